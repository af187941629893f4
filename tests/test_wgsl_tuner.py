"""The flash tile tuner's cache: a hit skips tuning, a changed adapter or driver retunes."""

from __future__ import annotations

import numpy as np
import pytest

from ortflash.kernels.wgpu.tiles import FlashTile
from ortflash.kernels.wgpu.tuner import TileCache, TuneKey, tune

CANDIDATES = [FlashTile(64, 32, 16, 1, 1), FlashTile(32, 32, 8, 1, 2), FlashTile(64, 16, 4, 1, 4, kv_split=1)]
TIMES = {CANDIDATES[0]: 4.0, CANDIDATES[1]: 3.0, CANDIDATES[2]: 5.0}


def key(adapter: str = "NVIDIA H200 (Vulkan)", driver: str = "580.159.04") -> TuneKey:
    return TuneKey(adapter, driver, 16, 16, "f32")


class Timer:
    """A stand-in for timing tiles on a device: records which tiles were timed."""

    def __init__(self) -> None:
        self.timed: list[FlashTile] = []

    def __call__(self, tile: FlashTile) -> float:
        self.timed.append(tile)
        return TIMES[tile]


def test_tunes_once_then_hits_the_cache(tmp_path):
    cache = TileCache(tmp_path / "tiles.json")
    first = Timer()
    assert tune(key(), CANDIDATES, first, cache) == CANDIDATES[1]
    assert first.timed == CANDIDATES
    again = Timer()
    assert tune(key(), CANDIDATES, again, TileCache(tmp_path / "tiles.json")) == CANDIDATES[1]
    assert again.timed == []  # a hit, in a fresh cache object reading the same file


@pytest.mark.parametrize("changed", [{"adapter": "AMD Radeon (Vulkan)"}, {"driver": "590.1"}])
def test_changed_adapter_or_driver_retunes(tmp_path, changed):
    cache = TileCache(tmp_path / "tiles.json")
    tune(key(), CANDIDATES, Timer(), cache)
    other = Timer()
    tune(key(**changed), CANDIDATES, other, cache)
    assert other.timed == CANDIDATES
    assert cache.get(key()) == CANDIDATES[1] and cache.get(key(**changed)) == CANDIDATES[1]


def test_skips_failing_tiles_and_ignores_a_broken_cache(tmp_path):
    path = tmp_path / "tiles.json"
    path.write_text("{not json")
    cache = TileCache(path)
    assert cache.get(key()) is None

    def time_tile(tile: FlashTile) -> float | None:
        if tile == CANDIDATES[1]:
            raise RuntimeError("pipeline refused")
        return None if tile == CANDIDATES[2] else 7.0

    assert tune(key(), CANDIDATES, time_tile, cache) == CANDIDATES[0]
    with pytest.raises(RuntimeError):
        tune(key("other"), CANDIDATES[1:], time_tile, cache)


def test_runner_uses_and_writes_the_cache(tmp_path):
    from ortflash.kernels.reference import flash_attention
    from ortflash.kernels.wgpu import kernel as wk
    from ortflash.kernels.wgpu.device import Runner
    from ortflash.op import spec

    if not wk.available():
        pytest.skip(wk.unavailable_reason() or "no wgpu adapter")
    cache = TileCache(tmp_path / "tiles.json")
    runner = Runner(tile_cache=cache)
    chosen = FlashTile(32, 16, 4, 1, 4)
    cache.put(TuneKey.of(runner.info, 16, 16, "f32"), chosen, 1.0)
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 70, 64)).astype(np.float32) for _ in range(3))
    got = runner.attention(q, k, v, attrs=spec.validate({"scale": 0.125}), kernel="flash")
    assert runner.last_plan["tile"] == chosen
    assert np.abs(got - flash_attention(q, k, v, scale=0.125)).max() < 1e-4

    tuned = runner.tune_flash(32, 32, "f32", cache, seq=64, heads=1, top=1)
    assert cache.get(TuneKey.of(runner.info, 8, 8, "f32")) == tuned


def test_tuning_times_resident_tensors(tmp_path):
    """tune_flash times every candidate on tensors uploaded once (the kernel without host copies
    around it): no per-call Q/K/V upload, and the tile it returns runs correctly."""
    from ortflash.kernels.reference import flash_attention
    from ortflash.kernels.wgpu import kernel as wk
    from ortflash.kernels.wgpu.device import Runner
    from ortflash.op import spec

    if not wk.available():
        pytest.skip(wk.unavailable_reason() or "no wgpu adapter")
    runner = Runner()
    before = dict(runner.uploads)
    tuned = runner.tune_flash(64, 64, "f32", TileCache(tmp_path / "tiles.json"), seq=96, heads=1, top=2)
    assert {role: runner.uploads[role] for role in ("q", "k", "v")} == {r: before.get(r, 0) for r in ("q", "k", "v")}
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 2, 96, 64)).astype(np.float32) for _ in range(3))
    attrs = spec.validate({"scale": 0.125, "is_causal": 1})
    got = runner.attention(q, k, v, attrs=attrs, kernel="flash", tile=tuned)
    assert np.abs(got - flash_attention(q, k, v, scale=0.125, is_causal=1)).max() < 1e-4
