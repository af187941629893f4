"""Raise a model's default-domain opset op by op, instead of with onnx.version_converter.

The whole-model converter stops at the first op it has no adapter for (ONNX Runtime's
LayerNormalization-1 in the ONNX domain below opset 17), at a node of a domain the model does not
import, and at an op without an ONNX schema (SimplifiedLayerNormalization). Here every node of
every graph (If branches, Loop and Scan bodies, model functions) is carried over on its own:

- other domains (com.microsoft, ai.onnx.ml, custom) are left alone;
- an op whose schema is the same at both opsets carries over as it is;
- an op whose schema changed carries over through each version step between the two: a step
  that only widens the types (or narrows them where the node's own types stay allowed), a step
  that adds an attribute or input whose absence is the old behaviour (``_SAME_MEANING``), or a
  step written out here (``_REWRITES``: axes and split attributes become inputs, Softmax-13's
  axis, Clip-11, Pad-11, Resize-13, inference Dropout-12, BatchNormalization-14,
  LayerNormalization-17);
- anything else raises OpsetNotRaised naming the op, its node and the step.

Ops ONNX has no schema for are read from ONNX Runtime's registry, where the model will run.
Over 400 lines: the version steps, the table of steps that keep their meaning and the rewrites
are one proof, read together.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import NotLowered

__all__ = ["OpsetNotRaised", "raise_default_opset"]

_DEFAULT_DOMAINS = ("", "ai.onnx")


class OpsetNotRaised(NotLowered):
    """A default-domain node that cannot be carried over to the target opset exactly."""


# (op, the version that changed it) -> why its new attribute or input, absent, is the old behaviour.
_SAME_MEANING = {
    ("ArgMax", 12): "select_last_index defaults to 0, the first index as before",
    ("ArgMin", 12): "select_last_index defaults to 0, the first index as before",
    ("AveragePool", 10): "ceil_mode defaults to 0",
    ("AveragePool", 19): "dilations default to 1",
    ("MaxPool", 10): "ceil_mode defaults to 0 and dilations to 1",
    ("Cast", 19): "saturate applies only to float8 targets, which no earlier Cast has",
    ("CastLike", 19): "saturate applies only to float8 targets, which no earlier CastLike has",
    ("Constant", 11): "sparse_value is one more way to write the value",
    ("Constant", 12): "value_float(s), value_int(s), value_string(s) are more ways to write the value",
    ("DepthToSpace", 11): "mode defaults to DCR, the only mode before",
    ("GatherND", 12): "batch_dims defaults to 0",
    ("Gemm", 11): "C becomes optional",
    ("Identity", 14): "sequence types are added",
    ("Pad", 18): "axes, absent, pads every axis as before",
    ("Pow", 12): "the exponent may have its own type",
    ("Reshape", 14): "allowzero defaults to 0, the old reading of a 0",
    ("ScatterElements", 16): "reduction defaults to none",
    ("ScatterND", 16): "reduction defaults to none",
    ("Shape", 15): "start and end default to the whole shape",
    ("TopK", 11): "largest and sorted default to 1, the old behaviour",
    ("BatchNormalization", 15): "scale, bias, mean and variance may have their own types",
    ("Resize", 18): "antialias 0, all axes and the stretch policy are the old behaviour",
}

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


def raise_default_opset(model: onnx.ModelProto, version: int) -> onnx.ModelProto:
    """A copy of ``model`` whose default-domain opset is ``version``, every node carried over exactly.

    A model already at ``version`` or above comes back as it is. Raises OpsetNotRaised for the
    first node that cannot be carried over."""
    source = _default_version(model.opset_import)
    if source >= version:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    raiser = _Raiser(out, version)
    raiser.graph(out.graph, source)
    for function in out.functions:
        function_source = _default_version(function.opset_import)
        if function_source < version and any(n.domain in _DEFAULT_DOMAINS for n in function.node):
            raiser.nodes(function.node, function_source)
            _set_default_version(function.opset_import, version)
    _set_default_version(out.opset_import, version)
    return out


def _default_version(imports: Any) -> int:
    return next((i.version for i in imports if i.domain in _DEFAULT_DOMAINS), 1)


def _set_default_version(imports: Any, version: int) -> None:
    for imp in imports:
        if imp.domain in _DEFAULT_DOMAINS:
            imp.version = version
            return
    imports.append(helper.make_opsetid("", version))


# ---------------------------------------------------------------- schemas: ONNX's, else ONNX Runtime's


@functools.lru_cache(maxsize=1)
def _onnx_versions() -> dict[str, list[int]]:
    versions: dict[str, set[int]] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        if schema.domain == "":
            versions.setdefault(schema.name, set()).add(schema.since_version)
    return {op: sorted(v) for op, v in versions.items()}


@functools.lru_cache(maxsize=1)
def _ort_schemas() -> dict[str, dict[int, Any]]:
    """ONNX Runtime's own default-domain schemas (its LayerNormalization-1 and
    SimplifiedLayerNormalization-1 are not ONNX's), by op and since_version."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    schemas: dict[str, dict[int, Any]] = {}
    for schema in ort_state.get_all_operator_schema():
        if schema.domain == "":
            schemas.setdefault(schema.name, {})[schema.since_version] = schema
    return schemas


def _chain(op: str, source: int, target: int) -> tuple[list[Any], str] | None:
    """The schemas ``op`` resolves to from ``source`` up to ``target`` (first one at ``source``),
    and whose registry they come from; None where neither registry knows the op at ``source``."""
    for registry in ("ONNX", "ONNX Runtime"):
        if registry == "ONNX":
            since = [v for v in _onnx_versions().get(op, []) if v <= target]
            schema_at: Callable[[int], Any] = functools.partial(onnx.defs.get_schema, op, domain="")
        else:
            by_version = _ort_schemas().get(op, {})
            since = sorted(v for v in by_version if v <= target)
            schema_at = by_version.__getitem__
        first = [v for v in since if v <= source]
        if first:
            return [schema_at(v) for v in [first[-1]] + [v for v in since if v > source]], registry
    return None


def _signature(schema: Any) -> tuple:
    """What a node of the op may say: attributes with defaults, inputs and outputs, arities."""

    def params(ps: Any) -> list[tuple]:
        return [
            (p.name, int(p.option), _attr(p, "is_homogeneous", "isHomogeneous"), _attr(p, "type_str", "typeStr"))
            for p in ps
        ]

    attrs = {k: (int(a.type), a.required, a._default_value) for k, a in schema.attributes.items()}
    return attrs, params(schema.inputs), params(schema.outputs), schema.min_input, schema.max_input


def _attr(obj: Any, name: str, other: str) -> Any:
    return getattr(obj, name) if hasattr(obj, name) else getattr(obj, other)


def _types(schema: Any) -> list[set[str]]:
    bound = {t.type_param_str: set(t.allowed_type_strs) for t in schema.type_constraints}
    return [bound.get(t, {t}) for t in (_attr(p, "type_str", "typeStr") for p in [*schema.inputs, *schema.outputs])]


# ---------------------------------------------------------------- the pass


class _Raiser:
    """Carries the nodes of one model to ``target``, knowing its values' types and ranks."""

    def __init__(self, model: onnx.ModelProto, target: int) -> None:
        self.target = target
        self.elem, self.rank = _value_facts(model)
        self.taken = {n for g in _graphs(model.graph) for node in g.node for n in (node.name, *node.output)}
        self.taken |= {v.name for g in _graphs(model.graph) for v in (*g.input, *g.initializer)}
        self.read = {n for g in _graphs(model.graph) for node in g.node for n in node.input}
        self.read |= {v.name for g in _graphs(model.graph) for v in g.output}
        for function in model.functions:
            self.taken |= {n for node in function.node for n in (node.name, *node.output)}
            self.read |= {n for node in function.node for n in node.input} | set(function.output)

    def graph(self, graph: onnx.GraphProto, source: int) -> None:
        self.nodes(graph.node, source)

    def nodes(self, nodes: Any, source: int) -> None:
        carried: list[onnx.NodeProto] = []
        for node in nodes:
            for attr in node.attribute:
                for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                    self.graph(sub, source)
            carried += self.node(node, source) if node.domain in _DEFAULT_DOMAINS else [node]
        del nodes[:]
        nodes.extend(carried)

    def node(self, node: onnx.NodeProto, source: int) -> list[onnx.NodeProto]:
        """node at ``self.target``: itself, or the nodes that compute the same."""
        where = f"{node.op_type} (node {node.name!r})" if node.name else node.op_type
        chain = _chain(node.op_type, source, self.target)
        if chain is None:
            raise OpsetNotRaised(
                f"{where} has no schema at opset {source} in ONNX {onnx.__version__} or in ONNX Runtime, "
                f"so nothing shows it means the same at opset {self.target}"
            )
        schemas, registry = chain
        before: list[onnx.NodeProto] = []
        after: list[onnx.NodeProto] = []
        for old, new in zip(schemas, schemas[1:]):
            step = (node.op_type, new.since_version)
            if step in _REWRITES:
                pre, node, post = _REWRITES[step](self, node)
                before, after = before + pre, post + after
            elif step in _SAME_MEANING or self._widens(node, old, new):
                continue
            else:
                raise OpsetNotRaised(
                    f"{where} changed at opset {new.since_version} ({registry} schema "
                    f"{old.since_version} -> {new.since_version}) in a way ortflash does not convert"
                )
        return before + [node] + after

    def _widens(self, node: onnx.NodeProto, old: Any, new: Any) -> bool:
        """The step only changes types, and the node's own types are allowed after it."""
        if _signature(old) != _signature(new) or new.deprecated:
            return False
        allowed_before, allowed_after = _types(old), _types(new)
        params = [*[(p, list(node.input)) for p in old.inputs], *[(p, list(node.output)) for p in old.outputs]]
        position = {id(p): i for ps in (old.inputs, old.outputs) for i, p in enumerate(ps)}
        for (param, names), was, now in zip(params, allowed_before, allowed_after):
            if was <= now:
                continue
            at = position[id(param)]
            bound = names[at:] if param.option == param.option.Variadic else names[at : at + 1]
            kinds = {_type_string(self.elem.get(name)) for name in bound if name}
            if None in kinds or not kinds <= now:  # the node's types unknown, or no longer allowed
                return False
        return True

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


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                yield from _graphs(sub)


def _value_facts(model: onnx.ModelProto) -> tuple[dict[str, int], dict[str, int]]:
    """Element types and ranks of the model's values that ONNX shape inference (or the model) knows."""
    work = onnx.ModelProto()
    work.CopyFrom(model)
    imported = {i.domain for i in work.opset_import}
    used = {n.domain for g in _graphs(work.graph) for n in g.node}
    for domain in sorted(used - imported - {"ai.onnx"}):  # ONNX Runtime does not need them; inference does
        work.opset_import.append(helper.make_opsetid(domain, 1))
    try:
        work = onnx.shape_inference.infer_shapes(work)
    except Exception:  # noqa: BLE001, S110 - without inference the model's own declarations stay
        pass
    elem: dict[str, int] = {}
    rank: dict[str, int] = {}
    for g in _graphs(work.graph):
        for init in g.initializer:
            elem[init.name], rank[init.name] = init.data_type, len(init.dims)
        for vi in (*g.input, *g.output, *g.value_info):
            tensor = vi.type.tensor_type
            if vi.type.HasField("tensor_type") and tensor.elem_type:
                elem[vi.name] = tensor.elem_type
                if tensor.HasField("shape"):
                    rank[vi.name] = len(tensor.shape.dim)
    return elem, rank


def _type_string(elem: int | None) -> str | None:
    return None if elem is None else f"tensor({onnx.TensorProto.DataType.Name(elem).lower()})"


# ---------------------------------------------------------------- the rewrites

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


def _attribute_to_input(raiser: _Raiser, node: onnx.NodeProto, name: str, position: int) -> Rewritten:
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


def _split_18(raiser: _Raiser, node: onnx.NodeProto) -> Rewritten:
    """Split-18 needs num_outputs where no split input gives the sizes; Split-13 then split equally,
    which for an evenly divisible axis is what num_outputs does."""
    node = _copy(node)
    if len(node.input) < 2 or not node.input[1]:
        node.attribute.append(helper.make_attribute("num_outputs", len(node.output)))
    return [], node, []


def _softmax_13(raiser: _Raiser, node: onnx.NodeProto) -> Rewritten:
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


def _float_constant(raiser: _Raiser, node: onnx.NodeProto, value: float, what: str) -> onnx.NodeProto:
    """A scalar of the node's float32/float64 input type (float16 would round the old default)."""
    elem = raiser.elem.get(node.input[0])
    if elem not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE):
        raise OpsetNotRaised(
            f"{node.op_type}: its {what} becomes an input of the input's type, float32 or float64 needed"
        )
    dtype = np.float32 if elem == onnx.TensorProto.FLOAT else np.float64
    return raiser.constant(f"{node.name or node.op_type}/{what}", np.array(value, dtype=dtype))


def _clip_11(raiser: _Raiser, node: onnx.NodeProto) -> Rewritten:
    """Clip-6's min/max attributes (defaults: the float32 extremes, which clamp infinities) become inputs."""
    node = _copy(node)
    low, high = _pop_attribute(node, "min"), _pop_attribute(node, "max")
    bounds = [
        _float_constant(raiser, node, -_FLOAT32_MAX if low is None else low.f, "min"),
        _float_constant(raiser, node, _FLOAT32_MAX if high is None else high.f, "max"),
    ]
    node.input.extend(b.output[0] for b in bounds)
    return bounds, node, []


def _pad_11(raiser: _Raiser, node: onnx.NodeProto) -> Rewritten:
    """Pad-2's pads and value attributes become inputs (mode stays)."""
    node = _copy(node)
    pads, value = _pop_attribute(node, "pads"), _pop_attribute(node, "value")
    if pads is None:
        raise OpsetNotRaised(f"{node.op_type} without pads")
    consts = [raiser.constant(f"{node.name or 'Pad'}/pads", np.array(pads.ints, dtype=np.int64))]
    consts.append(_float_constant(raiser, node, 0.0 if value is None else value.f, "value"))
    node.input.extend(c.output[0] for c in consts)
    return consts, node, []


def _resize_13(raiser: _Raiser, node: onnx.NodeProto) -> Rewritten:
    """Resize-13 makes roi and scales optional and drops the tf_half_pixel_for_nn coordinates."""
    mode = next((a.s for a in node.attribute if a.name == "coordinate_transformation_mode"), b"half_pixel")
    if mode == b"tf_half_pixel_for_nn":
        raise OpsetNotRaised(f"Resize (node {node.name!r}): tf_half_pixel_for_nn coordinates have no opset-13 form")
    return [], node, []


def _only_first_output(reason: str) -> Callable[[_Raiser, onnx.NodeProto], Rewritten]:
    def rewrite(raiser: _Raiser, node: onnx.NodeProto) -> Rewritten:
        if not raiser.only_first_output(node):
            raise OpsetNotRaised(f"{node.op_type} (node {node.name!r}): its later outputs are read; {reason}")
        node = _copy(node)
        del node.output[1:]
        if node.op_type == "Dropout":
            _pop_attribute(node, "ratio")
        return [], node, []

    return rewrite


def _layer_normalization_17(raiser: _Raiser, node: onnx.NodeProto) -> Rewritten:
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


_REWRITES: dict[tuple[str, int], Callable[[_Raiser, onnx.NodeProto], Rewritten]] = {
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
