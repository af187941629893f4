"""What every op's reading (graph/op_readers) asks of the reader and shares: ``TensorReader``
(its inputs read as terms, shape tensors and scalars as dims; graph/interpret's ``Reader`` is
one), ``input_at`` (an input, or ``NotProved`` where it is missing) and ``broadcast`` (operands'
index variables aligned right, their dims proved equal where neither is 1)."""

from __future__ import annotations

from typing import Protocol

import onnx_ir as ir

from . import ir_utils as u
from . import shapes
from .dim_terms import dims_equal
from .terms import Abstract, NotProved, Term, remap


class TensorReader(Protocol):
    """What an op's reading asks of the reader (graph/interpret.Reader): its inputs read as terms,
    shape tensors and scalars read as dims, and the graph's value of each Range length it read."""

    dim_values: dict[shapes.Dim, ir.Value]
    computed_starts: bool  # Slices from computed starts are read (graph/interpret.Reader)
    ends_assumed: list[tuple[shapes.Dim, int]]
    ends_inside: list[tuple[shapes.Dim, int]]

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


def broadcast(xs: list[Abstract]) -> tuple[tuple[shapes.Dim, ...], list[Term]]:
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
