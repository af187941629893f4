"""What a matched attention block is, and why one was not matched."""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx_ir as ir


class NotFused(Exception):
    """A precondition failed; the message says which, in words a user can act on."""


@dataclass
class AttentionMatch:
    """softmax(scale * q @ kᵀ [+ bias] [masked]) @ v, as found around one Softmax node."""

    softmax: ir.Node
    output: ir.Value | None = None  # the value the fused node replaces (probs @ v)
    q: ir.Value | None = None
    k: ir.Value | None = None  # [B, H, Sk, D] after k_perm
    k_perm: list[int] | None = None  # Transpose to apply to `k` to get [B, H, Sk, D]; None = as is
    v: ir.Value | None = None
    scale: float = 1.0
    biases: list[ir.Value] = field(default_factory=list)
    masks: list[tuple[ir.Value, bool]] = field(default_factory=list)  # (condition, True if it marks masked-out)
    mask_fill: float | None = None
    is_causal: bool = False
    nan_guard: bool = False
    guard_bias: ir.Value | None = None  # the tensor a row-max guard tests (must be the only bias)
    softcap: float = 0.0
    rank: int | None = None
    nodes: list[ir.Node] = field(default_factory=list)  # matched nodes, top (output) first
    ops: list[str] = field(default_factory=list)  # op types as read, for the report

    # Read so far above the current op (the walk goes from the Softmax towards Q·Kᵀ).
    seen_bias_above: bool = False
    seen_scale_above: bool = False

    probs_ops: int = 0  # how many of `ops` were read on the probability side

    def pattern(self) -> str:
        """The block as read, inputs first: e.g. MatMul(q,Transpose(k))→Div→Add→Softmax→MatMul."""
        probs = self.ops[1 : 1 + self.probs_ops]
        scores = self.ops[1 + self.probs_ops :]
        return "→".join(list(reversed(scores)) + [self.ops[0]] + probs)

    def add(self, node: ir.Node, label: str | None = None) -> None:
        self.nodes.append(node)
        self.ops.append(label or node.op_type)
