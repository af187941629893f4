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


if __name__ == "__main__":
    attention23()
