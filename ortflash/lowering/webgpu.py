"""FlashAttention -> the form ONNX Runtime's WebGPU EP both runs on the GPU and computes right.

The choice per block rests on CAPABILITIES below: what one H200 run measured for each candidate
form (benchmarks/webgpu_capabilities.py; the table is benchmarks/results/webgpu_capabilities.md,
the raw rows webgpu_capabilities.json, and tests/test_webgpu_target.py checks the two agree).

- Causal blocks with no bias or mask, Sq == Sk proved: GroupQueryAttention (its own causal mask;
  on the GPU and right, and at S=4096 faster than MultiHeadAttention with the causal mask written
  as a bias). GroupQueryAttention with an ``attention_bias`` is not used: rows whose keys are all
  masked come out wrong on the EP.
- Everything else: MultiHeadAttention with the mask and causality folded into ``attention_bias``,
  as the contrib target writes it. Its ``key_padding_mask`` input is not used (the EP refuses
  it at run time), nor ONNX Attention (the EP does not take it: it runs on the CPU), nor the
  decomposed MatMul/Softmax/MatMul graph (wrong at S=8192, where the score tensor passes 4 GiB).
- Rows with every key masked are written out by the lowering instead of left to the EP: a row whose
  bias is -inf everywhere is NaN (FlashAttention and the CPU EP; the EP gave finite values at S=96),
  by out + 0·ReduceMax(bias row); a row whose bias is one value <= -2**127 everywhere
  (float32-lowest, what transformers writes) is the mean of V, by Where. The probe found the EP
  right on such rows, but the zoo's GPT-2 and Llama blocks lowered to plain MultiHeadAttention
  were wrong on it (benchmarks/results/webgpu_zoo.md, error 1.2 and 1.4, the fill float32-lowest
  in every failing block, -inf in every passing causal one); whether the written-out rows make
  them right there is not yet measured.

Every exactness argument of the contrib target (ortflash/lowering/__init__.py) holds here: the same
additive bias, the same float32 computation between casts for float16 blocks.
"""

from __future__ import annotations

import math

import onnx_ir as ir

from ..errors import NotLowered
from ..graph.emitter import Emitter
from ..op.call import FlashAttentionCall
from . import layout, native
from .contrib import CONTRIB_DOMAIN, OP_GQA, OP_MHA
from .measured import Capability, CapabilityTable
from .read import ABSORBING_FILL, aligned_batch, call_dims

# (form, case) -> what the WebGPU EP did, measured 2026-11-30 on an NVIDIA H200 with onnxruntime
# 1.32.0 + onnxruntime-ep-webgpu 0.4.0 (benchmarks/results/webgpu_capabilities.md). Forms and cases
# are benchmarks/webgpu_capabilities.py's; only the rows the choices below read are copied here.
CAPABILITIES = CapabilityTable(
    {
        ("mha_bias", "padding"): Capability(on_gpu=True, right=True),
        ("mha_bias", "causal"): Capability(on_gpu=True, right=True),
        ("mha_bias", "causal_leftpad"): Capability(on_gpu=True, right=True),
        ("mha_bias", "dead_rows"): Capability(on_gpu=True, right=True),
        ("mha_bias", "dead_rows_neginf"): Capability(on_gpu=True, right=False),
        ("mha_bias", "causal_leftpad_neginf"): Capability(on_gpu=True, right=False),
        ("mha_bias", "nomask_s8192"): Capability(on_gpu=True, right=True),
        ("mha_bias", "causal_s8192"): Capability(on_gpu=True, right=True),
        ("mha_kpm", "padding"): Capability(on_gpu=False, right=False),  # "not implemented for webgpu"
        ("gqa", "causal"): Capability(on_gpu=True, right=True),
        ("gqa", "causal_s8192"): Capability(on_gpu=True, right=True),
        ("gqa", "causal_leftpad"): Capability(on_gpu=True, right=False),
        ("attn23", "padding"): Capability(on_gpu=False, right=True),
        ("unfused", "nomask_s8192"): Capability(on_gpu=True, right=False),
    }
)


def lower_webgpu(e: Emitter, call: FlashAttentionCall, output: ir.Value) -> tuple[str, str]:
    """Write the WebGPU-safe form of call and reroute output to it: (op, how)."""
    native.require_contrib_opset(e)
    # is_causal 2 (bottom-right: decoders with a cache) takes the MultiHeadAttention path below, its
    # causal part folded into attention_bias like any mask: the form the table measures right for
    # causal masks given as a bias; GroupQueryAttention's own mask is used for top-left only.
    if call.bias_after_mask and call.mask is not None:
        # Proved causal or a window (fusion/causal), the fills are is_causal and the window: the
        # masked-mean guard of _multi_head_attention covers the rows that then see no key.
        raise NotLowered(
            "bias_after_mask after a mask tensor (not proved causal or a window): the bias is added after "
            "the fills, which one additive bias does not express"
        )
    if call.softcap > 0:
        raise NotLowered(
            "softcap: MultiHeadAttention has none, and GroupQueryAttention's softcap is not in the WebGPU capability table"
        )
    dims = call_dims(call)
    hq, hkv = native.head_counts(dims)
    native.require_castlike_for_unknown_dtype(e, call)
    # GroupQueryAttention's own causal mask: top-left when Sq == Sk; no bias or mask, since
    # GroupQueryAttention with attention_bias is wrong on the EP for fully masked rows.
    use_gqa = (
        CAPABILITIES.usable("gqa", "causal")
        and native.gqa_own_causal_fits(call, dims)  # a window goes into attention_bias (MultiHeadAttention below)
    )
    if not use_gqa and not CAPABILITIES.usable("mha_bias", "padding"):
        raise NotLowered("no form in the WebGPU capability table is right on the GPU for this block")

    f16 = call.dtype != ir.DataType.FLOAT  # float16, or not known: computed in float32 between casts
    call, broadcast = aligned_batch(e, call, dims)
    q, k, v = (e.cast(x, ir.DataType.FLOAT) for x in (call.q, call.k, call.v))
    reuse = not f16  # with casts around, the surrounding Transposes are not the inputs
    parts = [f"{hq} query / {hkv} key-value heads"] + ([broadcast] if broadcast else [])
    if use_gqa:
        op = OP_GQA
        out = native.gqa_own_causal(e, call, q, k, v, hq, hkv, reuse)
        if call.masked_rows == "zero":
            out = e.node("Where", [e.node("IsNaN", [out]), e.f32(0.0), out])
        parts.append("GroupQueryAttention's causal mask (Sq == Sk proved; no bias or mask)")
    else:
        op = OP_MHA
        out, guard = _multi_head_attention(e, call, q, k, v, hq, hkv, reuse, parts)
        parts += layout.mask_parts(call, causal_folded=True)
        if guard:
            parts.append(guard)
    if f16:
        out, note = layout.cast_back(e, out, call)
        parts.append(note)
    layout.replace_bsd_output(e, out, hq, output, reuse)
    why = (
        "GroupQueryAttention: on the GPU and right for causal blocks, faster than MultiHeadAttention with a causal bias"
        if use_gqa
        else "MultiHeadAttention with attention_bias: on the GPU and right (key_padding_mask is refused by the EP, "
        "Attention-23 runs on the CPU, the unfused graph is wrong at S=8192)"
    )
    return op, f"{why}; " + "; ".join(parts)


def _multi_head_attention(
    e: Emitter,
    call: FlashAttentionCall,
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    hq: int,
    hkv: int,
    reuse: bool,
    parts: list[str],
) -> tuple[ir.Value, str]:
    """MultiHeadAttention [B, Sq, Hq·Dv] with every mask in attention_bias, and the -inf rows guard."""
    q3, k3, v3, bias = native.mha_operands(e, call, q, k, v, hq, hkv, reuse, parts)
    inputs = [q3, k3, v3] + ([None, None, bias] if bias is not None else [])
    out = e.node("MultiHeadAttention", inputs, domain=CONTRIB_DOMAIN, num_heads=hq, scale=call.scale)
    if bias is None:
        if call.masked_rows == "zero":  # no fully masked rows; the guard as the contrib target writes it
            return e.node("Where", [e.node("IsNaN", [out]), e.f32(0.0), out]), "NaN guard -> Where(IsNaN(out), 0, out)"
        return out, ""
    # Rows with every key masked, written out by the lowering rather than left to the EP:
    # - a row whose bias is one value c <= -2**127 everywhere (float32-lowest: what transformers
    #   writes): FlashAttention's scores are all c (s + c rounds to c), so the row is the mean of V.
    #   The EP was right on such rows in the probe but wrong in the zoo's GPT-2 and Llama blocks
    #   (benchmarks/results/webgpu_zoo.md), so the mean is selected by Where.
    # - a row whose bias is -inf everywhere: NaN in FlashAttention and on the CPU EP; not always on
    #   the WebGPU EP. Written in float arithmetic, which stays on the GPU: out + 0·max(bias row) is
    #   out where the maximum is finite (0·finite = 0, x + 0 = x) and NaN where it is -inf.
    row_max = e.transpose(layout.reduce_keepdims(e, "ReduceMax", bias), layout.SWAP_SH)  # [B|1, Sq, H|1, 1]
    row_min = e.transpose(layout.reduce_keepdims(e, "ReduceMin", bias), layout.SWAP_SH)
    uniform = layout.absorbing_rows(e, row_max, row_min)
    if call.bias_after_mask:
        # The bias added after the fills: a row that sees no key holds fill + bias, c (bias 0) or
        # -inf (fill + fill), not one value; FlashAttention gives the mean of V over the keys at
        # the row's maximum c, written out as that masked mean (an extra P x V product).
        uniform = e.node(
            "And",
            [
                e.node("LessOrEqual", [row_max, e.f32(ABSORBING_FILL)]),
                e.node("Greater", [row_max, e.f32(-math.inf)]),
            ],
        )
        at_max = e.cast(e.node("Equal", [bias, layout.reduce_keepdims(e, "ReduceMax", bias)]), ir.DataType.FLOAT)
        v4 = e.transpose(e.reshape(v3, [0, 0, hq, -1]), layout.SWAP_SH)  # [B, Hq, Sk, Dv]
        total = e.node("MatMul", [at_max, v4])
        count = e.node("ReduceSum", [at_max, e.i64([-1])], keepdims=1)  # axes an input from opset 13
        mean_v = e.transpose(e.node("Div", [total, count]), layout.SWAP_SH)
    else:
        mean_v = e.reshape(layout.reduce_keepdims(e, "ReduceMean", v3, axis=1), [0, 0, hq, -1])  # [B, 1, Hq, Dv]
    return layout.write_out_masked_rows(
        e, call, out, (uniform, mean_v, row_max), hq, why="the EP gets either wrong in some shapes"
    )
