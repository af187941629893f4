"""Hand-built attention subgraphs, one knob per pattern variant, for the rule tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
                m[..., -max(1, shape[-1] // 3) :] = False  # padded keys
            out[vi.name] = m
        else:
            np_dt = np.float16 if t.elem_type == F16 else np.float32
            x = rng.standard_normal(shape).astype(np_dt)
            if vi.name.startswith("bias") and pad:
                x[..., -max(1, shape[-1] // 4) :] = np.finfo(np_dt).min  # additive padding mask
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


# ---------------------------------------------------------------------------------------------
# Graph forms other fusion tools test (issue 16): broadcast operands, grouped-query repeats,
# Einsum, ranks that shape inference cannot see, decoder mask orders.


def tensor(name: str, dims: list, elem: int = F32) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, dims)


def initializer(name: str, value, dtype=np.int64) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.asarray(value, dtype), name)


class Nodes:
    """A graph under construction, named by the caller: ``const`` adds an initializer, ``node`` a
    node of one output; both return the output's name."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def const(self, name: str, value: object, dtype: type = np.int64) -> str:
        self.inits.append(initializer(name, value, dtype))
        return name

    def node(self, op: str, inputs: list[str], out: str, **attrs: object) -> str:
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out


def swap_for_zeros(lowered: onnx.ModelProto, op_type: str = "MultiHeadAttention") -> onnx.ModelProto:
    """lowered with its one op_type node replaced by Sub(q, q) (zeros of Q's shape, at opset 17): what
    a lowering writes around the native op, without the op's own numbers."""
    (node,) = [n for n in lowered.graph.node if n.op_type == op_type]
    q = node.input[0]
    node.CopyFrom(helper.make_node("Sub", [q, q], [node.output[0]], name=node.name))
    del lowered.opset_import[:]
    lowered.opset_import.extend([helper.make_opsetid("", 17)])
    return lowered


def attention_nodes(
    q: str, k: str, v: str, out: str = "out", bias: str | None = None, scale: float = 0.125, k_transposed: bool = False
) -> tuple[list, list]:
    """softmax(q @ kᵀ · scale + bias) @ v on 4D tensors: (nodes, initializers)."""
    nodes = [] if k_transposed else [helper.make_node("Transpose", [k], ["att_kt"], perm=[0, 1, 3, 2])]
    nodes += [
        helper.make_node("MatMul", [q, k if k_transposed else "att_kt"], ["att_s0"]),
        helper.make_node("Mul", ["att_s0", "att_scale"], ["att_s1"]),
    ]
    s = "att_s1"
    if bias is not None:
        nodes.append(helper.make_node("Add", [s, bias], ["att_s2"]))
        s = "att_s2"
    nodes += [helper.make_node("Softmax", [s], ["att_p"], axis=-1), helper.make_node("MatMul", ["att_p", v], [out])]
    return nodes, [initializer("att_scale", scale, np.float32)]


def model_of(nodes: list, inputs: list, inits: list, opset: int = 17, extra_domains: tuple = ()) -> onnx.ModelProto:
    """A model with output out (type and shape left to inference)."""
    graph = helper.make_graph(nodes, "breadth", inputs, [helper.make_tensor_value_info("out", F32, None)], inits)
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in extra_domains]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def broadcast_block(q: list, k: list, v: list, bias: list | None = None) -> onnx.ModelProto:
    """One block whose Q, K, V (and bias) dims are given: some broadcast over batch or heads."""
    inputs = [tensor("q", q), tensor("k", k), tensor("v", v)] + ([tensor("bias", bias)] if bias else [])
    nodes, inits = attention_nodes("q", "k", "v", bias="bias" if bias else None)
    return model_of(nodes, inputs, inits)


def projected_block(
    upstream: str = "LayerNormalization",
    opset: int = 16,
    heads: int = 2,
    head_dim: int = 16,
    causal_where: float | None = None,
    padding_bias: str = "",
) -> onnx.ModelProto:
    """x [B, S, H·D] → an op shape inference may not know → Q, K, V projections reshaped to
    [B, S, H, D] and transposed to [B, H, S, D] → attention. upstream: LayerNormalization (no
    schema below opset 17), SkipLayerNormalization or FastGelu (com.microsoft), or Identity.

    causal_where: Where(causal, scores, fill) with this fill, then (padding_bias: int64, bool or
    float) + a padding bias [B, 1, 1, S]: GPT-2's order."""
    width = heads * head_dim
    rng = np.random.default_rng(7)
    inputs = [tensor("x", ["B", "S", width])]
    inits = [
        initializer("gamma", np.ones(width), np.float32),
        initializer("beta", np.zeros(width), np.float32),
        initializer("split", [0, 0, heads, head_dim]),
    ]
    domains: tuple = ()
    if upstream == "LayerNormalization":
        nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["h"], axis=-1, epsilon=1e-5)]
    elif upstream == "SkipLayerNormalization":
        nodes = [helper.make_node("SkipLayerNormalization", ["x", "x", "gamma", "beta"], ["h"], domain="com.microsoft")]
        domains = ("com.microsoft",)
    elif upstream == "FastGelu":
        nodes = [helper.make_node("FastGelu", ["x"], ["h"], domain="com.microsoft")]
        domains = ("com.microsoft",)
    else:
        nodes = [helper.make_node(upstream, ["x"], ["h"])]
    for name in ("q", "k", "v"):
        inits.append(initializer(f"w_{name}", rng.standard_normal((width, width)) / 4, np.float32))
        nodes += [
            helper.make_node("MatMul", ["h", f"w_{name}"], [f"{name}_p"]),
            helper.make_node("Reshape", [f"{name}_p", "split"], [f"{name}_4"]),
            helper.make_node("Transpose", [f"{name}_4"], [name], perm=[0, 2, 1, 3]),
        ]
    nodes += [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s0"]),
        helper.make_node("Div", ["s0", "root_d"], ["s1"]),
    ]
    inits.append(initializer("root_d", np.sqrt(head_dim), np.float32))
    s = "s1"
    if causal_where is not None:
        inits.append(initializer("fill", causal_where, np.float32))
        nodes += [
            helper.make_node("Shape", ["x"], ["x_s"], start=1, end=2),
            helper.make_node("Concat", ["x_s", "x_s"], ["ss"], axis=0),
            helper.make_node("ConstantOfShape", ["ss"], ["ones_ss"], value=helper.make_tensor("o", F32, [1], [1.0])),
            helper.make_node("Trilu", ["ones_ss"], ["tril"], upper=0),
            helper.make_node("Cast", ["tril"], ["causal"], to=BOOL),
            helper.make_node("Where", ["causal", s, "fill"], ["s2"]),
        ]
        s = "s2"
    if padding_bias:
        # (1 - mask) · c as float: an int64 mask with c = lowest (unbounded: a mask value of 3
        # makes +inf), a bool mask with c = -10000 (bounded), or the bias itself as an input.
        inits += [
            initializer("ax12", [1, 2]),
            initializer("one", 1.0, np.float32),
            initializer("c", -1e4 if padding_bias == "bool" else np.finfo(np.float32).min, np.float32),
        ]
        if padding_bias == "float":
            inputs.append(tensor("bias_pad", ["B", 1, 1, "S"]))
            nodes.append(helper.make_node("Identity", ["bias_pad"], ["pad_bias"]))
        else:
            elem = BOOL if padding_bias == "bool" else TensorProto.INT64
            inputs.append(tensor("attention_mask", ["B", "S"], elem))
            nodes += [
                helper.make_node("Unsqueeze", ["attention_mask", "ax12"], ["m4"]),
                helper.make_node("Cast", ["m4"], ["m4f"], to=F32),
                helper.make_node("Sub", ["one", "m4f"], ["inv"]),
                helper.make_node("Mul", ["inv", "c"], ["pad_bias"]),
            ]
        nodes.append(helper.make_node("Add", [s, "pad_bias"], ["s3"]))
        s = "s3"
    nodes += [
        helper.make_node("Softmax", [s], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["o4"]),
        helper.make_node("Transpose", ["o4"], ["o_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["o_t", "merge"], ["out"]),
    ]
    inits.append(initializer("merge", [0, 0, width]))
    return model_of(nodes, inputs, inits, opset=opset, extra_domains=domains)


GQA_FORMS = (
    "expand_const",
    "expand_computed",
    "tile_5d",
    "concat_5d",
    "gather_interleave",
    "mqa_expand",
    "mqa_tile",
    "mqa_concat",
    "tile_4d_kept",
)


def gqa_form_block(form: str, heads: int = 4, head_dim: int = 8) -> onnx.ModelProto:
    """K and V [B, Hkv, T, D] repeated to Hq heads in one of GQA_FORMS, then attention.
    mqa_* forms have one kv head; tile_4d_kept tiles two heads as (0, 1, 0, 1): not the op's
    grouping, so the repeat must stay."""
    kv_heads = 1 if form.startswith("mqa") else 2
    g = heads // kv_heads
    inputs = [
        tensor("q", ["B", heads, "S", head_dim]),
        tensor("k", ["B", kv_heads, "T", head_dim]),
        tensor("v", ["B", kv_heads, "T", head_dim]),
    ]
    inits = [
        initializer("ax2", [2]),
        initializer("rep5", [1, 1, g, 1, 1]),
        initializer("rep4", [1, g, 1, 1]),
        initializer("merged", [0, heads, -1, head_dim]),
        initializer("g", [g]),
        initializer("s01", [0, 2]),
        initializer("idx", np.arange(heads) // g),
        initializer("wide", [1, heads, 1, 1]),
    ]
    nodes = []
    for x in ("k", "v"):
        u5, out = f"{x}_u5", f"{x}_rep"
        if form in ("expand_const", "expand_computed", "tile_5d", "concat_5d"):
            nodes.append(helper.make_node("Unsqueeze", [x, "ax2"], [u5]))
        if form == "expand_const":
            nodes += [
                helper.make_node("Expand", [u5, "rep5"], [f"{x}_e"]),
                helper.make_node("Reshape", [f"{x}_e", "merged"], [out]),
            ]
        elif form == "expand_computed":
            # shapes from Shape(x) at run time: [B, Hkv, G, T, D] and [B, Hkv·G, T, D]
            nodes += [
                helper.make_node("Shape", [x], [f"{x}_bh"], end=2),
                helper.make_node("Shape", [x], [f"{x}_td"], start=2),
                helper.make_node("Concat", [f"{x}_bh", "g", f"{x}_td"], [f"{x}_shape5"], axis=0),
                helper.make_node("Expand", [u5, f"{x}_shape5"], [f"{x}_e"]),
                helper.make_node("Shape", [x], [f"{x}_b"], end=1),
                helper.make_node("Shape", [x], [f"{x}_h"], start=1, end=2),
                helper.make_node("Mul", [f"{x}_h", "g"], [f"{x}_hg"]),
                helper.make_node("Concat", [f"{x}_b", f"{x}_hg", f"{x}_td"], [f"{x}_shape4"], axis=0),
                helper.make_node("Reshape", [f"{x}_e", f"{x}_shape4"], [out]),
            ]
        elif form == "tile_5d":
            nodes += [
                helper.make_node("Tile", [u5, "rep5"], [f"{x}_e"]),
                helper.make_node("Reshape", [f"{x}_e", "merged"], [out]),
            ]
        elif form == "concat_5d":
            nodes += [
                helper.make_node("Concat", [u5] * g, [f"{x}_e"], axis=2),
                helper.make_node("Reshape", [f"{x}_e", "merged"], [out]),
            ]
        elif form == "gather_interleave":
            nodes.append(helper.make_node("Gather", [x, "idx"], [out], axis=1))
        elif form == "mqa_expand":
            nodes.append(helper.make_node("Expand", [x, "wide"], [out]))
        elif form in ("mqa_tile", "tile_4d_kept"):
            nodes.append(helper.make_node("Tile", [x, "rep4"], [out]))
        elif form == "mqa_concat":
            nodes.append(helper.make_node("Concat", [x] * g, [out], axis=1))
    att, att_inits = attention_nodes("q", "k_rep", "v_rep")
    return model_of(nodes + att, inputs, inits + att_inits)


EINSUM_FORMS = {  # name -> (Q·Kᵀ equation, K's dims, P·V equation, V's dims)
    "bhqd_bhkd": ("bhqd,bhkd->bhqk", ["B", 2, "T", 8], "bhqk,bhkd->bhqd", ["B", 2, "T", 8]),
    "k_pretransposed": ("bhqd,bhdk->bhqk", ["B", 2, 8, "T"], "bhqk,bhkd->bhqd", ["B", 2, "T", 8]),
    "kv_bshd": ("bhqd,bkhd->bhqk", ["B", "T", 2, 8], "bhqk,bkhd->bhqd", ["B", "T", 2, 8]),
    "other_letters": ("nhid,nhjd->nhij", ["B", 2, "T", 8], "nhij,nhjf->nhif", ["B", 2, "T", 8]),
    "rank3": ("bqd,bkd->bqk", ["B", "T", 8], "bqk,bkd->bqd", ["B", "T", 8]),
}


def einsum_block(form: str) -> onnx.ModelProto:
    """Attention with Einsum for both products (tf2onnx style), scaled by Mul."""
    qk_eq, k_dims, pv_eq, v_dims = EINSUM_FORMS[form]
    q_dims = ["B", "S", 8] if len(k_dims) == 3 else ["B", 2, "S", 8]
    inputs = [tensor("q", q_dims), tensor("k", k_dims), tensor("v", v_dims)]
    nodes = [
        helper.make_node("Einsum", ["q", "k"], ["s0"], equation=qk_eq),
        helper.make_node("Mul", ["s0", "scale"], ["s1"]),
        helper.make_node("Softmax", ["s1"], ["p"], axis=-1),
        helper.make_node("Einsum", ["p", "v"], ["out"], equation=pv_eq),
    ]
    return model_of(nodes, inputs, [initializer("scale", 0.35, np.float32)])


def scale_from_shape_block(head_dim: int = 8, gather: bool = False) -> onnx.ModelProto:
    """SDPA as torch decomposes it: Q and Kᵀ each multiplied by sqrt(1/sqrt(D)), D read at run
    time from Shape(q) (by Slice, or by Gather with gather=True), B and S symbolic."""
    inputs = [
        tensor("q", ["B", 2, "S", head_dim]),
        tensor("k", ["B", 2, "T", head_dim]),
        tensor("v", ["B", 2, "T", head_dim]),
    ]
    inits = [
        initializer("last", [-1]),
        initializer("end", [np.iinfo(np.int64).max]),
        initializer("one", 1.0, np.float32),
        initializer("idx", 3),
    ]
    pick = (
        helper.make_node("Gather", ["q_shape", "idx"], ["d"], axis=0)
        if gather
        else helper.make_node("Slice", ["q_shape", "last", "end"], ["d"])
    )
    nodes = [
        helper.make_node("Shape", ["q"], ["q_shape"]),
        pick,
        helper.make_node("Cast", ["d"], ["d_f"], to=F32),
        helper.make_node("Sqrt", ["d_f"], ["root"]),
        helper.make_node("Div", ["one", "root"], ["inv"]),
        helper.make_node("Sqrt", ["inv"], ["half_scale"]),
        helper.make_node("Mul", ["q", "half_scale"], ["q_s"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("Mul", ["kt", "half_scale"], ["kt_s"]),
        helper.make_node("MatMul", ["q_s", "kt_s"], ["s0"]),
        helper.make_node("Softmax", ["s0"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["out"]),
    ]
    return model_of(nodes, inputs, inits)


KERAS_QK = "aecd,abcd->acbe"  # Keras MultiHeadAttention's dot product: Einsum(key, query)
KERAS_PV = "acbe,aecd->abcd"  # and its combine: the output [B, S, H, D], heads not moved first


def keras_einsum_block(
    qk_eq: str = KERAS_QK, pv_eq: str = KERAS_PV, key_first: bool = True, bias: bool = False
) -> onnx.ModelProto:
    """Keras MultiHeadAttention as tf2onnx writes it for 3D inputs: Q, K, V [B, S|T, H, D] (heads
    after the sequence), Q scaled by Mul, scores [B, H, S, T] from one Einsum, P·V by another whose
    output is [B, S, H, D]; bias: + a padding bias [B, 1, 1, T]."""
    inputs = [tensor("q", ["B", "S", 2, 8]), tensor("k", ["B", "T", 2, 8]), tensor("v", ["B", "T", 2, 8])]
    nodes = [
        helper.make_node("Mul", ["q", "scale"], ["q_s"]),
        helper.make_node("Einsum", ["k", "q_s"] if key_first else ["q_s", "k"], ["s0"], equation=qk_eq),
    ]
    scores = "s0"
    if bias:
        inputs.append(tensor("pad_bias", ["B", 1, 1, "T"]))
        nodes.append(helper.make_node("Add", ["s0", "pad_bias"], ["s1"]))
        scores = "s1"
    nodes += [
        helper.make_node("Softmax", [scores], ["p"], axis=-1),
        helper.make_node("Einsum", ["p", "v"], ["out"], equation=pv_eq),
    ]
    return model_of(nodes, inputs, [initializer("scale", 8**-0.5, np.float32)])


def batch_one_only(tmp_path: Any) -> tuple[str, str]:
    """A model whose Reshape fixes the batch at 1 (an export traced at batch 1), saved in tmp_path,
    and its fused model (--target ortflash) beside it: (path, fused path)."""
    import ortflash

    model = projected_block(upstream="Identity")
    split = next(i for i in model.graph.initializer if i.name == "split")
    split.CopyFrom(onnx.numpy_helper.from_array(np.array([1, 0, 2, 16], np.int64), "split"))
    path, fused = str(tmp_path / "b1.onnx"), str(tmp_path / "b1.flash.onnx")
    onnx.save(model, path)
    onnx.save(ortflash.optimize(path, target="ortflash")[0], fused)
    return path, fused
