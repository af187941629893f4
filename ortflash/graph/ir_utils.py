"""Small questions asked of an onnx-ir graph: constants, ranks, producers, attributes."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import overload

import numpy as np
import onnx
import onnx_ir as ir

FLOAT_TYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16)

# The most elements of an initializer stored as external data that const_array reads: scales,
# shapes and fills are a few; weights, which no rule needs as numbers, are far more.
MAX_EXTERNAL_ELEMENTS = 64

# How many producers any walk up the graph may follow (constant folding, dim resolution, the
# scores-or-bias test): real exports need a handful; the bound keeps a pathological graph cheap.
MAX_DEPTH = 32

# Ops a scalar scale is computed with in real exports (1/sqrt(head_dim) written out,
# sometimes from the static shape of Q). Evaluated in numpy, in the graph's dtype.
_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Sqrt": np.sqrt,
    "Reciprocal": np.reciprocal,
    "Neg": np.negative,
    "Identity": lambda x: x,
    "Abs": np.abs,
}
_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Div": np.divide,
    "Mul": np.multiply,
    "Add": np.add,
    "Sub": np.subtract,
    "Pow": np.power,
}
_EVALUATED = (
    set(_UNARY)
    | set(_BINARY)
    | {"Shape", "Cast", "CastLike", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Gather", "ConstantOfShape", "Slice"}
)


# Ops whose first output has the rank (and element type) of their first input.
_SAME_RANK = (
    "Identity",
    "Cast",
    "Softmax",
    "LayerNormalization",
    "Relu",
    "Gelu",
    "Erf",
    "Tanh",
    "Sigmoid",
    "Neg",
    "Sqrt",
    "Exp",
    "Dropout",
    "Softplus",
    "SimplifiedLayerNormalization",
    # Slice keeps every axis (a sliced causal look-up: fusion/causal/write writes one) and Not is
    # elementwise: without them the rank of a written padding mask was unknown, and its row read
    # the mask's batch axis as a query axis ('bias' on blocks proved causal + padding).
    "Slice",
    "Not",
)
# Ops whose output has the largest rank of their inputs (multidirectional broadcasting).
_BROADCAST_RANK = ("Add", "Sub", "Mul", "Div", "Pow", "Where", "MatMul")  # MatMul: inputs of rank >= 2
# com.microsoft ops whose output 0 has input 0's rank and type.
_CONTRIB_SAME_RANK = (
    "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "FastGelu",
    "BiasGelu",
    "Gelu",
    "QuickGelu",
    "BiasAdd",
    "SimplifiedLayerNormalization",
)


def default_opset(model: onnx.ModelProto) -> int:
    """The default-domain opset of an onnx.ModelProto."""
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 1


def producer(value: ir.Value | None, op_type: str | tuple[str, ...] | None = None) -> ir.Node | None:
    """The node computing value, when it is in the default domain and of the given op type(s)."""
    if value is None:
        return None
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    if op_type is not None:
        types = (op_type,) if isinstance(op_type, str) else op_type
        if node.op_type not in types:
            return None
    return node


@overload
def attr_int(node: ir.Node, name: str, default: int) -> int: ...
@overload
def attr_int(node: ir.Node, name: str, default: None = None) -> int | None: ...
def attr_int(node: ir.Node, name: str, default: int | None = None) -> int | None:
    """An int attribute of node, or default when absent."""
    a = node.attributes.get(name)
    return default if a is None else a.as_int()


def operand(node: ir.Node, index: int) -> ir.Value:
    """Input index of node, one the op requires (onnx-ir types every input as optional)."""
    value = node.inputs[index]
    if value is None:
        raise ValueError(f"{label(node)} lacks its input {index}")
    return value


def label(x: ir.Node | ir.Value) -> str:
    """How a reason names a node or a value. A node: by op type and name ("Cast /attn/Cast"), or,
    where it has no name (exporters and hand-built graphs often leave it empty), by op type and its
    first output's name ("Cast (output s32)"). A value: by its name, else as the output of its node."""
    if isinstance(x, ir.Value):
        if x.name:
            return x.name
        node = x.producer()
        return "an unnamed tensor" if node is None else f"output {x.index()} of {label(node)}"
    if x.name:
        return f"{x.op_type} {x.name}"
    first = x.outputs[0].name if x.outputs else None
    return f"{x.op_type} (output {first})" if first else f"an unnamed {x.op_type}"


def attr_ints(node: ir.Node, name: str) -> list[int] | None:
    """An ints attribute of node, or None when absent."""
    a = node.attributes.get(name)
    return None if a is None else list(a.as_ints())


def const_array(value: ir.Value | None, depth: int = MAX_DEPTH) -> np.ndarray | None:
    """The value as a numpy array when the graph fixes it (initializer, Constant, or a small
    expression of those and of static shapes); None otherwise."""
    if value is None:
        return None
    try:
        tensor = ir.convenience.get_const_tensor(value)
        if isinstance(tensor, ir.ExternalTensor) and not _external_readable(tensor):
            return None
        if tensor is not None:
            return tensor.numpy()
    except (OSError, ValueError):  # its data file is missing, short, or outside the model's folder
        return None
    node = producer(value)
    if node is None or depth == 0 or node.op_type not in _EVALUATED:
        return None
    op = node.op_type
    if op in ("Shape", "Slice", "Gather"):
        # Elements of a shape: the static ones are constants even where others are symbolic
        # (1/sqrt(head_dim) computed from Shape(q)[-1] in SDPA exports).
        elements = _shape_elements(value, depth)
        if elements is not None:
            return np.array(elements, np.int64).reshape(-1 if _is_vector(node) else ())
        if op == "Shape":
            return None
    if op == "CastLike":  # only the first input's value matters; the second gives the dtype
        x, like = const_array(node.inputs[0], depth - 1), operand(node, 1).dtype
        return None if x is None or like is None else x.astype(like.numpy())
    if op == "ConstantOfShape":
        shape = const_array(node.inputs[0], depth - 1)
        fill_attr = node.attributes.get("value")
        fill = np.zeros(1, np.float32) if fill_attr is None else fill_attr.as_tensor().numpy().reshape(-1)
        return None if shape is None else np.full([int(d) for d in shape], fill[0], fill.dtype)
    args: list[np.ndarray] = []
    for v in node.inputs:
        arr = const_array(v, depth - 1)
        if arr is None:
            return None
        args.append(arr)
    with np.errstate(all="ignore"):
        if op in _UNARY:
            return _UNARY[op](args[0])
        if op in _BINARY:
            out = _BINARY[op](args[0], args[1])
            return out.astype(np.result_type(args[0], args[1]), copy=False)
        if op == "Cast":
            return args[0].astype(ir.DataType(attr_int(node, "to", 0)).numpy())
        if op in ("Reshape", "Unsqueeze", "Squeeze", "Flatten") and args[0].size == 1:
            return args[0].reshape(())
        if op == "Gather" and args[1].ndim == 0:
            return np.take(args[0], int(args[1]), axis=attr_int(node, "axis", 0) or 0)
    return None


def _external_readable(tensor: ir.ExternalTensor) -> bool:
    """Whether const_array reads this initializer's external data: only a small one (a scale, a
    shape, a fill: MAX_EXTERNAL_ELEMENTS, so a weight is never read), and only from the model's
    folder (its base_dir, where onnx-ir also refuses a location that leads out of it). An empty
    base_dir (deserialize_model leaves it so) would resolve against the working directory: not read."""
    return bool(tensor.base_dir) and tensor.size <= MAX_EXTERNAL_ELEMENTS


def root_external_data(graph: ir.Graph, folder: str | os.PathLike[str]) -> None:
    """Resolve the external data of graph's initializers (and its subgraphs') against folder, the
    model's own, where nothing says where: deserialize_model leaves base_dir empty."""
    for each in (graph, *graph.subgraphs()):
        for value in each.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor) and not tensor.base_dir:
                tensor.base_dir = folder


def _is_vector(node: ir.Node) -> bool:
    """Whether a Shape, Slice or Gather node's output is 1-D (a Gather with a scalar index is not)."""
    if node.op_type != "Gather":
        return True
    idx = const_array(node.inputs[1])
    return idx is None or idx.ndim == 1


def _shape_elements(value: ir.Value, depth: int) -> list[int] | None:
    """The static elements of value when it is Shape(x), or a constant Slice or Gather of one,
    and every element it holds is a static dim of x."""
    node = producer(value)
    if node is None or depth <= 0:
        return None
    if node.op_type == "Shape":
        dims = value_shape(node.inputs[0])
        if dims is None:
            return None
        picked = dims[attr_int(node, "start", 0) : attr_int(node, "end", None)]
        return _all_static(picked)
    dims_in = producer(node.inputs[0], "Shape")
    whole = value_shape(dims_in.inputs[0]) if dims_in is not None else None
    if dims_in is None or whole is None:
        return None
    shape = whole[attr_int(dims_in, "start", 0) : attr_int(dims_in, "end", None)]
    if node.op_type == "Gather" and attr_int(node, "axis", 0) == 0:
        idx = const_array(node.inputs[1], depth - 1)
        if idx is None:
            return None
        try:
            picked = [shape[int(i)] for i in np.asarray(idx).reshape(-1)]
        except IndexError:
            return None
    elif node.op_type == "Slice" and len(node.inputs) >= 3:
        found = [const_array(x, depth - 1) for x in node.inputs[1:]]
        bounds = [b.reshape(-1) for b in found if b is not None]
        if (
            len(bounds) < len(found)
            or any(b.size != 1 for b in bounds)
            or (len(bounds) > 2 and int(bounds[2][0]) not in (0, -1))
        ):
            return None
        step = int(bounds[3][0]) if len(bounds) > 3 else 1
        picked = shape[int(bounds[0][0]) : int(np.clip(bounds[1][0], -len(shape) - 1, len(shape))) : step]
    else:
        return None
    return _all_static(picked)


def _all_static(dims: list[int | str | None]) -> list[int] | None:
    """dims when every one is a static size."""
    ints = [d for d in dims if isinstance(d, int)]
    return ints if len(ints) == len(dims) else None


def scalar(value: ir.Value | None) -> float | None:
    """A constant that holds one number (any rank, size 1), as a Python float."""
    arr = const_array(value)
    if arr is None or arr.size != 1:
        return None
    return float(arr.reshape(()))


def value_shape(value: ir.Value | None) -> list[int | str | None] | None:
    """Dims as ints (static), strings (named symbols) or None (unknown); None when the rank is unknown."""
    if value is None or value.shape is None:
        return None
    dims: list[int | str | None] = []
    for d in value.shape:
        if isinstance(d, int):
            dims.append(d)
        else:
            dims.append(d.value if getattr(d, "value", None) else None)
    return dims


def rank(value: ir.Value | None, depth: int = MAX_DEPTH) -> int | None:
    """The number of dims of value, when shape inference or the graph fixes it.

    Shape inference stops at ops it has no schema for (LayerNormalization below opset 17,
    com.microsoft ops): past them the rank is read from the structure (a Transpose's perm, a
    Reshape's constant target, ops whose output has their input's rank)."""
    shape = value_shape(value)
    if shape is not None:
        return len(shape)
    if value is None or depth <= 0:
        return None
    node = value.producer()
    if node is None or value is not node.outputs[0]:
        return None
    op = node.op_type
    if node.domain in ("", "ai.onnx"):
        if op == "Transpose":
            perm = attr_ints(node, "perm")
            return len(perm) if perm is not None else rank(node.inputs[0], depth - 1)
        if op == "Reshape":
            target = const_array(node.inputs[1])
            return None if target is None else int(target.size)
        if op in ("Unsqueeze", "Squeeze"):
            axes, r = unsqueeze_axes(node), rank(node.inputs[0], depth - 1)
            if axes is None or r is None:
                return None
            return r + len(axes) if op == "Unsqueeze" else r - len(axes)
        if op in _SAME_RANK:
            return rank(node.inputs[0], depth - 1)
        if op in _BROADCAST_RANK:
            ranks = [rank(x, depth - 1) for x in node.inputs if x is not None]
            known = [r for r in ranks if r is not None]
            if not known or len(known) < len(ranks) or (op == "MatMul" and min(known) < 2):
                return None
            return max(known)
        return None
    if node.domain == "com.microsoft" and op in _CONTRIB_SAME_RANK:
        return rank(node.inputs[0], depth - 1)
    return None


def dtype(value: ir.Value | None, depth: int = MAX_DEPTH) -> ir.DataType | None:
    """The element type of value, when shape inference or the graph fixes it (a Cast's target,
    or the type an op keeps from its inputs, past ops inference could not type)."""
    if value is None:
        return None
    if value.dtype not in (None, ir.DataType.UNDEFINED) or depth <= 0:
        return value.dtype
    node = value.producer()
    if node is None or value is not node.outputs[0]:
        return None
    if node.domain in ("", "ai.onnx") and node.op_type == "Cast":
        return ir.DataType(attr_int(node, "to", 0))
    keeps = _SAME_RANK + _BROADCAST_RANK + ("Transpose", "Reshape", "Unsqueeze", "Squeeze")
    known = node.domain in ("", "ai.onnx") and node.op_type in keeps and node.op_type != "Where"
    if known or (node.domain == "com.microsoft" and node.op_type in _CONTRIB_SAME_RANK):
        for x in node.inputs[:1] if node.op_type in ("Reshape", "Unsqueeze", "Squeeze") else node.inputs:
            found = dtype(x, depth - 1)
            if found is not None:
                return found
    return None


def const_rank(value: ir.Value | None) -> int | None:
    """The rank of a constant value; None when value is not constant."""
    arr = const_array(value)
    return None if arr is None else arr.ndim


def consumers_besides(value: ir.Value, allowed: set[ir.Node]) -> list[str]:
    """Names of what else reads value (nodes outside allowed, or the graph's outputs)."""
    other = [n.name or n.op_type for n in value.consumers() if n not in allowed]
    if value.is_graph_output():
        other.append("a graph output")
    return other


def unsqueeze_axes(node: ir.Node) -> list[int] | None:
    """The axes of an Unsqueeze, Squeeze or ReduceX node: the attribute (old opsets) or input 1."""
    axes = attr_ints(node, "axes")
    if axes is None and len(node.inputs) > 1:
        arr = const_array(node.inputs[1])
        axes = None if arr is None else [int(a) for a in arr.reshape(-1)]
    return axes
