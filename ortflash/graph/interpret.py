"""The deep mode of the one evaluator: dims, shape tensors and tensors read by a small exact
abstract interpretation over a fixed op set, never by pattern strings and never by sampling.

graph/shapes answers from shape inference and the shape subgraphs; ``Reader`` goes further:
through MatMuls, norms, rotary tables and computed reshapes (``dims_of``, ``proved_dims``), with
dims that are sums of symbols (graph/dim_terms), and into the elements of a tensor as a term of its
index variables (``read``, graph/terms; the reading of each op is graph/op_readers). The general
rules ask it for dims (fusion/softmax_read, fusion/softmax_rules); the causality proof reads a mask
subgraph with it (fusion/causal/proof).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from . import ir_utils as u
from . import shapes
from .dim_terms import CAPPED, broadcast_dims, decided_equal, dim_lin, dim_sum
from .op_readers import OPS
from .tensor_reader import input_at
from .terms import Abstract, Cmp, Lin, Look, NotProved, Num, Op, Term, normalise

# Constant tensors (a causal buffer) read element by element up to this size.
_MAX_CONSTANT = 1 << 22


def proved_dims(value: ir.Value) -> list[shapes.Dim] | None:
    """value's dims as the deep reading proves them (through MatMuls, norms, rotary tables
    and computed reshapes, further than shape inference and graph.shapes go)."""
    return Reader().dims_of(value)


def _const_ints(value: ir.Value | None) -> list[int] | None:
    arr = u.const_array(value)
    return None if arr is None or arr.ndim > 1 else [int(x) for x in arr.reshape(-1)]


class Reader:
    """Reads values into Abstracts, and the shape tensors around them into dims.

    Shapes are read with this reading's own dims (``dims_of``): ONNX shape inference names the
    outputs of a Reshape to ``[-1, S]`` or of an embedding Gather with fresh symbols, which would
    hide that the mask's rows are the scores' rows. Where this reading has no rule, the one
    evaluator (graph/shapes) answers."""

    def __init__(self, computed_starts: bool = False) -> None:
        self.memo: dict[int, Abstract] = {}
        self.dims_memo: dict[int, list[shapes.Dim] | None] = {}
        # a scalar value of the graph that computes each dim read as a Range's length
        self.dim_values: dict[shapes.Dim, ir.Value] = {}
        # computed_starts: a Slice from a start computed at run time (a causal buffer's rows from a
        # cache's length) is read, as exact only where its end e is inside the axis of static size
        # N (ONNX clamps an end past N): (e, N) in ends_assumed, which the caller must discharge
        # from ends_inside, the ends of Slices from 0 that the reading took as the slice's length
        # (wherever the graph runs e <= N there: a longer one is cut to N and fails to broadcast
        # with the scores, as the caller checks the dims). fusion/causal/proof is that caller.
        self.computed_starts = computed_starts
        self.ends_assumed: list[tuple[shapes.Dim, int]] = []
        self.ends_inside: list[tuple[shapes.Dim, int]] = []

    def dims_of(self, value: ir.Value | None, depth: int = 96) -> list[shapes.Dim] | None:
        if value is None:
            return None
        if id(value) not in self.dims_memo:
            self.dims_memo[id(value)] = self._dims_of(value, depth)
        return self.dims_memo[id(value)]

    def _dims_of(self, value: ir.Value, depth: int) -> list[shapes.Dim] | None:
        fused = value.producer()
        if fused is not None and fused.op_type == "FlashAttention" and fused.domain == "ai.onnx.contrib" and depth > 0:
            # an earlier block, fused already: O [B, Hq, Sq, Dv] from Q and V
            q, v = self.dims_of(input_at(fused, 0), depth - 1), self.dims_of(input_at(fused, 2), depth - 1)
            if q is not None and v is not None and len(q) == len(v) == 4:
                return q[:3] + v[3:]
        node = u.producer(value)
        if node is None or depth <= 0 or u.const_array(value) is not None:
            return shapes.dims_of(value)
        op = node.op_type
        if op in ("Cast", "Identity", "Not", "Neg"):
            return self.dims_of(input_at(node, 0), depth - 1)
        if op == "Reshape":
            target = self.vector(input_at(node, 1), depth - 1)
            source = self.dims_of(input_at(node, 0), depth - 1)
            if target is not None and source is not None:
                found = shapes.apply_reshape(target, source, bool(u.attr_int(node, "allowzero", 0)))
                if all(d is not None for d in found):
                    return found
        if op == "Gather" and u.const_array(input_at(node, 0)) is not None:  # an embedding lookup
            axis = u.attr_int(node, "axis", 0)
            data, idx = shapes.dims_of(input_at(node, 0)), self.dims_of(input_at(node, 1), depth - 1)
            if data is not None and idx is not None:
                return data[:axis] + idx + data[axis + 1 :]
        if (
            op == "Gather"
            and (picked := u.const_array(input_at(node, 1))) is not None
            and (r := u.rank(input_at(node, 0)))
        ):
            # one slot of a fused projection picked by a constant index (Bloom's q/k/v)
            source, axis = self.dims_of(input_at(node, 0), depth - 1), u.attr_int(node, "axis", 0) % r
            if source is not None and len(source) == r:
                return source[:axis] + list(np.shape(picked)) + source[axis + 1 :]
        if op in _SAME_DIMS:
            return self.dims_of(input_at(node, 0), depth - 1)
        if op in _REDUCE and (r := u.rank(input_at(node, 0))) is not None:  # RMSNorm's mean of squares
            reduced_in = self.dims_of(input_at(node, 0), depth - 1)
            reduced = u.attr_ints(node, "axes")
            if reduced is None and len(node.inputs) > 1 and node.inputs[1] is not None:
                reduced = _const_ints(node.inputs[1])
            if reduced_in is not None and reduced is not None and len(reduced_in) == r:
                gone = {a % r for a in reduced}
                if u.attr_int(node, "keepdims", 1):
                    return [1 if a in gone else reduced_in[a] for a in range(r)]
                return [reduced_in[a] for a in range(r) if a not in gone]
        if op == "Tile":  # rotary tables repeated along the head dim (GPT-J's interleaved sin/cos)
            tiled_in, repeats = self.dims_of(input_at(node, 0), depth - 1), self.vector(input_at(node, 1), depth - 1)
            if tiled_in is not None and repeats is not None and len(tiled_in) == len(repeats):
                # a size-1 axis tiled n times is n long (position ids tiled over the batch)
                tiled = [
                    d if n == 1 else n if d == 1 else shapes.times(d, n) if isinstance(n, int) else None
                    for d, n in zip(tiled_in, repeats)
                ]
                if all(d is not None for d in tiled):
                    return tiled
        if op == "Transpose":
            x = self.dims_of(input_at(node, 0), depth - 1)
            perm = u.attr_ints(node, "perm")
            if x is not None:
                return [x[p] for p in perm] if perm is not None else x[::-1]
        if op == "Split" and (r := u.rank(input_at(node, 0))) is not None:
            x, out = self.dims_of(input_at(node, 0), depth - 1), u.value_shape(value)
            axis = u.attr_int(node, "axis", 0) % r
            if x is not None and out is not None and isinstance(out[axis], int):
                return x[:axis] + [out[axis]] + x[axis + 1 :]
        if op in ("Concat", "Slice") and (r := u.rank(value)) is not None:
            # the dims along which nothing is cut or joined are the (first) input's
            x, out = self.dims_of(input_at(node, 0), depth - 1), u.value_shape(value)
            if op == "Concat":
                cut = {u.attr_int(node, "axis", 0) % r}
            else:
                axes = u.const_array(input_at(node, 3)) if len(node.inputs) > 3 and node.inputs[3] is not None else None
                cut = set(range(r)) if axes is None else {int(a) % r for a in axes.reshape(-1)}
            if op == "Concat" and x is not None and len(x) == r:
                # the joined axis: the sum of the pieces' (a KV cache's past + new)
                pieces = [self.dims_of(p, depth - 1) for p in node.inputs]
                if all(p is not None and len(p) == r for p in pieces):
                    joined = dim_sum([p[min(cut)] for p in pieces])  # type: ignore[index]
                    if joined is not None:
                        return [joined if a in cut else x[a] for a in range(r)]
            if op == "Slice" and x is not None and len(x) == r and out is not None and len(cut) == 1:
                cut_axis = min(cut)
                sliced: list[shapes.Dim] = list(out)
                sliced[cut_axis] = self._prefix_length(node, x[cut_axis], depth) or out[cut_axis]
                return [sliced[a] if a in cut else x[a] for a in range(r)]
            if x is not None and out is not None and len(x) == r:
                return [out[a] if a in cut else x[a] for a in range(r)]
        if op in _BROADCAST or op == "MatMul":
            parts = [self.dims_of(x, depth - 1) for x in node.inputs if x is not None]
            if all(p is not None for p in parts):
                tails: list[list[shapes.Dim]] = []
                if op == "MatMul" and all(len(p) >= 2 for p in parts):  # type: ignore[arg-type]
                    a, b = parts
                    tails, parts = [[a[-2], b[-1]]], [a[:-2], b[:-2]]  # type: ignore[index]
                dims = broadcast_dims(parts)  # type: ignore[arg-type]
                if dims is not None:
                    return _filled(dims + (tails[0] if tails else []), value)
        if op in OPS and op not in ("Gather", "GatherND", "Reshape"):
            try:
                return list(self.read(value).dims)
            except NotProved:
                pass
        return shapes.dims_of(value)

    def _prefix_length(self, node: ir.Node, size: shapes.Dim, depth: int) -> shapes.Dim:
        """The length of Slice(x, 0, e) along its one axis of static size N > 1: min(e, N),
        written "min(e, N)" for a symbolic e (a position table cut to the sequence length);
        broadcast_dims reads it as e where it meets e, as the graph runs only where they agree."""
        steps = node.inputs[4] if len(node.inputs) > 4 else None
        if _const_ints(input_at(node, 1)) != [0] or (steps is not None and _const_ints(steps) != [1]):
            return None
        end = self.scalar(input_at(node, 2), depth - 1)
        if not isinstance(size, int) or size <= 1 or end is None:
            return None
        if isinstance(end, int):
            return len(range(size)[:end])  # ONNX clamps and counts negative ends as Python does
        return f"{CAPPED}{end}, {size})" if isinstance(end, str) else None

    def vector(self, value: ir.Value | None, depth: int = 32) -> list[shapes.Dim] | None:
        """A 1-D shape tensor, element by element."""
        if value is None:
            return None
        node = u.producer(value)
        if node is None or depth <= 0 or u.const_array(value) is not None:
            return shapes.shape_vector(value)
        op = node.op_type
        if op == "Shape":
            dims = self.dims_of(input_at(node, 0), depth - 1)
            return None if dims is None else dims[u.attr_int(node, "start", 0) : u.attr_int(node, "end", None)]
        if op == "Concat":
            joined: list[shapes.Dim] = []
            for x in node.inputs:
                part = self.vector(x, depth - 1)
                if part is None:
                    return None
                joined += part
            return joined
        if op in ("Cast", "Identity"):
            return self.vector(input_at(node, 0), depth - 1)
        if op == "Slice" and len(node.inputs) >= 3:  # part of a shape: Shape(x)[:-2] + [-1]
            data = self.vector(input_at(node, 0), depth - 1)
            starts, ends = _const_ints(input_at(node, 1)), _const_ints(input_at(node, 2))
            axes = _const_ints(input_at(node, 3)) if len(node.inputs) > 3 and node.inputs[3] is not None else [0]
            steps = _const_ints(input_at(node, 4)) if len(node.inputs) > 4 and node.inputs[4] is not None else [1]
            if data is not None and starts and ends and axes in ([0], [-1]) and steps == [1]:
                return data[starts[0] : ends[0]]  # ONNX clamps as Python does for step 1
        if op == "Unsqueeze" and u.unsqueeze_axes(node) == [0] and u.rank(input_at(node, 0)) in (0, None):
            return [self.scalar(input_at(node, 0), depth - 1)]
        if op == "Gather" and u.attr_int(node, "axis", 0) == 0:
            idx, data = u.const_array(input_at(node, 1)), self.vector(input_at(node, 0), depth - 1)
            if idx is not None and data is not None and idx.ndim == 1:
                try:
                    return [data[int(i)] for i in idx]
                except IndexError:
                    return None
        if op == "Reshape" and u.rank(value) == 1:
            if u.rank(input_at(node, 0)) == 0:  # a scalar made a one-element vector (past + new)
                one = self.scalar(input_at(node, 0), depth - 1)
                return None if one is None else [one]
            return self.vector(input_at(node, 0), depth - 1)
        if op == "ConstantOfShape":
            n = self.vector(input_at(node, 0), depth - 1)
            attr = node.attributes.get("value")
            fill = 0 if attr is None else int(attr.as_tensor().numpy().reshape(-1)[0])
            if n is not None and len(n) == 1 and isinstance(n[0], int):
                return [fill for _ in range(n[0])]
        if op in ("Mul", "Add", "Where"):
            # entry by entry: Mul/Add of static entries; where(s == t, c, d) where each test is decided
            eq = u.producer(input_at(node, 0), "Equal") if op == "Where" else None
            if op == "Where" and eq is None:
                return shapes.shape_vector(value)
            sources = (
                [input_at(eq, 0), input_at(eq, 1), input_at(node, 1), input_at(node, 2)]
                if eq is not None
                else list(node.inputs)
            )
            found = [self.vector(x, depth - 1) for x in sources]
            parts = [p for p in found if p is not None]
            if len(parts) != len(found):
                return None
            width = max(len(p) for p in parts)
            if not all(len(p) in (1, width) for p in parts):
                return None
            rows = list(zip(*(p * (width // len(p)) for p in parts)))
            if op != "Where":
                if op == "Add" and not all(isinstance(x, int) for row in rows for x in row):
                    sums = [dim_sum([x, y]) for x, y in rows]
                    return None if any(d is None for d in sums) else sums
                if not all(isinstance(x, int) for row in rows for x in row):
                    return None
                return [int(x) * int(y) for x, y in rows]
            out: list[shapes.Dim] = []
            for x, y, yes, no in rows:
                same = decided_equal(x, y)
                if same is None:
                    return None
                out.append(yes if same else no)
            return out
        return shapes.shape_vector(value)

    def scalar(self, value: ir.Value | None, depth: int = 32) -> shapes.Dim:
        """A scalar shape element (Range's limit, a row length) as a dim term."""
        if value is None:
            return None
        if u.rank(value) == 1:  # a one-element vector (Slice's ends)
            vec = self.vector(value, depth - 1)
            return vec[0] if vec is not None and len(vec) == 1 else None
        node = u.producer(value)
        if node is None or depth <= 0 or u.const_array(value) is not None:
            return shapes.scalar_dim(value)
        op = node.op_type
        if op in ("Cast", "Identity", "Squeeze", "Reshape"):
            vec = self.vector(input_at(node, 0), depth - 1) if u.rank(input_at(node, 0)) == 1 else None
            if vec is not None and len(vec) == 1:
                return vec[0]
            return self.scalar(input_at(node, 0), depth - 1)
        if op in ("Add", "Sub") and all(u.rank(x) in (0, 1) for x in node.inputs):
            # past + new: a KV cache's total length
            parts = [self.scalar(x, depth - 1) for x in node.inputs]
            return dim_sum(parts, [1, 1 if op == "Add" else -1])
        if op == "Gather" and u.attr_int(node, "axis", 0) == 0:
            idx, data = u.const_array(input_at(node, 1)), self.vector(input_at(node, 0), depth - 1)
            if idx is not None and data is not None and idx.ndim == 0:
                try:
                    return data[int(idx)]
                except IndexError:
                    return None
        if op in ("Mul", "Div") and len(node.inputs) == 2:
            # B·H / H: the batch back from a per-batch·head dim (Bloom's views)
            a, b = self.scalar(input_at(node, 0), depth - 1), shapes.scalar_dim(input_at(node, 1))
            if isinstance(b, int) and b > 0:
                return shapes.times(a, b) if op == "Mul" else shapes.divided(a, b)
        return shapes.scalar_dim(value)

    def read(self, value: ir.Value | None, depth: int = 64) -> Abstract:
        if value is None:
            raise NotProved("a missing input")
        if id(value) in self.memo:
            return self.memo[id(value)]
        if depth <= 0:
            raise NotProved("the mask subgraph is deeper than this reading follows")
        out = self._read(value, depth)
        self.memo[id(value)] = out
        return out

    def _leaf(self, value: ir.Value) -> Abstract:
        arr = u.const_array(value)
        dtype = u.dtype(value)
        if arr is not None and arr.size == 1:
            v = arr.reshape(()).item()
            t = ir.DataType.BOOL if arr.dtype == np.bool_ else dtype or ir.DataType.FLOAT
            return Abstract((), Num(v, t) if not isinstance(v, int) or t == ir.DataType.BOOL else Lin((), v), t)
        dims = self.dims_of(value)
        if dims is None or any(d is None for d in dims):
            raise NotProved(f"the dims of {u.label(value)} are unknown")
        if arr is not None and arr.size <= _MAX_CONSTANT and arr.ndim >= 2 and arr.dtype == np.bool_:
            frontier = _constant_frontier(arr)
            if frontier is not None:  # a causal buffer: arr[..., i, j] == (j <= i + c), or a band
                c, low = frontier  # ... and not (j <= i + low): GPT-Neo's local layers
                r = arr.ndim

                def le(offset: int) -> Cmp:  # j <= i + offset
                    return Cmp("le", Lin.of({("x", r - 1): 1, ("x", r - 2): -1}, -offset))

                term: Term = le(c) if low is None else Op("And", (le(c), Op("Not", (le(low),))))
                return normalise(tuple(dims), term, ir.DataType.BOOL)
        index = tuple(Lin.of({("x", a): 1}) for a in range(len(dims)))
        return normalise(tuple(dims), Look(value, index, tuple(dims)), dtype)

    def _read(self, value: ir.Value, depth: int) -> Abstract:
        node = u.producer(value)
        if node is None or u.const_array(value) is not None:
            return self._leaf(value)
        if u.rank(value) == 0 and u.dtype(value) in (ir.DataType.INT64, ir.DataType.INT32):
            dim = self.scalar(value)  # a size read from a shape (the row length of a flattened mask)
            if (lin := dim_lin(dim)) is not None:
                return Abstract((), lin, u.dtype(value))
        if u.rank(value) == 1 and u.dtype(value) in (ir.DataType.INT64, ir.DataType.INT32):
            vec = self.vector(value)  # the same, as a one-element vector
            if vec is not None and len(vec) == 1 and (lin := dim_lin(vec[0])) is not None:
                return Abstract((1,), lin, u.dtype(value))
        if node.op_type not in OPS:
            return self._leaf(value)
        return OPS[node.op_type](self, node, depth - 1)


# Ops whose output has their first input's dims.
_SAME_DIMS = frozenset(
    "Cast Identity Not Neg Relu Gelu FastGelu Erf Tanh Sigmoid Sqrt Reciprocal Exp Log Softmax Cos Sin "
    "LayerNormalization SimplifiedLayerNormalization SkipLayerNormalization Dropout".split()
)
_REDUCE = frozenset("ReduceMean ReduceSum ReduceMax ReduceMin ReduceSumSquare ReduceL2".split())
# Elementwise ops with numpy broadcasting, for dims.
_BROADCAST = frozenset("Add Sub Mul Div Pow Where And Or Equal Less Greater Max Min".split())


def _filled(dims: list[shapes.Dim], value: ir.Value) -> list[shapes.Dim]:
    """dims, with shape inference's dim of value on the axes this reading left unknown."""
    inferred = shapes.dims_of(value) if None in dims else None
    if inferred is None or len(inferred) != len(dims):
        return dims
    return [i if d is None else d for d, i in zip(dims, inferred)]


def _constant_frontier(arr: np.ndarray) -> tuple[int, int | None] | None:
    """(c, None) when every matrix of the bool constant arr is exactly (j <= i + c); (c, low) when
    it is the band (low < j - i <= c) (GPT-Neo's local buffer: tril xor tril(-window)); else None."""
    sq, sk = arr.shape[-2:]
    first = arr.reshape(-1, sq, sk)
    if not (first == first[0]).all():
        return None
    row = first[0]
    c = int(row[0].sum()) - 1  # row 0 sees keys 0..c
    if -sq <= c < sk and np.array_equal(row, np.tril(np.ones((sq, sk), bool), k=c)):
        return c, None
    if not row[-1].any():
        return None
    c = int(np.flatnonzero(row[-1])[-1]) - (sq - 1)  # the last row's last key: i + c
    low = c - int(row[-1].sum())  # the last row sees keys (sq - 1 + low, sq - 1 + c]
    band = np.tril(np.ones((sq, sk), bool), k=c) & ~np.tril(np.ones((sq, sk), bool), k=low)
    return (c, low) if -sq <= low < c < sk and np.array_equal(row, band) else None
