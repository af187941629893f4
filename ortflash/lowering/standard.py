"""FlashAttention -> the standard ONNX Attention op (opset 23). Named ``standard`` because a module
``onnx`` inside this package would shadow the onnx package for the modules beside it."""

from __future__ import annotations

import math
from typing import Any

import onnx_ir as ir

from ..fusion.call import FlashAttentionCall
from ..graph import ir_utils as u
from ..graph.emitter import Emitter, replace_output
from . import layout
from .read import aligned_batch, call_dims

OP_ATTENTION = "Attention"
ONNX_ATTENTION_OPSET = 23
ONNX_IR_VERSION = 10  # ONNX Runtime 1.31 and onnxruntime-web 1.30 load it with opset 23


def lower_standard(e: Emitter, call: FlashAttentionCall, output: ir.Value) -> tuple[str, str]:
    """Write the Attention node computing call and reroute output to it: (op, how)."""
    f16 = call.dtype != ir.DataType.FLOAT  # float16, or not known: computed in float32 between casts
    dims = call_dims(call)
    call, broadcast = aligned_batch(e, call, dims)
    three_d = None if f16 or dims.hq != 1 or dims.hkv != 1 else _three_d_sources(call, output)
    if three_d is not None:
        q, k, v, squeeze = three_d  # [B·H, S, D]: one head each
        lengths = layout.SeqLengths(q=(q, 1), k=(k, 1))
    else:
        q, k, v = (e.cast(x, ir.DataType.FLOAT) for x in (call.q, call.k, call.v))
        lengths = layout.SeqLengths(q=(q, 2), k=(k, 2))
    native_causal = call.is_causal and call.mask_fill == -math.inf and call.bias is None and call.mask is None
    bias = layout.additive_bias(e, call, lengths, fold_causal=not native_causal, avoid_lowest=True)
    attrs: dict[str, Any] = {"scale": call.scale}
    if native_causal:
        attrs["is_causal"] = 1
    if call.softcap > 0:
        attrs["softcap"] = call.softcap
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
    if bias is not None:
        # Rows with every key masked: FlashAttention gives NaN (or zeros after its guard);
        # Attention gives zeros since the opset-23 errata, NaN before it. Written out, both hold.
        dead = e.node("Equal", [e.node("ReduceMax", [bias, e.i64([-1])], keepdims=1), e.f32(-math.inf)])
        if three_d is not None:
            dead = e.squeeze(dead, [1])
        nan_rows = call.masked_rows == "nan"
        out = e.node("Where", [dead, e.f32(math.nan if nan_rows else 0.0), out])
        parts.append(f"fully masked rows -> {'NaN' if nan_rows else 'zeros'} by Where")
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
