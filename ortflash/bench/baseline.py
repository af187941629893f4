"""The performance regression guard: time ratios to ``original`` against a baseline's.

Ratios are measured within one run (variant time / original time, same machine, same load),
so a baseline written on one machine still guards a run on another. A (variant, S) regresses
when its ratio is worse than the baseline's ratio times ``max_slowdown``, or when it failed
where the baseline measured it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import OrtflashError
from .report import ok_run, seq_label

REFERENCE_VARIANT = "original"


@dataclass
class BaselineCheck:
    max_slowdown: float
    lines: list[str] = field(default_factory=list)  # one per compared (variant, S), regressions first
    regressions: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.regressions


def load_baseline(path: str | Path) -> dict[str, Any]:
    """A results JSON written by ``ortflash bench``; raises OrtflashError (exit 2) when unusable."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise OrtflashError(f"{path}: cannot read the baseline ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise OrtflashError(f"{path}: not a JSON file ({exc.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list) or "config" not in data:
        raise OrtflashError(f"{path}: not the JSON of an `ortflash bench` run")
    return data


def time_ratio(results: dict[str, Any], variant: str, s: int, clock: str = "wall") -> float | None:
    """Median latency of variant / that of ``original`` at S, in one run; None if either is missing.
    ``clock``: ``wall``, or ``cpu`` (the workers' own CPU time)."""
    key = "cpu_median" if clock == "cpu" else "median"
    run, base = ok_run(results, variant, s), ok_run(results, REFERENCE_VARIANT, s)
    if run is None or base is None or not base["latency_ms"].get(key) or not run["latency_ms"].get(key):
        return None
    return float(run["latency_ms"][key] / base["latency_ms"][key])


def clock_of(results: dict[str, Any], baseline: dict[str, Any]) -> str:
    """CPU time where both runs measured one thread per worker: then a run's CPU time is its own
    work, which other load on a shared machine does not change (wall time can move 2x there)."""
    one_thread = all(r.get("config", {}).get("threads") == 1 for r in (results, baseline))
    return "cpu" if one_thread else "wall"


def compare(results: dict[str, Any], baseline: dict[str, Any], max_slowdown: float) -> BaselineCheck:
    """Check every (variant, S) measured in both runs; raise when nothing can be compared."""
    check = BaselineCheck(max_slowdown)
    clock = clock_of(results, baseline)
    notes: list[str] = []
    measured = {(r["variant"], r["seq_len"]): r for r in results["runs"]}
    for old in baseline["runs"]:
        v, s = old["variant"], old["seq_len"]
        base_ratio = time_ratio(baseline, v, s, clock)
        if v == REFERENCE_VARIANT or base_ratio is None:
            continue
        where = f"{v} at S={seq_label(s)}"
        new = measured.get((v, s))
        if new is None:
            notes.append(f"{where}: not in this run")
            continue
        ratio = time_ratio(results, v, s, clock)
        if ratio is None:
            status = new.get("status", "?") if new.get("status") != "ok" else f"{REFERENCE_VARIANT} not measured"
            if status in ("unavailable", "skipped"):
                notes.append(f"{where}: {status} in this run ({new.get('error', '')})")
            else:
                check.regressions.append(f"{where}: {status} here, measured in the baseline ({new.get('error', '')})")
            continue
        limit = base_ratio * max_slowdown
        text = (
            f"{where}: {ratio:.3f}x the original's {clock} time (baseline {base_ratio:.3f}x, "
            f"limit {limit:.3f}x = baseline x {max_slowdown:g})"
        )
        if ratio > limit:
            check.regressions.append("REGRESSION " + text)
        else:
            check.lines.append("ok " + text)
    if not check.lines and not check.regressions:
        raise OrtflashError(
            "the baseline shares no measured (variant, S) with this run: nothing to compare"
            + (f" ({'; '.join(notes)})" if notes else "")
        )
    check.lines = check.regressions + check.lines + notes
    return check
