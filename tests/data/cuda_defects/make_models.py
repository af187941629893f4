"""Writes the models of the reproductions beside it (onnx only): python make_models.py"""

from __future__ import annotations

import os

from onnx import TensorProto, helper, save_model

HERE = os.path.dirname(os.path.abspath(__file__))


def attention23(b: int = 2, h: int = 2, s: int = 37, d: int = 32) -> None:
    """One ONNX Attention (opset 23) node with a float attn_mask [B, 1, S, S], as
    ``ortflash optimize --target onnx`` writes causal decoders with padding."""
    vi = helper.make_tensor_value_info
    inputs = [vi(n, TensorProto.FLOAT, [b, h, s, d]) for n in "qkv"] + [vi("mask", TensorProto.FLOAT, [b, 1, s, s])]
    node = helper.make_node("Attention", ["q", "k", "v", "mask"], ["o"], scale=d**-0.5)
    graph = helper.make_graph([node], "attention23_lowest_rows", inputs, [vi("o", TensorProto.FLOAT, [b, h, s, d])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    save_model(model, os.path.join(HERE, "attention23_lowest_rows.onnx"))


def mha_causal_minimal(h: int = 16, s: int = 4096, d: int = 64) -> None:
    """com.microsoft.MultiHeadAttention, unidirectional=1, no bias, float16, on q, k, v [1, H, S, D]
    transposed and reshaped to [1, S, H·D]: the core of mha_causal_cudnn_rebuild.onnx (which is
    ``ortflash --target cuda``'s block as written: benchmarks/cuda_cudnn_cache.py make --groups causal)."""
    vi = helper.make_tensor_value_info
    shape = helper.make_tensor("bsd", TensorProto.INT64, [3], [0, 0, -1])
    nodes = []
    for n in "qkv":
        nodes.append(helper.make_node("Transpose", [n], [f"{n}_bshd"], perm=[0, 2, 1, 3]))
        nodes.append(helper.make_node("Reshape", [f"{n}_bshd", "bsd"], [f"{n}_bsd"]))
    nodes.append(
        helper.make_node(
            "MultiHeadAttention",
            ["q_bsd", "k_bsd", "v_bsd"],
            ["o"],
            domain="com.microsoft",
            num_heads=h,
            scale=d**-0.5,
            unidirectional=1,
        )
    )
    inputs = [vi(n, TensorProto.FLOAT16, [1, h, s, d]) for n in "qkv"]
    graph = helper.make_graph(
        nodes, "mha_causal_minimal", inputs, [vi("o", TensorProto.FLOAT16, [1, s, h * d])], [shape]
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10
    save_model(model, os.path.join(HERE, "mha_causal_minimal.onnx"))


if __name__ == "__main__":
    attention23()
    mha_causal_minimal()
