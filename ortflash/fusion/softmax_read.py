"""Reading the attention block around one Softmax: the walk over the rules (softmax_rules,
einsum_rules), what its report row shows, and nothing written: a block read and not fused leaves
the graph as it was (softmax_write writes one).

The walk reads down the probabilities to the P·V product first, then up the scores to Q·Kᵀ,
each node by the first rule (in the orders below) that matches it; every rule returns the
frozen SoftmaxBlock with its piece read into it, or raises NotFused."""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from ..errors import NotFused
from ..graph import ir_utils as u
from ..graph import shapes
from ..graph.dim_terms import dims_equal
from ..graph.interpret import proved_dims
from .driver import dtype_name
from .einsum_rules import ProbsEinsumV, QKEinsum
from .probs_rules import PROBS_RULES
from .softmax_block import Rule, SoftmaxBlock, through
from .softmax_rules import NOT_SPLIT, SCORE_RULES, softmax_axis_is_last

# The rules in the order the walk tries them: the Einsum forms of the two products last.
_SCORE_SIDE: tuple[Rule, ...] = SCORE_RULES + (QKEinsum(),)
_PROBS_SIDE: tuple[Rule, ...] = PROBS_RULES + (ProbsEinsumV(),)


def _next_probs_node(value: ir.Value) -> ir.Node:
    # The reasons say "Softmax output", not "attention probabilities": until a MatMul with V is
    # found, nothing says this Softmax is attention (a classifier's or a CTC head's is not).
    # CastLike(x, p) reads only p's type, not its values.
    consumers = [c for c in value.consumers() if not (c.op_type == "CastLike" and c.inputs[0] is not value)]
    if value.is_graph_output():
        raise NotFused(f"the Softmax output {u.label(value)} is a graph output, not only read by a MatMul with V")
    isnan = [c for c in consumers if c.op_type == "IsNaN"]
    if isnan and len(consumers) == 2:
        return isnan[0]  # the guard reads p twice: IsNaN(p) and Where(.., .., p)
    if len(consumers) != 1:
        names = ", ".join(c.name or c.op_type for c in consumers) or "nothing"
        raise NotFused(f"the Softmax output {u.label(value)} is read by {names}, not by one MatMul with V")
    return consumers[0]


def read_block(softmax: ir.Node, opset: int) -> SoftmaxBlock:
    """The attention block around softmax, complete (output, q, k, v and rank set); raises
    NotFused naming the failed precondition. The graph is not changed: the rewrites the block
    needs are in its ``rewrites``, for softmax_write."""
    softmax_axis_is_last(softmax, opset)
    block = SoftmaxBlock(softmax).read(softmax)
    try:
        block = _read_sides(block)
        _check_complete(block, opset)
    finally:
        for rewrite in block.rewrites:
            rewrite.release()
    return block


def _read_sides(block: SoftmaxBlock) -> SoftmaxBlock:
    """block (its Softmax read) with the probability side read down to P·V, then the score side
    up to Q·Kᵀ."""
    softmax = block.softmax
    value: ir.Value | None = softmax.outputs[0]
    while value is not None:
        node = _next_probs_node(value)
        rule = next((r for r in _PROBS_SIDE if r.matches(node, value)), None)
        if rule is None:
            raise NotFused(f"the Softmax output feeds {u.label(node)}, not a MatMul with V")
        block, value = rule.read(node, value, block)

    block = dataclasses.replace(block, probs_ops=len(block.ops) - 1)
    value = softmax.inputs[0]
    while value is not None:
        producer = u.producer(value)
        if producer is None:
            raise NotFused(f"the scores {u.label(value)} are not computed from Q and K in this graph")
        rule = next((r for r in _SCORE_SIDE if r.matches(producer, value)), None)
        if rule is None:
            raise NotFused(f"the scores come from {u.label(producer)}, which no rule reads")
        block, value = rule.read(producer, value, block)
    return block


def _check_complete(block: SoftmaxBlock, opset: int) -> None:
    """What the whole block needs once both sides are read: a row-max guard testing its only
    bias, a head merge with its split, and what the split views need."""
    assert block.output is not None and block.q is not None and block.k is not None and block.v is not None
    assert block.rank is not None  # the rules set every field a block needs
    if block.guard_bias is not None and (
        block.masks or [_strip(b) for b in block.biases] != [_strip(block.guard_bias)]
    ):
        raise NotFused("the fully-masked-row guard tests a tensor other than the block's only bias")
    if block.heads_merged and block.heads_split is None:
        raise NotFused(NOT_SPLIT)
    if block.heads_split is not None:
        if opset < _SLICE_INPUTS_OPSET:
            raise NotFused(
                f"the [B·H] <-> [B, H] views are written with Slice-{_SLICE_INPUTS_OPSET}; the model is opset {opset}"
            )
        _check_head_split(block)


_SLICE_INPUTS_OPSET = 10  # Slice takes its bounds as inputs (the head views read a shape's tail)


def _check_head_split(block: SoftmaxBlock) -> None:
    """What the [B, H, Sq, Sk] view of a per-batch·head block needs: K and V of Q's B·H rows (no
    broadcast over the merged axis), the per-batch·head biases and masks of B·H rows or one, and
    those of the 4D view not of more batch items than the scores."""
    assert block.q is not None and block.k is not None and block.v is not None

    def dim(x: ir.Value, axis: int) -> shapes.Dim:
        found = proved_dims(x)
        return found[axis] if found is not None and axis < len(found) else None

    rows = dim(block.q, 0)
    for name, x, axis in (("K", block.k, through(block.k_perm, 0)), ("V", block.v, through(block.v_perm, 0))):
        if not dims_equal(rows, dim(x, axis)):
            raise NotFused(f"{name}'s batch·head rows are not proved to be Q's ({rows} and {dim(x, axis)})")
    for x in list(block.biases[block.split_biases :]) + [c for c, _ in block.masks[block.split_masks :]]:
        r = u.rank(x)
        if r is None or r > 3:
            raise NotFused(f"{u.label(x)} is added to [B·H, Sq, Sk] scores with rank {r}")
        if r == 3 and dim(x, 0) != 1 and not dims_equal(rows, dim(x, 0)):
            raise NotFused(f"{u.label(x)} is not proved to have Q's batch·head rows or one")
    batch = dim(u.operand(block.softmax, 0), 0)
    for x in list(block.biases[: block.split_biases]) + [c for c, _ in block.masks[: block.split_masks]]:
        r = u.rank(x)
        if r is None:
            raise NotFused(f"the rank of {u.label(x)} is unknown")
        if r == 4 and dim(x, 0) != 1 and not dims_equal(batch, dim(x, 0)):
            raise NotFused(f"{u.label(x)} is not proved to have the scores' batch items or one")


def _strip(value: ir.Value) -> ir.Value:
    """value without Identity/Cast wrappers, to compare two reads of one tensor."""
    while (node := u.producer(value, ("Identity", "Cast"))) is not None:
        value = u.operand(node, 0)
    return value


def scores_kept(block: SoftmaxBlock) -> list[str]:
    """Readers outside the block of the score tensors it computes (they stay computed)."""
    inside = set(block.nodes)
    readers: list[str] = []
    for node in block.nodes:
        if node.op_type in ("MatMul", "Einsum") and node.outputs[0] is block.output:
            continue
        for out in node.outputs:
            readers += u.consumers_besides(out, inside)
    return sorted(set(readers))


def describe(block: SoftmaxBlock) -> dict[str, object]:
    """The report's columns for a block read (Block fields)."""
    q_shape = u.value_shape(block.q) or []
    k_shape = u.value_shape(block.k) or []
    if block.k_perm is not None and len(k_shape) == len(block.k_perm):
        k_shape = [k_shape[i] for i in block.k_perm]
    four_d = block.rank == 4 and len(q_shape) == 4
    parts = [f"bias {u.value_shape(b) or '?'}" for b in block.biases]
    parts += [("not-" if inv else "") + f"mask {u.value_shape(c) or '?'}" for c, inv in block.masks]
    if block.bias_after_mask:
        parts.append("bias after mask")
    if block.nan_guard:
        parts.append("NaN guard")
    heads: int | str | None
    kv_heads: int | str | None
    if block.heads_split is not None:
        heads, kv_heads = block.heads_split, block.heads_split
    else:  # a [B·H, S, D] block shows no head count: its node sees one head per batch·head pair
        heads = q_shape[1] if four_d else None
        kv_heads = k_shape[1] if four_d and len(k_shape) == 4 else None
    # the row's counts are numbers or None (Block), never a dim's name; a fused row's are then
    # the ones its node's operands prove (pipeline/fused_rows.prove_heads)
    return {
        "pattern": block.pattern,
        "heads": shapes.static(heads),
        "kv_heads": shapes.static(kv_heads),
        "head_dim": shapes.static(q_shape[-1]) if q_shape else None,
        "scale": block.scale,
        "mask": ", ".join(parts) or "none",
        "dtype": dtype_name(u.dtype(block.q)),
    }
