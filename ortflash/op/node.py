"""Write a FlashAttentionCall as one FlashAttention node, with what the ONNX Runtime bridge needs
around it, and mark the node with the block it stands for."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ..graph.emitter import Emitter
from . import spec
from .call import FlashAttentionCall
from .policy import SoftmaxPolicy

# Node metadata written on every FlashAttention node ortflash.optimize emits.
REPLACES = "ortflash.replaces"  # the original value the node computes (ortflash validate reads it)
BLOCK_ID = "ortflash.block"  # the report row (index in Report.blocks) the node stands for
# A head count the user gave (--num-heads) where nothing proves it, and which of Q, K, V (input
# indexes) have it: "12:0,1,2". A lowering, whose ops take the count as a number, reshapes those
# inputs to [0, N, 0, 0] (lowering/head_count.py); FlashAttention itself reads heads from shapes.
GIVEN_HEADS = "ortflash.given_heads"

_ACCUMULATOR = ir.DataType.FLOAT


def write_call(e: Emitter, call: FlashAttentionCall, policy: SoftmaxPolicy, block_id: str, replaces: str) -> ir.Value:
    """Insert the FlashAttention node computing call; its output in Q's dtype, [B, Hq, Sq, Dv]."""
    # The bridge cannot take missing inputs: an absent bias or mask is a neutral scalar (spec.INPUTS).
    bias = e.f32(0.0) if call.bias is None else call.bias
    mask = e.const(np.array(True)) if call.mask is None else call.mask
    q, k, v = call.q, call.k, call.v
    # onnxruntime-extensions' Python ops take float32 only: float16 blocks run with exact
    # upcasts around the node, which accumulates in float32 either way.
    exact_casts = (call.dtype or _ACCUMULATOR) != _ACCUMULATOR
    if exact_casts:
        q, k, v = (e.node("Cast", [x], to=_ACCUMULATOR) for x in (q, k, v))
    out = e.node(spec.OP_TYPE, [q, k, v, bias, mask], domain=spec.DOMAIN, **call.attributes(policy))
    fused = out.producer()
    assert fused is not None
    fused.metadata_props[REPLACES] = replaces
    fused.metadata_props[BLOCK_ID] = block_id
    if exact_casts and call.dtype is not None:
        out = e.node("Cast", [out], to=call.dtype)
    return out
