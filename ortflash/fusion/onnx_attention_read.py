"""Reading one standard ONNX ``Attention`` node (fusion/onnx_attention's front end) into an
AttentionOpReading: every attribute and input ONNX Runtime reads, each with its refusal
(``NotFused`` naming it), and the report's mask and pattern columns; nothing written
(onnx_attention_write writes the reading)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from ..errors import NotFused
from ..graph import ir_utils as u
from ..graph import shapes

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


def read_attention(node: ir.Node, opset: int) -> AttentionOpReading:
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
