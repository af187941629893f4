"""What the walk from one Softmax has read so far: the state every rule (softmax_rules,
einsum_rules, qk_operands) folds its piece into, and walker turns into a SoftmaxBlock."""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx_ir as ir


@dataclass
class WalkState:
    """What the walk from one Softmax has read so far; mutable, and thrown away when a rule fails.
    walker.read_block turns a complete walk into a SoftmaxBlock."""

    softmax: ir.Node
    output: ir.Value | None = None  # the value the fused node replaces (probs @ v)
    q: ir.Value | None = None
    k: ir.Value | None = None  # [B, H, Sk, D] after k_perm
    k_perm: list[int] | None = None  # Transpose to apply to `k` to get [B, H, Sk, D]; None = as is
    v: ir.Value | None = None
    v_perm: list[int] | None = None  # Transpose to apply to `v` to get [B, H, Sk, Dv]; None = as is
    scale: float = 1.0
    biases: list[ir.Value] = field(default_factory=list)
    masks: list[tuple[ir.Value, bool]] = field(default_factory=list)  # (condition, True if it marks masked-out)
    mask_fill: float | None = None
    nan_guard: bool = False
    guard_bias: ir.Value | None = None  # the tensor a row-max guard tests (must be the only bias)
    softcap: float = 0.0
    rank: int | None = None
    nodes: list[ir.Node] = field(default_factory=list)  # matched nodes, top (output) first
    ops: list[str] = field(default_factory=list)  # op types as read, for the report
    repeat: int = 1  # G of a grouped-query repeat of K and V read away
    probs_ops: int = 0  # how many of `ops` were read on the probability side
    # Read already, nearer the Softmax than the current op (the walk goes from it towards Q·Kᵀ).
    bias_nearer_softmax: bool = False
    scale_nearer_softmax: bool = False
    # Every bias was read nearer the Softmax than a mask whose fill does not absorb it (GPT-Neo:
    # where(causal, s, lowest) + padding bias): the op's bias_after_mask order.
    bias_after_mask: bool = False
    # Scores computed per batch·head [B·H, Sq, Sk], viewed as [B, H, Sq, Sk] around the Softmax
    # (Bloom's baddbmm): H, and how many biases and masks were read in the 4D view.
    heads_split: int | None = None
    split_biases: int = 0
    split_masks: int = 0
    heads_merged: bool = False  # the probabilities are viewed back as [B·H, Sq, Sk] before P·V

    def add(self, node: ir.Node, label: str | None = None) -> None:
        self.nodes.append(node)
        self.ops.append(label or node.op_type)
