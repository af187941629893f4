"""Read a FlashAttention node back into its FlashAttentionCall (op/node.read_node) with what the
native ops refuse and the dims they need proved, and give the native ops one batch size."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import onnx_ir as ir

from ..errors import NotLowered
from ..graph import bounds, shapes
from ..graph import ir_utils as u
from ..graph.emitter import Emitter
from ..op.call import FlashAttentionCall
from ..op.node import NodeOutsideContract, read_node
from ..op.spec import ABSORBING_FILL


def read_call(node: ir.Node) -> FlashAttentionCall:
    """The call a FlashAttention node makes (op/node.read_node); raises NotLowered where it is
    outside the op's contract or no native op can take it."""
    try:
        call = read_node(node)
    except NodeOutsideContract as exc:
        raise NotLowered(str(exc)) from None
    dtype = call.dtype
    if dtype is not None and dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
        raise NotLowered(f"Q's element type is {dtype}, not float32 or float16")
    for label, x in (("Q", call.q), ("K", call.k), ("V", call.v)):
        r = u.rank(x)
        if r is not None and r != 4:
            raise NotLowered(f"{label} has rank {r}, not 4")
    if call.bias is not None and (bias_rank := u.rank(call.bias)) is not None and bias_rank > 4:
        raise NotLowered(f"bias has rank {bias_rank}, more than 4")
    if call.mask is not None and call.mask.dtype is not None and call.mask.dtype != ir.DataType.BOOL:
        raise NotLowered(f"mask's element type is {call.mask.dtype}, not bool")
    if call.scale < 0:
        raise NotLowered(f"scale {call.scale:g} is negative: native attention ops take a positive scale")
    fill = call.mask_fill
    if call.masked and math.isfinite(fill) and fill > ABSORBING_FILL:
        raise NotLowered(
            f"mask_fill {fill:g} is finite: native ops add the fill to the score (s + fill) where "
            f"FlashAttention replaces the score by it, so rows with every key masked differ "
            f"(exact only for -inf or fills <= -2**127 such as float32-lowest)"
        )
    if call.bias_after_mask and (call.masked or call.is_causal):
        _prove_fill_absorbs_bias(call)
    return call


def _prove_fill_absorbs_bias(call: FlashAttentionCall) -> None:
    """bias_after_mask: FlashAttention gives a masked score fill + bias, a native op s + (fill + bias).
    The two agree where fill + bias absorbs s: fill -inf (the sum is -inf, or NaN in both where the
    bias is +inf or NaN), or fill + bias <= -2**127 for every bias value, which needs the bias
    bounded above (graph/bounds)."""
    fill = call.mask_fill
    if fill == -math.inf:
        return
    found = bounds.value_bounds(call.bias)
    if found is None or not fill + found[1] <= ABSORBING_FILL:
        bound = "no bound" if found is None else f"an upper bound of {found[1]:g}"
        raise NotLowered(
            f"bias_after_mask with mask_fill {fill:g}: native ops add the score to fill + bias, exact only "
            f"where fill + bias <= -2**127 absorbs it, and the graph gives the bias {bound}"
        )


@dataclass(frozen=True)
class CallDims:
    """The dims of a call's Q [B, Hq, Sq, D], K [B, Hkv, Sk, Dk] and V [B, _, Sv, Dv], as far as the
    graph proves them (shapes.Dim terms; heads only when static)."""

    hq: int | None
    hkv: int | None
    sq: shapes.Dim
    sk: shapes.Dim
    sv: shapes.Dim
    d: shapes.Dim
    dk: shapes.Dim
    dv: shapes.Dim


def call_dims(call: FlashAttentionCall) -> CallDims:
    dims = shapes.Bindings()
    for x, pattern in ((call.q, "_ Hq Sq D"), (call.k, "_ Hkv Sk Dk"), (call.v, "_ _ Sv Dv")):
        # Resolved per axis: the graph may fix a dim of an operand whose rank inference left open.
        shapes.check_shape(dims, [shapes.resolved_dim(x, i) for i in range(4)], pattern)
    return CallDims(
        hq=shapes.static(dims["Hq"]),
        hkv=shapes.static(dims["Hkv"]),
        sq=dims["Sq"],
        sk=dims["Sk"],
        sv=dims["Sv"],
        d=dims["D"],
        dk=dims["Dk"],
        dv=dims["Dv"],
    )


def aligned_batch(e: Emitter, call: FlashAttentionCall, dims: CallDims) -> tuple[FlashAttentionCall, str | None]:
    """call with Q, K, V (and a 4D bias or mask) given one batch size, as the native ops require.

    MatMul broadcasts: V [1, H, S, D] against Q and K [2, H, S, D] is a valid graph, and so is
    FlashAttention (its kernels broadcast), but MultiHeadAttention, GroupQueryAttention and
    Attention reject operands whose dim 0 differ. Where the graph does not prove one batch
    size (``shapes.may_broadcast``), each operand is Expanded to the largest dim 0 (Max over them,
    the broadcast size of a valid graph). Also proved here: K and V have one head count, and the bias and mask
    broadcast over heads as [1 | Hq]. Raises NotLowered where that cannot be proved."""
    kv_heads = [shapes.batch_and_heads(call.k), shapes.batch_and_heads(call.v)]
    assert kv_heads[0] is not None and kv_heads[1] is not None  # read_call proved rank 4
    hk, hv = kv_heads[0][1], kv_heads[1][1]
    # Unproved but symbolic counts pass: FlashAttention reads one count for both as well.
    if not shapes.same_dim(hk, hv) and (isinstance(hk, int) and isinstance(hv, int) or 1 in (hk, hv)):
        raise NotLowered(f"K has {_words(hk)} heads and V {_words(hv)}: the native ops read one key/value head count")
    for label, x in (("bias", call.bias), ("mask", call.mask)):
        found = shapes.batch_and_heads(x)
        if found is None:
            raise NotLowered(f"the rank of the {label} is unknown, so its batch and head dims cannot be proved")
        # In a valid graph the bias's head dim is 1 or the scores' (Hq), unless it broadcasts
        # a single query head up: that, or a static mismatch, the native ops cannot take.
        heads, q_heads = found[1], shapes.resolved_dim(call.q, 1)
        mismatch = isinstance(heads, int) and heads != 1 and isinstance(q_heads, int) and heads != q_heads
        if mismatch or (q_heads == 1 and heads != 1):
            raise NotLowered(
                f"the {label}'s head dim ({_words(found[1])}) is neither 1 nor Q's head count ({_words(dims.hq)})"
            )
    qkv = [call.q, call.k, call.v]
    extra = [x for x in (call.bias, call.mask) if x is not None]
    b = [shapes.batch_and_heads(x) for x in qkv + extra]
    dims0 = [bh[0] if bh is not None else None for bh in b]
    # A bias or mask may keep dim 0 of 1 (the native ops broadcast it); Q, K and V may not.
    wide_extra = [x for x, d in zip(extra, dims0[3:]) if d != 1]
    pairs = [(a, c) for i, a in enumerate(dims0[:3]) for c in dims0[i + 1 : 3]]
    pairs += [(a, d) for a in dims0[:3] for d in dims0[3:] if d != 1]
    if not any(shapes.may_broadcast(a, c) for a, c in pairs):
        return call, None
    operands = qkv + wide_extra
    batch = e.largest_batch(operands)

    def expanded(x: ir.Value) -> ir.Value:
        return e.expand_batch(x, batch, u.rank(x) or 4) if any(x is o for o in operands) else x

    aligned = dataclasses.replace(
        call,
        q=expanded(call.q),
        k=expanded(call.k),
        v=expanded(call.v),
        bias=None if call.bias is None else expanded(call.bias),
        mask=None if call.mask is None else expanded(call.mask),
    )
    return aligned, "batch sizes " + "/".join(_words(d) for d in dims0) + " broadcast by Expand"


def _words(d: shapes.Dim) -> str:
    return "?" if d is None else str(d) if isinstance(d, (int, str)) else "an unnamed number of"
