"""FlashAttention -> the standard ONNX Attention op (opset 23). Named ``standard`` because a module
``onnx`` inside this package would shadow the onnx package for the modules beside it.

A node whose K and V are a KV-cache append (cache.py) lowers to Attention with ``past_key`` /
``past_value`` in and ``present_key`` / ``present_value`` out. Measured on ONNX Runtime 1.31 (CPU
EP): with a past, ``is_causal=1`` is aligned bottom-right (query i sees keys j <= past + i), which
is FlashAttention's ``is_causal`` 2; any batch and number of new tokens runs."""

from __future__ import annotations

import math
from typing import Any

import onnx_ir as ir

from ..errors import NotLowered
from ..graph import ir_utils as u
from ..graph.emitter import Emitter, replace_output
from ..graph.shapes import same_dim
from ..op.call import FlashAttentionCall
from . import layout, native
from .cache import CacheAppend, find_cache_append, prove_absorbable
from .read import ABSORBING_FILL, CallDims, aligned_batch, call_dims

OP_ATTENTION = "Attention"
ONNX_ATTENTION_OPSET = 23
ONNX_IR_VERSION = 10  # ONNX Runtime 1.31 and onnxruntime-web 1.30 load it with opset 23


def lower_standard(e: Emitter, call: FlashAttentionCall, output: ir.Value) -> tuple[str, str]:
    """Write the Attention node computing call and reroute output to it: (op, how)."""
    f16 = call.dtype != ir.DataType.FLOAT  # float16, or not known: computed in float32 between casts
    dims = call_dims(call)
    cache = find_cache_append(call)
    kept_outside = ""
    if cache is not None:
        why_not = _cache_refusal(call, cache)
        if why_not is None:
            return _attention_with_cache(e, call, cache, dims.hq, dims.hkv, output)
        kept_outside = f"cache append kept outside the op: {why_not}"
    op, how = _attention(e, call, dims, f16, output)
    return op, how + (f"; {kept_outside}" if kept_outside else "")


def _cache_refusal(call: FlashAttentionCall, cache: CacheAppend) -> str | None:
    """Why the cache append cannot move into Attention; None where it can."""
    if call.dtype != ir.DataType.FLOAT:
        return "Q is not proved float32 (past and present would change type between casts)"
    try:
        prove_absorbable(call, cache)
    except NotLowered as why:
        return str(why)
    return None


def _attention_with_cache(
    e: Emitter, call: FlashAttentionCall, cache: CacheAppend, hq: int | None, hkv: int | None, output: ir.Value
) -> tuple[str, str]:
    """Attention with past_key/past_value in and present_key/present_value out (all 4D)."""
    lengths = layout.SeqLengths(q=(call.q, 2), k=(cache.new_key, 2), past=cache.past_key)
    # with a past, ONNX Runtime aligns is_causal bottom-right: FlashAttention's is_causal 2
    native_causal, bias, attrs = _bias_and_attributes(e, call, lengths, aligned=call.is_causal == 2)
    inputs = [call.q, cache.new_key, cache.new_value, bias, cache.past_key, cache.past_value]
    out, present_value = native.absorb_cache(e, "Attention", inputs, attrs, cache)
    parts = [
        f"{hq or '?'} query / {hkv or '?'} key-value heads",
        "past_key/past_value in, present_key/present_value out",
    ]
    if call.softcap > 0:
        parts.append(f"softcap {call.softcap:g}")
    parts += layout.mask_parts(call, causal_folded=not native_causal)
    if native_causal:
        parts.append("is_causal=1, bottom-right with a past in ONNX Runtime")
    out, note = _fully_masked_rows(e, call, bias, out, False, present_value, (hq, hkv))
    if note:
        parts.append(note)
    replace_output(e.graph, output, out)
    return OP_ATTENTION, "; ".join(parts)


def _bias_and_attributes(
    e: Emitter, call: FlashAttentionCall, lengths: layout.SeqLengths, aligned: bool
) -> tuple[bool, ir.Value | None, dict[str, Any]]:
    """(native_causal, attn_mask, attributes) of an Attention node: its own is_causal where the
    call's causality is aligned as ONNX Runtime aligns it and nothing else masks; else the
    causality, the window and the masks in the additive attn_mask (float32-lowest avoided)."""
    native_causal = aligned and call.mask_fill == -math.inf and call.bias is None and call.mask is None
    native_causal = native_causal and not _windowed(call)
    bias = layout.additive_bias(e, call, lengths, fold_causal=not native_causal, avoid_lowest=True)
    attrs: dict[str, Any] = {"scale": call.scale}
    if native_causal:
        attrs["is_causal"] = 1
    if call.softcap > 0:
        attrs["softcap"] = call.softcap
    return native_causal, bias, attrs


def _windowed(call: FlashAttentionCall) -> bool:
    """Attention-23 has no sliding window: a call with one folds it, with causality, into attn_mask."""
    return call.window_left >= 0 or call.window_right >= 0


def _fully_masked_rows(
    e: Emitter,
    call: FlashAttentionCall,
    bias: ir.Value | None,
    out: ir.Value,
    squeeze: bool,
    v: ir.Value,
    heads: tuple[int | None, int | None],
    qk: tuple[ir.Value, ir.Value, dict[str, Any]] | None = None,
    causal_folded: bool = False,
) -> tuple[ir.Value, str]:
    """Rows with every key masked, written out so that every EP gives FlashAttention's values:

    - a row of -inf: FlashAttention gives NaN (or zeros after its guard); Attention gives zeros
      since the opset-23 errata, NaN before it;
    - a row of one finite value <= -2**127 (a float32-lowest fill, moved one float up by
      additive_bias): FlashAttention gives the mean of V, the CPU EP too, but the CUDA EP's
      Attention-23 gives zeros there (tests/data/cuda_defects/attention23_lowest_rows.py), so the
      mean of V (V as Attention reads it: [B, Hkv, Sk, Dv], or [B·H, Sk, D] one head each) is
      selected by Where;
    - a row whose largest value is such a fill and whose other keys are -inf (a bias with a row
      per query, causality or a window folded in: GPT-Neo's left-padded rows): FlashAttention gives
      the mean of V over the keys at the fill, the CUDA EP zeros again (3.9 off on the zoo's GPT-Neo,
      benchmarks/results/gpt_neo_cuda.md); that mean, Σ V over those keys / their count (a MatMul),
      is selected by Where where the bias has a query axis and one key/value head per query head
      (a bias broadcast over the queries, [.., 1, Sk], has no such rows: each row is every query's)."""
    if bias is None:
        return out, ""
    row_max = e.node("ReduceMax", [bias, e.i64([-1])], keepdims=1)
    # a row of -inf is found by its keys, not by row_max: the CUDA EP's ReduceMax gives float32's
    # lowest, not -inf, for such a row (onnxruntime issue 32256; on the H200 that made the mean of V
    # below 0/0 = NaN for the left-padded rows of --target onnx: benchmarks/results/cuda_held_out.md)
    finite = e.node("Cast", [e.node("Greater", [bias, e.f32(-math.inf)])], to=ir.DataType.FLOAT)
    dead = e.node("Equal", [e.node("ReduceMax", [finite, e.i64([-1])], keepdims=1), e.f32(0.0)])
    hq, hkv = heads

    def at_fill_alive() -> ir.Value:
        # rows whose largest bias is a fill the CUDA EP absorbs, and that keep a finite key
        return e.node("And", [e.node("LessOrEqual", [row_max, e.f32(ABSORBING_FILL)]), e.node("Not", [dead])])

    def dead_rows_then(out: ir.Value, how: str) -> tuple[ir.Value, str]:
        nan_rows = call.masked_rows == "nan"
        out = e.node("Where", [dead, e.f32(math.nan if nan_rows else 0.0), out])
        return out, f"fully masked rows -> {'NaN' if nan_rows else 'zeros'} by Where (-inf), {how}"

    per_query = causal_folded or _windowed(call) or any(_query_rows(x) for x in (call.bias, call.mask))
    if per_query and not squeeze and isinstance(hq, int) and hq == hkv:
        at_fill = e.node("Cast", [e.node("Equal", [bias, row_max])], to=ir.DataType.FLOAT)
        total = e.node("MatMul", [at_fill, v])  # [B, H, Sq, Dv]
        fill_mean = e.node("Div", [total, e.node("ReduceSum", [at_fill, e.i64([-1])], keepdims=1)])
        out = e.node("Where", [at_fill_alive(), fill_mean, out])
        return dead_rows_then(
            out,
            "the mean of V over the keys at the row's fill by Where (a fill <= -2**127: the CUDA EP gives zeros there)",
        )
    row_min = e.node("ReduceMin", [bias, e.i64([-1])], keepdims=1)
    uniform = e.node("And", [e.node("Equal", [row_max, row_min]), at_fill_alive()])
    if squeeze:
        dead, uniform = e.squeeze(dead, [1]), e.squeeze(uniform, [1])
    mean_v = e.node("ReduceMean", [v, e.i64([-2])], keepdims=1)  # [B, Hkv, 1, Dv] or [B·H, 1, D]
    if not squeeze and hq != hkv and (hq is None or hkv is None) and qk is not None:
        # head counts not static: Attention itself maps query heads to key/value heads; with Q = 0
        # every score is 0 and each row is the mean of V
        q, k, attrs = qk
        mean_v = e.node("Attention", [e.node("Mul", [q, e.f32(0.0)]), k, v], **attrs)
    elif not squeeze and hq != hkv:
        if hq is None or hkv is None:
            raise NotLowered("the head counts are not static: the mean of V for fully masked rows needs them")
        grouped = e.node("Unsqueeze", [mean_v, e.i64([2])])  # [B, Hkv, 1, 1, Dv]
        grouped = e.node("Expand", [grouped, e.i64([1, 1, hq // hkv, 1, 1])])
        mean_v = e.reshape(grouped, [0, hq, 1, -1])
    out = e.node("Where", [uniform, mean_v, out])
    return dead_rows_then(out, "the mean of V by Where (one value <= -2**127: the CUDA EP gives zeros there)")


def _query_rows(x: ir.Value | None) -> bool:
    """Whether a bias or mask of the call may have a row per query (its query axis not proved 1)."""
    if x is None:
        return False
    shape = x.shape
    return shape is None or len(shape) < 2 or shape[-2] != 1


def _attention(e: Emitter, call: FlashAttentionCall, dims: CallDims, f16: bool, output: ir.Value) -> tuple[str, str]:
    call, broadcast = aligned_batch(e, call, dims)
    three_d = None if f16 or dims.hq != 1 or dims.hkv != 1 else _three_d_sources(call, output)
    if three_d is not None:
        q, k, v, squeeze = three_d  # [B·H, S, D]: one head each
        lengths = layout.SeqLengths(q=(q, 1), k=(k, 1))
    else:
        q, k, v = (e.cast(x, ir.DataType.FLOAT) for x in (call.q, call.k, call.v))
        lengths = layout.SeqLengths(q=(q, 2), k=(k, 2))
    # without a past, ONNX Runtime aligns is_causal top-left: is_causal 2 only where Sq == Sk
    aligned = call.is_causal == 1 or (call.is_causal == 2 and same_dim(dims.sq, dims.sk))
    native_causal, bias, attrs = _bias_and_attributes(e, call, lengths, aligned)
    if three_d is not None:
        attrs.update(q_num_heads=1, kv_num_heads=1)
    out = e.node("Attention", [q, k, v] + ([bias] if bias is not None else []), **attrs)

    parts = [f"{dims.hq or '?'} query / {dims.hkv or '?'} key-value heads"]
    if broadcast:
        parts.append(broadcast)
    if three_d is not None:
        parts.append("3D [B·H, S, D] taken as one head, Unsqueeze/Squeeze dropped")
    if call.softcap > 0:
        parts.append(f"softcap {call.softcap:g}")
    parts += layout.mask_parts(call, causal_folded=not native_causal)
    plain = {key: value for key, value in attrs.items() if key in ("scale", "q_num_heads", "kv_num_heads")}
    folded = bool(call.is_causal) and not native_causal
    out, note = _fully_masked_rows(
        e, call, bias, out, three_d is not None, v, (dims.hq, dims.hkv), (q, k, plain), causal_folded=folded
    )
    if note:
        parts.append(note)
    if f16:
        out, note = layout.cast_back(e, out, call)
        parts.append(note)
    if three_d is not None:
        replace_output(e.graph, squeeze.outputs[0], out)
        e.graph.remove(squeeze, safe=True)
    else:
        replace_output(e.graph, output, out)
    return OP_ATTENTION, "; ".join(parts)


def _three_d_sources(call: FlashAttentionCall, output: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value, ir.Node] | None:
    """(q3, k3, v3, squeeze) when the call is a 3D [B·H, S, D] one wrapped in Unsqueeze/Squeeze(1)."""
    sources = []
    for x in (call.q, call.k, call.v):
        s = u.producer(x, "Unsqueeze")
        if s is None or u.unsqueeze_axes(s) != [1]:
            return None
        sources.append(u.operand(s, 0))
    uses = list(output.uses())
    if len(uses) != 1 or output.is_graph_output():
        return None
    reader = uses[0].node
    if reader.op_type != "Squeeze" or reader.domain not in ("", "ai.onnx") or u.unsqueeze_axes(reader) != [1]:
        return None
    return sources[0], sources[1], sources[2], reader
