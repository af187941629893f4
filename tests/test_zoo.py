"""The model zoo: every exported model fuses all its attention blocks and computes what it did."""

import json
import os

import pytest

import ortflash
from ortflash.checks.feeds import make_feeds
from ortflash.checks.verify import verify

ZOO = os.path.join(os.path.dirname(__file__), "..", "models")
MANIFEST = json.load(open(os.path.join(ZOO, "manifest.json")))
ENTRIES = [e for e in MANIFEST["models"] if e.get("file") and e.get("check", {}).get("ok", True)]


def _feeds(model, entry, seq_len, batch):
    return make_feeds(model, seq_len=seq_len, batch=batch, dims=entry.get("feed_dims"))


@pytest.fixture(scope="module", params=ENTRIES, ids=[e["file"] for e in ENTRIES])
def zoo_model(request):
    import onnx

    entry = request.param
    return entry, onnx.load(os.path.join(ZOO, entry["file"]))


def test_zoo_is_small():
    total = sum(os.path.getsize(os.path.join(ZOO, e["file"])) for e in ENTRIES)
    assert total < 10 * 2**20
    assert {"bert", "gpt2", "vit"} <= {e["arch"] for e in ENTRIES}


@pytest.mark.parametrize("mode", ["naive", "online"])
def test_zoo_model_fuses_every_block_and_verifies(zoo_model, mode):
    entry, model = zoo_model
    fused, report = ortflash.optimize(model, softmax=mode, block_size=8, min_seq_len=0)
    reasons = [b.reason for b in report.blocks if not b.fused]
    assert report.fused == entry["attention_blocks"], reasons
    assert sum(n.op_type == "FlashAttention" for n in fused.graph.node) == entry["attention_blocks"]
    assert not any(n.op_type == "Softmax" for n in fused.graph.node)
    cases = [(1, 7), (2, 21)] if entry.get("dynamic", {}).get("seq", True) else [(2, None)]
    for batch, seq_len in cases:
        if not entry.get("dynamic", {}).get("batch", True):
            batch = 1
        feeds = _feeds(model, entry, seq_len or 16, batch)
        diffs = verify(model, fused, feeds)
        assert all(d.ok for d in diffs), [(d.name, d.max_abs, d.nan_mismatch) for d in diffs]
        assert max(d.max_abs for d in diffs) < 1e-3


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e["kv_heads"] < e["num_heads"]], ids=lambda e: e["file"])
def test_grouped_kv_heads_are_read_without_the_repeat(entry):
    """Llama's repeat_kv (Unsqueeze→Expand→Reshape) is proved from static, inferred or
    TorchScript-computed shapes, so the fused node reads K and V with their own kv heads."""
    import onnx

    fused, report = ortflash.optimize(onnx.load(os.path.join(ZOO, entry["file"])))
    assert all("repeat(k," in b.pattern for b in report.blocks), [b.pattern for b in report.blocks]
    made_by = {o: n.op_type for n in fused.graph.node for o in n.output}
    for node in (n for n in fused.graph.node if n.op_type == "FlashAttention"):
        assert made_by.get(node.input[1]) != "Reshape" and made_by.get(node.input[2]) != "Reshape"
    assert all(b.kv_heads == entry["kv_heads"] for b in report.blocks if isinstance(b.kv_heads, int))
