"""Bounds on the values a float tensor can hold, from the ops that compute it: enough to prove
that a bias is never +inf or NaN, or never large (where a mask's fill must absorb it).

An interval (lo, hi) says every element x of the tensor is a number with lo <= x <= hi (±inf
allowed as bounds); None says nothing is known, NaN included. Arithmetic is done in float64 and
widened to ±inf where float32 would overflow."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from . import ir_utils as u

Interval = tuple[float, float]

_F32_MAX = float(np.finfo(np.float32).max)
_F16_MAX = float(np.finfo(np.float16).max)
_SHAPE_ONLY = ("Identity", "Unsqueeze", "Squeeze", "Reshape", "Expand", "Transpose", "Flatten", "Tile", "Slice")


def _widened(lo: float, hi: float, limit: float = _F32_MAX) -> Interval:
    """(lo, hi) with bounds beyond the float type's largest number taken as the infinity they round to."""
    return (-np.inf if lo < -limit else lo, np.inf if hi > limit else hi)


def _holds_zero(x: Interval) -> bool:
    return x[0] <= 0.0 <= x[1]


def _unbounded(x: Interval) -> bool:
    return bool(np.isinf(x[0]) or np.isinf(x[1]))


def _int_range(dtype: ir.DataType) -> Interval | None:
    if dtype == ir.DataType.BOOL:
        return 0.0, 1.0
    try:
        info = np.iinfo(dtype.numpy())
    except (TypeError, ValueError):
        return None
    return float(info.min), float(info.max)


def value_bounds(value: ir.Value | None, depth: int = u.MAX_DEPTH) -> Interval | None:
    """Bounds on every element of value, or None when the graph does not bound it."""
    if value is None or depth <= 0:
        return None
    arr = u.const_array(value)
    if arr is not None:
        arr = np.asarray(arr, np.float64)
        return None if arr.size == 0 or np.isnan(arr).any() else (float(arr.min()), float(arr.max()))
    node = u.producer(value)
    if node is None:
        return None
    op = node.op_type
    args = node.inputs
    if op in _SHAPE_ONLY or (op == "Gather" and args):
        return value_bounds(args[0], depth - 1)
    if op == "Cast":
        source = u.dtype(args[0])
        inner = (
            _int_range(source)
            if source is not None and source not in u.FLOAT_TYPES
            else value_bounds(args[0], depth - 1)
        )
        if inner is None:
            return None
        to = ir.DataType(u.attr_int(node, "to", 0))
        return _widened(*inner, limit=_F16_MAX if to == ir.DataType.FLOAT16 else _F32_MAX)
    if op == "Neg":
        inner = value_bounds(args[0], depth - 1)
        return None if inner is None else (-inner[1], -inner[0])
    if op in ("Concat", "Where"):
        parts = [value_bounds(x, depth - 1) for x in (args[1:] if op == "Where" else args)]
        if not parts or any(p is None for p in parts):
            return None
        return min(p[0] for p in parts if p), max(p[1] for p in parts if p)
    if op in ("Add", "Sub", "Mul") and len(args) == 2:
        a, b = value_bounds(args[0], depth - 1), value_bounds(args[1], depth - 1)
        if a is None or b is None:
            return None
        if op == "Sub":
            b = (-b[1], -b[0])
        if op == "Mul" and ((_holds_zero(a) and _unbounded(b)) or (_holds_zero(b) and _unbounded(a))):
            return None  # 0 · inf
        if op != "Mul" and ((a[0] == -np.inf and b[1] == np.inf) or (a[1] == np.inf and b[0] == -np.inf)):
            return None  # inf - inf
        with np.errstate(all="ignore"):
            if op == "Mul":
                ends = np.array([a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]])
            else:
                ends = np.array([a[0] + b[0], a[1] + b[1]])
        if np.isnan(ends).any():
            return None  # inf - inf or 0 · inf can happen
        limit = _F16_MAX if u.dtype(value) == ir.DataType.FLOAT16 else _F32_MAX
        return _widened(float(ends.min()), float(ends.max()), limit)
    return None
