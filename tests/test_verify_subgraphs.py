"""verify's count of fused nodes inside If/Loop/Scan bodies (issue 33 item 9): a model without
bodies has none, whatever protobuf's transient node wrappers' ids are; a merged decoder's are
counted in its branches."""

from __future__ import annotations

import os

import pytest

import ortflash
from ortflash.checks.prover import inner_fused_nodes
from ortflash.checks.verify import verify_every_softmax
from ortflash.op.node import is_flash_attention

MODELS = os.path.join(os.path.dirname(__file__), os.pardir, "models")
BERT = os.path.join(MODELS, "bert_eager_torchscript.onnx")
MERGED = os.path.join(MODELS, "llama_merged_eager_torchscript.onnx")


def test_a_model_without_bodies_has_no_fused_node_inside_one():
    fused, report = ortflash.optimize(BERT, target="ortflash")
    assert len(fused.graph.node) > 200 and sum(is_flash_attention(n) for n in fused.graph.node) == 2
    assert inner_fused_nodes(fused) == []


def test_a_merged_decoders_branches_hold_its_fused_nodes():
    fused, _ = ortflash.optimize(MERGED, target="ortflash")
    assert sum(is_flash_attention(n) for n in fused.graph.node) == 0
    assert len(inner_fused_nodes(fused)) == 4


@pytest.mark.parametrize("softmax", ["auto", "naive"])
def test_verify_names_no_if_loop_scan_body_the_model_does_not_have(softmax):
    fused, _ = ortflash.optimize(BERT, target="ortflash", softmax=softmax)
    result = verify_every_softmax(BERT, fused)
    assert result.ok
    assert not [n for n in result.notes if "If/Loop/Scan" in n]
