"""The one symbolic evaluator of dims and shape tensors, and declarative shape checks.

A dim is a ``Dim``: an int (static), a str (a symbol shape inference named), a ``DimOf`` (an
unnamed dim of one tensor: equal only to itself), a ``Scaled`` (a symbolic dim times an int, as
TorchScript's shape subgraphs compute head counts), or None (unknown). Two dims are proved equal
only when their terms are equal and neither is None (``same_dim``). The terms, their arithmetic
and ``check_shape`` are in dim_arith.py (no graph there), re-exported here.

The evaluator follows shape tensors (Shape, Concat, Gather, Unsqueeze, integer arithmetic,
Reshape's 0 and -1) and, for one dim of a tensor, Transposes, Reshapes and broadcasting
elementwise ops back to a static size. Proofs read as onnxscript's ``check_shape``:

    dims = Bindings()
    if check_shape(dims, dims_of(q), "B H S D") and check_shape(dims, dims_of(k), "B Hkv S D"): ...
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from . import ir_utils as u
from .dim_arith import (
    Bindings,
    Dim,
    DimOf,
    Scaled,
    apply_reshape,
    check_shape,
    divided,
    may_broadcast,
    same_dim,
    static,
    times,
)

__all__ = [
    "Bindings",
    "Dim",
    "DimOf",
    "Scaled",
    "apply_reshape",
    "batch_and_heads",
    "check_shape",
    "dims_of",
    "divided",
    "may_broadcast",
    "reshape_dims",
    "resolved_dim",
    "same_dim",
    "scalar_dim",
    "shape_vector",
    "static",
    "times",
]


def _inferred_dims(value: ir.Value) -> list[Dim] | None:
    shape = u.value_shape(value)
    if shape is None:
        return None
    return [DimOf(id(value), i) if d is None else d for i, d in enumerate(shape)]


_PASS_THROUGH = ("Cast", "Identity", "Neg", "Sqrt", "Exp", "Tanh", "Erf", "Sigmoid", "Relu")
_BROADCASTING = ("Mul", "Div", "Add", "Sub", "Where", "Pow")


# One reading's answers, by (id(value), axis): the graph does not change while one top-level
# resolved_dim or dims_of call reads it, and rotary embeddings reach one tensor through both
# halves of a Concat at every layer, which without it is read again on every path.
_READING: contextvars.ContextVar[dict[tuple[int, int], tuple[int, Dim]] | None] = contextvars.ContextVar(
    "ortflash_shapes_reading", default=None
)


def resolved_dim(value: ir.Value | None, axis: int, depth: int = u.MAX_DEPTH) -> Dim:
    """value's size along axis. Beyond shape inference it follows Transposes, Reshapes with
    computed shapes and broadcasting elementwise ops back to a static size (TorchScript exports
    reshape heads as [B, S, -1, D] from runtime shapes, which inference leaves open)."""
    if value is None:
        return None
    memo = _READING.get()
    if memo is None:
        token = _READING.set({})
        try:
            return resolved_dim(value, axis, depth)
        finally:
            _READING.reset(token)
    key = (id(value), axis)
    found = memo.get(key)
    # a static size is final; another answer is reused only where it was read at least as deep
    if found is None or not (isinstance(found[1], int) or found[0] >= depth):
        found = memo[key] = (depth, _resolved_dim(value, axis, depth))
    return found[1]


def _resolved_dim(value: ir.Value, axis: int, depth: int) -> Dim:
    dims = _inferred_dims(value)
    d: Dim = dims[axis] if dims is not None and axis < len(dims) else None
    if isinstance(d, int) or depth <= 0:
        return d
    node = u.producer(value)
    found: Dim = None
    if node is None:
        pass
    elif node.op_type == "Transpose":
        perm = u.attr_ints(node, "perm")
        if perm is not None and axis < len(perm):
            found = resolved_dim(node.inputs[0], perm[axis], depth - 1)
    elif node.op_type == "Reshape":
        out = reshape_dims(node, depth - 1)
        if out is not None and axis < len(out):
            found = out[axis]
    elif node.op_type == "Expand":
        found = _expanded_dim(node, value, axis, depth)
    elif node.op_type in _PASS_THROUGH:
        found = resolved_dim(node.inputs[0], axis, depth - 1)
    elif node.op_type in _BROADCASTING:
        found = _broadcast_dim(node, value, axis, depth)
    elif node.op_type == "Concat":
        found = _concatenated_dim(node, value, axis, depth)
    elif node.op_type == "Slice":
        found = _sliced_dim(node, value, axis, depth)
    elif node.op_type == "Split":
        found = _split_dim(node, value, axis, depth)
    if isinstance(found, int) or isinstance(d, str):
        return found if isinstance(found, int) else d
    return found if found is not None else d


def _concatenated_dim(node: ir.Node, value: ir.Value, axis: int, depth: int) -> Dim:
    """Concat's output along axis: off the concatenation axis every input has the output's size
    (so one static input size proves it: rotate-half rotary embeddings concatenate halves of the
    head dim, which shape inference leaves symbolic); along it, the sum of static sizes."""
    rank = u.rank(value)
    cat = u.attr_int(node, "axis", 0)
    if rank is None or not -rank <= cat < rank or not node.inputs:
        return None
    if axis != cat % rank:  # the first input whose size is static (read lazily: the inputs share sources)
        found = (resolved_dim(x, axis, depth - 1) for x in node.inputs if x is not None)
        return next((d for d in found if isinstance(d, int)), None)
    total = 0
    for x in node.inputs:
        d = resolved_dim(x, axis, depth - 1) if x is not None else None
        if not isinstance(d, int):
            return None
        total += d
    return total


def _split_dim(node: ir.Node, value: ir.Value, axis: int, depth: int) -> Dim:
    """A Split output's size along axis: off the split axis, the input's; along it, the constant
    split size (the input `split` from opset 13, the attribute before), or an even share of a
    static input size (fused QKV projections split into Q, K and V this way)."""
    r = u.rank(node.inputs[0])
    split_axis = u.attr_int(node, "axis", 0)
    if r is None or not -r <= split_axis < r:
        return None
    if axis != split_axis % r:
        return resolved_dim(node.inputs[0], axis, depth - 1)
    index = list(node.outputs).index(value)
    sizes = _const_list(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
    if sizes is None:
        sizes = u.attr_ints(node, "split")
    if sizes is not None:
        return sizes[index] if len(sizes) == len(node.outputs) else None
    whole = resolved_dim(node.inputs[0], axis, depth - 1)
    parts = len(node.outputs)
    # num_outputs (opset 18) may leave a smaller last part; an even split is proved only exactly
    return whole // parts if isinstance(whole, int) and whole % parts == 0 else None


def _sliced_dim(node: ir.Node, value: ir.Value, axis: int, depth: int) -> Dim:
    """Slice's output along axis (opset 10+: starts, ends, axes and steps as inputs): the input's
    size where axis is not sliced; where it is, the length of the slice of a static size with
    constant bounds (ONNX clamps the bounds as Python's slices do)."""
    rank = u.rank(value)
    if rank is None or len(node.inputs) < 3:
        return None
    axes = _const_list(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else None
    if axes is None and len(node.inputs) > 3 and node.inputs[3] is not None:
        return None  # axes computed at run time
    positions = [a % rank for a in axes] if axes is not None else list(range(len(_const_list(node.inputs[1]) or [])))
    if axis not in positions:
        return resolved_dim(node.inputs[0], axis, depth - 1) if axes is not None else None
    i = positions.index(axis)
    starts, ends = _const_list(node.inputs[1]), _const_list(node.inputs[2])
    steps = _const_list(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else None
    size = resolved_dim(node.inputs[0], axis, depth - 1)
    if not isinstance(size, int) or starts is None or ends is None or len(starts) != len(positions):
        return None
    step = steps[i] if steps is not None and len(steps) == len(positions) else 1
    if steps is not None and len(steps) != len(positions) or step <= 0:
        return None  # negative steps clamp differently from Python's slices at the ends
    return len(range(size)[slice(starts[i], ends[i], step)])


def _expanded_dim(node: ir.Node, value: ir.Value, axis: int, depth: int) -> Dim:
    """Expand's output along axis: the target's size where it is not 1, else the input's."""
    target = shape_vector(node.inputs[1], depth - 1)
    out_rank, in_rank = u.rank(value), u.rank(node.inputs[0])
    if target is None or out_rank is None or in_rank is None:
        return None
    t = target[axis - (out_rank - len(target))] if axis >= out_rank - len(target) else 1
    a = axis - (out_rank - in_rank)
    source = 1 if a < 0 else resolved_dim(node.inputs[0], a, depth - 1)
    if t == 1:
        return source
    # A symbolic target may be 1 at run time (then the input's size wins): only a static size
    # above 1, or any target over an input of size 1, is the output's.
    return t if (isinstance(t, int) and t > 1) or source == 1 else None


def _broadcast_dim(node: ir.Node, value: ir.Value, axis: int, depth: int) -> Dim:
    """The output's size is an operand's size other than 1 (operands aligned right)."""
    out_rank = u.rank(value)
    ranks = [u.rank(x) for x in node.inputs]
    if out_rank is None or None in ranks:
        return None
    sizes: list[Dim] = []
    for x, r in zip(node.inputs, ranks):
        a = axis - (out_rank - (r or 0))
        sizes.append(1 if a < 0 or x is None else resolved_dim(x, a, depth - 1))
    found = {s for s in sizes if isinstance(s, int) and s != 1}
    if len(found) == 1:
        return found.pop()
    if sizes and all(s == 1 for s in sizes):
        return 1
    # Symbolic: where every operand that is not proved 1 has one and the same term, that term is
    # the output's size (if it is 1 at run time, so is the output).
    terms = [s for s in sizes if s != 1]
    if terms and not found and all(same_dim(terms[0], s) for s in terms):
        return terms[0]
    return None


def dims_of(value: ir.Value | None, depth: int = u.MAX_DEPTH) -> list[Dim] | None:
    """All dims of value, each resolved; None when its rank is unknown."""
    r = u.rank(value)
    if value is None or r is None:
        return None
    if _READING.get() is None:
        token = _READING.set({})
        try:
            return [resolved_dim(value, i, depth) for i in range(r)]
        finally:
            _READING.reset(token)
    return [resolved_dim(value, i, depth) for i in range(r)]


def shape_vector(value: ir.Value | None, depth: int = u.MAX_DEPTH) -> list[Dim] | None:
    """A 1-D int64 shape tensor, element by element; None when even its length is unknown."""
    if value is None or depth <= 0:
        return None
    arr = u.const_array(value)
    if arr is not None:
        return [int(x) for x in np.asarray(arr).reshape(-1)] if arr.ndim <= 1 else None
    node = u.producer(value)
    if node is None:
        return None
    op = node.op_type
    if op == "Shape":
        dims = dims_of(node.inputs[0], depth - 1)
        return None if dims is None else dims[u.attr_int(node, "start", 0) : u.attr_int(node, "end", None)]
    if op == "Concat":
        out: list[Dim] = []
        for x in node.inputs:
            part = shape_vector(x, depth - 1)
            if part is None:
                return None
            out += part
        return out
    if op in ("Cast", "Identity") or (op == "Reshape" and _const_list(node.inputs[1]) == [-1]):
        return shape_vector(node.inputs[0], depth - 1)
    if op == "Unsqueeze" and u.unsqueeze_axes(node) == [0] and u.rank(node.inputs[0]) in (0, None):
        return [scalar_dim(node.inputs[0], depth - 1)]
    if op == "Gather" and u.attr_int(node, "axis", 0) == 0:
        idx, data = u.const_array(node.inputs[1]), shape_vector(node.inputs[0], depth - 1)
        if idx is None or data is None or idx.ndim != 1:
            return None
        try:
            return [data[int(i)] for i in idx]
        except IndexError:
            return None
    if op == "Where":
        return _unless_minus_one(node, depth)
    if op == "Slice" and len(node.inputs) >= 3:  # a part of a shape: Shape(x)[1:3]
        data = shape_vector(node.inputs[0], depth - 1)
        starts, ends = _const_list(node.inputs[1]), _const_list(node.inputs[2])
        axes = _const_list(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else [0]
        steps = _const_list(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else [1]
        if data is not None and starts and ends and len(starts) == 1 and axes in ([0], [-1]) and steps == [1]:
            return data[starts[0] : ends[0]]  # ONNX clamps the bounds as Python does for step 1
    return None


def _unless_minus_one(where: ir.Node, depth: int) -> list[Dim] | None:
    """where(s == -1, ones, s) is s when no element of s can be -1 (dims are >= 0)."""
    cond, _, s = where.inputs
    eq = u.producer(cond, "Equal")
    vec = shape_vector(s, depth - 1)
    if eq is None or vec is None or s not in eq.inputs or -1 in vec:
        return None
    other = u.const_array(eq.inputs[1] if eq.inputs[0] is s else eq.inputs[0])
    return vec if other is not None and bool(np.all(other == -1)) else None


def _const_list(value: ir.Value | None) -> list[int] | None:
    arr = u.const_array(value)
    return None if arr is None else [int(x) for x in arr.reshape(-1)]


_INT_OPS: dict[str, Callable[[int, int], int | None]] = {
    "Mul": lambda a, b: a * b,
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Div": lambda a, b: a // b if b and a % b == 0 else None,
}


def scalar_dim(value: ir.Value | None, depth: int = u.MAX_DEPTH) -> Dim:
    """A scalar int64 shape element as a dim term."""
    if value is None or depth <= 0:
        return None
    arr = u.const_array(value)
    if arr is not None:
        arr = np.asarray(arr)
        return int(arr.reshape(())) if arr.size == 1 and np.issubdtype(arr.dtype, np.integer) else None
    node = u.producer(value)
    if node is None:
        return None
    op = node.op_type
    if op in ("Cast", "Identity", "Squeeze"):
        return scalar_dim(node.inputs[0], depth - 1)
    if op == "Gather" and u.attr_int(node, "axis", 0) == 0:
        idx, data = u.const_array(node.inputs[1]), shape_vector(node.inputs[0], depth - 1)
        if idx is None or data is None or idx.ndim != 0:
            return None
        try:
            return data[int(idx)]
        except IndexError:
            return None
    if op in _INT_OPS and len(node.inputs) == 2:
        a, b = (scalar_dim(x, depth - 1) for x in node.inputs)
        if isinstance(a, int) and isinstance(b, int):
            return _INT_OPS[op](a, b)
        if op == "Mul" and isinstance(b, int):
            return times(a, b)
        if op == "Mul" and isinstance(a, int):
            return times(b, a)
    return None


def reshape_dims(node: ir.Node, depth: int = u.MAX_DEPTH) -> list[Dim] | None:
    """The output dims of a Reshape node, its target and its input's dims evaluated."""
    target = shape_vector(node.inputs[1], depth - 1)
    if target is None:
        return None
    in_dims = dims_of(node.inputs[0], depth - 1)
    return apply_reshape(target, in_dims, bool(u.attr_int(node, "allowzero", 0)))


def batch_and_heads(x: ir.Value | None) -> tuple[Dim, Dim] | None:
    """(dim 0, dim 1) of a 4D operand; (1, dim 0) for rank 3 ([H, Sq, Sk]); (1, 1) for lower
    ranks, which broadcast over both; None when the rank is unknown."""
    if x is None:
        return (1, 1)
    r = u.rank(x)
    if r is None:
        return None
    if r >= 4:
        return resolved_dim(x, r - 4), resolved_dim(x, r - 3)
    if r == 3:
        return 1, resolved_dim(x, 0)
    return 1, 1
