"""The ops whose reading is a look-up into a tensor the reading does not enter (a ``Look`` term),
for graph/op_readers' table: ``Gather`` on a flattened [B, S] mask at ``b * S + j``, and
``GatherND`` with built index tuples (of index arithmetic alone, such as position ids
``Expand(Range(S))``, that arithmetic at the index); each index proved inside the data, or cut to
a Range's length where ONNX Runtime would fail past the end."""

from __future__ import annotations

import onnx_ir as ir

from . import ir_utils as u
from . import shapes
from .dim_terms import dims_equal
from .tensor_reader import TensorReader, input_at
from .terms import Abstract, Lin, Look, NotProved, Term, atoms, normalise, remap, substitute


def read_gather(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
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


def read_gather_nd(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
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
