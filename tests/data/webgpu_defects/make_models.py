"""Writes the tiny .onnx files beside it (needs onnx). The committed files are its output."""

from __future__ import annotations

import os

import onnx
from onnx import TensorProto, helper

HERE = os.path.dirname(os.path.abspath(__file__))
F = TensorProto.FLOAT
vi = helper.make_tensor_value_info


def save(
    name: str, nodes: list, inputs: list, outputs: list, opsets: dict[str, int], inits: list | None = None
) -> None:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=inits or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    model.ir_version = 10
    onnx.checker.check_model(model)
    onnx.save_model(model, os.path.join(HERE, f"{name}.onnx"))


def main() -> None:
    ms = {"": 21, "com.microsoft": 1}
    # 1. MatMul -> Softmax -> MatMul at S=8192, 16 heads: a 4 GiB float32 score tensor
    shape = [1, 16, 8192, 64]
    save(
        "unfused_s8192",
        [
            helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", ["q", "kt"], ["qk"]),
            helper.make_node("Mul", ["qk", "scale"], ["s"]),
            helper.make_node("Softmax", ["s"], ["p"], axis=-1),
            helper.make_node("MatMul", ["p", "v"], ["o"]),
        ],
        [vi(n, F, shape) for n in "qkv"],
        [vi("o", F, shape)],
        {"": 21},
        [helper.make_tensor("scale", F, [], [0.125])],
    )
    # 2. Softmax of a row that is -inf everywhere (CPU EP: NaN)
    save(
        "softmax_neginf_row",
        [helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
        [vi("x", F, [4, 8])],
        [vi("y", F, [4, 8])],
        {"": 21},
    )
    # 3. MultiHeadAttention, attention_bias with a row of -inf (CPU EP: NaN)
    mha_in = [vi("q", F, [1, 8, 64]), vi("k", F, [1, 8, 64]), vi("v", F, [1, 8, 64]), vi("bias", F, [1, 1, 8, 8])]
    # (at the capability probe's size: with 8 positions the EP gives NaN like the CPU)
    save(
        "mha_bias_neginf_row",
        [
            helper.make_node(
                "MultiHeadAttention",
                ["q", "k", "v", "", "", "bias"],
                ["o"],
                domain="com.microsoft",
                num_heads=4,
                scale=0.125,
            )
        ],
        [vi("q", F, [2, 96, 256]), vi("k", F, [2, 96, 256]), vi("v", F, [2, 96, 256]), vi("bias", F, [2, 1, 96, 96])],
        [vi("o", F, [2, 96, 256])],
        ms,
    )
    # 4. GroupQueryAttention (causal, no past) with an attention_bias that masks every key of some rows
    save(
        "gqa_bias_masked_rows",
        [
            helper.make_node(
                "GroupQueryAttention",
                ["q", "k", "v", "", "", "seqlens_k", "total", "", "", "", "bias"],
                ["o", "present_k", "present_v"],
                domain="com.microsoft",
                num_heads=2,
                kv_num_heads=2,
                scale=0.125,
            )
        ],
        mha_in[:3] + [vi("seqlens_k", TensorProto.INT32, [1]), vi("total", TensorProto.INT32, []), mha_in[3]],
        [vi("o", F, [1, 8, 64])],
        ms,
    )
    # 5. MultiHeadAttention with key_padding_mask (refused by the WebGPU EP at run time)
    save(
        "mha_key_padding_mask",
        [
            helper.make_node(
                "MultiHeadAttention",
                ["q", "k", "v", "", "kpm"],
                ["o"],
                domain="com.microsoft",
                num_heads=2,
                scale=0.125,
            )
        ],
        mha_in[:3] + [vi("kpm", TensorProto.INT32, [1, 8])],
        [vi("o", F, [1, 8, 64])],
        ms,
    )
    # 6. MultiHeadAttention, causal + left padding in attention_bias (float32-lowest), the zoo's GPT-2 case
    save(
        "mha_causal_leftpad",
        [
            helper.make_node(
                "MultiHeadAttention",
                ["q", "k", "v", "", "", "bias"],
                ["o"],
                domain="com.microsoft",
                num_heads=2,
                scale=0.125,
            )
        ],
        mha_in,
        [vi("o", F, [1, 8, 64])],
        ms,
    )
    # 7. ONNX Attention (opset 23): the WebGPU EP does not take it (CPU fallback)
    save(
        "attention23_cpu_fallback",
        [helper.make_node("Attention", ["q", "k", "v"], ["o"], q_num_heads=2, kv_num_heads=2)],
        [vi(n, F, [1, 8, 64]) for n in "qkv"],
        [vi("o", F, [1, 8, 64])],
        {"": 23},
    )


if __name__ == "__main__":
    main()
