"""What verify returns: one comparison (VerifyRun) and the whole check (Verification), as the CLI,
the API and the JSON read them; and the ONNX Runtime optimization level verify runs at."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .compare import OutputDiff

# The graph optimization level verify runs both models at unless told otherwise. Disabled, because
# verify compares what the two graphs compute: ONNX Runtime's own fusions rewrite the original's
# attention (and other subgraphs) but not the FlashAttention nodes that replaced it, so at any
# other level a difference can come from ONNX Runtime's rewrites rather than ortflash's (one
# BERT's output moved by 6.6e-05 at the default level; with optimizations off it is identical).
VERIFY_OPT_LEVEL = "disable"


@dataclass
class VerifyRun:
    """One comparison: on which inputs, which softmax each fused node ran, and the result."""

    why: str  # e.g. "as configured", "at 1024 keys, where auto runs online", "online forced"
    inputs: dict[str, list[int]]  # input name -> shape
    modes: dict[str, str]  # fused node -> the softmax it ran
    key_lengths: dict[str, int]  # fused node -> keys it saw
    diffs: list[OutputDiff]
    # output -> the model's own noise on these inputs, where beyond the tolerance (checks/noise)
    noise: dict[str, float] = field(default_factory=dict)
    # If on the length -> the side it ran ("fused" or "original ops"), read from its condition
    dispatch: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(d.ok for d in self.diffs)


@dataclass
class Verification:
    """Every run ``prove`` made, the tolerance in force, and what it had to force."""

    rtol: float
    atol: float
    ort_opt_level: str = VERIFY_OPT_LEVEL  # the graph optimization level both models ran at
    runs: list[VerifyRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # forced modes and why, in words
    deployed: dict[str, list[str]] = field(default_factory=dict)  # fused node -> softmaxes it runs deployed

    @property
    def ok(self) -> bool:
        return all(run.ok for run in self.runs)

    @property
    def noise(self) -> dict[str, float]:
        """Output -> the model's own noise, the largest over the runs (outputs within the tolerance left out)."""
        worst: dict[str, float] = {}
        for run in self.runs:
            for name, value in run.noise.items():
                worst[name] = max(value, worst.get(name, 0.0))
        return worst

    def to_dict(self) -> dict[str, Any]:
        return {
            "rtol": self.rtol,
            "atol": self.atol,
            "noise": self.noise,
            "ort_opt_level": self.ort_opt_level,
            "ok": self.ok,
            "notes": list(self.notes),
            "deployed_softmax": {k: list(v) for k, v in self.deployed.items()},
            "runs": [
                {
                    "why": r.why,
                    "inputs": r.inputs,
                    "softmax": r.modes,
                    "key_lengths": r.key_lengths,
                    "noise": r.noise,
                    "length_dispatch": r.dispatch,
                    "ok": r.ok,
                    "outputs": [diff_dict(d) for d in r.diffs],
                }
                for r in self.runs
            ],
        }


def diff_dict(diff: OutputDiff) -> dict[str, Any]:
    """An OutputDiff for JSON: infinite errors (incomparable outputs) as null, the problem in words."""

    def finite(x: float) -> float | None:
        return x if np.isfinite(x) else None

    return {
        "name": diff.name,
        "max_abs": finite(diff.max_abs),
        "max_rel": finite(diff.max_rel),
        "of_tolerance": finite(diff.of_tolerance),
        "nan_mismatch": diff.nan_mismatch,
        "problem": diff.problem or None,
        "ok": diff.ok,
    }
