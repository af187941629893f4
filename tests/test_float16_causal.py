"""A causal bias filled with float16's lowest, -65504, as Hugging Face writes float16 masks (issue 33
item 18; fusion/causal/finite_fill). The graph computes s + -65504, not -65504, so the op cannot
copy it; but on a row that keeps a visible key, with scores below the bound (32,668 in float16), the
graph's masked weights underflow to 0, as the op's with fill -inf. Proved there (no padding, nothing
else beside the bias); causal + padding, where a row's visible keys can all be padded, stays refused.
Every comparison runs the original float16 graph on ONNX Runtime's CPU EP."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from test_causal_proof import B, D, H, S, _cached_decoder, _cached_feeds, _decoder

import ortflash
from ortflash.fusion.causal.finite_fill import score_bound
from ortflash.op import spec

F16_LOWEST = float(np.finfo(np.float16).min)
DATA = Path(__file__).parent / "data" / "float16"


def _plain(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _fused(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    if any(n.domain == spec.DOMAIN for n in model.graph.node):
        return ortflash.InferenceSession(model).run(None, feeds)
    return _plain(model, feeds)


def _flash_attrs(model: onnx.ModelProto) -> list[dict[str, object]]:
    return [
        {a.name: helper.get_attribute_value(a) for a in n.attribute} | {"inputs": list(n.input)}
        for n in model.graph.node
        if n.op_type == spec.OP_TYPE
    ]


def _random(rng: np.random.Generator, dtype: type, padded: bool = False) -> dict[str, np.ndarray]:
    f = {"attention_mask": np.ones((B, S), np.int64)}
    if padded:
        f["attention_mask"][1, :3] = 0  # left padding: rows 0..2 of item 1 see only padded keys
    for layer in range(2):
        for x in "qkv":
            f[f"{x}{layer}"] = rng.standard_normal((B, H, S, D)).astype(dtype)
    return f


def _extreme(score: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Scores -score at key 0 and +score at every other key, in every row: row 0 sees key 0 only,
    so its hidden keys score 2 * score above its visible one (the bound's worst case)."""
    f = {"attention_mask": np.ones((B, S), np.int64)}
    k = np.zeros((B, H, S, D), np.float32)
    k[..., 0, 0], k[..., 1:, 0] = 64.0, -64.0
    q = np.zeros((B, H, S, D), np.float32)
    q[..., 0] = -score / (64.0 * D**-0.5)
    for layer in range(2):
        f[f"q{layer}"], f[f"k{layer}"] = q.astype(np.float16), k.astype(np.float16)
        f[f"v{layer}"] = rng.standard_normal((B, H, S, D)).astype(np.float16)
    return f


@pytest.mark.parametrize("frontier", ["le", "window"])
@pytest.mark.parametrize("padding", ["none", "ones"])
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT16, TensorProto.FLOAT])
def test_a_float16_lowest_causal_bias_without_padding_is_proved_and_agrees(dtype, padding, frontier):
    model = _decoder(fill=F16_LOWEST, padding=padding, frontier=frontier, dtype=dtype)
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    assert [b.mask_kind for b in report.blocks] == ["causal", "causal"], [b.reason for b in report.blocks]
    attrs = _flash_attrs(fused)
    assert [a["is_causal"] for a in attrs] == [1, 1]
    assert all(a["mask_fill"] == -math.inf for a in attrs)  # the masked weights are 0 in the graph too
    initial = {i.name for i in fused.graph.initializer} | {
        n.output[0] for n in fused.graph.node if n.op_type == "Constant"
    }
    assert all(a["inputs"][3] in initial for a in attrs), "the [B, 1, S, S] bias is gone (a scalar placeholder)"
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    feeds = _random(np.random.default_rng(0), np_type)
    for want, got in zip(_plain(model, feeds), _fused(fused, feeds)):
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)


def test_a_kv_cache_mask_filled_with_float16_lowest_is_proved_bottom_right():
    """j <= i + past: the offset is a cache's length, a dim, so >= 0 and row 0 sees key 0; in
    prefill, decode and a chunk after a cache the fused op gives the graph's outputs."""
    model = _cached_decoder(padding="none", fill=F16_LOWEST)
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    assert [b.mask_kind for b in report.blocks] == ["causal", "causal"], [b.reason for b in report.blocks]
    assert [a["is_causal"] for a in _flash_attrs(fused)] == [2, 2]
    rng = np.random.default_rng(3)
    for past, new in ((0, 7), (6, 1), (5, 4)):
        feeds = _cached_feeds(rng, past, new)
        for want, got in zip(_plain(model, feeds), _fused(fused, feeds)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target", ["ortflash", "contrib", "onnx"])
def test_extreme_finite_scores_agree_below_the_bound_and_the_graph_leaks_past_it(target):
    """At scores of +-32,000 (under the bound 32,668) row 0's hidden keys weigh 0 in the graph, as in
    the op; at +-33,000 the graph's own softmax weighs them (s + -65504 is above the visible score),
    which the bound excludes: the original is then not causal, the rewrite is."""
    model = _decoder(fill=F16_LOWEST, padding="none", dtype=TensorProto.FLOAT16)
    fused, report = ortflash.optimize(model, target=target)
    assert [b.mask_kind for b in report.blocks] == ["causal", "causal"], [b.reason for b in report.blocks]
    assert not any(n.op_type == spec.OP_TYPE for n in fused.graph.node) or target == "ortflash"
    rng = np.random.default_rng(1)
    below = _extreme(32000.0, rng)
    for feeds, leaks in ((below, False), (_extreme(33000.0, rng), True)):
        want, got = (r[0].astype(np.float32) for r in (_plain(model, feeds), _fused(fused, feeds)))
        v0 = feeds["v0"].astype(np.float32)
        np.testing.assert_allclose(got[:, :, 0], v0[:, :, 0], rtol=1e-3, atol=1e-3)  # the op: key 0 alone
        np.testing.assert_allclose(got[:, :, 1:], want[:, :, 1:], rtol=2e-3, atol=2e-3)  # keys 1..i tie
        if leaks:  # the graph's row 0 is the mean of the hidden keys' values
            np.testing.assert_allclose(want[:, :, 0], v0[:, :, 1:].mean(axis=2), rtol=2e-3, atol=2e-3)
        else:
            np.testing.assert_allclose(want[:, :, 0], v0[:, :, 0], rtol=1e-3, atol=1e-3)


def test_the_score_bound_is_where_the_masked_weight_underflows():
    bound = score_bound(F16_LOWEST, ir.DataType.FLOAT16)
    assert bound == pytest.approx(32668.0)
    for s in (bound, 0.98 * bound):  # a hidden key at +s, the row's visible key at -s
        hidden = np.float16(np.float16(s) + np.float16(F16_LOWEST)).astype(np.float32)
        assert np.exp(hidden - np.float32(-s)) == 0.0
    hidden = np.float16(np.float16(33000.0) + np.float16(F16_LOWEST)).astype(np.float32)
    assert hidden > -33000.0  # past it, the hidden key outscores the visible one in the graph


@pytest.mark.parametrize("padding", ["unsqueeze", "gathernd"])
def test_float16_lowest_causal_plus_padding_stays_refused(padding):
    """A row whose visible keys are all padded (left padding) weighs every key by s + -65504 in the
    graph; the op gives its hidden keys the fill: they differ there, so the block keeps its bias."""
    model = _decoder(fill=F16_LOWEST, padding=padding, dtype=TensorProto.FLOAT16)
    fused, report = ortflash.optimize(model, target="ortflash")
    assert [b.mask_kind for b in report.blocks] == ["bias", "bias"]
    assert all("float16's lowest" in b.reason and "no unpadded key" in b.reason for b in report.blocks)
    feeds = _random(np.random.default_rng(2), np.float16, padded=True)
    for want, got in zip(_plain(model, feeds), _fused(fused, feeds)):  # the full bias: the graph's rows
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)


def test_float16_lowest_causal_beside_another_bias_stays_refused():
    model = _decoder(fill=F16_LOWEST, padding="none", dtype=TensorProto.FLOAT16, beside=True)
    _, report = ortflash.optimize(model, target="ortflash")
    assert [b.mask_kind for b in report.blocks] == ["bias", "bias"]
    assert all("another bias or mask beside it" in b.reason for b in report.blocks), [b.reason for b in report.blocks]


def test_a_fill_above_float16_lowest_stays_refused():
    model = _decoder(fill=-10000.0, padding="none", dtype=TensorProto.FLOAT16)
    _, report = ortflash.optimize(model, target="ortflash")
    assert [b.mask_kind for b in report.blocks] == ["bias", "bias"]
    assert all("-10000 is not -10000" in b.reason for b in report.blocks)


@pytest.mark.parametrize("target", ["ortflash", "contrib", "onnx"])
def test_transformers_float16_bart_decoder_is_proved_causal(target):
    """tests/data/float16 (make_models.py): BART in float16 without a decoder mask writes its decoder
    self-attention mask as causal x a padding part of ones, filled with -65504."""
    path = DATA / "bart_f16_eager_torchscript.onnx"
    fused, report = ortflash.optimize(str(path), target=target)
    kinds = [b.mask_kind for b in report.blocks]
    assert kinds == ["padding", "causal", "padding", "causal", "padding"], [b.reason for b in report.blocks]
    assert all("is_causal=1" in b.reason for b in report.blocks if b.mask_kind == "causal")
    assert ortflash.verify(str(path), fused, seq_len=16).ok


def test_transformers_float16_llama_with_attention_mask_stays_refused():
    path = DATA / "llama_f16_eager_torchscript.onnx"
    _, report = ortflash.optimize(str(path), target="ortflash")
    assert [b.mask_kind for b in report.blocks] == ["bias", "bias"]
    assert all("no unpadded key" in b.reason for b in report.blocks)


@pytest.mark.parametrize("target", ["ortflash", "contrib", None])
def test_the_proved_row_s_detail_names_the_score_bound_and_the_check(target):
    """The fill taken as -inf holds only under the score bound, which nothing checks at run time: the
    row's detail (said once under the table, --json's detail) says so and names the check; a row
    proved exactly (fill -inf, or a padding bias) says nothing of it."""
    path = DATA / "bart_f16_eager_torchscript.onnx"
    _, report = ortflash.optimize(str(path), target=target)
    causal = [b for b in report.blocks if b.mask_kind == "causal"]
    assert len(causal) == 2, [b.reason for b in report.blocks]
    for b in causal:
        assert "|s| < 32,668" in b.detail and "--verify --feeds" in b.detail, b.detail
        assert "-65504" in b.detail and "taken as -inf" in b.detail
    assert all("32,668" not in b.detail for b in report.blocks if b.mask_kind != "causal")
    _, exact = ortflash.optimize(_decoder(padding="none"), target=target)  # fill float32's lowest
    assert [b.mask_kind for b in exact.blocks] == ["causal", "causal"]
    assert all("32,668" not in b.detail for b in exact.blocks)


def _softcapped(model: onnx.ModelProto, cap: float = 50.0) -> onnx.ModelProto:
    """model (``_decoder``) with Gemma 2's soft cap c * tanh(s / c) on each block's scaled scores,
    under the causal bias."""
    graph = model.graph
    graph.initializer.append(onnx.numpy_helper.from_array(np.array(cap, np.float16), "cap"))
    for layer in range(2):
        (add,) = [n for n in graph.node if n.output[0] == f"sb{layer}"]
        scores = add.input[0]
        capped = [
            helper.make_node("Div", [scores, "cap"], [f"sd{layer}"]),
            helper.make_node("Tanh", [f"sd{layer}"], [f"st{layer}"]),
            helper.make_node("Mul", [f"st{layer}", "cap"], [f"sc{layer}"]),
        ]
        add.input[0] = f"sc{layer}"
        at = list(graph.node).index(add)
        for offset, n in enumerate(capped):
            graph.node.insert(at + offset, n)
    return model


def test_a_softcapped_block_with_a_float16_lowest_causal_bias_is_proved():
    """The bias is the block's only one (the block's reading says so, told to the proof), with Gemma
    2's soft cap between the scaled scores and the Add: proved, and equal to the graph (the
    scores' own look at the graph around the Add refused it: the Mul of the Tanh is no scale)."""
    model = _softcapped(_decoder(fill=F16_LOWEST, padding="none", dtype=TensorProto.FLOAT16))
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    assert [b.mask_kind for b in report.blocks] == ["causal", "causal"], [b.reason for b in report.blocks]
    attrs = _flash_attrs(fused)
    assert [a["is_causal"] for a in attrs] == [1, 1]
    assert [a["softcap"] for a in attrs] == [50.0, 50.0]
    feeds = _random(np.random.default_rng(4), np.float16)
    for want, got in zip(_plain(model, feeds), _fused(fused, feeds)):
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)


def _no_mask_llama() -> onnx.ModelProto:
    return onnx.load(DATA / "llama_f16_no_mask_dynamo.onnx")


def test_dynamo_float16_llama_without_attention_mask_builds_a_plain_causal_mask():
    """tests/data/float16/llama_f16_no_mask_dynamo.onnx (make_models.py): the mask is built from the
    position ids pos = Expand(Range(S)) [B, S] as pos[b, j] <= pos[b, i] and cumsum(breaks)[b, i] ==
    cumsum(breaks)[b, j], breaks = diff(concat(pos[:, :1] - 1, pos)) != 1 (all False: one sequence
    per row), so it is where(j <= i, 0, -65504), as ONNX Runtime confirms here."""
    model = _no_mask_llama()
    model.graph.output.append(helper.make_value_info("where", onnx.TypeProto()))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seq in (1, 5, 16):
        ids = np.random.default_rng(seq).integers(3, 100, (3, seq))
        mask = session.run(["where"], {"input_ids": ids})[0]
        want = np.where(np.tril(np.ones((seq, seq), bool)), 0.0, F16_LOWEST).astype(np.float16)
        assert mask.shape == (3, 1, seq, seq) and (mask == want).all()


@pytest.mark.parametrize("target", ["ortflash", "contrib", "onnx"])
def test_dynamo_float16_llama_without_attention_mask_is_proved_causal(target):
    """graph/'s reader reads the position ids' GatherND through (index arithmetic alone), the Concat
    as the positions continued backwards (t - 1 over [0, S + 1)) and the CumSum of no breaks as 0:
    the mask is j <= i with fill -65504 added alone, proved as finite_fill says (fails before)."""
    path = DATA / "llama_f16_no_mask_dynamo.onnx"
    fused, report = ortflash.optimize(str(path), target=target)
    assert [b.mask_kind for b in report.blocks] == ["causal"], [b.reason for b in report.blocks]
    assert "is_causal=1" in report.blocks[0].reason and "32,668" in report.blocks[0].detail
    if target == "ortflash":
        assert [(a["is_causal"], a["mask_fill"]) for a in _flash_attrs(fused)] == [(1, -math.inf)]
    ids = np.random.default_rng(7).integers(3, 100, (2, 11))
    want = _plain(_no_mask_llama(), {"input_ids": ids})[0].astype(np.float32)
    got = _fused(fused, {"input_ids": ids})[0].astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
    assert ortflash.verify(str(path), fused, seq_len=16).ok


def test_a_position_concat_that_is_not_the_positions_continued_stays_refused():
    """concat(pos[:, :1] - 2, pos): its first element is not pos continued (t - 1 at t = 0), so the
    break ids are not proved 0 (here they are 1 everywhere, still one sequence: refused, not wrong)."""
    model = _no_mask_llama()
    (sub,) = [n for n in model.graph.node if n.op_type == "Sub" and n.output[0] == "sub_8"]
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(2, np.int64), "two"))
    sub.input[1] = "two"
    _, report = ortflash.optimize(model, target="ortflash")
    assert [b.mask_kind for b in report.blocks] == ["bias"], [b.reason for b in report.blocks]
    # the CumSum is not read, so its GatherND stays a look-up, which depends on the query position
    assert "other than by j <= i + c (cumsum)" in report.blocks[0].reason
