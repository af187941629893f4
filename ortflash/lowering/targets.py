"""The targets a fused model can be written for, and the execution providers it can be written for:
one record each.

Everything the pipeline knows about a target lives in its record: the writer that lowers one
FlashAttention node (None: the node stays), its one line for ``--target --help``, the opset and
IR version its ops need, the domain it imports, and whether the written model still needs
ortflash at run time. ``optimize`` fuses once and then lowers the same fused model for each
candidate target; nothing upstream of the lowering reads a target's name.

An execution provider's record holds its targets in order of preference (``--ep``, ``--target
auto``) and the measured cost table that decides, per block, where the user leaves the form open
(pipeline/forms.py): the table by element type, its longest measured key length and its results
file. A GPU EP's table stands beside its capability table and GpuProfile in its lowering module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import onnx_ir as ir

from ..graph.emitter import Emitter
from ..op.call import FlashAttentionCall
from . import cuda, cuda_measured, webgpu
from .contrib import CONTRIB_DOMAIN, CONTRIB_VERSION, MIN_CONTRIB_OPSET, lower_contrib
from .measured import CostRecord
from .standard import ONNX_ATTENTION_OPSET, ONNX_IR_VERSION, lower_standard

# Writes one call as the target's ops after ``e``'s anchor; returns (op written, how), or raises NotLowered.
Writer = Callable[[Emitter, FlashAttentionCall, ir.Value], tuple[str, str]]


@dataclass(frozen=True)
class Target:
    name: str
    write: Writer | None  # None: FlashAttention nodes stay as they are
    summary: str  # its one line in --target --help (cli/optimize.py)
    min_opset: int | None = None  # the default-domain opset its ops are written in
    domain: tuple[str, int] | None = None  # the opset import its ops need
    ir_version: int | None = None  # the least IR version its ops load with (a higher one is kept)
    # ONNX Runtime's own kernels compute the whole block, as the original ops did (the choice for
    # blocks that feed a quantizer, where a rounding difference can flip an integer downstream)
    ort_kernels: bool = False
    # (call, the model's default opset) -> a higher default opset a faster form of the call needs, which
    # the lowering raises the model to where it can (every node carried over exactly), else None
    opset_wanted: Callable[[FlashAttentionCall, int], int | None] | None = None

    @property
    def needs_ortflash(self) -> bool:
        """Whether the written model needs ortflash (its custom op) wherever it runs."""
        return self.write is None

    @property
    def needs_head_count(self) -> bool:
        """Whether the target's ops take the head count as a number (``--num-heads`` is written for it)."""
        return self.write is not None


ORTFLASH = Target(
    "ortflash",
    None,
    "FlashAttention nodes, run by ortflash's kernels (ortflash.session_options())",
)
REGISTRY: Mapping[str, Target] = MappingProxyType(
    {
        target.name: target
        for target in (
            ORTFLASH,
            Target(
                "contrib",
                lower_contrib,
                "ONNX Runtime's com.microsoft MultiHeadAttention / GroupQueryAttention",
                min_opset=MIN_CONTRIB_OPSET,
                domain=(CONTRIB_DOMAIN, CONTRIB_VERSION),
                ort_kernels=True,
            ),
            Target(
                "onnx",
                lower_standard,
                "the standard ONNX Attention op (opset 23)",
                min_opset=ONNX_ATTENTION_OPSET,
                ir_version=ONNX_IR_VERSION,
                ort_kernels=True,
            ),
            Target(
                "cuda",
                cuda.CUDA_PROFILE.lower,
                "the forms ONNX Runtime's CUDA EP runs on the GPU and right, float16 blocks in float16 "
                "(benchmarks/results/cuda_capabilities.md)",
                min_opset=MIN_CONTRIB_OPSET,
                domain=(CONTRIB_DOMAIN, CONTRIB_VERSION),
                opset_wanted=cuda.opset_wanted,
            ),
            Target(
                "webgpu",
                webgpu.WEBGPU_PROFILE.lower,
                "the forms ONNX Runtime's WebGPU EP runs on the GPU and right (benchmarks/results/webgpu_capabilities.md)",
                min_opset=MIN_CONTRIB_OPSET,
                domain=(CONTRIB_DOMAIN, CONTRIB_VERSION),
            ),
        )
    }
)
TARGETS = tuple(REGISTRY)


@dataclass(frozen=True)
class ExecutionProvider:
    name: str  # as --ep names it
    targets: tuple[str, ...]  # the targets whose ops run there natively, in order of preference
    measured: CostRecord  # what was measured there: the cost table, its reach, its results files


# The order per EP (docs/targets.md, "Targets"). contrib first on the CPU and CUDA: ONNX Runtime's
# own MultiHeadAttention / GroupQueryAttention kernels need nothing but onnxruntime at run time,
# were bit-identical to the original graph on the CPU EP for most zoo models and 1.16-1.27x faster
# than it (benchmarks/results/cpu_attention_*.md). onnx next: Attention-23 is the standard form, but
# on the WebGPU EP it falls back to the CPU (issue 11), so it is not offered there. On the CPU the
# last resort is ortflash's own op: faster still at long sequences but a custom op that needs
# ortflash and onnxruntime-extensions wherever the model runs. On CUDA the cuda target first (its
# form per block from the EP's measured capability table, ortflash/lowering/cuda.py), then contrib;
# onnx is not offered there: Attention-23 was wrong on the CUDA EP for causal decoders (issue 23).
PROVIDERS: Mapping[str, ExecutionProvider] = MappingProxyType(
    {
        ep.name: ep
        for ep in (
            # the CPU tables' longest key length (benchmarks/crossover.py, S = 16-2048)
            ExecutionProvider("cpu", ("contrib", "onnx", "ortflash"), CostRecord(measured_up_to=2048)),
            ExecutionProvider("cuda", ("cuda", "contrib"), cuda_measured.MEASURED),
            ExecutionProvider("webgpu", ("webgpu", "contrib"), webgpu.MEASURED),
        )
    }
)
EXECUTION_PROVIDERS = tuple(PROVIDERS)
# For blocks that feed a quantizer, in order: the targets whose ops are ONNX Runtime's own kernels.
ORT_KERNEL_TARGETS = tuple(t.name for t in REGISTRY.values() if t.ort_kernels)
DEFAULT_TARGET = ORTFLASH.name
