"""The head count a user gave (``--num-heads``) written where a lowering needs it.

Fusion hands the given counts to the lowering as typed facts, one ``GivenHeads`` per report row
(pipeline/fused_rows.prove_heads), and changes nothing in the graph: FlashAttention reads heads
from its operands' shapes at run time. The native ops take the count as a number, so before a
lowering reads its nodes (in its own copy of the model), the given operands are reshaped to ``[0, N, 0, 0]``: the identity when
N is right, a run-time error (caught before anything is written) when it is not, and a static
count the lowering proves from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import onnx_ir as ir

from ..graph.emitter import Emitter
from ..op.node import BLOCK_ID, flash_nodes


@dataclass(frozen=True)
class GivenHeads:
    """The query head count given for one fused block whose count nothing proves, and the
    FlashAttention node's inputs that have it: 0 (Q), and 1, 2 (K, V) where their head dim is the
    same unknown as Q's."""

    count: int
    inputs: tuple[int, ...]


def write_given_head_counts(model: ir.Model, given: Mapping[int, GivenHeads]) -> None:
    """The given inputs of each FlashAttention node whose row (``BLOCK_ID``) is in ``given``
    reshaped to the given head count, in place (the lowering's own copy of the model)."""
    if not given:
        return
    marked = [(n, given[row]) for n in flash_nodes(model.graph) if (row := _row(n)) is not None and row in given]
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
    for node, heads in marked:
        owner = node.graph
        assert owner is not None
        e = Emitter(owner, node, f"ortflash/num_heads_{node.metadata_props[BLOCK_ID]}", opset)
        for index in heads.inputs:
            operand = node.inputs[index]
            if operand is not None:
                viewed = e.reshape(operand, [0, heads.count, 0, 0])
                _typed_like(viewed, operand, heads.count)
                node.replace_input_with(index, viewed)


def _typed_like(viewed: ir.Value, operand: ir.Value, count: int) -> None:
    """The reshape's output typed as ONNX's inference types it (a 0 copies the input's dim): the
    lowering proves the count from it with no shape inference of its own."""
    if operand.dtype is not None:
        viewed.dtype = operand.dtype
    if operand.shape is not None and len(operand.shape) == 4:
        dims = list(operand.shape)
        viewed.shape = ir.Shape([dims[0], count, dims[2], dims[3]])


def _row(node: ir.Node) -> int | None:
    row = node.metadata_props.get(BLOCK_ID)
    return int(row) if row is not None else None
