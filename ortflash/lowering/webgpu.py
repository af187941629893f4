"""FlashAttention -> the form ONNX Runtime's WebGPU EP both runs on the GPU and computes right.

The choice per block rests on CAPABILITIES below (its rows in webgpu_capabilities.json beside this
module): what one H200 run measured for each candidate form (benchmarks/webgpu_capabilities.py; the
table is benchmarks/results/webgpu_capabilities.md, the raw rows webgpu_capabilities.json there,
and tests/test_webgpu_target.py checks the two agree).
WEBGPU_PROFILE (the module's end) is what the one GPU writer, lowering/gpu.lower_gpu, reads for this
EP: the table, the refusals, the choice (choose_form), the writer of each form, and every block in
float32 between casts.

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
  were wrong on it (error 1.2 and 1.4, the fill float32-lowest); with the rows written out all 8
  GPT-2 and Llama exports are right on the EP (benchmarks/results/webgpu_zoo_decoders.md).
- The guard costs nodes, and the EP pays per node (ORT's WebGPU EP has no And or IsNaN kernel:
  those run on the CPU, behind a GPU->CPU copy), so it is written in as few as the mask allows
  (guard_rows): none where no row can be fully masked, one Where on the row maximum where the
  bias's values are known and one of them absorbs a score, and the bias with its row statistics
  once per graph for the blocks that read the same mask (issue 31 item 2: held-out exports at
  S=128 1.10x the original, were 0.59x; benchmarks/results/webgpu_outside.md).

Every exactness argument of the contrib target (ortflash/lowering/__init__.py) holds here: the same
additive bias, the same float32 computation between casts for float16 blocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType

import onnx_ir as ir

from ..graph import ir_utils as u
from ..graph.emitter import Emitter
from ..op.call import FlashAttentionCall
from . import layout, masked_rows, native
from .contrib import CONTRIB_DOMAIN, OP_GQA, OP_MHA
from .gpu import GpuBlock, GpuForm, GpuProfile, Refusal, with_mask_notes
from .measured import ANY_DTYPE, CapabilityTable, CostRecord, Crossovers
from .read import ABSORBING_FILL, CallDims

# (form, case) -> what the WebGPU EP did, measured 2026-11-30 on an NVIDIA H200 with onnxruntime
# 1.32.0 + onnxruntime-ep-webgpu 0.4.0, re-measured 2026-12-02 on onnxruntime 1.31.1 + the same
# plugin, driver 580.159.04: all 67 rows the same (benchmarks/results/webgpu_capabilities.md), kept
# as data in webgpu_capabilities.json beside this module. Forms and cases are
# benchmarks/webgpu_capabilities.py's; only the rows the choices below read (gqa/causal and
# mha_bias/padding), or that say why a form is not chosen (each such row's "why"), are copied there.
CAPABILITIES = CapabilityTable.load(Path(__file__).with_name("webgpu_capabilities.json"))


# The forms the target writes, by the capability table's names (benchmarks/webgpu_capabilities.py).
FORM_GQA = "gqa"  # GroupQueryAttention with its own causal mask
FORM_MHA_BIAS = "mha_bias"  # MultiHeadAttention with every mask and causality in attention_bias


def choose_form(call: FlashAttentionCall, dims: CallDims, half: bool, opset: int) -> tuple[str | None, str]:
    """(form, why) for one block: GroupQueryAttention's own causal mask where it is top-left with
    Sq == Sk and nothing else masks (GroupQueryAttention with attention_bias is wrong on the EP for
    fully masked rows; a window goes into attention_bias), else MultiHeadAttention with
    attention_bias (None: the table has neither right on the GPU). is_causal 2 (bottom-right:
    decoders with a cache) takes MultiHeadAttention, its causal part folded into attention_bias like
    any mask: the form the table measures right for causal masks given as a bias."""
    if CAPABILITIES.usable(FORM_GQA, "causal") and native.gqa_own_causal_fits(call, dims):
        return FORM_GQA, (
            "GroupQueryAttention: on the GPU and right for causal blocks, faster than MultiHeadAttention with a "
            "causal bias"
        )
    if CAPABILITIES.usable(FORM_MHA_BIAS, "padding"):
        return FORM_MHA_BIAS, (
            "MultiHeadAttention with attention_bias: on the GPU and right (key_padding_mask is refused by the EP, "
            "Attention-23 runs on the CPU, the unfused graph is wrong at S=8192)"
        )
    return None, ""


def _gqa_causal(e: Emitter, block: GpuBlock) -> ir.Value:
    # Row i keeps keys 0..i: no row is fully masked, so masked_rows "zero" changes nothing
    # (for finite inputs: the contrib target's IsNaN guard is exact only for those too).
    out = native.gqa_own_causal(e, block.call, block.ops)
    block.parts.append("GroupQueryAttention's causal mask (Sq == Sk proved; no bias or mask; no row fully masked)")
    return out


def _multi_head_attention(e: Emitter, block: GpuBlock) -> ir.Value:
    """MultiHeadAttention [B, Sq, Hq·Dv] with every mask in attention_bias, and what fully masked
    rows need (guard_rows)."""
    call, dims, ops = block.call, block.dims, block.ops
    key = _share_key(call, dims)
    masks = call.bias is not None or call.mask is not None or _bounded(call)
    pre = expanded = None
    if masks:
        # One bias per graph for the blocks that read the same mask at the same lengths (every
        # layer of an export): the WebGPU EP pays per node, and the causal part's Range and int64
        # compares run on the CPU.
        pre = _maybe_shared(
            e,
            key,
            "bias",
            lambda: layout.bias_before_expand(e, call, ops.lengths, fold_causal=True, avoid_lowest=False),
        )
        assert pre is not None
        expanded = _maybe_shared(e, key, "expanded", lambda: layout.expand_to_scores(e, pre, ops.lengths))
    inputs = [ops.q, ops.k, ops.v] + ([None, None, expanded] if expanded is not None else [])
    out = e.node("MultiHeadAttention", inputs, domain=CONTRIB_DOMAIN, num_heads=ops.hq, scale=call.scale)
    if pre is None or expanded is None:
        return with_mask_notes(block, out, "no mask or bias: no row is fully masked, no guard")
    return with_mask_notes(block, *guard_rows(e, call, dims, out, (pre, expanded, ops.v), ops.hq, key))


def _bounded(call: FlashAttentionCall) -> bool:
    return call.is_causal != 0 or call.window_left >= 0 or call.window_right >= 0


def _share_key(call: FlashAttentionCall, dims: CallDims) -> str | None:
    """What the bias of a block is a function of, where two blocks with equal keys provably compute
    the same bias: the mask and bias tensors, the fills and bounds, and Sq and Sk as static or
    named dims (None, no sharing, where a length is an unnamed dim)."""
    if not all(isinstance(d, (int, str)) for d in (dims.sq, dims.sk)):
        return None
    names = [layout.structural_key(x) if x is not None else "-" for x in (call.bias, call.mask)]
    if any(n is None for n in names):
        return None
    return "|".join(
        [
            *(n or "-" for n in names),
            repr(call.mask_fill),
            str(call.is_causal),
            str(call.window_left),
            str(call.window_right),
        ]
        + [str(int(call.bias_after_mask)), repr(dims.sq), repr(dims.sk)]
    )


def _maybe_shared(e: Emitter, key: str | None, what: str, build: Callable[[], ir.Value | None]) -> ir.Value | None:
    if key is None:
        return build()
    return layout.shared(e, f"webgpu|{what}|{key}", lambda: _required(build()))


def _required(x: ir.Value | None) -> ir.Value:
    assert x is not None
    return x


def guard_rows(
    e: Emitter,
    call: FlashAttentionCall,
    dims: CallDims,
    out: ir.Value,
    tensors: tuple[ir.Value, ir.Value, ir.Value],
    hq: int,
    key: str | None,
) -> tuple[ir.Value, str]:
    """out [B, Sq, Hq·Dv] with the rows whose keys are all masked written out, in as few nodes as
    the mask's values allow. tensors: the bias before and after its Expand, and V [B, Sk, Hq·Dv].

    FlashAttention gives such a row the mean of V where every score is one finite value at or
    below -2**127 (float32-lowest, transformers' fill), NaN where all are -inf (0 with
    masked_rows "zero"). The WebGPU EP gets either wrong in some shapes (module docstring), so:
    - no row can be fully masked (every row keeps a key by its causal and window bounds, Sq == Sk
      proved, and no bias value absorbs a score; or no value at all absorbs one): no guard;
    - the bias's values are known and only one of them absorbs (masked_rows.value_set: a padding mask
      ``Where(mask, 0, lowest)`` folded with a causal fill of the same value): a row is fully masked
      exactly where its maximum is that value, and is then uniform: Where(ReduceMax <= -2**127,
      mean of V, or NaN / 0, out), the row maxima shared by the blocks of one bias;
    - otherwise the general guard (_general_guard)."""
    pre, expanded, v3 = tensors
    values = masked_rows.bias_value_set(call)
    own = masked_rows.bias_value_set(call, fold_causal=False) if call.mask is None else None
    by_position = (
        own is not None and not masked_rows.dead_values(own) and layout.sees_a_key_by_position(call, dims.sq, dims.sk)
    )
    if by_position or (values is not None and not masked_rows.dead_values(values)):
        why = (
            "every row keeps a key by its causal bounds (Sq == Sk proved)"
            if by_position
            else "no bias value absorbs a score"
        )
        return out, f"no row can be fully masked ({why}): no guard"
    # The maxima of the bias before its Expand where that is 4D ([B, 1, 1, Sk] for a padding mask:
    # a row per batch item); a causal part alone is [Sq, Sk], read after the Expand.
    four_d = all(x is None or u.rank(x) == 4 for x in (call.bias, call.mask)) and (call.bias, call.mask) != (None, None)
    rows = pre if four_d else expanded
    dead = masked_rows.dead_values(values) if values is not None else frozenset()
    if call.bias_after_mask:
        return _general_guard(e, call, out, (expanded, v3), hq)
    if len(dead) != 1:
        return _uniform_guard(e, call, out, (rows, v3), hq, key)
    (value,) = dead

    def row_dead() -> ir.Value:
        row_max = e.transpose(masked_rows.reduce_keepdims(e, "ReduceMax", rows), layout.SWAP_SH)  # [B|1, Sq|1, H|1, 1]
        return e.node("LessOrEqual", [row_max, e.f32(ABSORBING_FILL)])

    dead_rows = _maybe_shared(e, key, "dead_rows", row_dead)
    assert dead_rows is not None
    if math.isinf(value):
        nan_rows = call.masked_rows != "zero"
        fill_rows = e.f32(math.nan if nan_rows else 0.0)
        what = "NaN" if nan_rows else "0 (masked_rows zero)"
    else:
        fill_rows = e.reshape(
            masked_rows.reduce_keepdims(e, "ReduceMean", v3, axis=1), [0, 0, hq, -1]
        )  # [B, 1, Hq, Dv]
        what = "the mean of V"
    out4 = e.node("Where", [dead_rows, fill_rows, e.reshape(out, [0, 0, hq, -1])])
    return e.reshape(out4, [0, 0, -1]), (
        f"fully masked rows written out: the bias's one absorbing value is {value:g}, so a row whose maximum is "
        f"<= -2**127 is {what}, by Where (one ReduceMax per bias)"
    )


def _uniform_guard(
    e: Emitter,
    call: FlashAttentionCall,
    out: ir.Value,
    tensors: tuple[ir.Value, ir.Value],
    hq: int,
    key: str | None,
) -> tuple[ir.Value, str]:
    """The guard where the bias's values are not known, or several absorb a score: a row whose bias
    is one value c <= -2**127 everywhere is the mean of V, a row whose maximum is -inf NaN (0 with
    masked_rows "zero", for finite V). The row statistics are computed once per bias (shared by
    the blocks that read it) in float compares and Where, no And (which the WebGPU EP leaves to
    the CPU): t = Where(max == min, max, 0) is c on uniform rows and 0 elsewhere, -inf mapped to 0
    too, so t <= -2**127 holds exactly on the uniform rows at a finite c."""
    rows, v3 = tensors

    def row_max() -> ir.Value:
        return e.transpose(masked_rows.reduce_keepdims(e, "ReduceMax", rows), layout.SWAP_SH)  # [B|1, Sq|1, H|1, 1]

    top = _maybe_shared(e, key, "row_max", row_max)
    assert top is not None

    def uniform_rows() -> ir.Value:
        low = e.transpose(masked_rows.reduce_keepdims(e, "ReduceMin", rows), layout.SWAP_SH)
        zero = e.f32(0.0)
        t = e.node("Where", [e.node("Equal", [top, low]), top, zero])
        t = e.node("Where", [e.node("Greater", [t, e.f32(-math.inf)]), t, zero])
        return e.node("LessOrEqual", [t, e.f32(ABSORBING_FILL)])

    def nan_term() -> ir.Value:  # NaN where no key is above -inf (found by its keys), 0 elsewhere
        dead = e.transpose(masked_rows.key_dead_rows(e, rows), layout.SWAP_SH)
        return e.node("Where", [dead, e.f32(math.nan), e.f32(0.0)])

    uniform = _maybe_shared(e, key, "uniform_rows", uniform_rows)
    nan_rows = _maybe_shared(e, key, "nan_term", nan_term)
    assert uniform is not None and nan_rows is not None
    mean_v = e.reshape(masked_rows.reduce_keepdims(e, "ReduceMean", v3, axis=1), [0, 0, hq, -1])  # [B, 1, Hq, Dv]
    out4 = e.node("Where", [uniform, mean_v, e.reshape(out, [0, 0, hq, -1])])
    out4 = e.node("Add", [out4, nan_rows])
    guard = (
        "fully masked rows written out: one value <= -2**127 everywhere -> mean of V by Where, -inf everywhere -> "
        "NaN by out + NaN·[no key above -inf] (the EP gets either wrong in some shapes; the row statistics once per bias)"
    )
    if call.masked_rows == "zero":
        out4 = e.node("Where", [e.node("IsNaN", [out4]), e.f32(0.0), out4])
        guard += "; NaN guard -> Where(IsNaN(out), 0, out) (exact for finite V)"
    return e.reshape(out4, [0, 0, -1]), guard


def _general_guard(
    e: Emitter, call: FlashAttentionCall, out: ir.Value, tensors: tuple[ir.Value, ir.Value], hq: int
) -> tuple[ir.Value, str]:
    """The guard for bias_after_mask blocks (GPT-Neo's): the masked mean over the keys at the row's
    maximum, read from the expanded bias."""
    bias, v3 = tensors
    # Rows with every key masked, written out by the lowering rather than left to the EP:
    # - a row whose bias is one value c <= -2**127 everywhere (float32-lowest: what transformers
    #   writes): FlashAttention's scores are all c (s + c rounds to c), so the row is the mean of V.
    #   The EP was right on such rows in the probe but wrong in the zoo's GPT-2 and Llama blocks
    #   (benchmarks/results/webgpu_zoo.md), so the mean is selected by Where.
    # - a row whose bias is -inf everywhere: NaN in FlashAttention and on the CPU EP; not always on
    #   the WebGPU EP. Found by its keys (masked_rows.key_dead_rows), not by its ReduceMax, which the
    #   CUDA EP makes float32's lowest on such a row (onnxruntime issue 32256).
    top = masked_rows.reduce_keepdims(e, "ReduceMax", bias)  # [B|1, H|1, Sq, 1], read twice below
    row_max = e.transpose(top, layout.SWAP_SH)  # [B|1, Sq, H|1, 1]
    if call.bias_after_mask:
        # The bias added after the fills: a row that sees no key holds fill + bias, c (bias 0) or
        # -inf (fill + fill), not one value; FlashAttention gives the mean of V over the keys at
        # the row's maximum c, written out as that masked mean (an extra P x V product). Its rows:
        # -inf < max <= -2**127, as Where(max > -inf, max, 0) <= -2**127 (0 is above the fill), no
        # And (the WebGPU EP runs And on the CPU, behind a GPU->CPU copy).
        finite = e.node("Where", [e.node("Greater", [row_max, e.f32(-math.inf)]), row_max, e.f32(0.0)])
        uniform = e.node("LessOrEqual", [finite, e.f32(ABSORBING_FILL)])
        at_max = e.cast(e.node("Equal", [bias, top]), ir.DataType.FLOAT)
        v4 = e.transpose(e.reshape(v3, [0, 0, hq, -1]), layout.SWAP_SH)  # [B, Hq, Sk, Dv]
        total = e.node("MatMul", [at_max, v4])
        count = e.node("ReduceSum", [at_max, e.i64([-1])], keepdims=1)  # axes an input from opset 13
        mean_v = e.transpose(e.node("Div", [total, count]), layout.SWAP_SH)
    else:
        row_min = e.transpose(masked_rows.reduce_keepdims(e, "ReduceMin", bias), layout.SWAP_SH)
        uniform = masked_rows.absorbing_rows(e, row_max, row_min)
        mean_v = e.reshape(masked_rows.reduce_keepdims(e, "ReduceMean", v3, axis=1), [0, 0, hq, -1])  # [B, 1, Hq, Dv]
    dead = e.transpose(masked_rows.key_dead_rows(e, bias), layout.SWAP_SH)
    return masked_rows.write_out_masked_rows(
        e, call, out, (uniform, mean_v, dead), hq, why="the EP gets either wrong in some shapes"
    )


# The WebGPU EP's cost table, which pipeline/forms.py reads through the EP's record
# (lowering/targets.py: PROVIDERS["webgpu"]) where --ep webgpu leaves the form open: measured in
# float32, taken for every element type (the onnxruntime-ep-webgpu 0.4.0 plugin on onnxruntime
# 1.31.1, Dawn on Vulkan, on an NVIDIA H200, driver 580.159.04, 2026-12-02; wall time;
# benchmarks/crossover_webgpu.py -> CROSSOVER_RESULTS): the `webgpu` target's output against the
# original graph, per length the least ratio of the 12-head stacks and of 17 held-out exports of
# real shapes (benchmarks/webgpu_outside.py: 2 layers, 2-4 heads, head dims 16-32), then the rule.
# The exports are at parity at S = 32-512 (0.79-1.01 at the worst model; 0.93 the worst causal one
# at 128, up to 1.9 where the export's own mask subgraph is heavy), so no kind is fused below 1024
# keys. The padding row stands for the kinds not measured apart (no mask, a full bias; the exports'
# no-mask and ALiBi blocks counted in it). The causal stack's original is Attention-23, which the EP
# runs on the CPU: every causal export counts in both causal rows (none has head dim 64).
CROSSOVER_RESULTS = "benchmarks/results/crossover_webgpu.md"
CROSSOVERS_MEASURED_UP_TO = 2048  # the table's longest key length
_PADDING_COSTS = MappingProxyType({"webgpu": MappingProxyType({32: 2048, 64: 1024})})
CROSSOVERS: Crossovers = MappingProxyType(
    {
        "padding": _PADDING_COSTS,
        "none": _PADDING_COSTS,
        "causal": MappingProxyType({"webgpu": MappingProxyType({32: 1024, 64: 1024})}),
        "bias": _PADDING_COSTS,
    }
)
MEASURED = CostRecord(CROSSOVERS_MEASURED_UP_TO, MappingProxyType({ANY_DTYPE: CROSSOVERS}), results=CROSSOVER_RESULTS)

WEBGPU_PROFILE = GpuProfile(
    ep="WebGPU",
    capabilities=CAPABILITIES,
    refusals=(
        # Proved causal or a window (fusion/causal), the fills are is_causal and the window: the
        # masked-mean guard of _general_guard covers the rows that then see no key.
        Refusal(
            lambda call: call.bias_after_mask and call.mask is not None,
            "bias_after_mask after a mask tensor (not proved causal or a window): the bias is added after "
            "the fills, which one additive bias does not express",
        ),
        Refusal(
            lambda call: call.softcap > 0,
            "softcap: MultiHeadAttention has none, and GroupQueryAttention's softcap is not in the WebGPU capability "
            "table",
        ),
    ),
    choose=choose_form,
    forms={
        FORM_GQA: GpuForm(OP_GQA, _gqa_causal, one_head_count=False),
        FORM_MHA_BIAS: GpuForm(OP_MHA, _multi_head_attention, one_head_count=True),
    },
    native_float16=False,  # float16 blocks computed in float32 between casts
)
