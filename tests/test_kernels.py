"""numpy kernels (naive and online) against a float64 reference written from the formula."""

import numpy as np
import pytest

from ortflash import SoftmaxPolicy
from ortflash.kernels.reference import flash_attention


def float64_attention(q, k, v, bias, mask, scale, is_causal, fill=-np.inf, zero_rows=False, bias_after_mask=False):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = scale * q @ np.swapaxes(k, -1, -2)
    if bias is not None and not bias_after_mask:
        s = s + bias.astype(np.float64)
    if mask is not None:
        s = np.where(mask, s, fill)
    if is_causal:
        sq, sk = s.shape[-2:]
        s = np.where(np.tril(np.ones((sq, sk), bool), k=sk - sq if is_causal == 2 else 0), s, fill)
    if bias is not None and bias_after_mask:
        s = s + bias.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)
    if zero_rows:
        p = np.where(np.isnan(p), 0, p)
    return p @ v


CASES = [
    # (B, Hq, Hkv, Sq, Sk, D, Dv, block)
    (1, 2, 2, 1, 1, 32, 32, 16),
    (2, 4, 2, 17, 100, 32, 32, 16),
    (1, 4, 1, 64, 64, 64, 64, 64),
    (2, 2, 2, 33, 257, 80, 48, 64),
    (1, 8, 2, 5, 130, 128, 128, 32),
]


@pytest.mark.parametrize("mode", ["naive", "online"])
@pytest.mark.parametrize("b,hq,hkv,sq,sk,d,dv,block", CASES)
def test_kernel_matches_float64(mode, b, hq, hkv, sq, sk, d, dv, block):
    rng = np.random.default_rng(sk * 7 + d)
    q = rng.standard_normal((b, hq, sq, d), np.float32)
    k = rng.standard_normal((b, hkv, sk, d), np.float32)
    v = rng.standard_normal((b, hkv, sk, dv), np.float32)
    bias = rng.standard_normal((b, 1, sq, sk)).astype(np.float32)
    mask = rng.random((1, hq, 1, sk)) > 0.1
    scale = 1 / np.sqrt(d)
    want = float64_attention(q, k, v, bias, mask, scale, False)
    got = flash_attention(q, k, v, bias, mask, scale=scale, policy=SoftmaxPolicy(mode, block_size=block))
    assert got.shape == (b, hq, sq, dv) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("mode", ["naive", "online"])
def test_float16_inputs_accumulate_in_float32(mode):
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 2, 40, 64)).astype(np.float16)
    k = rng.standard_normal((1, 2, 300, 64)).astype(np.float16)
    v = rng.standard_normal((1, 2, 300, 64)).astype(np.float16)
    want = float64_attention(q, k, v, None, None, 0.125, False)
    got = flash_attention(q, k, v, scale=0.125, policy=SoftmaxPolicy(mode, block_size=64))
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-2, atol=2e-3)


@pytest.mark.parametrize("mode", ["naive", "online"])
@pytest.mark.parametrize("zero_rows", [False, True])
def test_fully_masked_rows_match_the_subgraph(mode, zero_rows):
    rng = np.random.default_rng(4)
    q = rng.standard_normal((2, 2, 9, 32), np.float32)
    k = rng.standard_normal((2, 2, 50, 32), np.float32)
    v = rng.standard_normal((2, 2, 50, 32), np.float32)
    mask = rng.random((2, 1, 9, 50)) > 0.3
    mask[1, 0, 4] = False  # one row with every key masked out
    want = float64_attention(q, k, v, None, mask, 0.2, False, zero_rows=zero_rows)
    got = flash_attention(
        q,
        k,
        v,
        None,
        mask,
        scale=0.2,
        masked_rows="zero" if zero_rows else "nan",
        policy=SoftmaxPolicy(mode, block_size=16),
    )
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[1, :, 4]).all() != zero_rows
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("mode", ["naive", "online"])
def test_causal_and_finite_fill(mode):
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 2, 70, 32), np.float32)
    k = rng.standard_normal((1, 2, 70, 32), np.float32)
    v = rng.standard_normal((1, 2, 70, 32), np.float32)
    mask = np.ones((1, 1, 70, 70), bool)
    mask[..., 3, :] = False  # fully masked with a finite fill: uniform weights, not NaN
    fill = float(np.finfo(np.float32).min)
    want = float64_attention(q, k, v, None, mask, 0.3, True, fill=fill)
    got = flash_attention(
        q, k, v, None, mask, scale=0.3, is_causal=1, mask_fill=fill, policy=SoftmaxPolicy(mode, block_size=16)
    )
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)


def test_online_never_allocates_a_whole_head_score_matrix(monkeypatch):
    import ortflash.kernels.reference as ref

    shapes = []
    real = ref._scores

    def spy(qg, kt, *args):
        out = real(qg, kt, *args)
        shapes.append(out.shape[-1])
        return out

    monkeypatch.setattr(ref, "_scores", spy)
    rng = np.random.default_rng(6)
    q = rng.standard_normal((1, 1, 8, 32), np.float32)
    k = rng.standard_normal((1, 1, 1000, 32), np.float32)
    flash_attention(q, k, k, scale=0.1, policy=SoftmaxPolicy("online", block_size=128))
    assert max(shapes) == 128 and len(shapes) == 8


@pytest.mark.parametrize("b,hq,hkv,sq,sk,d,dv,block", CASES)
def test_heads_split_over_threads_give_the_same_numbers(monkeypatch, b, hq, hkv, sq, sk, d, dv, block):
    import ortflash.kernels.reference as ref

    rng = np.random.default_rng(sk + d)
    q = rng.standard_normal((b, hq, sq, d), np.float32)
    k = rng.standard_normal((b, hkv, sk, d), np.float32)
    v = rng.standard_normal((b, hkv, sk, dv), np.float32)
    bias = rng.standard_normal((1, hq, sq, sk)).astype(np.float32)
    mask = rng.random((b, 1, 1, sk)) > 0.2
    serial = flash_attention(q, k, v, bias, mask, scale=0.2, masked_rows="zero", policy=SoftmaxPolicy("naive"))
    monkeypatch.setattr(ref, "_PARALLEL_MIN_SCORES", 0)
    split = flash_attention(q, k, v, bias, mask, scale=0.2, masked_rows="zero", policy=SoftmaxPolicy("naive"))
    np.testing.assert_array_equal(split, serial)


def test_a_3d_input_gets_the_4d_message_not_an_unpacking_error():
    q = np.zeros((2, 8, 4), np.float32)  # review B6: the shape was unpacked before ndim was checked
    k = v = np.zeros((1, 2, 8, 4), np.float32)
    with pytest.raises(ValueError, match="wants 4D Q, K, V"):
        flash_attention(q, k, v, scale=0.5)


@pytest.mark.parametrize("mode", ["naive", "online"])
@pytest.mark.parametrize("sq,sk", [(5, 40), (40, 40), (40, 5)])
@pytest.mark.parametrize("bias_after_mask", [0, 1])
def test_bottom_right_causal_and_bias_after_mask(mode, sq, sk, bias_after_mask):
    """is_causal=2 (query i sees keys j <= i + Sk - Sq) and the GPT-Neo order, against float64."""
    rng = np.random.default_rng(sq + sk)
    q = rng.standard_normal((2, 4, sq, 16), np.float32)
    k = rng.standard_normal((2, 2, sk, 16), np.float32)
    v = rng.standard_normal((2, 2, sk, 16), np.float32)
    bias = rng.standard_normal((2, 1, sq, sk)).astype(np.float32)
    mask = rng.random((2, 1, sq, sk)) > 0.2
    mask[:, :, 1] = False  # a row the mask removes: with a finite fill, fill + bias decides it
    for fill in (-np.inf, -100.0):  # -100: float32 keeps fill + bias to 8e-6 (at -1e4, 1e-3)
        want = float64_attention(q, k, v, bias, mask, 0.25, 2, fill, zero_rows=True, bias_after_mask=bias_after_mask)
        got = flash_attention(
            q,
            k,
            v,
            bias,
            mask,
            scale=0.25,
            is_causal=2,
            mask_fill=fill,
            masked_rows="zero",
            bias_after_mask=bias_after_mask,
            policy=SoftmaxPolicy(mode, block_size=16),
        )
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)
        if sq > sk and fill == -np.inf:  # the first Sq - Sk rows see no key
            assert (got[:, :, : sq - sk] == 0).all()


@pytest.mark.parametrize("backend", ["cpu", "reference", "wgpu"])
def test_no_keys_give_zeros_as_the_graph_does(backend):
    """Sk = 0 (a cross-attention cache with an empty encoder): the exported graph's empty softmax
    row times an empty V is zeros; the kernels gave NaN (0 / 0) before spec.py said so."""
    import onnxruntime as ort
    from attention_graphs import Variant, build, feeds

    import ortflash

    model = build(Variant(bias_shapes=(("B", 1, 1, "T"),)))
    fused, report = ortflash.optimize(model, target="ortflash")
    assert report.fused == 1
    inputs = feeds(model, {"B": 2, "S": 3, "T": 0}, np.random.default_rng(0))
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)[0]
    got = ortflash.InferenceSession(fused, backend=backend).run(None, inputs)[0]
    assert want.shape == got.shape == (2, 2, 3, 32)
    assert np.array_equal(got, want) and not np.abs(want).any()
