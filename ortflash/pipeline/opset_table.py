"""What one version step of an op may change and still mean the same, for pipeline/opset.py: the
table of steps whose schema changes keep the meaning for a node at their defaults (``SAME_MEANING``),
and the schemas the steps are read from (ONNX's, else ONNX Runtime's registry, where the model
will run), with the parts of a schema the step's diff compares."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import onnx
from onnx import helper

from ..errors import NotLowered

OPTIONAL, VARIADIC = 1, 2  # FormalParameterOption's values (Single is 0), ONNX's and ONNX Runtime's


class OpsetNotRaised(NotLowered):
    """A default-domain node that cannot be carried over to the target opset exactly."""


ABSENT = object()  # an attribute that has no default: only its absence is the old behaviour


@dataclass(frozen=True)
class Same:
    """A version step whose schema change keeps the meaning for a node that leaves the step's new
    attributes at ``defaults`` (the value each one has when absent, or ABSENT where only absence
    is the old behaviour). Every other difference of the schemas still refuses the node (the schema
    diff in pipeline/opset.py's _Raiser._step_misfit): what is named here is all the step may change."""

    why: str
    defaults: dict[str, object] = field(default_factory=dict)


# (op, the version that changed it) -> why the step keeps the meaning, and the defaults that do.
SAME_MEANING = {
    ("ArgMax", 12): Same("select_last_index defaults to 0, the first index as before", {"select_last_index": 0}),
    ("ArgMin", 12): Same("select_last_index defaults to 0, the first index as before", {"select_last_index": 0}),
    ("AveragePool", 10): Same("ceil_mode defaults to 0", {"ceil_mode": 0}),
    ("AveragePool", 19): Same("dilations default to 1", {"dilations": ABSENT}),
    ("MaxPool", 10): Same("ceil_mode defaults to 0 and dilations to 1", {"ceil_mode": 0, "dilations": ABSENT}),
    ("LpPool", 18): Same("ceil_mode defaults to 0 (floor) and dilations to 1", {"ceil_mode": 0, "dilations": ABSENT}),
    ("Cast", 19): Same("saturate applies only to float8 targets, which no earlier Cast has", {"saturate": 1}),
    ("CastLike", 19): Same("saturate applies only to float8 targets, which no earlier CastLike has", {"saturate": 1}),
    ("Constant", 11): Same("sparse_value is one more way to write the value", {"sparse_value": ABSENT}),
    ("Constant", 12): Same(
        "value_float(s), value_int(s), value_string(s) are more ways to write the value",
        {f"value_{k}": ABSENT for k in ("float", "floats", "int", "ints", "string", "strings")},
    ),
    ("DepthToSpace", 11): Same("mode defaults to DCR, the only mode before", {"mode": b"DCR"}),
    ("GatherND", 12): Same("batch_dims defaults to 0", {"batch_dims": 0}),
    ("Gemm", 11): Same("C becomes optional"),
    ("Identity", 14): Same("sequence types are added"),
    ("Pad", 18): Same("axes, absent, pads every axis as before"),
    ("Pow", 12): Same("the exponent may have its own type"),
    ("Reshape", 14): Same("allowzero defaults to 0, the old reading of a 0", {"allowzero": 0}),
    ("ScatterElements", 16): Same("reduction defaults to none", {"reduction": b"none"}),
    ("ScatterND", 16): Same("reduction defaults to none", {"reduction": b"none"}),
    ("Shape", 15): Same("start and end default to the whole shape", {"start": 0, "end": ABSENT}),
    ("TopK", 11): Same("largest and sorted default to 1, the old behaviour", {"largest": 1, "sorted": 1}),
    ("BatchNormalization", 15): Same("scale, bias, mean and variance may have their own types"),
    ("Resize", 18): Same(
        "antialias 0, all axes and the stretch policy are the old behaviour",
        {"antialias": 0, "axes": ABSENT, "keep_aspect_ratio_policy": b"stretch"},
    ),
    **{
        (rnn, 14): Same("layout defaults to 0, the [seq, batch, ...] shapes of before", {"layout": 0})
        for rnn in ("GRU", "LSTM", "RNN")
    },
    # Quantization (issue 33 item 2): what ONNX Runtime's quantizer writes at opsets 13-21.
    **{
        (op, 13): Same(
            "axis reads a 1-D scale, and before 13 the scale is a scalar (per tensor), where axis means nothing",
            {"axis": 1},
        )
        for op in ("QuantizeLinear", "DequantizeLinear")
    },
    ("QuantizeLinear", 19): Same(
        "saturate applies only to float8 outputs, which no earlier QuantizeLinear has; the scale takes x's "
        "type, which the node's types must show",
        {"saturate": 1},
    ),
    ("DequantizeLinear", 21): Same(
        "block_size 0 is per-tensor or per-axis dequantization, the only kind before", {"block_size": 0}
    ),
    ("DequantizeLinear", 23): Same("output_dtype 0 gives y the scale's type, the old typing", {"output_dtype": 0}),
    # QuantizeLinear-21 and 23 are not here, though their defaults keep the meaning: ONNX Runtime
    # 1.31's QDQ optimizer, at its default level, fails to load an opset-23 QDQ model ("output_dtype
    # INT8 does not match y_zero_point type UINT8" on the QuantizeLinear it inserts; 26 of 49 zoo
    # models quantized by quantize_static on their projections, benchmarks/quantized_targets.py).
}


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


def chain(op: str, source: int, target: int) -> tuple[list[Any], str] | None:
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


def params(ps: Any) -> list[tuple[Any, ...]]:
    """An input or output list's arities (single, optional, variadic) and homogeneity, not its types."""
    return [(int(p.option), _attr(p, "is_homogeneous", "isHomogeneous")) for p in ps]


def attributes(schema: Any) -> dict[str, tuple[int, bool, bytes]]:
    return {k: (int(a.type), a.required, a._default_value) for k, a in schema.attributes.items()}


def _attr(obj: Any, name: str, other: str) -> Any:
    return getattr(obj, name) if hasattr(obj, name) else getattr(obj, other)


def is_default(attr: onnx.AttributeProto, default: object) -> bool:
    """The node's attribute says its default (a function's reference to its caller's is unknown)."""
    if default is ABSENT or attr.ref_attr_name:
        return False
    return bool(helper.get_attribute_value(attr) == default)


def bound_types(schema: Any) -> dict[str, set[str]]:
    return {t.type_param_str: set(t.allowed_type_strs) for t in schema.type_constraints}


def slots(schema: Any, node: onnx.NodeProto) -> list[tuple[str, str]]:
    """(value name, the schema's type string for it) for every input and output the node gives."""
    slots = []
    for params, names in ((schema.inputs, list(node.input)), (schema.outputs, list(node.output))):
        for at, param in enumerate(params):
            variadic = param.option == param.option.Variadic
            type_str = _attr(param, "type_str", "typeStr")
            slots += [(name, type_str) for name in (names[at:] if variadic else names[at : at + 1]) if name]
    return slots
