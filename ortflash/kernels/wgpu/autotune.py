"""Time candidate flash tiles on a Runner's device and keep the fastest (tuner.py's cache).

The tensors are uploaded once and stay on the device: each timed call is the kernel with no
host copies around it, and the GPU stays loaded from one call to the next (an idle GPU clocks
down). The runner is read through ``ResidentRunner``, the calls it needs, so this module does
not import the one that drives it (device.py's ``Runner.tune_flash``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from .resident import DeviceTensor
from .tiles import FlashTile
from .tuner import TileCache, TuneKey, tune

# Timed calls per candidate tile (after two warm-up calls); the median counts.
TUNE_REPS = 3


class ResidentRunner(Protocol):
    """What timing a tile needs of a runner: resident tensors, a resident call, the device time."""

    last_device_ms: float | None

    def to_device(self, array: np.ndarray) -> DeviceTensor: ...

    def empty_tensor(self, shape: tuple[int, int, int, int], dtype: np.dtype[Any]) -> DeviceTensor: ...

    def attention_resident(
        self,
        q: DeviceTensor,
        k: DeviceTensor,
        v: DeviceTensor,
        *,
        attrs: Mapping[str, Any],
        kernel: str,
        tile: FlashTile | None,
        out: DeviceTensor | None,
    ) -> DeviceTensor: ...

    def sync(self) -> float | None: ...


def tune_on_device(
    runner: ResidentRunner,
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
    from ...op import spec

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
