"""What one NVIDIA H200 measured of ONNX Runtime's CUDA EP, as the CUDA target reads it:
CAPABILITIES, each candidate form's kernel, time and rightness per case (lowering/cuda.choose_form
picks the form from it; benchmarks/cuda_capabilities.py, tests/test_cuda_table.py holds it to the
committed JSON), and CROSSOVERS, the cost table of the `cuda` target's output against the original
graph per element type, mask kind and head dim (pipeline/forms reads it through the EP's record,
lowering/targets.PROVIDERS["cuda"]; tests/test_forms.py and tests/test_cuda_costs.py hold it to the
results files named here)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from .measured import Capability, CapabilityTable, Crossovers

# (form, case) -> what the CUDA EP did, measured 2026-12-01 on an NVIDIA H200 (driver 580.159.04)
# with onnxruntime-gpu 1.31.1 (benchmarks/results/cuda_capabilities.md). Forms and case names are
# benchmarks/cuda_capabilities.py's; only the rows the choices below read, or that say why a form
# is not chosen, are copied here, and tests/test_cuda_table.py checks each against the committed JSON.
CAPABILITIES = CapabilityTable(
    {
        # A causal block with no bias or mask (Sq == Sk) takes the fastest of these three at its case
        # (choose_form): GroupQueryAttention (cuDNN flash in float16; on the CPU in float32, 0 of 1
        # nodes on CUDA), MultiHeadAttention unidirectional=1 without bias (cuDNN flash in float16)
        # and Attention-23 is_causal on [B, S, H·D] (flash in float16). kernel: what ORT printed;
        # ms: the op alone, median, I/O bound, the EP's default session (TF32 on in float32).
        ("gqa", "causal_f16_d64_s37"): Capability(on_gpu=True, right=True, kernel="CUDNN_FLASH_ATTENTION", ms=0.064),
        ("gqa", "causal_f32_d64_s37"): Capability(on_gpu=False, right=True, kernel="", ms=0.258),
        ("gqa", "causal_f16_d64_s1024"): Capability(on_gpu=True, right=True, kernel="CUDNN_FLASH_ATTENTION", ms=0.097),
        ("gqa", "causal_f16_d64_s4096"): Capability(on_gpu=True, right=True, kernel="CUDNN_FLASH_ATTENTION", ms=0.274),
        ("gqa", "causal_f16_d64_s16384"): Capability(on_gpu=True, right=True, kernel="CUDNN_FLASH_ATTENTION", ms=1.739),
        ("gqa", "causal_f16_d128_s1024"): Capability(on_gpu=True, right=True, kernel="CUDNN_FLASH_ATTENTION", ms=0.107),
        ("gqa", "causal_f16_d128_s4096"): Capability(on_gpu=True, right=True, kernel="CUDNN_FLASH_ATTENTION", ms=0.326),
        ("gqa", "causal_f16_d128_s16384"): Capability(
            on_gpu=True, right=True, kernel="CUDNN_FLASH_ATTENTION", ms=2.455
        ),
        ("gqa", "causal_f32_d64_s1024"): Capability(on_gpu=False, right=True, kernel="", ms=12.215),
        ("gqa", "causal_f32_d64_s4096"): Capability(on_gpu=False, right=True, kernel="", ms=88.372),
        ("mha_causal", "causal_f16_d64_s37"): Capability(
            on_gpu=True, right=True, kernel="CUDNN_FLASH_ATTENTION", ms=0.04
        ),
        ("mha_causal", "causal_f32_d64_s37"): Capability(on_gpu=True, right=True, kernel="MATH", ms=0.084),
        ("mha_causal", "causal_f16_d64_s1024"): Capability(
            on_gpu=True, right=True, kernel="CUDNN_FLASH_ATTENTION", ms=0.064
        ),
        ("mha_causal", "causal_f16_d64_s4096"): Capability(
            on_gpu=True, right=True, kernel="CUDNN_FLASH_ATTENTION", ms=0.137
        ),
        ("mha_causal", "causal_f16_d64_s16384"): Capability(
            on_gpu=True, right=True, kernel="CUDNN_FLASH_ATTENTION", ms=1.145
        ),
        ("mha_causal", "causal_f16_d128_s1024"): Capability(
            on_gpu=True, right=True, kernel="CUDNN_FLASH_ATTENTION", ms=0.052
        ),
        ("mha_causal", "causal_f16_d128_s4096"): Capability(
            on_gpu=True, right=True, kernel="CUDNN_FLASH_ATTENTION", ms=0.202
        ),
        ("mha_causal", "causal_f16_d128_s16384"): Capability(
            on_gpu=True, right=True, kernel="CUDNN_FLASH_ATTENTION", ms=1.823
        ),
        ("mha_causal", "causal_f32_d64_s1024"): Capability(
            on_gpu=True, right=True, kernel="EFFICIENT_ATTENTION", ms=0.183
        ),
        ("mha_causal", "causal_f32_d64_s4096"): Capability(
            on_gpu=True, right=True, kernel="EFFICIENT_ATTENTION", ms=1.464
        ),
        ("attn23_causal_bsd", "causal_f16_d64_s37"): Capability(
            on_gpu=True, right=True, kernel="FLASH_ATTENTION", ms=0.033
        ),
        ("attn23_causal_bsd", "causal_f32_d64_s37"): Capability(
            on_gpu=True, right=True, kernel="EFFICIENT_ATTENTION", ms=0.035
        ),
        ("attn23_causal_bsd", "causal_f16_d64_s1024"): Capability(
            on_gpu=True, right=True, kernel="FLASH_ATTENTION", ms=0.047
        ),
        ("attn23_causal_bsd", "causal_f16_d64_s4096"): Capability(
            on_gpu=True, right=True, kernel="FLASH_ATTENTION", ms=0.213
        ),
        ("attn23_causal_bsd", "causal_f16_d64_s16384"): Capability(
            on_gpu=True, right=True, kernel="FLASH_ATTENTION", ms=1.951
        ),
        ("attn23_causal_bsd", "causal_f16_d128_s1024"): Capability(
            on_gpu=True, right=True, kernel="FLASH_ATTENTION", ms=0.058
        ),
        ("attn23_causal_bsd", "causal_f16_d128_s4096"): Capability(
            on_gpu=True, right=True, kernel="FLASH_ATTENTION", ms=0.342
        ),
        ("attn23_causal_bsd", "causal_f16_d128_s16384"): Capability(
            on_gpu=True, right=True, kernel="FLASH_ATTENTION", ms=3.262
        ),
        ("attn23_causal_bsd", "causal_f32_d64_s1024"): Capability(
            on_gpu=True, right=True, kernel="EFFICIENT_ATTENTION", ms=0.17
        ),
        ("attn23_causal_bsd", "causal_f32_d64_s4096"): Capability(
            on_gpu=True, right=True, kernel="EFFICIENT_ATTENTION", ms=1.353
        ),
        # MultiHeadAttention with attention_bias: cuDNN flash in float16, MATH / memory-efficient in float32
        ("mha_bias", "padding_f16_d64_s37"): Capability(on_gpu=True, right=True),
        ("mha_bias", "causal_leftpad_f16_d64_s37"): Capability(on_gpu=True, right=True),
        ("mha_bias", "padding_f16_d64_s16384"): Capability(on_gpu=True, right=True),
        ("mha_bias", "padding_f32_d64_s37"): Capability(on_gpu=True, right=True),
        ("mha_bias", "causal_leftpad_f32_d64_s37"): Capability(on_gpu=True, right=True),
        # rows of -inf: finite on the EP, NaN on the CPU EP (the lowering writes such rows out)
        ("mha_bias", "dead_rows_neginf_f16_d64_s37"): Capability(on_gpu=True, right=False),
        # key_padding_mask: the unfused MATH kernel at 4096 (1.22 ms against 0.32 with attention_bias),
        # refused at 16384
        ("mha_kpm", "padding_f16_d64_s16384"): Capability(on_gpu=False, right=False),
        # the decomposed graph in float16: rows of float16-lowest wrong (about 1.0); refused at 16384
        ("unfused", "causal_leftpad_f16_d64_s37"): Capability(on_gpu=True, right=False),
        ("unfused", "padding_f16_d64_s16384"): Capability(on_gpu=False, right=False),
    }
)


# The CUDA EP's cost table, by element type, which pipeline/forms.py reads through the EP's record
# (lowering/targets.py: PROVIDERS["cuda"]) where --ep cuda leaves the form open (onnxruntime-gpu
# 1.31.1 on an NVIDIA H200, its defaults: TF32 on; wall time with inputs and outputs bound on the
# GPU; benchmarks/crossover_cuda.py -> CROSSOVER_RESULTS): the `cuda` target's output against the
# original graph. In float32 the original's TF32 products beat every form the target writes
# (MultiHeadAttention's float32 kernels do not use them) at every measured length; in float16
# cuDNN's flash attention wins from 2048 keys with a padding mask, at every length without a mask,
# never with a full bias ([1, H, S, S]). Causal D64/D128 from 1024 (CAUSAL_RESULTS: the own-causal form written in
# float16 below opset 23, GroupQueryAttention, 1.18-1.51x at 1024, 2.24-2.61x at 2048, 3.73-5.59x at 4096, where the
# unchanged cells read 0.99-1.01x), D32 and contrib 4096; causal_padding D64/D128 from 2048 (CAUSAL_PADDING_RESULTS: the own causal mask + the
# padding row, 1.61-2.05x at 2048, 3.24-4.24x at 4096; 1.03-1.24x at 1024, not clear of the noise), D32 and contrib never.
CROSSOVER_RESULTS = "benchmarks/results/crossover_cuda.md"
CAUSAL_RESULTS = "benchmarks/results/cuda_forms_causal_gqa_f16.md"  # the float16 causal rows' D64/D128
CAUSAL_PADDING_RESULTS = "benchmarks/results/cuda_forms_causal_padding_f16.md"  # the causal_padding rows
# MultiHeadAttention unidirectional=1 (no bias) rebuilding its cuDNN graph per call (lowering/cuda.py)
CUDNN_REBUILT_RESULTS = "benchmarks/results/cuda_cudnn_causal.md"
# the rows measured apart from crossover_cuda.md, by (element type, mask kind): what a choice's detail names
KIND_RESULTS: Mapping[tuple[str, str], str] = MappingProxyType(
    {
        ("float16", "causal"): f"{CAUSAL_RESULTS} (D64/D128) and {CROSSOVER_RESULTS} (D32)",
        ("float16", "causal_padding"): CAUSAL_PADDING_RESULTS,
    }
)
CROSSOVERS_MEASURED_UP_TO = 4096  # the table's longest key length


def _cost_row(cuda_row: Mapping[int, int | None], contrib: Mapping[int, int | None] | None = None) -> Mapping:
    row = MappingProxyType(dict(cuda_row))  # contrib: 0.39-0.54x at 2048-4096 causal (CAUSAL_RESULTS)
    return MappingProxyType({"cuda": row, "contrib": row if contrib is None else MappingProxyType(dict(contrib))})


_NEVER = _cost_row({32: None, 64: None, 128: None})
CROSSOVERS: Mapping[str, Crossovers] = MappingProxyType(
    {
        "float32": MappingProxyType({"padding": _NEVER, "none": _NEVER, "causal": _NEVER, "bias": _NEVER}),
        "float16": MappingProxyType(
            {
                "padding": _cost_row({32: 2048, 64: 2048, 128: 2048}),
                "none": _cost_row({32: 64, 64: 64, 128: 64}),
                "causal": _cost_row({32: 4096, 64: 1024, 128: 1024}, {32: 4096, 64: 4096, 128: 4096}),
                "causal_padding": _cost_row({32: None, 64: 2048, 128: 2048}, {32: None, 64: None, 128: None}),
                "bias": _NEVER,
            }
        ),
    }
)
# a block of no known element type (or one without a table: bfloat16) takes this one's, which keeps most
CROSSOVERS_UNKNOWN_DTYPE = "float32"  # (tests/test_forms.py holds it to keep every block another keeps)
