"""Per-adapter flash tiles: time the candidates once, keep the fastest in a cache file.

The cost model of tiles.py ranks tiles without running them, and TUNED_TILES holds what one H200
measured; neither knows another adapter or driver. ``tune`` times candidate tiles on the device
in hand and records the fastest under a ``TuneKey`` (adapter, driver, head dims, dtype); later
processes find it in the ``TileCache`` and never tune again for that key. A new adapter or a
driver update is a new key, so it is tuned afresh.

The cache is one JSON file (``ORTFLASH_CACHE_DIR`` or ``~/.cache/ortflash``), written whole to
a temporary file and renamed, so a reader never sees half of it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .tiles import FlashTile

CACHE_DIR_ENV = "ORTFLASH_CACHE_DIR"
CACHE_FILE = "wgpu_flash_tiles.json"
# Bumped when flash.wgsl changes so much that earlier measurements no longer rank its tiles.
KERNEL_VERSION = 3  # 3: heaviest-first causal order, red_tile freed with subgroups, resident timing


@dataclass(frozen=True)
class TuneKey:
    """What a tuned tile depends on: the adapter, its driver, the head dims and the dtype."""

    adapter: str
    driver: str
    d4: int
    dv4: int
    io: str  # 'f32' or 'f16'

    @classmethod
    def of(cls, info: Mapping[str, Any], d4: int, dv4: int, io: str) -> TuneKey:
        """The key for a runner's ``info`` (device, backend, driver) and one problem."""
        adapter = f"{info.get('device', '')} ({info.get('backend', '')})"
        return cls(adapter, str(info.get("driver", "")), d4, dv4, io)

    def text(self) -> str:
        """The key as the cache file spells it."""
        return f"v{KERNEL_VERSION}|{self.adapter}|{self.driver}|D4={self.d4}|DV4={self.dv4}|{self.io}"


@dataclass(frozen=True)
class TileCache:
    """The tiles tuned so far, in one JSON file: {key text: {"tile": {...}, "device_ms": ms}}."""

    path: Path

    @classmethod
    def default(cls) -> TileCache:
        """The cache in ORTFLASH_CACHE_DIR, else ~/.cache/ortflash."""
        folder = os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "ortflash"
        return cls(Path(folder) / CACHE_FILE)

    def _entries(self) -> dict[str, Any]:
        try:
            entries = json.loads(self.path.read_text())
        except (OSError, ValueError):  # no cache yet, or one cut short: tune again
            return {}
        return entries if isinstance(entries, dict) else {}

    def get(self, key: TuneKey) -> FlashTile | None:
        """The tile tuned for `key`, or None."""
        entry = self._entries().get(key.text())
        try:
            return FlashTile(**entry["tile"]) if entry else None
        except (TypeError, KeyError):  # written by another version of FlashTile
            return None

    def put(self, key: TuneKey, tile: FlashTile, device_ms: float) -> None:
        """Record `tile` for `key` (the file is replaced whole, atomically)."""
        entries = self._entries()
        entries[key.text()] = {"tile": asdict(tile), "device_ms": device_ms}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(entries, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def tune(
    key: TuneKey,
    candidates: Iterable[FlashTile],
    time_tile: Callable[[FlashTile], float | None],
    cache: TileCache,
) -> FlashTile:
    """The fastest of `candidates` for `key`: from the cache when it has one, else timed now.

    ``time_tile`` returns a tile's device milliseconds (None or an exception: the tile is
    skipped). RuntimeError when no candidate could be timed.
    """
    cached = cache.get(key)
    if cached is not None:
        return cached
    best: tuple[float, FlashTile] | None = None
    for tile in candidates:
        try:
            ms = time_tile(tile)
        except (RuntimeError, ValueError, MemoryError):  # a tile the device refuses: try the next
            continue
        if ms is not None and (best is None or ms < best[0]):
            best = (ms, tile)
    if best is None:
        raise RuntimeError(f"no candidate tile could be timed for {key.text()}")
    cache.put(key, best[1], best[0])
    return best[1]
