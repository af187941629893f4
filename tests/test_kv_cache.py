"""The KV-cache append owned by the lowered node (issue 12): K = Concat(past, new) and V likewise,
read by a FlashAttention node and returned as present outputs, become the past/present of
GroupQueryAttention, MultiHeadAttention or Attention-23, where each computes the same; is_causal 2
(bottom-right) and bias_after_mask lower where exact."""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ortflash
from ortflash.checks.feeds import decoder_cases, make_feeds
from ortflash.checks.verify import verify
from ortflash.kernels import reference
from ortflash.lowering import lower
from ortflash.model_shapes import graphs_of
from ortflash.op import side_channel, spec

F32 = TensorProto.FLOAT
LOWEST = float(np.finfo(np.float32).min)
D = 16


def _flash_attrs(is_causal: int, mask_fill: float = -math.inf, bias_after_mask: int = 0) -> dict[str, Any]:
    attrs: dict[str, Any] = spec.validate(
        {"scale": 0.3, "is_causal": is_causal, "softmax": "naive", "mask_fill": mask_fill}
    )
    attrs["exact_floats"] = side_channel.SideChannel.of_attributes(attrs).encode()
    del attrs["bias_after_mask"]
    if bias_after_mask:
        attrs["bias_after_mask"] = 1
        attrs["exact_floats"] += ";bias_after_mask=1"
    return attrs


def cached_flash_model(
    hq: int, hkv: int, is_causal: int, bias: str = "none", mask_fill: float = -math.inf, bias_after_mask: int = 0
) -> onnx.ModelProto:
    """q [B, Hq, S, D], the cache append K = Concat(past_key, new_key, axis 2) (V likewise) feeding a
    FlashAttention node and the present outputs. bias: "none", "input" (a graph input
    [B, 1, S, P + S]) or "padding" (Where(keep [B, P + S], 0, lowest), bounded); a bool mask
    [B, 1, 1, P + S] comes with "padding"."""
    n = helper.make_node
    inputs = [helper.make_tensor_value_info("q", F32, ["B", hq, "S", D])]
    for kv in ("key", "value"):
        inputs.append(helper.make_tensor_value_info(f"past_{kv}", F32, ["B", hkv, "P", D]))
        inputs.append(helper.make_tensor_value_info(f"new_{kv}", F32, ["B", hkv, "S", D]))
    nodes = [n("Concat", [f"past_{kv}", f"new_{kv}"], [f"present_{kv}"], axis=2) for kv in ("key", "value")]
    inits = [onnx.numpy_helper.from_array(np.array(True), "no_mask")]
    bias_name, mask_name = "zero_bias", "no_mask"
    inits.append(onnx.numpy_helper.from_array(np.array(0.0, np.float32), "zero_bias"))
    if bias == "input":
        inputs.append(helper.make_tensor_value_info("bias", F32, ["B", 1, "S", "T"]))
        bias_name = "bias"
    elif bias == "padding":
        inputs.append(helper.make_tensor_value_info("keep", TensorProto.BOOL, ["B", "T"]))
        inits += [
            onnx.numpy_helper.from_array(np.array([1, 2], np.int64), "axes_12"),
            onnx.numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
            onnx.numpy_helper.from_array(np.array(LOWEST, np.float32), "lowest"),
        ]
        nodes += [
            n("Unsqueeze", ["keep", "axes_12"], ["keep4"]),
            n("Where", ["keep4", "zero", "lowest"], ["padding_bias"]),
        ]
        bias_name, mask_name = "padding_bias", "keep4"
    nodes.append(
        n(
            spec.OP_TYPE,
            ["q", "present_key", "present_value", bias_name, mask_name],
            ["attn"],
            domain=spec.DOMAIN,
            name="flash",
            **_flash_attrs(is_causal, mask_fill, bias_after_mask),
        )
    )
    outputs = [helper.make_tensor_value_info("attn", F32, None)]
    outputs += [helper.make_tensor_value_info(f"present_{kv}", F32, None) for kv in ("key", "value")]
    graph = helper.make_graph(nodes, "cached_flash", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(spec.DOMAIN, spec.DOMAIN_VERSION)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def _feeds(hq: int, hkv: int, batch: int, past: int, new: int, bias: str, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {"q": rng.standard_normal((batch, hq, new, D)).astype(np.float32)}
    for kv in ("key", "value"):
        feeds[f"past_{kv}"] = rng.standard_normal((batch, hkv, past, D)).astype(np.float32)
        feeds[f"new_{kv}"] = rng.standard_normal((batch, hkv, new, D)).astype(np.float32)
    total = past + new
    if bias == "input":
        feeds["bias"] = rng.standard_normal((batch, 1, new, total)).astype(np.float32)
        feeds["bias"][0, ..., : max(1, total // 3)] = LOWEST
    elif bias == "padding":
        keep = np.ones((batch, total), bool)
        keep[0, : max(1, total // 3)] = False  # left padding: the first keys of item 0
        feeds["keep"] = keep
    return feeds


def _expected(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    attrs = _reference_attrs(model)
    k = np.concatenate([feeds["past_key"], feeds["new_key"]], axis=2)
    v = np.concatenate([feeds["past_value"], feeds["new_value"]], axis=2)
    bias, mask = None, None
    if "bias" in feeds:
        bias = feeds["bias"]
    if "keep" in feeds:
        mask = feeds["keep"][:, None, None, :]
        bias = np.where(mask, np.float32(0.0), np.float32(LOWEST))
    return reference.flash_attention(feeds["q"], k, v, bias, mask, **attrs)


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in feeds.items() if k in names})


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for g in graphs_of(model.graph) for n in g.node]


def _check_lowered(model: onnx.ModelProto, target: str, op: str, shapes: list[tuple[int, int, int]], **kw: Any) -> str:
    lowered, notes = lower(model, target)
    assert [n.lowered for n in notes] == [True], notes
    assert notes[0].op.endswith(op), notes[0]
    assert "past_key/past_value in, present_key/present_value out" in notes[0].reason
    assert spec.OP_TYPE not in _ops(lowered)
    appends = [n for n in lowered.graph.node if n.op_type == "Concat" and "past_key" in n.input]
    assert not appends  # the append moved into the op
    for batch, past, new in shapes:
        feeds = _feeds(batch=batch, past=past, new=new, **kw)
        got, present_key, present_value = _run(lowered, feeds)
        np.testing.assert_allclose(got, _expected(model, feeds), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(present_key, np.concatenate([feeds["past_key"], feeds["new_key"]], 2))
        np.testing.assert_array_equal(present_value, np.concatenate([feeds["past_value"], feeds["new_value"]], 2))
    return notes[0].reason


# (batch, past, new): a prefill, decode steps, and a batch of one with several new tokens after a past
PREFILL_DECODE = [(2, 0, 4), (2, 5, 1), (1, 4, 3)]


@pytest.mark.parametrize("bias", ["none", "input", "padding"])
def test_grouped_query_blocks_lower_to_group_query_attention_with_past(bias: str) -> None:
    model = cached_flash_model(4, 2, is_causal=2, bias=bias, mask_fill=LOWEST if bias == "padding" else -math.inf)
    how = _check_lowered(model, "contrib", "GroupQueryAttention", PREFILL_DECODE, hq=4, hkv=2, bias=bias)
    assert ("causal=1 (bottom-right" in how) == (bias == "none"), how
    lowered, _ = lower(model, "contrib")
    gqa = next(n for n in lowered.graph.node if n.op_type == "GroupQueryAttention")
    assert [a.i for a in gqa.attribute if a.name == "causal"] == ([] if bias == "none" else [0])
    assert "MultiHeadAttention" not in _ops(lowered) and "Expand" not in [
        n.op_type for n in lowered.graph.node if n.output[0].startswith("ortflash") and "repeat" in n.name
    ]


def test_group_query_attention_refuses_a_batch_of_new_tokens_after_a_past() -> None:
    """The ONNX Runtime 1.31 limit the lowering note states: a failure, never a different result."""
    lowered, notes = lower(cached_flash_model(4, 2, is_causal=2), "contrib")
    assert "refuses a batch > 1 with several new tokens after a non-empty past" in notes[0].reason
    with pytest.raises(Exception, match="batch_size must be 1"):
        _run(lowered, _feeds(4, 2, batch=2, past=3, new=2, bias="none"))


@pytest.mark.parametrize("is_causal", [0, 1, 2])
def test_multi_head_blocks_lower_to_multi_head_attention_with_past(is_causal: int) -> None:
    model = cached_flash_model(2, 2, is_causal=is_causal, bias="input")
    shapes = PREFILL_DECODE + [(2, 4, 3)]
    how = _check_lowered(model, "contrib", "MultiHeadAttention", shapes, hq=2, hkv=2, bias="input")
    if is_causal:
        assert ("bottom-right" if is_causal == 2 else "top-left") in how


@pytest.mark.parametrize(
    ("hq", "hkv", "is_causal", "bias"), [(4, 2, 2, "none"), (4, 1, 2, "padding"), (2, 2, 1, "input")]
)
def test_attention_23_takes_the_cache(hq: int, hkv: int, is_causal: int, bias: str) -> None:
    model = cached_flash_model(
        hq, hkv, is_causal=is_causal, bias=bias, mask_fill=LOWEST if bias == "padding" else -math.inf
    )
    shapes = PREFILL_DECODE + [(2, 4, 3)]
    how = _check_lowered(model, "onnx", "Attention", shapes, hq=hq, hkv=hkv, bias=bias)
    assert ("bottom-right with a past" in how) == (bias == "none"), how


def test_bias_after_mask_lowers_where_the_fill_absorbs_a_bounded_bias() -> None:
    model = cached_flash_model(4, 2, is_causal=2, bias="padding", mask_fill=LOWEST, bias_after_mask=1)
    for target, op in (("contrib", "GroupQueryAttention"), ("onnx", "Attention")):
        how = _check_lowered(model, target, op, PREFILL_DECODE, hq=4, hkv=2, bias="padding")
        assert "bias added after the mask fills" in how


def test_bias_after_mask_with_an_unbounded_bias_stays_flash_attention() -> None:
    model = cached_flash_model(4, 2, is_causal=2, bias="input", mask_fill=LOWEST, bias_after_mask=1)
    for target in ("contrib", "onnx"):
        lowered, notes = lower(model, target)
        assert [n.lowered for n in notes] == [False]
        assert "bias_after_mask with mask_fill" in notes[0].reason and "no bound" in notes[0].reason
        assert lowered is model


def _flash_no_cache(is_causal: int, sq: int, sk: int) -> onnx.ModelProto:
    """One FlashAttention node reading graph inputs: K and V are no cache append."""
    inputs = [
        helper.make_tensor_value_info("q", F32, [2, 2, sq, D]),
        helper.make_tensor_value_info("k", F32, [2, 2, sk, D]),
        helper.make_tensor_value_info("v", F32, [2, 2, sk, D]),
    ]
    inits = [
        onnx.numpy_helper.from_array(np.array(0.0, np.float32), "zero_bias"),
        onnx.numpy_helper.from_array(np.array(True), "no_mask"),
    ]
    node = helper.make_node(
        spec.OP_TYPE, ["q", "k", "v", "zero_bias", "no_mask"], ["attn"], domain=spec.DOMAIN, **_flash_attrs(is_causal)
    )
    graph = helper.make_graph([node], "flash", inputs, [helper.make_tensor_value_info("attn", F32, None)], inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(spec.DOMAIN, spec.DOMAIN_VERSION)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


@pytest.mark.parametrize("target", ["contrib", "onnx"])
@pytest.mark.parametrize(("sq", "sk"), [(3, 7), (7, 3), (5, 5)])
def test_bottom_right_causal_without_a_cache_lowers_exactly(target: str, sq: int, sk: int) -> None:
    model = _flash_no_cache(2, sq, sk)
    lowered, notes = lower(model, target)
    assert [n.lowered for n in notes] == [True], notes
    rng = np.random.default_rng(3)
    feeds = {x: rng.standard_normal((2, 2, sq if x == "q" else sk, D)).astype(np.float32) for x in "qkv"}
    expected = reference.flash_attention(feeds["q"], feeds["k"], feeds["v"], None, None, **_reference_attrs(model))
    np.testing.assert_allclose(_run(lowered, feeds)[0], expected, rtol=1e-5, atol=1e-5)  # NaN rows too (sq > sk)


def _reference_attrs(model: onnx.ModelProto) -> dict[str, Any]:
    """The node's attributes as the kernels take them: exact floats and the side channel's ints."""
    node = next(n for n in model.graph.node if n.op_type == spec.OP_TYPE)
    raw = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    attrs = side_channel.resolve({k: (v.decode() if isinstance(v, bytes) else v) for k, v in raw.items()})
    attrs.pop("exact_floats")
    return attrs


# ---------------------------------------------------------------------------------------------
# the zoo's decoders with a KV cache

ZOO = os.path.join(os.path.dirname(__file__), "..", "models")
CACHED = [e for e in json.load(open(os.path.join(ZOO, "manifest.json")))["models"] if e.get("cache")]


@pytest.fixture(scope="module", params=CACHED, ids=[e["file"] for e in CACHED])
def cached_zoo_model(request: pytest.FixtureRequest) -> tuple[dict[str, Any], onnx.ModelProto, onnx.ModelProto]:
    entry = request.param
    model = onnx.load(os.path.join(ZOO, entry["file"]))
    fused, report = ortflash.optimize(model, target="ortflash")
    assert report.fused == entry["attention_blocks"], [b.reason for b in report.blocks]
    return entry, model, fused


def test_zoo_decoders_lower_with_the_cache_inside_and_verify_in_prefill_and_decode(
    cached_zoo_model: tuple[dict[str, Any], onnx.ModelProto, onnx.ModelProto],
) -> None:
    """contrib in prefill and decode shapes, onnx in decode (the test time budget)."""
    entry, model, fused = cached_zoo_model
    cases = decoder_cases(model, seq_len=5, batch=2)
    assert [c[0].split(":")[0] for c in cases] == ["prefill", "decode"]
    grouped = entry["kv_heads"] < entry["num_heads"]
    for target, op, shapes in (
        ("contrib", "GroupQueryAttention" if grouped else "MultiHeadAttention", cases),
        ("onnx", "Attention", cases[1:]),
    ):
        lowered, notes = lower(fused, target)
        assert all(n.lowered for n in notes) and len(notes) == entry["attention_blocks"], notes
        cached = [n for n in notes if "present_key/present_value out" in n.reason]
        # a merged decoder: the blocks of its with-cache branch take the cache, the others have none
        assert len(cached) == entry["attention_blocks"] // (2 if entry["arch"] == "llama_merged" else 1), notes
        assert all(n.op.endswith(op) for n in cached), cached
        # every present output is written by the native op: no two-input Concat is left for the cache
        made_by = {o: n for g in graphs_of(lowered.graph) for n in g.node for o in n.output}
        outputs = [o.name for g in graphs_of(lowered.graph) for o in g.output if o.name in made_by]
        assert sum(made_by[o].op_type == op for o in outputs) == 2 * len(cached), outputs
        assert not [o for o in outputs if made_by[o].op_type == "Concat" and len(made_by[o].input) == 2]
        for _, dims in shapes:
            diffs = verify(model, lowered, make_feeds(model, seq_len=5, batch=2, dims=dims))
            assert all(d.ok for d in diffs), (target, dims, [(d.name, d.max_abs) for d in diffs])
