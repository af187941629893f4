"""Attention written with Einsum (tf2onnx and hand-written exports): ``bhqd,bhkd->bhqk`` for
Q·Kᵀ and ``bhqk,bhkd->bhqd`` for P·V, K and V in any axis order the equation names.

Read only where the equation is exactly a batched product over the last axis: two operands,
no ellipsis, no repeated letter, the batch letters in the same order in Q (P) and the output,
and Q (P) laid out as [batch..., rows, contracted]. K's (V's) order is free: it becomes the
Transpose the fused op reads it through."""

from __future__ import annotations

import onnx_ir as ir

from ..errors import NotFused
from ..graph import ir_utils as u
from .qk_operands import QKOperands, scaled_q, take_qk
from .softmax_rules import Rule, WalkState


def _equation(node: ir.Node) -> tuple[str, str, str] | None:
    """(left, right, output) letters of a two-operand Einsum without ellipsis or repeats."""
    attr = node.attributes.get("equation")
    if attr is None or len(node.inputs) != 2:
        return None
    text = attr.as_string().replace(" ", "")
    if "..." in text or "->" not in text:
        return None
    lhs, out = text.split("->")
    terms = lhs.split(",")
    if len(terms) != 2 or any(len(set(t)) != len(t) for t in (*terms, out)):
        return None
    return terms[0], terms[1], out


def batched_product(node: ir.Node) -> tuple[int, list[int] | None] | None:
    """(rank, perm) when the Einsum computes left @ perm(right)ᵀ-free form: left [L..., r, c],
    right some order of [L..., c, n], output [L..., r, n]; perm takes right to [L..., n, c]
    (None when it already is) and keeps dim 0 first. Rank 3 or 4."""
    eq = _equation(node)
    if eq is None:
        return None
    left, right, out = eq
    if len(out) not in (3, 4) or len(left) != len(out) or len(right) != len(out):
        return None
    lead, row, col = out[:-2], out[-2], out[-1]
    contracted = left[-1]
    if left != lead + row + contracted or contracted in out or sorted(right) != sorted(lead + col + contracted):
        return None
    want = lead + col + contracted
    perm = [right.index(c) for c in want]
    if perm[0] != 0:
        return None  # the batch axis moves: the fused op's batch broadcasting reads dim 0
    return len(out), None if perm == list(range(len(out))) else perm


class QKEinsum(Rule):
    """Einsum(q, k) = q @ kᵀ with k in the order the equation names (K [B, H, Sk, D] after k_perm)."""

    op_types = ("Einsum",)

    def _read(self, node: ir.Node, m: WalkState) -> tuple[QKOperands, str]:
        found = batched_product(node)
        if found is None:
            eq = node.attributes.get("equation")
            raise NotFused(f"Einsum {node.name} ({eq.as_string() if eq else '?'}) is not a batched Q·Kᵀ")
        rank, perm = found
        q, scale, q_label = scaled_q(u.operand(node, 0))
        k = u.operand(node, 1)
        if u.const_array(k) is not None:
            raise NotFused("K is a constant (a weight): this Softmax is not attention")
        return QKOperands(q, k, perm, rank, scale), q_label

    def check(self, node: ir.Node, value: ir.Value, m: WalkState) -> None:
        take_qk(node, m, self._read(node, m)[0], dry_run=True)

    def apply(self, node: ir.Node, value: ir.Value, m: WalkState) -> ir.Value | None:
        read, q_label = self._read(node, m)
        take_qk(node, m, read, dry_run=False)
        m.add(node, f"Einsum({q_label},k)")
        return None


class ProbsEinsumV(Rule):
    """Einsum(p, v) = p @ v with v in the order the equation names."""

    op_types = ("Einsum",)

    def matches(self, node: ir.Node, value: ir.Value) -> bool:
        return node.op_type == "Einsum" and len(node.inputs) == 2 and node.inputs[0] is value

    def check(self, node: ir.Node, value: ir.Value, m: WalkState) -> None:
        if self._v_perm(node) is None:
            eq = node.attributes.get("equation")
            raise NotFused(f"Einsum {node.name} ({eq.as_string() if eq else '?'}) is not a batched P·V")

    @staticmethod
    def _v_perm(node: ir.Node) -> tuple[list[int] | None] | None:
        """(perm,) taking v to [L..., Sk, Dv] when the equation is P·V (perm None: as is)."""
        found = batched_product(node)
        if found is None:
            return None
        _, to_n_c = found  # right to [L..., n, c]; the op wants V as [L..., c, n]
        eq = _equation(node)
        assert eq is not None
        rank = len(eq[2])
        base = to_n_c if to_n_c is not None else list(range(rank))
        perm = base[:-2] + [base[-1], base[-2]]
        return (None if perm == list(range(rank)) else perm,)

    def apply(self, node: ir.Node, value: ir.Value, m: WalkState) -> ir.Value | None:
        found = self._v_perm(node)
        assert found is not None  # check() proved it
        m.v, m.v_perm = u.operand(node, 1), found[0]
        m.output = node.outputs[0]
        m.add(node, "Einsum(p,v)")
        return None
