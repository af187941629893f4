"""Which target a model is written for where the user leaves it open: per execution provider, the
first of its targets that lowers every fused block and loads (``--target auto --ep``); by default
ortflash's own op, or ONNX Runtime's where fused blocks feed a quantizer. Each candidate is built by
the pipeline's ``run`` and proved loadable by its ``check`` (ortflash/optimize.py)."""

from __future__ import annotations

from collections.abc import Callable

import onnx

from ..lowering.targets import DEFAULT_TARGET, ORT_KERNEL_TARGETS, PROVIDERS, REGISTRY, TARGETS
from ..report import Report, TargetChoice

AUTO = "auto"  # target: the first of PROVIDERS[ep].targets that loads and lowers every fused block

# Why ONNX Runtime cannot load (or, lowered, run once) a candidate model; None when it can.
LoadCheck = Callable[[onnx.ModelProto, Report], "str | None"]


def unlowered(report: Report, rows: list[int] | None = None) -> list[str]:
    """Names of the fused blocks (of ``rows``, default all) that stay FlashAttention."""
    chosen = range(len(report.blocks)) if rows is None else rows
    return [report.blocks[i].name for i in chosen if report.blocks[i].needs_ortflash]


def choose_for_ep(
    ep: str, run: Callable[[str], tuple[onnx.ModelProto, Report]], check: LoadCheck
) -> tuple[onnx.ModelProto, Report]:
    """The first target of PROVIDERS[ep].targets (those this ortflash has) that lowers every fused block
    and loads; else the loadable candidate keeping the fewest blocks FlashAttention."""
    candidates = [t for t in PROVIDERS[ep].targets if t in TARGETS]
    tried: list[str] = []
    fallback: tuple[onnx.ModelProto, Report, str] | None = None
    first: tuple[onnx.ModelProto, Report] | None = None
    for candidate in candidates:
        model, report = run(candidate)
        first = first or (model, report)
        if not report.fused:
            report.target = TargetChoice(AUTO, ep, candidate, "no block fused: the model is unchanged", tried)
            return model, report
        kept = [] if REGISTRY[candidate].needs_ortflash else unlowered(report)
        problem = check(model, report)
        if problem is None and not kept:
            why = f"the first of {', '.join(candidates)} (the order for {ep}) that lowers every block and loads"
            report.target = TargetChoice(AUTO, ep, candidate, why, tried)
            return model, report
        if problem is not None:
            tried.append(f"{candidate}: ONNX Runtime cannot take it ({problem})")
            continue
        tried.append(f"{candidate}: {len(kept)} of {report.fused} fused blocks not lowered ({', '.join(kept[:3])})")
        if fallback is None or len(kept) < len(unlowered(fallback[1])):
            fallback = model, report, candidate
    if fallback is None:  # the caller's own load check says why, with nothing written (exit 1 in the CLI)
        assert first is not None
        model, report = first
        why = f"ONNX Runtime cannot load the model for any of {', '.join(candidates)}"
        report.target = TargetChoice(AUTO, ep, candidates[0], why, tried)
        return model, report
    model, report, candidate = fallback
    staying = len(unlowered(report))
    if staying == report.fused:
        why = (
            f"no target of {', '.join(candidates)} lowers any block: written for {candidate}, the first that loads, "
            f"where those block(s) keep their original ops"
        )
    else:
        why = (
            f"no target of {', '.join(candidates)} lowers every block; {candidate} lowers the most, "
            f"and {staying} block(s) it cannot lower keep their original ops"
        )
    # the chosen one is said in `why`; `tried` lists the others passed over
    others = [t for t in tried if not t.startswith(f"{candidate}:")]
    report.target = TargetChoice(AUTO, ep, candidate, why, others)
    return model, report


def choose_default(
    run: Callable[[str], tuple[onnx.ModelProto, Report]], check: LoadCheck
) -> tuple[onnx.ModelProto, Report]:
    """ortflash; where fused blocks feed a quantizer, contrib or else onnx when it lowers every such block
    and loads: there a float32 rounding difference can become a different integer downstream."""
    model, report = run(DEFAULT_TARGET)
    sensitive = [i for i, b in enumerate(report.blocks) if b.fused and b.rounding]
    if not sensitive:
        report.target = TargetChoice(None, None, DEFAULT_TARGET, "the default")
        return model, report
    names = ", ".join(report.blocks[i].name for i in sensitive[:3]) + (" ..." if len(sensitive) > 3 else "")
    tried: list[str] = []
    for candidate in ORT_KERNEL_TARGETS:
        lowered_model, lowered_report = run(candidate)
        kept = unlowered(lowered_report, sensitive)
        problem = None if kept else check(lowered_model, lowered_report)
        if not kept and problem is None:
            why = (
                f"{len(sensitive)} fused block(s) feed a quantizer ({names}), where a float32 rounding "
                f"difference can flip an integer downstream: {candidate} lowers them all to ONNX Runtime's "
                "own ops, which matched the original graph bit for bit on the CPU EP where measured; "
                "ortflash's kernel rounds differently (--target ortflash keeps it)"
            )
            lowered_report.target = TargetChoice(None, None, candidate, why, tried)
            return lowered_model, lowered_report
        tried.append(
            f"{candidate}: "
            + (f"does not lower {', '.join(kept[:3])}" if kept else f"ONNX Runtime cannot take it ({problem})")
        )
    why = (
        f"{len(sensitive)} fused block(s) feed a quantizer ({names}), but neither contrib nor onnx lowers "
        "them all and loads: they stay FlashAttention; check with real inputs (--verify --feeds)"
    )
    report.target = TargetChoice(None, None, DEFAULT_TARGET, why, tried)
    return model, report
