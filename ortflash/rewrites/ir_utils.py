"""Small questions asked of an onnx-ir graph: constants, ranks, producers."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

FLOAT_TYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16)

# Ops a scalar scale is computed with in real exports (1/sqrt(head_dim) written out,
# sometimes from the static shape of Q). Evaluated in numpy, in the graph's dtype.
_UNARY = {
    "Sqrt": np.sqrt,
    "Reciprocal": np.reciprocal,
    "Neg": np.negative,
    "Identity": lambda x: x,
    "Abs": np.abs,
}
_BINARY = {"Div": np.divide, "Mul": np.multiply, "Add": np.add, "Sub": np.subtract, "Pow": np.power}
_EVALUATED = set(_UNARY) | set(_BINARY) | {
    "Shape", "Cast", "CastLike", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Gather", "ConstantOfShape"
}


def default_opset(model) -> int:
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


def attr_int(node: ir.Node, name: str, default: int | None = None) -> int | None:
    a = node.attributes.get(name)
    return default if a is None else a.as_int()


def attr_ints(node: ir.Node, name: str) -> list[int] | None:
    a = node.attributes.get(name)
    return None if a is None else list(a.as_ints())


def const_array(value: ir.Value | None, depth: int = 10) -> np.ndarray | None:
    """The value as a numpy array when the graph fixes it (initializer, Constant, or a small
    expression of those and of static shapes); None otherwise."""
    if value is None:
        return None
    try:
        tensor = ir.convenience.get_const_tensor(value)
        if tensor is not None:
            return tensor.numpy()
    except (OSError, ValueError):  # external data not loaded: a weight, never a scale
        return None
    node = producer(value)
    if node is None or depth == 0 or node.op_type not in _EVALUATED:
        return None
    op = node.op_type
    if op == "Shape":
        shape = value_shape(node.inputs[0])
        if shape is None or not all(isinstance(d, int) for d in shape):
            return None
        start, end = attr_int(node, "start", 0), attr_int(node, "end", None)
        return np.array(shape[start:end], np.int64)
    if op == "CastLike":  # only the first input's value matters; the second gives the dtype
        x, like = const_array(node.inputs[0], depth - 1), node.inputs[1].dtype
        return None if x is None or like is None else x.astype(like.numpy())
    if op == "ConstantOfShape":
        shape = const_array(node.inputs[0], depth - 1)
        fill = node.attributes.get("value")
        fill = np.zeros(1, np.float32) if fill is None else fill.as_tensor().numpy().reshape(-1)
        return None if shape is None else np.full([int(d) for d in shape], fill[0], fill.dtype)
    args = []
    for v in node.inputs:
        args.append(const_array(v, depth - 1))
        if args[-1] is None:
            return None
    with np.errstate(all="ignore"):
        if op in _UNARY:
            return _UNARY[op](args[0])
        if op in _BINARY:
            out = _BINARY[op](args[0], args[1])
            return out.astype(np.result_type(args[0], args[1]), copy=False)
        if op == "Cast":
            return args[0].astype(ir.DataType(attr_int(node, "to")).numpy())
        if op in ("Reshape", "Unsqueeze", "Squeeze", "Flatten") and args[0].size == 1:
            return args[0].reshape(())
        if op == "Gather" and args[1].ndim == 0:
            return np.take(args[0], int(args[1]), axis=attr_int(node, "axis", 0))
    return None


def scalar(value: ir.Value | None) -> float | None:
    """A constant that holds one number (any rank, size 1), as a Python float."""
    arr = const_array(value)
    if arr is None or arr.size != 1:
        return None
    return float(arr.reshape(()))


def value_shape(value: ir.Value) -> list[int | str | None] | None:
    """Dims as ints (static), strings (named symbols) or None (unknown); None when the rank is unknown."""
    if value is None or value.shape is None:
        return None
    dims = []
    for d in value.shape:
        if isinstance(d, int):
            dims.append(d)
        else:
            dims.append(d.value if getattr(d, "value", None) else None)
    return dims


def rank(value: ir.Value) -> int | None:
    shape = value_shape(value)
    return None if shape is None else len(shape)


def const_rank(value: ir.Value) -> int | None:
    arr = const_array(value)
    return None if arr is None else arr.ndim


def other_input(node: ir.Node, value: ir.Value) -> ir.Value:
    """The operand of a binary node that is not value."""
    a, b = node.inputs[0], node.inputs[1]
    return b if a is value else a


def consumers_besides(value: ir.Value, allowed: set) -> list[str]:
    """Names of what else reads value (nodes outside allowed, or the graph's outputs)."""
    other = [n.name or n.op_type for n in value.consumers() if n not in allowed]
    if value.is_graph_output():
        other.append("a graph output")
    return other


def same_dim(a, b) -> bool:
    """Two dims proved equal: equal ints, or one named symbol."""
    return a is not None and b is not None and a == b


def unsqueeze_axes(node: ir.Node) -> list[int] | None:
    axes = attr_ints(node, "axes")
    if axes is None and len(node.inputs) > 1:
        arr = const_array(node.inputs[1])
        axes = None if arr is None else [int(a) for a in arr.reshape(-1)]
    return axes


# Shape arithmetic, symbolically: a dim is an int, ("dim", id(x), i) for dim i of tensor x,
# or ("mul", dim, k). Enough to prove what TorchScript's shape subgraphs compute
# (Concat of Unsqueeze(Gather(Shape(x), i)), times a constant).


def dim_terms(x: ir.Value) -> list | None:
    shape = value_shape(x)
    if shape is None:
        return None
    return [d if isinstance(d, int) else ("dim", id(x), i) for i, d in enumerate(shape)]


def sym_vec(value: ir.Value, depth: int = 12) -> list | None:
    """A 1-D int64 shape tensor as a list of dim terms, or None."""
    arr = const_array(value)
    if arr is not None:
        return [int(d) for d in arr.reshape(-1)] if arr.ndim == 1 else None
    node = producer(value)
    if node is None or depth == 0:
        return None
    op = node.op_type
    if op == "Shape":
        dims = dim_terms(node.inputs[0])
        if dims is None:
            return None
        return dims[attr_int(node, "start", 0) : attr_int(node, "end", None)]
    if op == "Concat":
        out = []
        for v in node.inputs:
            part = sym_vec(v, depth - 1)
            if part is None:
                return None
            out += part
        return out
    if op == "Unsqueeze":
        term = sym_scalar(node.inputs[0], depth - 1)
        return None if term is None else [term]
    if op in ("Cast", "Identity") or (op == "Reshape" and (const_array(node.inputs[1]) is not None)
                                      and const_array(node.inputs[1]).tolist() == [-1]):
        return sym_vec(node.inputs[0], depth - 1)
    if op == "Where":
        # where(s == -1, ones, s) is s when no dim of s can be -1 (dims are >= 0)
        cond, _, s = node.inputs
        eq = producer(cond, "Equal")
        vec = sym_vec(s, depth - 1)
        if eq is None or vec is None or s not in eq.inputs or -1 in vec:
            return None
        other = eq.inputs[1] if eq.inputs[0] is s else eq.inputs[0]
        arr = const_array(other)
        return vec if arr is not None and np.all(arr == -1) else None
    return None


def sym_scalar(value: ir.Value, depth: int = 12):
    arr = const_array(value)
    if arr is not None:
        return int(arr.reshape(-1)[0]) if arr.size == 1 else None
    node = producer(value)
    if node is None or depth == 0:
        return None
    if node.op_type == "Gather":
        vec, idx = sym_vec(node.inputs[0], depth - 1), const_array(node.inputs[1])
        if vec is None or idx is None or idx.ndim != 0 or attr_int(node, "axis", 0) != 0:
            return None
        return vec[int(idx)]
    if node.op_type == "Mul":
        a, b = sym_scalar(node.inputs[0], depth - 1), sym_scalar(node.inputs[1], depth - 1)
        if isinstance(a, int) and isinstance(b, int):
            return a * b
        if isinstance(b, int) and a is not None:
            return ("mul", a, b)
        if isinstance(a, int) and b is not None:
            return ("mul", b, a)
        return None
    if node.op_type in ("Cast", "Identity", "Squeeze"):
        return sym_scalar(node.inputs[0], depth - 1)
    return None
