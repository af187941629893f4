"""The version steps pipeline/opset.py writes out (``REWRITES``: axes and split attributes become
inputs, Softmax-13's axis, Clip-11, Pad-11, Resize-13, inference Dropout-12, BatchNormalization-14,
LayerNormalization-17), and what they read of the model (``ModelFacts``: its values' types and
ranks, the names taken, the values read)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .opset_table import OpsetNotRaised

_REDUCE_AXES_INPUT = {"ReduceSum": 13} | {
    op: 18
    for op in (
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceMax",
        "ReduceMean",
        "ReduceMin",
        "ReduceProd",
        "ReduceSumSquare",
    )
}
_FLOAT32_MAX = float(np.finfo(np.float32).max)


class ModelFacts:
    """What the version steps read of one model: its values' element types and ranks (ONNX's
    inference, else its declarations), the names its graphs and functions take, the values read."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.elem, self.rank = value_facts(model)
        self.taken = {n for g in graphs(model.graph) for node in g.node for n in (node.name, *node.output)}
        self.taken |= {v.name for g in graphs(model.graph) for v in (*g.input, *g.initializer)}
        self.read = {n for g in graphs(model.graph) for node in g.node for n in node.input}
        self.read |= {v.name for g in graphs(model.graph) for v in g.output}
        for function in model.functions:
            self.taken |= {n for node in function.node for n in (node.name, *node.output)}
            self.read |= {n for node in function.node for n in node.input} | set(function.output)

    def fresh(self, base: str) -> str:
        name, n = base, 1
        while name in self.taken:
            n += 1
            name = f"{base}_{n}"
        self.taken.add(name)
        return name

    def constant(self, base: str, value: np.ndarray) -> onnx.NodeProto:
        name = self.fresh(base)
        return helper.make_node(
            "Constant", [], [name], name=self.fresh(f"{name}/Constant"), value=numpy_helper.from_array(value, name)
        )

    def only_first_output(self, node: onnx.NodeProto) -> bool:
        return all(not name or name not in self.read for name in node.output[1:])


def graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                yield from graphs(sub)


def value_facts(model: onnx.ModelProto) -> tuple[dict[str, int], dict[str, int]]:
    """Element types and ranks of the model's values that ONNX shape inference (or the model) knows."""
    work = onnx.ModelProto()
    work.CopyFrom(model)
    imported = {i.domain for i in work.opset_import}
    used = {n.domain for g in graphs(work.graph) for n in g.node}
    for domain in sorted(used - imported - {"ai.onnx"}):  # ONNX Runtime does not need them; inference does
        work.opset_import.append(helper.make_opsetid(domain, 1))
    try:
        work = onnx.shape_inference.infer_shapes(work)
    except Exception:  # noqa: BLE001, S110 - without inference the model's own declarations stay
        pass
    elem: dict[str, int] = {}
    rank: dict[str, int] = {}
    for g in graphs(work.graph):
        for init in g.initializer:
            elem[init.name], rank[init.name] = init.data_type, len(init.dims)
        for vi in (*g.input, *g.output, *g.value_info):
            tensor = vi.type.tensor_type
            if vi.type.HasField("tensor_type") and tensor.elem_type:
                elem[vi.name] = tensor.elem_type
                if tensor.HasField("shape"):
                    rank[vi.name] = len(tensor.shape.dim)
    return elem, rank


Rewritten = tuple[list[onnx.NodeProto], onnx.NodeProto, list[onnx.NodeProto]]


def _pop_attribute(node: onnx.NodeProto, name: str) -> onnx.AttributeProto | None:
    """Remove and return the attribute ``name`` (a function's reference to its caller's is refused)."""
    for index, attr in enumerate(node.attribute):
        if attr.name == name:
            if attr.ref_attr_name:
                raise OpsetNotRaised(
                    f"{node.op_type}'s {name} refers to a function attribute; it cannot become an input"
                )
            del node.attribute[index]
            return attr
    return None


def _attribute_to_input(raiser: ModelFacts, node: onnx.NodeProto, name: str, position: int) -> Rewritten:
    """The int list attribute ``name`` becomes the int64 input at ``position`` (absent stays absent)."""
    node = _copy(node)
    attr = _pop_attribute(node, name)
    if attr is None or not attr.ints:
        return [], node, []
    const = raiser.constant(f"{node.name or node.op_type}/{name}", np.array(attr.ints, dtype=np.int64))
    inputs = list(node.input) + [""] * (position - len(node.input))
    del node.input[:]
    node.input.extend(inputs[:position] + [const.output[0]] + inputs[position:])
    return [const], node, []


def _split_18(raiser: ModelFacts, node: onnx.NodeProto) -> Rewritten:
    """Split-18 needs num_outputs where no split input gives the sizes; Split-13 then split equally,
    which for an evenly divisible axis is what num_outputs does."""
    node = _copy(node)
    if len(node.input) < 2 or not node.input[1]:
        node.attribute.append(helper.make_attribute("num_outputs", len(node.output)))
    return [], node, []


def _softmax_13(raiser: ModelFacts, node: onnx.NodeProto) -> Rewritten:
    """Before 13, Softmax (LogSoftmax, Hardmax) flattened the dims from ``axis`` on into one; at 13
    it reads one axis. The same where that axis is the last; else flatten, apply, reshape back."""
    node = _copy(node)
    attr = _pop_attribute(node, "axis")
    axis = 1 if attr is None else attr.i  # the default was 1 before 13
    rank = raiser.rank.get(node.input[0])
    if axis == -1 or (rank and axis % rank == rank - 1):
        node.attribute.append(helper.make_attribute("axis", -1))
        return [], node, []
    base = node.name or node.op_type
    flat, flat_out, shape = (
        raiser.fresh(f"{base}/flat"),
        raiser.fresh(f"{base}/flat_out"),
        raiser.fresh(f"{base}/shape"),
    )
    result = node.output[0]
    flatten = helper.make_node("Flatten", [node.input[0]], [flat], name=raiser.fresh(f"{base}/Flatten"), axis=axis)
    of_shape = helper.make_node("Shape", [node.input[0]], [shape], name=raiser.fresh(f"{base}/Shape"))
    node.input[0], node.output[0] = flat, flat_out
    node.attribute.append(helper.make_attribute("axis", -1))
    back = helper.make_node("Reshape", [flat_out, shape], [result], name=raiser.fresh(f"{base}/Reshape"))
    return [flatten, of_shape], node, [back]


def _float_constant(raiser: ModelFacts, node: onnx.NodeProto, value: float, what: str) -> onnx.NodeProto:
    """A scalar of the node's float32/float64 input type (float16 would round the old default)."""
    elem = raiser.elem.get(node.input[0])
    if elem not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE):
        raise OpsetNotRaised(
            f"{node.op_type}: its {what} becomes an input of the input's type, float32 or float64 needed"
        )
    dtype = np.float32 if elem == onnx.TensorProto.FLOAT else np.float64
    return raiser.constant(f"{node.name or node.op_type}/{what}", np.array(value, dtype=dtype))


def _clip_11(raiser: ModelFacts, node: onnx.NodeProto) -> Rewritten:
    """Clip-6's min/max attributes (defaults: the float32 extremes, which clamp infinities) become inputs."""
    node = _copy(node)
    low, high = _pop_attribute(node, "min"), _pop_attribute(node, "max")
    bounds = [
        _float_constant(raiser, node, -_FLOAT32_MAX if low is None else low.f, "min"),
        _float_constant(raiser, node, _FLOAT32_MAX if high is None else high.f, "max"),
    ]
    node.input.extend(b.output[0] for b in bounds)
    return bounds, node, []


def _pad_11(raiser: ModelFacts, node: onnx.NodeProto) -> Rewritten:
    """Pad-2's pads and value attributes become inputs (mode stays)."""
    node = _copy(node)
    pads, value = _pop_attribute(node, "pads"), _pop_attribute(node, "value")
    if pads is None:
        raise OpsetNotRaised(f"{node.op_type} without pads")
    consts = [raiser.constant(f"{node.name or 'Pad'}/pads", np.array(pads.ints, dtype=np.int64))]
    consts.append(_float_constant(raiser, node, 0.0 if value is None else value.f, "value"))
    node.input.extend(c.output[0] for c in consts)
    return consts, node, []


def _resize_13(raiser: ModelFacts, node: onnx.NodeProto) -> Rewritten:
    """Resize-13 makes roi and scales optional and drops the tf_half_pixel_for_nn coordinates."""
    mode = next((a.s for a in node.attribute if a.name == "coordinate_transformation_mode"), b"half_pixel")
    if mode == b"tf_half_pixel_for_nn":
        raise OpsetNotRaised(f"Resize (node {node.name!r}): tf_half_pixel_for_nn coordinates have no opset-13 form")
    return [], node, []


def _only_first_output(reason: str) -> Callable[[ModelFacts, onnx.NodeProto], Rewritten]:
    def rewrite(raiser: ModelFacts, node: onnx.NodeProto) -> Rewritten:
        if not raiser.only_first_output(node):
            raise OpsetNotRaised(f"{node.op_type} (node {node.name!r}): its later outputs are read; {reason}")
        node = _copy(node)
        del node.output[1:]
        if node.op_type == "Dropout":
            _pop_attribute(node, "ratio")
        return [], node, []

    return rewrite


def _layer_normalization_17(raiser: ModelFacts, node: onnx.NodeProto) -> Rewritten:
    """ONNX Runtime's LayerNormalization-1 (ONNX domain, before ONNX had one) is ONNX's
    LayerNormalization-17: the same attributes, inputs and outputs, one kernel in ONNX Runtime. But 17
    binds X, Scale and B to one type, and its Mean/InvStdDev types differ: those must hold."""
    kinds = {raiser.elem.get(name) for name in node.input if name}
    if len(kinds) != 1 or None in kinds:
        raise OpsetNotRaised(
            f"LayerNormalization (node {node.name!r}): opset 17 needs X, Scale and B of one type, and theirs "
            f"are {'not all known' if None in kinds else 'mixed'}"
        )
    if not raiser.only_first_output(node):
        raise OpsetNotRaised(
            f"LayerNormalization (node {node.name!r}): Mean/InvStdDev are read, and their types change at 17"
        )
    return [], node, []


def _copy(node: onnx.NodeProto) -> onnx.NodeProto:
    out = onnx.NodeProto()
    out.CopyFrom(node)
    return out


REWRITES: dict[tuple[str, int], Callable[[ModelFacts, onnx.NodeProto], Rewritten]] = {
    **{
        (op, v): functools.partial(_attribute_to_input, name="axes", position=1) for op, v in _REDUCE_AXES_INPUT.items()
    },
    ("Squeeze", 13): functools.partial(_attribute_to_input, name="axes", position=1),
    ("Unsqueeze", 13): functools.partial(_attribute_to_input, name="axes", position=1),
    ("Split", 13): functools.partial(_attribute_to_input, name="split", position=1),
    ("Split", 18): _split_18,
    **{(op, 13): _softmax_13 for op in ("Softmax", "LogSoftmax", "Hardmax")},
    ("Clip", 11): _clip_11,
    ("Pad", 11): _pad_11,
    ("Resize", 13): _resize_13,
    ("Dropout", 12): _only_first_output("an inference Dropout is its input"),
    ("BatchNormalization", 14): _only_first_output("opset 14 writes running statistics only when training"),
    ("LayerNormalization", 17): _layer_normalization_17,
}
