"""The ops whose reading moves index variables between axes, for graph/op_readers' table:
``Unsqueeze``, ``Squeeze``, ``Reshape`` (adding or dropping axes of size 1 only), ``Expand``, a
static ``Slice`` (an index shifted by its start) and ``Concat`` (of size-1 pieces, or of pieces
that continue the last piece's term backwards)."""

from __future__ import annotations

import functools

import numpy as np
import onnx_ir as ir

from . import ir_utils as u
from . import shapes
from .dim_terms import dim_lin, dim_sum, dims_equal, lin_dim
from .tensor_reader import TensorReader, broadcast, input_at
from .terms import Abstract, Cat, Lin, Look, NotProved, Num, Op, Term, atoms, map_lin, normalise, remap, substitute


def read_unsqueeze(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
    x = r.read(input_at(node, 0), depth)
    axes = u.unsqueeze_axes(node)
    if axes is None:
        raise NotProved("an Unsqueeze with axes computed at run time")
    rank = len(x.dims) + len(axes)
    axes = sorted(a % rank for a in axes)
    dims: list[shapes.Dim] = []
    mapping = {}
    src = 0
    for o in range(rank):
        if o in axes:
            dims.append(1)
        else:
            mapping[src] = o
            dims.append(x.dims[src])
            src += 1
    return Abstract(tuple(dims), remap(x.term, mapping), x.dtype)


def read_squeeze(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
    x = r.read(input_at(node, 0), depth)
    axes = u.unsqueeze_axes(node)
    if axes is None:
        axes = [a for a, d in enumerate(x.dims) if d == 1]
    axes = [a % max(1, len(x.dims)) for a in axes]
    if any(x.dims[a] != 1 for a in axes):
        raise NotProved("a Squeeze of an axis not proved to be 1")
    kept = [a for a in range(len(x.dims)) if a not in axes]
    return Abstract(tuple(x.dims[a] for a in kept), remap(x.term, {a: o for o, a in enumerate(kept)}), x.dtype)


def _moved_axes(src: tuple[shapes.Dim, ...], dst: list[shapes.Dim]) -> dict[int, int]:
    """The axis map of a reshape that only adds or drops axes of size 1."""
    a = [i for i, d in enumerate(src) if d != 1]
    b = [i for i, d in enumerate(dst) if d != 1]
    if len(a) != len(b) or not all(dims_equal(src[i], dst[j]) for i, j in zip(a, b)):
        raise NotProved(f"a reshape from {list(src)} to {dst} that moves elements between axes")
    return dict(zip(a, b))


def read_reshape(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
    # Reshape keeps the row-major order of the elements, so a chain of them (TorchScript's
    # flatten to [-1] and back) is one Reshape of the chain's first input.
    source = input_at(node, 0)
    while (inner := u.producer(source, "Reshape")) is not None:
        source = input_at(inner, 0)
    x = r.read(source, depth)
    target = r.vector(input_at(node, 1))
    if target is None:
        raise NotProved("a Reshape to a shape this reading cannot follow")
    dims = shapes.apply_reshape(target, list(x.dims), bool(u.attr_int(node, "allowzero", 0)))
    if any(d is None for d in dims) and len(dims) == 1:
        dims = [_flat_size(x.dims)]
    if any(d is None for d in dims):
        raise NotProved("a Reshape whose output dims are not proved")
    return normalise(tuple(dims), remap(x.term, _moved_axes(x.dims, dims)), x.dtype)


def _flat_size(dims: tuple[shapes.Dim, ...]) -> shapes.Dim:
    big = [d for d in dims if d != 1]
    return 1 if not big else big[0] if len(big) == 1 else None


def read_expand(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
    x = r.read(input_at(node, 0), depth)
    target = r.vector(input_at(node, 1))
    if target is None or any(d is None for d in target):
        raise NotProved("an Expand to a shape this reading cannot follow")
    shape = Abstract(tuple(target), Num(0, ir.DataType.INT64), None)
    dims, (term, _) = broadcast([x, shape])
    return normalise(dims, term, x.dtype)


def read_concat(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
    xs = [r.read(x, depth) for x in node.inputs]
    rank = len(xs[0].dims)
    axis = u.attr_int(node, "axis", 0) % rank
    if any(len(x.dims) != rank for x in xs):
        raise NotProved("a Concat of pieces of other ranks")
    if any(x.dims[axis] != 1 for x in xs):
        return _continued(xs, axis)
    dims, terms = broadcast(xs)
    dims = dims[:axis] + (len(xs),) + dims[axis + 1 :]
    return Abstract(dims, Cat(axis, tuple(terms)), xs[0].dtype)


def _continued(xs: list[Abstract], axis: int) -> Abstract:
    """A Concat whose pieces before the last have static sizes and are the last piece's term
    continued backwards: ``concat(pos[:, :1] - 1, pos)`` with pos[b, t] = t is t - 1 over [0, S + 1).
    Each earlier element is checked, at its static index, to be that term there; index arithmetic
    alone (no look-up: a look-up at a negative index would read another element)."""
    sizes = [x.dims[axis] for x in xs[:-1]]
    if not all(isinstance(n, int) for n in sizes) or sum(sizes) > 16:  # type: ignore[arg-type]
        raise NotProved("a Concat of other than size-1 pieces")
    if any(isinstance(a, Look) for x in xs for a in atoms(x.term)) or any(_has_cat(x.term) for x in xs):
        raise NotProved("a Concat of other than size-1 pieces")
    flat = [Abstract(x.dims[:axis] + (1,) + x.dims[axis + 1 :], x.term, x.dtype) for x in xs]
    dims, terms = broadcast(flat)
    start = sum(sizes)  # type: ignore[arg-type]
    continued = map_lin(terms[-1], functools.partial(_shift, axis=axis, by=-start))
    at = 0
    for piece, n in zip(terms[:-1], sizes):
        for k in range(int(n)):  # type: ignore[arg-type]
            if substitute(continued, axis, at + k) != substitute(piece, axis, k):
                raise NotProved("a Concat whose first pieces are not its last piece continued")
        at += int(n)  # type: ignore[arg-type]
    size = dim_sum([start, xs[-1].dims[axis]])
    if size is None:
        raise NotProved("a Concat whose length is not proved")
    return normalise(dims[:axis] + (size,) + dims[axis + 1 :], continued, xs[-1].dtype)


def _has_cat(term: Term) -> bool:
    """Whether term holds a Cat (whose parts a shift of its axis would not move)."""
    if isinstance(term, Cat):
        return True
    return isinstance(term, Op) and any(_has_cat(a) for a in term.args)


def read_slice(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
    """A static slice (a causal buffer cut to the sequence length): x_a -> x_a + start."""
    x = r.read(input_at(node, 0), depth)
    starts, ends = (u.const_array(node.inputs[i]) for i in (1, 2))
    axes = u.const_array(input_at(node, 3)) if len(node.inputs) > 3 and node.inputs[3] is not None else None
    steps = u.const_array(input_at(node, 4)) if len(node.inputs) > 4 and node.inputs[4] is not None else None
    if starts is None:  # computed, but proved a number: Sk - Sq of a prefill (GPT-Neo's buffer rows)
        computed_starts = r.vector(input_at(node, 1))
        if computed_starts is not None and all(isinstance(d, int) for d in computed_starts):
            starts = np.asarray(computed_starts, np.int64)
        elif computed_starts is not None and (steps is None or bool((steps == 1).all())):
            return _from_computed_start(r, node, x, computed_starts, axes)
    if starts is None or (steps is not None and bool((steps != 1).any())):
        raise NotProved("a Slice with starts or steps computed at run time")
    axes_list = list(range(len(starts))) if axes is None else [int(a) % len(x.dims) for a in axes.reshape(-1)]
    dims = list(x.dims)
    term = x.term
    out = u.value_shape(node.outputs[0])
    for k, a in enumerate(axes_list):
        s = int(starts.reshape(-1)[k])
        if s < 0:
            raise NotProved("a Slice with a negative start")
        end = int(ends.reshape(-1)[k]) if ends is not None else None
        size = x.dims[a]
        computed = r.vector(input_at(node, 2)) if end is None else None
        if isinstance(size, int) and end is not None and min(end, size) - s >= 0:
            dims[a] = min(end, size) - s
        elif computed is not None and len(computed) == len(axes_list) and computed[k] is not None and s == 0:
            # a buffer cut to a length read from the graph: that length (a longer one would be
            # cut to the buffer's size and then fail to broadcast with the scores)
            dims[a] = computed[k]
            if isinstance(size, int) and size > 1:
                r.ends_inside.append((computed[k], size))
        elif out is not None and out[a] is not None:
            dims[a] = out[a]
        else:
            raise NotProved("a Slice whose length is not proved")
        if s:
            term = map_lin(term, functools.partial(_shift, axis=a, by=s))
    return normalise(tuple(dims), term, x.dtype)


def _from_computed_start(
    r: TensorReader, node: ir.Node, x: Abstract, starts: list[shapes.Dim], axes: np.ndarray | None
) -> Abstract:
    """Slice(x, s, e) of one axis of static size N > 1, s and e computed (a causal buffer's rows
    [past, past + seq) of a KV cache): x_a -> x_a + s, e - s long, exact where e <= N (then
    0 <= s <= e <= N: neither is clamped), which the reader records for its caller to discharge
    (graph/interpret.Reader.ends_assumed); only in a reading that asks for it."""
    if not r.computed_starts:
        raise NotProved("a Slice with starts or steps computed at run time")
    ends = r.vector(input_at(node, 2))
    if len(starts) != 1 or ends is None or len(ends) != 1 or (axes is not None and axes.size != 1):
        raise NotProved("a Slice of more than one axis from a computed start")
    a = (int(axes.reshape(-1)[0]) if axes is not None else 0) % len(x.dims)
    size, start, end = x.dims[a], dim_lin(starts[0]), dim_lin(ends[0])
    if not isinstance(size, int) or size <= 1 or start is None or end is None:
        raise NotProved("a Slice from a computed start of an axis whose size is not static")
    length = end.plus(start, -1)
    for lin in (start, length):  # sums of dims: never negative
        if lin.const < 0 or any(atom[0] != "d" or c < 0 for atom, c in lin.coeffs):
            raise NotProved("a Slice from a computed start that is not proved at or before its end")
    r.ends_assumed.append((ends[0], size))
    dims = list(x.dims)
    dims[a] = lin_dim(length)
    if dims[a] is None:
        raise NotProved("a Slice from a computed start whose length is not proved")
    term = map_lin(x.term, functools.partial(_shift, axis=a, by=start))
    return normalise(tuple(dims), term, x.dtype)


def _shift(lin: Lin, axis: int, by: int | Lin) -> Lin:
    c = lin.as_dict().get(("x", axis), 0)
    if any(a[0] == "xd" and a[1] == axis for a, _ in lin.coeffs):
        raise NotProved("a Slice of a flattened index")
    if isinstance(by, Lin):  # x_axis -> x_axis + by, by over symbolic dims
        return lin.plus(by.scaled(c)) if c else lin
    return Lin.of(lin.as_dict(), lin.const + c * by)
