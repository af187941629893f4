"""The reading of each op of a mask subgraph into terms (graph/terms), one rule per op in ``OPS``:
``Unsqueeze``/``Squeeze``/``Reshape``/``Expand``/broadcasting move index variables between axes;
``Gather`` on a flattened tensor and ``GatherND`` with built index tuples become look-ups (a
``GatherND`` of index arithmetic alone, such as position ids ``Expand(Range(S))``, that arithmetic at
the index); comparisons, bool ops, ``Where`` and integer arithmetic build terms; a ``Concat`` of
other than size-1 pieces is read where it continues its last piece's term, a ``CumSum`` where its
input is 0 (transformers' packed-sequence test on position ids that are one range per row). graph/interpret's ``Reader``
runs them; a rule that cannot read its op raises ``NotProved`` naming the step.

Over 400 lines because it is one table of per-op rules (``OPS``), each short and read alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol

import numpy as np
import onnx_ir as ir

from . import ir_utils as u
from . import shapes
from .dim_terms import dim_lin, dim_sum, dims_equal, lin_dim
from .terms import (
    Abstract,
    Cat,
    Cmp,
    Lin,
    Look,
    NotProved,
    Num,
    Op,
    Term,
    atoms,
    fold,
    map_lin,
    normalise,
    remap,
    substitute,
)


class TensorReader(Protocol):
    """What an op's reading asks of the reader (graph/interpret.Reader): its inputs read as terms,
    shape tensors and scalars read as dims, and the graph's value of each Range length it read."""

    dim_values: dict[shapes.Dim, ir.Value]

    def read(self, value: ir.Value | None, depth: int = 64) -> Abstract: ...

    def dims_of(self, value: ir.Value | None, depth: int = 96) -> list[shapes.Dim] | None: ...

    def vector(self, value: ir.Value | None, depth: int = 32) -> list[shapes.Dim] | None: ...

    def scalar(self, value: ir.Value | None, depth: int = 32) -> shapes.Dim: ...


def input_at(node: ir.Node, index: int) -> ir.Value:
    """Input index of node; a missing one is a step this reading cannot take."""
    value = node.inputs[index] if index < len(node.inputs) else None
    if value is None:
        raise NotProved(f"{u.label(node)} lacks its input {index}")
    return value


def _broadcast(xs: list[Abstract]) -> tuple[tuple[shapes.Dim, ...], list[Term]]:
    rank = max(len(x.dims) for x in xs)
    dims: list[shapes.Dim] = [1] * rank
    terms = []
    for x in xs:
        shift = rank - len(x.dims)
        terms.append(remap(x.term, {a: a + shift for a in range(len(x.dims))}) if shift else x.term)
        for a, d in enumerate(x.dims):
            o = a + shift
            if d == 1:
                continue
            if dims[o] == 1:
                dims[o] = d
            elif not dims_equal(dims[o], d):
                raise NotProved(f"cannot prove two broadcast dims equal ({dims[o]} and {d})")
    return tuple(dims), terms


def _elementwise(op: str) -> Callable[[TensorReader, ir.Node, int], Abstract]:
    def read(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
        xs = [r.read(x, depth) for x in node.inputs if x is not None]
        dims, terms = _broadcast(xs)
        dtype = xs[-1].dtype if op == "Where" else xs[0].dtype
        if op in ("Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal"):
            dtype = ir.DataType.BOOL
            a, b = terms
            if isinstance(a, Lin) and isinstance(b, Lin):
                if op == "Equal":
                    term: Term = Cmp("eq", a.plus(b, -1))
                elif op in ("Less", "LessOrEqual"):
                    term = Cmp("le", a.plus(b, -1).plus(Lin((), 1 if op == "Less" else 0)))
                else:
                    term = Cmp("le", b.plus(a, -1).plus(Lin((), 1 if op == "Greater" else 0)))
                assert isinstance(term, Cmp)
                if not term.lin.coeffs:
                    const = term.lin.const
                    return normalise(dims, Num(const <= 0 if term.op == "le" else const == 0, dtype), dtype)
                return normalise(dims, term, dtype)
            return normalise(dims, fold(Op(op, (a, b))), dtype)
        if op in ("Add", "Sub", "Mul") and all(isinstance(t, Lin) for t in terms):
            a, b = terms
            assert isinstance(a, Lin) and isinstance(b, Lin)
            if op != "Mul":
                return normalise(dims, a.plus(b, 1 if op == "Add" else -1), dtype)
            return normalise(dims, _times(a, b), dtype)
        if op == "Where":
            dtype = xs[1].dtype or xs[2].dtype
        return normalise(dims, fold(Op(op, tuple(terms))), dtype)

    return read


def _times(a: Lin, b: Lin) -> Lin:
    if not a.coeffs:
        return b.scaled(a.const)
    if not b.coeffs:
        return a.scaled(b.const)
    for x, d in ((a, b), (b, a)):
        if x.const == 0 and d.const == 0 and len(x.coeffs) == 1 and len(d.coeffs) == 1:
            (xa, xc), (da, dc) = x.coeffs[0], d.coeffs[0]
            if xa[0] == "x" and da[0] == "d":
                return Lin.of({("xd", xa[1], da[1]): xc * dc})
        if x.const == 0 and len(x.coeffs) == 1 and x.coeffs[0][0][0] == "x" and all(t[0] == "d" for t, _ in d.coeffs):
            # b * (past + new): a row of a flattened [B, past + new] mask
            size = lin_dim(d)
            if size is not None:
                (xa, xc) = x.coeffs[0]
                return Lin.of({("xd", xa[1], size): xc})
    raise NotProved("a product of two index-dependent integers")


def _read_cast(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
    x = r.read(input_at(node, 0), depth)
    to = ir.DataType(u.attr_int(node, "to", 0))
    if x.dtype == to or (isinstance(x.term, Lin) and to in (ir.DataType.INT64, ir.DataType.INT32)):
        return Abstract(x.dims, x.term, to)
    return Abstract(x.dims, fold(Op("Cast", (x.term,), int(to))), to)


def _read_not(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
    x = r.read(input_at(node, 0), depth)
    return Abstract(x.dims, fold(Op("Not", (x.term,))), ir.DataType.BOOL)


def _read_identity(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
    return r.read(input_at(node, 0), depth)


def _read_range(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
    delta = u.const_array(node.inputs[2])
    if delta is None or delta.size != 1 or int(delta.reshape(())) != 1:
        raise NotProved("a Range whose step is not the constant 1")
    dtype = u.dtype(node.outputs[0]) or ir.DataType.INT64
    start = u.const_array(node.inputs[0])
    if start is not None and start.size == 1 and int(start.reshape(())) == 0:
        n = r.scalar(input_at(node, 1))
        if n is None:
            raise NotProved("a Range whose length is not a dim of the graph")
        r.dim_values.setdefault(n, input_at(node, 1))
        return normalise((n,), Lin.of({("x", 0): 1}), dtype)
    # Range(start, limit): the positions of new tokens after a cache (cache_position = Range(past,
    # past + new)); element x is start + x, and there are limit - start of them
    first, limit = dim_lin(r.scalar(input_at(node, 0))), r.scalar(input_at(node, 1))
    n = dim_sum([limit, r.scalar(input_at(node, 0))], [1, -1]) if first is not None else None
    if first is None or n is None:
        raise NotProved("a Range whose start and length (limit - start) are not dims of the graph")
    return normalise((n,), Lin.of({("x", 0): 1}).plus(first), dtype)


def _read_unsqueeze(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
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


def _read_squeeze(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
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


def _read_reshape(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
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


def _read_expand(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
    x = r.read(input_at(node, 0), depth)
    target = r.vector(input_at(node, 1))
    if target is None or any(d is None for d in target):
        raise NotProved("an Expand to a shape this reading cannot follow")
    shape = Abstract(tuple(target), Num(0, ir.DataType.INT64), None)
    dims, (term, _) = _broadcast([x, shape])
    return normalise(dims, term, x.dtype)


def _read_constant_of_shape(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
    target = r.vector(input_at(node, 0))
    attr = node.attributes.get("value")
    if target is None or any(d is None for d in target):
        raise NotProved("a ConstantOfShape of a shape this reading cannot follow")
    if attr is None:
        value, dtype = 0.0, ir.DataType.FLOAT
    else:
        arr = attr.as_tensor().numpy()
        value, dtype = arr.reshape(-1)[0].item(), ir.DataType(attr.as_tensor().dtype)
    term: Term = Lin((), int(value)) if dtype in (ir.DataType.INT64, ir.DataType.INT32) else Num(value, dtype)
    return Abstract(tuple(target), term, dtype)


def _read_gather(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
    """Gather(Flatten(X, 2 | -1 ...), b * S + j) on axis 0: X[b, j] (TorchScript's padding lookup)."""
    if u.attr_int(node, "axis", 0) != 0:
        raise NotProved("a Gather on an axis other than 0")
    flat = u.producer(input_at(node, 0), "Flatten")
    if flat is None:
        raise NotProved("a Gather from a tensor that is not a flattened mask")
    source = input_at(flat, 0)
    src_dims = r.dims_of(source)
    if src_dims is None or len(src_dims) != 2 or u.attr_int(flat, "axis", 1) != 2:
        raise NotProved("a Gather from a Flatten of other than a [B, S] mask")
    idx = r.read(input_at(node, 1), depth)
    if not isinstance(idx.term, Lin):
        raise NotProved("a Gather index that is not a linear form")
    batch, keys = src_dims
    b_axes = [a for a, c in idx.term.coeffs if a[0] == "xd" and c == 1 and dims_equal(a[2], keys)]  # type: ignore[arg-type]
    j_axes = [a for a, c in idx.term.coeffs if a[0] == "x" and c == 1]
    if len(idx.term.coeffs) != 2 or idx.term.const != 0 or len(b_axes) != 1 or len(j_axes) != 1:
        raise NotProved("a Gather index that is not b * S + j")
    ba, ja = int(b_axes[0][1]), int(j_axes[0][1])  # type: ignore[call-overload]
    prefix: tuple[tuple[shapes.Dim, ir.Value] | None, ...] | None = None
    if _in_range(idx.dims, ba, batch) and not _in_range(idx.dims, ja, keys) and ja != ba:
        # j over [0, n), n a Range's length, not proved the mask's S: the index reads the last row
        # (b = B - 1, b over the whole batch) at (B - 1) * S + j, and ONNX Runtime's Gather fails
        # past the end, so wherever the graph runs n <= S and it reads X[:, :n]
        length = r.dim_values.get(idx.dims[ja])
        if length is not None and dims_equal(idx.dims[ba], batch):
            prefix = (None, (idx.dims[ja], length))
    elif _in_range(idx.dims, ja, keys) and not _in_range(idx.dims, ba, batch) and ja != ba:
        # b over [0, n), n a Range's length (TorchScript's: the embeddings' batch), not proved the
        # mask's B; j over the whole row: the last index is n * S - 1, past the end unless n <= B,
        # so wherever the graph runs it reads X[:n]
        length = r.dim_values.get(idx.dims[ba])
        if length is not None:
            prefix = ((idx.dims[ba], length), None)
    if (not _in_range(idx.dims, ba, batch) or not _in_range(idx.dims, ja, keys)) and prefix is None:
        raise NotProved("a Gather index whose range is not proved inside the mask")
    look = Look(source, (Lin.of({("x", ba): 1}), Lin.of({("x", ja): 1})), tuple(src_dims), prefix)
    return normalise(idx.dims + (1,), look, u.dtype(source))


def _in_range(dims: tuple[shapes.Dim, ...], axis: int, size: shapes.Dim) -> bool:
    """x_axis < size for every index of dims (x_axis ranges over [0, dims[axis]))."""
    return dims[axis] == 1 or dims_equal(dims[axis], size)


def _read_gather_nd(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
    if u.attr_int(node, "batch_dims", 0) != 0:
        raise NotProved("a GatherND with batch_dims")
    data = input_at(node, 0)
    src_dims = r.dims_of(data)
    idx = r.read(input_at(node, 1), depth)
    last = len(idx.dims) - 1
    if src_dims is None or idx.dims[-1] != len(src_dims):
        raise NotProved("a GatherND that does not index every axis of its data")
    index = []
    prefix: list[tuple[shapes.Dim, ir.Value] | None] = []
    for k, size in enumerate(src_dims):
        lin = substitute(idx.term, last, k)
        if not isinstance(lin, Lin) or len(lin.coeffs) > 1 or lin.const != 0:
            raise NotProved("a GatherND index that is not one index variable")
        cut = None
        if lin.coeffs:
            (atom, coef) = lin.coeffs[0]
            if atom[0] != "x" or coef != 1:
                raise NotProved("a GatherND index that is not one index variable")
            axis = int(atom[1])  # type: ignore[call-overload]
            if not _in_range(idx.dims, axis, size):
                # x ranges over [0, n) with n a Range's length: ONNX Runtime's GatherND fails on an
                # index past the data's end, so wherever the graph runs it reads data[..., :n, ...]
                length = r.dim_values.get(idx.dims[axis])
                if length is None:
                    raise NotProved("a GatherND index whose range is not proved inside the data")
                cut = (idx.dims[axis], length)
        index.append(lin)
        prefix.append(cut)
    through = _index_only(r, data, depth)
    if through is not None and len(through.dims) == len(src_dims):
        # data is index arithmetic alone (the position ids, Expand(Range(S))): its term at the index
        return normalise(idx.dims[:-1], _at_index(through.term, index), through.dtype or u.dtype(data))
    look = Look(data, tuple(index), tuple(src_dims), tuple(prefix) if any(prefix) else None)
    return normalise(idx.dims[:-1], look, u.dtype(data))


def _index_only(r: TensorReader, value: ir.Value, depth: int) -> Abstract | None:
    """value read as a term of its index variables and dims alone (no look-up of a tensor the
    reading does not enter), or None: such a term has the same value at every index the graph reads."""
    try:
        x = r.read(value, depth)
    except NotProved:
        return None
    return None if atoms(x.term) and any(isinstance(a, Look) for a in atoms(x.term)) else x


def _at_index(term: Term, index: list[Lin]) -> Term:
    """term (over the data's axes 0..n-1) at data[index], each index 0 or one index variable x_a."""
    mapping: dict[int, int] = {}
    for k, lin in reversed(list(enumerate(index))):
        if lin.coeffs:
            mapping[k] = int(lin.coeffs[0][0][1])  # type: ignore[call-overload]
        else:
            term = substitute(term, k, 0)
    return remap(term, mapping)


def _read_concat(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
    xs = [r.read(x, depth) for x in node.inputs]
    rank = len(xs[0].dims)
    axis = u.attr_int(node, "axis", 0) % rank
    if any(len(x.dims) != rank for x in xs):
        raise NotProved("a Concat of pieces of other ranks")
    if any(x.dims[axis] != 1 for x in xs):
        return _continued(xs, axis)
    dims, terms = _broadcast(xs)
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
    dims, terms = _broadcast(flat)
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


def _read_cumsum(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
    """A CumSum of a tensor proved 0 everywhere is 0 (transformers' packed-sequence ids of one
    sequence per row: the CumSum of no breaks)."""
    x = r.read(input_at(node, 0), depth)
    zero = (isinstance(x.term, Lin) and not x.term.coeffs and x.term.const == 0) or (
        isinstance(x.term, Num) and x.term.value == 0
    )
    if not zero or x.dtype not in (ir.DataType.INT64, ir.DataType.INT32):
        raise NotProved("a CumSum of a tensor not proved 0")
    return Abstract(x.dims, Lin(), x.dtype)


def _read_slice(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
    """A static slice (a causal buffer cut to the sequence length): x_a -> x_a + start."""
    x = r.read(input_at(node, 0), depth)
    starts, ends = (u.const_array(node.inputs[i]) for i in (1, 2))
    axes = u.const_array(input_at(node, 3)) if len(node.inputs) > 3 and node.inputs[3] is not None else None
    steps = u.const_array(input_at(node, 4)) if len(node.inputs) > 4 and node.inputs[4] is not None else None
    if starts is None:  # computed, but proved a number: Sk - Sq of a prefill (GPT-Neo's buffer rows)
        computed_starts = r.vector(input_at(node, 1))
        if computed_starts is not None and all(isinstance(d, int) for d in computed_starts):
            starts = np.asarray(computed_starts, np.int64)
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
        elif out is not None and out[a] is not None:
            dims[a] = out[a]
        else:
            raise NotProved("a Slice whose length is not proved")
        if s:
            term = map_lin(term, functools.partial(_shift, axis=a, by=s))
    return normalise(tuple(dims), term, x.dtype)


def _shift(lin: Lin, axis: int, by: int) -> Lin:
    c = lin.as_dict().get(("x", axis), 0)
    if any(a[0] == "xd" and a[1] == axis for a, _ in lin.coeffs):
        raise NotProved("a Slice of a flattened index")
    return Lin.of(lin.as_dict(), lin.const + c * by)


OPS: dict[str, Callable[[TensorReader, ir.Node, int], Abstract]] = {
    **{
        op: _elementwise(op)
        for op in (
            "Less",
            "LessOrEqual",
            "Greater",
            "GreaterOrEqual",
            "Equal",
            "And",
            "Or",
            "Where",
            "Add",
            "Sub",
            "Mul",
        )
    },
    "Not": _read_not,
    "Cast": _read_cast,
    "Identity": _read_identity,
    "Range": _read_range,
    "Unsqueeze": _read_unsqueeze,
    "Squeeze": _read_squeeze,
    "Reshape": _read_reshape,
    "Expand": _read_expand,
    "ConstantOfShape": _read_constant_of_shape,
    "Gather": _read_gather,
    "GatherND": _read_gather_nd,
    "Concat": _read_concat,
    "Slice": _read_slice,
    "CumSum": _read_cumsum,
}
