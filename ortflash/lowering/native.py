"""Writes the native attention nodes the targets share: a node with present_key/present_value
outputs (and the cache append moved into it), GroupQueryAttention with its key lengths (and with
its own causal mask, as the GPU targets write it), and the head counts, head size and opsets those
nodes need."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import onnx_ir as ir

from ..errors import NotLowered
from ..graph.emitter import Emitter
from ..graph.shapes import same_dim
from ..op.call import FlashAttentionCall
from . import layout
from .cache import CacheAppend, move_present
from .read import CallDims

CONTRIB_DOMAIN = "com.microsoft"
MIN_CONTRIB_OPSET = 13  # the helper ops are written in their opset-13 forms (axes as inputs)
GQA_HEAD_SIZE_MULTIPLE = 8  # GroupQueryAttention's kernels (CPU and CUDA); a WebGPU form must run there too
CASTLIKE_OPSET = 15  # restores an element type that shape inference did not find (layout.cast_back)


def require_contrib_opset(e: Emitter) -> None:
    """NotLowered below the opset the reshaping ops around the com.microsoft nodes are written for."""
    if e.opset < MIN_CONTRIB_OPSET:
        raise NotLowered(
            f"the model's opset {e.opset} is below {MIN_CONTRIB_OPSET}, which the reshaping ops are written for"
        )


def require_castlike_for_unknown_dtype(e: Emitter, call: FlashAttentionCall) -> None:
    """NotLowered where Q's element type is not known and the opset has no CastLike to restore it."""
    if call.dtype is None and e.opset < CASTLIKE_OPSET:
        raise NotLowered("Q's element type is not known and the model's opset has no CastLike (15) to restore it")


def head_counts(dims: CallDims) -> tuple[int, int]:
    """(num_heads, kv_num_heads): static, and the query heads a multiple of the key/value heads."""
    hq, hkv = dims.hq, dims.hkv
    if hq is None or hkv is None:
        raise NotLowered("the head counts (dim 1 of Q and K) are not static; MultiHeadAttention needs num_heads")
    if hkv < 1 or hq % hkv:
        raise NotLowered(f"{hq} query heads are not a multiple of {hkv} key/value heads")
    return hq, hkv


def gqa_head_size_fits(dims: CallDims) -> bool:
    """GroupQueryAttention's one head size: Q, K and V alike, static, a multiple of GQA_HEAD_SIZE_MULTIPLE."""
    return (
        same_dim(dims.dk, dims.dv)
        and same_dim(dims.d, dims.dv)
        and isinstance(dims.d, int)
        and dims.d % GQA_HEAD_SIZE_MULTIPLE == 0
    )


def node_with_presents(
    e: Emitter, op_type: str, inputs: Sequence[ir.Value | None], attributes: Mapping[str, Any], domain: str = ""
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """op_type with three outputs (out, present_key, present_value), named after it, before the anchor."""
    node = ir.node(op_type, inputs, attributes=attributes, domain=domain, num_outputs=3, name=f"{e.prefix}/{op_type}")
    for value, suffix in zip(node.outputs, ("out", "present_key", "present_value")):
        value.name = f"{e.prefix}/{op_type}_{suffix}"
    e.graph.insert_before(e.anchor, node)
    out, present_key, present_value = node.outputs
    return out, present_key, present_value


def absorb_cache(
    e: Emitter,
    op_type: str,
    inputs: Sequence[ir.Value | None],
    attributes: Mapping[str, Any],
    cache: CacheAppend,
    domain: str = "",
) -> tuple[ir.Value, ir.Value]:
    """node_with_presents whose presents take the place of the cache append's Concat outputs:
    (out, present_value)."""
    out, present_key, present_value = node_with_presents(e, op_type, inputs, attributes, domain)
    move_present(e.graph, e.anchor, cache.present_key, present_key)
    move_present(e.graph, e.anchor, cache.present_value, present_value)
    return out, present_value


def gqa_own_causal_fits(call: FlashAttentionCall, dims: CallDims) -> bool:
    """Whether GroupQueryAttention without past, with its own causal mask and nothing else, computes
    the call: top-left causal (Sq == Sk proved, where seqlens_k = Sk - 1 is that mask), no window,
    bias or mask, and one head size the kernels take."""
    return (
        call.is_causal == 1
        and call.window_left < 0
        and call.window_right < 0
        and call.bias is None
        and call.mask is None
        and same_dim(dims.sq, dims.sk)
        and gqa_head_size_fits(dims)
    )


def key_lengths(e: Emitter, total: ir.Value, q3: ir.Value) -> tuple[ir.Value, ir.Value]:
    """GroupQueryAttention's seqlens_k and total_sequence_length (int32) when every row holds all
    `total` keys (int64 scalar): seqlens_k = total - 1 for each of q3's batch rows."""
    seqlens = e.node("Cast", [e.node("Sub", [total, e.i64(1)])], to=ir.DataType.INT32)
    seqlens = e.node("Expand", [seqlens, e.dim(q3, 0)])
    return seqlens, e.node("Cast", [total], to=ir.DataType.INT32)


def gqa_inputs(
    q3: ir.Value,
    k3: ir.Value,
    v3: ir.Value,
    lengths: tuple[ir.Value, ir.Value],
    past: tuple[ir.Value | None, ir.Value | None] = (None, None),
    attention_bias: Sequence[ir.Value | None] = (),
) -> list[ir.Value | None]:
    """GroupQueryAttention's inputs: query, key, value, past_key, past_value, seqlens_k,
    total_sequence_length, then (where attention_bias holds one value) cos_cache, sin_cache and
    position_ids left empty before attention_bias."""
    inputs: list[ir.Value | None] = [q3, k3, v3, *past, *lengths]
    if attention_bias:
        inputs += [None, None, None, *attention_bias]
    return inputs


def gqa_attributes(hq: int, hkv: int, scale: float) -> dict[str, Any]:
    """GroupQueryAttention's head counts and scale; callers add causal, local_window_size, softcap."""
    return {"num_heads": hq, "kv_num_heads": hkv, "scale": scale}


def group_query_attention(
    e: Emitter, inputs: Sequence[ir.Value | None], attributes: Mapping[str, Any], presents: bool = False
) -> ir.Value:
    """The GroupQueryAttention node (com.microsoft) and its output; presents: with present_key /
    present_value outputs that nothing reads (an EP that refuses the node without them)."""
    if presents:
        return node_with_presents(e, "GroupQueryAttention", inputs, attributes, CONTRIB_DOMAIN)[0]
    return e.node("GroupQueryAttention", inputs, domain=CONTRIB_DOMAIN, **attributes)


def gqa_own_causal(e: Emitter, call: FlashAttentionCall, ops: layout.BsdOperands, presents: bool = False) -> ir.Value:
    """GroupQueryAttention without past and its own causal mask (gqa_own_causal_fits): causal with
    seqlens_k = Sk - 1 for every row is the top-left mask when Sq == Sk (no row is fully masked:
    row i sees key 0). presents as for group_query_attention."""
    seqlens = key_lengths(e, e.dim(ops.k, 1, scalar=True), ops.q)
    inputs = gqa_inputs(ops.q, ops.k, ops.v, seqlens)
    return group_query_attention(e, inputs, gqa_attributes(ops.hq, ops.hkv, call.scale), presents=presents)
