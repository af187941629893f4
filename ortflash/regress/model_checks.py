"""Running a manifest: each model optimized for each target, then counted, opened, compared, timed.

One model file is one unit of work (its targets share the original and its inputs); ``jobs > 1``
runs files in that many worker processes. Every check is made through the public pipeline and
the checks the CLI runs (``ortflash.optimize``, ``pipeline.first_run``, ``checks.verify.verify_every_softmax``,
``ortflash.bench``), so a row here fails exactly where ``ortflash optimize --verify`` would.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from ..checks.compare import OutputDiff
from ..checks.feeds import make_feeds, read_feeds
from ..checks.verify import verify_every_softmax
from ..errors import OrtflashError
from ..model_io import load
from ..pipeline.first_run import first_run
from ..pipeline.optimize import optimize
from ..report import Report
from ..testing import counted_blocks
from .manifest import Baseline, InputCase, ModelCheck

# The row of a model's performance check (its targets' rows are named by the target).
BENCH_ROW = "bench"


@dataclass
class CheckResult:
    """One row: one model for one target (or its performance against the baseline)."""

    model: str  # the path as the manifest names it
    target: str  # ortflash | contrib | onnx, or BENCH_ROW
    expected: int | None = None  # blocks the manifest expects (None: no expectation recorded)
    fused: int | None = None  # blocks that became what the target asks for
    found: int | None = None  # Softmax / Attention nodes in the model
    problems: list[str] = field(default_factory=list)  # regressions, in words: any makes the row fail
    notes: list[str] = field(default_factory=list)
    # the block count against the expectation when it is not a regression (none recorded, or more
    # than expected), shown in the row; and whether problems[0] is a count below the expectation
    count_note: str = ""
    count_regressed: bool = False
    max_abs: float | None = None  # worst absolute error over every compared output and run
    of_tolerance: float | None = None  # worst err / tolerance (ok where <= 1)
    softmax: list[str] = field(default_factory=list)  # softmaxes the fused nodes ran
    verifications: list[dict[str, Any]] = field(default_factory=list)  # each case's `verification` JSON
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def name(self) -> str:
        return f"{self.model}[{self.target}]"


def _diff_text(diff: OutputDiff) -> str:
    if diff.problem:
        return f"{diff.name}: {diff.problem}"
    where = "" if diff.worst_index is None else f" at {list(diff.worst_index)}"
    return (
        f"{diff.name}: max abs err {diff.max_abs:.3g}{where}, err / tolerance {diff.of_tolerance:.3g}, "
        f"NaN mismatches {diff.nan_mismatch}"
    )


def _finite_max(values: Sequence[float], start: float | None) -> float | None:
    finite = [v for v in values if np.isfinite(v)]
    if not finite:
        return start
    return max([*finite, *([start] if start is not None else [])])


def _count_blocks(row: CheckResult, report: Report, target: str) -> None:
    row.fused, row.found = counted_blocks(report, target), len(report.blocks)
    if row.expected is None:
        row.count_note = f"no expectation recorded: {row.fused} fused (regress --update records it)"
    elif row.fused < row.expected:
        missed = [b for b in report.blocks if not b.fused or (target != "ortflash" and b.needs_ortflash)]
        why = "; ".join(f"{b.name}: {b.reason or 'no reason recorded'}" for b in missed[:3])
        more = f" (and {len(missed) - 3} more)" if len(missed) > 3 else ""
        row.problems.append(f"{row.fused} of {row.expected} expected blocks fused; kept {why}{more}")
        row.count_regressed = True
    elif row.fused > row.expected:
        fused = f"{row.fused} block{'' if row.fused == 1 else 's'} fused"
        row.count_note = f"{fused}, {row.expected} expected (regress --update records it)"


def _compare(row: CheckResult, check: ModelCheck, optimized: onnx.ModelProto, case: InputCase | None) -> None:
    """One case: prove the optimized model against the original, every fused node in each softmax it runs."""
    user_feeds = read_feeds(check.feeds) if check.feeds else None
    verification = verify_every_softmax(
        check.file,
        optimized,
        feeds=user_feeds,
        seq_len=case.seq_len if case else 16,
        batch=case.batch if case else 2,
        dims=case.dims if case else None,
        rtol=check.rtol,
        atol=check.atol,
        weights_dir=os.path.dirname(check.file),
        opt_level=check.ort_opt_level,
    )
    row.verifications.append(verification.to_dict())
    diffs = [d for run in verification.runs for d in run.diffs]
    row.max_abs = _finite_max([d.max_abs for d in diffs], row.max_abs)
    row.of_tolerance = _finite_max([d.of_tolerance for d in diffs], row.of_tolerance)
    row.softmax = sorted(set(row.softmax) | {m for run in verification.runs for m in run.modes.values()})
    label = f"inputs {case.label()}" if case else "the manifest's feeds"
    for run in verification.runs:
        for diff in run.diffs:
            if not diff.ok:
                row.problems.append(f"outputs differ ({label}, {run.why}): {_diff_text(diff)}")


def _check_target(check: ModelCheck, target: str, original: onnx.ModelProto) -> CheckResult:
    row = CheckResult(check.shown, target, expected=check.blocks[target])
    try:
        optimized, report = optimize(original, policy=check.policy, target=target)
    except OrtflashError as exc:
        row.problems.append(f"optimize failed: {exc}")
        return row
    _count_blocks(row, report, target)
    cases: Sequence[InputCase | None] = (None,) if check.feeds else check.cases
    if check.feeds:
        feeds = read_feeds(check.feeds)
    else:
        first = check.cases[0]
        feeds = make_feeds(original, seq_len=first.seq_len, batch=first.batch, dims=dict(first.dims))
    weights_dir = os.path.dirname(check.file)
    opened = first_run(optimized, weights_dir=weights_dir, original=check.file, feeds=feeds)
    if opened.problem:
        row.problems.append(f"ONNX Runtime cannot use the optimized model: {opened.problem}")
        return row
    if opened.note:
        row.notes.append(opened.note)
    for case in cases:
        try:
            _compare(row, check, optimized, case)
        except OrtflashError as exc:
            row.problems.append(f"could not compare: {exc}")
    return row


def _check_speed(check: ModelCheck, baseline: Baseline) -> CheckResult:
    """The model's variants timed as the baseline was, and each time ratio to the original against it."""
    from ..bench import bench, compare_baseline, load_baseline

    row = CheckResult(check.shown, BENCH_ROW)
    old = load_baseline(baseline.file)
    config = old.get("config", {})
    measured = sorted({(r["variant"], r["seq_len"]) for r in old["runs"]})
    results = bench(
        check.file,
        seq_lens=sorted({s for _, s in measured}),
        variants=sorted({v for v, _ in measured}, key=lambda v: (v != "original", v)),
        batch=int(config.get("batch", 1)),
        repeats=int(config.get("repeats", 5)),
        warmup=int(config.get("warmup", 1)),
        block_size=int(config.get("block_size", 128)),
        threads=config.get("threads"),
        profile=False,
        plot=False,
        progress=False,
    )
    comparison = compare_baseline(results, old, baseline.max_slowdown)
    row.problems += comparison.regressions
    row.notes += [line for line in comparison.lines if line not in comparison.regressions]
    return row


def check_model(check: ModelCheck) -> list[CheckResult]:
    """Every row of one model file: one per target, and the performance row where a baseline is given."""
    try:
        original = load(check.file)
    except OrtflashError as exc:
        return [CheckResult(check.shown, t, check.blocks[t], problems=[f"unloadable: {exc}"]) for t in check.targets]
    rows = []
    for target in check.targets:
        started = time.perf_counter()
        try:
            row = _check_target(check, target, original)
        except OrtflashError as exc:  # inputs the original cannot take, say
            row = CheckResult(check.shown, target, check.blocks[target], problems=[str(exc)])
        row.seconds = time.perf_counter() - started
        rows.append(row)
    if check.baseline is not None:
        started = time.perf_counter()
        try:
            row = _check_speed(check, check.baseline)
        except OrtflashError as exc:
            row = CheckResult(check.shown, BENCH_ROW, problems=[f"could not time it: {exc}"])
        row.seconds = time.perf_counter() - started
        rows.append(row)
    return rows


def run_checks(
    checks: Sequence[ModelCheck],
    jobs: int = 1,
    on_done: Callable[[ModelCheck, list[CheckResult]], None] | None = None,
) -> list[CheckResult]:
    """Every row of every model, in manifest order; ``jobs`` worker processes (1: this process).

    ``on_done`` is called in this process as each model finishes (for progress).
    """
    done: dict[int, list[CheckResult]] = {}
    if jobs <= 1:
        for i, check in enumerate(checks):
            done[i] = check_model(check)
            if on_done:
                on_done(check, done[i])
    else:
        # spawn, not fork: ONNX Runtime's thread pools do not survive a fork
        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures: dict[Future[list[CheckResult]], int] = {
                pool.submit(check_model, check): i for i, check in enumerate(checks)
            }
            for future in as_completed(futures):
                i = futures[future]
                done[i] = future.result()
                if on_done:
                    on_done(checks[i], done[i])
    return [row for i in range(len(checks)) for row in done[i]]
