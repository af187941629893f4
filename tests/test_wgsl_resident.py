"""Tensors that stay on the GPU: DeviceTensor in and out of the WGSL kernels (lavapipe in CI).

The resident path must give bit-for-bit the numpy path's results (same kernel, same
tile), upload K and V once however many calls read them, and reuse its buffers.
"""

from __future__ import annotations

import numpy as np
import pytest

from ortflash.kernels.wgpu import DeviceTensor
from ortflash.kernels.wgpu import kernel as wk
from ortflash.op import spec

pytestmark = pytest.mark.skipif(not wk.available(), reason=wk.unavailable_reason() or "no wgpu adapter")


@pytest.fixture(scope="module")
def runner():
    return wk.runner()


def qkv(seed, b=1, hq=2, hkv=2, sq=70, sk=90, d=64, dv=None, dtype=np.float32):
    rng = np.random.default_rng(seed)
    shapes = ((b, hq, sq, d), (b, hkv, sk, d), (b, hkv, sk, dv or d))
    return tuple(rng.standard_normal(shape).astype(dtype) for shape in shapes)


@pytest.mark.parametrize("d", [64, 30])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_round_trip_is_exact(runner, d, dtype):
    """to_device then to_host gives the array back unchanged, D not a multiple of 4 included."""
    x = np.random.default_rng(d).standard_normal((2, 3, 17, d)).astype(dtype)
    t = wk.to_device(x)
    assert isinstance(t, DeviceTensor) and t.shape == x.shape and t.padded_dim == -(-d // 4) * 4
    assert t.dtype == (dtype if runner.has_f16 else np.float32)
    back = wk.to_host(t)
    assert back.shape == x.shape and np.array_equal(back.astype(dtype), x)


@pytest.mark.parametrize("kernel", ["flash", "naive"])
def test_resident_equals_numpy_path(runner, kernel):
    """DeviceTensors in, DeviceTensor out: the same numbers as numpy in, numpy out, bit for bit,
    with a mask, causal, grouped KV heads and Dv != D."""
    q, k, v = qkv(1, b=2, hq=4, hkv=2, sq=70, sk=90, d=64, dv=36)
    mask = np.random.default_rng(2).random((2, 1, 70, 90)) > 0.2
    attrs = spec.validate({"scale": 0.125, "is_causal": 1})
    want = runner.attention(q, k, v, mask=mask, attrs=attrs, kernel=kernel)
    o = runner.attention_resident(wk.to_device(q), wk.to_device(k), v, mask=mask, attrs=attrs, kernel=kernel)
    assert o.shape == (2, 4, 70, 36)
    got = wk.to_host(o)
    assert np.array_equal(got, want, equal_nan=True)


def test_kv_uploaded_once_for_several_calls(runner):
    """Three calls (three "nodes") reading the same K and V: K and V go up once, in to_device;
    each call uploads only its own Q."""
    q, k, v = qkv(3, sq=40, sk=120)
    k_dev, v_dev = wk.to_device(k), wk.to_device(v)
    before = dict(runner.uploads)
    outs = [wk.run_resident(q * (i + 1), k_dev, v_dev, scale=0.125, softmax="online") for i in range(3)]
    after = runner.uploads
    assert after["k"] == before.get("k", 0) and after["v"] == before.get("v", 0)
    assert after["q"] == before.get("q", 0) + 3
    for i, o in enumerate(outs):
        want = wk.flash_attention(q * (i + 1), k, v, scale=0.125, softmax="online")
        assert np.array_equal(wk.to_host(o), want)


def test_chained_calls_stay_on_the_device(runner):
    """One call's output is the next call's query, with no read-back between them."""
    q, k, v = qkv(4, sq=33, sk=65, d=32)
    k_dev, v_dev = wk.to_device(k), wk.to_device(v)
    o1 = wk.run_resident(wk.to_device(q), k_dev, v_dev, scale=0.3, softmax="online")
    o2 = wk.run_resident(o1, k_dev, v_dev, scale=0.3, softmax="online", is_causal=1)
    step1 = wk.flash_attention(q, k, v, scale=0.3, softmax="online")
    step2 = wk.flash_attention(step1, k, v, scale=0.3, softmax="online", is_causal=1)
    assert np.array_equal(wk.to_host(o2), step2)


def test_out_buffer_is_reused_and_checked(runner):
    """out= is written in place (the same buffer comes back); an out that is also an input, or has
    the wrong shape, is refused before anything runs."""
    q, k, v = qkv(5, sq=20, sk=50, d=32)
    q_dev, k_dev, v_dev = (wk.to_device(t) for t in (q, k, v))
    out = runner.empty_tensor((1, 2, 20, 32), np.dtype(np.float32))
    got = wk.run_resident(q_dev, k_dev, v_dev, scale=0.2, out=out)
    assert got is out and np.array_equal(wk.to_host(out), wk.flash_attention(q, k, v, scale=0.2))
    with pytest.raises(ValueError, match="input of the same call"):
        wk.run_resident(q_dev, k_dev, v_dev, scale=0.2, out=q_dev)
    with pytest.raises(ValueError, match="this call writes"):
        wk.run_resident(q_dev, k_dev, v_dev, scale=0.2, out=runner.empty_tensor((1, 2, 21, 32), np.float32))


def test_read_back_buffer_reused_and_sync(runner):
    """to_host reuses one mapped read-back buffer across calls; sync() waits and reports the device time."""
    q, k, v = qkv(6, sq=30, sk=30, d=32)
    o = wk.run_resident(q, k, v, scale=0.2)
    device_ms = runner.sync()
    assert (device_ms is not None and device_ms > 0) == runner.has_timestamps
    wk.to_host(o)
    staging = runner._buffers["staging"]
    wk.to_host(wk.run_resident(q, k, v, scale=0.2))
    assert runner._buffers["staging"] is staging


def test_mixed_dtypes_refused(runner):
    if not runner.has_f16:
        pytest.skip("the device has no shader-f16")
    q, k, v = qkv(7, sq=8, sk=8, d=8)
    with pytest.raises(ValueError, match="share a dtype"):
        wk.run_resident(wk.to_device(q), wk.to_device(k.astype(np.float16)), v, scale=1.0)


def test_empty_queries_and_dtype_of_mixed_operands(runner):
    """No query rows: an empty DeviceTensor, nothing run. A numpy Q beside float16 DeviceTensors
    is converted to float16, and the result matches the numpy path in float16."""
    k = np.random.default_rng(8).standard_normal((1, 2, 5, 8)).astype(np.float32)
    o = wk.run_resident(np.zeros((1, 2, 0, 8), np.float32), wk.to_device(k), wk.to_device(k), scale=1.0)
    assert o.shape == (1, 2, 0, 8) and wk.to_host(o).shape == (1, 2, 0, 8)
    if not runner.has_f16:
        return
    q, k, v = qkv(9, sq=7, sk=9, d=8)
    k16, v16 = k.astype(np.float16), v.astype(np.float16)
    o = wk.run_resident(q, wk.to_device(k16), wk.to_device(v16), scale=0.5)
    assert o.dtype == np.float16
    assert np.array_equal(wk.to_host(o), wk.flash_attention(q.astype(np.float16), k16, v16, scale=0.5))
