"""Attention blocks whose output soon reaches a quantizer: where float32 rounding can change integers.

A fused block agrees with the graph it replaced within float32 rounding, but a quantizer a few
nodes on (ONNX Runtime's dynamic quantization puts ``DynamicQuantizeLinear`` before every
quantized MatMul) can turn a difference of one ulp into the next integer, and a model that
rounds durations or token ids from there then computes something visibly different. Random
inputs rarely land on such a boundary; real inputs (``--feeds``) do. This module finds those
blocks from the fused node that stands for each report row, on the fused model in memory
(pipeline/fused_model.py marks every report).
"""

from __future__ import annotations

from collections import deque

import onnx_ir as ir

from ..op.node import BLOCK_ID
from ..report import Report

# How far past the row's node (the Softmax, or an ONNX Attention node) a quantizer still counts:
# Softmax -> (IsNaN -> Where) -> MatMul(V) -> Transpose -> Reshape -> quantizer is six nodes on;
# the next layer's quantizers are ten or more.
MAX_NODES_ON = 6
QUANTIZERS = ("DynamicQuantizeLinear", "QuantizeLinear", "DynamicQuantizeMatMul", "MatMulIntegerToFloat")
# Ops whose output depends on their input's shape only: the rewrite keeps shapes exactly, so nothing
# past them can round differently (Bloom's `Shape -> Gather -> Div -> Cast(int64)` after a block).
SHAPE_ONLY = ("Shape", "Size")


def mark_rounding_sensitive(model: ir.Model, report: Report) -> None:
    """``Block.rounding`` on every fused row whose FlashAttention node's output soon reaches a
    quantizer. ``model``: as fusion wrote it, before any lowering (whose ops carry no row id): a
    row is found by the id on its node, in any graph (If branches, Loop and Scan bodies too)."""
    rows: dict[int, tuple[ir.Graph, ir.Node]] = {}
    for graph in (model.graph, *model.graph.subgraphs()):
        for node in graph:
            block_id = node.metadata_props.get(BLOCK_ID)
            if block_id is not None and block_id.isdigit():
                rows[int(block_id)] = (graph, node)
    for row, block in enumerate(report.blocks):
        if block.fused and row in rows:
            block.rounding = nearest_quantizer(*rows[row])


def nearest_quantizer(graph: ir.Graph, start: ir.Node) -> str:
    """'DynamicQuantizeLinear 4 nodes on' for the first quantizer past ``start``, nearest first
    (the readers of each value in graph order); '' when none is within MAX_NODES_ON nodes."""
    readers: dict[int, list[ir.Node]] = {}
    for node in graph:
        for value in node.inputs:
            if value is not None:
                readers.setdefault(id(value), []).append(node)
    seen = {id(start)}
    queue = deque([(start, 0)])
    while queue:
        node, hops = queue.popleft()
        if hops == MAX_NODES_ON:
            continue
        for value in node.outputs:
            for reader in readers.get(id(value), []):
                if reader.op_type in SHAPE_ONLY or id(reader) in seen:
                    continue
                seen.add(id(reader))
                if _quantizes(reader):
                    what = "Cast to an integer type" if reader.op_type == "Cast" else reader.op_type
                    return f"{what} {hops + 1} node{'s' if hops + 1 != 1 else ''} on"
                queue.append((reader, hops + 1))
    return ""


def _quantizes(node: ir.Node) -> bool:
    if node.op_type in QUANTIZERS:
        return True
    if node.op_type == "Cast":
        to = node.attributes.get("to")
        return to is not None and ir.DataType(to.as_int()).is_integer()
    return False
