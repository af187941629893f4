"""FlashAttention -> ONNX Runtime's com.microsoft MultiHeadAttention, or GroupQueryAttention where
it provably computes the same (see the package docstring for the ONNX Runtime facts relied on)."""

from __future__ import annotations

import math

import onnx_ir as ir

from ..errors import NotLowered
from ..fusion.call import FlashAttentionCall
from ..graph.emitter import Emitter
from ..graph.shapes import same_dim
from . import layout
from .read import aligned_batch, call_dims

CONTRIB_DOMAIN = "com.microsoft"
CONTRIB_VERSION = 1
MIN_CONTRIB_OPSET = 13  # the helper ops are written in their opset-13 forms (axes as inputs)
OP_MHA = f"{CONTRIB_DOMAIN}.MultiHeadAttention"
OP_GQA = f"{CONTRIB_DOMAIN}.GroupQueryAttention"
_CASTLIKE_OPSET = 15
_GQA_HEAD_SIZE_MULTIPLE = 8  # the CPU EP's GroupQueryAttention kernel


def lower_contrib(e: Emitter, call: FlashAttentionCall, output: ir.Value) -> tuple[str, str]:
    """Write the native op computing call and reroute output to it: (op, how)."""
    if e.opset < MIN_CONTRIB_OPSET:
        raise NotLowered(
            f"the model's opset {e.opset} is below {MIN_CONTRIB_OPSET}, which the reshaping ops are written for"
        )
    dims = call_dims(call)
    hq, hkv = dims.hq, dims.hkv
    if hq is None or hkv is None:
        raise NotLowered("the head counts (dim 1 of Q and K) are not static; MultiHeadAttention needs num_heads")
    if hkv < 1 or hq % hkv:
        raise NotLowered(f"{hq} query heads are not a multiple of {hkv} key/value heads")
    # GroupQueryAttention without past: Sq == Sk, one head size (a multiple of 8 on the CPU EP), and
    # causal blocks only: its causal=0 attribute is recent (ONNX Runtime 1.31 has it, older ones
    # reject it), and MultiHeadAttention covers non-causal blocks everywhere.
    gqa_fits = (
        call.is_causal
        and call.mask_fill == -math.inf
        and same_dim(dims.sq, dims.sk)
        and same_dim(dims.dk, dims.dv)
        and same_dim(dims.d, dims.dv)
        and isinstance(dims.d, int)
        and dims.d % _GQA_HEAD_SIZE_MULTIPLE == 0
    )
    if call.softcap > 0 and not gqa_fits:
        raise NotLowered(
            "softcap: MultiHeadAttention has none, and GroupQueryAttention is used only for causal blocks "
            "with mask_fill -inf, Sq == Sk and one static head size that is a multiple of 8, not proved here"
        )
    use_gqa = gqa_fits and (hkv < hq or call.softcap > 0)

    if call.dtype is None and e.opset < _CASTLIKE_OPSET:
        raise NotLowered("Q's element type is not known and the model's opset has no CastLike (15) to restore it")
    f16 = call.dtype != ir.DataType.FLOAT  # float16, or not known: computed in float32 between casts
    call, broadcast = aligned_batch(e, call, dims)
    q, k, v = (e.cast(x, ir.DataType.FLOAT) for x in (call.q, call.k, call.v))
    reuse = not f16  # with casts around, the surrounding Transposes are not the inputs
    parts = [f"{hq} query / {hkv} key-value heads"] + ([broadcast] if broadcast else [])
    if use_gqa:
        out = _group_query_attention(e, call, q, k, v, hq, hkv, reuse)
        op = OP_GQA
        if call.softcap > 0:
            parts.append(f"softcap {call.softcap:g}")
        parts.append("Sq == Sk proved")
    else:
        q3 = layout.to_bsd(e, q, hq, reuse)
        if hkv != hq:
            r = hq // hkv
            k_in, v_in = layout.repeat_bsd(e, k, hkv, r, reuse), layout.repeat_bsd(e, v, hkv, r, reuse)
            parts.append(f"key/value heads repeated {r}x")
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
    parts += layout.mask_parts(call, causal_folded=not use_gqa)
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
    e: Emitter, call: FlashAttentionCall, q: ir.Value, k: ir.Value, v: ir.Value, hq: int, hkv: int, reuse: bool
) -> ir.Value:
    """GroupQueryAttention without past: causal with seqlens_k = Sk - 1 for every row is the
    top-left mask when Sq == Sk."""
    q3, k3, v3 = (layout.to_bsd(e, x, h, reuse) for x, h in ((q, hq), (k, hkv), (v, hkv)))
    lengths = layout.SeqLengths(q=(q3, 1), k=(k3, 1))
    sk = lengths.of(e, "k", scalar=True)
    seqlens = e.node("Cast", [e.node("Sub", [sk, e.i64(1)])], to=ir.DataType.INT32)
    seqlens = e.node("Expand", [seqlens, e.dim(q3, 0)])
    total = e.node("Cast", [sk], to=ir.DataType.INT32)
    bias = layout.additive_bias(e, call, lengths, fold_causal=False, avoid_lowest=False)
    attrs: dict[str, object] = {"num_heads": hq, "kv_num_heads": hkv, "scale": call.scale}
    if call.softcap > 0:
        attrs["softcap"] = call.softcap
    return e.node(
        "GroupQueryAttention",
        [q3, k3, v3, None, None, seqlens, total, None, None, None, bias],
        domain=CONTRIB_DOMAIN,
        **attrs,
    )
