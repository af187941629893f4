"""Which form a fused block takes where the user leaves the choice open: the one that runs fastest
where the model runs, by a measured cost table, never a form predicted to be slower than the
original ops.

The table (``CPU_CROSSOVERS``) comes from ``benchmarks/crossover.py``: for each form and head dim,
the least key length at which the form ran faster than the original graph, in one run, on this
project's CPU class (``benchmarks/results/crossover_cpu.json``; a test checks the two agree).
A block is fused where its key length is known (a static shape, or the lengths the user says the
model runs at) and at or past the crossover at every such length. Where the length is known only
at run time, the original ops stay: an ONNX ``If`` that dispatches on the length costs more per
block and run on ONNX Runtime's CPU EP than the short side saves (``if_dispatch`` in the same
results), and the fused form loses below the crossover. The row says which form was chosen and why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from .policy import SoftmaxPolicy

RESULTS = "benchmarks/results/crossover_cpu.md"
# form -> head dim -> the least key length from which the form ran faster than the original ops on
# the CPU EP in both runs of benchmarks/crossover.py on this project's 2-core AMD EPYC with AVX2
# (no AVX-512), 2026-12-01: CPU time at one thread per worker (RESULTS), and wall time at the
# libraries' own threads on the loaded machine (crossover_cpu_wall.md). The larger of the two:
# a form is chosen only where neither measurement says it is slower. None: at no measured length
# up to MEASURED_UP_TO in one of them.
CPU_CROSSOVERS: Mapping[str, Mapping[int, int | None]] = MappingProxyType(
    {
        "naive": MappingProxyType({32: 2048, 64: 512}),
        "online": MappingProxyType({32: 2048, 64: 512}),
        "contrib": MappingProxyType({32: None, 64: None}),
        "onnx": MappingProxyType({32: None, 64: None}),
    }
)
MEASURED_UP_TO = 2048
# The target whose blocks the table measured for each form: FlashAttention (naive or online by
# the policy) for ortflash, MultiHeadAttention for contrib, Attention-23 for onnx.
_TARGET_FORMS = {"contrib": "contrib", "onnx": "onnx"}


@dataclass(frozen=True)
class FormChoice:
    fused: bool
    why: str


def form_at(target: str, policy: SoftmaxPolicy, key_len: int) -> str | None:
    """The table's form a block of ``target`` runs at ``key_len``; None where no table covers it."""
    if target == "ortflash":
        return policy.choose(key_len)
    return _TARGET_FORMS.get(target)


def crossover(form: str, head_dim: int | None) -> int | None:
    """The form's crossover for this head dim: the measured dims around it (the larger crossover
    of the two, None if either never wins); every dim's where the head dim is unknown."""
    by_dim = CPU_CROSSOVERS[form]
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


def choose(target: str, policy: SoftmaxPolicy, head_dim: int | None, key_lens: Sequence[int] | None) -> FormChoice:
    """Fused, or the original ops kept, for one block of ``target`` that runs at ``key_lens``
    (None: the length is known only at run time)."""
    probe = form_at(target, policy, MEASURED_UP_TO)
    if probe is None:
        return FormChoice(True, f"no measured cost table for {target} on the CPU EP: fused as asked")
    dim = "an unproved head dim" if head_dim is None else f"head dim {head_dim}"
    if key_lens is None:
        lowest = crossover(probe, head_dim)
        where = (
            f"{probe} beats the original ops only from key length {lowest}"
            if lowest is not None
            else f"{probe} beat the original ops at no measured key length up to {MEASURED_UP_TO}"
        )
        return FormChoice(
            False,
            f"kept the original ops, the faster form here: the key length is known only at run time, and {where} "
            f"({dim}, {RESULTS}); --seq-lens says which lengths the model runs at, --target {target} fuses anyway",
        )
    for key_len in key_lens:
        form = form_at(target, policy, key_len)
        assert form is not None
        at = crossover(form, head_dim)
        if at is None or key_len < at:
            beats = f"from {at}" if at is not None else f"at no measured length up to {MEASURED_UP_TO}"
            return FormChoice(
                False,
                f"kept the original ops, the faster form here: at key length {key_len}, {form} beats them only {beats} "
                f"({dim}, {RESULTS}); --target {target} fuses anyway",
            )
    lengths = ", ".join(map(str, key_lens))
    return FormChoice(True, f"{probe} is faster than the original ops at key length {lengths} ({dim}, {RESULTS})")
