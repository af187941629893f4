"""ortflash validate: every fused node's kernel (numpy, and WGSL on the software Vulkan driver
in CI) against the naive ONNX Runtime subgraph it replaced."""

import json
import os

import onnx
import pytest
from attention_graphs import tamper_scale

import ortflash
from ortflash.cli import main
from ortflash.validate import validate
from ortflash.verify import make_feeds

ZOO = os.path.join(os.path.dirname(__file__), "..", "models")
ENTRIES = [e for e in json.load(open(os.path.join(ZOO, "manifest.json")))["models"] if e.get("file")]


def _wgsl_ready():
    from ortflash.ops import wgpu_kernel

    if not wgpu_kernel.available():
        pytest.skip(f"no WebGPU adapter at all: {wgpu_kernel.unavailable_reason()}")


@pytest.mark.parametrize("backend", ["cpu", "wgsl"])
@pytest.mark.parametrize("entry", ENTRIES, ids=[e["file"] for e in ENTRIES])
def test_every_fused_node_agrees_with_the_naive_ort_subgraph(entry, backend):
    if backend == "wgsl":
        _wgsl_ready()
    model = onnx.load(os.path.join(ZOO, entry["file"]))
    fused, _ = ortflash.optimize(model)
    feeds = make_feeds(model, seq_len=13, batch=2)
    for softmax in ("naive", "online"):
        checks = validate(model, fused, feeds, backend=backend, softmax=softmax, block_size=8)
        assert len(checks) == entry["attention_blocks"]
        assert all(c.ok for c in checks), [(c.node, c.max_abs, c.nan_mismatch) for c in checks]


@pytest.mark.parametrize("backend", ["cpu", "wgsl"])
def test_a_tampered_scale_fails(tmp_path, backend):
    if backend == "wgsl":
        _wgsl_ready()
    path = os.path.join(ZOO, "bert_eager_torchscript.onnx")
    fused, _ = ortflash.optimize(path)
    tamper_scale(fused, 1.5)
    bad = str(tmp_path / "bad.onnx")
    onnx.save(fused, bad)
    assert main(["validate", path, "--optimized", bad, "--backend", backend]) == 1
    assert main(["validate", path, "--backend", backend]) == 0


def test_inference_session_runs_fused_nodes_through_wgsl():
    import numpy as np

    from ortflash.verify import run_model

    _wgsl_ready()
    path = os.path.join(ZOO, "gpt2_sdpa_dynamo.onnx")
    model = onnx.load(path)
    fused, _ = ortflash.optimize(model)
    feeds = make_feeds(model, seq_len=11)
    want = run_model(model, feeds)
    sess = ortflash.InferenceSession(fused, backend="wgpu", softmax="online", block_size=4)
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    for name, w in want.items():
        np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-5)
    ortflash.session_options(backend="numpy")  # leave the process-wide kernel as it was
