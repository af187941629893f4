"""FlashAttention -> the form ONNX Runtime's CUDA EP runs on the GPU, computes right, and runs fast.

The choice per block rests on CAPABILITIES (cuda_measured.py; its rows in cuda_capabilities.json
beside it): what one H200 run measured for each candidate form (benchmarks/cuda_capabilities.py; the
table is benchmarks/results/cuda_capabilities.md, the raw rows cuda_capabilities.json there, and
tests/test_cuda_table.py checks the two agree). CUDA_PROFILE
(the module's end) is what the one GPU writer (lowering/gpu.lower_gpu) reads for this EP: the table,
refusals, choose_form, a writer per form, float16 computed natively, the cached-step shortcut.

- float16 blocks run in float16 (the casts around the fused node are not written): the EP's fast
  kernels (flash, memory-efficient, cuDNN) take float16 only, and a float16 model computes its
  products in float16 on the EP anyway, so the result is checked at a float16 tolerance.
  - causal, no bias or mask, Sq == Sk proved, one head size that is a multiple of 8: the fastest
    right form the table timed at the block's (element type, head dim, key length) row, a length
    known only at run time read at S=4096 (choose_form): Attention-23 is_causal on [B, S, H·D]
    (ORT's own flash kernel; a float16 model below opset 23 is raised to it for this form where the
    table times it fastest: opset_wanted) or GroupQueryAttention with its own causal mask (on the
    GPU in float16 only), and in float32 MultiHeadAttention unidirectional=1 without a bias, which float16
    blocks do not take (its cuDNN graph was rebuilt on every call: REBUILT_PER_CALL_F16); the note
    names the kernel ORT ran there and its time;
  - causal with a padding part (Hugging Face's decoder mask: one bias row per batch, [B, 1, 1, Sk],
    -inf where padded), Sq == Sk proved: MultiHeadAttention unidirectional=1 with that row expanded
    as ``attention_bias``; the rows with no key up to their position (left padding) are NaN (or 0)
    by one CumSum over the row (causal_padding_fits);
  - everything else: MultiHeadAttention with the mask and causality in ``attention_bias`` (cast
    to float16: float32-lowest becomes -inf there, the same for softmax), key/value heads repeated
    for grouped-query blocks; a bias that is a float16 value cast to float32 is held by one Where
    before its Cast back (_held_bias: the static-shape cliff).
- float32 blocks (and blocks whose element type is not inferred): the causal ones as above (by the
  table's times with TF32 on, the EP's default), the others MultiHeadAttention with every mask in
  ``attention_bias``, in float32. For those, not GroupQueryAttention (the EP runs it on the CPU in
  float32), not ONNX Attention-23 (wrong on the EP for causal decoders, issue 23), not
  ``key_padding_mask`` (see the table).
- float32 blocks with a KV-cache append and one key/value head per query head: the contrib
  target's MultiHeadAttention with past_key/past_value (a decode step as fast as the original).
- Rows with every key masked are written out by the lowering instead of left to the EP's kernels,
  as the webgpu target writes them (ortflash/lowering/webgpu.py): a row whose float32 bias is one
  value <= -2**127 everywhere is the mean of V, by Where; a row with no key above -inf is NaN (0
  where the block asks for zeros), found by its keys (the EP's ReduceMax gives float32's lowest
  there); the row statistics are reduced with the keys' axis moved to the front (ROW_REDUCE).

The float32 products on the CUDA EP use TF32 unless the session sets ``use_tf32=0``
(benchmarks/results/cuda_capabilities.md: about 1e-3 against the CPU EP with TF32, 1e-6 without).
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from ..graph import ir_utils as u
from ..graph import shapes
from ..graph.emitter import Emitter
from ..op.call import FlashAttentionCall
from . import gpu, layout, masked_rows, native
from .cache import find_cache_append
from .contrib import CONTRIB_DOMAIN, OP_GQA, OP_MHA, lower_contrib
from .cuda_measured import CAPABILITIES, CAUSAL_PADDING_RESULTS, CUDNN_REBUILT_RESULTS
from .gpu import GpuBlock, GpuForm, GpuProfile, Refusal, float16_source, with_mask_notes
from .read import CallDims
from .standard import OP_ATTENTION


def _cached_float32_step(
    e: Emitter, call: FlashAttentionCall, output: ir.Value, heads: tuple[int, int]
) -> tuple[str, str] | None:
    """A float32 decoder step with a cache and one key/value head per query head: the contrib
    target's MultiHeadAttention with past_key/past_value (the append inside the op) ran a decode
    step at past 2048 as fast as the original graph (GPT-2: 0.58 against 0.57 ms), where the cache
    append kept outside and the row guards cost half as much again (0.86 ms;
    benchmarks/results/cuda_zoo.md). None for every other block."""
    hq, hkv = heads
    if hq != hkv or call.dtype != ir.DataType.FLOAT or find_cache_append(call) is None:
        return None
    op, how = lower_contrib(e, call, output)
    return op, f"the contrib target's form for a cached float32 step (MultiHeadAttention on the GPU); {how}"


# The forms the target writes, by the capability table's names (benchmarks/cuda_capabilities.py).
FORM_GQA = "gqa"  # GroupQueryAttention with its own causal mask
FORM_MHA_CAUSAL = "mha_causal"  # MultiHeadAttention, unidirectional=1, no bias
FORM_ATTN23_CAUSAL = "attn23_causal_bsd"  # ONNX Attention-23, is_causal=1, inputs [B, S, H·D]
FORM_MHA_BIAS = "mha_bias"  # MultiHeadAttention with every mask and causality in attention_bias
# MultiHeadAttention unidirectional=1 with the padding part alone in attention_bias (causal_padding_fits)
FORM_MHA_CAUSAL_PADDING = "mha_causal_padding"
# A causal block with no bias or mask and Sq == Sk proved may take any of these; the others take
# mha_bias. Not mha_bias for it: its row times the node alone, while the lowering adds the causal
# bias it builds and the fully-masked-rows guard (0.106 ms against mha_causal's 0.060 at S=1024,
# D=64, benchmarks/results/cuda_forms.md), and the own causal mask needs neither.
OWN_CAUSAL_FORMS = (FORM_GQA, FORM_MHA_CAUSAL, FORM_ATTN23_CAUSAL)
# Forms not chosen in float16 whatever their row's time: MultiHeadAttention unidirectional=1 with no
# bias rebuilt its cuDNN graph on every call in the zoo's long causal block (35-54 ms a call against
# 0.32 for GroupQueryAttention, the process growing 110 MiB over 50 calls, static and symbolic alike),
# and ran 0.5 ms as soon as cuDNN's API log was on: ORT 1.31.1 keys its cuDNN graph cache by a hash
# of every byte of a struct whose padding is left uninitialized, so whether the cache hits follows
# what the stack held before the call, not the model's shapes (CUDNN_REBUILT_RESULTS; the same node
# hit the cache in cuda_forms.md's blocks, so the table's rows for it are right but not to be relied on).
REBUILT_PER_CALL_F16 = frozenset({FORM_MHA_CAUSAL})
ATTENTION_OPSET = 23  # Attention is in the default domain from this opset
TABLE_HEAD_DIMS = (64, 128)  # the long cases' head dims and key lengths (cuda_capabilities.py)
TABLE_LENGTHS = (1024, 4096, 16384)
# a key length known only at run time is read at this row: the S=4096 target (--ep cuda
# lowers float16 causal blocks from 1024 keys at D64/D128 or 4096: CROSSOVERS below)
RUN_TIME_LENGTH = 4096
# How the masked-rows guard finds its rows: "counts" (masked_rows.rows_by_counts: keys counted by
# MatMuls where the values the bias can hold allow, else as "outer_first"), "outer_first" (every
# statistic a reduction with the reduced axis moved to the front: masked_rows.reduce_outer_first)
# or "direct" (reduced in place). benchmarks/cuda_cudnn_cache.py forces each to compare them.
ROW_REDUCE = "counts"
# the float32 next above float32-lowest (the held bias's stand-in for lowest; -inf in float16 too)
STATIC_CLIFF_ABOVE_LOWEST = float(np.nextafter(np.float32(layout.F32_LOWEST), np.float32(0)))


def table_case(kind: str, half: bool, head_dim: int | None, key_len: int | None) -> str:
    """The capability table's long case a block is read at: its head dim's nearest measured one
    (64 where not static), the longest measured length not above its key length (the shortest
    where it is below every one; RUN_TIME_LENGTH where not static)."""
    d = min(TABLE_HEAD_DIMS, key=lambda m: abs(m - head_dim)) if head_dim is not None else TABLE_HEAD_DIMS[0]
    if key_len is None:
        s = RUN_TIME_LENGTH
    else:
        s = max([n for n in TABLE_LENGTHS if n <= key_len] or [TABLE_LENGTHS[0]])
    return f"{kind}_{'f16' if half else 'f32'}_d{d}_s{s}"


def causal_padding_fits(call: FlashAttentionCall, dims: CallDims) -> bool:
    """Whether MultiHeadAttention's own causal mask plus the call's bias as attention_bias computes
    the call: causal with Sq == Sk proved (top-left and bottom-right agree), no window or mask
    tensor, a bias with one row over the queries ([B|1, H|1, 1, Sk]: a padding part) whose values
    absorb a score only at -inf, and -inf as the fill where the bias holds -inf. Then a row is fully
    masked only where every key up to its own position is -inf in the bias, and the graph's row is
    NaN there (or 0) whatever the causal fill: the guard reads that from the bias's one row."""
    bias = call.bias
    if not (call.is_causal and call.mask is None and not call.bias_after_mask and bias is not None):
        return False
    if call.window_left >= 0 or call.window_right >= 0 or not shapes.same_dim(dims.sq, dims.sk):
        return False
    if bias.shape is None or len(bias.shape) != 4 or bias.shape[2] != 1 or not native.gqa_head_size_fits(dims):
        return False
    values = masked_rows.bias_value_set(call, fold_causal=False)
    if values is None or not masked_rows.dead_values(values) <= {-math.inf}:
        return False
    return -math.inf not in values or call.mask_fill == -math.inf


def opset_wanted(call: FlashAttentionCall, opset: int) -> int | None:
    """ATTENTION_OPSET where a float16 block would take Attention-23 in a model of that opset and not
    at ``opset`` (lowering/targets.py's Target.opset_wanted: the model's default opset is raised for
    it, every node carried over exactly, pipeline/opset.py), else None. Attention-23 runs ORT's own
    flash kernel, outside cuDNN's graph cache, and the table times it fastest for float16 causal
    blocks at D64 up to 4096 keys and D128 at 1024 (0.047 against GroupQueryAttention's 0.097 ms at
    1024, 0.213 against 0.274 at 4096, D64). Float32 blocks are not raised for it (0.170 against
    MultiHeadAttention's 0.183 at 1024: within the noise, and the float32 rows lower at no length)."""
    if opset >= ATTENTION_OPSET:
        return None
    form, half = gpu.form_at_opset(call, CUDA_PROFILE, ATTENTION_OPSET)
    if not half or form != FORM_ATTN23_CAUSAL:
        return None
    return ATTENTION_OPSET if gpu.form_at_opset(call, CUDA_PROFILE, opset)[0] != FORM_ATTN23_CAUSAL else None


def own_causal_forms(half: bool, opset: int) -> list[str]:
    """The own-causal forms a causal block with nothing else masking it may take: Attention-23 from
    its opset, none that rebuilt its cuDNN graph per call in float16 (REBUILT_PER_CALL_F16)."""
    return [
        f
        for f in OWN_CAUSAL_FORMS
        if (f != FORM_ATTN23_CAUSAL or opset >= ATTENTION_OPSET) and not (half and f in REBUILT_PER_CALL_F16)
    ]


def choose_form(call: FlashAttentionCall, dims: CallDims, half: bool, opset: int) -> tuple[str | None, str]:
    """(form, why) for one block: a causal block with nothing else masking it takes the fastest right
    form the table timed at its case (table_case); a causal block with a padding part the own causal
    mask with the padding in attention_bias (causal_padding_fits); every other block
    MultiHeadAttention with attention_bias where the table has it right on the GPU (None: no form is)."""
    mha_case = "causal_leftpad_f16_d64_s37" if half else "causal_leftpad_f32_d64_s37"
    if causal_padding_fits(call, dims) and CAPABILITIES.usable(FORM_MHA_BIAS, mha_case):
        return FORM_MHA_CAUSAL_PADDING, (
            "MultiHeadAttention unidirectional=1 with the padding part in attention_bias: its own causal "
            f"mask, no [Sq, Sk] causal bias to build or guard ({CAUSAL_PADDING_RESULTS})"
        )
    if native.gqa_own_causal_fits(call, dims):
        case = table_case("causal", half, shapes.static(dims.d), shapes.static(dims.sk))
        form = CAPABILITIES.fastest(own_causal_forms(half, opset), case)
        if form is not None:
            cap = CAPABILITIES[(form, case)]
            others = ", ".join(
                f"{f} {c.ms:.3f}"
                for f in OWN_CAUSAL_FORMS
                if f != form and (c := CAPABILITIES.get((f, case))) is not None and c.ms and c.right and c.on_gpu
            )
            where = "" if opset >= ATTENTION_OPSET else f"; {FORM_ATTN23_CAUSAL} needs opset {ATTENTION_OPSET}"
            if half:
                where += f"; not {FORM_MHA_CAUSAL}: its cuDNN graph was rebuilt on every call ({CUDNN_REBUILT_RESULTS})"
            return form, (
                f"{form}: the fastest right form on the GPU for a causal block at the table's {case} "
                f"(ORT's {cap.kernel} kernel, {cap.ms:.3f} ms; {others or 'no other form timed'}{where})"
            )
        if half and CAPABILITIES.usable(FORM_GQA, "causal_f16_d64_s37"):  # the table timed no form here
            return FORM_GQA, "GroupQueryAttention: on the GPU in float16 and right for causal blocks"
    if CAPABILITIES.usable(FORM_MHA_BIAS, mha_case):
        return FORM_MHA_BIAS, "MultiHeadAttention with attention_bias: on the GPU and right" + (
            "" if half else " (GroupQueryAttention runs on the CPU in float32; Attention-23 is wrong for causal blocks)"
        )
    return None, ""


def _gqa_causal(e: Emitter, block: GpuBlock) -> ir.Value:
    # present_key / present_value are written although nothing reads them: the CUDA EP refuses
    # the node without them ("present_key and present_value are required", onnxruntime-gpu 1.31.1)
    out = native.gqa_own_causal(e, block.call, block.ops, presents=True)
    block.parts.append("GroupQueryAttention's causal mask (Sq == Sk proved; no bias or mask)")
    return out


def _own_causal(e: Emitter, block: GpuBlock) -> ir.Value:
    """[B, Sq, Hq·Dv] of MultiHeadAttention (unidirectional=1; key/value heads repeated for
    grouped-query blocks) or Attention-23 (is_causal=1, its own head counts) on [B, S, H·D]
    operands, no bias: causal top-left is the call's mask where Sq == Sk, and no row is fully
    masked (row i sees key 0), so no guard is written."""
    ops, scale = block.ops, block.call.scale
    if block.form == FORM_MHA_CAUSAL:
        op = OP_MHA
        out = e.node(
            "MultiHeadAttention",
            [ops.q, ops.k, ops.v],
            domain=CONTRIB_DOMAIN,
            num_heads=ops.hq,
            scale=scale,
            unidirectional=1,
        )
    else:
        op = OP_ATTENTION
        out = e.node(
            "Attention", [ops.q, ops.k, ops.v], q_num_heads=ops.hq, kv_num_heads=ops.hkv, scale=scale, is_causal=1
        )
    block.parts.append(f"{op}'s own causal mask (Sq == Sk proved; no bias or mask)")
    return out


def _causal_with_padding(e: Emitter, block: GpuBlock) -> ir.Value:
    """MultiHeadAttention [B, Sq, Hq·Dv], unidirectional=1, the padding part alone in attention_bias
    (causal_padding_fits). The rows with no key up to their own position (a left-padded row's
    first queries) are written out from the bias's one row [B|1, H|1, 1, Sk]: the running count
    of the keys above -inf (CumSum over the keys) is 0 at key i exactly where query i sees none,
    O(B·Sk) work where the causal bias's guard reduced [B, 1, Sq, Sk] (cuda_forms_causal_f16.md)."""
    call, ops = block.call, block.ops
    pad = layout.bias_before_expand(e, call, ops.lengths, fold_causal=False, avoid_lowest=False)
    assert pad is not None  # causal_padding_fits: a bias
    op_bias = e.cast(_held_bias(e, pad), ir.DataType.FLOAT16) if block.half else pad
    inputs = [ops.q, ops.k, ops.v, None, None, layout.expand_to_scores(e, op_bias, ops.lengths)]
    out = e.node(
        "MultiHeadAttention", inputs, domain=CONTRIB_DOMAIN, num_heads=ops.hq, scale=call.scale, unidirectional=1
    )
    block.parts.append("MultiHeadAttention's own causal mask (Sq == Sk proved), the padding part in attention_bias")
    block.parts.extend(layout.mask_parts(call, causal_folded=False))
    values = masked_rows.bias_value_set(call, fold_causal=False)
    if values is None or -math.inf not in values:
        block.parts.append("no bias value absorbs a score: no row can be fully masked, no guard")
        return out
    alive = e.node("Cast", [e.node("Greater", [pad, e.f32(-math.inf)])], to=ir.DataType.FLOAT)
    seen = e.node("CumSum", [alive, e.i64(3)])  # [B|1, H|1, 1, Sk]: keys above -inf up to each key
    dead = e.transpose(e.node("Equal", [seen, e.f32(0.0)]), [0, 3, 1, 2])  # [B|1, Sq, H|1, 1]
    zero = call.masked_rows == "zero"
    fill = e.f32(0.0 if zero else math.nan)
    fill = e.cast(fill, ir.DataType.FLOAT16) if block.half else fill
    out4 = e.node("Where", [dead, fill, e.reshape(out, [0, 0, ops.hq, -1])])
    block.parts.append(
        "rows with no key up to their position (CumSum of the bias's keys above -inf) -> "
        f"{'0 (masked_rows zero)' if zero else 'NaN'} by Where"
    )
    return e.reshape(out4, [0, 0, -1])


def _held_bias(e: Emitter, bias: ir.Value) -> ir.Value:
    """bias, where it is a float16 value cast to float32, through Where(bias == lowest, next float up,
    bias): the same float16 values once cast back (both are -inf there), and an op ORT's optimizer
    keeps. Without it, on a model whose sequence dim is a number, ORT's basic optimizations remove
    the Cast pair and the Expand (a no-op there) and MultiHeadAttention with a whole [1, 1, S, S]
    bias ran 41-64 ms instead of 1.3 (float16, S=4096, H=16, D=64; the same block with a symbolic dim
    or ORT's optimizations off: 1.3 ms; benchmarks/results/cuda_forms.md, the static-shape cliff)."""
    if float16_source(bias) is None:
        return bias
    lowest = e.node("Equal", [bias, e.f32(layout.F32_LOWEST)])
    return e.node("Where", [lowest, e.f32(STATIC_CLIFF_ABOVE_LOWEST), bias])


def _multi_head_attention(e: Emitter, block: GpuBlock) -> ir.Value:
    """MultiHeadAttention [B, Sq, Hq·Dv] with every mask in attention_bias, and the masked-rows guard
    (computed in float32 on the float32 bias; the output cast around it for float16)."""
    out, guard = _with_row_guard(e, block)
    return with_mask_notes(block, out, guard)


def _with_row_guard(e: Emitter, block: GpuBlock) -> tuple[ir.Value, str]:
    call, half, ops = block.call, block.half, block.ops
    q3, k3, v3, hq = ops.q, ops.k, ops.v, ops.hq
    expanded = layout.additive_bias(e, call, ops.lengths, fold_causal=True, avoid_lowest=False)
    # the bias before its Expand to [.., Sq, Sk]: the row guard reads it there (a padding mask is
    # [B, 1, 1, Sk], not Sq·Sk values), and a float16 block casts it there, before the Expand
    expand = u.producer(expanded, "Expand")
    bias = expanded if expand is None else u.operand(expand, 0)
    op_bias = expanded
    if expanded is not None and bias is not None and half:
        op_bias = (
            e.cast(_held_bias(e, expanded), ir.DataType.FLOAT16)
            if expand is None
            else e.node("Expand", [e.cast(_held_bias(e, bias), ir.DataType.FLOAT16), u.operand(expand, 1)])
        )
    inputs = [q3, k3, v3] + ([None, None, op_bias] if op_bias is not None else [])
    out = e.node("MultiHeadAttention", inputs, domain=CONTRIB_DOMAIN, num_heads=hq, scale=call.scale)
    if bias is None:
        if call.masked_rows == "zero" and not half:
            return e.node("Where", [e.node("IsNaN", [out]), e.f32(0.0), out]), "NaN guard -> Where(IsNaN(out), 0, out)"
        return out, ""
    values = masked_rows.bias_value_set(call)
    if values is not None and not masked_rows.dead_values(values):
        return out, "no bias value absorbs a score: no row can be fully masked, no guard"
    out32 = e.cast(out, ir.DataType.FLOAT) if half else out
    rows = (
        masked_rows.rows_by_counts(e, bias, masked_rows.absorbing_values(call, values), v3, hq, half)
        if ROW_REDUCE == "counts"
        else None
    )
    if rows is None:
        rows = masked_rows.rows_by_reductions(e, bias, values, v3, hq, half, outer_first=ROW_REDUCE != "direct")
    out3, guard = masked_rows.write_out_masked_rows(e, call, out32, rows, hq)
    return (e.cast(out3, ir.DataType.FLOAT16) if half else out3), guard


CUDA_PROFILE = GpuProfile(
    ep="CUDA",
    capabilities=CAPABILITIES,
    refusals=(
        Refusal(
            lambda call: call.bias_after_mask and call.bias is not None and call.masked,
            "bias_after_mask: the bias is added after the fills, which one additive bias does not express",
        ),
        Refusal(
            lambda call: call.softcap > 0,
            "softcap: MultiHeadAttention has none, and the CUDA capability table has no softcap row",
        ),
    ),
    # choose_form looked up per call: benchmarks/cuda_forms.py forces a form by replacing it
    choose=lambda call, dims, half, opset: choose_form(call, dims, half, opset),
    forms={
        FORM_GQA: GpuForm(OP_GQA, _gqa_causal, one_head_count=False),
        FORM_MHA_CAUSAL: GpuForm(OP_MHA, _own_causal, one_head_count=True),
        FORM_ATTN23_CAUSAL: GpuForm(OP_ATTENTION, _own_causal, one_head_count=False),
        FORM_MHA_BIAS: GpuForm(OP_MHA, _multi_head_attention, one_head_count=True),
        FORM_MHA_CAUSAL_PADDING: GpuForm(OP_MHA, _causal_with_padding, one_head_count=True),
    },
    native_float16=True,
    cached_step=_cached_float32_step,
)
