"""The one fusion loop: every front end's candidates in a graph, each read, described in the
report and (unless the caller keeps it) written as a FlashAttention node, numbered by report row.

A front end says how to find its candidates, how to read one (raising NotFused with the first
failed precondition), what its report row shows, and how to write it; the loop around them, the
row numbering, the node-name prefix and the block-id metadata are written once, here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

import onnx_ir as ir

from ..errors import NotFused
from ..graph.emitter import Emitter
from ..op.node import BLOCK_ID, is_flash_attention
from ..op.policy import SoftmaxPolicy
from ..report import Block


@dataclass(frozen=True)
class Written:
    """What a front end wrote for one block: the value that replaces the block's output is already
    rerouted; this is what its report row says."""

    reason: str  # notes for the row ("" for none)
    columns: Mapping[str, Any]  # Block fields (pattern, heads, mask, ...)


class FrontEnd(Protocol):
    """One way a graph writes attention (the Softmax of the plain ops, the ONNX Attention op)."""

    @property
    def label(self) -> str:
        """The report's name for an unnamed candidate: "Softmax" -> "Softmax_3" (its row)."""
        ...

    @property
    def prefix(self) -> str:
        """The stem of the new nodes' names: "attention" -> "ortflash/attention_3/..."."""
        ...

    @property
    def one_op(self) -> bool:
        """Whether each block it reads is already one attention op (ONNX's Attention), not a graph of
        plain ops: a GPU EP may run that op natively, which the cost tables did not time against."""
        ...

    def candidates(self, graph: ir.Graph) -> list[ir.Node]:
        """The nodes of graph this front end reads, in graph order."""
        ...

    def read(self, node: ir.Node, opset: int) -> Any:
        """The block at node; raises NotFused naming the first failed precondition."""
        ...

    def unread_columns(self) -> Mapping[str, Any]:
        """The row's columns for a candidate that is not a block."""
        ...

    def columns(self, reading: Any) -> Mapping[str, Any]:
        """The row's columns for a block read and left as it is."""
        ...

    def anchor(self, reading: Any, node: ir.Node) -> ir.Node:
        """The node the new nodes go before."""
        ...

    def write(self, e: Emitter, reading: Any, policy: SoftmaxPolicy, block_id: str) -> Written:
        """Write the block's FlashAttention node (op.node.write_call) and reroute its outputs."""
        ...

    def heads_per_batch_head(self, reading: Any) -> bool:
        """Whether the block's scores are per batch·head ([B·H, Sq, Sk]): its node sees one head
        per (batch, head) pair, so the heads its shapes show are not the model's."""
        ...


@dataclass
class Fused:
    """The rows fuse() wrote for one graph, and which of them are per batch·head."""

    blocks: list[Block] = field(default_factory=list)
    per_batch_head: set[int] = field(default_factory=set)  # row numbers (first_row-based)
    one_op: set[int] = field(default_factory=set)  # the rows that were one attention op (FrontEnd.one_op)


def fuse(
    graph: ir.Graph,
    opset: int,
    policy: SoftmaxPolicy,
    front_ends: Sequence[FrontEnd],
    first_row: int = 0,
    keep: Mapping[str, str] = MappingProxyType({}),
) -> Fused:
    """Fuse every block each front end reads in graph, in place, front end by front end; one row
    per candidate, numbered from first_row (the rows before them in the report).

    Each fused node records its row in its metadata (op.node.BLOCK_ID) for the lowering's notes;
    the nodes it replaces are left dead for the caller's RemoveUnusedNodesPass. ``keep``: candidate
    names whose block is read but left as it is, each with the reason its row gives (forms.py: the
    original ops are faster there)."""
    fused = Fused()
    taken = {n.name for n in graph if n.name}
    for front_end in front_ends:
        for node in front_end.candidates(graph):
            row = first_row + len(fused.blocks)
            label = node.name or f"{front_end.label}_{row}"
            try:
                reading = front_end.read(node, opset)
            except NotFused as why:
                fused.blocks.append(Block(label, False, str(why), **front_end.unread_columns()))
                continue
            if label in keep:
                fused.blocks.append(Block(label, False, keep[label], **front_end.columns(reading)))
                continue
            # numbered by report row: unique across a model's graphs, as nested scopes need; and
            # apart from the names an earlier run of ortflash left in the graph
            prefix = f"ortflash/{front_end.prefix}_{row}"
            while _prefix_taken(prefix, taken):
                prefix += "_"
            e = Emitter(graph, front_end.anchor(reading, node), prefix, opset)
            written = front_end.write(e, reading, policy, block_id=str(row))
            _type_flash_outputs(graph, str(row))
            # mode is None only for a session's policy, which never fuses
            fused.blocks.append(Block(label, True, written.reason, softmax=policy.mode or "", **written.columns))
            if front_end.heads_per_batch_head(reading):
                fused.per_batch_head.add(row)
            if front_end.one_op:
                fused.one_op.add(row)
    return fused


def _type_flash_outputs(graph: ir.Graph, block_id: str) -> None:
    """The output of the FlashAttention node written for ``block_id`` typed as the op defines it
    (op/spec.py): its Q's element type (float32 between the exact casts of a float16 block) and
    [B, Hq, Sq, Dv], B being Q's batch (the op broadcasts K, V, bias and mask to it), where Q's and
    V's shapes are known. ONNX shape inference does not know the op; the model in memory does. A
    type the output already took (from the block output it replaced: emitter.replace_output) stays."""
    for node in graph:
        if not is_flash_attention(node) or node.metadata_props.get(BLOCK_ID) != block_id:
            continue
        out, q, v = node.outputs[0], node.inputs[0], node.inputs[2]
        if q is None or v is None:
            continue
        dtype, q_shape, v_shape = _element_type(q), _through_cast(q).shape, _through_cast(v).shape
        if out.dtype is None and dtype is not None:
            out.dtype = dtype
        if out.shape is None and q_shape is not None and v_shape is not None and len(q_shape) == len(v_shape) == 4:
            out.shape = ir.Shape([q_shape[0], q_shape[1], q_shape[2], v_shape[3]])


def _through_cast(x: ir.Value) -> ir.Value:
    """x, or the input of the Cast that computes it (write_call's exact casts: same shape)."""
    node = x.producer()
    if x.shape is None and node is not None and node.op_type == "Cast" and node.inputs[0] is not None:
        return node.inputs[0]
    return x


def _element_type(x: ir.Value) -> ir.DataType | None:
    node = x.producer()
    if x.dtype is None and node is not None and node.op_type == "Cast" and "to" in node.attributes:
        return ir.DataType(node.attributes["to"].as_int())
    return x.dtype


def dtype_name(dtype: ir.DataType | None) -> str:
    """A block's element type as its report row names it ("float32", "float16"); "" where not known."""
    if dtype is None or dtype == ir.DataType.UNDEFINED:
        return ""
    try:
        return str(dtype.numpy().name)
    except (TypeError, ValueError):
        return dtype.name.lower()


def _prefix_taken(prefix: str, names: Iterable[str]) -> bool:
    return any(name.startswith(prefix + "/") for name in names)
