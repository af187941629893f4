"""A causal mask filled before a causal bias added after it, both read as one causal proof
(fusion/softmax_write._with_bias_after): GPT-Neo's own causal buffer (a Where, filled with
float32's lowest) and Hugging Face's [B, 1, S, S] causal + padding mask added after it. Where
both have one frontier the block becomes is_causal with the bias's [B, 1, 1, S] padding part and
the fill -inf (the two fills' sum, which float32 rounds to -inf); where their frontiers differ
(GPT-Neo's local layer: a window in the buffer, none in Hugging Face's mask) the bias stays whole,
since a row whose every visible key is padded sees other keys in the graph. By hand: the same
form with fills that do not absorb the scores, and with a window in the bias only, is not read as
one block, and every case computes what the graph does. With a KV cache (GPT-Neo's buffer rows
sliced from the cache's length): the rows read as i + past where the key Slice bounds their end,
and refused where nothing does."""

from __future__ import annotations

import math
import os

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from attention_graphs import Nodes
from onnx import TensorProto
from onnx import helper as h

import ortflash
from ortflash.op import spec
from ortflash.op.node import is_placeholder

ZOO = os.path.join(os.path.dirname(__file__), "..", "models")
NAMES = ["gpt_neo_eager_torchscript", "gpt_neo_eager_dynamo"]


def _flash_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == spec.OP_TYPE]


def _operand_dims(model: onnx.ModelProto, index: int, name: str) -> list | None:
    """The dims ortflash's shape reading proves for input ``name`` (bias, mask) of the model's
    index-th FlashAttention node (None: not fed, or a placeholder)."""
    graph = ir.from_proto(onnx.shape_inference.infer_shapes(model)).graph
    node = [n for n in graph if n.op_type == spec.OP_TYPE][index]
    at = spec.INPUTS.index(name)
    value = node.inputs[at] if len(node.inputs) > at else None
    if value is None or is_placeholder(value):
        return None
    assert value.shape is not None, f"no shape inferred for {value.name}"
    return [d if isinstance(d, int) else str(d) for d in value.shape]


def _feeds(seq: int) -> dict[str, np.ndarray]:
    """Three rows: left padding, every key but the last padded (every visible key of the first
    rows padded: the case two fills would tell apart), right padding."""
    rng = np.random.default_rng(seq)
    mask = np.ones((3, seq), np.int64)
    mask[0, :3] = 0
    mask[1, : seq - 1] = 0
    mask[2, seq // 4 :] = 0  # past the window (8 keys) from seq 12: rows whose window is all padding
    return {"input_ids": rng.integers(0, 100, (3, seq)).astype(np.int64), "attention_mask": mask}


@pytest.mark.parametrize("name", NAMES)
def test_gpt_neo_global_layer_takes_the_padding_part_and_the_local_one_keeps_its_bias(name):
    model = onnx.load(os.path.join(ZOO, f"{name}.onnx"))
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    nodes = _flash_nodes(fused)
    assert len(nodes) == 2, [b.reason for b in report.blocks]
    attrs = [{a.name: h.get_attribute_value(a) for a in n.attribute} for n in nodes]
    # the global layer: one causal proof for both tensors, fill -inf, the padding part as its bias
    assert int(attrs[0]["is_causal"]) == 1 and int(attrs[0].get("window_left", -1)) == -1
    assert attrs[0]["mask_fill"] == -math.inf
    assert _operand_dims(fused, 0, "mask") is None, "the causal buffer's mask is not fed"
    global_bias = _operand_dims(fused, 0, "bias")
    assert global_bias is not None and global_bias[2] == 1, global_bias
    # the local layer: the window from the buffer; Hugging Face's mask (no window) stays whole
    assert int(attrs[1]["is_causal"]) == 1 and int(attrs[1]["window_left"]) == 7
    assert attrs[1]["mask_fill"] == float(np.finfo(np.float32).min)
    local_bias = _operand_dims(fused, 1, "bias")
    assert local_bias is not None and local_bias[2] != 1, local_bias
    assert "causal (is_causal=1, proved from the mask subgraph)" in report.blocks[0].reason
    assert "bias [" not in report.blocks[0].mask and "bias [" in report.blocks[1].mask

    original = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seq in (5, 20):
        f = _feeds(seq)
        want = original.run(None, f)
        for mode in ("naive", "online"):
            got = ortflash.InferenceSession(fused, softmax=mode, block_size=4).run(None, f)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def _cache_feeds(batch: int, seq: int, past: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A step of the cached export: seq new tokens against past cached ones, the first row left
    padded over every cached key and the first new one (rows that see only padding at a prefill),
    the second right padded over its last new token where there are several."""
    mask = np.ones((batch, past + seq), np.int64)
    mask[0, : past + 1] = 0
    if seq > 1:
        mask[1, -1] = 0
    f = {"input_ids": rng.integers(0, 100, (batch, seq)).astype(np.int64), "attention_mask": mask}
    for i in range(2):
        for kv in ("key", "value"):
            f[f"past_key_values.{i}.{kv}"] = rng.standard_normal((batch, 2, past, 32)).astype(np.float32)
    return f


CACHED = os.path.join(os.path.dirname(__file__), "data", "outside", "gpt_neo_cache_eager_torchscript.onnx")


def _assert_steps_match(model: onnx.ModelProto, fused: onnx.ModelProto) -> None:
    """A prefill and one-token steps, up to the buffer's last row (past + seq = 127 of 128)."""
    original = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    session = ortflash.InferenceSession(fused, softmax="naive")
    rng = np.random.default_rng(0)
    for seq, past in ((6, 0), (1, 5), (1, 12), (3, 9), (1, 126)):
        f = _cache_feeds(2, seq, past, rng)
        for g, w in zip(session.run(None, f), original.run(None, f)):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_gpt_neo_with_a_cache_reads_its_buffer_rows_from_the_cache_length():
    """With a KV cache the buffer's rows start at the cache's length: Slice(buffer, past, past +
    seq) on its 128 rows, then Slice(.., 0, past + seq) on its 128 keys. The rows are read as i +
    past, exact where past + seq <= 128, which the key Slice gives wherever the graph runs (a
    longer one is cut to 128 keys and fails to broadcast with the scores): is_causal 2 (bottom
    right), and the global layer reads Hugging Face's mask with it, as without a cache."""
    model = onnx.load(CACHED)
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    attrs = [{a.name: h.get_attribute_value(a) for a in n.attribute} for n in _flash_nodes(fused)]
    assert [(int(a["is_causal"]), int(a.get("window_left", -1))) for a in attrs] == [(2, -1), (2, 7)], [
        b.reason for b in report.blocks
    ]
    assert attrs[0]["mask_fill"] == -math.inf
    global_bias, local_bias = (_operand_dims(fused, i, "bias") for i in range(2))
    assert global_bias is not None and global_bias[2] == 1, global_bias
    assert local_bias is not None and local_bias[2] != 1, local_bias  # the window: the bias stays whole
    _assert_steps_match(model, fused)


def test_a_computed_row_start_is_refused_where_no_key_slice_bounds_its_end():
    """The same export with the key Slice's end read from attention_mask's length (equal at run
    time, not proved the rows' end past + seq): nothing bounds past + seq by the buffer's rows, so
    the rows are not read and both blocks keep their buffer mask, saying why."""
    model = onnx.load(CACHED)
    graph = model.graph
    slices = {n.output[0]: n for n in graph.node if n.op_type == "Slice"}
    keys = [n for n in slices.values() if n.input[0] in slices]  # the key Slice of each row Slice
    assert len(keys) == 2
    graph.node.insert(0, h.make_node("Shape", ["attention_mask"], ["mask_length"], start=1, end=2))
    for n in keys:
        n.input[2] = "mask_length"
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    assert all("whose end" in b.reason and "not proved inside its 128 rows" in b.reason for b in report.blocks), [
        b.reason for b in report.blocks
    ]
    assert all(_operand_dims(fused, i, "mask") is not None for i in range(2))
    _assert_steps_match(model, fused)


# ------------------------------------------------------------- hand-built: what is read and what is not

LOWEST = float(np.finfo(np.float32).min)
B, H, S, D = 2, 2, 11, 8


def _where_then_bias(mask_fill: float, bias_fill: float, bias_window: bool) -> onnx.ModelProto:
    """GPT-Neo's form by hand: scores Where(j <= i, s, mask_fill) (the buffer), then + Where(j <= i
    [and j > i - 4] and attention_mask[b, j], 0, bias_fill) (masking_utils' mask), Softmax, P·V."""
    g = Nodes()
    const, node = g.const, g.node
    length = node("Squeeze", [node("Shape", ["attention_mask"], "shape_m", start=1, end=2), const("ax0", [0])], "n")
    ar = node("Range", [const("zero", 0), length, const("one", 1)], "ar")
    kv = node("Unsqueeze", [ar, const("ax012", [0, 1, 2])], "kv")  # [1, 1, 1, S]: j
    qi = node("Unsqueeze", [ar, const("ax013", [0, 1, 3])], "qi")  # [1, 1, S, 1]: i
    causal = node("LessOrEqual", [kv, qi], "causal")
    seen = causal
    if bias_window:
        inside = node("Greater", [kv, node("Sub", [qi, const("four", 4)], "low")], "inside")
        seen = node("And", [causal, inside], "band")
    keep = node(
        "Unsqueeze", [node("Cast", ["attention_mask"], "keep", to=TensorProto.BOOL), const("ax12", [1, 2])], "pad"
    )
    visible = node("And", [seen, keep], "visible")
    bias = node("Where", [visible, const("zero_f", 0.0, np.float32), const("bias_fill", bias_fill, np.float32)], "bias")
    s = node("MatMul", ["q", node("Transpose", ["k"], "kt", perm=[0, 1, 3, 2])], "s")
    s = node("Where", [causal, s, const("mask_fill", mask_fill, np.float32)], "masked")
    s = node("Add", [s, bias], "biased")
    node("MatMul", [node("Softmax", [s], "p", axis=-1), "v"], "out")
    inputs = [h.make_tensor_value_info("attention_mask", TensorProto.INT64, ["B", "S"])]
    inputs += [h.make_tensor_value_info(x, TensorProto.FLOAT, ["B", H, "S", D]) for x in "qkv"]
    outputs = [h.make_tensor_value_info("out", TensorProto.FLOAT, None)]
    graph = h.make_graph(g.nodes, "where_then_bias", inputs, outputs, g.inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model


# (mask fill, bias fill, a window in the bias only) -> read as one causal block?
CASES = {
    "both_lowest": (LOWEST, LOWEST, False, True),
    # -10000 does not absorb the scores: right of the frontier the graph holds lowest - 10000 = lowest
    # (finite), not -inf, so the fills are not the op's -inf: the buffer alone is read
    "bias_fill_finite": (LOWEST, -10000.0, False, False),
    "mask_fill_finite": (-10000.0, LOWEST, False, False),
    # another frontier in the bias: its window's left keys are visible to the buffer
    "bias_window": (LOWEST, LOWEST, True, False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hand_built_where_then_bias_is_read_only_with_one_frontier_and_absorbing_fills(case):
    mask_fill, bias_fill, window, combined = CASES[case]
    model = _where_then_bias(mask_fill, bias_fill, window)
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    (node,) = _flash_nodes(fused)
    attrs = {a.name: h.get_attribute_value(a) for a in node.attribute}
    bias = _operand_dims(fused, 0, "bias")
    if combined:
        assert int(attrs["is_causal"]) == 1, report.blocks[0].reason
        assert attrs["mask_fill"] == -math.inf and bias is not None and bias[2] == 1, (attrs, bias)
    else:  # the bias stays whole (with the buffer proved causal alone, or, where the bias bounds
        # the scores and the op's own order is taken, with nothing proved: two query-dependent tensors)
        assert bias is not None and bias[2] != 1, (attrs, bias)
    rng = np.random.default_rng(7)
    mask = np.ones((B, S), np.int64)
    mask[0, :3] = 0  # left padding: rows 0..2 see only padded keys
    mask[1, 5:] = 0  # right padding: with a window, rows from 9 see only padding in it
    f = {"attention_mask": mask, **{x: rng.standard_normal((B, H, S, D)).astype(np.float32) for x in "qkv"}}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, f)[0]
    for mode in ("naive", "online"):
        got = ortflash.InferenceSession(fused, softmax=mode, block_size=4).run(None, f)[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
