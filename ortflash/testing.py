"""Assertions for pytest users: a model still fuses, and an optimized model still computes the same.

    from ortflash.testing import assert_equivalent, assert_fuses

    def test_my_model_keeps_fusing():
        fused = assert_fuses("my_model.onnx", blocks=12, target="contrib")
        assert_equivalent("my_model.onnx", fused)

Each raises ``AssertionError`` with what a failure needs to be read: the Softmax nodes kept and
the precondition that failed at each, or per output the worst element, its index and both values.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx

from .api import VerifyResult, verify
from .checks.compare import OutputDiff
from .model_io import ModelLike
from .pipeline.optimize import optimize
from .report import Block, Report

__all__ = ["assert_fuses", "assert_equivalent", "counted_blocks"]


def counted_blocks(report: Report, target: str) -> int:
    """Blocks that became what ``target`` asks for: FlashAttention nodes (``ortflash``) or native ops."""
    if target == "ortflash":
        return report.fused
    return sum(1 for b in report.blocks if b.lowered_to)


def _block_line(block: Block, target: str) -> str:
    if not block.fused:
        return f"  kept {block.name}: {block.reason or 'no reason recorded'}"
    return f"  stays FlashAttention (not lowered to {target}) {block.name}: {block.reason or 'no reason recorded'}"


def assert_fuses(
    model: ModelLike,
    blocks: int,
    target: str = "ortflash",
    *,
    softmax: str | None = None,
) -> onnx.ModelProto:
    """Optimize ``model`` for ``target`` and assert that exactly ``blocks`` attention blocks became
    FlashAttention nodes (``ortflash``) or native ops (``contrib``, ``onnx``). Returns the optimized model.

    On failure the message lists every Softmax (or Attention) node that was kept, and why.
    """
    optimized, report = optimize(model, softmax=softmax, target=target)
    got = counted_blocks(report, target)
    if got == blocks:
        return optimized
    missed = [b for b in report.blocks if not b.fused or (target != "ortflash" and b.needs_ortflash)]
    lines = [
        f"expected {blocks} attention block(s) fused for target {target!r}, got {got} "
        f"({len(report.blocks)} Softmax/Attention node(s) in the model)"
    ]
    lines += [_block_line(b, target) for b in missed]
    if got > blocks:
        lines.append(f"  ({got - blocks} more than expected: the model has more attention blocks than {blocks})")
    elif not missed:
        lines.append(
            f"  (all {len(report.blocks)} Softmax/Attention node(s) were fused: the model has fewer attention blocks "
            f"than {blocks})"
        )
    raise AssertionError("\n".join(lines))


def _index_text(index: tuple[int, ...] | None) -> str:
    return "[" + ", ".join(str(i) for i in index) + "]" if index is not None else "[]"


def _diff_line(diff: OutputDiff) -> str:
    if diff.problem:
        return f"  {diff.name}: {diff.problem}"
    where = (
        f"worst at {_index_text(diff.worst_index)}: expected {diff.worst_expected!r}, got {diff.worst_actual!r}"
        if diff.worst_index is not None
        else "no differing element"
    )
    return (
        f"  {diff.name}: {where}; max abs err {diff.max_abs:.3g}, err / tolerance {diff.of_tolerance:.3g}, "
        f"NaN mismatches {diff.nan_mismatch}"
    )


def assert_equivalent(
    original: ModelLike,
    optimized: ModelLike,
    feeds: Mapping[str, np.ndarray] | None = None,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    softmax: str | None = None,
    dims: Mapping[str, int] | None = None,
) -> VerifyResult:
    """Assert that ``optimized`` computes what ``original`` does in ONNX Runtime (``ortflash.verify``),
    each fused node in every softmax it runs deployed. Returns the result.

    On failure the message shows, per output that differs, the worst element's index and both values.
    """
    result = verify(original, optimized, feeds, rtol=rtol, atol=atol, softmax=softmax, dims=dims)
    if result.ok:
        return result
    lines = [f"the optimized model differs from the original (rtol {result.rtol:g}, atol {result.atol:g})"]
    for run in result.runs:
        bad = [d for d in run.diffs if not d.ok]
        if not bad:
            continue
        inputs = ", ".join(f"{name} {list(shape)}" for name, shape in run.inputs.items())
        modes = ", ".join(sorted(set(run.modes.values()))) or "no fused node"
        lines.append(f" {run.why} (inputs {inputs}; softmax {modes}):")
        lines += [_diff_line(d) for d in bad]
    raise AssertionError("\n".join(lines))
