"""Writing an AttentionOpReading (onnx_attention_read) as one FlashAttention node, ONNX Runtime's
rules in the op's terms (fusion/onnx_attention says which): the heads split from 3D inputs, the
past concatenated, the causal frontier (the op's is_causal where it is top-left, else a bool mask),
the window, the nonpad and bool masks as one mask, the float mask as the bias; then the call, and
the node's outputs rerouted to it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from ..graph import ir_utils as u
from ..graph import shapes
from ..graph.emitter import Emitter, replace_output
from ..op.call import FlashAttentionCall
from ..op.node import write_call
from ..op.policy import SoftmaxPolicy
from .onnx_attention_read import AttentionOpReading


def _dim_of(value: ir.Value | None, axis: int) -> int | None:
    shape = u.value_shape(value) if value is not None else None
    return None if shape is None or len(shape) <= axis else shapes.static(shape[axis])


def _total_static(p: AttentionOpReading) -> int | None:
    """The static key count past + new, when both are known."""
    new = _dim_of(p.k, 2 if p.rank == 4 else 1)
    past = 0 if p.past_key is None else _dim_of(p.past_key, 2)
    return None if new is None or past is None else past + new


def _heads_first(e: Emitter, x: ir.Value, heads: int | None) -> ir.Value:
    """[B, S, H·D] -> [B, H, S, D]."""
    assert heads is not None  # read_attention requires the head counts of 3D inputs
    return e.transpose(e.reshape(x, [0, 0, heads, -1]), [0, 2, 1, 3])


@dataclass(frozen=True)
class _Causal:
    """How ORT's causal rule is written for one node."""

    mask: ir.Value | None  # an explicit bool mask, or None
    top_left: bool  # FlashAttention's own is_causal computes it
    how: str  # for the report


def _causal(e: Emitter, p: AttentionOpReading, q4: ir.Value, k4: ir.Value) -> _Causal:
    """ORT's causal rule as FlashAttention's is_causal where it is top-left, else as a bool mask."""
    sq_static = _dim_of(p.q, 2 if p.rank == 4 else 1)
    past_static = _dim_of(p.past_key, 2)
    if p.nonpad is None and (p.past_key is None or past_static == 0):
        return _Causal(None, True, "top-left")
    if p.nonpad is None and past_static is not None and sq_static == 1 and not p.windowed:
        return _Causal(None, False, "none: one query after a past sees every key, as in ONNX Runtime")
    sq = e.dim(q4, 2, scalar=True, known=sq_static)
    total = e.dim(k4, 2, scalar=True, known=_total_static(p))
    if p.nonpad is not None:
        # Per batch, bottom-right: key j is seen by query i when j <= i + nonpad[b] - Sq.
        how = "bottom-right by nonpad_kv_seqlen"
        offset = e.unsqueeze(e.node("Sub", [p.nonpad, sq]), [1, 2, 3])  # [B, 1, 1, 1]
    else:
        # j <= i + P, except that ORT lets a single query after a non-empty past see every key.
        assert p.past_key is not None
        how = "offset by the past length"
        offset = e.dim(p.past_key, 2, scalar=True, known=past_static)
        if (sq_static is None or sq_static == 1) and not p.windowed:
            single = e.node("Equal", [sq, e.i64(1)])
            has_past = e.node("Greater", [offset, e.i64(0)])
            offset = e.node("Where", [e.node("And", [single, has_past]), total, offset])
    rows = e.unsqueeze(e.arange(sq), [1])  # [Sq, 1]
    cols = e.unsqueeze(e.arange(total), [0])  # [1, T]
    ahead = e.node("Sub", [cols, rows])  # j - i
    return _Causal(e.node("LessOrEqual", [ahead, offset]), False, how)


def _window_mask(e: Emitter, p: AttentionOpReading, q4: ir.Value, k4: ir.Value) -> ir.Value:
    """ONNX's sliding window as a bool mask: query i at position t = i + offset sees key j where
    t - left <= j <= t + right (each bound where it is >= 0); the offset is the past length, or
    per batch nonpad[b] - Sq, as for the causal frontier in ONNX's rule."""
    sq = e.dim(q4, 2, scalar=True, known=_dim_of(p.q, 2 if p.rank == 4 else 1))
    total = e.dim(k4, 2, scalar=True, known=_total_static(p))
    rows = e.unsqueeze(e.arange(sq), [1])  # [Sq, 1]
    cols = e.unsqueeze(e.arange(total), [0])  # [1, T]
    behind = e.node("Sub", [rows, cols])  # i - j
    if p.past_key is not None:
        behind = e.node("Add", [behind, e.dim(p.past_key, 2, scalar=True, known=_dim_of(p.past_key, 2))])
    elif p.nonpad is not None:
        behind = e.node("Add", [behind, e.unsqueeze(e.node("Sub", [p.nonpad, sq]), [1, 2, 3])])  # [B, 1, Sq, T]
    left, right = p.window
    keep = []
    if left >= 0:
        keep.append(e.node("LessOrEqual", [behind, e.i64(left)]))
    if right >= 0:
        keep.append(e.node("GreaterOrEqual", [behind, e.i64(-right)]))
    return keep[0] if len(keep) == 1 else e.node("And", keep)


def _own_window(p: AttentionOpReading) -> int | None:
    """The is_causal (0, 1 or 2) under which FlashAttention's own window_left / window_right
    compute ONNX's window (and causal frontier) exactly, so that tiles outside the band are
    skipped; None where only a mask does. The op's query position is i (is_causal 0, 1) or
    i + Sk - Sq (2); ONNX's is i + the past length: equal without a past, and, for a causal node,
    where the new keys are as many as the queries."""
    if not p.windowed or p.nonpad is not None:
        return None
    past = 0 if p.past_key is None else _dim_of(p.past_key, 2)
    if past == 0:
        return 1 if p.is_causal else 0
    sq, new = _dim_of(p.q, 2 if p.rank == 4 else 1), _dim_of(p.k, 2 if p.rank == 4 else 1)
    if p.is_causal and sq is not None and sq == new:
        return 2
    return None


def _nonpad_mask(e: Emitter, p: AttentionOpReading, k4: ir.Value) -> ir.Value:
    """keys j < nonpad[b]: [B, 1, 1, T]."""
    assert p.nonpad is not None
    total = e.dim(k4, 2, scalar=True, known=_total_static(p))
    cols = e.unsqueeze(e.arange(total), [0])  # [1, T]
    lengths = e.unsqueeze(p.nonpad, [1])  # [B, 1]
    return e.unsqueeze(e.node("Less", [cols, lengths]), [1, 2])


def _padded_to_keys(e: Emitter, p: AttentionOpReading, mask: ir.Value, fill: np.ndarray) -> ir.Value:
    """attn_mask with its last axis padded with ``fill`` (False, -inf) up to the keys, where both
    lengths are static and the mask is shorter: ONNX's rule for a mask over fewer keys than past +
    new (ONNX Runtime refuses such a mask, so no model it runs has one)."""
    rank, length, total = u.rank(mask), _dim_of(mask, (u.rank(mask) or 1) - 1), _total_static(p)
    if rank is None or length is None or total is None or length >= total:
        return mask
    pads = [0] * (2 * rank)
    pads[-1] = total - length
    return e.node("Pad", [mask, e.i64(pads), e.const(fill)])


def _float_mask_as_bias(e: Emitter, p: AttentionOpReading) -> ir.Value | None:
    """The float attn_mask as FlashAttention's bias. ORT zeroes a row whose mask entries are all
    <= lowest(T); as -inf they make the row all -inf, which masked_rows=zero turns into zeros."""
    if p.mask is None or p.mask_is_bool:
        return None
    bias = e.cast(p.mask, ir.DataType.FLOAT)  # float16 -> float32 is exact
    bias = _padded_to_keys(e, p, bias, np.array(-math.inf, np.float32))
    lowest = np.float32(np.finfo(p.dtype.numpy()).min)
    dead = e.node("LessOrEqual", [bias, e.const(np.array(lowest))])
    return e.node("Where", [dead, e.f32(-math.inf), bias])


def write_attention(e: Emitter, p: AttentionOpReading, policy: SoftmaxPolicy, block_id: str, replaces: str) -> str:
    """Write the node's FlashAttention replacement and reroute its outputs; how causality was written."""
    if p.rank == 3:
        q4, k4, v4 = _heads_first(e, p.q, p.q_heads), _heads_first(e, p.k, p.kv_heads), _heads_first(e, p.v, p.kv_heads)
    else:
        q4, k4, v4 = p.q, p.k, p.v
    if p.past_key is not None and p.past_value is not None:
        k4 = e.node("Concat", [p.past_key, k4], axis=2)
        v4 = e.node("Concat", [p.past_value, v4], axis=2)
    present = {1: k4, 2: v4}

    bias = _float_mask_as_bias(e, p)
    masks = [_padded_to_keys(e, p, p.mask, np.array(False))] if p.mask is not None and p.mask_is_bool else []
    own_window = _own_window(p)
    if own_window is not None:
        how = {0: "", 1: "top-left", 2: "bottom-right: the new keys are as many as the queries"}[own_window]
        causal = _Causal(None, bool(own_window), how)
    else:
        causal = _causal(e, p, q4, k4) if p.is_causal else _Causal(None, False, "")
    if causal.mask is not None:
        masks.append(causal.mask)
    if p.nonpad is not None:
        masks.append(_nonpad_mask(e, p, k4))
    if p.windowed and own_window is None:
        masks.append(_window_mask(e, p, q4, k4))
    mask = None
    for m in masks:
        mask = m if mask is None else e.node("And", [mask, m])

    call = FlashAttentionCall(
        q4,
        k4,
        v4,
        dtype=p.dtype,
        scale=p.scale,
        bias=bias,
        mask=mask,
        is_causal=own_window if own_window is not None else int(causal.top_left),
        mask_fill=-math.inf,
        masked_rows="zero",
        softcap=p.softcap,
        window_left=p.window[0] if own_window is not None else -1,
        window_right=p.window[1] if own_window is not None else -1,
    )
    out = write_call(e, call, policy, block_id, replaces)
    if p.rank == 3:
        out = e.reshape(e.transpose(out, [0, 2, 1, 3]), [0, 0, -1])

    for i, old in p.outputs:
        new = out if i == 0 else present[i]
        if not e.made_here(new):
            new = e.node("Identity", [new])  # replace_output renames new: never rename K or V themselves
        replace_output(e.graph, old, new)
    return causal.how
