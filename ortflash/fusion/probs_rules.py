"""The probability-side rules: each one piece of  softmax(...) @ v, from the Softmax's output
down to the P·V product (softmax_rules.py says how a rule reads; the score side is there). The
value read so far is ``p``; each rule's docstring draws the nodes it matches."""

from __future__ import annotations

import math

import onnx_ir as ir

from ..errors import NotFused
from ..graph import ir_utils as u
from .softmax_block import Rule, SoftmaxBlock
from .softmax_rules import Read, float_cast, read_inference_identity, same_trailing_dims


class ProbsCast(Rule):
    """A cast of the probabilities between float types::

    y = Cast(p, to=float32 | float16)      p float32 or float16; next: y
    """

    op_types = ("Cast",)

    def read(self, node: ir.Node, value: ir.Value, block: SoftmaxBlock) -> Read:
        float_cast(node)
        return block.read(node), node.outputs[0]


class ProbsInferenceIdentity(Rule):
    """Identity, or attention dropout at inference, between the Softmax and P·V::

    y = Identity(p)    y = Dropout(p[, ratio[, training_mode=false]])   (mask unread); next: y
    """

    op_types = ("Identity", "Dropout")

    def read(self, node: ir.Node, value: ir.Value, block: SoftmaxBlock) -> Read:
        read_inference_identity(node)
        return block.read(node), node.outputs[0]


class NanGuard(Rule):
    """Fully masked rows give zeros instead of NaN (the op's masked_rows='zero')::

    y = Where(IsNaN(p), 0, p)      next: y
    """

    op_types = ("IsNaN",)

    def _where(self, node: ir.Node, value: ir.Value) -> ir.Node | None:
        for where in node.outputs[0].consumers():
            if (
                where.op_type == "Where"
                and where.inputs[0] is node.outputs[0]
                and where.inputs[2] is value
                and u.scalar(where.inputs[1]) == 0.0
            ):
                return where
        return None

    def read(self, node: ir.Node, value: ir.Value, block: SoftmaxBlock) -> Read:
        where = self._where(node, value)
        if where is None:
            raise NotFused(f"{u.label(node)} is not a Where(IsNaN(p), 0, p) guard")
        return block.read(node, nan_guard=True).read(where, "Where(isnan)"), where.outputs[0]


class ProbsHeadMerge(Rule):
    """The probabilities viewed per batch·head before a batched P·V (ScoresHeadSplit must split
    the scores back)::

        y [B·H, Sq, Sk] = Reshape(p [B, H, Sq, Sk], ...)   (Sq, Sk proved the same)      next: y
    """

    op_types = ("Reshape",)

    def matches(self, node: ir.Node, value: ir.Value) -> bool:
        return node.op_type == "Reshape" and node.inputs[0] is value

    def read(self, node: ir.Node, value: ir.Value, block: SoftmaxBlock) -> Read:
        if block.heads_merged:
            raise NotFused(f"the probabilities are reshaped twice ({u.label(node)})")
        if not same_trailing_dims(value, node.outputs[0]):
            raise NotFused(f"the probabilities feed {u.label(node)}, not proved to merge [B, H] into B·H")
        return block.read(node, "Reshape(B·H)", heads_merged=True), node.outputs[0]


class ProbsMatMulV(Rule):
    """The block's output, the last node of the probability side::

    output = MatMul(p, v)      next: none (the score side is read next)
    """

    op_types = ("MatMul",)

    def matches(self, node: ir.Node, value: ir.Value) -> bool:
        return node.op_type == "MatMul" and node.inputs[0] is value

    def read(self, node: ir.Node, value: ir.Value, block: SoftmaxBlock) -> Read:
        return block.read(node, v=node.inputs[1], output=node.outputs[0]), None


class RowMaxGuard(Rule):
    """ONNX Attention's function body zeroes the rows its bias masks out entirely::

        y = Where(Equal(ReduceMax(bias, axes=[-1]), -inf), 0, p)      next: y

    Equal to masked_rows='zero' when that bias is the block's only source of -inf, which
    read_block checks once the score side is read."""

    def _guarded_bias(self, node: ir.Node, value: ir.Value) -> ir.Value | None:
        if node.op_type != "Where" or node.inputs[2] is not value or u.scalar(node.inputs[1]) != 0.0:
            return None
        eq = u.producer(node.inputs[0], "Equal")
        if eq is None:
            return None
        for row_max, neg_inf in (eq.inputs, reversed(eq.inputs)):
            reduce = u.producer(row_max, "ReduceMax")
            if reduce is None or u.scalar(neg_inf) != -math.inf:
                continue
            axes = u.unsqueeze_axes(reduce)
            r = u.rank(reduce.inputs[0])
            if axes is not None and len(axes) == 1 and (axes[0] == -1 or (r is not None and axes[0] == r - 1)):
                return reduce.inputs[0]
        return None

    def matches(self, node: ir.Node, value: ir.Value) -> bool:
        return self._guarded_bias(node, value) is not None

    def read(self, node: ir.Node, value: ir.Value, block: SoftmaxBlock) -> Read:
        guarded = self._guarded_bias(node, value)
        return block.read(node, "Where(rowmax=-inf)", nan_guard=True, guard_bias=guarded), node.outputs[0]


PROBS_RULES: tuple[Rule, ...] = (
    ProbsCast(),
    ProbsInferenceIdentity(),
    NanGuard(),
    RowMaxGuard(),
    ProbsHeadMerge(),
    ProbsMatMulV(),
)
