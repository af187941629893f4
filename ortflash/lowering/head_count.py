"""The head count a user gave (``--num-heads``) written where a lowering needs it.

Fusion hands the given counts to the lowering as typed facts, one ``GivenHeads`` per report row
(pipeline/fused_rows.prove_heads), and changes nothing in the graph: FlashAttention reads heads
from its operands' shapes at run time. The native ops take the count as a number, so before a
lowering reads its nodes, the given operands are reshaped to ``[0, N, 0, 0]``: the identity when
N is right, a run-time error (caught before anything is written) when it is not, and a static
count the lowering proves from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import onnx
import onnx_ir as ir

from ..graph import ir_utils as u
from ..graph.emitter import Emitter
from ..op.node import BLOCK_ID, flash_nodes


@dataclass(frozen=True)
class GivenHeads:
    """The query head count given for one fused block whose count nothing proves, and the
    FlashAttention node's inputs that have it: 0 (Q), and 1, 2 (K, V) where their head dim is the
    same unknown as Q's."""

    count: int
    inputs: tuple[int, ...]


def with_given_head_counts(model: onnx.ModelProto, given: Mapping[int, GivenHeads]) -> onnx.ModelProto:
    """``model`` with the given inputs of each FlashAttention node whose row (``BLOCK_ID``) is in
    ``given`` reshaped to the given head count; the model itself where no node is (the input is
    never modified)."""
    if not given:
        return model
    irm = ir.serde.deserialize_model(model)
    marked = [(n, given[row]) for n in flash_nodes(irm.graph) if (row := _row(n)) is not None and row in given]
    if not marked:
        return model
    opset = u.default_opset(model)
    for node, heads in marked:
        owner = node.graph
        assert owner is not None
        e = Emitter(owner, node, f"ortflash/num_heads_{node.metadata_props[BLOCK_ID]}", opset)
        for index in heads.inputs:
            operand = node.inputs[index]
            if operand is not None:
                node.replace_input_with(index, e.reshape(operand, [0, heads.count, 0, 0]))
    out = ir.serde.serialize_model(irm)
    out.ir_version = model.ir_version
    return out


def _row(node: ir.Node) -> int | None:
    row = node.metadata_props.get(BLOCK_ID)
    return int(row) if row is not None else None
