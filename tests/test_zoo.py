"""The model zoo: every exported model fuses all its attention blocks and computes what it did."""

import json
import os

import pytest

import ortflash
from ortflash.checks.feeds import make_feeds
from ortflash.checks.verify import verify
from ortflash.model_shapes import graphs_of

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
    assert total < 20 * 2**20
    assert {"bert", "gpt2", "vit"} <= {e["arch"] for e in ENTRIES}
    # issue 12: decoders with a KV cache, the merged If form, GPT-Neo and a model without shapes
    archs = {e["arch"] for e in ENTRIES}
    assert {"gpt2_cache", "llama_cache", "qwen2_cache", "mistral_cache", "llama_merged", "gpt_neo"} <= archs
    assert "bert_shapeless" in archs


def test_zoo_model_fuses_every_block(zoo_model):
    """Numerics are checked by `ortflash regress models/regress.toml` in .ci/run (both softmaxes,
    two input sizes, every target), the command users run; here: the structure of the result."""
    entry, model = zoo_model
    fused, report = ortflash.optimize(model, softmax="online", block_size=8, min_seq_len=0, target="ortflash")
    reasons = [b.reason for b in report.blocks if not b.fused]
    assert report.fused == entry["attention_blocks"], reasons
    # every graph: a merged decoder's blocks sit in its If branches
    nodes = [n for g in graphs_of(fused.graph) for n in g.node]
    assert sum(n.op_type == "FlashAttention" for n in nodes) == entry["attention_blocks"]
    assert not any(n.op_type == "Softmax" for n in nodes)


def test_zoo_model_verifies_in_both_softmaxes():
    """One model per family end to end in pytest too (the whole zoo runs through regress in CI)."""
    picked = {}
    for entry in ENTRIES:
        picked.setdefault(entry["arch"], entry)
    import onnx

    for entry in picked.values():
        model = onnx.load(os.path.join(ZOO, entry["file"]))
        for mode in ("naive", "online"):
            fused, _ = ortflash.optimize(model, softmax=mode, block_size=8, min_seq_len=0, target="ortflash")
            batch = 2 if entry.get("dynamic", {}).get("batch", True) else 1
            diffs = verify(model, fused, _feeds(model, entry, 21, batch))
            assert all(d.ok for d in diffs), (entry["file"], [(d.name, d.max_abs, d.nan_mismatch) for d in diffs])
            assert max(d.max_abs for d in diffs) < 1e-3


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e["kv_heads"] < e["num_heads"]], ids=lambda e: e["file"])
def test_grouped_kv_heads_are_read_without_the_repeat(entry):
    """Llama's repeat_kv (Unsqueeze→Expand→Reshape) is proved from static, inferred or
    TorchScript-computed shapes, so the fused node reads K and V with their own kv heads."""
    import onnx

    fused, report = ortflash.optimize(onnx.load(os.path.join(ZOO, entry["file"])), target="ortflash")
    assert all("repeat(k," in b.pattern for b in report.blocks), [b.pattern for b in report.blocks]
    nodes = [n for g in graphs_of(fused.graph) for n in g.node]
    made_by = {o: n.op_type for n in nodes for o in n.output}
    for node in (n for n in nodes if n.op_type == "FlashAttention"):
        assert made_by.get(node.input[1]) != "Reshape" and made_by.get(node.input[2]) != "Reshape"
    assert all(b.kv_heads == entry["kv_heads"] for b in report.blocks if isinstance(b.kv_heads, int))


# issue 12: prefill decoders whose [B, 1, S, S] mask is proved causal x key padding (fusion/causal)
PREFILL_DECODERS = ("gpt2", "llama", "qwen2", "mistral")


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e["arch"] in PREFILL_DECODERS], ids=lambda e: e["file"])
def test_prefill_decoders_are_proved_causal_and_lose_the_square_mask(entry):
    import onnx

    fused, report = ortflash.optimize(onnx.load(os.path.join(ZOO, entry["file"])), target="ortflash")
    nodes = [n for g in graphs_of(fused.graph) for n in g.node]
    causal = [next(a.i for a in n.attribute if a.name == "is_causal") for n in nodes if n.op_type == "FlashAttention"]
    assert causal == [1] * entry["attention_blocks"], [b.reason for b in report.blocks]
    # the ops that built the [B, 1, S, S] mask are gone (tests/test_causal_proof.py checks the run)
    assert not {"LessOrEqual", "GatherND"} & {n.op_type for n in nodes}


@pytest.mark.parametrize("target", ["contrib", "onnx"])
def test_the_shapeless_opset_12_model_fuses_and_lowers(target):
    """Issue 12: no value_info, opset 12: ONNX Runtime's symbolic shape inference proves the blocks;
    the lowering converts the fused model to opset 13 (contrib) or 23 (onnx) after fusion."""
    import onnx

    from ortflash.lowering import lower

    entry = next(e for e in ENTRIES if e["arch"] == "bert_shapeless")
    model = onnx.load(os.path.join(ZOO, entry["file"]))
    assert not model.graph.value_info
    if target == "onnx":
        lowered, report = ortflash.optimize(model, target=target)
        assert report.fused == entry["attention_blocks"] == 2
        assert [b.lowered_to for b in report.blocks] == ["Attention", "Attention"], [b.reason for b in report.blocks]
    else:
        fused, report = ortflash.optimize(model, target="ortflash")
        assert report.fused == 2
        lowered, notes = lower(fused, target)
        assert [n.op for n in notes] == ["com.microsoft.MultiHeadAttention"] * 2, notes
    assert not any(n.op_type == "FlashAttention" for n in lowered.graph.node)
    diffs = verify(model, lowered, make_feeds(model, seq_len=7, batch=2))
    assert all(d.ok for d in diffs), [(d.name, d.max_abs) for d in diffs]
