"""The one fusion driver (fusion/driver.py) around both front ends (issue 21 item 5): report rows
are written in one place, new node names never reuse a prefix an earlier run left in the graph,
and a per-batch·head block's row says so by a flag, not by a string in its head count."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from attention_graphs import Variant, attention_nodes, build, model_of
from onnx import TensorProto, helper

import ortflash

PACKAGE = Path(__file__).resolve().parents[1] / "ortflash"


def test_only_the_driver_writes_report_rows_for_fusion():
    """Each front end once had its own loop building Block rows; now fusion/driver.fuse is the one."""
    writers = set()
    for path in sorted((PACKAGE / "fusion").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Block":
                writers.add(str(path.relative_to(PACKAGE)))
    assert writers == {"fusion/driver.py"}


def _block_after_a_taken_prefix() -> onnx.ModelProto:
    """One attention block whose Q passes a Neg named as ortflash names the nodes it writes for
    row 0: what a model optimized once (its block kept, others fused) and optimized again has."""
    taken = "ortflash/attention_0/Transpose_1"
    nodes, inits = attention_nodes(taken + "_out", "k", "v")
    nodes = [helper.make_node("Neg", ["q"], [taken + "_out"], name=taken)] + nodes
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", 2, "S", 8]) for n in ("q", "k", "v")]
    return model_of(nodes, inputs, inits)


def test_new_nodes_do_not_reuse_a_prefix_the_graph_has():
    model = _block_after_a_taken_prefix()
    fused, report = ortflash.optimize(model, target="ortflash")
    assert report.fused == 1
    names = [n.name for n in fused.graph.node]
    # the only node under the taken prefix is the input's own; the block's nodes took another
    assert [n for n in names if n.startswith("ortflash/attention_0/")] == ["ortflash/attention_0/Transpose_1"]
    assert any(n.startswith("ortflash/attention_0_/") for n in names)
    values = [o for n in fused.graph.node for o in n.output]
    assert len(values) == len(set(values))
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((2, 2, 5, 8)).astype(np.float32) for n in ("q", "k", "v")}
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ortflash.InferenceSession(fused).run(None, feeds)
    np.testing.assert_allclose(got[0], expected[0], atol=1e-5)


def test_a_per_batch_head_block_shows_no_head_count():
    """[B·H, S, D] blocks: the fused node sees Q as [B·H, 1, S, D], one head per pair; its row
    shows no head count rather than the 1 its shapes show."""
    model = build(Variant(rank=3))
    _, report = ortflash.optimize(model, target="ortflash")
    (block,) = report.blocks
    assert block.fused
    assert (block.heads, block.kv_heads) == (None, None)
    # --num-heads is for counts nothing proves in [B, H, S, D] blocks; a per-batch·head block ignores it
    _, given = ortflash.optimize(model, target="ortflash", num_heads=4)
    assert (given.blocks[0].heads, given.blocks[0].kv_heads) == (None, None)
    assert "given" not in given.blocks[0].reason
