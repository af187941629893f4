"""Raise a model's default-domain opset op by op, instead of with onnx.version_converter.

The whole-model converter stops at the first op it has no adapter for (ONNX Runtime's
LayerNormalization-1 in the ONNX domain below opset 17), at a node of a domain the model does not
import, and at an op without an ONNX schema (SimplifiedLayerNormalization). Here every node of
every graph (If branches, Loop and Scan bodies, model functions) is carried over on its own:

- other domains (com.microsoft, ai.onnx.ml, custom) are left alone;
- an op whose schema is the same at both opsets carries over as it is;
- an op whose schema changed carries over through each version step between the two: a step
  that only changes the types, where the node's own types fit the new ones (bound to one type
  where the new schema binds them), a step of the named table ``_SAME_MEANING`` (each with why:
  new attributes whose defaults keep the old meaning, new optional inputs), for a node that leaves
  the new attributes at those defaults and whose types fit, or a step written out here (``_REWRITES``: axes and split attributes become inputs, Softmax-13's
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
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import NotLowered

__all__ = ["OpsetNotRaised", "raise_default_opset"]

_DEFAULT_DOMAINS = ("", "ai.onnx")
_OPTIONAL, _VARIADIC = 1, 2  # FormalParameterOption's values (Single is 0), ONNX's and ONNX Runtime's


class OpsetNotRaised(NotLowered):
    """A default-domain node that cannot be carried over to the target opset exactly."""


_ABSENT = object()  # an attribute that has no default: only its absence is the old behaviour


@dataclass(frozen=True)
class _Same:
    """A version step whose schema change keeps the meaning for a node that leaves the step's new
    attributes at ``defaults`` (the value each one has when absent, or _ABSENT where only absence
    is the old behaviour). Every other difference of the schemas still refuses the node (the schema
    diff in _Raiser._step_misfit): what is named here is all the step may change."""

    why: str
    defaults: dict[str, object] = field(default_factory=dict)


# (op, the version that changed it) -> why the step keeps the meaning, and the defaults that do.
_SAME_MEANING = {
    ("ArgMax", 12): _Same("select_last_index defaults to 0, the first index as before", {"select_last_index": 0}),
    ("ArgMin", 12): _Same("select_last_index defaults to 0, the first index as before", {"select_last_index": 0}),
    ("AveragePool", 10): _Same("ceil_mode defaults to 0", {"ceil_mode": 0}),
    ("AveragePool", 19): _Same("dilations default to 1", {"dilations": _ABSENT}),
    ("MaxPool", 10): _Same("ceil_mode defaults to 0 and dilations to 1", {"ceil_mode": 0, "dilations": _ABSENT}),
    ("LpPool", 18): _Same("ceil_mode defaults to 0 (floor) and dilations to 1", {"ceil_mode": 0, "dilations": _ABSENT}),
    ("Cast", 19): _Same("saturate applies only to float8 targets, which no earlier Cast has", {"saturate": 1}),
    ("CastLike", 19): _Same("saturate applies only to float8 targets, which no earlier CastLike has", {"saturate": 1}),
    ("Constant", 11): _Same("sparse_value is one more way to write the value", {"sparse_value": _ABSENT}),
    ("Constant", 12): _Same(
        "value_float(s), value_int(s), value_string(s) are more ways to write the value",
        {f"value_{k}": _ABSENT for k in ("float", "floats", "int", "ints", "string", "strings")},
    ),
    ("DepthToSpace", 11): _Same("mode defaults to DCR, the only mode before", {"mode": b"DCR"}),
    ("GatherND", 12): _Same("batch_dims defaults to 0", {"batch_dims": 0}),
    ("Gemm", 11): _Same("C becomes optional"),
    ("Identity", 14): _Same("sequence types are added"),
    ("Pad", 18): _Same("axes, absent, pads every axis as before"),
    ("Pow", 12): _Same("the exponent may have its own type"),
    ("Reshape", 14): _Same("allowzero defaults to 0, the old reading of a 0", {"allowzero": 0}),
    ("ScatterElements", 16): _Same("reduction defaults to none", {"reduction": b"none"}),
    ("ScatterND", 16): _Same("reduction defaults to none", {"reduction": b"none"}),
    ("Shape", 15): _Same("start and end default to the whole shape", {"start": 0, "end": _ABSENT}),
    ("TopK", 11): _Same("largest and sorted default to 1, the old behaviour", {"largest": 1, "sorted": 1}),
    ("BatchNormalization", 15): _Same("scale, bias, mean and variance may have their own types"),
    ("Resize", 18): _Same(
        "antialias 0, all axes and the stretch policy are the old behaviour",
        {"antialias": 0, "axes": _ABSENT, "keep_aspect_ratio_policy": b"stretch"},
    ),
    **{
        (rnn, 14): _Same("layout defaults to 0, the [seq, batch, ...] shapes of before", {"layout": 0})
        for rnn in ("GRU", "LSTM", "RNN")
    },
    # Quantization (issue 33 item 2): what ONNX Runtime's quantizer writes at opsets 13-21.
    **{
        (op, 13): _Same(
            "axis reads a 1-D scale, and before 13 the scale is a scalar (per tensor), where axis means nothing",
            {"axis": 1},
        )
        for op in ("QuantizeLinear", "DequantizeLinear")
    },
    ("QuantizeLinear", 19): _Same(
        "saturate applies only to float8 outputs, which no earlier QuantizeLinear has; the scale takes x's "
        "type, which the node's types must show",
        {"saturate": 1},
    ),
    ("DequantizeLinear", 21): _Same(
        "block_size 0 is per-tensor or per-axis dequantization, the only kind before", {"block_size": 0}
    ),
    ("DequantizeLinear", 23): _Same("output_dtype 0 gives y the scale's type, the old typing", {"output_dtype": 0}),
    # QuantizeLinear-21 and 23 are not here, though their defaults keep the meaning: ONNX Runtime
    # 1.31's QDQ optimizer, at its default level, fails to load an opset-23 QDQ model ("output_dtype
    # INT8 does not match y_zero_point type UINT8" on the QuantizeLinear it inserts; 26 of 49 zoo
    # models quantized by quantize_static on their projections, benchmarks/quantized_targets.py).
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


def _params(ps: Any) -> list[tuple[Any, ...]]:
    """An input or output list's arities (single, optional, variadic) and homogeneity, not its types."""
    return [(int(p.option), _attr(p, "is_homogeneous", "isHomogeneous")) for p in ps]


def _attributes(schema: Any) -> dict[str, tuple[int, bool, bytes]]:
    return {k: (int(a.type), a.required, a._default_value) for k, a in schema.attributes.items()}


def _attr(obj: Any, name: str, other: str) -> Any:
    return getattr(obj, name) if hasattr(obj, name) else getattr(obj, other)


def _is_default(attr: onnx.AttributeProto, default: object) -> bool:
    """The node's attribute says its default (a function's reference to its caller's is unknown)."""
    if default is _ABSENT or attr.ref_attr_name:
        return False
    return bool(helper.get_attribute_value(attr) == default)


def _bound_types(schema: Any) -> dict[str, set[str]]:
    return {t.type_param_str: set(t.allowed_type_strs) for t in schema.type_constraints}


def _slots(schema: Any, node: onnx.NodeProto) -> list[tuple[str, str]]:
    """(value name, the schema's type string for it) for every input and output the node gives."""
    slots = []
    for params, names in ((schema.inputs, list(node.input)), (schema.outputs, list(node.output))):
        for at, param in enumerate(params):
            variadic = param.option == param.option.Variadic
            type_str = _attr(param, "type_str", "typeStr")
            slots += [(name, type_str) for name in (names[at:] if variadic else names[at : at + 1]) if name]
    return slots


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
            elif misfit := self._step_misfit(node, old, new, _SAME_MEANING.get(step)):
                raise OpsetNotRaised(
                    f"{where} changed at opset {new.since_version} ({registry} schema "
                    f"{old.since_version} -> {new.since_version}) in a way ortflash does not convert: {misfit}"
                )
        return before + [node] + after

    def _step_misfit(self, node: onnx.NodeProto, old: Any, new: Any, same: _Same | None) -> str:
        """Why ``node`` may not mean the same after the step old -> new; '' where it does. The schemas
        may differ only in new attributes ``same`` names (the node leaving each at its default), new
        optional inputs and outputs the node does not give, and types; the node's own types must
        fit the new ones."""
        if new.deprecated:
            return "the op is deprecated there"
        before, after = _attributes(old), _attributes(new)
        given = {a.name: a for a in node.attribute}
        for name, had in before.items():
            has = after.get(name)
            made_optional = bool(same and has and had[1] and not has[1] and name in given and has[0] == had[0])
            if has != had and not made_optional:  # an attribute the node must give becomes optional: same
                return f"its attribute {name} {'is removed' if has is None else 'changes'}"
        for name in sorted(set(after) - set(before)):
            if same is None or name not in same.defaults:
                return f"it gains the attribute {name}, which no entry of ortflash's table says keeps the meaning"
            if name in given and not _is_default(given[name], same.defaults[name]):
                value = helper.get_attribute_value(given[name])
                return f"the node sets the new attribute {name} ({value!r}), where only its default keeps the meaning"
        for what, was_params, now_params, count in (
            ("input", old.inputs, new.inputs, len(node.input)),
            ("output", old.outputs, new.outputs, len(node.output)),
        ):
            was, now = _params(was_params), _params(now_params)
            added = now[len(was) :]
            # Single -> Optional, and new optional inputs, only where the table names the step
            kept = all(w == n or (same and n[0] == _OPTIONAL and w[0] != _VARIADIC) for w, n in zip(was, now))
            if len(now) < len(was) or not kept or (added and (same is None or any(a[0] != _OPTIONAL for a in added))):
                return f"its {what}s change"
            if count > len(was) and (not was or was[-1][0] != _VARIADIC):
                return f"the node gives {what}s the old schema does not have"
        if same is None and (old.min_input, old.max_input) != (new.min_input, new.max_input):
            return "its number of inputs changes"
        if new.min_input > len([n for n in node.input if n]) or new.max_input < len(node.input):
            return "its number of inputs changes"
        return self._types_misfit(node, old, new)

    def _types_misfit(self, node: onnx.NodeProto, old: Any, new: Any) -> str:
        """Why the node's types may not fit the new schema; '' where they do. A value whose type is
        unknown fits where the step only widens what it may be and ties it to no value it was not
        tied to before (two values of one fixed type, tensor(float), count as tied)."""
        old_bound, new_bound = _bound_types(old), _bound_types(new)
        was_slots, now_slots = _slots(old, node), _slots(new, node)
        groups: dict[str, list[tuple[str, str]]] = {}
        for (name, was), (_, now) in zip(was_slots, now_slots):
            kind = _type_string(self.elem.get(name))
            allowed = new_bound.get(now, {now})
            if kind is not None and kind not in allowed:
                return f"{name} is {kind}, which the new schema does not allow"
            if kind is None and not old_bound.get(was, {was}) <= allowed:
                return f"the type of {name} is unknown and the new schema narrows what it may be"
            if now in new_bound:
                groups.setdefault(now, []).append((was, kind or ""))
        for now, members in groups.items():
            kinds = {kind for _, kind in members}
            if len(kinds - {""}) > 1:
                return f"values the new schema binds to one type ({now}) have types {sorted(kinds - {''})}"
            if "" in kinds and len({was for was, _ in members}) > 1:
                return f"the new schema binds values of unknown types to one type ({now}), which the old did not"
        return ""

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
