"""Terms: each element of a tensor as a function of its index variables (the deep mode of the one
evaluator, graph/shapes, reads tensors into them: graph/interpret).

* a tensor read is an ``Abstract``: its dims (``shapes.Dim`` terms) and a *term* giving each
  element as a function of its index variables ``x0 .. x{r-1}``;
* integer terms are linear forms over the index variables and symbolic dims (``Range(0, n)``
  is ``x0`` over dims ``[n]``); comparisons of linear forms are normalised to ``lin <= 0`` or
  ``lin == 0``; tensors the interpretation does not enter (``attention_mask``, a constant) are
  ``Look``-ups at index terms; bool and float ops build a small expression tree.

The rewriting here (fix an index variable, rename axes, fold constants) is what the op readings
(graph/op_readers) and the causality proof (fusion/causal/proof) do to terms.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from . import ir_utils as u
from . import shapes


class NotProved(Exception):
    """A step that does not hold, or that this reading cannot show (the causality proof names it)."""


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


def map_lin(term: Term, f: Callable[[Lin], Lin | Num]) -> Term:
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
        return fold(Op(term.op, tuple(map_lin(a, f) for a in term.args), term.attr))
    if isinstance(term, Cat):
        return Cat(term.axis, tuple(map_lin(p, f) for p in term.parts))
    return term


def substitute(term: Term, axis: int, value: int) -> Term:
    """term with index variable x_axis fixed to value."""
    if isinstance(term, Cat) and term.axis == axis:
        if not 0 <= value < len(term.parts):
            raise NotProved("an index outside a Concat")
        return substitute(term.parts[value], axis, value - value)  # parts have size 1 there

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

    out = map_lin(term, fix)
    if isinstance(out, Cat):
        return Cat(out.axis, tuple(substitute(p, axis, value) for p in out.parts))
    return out


def remap(term: Term, mapping: dict[int, int]) -> Term:
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
        return Cat(mapping[term.axis], tuple(remap(p, mapping) for p in term.parts))
    return map_lin(term, move)


def fold(term: Term) -> Term:
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


def atoms(term: Term) -> list[Term]:
    """The comparisons and look-ups a term is built from."""
    if isinstance(term, (Cmp, Look)):
        return [term]
    if isinstance(term, Op):
        return [a for arg in term.args for a in atoms(arg)]
    if isinstance(term, Cat):
        return [a for p in term.parts for a in atoms(p)]
    return []


def axes_of(term: Term) -> set[int]:
    if isinstance(term, Lin):
        return term.axes()
    if isinstance(term, Cmp):
        return term.lin.axes()
    if isinstance(term, Look):
        return set().union(*(lin.axes() for lin in term.index)) if term.index else set()
    if isinstance(term, Op):
        return set().union(*(axes_of(a) for a in term.args)) if term.args else set()
    if isinstance(term, Cat):
        return {term.axis}.union(*(axes_of(p) for p in term.parts))
    return set()


def replace_atom(term: Term, atom: Term, value: Term) -> Term:
    if term == atom:
        return value
    if isinstance(term, Op):
        return fold(Op(term.op, tuple(replace_atom(a, atom, value) for a in term.args), term.attr))
    return term


def normalise(dims: tuple[shapes.Dim, ...], term: Term, dtype: ir.DataType | None) -> Abstract:
    """x_a is 0 on an axis of size 1."""
    for axis, d in enumerate(dims):
        if d == 1:
            term = substitute(term, axis, 0)
    return Abstract(dims, term, dtype)
