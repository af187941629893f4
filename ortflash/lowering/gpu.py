"""One writer for the GPU targets: what every GPU EP's lowering does alike, with what differs per
EP in its GpuProfile (lowering/cuda.py's CUDA_PROFILE, lowering/webgpu.py's WEBGPU_PROFILE).

``lower_gpu`` refuses what the EP's forms cannot express (the profile's refusals), reads the dims
and head counts, takes the profile's shortcut for a cached step where it has one, chooses the form
(the profile's choice, read from its measured capability table), computes in float16 where the
profile runs float16 blocks natively (else in float32 between casts), builds Q, K and V [B, S, H·D]
once (layout.bsd_operands), writes the form, casts the output back and reroutes it. A third EP is a
capability table and a profile (CONTRIBUTING.md, "Add a lowering")."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import onnx_ir as ir

from ..errors import NotLowered
from ..graph import ir_utils as u
from ..graph.emitter import Emitter
from ..op.call import FlashAttentionCall
from . import layout, native
from .measured import CapabilityTable
from .read import CallDims, aligned_batch, call_dims


@dataclass(frozen=True)
class GpuBlock:
    """What a form's writer reads: the call (given one batch size), its dims, its operands
    [B, S, H·D], whether they are float16 (the EP's native float16 kernels), and the report's
    notes so far, which the writer extends."""

    form: str  # the profile's name of the form chosen
    call: FlashAttentionCall
    dims: CallDims
    ops: layout.BsdOperands
    half: bool
    parts: list[str]


# Writes the form's node(s) after the anchor: out [B, Sq, Hq·Dv] in the operands' element type.
FormWriter = Callable[[Emitter, GpuBlock], ir.Value]


@dataclass(frozen=True)
class GpuForm:
    op: str  # the op it writes (the report's lowered_to)
    write: FormWriter
    one_head_count: bool  # its op has one head count (MultiHeadAttention): key/value heads repeated


@dataclass(frozen=True)
class Refusal:
    """A block the EP's forms cannot express, and why (the NotLowered reason on its report row)."""

    applies: Callable[[FlashAttentionCall], bool]
    why: str


# (call, dims, float16, the model's opset) -> (form, why), form None where no form is right on the GPU
FormChoice = Callable[[FlashAttentionCall, CallDims, bool, int], tuple[str | None, str]]
# (e, call, output, (hq, hkv)) -> (op, how) where the EP writes this block another way, else None
Shortcut = Callable[[Emitter, FlashAttentionCall, ir.Value, tuple[int, int]], tuple[str, str] | None]


@dataclass(frozen=True)
class GpuProfile:
    """One GPU EP's choices: its measured capability table and what it reads from it."""

    ep: str  # the EP's name in the reasons ("the CUDA capability table")
    capabilities: CapabilityTable
    refusals: tuple[Refusal, ...]
    choose: FormChoice
    forms: Mapping[str, GpuForm]  # the choice's form names -> their writers
    # float16 blocks computed in float16 (the EP's fast kernels take float16 only), the casts around
    # the fused node left out; False: every block in float32 between casts
    native_float16: bool
    cached_step: Shortcut | None = None

    def lower(self, e: Emitter, call: FlashAttentionCall, output: ir.Value) -> tuple[str, str]:
        """The target's writer (lowering/targets.py): this EP's form of call, output rerouted to it."""
        return lower_gpu(e, call, output, self)


def lower_gpu(e: Emitter, call: FlashAttentionCall, output: ir.Value, profile: GpuProfile) -> tuple[str, str]:
    """Write the profile's form of call and reroute output to it: (op, how)."""
    native.require_contrib_opset(e)
    dims, heads, halves, half = _read(call, profile)
    native.require_castlike_for_unknown_dtype(e, call)
    if profile.cached_step is not None and (written := profile.cached_step(e, call, output, heads)) is not None:
        return written
    name, why = profile.choose(call, dims, half, e.opset)
    if name is None:
        raise NotLowered(f"no form in the {profile.ep} capability table is right on the GPU for this block")
    form = profile.forms[name]

    call, broadcast = aligned_batch(e, call, dims)
    hq, hkv = heads
    parts = [f"{hq} query / {hkv} key-value heads"] + ([broadcast] if broadcast else [])
    if half:  # native float16: no casts, so the surrounding Transposes are the inputs
        q, k, v = (x if h is None else h for x, h in zip((call.q, call.k, call.v), halves))
        reuse = True
        parts.append("computed in float16 (the EP's fast kernels are float16 ones; checked at a float16 tolerance)")
    else:  # float32, float16 between casts, or not known
        q, k, v = (e.cast(x, ir.DataType.FLOAT) for x in (call.q, call.k, call.v))
        reuse = call.dtype == ir.DataType.FLOAT  # with casts around, the surrounding Transposes are not the inputs
    ops = layout.bsd_operands(e, (q, k, v), heads, reuse, parts, one_head_count=form.one_head_count)
    out = form.write(e, GpuBlock(name, call, dims, ops, half, parts))
    if not half and call.dtype != ir.DataType.FLOAT:
        out, note = layout.cast_back(e, out, call)
        parts.append(note)
    if half and call.dtype == ir.DataType.FLOAT:  # the fused node's float32 output, cast back after it
        out = e.cast(out, ir.DataType.FLOAT)
    layout.replace_bsd_output(e, out, hq, output, reuse)
    return form.op, f"{why}; " + "; ".join(parts)


def _read(
    call: FlashAttentionCall, profile: GpuProfile
) -> tuple[CallDims, tuple[int, int], list[ir.Value | None], bool]:
    """What the profile's choice reads of call: its dims, head counts (hq, hkv), the float16 value
    each of Q, K and V was cast from (None where not, or where the profile runs no float16), and
    whether the block is computed in float16 (the call is float16, or all three are such casts).
    Raises NotLowered where a refusal of the profile applies or the head counts are not known."""
    for refusal in profile.refusals:
        if refusal.applies(call):
            raise NotLowered(refusal.why)
    dims = call_dims(call)
    heads = native.head_counts(dims)
    halves = [float16_source(x) if profile.native_float16 else None for x in (call.q, call.k, call.v)]
    half = profile.native_float16 and (call.dtype == ir.DataType.FLOAT16 or all(h is not None for h in halves))
    return dims, heads, halves, half


def form_at_opset(call: FlashAttentionCall, profile: GpuProfile, opset: int) -> tuple[str | None, bool]:
    """(form, computed in float16) as lower_gpu would choose for call in a model of default opset
    ``opset`` ((None, False) where it would refuse the call; form None where no form is right), read
    without writing anything; the cached-step shortcut is not considered (a block it takes is not
    one whose form an opset changes)."""
    try:
        dims, _, _, half = _read(call, profile)
    except NotLowered:
        return None, False
    return profile.choose(call, dims, half, opset)[0], half


def float16_source(x: ir.Value) -> ir.Value | None:
    """The float16 value x was cast to float32 from (the fusion's Cast before the node), or None."""
    cast = u.producer(x, "Cast")
    if cast is None or u.attr_int(cast, "to") != ir.DataType.FLOAT:
        return None
    source = u.operand(cast, 0)
    return source if source.dtype == ir.DataType.FLOAT16 else None


def with_mask_notes(block: GpuBlock, out: ir.Value, guard: str) -> ir.Value:
    """out of a form with every mask in attention_bias, the mask's notes and the guard's (where
    one was written) added to the block's."""
    block.parts.extend(layout.mask_parts(block.call, causal_folded=True))
    if guard:
        block.parts.append(guard)
    return out
