"""SoftmaxBlock, the one state of a walk from a Softmax, and Rule, the reader of one piece of it.

The walk (softmax_read.read_block) starts from the Softmax with an empty block and hands it to one
rule per node; each rule returns the block with its node read into it (a new frozen value) and the
next value to read, or raises NotFused naming the precondition that failed. The block read_block
returns is the same type, complete: what the front end describes and writes. A rule never changes
the graph: a rewrite the block needs (the Einsum forms', einsum_rules) is recorded in ``rewrites``
and performed by softmax_write, once the block is fused."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

import onnx_ir as ir


class PlannedRewrite(Protocol):
    """A change of the graph a block is read through and written after (einsum_rules)."""

    def perform(self, graph: ir.Graph) -> None:
        """Make the change; called once, by the write of the block that planned it."""
        ...

    def release(self) -> None:
        """Forget what the plan holds on the graph's values (called when the read ends)."""
        ...


@dataclass(frozen=True)
class SoftmaxBlock:
    """softmax(scale · q @ kᵀ [+ biases] [masked]) @ v around one Softmax node: as far as the walk
    has read it, or, as read_block returns it, the whole block (output, q, k, v and rank set)."""

    softmax: ir.Node
    output: ir.Value | None = None  # the value the fused node replaces (probs @ v)
    q: ir.Value | None = None
    k: ir.Value | None = None  # [B, H, Sk, D] after k_perm
    k_perm: list[int] | None = None  # Transpose to apply to k to get [B, H, Sk, D]; None = as is
    v: ir.Value | None = None
    v_perm: list[int] | None = None  # Transpose to apply to v to get [B, H, Sk, Dv]; None = as is
    rank: int | None = None  # 4: [B, H, S, D]; 3: [B·H, S, D]
    scale: float = 1.0
    biases: tuple[ir.Value, ...] = ()
    masks: tuple[tuple[ir.Value, bool], ...] = ()  # (condition, True if it marks masked-out)
    mask_fill: float | None = None
    nan_guard: bool = False
    guard_bias: ir.Value | None = None  # the tensor a row-max guard tests (must be the only bias)
    softcap: float = 0.0
    # Every bias was read nearer the Softmax than a mask whose fill does not absorb it (GPT-Neo:
    # where(causal, s, lowest) + padding bias): the op's bias_after_mask order.
    bias_after_mask: bool = False
    nodes: tuple[ir.Node, ...] = ()  # matched nodes, top (output) first
    ops: tuple[str, ...] = ()  # op types as read, the Softmax first, for the report's pattern
    probs_ops: int = 0  # how many of ops (after the Softmax) were read on the probability side
    repeat: int = 1  # G of a grouped-query repeat of K and V read away
    # Read already, nearer the Softmax than the current op (the walk goes from it towards Q·Kᵀ).
    bias_nearer_softmax: bool = False
    scale_nearer_softmax: bool = False
    # Scores computed per batch·head [B·H, Sq, Sk], viewed as [B, H, Sq, Sk] around the Softmax
    # (Bloom's baddbmm): H, and how many of biases / masks (the first ones) were read in that view.
    heads_split: int | None = None
    split_biases: int = 0
    split_masks: int = 0
    heads_merged: bool = False  # the probabilities are viewed back as [B·H, Sq, Sk] before P·V
    rewrites: tuple[PlannedRewrite, ...] = ()  # performed when the block is written, in this order

    def read(
        self, node: ir.Node, label: str | None = None, *, also: tuple[ir.Node, ...] = (), **changes: Any
    ) -> SoftmaxBlock:
        """This block with node read (named label in the pattern), the nodes ``also`` matched with
        it, and the fields ``changes`` names set."""
        return dataclasses.replace(
            self, nodes=self.nodes + (node, *also), ops=self.ops + (label or node.op_type,), **changes
        )

    @property
    def pattern(self) -> str:
        """The block as read, inputs first: MatMul(q,Transpose(k))→Div→Add→Softmax→MatMul."""
        probs = self.ops[1 : 1 + self.probs_ops]
        scores = self.ops[1 + self.probs_ops :]
        return "→".join([*reversed(scores), self.ops[0], *probs])


def through(perm: list[int] | None, axis: int) -> int:
    """The axis of a tensor read through perm (a block's k_perm, v_perm) that becomes axis."""
    return axis if perm is None else perm[axis]


class Rule:
    """The reader of one piece of a block: the nodes it ``matches`` and what it reads of one."""

    op_types: tuple[str, ...] = ()

    def matches(self, node: ir.Node, value: ir.Value) -> bool:
        return node.op_type in self.op_types

    def read(self, node: ir.Node, value: ir.Value, block: SoftmaxBlock) -> tuple[SoftmaxBlock, ir.Value | None]:
        """(block with node read into it, the next value to read: None where this side of the
        Softmax is done); raises NotFused naming the precondition node fails."""
        raise NotImplementedError
