"""A FlashAttention node's fixed cost (issue 20, item 1): what the bridge does per call, and the
kernel's small-call paths.

Per call the bridge now runs a call prepared once per node (``cpu.PreparedCall``): nothing that
depends on the attributes alone is resolved again, and whatever the compiled kernel refuses goes
the general way. These tests count that work and check the prepared call against
``cpu.flash_attention`` and the float64 truth; the speed itself is in benchmarks/fixed_cost.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ortflash
from ortflash.kernels import cpu, ort_bridge, reference

pytestmark = pytest.mark.skipif(not cpu.available(), reason="no compiled kernel")


def _block(heads: int, seq: int, dim: int) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, heads, seq, dim]) for n in "qkv"]
    inputs.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, [1, 1, 1, seq]))
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["ss"]),
        helper.make_node("Add", ["ss", "bias"], ["sb"]),
        helper.make_node("Softmax", ["sb"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["o"]),
    ]
    scale = onnx.numpy_helper.from_array(np.array(dim**-0.5, np.float32), "scale")
    out = [helper.make_tensor_value_info("o", TensorProto.FLOAT, [1, heads, seq, dim])]
    graph = helper.make_graph(nodes, "block", inputs, out, [scale])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _fused(model: onnx.ModelProto) -> onnx.ModelProto:
    try:  # short blocks keep their original ops by default: fuse anyway
        fused, report = ortflash.optimize(model, target="ortflash")
    except ValueError:
        fused, report = ortflash.optimize(model, target="ortflash")
    assert report.fused == 1
    return fused


def _feeds(heads: int, seq: int, dim: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {n: rng.standard_normal((1, heads, seq, dim), dtype=np.float32) for n in "qkv"}
    out["bias"] = np.where(np.arange(seq) < seq - 3, 0.0, -1e9).astype(np.float32).reshape(1, 1, 1, seq)
    return out


def test_a_call_resolves_nothing_that_depends_on_the_attributes_alone(monkeypatch):
    """Before: every call went through cpu.flash_attention, which looked its KernelCall up
    (building a key of every attribute), re-read the CPU build and the affinity mask."""
    ort_bridge._node_call_cached.cache_clear()
    model = _block(2, 16, 32)
    f = _feeds(2, 16, 32)
    session = ortflash.InferenceSession(_fused(model), threads=1, native=False)
    counts = {"kernel_call": 0, "default_threads": 0, "selection": 0}
    for name in counts:
        real = getattr(cpu, name)

        def counting(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            counts[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(cpu, name, counting)
    first = session.run(None, f)[0]
    assert counts == {"kernel_call": 1, "default_threads": 0, "selection": 1}  # prepared once
    for _ in range(5):
        np.testing.assert_array_equal(session.run(None, f)[0], first)
    assert counts == {"kernel_call": 1, "default_threads": 0, "selection": 1}
    plain = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, f)[0]
    np.testing.assert_allclose(first, plain, rtol=1e-5, atol=1e-6)


def test_a_replaced_kernel_still_runs(monkeypatch):
    """The prepared calls stand for cpu.flash_attention: a replacement (a test's wrong kernel) is called."""
    ort_bridge._node_call_cached.cache_clear()
    session = ortflash.InferenceSession(_fused(_block(1, 16, 32)), native=False)
    f = _feeds(1, 16, 32)
    right = session.run(None, f)[0]
    real = cpu.flash_attention
    monkeypatch.setattr(cpu, "flash_attention", lambda *a, **kw: real(*a, **kw) + 1.0)
    np.testing.assert_allclose(session.run(None, f)[0], right + 1.0, rtol=1e-6)


def _prepared(**attrs: Any) -> cpu.PreparedCall:
    prepared = cpu.prepare(attrs, threads=2)
    assert prepared is not None
    return prepared


@pytest.mark.parametrize(
    "case",
    ["float64", "bias of rank 2", "bias that does not broadcast", "no keys", "strided q", "float16", "gqa"],
)
def test_what_the_compiled_kernel_refuses_goes_the_general_way(case):
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 4, 5, 8), dtype=np.float32) for _ in range(3))
    bias: np.ndarray | None = rng.standard_normal((1, 1, 1, 5)).astype(np.float32)
    if case == "float64":
        q = q.astype(np.float64)
    elif case == "bias of rank 2":
        bias = np.zeros((1, 5), np.float32) + 0.5
    elif case == "bias that does not broadcast":
        bias = np.zeros((1, 1, 1, 4), np.float32)
    elif case == "no keys":
        k, v = k[:, :, :0], v[:, :, :0]
    elif case == "strided q":
        q = np.ascontiguousarray(np.swapaxes(q, 2, 3)).swapaxes(2, 3)
    elif case == "float16":
        q, k, v = (t.astype(np.float16) for t in (q, k, v))
    elif case == "gqa":
        k, v = k[:, :2], v[:, :2]
    prepared = _prepared(scale=0.3)
    try:
        expected = cpu.flash_attention(q, k, v, bias, None, scale=0.3, threads=2)
    except Exception as exc:  # the same error either way
        with pytest.raises(type(exc)):
            prepared(q, k, v, bias, None)
        return
    got = prepared(q, k, v, bias, None)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("d", [16, 20, 32, 64])
@pytest.mark.parametrize("sk", [1, 16, 37, 300])
@pytest.mark.parametrize("mode", ["naive", "online"])
def test_transposed_scores_of_the_direct_path(d, sk, mode):
    """Sq = 16 rows per kv head (and 8, GQA): the direct path scores through a transposed key
    chunk (two chunks at 300 keys); against the float64 reference, with a padding mask and causal."""
    rng = np.random.default_rng(d + sk)
    for hq, hkv, sq in ((3, 3, 16), (8, 2, 2), (4, 1, 4)):
        q = rng.standard_normal((2, hq, sq, d), dtype=np.float32)
        k, v = (rng.standard_normal((2, hkv, sk, d), dtype=np.float32) for _ in range(2))
        mask = rng.random((2, 1, 1, sk)) > 0.3
        mask[..., 0] = True
        for attrs in ({}, {"is_causal": 2}):
            got = cpu.flash_attention(q, k, v, None, mask, softmax=mode, block_size=32, scale=d**-0.5, **attrs)
            truth = reference.flash_attention(
                *(t.astype(np.float64) for t in (q, k, v)), None, mask, softmax="naive", scale=d**-0.5, **attrs
            )
            np.testing.assert_allclose(got, truth, rtol=2e-5, atol=2e-6)
