"""Which form a fused block takes where the user leaves the choice open: the one that runs fastest
where the model runs, by a measured cost table, never a form predicted to be slower than the
original ops.

The tables come from committed benchmarks, one per execution provider, read through the EP's
record (lowering/targets.py: ``PROVIDERS``): the CPU EP's here (``CPU_CROSSOVERS``,
``benchmarks/crossover.py``, one per CPU class: AVX-512, AVX2 and the generic build, chosen per
optimize call, default the running kernel build's; a row per mask kind, bounded where measured by
real-size exports, ``benchmarks/crossover_real_size.py``); each GPU EP's beside its capability table
in its lowering module: the WebGPU EP's (lowering/webgpu.py ``CROSSOVERS``,
``benchmarks/crossover_webgpu.py``), measured in float32 and taken for every element type, and the
CUDA EP's, one per element type (lowering/cuda_measured.py ``CROSSOVERS``, ``benchmarks/crossover_cuda.py``).
Each gives, per form and head dim, the least key length at which the form ran faster than the original graph in one run; tests check
them against their results files. A block is fused where its key length is known (a static
shape, or the lengths the user says the model runs at) and at or past the crossover at every such
length. Where the length is known only at run time, a block whose fused form wins at some measured
length is written as an ONNX ``If`` on the run's length (pipeline/length_dispatch.py: the fused form
from the crossover, the original ops below, one condition per distinct length shared by the blocks;
its cost in benchmarks/results/length_dispatch.md), on the CPU EP where ortflash's op runs; a block
whose form wins at no measured length keeps the original ops. The row says which form was chosen
and why in one sentence; ``FormChoice.detail`` says it whole, and which CPU table it read.

Over 400 lines because the tables are data with their provenance beside each (machine, date,
results files, what was borrowed), which the choice reads directly; the rest is the choice itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from ..lowering.measured import EVERY_LENGTH, Crossovers
from ..lowering.targets import PROVIDERS, ExecutionProvider
from ..op.policy import SoftmaxPolicy

# The kinds of block the table has a row for, by what the fused node reads besides Q, K and V:
# nothing; a padding bias or mask broadcast over the queries ([B, 1, 1, Sk]); is_causal (with at
# most a padding part, REFINED_KINDS: the kernels skip the tiles past the diagonal); a full bias or mask with a
# row per query ([B, H, Sq, Sk], T5's position bias), which the kernels read whole.
MASK_KINDS = ("none", "padding", "causal", "bias")
# Kinds a table may hold a row of its own for, each refining one of MASK_KINDS; a table without the
# row reads the refined kind's. ``causal_padding``: is_causal with a padding part. The CUDA target
# writes those as MultiHeadAttention's own causal mask with the padding row in attention_bias, not as
# the own-causal forms of a plain causal block (lowering/cuda.py: choose_form), and its CUDA row is that form's.
REFINED_KINDS: Mapping[str, str] = MappingProxyType({"causal_padding": "causal"})


def parent_kind(kind: str) -> str:
    """The row of MASK_KINDS that ``kind`` refines (itself where it is one)."""
    return REFINED_KINDS.get(kind, kind)


# The CPU classes the CPU EP's table has a row set for, by the kernel build that runs
# (ortflash.kernels.cpu.isa()): the crossovers move with the vector unit (the fused kernel gains
# more from AVX-512 than ONNX Runtime's unfused ops do), so a table measured on one class does not
# decide for the other. ``generic``: the build for a CPU with neither (or the numpy reference kernel).
CPU_CLASSES = ("avx512", "avx2", "generic")
_CLASS_OF_ISA = {"avx512": "avx512", "avx2": "avx2", "generic": "generic", "reference": "generic"}
_CLASS_NAMES = {"avx512": "AVX-512", "avx2": "AVX2", "generic": "generic (no AVX2)"}


def cpu_class_of(isa: str) -> str:
    """The CPU table's class for a kernel build name (``ortflash.kernels.cpu.isa()``)."""
    return _CLASS_OF_ISA.get(isa, "generic")


def running_cpu_class() -> str:
    """The class of the kernel build this process runs: the table ``optimize`` takes where the
    caller names none (``cpu_class=``, ``--cpu-class``)."""
    from ..kernels import cpu

    return cpu_class_of(cpu.isa())


# CPU class -> mask kind -> the results files of benchmarks/crossover.py whose crossovers the
# table's row is the larger of (CPU-time runs at one thread per worker; where listed, a wall-time
# run at the libraries' own threads). A kind never measured on a class takes another class's
# files and row (BORROWED); the generic class has no files of its own (the slower of the others).
_AVX2_FILES = MappingProxyType(
    {
        "padding": ("crossover_cpu",),
        "none": ("crossover_cpu_nomask",),
        "causal": ("crossover_cpu_causal_mask",),
        # the current kernel's two runs on a quiet AVX2 EPYC (Zen 3); the shared-machine runs of older
        # kernels (crossover_cpu_bias, crossover_cpu_bias_avx2_native) stay committed but are not read
        "bias": ("crossover_cpu_avx2_bias_zen3", "crossover_cpu_avx2_bias_zen3_run2"),
    }
)
RESULTS_FILES: Mapping[str, Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        "avx2": _AVX2_FILES,
        "avx512": MappingProxyType(
            {
                "padding": ("crossover_cpu_avx512", "crossover_cpu_avx512_run2"),
                # the current kernel's run on the AVX-512 EPYC (Zen 5); the Xeon's two runs of the older
                # kernel (crossover_cpu_avx512_nomask{,_run2}) are kept committed but no longer read
                "none": ("crossover_cpu_avx512_nomask_zen5", "crossover_cpu_avx512_nomask_zen5_run2"),
                "causal": ("crossover_cpu_avx512_causal_mask",),
                # the current kernel's runs (3ac9cf1-67641d2, the native op): two on an AVX-512 EPYC (Zen 5),
                # one on a Xeon; the Xeon's crossover_cpu_avx512_bias (older kernel, the Python bridge, load
                # 9-13) is kept committed but no longer read: a faster kernel only moves a crossover earlier
                "bias": (
                    "crossover_cpu_avx512_bias_zen5",
                    "crossover_cpu_avx512_bias_zen5_run2",
                    "crossover_cpu_avx512_bias_xeon",  # S = 512-2048, naive and online only
                ),
            }
        ),
    }
)
# class -> kind -> the class whose measurement the row is, where the kind was not measured on it
BORROWED: Mapping[str, Mapping[str, str]] = MappingProxyType({"avx512": MappingProxyType({})})
# CPU class -> mask kind -> the results files of benchmarks/crossover_real_size.py: the project's
# real-size exports (models/real_size_exports.py: MiniLM-sized, a 6x64 BERT, a ViT-S) run with their
# blocks fused. A stack's crossover does not always carry to a real export (AVX2: naive from the
# stack's 256 keys ran 0.84x at S=256 on the 6-head BERT), so a row listed here takes, for the
# FlashAttention forms (REAL_SIZE_FORMS), the later of the stack's crossover and the exports' bound:
# the latest export crossover at that head dim, or, where an export won at no length it was run at,
# the stack's next measured length past its longest (not checked on the exports there). The
# contrib and onnx rows are the stack's: the exports ran ortflash's op only.
# AVX-512 padding: the run through the native op (c630042: the default session path since), alone.
# The two bridge-era runs (onnxruntime-extensions' Python op, ortflash at 4f72638) stay committed
# but no longer bound that row; they still hold ViT-S's 197-key no-mask cell, the only no-mask export.
_AVX512_BRIDGE_RUNS = ("crossover_real_size_avx512", "crossover_real_size_avx512_run2")
REAL_SIZE_FILES: Mapping[str, Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        "avx2": MappingProxyType({"padding": ("crossover_real_size_avx2",)}),
        "avx512": MappingProxyType(
            {
                "padding": ("crossover_real_size_avx512_native", "crossover_real_size_avx512_zen5"),
                "none": (*_AVX512_BRIDGE_RUNS, "crossover_real_size_avx512_zen5"),
            }
        ),
    }
)
REAL_SIZE_FORMS = ("naive", "online")
# The generic build is slower than both vector builds, and was not measured: it takes, per entry,
# the later crossover of the two classes (never, where either never wins).
GENERIC_FROM = ("avx512", "avx2")


def results_path(kind: str, cpu_class: str = "avx2") -> str:
    files = RESULTS_FILES.get(cpu_class, RESULTS_FILES["avx2"])[parent_kind(kind)]
    return f"benchmarks/results/{files[0]}.md"


def results_paths(kind: str, cpu_class: str) -> list[str]:
    """The results files a row was read from: the stack's, then the real-size exports' where listed."""
    exports = REAL_SIZE_FILES.get(cpu_class, {}).get(parent_kind(kind), ())
    return [results_path(kind, cpu_class), *(f"benchmarks/results/{name}.md" for name in exports)]


def _rows(
    naive: Mapping[int, int | None],
    online: Mapping[int, int | None],
    contrib: Mapping[int, int | None],
    onnx: Mapping[int, int | None],
) -> Mapping[str, Mapping[int, int | None]]:
    return MappingProxyType(
        {
            form: MappingProxyType(dict(row))
            for form, row in zip(("naive", "online", "contrib", "onnx"), (naive, online, contrib, onnx))
        }
    )


Table = Crossovers  # mask kind -> form -> head dim -> crossover


def _slower(*tables: Table) -> Table:
    """Per entry, the later crossover of ``tables`` (None where any is None)."""

    def later(values: list[int | None]) -> int | None:
        return None if any(v is None for v in values) else max(v for v in values if v is not None)

    first = tables[0]
    return MappingProxyType(
        {
            kind: MappingProxyType(
                {
                    form: MappingProxyType({dim: later([t[kind][form][dim] for t in tables]) for dim in by_dim})
                    for form, by_dim in by_form.items()
                }
            )
            for kind, by_form in first.items()
        }
    )


# mask kind -> form -> head dim -> the least key length from which the form ran faster than the
# original ops on the CPU EP in every run of RESULTS_FILES (and, for REAL_SIZE_FORMS, of
# REAL_SIZE_FILES): the largest of their crossovers, so a form is chosen only where no measurement
# says it is slower. None: at no measured length up to MEASURED_UP_TO in one of them.
# AVX2: this project's 2-core AMD EPYC (Zen 3, no AVX-512), CPU time at one thread, two rounds per
# run, S = 16, 64, 256, 512, 1024, 2048, 2026-12-02, at load 7-17 (a shared machine), with the
# kernel of issue 30 items 1-2 (worker pool, buffer reuse, direct path to 64 rows): with a padding
# mask the stack fused from 256 keys, where the older kernel won from 512-2048. The older kernel's
# wall-time run (crossover_cpu_wall, 2026-12-01) no longer bounds the rows: wall time at this load
# measures the other jobs. The padding row's FlashAttention entries are bounded by the real-size
# exports (REAL_SIZE_FILES, a quiet run of the same day): from 512 at head dim 32 (MiniLM-L6 0.96x at
# 256, 1.08x at 512) and 1024 at 64 (the 6x64 BERT 0.84x at 256, 0.93x at 512; 1024 is the stack's
# next measured length, not run on the exports).
_AVX2 = MappingProxyType(
    {
        "padding": _rows({32: 512, 64: 1024}, {32: 512, 64: 1024}, {32: 1024, 64: None}, {32: None, 64: None}),
        "none": _rows({32: None, 64: 2048}, {32: 512, 64: 1024}, {32: 64, 64: 1024}, {32: None, 64: None}),
        "causal": _rows({32: 256, 64: 1024}, {32: 512, 64: 1024}, {32: 1024, 64: None}, {32: None, 64: None}),
        "bias": _rows({32: None, 64: 2048}, {32: None, 64: None}, {32: None, 64: None}, {32: None, 64: None}),
    }
)
# The AVX2 bias row: two runs of the current kernel (3ac9cf1-67641d2, the native op) on a quiet AVX2 AMD
# EPYC (Zen 3, family 25 model 1), 2026-12-07, load 0.2-1.0, two rounds each
# (crossover_cpu_avx2_bias_zen3{,_run2}): naive at D=64 won at 2048 in both (1.06x, 1.12x; 1.36x and
# 0.89x at 1024), so from 2048; nothing else won in both (naive at D=32: 0.93x at 1024 and 1.01x at
# 2048 in one run; online from 512 at D=64 in one run, never in the other). The runs' cells below 1024
# spread 0.5-1.2x on this VM: a row is taken only where both say so.
# AVX-512: a 2-core Intel Xeon, 2026-12-01, with the kernel of items 1-2, CPU time at one thread,
# S = 16, 64, 256, 512, 1024, 2048, one round per run (padding: two runs; no mask: one, and a second
# of two rounds on 2026-12-02 with S = 32 and 128, which moved every D=64 entry to 1024); the causal
# row on the same class 2026-12-02, S = 16-2048 with 32 and 128, two rounds, load 8-13 (a shared
# machine): naive and online from 128 (D=32) and 256 (D=64), where AVX2's were 256-1024; no causal
# real-size export was run, so that row is the stack's alone. The bias row: two runs on an AVX-512
# AMD EPYC (Zen 5, family 26 model 2) with the current kernel through the native op, 2026-12-02,
# quiet (load 0.5-1.5), two rounds each: naive from 1024 (D=32: 1.20-1.41x at 1024-2048) and 512
# (D=64: 1.05-1.07x at 512, 1.00-1.03x at 1024, 1.09-1.20x at 2048), online from 1024 at D=32 and
# never at 64 (0.92x at 2048 in one run); contrib and onnx never. A Xeon (family 6 model 207, quiet)
# with the current kernel, S = 512-2048 only: naive and online from 512 at D=32 (1.07-1.35x) and 1024
# at D=64 (0.94-0.99x at 512, 1.14-1.28x at 1024), so naive at D=64 from 1024. The older kernel's Xeon
# run (no form won, 0.61-1.08x, through the bridge at load 9-13) is no longer read.
# No row is borrowed now (BORROWED is empty; the mechanism stays for a class measured in part).
# The padding row's FlashAttention entries are bounded by the real-size exports run fused through
# the native op on the same class (REAL_SIZE_FILES: crossover_real_size_avx512_native, 2026-12-02
# 05:34-05:40, ortflash at 9994fbf, 2 rounds, S = 16-512, load 1-3): from 128 at head dim 32
# (MiniLM-L6 0.99x at 32, 1.04x at 64, 1.06x at 128; MiniLM-L3 from 16, MiniLM-L6 SDPA from 32) and
# 32 at 64 (the 6x64 BERT 0.89x at 16, 1.06-1.21x at 32-512), where the stacks won from 64 and 16.
# The bridge-era runs (crossover_real_size_avx512{,_run2}, 256 / 512) are no longer read for it.
# The same exports fused on the AVX-512 EPYC (Zen 5) with the current kernel (crossover_real_size_
# avx512_zen5, 2026-12-02, quiet, 2-3 rounds, S = 16-512 with 197) won only from 512 at both head dims
# (the 6x64 BERT 0.93x at 197; MiniLM-L6 0.93-0.94x at 64-128, MiniLM-L3 0.94-0.98x below 256), so the
# padding row is 512 / 512: the later of both machines. The no-mask row: the current kernel's two stack
# runs on the Zen 5 (crossover_cpu_avx512_nomask_zen5{,_run2}, two rounds each, load 1.6-2.8 and 0.4-1.1):
# naive from 128 (D=32) and 32 (D=64), online from 128 and 64, contrib from 512, onnx never; the FlashAttention
# entries at D=64 bounded by ViT-S at its 197 (0.88x through the bridge on the Xeon, 0.94x on the Zen 5
# natively: from the stack's next length, 256). The Xeon's no-mask runs (older kernel) are not read.
_AVX512 = MappingProxyType(
    {
        "padding": _rows({32: 512, 64: 512}, {32: 512, 64: 512}, {32: None, 64: None}, {32: None, 64: None}),
        # no padded key tile to skip: the kernel does the unfused graph's work
        "none": _rows({32: 128, 64: 256}, {32: 128, 64: 256}, {32: 512, 64: 512}, {32: None, 64: None}),
        "causal": _rows({32: 128, 64: 256}, {32: 128, 64: 256}, {32: 1024, 64: 1024}, {32: None, 64: None}),
        "bias": _rows({32: 1024, 64: 1024}, {32: 1024, 64: None}, {32: None, 64: None}, {32: None, 64: None}),
    }
)
CPU_CROSSOVERS: Mapping[str, Table] = MappingProxyType(
    {"avx512": _AVX512, "avx2": _AVX2, "generic": _slower(_AVX512, _AVX2)}
)


def table(ep: str | None, dtype: str | None, cpu_class: str | None = None) -> Table:
    """The cost table of ``ep`` for blocks of element type ``dtype`` ("float32", "float16"; None or ""
    where not known) and, on the CPU EP, of ``cpu_class`` (None: the running machine's): mask kind
    -> form -> head dim -> crossover."""
    provider = PROVIDERS[_named(ep)]
    if provider.measured.costs is None:
        kinds = CPU_CROSSOVERS[cpu_class or running_cpu_class()]
    else:
        kinds = provider.measured.cost_table(dtype)
    missing = {kind: kinds[parent] for kind, parent in REFINED_KINDS.items() if kind not in kinds}
    return MappingProxyType({**kinds, **missing}) if missing else kinds


def _named(ep: str | None) -> str:
    return "cpu" if ep is None else ep  # None: the CPU EP, where ortflash's own op runs


def cpu_table_says(kind: str, cpu_class: str) -> str:
    """Which CPU table a row was read from, for its detail: the class, and where the kind's row is
    another class's measurement (or the slower of both), that too."""
    if cpu_class == "generic":
        return "the generic (no AVX2) CPU table: the later crossover of the AVX-512 and AVX2 rows, not measured apart"
    said = f"the {_CLASS_NAMES[cpu_class]} CPU table"
    lender = BORROWED.get(cpu_class, {}).get(parent_kind(kind))
    if lender is not None:
        said += (
            f" (its {kind} row is the {_CLASS_NAMES[lender]} measurement: not measured on {_CLASS_NAMES[cpu_class]})"
        )
    return said


MEASURED_UP_TO = PROVIDERS["cpu"].measured.measured_up_to  # the CPU tables' longest key length
_KIND_NAMES = {
    "none": "no mask",
    "padding": "a padding mask",
    "causal": "causal",
    "causal_padding": "causal with a padding mask",
    "bias": "a full bias",
}


@dataclass(frozen=True)
class FormChoice:
    fused: bool
    why: str  # one short sentence, for the report row
    detail: str = ""  # the whole explanation (the measurement, the flags that change it), said once under the table
    # where the length is known only at run time: the key length from which the fused form runs,
    # the original ops below it (pipeline/length_dispatch.py writes the If); None: no dispatch
    dispatch_from: int | None = None
    # with dispatch_from: the key length from which a one-query step (a decode step against a KV
    # cache) takes the fused form (None: never)
    decode_from: int | None = None


# The decode step (one query row against a KV cache) on the CPU EP: ortflash's FlashAttention at
# parity with the original ops at 2048 cached keys (0.84-1.41x over four runs) and 1.94-2.68x at
# 8192, the least measured length where it won in every run (benchmarks/results/decode_step.md,
# a Llama decoder, head dim 64, 2026-11-30). A one-query step takes the fused form from here.
CPU_DECODE_CROSSOVER: int | None = 8192
DECODE_RESULTS = "benchmarks/results/decode_step.md"
# The execution providers whose blocks may dispatch on the length at run time: ortflash's own op
# runs on the CPU EP (pipeline/length_dispatch.py; its cost in benchmarks/results/length_dispatch.md).
# On a GPU EP of LOWERED_DISPATCH_EPS the If is written around the FlashAttention node and the
# lowering then writes the EP's native form inside its fused branch, so no FlashAttention is left.
# None is listed: on the H200 (2026-12-02, GPU_DECODE_RESULTS) the If itself made every measured
# KV-cache decoder slower, whichever branch ran: on WebGPU 0.71-0.86x the original at a decode step
# (the original branch) and 0.58-0.76x at a 2048-token prefill (the lowered one); on CUDA a float16
# cached block 0.93-0.96x at a decode step and 0.004x at a 2048-key prefill (56 ms against the same
# MultiHeadAttention's 0.12 ms outside an If). Both branches loaded and were right on both EPs.
DISPATCH_EPS = (None, "cpu", "cuda", "webgpu")
LOWERED_DISPATCH_EPS: tuple[str, ...] = ()
# The lowered ops that get the If on a GPU EP even where LOWERED_DISPATCH_EPS does not list it:
# EP -> op (a Report row's lowered_to). The candidate is CUDA's Attention-23 (the float16 causal
# blocks' form, lowering/cuda.opset_wanted), which runs ORT's own flash kernel outside cuDNN's graph
# cache, where the 56 ms above was MultiHeadAttention's cuDNN graph rebuilt on every call inside the
# If (benchmarks/results/cuda_cudnn_causal.md). Measured with the If on the exported causal block
# (H200, 2026-12-03, IF_RESULTS): 2.4-6.9x the original from 1024 keys at D64, but 0.93-0.99x on
# the original branch below (0.82-0.93x at D128, GroupQueryAttention): on a lone block the If's
# 7-20 us is a loss, so none is listed.
LOWERED_DISPATCH_OPS: Mapping[str, frozenset[str]] = MappingProxyType({})
IF_RESULTS = "benchmarks/results/cuda_forms_if.md"


def dispatches_lowered(ep: str | None, lowered_to: str | None) -> bool:
    """Whether a block lowered to ``lowered_to`` for ``ep`` may be written as an If on the length."""
    return lowered_to is not None and (
        ep in LOWERED_DISPATCH_EPS or lowered_to in LOWERED_DISPATCH_OPS.get(ep or "", ())
    )


# The decode step on the GPU EPs: GPU EP -> the key length from which a one-query step takes the
# lowered form (None: never, the original ops at every length). Measured at past 127 and 2048 on the
# zoo's Llama, Mistral, Qwen2 and GPT-2 decoders and decode_step.py's Llama (H200, onnxruntime-gpu
# 1.31.1, onnxruntime-ep-webgpu 0.4.0, driver 580.159.04, 2026-12-02): --target cuda 0.71-0.77x
# (float32) and 0.73-0.83x (float16), --target webgpu 0.93-1.09x (parity within the run's noise):
# the lowered form wins at no measured past on either EP.
GPU_DECODE_CROSSOVERS: Mapping[str, int | None] = MappingProxyType({"cuda": None, "webgpu": None})
GPU_DECODE_RESULTS = "benchmarks/results/decode_gpu.md"


def form_at(target: str, policy: SoftmaxPolicy, key_len: int) -> str | None:
    """The table's form a block of ``target`` runs at ``key_len``: FlashAttention's softmax (naive or
    online by the policy) for ortflash; every other target's blocks are its own row (MultiHeadAttention
    for contrib, Attention-23 for onnx, the GPU targets' forms), found or not in the EP's table."""
    if target == "ortflash":
        return policy.choose(key_len)
    return target


def mask_kind(is_causal: bool, bias_query_rows: tuple[int | None, ...]) -> str:
    """The table's row for a fused block: ``bias_query_rows`` holds, for its bias and its mask
    each (where present), the size of the query axis it has (1: broadcast over the queries; None:
    not proved, so taken as a row per query)."""
    if any(rows != 1 for rows in bias_query_rows):
        return "bias"
    if is_causal:
        return "causal_padding" if bias_query_rows else "causal"
    return "padding" if bias_query_rows else "none"


def crossover(
    form: str,
    head_dim: int | None,
    kind: str = "padding",
    ep: str | None = None,
    dtype: str | None = None,
    cpu_class: str | None = None,
) -> int | None:
    """The form's crossover on ``ep`` for this head dim, mask kind, element type and CPU class (on
    the CPU EP; None: the running machine's): the measured dims around it (the larger crossover of
    the two, None if either never wins); every dim's where the head dim is unknown."""
    by_dim = table(ep, dtype, cpu_class)[kind][form]
    dims = sorted(by_dim)
    if head_dim is None:
        around = dims
    elif head_dim <= dims[0]:
        around = dims[:1]
    elif head_dim >= dims[-1]:
        around = dims[-1:]
    else:
        around = [max(d for d in dims if d <= head_dim), min(d for d in dims if d >= head_dim)]
    values = [by_dim[d] for d in around]
    return None if any(v is None for v in values) else max(v for v in values if v is not None)


def choose(
    target: str,
    policy: SoftmaxPolicy,
    head_dim: int | None,
    key_lens: Sequence[int] | None,
    kind: str = "padding",
    ep: str | None = None,
    dtype: str | None = None,
    can_dispatch: bool = False,
    cpu_class: str | None = None,
    queries_are_keys: bool = False,
    one_op: bool = False,
) -> FormChoice:
    """Fused, or the original ops kept, for one block of ``target``, mask ``kind`` and element type
    ``dtype`` (None: not known) that runs at ``key_lens`` (None: the length is known only at run
    time) on ``ep`` (None: the CPU EP, where ortflash's own op runs). ``can_dispatch``: the block
    can be written as an If on its run's length (it stays a FlashAttention node in the main graph):
    then a length known only at run time takes the fused form from the crossover
    (``FormChoice.dispatch_from``) wherever the table has one. ``cpu_class``: which CPU table
    decides on the CPU EP (``CPU_CLASSES``; None: the running machine's); the detail names it.
    ``queries_are_keys``: the block's query length is proved its key length (no one-query step
    against a cache), so a row that wins from one key (``EVERY_LENGTH``) needs no If. ``one_op``:
    the block was one ONNX Attention op, which an EP with ``one_op_results`` keeps."""
    provider: ExecutionProvider | None = PROVIDERS.get(_named(ep))
    if provider is None:
        return FormChoice(True, f"fused as the target writes it: no measured cost table for the {ep} EP")
    if one_op and provider.measured.one_op_results:
        return FormChoice(
            False,
            f"the block is ONNX's Attention op, which the {ep} EP runs natively",
            f"kept ONNX's Attention op: the {ep} EP runs it on its own fused kernels, and the forms the target "
            f"writes measured slower than the op itself ({provider.measured.one_op_results}); the cost table times them "
            f"against graphs of plain ops; --target {target} rewrites it anyway",
        )
    # the CPU EP's table by CPU class; another EP's by element type
    cpu_class = (cpu_class or running_cpu_class()) if provider.measured.costs is None else None
    longest = provider.measured.measured_up_to
    probe = form_at(target, policy, longest)
    if probe is None or probe not in table(ep, dtype, cpu_class)[kind]:
        return FormChoice(True, f"fused as asked: no measured cost table for {target} on the {ep or 'cpu'} EP")
    dim = ("an unproved head dim" if head_dim is None else f"head dim {head_dim}") + f", {_KIND_NAMES[kind]}"
    if cpu_class is not None:
        dim += f", {cpu_table_says(kind, cpu_class)}"
        sources = GENERIC_FROM if cpu_class == "generic" else (cpu_class,)
        results = " and ".join(path for c in sources for path in results_paths(kind, c))
    else:
        results = provider.measured.results_for(kind, dtype)
    dim += provider.measured.dtype_said(dtype)
    if key_lens is None:
        lowest = crossover(probe, head_dim, kind, ep, dtype, cpu_class)
        start = _fused_from(target, policy, head_dim, kind, ep, dtype, lowest, cpu_class)
        if start is not None and start <= EVERY_LENGTH and queries_are_keys:
            return FormChoice(
                True,
                f"{probe} is faster at every key length",
                f"{probe} beat the original ops at every key length measured, from one key ({dim}, {results}), "
                "and the block's query length is its key length (no one-query step against a cache): written "
                "with no If on the length",
            )
        if start is not None and can_dispatch and ep in DISPATCH_EPS:
            return _dispatched(target, policy, start, dim, results, ep)
        where = (
            f"{probe} beats the original ops only from key length {lowest}"
            if lowest is not None
            else f"{probe} beat the original ops at no measured key length up to {longest}"
        )
        short = (
            f"the original ops are faster: {probe} wins only from {lowest} keys ({_KIND_NAMES[kind]}), and the "
            "length is known only at run time"
            if lowest is not None
            else f"the original ops are faster: {probe} wins at no measured length ({_KIND_NAMES[kind]})"
        )
        no_if = (
            f"; no If on the length on the {ep} EP: it measured slower than the original ops ({GPU_DECODE_RESULTS})"
            if start is not None and ep in GPU_DECODE_CROSSOVERS and ep not in LOWERED_DISPATCH_EPS
            else ""
        )
        return FormChoice(
            False,
            short,
            f"kept the original ops, the faster form here: the key length is known only at run time, and {where} "
            f"({dim}, {results}){no_if}; --seq-lens says which lengths the model runs at, --target {target} fuses "
            "anyway",
        )
    for key_len in key_lens:
        form = form_at(target, policy, key_len)
        assert form is not None
        at = crossover(form, head_dim, kind, ep, dtype, cpu_class)
        if at is None or key_len < at:
            beats = f"from {at}" if at is not None else f"at no measured length up to {longest}"
            wins = f"wins only from {at} keys" if at is not None else "wins at no measured length"
            return FormChoice(
                False,
                f"the original ops are faster at {key_len} keys: {form} {wins} ({_KIND_NAMES[kind]})",
                f"kept the original ops, the faster form here: at key length {key_len}, {form} beats them only {beats} "
                f"({dim}, {results}); --target {target} fuses anyway",
            )
    lengths = ", ".join(map(str, key_lens))
    return FormChoice(
        True,
        f"{probe} is faster at key length {lengths}",
        f"{probe} is faster than the original ops at key length {lengths} ({dim}, {results})",
    )


def _fused_from(
    target: str,
    policy: SoftmaxPolicy,
    head_dim: int | None,
    kind: str,
    ep: str | None,
    dtype: str | None,
    lowest: int | None,
    cpu_class: str | None,
) -> int | None:
    """The least key length from which every form the block runs (auto: naive below min_seq_len,
    online from it) beats the original ops: ``lowest``, the longest form's crossover, raised to the
    other form's where the block runs that one there, or to where it stops running it."""
    if lowest is None:
        return None
    start = lowest
    form = form_at(target, policy, start)
    if form is not None and form != form_at(target, policy, MEASURED_UP_TO):
        at = crossover(form, head_dim, kind, ep, dtype, cpu_class)
        switch = policy.min_seq_len if policy.mode == "auto" and policy.min_seq_len is not None else MEASURED_UP_TO
        start = max(start, at) if at is not None else max(start, switch)
    return start


def _dispatched(
    target: str, policy: SoftmaxPolicy, lowest: int, dim: str, results: str, ep: str | None = None
) -> FormChoice:
    """The choice for a block whose length is known only at run time and whose fused form wins from
    ``lowest`` keys: the fused form from there, the original ops below, decided per run; a one-query
    step by the EP's decode crossover."""
    form = form_at(target, policy, lowest)
    on_gpu = ep in GPU_DECODE_CROSSOVERS
    decode = GPU_DECODE_CROSSOVERS[ep or ""] if on_gpu else CPU_DECODE_CROSSOVER
    step = f"from {decode} keys" if decode is not None else "never"
    return FormChoice(
        True,
        f"{form} from {lowest} keys, original ops below",
        f"the key length is known only at run time: the model runs {form} from key length {lowest}, where it "
        f"beats the original ops ({dim}, {results}), and the original ops below, decided per run by an If on "
        f"the length (pipeline/length_dispatch.py); a one-query step against a KV cache takes it {step} "
        f"({GPU_DECODE_RESULTS if on_gpu else DECODE_RESULTS}); --seq-lens fixes the form for the lengths given, "
        "with no If",
        dispatch_from=lowest,
        decode_from=decode,
    )
