"""FlashAttention -> ONNX Runtime's com.microsoft MultiHeadAttention, or GroupQueryAttention where
it provably computes the same (see the package docstring for the ONNX Runtime facts relied on).

A node whose K and V are a KV-cache append (cache.py) lowers with the cache inside the native op:
GroupQueryAttention with past_key/past_value for grouped-query blocks, MultiHeadAttention with
past_key/past_value for blocks with as many key/value heads as query heads; each writes the
present outputs the Concat wrote."""

from __future__ import annotations

import math
from typing import Any

import onnx_ir as ir

from ..errors import NotLowered
from ..graph.emitter import Emitter
from ..graph.shapes import same_dim
from ..op.call import FlashAttentionCall
from . import layout, native
from .cache import CacheAppend, find_cache_append, prove_absorbable
from .native import CONTRIB_DOMAIN
from .native import MIN_CONTRIB_OPSET as MIN_CONTRIB_OPSET  # re-exported: targets.py reads it here
from .read import CallDims, aligned_batch, call_dims

CONTRIB_VERSION = 1
OP_MHA = f"{CONTRIB_DOMAIN}.MultiHeadAttention"
OP_GQA = f"{CONTRIB_DOMAIN}.GroupQueryAttention"


def lower_contrib(e: Emitter, call: FlashAttentionCall, output: ir.Value) -> tuple[str, str]:
    """Write the native op computing call and reroute output to it: (op, how)."""
    native.require_contrib_opset(e)
    dims = call_dims(call)
    hq, hkv = native.head_counts(dims)
    cache = find_cache_append(call)
    kept_outside = ""
    if cache is not None:
        why_not = _cache_refusal(call, cache, dims, hq, hkv)
        if why_not is None:
            return _lower_with_cache(e, call, cache, dims, hq, hkv, output)
        kept_outside = f"cache append kept outside the op: {why_not}"
    op, how = _lower_without_cache(e, call, dims, hq, hkv, output)
    return op, how + (f"; {kept_outside}" if kept_outside else "")


def _native_causal(call: FlashAttentionCall) -> bool:
    """Whether GroupQueryAttention's own causal mask (and local window) may stand for the call's:
    with no bias and no mask. With them, a row whose causally visible keys are all masked differs
    (measured on ONNX Runtime 1.31: GroupQueryAttention does not give such a row NaN, FlashAttention
    with fill -inf does), so causality and the window are then folded into attention_bias and the
    op runs with causal=0 (which takes no local_window_size)."""
    return bool(call.is_causal) and call.bias is None and call.mask is None


def local_window_size(call: FlashAttentionCall) -> int | None:
    """GroupQueryAttention's local_window_size for a causal call's window: the keys a query sees,
    itself included, so window_left + 1 (measured on ONNX Runtime 1.31's CPU kernel, prefill and
    decode: local_window_size L keeps keys p - L < j <= p, tests/test_sliding_window.py); None
    without a window. With is_causal set window_right adds nothing (spec.py)."""
    return call.window_left + 1 if call.window_left >= 0 else None


def _window_attribute(call: FlashAttentionCall, attrs: dict[str, Any], parts: list[str]) -> None:
    """attrs["local_window_size"] for GroupQueryAttention's native causal mask, where the call has a window."""
    size = local_window_size(call)
    if size is not None:
        attrs["local_window_size"] = size
        parts.append(f"local_window_size={size} (window_left {call.window_left} + the query itself)")


def _cache_refusal(call: FlashAttentionCall, cache: CacheAppend, dims: CallDims, hq: int, hkv: int) -> str | None:
    """Why the cache append cannot move into a native op; None where it can."""
    if call.dtype != ir.DataType.FLOAT:
        return "Q is not proved float32 (past and present would change type between casts)"
    if call.softcap > 0:
        return "softcap: MultiHeadAttention has none, and GroupQueryAttention with past is not used with it"
    if hkv < hq and not native.gqa_head_size_fits(dims):
        return (
            "grouped-query heads need GroupQueryAttention, which needs one static head size that is a "
            f"multiple of {native.GQA_HEAD_SIZE_MULTIPLE}"
        )
    try:
        prove_absorbable(call, cache)
    except NotLowered as why:
        return str(why)
    return None


def _lower_with_cache(
    e: Emitter,
    call: FlashAttentionCall,
    cache: CacheAppend,
    dims: CallDims,
    hq: int,
    hkv: int,
    output: ir.Value,
) -> tuple[str, str]:
    """GroupQueryAttention (hkv < hq) or MultiHeadAttention (hkv == hq) with past_key/past_value in,
    present_key/present_value out, the Concat outputs rerouted to the presents."""
    q3 = layout.to_bsd(e, call.q, hq)
    k3, v3 = layout.to_bsd(e, cache.new_key, hkv), layout.to_bsd(e, cache.new_value, hkv)
    lengths = layout.SeqLengths(q=(q3, 1), k=(k3, 1), past=cache.past_key)
    parts = [f"{hq} query / {hkv} key-value heads", "past_key/past_value in, present_key/present_value out"]
    if hkv < hq:
        # with a past, GroupQueryAttention's causal mask is bottom-right: is_causal 2's; 1 goes in the bias
        native_causal = call.is_causal == 2 and _native_causal(call)
        bias = layout.additive_bias(e, call, lengths, fold_causal=not native_causal, avoid_lowest=False)
        # every row holds all past + new keys: seqlens_k (keys - 1) is the same for each
        seqlens = native.key_lengths(e, lengths.of(e, "k", scalar=True), q3)
        attrs = native.gqa_attributes(hq, hkv, call.scale)
        if not native_causal:
            attrs["causal"] = 0
        else:
            _window_attribute(call, attrs, parts)
        past = (cache.past_key, cache.past_value)
        inputs = native.gqa_inputs(q3, k3, v3, seqlens, past, (bias,) if bias is not None else ())
        op, op_type = OP_GQA, "GroupQueryAttention"
        parts.append("seqlens_k = past + new - 1 for every row, total_sequence_length = past + new")
        parts.append(
            "causal=1 (bottom-right, as is_causal 2)"
            if native_causal
            else "causal=0, causality (if any) in attention_bias"
        )
        parts.append(
            "ONNX Runtime 1.31's CPU kernel runs prefill (past 0) and decode (1 new token); it refuses a batch > 1 "
            "with several new tokens after a non-empty past"
        )
        causal_folded = not native_causal
    else:
        bias = layout.additive_bias(e, call, lengths, fold_causal=True, avoid_lowest=False)
        inputs = [q3, k3, v3, None, None, bias, cache.past_key, cache.past_value]
        attrs = {"num_heads": hq, "scale": call.scale}
        op, op_type = OP_MHA, "MultiHeadAttention"
        parts.append("no GroupQueryAttention needed: as many key/value heads as query heads")
        causal_folded = True
    out, _ = native.absorb_cache(e, op_type, inputs, attrs, cache, CONTRIB_DOMAIN)
    parts += layout.mask_parts(call, causal_folded=causal_folded)
    if call.masked_rows == "zero":
        out = e.node("Where", [e.node("IsNaN", [out]), e.f32(0.0), out])
        parts.append("NaN guard -> Where(IsNaN(out), 0, out) (exact for finite V)")
    layout.replace_bsd_output(e, out, hq, output, True)
    return op, "; ".join(parts)


def _lower_without_cache(
    e: Emitter, call: FlashAttentionCall, dims: CallDims, hq: int, hkv: int, output: ir.Value
) -> tuple[str, str]:
    # GroupQueryAttention without past: Sq == Sk, one head size (a multiple of 8 on the CPU EP), and
    # causal blocks only (MultiHeadAttention covers non-causal blocks everywhere). With Sq == Sk,
    # is_causal 1 and 2 are the same mask.
    gqa_fits = (
        bool(call.is_causal)
        and call.mask_fill == -math.inf
        and not call.bias_after_mask
        and same_dim(dims.sq, dims.sk)
        and native.gqa_head_size_fits(dims)
    )
    if call.softcap > 0 and not gqa_fits:
        raise NotLowered(
            "softcap: MultiHeadAttention has none, and GroupQueryAttention is used only for causal blocks "
            "with mask_fill -inf, Sq == Sk and one static head size that is a multiple of 8, not proved here"
        )
    use_gqa = gqa_fits and (hkv < hq or call.softcap > 0)

    native.require_castlike_for_unknown_dtype(e, call)
    f16 = call.dtype != ir.DataType.FLOAT  # float16, or not known: computed in float32 between casts
    call, broadcast = aligned_batch(e, call, dims)
    q, k, v = (e.cast(x, ir.DataType.FLOAT) for x in (call.q, call.k, call.v))
    reuse = not f16  # with casts around, the surrounding Transposes are not the inputs
    parts = [f"{hq} query / {hkv} key-value heads"] + ([broadcast] if broadcast else [])
    causal_folded = True
    if use_gqa:
        native_causal = _native_causal(call)
        ops = layout.bsd_operands(e, (q, k, v), (hq, hkv), reuse, parts)
        out = _group_query_attention(e, call, ops, native_causal, parts)
        op = OP_GQA
        if call.softcap > 0:
            parts.append(f"softcap {call.softcap:g}")
        parts.append("Sq == Sk proved")
        causal_folded = not native_causal
        if not native_causal:
            parts.append("causal=0, causality in attention_bias")
    else:
        q3 = layout.to_bsd(e, q, hq, reuse)
        if hkv != hq:
            k_in, v_in = layout.repeat_kv_bsd(e, k, v, hq, hkv, reuse, parts)
        elif reuse and layout.bsd_source(k, hkv) is not None and layout.bsd_source(v, hkv) is not None:
            k_in, v_in = layout.to_bsd(e, k, hkv), layout.to_bsd(e, v, hkv)
        elif same_dim(dims.dk, dims.dv) and same_dim(dims.sk, dims.sv):
            k_in, v_in = k, v  # 4D BNSH, as MultiHeadAttention takes when key and value shapes agree
        else:
            k_in, v_in = layout.to_bsd(e, k, hkv, reuse), layout.to_bsd(e, v, hkv, reuse)
        lengths = layout.SeqLengths(q=(q3, 1), k=(k_in, 2 if k_in is k else 1))
        bias = layout.additive_bias(e, call, lengths, fold_causal=True, avoid_lowest=False)
        inputs = [q3, k_in, v_in] + ([None, None, bias] if bias is not None else [])
        out = e.node("MultiHeadAttention", inputs, domain=CONTRIB_DOMAIN, num_heads=hq, scale=call.scale)
        op = OP_MHA
    parts += layout.mask_parts(call, causal_folded=causal_folded)
    if call.masked_rows == "zero":
        # Both ops give NaN for a row with every key masked; FlashAttention's guard gives zeros.
        out = e.node("Where", [e.node("IsNaN", [out]), e.f32(0.0), out])
        parts.append("NaN guard -> Where(IsNaN(out), 0, out) (exact for finite V)")
    if f16:
        out, note = layout.cast_back(e, out, call)
        parts.append(note)
    layout.replace_bsd_output(e, out, hq, output, reuse)
    return op, "; ".join(parts)


def _group_query_attention(
    e: Emitter, call: FlashAttentionCall, ops: layout.BsdOperands, native_causal: bool, parts: list[str]
) -> ir.Value:
    """GroupQueryAttention without past: causal with seqlens_k = Sk - 1 for every row is the
    top-left mask when Sq == Sk; causal=0 where the causality is folded into attention_bias."""
    seqlens = native.key_lengths(e, ops.lengths.of(e, "k", scalar=True), ops.q)
    bias = layout.additive_bias(e, call, ops.lengths, fold_causal=not native_causal, avoid_lowest=False)
    attrs = native.gqa_attributes(ops.hq, ops.hkv, call.scale)
    if not native_causal:
        attrs["causal"] = 0
    else:
        _window_attribute(call, attrs, parts)
    if call.softcap > 0:
        attrs["softcap"] = call.softcap
    # the attention_bias slot is written even when empty (an 11-input node)
    inputs = native.gqa_inputs(ops.q, ops.k, ops.v, seqlens, attention_bias=(bias,))
    return native.group_query_attention(e, inputs, attrs)
