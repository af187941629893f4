"""FlashAttention -> the form ONNX Runtime's CUDA EP runs on the GPU, computes right, and runs fast.

The choice per block rests on CAPABILITIES below: what one H200 run measured for each candidate
form (benchmarks/cuda_capabilities.py; the table is benchmarks/results/cuda_capabilities.md, the
raw rows cuda_capabilities.json, and tests/test_cuda_table.py checks the two agree).

- float16 blocks run in float16 (the casts around the fused node are not written): the EP's fast
  kernels (flash, memory-efficient, cuDNN) take float16 only, and a float16 model computes its
  products in float16 on the EP anyway, so the result is checked at a float16 tolerance.
  - causal, no bias or mask, Sq == Sk proved, one head size that is a multiple of 8:
    GroupQueryAttention with its own causal mask (on the GPU in float16 only);
  - everything else: MultiHeadAttention with the mask and causality in ``attention_bias`` (cast
    to float16: float32-lowest becomes -inf there, the same for softmax), key/value heads repeated
    for grouped-query blocks.
- float32 blocks (and blocks whose element type is not inferred): MultiHeadAttention with every
  mask in ``attention_bias``, in float32. Not GroupQueryAttention (the EP runs it on the CPU in
  float32), not ONNX Attention-23 (wrong on the EP for causal decoders, issue 23), not
  ``key_padding_mask`` (see the table).
- float32 blocks with a KV-cache append and one key/value head per query head: the contrib
  target's MultiHeadAttention with past_key/past_value (a decode step as fast as the original).
- Rows with every key masked are written out by the lowering instead of left to the EP's kernels,
  as the webgpu target writes them (ortflash/lowering/webgpu.py): a row whose float32 bias is one
  value <= -2**127 everywhere is the mean of V, by Where; a row of -inf everywhere is NaN, by
  out + 0·max(bias row); a NaN guard turns NaN into zeros where the block asks for it.

The float32 products on the CUDA EP use TF32 unless the session sets ``use_tf32=0``
(benchmarks/results/cuda_capabilities.md: about 1e-3 against the CPU EP with TF32, 1e-6 without).
"""

from __future__ import annotations

import onnx_ir as ir

from ..errors import NotLowered
from ..graph import ir_utils as u
from ..graph.emitter import Emitter
from ..op.call import FlashAttentionCall
from . import layout, native
from .cache import find_cache_append
from .contrib import CONTRIB_DOMAIN, OP_GQA, OP_MHA, lower_contrib
from .measured import Capability, CapabilityTable
from .read import aligned_batch, call_dims

# (form, case) -> what the CUDA EP did, measured 2026-12-01 on an NVIDIA H200 (driver 580.159.04)
# with onnxruntime-gpu 1.31.1 (benchmarks/results/cuda_capabilities.md). Forms and case names are
# benchmarks/cuda_capabilities.py's; only the rows the choices below read, or that say why a form
# is not chosen, are copied here, and tests/test_cuda_table.py checks each against the committed JSON.
CAPABILITIES = CapabilityTable(
    {
        # GroupQueryAttention: cuDNN flash in float16; on the CPU in float32 (0 of 1 nodes on CUDA)
        ("gqa", "causal_f16_d64_s37"): Capability(on_gpu=True, right=True),
        ("gqa", "causal_f16_d128_s16384"): Capability(on_gpu=True, right=True),
        ("gqa", "causal_f32_d64_s37"): Capability(on_gpu=False, right=True),
        ("gqa", "causal_f32_d64_s4096"): Capability(on_gpu=False, right=True),
        # MultiHeadAttention with attention_bias: cuDNN flash in float16, MATH / memory-efficient in float32
        ("mha_bias", "padding_f16_d64_s37"): Capability(on_gpu=True, right=True),
        ("mha_bias", "causal_leftpad_f16_d64_s37"): Capability(on_gpu=True, right=True),
        ("mha_bias", "padding_f16_d64_s16384"): Capability(on_gpu=True, right=True),
        ("mha_bias", "padding_f32_d64_s37"): Capability(on_gpu=True, right=True),
        ("mha_bias", "causal_leftpad_f32_d64_s37"): Capability(on_gpu=True, right=True),
        # rows of -inf: finite on the EP, NaN on the CPU EP (the lowering writes such rows out)
        ("mha_bias", "dead_rows_neginf_f16_d64_s37"): Capability(on_gpu=True, right=False),
        # key_padding_mask: the unfused MATH kernel at 4096 (1.22 ms against 0.32 with attention_bias),
        # refused at 16384
        ("mha_kpm", "padding_f16_d64_s16384"): Capability(on_gpu=False, right=False),
        # the decomposed graph in float16: rows of float16-lowest wrong (about 1.0); refused at 16384
        ("unfused", "causal_leftpad_f16_d64_s37"): Capability(on_gpu=True, right=False),
        ("unfused", "padding_f16_d64_s16384"): Capability(on_gpu=False, right=False),
    }
)


def lower_cuda(e: Emitter, call: FlashAttentionCall, output: ir.Value) -> tuple[str, str]:
    """Write the CUDA EP's form of call and reroute output to it: (op, how)."""
    native.require_contrib_opset(e)
    if call.bias_after_mask and call.bias is not None and call.masked:
        raise NotLowered("bias_after_mask: the bias is added after the fills, which one additive bias does not express")
    if call.softcap > 0:
        raise NotLowered("softcap: MultiHeadAttention has none, and the CUDA capability table has no softcap row")
    dims = call_dims(call)
    hq, hkv = native.head_counts(dims)
    native.require_castlike_for_unknown_dtype(e, call)
    if hq == hkv and call.dtype == ir.DataType.FLOAT and find_cache_append(call) is not None:
        # a float32 decoder step with a cache and one key/value head per query head: the contrib
        # target's MultiHeadAttention with past_key/past_value (the append inside the op) ran a
        # decode step at past 2048 as fast as the original graph (GPT-2: 0.58 against 0.57 ms),
        # where the cache append kept outside and the row guards cost half as much again
        # (0.86 ms; benchmarks/results/cuda_zoo.md)
        op, how = lower_contrib(e, call, output)
        return op, f"the contrib target's form for a cached float32 step (MultiHeadAttention on the GPU); {how}"
    halves = [_float16_source(x) for x in (call.q, call.k, call.v)]
    half = call.dtype == ir.DataType.FLOAT16 or all(h is not None for h in halves)
    use_gqa = half and CAPABILITIES.usable("gqa", "causal_f16_d64_s37") and native.gqa_own_causal_fits(call, dims)
    mha_case = "causal_leftpad_f16_d64_s37" if half else "causal_leftpad_f32_d64_s37"
    if not use_gqa and not CAPABILITIES.usable("mha_bias", mha_case):
        raise NotLowered("no form in the CUDA capability table is right on the GPU for this block")

    call, broadcast = aligned_batch(e, call, dims)
    parts = [f"{hq} query / {hkv} key-value heads"] + ([broadcast] if broadcast else [])
    if half:  # native float16: no casts, so the surrounding Transposes are the inputs
        q, k, v = (x if h is None else h for x, h in zip((call.q, call.k, call.v), halves))
        reuse = True
        parts.append("computed in float16 (the EP's fast kernels are float16 ones; checked at a float16 tolerance)")
    else:
        q, k, v = (e.cast(x, ir.DataType.FLOAT) for x in (call.q, call.k, call.v))
        reuse = call.dtype == ir.DataType.FLOAT
    if use_gqa:
        op = OP_GQA
        # present_key / present_value are written although nothing reads them: the CUDA EP refuses
        # the node without them ("present_key and present_value are required", onnxruntime-gpu 1.31.1)
        out = native.gqa_own_causal(e, call, q, k, v, hq, hkv, reuse, presents=True)
        parts.append("GroupQueryAttention's causal mask (Sq == Sk proved; no bias or mask; on the GPU in float16)")
        why = "GroupQueryAttention: on the GPU in float16 and right for causal blocks"
    else:
        op = OP_MHA
        out, guard = _multi_head_attention(e, call, q, k, v, hq, hkv, reuse, half, parts)
        parts += layout.mask_parts(call, causal_folded=True)
        if guard:
            parts.append(guard)
        why = "MultiHeadAttention with attention_bias: on the GPU and right" + (
            "" if half else " (GroupQueryAttention runs on the CPU in float32; Attention-23 is wrong for causal blocks)"
        )
    if not half and call.dtype != ir.DataType.FLOAT:
        out, note = layout.cast_back(e, out, call)
        parts.append(note)
    if half and call.dtype == ir.DataType.FLOAT:  # the fused node's float32 output, cast back after it
        out = e.cast(out, ir.DataType.FLOAT)
    layout.replace_bsd_output(e, out, hq, output, reuse)
    return op, f"{why}; " + "; ".join(parts)


def _float16_source(x: ir.Value) -> ir.Value | None:
    """The float16 value x was cast to float32 from (the fusion's Cast before the node), or None."""
    cast = u.producer(x, "Cast")
    if cast is None or u.attr_int(cast, "to") != ir.DataType.FLOAT:
        return None
    source = u.operand(cast, 0)
    return source if source.dtype == ir.DataType.FLOAT16 else None


def _multi_head_attention(
    e: Emitter,
    call: FlashAttentionCall,
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    hq: int,
    hkv: int,
    reuse: bool,
    half: bool,
    parts: list[str],
) -> tuple[ir.Value, str]:
    """MultiHeadAttention [B, Sq, Hq·Dv] with every mask in attention_bias, and the masked-rows guard
    (computed in float32 on the float32 bias; the output cast around it for float16)."""
    q3, k3, v3, expanded = native.mha_operands(e, call, q, k, v, hq, hkv, reuse, parts)
    # the bias before its Expand to [.., Sq, Sk]: the row guard reads it there (a padding mask is
    # [B, 1, 1, Sk], not Sq·Sk values), and a float16 block casts it there, before the Expand
    expand = u.producer(expanded, "Expand")
    bias = expanded if expand is None else u.operand(expand, 0)
    op_bias = expanded
    if expanded is not None and bias is not None and half:
        op_bias = (
            e.cast(expanded, ir.DataType.FLOAT16)
            if expand is None
            else e.node("Expand", [e.cast(bias, ir.DataType.FLOAT16), u.operand(expand, 1)])
        )
    inputs = [q3, k3, v3] + ([None, None, op_bias] if op_bias is not None else [])
    out = e.node("MultiHeadAttention", inputs, domain=CONTRIB_DOMAIN, num_heads=hq, scale=call.scale)
    if bias is None:
        if call.masked_rows == "zero" and not half:
            return e.node("Where", [e.node("IsNaN", [out]), e.f32(0.0), out]), "NaN guard -> Where(IsNaN(out), 0, out)"
        return out, ""
    out32 = e.cast(out, ir.DataType.FLOAT) if half else out
    v32 = e.cast(v3, ir.DataType.FLOAT) if half else v3
    ones = e.i64([1, 1, 1, 1])  # the reduced bias at rank 4 (a causal-only bias is [Sq, Sk])
    row_max = e.transpose(e.node("Expand", [layout.reduce_keepdims(e, "ReduceMax", bias), ones]), layout.SWAP_SH)
    row_min = e.transpose(e.node("Expand", [layout.reduce_keepdims(e, "ReduceMin", bias), ones]), layout.SWAP_SH)
    uniform = layout.absorbing_rows(e, row_max, row_min)
    mean_v = e.reshape(layout.reduce_keepdims(e, "ReduceMean", v32, axis=1), [0, 0, hq, -1])  # [B, 1, Hq, Dv]
    out3, guard = layout.write_out_masked_rows(e, call, out32, (uniform, mean_v, row_max), hq)
    return (e.cast(out3, ir.DataType.FLOAT16) if half else out3), guard
