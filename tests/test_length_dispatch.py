"""A model that picks its form by the run's length (issue 30 items 4 and 5): an If per block on the
key length, the fused form from the cost table's crossover and the original ops below, one condition
per distinct length; both sides verified; a decoder with a KV cache dispatches its decode steps
apart from its prefill."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import ortflash
from ortflash.checks.feeds import decoder_cases, make_feeds
from ortflash.checks.verify import verify_every_softmax
from ortflash.model_shapes import with_shapes
from ortflash.op.node import DISPATCH_KEY
from ortflash.op.policy import SoftmaxPolicy
from ortflash.pipeline import forms
from ortflash.pipeline.length_dispatch import Threshold, dispatch
from ortflash.pipeline.optimize import optimize

ROOT = os.path.join(os.path.dirname(__file__), "..")
NO_CHECK = {"load_check": lambda m, r: None}
HEAD_DIM = 64


def _stack(stack: str = "padding", layers: int = 2) -> onnx.ModelProto:
    """benchmarks/cpu_attention.py's stack at 2 heads of 64 (small enough to run at its crossover)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import cpu_attention
    finally:
        sys.path.pop(0)
    return cpu_attention.build_model(layers, stack=stack, heads=2, head_dim=HEAD_DIM)


def _ifs(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == "If" and any(p.key == DISPATCH_KEY for p in n.metadata_props)]


def _meta(node: onnx.NodeProto) -> dict:
    return json.loads(next(p.value for p in node.metadata_props if p.key == DISPATCH_KEY))


def _exposed(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A copy that also outputs each If's condition: which side the run takes."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    conds = sorted({_meta(n)["condition"] for n in _ifs(model)})
    out.graph.output.extend(onnx.ValueInfoProto(name=c) for c in conds)
    return out, conds


def _unoptimized() -> ort.SessionOptions:
    """ONNX Runtime's graph optimizations off: its rewrites differ between a branch and the main graph,
    so only then does the original side compute the original's numbers bit for bit."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return so


def _sides(model: onnx.ModelProto, original: onnx.ModelProto, feeds: dict) -> tuple[list[bool], float]:
    """(each condition's value, the worst difference from the original) on ``feeds``."""
    exposed, conds = _exposed(model)
    got = ortflash.InferenceSession(exposed, sess_options=_unoptimized()).run(None, feeds)
    expected = ort.InferenceSession(
        original.SerializeToString(), _unoptimized(), providers=["CPUExecutionProvider"]
    ).run(None, feeds)
    n = len(original.graph.output)
    worst = max(float(np.abs(a.astype(np.float64) - b).max()) for a, b in zip(expected, got[:n]))
    return [bool(np.asarray(c).reshape(-1)[0]) for c in got[n:]], worst


def _crossover(kind: str) -> tuple[str, int]:
    policy = SoftmaxPolicy.for_new_nodes(online_softmax=True)
    form = forms.form_at("ortflash", policy, forms.MEASURED_UP_TO)
    assert form is not None
    at = forms.crossover(form, HEAD_DIM, kind)
    if at is None:
        pytest.skip(f"no form beats the original ops at any measured length for {kind} blocks of head dim {HEAD_DIM}")
    start = forms.choose("ortflash", policy, HEAD_DIM, None, kind, can_dispatch=True).dispatch_from
    assert start is not None and start >= at
    return form, start


@pytest.mark.parametrize(("stack", "kind"), [("padding", "padding"), ("causal_mask", "causal")])
def test_the_default_runs_the_fused_form_from_the_tables_crossover_and_the_original_ops_below(stack, kind):
    """With no --target and no --seq-lens, a dynamic-length block is fused behind an If on its key
    length whose threshold is the table's crossover: one key short of it the model runs the original
    ops (the same numbers, bit for bit), at it the fused form (the condition is true)."""
    _, start = _crossover(kind)
    model = _stack(stack)
    out, report = optimize(model, online_softmax=True, **NO_CHECK)
    assert report.fused == 2 and [b.fused_from for b in report.blocks] == [start, start]
    assert [b.mask_kind for b in report.blocks] == [kind, kind]
    assert all(b.reason.endswith(f"from {start} keys, original ops below") for b in report.blocks)
    ifs = _ifs(out)
    assert len(ifs) == 2 and {_meta(n)["key_len"] for n in ifs} == {start}
    onnx.checker.check_model(out)
    below, below_diff = _sides(out, model, make_feeds(model, seq_len=start - 1, batch=1))
    at, at_diff = _sides(out, model, make_feeds(model, seq_len=start, batch=1))
    assert below and not any(below) and below_diff == 0.0
    assert at and all(at) and 0.0 < at_diff < 1e-4


def test_one_condition_per_distinct_length_and_no_weight_moves_into_a_branch():
    model = _stack("padding", layers=3)
    out, report = optimize(model, online_softmax=True, **NO_CHECK)
    ifs = _ifs(out)
    assert len(ifs) == 3 and len({i.input[0] for i in ifs}) == 1
    lengths = [n for n in out.graph.node if n.name.startswith("ortflash/length_dispatch") and n.op_type == "Shape"]
    assert len(lengths) == 1 and lengths[0].input[0] in {i.name for i in out.graph.input}
    for node in ifs:  # no initializer in a branch: the Q/K/V projections and their weights stay outside
        for attr in node.attribute:
            assert not attr.g.initializer and "MatMul" in {n.op_type for n in attr.g.node} | {"MatMul"}
    assert {t.name for t in model.graph.initializer} <= {t.name for t in out.graph.initializer}


def test_seq_lens_fix_the_form_with_no_if():
    _, start = _crossover("padding")
    out, report = optimize(_stack(), online_softmax=True, seq_lens=[start], **NO_CHECK)
    assert report.fused == 2 and not _ifs(out) and all(b.fused_from is None for b in report.blocks)


def test_both_sides_are_verified_against_the_original_on_padded_inputs():
    """verify runs each If on both sides, and says so in each run (random inputs pad the mask)."""
    _, start = _crossover("padding")
    model = _stack()
    out, _ = optimize(model, online_softmax=True, **NO_CHECK)
    result = verify_every_softmax(model, out)
    assert result.ok
    sides = [set(run.dispatch.values()) for run in result.runs]
    assert {"original ops"} in sides and {"fused"} in sides
    fused_run = next(run for run in result.runs if run.dispatch and set(run.dispatch.values()) == {"fused"})
    assert min(fused_run.inputs["hidden_states"][1], fused_run.inputs["attention_mask"][1]) >= start
    assert set(fused_run.modes) and set(fused_run.key_lengths.values()) >= {start}
    for run in result.runs:  # every run's mask pads
        assert 0 < int(make_feeds(model, seq_len=run.inputs["attention_mask"][1], batch=2)["attention_mask"].sum())
        assert (make_feeds(model, seq_len=run.inputs["attention_mask"][1], batch=2)["attention_mask"] == 0).any()


def test_the_witness_writes_the_original_ops_on_both_sides():
    """benchmarks/length_dispatch.py's witness: the If alone, the same numbers on both sides."""
    model = _stack()
    fused, report = optimize(model, online_softmax=True, target="ortflash", **NO_CHECK)
    witness = dispatch(model, fused, {0: Threshold(8), 1: Threshold(8)}, with_shapes(model)[0], witness=True)
    assert not witness.left and not any(n.op_type == "FlashAttention" for n in _all_nodes(witness.model))
    for seq in (4, 16):
        sides, diff = _sides(witness.model, model, make_feeds(model, seq_len=seq, batch=2))
        assert sides == [seq >= 8] and diff == 0.0


def _all_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    from ortflash.model_io import graphs_of

    return [n for g in graphs_of(model.graph) for n in g.node]


def test_a_decoder_with_a_kv_cache_dispatches_its_decode_steps_apart_from_its_prefill():
    """A cache decoder's blocks read the query length too: a prefill (queries = keys) takes the fused
    form from the prefill crossover, a one-query step only from the decode crossover."""
    path = os.path.join(ROOT, "models", "llama_cache_eager_torchscript.onnx")
    model = onnx.load(path)
    fused, report = optimize(path, online_softmax=True, target="ortflash", **NO_CHECK)
    rows = {i: Threshold(16, 48) for i, b in enumerate(report.blocks) if b.fused}
    built = dispatch(model, fused, rows, with_shapes(model)[0])
    assert not built.left and len(built.rows) == 2
    onnx.checker.check_model(built.model)
    ortflash_session = ortflash.InferenceSession(_exposed(built.model)[0], sess_options=_unoptimized())
    original = ort.InferenceSession(path, _unoptimized(), providers=["CPUExecutionProvider"])
    taken = {}
    for length in (8, 24, 56):
        for words, dims in decoder_cases(model, seq_len=length, batch=1):
            feeds = make_feeds(model, seq_len=length, batch=1, dims=dims)
            got = ortflash_session.run(None, feeds)
            expected = original.run(None, feeds)
            diff = max(float(np.abs(a - b).max()) for a, b in zip(expected, got))
            side = [bool(np.asarray(c).reshape(-1)[0]) for c in got[len(expected) :]]
            assert diff < 1e-4, (words, diff)
            taken[(words.split(":")[0], length)] = side, diff

    def side(case: str, length: int) -> set[bool]:
        return set(taken[(case, length)][0])

    assert side("prefill", 8) == {False} and taken[("prefill", 8)][1] == 0.0
    assert side("prefill", 24) == {True} and side("prefill", 56) == {True}
    # decode: `length` cached tokens + 1 new; past 16 but under 48 keys a step keeps the original ops
    assert side("decode", 24) == {False} and taken[("decode", 24)][1] == 0.0
    assert side("decode", 56) == {True}


def test_a_kept_row_is_one_sentence_with_its_mask_kind_and_the_explanation_once_under_the_table():
    from rich.console import Console

    # T5: the three blocks with a position bias (a full bias) are kept; its cross block's padding is fused
    path = os.path.join(ROOT, "models", "t5_sdpa_dynamo.onnx")
    out, report = optimize(path, online_softmax=True, **NO_CHECK)
    kept = [b for b in report.blocks if not b.fused]
    assert kept and all(b.mask_kind for b in kept)  # --json's mask_kind filled for kept blocks
    assert all(len(b.reason) < 120 and "(" in b.reason for b in kept)
    assert all(f"{forms.results_path(b.mask_kind)}" in b.detail for b in kept)
    buffer = io.StringIO()
    report.print(Console(file=buffer, width=100))
    text = buffer.getvalue()
    assert text.count(kept[0].detail) == 1 and "[1]" in text  # whole, once, however many rows cite it
    assert all(b.detail == kept[0].detail for b in kept)


def test_the_dispatched_model_is_the_same_bytes_in_every_process() -> None:
    """The written node order must not follow a set's per-process iteration order (it did: three
    runs of the default on llama_eager_dynamo gave three different files)."""
    import subprocess

    script = (
        "import hashlib, sys, warnings; warnings.filterwarnings('ignore'); import ortflash\n"
        "m, r = ortflash.optimize(sys.argv[1], online_softmax=True)\n"
        "assert any(n.op_type == 'If' for n in m.graph.node)\n"
        "print(hashlib.sha1(m.SerializeToString()).hexdigest())\n"
    )
    model = str(Path(__file__).resolve().parents[1] / "models" / "llama_eager_dynamo.onnx")
    digests = {
        subprocess.run(
            [sys.executable, "-c", script, model],
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for seed in (1, 2, 3)
    }
    assert len(digests) == 1, digests
