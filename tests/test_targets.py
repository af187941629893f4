"""The target registry: one record per target, fusion once per model, and the head count a user
gives written by the lowering that needs it (issue 21, item 2)."""

from __future__ import annotations

import importlib

import numpy as np
import onnx
import pytest
from attention_graphs import Variant, build

from ortflash import lowering
from ortflash.lowering.head_count import GivenHeads
from ortflash.lowering.targets import EXECUTION_PROVIDERS, ORT_KERNEL_TARGETS, PROVIDERS, REGISTRY, TARGETS
from ortflash.pipeline import fused_model, fused_rows
from ortflash.pipeline.optimize import optimize

# the module (the package exports its function under the same name)
pipeline = importlib.import_module("ortflash.pipeline.optimize")


def test_every_target_has_one_record_and_every_ep_order_names_registered_targets():
    assert TARGETS == ("ortflash", "contrib", "onnx", "cuda", "webgpu") == lowering.TARGETS
    assert [t.name for t in REGISTRY.values() if t.needs_ortflash] == ["ortflash"]
    assert ORT_KERNEL_TARGETS == ("contrib", "onnx")
    assert all(set(ep.targets) <= set(TARGETS) for ep in PROVIDERS.values())
    assert EXECUTION_PROVIDERS == ("cpu", "cuda", "webgpu") == tuple(ep.name for ep in PROVIDERS.values())


def _counting_shape_inference(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = pipeline.with_shapes

    def counted(model):
        calls.append(1)
        return real(model)

    monkeypatch.setattr(pipeline, "with_shapes", counted)
    return calls


def test_auto_fuses_once_and_lowers_the_same_fused_model_for_each_candidate(monkeypatch):
    # a finite fill above float32's lowest: no native op computes it, so contrib and onnx are both
    # passed over and the cpu order ends at ortflash, three candidates
    model = build(Variant(where_mask="keep", fill=-1e4))
    calls = _counting_shape_inference(monkeypatch)
    # (at a length where FlashAttention is the faster form, so no block is re-read to keep its ops)
    out, report = optimize(model, ep="cpu", seq_lens=[4096], load_check=lambda m, r: None)
    assert report.target is not None and report.target.chosen == "ortflash"
    assert len(report.target.tried) == 2  # contrib and onnx, each with its reason
    assert len(calls) == 1  # the pass ran shape inference and fusion once, not once per candidate
    assert [n.op_type for n in out.graph.node].count("FlashAttention") == 1


def test_candidates_do_not_share_report_rows():
    model = build(Variant(where_mask="keep"))
    _, contrib = optimize(model, target="contrib", load_check=lambda m, r: None)
    _, own = optimize(model, target="ortflash", load_check=lambda m, r: None)
    assert contrib.blocks[0].lowered_to == "com.microsoft.MultiHeadAttention"
    assert own.blocks[0].lowered_to is None and own.blocks[0].needs_ortflash


def _unproved_heads_model() -> onnx.ModelProto:
    """Q, K, V [B, H, S, D] with H a symbol nothing proves."""
    model = build(Variant(heads="H"))  # type: ignore[arg-type]
    return model


def test_a_given_head_count_is_written_by_the_lowering_and_never_left_in_the_output():
    model = _unproved_heads_model()
    own, own_report = optimize(model, target="ortflash", num_heads=2, load_check=lambda m, r: None)
    lowered, lowered_report = optimize(model, target="contrib", num_heads=2, load_check=lambda m, r: None)
    # FlashAttention reads heads from shapes at run time: no reshape is written for it
    assert not any(n.op_type == "Reshape" for n in own.graph.node)
    assert own_report.blocks[0].heads == 2 and "2 heads given" in own_report.blocks[0].reason
    # the native op takes the count as a number: Q, K and V are reshaped to it before the node
    reshapes = [n for n in lowered.graph.node if n.op_type == "Reshape" and "num_heads" in n.name]
    assert len(reshapes) == 3, [n.name for n in lowered.graph.node]
    assert lowered_report.blocks[0].lowered_to == "com.microsoft.MultiHeadAttention"
    # the count crosses from fusion to the lowering as a value, never as node metadata
    for m in (own, lowered):
        assert all("given_heads" not in p.key for n in m.graph.node for p in n.metadata_props)


def test_the_given_head_counts_are_returned_by_fusion_and_read_by_the_lowering(monkeypatch):
    """--num-heads crosses as typed per-row facts (lowering/head_count.GivenHeads, in the FusedModel's
    BlockFacts), not a string in the fused node's metadata: the fused model carries no mark, and lower() writes the count
    exactly where it is handed one."""
    returned: list[dict[int, GivenHeads]] = []
    prove = fused_rows.prove_heads

    def recording(*args, **kwargs):
        given = prove(*args, **kwargs)
        returned.append(given)
        return given

    monkeypatch.setattr(fused_model, "prove_heads", recording)
    fused, _ = optimize(_unproved_heads_model(), target="ortflash", num_heads=2, load_check=lambda m, r: None)
    assert returned == [{0: GivenHeads(2, (0, 1, 2))}]
    assert all("given_heads" not in p.key for n in fused.graph.node for p in n.metadata_props)

    unmarked, notes = lowering.lower(fused, "contrib")
    assert unmarked is fused and [n.lowered for n in notes] == [False]
    lowered, notes = lowering.lower(fused, "contrib", given_heads={0: GivenHeads(2, (0, 1, 2))})
    assert [n.lowered for n in notes] == [True]
    assert len([n for n in lowered.graph.node if n.op_type == "Reshape" and "num_heads" in n.name]) == 3


def test_a_wrong_given_head_count_fails_the_lowered_model_at_its_first_run():
    import onnxruntime as ort

    model = _unproved_heads_model()
    lowered, _ = optimize(model, target="contrib", num_heads=3, load_check=lambda m, r: None)
    session = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((1, 2, 5, 32)).astype(np.float32) for n in ("q", "k", "v")}
    with pytest.raises(Exception, match="(?i)reshape|shape"):
        session.run(None, feeds)


def test_auto_where_no_target_lowers_any_block_says_so_once():
    # issue 24 item 5: "contrib lowers the most" beside "passed over contrib: 1 of 1 not lowered"
    model = build(Variant(where_mask="keep", fill=-1e4))
    _, report = optimize(model, ep="cuda", load_check=lambda m, r: None)
    assert report.target is not None and report.target.chosen == "cuda"  # the first of PROVIDERS["cuda"].targets
    assert "lowers any block" in report.target.why and "lowers the most" not in report.target.why
    assert [t.split(":")[0] for t in report.target.tried] == ["contrib"]


def test_ep_with_a_fixed_target_is_refused():
    from ortflash.errors import OrtflashError

    with pytest.raises(OrtflashError, match="picks the target"):
        optimize(build(Variant()), target="contrib", ep="cpu")


def test_a_row_read_from_a_block_carries_head_counts_as_numbers_or_none():
    """The Softmax front end's columns hold numbers or None, never a dim's name: a row needs no
    scrub after fusion (Q, K, V are [B, H, S, 32] with H a symbol here)."""
    import onnx_ir as ir

    from ortflash.fusion.softmax import SoftmaxFrontEnd

    model = ir.serde.deserialize_model(_unproved_heads_model())
    front_end = SoftmaxFrontEnd()
    (softmax,) = front_end.candidates(model.graph)
    columns = front_end.columns(front_end.read(softmax, 17))
    assert (columns["heads"], columns["kv_heads"], columns["head_dim"]) == (None, None, 32)
