"""The one way ortflash writes nodes into a graph: before an anchor node, under one name prefix,
in the forms the model's opset takes, with constants and Shape nodes shared within a block."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

# Unsqueeze and Squeeze take their axes as an input from this opset on (an attribute before).
AXES_AS_INPUT_OPSET = 13


class Emitter:
    """Appends nodes before ``anchor`` in ``graph``, named ``{prefix}/{op}_{n}``."""

    def __init__(self, graph: ir.Graph, anchor: ir.Node, prefix: str, opset: int) -> None:
        self.graph = graph
        self.anchor = anchor
        self.prefix = prefix
        self.opset = opset
        self._count = 0
        self._constants: dict[tuple[str, tuple[int, ...], bytes], ir.Value] = {}
        self._shapes: dict[int, ir.Value] = {}

    def node(self, op_type: str, inputs: Sequence[ir.Value | None], domain: str = "", **attrs: Any) -> ir.Value:
        """Insert one node; its first output, named after the node."""
        self._count += 1
        name = f"{self.prefix}/{op_type}_{self._count}"
        node = ir.node(op_type, list(inputs), attributes=attrs, domain=domain, name=name)
        node.outputs[0].name = name + "_out"
        self.graph.insert_before(self.anchor, node)
        return node.outputs[0]

    def made_here(self, value: ir.Value) -> bool:
        """Whether value is the output of a node this emitter wrote."""
        producer = value.producer()
        return producer is not None and (producer.name or "").startswith(self.prefix + "/")

    def const(self, array: np.ndarray | float | bool | Sequence[int]) -> ir.Value:
        """A Constant node holding array (one per distinct value in this block)."""
        array = np.asarray(array)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._constants:
            self._constants[key] = self.node("Constant", [], value=ir.tensor(array))
        return self._constants[key]

    def i64(self, values: int | Sequence[int]) -> ir.Value:
        return self.const(np.asarray(values, np.int64))

    def f32(self, value: float) -> ir.Value:
        return self.const(np.array(value, np.float32))

    def cast(self, x: ir.Value, to: ir.DataType) -> ir.Value:
        """x as type to (x itself when it is known to be of that type)."""
        return x if x.dtype == to else self.node("Cast", [x], to=to)

    def unsqueeze(self, x: ir.Value, axes: Sequence[int]) -> ir.Value:
        if self.opset >= AXES_AS_INPUT_OPSET:
            return self.node("Unsqueeze", [x, self.i64(list(axes))])
        return self.node("Unsqueeze", [x], axes=list(axes))

    def squeeze(self, x: ir.Value, axes: Sequence[int]) -> ir.Value:
        if self.opset >= AXES_AS_INPUT_OPSET:
            return self.node("Squeeze", [x, self.i64(list(axes))])
        return self.node("Squeeze", [x], axes=list(axes))

    def transpose(self, x: ir.Value, perm: Sequence[int]) -> ir.Value:
        return self.node("Transpose", [x], perm=list(perm))

    def reshape(self, x: ir.Value, dims: Sequence[int]) -> ir.Value:
        return self.node("Reshape", [x, self.i64(list(dims))])

    def shape(self, x: ir.Value) -> ir.Value:
        """Shape(x), written once per tensor."""
        if id(x) not in self._shapes:
            self._shapes[id(x)] = self.node("Shape", [x])
        return self._shapes[id(x)]

    def dim(self, x: ir.Value, axis: int, scalar: bool = False, known: int | None = None) -> ir.Value:
        """x's size along axis as int64: 1-D of one element, or a scalar; a constant when known."""
        if known is not None:
            return self.i64(known if scalar else [known])
        index = self.i64(axis) if scalar else self.i64([axis])
        return self.node("Gather", [self.shape(x), index], axis=0)

    def largest_batch(self, xs: Sequence[ir.Value]) -> ir.Value:
        """The largest dim 0 of xs, 1-D int64 of one element: the batch size of operands that
        broadcast over it (in a valid graph each dim 0 is 1 or that size)."""
        sizes = [self.node("Slice", [self.shape(x), self.i64([0]), self.i64([1])]) for x in xs]
        return self.node("Max", sizes) if len(sizes) > 1 else sizes[0]

    def expand_batch(self, x: ir.Value, batch: ir.Value, rank: int) -> ir.Value:
        """x of the given rank broadcast to batch along dim 0."""
        return self.node("Expand", [x, self.node("Concat", [batch, self.i64([1] * (rank - 1))], axis=0)])

    def arange(self, n: ir.Value) -> ir.Value:
        """0, 1, ..., n - 1 for a scalar int64 n."""
        return self.node("Range", [self.i64(0), n, self.i64(1)])


def take_graph_output(graph: ir.Graph, old: ir.Value, new: ir.Value) -> None:
    """Where old is a graph output, new stands there under old's name (old is renamed apart)."""
    if old.is_graph_output():
        name = old.name
        for i, out in enumerate(graph.outputs):
            if out is old:
                graph.outputs[i] = new
        old.name = f"{name}_replaced"
        new.name = name


def replace_output(graph: ir.Graph, old: ir.Value, new: ir.Value) -> None:
    """Point every reader of old at new; a graph output keeps its name, and new takes old's
    type and shape where they are known."""
    take_graph_output(graph, old, new)
    old.replace_all_uses_with(new)
    if old.dtype is not None:
        new.dtype = old.dtype
    if old.shape is not None:
        new.shape = old.shape
