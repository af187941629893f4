"""An If on the length inside an If's branch (issue 30 item 4, a merged decoder): the blocks of
llama_merged, which live in the branches of its use_cache_branch If, get a fused path behind an
If nested in the branch that holds them; plain ONNX Runtime runs each side at the table's
crossover in both softmax modes; verify runs both sides of every nested If against the original,
forcing the fused side where the model does not run at the crossover (a short position table)."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import ortflash
from ortflash.checks.feeds import make_feeds
from ortflash.checks.verify import verify_every_softmax
from ortflash.model_io import graphs_of
from ortflash.op.node import BLOCK_ID, DISPATCH_KEY
from ortflash.op.policy import SoftmaxPolicy
from ortflash.pipeline import forms
from ortflash.pipeline.optimize import optimize

ROOT = os.path.join(os.path.dirname(__file__), "..")
MERGED = os.path.join(ROOT, "models", "llama_merged_eager_torchscript.onnx")
WHISPER_MERGED = os.path.join(ROOT, "tests", "data", "outside", "optimum_whisper_decoder_model_merged.onnx")
HEAD_DIM = 16  # llama_merged's


def _dispatch_ifs(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    return [n for n in graph.node if n.op_type == "If" and any(p.key == DISPATCH_KEY for p in n.metadata_props)]


def _branches(model: onnx.ModelProto) -> dict[str, onnx.GraphProto]:
    return {a.name: a.g for a in model.graph.node[0].attribute if a.type == onnx.AttributeProto.GRAPH}


def _start() -> int:
    """Where the causal table says a dispatched block of llama_merged's head dim takes the fused form."""
    policy = SoftmaxPolicy.for_new_nodes(online_softmax=True)
    choice = forms.choose(
        "ortflash", policy, HEAD_DIM, None, "causal", can_dispatch=True, cpu_class=forms.running_cpu_class()
    )
    start = choice.dispatch_from
    if start is None:
        pytest.skip(f"no form beats the original ops at any measured length for causal blocks of head dim {HEAD_DIM}")
    return start


@pytest.fixture
def merged() -> tuple[onnx.ModelProto, ortflash.Report]:
    """The default, with its load check: the file ONNX Runtime opens (a model it cannot is never written).
    Per test: conftest pins the CPU class for each test, after a module's fixtures are made."""
    return optimize(MERGED, online_softmax=True)


def test_the_merged_decoders_four_blocks_get_a_fused_path_in_the_branches_that_hold_them(merged) -> None:
    """Failed before: 0 of 4 fused, each row kept ("the length is known only at run time"), as an If on
    the length was written around main-graph blocks only."""
    out, report = merged
    start = _start()
    assert report.fused == 4 and [b.fused_from for b in report.blocks] == [start] * 4
    assert all(b.reason.endswith(f"from {start} keys, original ops below") for b in report.blocks)
    assert not _dispatch_ifs(out.graph) and [n.op_type for n in out.graph.node] == ["If"]
    branches = _branches(out)
    for name, branch in branches.items():  # two blocks per branch, each its own If, its condition there
        ifs = _dispatch_ifs(branch)
        assert len(ifs) == 2, name
        made = {o for n in branch.node for o in n.output}
        assert all(i.input[0] in made for i in ifs)
        assert {
            json.loads(next(p.value for p in i.metadata_props if p.key == DISPATCH_KEY))["key_len"] for i in ifs
        } == {start}
        # the fused node is inside the nested If's fused branch, not in the decoder's branch itself
        assert not [n for n in branch.node if n.op_type == "FlashAttention"]
        fused_sides = [a.g for i in ifs for a in i.attribute if a.name == "then_branch"]
        flash = [n for side in fused_sides for g in graphs_of(side) for n in g.node if n.op_type == "FlashAttention"]
        assert len(flash) == 2 and all(any(p.key == BLOCK_ID for p in n.metadata_props) for n in flash)
    # no weight is copied into a branch: they stay the main graph's initializers
    original = onnx.load(MERGED)
    assert {t.name for t in original.graph.initializer} <= {t.name for t in out.graph.initializer}
    onnx.checker.check_model(out)


def _with_softmax(model: onnx.ModelProto, mode: str) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for graph in graphs_of(copy.graph):
        for node in graph.node:
            if node.op_type == "FlashAttention":
                for attr in node.attribute:
                    if attr.name == "softmax":
                        attr.s = mode.encode()
    return copy


def _unoptimized(base: ort.SessionOptions | None = None) -> ort.SessionOptions:
    so = base or ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return so


@pytest.mark.parametrize("softmax", ["naive", "online"])
def test_plain_onnx_runtime_runs_each_branch_on_each_side_of_the_crossover(merged, softmax) -> None:
    """onnxruntime.InferenceSession on the CPU EP (ortflash.session_options), each decoder branch
    (use_cache_branch False: no cache; True: a cache, here a prefill from an empty one): one key short
    of the crossover the original ops, bit for bit; at it the fused node (the numbers move)."""
    out, _ = merged
    start = _start()
    model = _with_softmax(out, softmax)
    session = ort.InferenceSession(
        model.SerializeToString(), _unoptimized(ortflash.session_options()), providers=["CPUExecutionProvider"]
    )
    original = ort.InferenceSession(MERGED, _unoptimized(), providers=["CPUExecutionProvider"])
    dims = {"past": 0}
    for use_cache in (False, True):
        diffs = []
        for length in (start - 1, start):
            feeds = make_feeds(
                onnx.load(MERGED), seq_len=length, batch=1, dims={**dims, "seq": length, "total": length}
            )
            feeds["use_cache_branch"] = np.array([use_cache])
            got, expected = session.run(None, feeds), original.run(None, feeds)
            diffs.append(max(float(np.abs(a.astype(np.float64) - b).max()) for a, b in zip(expected, got)))
        assert diffs[0] == 0.0 and 0.0 < diffs[1] < 1e-4, (use_cache, diffs)


def test_verify_runs_both_sides_of_every_nested_if_in_both_softmaxes(merged) -> None:
    out, _ = merged
    result = verify_every_softmax(MERGED, out)
    assert result.ok
    sides: dict[str, set[str]] = {}
    modes: dict[str, set[str]] = {}
    for run in result.runs:
        for name, side in run.dispatch.items():
            sides.setdefault(name, set()).add(side)
        for node, mode in run.modes.items():
            modes.setdefault(node, set()).add(mode)
    assert len(sides) == 4 and all(s == {"fused", "original ops"} for s in sides.values()), sides
    assert len(modes) == 4 and all(m == {"naive", "online"} for m in modes.values()), modes
    # the branch without a cache is reached by setting the input its If reads
    assert any("use_cache_branch=False" in run.why for run in result.runs)
    assert not any("forced" in run.why for run in result.runs)  # every side ran at a length the model takes


def test_a_nested_if_the_model_cannot_run_at_the_crossover_of_has_its_fused_side_forced() -> None:
    """optimum's whisper decoder has 64 positions, under its blocks' crossover: the fused side runs
    with the thresholds at 0 in verify's copy, on the first inputs, in both branches."""
    out, report = optimize(WHISPER_MERGED, online_softmax=True)
    dispatched = [b for b in report.blocks if b.fused_from]
    assert len(dispatched) >= 2
    assert min(b.fused_from for b in dispatched) > 64  # past its positions: plain lengths never reach it
    result = verify_every_softmax(WHISPER_MERGED, out)
    assert result.ok
    forced = [run for run in result.runs if run.why.startswith("fused side forced")]
    assert len(forced) == 2 and all(set(run.dispatch.values()) == {"fused"} for run in forced)  # one per branch
    fused = {name for run in result.runs for name, side in run.dispatch.items() if side == "fused"}
    original = {name for run in result.runs for name, side in run.dispatch.items() if side == "original ops"}
    assert len(fused) == len(dispatched) and fused == original
    ran: dict[str, set[str]] = {}
    for run in result.runs:
        for node, mode in run.modes.items():
            ran.setdefault(node, set()).add(mode)
    assert len(ran) == len(dispatched) and all(modes == {"naive", "online"} for modes in ran.values()), ran


def test_ifs_two_levels_deep_are_written_and_each_side_verified(tmp_path) -> None:
    """llama_merged's If inside both branches of another If on a boolean input: 8 blocks, each its
    If in its own branch two levels down; verify reaches each through both inputs the Ifs read."""
    import copy

    from onnx import helper

    model = onnx.load(MERGED)
    graph = model.graph
    merged_if = graph.node[0]
    branches = {
        side: helper.make_graph(
            [copy.deepcopy(merged_if)], f"outer_{side}", [], [copy.deepcopy(o) for o in graph.output]
        )
        for side in ("then", "else")
    }
    outer = helper.make_node(
        "If",
        ["outer_flag"],
        [o.name for o in graph.output],
        name="outer/if",
        then_branch=branches["then"],
        else_branch=branches["else"],
    )
    del graph.node[:]
    graph.node.append(outer)
    graph.input.append(helper.make_tensor_value_info("outer_flag", onnx.TensorProto.BOOL, [1]))
    path = str(tmp_path / "deep.onnx")
    onnx.save(model, path)
    out, report = optimize(path, online_softmax=True)
    assert report.fused == 8 and all(b.fused_from == _start() for b in report.blocks)
    depth_two = [
        n
        for outer_branch in out.graph.node[0].attribute
        for node in outer_branch.g.node
        for branch in node.attribute
        if branch.type == onnx.AttributeProto.GRAPH
        for n in _dispatch_ifs(branch.g)
    ]
    assert len(depth_two) == 8
    result = verify_every_softmax(path, out)
    assert result.ok
    sides: dict[str, set[str]] = {}
    for run in result.runs:
        for name, side in run.dispatch.items():
            sides.setdefault(name, set()).add(side)
    assert len(sides) == 8 and all(s == {"fused", "original ops"} for s in sides.values()), sides
