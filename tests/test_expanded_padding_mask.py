"""A padding mask expanded over the queries (issue 30 item 3): a block's [B, 1, Sq, Sk] bias or
mask proved constant over the query axis is fed as its [B, 1, 1, Sk] part (fusion/causal/proof,
offset None), read as a 'padding' row; a tensor that varies over the queries stays a full bias
and the row says why."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from attention_graphs import Nodes
from onnx import TensorProto, helper

import ortflash
from ortflash.checks.feeds import make_feeds
from ortflash.checks.verify import verify
from ortflash.op import spec

ZOO = os.path.join(os.path.dirname(__file__), "..", "models")
LOWEST = float(np.finfo(np.float32).min)
B, H, S, D = 2, 2, 9, 8


def _flash(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == spec.OP_TYPE]


def _attrs(node: onnx.NodeProto) -> dict[str, object]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _block(bias: str) -> onnx.ModelProto:
    """One attention block whose [B, 1, S, S] bias is built from attention_mask [B, S]:
    expand: Where(mask, 0, lowest) Expanded over the queries; bounded: masking_utils' form, the
    padding and-ed with q_idx >= 0; by_query: expand plus 0.25 * i (varies over the queries)."""
    g = Nodes()
    const, node, nodes, inits = g.const, g.node, g.nodes, g.inits

    keep = node("Cast", ["attention_mask"], "keep", to=TensorProto.BOOL)
    pad = node("Unsqueeze", [keep, const("ax12", [1, 2])], "pad")  # [B, 1, 1, S]
    batch = node("Shape", ["attention_mask"], "batch", start=0, end=1)
    seq = node("Shape", ["attention_mask"], "seq", start=1, end=2)
    if bias == "bounded":
        length = node("Squeeze", [seq, const("ax0", [0])], "length")
        ar = node("Range", [const("zero", 0), length, const("one", 1)], "ar")
        qi = node("Unsqueeze", [ar, const("ax013", [0, 1, 3])], "qi")  # [1, 1, S, 1]: i
        pad = node("And", [node("GreaterOrEqual", [qi, "zero"], "q_ge_0"), pad], "pad_q")
    shape = node("Concat", [batch, const("one_1", [1]), seq, seq], "shape4", axis=0)
    where = node("Where", [pad, const("zero_f", 0.0, np.float32), const("fill", LOWEST, np.float32)], "where")
    full = node("Expand", [where, shape], "full")  # [B, 1, S, S]
    if bias == "by_query":
        length = node("Squeeze", [seq, const("ax0", [0])], "length")
        ar = node("Range", [const("zero", 0), length, const("one", 1)], "ar")
        qi = node("Unsqueeze", [ar, const("ax013", [0, 1, 3])], "qi")
        rows = node("Mul", [node("Cast", [qi], "qf", to=TensorProto.FLOAT), const("quarter", 0.25, np.float32)], "rows")
        full = node("Add", [full, rows], "full_rows")
    s = node("MatMul", ["q", node("Transpose", ["k"], "kt", perm=[0, 1, 3, 2])], "s")
    s = node("Mul", [s, const("scale", D**-0.5, np.float32)], "ss")
    p = node("Softmax", [node("Add", [s, full], "sb")], "p", axis=-1)
    node("MatMul", [p, "v"], "out")
    inputs = [helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["B", "S"])]
    inputs += [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["B", H, "S", D]) for x in "qkv"]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)]
    model = helper.make_model(
        helper.make_graph(nodes, "expanded", inputs, outputs, inits), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    return model


def _block_feeds(rng: np.random.Generator) -> dict[str, np.ndarray]:
    f = {"attention_mask": np.ones((B, S), np.int64)}
    f["attention_mask"][0, -3:] = 0  # right padding
    f["attention_mask"][1, :2] = 0  # left padding
    f.update({x: rng.standard_normal((B, H, S, D)).astype(np.float32) for x in "qkv"})
    return f


def _run(model: onnx.ModelProto, f: dict[str, np.ndarray]) -> np.ndarray:
    if _flash(model):
        return ortflash.InferenceSession(model).run(None, f)[0]
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, f)[0]


@pytest.mark.parametrize("bias", ["expand", "bounded"])
@pytest.mark.parametrize("softmax", ["naive", "online"])
def test_an_expanded_padding_bias_is_fed_as_its_key_row(bias: str, softmax: str) -> None:
    model = _block(bias)
    fused, report = ortflash.optimize(model, target="ortflash", softmax=softmax, block_size=4, min_seq_len=0)
    (row,) = report.blocks
    assert row.fused and row.mask_kind == "padding", (row.mask_kind, row.reason)
    assert row.mask == "padding ['B', 1, 1, 'S']"
    assert "constant over the queries" in row.reason
    (node,) = _flash(fused)
    assert _attrs(node).get("is_causal", 0) == 0
    # the square tensor is gone: nothing [B, 1, S, S] is computed any more
    assert not any(n.op_type == "Expand" for n in fused.graph.node)
    f = _block_feeds(np.random.default_rng(0))
    np.testing.assert_allclose(_run(fused, f), _run(model, f), rtol=1e-5, atol=1e-6)


def test_a_bias_that_varies_over_the_queries_stays_a_full_bias_and_says_why() -> None:
    # 0.25 * i reaches the term as a cast of the query index, no comparison: the proof sees it
    fused, report = ortflash.optimize(_block("by_query"), target="ortflash")
    (row,) = report.blocks
    assert row.fused and row.mask_kind == "bias"
    assert row.reason == "kept as a full bias: the mask depends on the query position"
    f = _block_feeds(np.random.default_rng(1))
    np.testing.assert_allclose(_run(fused, f), _run(_block("by_query"), f), rtol=1e-5, atol=1e-6)


def _zoo(name: str) -> onnx.ModelProto:
    return onnx.load(os.path.join(ZOO, f"{name}.onnx"))


def _padded_feeds(model: onnx.ModelProto, seq: int) -> dict[str, np.ndarray]:
    f = make_feeds(model, seq_len=seq, batch=2)
    mask = np.ones((2, seq), f["attention_mask"].dtype)
    mask[1, seq - 6 :] = 0  # item 1: six padded keys
    f["attention_mask"] = mask
    return f


@pytest.mark.parametrize(
    "name", ["bert_sdpa_dynamo", "bert_eager_dynamo", "bert_eager_torchscript", "bert_sdpa_torchscript"]
)
def test_zoo_bert_blocks_move_from_bias_to_padding_and_compute_the_same(name: str) -> None:
    model = _zoo(name)
    fused, report = ortflash.optimize(model, target="ortflash", softmax="online", block_size=8, min_seq_len=0)
    assert [b.mask_kind for b in report.blocks] == ["padding", "padding"], [b.reason for b in report.blocks]
    for node in _flash(fused):
        assert _attrs(node).get("is_causal", 0) == 0
    if "torchscript" in name:  # the Gather's batch, the embeddings', read as a prefix of the mask's
        assert all(row.mask.startswith("padding ['unk__5', 1, 1,") for row in report.blocks)
    diffs = verify(model, fused, _padded_feeds(model, 21))
    assert all(d.ok for d in diffs), [(d.name, d.max_abs) for d in diffs]
    assert max(d.max_abs for d in diffs) < 1e-4


def test_t5_position_bias_stays_a_bias_with_the_reason() -> None:
    _, report = ortflash.optimize(_zoo("t5_sdpa_dynamo"), target="ortflash")
    kinds = [b.mask_kind for b in report.blocks]
    # encoder self-attention (2) and decoder self-attention: the position bias varies over queries;
    # the cross-attention's bias is the encoder padding expanded over the decoder's queries
    assert kinds == ["bias", "bias", "bias", "padding"], kinds
    assert report.blocks[0].reason.startswith("kept as a full bias: the mask depends on the query position")


def test_vit_constant_bias_is_dropped() -> None:
    model = _zoo("vit_sdpa_dynamo")
    fused, report = ortflash.optimize(model, target="ortflash")
    assert [b.mask_kind for b in report.blocks] == ["none", "none"]
    assert all("neutral constant" in b.reason for b in report.blocks)
    assert spec.INPUTS[3:] == ("bias", "mask")
    scalars = {
        n.output[0]
        for n in fused.graph.node
        if n.op_type == "Constant" and not onnx.numpy_helper.to_array(n.attribute[0].t).shape
    }
    for node in _flash(fused):  # no bias, no mask: the op's scalar placeholders for absent inputs
        assert set(node.input[3:]) <= scalars, list(node.input)
    diffs = verify(model, fused, make_feeds(model, batch=2))
    assert all(d.ok for d in diffs)


def test_a_causal_bias_filled_with_float16_lowest_is_refused_with_the_reason() -> None:
    """Issue 33 item 18: s + -65504 is not -65504 (nor in float16 for |s| >= 16), and a row whose
    visible keys are all padded weighs its hidden keys by their scores: not exact, refused."""
    from test_causal_proof import _decoder

    _, report = ortflash.optimize(_decoder(fill=float(np.finfo(np.float16).min)), target="ortflash")
    assert [b.mask_kind for b in report.blocks] == ["bias", "bias"]
    assert all("-65504 (float16's lowest)" in b.reason and "no unpadded key" in b.reason for b in report.blocks)
