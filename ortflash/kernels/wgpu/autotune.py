"""Time candidate flash tiles on a Runner's device and keep the fastest (tuner.py's cache).

The tensors are uploaded once and stay on the device: each timed call is the kernel with no
host copies around it, and the GPU stays loaded from one call to the next (an idle GPU clocks
down).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .tiles import FlashTile
from .tuner import TileCache, TuneKey, tune

if TYPE_CHECKING:
    from .runner import Runner

# Timed calls per candidate tile (after two warm-up calls); the median counts.
TUNE_REPS = 3


def tune_on_device(
    runner: Runner,
    key: TuneKey,
    candidates: Sequence[FlashTile],
    cache: TileCache,
    *,
    d: int,
    dv: int,
    seq: int,
    heads: int,
) -> FlashTile:
    """The fastest of `candidates` for `key`: from `cache` when it has one, else each timed on
    random [1, heads, seq, d] Q, K and [1, heads, seq, dv] V (key.io's dtype) resident on the
    runner's device."""
    from ... import spec

    dtype = np.float16 if key.io == "f16" else np.float32
    rng = np.random.default_rng(0)
    q, k = (runner.to_device(rng.standard_normal((1, heads, seq, d)).astype(dtype)) for _ in range(2))
    v = runner.to_device(rng.standard_normal((1, heads, seq, dv)).astype(dtype))
    out = runner.empty_tensor((1, heads, seq, dv), np.dtype(dtype))
    attrs = spec.validate({"scale": d**-0.5})

    def time_tile(tile: FlashTile) -> float | None:
        times = []
        for _ in range(2 + TUNE_REPS):  # the first two compile and warm up
            t0 = time.perf_counter()
            runner.attention_resident(q, k, v, attrs=attrs, kernel="flash", tile=tile, out=out)
            runner.sync()
            host_ms = (time.perf_counter() - t0) * 1e3
            times.append(runner.last_device_ms if runner.last_device_ms is not None else host_ms)
        return float(np.median(times[2:]))

    try:
        return tune(key, candidates, time_tile, cache)
    finally:
        for t in (q, k, v, out):
            t.destroy()
