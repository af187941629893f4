"""Sliding-window attention (issue 22 item 1): the op's window_left / window_right (spec.py), the
window proved from exported masks (fusion/causal), the tiles outside the band skipped by the CPU
kernel, and the window lowered to GroupQueryAttention's local_window_size where that is exact.

The exports under tests/data/sliding_window/ are models/sliding_window_exports.py's (tiny random
Mistral with a KV cache, TorchScript + eager; Gemma2, dynamo + eager, one sliding and one global
layer), window 4: every sliding block must become is_causal + window_left 3."""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

import ortflash
from ortflash.kernels import cpu, reference
from ortflash.lowering import lower
from ortflash.op import side_channel, spec
from ortflash.op.call import FlashAttentionCall  # noqa: F401  (the attributes' one writer, below)

sys.path.insert(0, os.path.dirname(__file__))
from test_causal_proof import _decoder, _feeds  # noqa: E402  (the hand-built masking_utils decoder)

HERE = os.path.dirname(__file__)
DATA = os.path.join(HERE, "data", "sliding_window")
ZOO = os.path.join(HERE, "..", "models")
LOWEST = float(np.finfo(np.float32).min)


def _visible(is_causal: int, wl: int, wr: int, sq: int, sk: int) -> np.ndarray:
    """The spec's sentence, element by element: bool [Sq, Sk]."""
    offset = sk - sq if is_causal == 2 else 0
    out = np.zeros((sq, sk), bool)
    for i in range(sq):
        p = i + offset
        for j in range(sk):
            out[i, j] = (not is_causal or j <= p) and (wl < 0 or j >= p - wl) and (wr < 0 or j <= p + wr)
    return out


def _flash_attrs(model: onnx.ModelProto) -> list[dict]:
    return [
        {a.name: h.get_attribute_value(a) for a in n.attribute} for n in model.graph.node if n.op_type == spec.OP_TYPE
    ]


def _window_of(attrs: dict) -> tuple[int, int]:
    """(is_causal, window_left) as the node carries them (window_left absent: -1)."""
    return int(attrs["is_causal"]), int(attrs.get("window_left", -1))


# ---------------------------------------------------------------- the contract


def test_window_attributes_are_validated_and_travel_in_the_side_channel():
    with pytest.raises(spec.SpecError, match="window_left"):
        spec.validate({"window_left": -2})
    with pytest.raises(spec.SpecError, match="window_right"):
        spec.validate({"window_right": 1.5})
    attrs = spec.validate({"is_causal": 1, "window_left": 3})
    assert attrs["window_right"] == -1
    assert {"window_left", "window_right"} <= set(spec.SIDE_CHANNEL_INTS)  # not declared to the bridge
    assert "window_left=3" in side_channel.SideChannel.of_attributes(attrs).encode()
    assert "window_right" not in side_channel.SideChannel.of_attributes(attrs).encode()  # only away from its default
    assert (
        side_channel.resolve({"exact_floats": side_channel.SideChannel.of_attributes(attrs).encode()})["window_left"]
        == 3
    )


@pytest.mark.parametrize("is_causal", [0, 1, 2])
@pytest.mark.parametrize("sq,sk", [(7, 7), (3, 11), (11, 3), (1, 9)])
@pytest.mark.parametrize("wl,wr", [(-1, -1), (0, -1), (2, -1), (2, 1), (-1, 2), (20, 0)])
def test_key_bounds_are_the_window_sentence(is_causal, sq, sk, wl, wr):
    attrs = spec.validate({"is_causal": is_causal, "window_left": wl, "window_right": wr})
    first, last = spec.key_bounds(attrs, sq, sk)
    j = np.arange(sk)[None, :]
    np.testing.assert_array_equal((j >= first[:, None]) & (j <= last[:, None]), _visible(is_causal, wl, wr, sq, sk))


@pytest.mark.parametrize("mode", ["naive", "online"])
@pytest.mark.parametrize(
    "is_causal,sq,sk,wl,wr", [(1, 9, 9, 3, -1), (2, 4, 13, 2, -1), (2, 6, 3, 0, -1), (0, 8, 8, 2, 2)]
)
def test_reference_window_is_the_same_as_its_mask(mode, is_causal, sq, sk, wl, wr):
    """The window in the reference kernel computes what a bool mask of the band computes
    (including the rows that see no key: is_causal 2 with Sq > Sk)."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 4, sq, 8)).astype(np.float32)
    k, v = (rng.standard_normal((2, 2, sk, 8)).astype(np.float32) for _ in range(2))
    got = reference.flash_attention(
        q, k, v, scale=0.4, is_causal=is_causal, window_left=wl, window_right=wr, softmax=mode, block_size=4
    )
    band = _visible(is_causal, wl, wr, sq, sk)
    want = reference.flash_attention(q, k, v, mask=band, scale=0.4, softmax="naive")
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- the CPU kernel

# (Sq, Sk, is_causal, window_left, window_right): prefill, Sq != Sk both ways, decode (the direct
# path: (Hq / Hkv) * Sq <= 16 rows), a window wider than the keys, a non-causal band.
KERNEL_CASES = [
    (130, 130, 1, 16, -1),
    (200, 200, 1, 63, -1),
    (70, 300, 2, 40, -1),
    (300, 70, 2, 9, -1),
    (1, 257, 2, 31, -1),
    (5, 400, 2, 100, -1),
    (64, 64, 1, 500, -1),
    (90, 90, 0, 12, 5),
    (90, 90, 0, -1, 5),
]


@pytest.mark.skipif(not cpu.available(), reason="no compiled CPU kernel")
@pytest.mark.parametrize("mode", ["naive", "online"])
@pytest.mark.parametrize("fill", [-np.inf, LOWEST])
@pytest.mark.parametrize("extra", ["none", "padding_bias", "mask", "bias_after_mask"])
@pytest.mark.parametrize("sq,sk,is_causal,wl,wr", KERNEL_CASES)
def test_cpu_kernel_window_matches_the_reference(mode, fill, extra, sq, sk, is_causal, wl, wr):
    rng = np.random.default_rng(sq * 1000 + sk)
    q = rng.standard_normal((2, 4, sq, 16)).astype(np.float32)
    k, v = (rng.standard_normal((2, 2, sk, 16)).astype(np.float32) for _ in range(2))
    bias = mask = None
    attrs = dict(scale=0.3, is_causal=is_causal, window_left=wl, window_right=wr, mask_fill=fill)
    if extra in ("padding_bias", "bias_after_mask"):
        bias = np.where(rng.random((2, 1, 1, sk)) < 0.3, LOWEST, 0).astype(np.float32)
        bias[1, ..., :] = LOWEST  # item 1: every key padded, every row fully masked
        attrs["bias_after_mask"] = int(extra == "bias_after_mask")
    if extra == "mask":
        mask = rng.random((2, 1, sq, sk)) < 0.7
    want = reference.flash_attention(q, k, v, bias, mask, softmax=mode, block_size=32, **attrs)
    got = cpu.flash_attention(q, k, v, bias, mask, softmax=mode, block_size=32, **attrs)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=1e-4, atol=2e-5)


@pytest.mark.skipif(not cpu.available(), reason="no compiled CPU kernel")
@pytest.mark.parametrize("mode", ["naive", "online"])
# packed key tiles (naive groups, online tiles); the decode path, whose closed form for a finite
# fill reads the V rows left of the window only for a row that sees no other key
@pytest.mark.parametrize("sq,fill", [(64, -np.inf), (2, -np.inf), (2, LOWEST)])
def test_cpu_kernel_never_reads_keys_left_of_every_window(mode, sq, fill):
    """Keys left of every row's window are skipped, not multiplied by 0: NaN in their V rows
    reaches the reference's output (p = 0 times NaN) and not the kernel's (as for the causal keys
    right of the diagonal). Rows at positions 448.. with window_left 64 see no key below 384, six
    whole tiles of 64."""
    rng = np.random.default_rng(1)
    sk = 512
    q = rng.standard_normal((1, 4, sq, 16)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, sk, 16)).astype(np.float32) for _ in range(2))
    v[..., :384, :] = np.nan
    attrs = dict(scale=0.3, is_causal=2, window_left=64, softmax=mode, block_size=64, mask_fill=fill)
    got = cpu.flash_attention(q, k, v, **attrs)
    assert np.isfinite(got).all()
    want = reference.flash_attention(q, k, v, **attrs)
    assert np.isnan(want).all()  # the reference multiplies them: what the kernel skipped
    v[..., :384, :] = 0.0
    np.testing.assert_allclose(got, reference.flash_attention(q, k, v, **attrs), rtol=1e-4, atol=1e-5)


def test_the_bridge_runs_the_window():
    """window_left reaches the kernel through the side channel of a node as the emitter writes it."""
    attrs = spec.validate({"scale": 0.5, "is_causal": 1, "window_left": 2})
    declared = {name: attrs[name] for name in spec.DECLARED}
    declared["exact_floats"] = side_channel.SideChannel.of_attributes(attrs).encode()
    node = h.make_node(spec.OP_TYPE, ["q", "k", "v", "bias", "mask"], ["o"], domain=spec.DOMAIN, **declared)
    node.attribute.append(h.make_attribute("window_left", 2))
    io = [h.make_tensor_value_info(x, TP.FLOAT, None) for x in ("q", "k", "v", "bias")]
    io.append(h.make_tensor_value_info("mask", TP.BOOL, None))
    graph = h.make_graph([node], "g", io, [h.make_tensor_value_info("o", TP.FLOAT, None)])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(spec.DOMAIN, 1)], ir_version=8)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 9, 8)).astype(np.float32) for _ in range(3))
    sess = ort.InferenceSession(model.SerializeToString(), ortflash.session_options())
    got = sess.run(None, {"q": q, "k": k, "v": v, "bias": np.zeros((), np.float32), "mask": np.ones((), bool)})[0]
    want = reference.flash_attention(q, k, v, scale=0.5, is_causal=1, window_left=2)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.abs(reference.flash_attention(q, k, v, scale=0.5, is_causal=1) - want).max() > 0.05


# ---------------------------------------------------------------- the proof


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    if any(n.domain == spec.DOMAIN for n in model.graph.node):
        return ortflash.InferenceSession(model).run(None, feeds)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _assert_same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_allclose(np.nan_to_num(g), np.nan_to_num(w), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("form", ["bias", "mask"])
def test_hand_built_window_is_proved_and_computes_the_same(form):
    """masking_utils' sliding window (kv <= q and kv > q - 4) with a padding part: is_causal 1 and
    window_left 3 (the query and the 3 keys before it), the [B, 1, S, S] tensor gone."""
    model = _decoder(frontier="window", form=form)
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    assert [_window_of(a) for a in _flash_attrs(fused)] == [(1, 3), (1, 3)], [b.reason for b in report.blocks]
    assert all("window_left=3" in b.reason for b in report.blocks)
    assert not {"LessOrEqual", "Greater"} & {n.op_type for n in fused.graph.node}
    f = _feeds(np.random.default_rng(0))
    _assert_same(_run(fused, f), _run(model, f))


def _export_feeds(model: onnx.ModelProto, batch: int, new: int, past: int, pad: int) -> dict[str, np.ndarray]:
    """Feeds for models/sliding_window_exports.py's exports (input_ids, attention_mask over past +
    new, past_key_values.{i}.key/value [B, kv, past, D]); the last item padded on the right."""
    rng = np.random.default_rng(past * 31 + new)
    feeds = {}
    for vi in model.graph.input:
        dims = vi.type.tensor_type.shape.dim
        if vi.name == "input_ids":
            feeds[vi.name] = rng.integers(3, 100, (batch, new), dtype=np.int64)
        elif vi.name == "attention_mask":
            m = np.ones((batch, past + new), np.int64)
            if pad:
                m[-1, past + new - pad :] = 0
            feeds[vi.name] = m
        else:  # a cache input
            feeds[vi.name] = rng.standard_normal((batch, dims[1].dim_value, past, dims[3].dim_value)).astype(np.float32)
    return feeds


EXPORTS = {
    # file: ((is_causal, window_left) per block, cases (batch, new, past, pad))
    "mistral_window_cache_eager_torchscript.onnx": ([(2, 3), (2, 3)], [(2, 9, 0, 3), (2, 1, 11, 0), (1, 4, 6, 0)]),
    "gemma2_window_eager_dynamo.onnx": ([(1, 3), (1, -1)], [(2, 11, 0, 4), (1, 5, 0, 0)]),
}


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_exported_sliding_windows_are_proved(name):
    model = onnx.load(os.path.join(DATA, name))
    expected, cases = EXPORTS[name]
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    assert report.fused == len(expected)
    assert [_window_of(a) for a in _flash_attrs(fused)] == expected, [b.reason for b in report.blocks]
    for batch, new, past, pad in cases:
        f = _export_feeds(model, batch, new, past, pad)
        want = _run(model, f)
        for mode in ("naive", "online"):
            _assert_same(ortflash.InferenceSession(fused, softmax=mode, block_size=4).run(None, f), want)


@pytest.mark.parametrize("name", ["gpt_neo_eager_torchscript", "gpt_neo_eager_dynamo"])
def test_zoo_gpt_neo_local_layer_is_proved_a_window(name):
    """GPT-Neo's registered buffers (layer 0 tril, layer 1 tril xor tril(-8)), sliced by Sk - Sq
    (computed in the TorchScript export) and filled before the padding bias: is_causal 1, and
    window_left 7 on the local layer; the bias stays after the fills."""
    model = onnx.load(os.path.join(ZOO, f"{name}.onnx"))
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    attrs = _flash_attrs(fused)
    assert [_window_of(a) for a in attrs] == [(1, -1), (1, 7)], [b.reason for b in report.blocks]
    assert all(a.get("bias_after_mask") == 1 for a in attrs)
    from ortflash.checks.feeds import make_feeds

    for seq in (5, 19):
        f = make_feeds(model, seq_len=seq, batch=2)
        f["attention_mask"][1, seq - 3 :] = 0
        _assert_same(_run(fused, f), _run(model, f))


# Bands the proof must refuse, and why: the block keeps its [B, 1, S, S] tensor.
REFUSED = {
    # j <= i + 1 and j > i - 4: a band, but its upper frontier is neither causal alignment
    "shifted_band": (dict(frontier="window_shift"), "neither top-left (0) nor bottom-right"),
    # j > i - 4 alone: keys right of the query stay visible, the lower frontier is no causal one
    "lower_only": (dict(frontier="lower"), "not one constant"),
}


def _band_decoder(frontier: str) -> onnx.ModelProto:
    """_decoder's masking_utils graph with another band: the comparisons swapped in place."""
    model = _decoder(frontier="window")
    nodes = {n.output[0]: n for n in model.graph.node}
    if frontier == "window_shift":  # causal: kv <= qi + 1
        one = onnx.numpy_helper.from_array(np.asarray(1, np.int64), "one_shift")
        model.graph.initializer.append(one)
        shift = h.make_node("Add", ["qi", "one_shift"], ["qi_shifted"])
        nodes["causal"].input[1] = "qi_shifted"
        model.graph.node.insert(list(model.graph.node).index(nodes["causal"]), shift)
    else:  # band = inside only
        nodes["band"].input[0] = "inside"
        nodes["band"].op_type = "Identity"
        del nodes["band"].input[1]
    return model


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_bands_that_are_not_a_causal_window_keep_their_tensor(name):
    kwargs, reason = REFUSED[name]
    model = _band_decoder(kwargs["frontier"])
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    assert report.fused == 2
    assert all(reason in b.reason for b in report.blocks), [b.reason for b in report.blocks]
    assert [_window_of(a) for a in _flash_attrs(fused)] == [(0, -1), (0, -1)]
    f = _feeds(np.random.default_rng(2))
    _assert_same(_run(fused, f), _run(model, f))


# ---------------------------------------------------------------- lowering


def _fa_model(hq: int, hkv: int, d: int, attrs: dict, bias: bool = False) -> onnx.ModelProto:
    """One FlashAttention node as the emitter writes it (FlashAttentionCall.attributes' rules: the
    side channel carries the window), over q [B, Hq, S, D], k, v [B, Hkv, S, D]."""
    full = spec.validate(attrs)
    node_attrs = {name: full[name] for name in spec.DECLARED}
    node_attrs["exact_floats"] = side_channel.SideChannel.of_attributes(full).encode()
    node_attrs.update({n: full[n] for n in spec.SIDE_CHANNEL_INTS if full[n] != spec.ATTRIBUTES[n].default})
    inputs = [
        h.make_tensor_value_info("q", TP.FLOAT, ["B", hq, "S", d]),
        h.make_tensor_value_info("k", TP.FLOAT, ["B", hkv, "S", d]),
        h.make_tensor_value_info("v", TP.FLOAT, ["B", hkv, "S", d]),
    ]
    inits = [onnx.numpy_helper.from_array(np.array(True), "no_mask")]
    if bias:
        inputs.append(h.make_tensor_value_info("bias", TP.FLOAT, ["B", 1, 1, "S"]))
    else:
        inits.append(onnx.numpy_helper.from_array(np.array(0, np.float32), "bias"))
    node = h.make_node(spec.OP_TYPE, ["q", "k", "v", "bias", "no_mask"], ["o"], domain=spec.DOMAIN, **node_attrs)
    graph = h.make_graph([node], "fa", inputs, [h.make_tensor_value_info("o", TP.FLOAT, ["B", hq, "S", d])], inits)
    opsets = [h.make_opsetid("", 17), h.make_opsetid(spec.DOMAIN, spec.DOMAIN_VERSION)]
    return h.make_model(graph, opset_imports=opsets, ir_version=8)


@pytest.mark.parametrize("wl", [0, 2, 5])
def test_gqa_local_window_size_is_window_left_plus_one(wl):
    """ONNX Runtime's GroupQueryAttention (CPU) keeps keys p - L < j <= p for local_window_size L
    (measured here, prefill; decode in the next test): the window of window_left L - 1."""
    model = _fa_model(4, 2, 8, {"scale": 0.35, "is_causal": 1, "window_left": wl})
    lowered, notes = lower(model, "contrib")
    (gqa,) = [n for n in lowered.graph.node if n.op_type == "GroupQueryAttention"]
    assert {a.name: h.get_attribute_value(a) for a in gqa.attribute}["local_window_size"] == wl + 1
    rng = np.random.default_rng(wl)
    f = {x: rng.standard_normal((2, 4 if x == "q" else 2, 10, 8)).astype(np.float32) for x in "qkv"}
    got = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, f)[0]
    want = reference.flash_attention(f["q"], f["k"], f["v"], scale=0.35, is_causal=1, window_left=wl)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    other = reference.flash_attention(f["q"], f["k"], f["v"], scale=0.35, is_causal=1, window_left=wl + 1)
    assert np.abs(other - want).max() > 1e-3  # the window is pinned to the key


def test_window_with_padding_goes_into_attention_bias_exactly():
    """With a padding bias GroupQueryAttention's own mask is not exact for fully masked rows (and
    causal=0 takes no local_window_size): the window is folded into attention_bias."""
    model = _fa_model(4, 2, 8, {"scale": 0.35, "is_causal": 1, "window_left": 2}, bias=True)
    lowered, notes = lower(model, "contrib")
    ops = {n.op_type for n in lowered.graph.node}
    assert ops & {"GroupQueryAttention", "MultiHeadAttention"} and spec.OP_TYPE not in ops
    assert "window (left 2) in the bias" in notes[0].reason
    rng = np.random.default_rng(5)
    f = {x: rng.standard_normal((2, 4 if x == "q" else 2, 9, 8)).astype(np.float32) for x in "qkv"}
    f["bias"] = np.zeros((2, 1, 1, 9), np.float32)
    f["bias"][1, ..., 4:] = -np.inf  # right padding: rows 6.. of item 1 see no key
    got = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, f)[0]
    want = reference.flash_attention(f["q"], f["k"], f["v"], f["bias"], scale=0.35, is_causal=1, window_left=2)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target", ["contrib", "onnx"])
def test_exported_window_lowers_exactly(target):
    """The Mistral export with a cache computes what the original computes, prefill and decode:
    contrib and Attention-23 (which has no window) with the window folded into the bias, as the
    padding part rules out GroupQueryAttention's own causal mask."""
    model = onnx.load(os.path.join(DATA, "mistral_window_cache_eager_torchscript.onnx"))
    fused, _ = ortflash.optimize(model, softmax="naive", target="ortflash")
    lowered, notes = lower(fused, target)
    assert spec.OP_TYPE not in {n.op_type for n in lowered.graph.node}, [n.reason for n in notes]
    assert all(n.lowered and "window (left 3) in the bias" in n.reason for n in notes), [n.reason for n in notes]
    for batch, new, past, pad in [(2, 9, 0, 3), (1, 1, 11, 0), (1, 4, 0, 0)]:
        f = _export_feeds(model, batch, new, past, pad)
        _assert_same(_run(lowered, f), _run(model, f))


# ---------------------------------------------------------------- WGSL (lavapipe in CI)


def _wgsl_runner():
    from ortflash.kernels.wgpu import kernel as wk

    if not wk.available():
        pytest.skip(wk.unavailable_reason() or "no wgpu adapter")
    return wk.runner()


@pytest.mark.parametrize("kernel", ["flash", "naive"])
@pytest.mark.parametrize("fill", [-np.inf, LOWEST])
@pytest.mark.parametrize(
    "sq,sk,is_causal,wl,wr",
    [(150, 150, 1, 20, -1), (37, 150, 2, 9, -1), (150, 37, 2, 5, -1), (1, 300, 2, 63, -1), (65, 65, 0, 7, 3)],
)
def test_wgsl_window_matches_the_reference(kernel, fill, sq, sk, is_causal, wl, wr):
    """Both shaders with the window; flash with small tiles, so that row tiles start past whole
    key tiles left of their window (skipped under -inf) and others cross the window's edge."""
    from ortflash.kernels.wgpu.tiles import FlashTile

    runner = _wgsl_runner()
    rng = np.random.default_rng(sq + 3 * sk + wl)
    q = rng.standard_normal((1, 2, sq, 32)).astype(np.float32)
    k, v = (rng.standard_normal((1, 1, sk, 32)).astype(np.float32) for _ in range(2))
    bias = np.where(rng.random((1, 1, 1, sk)) < 0.2, LOWEST, 0).astype(np.float32)
    attrs = spec.validate(
        {"scale": 0.2, "is_causal": is_causal, "window_left": wl, "window_right": wr, "mask_fill": fill}
    )
    tiles = [FlashTile(16, 16, 4, 1, 4), None] if kernel == "flash" else [None]
    want = reference.flash_attention(q, k, v, bias, **attrs)
    for tile in tiles:
        got = runner.attention(q, k, v, bias=bias, attrs=attrs, kernel=kernel, tile=tile)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=1e-4, atol=1e-4)


def test_wgsl_flash_skips_key_tiles_left_of_every_window():
    """Under fill -inf flash.wgsl starts each row tile at its first window's key tile: NaN in the
    V rows before it reaches the reference's output (0 * NaN) and not the shader's."""
    from ortflash.kernels.wgpu.tiles import FlashTile

    runner = _wgsl_runner()
    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 2, 16, 32)).astype(np.float32)  # positions 240..255 of 256 keys
    k, v = (rng.standard_normal((1, 1, 256, 32)).astype(np.float32) for _ in range(2))
    v[..., :192, :] = np.nan  # whole tiles before key 224, row 240's first
    attrs = spec.validate({"scale": 0.2, "is_causal": 2, "window_left": 16})
    got = runner.attention(q, k, v, attrs=attrs, kernel="flash", tile=FlashTile(16, 16, 4, 1, 4))
    assert np.isfinite(got).all()
    assert np.isnan(reference.flash_attention(q, k, v, **attrs)).all()
    v[..., :192, :] = 0.0
    np.testing.assert_allclose(got, reference.flash_attention(q, k, v, **attrs), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- --target webgpu (issue 22 item 5)


@pytest.mark.parametrize("name", ["gpt_neo_eager_torchscript", "gpt_neo_eager_dynamo"])
def test_gpt_neo_lowers_to_webgpu_once_its_mask_is_proved(name):
    """GPT-Neo's padding bias is added after the causal (window) fill. With the fill proved
    is_causal + window, MultiHeadAttention's attention_bias expresses it (fill + bias absorbs the
    score); the rows that see no key hold float32-lowest and -inf, whose mean over the maximum's
    keys the lowering writes out. Before: kept, "bias after mask: one additive bias does not
    express". Checked on the CPU EP (no WebGPU adapter here), including fully masked rows."""
    model = onnx.load(os.path.join(ZOO, f"{name}.onnx"))
    fused, _ = ortflash.optimize(model, softmax="naive", target="ortflash")
    lowered, notes = lower(fused, "webgpu")
    assert [(n.lowered, n.op) for n in notes] == [(True, "com.microsoft.MultiHeadAttention")] * 2, [
        n.reason for n in notes
    ]
    assert "window (left 7) in the bias" in notes[1].reason
    from ortflash.checks.feeds import make_feeds

    for seq, pad in [(5, 0), (19, 3), (19, 12), (19, 19)]:
        f = make_feeds(model, seq_len=seq, batch=2)
        f["attention_mask"][:] = 1
        if pad:
            f["attention_mask"][1, seq - pad :] = 0  # 12 or 19 padded: rows whose window is all padding
        _assert_same(_run(lowered, f), _run(model, f))
