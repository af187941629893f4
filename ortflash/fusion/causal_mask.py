"""Causality proved from the mask subgraph: is a block's [B, 1, Sq, Sk] bias (or bool mask)
exactly a causal frontier combined with a key padding part that depends only on (b, j)?

Exporters build the causal and padding mask upstream, once per stack, from ``attention_mask``
and ``Range``s of the sequence lengths (HF transformers' masking_utils, both exporters), and
every block adds it as one [B, 1, S, S] tensor. This module reads that subgraph by a small exact
abstract interpretation over a fixed op set, never by pattern strings and never by sampling:

* every tensor of the subgraph becomes a ``Abstract``: its dims (``shapes.Dim`` terms) and a
  *term* giving each element as a function of its index variables ``x0 .. x{r-1}``;
* integer terms are linear forms over the index variables and symbolic dims (``Range(0, n)``
  is ``x0`` over dims ``[n]``); comparisons of linear forms are normalised to ``lin <= 0`` or
  ``lin == 0``; tensors the interpretation does not enter (``attention_mask``, a constant) are
  ``Look``-ups at index terms; bool and float ops build a small expression tree;
* ``Unsqueeze``/``Squeeze``/``Reshape``/``Expand``/broadcasting move index variables between axes;
  ``Gather`` on a flattened tensor and ``GatherND`` with built index tuples become look-ups.

The proof then splits the term on its comparisons of the key index j (axis 3) with the query
index i (axis 2): all must be one predicate ``j <= i + c``; with it false the term must fold to
one constant (the fill); with it true the term must not mention i (the padding part P(b, j)).
The block then becomes ``is_causal`` (1 for c = 0; 2 for c = Sk - Sq) with P, rewritten from the same upstream tensors by the same ops (so exactly the same values),
as a [B, 1, 1, Sk] bias or mask. Every step that cannot be proved raises ``NotProved`` naming it,
and the block keeps its [B, 1, Sq, Sk] tensor.

KV-cache decoders. Their masks compare j over ``Range(past + new)`` with ``i = Range(new) + past``:
c is then a linear form over symbolic dims (``past``), and dims are sums of symbols (``past +
seq``, written as ONNX Runtime's symbolic shape inference names them). c is proved Sk - Sq by
sums of the dims' terms: Sk from the K cache's Concat (the sum of its pieces), Sq from Q, and the
mask's rows and keys proved the scores'. The padding part reads ``attention_mask`` [B, T], whose
own length symbol T is never assumed to be Sk: the graph reads it at j < past + new through a
GatherND (or a Gather from its Flatten at b * T + j, b over the whole batch), which ONNX Runtime
refuses past the end, so wherever the graph runs it reads the prefix ``attention_mask[:, :Sk]``,
and the rewrite writes that Slice with the graph's own value of the Range's length.

One module of about 1200 lines on purpose: the term types, the reading of each op, the proof
and the writer are one abstract interpretation and change together (a new op is a reading rule,
a term case and, where the padding part uses it, a writing case).

Exactness. For a bool mask ``where(T, s, fill)``: exact (the masked scores are ``fill`` either
way). For an additive bias ``s + T`` with T = fill off the frontier: the op writes ``fill`` where
the graph has ``s + fill``; equal for fill -inf and finite s, and for fill <= -2**127
(float32-lowest) and |s| < 2**102. A NaN or infinite score right of the frontier (NaN in Q or
K) no longer reaches its row, as with every causal fill of the op (the kernels skip those keys).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from ..graph import ir_utils as u
from ..graph import shapes
from ..graph.emitter import Emitter

# A float32 fill at or below -2**127 absorbs any score below 2**102 in magnitude (fill + s == fill).
ABSORBING_FILL = -(2.0**127)
# Constant tensors (a causal buffer) read element by element up to this size.
_MAX_CONSTANT = 1 << 22


class NotProved(Exception):
    """A step of the causality proof that does not hold (or that this reading cannot show)."""


class NoFrontier(NotProved):
    """The mask compares no key position with a query position: nothing causal to prove."""


# ---------------------------------------------------------------- terms

# Atoms of a linear form: ("x", axis) an index variable, ("d", dim) a symbolic dim,
# ("xd", axis, dim) their product (a flattened index b * S).
Atom = tuple[object, ...]


def _atom_key(a: Atom) -> str:
    return repr(a)


@dataclass(frozen=True)
class Lin:
    """sum(coef * atom) + const, an integer."""

    coeffs: tuple[tuple[Atom, int], ...] = ()
    const: int = 0

    @staticmethod
    def of(coeffs: dict[Atom, int], const: int = 0) -> Lin:
        items = sorted(((a, c) for a, c in coeffs.items() if c), key=lambda ac: _atom_key(ac[0]))
        return Lin(tuple(items), const)

    def as_dict(self) -> dict[Atom, int]:
        return dict(self.coeffs)

    def plus(self, other: Lin, sign: int = 1) -> Lin:
        d = self.as_dict()
        for a, c in other.coeffs:
            d[a] = d.get(a, 0) + sign * c
        return Lin.of(d, self.const + sign * other.const)

    def scaled(self, k: int) -> Lin:
        return Lin.of({a: c * k for a, c in self.coeffs}, self.const * k)

    def axes(self) -> set[int]:
        return {int(a[1]) for a, _ in self.coeffs if a[0] in ("x", "xd")}  # type: ignore[call-overload]


@dataclass(frozen=True)
class Num:
    value: float | int | bool
    dtype: ir.DataType


@dataclass(frozen=True)
class Cmp:
    """lin <= 0 (op "le") or lin == 0 (op "eq")."""

    op: str
    lin: Lin


@dataclass(frozen=True)
class Look:
    """source[index...]: an element of a tensor the interpretation does not enter."""

    source: ir.Value
    index: tuple[Lin, ...]
    source_dims: tuple[shapes.Dim, ...] | None = None  # as the reading proved them
    # Per source axis, where the reading reads only a prefix of it: the prefix's length n and the
    # graph's scalar value of it (a GatherND index over Range(0, n) reads source[:n]; ONNX Runtime's
    # GatherND fails on an index past the end, so wherever the graph runs, n <= the source's size).
    prefix: tuple[tuple[shapes.Dim, ir.Value] | None, ...] | None = None


@dataclass(frozen=True)
class Op:
    """An elementwise op of terms: And, Or, Not, Where, Cast (attr: to), Add, Sub, Mul, Equal..."""

    op: str
    args: tuple[Term, ...]
    attr: int = 0


@dataclass(frozen=True)
class Cat:
    """Concat along ``axis`` of parts of size 1 there: part k at index k."""

    axis: int
    parts: tuple[Term, ...]


Term = Lin | Num | Cmp | Look | Op | Cat


@dataclass(frozen=True)
class Abstract:
    dims: tuple[shapes.Dim, ...]
    term: Term
    dtype: ir.DataType | None


# ---------------------------------------------------------------- term rewriting


def _map_lin(term: Term, f: Callable[[Lin], Lin | Num]) -> Term:
    """term with every linear form replaced by f(lin) (which may fold it to a number)."""
    if isinstance(term, Lin):
        return f(term)
    if isinstance(term, Cmp):
        lin = f(term.lin)
        if isinstance(lin, Num):
            v = int(lin.value)
            return Num(v <= 0 if term.op == "le" else v == 0, ir.DataType.BOOL)
        return Cmp(term.op, lin)
    if isinstance(term, Look):
        index = []
        for lin in term.index:
            m = f(lin)
            index.append(m if isinstance(m, Lin) else Lin((), int(m.value)))
        return Look(term.source, tuple(index), term.source_dims, term.prefix)
    if isinstance(term, Op):
        return _fold(Op(term.op, tuple(_map_lin(a, f) for a in term.args), term.attr))
    if isinstance(term, Cat):
        return Cat(term.axis, tuple(_map_lin(p, f) for p in term.parts))
    return term


def _substitute(term: Term, axis: int, value: int) -> Term:
    """term with index variable x_axis fixed to value."""
    if isinstance(term, Cat) and term.axis == axis:
        if not 0 <= value < len(term.parts):
            raise NotProved("an index outside a Concat")
        return _substitute(term.parts[value], axis, value - value)  # parts have size 1 there

    def fix(lin: Lin) -> Lin | Num:
        d: dict[Atom, int] = {}
        const = lin.const
        for a, c in lin.coeffs:
            if a[0] == "x" and a[1] == axis:
                const += c * value
            elif a[0] == "xd" and a[1] == axis:
                if value:
                    d[("d", a[2])] = d.get(("d", a[2]), 0) + c * value
            else:
                d[a] = d.get(a, 0) + c
        return Lin.of(d, const)

    out = _map_lin(term, fix)
    if isinstance(out, Cat):
        return Cat(out.axis, tuple(_substitute(p, axis, value) for p in out.parts))
    return out


def _remap(term: Term, mapping: dict[int, int]) -> Term:
    """term with index variable x_a renamed x_mapping[a] (axes moved by a reshape)."""

    def move(lin: Lin) -> Lin:
        d: dict[Atom, int] = {}
        for a, c in lin.coeffs:
            if a[0] in ("x", "xd"):
                if int(a[1]) not in mapping:  # type: ignore[call-overload]
                    raise NotProved("an index variable on an axis that a reshape removes")
                a = (a[0], mapping[int(a[1])]) + tuple(a[2:])  # type: ignore[call-overload]
            d[a] = d.get(a, 0) + c
        return Lin.of(d, lin.const)

    if isinstance(term, Cat):
        if term.axis not in mapping:
            raise NotProved("a Concat axis that a reshape removes")
        return Cat(mapping[term.axis], tuple(_remap(p, mapping) for p in term.parts))
    return _map_lin(term, move)


def _fold(term: Term) -> Term:
    """Constant folding of the bool and select ops (enough to see a term is one constant)."""
    if not isinstance(term, Op):
        return term
    args = term.args
    consts = [a.value if isinstance(a, Num) else None for a in args]
    if term.op == "Not" and consts[0] is not None:
        return Num(not consts[0], ir.DataType.BOOL)
    if term.op in ("And", "Or"):
        absorbing = term.op == "Or"
        for c in consts:
            if c is not None and bool(c) == absorbing:
                return Num(absorbing, ir.DataType.BOOL)
        rest = [a for a, c in zip(args, consts) if c is None]
        if not rest:
            return Num(not absorbing, ir.DataType.BOOL)
        if len(rest) == 1:
            return rest[0]
        if rest[0] == rest[1]:
            return rest[0]
    if term.op == "Where" and consts[0] is not None:
        return args[1] if consts[0] else args[2]
    if term.op == "Where" and args[1] == args[2]:
        return args[1]
    if term.op == "Cast" and isinstance(args[0], Num):
        return Num(_cast_scalar(args[0].value, ir.DataType(term.attr)), ir.DataType(term.attr))
    return term


def _cast_scalar(value: float | int | bool, to: ir.DataType) -> float | int | bool:
    if to == ir.DataType.BOOL:
        return bool(value)
    if to in u.FLOAT_TYPES:
        return float(np.asarray(value).astype(to.numpy()))
    return int(value)


def _atoms(term: Term) -> list[Term]:
    """The comparisons and look-ups a term is built from."""
    if isinstance(term, (Cmp, Look)):
        return [term]
    if isinstance(term, Op):
        return [a for arg in term.args for a in _atoms(arg)]
    if isinstance(term, Cat):
        return [a for p in term.parts for a in _atoms(p)]
    return []


def _axes_of(term: Term) -> set[int]:
    if isinstance(term, Lin):
        return term.axes()
    if isinstance(term, Cmp):
        return term.lin.axes()
    if isinstance(term, Look):
        return set().union(*(lin.axes() for lin in term.index)) if term.index else set()
    if isinstance(term, Op):
        return set().union(*(_axes_of(a) for a in term.args)) if term.args else set()
    if isinstance(term, Cat):
        return {term.axis}.union(*(_axes_of(p) for p in term.parts))
    return set()


def _replace_atom(term: Term, atom: Term, value: Term) -> Term:
    if term == atom:
        return value
    if isinstance(term, Op):
        return _fold(Op(term.op, tuple(_replace_atom(a, atom, value) for a in term.args), term.attr))
    return term


# ---------------------------------------------------------------- the interpretation


def proved_dims(value: ir.Value) -> list[shapes.Dim] | None:
    """value's dims as this module's reader proves them (through MatMuls, norms, rotary tables
    and computed reshapes, further than shape inference and graph.shapes go)."""
    return _Reader().dims_of(value)


def dims_equal(a: shapes.Dim, b: shapes.Dim) -> bool:
    """Two dims proved equal (sums of symbols compared as linear forms)."""
    return _dims_equal(a, b)


def _const_ints(value: ir.Value | None) -> list[int] | None:
    arr = u.const_array(value)
    return None if arr is None or arr.ndim > 1 else [int(x) for x in arr.reshape(-1)]


def _dims_equal(a: shapes.Dim, b: shapes.Dim) -> bool:
    if shapes.same_dim(a, b):
        return True
    la, lb = _dim_lin(a), _dim_lin(b)
    return la is not None and la == lb


# Sums of symbolic dims (a KV cache's past + new) are written as ONNX Runtime's symbolic shape
# inference names them: "past + seq", symbols sorted, a constant last. A symbol is taken apart
# only where every term is a plain name or an integer.
_SUM = " + "


def _dim_lin(d: shapes.Dim) -> Lin | None:
    """d as a linear form over dim atoms; None for an unknown dim."""
    if d is None:
        return None
    if isinstance(d, int):
        return Lin((), d)
    if isinstance(d, str) and _SUM in d:
        terms = d.split(_SUM)
        if all(t.strip() and (t.isdigit() or t.isidentifier()) for t in terms):
            coeffs: dict[Atom, int] = {}
            const = 0
            for t in terms:
                if t.isdigit():
                    const += int(t)
                else:
                    coeffs[("d", t)] = coeffs.get(("d", t), 0) + 1
            return Lin.of(coeffs, const)
    return Lin.of({("d", d): 1})


def _lin_dim(lin: Lin) -> shapes.Dim:
    """The dim term of a linear form over dim atoms (a sum of names written as _SUM does)."""
    if not lin.coeffs:
        return lin.const if lin.const >= 0 else None
    if lin.const == 0 and len(lin.coeffs) == 1:
        (atom, coef) = lin.coeffs[0]
        if atom[0] == "d" and coef == 1:
            return atom[1]  # type: ignore[return-value]
    names: list[str] = []
    for atom, coef in lin.coeffs:
        if atom[0] != "d" or not isinstance(atom[1], str) or not atom[1].isidentifier() or coef < 1:
            return None
        names += [atom[1]] * coef
    if lin.const < 0:
        return None
    return _SUM.join(sorted(names) + ([str(lin.const)] if lin.const else []))


def _dim_sum(parts: list[shapes.Dim], signs: list[int] | None = None) -> shapes.Dim:
    """sum(sign * part) as a dim term; None where a part is unknown or the sum cannot be written."""
    total = Lin()
    for k, d in enumerate(parts):
        lin = _dim_lin(d)
        if lin is None:
            return None
        total = total.plus(lin, 1 if signs is None else signs[k])
    return _lin_dim(total)


def _normalise(dims: tuple[shapes.Dim, ...], term: Term, dtype: ir.DataType | None) -> Abstract:
    """x_a is 0 on an axis of size 1."""
    for axis, d in enumerate(dims):
        if d == 1:
            term = _substitute(term, axis, 0)
    return Abstract(dims, term, dtype)


class _Reader:
    """Reads values into Abstracts, and the shape tensors around them into dims.

    Shapes are read with this reading's own dims (``dims_of``): ONNX shape inference names the
    outputs of a Reshape to ``[-1, S]`` or of an embedding Gather with fresh symbols, which would
    hide that the mask's rows are the scores' rows. Where this reading has no rule, the one
    evaluator (graph/shapes) answers."""

    def __init__(self) -> None:
        self.memo: dict[int, Abstract] = {}
        self.dims_memo: dict[int, list[shapes.Dim] | None] = {}
        # a scalar value of the graph that computes each dim read as a Range's length
        self.dim_values: dict[shapes.Dim, ir.Value] = {}

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
            q, v = self.dims_of(_inp(fused, 0), depth - 1), self.dims_of(_inp(fused, 2), depth - 1)
            if q is not None and v is not None and len(q) == len(v) == 4:
                return q[:3] + v[3:]
        node = u.producer(value)
        if node is None or depth <= 0 or u.const_array(value) is not None:
            return shapes.dims_of(value)
        op = node.op_type
        if op in ("Cast", "Identity", "Not", "Neg"):
            return self.dims_of(_inp(node, 0), depth - 1)
        if op == "Reshape":
            target = self.vector(_inp(node, 1), depth - 1)
            source = self.dims_of(_inp(node, 0), depth - 1)
            if target is not None and source is not None:
                found = shapes.apply_reshape(target, source, bool(u.attr_int(node, "allowzero", 0)))
                if all(d is not None for d in found):
                    return found
        if op == "Gather" and u.const_array(_inp(node, 0)) is not None:  # an embedding lookup
            axis = u.attr_int(node, "axis", 0)
            data, idx = shapes.dims_of(_inp(node, 0)), self.dims_of(_inp(node, 1), depth - 1)
            if data is not None and idx is not None:
                return data[:axis] + idx + data[axis + 1 :]
        if op == "Gather" and (picked := u.const_array(_inp(node, 1))) is not None and (r := u.rank(_inp(node, 0))):
            # one slot of a fused projection picked by a constant index (Bloom's q/k/v)
            source, axis = self.dims_of(_inp(node, 0), depth - 1), u.attr_int(node, "axis", 0) % r
            if source is not None and len(source) == r:
                return source[:axis] + list(np.shape(picked)) + source[axis + 1 :]
        if op in _SAME_DIMS:
            return self.dims_of(_inp(node, 0), depth - 1)
        if op in _REDUCE and (r := u.rank(_inp(node, 0))) is not None:  # RMSNorm's mean of squares
            reduced_in = self.dims_of(_inp(node, 0), depth - 1)
            reduced = u.attr_ints(node, "axes")
            if reduced is None and len(node.inputs) > 1 and node.inputs[1] is not None:
                reduced = _const_ints(node.inputs[1])
            if reduced_in is not None and reduced is not None and len(reduced_in) == r:
                gone = {a % r for a in reduced}
                if u.attr_int(node, "keepdims", 1):
                    return [1 if a in gone else reduced_in[a] for a in range(r)]
                return [reduced_in[a] for a in range(r) if a not in gone]
        if op == "Tile":  # rotary tables repeated along the head dim (GPT-J's interleaved sin/cos)
            tiled_in, repeats = self.dims_of(_inp(node, 0), depth - 1), self.vector(_inp(node, 1), depth - 1)
            if tiled_in is not None and repeats is not None and len(tiled_in) == len(repeats):
                # a size-1 axis tiled n times is n long (position ids tiled over the batch)
                tiled = [
                    d if n == 1 else n if d == 1 else shapes.times(d, n) if isinstance(n, int) else None
                    for d, n in zip(tiled_in, repeats)
                ]
                if all(d is not None for d in tiled):
                    return tiled
        if op == "Transpose":
            x = self.dims_of(_inp(node, 0), depth - 1)
            perm = u.attr_ints(node, "perm")
            if x is not None:
                return [x[p] for p in perm] if perm is not None else x[::-1]
        if op == "Split" and (r := u.rank(_inp(node, 0))) is not None:
            x, out = self.dims_of(_inp(node, 0), depth - 1), u.value_shape(value)
            axis = u.attr_int(node, "axis", 0) % r
            if x is not None and out is not None and isinstance(out[axis], int):
                return x[:axis] + [out[axis]] + x[axis + 1 :]
        if op in ("Concat", "Slice") and (r := u.rank(value)) is not None:
            # the dims along which nothing is cut or joined are the (first) input's
            x, out = self.dims_of(_inp(node, 0), depth - 1), u.value_shape(value)
            if op == "Concat":
                cut = {u.attr_int(node, "axis", 0) % r}
            else:
                axes = u.const_array(_inp(node, 3)) if len(node.inputs) > 3 and node.inputs[3] is not None else None
                cut = set(range(r)) if axes is None else {int(a) % r for a in axes.reshape(-1)}
            if op == "Concat" and x is not None and len(x) == r:
                # the joined axis: the sum of the pieces' (a KV cache's past + new)
                pieces = [self.dims_of(p, depth - 1) for p in node.inputs]
                if all(p is not None and len(p) == r for p in pieces):
                    joined = _dim_sum([p[min(cut)] for p in pieces])  # type: ignore[index]
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
                dims = _broadcast_dims(parts)  # type: ignore[arg-type]
                if dims is not None:
                    return _filled(dims + (tails[0] if tails else []), value)
        if op in _OPS and op not in ("Gather", "GatherND", "Reshape"):
            try:
                return list(self.read(value).dims)
            except NotProved:
                pass
        return shapes.dims_of(value)

    def _prefix_length(self, node: ir.Node, size: shapes.Dim, depth: int) -> shapes.Dim:
        """The length of Slice(x, 0, e) along its one axis of static size N > 1: min(e, N),
        written "min(e, N)" for a symbolic e (a position table cut to the sequence length);
        _broadcast_dims reads it as e where it meets e, as the graph runs only where they agree."""
        steps = node.inputs[4] if len(node.inputs) > 4 else None
        if _const_ints(_inp(node, 1)) != [0] or (steps is not None and _const_ints(steps) != [1]):
            return None
        end = self.scalar(_inp(node, 2), depth - 1)
        if not isinstance(size, int) or size <= 1 or end is None:
            return None
        if isinstance(end, int):
            return len(range(size)[:end])  # ONNX clamps and counts negative ends as Python does
        return f"{_CAPPED}{end}, {size})" if isinstance(end, str) else None

    def vector(self, value: ir.Value | None, depth: int = 32) -> list[shapes.Dim] | None:
        """A 1-D shape tensor, element by element."""
        if value is None:
            return None
        node = u.producer(value)
        if node is None or depth <= 0 or u.const_array(value) is not None:
            return shapes.shape_vector(value)
        op = node.op_type
        if op == "Shape":
            dims = self.dims_of(_inp(node, 0), depth - 1)
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
            return self.vector(_inp(node, 0), depth - 1)
        if op == "Slice" and len(node.inputs) >= 3:  # part of a shape: Shape(x)[:-2] + [-1]
            data = self.vector(_inp(node, 0), depth - 1)
            starts, ends = _const_ints(_inp(node, 1)), _const_ints(_inp(node, 2))
            axes = _const_ints(_inp(node, 3)) if len(node.inputs) > 3 and node.inputs[3] is not None else [0]
            steps = _const_ints(_inp(node, 4)) if len(node.inputs) > 4 and node.inputs[4] is not None else [1]
            if data is not None and starts and ends and axes in ([0], [-1]) and steps == [1]:
                return data[starts[0] : ends[0]]  # ONNX clamps as Python does for step 1
        if op == "Unsqueeze" and u.unsqueeze_axes(node) == [0] and u.rank(_inp(node, 0)) in (0, None):
            return [self.scalar(_inp(node, 0), depth - 1)]
        if op == "Gather" and u.attr_int(node, "axis", 0) == 0:
            idx, data = u.const_array(_inp(node, 1)), self.vector(_inp(node, 0), depth - 1)
            if idx is not None and data is not None and idx.ndim == 1:
                try:
                    return [data[int(i)] for i in idx]
                except IndexError:
                    return None
        if op == "Reshape" and u.rank(value) == 1:
            if u.rank(_inp(node, 0)) == 0:  # a scalar made a one-element vector (past + new)
                one = self.scalar(_inp(node, 0), depth - 1)
                return None if one is None else [one]
            return self.vector(_inp(node, 0), depth - 1)
        if op == "ConstantOfShape":
            n = self.vector(_inp(node, 0), depth - 1)
            attr = node.attributes.get("value")
            fill = 0 if attr is None else int(attr.as_tensor().numpy().reshape(-1)[0])
            if n is not None and len(n) == 1 and isinstance(n[0], int):
                return [fill for _ in range(n[0])]
        if op in ("Mul", "Add", "Where"):
            # entry by entry: Mul/Add of static entries; where(s == t, c, d) where each test is decided
            eq = u.producer(_inp(node, 0), "Equal") if op == "Where" else None
            if op == "Where" and eq is None:
                return shapes.shape_vector(value)
            sources = [_inp(eq, 0), _inp(eq, 1), _inp(node, 1), _inp(node, 2)] if eq is not None else list(node.inputs)
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
                    sums = [_dim_sum([x, y]) for x, y in rows]
                    return None if any(d is None for d in sums) else sums
                if not all(isinstance(x, int) for row in rows for x in row):
                    return None
                return [int(x) * int(y) for x, y in rows]
            out: list[shapes.Dim] = []
            for x, y, yes, no in rows:
                same = _decided_equal(x, y)
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
            vec = self.vector(_inp(node, 0), depth - 1) if u.rank(_inp(node, 0)) == 1 else None
            if vec is not None and len(vec) == 1:
                return vec[0]
            return self.scalar(_inp(node, 0), depth - 1)
        if op in ("Add", "Sub") and all(u.rank(x) in (0, 1) for x in node.inputs):
            # past + new: a KV cache's total length
            parts = [self.scalar(x, depth - 1) for x in node.inputs]
            return _dim_sum(parts, [1, 1 if op == "Add" else -1])
        if op == "Gather" and u.attr_int(node, "axis", 0) == 0:
            idx, data = u.const_array(_inp(node, 1)), self.vector(_inp(node, 0), depth - 1)
            if idx is not None and data is not None and idx.ndim == 0:
                try:
                    return data[int(idx)]
                except IndexError:
                    return None
        if op in ("Mul", "Div") and len(node.inputs) == 2:
            # B·H / H: the batch back from a per-batch·head dim (Bloom's views)
            a, b = self.scalar(_inp(node, 0), depth - 1), shapes.scalar_dim(_inp(node, 1))
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
            raise NotProved(f"the dims of {value.name} are unknown")
        if arr is not None and arr.size <= _MAX_CONSTANT and arr.ndim >= 2 and arr.dtype == np.bool_:
            frontier = _constant_frontier(arr)
            if frontier is not None:  # a causal buffer: arr[..., i, j] == (j <= i + c)
                r = arr.ndim
                lin = Lin.of({("x", r - 1): 1, ("x", r - 2): -1}, -frontier)
                return _normalise(tuple(dims), Cmp("le", lin), ir.DataType.BOOL)
        index = tuple(Lin.of({("x", a): 1}) for a in range(len(dims)))
        return _normalise(tuple(dims), Look(value, index, tuple(dims)), dtype)

    def _read(self, value: ir.Value, depth: int) -> Abstract:
        node = u.producer(value)
        if node is None or u.const_array(value) is not None:
            return self._leaf(value)
        if u.rank(value) == 0 and u.dtype(value) in (ir.DataType.INT64, ir.DataType.INT32):
            dim = self.scalar(value)  # a size read from a shape (the row length of a flattened mask)
            if (lin := _dim_lin(dim)) is not None:
                return Abstract((), lin, u.dtype(value))
        if u.rank(value) == 1 and u.dtype(value) in (ir.DataType.INT64, ir.DataType.INT32):
            vec = self.vector(value)  # the same, as a one-element vector
            if vec is not None and len(vec) == 1 and (lin := _dim_lin(vec[0])) is not None:
                return Abstract((1,), lin, u.dtype(value))
        if node.op_type not in _OPS:
            return self._leaf(value)
        return _OPS[node.op_type](self, node, depth - 1)


# Ops whose output has their first input's dims.
_SAME_DIMS = frozenset(
    "Cast Identity Not Neg Relu Gelu FastGelu Erf Tanh Sigmoid Sqrt Reciprocal Exp Log Softmax Cos Sin "
    "LayerNormalization SimplifiedLayerNormalization SkipLayerNormalization Dropout".split()
)
_REDUCE = frozenset("ReduceMean ReduceSum ReduceMax ReduceMin ReduceSumSquare ReduceL2".split())
# Elementwise ops with numpy broadcasting, for dims.
_BROADCAST = frozenset("Add Sub Mul Div Pow Where And Or Equal Less Greater Max Min".split())


_CAPPED = "min("  # "min(e, N)": Slice(x, 0, e) of an axis of static size N > 1


def _capped_meets(capped: shapes.Dim, other: shapes.Dim) -> bool:
    """Whether capped is "min(e, N)" and other is e: broadcast together they run only where
    min(e, N) is e or 1, and it is 1 (N > 1) only where e is 1; so the result is e."""
    return (
        isinstance(capped, str)
        and isinstance(other, str)
        and capped == f"{_CAPPED}{other}, " + capped.rsplit(", ", 1)[-1]
    )


def _broadcast_dims(parts: list[list[shapes.Dim]]) -> list[shapes.Dim] | None:
    """The dims of a broadcast result, None on an axis where two symbols are not proved equal
    (the other axes stay proved); None for all when two static sizes clash. A static size above
    1 is the result against a symbol: the symbol is either 1 or that size."""
    rank = max(len(p) for p in parts)
    out: list[shapes.Dim] = [1] * rank
    for p in parts:
        for a, d in enumerate(p, rank - len(p)):
            o = out[a]
            if d == 1 or shapes.same_dim(o, d) or _capped_meets(d, o):
                continue
            if _capped_meets(o, d):
                out[a] = d
            elif isinstance(d, int) and not isinstance(o, int):
                out[a] = d
            elif isinstance(o, int) and o != 1 and not isinstance(d, int):
                continue
            elif isinstance(o, int) and isinstance(d, int) and o != 1:
                return None
            elif o == 1:
                out[a] = d
            else:
                out[a] = None
    return out


def _filled(dims: list[shapes.Dim], value: ir.Value) -> list[shapes.Dim]:
    """dims, with shape inference's dim of value on the axes this reading left unknown."""
    inferred = shapes.dims_of(value) if None in dims else None
    if inferred is None or len(inferred) != len(dims):
        return dims
    return [i if d is None else d for d, i in zip(dims, inferred)]


def _inp(node: ir.Node, index: int) -> ir.Value:
    """Input index of node; a missing one is a step this reading cannot take."""
    value = node.inputs[index] if index < len(node.inputs) else None
    if value is None:
        raise NotProved(f"{node.op_type} {node.name} lacks its input {index}")
    return value


def _decided_equal(x: shapes.Dim, y: shapes.Dim) -> bool | None:
    """Whether two shape entries are equal, where that is decided (a dim is never negative)."""
    if isinstance(x, int) and isinstance(y, int):
        return x == y
    if x is None or y is None:
        return None
    if shapes.same_dim(x, y):
        return True
    if (isinstance(x, int) and x < 0) or (isinstance(y, int) and y < 0):
        return False
    return None


def _constant_frontier(arr: np.ndarray) -> int | None:
    """c when every matrix of the bool constant arr is exactly (j <= i + c), else None."""
    sq, sk = arr.shape[-2:]
    first = arr.reshape(-1, sq, sk)
    if not (first == first[0]).all():
        return None
    row = first[0]
    c = int(row[0].sum()) - 1  # row 0 sees keys 0..c
    if c < -sq or c >= sk:
        return None
    want = np.tril(np.ones((sq, sk), bool), k=c)
    return c if np.array_equal(row, want) else None


def _broadcast(xs: list[Abstract]) -> tuple[tuple[shapes.Dim, ...], list[Term]]:
    rank = max(len(x.dims) for x in xs)
    dims: list[shapes.Dim] = [1] * rank
    terms = []
    for x in xs:
        shift = rank - len(x.dims)
        terms.append(_remap(x.term, {a: a + shift for a in range(len(x.dims))}) if shift else x.term)
        for a, d in enumerate(x.dims):
            o = a + shift
            if d == 1:
                continue
            if dims[o] == 1:
                dims[o] = d
            elif not _dims_equal(dims[o], d):
                raise NotProved(f"cannot prove two broadcast dims equal ({dims[o]} and {d})")
    return tuple(dims), terms


def _elementwise(op: str) -> Callable[[_Reader, ir.Node, int], Abstract]:
    def read(r: _Reader, node: ir.Node, depth: int) -> Abstract:
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
                    return _normalise(dims, Num(const <= 0 if term.op == "le" else const == 0, dtype), dtype)
                return _normalise(dims, term, dtype)
            return _normalise(dims, _fold(Op(op, (a, b))), dtype)
        if op in ("Add", "Sub", "Mul") and all(isinstance(t, Lin) for t in terms):
            a, b = terms
            assert isinstance(a, Lin) and isinstance(b, Lin)
            if op != "Mul":
                return _normalise(dims, a.plus(b, 1 if op == "Add" else -1), dtype)
            return _normalise(dims, _times(a, b), dtype)
        if op == "Where":
            dtype = xs[1].dtype or xs[2].dtype
        return _normalise(dims, _fold(Op(op, tuple(terms))), dtype)

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
            size = _lin_dim(d)
            if size is not None:
                (xa, xc) = x.coeffs[0]
                return Lin.of({("xd", xa[1], size): xc})
    raise NotProved("a product of two index-dependent integers")


def _read_cast(r: _Reader, node: ir.Node, depth: int) -> Abstract:
    x = r.read(_inp(node, 0), depth)
    to = ir.DataType(u.attr_int(node, "to", 0))
    if x.dtype == to or (isinstance(x.term, Lin) and to in (ir.DataType.INT64, ir.DataType.INT32)):
        return Abstract(x.dims, x.term, to)
    return Abstract(x.dims, _fold(Op("Cast", (x.term,), int(to))), to)


def _read_not(r: _Reader, node: ir.Node, depth: int) -> Abstract:
    x = r.read(_inp(node, 0), depth)
    return Abstract(x.dims, _fold(Op("Not", (x.term,))), ir.DataType.BOOL)


def _read_identity(r: _Reader, node: ir.Node, depth: int) -> Abstract:
    return r.read(_inp(node, 0), depth)


def _read_range(r: _Reader, node: ir.Node, depth: int) -> Abstract:
    delta = u.const_array(node.inputs[2])
    if delta is None or delta.size != 1 or int(delta.reshape(())) != 1:
        raise NotProved("a Range whose step is not the constant 1")
    dtype = u.dtype(node.outputs[0]) or ir.DataType.INT64
    start = u.const_array(node.inputs[0])
    if start is not None and start.size == 1 and int(start.reshape(())) == 0:
        n = r.scalar(_inp(node, 1))
        if n is None:
            raise NotProved("a Range whose length is not a dim of the graph")
        r.dim_values.setdefault(n, _inp(node, 1))
        return _normalise((n,), Lin.of({("x", 0): 1}), dtype)
    # Range(start, limit): the positions of new tokens after a cache (cache_position = Range(past,
    # past + new)); element x is start + x, and there are limit - start of them
    first, limit = _dim_lin(r.scalar(_inp(node, 0))), r.scalar(_inp(node, 1))
    n = _dim_sum([limit, r.scalar(_inp(node, 0))], [1, -1]) if first is not None else None
    if first is None or n is None:
        raise NotProved("a Range whose start and length (limit - start) are not dims of the graph")
    return _normalise((n,), Lin.of({("x", 0): 1}).plus(first), dtype)


def _read_unsqueeze(r: _Reader, node: ir.Node, depth: int) -> Abstract:
    x = r.read(_inp(node, 0), depth)
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
    return Abstract(tuple(dims), _remap(x.term, mapping), x.dtype)


def _read_squeeze(r: _Reader, node: ir.Node, depth: int) -> Abstract:
    x = r.read(_inp(node, 0), depth)
    axes = u.unsqueeze_axes(node)
    if axes is None:
        axes = [a for a, d in enumerate(x.dims) if d == 1]
    axes = [a % max(1, len(x.dims)) for a in axes]
    if any(x.dims[a] != 1 for a in axes):
        raise NotProved("a Squeeze of an axis not proved to be 1")
    kept = [a for a in range(len(x.dims)) if a not in axes]
    return Abstract(tuple(x.dims[a] for a in kept), _remap(x.term, {a: o for o, a in enumerate(kept)}), x.dtype)


def _moved_axes(src: tuple[shapes.Dim, ...], dst: list[shapes.Dim]) -> dict[int, int]:
    """The axis map of a reshape that only adds or drops axes of size 1."""
    a = [i for i, d in enumerate(src) if d != 1]
    b = [i for i, d in enumerate(dst) if d != 1]
    if len(a) != len(b) or not all(_dims_equal(src[i], dst[j]) for i, j in zip(a, b)):
        raise NotProved(f"a reshape from {list(src)} to {dst} that moves elements between axes")
    return dict(zip(a, b))


def _read_reshape(r: _Reader, node: ir.Node, depth: int) -> Abstract:
    # Reshape keeps the row-major order of the elements, so a chain of them (TorchScript's
    # flatten to [-1] and back) is one Reshape of the chain's first input.
    source = _inp(node, 0)
    while (inner := u.producer(source, "Reshape")) is not None:
        source = _inp(inner, 0)
    x = r.read(source, depth)
    target = r.vector(_inp(node, 1))
    if target is None:
        raise NotProved("a Reshape to a shape this reading cannot follow")
    dims = shapes.apply_reshape(target, list(x.dims), bool(u.attr_int(node, "allowzero", 0)))
    if any(d is None for d in dims) and len(dims) == 1:
        dims = [_flat_size(x.dims)]
    if any(d is None for d in dims):
        raise NotProved("a Reshape whose output dims are not proved")
    return _normalise(tuple(dims), _remap(x.term, _moved_axes(x.dims, dims)), x.dtype)


def _flat_size(dims: tuple[shapes.Dim, ...]) -> shapes.Dim:
    big = [d for d in dims if d != 1]
    return 1 if not big else big[0] if len(big) == 1 else None


def _read_expand(r: _Reader, node: ir.Node, depth: int) -> Abstract:
    x = r.read(_inp(node, 0), depth)
    target = r.vector(_inp(node, 1))
    if target is None or any(d is None for d in target):
        raise NotProved("an Expand to a shape this reading cannot follow")
    shape = Abstract(tuple(target), Num(0, ir.DataType.INT64), None)
    dims, (term, _) = _broadcast([x, shape])
    return _normalise(dims, term, x.dtype)


def _read_constant_of_shape(r: _Reader, node: ir.Node, depth: int) -> Abstract:
    target = r.vector(_inp(node, 0))
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


def _read_gather(r: _Reader, node: ir.Node, depth: int) -> Abstract:
    """Gather(Flatten(X, 2 | -1 ...), b * S + j) on axis 0: X[b, j] (TorchScript's padding lookup)."""
    if u.attr_int(node, "axis", 0) != 0:
        raise NotProved("a Gather on an axis other than 0")
    flat = u.producer(_inp(node, 0), "Flatten")
    if flat is None:
        raise NotProved("a Gather from a tensor that is not a flattened mask")
    source = _inp(flat, 0)
    src_dims = r.dims_of(source)
    if src_dims is None or len(src_dims) != 2 or u.attr_int(flat, "axis", 1) != 2:
        raise NotProved("a Gather from a Flatten of other than a [B, S] mask")
    idx = r.read(_inp(node, 1), depth)
    if not isinstance(idx.term, Lin):
        raise NotProved("a Gather index that is not a linear form")
    batch, keys = src_dims
    b_axes = [a for a, c in idx.term.coeffs if a[0] == "xd" and c == 1 and _dims_equal(a[2], keys)]  # type: ignore[arg-type]
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
        if length is not None and _dims_equal(idx.dims[ba], batch):
            prefix = (None, (idx.dims[ja], length))
    if not _in_range(idx.dims, ba, batch) or (not _in_range(idx.dims, ja, keys) and prefix is None):
        raise NotProved("a Gather index whose range is not proved inside the mask")
    look = Look(source, (Lin.of({("x", ba): 1}), Lin.of({("x", ja): 1})), tuple(src_dims), prefix)
    return _normalise(idx.dims + (1,), look, u.dtype(source))


def _in_range(dims: tuple[shapes.Dim, ...], axis: int, size: shapes.Dim) -> bool:
    """x_axis < size for every index of dims (x_axis ranges over [0, dims[axis]))."""
    return dims[axis] == 1 or _dims_equal(dims[axis], size)


def _read_gather_nd(r: _Reader, node: ir.Node, depth: int) -> Abstract:
    if u.attr_int(node, "batch_dims", 0) != 0:
        raise NotProved("a GatherND with batch_dims")
    data = _inp(node, 0)
    src_dims = r.dims_of(data)
    idx = r.read(_inp(node, 1), depth)
    last = len(idx.dims) - 1
    if src_dims is None or idx.dims[-1] != len(src_dims):
        raise NotProved("a GatherND that does not index every axis of its data")
    index = []
    prefix: list[tuple[shapes.Dim, ir.Value] | None] = []
    for k, size in enumerate(src_dims):
        lin = _substitute(idx.term, last, k)
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
    look = Look(data, tuple(index), tuple(src_dims), tuple(prefix) if any(prefix) else None)
    return _normalise(idx.dims[:-1], look, u.dtype(data))


def _read_concat(r: _Reader, node: ir.Node, depth: int) -> Abstract:
    xs = [r.read(x, depth) for x in node.inputs]
    rank = len(xs[0].dims)
    axis = u.attr_int(node, "axis", 0) % rank
    if any(len(x.dims) != rank or x.dims[axis] != 1 for x in xs):
        raise NotProved("a Concat of other than size-1 pieces")
    dims, terms = _broadcast(xs)
    dims = dims[:axis] + (len(xs),) + dims[axis + 1 :]
    return Abstract(dims, Cat(axis, tuple(terms)), xs[0].dtype)


def _read_slice(r: _Reader, node: ir.Node, depth: int) -> Abstract:
    """A static slice (a causal buffer cut to the sequence length): x_a -> x_a + start."""
    x = r.read(_inp(node, 0), depth)
    starts, ends = (u.const_array(node.inputs[i]) for i in (1, 2))
    axes = u.const_array(_inp(node, 3)) if len(node.inputs) > 3 and node.inputs[3] is not None else None
    steps = u.const_array(_inp(node, 4)) if len(node.inputs) > 4 and node.inputs[4] is not None else None
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
        computed = r.vector(_inp(node, 2)) if end is None else None
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
            term = _map_lin(term, functools.partial(_shift, axis=a, by=s))
    return _normalise(tuple(dims), term, x.dtype)


def _shift(lin: Lin, axis: int, by: int) -> Lin:
    c = lin.as_dict().get(("x", axis), 0)
    if any(a[0] == "xd" and a[1] == axis for a, _ in lin.coeffs):
        raise NotProved("a Slice of a flattened index")
    return Lin.of(lin.as_dict(), lin.const + c * by)


_OPS: dict[str, Callable[[_Reader, ir.Node, int], Abstract]] = {
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
}


# ---------------------------------------------------------------- the proof


@dataclass(frozen=True)
class CausalSplit:
    """T(b, h, i, j) == where(j <= i + offset, padding(b, h, j), fill), read from the graph."""

    offset: Lin  # over symbolic dims (a cache's past length) and a constant
    fill: Term  # a Num: the value right of the frontier (False for a bool mask)
    padding: Abstract  # dims [.., .., 1, Sk]: no dependence on i
    dims: tuple[shapes.Dim, ...]  # of the original [B, H|1, Sq, Sk] tensor


def split_causal(value: ir.Value, reader: _Reader | None = None) -> CausalSplit:
    """Read value (a [B, 1|H, Sq, Sk] bias or bool mask) as causal x padding, or raise NotProved."""
    x = (reader or _Reader()).read(value)
    x = Abstract(x.dims, _decide_bounds(x.term), x.dtype)
    if len(x.dims) != 4:
        dims = (1,) * (4 - len(x.dims)) + x.dims
        x = Abstract(dims, _remap(x.term, {a: a + 4 - len(x.dims) for a in range(len(x.dims))}), x.dtype)
    i_axis, j_axis = 2, 3
    offsets: set[Lin] = set()
    frontier: list[tuple[Term, bool]] = []  # (atom, True when the atom means j <= i + offset)
    for atom in _atoms(x.term):
        axes = _axes_of(atom)
        if i_axis not in axes:
            continue
        if not isinstance(atom, Cmp) or atom.op != "le":
            raise NotProved(f"the mask depends on the query position other than by j <= i + c ({_name(atom)})")
        d = atom.lin.as_dict()
        if any(a[0] != "d" for a in set(d) - {("x", i_axis), ("x", j_axis)}):
            raise NotProved("a comparison of the query position with more than the key position and a constant")
        ci, cj = d.pop(("x", i_axis), 0), d.pop(("x", j_axis), 0)
        k = Lin.of(d, atom.lin.const)  # the rest: a constant and symbolic dims (a cache's past length)
        if (ci, cj) == (-1, 1):  # j - i + k <= 0  <=>  j <= i - k
            offsets.add(k.scaled(-1))
            frontier.append((atom, True))
        elif (ci, cj) == (1, -1):  # i - j + k <= 0  <=>  j >= i + k  <=>  not (j <= i + k - 1)
            offsets.add(k.plus(Lin((), 1), -1))
            frontier.append((atom, False))
        else:
            raise NotProved("a comparison of the query and key positions that is not j <= i + c")
    if not frontier:
        raise NoFrontier("no comparison of the key and query positions (j <= i + c) in the mask")
    if len(offsets) != 1:
        shown = sorted(_show(o) for o in offsets)
        raise NotProved(f"two causal frontiers in one mask (offsets {shown}: a band or a window)")
    (offset,) = offsets

    def with_frontier(visible: bool) -> Term:
        term = x.term
        for atom, means_visible in frontier:
            term = _replace_atom(term, atom, Num(visible == means_visible, ir.DataType.BOOL))
        return _fold_all(term)

    hidden, seen = with_frontier(False), with_frontier(True)
    if not isinstance(hidden, Num):
        raise NotProved("right of the causal frontier the mask is not one constant")
    if i_axis in _axes_of(seen):
        raise NotProved("the padding part of the mask still depends on the query position")
    dims = x.dims[:i_axis] + (1,) + x.dims[i_axis + 1 :]
    return CausalSplit(offset, hidden, Abstract(dims, seen, x.dtype), x.dims)


def _decide_bounds(term: Term) -> Term:
    """term with comparisons of one index variable with a constant decided where the index's
    range [0, n) decides them without n (masking_utils writes q_idx >= 0 into encoder masks)."""
    for atom in _atoms(term):
        if not isinstance(atom, Cmp) or atom.op != "le" or len(atom.lin.coeffs) != 1:
            continue
        (var, coef) = atom.lin.coeffs[0]
        if var[0] != "x":
            continue
        c = atom.lin.const  # coef * x + c <= 0 with x >= 0
        if coef < 0 and c <= 0:
            term = _replace_atom(term, atom, Num(True, ir.DataType.BOOL))
        elif coef > 0 and c > 0:
            term = _replace_atom(term, atom, Num(False, ir.DataType.BOOL))
    return _fold_all(term)


def _fold_all(term: Term) -> Term:
    if isinstance(term, Op):
        return _fold(Op(term.op, tuple(_fold_all(a) for a in term.args), term.attr))
    return term


def _name(term: Term) -> str:
    return term.source.name or "a tensor" if isinstance(term, Look) else type(term).__name__


def _show(lin: Lin) -> str:
    """A linear form over dims as text: past + 2, -1."""
    terms = [f"{'' if c == 1 else '-' if c == -1 else c}{a[1]}" for a, c in lin.coeffs]
    if lin.const or not terms:
        terms.append(str(lin.const))
    return " + ".join(terms).replace("+ -", "- ")


def _causal_flag(offset: Lin, sq: shapes.Dim, sk: shapes.Dim) -> int:
    """The op's is_causal for the frontier j <= i + offset over scores [.., Sq, Sk]: 2 where the
    offset is proved Sk - Sq, as sums of the dims' terms (Sk = past + new from the K cache's
    Concat, and a mask built from past + Range(new))."""
    if offset == Lin():
        return 1
    lq, lk = _dim_lin(sq), _dim_lin(sk)
    if lq is not None and lk is not None and offset == lk.plus(lq, -1):
        return 2
    raise NotProved(
        f"the causal frontier j <= i + {_show(offset)} is neither top-left (0) nor bottom-right (Sk - Sq = {sk} - {sq})"
    )


def absorbs_scores(fill: float) -> bool:
    """fill + s == fill for the scores (see the module docstring)."""
    return fill == -math.inf or fill <= ABSORBING_FILL


@dataclass(frozen=True)
class CausalProof:
    """What a block becomes: is_causal, the op's mask_fill and the [B, 1, 1, Sk] padding part."""

    is_causal: int
    mask_fill: float
    padding: Abstract


def prove(
    candidate: ir.Value,
    *,
    as_mask: bool,
    marks_masked: bool,
    block_fill: float | None,
    q: ir.Value,
    k: ir.Value,
    k_perm: list[int] | None,
) -> CausalProof:
    """The proof for one block whose only bias (as_mask False) or only mask (True; marks_masked:
    True where the condition marks masked-out keys) is ``candidate``; raises NotProved."""
    reader = _Reader()
    split = split_causal(candidate, reader)
    q_dims, k_dims = reader.dims_of(q), reader.dims_of(k)
    if q_dims is None or k_dims is None or len(q_dims) != 4 or len(k_dims) != 4:
        raise NotProved("the ranks of Q and K are not proved 4")
    sq, sk = q_dims[2], k_dims[2 if k_perm is None else k_perm[2]]
    _, _, mq, mk = split.dims
    if not _dims_equal(mq, sq) or not _dims_equal(mk, sk):
        raise NotProved(f"the mask's rows and keys [{mq}, {mk}] are not proved to be the scores' [{sq}, {sk}]")
    is_causal = _causal_flag(split.offset, sq, sk)
    hidden = split.fill
    assert isinstance(hidden, Num)
    if as_mask:
        if bool(hidden.value) != marks_masked:
            raise NotProved("right of the causal frontier the mask keeps keys")
        assert block_fill is not None
        fill = block_fill
    else:
        fill = float(hidden.value)
        if not absorbs_scores(fill):
            raise NotProved(
                f"right of the causal frontier the bias is {fill:g}: s + {fill:g} is not {fill:g} "
                "(exact only for -inf or fills <= -2**127)"
            )
    _write(None, split.padding.term, split.padding.dtype, split.padding.dims)  # dry run: raises where it cannot
    return CausalProof(is_causal, fill, split.padding)


# ---------------------------------------------------------------- writing the padding part


def write_padding(e: Emitter, padding: Abstract) -> ir.Value | None:
    """The padding part as a tensor of rank 4 (dims [B|1, H|1, 1, Sk|1]); None when it is the
    neutral constant (0.0 for a bias, True for a mask)."""
    term = padding.term
    if isinstance(term, Num) and (
        (padding.dtype == ir.DataType.BOOL and bool(term.value))
        or (padding.dtype != ir.DataType.BOOL and term.value == 0)
    ):
        return None
    return _write(e, term, padding.dtype, padding.dims)


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


def _write(e: Emitter | None, term: Term, dtype: ir.DataType | None, dims: tuple[shapes.Dim, ...]) -> ir.Value | None:
    """Write term as nodes of e (None: check only that it can be written)."""
    if isinstance(term, Num):
        t = term.dtype if term.dtype is not None else dtype
        np_type = t.numpy() if t is not None else np.float32
        return None if e is None else e.const(np.asarray(term.value, np_type).reshape(1, 1, 1, 1))
    if isinstance(term, Look):
        return _write_look(e, term, dims)
    if isinstance(term, Op) and term.op in _WRITABLE:
        if term.op == "Cast":
            inner = _write(e, term.args[0], None, dims)
            return None if e is None or inner is None else e.node("Cast", [inner], to=ir.DataType(term.attr))
        args = [_write(e, a, dtype, dims) for a in term.args]
        return None if e is None else e.node(term.op, args)
    raise NotProved(f"the padding part contains a {type(term).__name__} this rewrite cannot write")


def _write_look(e: Emitter | None, look: Look, dims: tuple[shapes.Dim, ...]) -> ir.Value | None:
    """source[x_a0, x_a1, ...] with each index one distinct index variable, increasing, over
    axes of the source's own sizes: the source itself with size-1 axes inserted (the same
    tensor, so the same values)."""
    axes = []
    for lin in look.index:
        if len(lin.coeffs) != 1 or lin.const != 0 or lin.coeffs[0][1] != 1 or lin.coeffs[0][0][0] != "x":
            raise NotProved(f"the padding part reads {look.source.name} at other than its own indices")
        axes.append(int(lin.coeffs[0][0][1]))  # type: ignore[call-overload]
    if axes != sorted(set(axes)):
        raise NotProved(f"the padding part reads {look.source.name} with its axes reordered")
    prefix = look.prefix or (None,) * len(axes)
    if look.source_dims is None:
        raise NotProved(f"the padding part reads {look.source.name}, whose dims are not proved to be the mask's")
    read = [look.source_dims[k] if cut is None else cut[0] for k, cut in enumerate(prefix)]
    if not all(_dims_equal(read[k], dims[a]) for k, a in enumerate(axes)):
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


__all__ = [
    "CausalProof",
    "CausalSplit",
    "NoFrontier",
    "NotProved",
    "absorbs_scores",
    "prove",
    "split_causal",
    "write_padding",
]
