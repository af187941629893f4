"""Attention blocks whose output soon reaches a quantizer: where float32 rounding can change integers.

A fused block agrees with the graph it replaced within float32 rounding, but a quantizer a few
nodes on (ONNX Runtime's dynamic quantization puts ``DynamicQuantizeLinear`` before every
quantized MatMul) can turn a difference of one ulp into the next integer, and a model that
rounds durations or token ids from there then computes something visibly different. Random
inputs rarely land on such a boundary; real inputs (``--feeds``) do. This module finds those
blocks from the fused node that stands for each report row (ortflash.optimize marks every report).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import onnx

from ..model_io import graphs_of
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
_INTEGER_TYPES = frozenset(
    {
        onnx.TensorProto.INT8,
        onnx.TensorProto.UINT8,
        onnx.TensorProto.INT16,
        onnx.TensorProto.UINT16,
        onnx.TensorProto.INT32,
        onnx.TensorProto.UINT32,
        onnx.TensorProto.INT64,
        onnx.TensorProto.UINT64,
        onnx.TensorProto.INT4,
        onnx.TensorProto.UINT4,
    }
)


def _quantizes(node: onnx.NodeProto) -> bool:
    if node.op_type in QUANTIZERS:
        return True
    if node.op_type == "Cast":
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        return to in _INTEGER_TYPES
    return False


def _consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            if name:
                readers.setdefault(name, []).append(node)
    return readers


def _downstream(
    start: onnx.NodeProto, readers: dict[str, list[onnx.NodeProto]]
) -> Iterator[tuple[onnx.NodeProto, int]]:
    """Nodes reachable from ``start``'s outputs, nearest first, with how many nodes on they are."""
    seen = {id(start)}
    queue = deque([(start, 0)])
    while queue:
        node, hops = queue.popleft()
        if hops == MAX_NODES_ON:
            continue
        for name in node.output:
            for reader in readers.get(name, []):
                if reader.op_type in SHAPE_ONLY:
                    continue
                if id(reader) not in seen:
                    seen.add(id(reader))
                    yield reader, hops + 1
                    queue.append((reader, hops + 1))


def nearest_quantizer(graph: onnx.GraphProto, start: onnx.NodeProto) -> str:
    """'DynamicQuantizeLinear 4 nodes on' for the first quantizer past ``start``; '' when none is near."""
    for node, hops in _downstream(start, _consumers(graph)):
        if _quantizes(node):
            what = "Cast to an integer type" if node.op_type == "Cast" else node.op_type
            return f"{what} {hops} node{'s' if hops != 1 else ''} on"
    return ""


def _block_nodes(model: onnx.ModelProto) -> dict[int, tuple[onnx.GraphProto, onnx.NodeProto]]:
    """Report row -> the fused node that stands for it and its graph (any graph: If branches,
    Loop and Scan bodies too), by the row id the rewrite wrote on the node."""
    found = {}
    for graph in graphs_of(model.graph):
        if not isinstance(graph, onnx.GraphProto):
            continue
        for node in graph.node:
            for prop in node.metadata_props:
                if prop.key == BLOCK_ID and prop.value.isdigit():
                    found[int(prop.value)] = (graph, node)
    return found


def mark_rounding_sensitive(fused: onnx.ModelProto, report: Report) -> list[str]:
    """Set ``Block.rounding`` on every fused row whose output soon reaches a quantizer; their names.

    ``fused``: the model as fusion wrote it, before any lowering (whose ops carry no row id): a
    row is found by the id on its FlashAttention node.
    """
    fused_nodes = _block_nodes(fused)
    marked = []
    for row, block in enumerate(report.blocks):
        if not block.fused or row not in fused_nodes:
            continue
        graph, node = fused_nodes[row]
        block.rounding = nearest_quantizer(graph, node)
        if block.rounding:
            marked.append(block.name)
    return marked
