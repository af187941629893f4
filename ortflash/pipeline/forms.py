"""Which form a fused block takes where the user leaves the choice open: the one that runs fastest
where the model runs, by a measured cost table, never a form predicted to be slower than the
original ops.

The tables come from committed benchmarks, one per execution provider (``TABLES``): the CPU EP's
(``CPU_CROSSOVERS``, ``benchmarks/crossover.py``, a row per mask kind) and the WebGPU EP's
(``WEBGPU_CROSSOVERS``, ``benchmarks/crossover_webgpu.py``), measured in float32 and taken for
every element type; and the CUDA EP's, one per element type (``CUDA_CROSSOVERS``,
``benchmarks/crossover_cuda.py``). Each gives, per form and head dim, the
least key length at which the form ran faster than the original graph in one run; tests check
them against their results files. A block is fused where its key length is known (a static
shape, or the lengths the user says the model runs at) and at or past the crossover at every such
length. Where the length is known only at run time, a block whose fused form wins at some measured
length is written as an ONNX ``If`` on the run's length (pipeline/length_dispatch.py: the fused form
from the crossover, the original ops below, one condition per distinct length shared by the blocks;
its cost in benchmarks/results/length_dispatch.md), on the CPU EP where ortflash's op runs; a block
whose form wins at no measured length keeps the original ops. The row says which form was chosen
and why in one sentence; ``FormChoice.detail`` says it whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from ..op.policy import SoftmaxPolicy

# The kinds of block the table has a row for, by what the fused node reads besides Q, K and V:
# nothing; a padding bias or mask broadcast over the queries ([B, 1, 1, Sk]); is_causal (with at
# most a padding part: the kernels skip the tiles past the diagonal); a full bias or mask with a
# row per query ([B, H, Sq, Sk], T5's position bias), which the kernels read whole.
MASK_KINDS = ("none", "padding", "causal", "bias")
# mask kind -> the stack of benchmarks/crossover.py that measured it, and its results files: the
# CPU-time run (one thread per worker) and, where one was made, the wall-time run (the libraries'
# own threads).
RESULTS_FILES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "padding": ("crossover_cpu", "crossover_cpu_wall"),
        "none": ("crossover_cpu_nomask",),
        "causal": ("crossover_cpu_causal_mask",),
        "bias": ("crossover_cpu_bias",),
    }
)
# The wall-time run of the padding stack bounds the kinds that have none: threads are what
# separates the two measurements (ONNX Runtime's unfused ops spread over cores better than the
# kernel does at short lengths), and that holds for every mask.
WALL_FOR_ALL = "crossover_cpu_wall"


def results_path(kind: str) -> str:
    return f"benchmarks/results/{RESULTS_FILES[kind][0]}.md"


# mask kind -> form -> head dim -> the least key length from which the form ran faster than the
# original ops on the CPU EP in every run that measured it, on this project's 2-core AMD EPYC with
# AVX2 (no AVX-512), 2026-12-01 (RESULTS_FILES, and WALL_FOR_ALL for kinds with no wall-time run of
# their own): the largest of their crossovers, so a form is chosen only where no measurement says
# it is slower. None: at no measured length up to MEASURED_UP_TO in one of them.
# The table does not carry across CPU classes, nor across kernel versions: on the 2-core AVX-512
# Xeon with the kernel of issue 30 items 1-2 (worker pool, direct path to 64 rows), the padding
# stack's naive and online forms won from S = 64 (D = 32) and 16 (D = 64) in two runs, contrib and
# onnx at none below 1024 (benchmarks/results/crossover_cpu_avx512{,_run2,_nomask}.md; one round
# each, CPU time). A row per CPU class,
# chosen by ortflash.kernels.cpu.isa(), needs every kind re-measured on both classes first.
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


CPU_CROSSOVERS: Mapping[str, Mapping[str, Mapping[int, int | None]]] = MappingProxyType(
    {
        "padding": _rows({32: 2048, 64: 512}, {32: 2048, 64: 512}, {32: None, 64: None}, {32: None, 64: None}),
        # no padded key tile to skip: the kernel does the unfused graph's work, and loses to its sgemm
        "none": _rows({32: None, 64: None}, {32: 2048, 64: None}, {32: None, 64: None}, {32: None, 64: 1024}),
        "causal": _rows({32: 2048, 64: 512}, {32: 2048, 64: 1024}, {32: None, 64: None}, {32: None, 64: None}),
        # a [1, H, S, S] bias read whole by every form: none beat the original at any measured length
        "bias": _rows({32: None, 64: None}, {32: None, 64: None}, {32: None, 64: None}, {32: None, 64: None}),
    }
)

# The same for ONNX Runtime's WebGPU EP (the onnxruntime-ep-webgpu 0.4.0 plugin, Dawn on Vulkan, on
# an NVIDIA H200; wall time; benchmarks/crossover_webgpu.py -> WEBGPU_RESULTS): the `webgpu`
# target's output against the original graph. The padding stack's row stands for the kinds that
# were not measured (no mask, a full bias): it is the slower of the two measured. The causal
# stack's original is ONNX Attention with is_causal, which an export's mask subgraph is no faster than.
WEBGPU_RESULTS = "benchmarks/results/crossover_webgpu.md"
_WEBGPU_PADDING = MappingProxyType({"webgpu": MappingProxyType({32: 2048, 64: 2048})})
WEBGPU_CROSSOVERS: Mapping[str, Mapping[str, Mapping[int, int | None]]] = MappingProxyType(
    {
        "padding": _WEBGPU_PADDING,
        "none": _WEBGPU_PADDING,
        "causal": MappingProxyType({"webgpu": MappingProxyType({32: 64, 64: 64})}),
        "bias": _WEBGPU_PADDING,
    }
)
# The same for ONNX Runtime's CUDA EP (onnxruntime-gpu 1.31.1 on an NVIDIA H200, its defaults: TF32
# on; wall time with inputs and outputs bound on the GPU; benchmarks/crossover_cuda.py ->
# CUDA_RESULTS): the `cuda` target's output against the original graph, by element type. In float32
# the original's TF32 products beat every form the target writes (MultiHeadAttention's float32
# kernels do not use them) at every measured length; in float16 cuDNN's flash attention wins from
# 2048 keys with a padding mask and 4096 with an exported causal mask, at every length without a
# mask, and never with a full bias ([1, H, S, S], read whole).
# The contrib target's blocks take the cuda row there: it writes the same MultiHeadAttention and
# GroupQueryAttention ops the cuda target chooses among (--ep cuda falls back to it where cuda
# cannot lower a block, GPT-Neo's), and was not measured apart.
CUDA_RESULTS = "benchmarks/results/crossover_cuda.md"


def _cuda_row(crossovers: Mapping[int, int | None]) -> Mapping[str, Mapping[int, int | None]]:
    row = MappingProxyType(dict(crossovers))
    return MappingProxyType({"cuda": row, "contrib": row})


_NEVER = _cuda_row({32: None, 64: None, 128: None})


CUDA_CROSSOVERS: Mapping[str, Mapping[str, Mapping[str, Mapping[int, int | None]]]] = MappingProxyType(
    {
        "float32": MappingProxyType({"padding": _NEVER, "none": _NEVER, "causal": _NEVER, "bias": _NEVER}),
        "float16": MappingProxyType(
            {
                "padding": _cuda_row({32: 2048, 64: 2048, 128: 2048}),
                "none": _cuda_row({32: 64, 64: 64, 128: 64}),
                "causal": _cuda_row({32: 4096, 64: 4096, 128: 4096}),
                "bias": _NEVER,
            }
        ),
    }
)
# A block whose element type is not known (or has no table of its own: bfloat16) takes this one's:
# its crossovers are at least every other's (tests/test_forms.py holds them to it).
CUDA_UNKNOWN_DTYPE = "float32"
# execution provider (None: none named, so the CPU EP) -> element type ("*": any) -> its table
ANY_DTYPE = "*"
TABLES: Mapping[str | None, Mapping[str, Mapping[str, Mapping[str, Mapping[int, int | None]]]]] = MappingProxyType(
    {
        None: MappingProxyType({ANY_DTYPE: CPU_CROSSOVERS}),
        "cpu": MappingProxyType({ANY_DTYPE: CPU_CROSSOVERS}),
        "webgpu": MappingProxyType({ANY_DTYPE: WEBGPU_CROSSOVERS}),
        "cuda": CUDA_CROSSOVERS,
    }
)
_UNKNOWN_DTYPE_TAKES = {"cuda": CUDA_UNKNOWN_DTYPE}
_RESULTS = {"webgpu": WEBGPU_RESULTS, "cuda": CUDA_RESULTS}


def table(ep: str | None, dtype: str | None) -> Mapping[str, Mapping[str, Mapping[int, int | None]]]:
    """The cost table of ``ep`` for blocks of element type ``dtype`` ("float32", "float16"; None or ""
    where not known): mask kind -> form -> head dim -> crossover."""
    by_dtype = TABLES[ep]
    if ANY_DTYPE in by_dtype:
        return by_dtype[ANY_DTYPE]
    return by_dtype.get(dtype or "", by_dtype[_UNKNOWN_DTYPE_TAKES[ep or "cpu"]])


MEASURED_UP_TO = 2048  # the CPU and WebGPU tables' longest key length; the CUDA table's below
CUDA_MEASURED_UP_TO = 4096
_KIND_NAMES = {"none": "no mask", "padding": "a padding mask", "causal": "causal", "bias": "a full bias"}
# The target whose blocks the table measured for each form: FlashAttention (naive or online by
# the policy) for ortflash, MultiHeadAttention for contrib, Attention-23 for onnx.
_TARGET_FORMS = {"contrib": "contrib", "onnx": "onnx", "webgpu": "webgpu", "cuda": "cuda"}


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
DISPATCH_EPS = (None, "cpu")


def form_at(target: str, policy: SoftmaxPolicy, key_len: int) -> str | None:
    """The table's form a block of ``target`` runs at ``key_len``; None where no table covers it."""
    if target == "ortflash":
        return policy.choose(key_len)
    return _TARGET_FORMS.get(target)


def mask_kind(is_causal: bool, bias_query_rows: tuple[int | None, ...]) -> str:
    """The table's row for a fused block: ``bias_query_rows`` holds, for its bias and its mask
    each (where present), the size of the query axis it has (1: broadcast over the queries; None:
    not proved, so taken as a row per query)."""
    if any(rows != 1 for rows in bias_query_rows):
        return "bias"
    if is_causal:
        return "causal"
    return "padding" if bias_query_rows else "none"


def crossover(
    form: str, head_dim: int | None, kind: str = "padding", ep: str | None = None, dtype: str | None = None
) -> int | None:
    """The form's crossover on ``ep`` for this head dim, mask kind and element type: the measured
    dims around it (the larger crossover of the two, None if either never wins); every dim's where
    the head dim is unknown."""
    by_dim = table(ep, dtype)[kind][form]
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
) -> FormChoice:
    """Fused, or the original ops kept, for one block of ``target``, mask ``kind`` and element type
    ``dtype`` (None: not known) that runs at ``key_lens`` (None: the length is known only at run
    time) on ``ep`` (None: the CPU EP, where ortflash's own op runs). ``can_dispatch``: the block
    can be written as an If on its run's length (it stays a FlashAttention node in the main graph):
    then a length known only at run time takes the fused form from the crossover
    (``FormChoice.dispatch_from``) wherever the table has one."""
    if ep not in TABLES:
        return FormChoice(True, f"fused as the target writes it: no measured cost table for the {ep} EP")
    longest = CUDA_MEASURED_UP_TO if ep == "cuda" else MEASURED_UP_TO
    probe = form_at(target, policy, longest)
    if probe is None or probe not in table(ep, dtype)[kind]:
        return FormChoice(True, f"fused as asked: no measured cost table for {target} on the {ep or 'cpu'} EP")
    dim = ("an unproved head dim" if head_dim is None else f"head dim {head_dim}") + f", {_KIND_NAMES[kind]}"
    if ANY_DTYPE not in TABLES[ep]:
        dim += (
            f", {dtype}"
            if dtype in TABLES[ep]
            else f", an element type without a table of its own (as {_UNKNOWN_DTYPE_TAKES[ep or 'cpu']})"
        )
    results = _RESULTS.get(ep or "", results_path(kind))
    if key_lens is None:
        lowest = crossover(probe, head_dim, kind, ep, dtype)
        start = _fused_from(target, policy, head_dim, kind, ep, dtype, lowest)
        if start is not None and can_dispatch and ep in DISPATCH_EPS:
            return _dispatched(target, policy, start, dim, results)
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
        return FormChoice(
            False,
            short,
            f"kept the original ops, the faster form here: the key length is known only at run time, and {where} "
            f"({dim}, {results}); --seq-lens says which lengths the model runs at, --target {target} fuses anyway",
        )
    for key_len in key_lens:
        form = form_at(target, policy, key_len)
        assert form is not None
        at = crossover(form, head_dim, kind, ep, dtype)
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
) -> int | None:
    """The least key length from which every form the block runs (auto: naive below min_seq_len,
    online from it) beats the original ops: ``lowest``, the longest form's crossover, raised to the
    other form's where the block runs that one there, or to where it stops running it."""
    if lowest is None:
        return None
    start = lowest
    form = form_at(target, policy, start)
    if form is not None and form != form_at(target, policy, MEASURED_UP_TO):
        at = crossover(form, head_dim, kind, ep, dtype)
        switch = policy.min_seq_len if policy.mode == "auto" and policy.min_seq_len is not None else MEASURED_UP_TO
        start = max(start, at) if at is not None else max(start, switch)
    return start


def _dispatched(target: str, policy: SoftmaxPolicy, lowest: int, dim: str, results: str) -> FormChoice:
    """The choice for a block whose length is known only at run time and whose fused form wins from
    ``lowest`` keys: the fused form from there, the original ops below, decided per run."""
    form = form_at(target, policy, lowest)
    decode = CPU_DECODE_CROSSOVER
    step = f"from {decode} keys" if decode is not None else "never"
    return FormChoice(
        True,
        f"{form} from {lowest} keys, original ops below",
        f"the key length is known only at run time: the model runs {form} from key length {lowest}, where it "
        f"beats the original ops ({dim}, {results}), and the original ops below, decided per run by an If on "
        f"the length (pipeline/length_dispatch.py); a one-query step against a KV cache takes it {step} "
        f"({DECODE_RESULTS}); --seq-lens fixes the form for the lengths given, with no If",
        dispatch_from=lowest,
        decode_from=decode,
    )
