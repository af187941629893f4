"""The padding part of a proved causal mask written back as nodes: the same upstream tensors
through the same ONNX ops (so exactly the same values), or a check that it can be (fusion/causal/proof
runs it dry before it claims a block)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ...graph import shapes
from ...graph.dim_terms import dims_equal
from ...graph.emitter import Emitter
from ...graph.terms import Abstract, Look, NotProved, Num, Op, Term, axes_of


def neutral_padding(padding: Abstract) -> bool:
    """Whether the padding part is the neutral constant (0.0 for a bias, True for a mask)."""
    term = padding.term
    return isinstance(term, Num) and (
        (padding.dtype == ir.DataType.BOOL and bool(term.value))
        or (padding.dtype != ir.DataType.BOOL and term.value == 0)
    )


def write_padding(e: Emitter, padding: Abstract) -> ir.Value | None:
    """The padding part as a tensor of rank 4 (dims [B|1, H|1, 1, Sk|1]); None when it is the
    neutral constant (0.0 for a bias, True for a mask)."""
    if neutral_padding(padding):
        return None
    value = write_term(e, padding.term, padding.dtype, padding.dims)
    assert value is not None
    written = _written_dtype(padding.term, padding.dtype)
    if value.shape is None and written is not None:  # written without inferred shapes: what is known
        # the axes the term does not read are 1 (constants are [1, 1, 1, 1], a look-up's missing
        # axes Unsqueezed), the query axis among them (the report's rows read it); the others as
        # the graph runs them
        read = axes_of(padding.term)
        value.type = ir.TensorType(written)
        value.shape = ir.Shape([None if a in read else 1 for a in range(4)])
    return value


_BOOL_OPS = ("And", "Or", "Not", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal")


def _written_dtype(term: Term, dtype: ir.DataType | None) -> ir.DataType | None:
    """The element type write_term gives term's tensor (None where it does not say)."""
    if isinstance(term, Num):
        return term.dtype if term.dtype is not None else dtype
    if isinstance(term, Look):
        return term.source.dtype
    if isinstance(term, Op) and term.op == "Cast":
        return ir.DataType(term.attr)
    if isinstance(term, Op) and term.op in _BOOL_OPS:
        return ir.DataType.BOOL
    if isinstance(term, Op) and term.op in ("Where", "Add", "Sub", "Mul"):
        return _written_dtype(term.args[1 if term.op == "Where" else 0], dtype)
    return None


# Ops of a padding term, written back as the same ONNX ops (so the same values).
_WRITABLE = (
    "And",
    "Or",
    "Not",
    "Where",
    "Cast",
    "Add",
    "Sub",
    "Mul",
    "Less",
    "LessOrEqual",
    "Greater",
    "GreaterOrEqual",
    "Equal",
)


def write_term(
    e: Emitter | None, term: Term, dtype: ir.DataType | None, dims: tuple[shapes.Dim, ...]
) -> ir.Value | None:
    """Write term as nodes of e (None: check only that it can be written)."""
    if isinstance(term, Num):
        t = term.dtype if term.dtype is not None else dtype
        np_type = t.numpy() if t is not None else np.float32
        return None if e is None else e.const(np.asarray(term.value, np_type).reshape(1, 1, 1, 1))
    if isinstance(term, Look):
        return _write_look(e, term, dims)
    if isinstance(term, Op) and term.op in _WRITABLE:
        if term.op == "Cast":
            inner = write_term(e, term.args[0], None, dims)
            return None if e is None or inner is None else e.node("Cast", [inner], to=ir.DataType(term.attr))
        args = [write_term(e, a, dtype, dims) for a in term.args]
        return None if e is None else e.node(term.op, args)
    raise NotProved(f"the padding part contains a {type(term).__name__} this rewrite cannot write")


def _place_unit_axes(own: list[int | None]) -> list[int] | None:
    """Each source axis's mask axis: ``own``'s where given, and for a size-1 axis (None) the first
    mask axis past the one before it, below the next given one (None: no room)."""
    placed: list[int] = []
    for k, axis in enumerate(own):
        if axis is None:
            upper = next((a for a in own[k + 1 :] if a is not None), 4)
            axis = (placed[-1] if placed else -1) + 1
            if axis >= upper:
                return None
        placed.append(axis)
    return placed


def _write_look(e: Emitter | None, look: Look, dims: tuple[shapes.Dim, ...]) -> ir.Value | None:
    """source[x_a0, x_a1, ...] with each index one distinct index variable, increasing, over
    axes of the source's own sizes: the source itself with size-1 axes inserted (the same
    tensor, so the same values). An axis of static size 1 read at 0 (attention_mask [1, S] of a
    batch-1 export) is the whole axis: it takes a mask axis of its own between its neighbours'
    (size 1 there, so it broadcasts as the read does)."""
    prefix = look.prefix or (None,) * len(look.index)
    if look.source_dims is None:
        raise NotProved(f"the padding part reads {look.source.name}, whose dims are not proved to be the mask's")
    read = [look.source_dims[k] if cut is None else cut[0] for k, cut in enumerate(prefix)]
    own: list[int | None] = []  # the mask axis each source axis is read at (None: size 1, read at 0)
    for k, lin in enumerate(look.index):
        if not lin.coeffs and lin.const == 0 and read[k] == 1:
            own.append(None)
        elif len(lin.coeffs) != 1 or lin.const != 0 or lin.coeffs[0][1] != 1 or lin.coeffs[0][0][0] != "x":
            raise NotProved(f"the padding part reads {look.source.name} at other than its own indices")
        else:
            own.append(int(lin.coeffs[0][0][1]))  # type: ignore[call-overload]
    fixed = [a for a in own if a is not None]
    if fixed != sorted(set(fixed)):
        raise NotProved(f"the padding part reads {look.source.name} with its axes reordered")
    axes = _place_unit_axes(own)
    if axes is None:
        raise NotProved(f"the padding part reads {look.source.name} at other than its own indices")
    if not all(own[k] is None or dims_equal(read[k], dims[a]) for k, a in enumerate(axes)):
        raise NotProved(f"the padding part reads {look.source.name}, whose dims are not proved to be the mask's")
    missing = [a for a in range(4) if a not in axes]
    if e is None:
        return None
    source = look.source
    for k, cut in enumerate(prefix):
        if cut is not None:  # source[..., :n, ...], n the graph's own value of the length
            end = e.cast(e.node("Reshape", [cut[1], e.i64([1])]), ir.DataType.INT64)  # Range's limit: a scalar
            source = e.node("Slice", [source, e.i64([0]), end, e.i64([k])])
    return e.unsqueeze(source, missing) if missing else source
