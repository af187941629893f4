"""ortflash validate: every fused node's kernel (compiled, numpy, and WGSL on the software Vulkan driver
in CI) against the naive ONNX Runtime subgraph it replaced."""

import json
import os

import numpy as np
import onnx
import pytest
from attention_graphs import Variant, build, tamper_scale

import ortflash
from ortflash import SoftmaxPolicy
from ortflash.checks.compare import compare
from ortflash.checks.feeds import make_feeds
from ortflash.checks.validate import in_subgraphs, validate
from ortflash.cli import main

ZOO = os.path.join(os.path.dirname(__file__), "..", "models")
ENTRIES = [e for e in json.load(open(os.path.join(ZOO, "manifest.json")))["models"] if e.get("file")]


def _wgsl_ready():
    from ortflash.kernels.wgpu import kernel as wgpu_kernel

    if not wgpu_kernel.available():
        pytest.skip(f"no WebGPU adapter at all: {wgpu_kernel.unavailable_reason()}")


@pytest.mark.parametrize("backend", ["cpu", "wgpu"])
@pytest.mark.parametrize("entry", ENTRIES, ids=[e["file"] for e in ENTRIES])
def test_every_fused_node_agrees_with_the_naive_ort_subgraph(entry, backend):
    if backend == "wgpu":
        _wgsl_ready()
    model = onnx.load(os.path.join(ZOO, entry["file"]))
    fused, _ = ortflash.optimize(model, target="ortflash")
    feeds = make_feeds(model, seq_len=13, batch=2)
    for softmax in ("naive", "online"):
        checks = validate(model, fused, feeds, backend=backend, policy=SoftmaxPolicy(softmax, block_size=8))
        # blocks inside If/Loop/Scan bodies are not validated node by node (verify covers them)
        assert len(checks) + in_subgraphs(fused) == entry["attention_blocks"]
        assert len(checks) > 0 or in_subgraphs(fused) > 0
        assert all(c.ok for c in checks), [(c.node, c.max_abs, c.nan_mismatch) for c in checks]


@pytest.mark.parametrize("backend", ["cpu", "reference", "wgpu", "wgsl"])  # wgsl: the CLI's older name for wgpu
def test_a_tampered_scale_fails(tmp_path, backend):
    if backend in ("wgpu", "wgsl"):
        _wgsl_ready()
    path = os.path.join(ZOO, "bert_eager_torchscript.onnx")
    fused, _ = ortflash.optimize(path, target="ortflash")
    tamper_scale(fused, 1.5)
    bad = str(tmp_path / "bad.onnx")
    onnx.save(fused, bad)
    assert main(["validate", path, "--optimized", bad, "--backend", backend]) == 1
    assert main(["validate", path, "--backend", backend]) == 0


def test_inference_session_runs_fused_nodes_through_wgsl():
    from ortflash.checks.sessions import run_model

    _wgsl_ready()
    path = os.path.join(ZOO, "gpt2_sdpa_dynamo.onnx")
    model = onnx.load(path)
    fused, _ = ortflash.optimize(model, target="ortflash")
    feeds = make_feeds(model, seq_len=11)
    want = run_model(model, feeds)
    sess = ortflash.InferenceSession(fused, backend="wgpu", softmax="online", block_size=4)
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    for name, w in want.items():
        np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-5)


def test_equal_infinities_agree_in_validate_as_in_verify():
    """B4: validate used its own comparison, in which inf - inf = NaN made equal outputs DIFFERENT."""

    model = build(Variant())
    fused, _ = ortflash.optimize(model, target="ortflash")
    feeds = make_feeds(model, seq_len=6)
    feeds["v"][:, :, 0, 0] = np.inf  # every row of the output's first column is +inf, here and in ORT
    feeds["v"][:, :, 0, 1] = -np.inf
    checks = validate(model, fused, feeds, backend="reference", policy=SoftmaxPolicy("naive"))
    assert [(c.ok, c.nan_mismatch) for c in checks] == [(True, 0)], checks


@pytest.mark.parametrize(
    ("expected", "actual", "ok"),
    [
        ([np.inf, -np.inf, 1.0], [np.inf, -np.inf, 1.0], True),
        ([np.inf, 1.0], [-np.inf, 1.0], False),
        ([np.inf, 1.0], [1e30, 1.0], False),
        ([np.nan, 1.0], [np.nan, 1.0], True),
        ([np.nan, 1.0], [0.0, 1.0], False),
    ],
)
def test_the_one_comparison(expected, actual, ok):
    diff = compare(np.array(expected, np.float32), np.array(actual, np.float32), "o", 1e-4, 1e-5)
    assert diff.ok is ok


def test_validate_block_size_alone_keeps_each_nodes_softmax():

    model = build(Variant())
    fused, _ = ortflash.optimize(model, softmax="auto", min_seq_len=4, target="ortflash")
    feeds = make_feeds(model, seq_len=6)
    checks = validate(model, fused, feeds, backend="reference", policy=SoftmaxPolicy.from_options(block_size=2))
    assert [(c.mode, c.ok) for c in checks] == [("online", True)]
