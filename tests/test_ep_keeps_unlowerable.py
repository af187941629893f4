"""--ep webgpu (the target chosen per execution provider) never leaves a FlashAttention node: a
block that neither webgpu nor contrib can lower (a softcapped one) keeps its original ops, as a
portable target asked for by name does (issue 31 item 0; gemma2's blocks came out
FlashAttention with exit 0, and the model did not load on the WebGPU EP)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from ortflash import optimize

B, H, S, D, CAP = 1, 2, 16, 8, 20.0


def _softcapped() -> onnx.ModelProto:
    """softmax(cap * tanh(q @ k^T / sqrt(D) / cap)) @ v, with static shapes."""
    f = TensorProto.FLOAT
    shape = [B, H, S, D]
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"]),
        helper.make_node("Mul", ["qk", "scale"], ["scaled"]),
        helper.make_node("Div", ["scaled", "cap"], ["capped"]),
        helper.make_node("Tanh", ["capped"], ["tanh"]),
        helper.make_node("Mul", ["tanh", "cap"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["out"]),
    ]
    inits = [
        helper.make_tensor("scale", f, [], [1.0 / np.sqrt(D)]),
        helper.make_tensor("cap", f, [], [CAP]),
    ]
    graph = helper.make_graph(
        nodes,
        "softcapped",
        [helper.make_tensor_value_info(n, f, shape) for n in ("q", "k", "v")],
        [helper.make_tensor_value_info("out", f, shape)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_ep_webgpu_keeps_the_ops_of_a_block_no_target_lowers() -> None:
    model = _softcapped()
    fused, report = optimize(model, target="ortflash")
    assert sum(n.op_type == "FlashAttention" for n in fused.graph.node) == 1  # it is a block ortflash fuses

    written, report = optimize(model, ep="webgpu", seq_lens=[S])
    assert [n.op_type for n in written.graph.node if n.domain not in ("", "ai.onnx")] == []
    assert sum(n.op_type == "Softmax" for n in written.graph.node) == 1
    assert report.blocks[0].fused is False and "softcap" in (report.blocks[0].reason or "")
    # it loads and runs in plain ONNX Runtime, with the original's values
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((B, H, S, D)).astype(np.float32) for n in ("q", "k", "v")}
    got = ort.InferenceSession(written.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_array_equal(got, want)
