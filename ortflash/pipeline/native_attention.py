"""The attention ONNX Runtime's own ops already compute in a model (its transformers optimizer
and onnxscript's optimize_for_ort write them): no rule reads them, so a model fused by those
finds 0 blocks, and without a note in the report the user would not see why."""

from __future__ import annotations

import collections

import onnx

from ..lowering.contrib import CONTRIB_DOMAIN
from ..model_io import graphs_of

# ONNX Runtime's com.microsoft ops that already compute a whole attention block ("Attention": packed QKV)
NATIVE_ATTENTION = ("MultiHeadAttention", "GroupQueryAttention", "Attention")


def native_attention_note(model: onnx.ModelProto) -> str | None:
    """One line on the com.microsoft attention nodes of ``model`` (every graph), None where it has none."""
    found = collections.Counter(
        node.op_type
        for graph in graphs_of(model.graph)
        for node in graph.node
        if node.domain == CONTRIB_DOMAIN and node.op_type in NATIVE_ATTENTION
    )
    if not found:
        return None
    total = sum(found.values())
    ops = ", ".join(f"{count} {op}" for op, count in sorted(found.items()))
    return (
        f"the model already has {total} {CONTRIB_DOMAIN} attention node{'s' if total > 1 else ''} ({ops}), "
        "which ortflash leaves unchanged (ONNX Runtime's own fused attention; ortflash reads Softmax blocks "
        "and the standard ONNX Attention op)"
    )
