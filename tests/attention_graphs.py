"""Hand-built attention subgraphs, one knob per pattern variant, for the rule tests."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

F32, F16, BOOL = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BOOL


@dataclass
class Variant:
    scale: float = 0.125
    scale_site: str = "div_scores"  # div_scores | mul_scores | split_qk | q_only | none
    k_form: str = "transpose"  # transpose | pretransposed | bshd
    bias_shapes: tuple = ()  # each e.g. ("B", 1, 1, "S") of ints/"B"/"H"/"S"/"T"
    where_mask: str | None = None  # None | "keep" (True keeps) | "drop" (True masks out)
    mask_shape: tuple = ("B", 1, 1, "T")
    fill: float = -np.inf
    softmax_cast: bool = False  # float16 graph with the softmax in float32
    nan_guard: bool = False
    rank: int = 4
    softmax_axis: int = -1
    dtype: int = F32
    heads: int = 2
    head_dim: int = 32
    opset: int = 17


def build(v: Variant) -> onnx.ModelProto:
    """A model with inputs q, k, v (+ bias_i, mask) and output out."""
    nodes, inits = [], []
    dt = v.dtype
    qk_dims = ["B", v.heads, "S", v.head_dim] if v.rank == 4 else ["BH", "S", v.head_dim]
    k_dims = ["B", v.heads, "T", v.head_dim] if v.rank == 4 else ["BH", "T", v.head_dim]
    if v.k_form == "pretransposed":
        k_dims = k_dims[:-2] + [v.head_dim, "T"]
    elif v.k_form == "bshd":
        k_dims = ["B", "T", v.heads, v.head_dim]
    v_dims = ["B", v.heads, "T", v.head_dim] if v.rank == 4 else ["BH", "T", v.head_dim]
    inputs = [
        helper.make_tensor_value_info("q", dt, qk_dims),
        helper.make_tensor_value_info("k", dt, k_dims),
        helper.make_tensor_value_info("v", dt, v_dims),
    ]
    np_dt = np.float16 if dt == F16 else np.float32

    def const(name, value, dtype=np_dt):
        inits.append(onnx.numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    q, k = "q", "k"
    if v.scale_site == "split_qk":
        root = float(np.sqrt(v.scale))
        nodes.append(helper.make_node("Mul", [q, const("sq", root)], ["q_s"]))
        q = "q_s"
    if v.scale_site == "q_only":
        nodes.append(helper.make_node("Mul", [q, const("sq", v.scale)], ["q_s"]))
        q = "q_s"
    swap = [0, 1, 3, 2] if v.rank == 4 else [0, 2, 1]
    if v.k_form == "transpose":
        nodes.append(helper.make_node("Transpose", [k], ["kt"], perm=swap))
    elif v.k_form == "bshd":
        nodes.append(helper.make_node("Transpose", [k], ["kt"], perm=[0, 2, 3, 1]))
    else:
        nodes.append(helper.make_node("Identity", [k], ["kt"]))
    kt = "kt"
    if v.scale_site == "split_qk":
        nodes.append(helper.make_node("Mul", [kt, const("sk", float(np.sqrt(v.scale)))], ["kt_s"]))
        kt = "kt_s"
    nodes.append(helper.make_node("MatMul", [q, kt], ["s0"]))
    s = "s0"
    if v.scale_site == "div_scores":
        nodes.append(helper.make_node("Div", [s, const("d", 1.0 / v.scale)], ["s1"]))
        s = "s1"
    elif v.scale_site == "mul_scores":
        nodes.append(helper.make_node("Mul", [const("c", v.scale), s], ["s1"]))
        s = "s1"
    for i, shape in enumerate(v.bias_shapes):
        inputs.append(helper.make_tensor_value_info(f"bias{i}", dt, list(shape)))
        nodes.append(helper.make_node("Add", [s, f"bias{i}"] if i % 2 == 0 else [f"bias{i}", s], [f"sb{i}"]))
        s = f"sb{i}"
    if v.where_mask:
        inputs.append(helper.make_tensor_value_info("mask", BOOL, list(v.mask_shape)))
        fill = const("fill", v.fill)
        args = ["mask", s, fill] if v.where_mask == "keep" else ["mask", fill, s]
        nodes.append(helper.make_node("Where", args, ["sm"]))
        s = "sm"
    if v.softmax_cast:
        nodes.append(helper.make_node("Cast", [s], ["s32"], to=F32))
        s = "s32"
    nodes.append(helper.make_node("Softmax", [s], ["p"], axis=v.softmax_axis))
    p = "p"
    if v.nan_guard:
        nodes.append(helper.make_node("IsNaN", [p], ["isnan"]))
        zero = const("zero", 0.0, np.float32 if v.softmax_cast else np_dt)
        nodes.append(helper.make_node("Where", ["isnan", zero, p], ["pg"]))
        p = "pg"
    if v.softmax_cast:
        nodes.append(helper.make_node("Cast", [p], ["p16"], to=dt))
        p = "p16"
    nodes.append(helper.make_node("MatMul", [p, "v"], ["out"]))
    graph = helper.make_graph(nodes, "attention", inputs, [helper.make_tensor_value_info("out", dt, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", v.opset)])
    model.ir_version = 8
    return model


def feeds(model: onnx.ModelProto, dims: dict, rng: np.random.Generator, pad: bool = True) -> dict:
    """Random inputs: dims maps symbolic names to sizes; masks pad the tail of batch item 0."""
    out = {}
    for vi in model.graph.input:
        t = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else dims[d.dim_param] for d in t.shape.dim]
        if t.elem_type == BOOL:
            m = rng.random(shape) > 0.2
            if pad and len(shape) >= 1:
                m[..., -max(1, shape[-1] // 3):] = False  # padded keys
            out[vi.name] = m
        else:
            np_dt = np.float16 if t.elem_type == F16 else np.float32
            x = rng.standard_normal(shape).astype(np_dt)
            if vi.name.startswith("bias") and pad:
                x[..., -max(1, shape[-1] // 4):] = np.finfo(np_dt).min  # additive padding mask
            out[vi.name] = x
    return out


def build_gqa(heads=4, kv_heads=2, head_dim=32, static=False, opset=17) -> onnx.ModelProto:
    """Llama-style grouped-query attention: K and V repeated by Unsqueeze → Expand → Reshape."""
    g = heads // kv_heads
    b, s, t = (2, 9, 11) if static else ("B", "S", "T")
    inputs = [
        helper.make_tensor_value_info("q", F32, [b, heads, s, head_dim]),
        helper.make_tensor_value_info("k", F32, [b, kv_heads, t, head_dim]),
        helper.make_tensor_value_info("v", F32, [b, kv_heads, t, head_dim]),
    ]
    inits = [
        onnx.numpy_helper.from_array(np.array([2], np.int64), "ax2"),
        onnx.numpy_helper.from_array(np.array([1, 1, g, 1, 1], np.int64), "rep"),
        onnx.numpy_helper.from_array(np.array([0, heads, -1, head_dim], np.int64), "merged"),
        onnx.numpy_helper.from_array(np.array(head_dim**-0.5, np.float32), "scale"),
    ]
    nodes = []
    for x in ("k", "v"):
        nodes += [
            helper.make_node("Unsqueeze", [x, "ax2"], [f"{x}5"]),
            helper.make_node("Expand", [f"{x}5", "rep"], [f"{x}e"]),
            helper.make_node("Reshape", [f"{x}e", "merged"], [f"{x}r"]),
        ]
    nodes += [
        helper.make_node("Transpose", ["kr"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s0"]),
        helper.make_node("Mul", ["s0", "scale"], ["s1"]),
        helper.make_node("Softmax", ["s1"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "vr"], ["out"]),
    ]
    graph = helper.make_graph(nodes, "gqa", inputs, [helper.make_tensor_value_info("out", F32, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def tamper_scale(model: onnx.ModelProto, factor: float) -> onnx.ModelProto:
    """Tamper with a fused model: multiply the first FlashAttention node's scale (a check must fail)."""
    node = next(n for n in model.graph.node if n.op_type == "FlashAttention")
    for a in node.attribute:
        if a.name == "scale":
            a.f *= factor
    return model
