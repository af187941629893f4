"""The one comparison of an output with the value it must equal, and the one tolerance default."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from ..model_io import graphs_of

# (rtol, atol): float32 rounding, and looser where the model computes in float16.
FLOAT32_TOLERANCE = (1e-4, 1e-5)
FLOAT16_TOLERANCE = (2e-2, 2e-3)


@dataclass
class OutputDiff:
    name: str
    max_abs: float
    max_rel: float
    nan_mismatch: int
    ok: bool
    # what makes the values incomparable, in words (a missing output, a changed shape or dtype);
    # the errors are then infinite and mean nothing
    problem: str = ""
    # the worst error as a fraction of what the tolerance allows there, max |a - e| / (atol + rtol |e|):
    # within tolerance where <= 1 (max_rel alone can exceed rtol on values near zero, where atol rules)
    of_tolerance: float = 0.0
    # where that worst error is (an index into the output; None when no element differs or the outputs
    # are incomparable), and the two values there: what a failed assertion shows (a NaN mismatch first)
    worst_index: tuple[int, ...] | None = None
    worst_expected: float = float("nan")
    worst_actual: float = float("nan")


def _incomparable(name: str, problem: str) -> OutputDiff:
    return OutputDiff(name, float("inf"), float("inf"), 0, False, problem, float("inf"))


def shape_text(shape: tuple[int, ...] | list[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def compare(expected: np.ndarray, actual: np.ndarray, name: str, rtol: float, atol: float) -> OutputDiff:
    """Worst absolute and relative error, NaN mismatches, and whether ``actual`` is within tolerance.

    Within tolerance means ``|actual - expected| <= atol + rtol * |expected|`` everywhere
    (numpy's ``allclose``); the relative error reported is ``|actual - expected| / (|expected| + atol)``.
    """
    if expected.shape != actual.shape:
        return _incomparable(name, f"shape changed from {shape_text(expected.shape)} to {shape_text(actual.shape)}")
    if expected.dtype != actual.dtype:
        return _incomparable(name, f"dtype changed from {expected.dtype} to {actual.dtype}")
    if not np.issubdtype(expected.dtype, np.floating):
        bad = int(np.sum(expected != actual))
        if bad == 0:
            return OutputDiff(name, 0.0, 0.0, 0, True, "", 0.0)
        first = tuple(int(i) for i in np.unravel_index(int(np.flatnonzero(expected != actual)[0]), expected.shape))
        return OutputDiff(
            name,
            float(bad),
            float(bad),
            0,
            False,
            "",
            float("inf"),
            first,
            float(expected[first]),
            float(actual[first]),
        )
    e, a = expected.astype(np.float64), actual.astype(np.float64)
    nan_mismatch = int(np.sum(np.isnan(e) != np.isnan(a)))
    # equal infinities agree (inf - inf would be NaN); an infinity against anything else does
    # not, though |e| = inf would make the tolerance below infinite
    same_inf = np.isinf(e) & (e == a)
    both = ~(np.isnan(e) | np.isnan(a) | same_inf)
    want, got = e[both], a[both]
    with np.errstate(invalid="ignore"):
        diff = np.abs(want - got)
        rel = diff / (np.abs(want) + atol)
    rel[np.isnan(rel)] = np.inf  # inf / inf: an infinity against another value
    allowed = atol + rtol * np.abs(want)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(diff == 0, 0.0, diff / allowed)
    ratio[np.isnan(ratio)] = np.inf  # inf / inf again
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = float(rel.max()) if rel.size else 0.0
    of_tolerance = float(ratio.max()) if ratio.size else 0.0
    within = bool(np.all(diff <= allowed)) and not np.isinf(want).any()
    worst = _worst_index(e, a, both, ratio)
    return OutputDiff(
        name,
        max_abs,
        max_rel,
        nan_mismatch,
        nan_mismatch == 0 and within,
        "",
        of_tolerance,
        worst,
        float(e[worst]) if worst is not None else float("nan"),
        float(a[worst]) if worst is not None else float("nan"),
    )


def _worst_index(e: np.ndarray, a: np.ndarray, both: np.ndarray, ratio: np.ndarray) -> tuple[int, ...] | None:
    """The index of the first NaN mismatch, else of the largest error / tolerance; None where none differs."""
    mismatched = np.flatnonzero(np.isnan(e) != np.isnan(a))
    if mismatched.size:
        flat = int(mismatched[0])
    elif ratio.size and float(ratio.max()) > 0:
        flat = int(np.flatnonzero(both)[int(np.argmax(ratio))])
    else:
        return None
    return tuple(int(i) for i in np.unravel_index(flat, e.shape))


# How many times the model's own noise (checks/noise) an output beyond the tolerance on its own is
# allowed on top of the tolerance: the original and a correct rewrite may each be that far from the
# exact result, on either side of it.
NOISE_FACTOR = 2.0


def compare_outputs(
    expected: Mapping[str, np.ndarray],
    actual: Mapping[str, np.ndarray],
    rtol: float,
    atol: float,
    label: str = "{name}",
    noise: Mapping[str, float] | None = None,
) -> list[OutputDiff]:
    """One diff per expected output, in order; ``label`` formats its name (``{name}#1``).

    ``noise``: output name -> the model's own noise there (max |float32 - float64| of the
    original, only where that is beyond the tolerance); NOISE_FACTOR times it is added to atol."""
    diffs = []
    for name, want in expected.items():
        shown = label.format(name=name)
        allowed = atol + NOISE_FACTOR * (noise or {}).get(name, 0.0)
        diffs.append(
            compare(want, actual[name], shown, rtol, allowed)
            if name in actual
            else _incomparable(shown, "missing from the outputs")
        )
    return diffs


def noise_text(noise: Mapping[str, float]) -> str:
    """The model's own noise as a note says it ("" where none was beyond the tolerance)."""
    if not noise:
        return ""
    worst = max(noise, key=lambda name: noise[name])
    outputs = f"{worst}" if len(noise) == 1 else f"{worst}; {len(noise)} outputs beyond the tolerance on their own"
    return (
        f"the model's own noise: {_short(noise[worst])} (the original against itself in float64, max |difference|, "
        f"at {outputs}): atol raised by {NOISE_FACTOR:g} x its noise there"
    )


def default_tolerance(model: onnx.ModelProto) -> tuple[float, float]:
    """(rtol, atol): float32 rounding, looser where the model computes in float16: a float16 output,
    or float16 values inside the graph (a model converted to float16 with its inputs and outputs
    kept float32, as onnxruntime.transformers.float16's keep_io_types writes it, rounds in float16
    although its outputs are float32)."""
    return FLOAT16_TOLERANCE if computes_in_float16(model) else FLOAT32_TOLERANCE


def computes_in_float16(model: onnx.ModelProto) -> bool:
    """Whether any graph of the model (subgraphs and functions too) has a float16 input, output,
    initializer or typed value, or a node that casts to float16 or makes a float16 constant."""
    half = onnx.TensorProto.FLOAT16
    for graph in (g for root in (model.graph, *model.functions) for g in graphs_of(root)):
        values = [*getattr(graph, "input", ()), *getattr(graph, "output", ()), *getattr(graph, "value_info", ())]
        if any(v.type.tensor_type.elem_type == half for v in values if v.type.HasField("tensor_type")):
            return True
        if any(t.data_type == half for t in getattr(graph, "initializer", ())):
            return True
        for node in graph.node:
            for attr in node.attribute:
                if node.op_type == "Cast" and attr.name == "to" and attr.i == half:
                    return True
                if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == half:
                    return True
    return False


def tolerance_text(rtol: float, atol: float) -> str:
    """The tolerance in force, as every check prints it."""
    return (
        f"|actual - expected| <= atol + rtol * |expected| everywhere (err / tolerance <= 1), "
        f"rtol {rtol:g}, atol {atol:g}"
    )


def tolerance(model: onnx.ModelProto, rtol: float | None, atol: float | None) -> tuple[float, float]:
    """The tolerances given, each one not given taken from :func:`default_tolerance`."""
    default_rtol, default_atol = default_tolerance(model)
    return (default_rtol if rtol is None else rtol), (default_atol if atol is None else atol)


def _short(x: float) -> str:
    """2.2e-3, not 2.2e-03."""
    return f"{x:.1e}".replace("e-0", "e-").replace("e+0", "e")
