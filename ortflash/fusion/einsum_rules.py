"""Attention written with Einsum (tf2onnx and hand-written exports): ``bhqd,bhkd->bhqk`` for
Q·Kᵀ and ``bhqk,bhkd->bhqd`` for P·V, K and V in any axis order the equation names.

Read only where the equation is exactly a batched product over the last axis: two operands,
no ellipsis, no repeated letter, the batch letters in the same order in Q (P) and the output,
and Q (P) laid out as [batch..., rows, contracted]. K's (V's) order is free: it becomes the
Transpose the fused op reads it through.

Keras MultiHeadAttention (through tf2onnx) writes 4D attention over [B, S, H, D] projections:
``aecd,abcd->acbe`` (key first, query with its heads after the sequence) and
``acbe,aecd->abcd`` (P·V written straight into [B, S, H, D]). The fused op has no Q layout and no
output layout, so such an Einsum is first rewritten into the form above plus a Transpose: the Q
operand transposed to [batch..., rows, contracted] and the operands in Q, K order; the P·V
output computed in [batch..., rows, V's kept axis] and transposed to the written order. Each
rewrite computes exactly what the Einsum did. Reading never performs it: the rule reads the
Einsum as the rewrite would leave it and records the rewrite in the block (SoftmaxBlock.rewrites),
and softmax_write performs it when the block is fused; a block that is not fused (a later
precondition fails, or the cost table keeps it) leaves the graph as it was."""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from ..errors import NotFused
from ..graph import ir_utils as u
from ..graph.emitter import replace_output
from .qk_operands import QKOperands, scaled_q, take_qk
from .softmax_block import Rule, SoftmaxBlock
from .softmax_rules import Read


def _equation(node: ir.Node) -> tuple[str, str, str] | None:
    """(left, right, output) letters of a two-operand Einsum without ellipsis or repeats."""
    attr = node.attributes.get("equation")
    if attr is None or len(node.inputs) != 2:
        return None
    return _terms(attr.as_string())


def _terms(text: str) -> tuple[str, str, str] | None:
    """(left, right, output) letters of a two-operand equation without ellipsis or repeats."""
    text = text.replace(" ", "")
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
    return None if eq is None else _batched(*eq)


def _batched(left: str, right: str, out: str) -> tuple[int, list[int] | None] | None:
    """batched_product of the equation left,right->out."""
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


def _scores_rewrite(node: ir.Node) -> tuple[bool, list[int], str] | None:
    """(swap, q_perm, equation) writing a Q·Kᵀ Einsum whose Q is the second operand or not laid
    out [batch..., rows, contracted] as a batched product over Transpose(q, q_perm), k; None where
    it is not such an Einsum, or already the plain form."""
    eq = _equation(node)
    if eq is None or batched_product(node) is not None:
        return None
    left, right, out = eq
    if len(out) not in (3, 4):
        return None
    lead, row, col = out[:-2], out[-2], out[-1]
    shared = [c for c in left if c in right and c not in out]
    swap = row in right and row not in left
    q, k = (right, left) if swap else (left, right)
    if len(shared) != 1 or row not in q or col in q or col not in k or row in k:
        return None
    plain_q = lead + row + shared[0]
    if sorted(q) != sorted(plain_q) or _batched(plain_q, k, out) is None:
        return None
    return swap, [q.index(c) for c in plain_q], f"{plain_q},{k}->{out}"


def _probs_rewrite(node: ir.Node) -> tuple[list[int], str] | None:
    """(perm, equation): a P·V Einsum whose output is another order of P's [batch..., rows] and
    V's kept letter, written as the plain batched product followed by Transpose(perm)."""
    eq = _equation(node)
    if eq is None or batched_product(node) is not None:
        return None
    left, right, out = eq
    kept = [c for c in right if c not in left]
    if len(kept) != 1 or len(left) != len(out):
        return None
    plain_out = left[:-1] + kept[0]
    if sorted(out) != sorted(plain_out) or out == plain_out or _batched(left, right, plain_out) is None:
        return None
    return [plain_out.index(c) for c in out], f"{left},{right}->{plain_out}"


def _set_equation(node: ir.Node, equation: str) -> None:
    node.attributes["equation"] = ir.AttrString("equation", equation)


def _transposed_shape(value: ir.Value, perm: list[int]) -> ir.Shape | None:
    if value.shape is None or len(value.shape) != len(perm):
        return None
    return ir.Shape([value.shape[i] for i in perm])


@dataclass(frozen=True)
class ScoresRewrite:
    """The Q·Kᵀ Einsum ``node`` written in the plain form (the module docstring): its operands in
    Q, K order, Q through ``transpose`` (a Transpose node not in the graph) where Q's layout is not
    [batch..., rows, contracted], and ``equation``. ``q`` is the operand the block reads as Q."""

    node: ir.Node
    k: ir.Value
    q_source: ir.Value  # the Einsum's Q operand as the graph has it
    transpose: ir.Node | None
    equation: str

    @property
    def q(self) -> ir.Value:
        return self.transpose.outputs[0] if self.transpose is not None else self.q_source

    @staticmethod
    def plan(node: ir.Node) -> ScoresRewrite | None:
        """The rewrite of a Q·Kᵀ Einsum whose Q is the second operand or not laid out [batch...,
        rows, contracted]; None where it is not such an Einsum, or already the plain form. While
        the read lasts, the planned Transpose reads Q (so the rules read through it as through
        the graph), and nothing in the graph reads it."""
        found = _scores_rewrite(node)
        if found is None or node.graph is None:
            return None
        swap, q_perm, equation = found
        q, k = (node.inputs[1], node.inputs[0]) if swap else (node.inputs[0], node.inputs[1])
        assert q is not None and k is not None
        transpose = None
        if q_perm != list(range(len(q_perm))):
            # named after the Einsum's output, which is unique in its graph (node names need not be)
            scores = node.outputs[0].name
            transpose = ir.node("Transpose", [q], attributes={"perm": q_perm}, name=f"{scores}/Transpose_q")
            transpose.outputs[0].name = f"{scores}/q_transposed"
            if q.dtype is not None:
                transpose.outputs[0].dtype = q.dtype
            transpose.outputs[0].shape = _transposed_shape(q, q_perm)
        return ScoresRewrite(node, k, q, transpose, equation)

    def release(self) -> None:
        # the planned Transpose stops reading Q: Q's readers are the graph's again
        if self.transpose is not None:
            self.transpose.replace_input_with(0, None)

    def perform(self, graph: ir.Graph) -> None:
        if self.transpose is not None:
            self.transpose.replace_input_with(0, self.q_source)
            graph.insert_before(self.node, self.transpose)
        self.node.replace_input_with(0, self.q)
        self.node.replace_input_with(1, self.k)
        _set_equation(self.node, self.equation)


@dataclass(frozen=True)
class ProbsRewrite:
    """The P·V Einsum ``node`` with a permuted output written as the plain batched product
    (``equation``) followed by Transpose(perm) to the written order; the Einsum's output value
    then holds the plain form, and the Transpose's output takes its readers and its graph-output
    name."""

    node: ir.Node
    perm: list[int]
    equation: str

    @staticmethod
    def plan(node: ir.Node) -> ProbsRewrite | None:
        found = _probs_rewrite(node)
        if found is None or node.graph is None:
            return None
        return ProbsRewrite(node, *found)

    def release(self) -> None:
        pass

    def perform(self, graph: ir.Graph) -> None:
        node, perm = self.node, self.perm
        written = node.outputs[0]
        written_shape = written.shape
        transpose = ir.node("Transpose", [None], attributes={"perm": perm}, name=f"{written.name}/Transpose_to_written")
        ordered = transpose.outputs[0]
        ordered.name = f"{written.name}/ordered"
        graph.insert_after(node, transpose)
        replace_output(graph, written, ordered)  # readers and a graph output's name move to the Transpose
        transpose.replace_input_with(0, written)
        inverse = [perm.index(i) for i in range(len(perm))]
        written.shape = _transposed_shape(ordered, inverse) if written_shape is not None else None
        _set_equation(node, self.equation)


class QKEinsum(Rule):
    """The scores' product as an Einsum, the last node of the score side; Q scaled by constants,
    K in the order the equation names (K [B, H, Sk, D] after k_perm)::

        s = Einsum(q', k, "bhqd,bhkd->bhqk")     (any letters; K's axes in any order: "bhqd,bkhd->bhqk")
        s = Einsum(k, q', "aecd,abcd->acbe")     (Keras: read as Einsum(Transpose(q', [0,2,1,3]), k))
                                                                                          next: none
    """

    op_types = ("Einsum",)

    def read(self, node: ir.Node, value: ir.Value, block: SoftmaxBlock) -> Read:
        rewrite = ScoresRewrite.plan(node)
        try:
            terms = _terms(rewrite.equation) if rewrite is not None else _equation(node)
            found = _batched(*terms) if terms is not None else None
            if found is None:
                eq = node.attributes.get("equation")
                raise NotFused(f"{u.label(node)} ({eq.as_string() if eq else '?'}) is not a batched Q·Kᵀ")
            rank, perm = found
            q, scale, q_label = scaled_q(rewrite.q if rewrite is not None else u.operand(node, 0))
            k = rewrite.k if rewrite is not None else u.operand(node, 1)
            if u.const_array(k) is not None:
                raise NotFused("K is a constant (a weight): this Softmax is not attention")
            block = take_qk(node, block, QKOperands(q, k, perm, rank, scale))
        except NotFused:
            if rewrite is not None:
                rewrite.release()
            raise
        rewrites = block.rewrites + ((rewrite,) if rewrite is not None else ())
        return block.read(node, f"Einsum({q_label},k)", rewrites=rewrites), None


class ProbsEinsumV(Rule):
    """The block's output as an Einsum, the last node of the probability side; V in the order
    the equation names::

        output = Einsum(p, v, "bhqk,bhkd->bhqd")    (any letters; V's axes in any order)
        output = Einsum(p, v, "acbe,aecd->abcd")    (Keras [B, S, H, D] output: read as
                 Transpose(Einsum(p, v, "acbe,aecd->acbd"), [0, 2, 1, 3]))   next: none (the scores)
    """

    op_types = ("Einsum",)

    def matches(self, node: ir.Node, value: ir.Value) -> bool:
        return node.op_type == "Einsum" and len(node.inputs) == 2 and node.inputs[0] is value

    def read(self, node: ir.Node, value: ir.Value, block: SoftmaxBlock) -> Read:
        rewrite = ProbsRewrite.plan(node)
        terms = _terms(rewrite.equation) if rewrite is not None else _equation(node)
        v_perm = _v_perm(terms) if terms is not None else None
        if v_perm is None:
            eq = node.attributes.get("equation")
            raise NotFused(f"{u.label(node)} ({eq.as_string() if eq else '?'}) is not a batched P·V")
        rewrites = block.rewrites + ((rewrite,) if rewrite is not None else ())
        v = u.operand(node, 1)
        return block.read(node, "Einsum(p,v)", v=v, v_perm=v_perm[0], output=node.outputs[0], rewrites=rewrites), None


def _v_perm(terms: tuple[str, str, str]) -> tuple[list[int] | None] | None:
    """(perm,) taking v to [L..., Sk, Dv] when the equation is P·V (perm None: as is)."""
    found = _batched(*terms)
    if found is None:
        return None
    _, to_n_c = found  # right to [L..., n, c]; the op wants V as [L..., c, n]
    rank = len(terms[2])
    base = to_n_c if to_n_c is not None else list(range(rank))
    perm = base[:-2] + [base[-1], base[-2]]
    return (None if perm == list(range(rank)) else perm,)
