"""The host side of one attention call: the shapes checked, the operands laid out as the
shaders read them, and the uniform ``Params`` record of common.wgsl filled in."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .resident import DeviceTensor

# An operand: a numpy array, or a tensor already on the device (resident.py).
Operand = np.ndarray | DeviceTensor

# Uniform block layout; must match `struct Params` in common.wgsl.
PARAMS_DTYPE = np.dtype(
    [
        ("heads_q", "<u4"),
        ("group", "<u4"),
        ("seq_q", "<u4"),
        ("seq_k", "<u4"),
        ("flags", "<u4"),
        ("bh0", "<u4"),
        ("row0", "<u4"),
        ("rows", "<u4"),
        ("scale", "<f4"),
        ("softcap", "<f4"),
        ("mask_fill", "<f4"),
        ("neg_inf", "<f4"),
        ("empty_row", "<f4"),
        ("causal_row_shift", "<u4"),
        ("causal_key_shift", "<u4"),
        ("window_row_shift", "<u4"),
        ("window_key_shift", "<u4"),
        ("_pad", "<u4", (3,)),
        ("bias_stride", "<u4", (4,)),
        ("mask_stride", "<u4", (4,)),
    ]
)
assert PARAMS_DTYPE.itemsize == 112

# Bits of Params.flags; the same values as the FLAG_* constants of common.wgsl.
FLAG_BIAS, FLAG_MASK, FLAG_CAUSAL, FLAG_SOFTCAP, FLAG_SKIP_CAUSAL_TILES, FLAG_BIAS_AFTER_MASK = 1, 2, 4, 8, 16, 32
FLAG_HEAVY_FIRST = 64
FLAG_WINDOW, FLAG_SKIP_WINDOW_TILES = 128, 256


def shifts(offset: int) -> tuple[int, int]:
    """(row shift, key shift), both unsigned, with row shift - key shift = offset: the shader's
    tests ``key + key_shift > row + row_shift`` (right of j <= i + offset) and ``<`` (left of
    j >= i + offset) need no signed arithmetic."""
    return (offset, 0) if offset >= 0 else (0, -offset)


def causal_tiles_skippable(attrs: Mapping[str, Any], bias: np.ndarray | None) -> bool:
    """True when key tiles wholly right of the causal diagonal add exactly nothing.

    They do when the causal fill is -inf and nothing is added after it: with
    bias_after_mask=1 a bias is added to the fill, and -inf + (+inf or NaN) is
    NaN, which the reference propagates; a bias with neither (one pass over it)
    leaves -inf at -inf.
    """
    if attrs["mask_fill"] != -math.inf:
        return False
    if bias is None or not attrs.get("bias_after_mask", 0):
        return True
    return bool(np.all(np.asarray(bias) < np.inf))  # False for +inf and for NaN


@dataclass(frozen=True)
class Problem:
    """The shapes of one call: Q [B, Hq, Sq, D], K [B, Hkv, Sk, D], V [B, Hkv, Sk, Dv]."""

    batch: int
    heads_q: int
    heads_kv: int
    seq_q: int
    seq_k: int
    head_dim: int
    value_dim: int

    @classmethod
    def of(cls, q: Operand, k: Operand, v: Operand) -> Problem:
        """The problem of Q, K, V; ValueError when their shapes do not make one."""
        if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
            raise ValueError(f"FlashAttention wants 4D Q, K, V; got {q.shape}, {k.shape}, {v.shape}")
        b, hq, sq, d = q.shape
        hkv, sk = k.shape[1], k.shape[2]
        if k.shape[0] != b or v.shape[0] != b or v.shape[1] != hkv or v.shape[2] != sk or k.shape[3] != d:
            raise ValueError(f"Q, K, V shapes do not agree: {q.shape}, {k.shape}, {v.shape}")
        if hq % hkv:
            raise ValueError(f"query heads ({hq}) must be a multiple of kv heads ({hkv})")
        return cls(b, hq, hkv, sq, sk, d, v.shape[3])

    @property
    def d4(self) -> int:
        """The Q/K head dim in vec4s (padded up)."""
        return -(-self.head_dim // 4)

    @property
    def dv4(self) -> int:
        """The V/O head dim in vec4s (padded up)."""
        return -(-self.value_dim // 4)

    @property
    def heads(self) -> int:
        """(batch, query head) pairs: the axis the kernels' grids walk."""
        return self.batch * self.heads_q

    @property
    def is_empty(self) -> bool:
        """True when O has no rows to compute."""
        return self.seq_q == 0 or self.heads == 0


@dataclass(frozen=True)
class HostOperands:
    """The arrays to upload and the Params record of one call."""

    io: str  # which io_*.wgsl reads Q/K/V/O: 'f32' or 'f16'
    host_dtype: type[np.floating[Any]]  # the dtype of Q/K/V/O on the device
    q: Operand  # numpy arrays are laid out for upload; DeviceTensors are bound as they are
    k: Operand
    v: Operand
    bias: np.ndarray | None  # float32, broadcast dims kept at size 1
    mask: np.ndarray | None  # one uint8 per element, broadcast dims kept at size 1
    params: np.ndarray  # one PARAMS_DTYPE record; the planner sets bh0/row0/rows per dispatch


def prepare(
    problem: Problem,
    q: Operand,
    k: Operand,
    v: Operand,
    bias: np.ndarray | None,
    mask: np.ndarray | None,
    attrs: Mapping[str, Any],
    *,
    f16_on_device: bool,
    heavy_first: bool = True,
) -> HostOperands:
    """Lay out the operands of one call; attrs as spec.validate gives them.

    float16 stays float16 on the way in when the shader can read it
    (``f16_on_device``); otherwise the host widens it to float32. Operands
    already on the device fix the dtype: every DeviceTensor of a call has the
    same one, and numpy operands beside them are converted to it.

    heavy_first: where causal tiles are skipped, flash.wgsl runs the row tiles
    heaviest first (FLAG_HEAVY_FIRST); False keeps the grid order (for A/B timing).
    """
    resident = {np.dtype(t.dtype) for t in (q, k, v) if isinstance(t, DeviceTensor)}
    if len(resident) > 1:
        raise ValueError(f"the DeviceTensors of one call must share a dtype, got {sorted(map(str, resident))}")
    if resident:
        f16 = resident.pop() == np.float16
        if f16 and not f16_on_device:
            raise ValueError("a float16 DeviceTensor needs a device with shader-f16")
    else:
        f16 = f16_on_device and all(t.dtype == np.float16 for t in (q, k, v))
    host_dtype = np.float16 if f16 else np.float32
    qh, kh, vh = (
        t if isinstance(t, DeviceTensor) else _pad_last(np.asarray(t, host_dtype), 4 * n)
        for t, n in ((q, problem.d4), (k, problem.d4), (v, problem.dv4))
    )
    full_shape = (problem.batch, problem.heads_q, problem.seq_q, problem.seq_k)
    params = np.zeros(1, PARAMS_DTYPE)
    flags = 0
    bias_arr = mask_arr = None
    if bias is not None:
        bias_arr, params["bias_stride"] = _broadcast_operand(bias, full_shape, "bias")
        bias_arr = bias_arr.astype(np.float32, copy=False)
        flags |= FLAG_BIAS
    if mask is not None:
        mask_arr, params["mask_stride"] = _broadcast_operand(mask, full_shape, "mask")
        mask_arr = mask_arr.astype(bool, copy=False).astype(np.uint8)
        flags |= FLAG_MASK
    if attrs["is_causal"] not in (0, 1, 2):
        raise ValueError(f"is_causal must be 0, 1 or 2, got {attrs['is_causal']}")
    # spec.key_bounds: position p = i + (Sk - Sq under is_causal 2); keys j <= p under is_causal,
    # j <= p + window_right under a window without it (the causal test, moved), j >= p - window_left.
    position = problem.seq_k - problem.seq_q if attrs["is_causal"] == 2 else 0
    window_left, window_right = attrs.get("window_left", -1), attrs.get("window_right", -1)
    if attrs["is_causal"] or window_right >= 0:
        flags |= FLAG_CAUSAL
        if causal_tiles_skippable(attrs, bias):
            flags |= FLAG_SKIP_CAUSAL_TILES | (FLAG_HEAVY_FIRST if heavy_first else 0)
        right = position if attrs["is_causal"] else position + window_right
        params["causal_row_shift"], params["causal_key_shift"] = shifts(right)
    if window_left >= 0:
        flags |= FLAG_WINDOW
        if causal_tiles_skippable(attrs, bias):
            flags |= FLAG_SKIP_WINDOW_TILES
        params["window_row_shift"], params["window_key_shift"] = shifts(position - window_left)
    if attrs.get("bias_after_mask", 0):
        flags |= FLAG_BIAS_AFTER_MASK
    if attrs["softcap"] > 0:
        flags |= FLAG_SOFTCAP
    params["heads_q"] = problem.heads_q
    params["group"] = problem.heads_q // problem.heads_kv
    params["seq_q"] = problem.seq_q
    params["seq_k"] = problem.seq_k
    params["flags"] = flags
    params["scale"] = attrs["scale"]
    params["softcap"] = attrs["softcap"] or 1.0
    params["mask_fill"] = attrs["mask_fill"]
    params["neg_inf"] = -np.inf
    params["empty_row"] = 0.0 if attrs["masked_rows"] == "zero" else np.nan
    return HostOperands("f16" if f16 else "f32", host_dtype, qh, kh, vh, bias_arr, mask_arr, params)


def _pad_last(a: np.ndarray, n: int) -> np.ndarray:
    """a with its last axis zero-padded to n (dot products and outputs unchanged)."""
    if a.shape[-1] == n:
        return np.ascontiguousarray(a)
    pad = [(0, 0)] * (a.ndim - 1) + [(0, n - a.shape[-1])]
    return np.pad(a, pad)


def _broadcast_operand(t: np.ndarray, full_shape: tuple[int, ...], name: str) -> tuple[np.ndarray, list[int]]:
    """(contiguous array, per-dim element strides with 0 on broadcast dims) of a bias or mask."""
    t = np.asarray(t)
    if t.ndim > 4:
        raise ValueError(f"{name} has {t.ndim} dims; at most 4 (broadcastable to [B, Hq, Sq, Sk])")
    t = t.reshape((1,) * (4 - t.ndim) + t.shape)
    size: int
    for size, full, axis in zip(t.shape, full_shape, ("B", "Hq", "Sq", "Sk")):
        if size not in (1, full):
            raise ValueError(f"{name} shape {t.shape} does not broadcast to {full_shape} (axis {axis})")
    t = np.ascontiguousarray(t)
    contiguous = [int(np.prod(t.shape[i + 1 :])) for i in range(4)]
    strides = [0 if size == 1 else s for size, s in zip(t.shape, contiguous)]
    return t, strides
