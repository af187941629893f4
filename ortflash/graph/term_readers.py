"""The ops whose reading builds a term of the index variables (graph/terms), for graph/op_readers'
table: comparisons, bool ops, ``Where`` and integer arithmetic (a product of two index-dependent
integers only as a flattened index), ``Cast``, ``Not``, ``Identity``, ``Range`` (an index variable
from its start), ``ConstantOfShape``, and a ``CumSum`` where its input is 0 (transformers'
packed-sequence test on position ids that are one range per row)."""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from . import ir_utils as u
from .dim_terms import dim_lin, dim_sum, lin_dim
from .tensor_reader import TensorReader, broadcast, input_at
from .terms import Abstract, Cmp, Lin, NotProved, Num, Op, Term, fold, normalise


def elementwise(op: str) -> Callable[[TensorReader, ir.Node, int], Abstract]:
    def read(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
        xs = [r.read(x, depth) for x in node.inputs if x is not None]
        dims, terms = broadcast(xs)
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


def read_cast(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
    x = r.read(input_at(node, 0), depth)
    to = ir.DataType(u.attr_int(node, "to", 0))
    if x.dtype == to or (isinstance(x.term, Lin) and to in (ir.DataType.INT64, ir.DataType.INT32)):
        return Abstract(x.dims, x.term, to)
    return Abstract(x.dims, fold(Op("Cast", (x.term,), int(to))), to)


def read_not(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
    x = r.read(input_at(node, 0), depth)
    return Abstract(x.dims, fold(Op("Not", (x.term,))), ir.DataType.BOOL)


def read_identity(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
    return r.read(input_at(node, 0), depth)


def read_range(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
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


def read_constant_of_shape(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
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


def read_cumsum(r: TensorReader, node: ir.Node, depth: int) -> Abstract:
    """A CumSum of a tensor proved 0 everywhere is 0 (transformers' packed-sequence ids of one
    sequence per row: the CumSum of no breaks)."""
    x = r.read(input_at(node, 0), depth)
    zero = (isinstance(x.term, Lin) and not x.term.coeffs and x.term.const == 0) or (
        isinstance(x.term, Num) and x.term.value == 0
    )
    if not zero or x.dtype not in (ir.DataType.INT64, ir.DataType.INT32):
        raise NotProved("a CumSum of a tensor not proved 0")
    return Abstract(x.dims, Lin(), x.dtype)
