"""Read every Softmax of a graph as an attention block, or say why it is not one."""

from __future__ import annotations

import onnx_ir as ir

from . import ir_utils as u
from .match import AttentionMatch, NotFused
from .rules import PROBS_RULES, SCORE_RULES, softmax_axis_is_last


def _next_probs_node(value: ir.Value, m: AttentionMatch):
    # CastLike(x, p) reads only p's type, not its values.
    consumers = [c for c in value.consumers() if not (c.op_type == "CastLike" and c.inputs[0] is not value)]
    if value.is_graph_output():
        raise NotFused(f"the attention probabilities {value.name} are a graph output")
    isnan = [c for c in consumers if c.op_type == "IsNaN"]
    if isnan and len(consumers) == 2:
        return isnan[0]  # the guard reads p twice: IsNaN(p) and Where(.., .., p)
    if len(consumers) != 1:
        names = ", ".join(c.name or c.op_type for c in consumers) or "nothing"
        raise NotFused(f"the attention probabilities {value.name} are read by {names}, not by one MatMul with V")
    return consumers[0]


def read_block(softmax: ir.Node, opset: int) -> AttentionMatch:
    """The attention block around softmax; raises NotFused naming the failed precondition."""
    m = AttentionMatch(softmax)
    softmax_axis_is_last(softmax, opset)
    m.add(softmax)

    value = softmax.outputs[0]
    while value is not None:
        node = _next_probs_node(value, m)
        rule = next((r for r in PROBS_RULES if r.matches(node, value)), None)
        if rule is None:
            raise NotFused(f"the attention probabilities feed {node.op_type} {node.name}, not a MatMul with V")
        rule.check(node, value, m)
        value = rule.apply(node, value, m)

    m.probs_ops = len(m.ops) - 1
    value = softmax.inputs[0]
    while value is not None:
        node = u.producer(value)
        if node is None:
            raise NotFused(f"the scores {value.name} are not computed from Q and K in this graph")
        rule = next((r for r in SCORE_RULES if r.matches(node, value)), None)
        if rule is None:
            raise NotFused(f"the scores come from {node.op_type} {node.name}, which no rule reads")
        rule.check(node, value, m)
        value = rule.apply(node, value, m)
    if m.guard_bias is not None and (m.masks or [_strip(b) for b in m.biases] != [_strip(m.guard_bias)]):
        raise NotFused("the fully-masked-row guard tests a tensor other than the block's only bias")
    return m


def _strip(value: ir.Value) -> ir.Value:
    """value without Identity/Cast wrappers, to compare two reads of one tensor."""
    while (node := u.producer(value, ("Identity", "Cast"))) is not None:
        value = node.inputs[0]
    return value


def scores_kept(m: AttentionMatch) -> list[str]:
    """Readers outside the block of the score tensors it computes (they stay computed)."""
    inside = set(m.nodes)
    readers = []
    for node in m.nodes:
        if node.op_type == "MatMul" and node.outputs[0] is m.output:
            continue
        for out in node.outputs:
            readers += u.consumers_besides(out, inside)
    return sorted(set(readers))
