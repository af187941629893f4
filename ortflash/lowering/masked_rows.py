"""The rows a block's bias masks fully, which the native ops do not compute as FlashAttention does
(onnxruntime's kernels give a finite row, or NaN, where FlashAttention gives the mean of V or
NaN: docs/flashattention-op.md), found in the graph and written out by Where: which values a
bias can hold (value_set), how the rows are found (by counts, MatMuls with a column of ones, or
by reductions over the keys), and the output written out there (write_out_masked_rows). One
place for every GPU lowering (cuda, webgpu): found by the keys, not by a ReduceMax of the bias,
which the CUDA EP leaves finite for a row of -inf."""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from ..graph import ir_utils as u
from ..graph.emitter import Emitter
from ..op.call import FlashAttentionCall
from ..op.spec import ABSORBING_FILL
from .gpu import float16_source
from .layout import SWAP_SH

_REDUCE_AXES_INPUT_OPSET = 18  # ReduceMax takes its axes as an input from here on


def reduce_keepdims(e: Emitter, op: str, x: ir.Value, axis: int = -1) -> ir.Value:
    """op (ReduceMax, ReduceMin, ReduceMean) over one axis, keepdims, in the model's opset's form."""
    if e.opset >= _REDUCE_AXES_INPUT_OPSET:
        return e.node(op, [x, e.i64([axis])], keepdims=1)
    return e.node(op, [x], axes=[axis], keepdims=1)


def _front_perms(rank: int, axis: int) -> tuple[list[int], list[int]]:
    """(perm moving axis to the front, perm moving it back)."""
    front = [axis] + [i for i in range(rank) if i != axis]
    return front, [front.index(i) for i in range(rank)]


def reduce_outer_first(e: Emitter, op: str, x: ir.Value, axis: int = -1) -> ir.Value:
    """reduce_keepdims, with the reduced axis moved to the front first and back after (two Transposes).

    On ONNX Runtime's CUDA EP a reduction whose output has more than one element and whose reduced
    axis is not the outermost runs cuDNN's generic reduce kernel, 95-360 µs on the padding block's
    [2, 1, 1, 4096] bias or [2, 4096, 1024] V at batch 2 (0.59 of the lowered block's 1.58 ms GPU
    time), against under 11 µs at batch 1 (benchmarks/results/cuda_cudnn_cache.md)."""
    rank = u.rank(x)
    if rank is None or rank < 2:
        return reduce_keepdims(e, op, x, axis)
    front, back = _front_perms(rank, axis % rank)
    return e.transpose(reduce_keepdims(e, op, e.transpose(x, front), axis=0), back)


def key_dead_rows(e: Emitter, bias: ir.Value, outer_first: bool = False) -> ir.Value:
    """bool, bias's last axis reduced (keepdims): the row has no key above -inf. Found by its keys,
    not by ReduceMax(bias) == -inf: the CUDA EP's ReduceMax gives float32's lowest for a row of
    -inf (onnxruntime issue 32256; what made --target onnx wrong on 4 held-out exports, a1a40cd).
    outer_first: reduced as reduce_outer_first does (the keys' axis moved to the front first)."""
    rank = u.rank(bias)
    front_back = _front_perms(rank, rank - 1) if outer_first and rank is not None and rank >= 2 else None
    x = e.transpose(bias, front_back[0]) if front_back else bias
    alive = e.node("Cast", [e.node("Greater", [x, e.f32(-math.inf)])], to=ir.DataType.FLOAT)
    if front_back:
        top = e.transpose(reduce_keepdims(e, "ReduceMax", alive, axis=0), front_back[1])
    else:
        top = reduce_keepdims(e, "ReduceMax", alive)
    return e.node("Equal", [top, e.f32(0.0)])


def absorbing_rows(e: Emitter, row_max: ir.Value, row_min: ir.Value) -> ir.Value:
    """bool: the bias row is one finite value at or below ABSORBING_FILL everywhere (float32-lowest,
    what transformers writes), where FlashAttention's row is the mean of V."""
    return e.node(
        "And",
        [
            e.node("Equal", [row_max, row_min]),
            e.node(
                "And",
                [
                    e.node("LessOrEqual", [row_max, e.f32(ABSORBING_FILL)]),
                    e.node("Greater", [row_max, e.f32(-math.inf)]),
                ],
            ),
        ],
    )


def keys_above(e: Emitter, x: ir.Value, floor: float) -> ir.Value:
    """float32 [.., 1]: how many keys of each row of x (keys last, any rank) are above floor, as a
    MatMul with a column of ones (not a ReduceSum: see rows_by_counts). Exact: the products
    are 0 or 1 (in TF32 too) and the sums whole numbers below 2**24."""
    above = e.node("Cast", [e.node("Greater", [x, e.f32(floor)])], to=ir.DataType.FLOAT)
    return e.node("MatMul", [above, _ones(e, x, column=True)])


def key_count(e: Emitter, x: ir.Value) -> ir.Value:
    """float32: x's last dim (its keys), a constant where static."""
    return e.cast(e.dim(x, -1, known=_static_dim(x, -1)), ir.DataType.FLOAT)


def mean_over_keys(e: Emitter, v3: ir.Value) -> ir.Value:
    """float32 V [B, Sk, W] -> [B, 1, W], its mean over the keys, as a MatMul with a row of ones
    divided by Sk (not a ReduceMean: see rows_by_counts)."""
    total = e.node("MatMul", [_ones(e, v3, column=False), v3])
    return e.node("Div", [total, e.cast(e.dim(v3, 1, known=_static_dim(v3, 1)), ir.DataType.FLOAT)])


def _ones(e: Emitter, x: ir.Value, column: bool) -> ir.Value:
    """float32 ones [Sk, 1] (column; Sk x's last dim) or [1, Sk] (Sk x's dim 1)."""
    axis = -1 if column else 1
    known = _static_dim(x, axis)
    if known is not None:
        return e.const(np.ones((known, 1) if column else (1, known), np.float32))
    size = e.dim(x, axis)
    dims = [size, e.i64([1])] if column else [e.i64([1]), size]
    return e.node("Expand", [e.const(np.ones((1, 1), np.float32)), e.node("Concat", dims, axis=0)])


def _static_dim(x: ir.Value, axis: int) -> int | None:
    shape = u.value_shape(x)
    if shape is None or not -len(shape) <= axis < len(shape):
        return None
    dim = shape[axis]
    return dim if isinstance(dim, int) else None


# A block's fully masked rows, as write_out_masked_rows takes them: (uniform, mean_v, dead), each
# None where no such row can be.
MaskedRows = tuple["ir.Value | None", "ir.Value | None", "ir.Value | None"]


def write_out_masked_rows(
    e: Emitter,
    call: FlashAttentionCall,
    out: ir.Value,
    rows: MaskedRows,
    heads: int,
    why: str = "",
) -> tuple[ir.Value, str]:
    """out [B, Sq, H·Dv] with its fully masked rows written out, and the note's words.

    rows: (uniform, mean_v, dead) [.., Sq, H|1, ..]: where uniform (the row is one value at or below
    ABSORBING_FILL) the row is mean_v; where dead (no key above -inf, key_dead_rows; None: no row
    can be) it is NaN, or 0 where the block asks for zeros (masked_rows "zero")."""
    uniform, mean_v, dead = rows
    out4 = e.reshape(out, [0, 0, heads, -1])
    written = []
    if uniform is not None and mean_v is not None:
        out4 = e.node("Where", [uniform, mean_v, out4])
        written.append("one value <= -2**127 everywhere -> mean of V by Where")
    if dead is not None:
        zero = call.masked_rows == "zero"
        out4 = e.node("Where", [dead, e.f32(0.0 if zero else math.nan), out4])
        written.append(f"-inf everywhere (found by its keys) -> {'0 (masked_rows zero)' if zero else 'NaN'} by Where")
    guard = "fully masked rows written out: " + ", ".join(written)
    return e.reshape(out4, [0, 0, -1]), guard + (f" ({why})" if why else "")


# ------------------------------------------------------------------------------------------------
# What a bias can hold, for the guards of fully masked rows (lowering/webgpu.py)

_VALUE_SET_LIMIT = 16  # distinct values followed through arithmetic; more: not known
_SAME_VALUES = ("Identity", "Reshape", "Expand", "Unsqueeze", "Squeeze", "Transpose", "Flatten", "Slice", "Tile")


def value_set(x: ir.Value | None, depth: int = 12) -> frozenset[float] | None:
    """A finite superset of the float values x's elements can take, where the graph fixes one: a
    constant's values, Where of two such, a bool Cast to a number ({0, 1}), the shape and copy
    ops (their output holds some of their input's values) and elementwise arithmetic of two
    known sets; None where not known, or where a NaN could arise (no guard is then left out)."""
    if x is None or depth == 0:
        return None
    found = u.const_array(x)
    if found is not None:
        values = np.unique(np.asarray(found, np.float64))
        return _finite_set(values) if values.size <= _VALUE_SET_LIMIT else None
    node = x.producer()
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    op = node.op_type
    if op == "Cast":
        src = u.operand(node, 0)
        to = ir.DataType(u.attr_int(node, "to", 0))
        inner = frozenset({0.0, 1.0}) if src.dtype == ir.DataType.BOOL else value_set(src, depth - 1)
        if inner is None or not to.is_floating_point():
            return None
        return _finite_set(np.asarray(sorted(inner), np.float64).astype(to.numpy()).astype(np.float64))
    if op == "Where":
        a, b = value_set(node.inputs[1], depth - 1), value_set(node.inputs[2], depth - 1)
        return None if a is None or b is None else _finite_set(np.asarray(sorted(a | b)))
    if op in _SAME_VALUES or op == "Gather":
        return value_set(node.inputs[0], depth - 1)
    if op == "Concat":
        parts = [value_set(v, depth - 1) for v in node.inputs]
        if any(p is None for p in parts):
            return None
        return _finite_set(np.asarray(sorted(frozenset().union(*parts))))  # type: ignore[arg-type]
    if op in ("Add", "Sub", "Mul") and len(node.inputs) == 2:
        a, b = value_set(node.inputs[0], depth - 1), value_set(node.inputs[1], depth - 1)
        if a is None or b is None or len(a) * len(b) > _VALUE_SET_LIMIT:
            return None
        dtype = (x.dtype or ir.DataType.FLOAT).numpy()
        fa, fb = np.asarray(sorted(a), dtype), np.asarray(sorted(b), dtype)
        with np.errstate(all="ignore"):
            fn = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}[op]
            out = fn(fa[:, None], fb[None, :]).astype(np.float64)
        return _finite_set(out)
    return None


def _finite_set(values: np.ndarray) -> frozenset[float] | None:
    """values as a set, None where one is NaN (or +inf: a score no fill absorbs)."""
    flat = np.asarray(values, np.float64).reshape(-1)
    if np.isnan(flat).any() or np.isposinf(flat).any() or np.unique(flat).size > _VALUE_SET_LIMIT:
        return None
    return frozenset(float(v) for v in flat)


def bias_value_set(call: FlashAttentionCall, fold_causal: bool = True) -> frozenset[float] | None:
    """The values additive_bias's tensor can hold (the bias as float32 where kept, mask_fill where
    masked out), or None where not known (and for bias_after_mask, whose sums it does not follow)."""
    if call.bias_after_mask:
        return None
    masks = call.mask is not None or (
        fold_causal and (call.is_causal != 0 or call.window_left >= 0 or call.window_right >= 0)
    )
    kept: frozenset[float] | None = frozenset({0.0})
    if call.bias is not None:
        found = value_set(call.bias)
        kept = None if found is None else _finite_set(np.asarray(sorted(found), np.float32).astype(np.float64))
    if kept is None:
        return None
    return kept | {float(np.float32(call.mask_fill))} if masks else kept


def dead_values(values: frozenset[float]) -> frozenset[float]:
    """The values of a bias at which a score is absorbed (at or below ABSORBING_FILL, -inf too): a
    row of only these sees no key."""
    return frozenset(v for v in values if v <= ABSORBING_FILL)


def per_row(e: Emitter, x: ir.Value) -> ir.Value:
    """[B|1, H|1, Sq|1, 1] (or lower rank) -> [B|1, Sq|1, H|1, 1], as out's rows are laid out."""
    return e.transpose(e.node("Expand", [x, e.i64([1, 1, 1, 1])]), SWAP_SH)


def absorbing_values(call: FlashAttentionCall, values: frozenset[float] | None) -> frozenset[float] | None:
    """The values at or below -2**127 (-inf too) the guard's float32 bias can hold, or None where
    not known: from the bias's value set (bias_value_set), else, for a bias that is a
    float16 tensor cast to float32 (no finite float16 is that low), -inf and the fill where the
    call masks or folds causality in."""
    if values is not None:
        return dead_values(values)
    if call.bias is None or call.bias_after_mask or float16_source(call.bias) is None:
        return None
    fill = float(np.float32(call.mask_fill))
    masks = call.mask is not None or call.is_causal != 0 or call.window_left >= 0 or call.window_right >= 0
    return frozenset({-math.inf} | ({fill} if masks and fill <= ABSORBING_FILL else set()))


def rows_by_counts(
    e: Emitter, bias: ir.Value, absorbing: frozenset[float] | None, v3: ir.Value, hq: int, half: bool
) -> MaskedRows | None:
    """The masked rows found by counting keys with MatMuls, where the values at or below -2**127
    the bias can hold (absorbing_values) let counts decide (else None: rows_by_reductions). On
    the CUDA EP a reduction over the keys whose output has more than one element runs cuDNN's
    generic reduce kernel: the guard's ReduceMax, ReduceMin and ReduceMean took 440 us of the
    padding block's 690 us GPU time at batch 2, S = 2048, against 144 us for the attention kernel
    (benchmarks/results/cuda_padding_batch.md); a MatMul with a column of ones is cuBLAS's GEMV.

    With at most one finite such value f (transformers' float32-lowest; a bool mask's fill is
    -inf, a float16 bias has none):
    - a row is dead (no key above -inf) where no key is above -inf;
    - a row is f everywhere where no key is above -2**127 and none is -inf (every value at or
      below -2**127 but -inf is f), and is then the mean of V: a MatMul too for float16 blocks
      (V cast from float16 is exact in TF32, the EP's default for float32 products), a ReduceMean
      for float32 ones (which TF32 would round);
    - a row of f and -inf only is neither, as the reductions find it (its max is not its min).
    Two such values or an unknown set are left to the reductions."""
    if absorbing is None:
        return None
    finite = {v for v in absorbing if v > -math.inf}
    if len(finite) > 1:
        return None
    alive = keys_above(e, bias, -math.inf) if -math.inf in absorbing else None
    dead = per_row(e, e.node("Equal", [alive, e.f32(0.0)])) if alive is not None else None
    if not finite:
        return None, None, dead
    uniform = e.node("Equal", [keys_above(e, bias, ABSORBING_FILL), e.f32(0.0)])
    if alive is not None:  # and no key -inf
        uniform = e.node("And", [uniform, e.node("Equal", [alive, key_count(e, bias)])])
    mean_v = mean_of_v(e, v3, hq, half, by_matmul=half, outer_first=True)
    return per_row(e, uniform), mean_v, dead


def rows_by_reductions(
    e: Emitter,
    bias: ir.Value,
    values: frozenset[float] | None,
    v3: ir.Value,
    hq: int,
    half: bool,
    outer_first: bool,
) -> MaskedRows:
    """The masked rows found by ReduceMax, ReduceMin and ReduceMean over the keys (any bias);
    outer_first: each reduced with the keys' axis moved to the front (reduce_outer_first)."""
    reduce = reduce_outer_first if outer_first else reduce_keepdims
    row_max, row_min = (per_row(e, reduce(e, op, bias)) for op in ("ReduceMax", "ReduceMin"))
    uniform = absorbing_rows(e, row_max, row_min)
    can_die = values is None or -math.inf in values
    dead = per_row(e, key_dead_rows(e, bias, outer_first)) if can_die else None
    return uniform, mean_of_v(e, v3, hq, half, by_matmul=False, outer_first=outer_first), dead


def mean_of_v(e: Emitter, v3: ir.Value, hq: int, half: bool, by_matmul: bool, outer_first: bool) -> ir.Value:
    """V [B, Sk, Hq·Dv]'s mean over the keys, float32 [B, 1, Hq, Dv]: a MatMul with a row of ones
    (mean_over_keys), or a ReduceMean (outer_first: of V's Transpose, cast to float32 after
    it: half the bytes moved)."""
    if by_matmul and u.rank(v3) == 3:
        v_keys = mean_over_keys(e, e.cast(v3, ir.DataType.FLOAT))
    elif outer_first and u.rank(v3) == 3:
        v_front = e.transpose(v3, [1, 0, 2])
        v_front = e.cast(v_front, ir.DataType.FLOAT) if half else v_front
        v_keys = e.transpose(reduce_keepdims(e, "ReduceMean", v_front, axis=0), [1, 0, 2])
    else:
        v_keys = reduce_keepdims(e, "ReduceMean", e.cast(v3, ir.DataType.FLOAT) if half else v3, axis=1)
    return e.reshape(v_keys, [0, 0, hq, -1])
