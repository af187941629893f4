"""The head count a user gave (``--num-heads``) written where a lowering needs it.

Fusion records a given count on the FlashAttention node (``GIVEN_HEADS``) and changes nothing
else: FlashAttention reads heads from its operands' shapes at run time. The native ops take the
count as a number, so before a lowering reads its nodes, the marked operands are reshaped to
``[0, N, 0, 0]``: the identity when N is right, a run-time error (caught before anything is
written) when it is not, and a static count the lowering proves from.
"""

from __future__ import annotations

import onnx
import onnx_ir as ir

from ..graph import ir_utils as u
from ..graph.emitter import Emitter
from ..op.node import BLOCK_ID, GIVEN_HEADS, flash_nodes


def encode(num_heads: int, inputs: list[int]) -> str:
    return f"{num_heads}:{','.join(map(str, inputs))}"


def decode(text: str) -> tuple[int, list[int]]:
    count, _, inputs = text.partition(":")
    return int(count), [int(i) for i in inputs.split(",") if i]


def with_given_head_counts(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every marked operand reshaped to its given head count; the model itself
    where no node is marked (the input is never modified)."""
    irm = ir.serde.deserialize_model(model)
    marked = [n for n in flash_nodes(irm.graph) if GIVEN_HEADS in n.metadata_props]
    if not marked:
        return model
    opset = u.default_opset(model)
    for node in marked:
        count, inputs = decode(node.metadata_props.pop(GIVEN_HEADS))
        owner = node.graph
        assert owner is not None
        e = Emitter(owner, node, f"ortflash/num_heads_{node.metadata_props.get(BLOCK_ID, node.name)}", opset)
        for index in inputs:
            operand = node.inputs[index]
            if operand is not None:
                node.replace_input_with(index, e.reshape(operand, [0, count, 0, 0]))
    out = ir.serde.serialize_model(irm)
    out.ir_version = model.ir_version
    return out
