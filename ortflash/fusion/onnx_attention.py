"""The standard ONNX ``Attention`` op (opsets 23, 24) → FlashAttention, as ONNX Runtime runs it.

What ONNX Runtime 1.31 (CPU) computes for one Attention node, measured on it and
reproduced here exactly (see tests/test_onnx_attention.py):

* 3D inputs ``[B, S, H·D]`` are split into heads with ``q_num_heads`` / ``kv_num_heads``;
  4D inputs are ``[B, H, S, D]``. Query head ``h`` reads kv head ``h // (Hq / Hkv)``.
* ``scale`` defaults to ``float(1 / sqrt(head_size))``; it multiplies ``Q @ Kᵀ``.
* ``softcap`` (when > 0) caps the scaled scores *before* the mask is added, which is
  FlashAttention's own order.
* ``past_key`` / ``past_value`` are concatenated before K / V on the sequence axis;
  ``present_key`` / ``present_value`` are those concatenations (K / V themselves, in the
  4D layout, without a past).
* ``is_causal``: query ``i`` sees key ``j <= i + P`` with ``P`` the past length (top-left
  aligned without a past, whatever Sq and Sk are), except that ORT drops the causal mask
  altogether for a single query with a non-empty past (``Sq == 1 and P > 0``). With
  ``nonpad_kv_seqlen`` (no past allowed with it) the frontier is per batch and
  bottom-right: ``j <= i + nonpad[b] - Sq``.
* ``nonpad_kv_seqlen`` masks keys ``j >= nonpad[b]``.
* ``attn_mask``: bool (False = masked) or float (added to the scores).
* Fully masked rows give zeros. ORT masks with ``lowest(T)`` and zeroes a query row when
  every key of it is masked, which counts a float mask value ``<= lowest(T)``
  (``-inf`` or ``finfo(T).min``) as masked; a row of larger values, however negative
  (say ``-1e30``), is an ordinary softmax (uniform, as the scores vanish in it).

In FlashAttention terms: the float mask is the bias, with its ``<= lowest`` entries made
``-inf``; bool mask, causal frontier (unless it is top-left: then ``is_causal``) and
``nonpad_kv_seqlen`` are one boolean mask; ``mask_fill = -inf`` and ``masked_rows = zero``
turn exactly the rows ORT zeroes into zeros. The one divergence: ORT adds ``lowest`` to a
masked score where this writes ``-inf``, which differs only for scores of magnitude
≥ 1e31 (float32) or for float16 mask values within a score of -65504.

Three of ONNX's rules ONNX Runtime 1.31 refuses to run, so no model it runs has them, are
written as ONNX's reference computes them: Attention-25's ``left_window_size`` /
``right_window_size`` (query i at position t = i + offset, the offset as for the causal frontier,
sees keys t - left <= j <= t + right) as one more bool mask, with ONNX's causal rule (no
exception for a single query); a rank-1 ``attn_mask`` (one row for every query); and a mask over
fewer keys than past + new, padded with False / -inf where both lengths are static.

Over 400 lines because it is one front end: reading the node (every attribute and input ORT
reads, each with its refusal) and writing it (heads, past, causal frontier, window, masks), which
share the reading and make sense only together.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from ..errors import NotFused
from ..graph import ir_utils as u
from ..graph import shapes
from ..graph.emitter import Emitter, replace_output
from ..op.call import FlashAttentionCall
from ..op.node import write_call
from ..op.policy import SoftmaxPolicy
from .driver import Written, dtype_name

FIRST_OPSET = 23  # Attention entered the default domain here
# Attention-25's window attributes (ONNX Runtime 1.31 does not run them): written as a mask
_WINDOW_ATTRS = ("left_window_size", "right_window_size")

_INPUT_NAMES = ("Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen")


@dataclass(frozen=True)
class AttentionOpReading:
    """What one Attention node asks for, read and proved before anything is emitted."""

    q: ir.Value
    k: ir.Value
    v: ir.Value
    dtype: ir.DataType
    rank: int
    q_heads: int | None
    kv_heads: int | None
    head_dim: int | None
    scale: float
    softcap: float = 0.0
    is_causal: bool = False
    mask: ir.Value | None = None
    mask_is_bool: bool = False
    past_key: ir.Value | None = None
    past_value: ir.Value | None = None
    nonpad: ir.Value | None = None
    outputs: tuple[tuple[int, ir.Value], ...] = ()  # (0|1|2, the Attention output to reroute)
    notes: str = ""
    # (left_window_size, right_window_size) of opset 25, -1 unbounded: ONNX's rule, which ONNX Runtime
    # 1.31 does not run (its models keep ONNX's own causal rule: no exception for a single query)
    window: tuple[int, int] = (-1, -1)

    @property
    def windowed(self) -> bool:
        return self.window != (-1, -1)

    def summary(self, causal: str) -> str:
        """The report's mask column; causal says how the causal rule was written."""
        parts = []
        if self.mask is not None:
            kind = "bool" if self.mask_is_bool else "float"
            parts.append(f"{kind} attn_mask {u.value_shape(self.mask) or '?'}")
        if self.is_causal:
            parts.append(f"causal ({causal})" if causal else "causal")
        if self.nonpad is not None:
            parts.append("nonpad_kv_seqlen")
        if self.past_key is not None:
            parts.append("past_key/value")
        if self.softcap:
            parts.append(f"softcap {self.softcap:g}")
        if self.windowed:
            parts.append(f"window (left {self.window[0]}, right {self.window[1]})")
        return ", ".join(parts) or "none"

    def pattern(self) -> str:
        """The report's pattern column."""
        gqa = ""
        if self.q_heads and self.kv_heads and self.q_heads != self.kv_heads:
            gqa = f", GQA {self.q_heads}/{self.kv_heads}"
        return f"Attention({self.rank}D{gqa})"


def _present(value: ir.Value | None) -> bool:
    return value is not None and bool(value.name)


def _used(value: ir.Value | None) -> bool:
    return value is not None and _present(value) and (bool(list(value.consumers())) or value.is_graph_output())


def _attr(node: ir.Node, name: str) -> Any:
    a = node.attributes.get(name)
    return None if a is None else a.value


def _read(node: ir.Node, opset: int) -> AttentionOpReading:
    """Prove node can be rewritten; raise NotFused with the reason otherwise."""
    if opset < FIRST_OPSET:
        raise NotFused(f"the model's opset {opset} has no standard Attention op (it came in opset 23)")
    inputs = list(node.inputs) + [None] * (len(_INPUT_NAMES) - len(node.inputs))
    if len(node.inputs) > len(_INPUT_NAMES):
        raise NotFused(f"{u.label(node)} has {len(node.inputs)} inputs, more than opset 24 defines")
    q, k, v, mask, past_key, past_value, nonpad = inputs
    if q is None or k is None or v is None:
        raise NotFused("Q, K or V is missing")
    outputs = list(node.outputs)
    if len(outputs) > 3 and _used(outputs[3]):
        mode = _attr(node, "qk_matmul_output_mode") or 0
        raise NotFused(
            f"it asks for qk_matmul_output (mode {mode}: the score/probability matrix), which the fused op never "
            "materialises"
        )
    left, right = (int(_attr(node, name) if _attr(node, name) is not None else -1) for name in _WINDOW_ATTRS)
    window = (left, right)
    if any(w < -1 for w in window):
        raise NotFused(f"left_window_size={window[0]}, right_window_size={window[1]}: a bound below -1")

    dtype = q.dtype
    if dtype not in u.FLOAT_TYPES:
        raise NotFused(f"Q is {dtype.name if dtype else 'of unknown type'}, not float32 or float16")
    if k.dtype != dtype or v.dtype != dtype:
        raise NotFused("Q, K and V do not share one float type")

    rank = u.rank(q)
    if rank not in (3, 4):
        raise NotFused("the rank of Q is unknown or not 3 or 4")
    for x, name in ((k, "K"), (v, "V")):
        r = u.rank(x)
        if r is not None and r != rank:
            raise NotFused(f"{name} has rank {r}, Q rank {rank}")

    q_shape = u.value_shape(q) or [None] * rank
    k_shape = u.value_shape(k) or [None] * rank
    q_heads_attr, kv_heads_attr = _attr(node, "q_num_heads"), _attr(node, "kv_num_heads")
    q_heads: int | None
    kv_heads: int | None
    if rank == 3:
        if not q_heads_attr or not kv_heads_attr:
            raise NotFused("3D inputs without q_num_heads and kv_num_heads (ONNX Runtime refuses them too)")
        q_heads, kv_heads = int(q_heads_attr), int(kv_heads_attr)
        hidden = shapes.static(q_shape[2])
        head_dim = hidden // q_heads if hidden is not None and hidden % q_heads == 0 else None
    else:
        q_heads, kv_heads = shapes.static(q_shape[1]), shapes.static(k_shape[1])
        head_dim = shapes.static(q_shape[3])
    if q_heads and kv_heads and q_heads % kv_heads:
        raise NotFused(f"{q_heads} query heads are not a multiple of {kv_heads} kv heads")

    scale = _attr(node, "scale")
    if scale is None:
        if head_dim is None:
            raise NotFused(
                "no scale attribute and the head size is not static, so the default 1/sqrt(head_size) is unknown"
            )
        scale = float(np.float32(1.0 / math.sqrt(head_dim)))  # ORT: static_cast<float>(1.0 / sqrt(h))
    scale = float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise NotFused(f"scale={scale}: ONNX Runtime accepts only a positive scale")

    softcap = float(_attr(node, "softcap") or 0.0)
    if not math.isfinite(softcap):
        raise NotFused(f"softcap={softcap} is not finite")
    softcap = max(softcap, 0.0)  # ORT: a softcap <= 0 is no softcap

    if mask is not None:
        if mask.dtype not in (ir.DataType.BOOL, dtype):
            raise NotFused(
                f"attn_mask is {mask.dtype.name if mask.dtype else 'of unknown type'}: a bool mask and a float "
                "(additive) mask mean different things, so its type must be known"
            )
        mask_rank = u.rank(mask)
        # broadcast to [B, H, Sq, T] aligned right, as ONNX defines it (rank 1: one row for every query)
        if mask_rank is not None and not 1 <= mask_rank <= 4:
            raise NotFused(f"attn_mask has rank {mask_rank}, not 1 to 4")

    if (past_key is None) != (past_value is None):
        raise NotFused("only one of past_key and past_value is given")
    if past_key is not None and past_value is not None:
        if past_key.dtype != dtype or past_value.dtype != dtype:
            raise NotFused("past_key / past_value do not have Q's type")
        for x in (past_key, past_value):
            r = u.rank(x)
            if r is not None and r != 4:
                raise NotFused(f"{u.label(x)} has rank {r}, not 4")

    if nonpad is not None:
        if opset < 24:
            raise NotFused("nonpad_kv_seqlen needs opset 24")
        if nonpad.dtype is not None and nonpad.dtype != ir.DataType.INT64:
            raise NotFused("nonpad_kv_seqlen is not int64")
        if past_key is not None:
            raise NotFused("nonpad_kv_seqlen together with past_key (ONNX Runtime refuses it)")

    used = tuple((i, outputs[i]) for i in range(min(3, len(outputs))) if _used(outputs[i]))
    dropped = len(outputs) > 3 and _present(outputs[3])
    return AttentionOpReading(
        q,
        k,
        v,
        dtype,
        rank,
        q_heads,
        kv_heads,
        head_dim,
        scale,
        softcap=softcap,
        is_causal=bool(_attr(node, "is_causal") or 0),
        mask=mask,
        mask_is_bool=mask is not None and mask.dtype == ir.DataType.BOOL,
        past_key=past_key,
        past_value=past_value,
        nonpad=nonpad,
        outputs=used,
        notes="qk_matmul_output is declared but read by nothing; dropped" if dropped else "",
        window=window,
    )


# ------------------------------------------------------------------ emission


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
    assert heads is not None  # _read requires the head counts of 3D inputs
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


def _emit(e: Emitter, p: AttentionOpReading, policy: SoftmaxPolicy, block_id: str, replaces: str) -> str:
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
        q=q4,
        k=k4,
        v=v4,
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


@dataclass(frozen=True)
class AttentionOpFrontEnd:
    """The standard ONNX Attention nodes (fusion/driver.FrontEnd). New nodes go before each
    Attention node and its outputs are rerouted to them."""

    label: str = "Attention"
    prefix: str = "onnx_attention"

    def candidates(self, graph: ir.Graph) -> list[ir.Node]:
        return [n for n in graph if n.op_type == "Attention" and n.domain in ("", "ai.onnx")]

    def read(self, node: ir.Node, opset: int) -> AttentionOpReading:
        return _read(node, opset)

    def unread_columns(self) -> Mapping[str, object]:
        return {"pattern": "Attention"}

    def columns(self, reading: AttentionOpReading) -> Mapping[str, object]:
        return {"pattern": "Attention", "head_dim": reading.head_dim, "dtype": dtype_name(reading.dtype)}

    def anchor(self, reading: AttentionOpReading, node: ir.Node) -> ir.Node:
        return node

    def heads_per_batch_head(self, reading: AttentionOpReading) -> bool:
        return False

    def write(self, e: Emitter, reading: AttentionOpReading, policy: SoftmaxPolicy, block_id: str) -> Written:
        causal = _emit(e, reading, policy, block_id=block_id, replaces=e.anchor.outputs[0].name or "")
        columns = {
            "pattern": reading.pattern(),
            "heads": reading.q_heads,
            "kv_heads": reading.kv_heads,
            "head_dim": reading.head_dim,
            "scale": reading.scale,
            "mask": reading.summary(causal),
            "dtype": dtype_name(reading.dtype),
        }
        return Written(reading.notes, columns)
