"""numpy kernels for FlashAttention: naive (whole score row) and online (key tiles).

Both follow ortflash.spec exactly and accumulate in float32 whatever the input
dtype; the output has Q's dtype. Q is [B, Hq, Sq, D], K [B, Hkv, Sk, D],
V [B, Hkv, Sk, Dv]; query heads are grouped over kv heads (Hq = G * Hkv) by a
reshape, so K and V are never repeated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..op import spec
from ..op.policy import SoftmaxPolicy

ACC = np.float32


Array = np.ndarray
Attrs = dict[str, Any]


def _grouped(
    q: Array, k: Array, v: Array, bias: Array | None, mask: Array | None
) -> tuple[Array, Array, Array, Array | None, Array | None, tuple[int, int, int, int]]:
    """Reshape to [B, Hkv, G, ...] so one K/V head serves its G query heads."""
    if k.ndim != 4 or v.ndim != 4 or q.ndim != 4:
        raise ValueError(f"FlashAttention wants 4D Q, K, V; got {q.shape}, {k.shape}, {v.shape}")
    b, hq, sq, _ = q.shape
    hkv = k.shape[1]
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of kv heads ({hkv})")
    g = hq // hkv
    sk = k.shape[2]
    qg = q.astype(ACC).reshape(b, hkv, g, sq, q.shape[3])
    kg = k.astype(ACC)[:, :, None]  # [B, Hkv, 1, Sk, D]
    vg = v.astype(ACC)[:, :, None]

    def group(t: Array | None, dtype: type, name: str) -> Array | None:
        if t is None:
            return None
        arr = np.asarray(t)
        if arr.ndim > 4:
            raise ValueError(f"FlashAttention's {name} has {arr.ndim} dims; it broadcasts to [B, Hq, Sq, Sk] (4)")
        shape: tuple[int, ...] = (1,) * (4 - arr.ndim) + tuple(arr.shape)
        if shape[3] not in (1, sk):
            # else a key tile of it is short or empty, and the output NaN, not an error (its batch and
            # query axes may be ones the scores broadcast over, as the graph's own Add did)
            raise ValueError(
                f"FlashAttention's {name} of shape {list(arr.shape)} does not broadcast to the scores' {sk} keys"
            )
        arr = arr.reshape(shape)
        full = np.broadcast_to(arr, (shape[0], hq if shape[1] != 1 else 1, shape[2], shape[3]))
        if full.shape[1] == 1:
            return full[:, :, None].astype(dtype, copy=False)  # [B|1, 1, 1, Sq|1, Sk|1]
        return full.reshape(full.shape[0], hkv, g, full.shape[2], full.shape[3]).astype(dtype, copy=False)

    return qg, kg, vg, group(bias, ACC, "bias"), group(mask, bool, "mask"), (b, hq, sq, sk)


def _scores(qg: Array, kt: Array, bias: Array | None, mask: Array | None, key_offset: int, attrs: Attrs) -> Array:
    """Scaled, capped, biased and masked scores of the keys [key_offset, key_offset + kt.shape[-2]).

    ``attrs["key_bounds"]`` (set by flash_attention: spec.key_bounds) are the first and last key
    each query row sees by is_causal and the window. Computed in place on the one fresh array the matmul returns
    (the tile is the only score-sized allocation)."""
    s = np.matmul(qg, np.swapaxes(kt, -1, -2))
    s *= ACC(attrs["scale"])
    if attrs["softcap"] > 0:
        cap = ACC(attrs["softcap"])
        s /= cap
        np.tanh(s, out=s)
        s *= cap
    stop = key_offset + kt.shape[-2]
    if bias is not None and not attrs["bias_after_mask"]:
        s = _add_bias(s, bias, key_offset, stop)
    fill = ACC(attrs["mask_fill"])
    if mask is not None:
        keep = mask if mask.shape[-1] == 1 else mask[..., key_offset:stop]
        if np.broadcast_shapes(s.shape, keep.shape) != s.shape:
            s = np.broadcast_to(s, np.broadcast_shapes(s.shape, keep.shape)).copy()
        np.copyto(s, fill, where=~keep)
    if attrs["is_causal"] or spec.windowed(attrs):  # the causal and window fills: spec.key_bounds
        first, last = attrs["key_bounds"]
        cols = np.arange(key_offset, stop)[None, :]
        np.copyto(s, fill, where=(cols < first[:, None]) | (cols > last[:, None]))
    if bias is not None and attrs["bias_after_mask"]:
        s = _add_bias(s, bias, key_offset, stop)
    return s


def _add_bias(s: Array, bias: Array, key_offset: int, stop: int) -> Array:
    tile = bias if bias.shape[-1] == 1 else bias[..., key_offset:stop]
    with np.errstate(over="ignore"):  # after the mask, lowest fill + lowest bias is -inf, as in float32
        if np.broadcast_shapes(s.shape, tile.shape) != s.shape:
            return s + tile  # a bias with a dim the scores broadcast over (batch 1 scores, say)
        s += tile
    return s


def _naive(qg: Array, kg: Array, vg: Array, bias: Array | None, mask: Array | None, attrs: Attrs) -> Array:
    s = _scores(qg, kg, bias, mask, 0, attrs)
    with np.errstate(invalid="ignore", over="ignore"):
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
    if attrs["masked_rows"] == "zero":
        s[np.isnan(s)] = 0
    return np.matmul(s, vg)


def _online(qg: Array, kg: Array, vg: Array, bias: Array | None, mask: Array | None, attrs: Attrs) -> Array:
    sk = kg.shape[-2]
    block = attrs["block_size"]
    lead = np.broadcast_shapes(qg.shape[:-2], kg.shape[:-2])
    sq = qg.shape[-2]
    running_max = np.full(lead + (sq, 1), -np.inf, ACC)  # m: largest score seen so far per row
    running_sum = np.zeros(lead + (sq, 1), ACC)  # l: sum of exp(score - m) so far per row
    acc = np.zeros(lead + (sq, vg.shape[-1]), ACC)  # unnormalised output, in units of exp(-m)
    with np.errstate(invalid="ignore", over="ignore"):
        for start in range(0, sk, block):
            p = _scores(qg, kg[..., start : start + block, :], bias, mask, start, attrs)
            new_max = np.maximum(running_max, p.max(axis=-1, keepdims=True))
            # A row whose keys so far are all -inf keeps 0 as its reference, so
            # exp(-inf - ref) = 0 instead of NaN; a fully masked row ends with
            # running_sum 0 and yields 0/0 = NaN, as the naive softmax does.
            ref = np.where(np.isneginf(new_max), ACC(0), new_max)
            rescale = np.exp(running_max - ref)  # shrink what was summed under the old max
            p -= ref
            np.exp(p, out=p)
            running_sum *= rescale
            running_sum += p.sum(axis=-1, keepdims=True)
            acc *= rescale
            acc += np.matmul(p, vg[..., start : start + block, :])
            running_max = new_max
        out = acc / running_sum
    if attrs["masked_rows"] == "zero":
        out = np.where(running_sum == 0, ACC(0), out)
    return out


# numpy's elementwise work (exp, max, sums) runs on one core; heads are independent, so
# large naive calls split them over a few threads (ufuncs and BLAS release the GIL). The
# online kernel's small tile matmuls gained nothing from it on 2 cores (measured), so it
# stays on one thread.
_PARALLEL_MIN_SCORES = 1 << 22


def _over_heads(
    kernel: Callable[..., Array], qg: Array, kg: Array, vg: Array, bias: Array | None, mask: Array | None, attrs: Attrs
) -> Array:
    import concurrent.futures
    import os

    workers = min(os.cpu_count() or 1, 8)
    axis = 1 if qg.shape[1] >= qg.shape[2] else 2  # kv heads, or the query heads of one kv head
    parts = min(workers, qg.shape[axis])
    too_small = qg.shape[1] * qg.shape[2] * qg.shape[3] * kg.shape[3] < _PARALLEL_MIN_SCORES
    if kernel is not _naive or parts < 2 or too_small:
        return kernel(qg, kg, vg, bias, mask, attrs)
    bounds = np.linspace(0, qg.shape[axis], parts + 1).astype(int)

    def cut(t: Array | None, lo: int, hi: int) -> Array | None:
        if t is None or t.shape[axis] == 1:
            return t  # broadcast along this axis
        index = [slice(None)] * t.ndim
        index[axis] = slice(lo, hi)
        return t[tuple(index)]

    with concurrent.futures.ThreadPoolExecutor(parts) as pool:
        futures = [
            pool.submit(
                kernel, cut(qg, lo, hi), cut(kg, lo, hi), cut(vg, lo, hi), cut(bias, lo, hi), cut(mask, lo, hi), attrs
            )
            for lo, hi in zip(bounds[:-1], bounds[1:])
        ]
        outs = [f.result() for f in futures]
    # a part can come back broadcast-smaller (e.g. batch 1 scores); bring all to one shape first
    shape = np.broadcast_shapes(*[o.shape[:axis] + (1,) + o.shape[axis + 1 :] for o in outs])
    outs = [np.broadcast_to(o, shape[:axis] + (o.shape[axis],) + shape[axis + 1 :]) for o in outs]
    return np.concatenate(outs, axis=axis)


def no_keys_output(q: Array, k: Array, v: Array) -> Array | None:
    """O for a call without keys (Sk = 0): zeros of [B, Hq, Sq, Dv] (spec.py); None when there are keys."""
    if k.ndim != 4 or k.shape[2] != 0:
        return None
    return np.zeros((max(q.shape[0], k.shape[0], v.shape[0]), q.shape[1], q.shape[2], v.shape[3]), q.dtype)


def flash_attention(
    q: Array,
    k: Array,
    v: Array,
    bias: Array | None = None,
    mask: Array | None = None,
    *,
    policy: SoftmaxPolicy | None = None,
    **attrs: Any,
) -> Array:
    """Run FlashAttention on numpy arrays. ``attrs`` are spec attributes (scale, is_causal, ...).

    ``policy`` overrides the softmax/block_size/min_seq_len attributes; the mode it
    chooses for this key length decides the kernel.
    """
    attrs = spec.validate(attrs)
    empty = no_keys_output(q, k, v)
    if empty is not None:
        return empty
    policy = SoftmaxPolicy.for_node(attrs, policy)
    attrs["block_size"] = policy.block_size
    qg, kg, vg, bias_g, mask_g, (b, hq, sq, sk) = _grouped(q, k, v, bias, mask)
    attrs["key_bounds"] = spec.key_bounds(attrs, sq, sk)
    kernel = _online if policy.choose(sk) == "online" else _naive
    out = _over_heads(kernel, qg, kg, vg, bias_g, mask_g, attrs)
    out = np.broadcast_to(out, (b, k.shape[1], hq // k.shape[1], sq, v.shape[-1]))
    return out.reshape(b, hq, sq, v.shape[-1]).astype(q.dtype)
