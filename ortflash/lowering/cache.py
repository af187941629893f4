"""The KV-cache append around a FlashAttention node, for the native ops to own.

Decoders exported with a cache compute ``present_key = Concat(past_key, new_key, axis=2)`` (and
the same for values) in [B, Hkv, S, D], feed it to the attention as K (V), and return it as a
graph output. The FlashAttention op keeps its five inputs (Q, K, V, bias, mask): the
onnxruntime-extensions bridge cannot take optional inputs, and more inputs would break models
fused earlier. So the fused node reads the concatenated K and V, and the append stays a Concat
beside it; the lowering hands it to the native op, which takes ``past_key``/``past_value`` and
writes ``present_key``/``present_value`` itself (GroupQueryAttention, MultiHeadAttention,
Attention-23).

Preconditions, each proved from the graph or the append stays outside:

- K and V are each the output of one two-input Concat on axis 2 (or -2) of rank-4 tensors;
- new keys and values have as many tokens as Q (the native ops take one sequence length for
  the new tokens), proved from shapes;
- past and new tensors have the batch size of Q, not a broadcast one;
- the Concat outputs are read by nothing that runs before the attention except the graph's
  outputs: later readers move to the native op's present outputs, earlier ones keep the Concat.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from ..errors import NotLowered
from ..graph import ir_utils as u
from ..graph import shapes
from ..graph.emitter import take_graph_output
from ..op.call import FlashAttentionCall

_SEQ_AXES = (2, -2)


@dataclass(frozen=True)
class CacheAppend:
    """K = Concat(past_key, new_key) and V = Concat(past_value, new_value), all [B, Hkv, S, D]."""

    past_key: ir.Value
    new_key: ir.Value
    past_value: ir.Value
    new_value: ir.Value
    present_key: ir.Value  # the Concat outputs: the call's K and V
    present_value: ir.Value


def _concat_parts(x: ir.Value) -> tuple[ir.Value, ir.Value] | None:
    node = u.producer(x, "Concat")
    if node is None or len(node.inputs) != 2 or any(i is None for i in node.inputs):
        return None
    axis = node.attributes.get("axis")
    if axis is None or axis.value not in _SEQ_AXES:
        return None
    past, new = node.inputs
    assert past is not None and new is not None
    if any(u.rank(t) not in (4, None) for t in (past, new, x)) or u.rank(x) is None:
        return None
    return past, new


def find_cache_append(call: FlashAttentionCall) -> CacheAppend | None:
    """The cache append feeding the call's K and V, or None where K or V is not one."""
    keys, values = _concat_parts(call.k), _concat_parts(call.v)
    if keys is None or values is None:
        return None
    return CacheAppend(keys[0], keys[1], values[0], values[1], call.k, call.v)


def prove_absorbable(call: FlashAttentionCall, cache: CacheAppend) -> None:
    """Raise NotLowered naming the precondition the cache append fails (module docstring)."""
    sq = shapes.resolved_dim(call.q, 2)
    for label, x in (("keys", cache.new_key), ("values", cache.new_value)):
        if not shapes.same_dim(shapes.resolved_dim(x, 2), sq):
            raise NotLowered(
                f"the cache append's new {label} are not proved to have as many tokens as Q "
                f"({_words(shapes.resolved_dim(x, 2))} and {_words(sq)}), which the native ops need"
            )
    batch = shapes.resolved_dim(call.q, 0)
    for label, x in (
        ("past keys", cache.past_key),
        ("new keys", cache.new_key),
        ("past values", cache.past_value),
        ("new values", cache.new_value),
    ):
        if shapes.may_broadcast(shapes.resolved_dim(x, 0), batch):
            raise NotLowered(f"the cache append's {label} are not proved to have Q's batch size")


def move_present(graph: ir.Graph, anchor: ir.Node, old: ir.Value, new: ir.Value) -> bool:
    """Let ``new`` (a native op's present output, written before ``anchor``) stand for ``old`` (the
    Concat output) for the graph's outputs and every reader at or after ``anchor``; readers before
    it keep ``old`` (moving them would break the node order). True when nothing reads ``old`` then."""
    order = {id(n): i for i, n in enumerate(graph)}
    at = order[id(anchor)]
    take_graph_output(graph, old, new)
    for use in list(old.uses()):
        if order.get(id(use.node), -1) >= at:
            use.node.replace_input_with(use.idx, new)
    if old.dtype is not None:
        new.dtype = old.dtype
    new.shape = old.shape
    return not list(old.uses())


def _words(d: shapes.Dim) -> str:
    return "?" if d is None else str(d) if isinstance(d, (int, str)) else "an unnamed number of"
