"""What the native attention ops need around them: BNSH <-> BSD layouts, repeated K/V heads,
the causal and boolean masks written as one additive bias, and the cast back to Q's type (the
rows that bias masks fully: lowering/masked_rows.py)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from ..graph import ir_utils as u
from ..graph import shapes
from ..graph.emitter import Emitter, replace_output
from ..op.call import FlashAttentionCall

SWAP_SH = [0, 2, 1, 3]  # [B, H, S, D] <-> [B, S, H, D]
F32_LOWEST = float(np.finfo(np.float32).min)
# One step above lowest: the same mask value for softmax, but not ONNX Runtime's sentinel.
_F32_ABOVE_LOWEST = float(np.nextafter(np.float32(F32_LOWEST), np.float32(0)))


@dataclass(frozen=True)
class SeqLengths:
    """Where the lowered graph reads Sq and Sk from: (a tensor it keeps, its sequence axis).

    ``past``: with a KV cache absorbed into the native op, the keys are the cached ones (this
    tensor's axis 2) followed by ``k``'s, so Sk is their sum."""

    q: tuple[ir.Value, int]
    k: tuple[ir.Value, int]
    past: ir.Value | None = None

    def of(self, e: Emitter, which: str, scalar: bool = False) -> ir.Value:
        """Sq ("q") or Sk ("k") as int64, 1-D of one element or a scalar."""
        x, axis = self.q if which == "q" else self.k
        if which == "k" and self.past is not None:
            return e.node("Add", [e.dim(self.past, 2, scalar), e.dim(x, axis, scalar)])
        return e.dim(x, axis, scalar)


def bsd_source(x: ir.Value, heads: int | None) -> ir.Value | None:
    """x [B, H, S, D] as a 3D [B, S, H·D] tensor the graph already has, without a Transpose."""
    t = u.producer(x, "Transpose")
    if t is not None and u.attr_ints(t, "perm") == SWAP_SH:
        return t.inputs[0]  # [B, S, H, D]: reshaped by the caller
    s = u.producer(x, "Unsqueeze")
    if s is not None and heads == 1 and u.unsqueeze_axes(s) == [1]:
        return s.inputs[0]  # [B·H, S, D]: already 3D with one head
    return None


def to_bsd(e: Emitter, x: ir.Value, heads: int | None, reuse_transpose: bool = True) -> ir.Value:
    """[B, H, S, D] -> [B, S, H·D]; reuse_transpose: start from the [B, S, H, D] tensor the graph
    transposed into x, when there is one."""
    src = bsd_source(x, heads) if reuse_transpose else None
    if src is not None and u.producer(x, "Unsqueeze") is not None:
        return src
    bshd = src if src is not None else e.transpose(x, SWAP_SH)
    return e.reshape(bshd, [0, 0, _width(x, heads)])


def _width(x: ir.Value, heads: int | None) -> int:
    """H·D for a reshape to [B, S, H·D]: static where D is, so that a wrong head count fails
    loudly at run time instead of splitting heads differently; -1 otherwise."""
    d = shapes.static(shapes.resolved_dim(x, 3))
    return heads * d if heads is not None and d is not None else -1


def repeat_bsd(e: Emitter, x: ir.Value, heads: int, repeats: int, reuse_transpose: bool) -> ir.Value:
    """[B, Hkv, S, D] -> [B, S, Hkv·repeats·D], query head h reading kv head h // repeats."""
    t = u.producer(x, "Transpose") if reuse_transpose else None
    if t is not None and u.attr_ints(t, "perm") == SWAP_SH:
        bshd = u.operand(t, 0)
    else:
        bshd = e.transpose(x, SWAP_SH)
    wide = e.node("Expand", [e.unsqueeze(bshd, [3]), e.i64([1, 1, 1, repeats, 1])])
    return e.reshape(wide, [0, 0, _width(x, heads * repeats)])


def repeat_kv_bsd(
    e: Emitter, k: ir.Value, v: ir.Value, hq: int, hkv: int, reuse_transpose: bool, parts: list[str]
) -> tuple[ir.Value, ir.Value]:
    """K and V [B, Hkv, S, D] as [B, S, Hq·D], each key/value head repeated for its hq // hkv query
    heads (for MultiHeadAttention, which has one head count); the note's words go to parts."""
    r = hq // hkv
    k3, v3 = repeat_bsd(e, k, hkv, r, reuse_transpose), repeat_bsd(e, v, hkv, r, reuse_transpose)
    parts.append(f"key/value heads repeated {r}x")
    return k3, v3


@dataclass(frozen=True)
class BsdOperands:
    """A block's query, key and value as [B, S, H·D], the form every native op here takes, built
    once per block: the head counts they stand for, whether they started from the graph's own
    Transposes (``reuse``), and where the lowered graph reads Sq and Sk."""

    q: ir.Value
    k: ir.Value
    v: ir.Value
    hq: int
    hkv: int  # the block's key/value heads (k and v hold hq of them where one_head_count repeated them)
    reuse: bool
    lengths: SeqLengths


def bsd_operands(
    e: Emitter,
    qkv: tuple[ir.Value, ir.Value, ir.Value],
    heads: tuple[int, int],
    reuse: bool,
    parts: list[str],
    one_head_count: bool = False,
) -> BsdOperands:
    """Q, K and V [B, H, S, D] as [B, S, H·D]; one_head_count: key/value heads repeated to the query
    heads (for MultiHeadAttention, which has one head count; the note's words go to parts)."""
    q, k, v = qkv
    hq, hkv = heads
    q3 = to_bsd(e, q, hq, reuse)
    if one_head_count and hkv != hq:
        k3, v3 = repeat_kv_bsd(e, k, v, hq, hkv, reuse, parts)
    else:
        k3, v3 = to_bsd(e, k, hkv, reuse), to_bsd(e, v, hkv, reuse)
    return BsdOperands(q3, k3, v3, hq, hkv, reuse, SeqLengths(q=(q3, 1), k=(k3, 1)))


def replace_bsd_output(e: Emitter, out3: ir.Value, heads: int, old: ir.Value, reuse_transpose: bool) -> None:
    """Make out3 [B, S, H·Dv] stand for old [B, H, S, Dv], taking the place of the Transpose or
    Squeeze that reads old when it is old's only reader."""
    uses = list(old.uses())
    reader = uses[0].node if reuse_transpose and len(uses) == 1 and not old.is_graph_output() else None
    if reader is not None and reader.domain in ("", "ai.onnx"):
        new = None
        if reader.op_type == "Transpose" and u.attr_ints(reader, "perm") == SWAP_SH:
            new = e.reshape(out3, [0, 0, heads, -1])
        elif reader.op_type == "Squeeze" and heads == 1 and u.unsqueeze_axes(reader) == [1]:
            new = out3
        if new is not None:
            replace_output(e.graph, reader.outputs[0], new)
            e.graph.remove(reader, safe=True)
            return
    bshd = e.reshape(out3, [0, 0, heads, -1])
    replace_output(e.graph, old, e.transpose(bshd, SWAP_SH))


def _causal_keep(e: Emitter, lengths: SeqLengths, call: FlashAttentionCall) -> ir.Value:
    """bool [Sq, Sk]: key j visible from query i iff j <= p (is_causal 1: p = i, top-left; 2:
    p = i + Sk - Sq, bottom-right: the queries follow Sk - Sq cached keys), and within the window
    p - window_left <= j <= p + window_right where one is set (spec.key_bounds)."""
    sq, sk = lengths.of(e, "q", scalar=True), lengths.of(e, "k", scalar=True)
    rows = e.arange(sq)
    if call.is_causal == 2:
        rows = e.node("Add", [rows, e.node("Sub", [sk, sq])])
    cols, rows = e.unsqueeze(e.arange(sk), [0]), e.unsqueeze(rows, [1])
    bounds = [e.node("LessOrEqual", [cols, rows])] if call.is_causal else []
    if call.window_left >= 0:
        bounds.append(e.node("GreaterOrEqual", [cols, e.node("Sub", [rows, e.i64(call.window_left)])]))
    if call.window_right >= 0:
        bounds.append(e.node("LessOrEqual", [cols, e.node("Add", [rows, e.i64(call.window_right)])]))
    keep = bounds[0]
    for bound in bounds[1:]:
        keep = e.node("And", [keep, bound])
    return keep


def additive_bias(
    e: Emitter, call: FlashAttentionCall, lengths: SeqLengths, fold_causal: bool, avoid_lowest: bool
) -> ir.Value | None:
    """float32 [B|1, H|1, Sq, Sk] to add to scale·QKᵀ: bias where kept, mask_fill where masked out
    (``bias_after_mask``: bias + mask_fill there, read_call proved that the sum absorbs the score).

    avoid_lowest: no element may be float32-lowest (ONNX Runtime's Attention takes a row whose
    maximum is lowest for fully masked); lowest becomes the next float up, the same for softmax."""
    bias = bias_before_expand(e, call, lengths, fold_causal, avoid_lowest)
    return None if bias is None else expand_to_scores(e, bias, lengths)


def expand_to_scores(e: Emitter, bias: ir.Value, lengths: SeqLengths) -> ir.Value:
    """bias broadcast to [.., Sq, Sk], the shape the native ops' attention_bias must have."""
    sizes = e.node("Concat", [e.i64([1, 1]), lengths.of(e, "q"), lengths.of(e, "k")], axis=0)
    return e.node("Expand", [bias, sizes])


def bias_before_expand(
    e: Emitter, call: FlashAttentionCall, lengths: SeqLengths, fold_causal: bool, avoid_lowest: bool
) -> ir.Value | None:
    """additive_bias's values before their Expand to [.., Sq, Sk] (broadcastable to it)."""
    fill = call.mask_fill
    keep = call.mask
    if fold_causal and (call.is_causal or call.window_left >= 0 or call.window_right >= 0):
        causal = _causal_keep(e, lengths, call)
        keep = causal if keep is None else e.node("And", [keep, causal])
    bias = None if call.bias is None else e.cast(call.bias, ir.DataType.FLOAT)
    after_mask = call.bias_after_mask and bias is not None and keep is not None
    if after_mask:
        # FlashAttention: masked scores become fill + bias; added to s, the sum absorbs s
        assert bias is not None and keep is not None
        bias = e.node("Add", [bias, e.node("Where", [keep, e.f32(0.0), e.f32(fill)])])
        keep = None
    if avoid_lowest and bias is not None:
        lowest = e.f32(F32_LOWEST)
        bias = e.node("Where", [e.node("Equal", [bias, lowest]), e.f32(_F32_ABOVE_LOWEST), bias])
    if avoid_lowest and fill == F32_LOWEST:
        fill = _F32_ABOVE_LOWEST
    if keep is not None:
        bias = e.node("Where", [keep, bias if bias is not None else e.f32(0.0), e.f32(fill)])
    return bias


def cast_back(e: Emitter, out: ir.Value, call: FlashAttentionCall) -> tuple[ir.Value, str]:
    """out (float32) back to Q's element type: Cast where it is known, CastLike(Q) where not."""
    if call.dtype is None:
        return e.node(
            "CastLike", [out, call.q]
        ), "computed in float32 between Cast and CastLike (Q's type not inferred)"
    return e.cast(out, call.dtype), f"computed in float32 between casts (Q is {call.dtype.name.lower()})"


def mask_parts(call: FlashAttentionCall, causal_folded: bool) -> list[str]:
    """The note's words for the call's bias, mask and causality."""
    fill = "-inf" if call.mask_fill == -math.inf else f"{call.mask_fill:g}"
    parts = []
    if call.bias is not None:
        parts.append(
            "bias added after the mask fills (fill + bias absorbs the score)" if call.bias_after_mask else "bias"
        )
    if call.mask is not None:
        parts.append(f"bool mask as Where(mask, ., {fill})")
    if call.is_causal:
        aligned = "bottom-right" if call.is_causal == 2 else "top-left"
        parts.append(f"causal ({aligned}) in the bias (fill {fill})" if causal_folded else f"causal ({aligned})")
    window = [f"{side} {n}" for side, n in (("left", call.window_left), ("right", call.window_right)) if n >= 0]
    if window:
        where = " in the bias" if causal_folded else ""
        parts.append(f"window ({', '.join(window)}){where}")
    return parts


def sees_a_key_by_position(call: FlashAttentionCall, sq: object, sk: object) -> bool:
    """Whether every query row keeps a key by its causal and window bounds alone (no mask tensor):
    Sq == Sk proved, so query i keeps key i (j <= i + 0 for either alignment, and i lies inside
    any window around position i); with no bounds at all, every key."""
    if call.mask is not None:
        return False
    bounded = call.is_causal != 0 or call.window_left >= 0 or call.window_right >= 0
    return not bounded or shapes.same_dim(sq, sk)  # type: ignore[arg-type]


def structural_key(x: ir.Value, depth: int = 8) -> str | None:
    """A string equal for two values that the graph provably computes alike: the same graph input
    or initializer, the same constant, or the same deterministic op with the same attributes over
    inputs with equal keys (what the fusion writes per block over one mask, a Cast of it, say);
    None past ``depth`` nodes or for values without a name."""
    found = u.const_array(x)
    if found is not None and found.size <= 64:
        return f"const:{found.dtype.str}:{list(found.shape)}:{found.tobytes().hex()}"
    node = x.producer()
    if node is None or depth == 0 or node.op_type.startswith("Random") or node.op_type == "Multinomial":
        return f"value:{x.name}" if x.name and node is None else None
    parts = []
    for v in node.inputs:
        key = "-" if v is None else structural_key(v, depth - 1)
        if key is None:
            return None
        parts.append(key)
    attrs = ",".join(
        f"{k}={a.value!r}" for k, a in sorted(node.attributes.items()) if not isinstance(a.value, ir.Graph)
    )
    if any(isinstance(a.value, ir.Graph) for a in node.attributes.values()):
        return None
    index = next(i for i, o in enumerate(node.outputs) if o is x)
    return f"{node.domain}:{node.op_type}({attrs})[{';'.join(parts)}]#{index}"


def shared(e: Emitter, key: str, build: Callable[[], ir.Value]) -> ir.Value:
    """The value build() writes, written once per graph for blocks that compute the same thing: a
    node named after key written before this block's anchor is reused (an earlier block wrote
    it, from the same inputs); otherwise build() writes it here and its node takes that name."""
    name = "ortflash_shared/" + hashlib.sha1(key.encode()).hexdigest()[:16]
    for node in e.graph:
        if node is e.anchor:
            break
        if node.name == name:
            return node.outputs[0]
    value = build()
    producer = value.producer()
    if producer is not None and e.made_here(value):
        producer.name = name
    return value
