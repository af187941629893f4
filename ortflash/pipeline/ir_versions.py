"""The IR version a model needs, and the one ONNX Runtime loads: a model stamped newer than ONNX
Runtime reads (onnx 1.23's make_model writes IR 14, ONNX Runtime 1.31 loads 13 at most) can be
stamped lower where nothing in it belongs to a newer IR version.

What each IR version added is onnx.proto's own list (``enum Version``); a feature the list does
not date is counted at the newest version this onnx knows, so that a model is never stamped
older than what it uses.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator

import onnx
from google.protobuf.message import Message
from onnx import TensorProto, helper

from ..errors import OrtflashError

__all__ = [
    "IrVersionNeed",
    "ir_version_onnxruntime_loads",
    "least_ir_version",
    "loadable_ir_version",
    "stamp_loadable_ir_version",
]

IrVersionNeed = tuple[int, str]  # (IR version, the first thing in the model that needs it)

# element type -> the IR version that added it (onnx.proto: 4 BFLOAT16, 9 FLOAT8*, 10 UINT4/INT4,
# 11 FLOAT4E2M1, 12 FLOAT8E8M0, 13 UINT2/INT2, 14 FLOAT6E2M3/FLOAT6E3M2)
_TYPE_IR: dict[int, int] = {TensorProto.BFLOAT16: 4, TensorProto.UINT4: 10, TensorProto.INT4: 10}
_TYPE_IR |= {
    t: 9
    for t in (TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ)
}
_TYPE_IR |= {TensorProto.FLOAT4E2M1: 11, TensorProto.FLOAT8E8M0: 12, TensorProto.UINT2: 13, TensorProto.INT2: 13}
_TYPE_IR |= {TensorProto.FLOAT6E2M3: 14, TensorProto.FLOAT6E3M2: 14}
_DTYPE_ATTRIBUTES = ("to", "dtype", "output_dtype")  # int attributes that name an element type

# the proto fields an IR version added (onnx.proto), as (field, IR version, what a set one is, said
# of {where}); in the order they are looked at, since of needs that tie the first found is named
_AddedFields = tuple[tuple[str, int, str], ...]
_MODEL_FIELDS: _AddedFields = (
    ("training_info", 7, "training information"),
    ("functions", 8, "model-local functions"),
    ("configuration", 11, "a multi-device configuration"),
)
_FUNCTION_FIELDS: _AddedFields = (
    ("attribute_proto", 9, "default attribute values in {where}"),
    ("overload", 10, "an overloaded {where}"),
)
_GRAPH_FIELDS: _AddedFields = (
    ("quantization_annotation", 5, "quantization annotations in {where}"),
    ("sparse_initializer", 6, "sparse initializers in {where}"),
    ("metadata_props", 10, "metadata on {where}"),
)
_NODE_FIELDS: _AddedFields = (
    ("metadata_props", 10, "metadata on {where}"),
    ("overload", 10, "an overloaded call in {where}"),
    ("device_configurations", 11, "device configurations on {where}"),
)


def least_ir_version(model: onnx.ModelProto) -> IrVersionNeed:
    """The least IR version the model's contents need, and what needs it (IR 3 for the rest)."""
    return max(_needs(model), key=lambda need: need[0], default=(3, "opset imports"))


def stamp_loadable_ir_version(model: onnx.ModelProto, loads: int | None = None) -> tuple[onnx.ModelProto, str | None]:
    """``model`` stamped with the IR version ONNX Runtime loads (``loads``, default: measured),
    where it is stamped newer and nothing in it needs the newer one: (a copy, a note saying so).
    Stamped at or below it: (``model`` itself, None). OrtflashError where it needs a newer one."""
    import onnxruntime as ort

    highest = ir_version_onnxruntime_loads() if loads is None else loads
    if model.ir_version <= highest:
        return model, None
    needed, what = least_ir_version(model)
    if needed > highest:
        raise OrtflashError(
            f"ONNX Runtime {ort.__version__} loads IR version {highest} at most, and the model needs "
            f"IR version {needed} ({what})"
        )
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.ir_version = highest
    why = f"needs {needed} ({what})" if needed > 3 else "needs no newer one"
    note = f"IR version {model.ir_version} stamped {highest}, the newest ONNX Runtime {ort.__version__} loads (the model {why})"
    return out, note


def loadable_ir_version(model: onnx.ModelProto, notes: list[str]) -> onnx.ModelProto:
    """``model`` stamped with the IR version ONNX Runtime loads where nothing in it needs a newer
    one, the note saying so added to ``notes``; ``model`` itself where it is loadable as it is, or
    needs the newer version (the load check then says ONNX Runtime cannot take it). optimize writes
    every model through this, fused or not: a model with nothing to fuse is written at the IR
    version a fused one would be (issue 33 item 6)."""
    try:
        out, stamped = stamp_loadable_ir_version(model)
    except OrtflashError:
        return model
    if stamped is not None:
        notes.append(stamped)
    return out


@functools.lru_cache(maxsize=1)
def ir_version_onnxruntime_loads() -> int:
    """The newest IR version this ONNX Runtime opens a model of (measured on a one-node model)."""
    import onnxruntime as ort

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "probe",
        [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    for version in range(onnx.IR_VERSION, 3, -1):
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=version)
        try:
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        except Exception:  # noqa: BLE001 - ONNX Runtime reports an unsupported IR version as several types
            continue
        return version
    raise OrtflashError(f"ONNX Runtime {ort.__version__} loads no IR version from 4 to {onnx.IR_VERSION}")


def _needs(model: onnx.ModelProto) -> Iterator[IrVersionNeed]:
    yield from _set_fields(model, _MODEL_FIELDS, "the model")
    for function in model.functions:
        yield from _set_fields(function, _FUNCTION_FIELDS, f"function {function.name}")
        if function.metadata_props or function.value_info:
            yield 10, f"metadata or value_info in function {function.name}"
        yield from _value_infos(function.value_info, f"function {function.name}")
        yield from _nodes(function.node, f"function {function.name}")
    yield from _graph(model.graph, top=True)


def _graph(graph: onnx.GraphProto, top: bool = False) -> Iterator[IrVersionNeed]:
    where = f"graph {graph.name}"
    inputs = {i.name for i in graph.input}
    if top and any(init.name not in inputs for init in graph.initializer):
        yield 4, "initializers that are not graph inputs"
    yield from _set_fields(graph, _GRAPH_FIELDS, where)
    for init in graph.initializer:
        yield from _element_type(init.data_type, f"initializer {init.name}")
    for sparse in graph.sparse_initializer:
        yield from _element_type(sparse.values.data_type, f"sparse initializer {sparse.values.name}")
    yield from _value_infos([*graph.input, *graph.output, *graph.value_info], where)
    yield from _nodes(graph.node, where)


def _nodes(nodes: Iterable[onnx.NodeProto], where: str) -> Iterator[IrVersionNeed]:
    for node in nodes:
        name = f"node {node.name or node.op_type} in {where}"
        yield from _set_fields(node, _NODE_FIELDS, name)
        for attr in node.attribute:
            yield from _attribute(attr, name)


def _set_fields(proto: Message, fields: _AddedFields, where: str) -> Iterator[IrVersionNeed]:
    """What those of proto's fields that are set (non-empty) need, in the table's order."""
    for field, version, what in fields:
        if getattr(proto, field):
            yield version, what.format(where=where)


def _attribute(attr: onnx.AttributeProto, where: str) -> Iterator[IrVersionNeed]:
    what = f"attribute {attr.name} of {where}"
    kind = onnx.AttributeProto
    if attr.type == kind.INT and attr.name in _DTYPE_ATTRIBUTES:
        yield from _element_type(attr.i, what)
    for tensor in [attr.t] if attr.type == kind.TENSOR else list(attr.tensors):
        yield from _element_type(tensor.data_type, what)
    if attr.type in (kind.SPARSE_TENSOR, kind.SPARSE_TENSORS):
        yield 6, f"a sparse tensor in {what}"
        for sparse in [attr.sparse_tensor] if attr.type == kind.SPARSE_TENSOR else list(attr.sparse_tensors):
            yield from _element_type(sparse.values.data_type, what)
    for type_proto in [attr.tp] if attr.type == kind.TYPE_PROTO else list(attr.type_protos):
        yield from _type(type_proto, what)
    for sub in [attr.g] if attr.type == kind.GRAPH else list(attr.graphs):
        yield from _graph(sub)


def _value_infos(infos: Iterable[onnx.ValueInfoProto], where: str) -> Iterator[IrVersionNeed]:
    for info in infos:
        if info.metadata_props:
            yield 10, f"metadata on value {info.name} in {where}"
        yield from _type(info.type, f"value {info.name} in {where}")


def _type(type_proto: onnx.TypeProto, what: str) -> Iterator[IrVersionNeed]:
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type":
        yield from _element_type(type_proto.tensor_type.elem_type, what)
    elif kind == "sparse_tensor_type":
        yield 8, f"a sparse tensor type of {what}"
        yield from _element_type(type_proto.sparse_tensor_type.elem_type, what)
    elif kind == "optional_type":
        yield 8, f"an optional type of {what}"
        yield from _type(type_proto.optional_type.elem_type, what)
    elif kind == "sequence_type":
        yield from _type(type_proto.sequence_type.elem_type, what)
    elif kind == "map_type":
        yield from _element_type(type_proto.map_type.key_type, what)
        yield from _type(type_proto.map_type.value_type, what)
    elif kind == "opaque_type":  # in every build only from IR 14 (ONNX-ML builds had it before)
        yield 14, f"an opaque type of {what}"


def _element_type(elem: int, what: str) -> Iterator[IrVersionNeed]:
    if elem in _TYPE_IR:
        yield _TYPE_IR[elem], f"{TensorProto.DataType.Name(elem)} in {what}"
    elif elem > max(TensorProto.DataType.values()):
        yield onnx.IR_VERSION, f"element type {elem}, which onnx {onnx.__version__} does not know, in {what}"
