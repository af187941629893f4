"""A causal mask filled before a causal bias added after it, both read as one causal proof
(fusion/softmax_write._with_bias_after): GPT-Neo's own causal buffer (a Where, filled with
float32's lowest) and Hugging Face's [B, 1, S, S] causal + padding mask added after it. Where
both have one frontier the block becomes is_causal with the bias's [B, 1, 1, S] padding part and
the fill -inf (the two fills' sum, which float32 rounds to -inf); where their frontiers differ
(GPT-Neo's local layer: a window in the buffer, none in Hugging Face's mask) the bias stays whole,
since a row whose every visible key is padded sees other keys in the graph."""

from __future__ import annotations

import math
import os

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
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
    padded over every cached key and the first new one (rows that see only padding at a prefill)."""
    mask = np.ones((batch, past + seq), np.int64)
    mask[0, : past + 1] = 0
    f = {"input_ids": rng.integers(0, 100, (batch, seq)).astype(np.int64), "attention_mask": mask}
    for i in range(2):
        for kv in ("key", "value"):
            f[f"past_key_values.{i}.{kv}"] = rng.standard_normal((batch, 2, past, 32)).astype(np.float32)
    return f


def test_gpt_neo_with_a_cache_keeps_its_buffer_mask_whole_and_computes_the_same():
    """With a KV cache the buffer's rows start at the cache's length (a Slice whose start is
    computed): the buffer is not proved causal, so nothing is read with it (the combined proof needs
    the buffer's), and both blocks keep their mask and bias. A prefill and one-token steps match."""
    path = os.path.join(os.path.dirname(__file__), "data", "outside", "gpt_neo_cache_eager_torchscript.onnx")
    model = onnx.load(path)
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    assert [b.fused for b in report.blocks] == [True, True]
    assert all("kept as a full mask: a Slice with starts or steps computed" in b.reason for b in report.blocks)
    assert all(_operand_dims(fused, i, "bias") is not None for i in range(2))
    original = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for seq, past in ((6, 0), (1, 5), (1, 12)):
        f = _cache_feeds(2, seq, past, rng)
        want = original.run(None, f)
        got = ortflash.InferenceSession(fused, softmax="naive").run(None, f)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
