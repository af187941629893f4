"""Named dims of a model's inputs that the graph ties to the other inputs' dims.

An exporter may give one input symbols of its own: a transformers 5.x dynamo export of a decoder
with a cache names its attention mask ``[s43, s53]`` while the batch is ``s10`` and the keys are
past + new (``s70 + s15``), so nothing in the input names says how long the mask must be. The graph
says it: the mask is read by a GatherND whose indices range over ``Range(batch)`` and
``Range(past + new)``, or meets, in a broadcasting op, a tensor of those dims. This module reads
those ops with the deep reading of graph/interpret and gives each such dim as a linear form over
the other inputs' dim names, for the feeds to follow.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import onnx
import onnx_ir as ir

from ..graph import ir_utils as u
from ..graph.dim_terms import dim_lin
from ..graph.interpret import Reader
from ..graph.terms import Lin, NotProved, substitute
from ..model_shapes import with_shapes

# Ops that keep every axis of their first input where it goes (the mask cast to bool or float).
_SAME_AXES = ("Cast", "Identity", "Not", "Neg", "Abs", "Sign")
# Broadcasting ops a mask meets other tensors in (a padding mask and the causal one, a fill).
_BROADCASTING = (
    "Add",
    "Sub",
    "Mul",
    "Div",
    "And",
    "Or",
    "Xor",
    "Where",
    "Equal",
    "Less",
    "LessOrEqual",
    "Greater",
    "GreaterOrEqual",
    "Max",
    "Min",
)
# How many ops past the input the reading follows before it stops looking.
_MAX_STEPS = 8

# An axis of a value walked from the input: the input's axis it carries, None for one it does not.
AxisMap = tuple[int | None, ...]


def own_dim_names(model: onnx.ModelProto) -> dict[str, tuple[str, int]]:
    """Dim names that only one input of the model has, each with (that input, its axis)."""
    inits = {i.name for i in model.graph.initializer}
    seen: dict[str, set[str]] = {}
    where: dict[str, tuple[str, int]] = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.dim_param:
                seen.setdefault(d.dim_param, set()).add(vi.name)
                where.setdefault(d.dim_param, (vi.name, axis))
    return {d: where[d] for d, names in seen.items() if len(names) == 1}


def tied_dims(model: onnx.ModelProto) -> dict[str, Lin]:
    """Dim name of one input -> the linear form over other inputs' dim names the graph says it equals.

    Only names that one input alone has are read (a name two inputs share is tied already), and
    only a tie to names of the other inputs, or to a static size above 1, is kept: a mask that meets
    a tensor of size 1 on an axis only broadcasts there. Where the graph says two different things
    about one dim, the first one read (GatherND before broadcasting, nearest op first) is kept."""
    own = own_dim_names(model)
    if not own:
        return {}
    inits = {i.name for i in model.graph.initializer}
    names_of = {
        vi.name: {d.dim_param for d in vi.type.tensor_type.shape.dim if d.dim_param}
        for vi in model.graph.input
        if vi.name not in inits
    }
    graph = ir.serde.deserialize_model(with_shapes(model)[0]).graph  # the readings prove from shapes
    reader = Reader()
    tied: dict[str, Lin] = {}
    for value in graph.inputs:
        names = [d if isinstance(d, str) and d in own else None for d in (u.value_shape(value) or [])]
        if not any(names):
            continue
        others = set().union(*(n for name, n in names_of.items() if name != value.name))
        for axis, lin in _ties(reader, value, tuple(range(len(names)))):
            name = names[axis] if axis < len(names) else None
            if name is not None and name not in tied and _over(lin, others):
                tied[name] = lin
    # a tie to a name that is tied itself is dropped: the names a tie reads keep their own values
    return {name: lin for name, lin in tied.items() if not any(atom[1] in tied for atom, _ in lin.coeffs)}


def _over(lin: Lin, names: set[str]) -> bool:
    """A form over the given dim names only, or a static size above 1."""
    if not lin.coeffs:
        return lin.const > 1
    return all(atom[0] == "d" and atom[1] in names and coef > 0 for atom, coef in lin.coeffs)


def _ties(reader: Reader, start: ir.Value, axes: AxisMap) -> Iterator[tuple[int, Lin]]:
    """(input axis, the form its size equals) for every tie read on the ops consuming ``start``,
    breadth first (the nearest op first)."""
    frontier: list[tuple[ir.Value, AxisMap]] = [(start, axes)]
    seen = {id(start)}
    for _ in range(_MAX_STEPS):
        following: list[tuple[ir.Value, AxisMap]] = []
        for value, carried in frontier:
            for node in value.consumers():
                yield from _read_consumer(reader, node, value, carried)
                for out, mapped in _carried_on(node, value, carried):
                    if id(out) not in seen and any(a is not None for a in mapped):
                        seen.add(id(out))
                        following.append((out, mapped))
        frontier = following
        if not frontier:
            return


def _read_consumer(reader: Reader, node: ir.Node, value: ir.Value, carried: AxisMap) -> Iterator[tuple[int, Lin]]:
    """The ties one consumer proves."""
    try:
        if node.op_type == "GatherND" and node.inputs[0] is value and u.attr_int(node, "batch_dims", 0) == 0:
            yield from _gather_nd_ties(reader, node, carried)
        elif node.op_type in _BROADCASTING:
            yield from _broadcast_ties(reader, node, value, carried)
    except NotProved:
        return


def _gather_nd_ties(reader: Reader, node: ir.Node, carried: AxisMap) -> Iterator[tuple[int, Lin]]:
    """GatherND(data, indices) where index component k is an index variable ranging over a dim:
    data's axis k is that long (ONNX Runtime fails on an index past the end, and a mask read over
    Range(past + new) is that long)."""
    index = reader.read(node.inputs[1])
    last = len(index.dims) - 1
    if index.dims[-1] != len(carried):
        return
    for k, axis in enumerate(carried):
        component = substitute(index.term, last, k)
        if axis is None or not isinstance(component, Lin) or len(component.coeffs) != 1 or component.const:
            continue
        (atom, coef) = component.coeffs[0]
        if atom[0] != "x" or coef != 1:
            continue
        lin = dim_lin(index.dims[int(atom[1])])  # type: ignore[call-overload]
        if lin is not None:
            yield axis, lin


def _broadcast_ties(reader: Reader, node: ir.Node, value: ir.Value, carried: AxisMap) -> Iterator[tuple[int, Lin]]:
    """A broadcasting op: on an axis where another operand is not 1, the value has that size too."""
    for other in node.inputs:
        if other is None or other is value:
            continue
        dims = reader.dims_of(other)
        if dims is None:
            continue
        for back in range(1, min(len(dims), len(carried)) + 1):
            axis, d = carried[-back], dims[-back]
            if axis is None or d is None or d == 1:
                continue
            lin = dim_lin(d) if isinstance(d, (int, str)) else None
            if lin is not None:
                yield axis, lin


def _carried_on(node: ir.Node, value: ir.Value, carried: AxisMap) -> Iterator[tuple[ir.Value, AxisMap]]:
    """The outputs of ``node`` that carry the input's axes on, and where they put them."""
    op = node.op_type
    if op in _SAME_AXES and node.inputs[0] is value:
        yield node.outputs[0], carried
    elif op == "Unsqueeze" and node.inputs[0] is value:
        axes = u.unsqueeze_axes(node)
        if axes is None:
            return
        rank = len(carried) + len(axes)
        inserted = {a % rank for a in axes}
        rest = iter(carried)
        yield node.outputs[0], tuple(None if a in inserted else next(rest) for a in range(rank))
    elif op == "Reshape" and node.inputs[0] is value and u.rank(node.outputs[0]) == len(carried):
        # a view that keeps the rank (GPT-2's mask.view(batch, -1)): of the shapes it could give, the
        # one where each axis keeps its length is the one where each keeps its meaning
        yield node.outputs[0], carried
    elif op in _BROADCASTING:
        out_rank = u.rank(node.outputs[0])
        if out_rank is not None and out_rank >= len(carried):
            yield node.outputs[0], (None,) * (out_rank - len(carried)) + carried


def evaluated(lin: Lin, values: Mapping[str, int]) -> int | None:
    """The form's value where every name in it has one."""
    total = lin.const
    for atom, coef in lin.coeffs:
        if atom[0] != "d" or atom[1] not in values:
            return None
        total += coef * values[str(atom[1])]
    return total
