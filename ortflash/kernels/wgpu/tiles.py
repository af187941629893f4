"""The work split of flash.wgsl: the tile model, the space of tiles tried, the cost model that
ranks them, and the tiles measured best on real hardware.

The numbers here come from the H200 sweep (``benchmarks/gpu_attention.py --sweep``, results in
``benchmarks/results/gpu_sweep_nvidia-h200*.json`` and ``gpu_attention_nvidia-h200*.md``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from .limits import DeviceLimits


@dataclass(frozen=True)
class FlashTile:
    """Work split of flash.wgsl (see the comment at its top)."""

    br: int  # query rows per workgroup
    bc: int  # keys per tile
    c: int  # invocations per row group
    rv: int  # vec4 row blocks per invocation (4*rv rows)
    vpt: int  # vec4 output columns per invocation
    kv_split: int = 0  # 1: K and V tiles in separate workgroup memory, staged together (flash.wgsl's KVS)

    @property
    def workgroup_size(self) -> int:
        return self.br // (4 * self.rv) * self.c

    @property
    def keys_per_invocation(self) -> int:
        """Keys one invocation scores per tile (flash.wgsl's KPT)."""
        return self.bc // self.c

    def kv_vec4s(self, d4: int) -> tuple[int, int]:
        """(vec4s of flash.wgsl's kv_tile, where its V tile starts) at a Q/K head dim of d4 vec4s."""
        k_tile, v_tile = self.bc * (d4 + 1), self.bc * self.vpt * self.c
        return (k_tile + v_tile, k_tile) if self.kv_split else (max(k_tile, v_tile), 0)

    def reduction_vec4s(self, subgroup_size: int = 0) -> int:
        """vec4s of flash.wgsl's red_tile: one per (lane of a row group, row block), or 1 (unused)
        when the rows are reduced by subgroup shuffles."""
        return 1 if self.uses_subgroups(subgroup_size) else self.c * self.br // 4

    def smem_bytes(self, d4: int, subgroup_size: int = 0) -> int:
        """Bytes of workgroup storage flash.wgsl declares for this tile at a Q/K head dim of d4 vec4s,
        on a device whose subgroups have subgroup_size lanes (0: none; the conservative figure)."""
        kv, _ = self.kv_vec4s(d4)
        return 16 * (d4 * self.br + kv + self.bc * (self.br // 4 + 1) + self.reduction_vec4s(subgroup_size))

    def registers(self) -> int:
        """float32 values an invocation keeps live in the inner loops (estimate)."""
        return 4 * (self.keys_per_invocation * self.rv + 4 * self.rv * self.vpt + 4 * self.rv + 2 * self.rv)

    def uses_subgroups(self, subgroup_size: int) -> bool:
        """True when a device whose subgroups have subgroup_size lanes (0: none) can reduce this
        tile's rows by shuffles: a row group's C lanes, C a power of two, fit in one subgroup."""
        return subgroup_size > 0 and self.c <= subgroup_size and self.c & (self.c - 1) == 0

    def constants(self, d4: int, dv4: int, subgroup_size: int = 0) -> dict[str, int]:
        """The specialisation constants of flash.wgsl for this tile, head dims of d4 and dv4 vec4s
        and a device whose subgroups have subgroup_size lanes (0: no subgroup operations)."""
        kv_size, v_off = self.kv_vec4s(d4)
        return {
            "D4": d4,
            "DV4": dv4,
            "BR": self.br,
            "BC": self.bc,
            "C": self.c,
            "RV": self.rv,
            "VPT": self.vpt,
            "KPT": self.keys_per_invocation,
            "SG": int(self.uses_subgroups(subgroup_size)),
            "KVS": int(bool(self.kv_split)),
            "KV_SIZE": kv_size,
            "V_OFF": v_off,
            "RED_SIZE": self.reduction_vec4s(subgroup_size),
        }


# --------------------------------------------------------------------------- the space of tiles

# The values of each tile parameter that flash_tiles tries.
ROW_BLOCKS = (1, 2)
ROW_GROUP_SIZES = (2, 4, 8, 16, 32)
KEYS_PER_INVOCATION = (1, 2, 4, 8)
# 48 and 96: 1.5x the rows of 32 and 64 where those leave workgroup storage unused (D=128: 48
# rows x 32 keys fits 48 KiB, 64 rows do not).
ROWS_PER_WORKGROUP = (4, 8, 16, 32, 48, 64, 96, 128)
# Output vec4s one invocation may accumulate; a head dim needing more per
# invocation takes a larger row group instead.
MAX_OUTPUT_VEC4S = 8
# Invocations per workgroup, at most: WebGPU's default limit, and the largest
# the sweep timed (adapters may allow 1024).
MAX_WORKGROUP_SIZE = 256
# The largest registers() estimate worth compiling: one row block with 8
# output vec4s and 4 keys per invocation, 4 * (4 + 32 + 6) = 168. Larger
# register tiles ran 1.5-4x slower in the H200 sweep.
MAX_LIVE_FLOATS = 168


@dataclass(frozen=True)
class TileScoreWeights:
    """The factors of the cost model, each a penalty for a shape the H200 sweep found slow.

    Hand-set to reproduce the sweep's ranking: one row block per invocation
    (rv=1), 2-4 keys and at most 4 output vec4s per invocation, 64 rows and
    16-32 keys per tile ran fastest; rv=2 and vpt=8 (more live registers per
    invocation) ran 1.5-4x slower, and fewer than 4 invocations per row group
    starved the score phase.
    """

    # Reuse of each staged K/V row grows with the rows of a tile, and of each
    # Q row with its keys, up to these sizes; past them more is no better.
    reuse_rows_cap: int = 128
    reuse_keys_cap: int = 32
    two_row_blocks: float = 0.6  # rv > 1
    eight_output_vec4s: float = 0.4  # vpt >= 8
    over_four_output_vec4s: float = 0.8  # 4 < vpt < 8
    small_row_group: float = 0.5  # c < small_row_group_below
    small_row_group_below: int = 4
    keys_per_invocation_not_2_or_4: float = 0.7
    small_workgroup: float = 0.7  # workgroup_size < small_workgroup_below
    small_workgroup_below: int = 64
    not_best_rows: float = 0.95  # br != best_rows
    best_rows: int = 64


def _tile_score(tile: FlashTile, dv4: int, sq: int, weights: TileScoreWeights) -> float:
    """Rank of a tile (higher is better)."""
    score = float(min(tile.br, weights.reuse_rows_cap) * min(tile.bc, weights.reuse_keys_cap))
    score *= weights.two_row_blocks if tile.rv > 1 else 1.0
    if tile.vpt >= 8:
        score *= weights.eight_output_vec4s
    elif tile.vpt > 4:
        score *= weights.over_four_output_vec4s
    score *= weights.small_row_group if tile.c < weights.small_row_group_below else 1.0
    score *= 1.0 if tile.keys_per_invocation in (2, 4) else weights.keys_per_invocation_not_2_or_4
    score *= weights.small_workgroup if tile.workgroup_size < weights.small_workgroup_below else 1.0
    score *= 1.0 if tile.br == weights.best_rows else weights.not_best_rows
    score *= min(tile.br, max(sq, 1)) / tile.br  # rows past Sq are wasted
    score *= dv4 / (tile.vpt * tile.c)  # output columns past Dv are wasted
    return score


def flash_tiles(
    d4: int,
    dv4: int,
    sq: int,
    smem_limit: int,
    max_invocations: int,
    max_registers: int = MAX_LIVE_FLOATS,
    subgroup_size: int = 0,
) -> list[FlashTile]:
    """Every tile that fits the adapter (subgroups of subgroup_size lanes, 0: none), best first
    by the cost model."""
    fitting = []
    rows_needed = max(4, 1 << max(0, math.ceil(math.log2(max(sq, 1)))))
    for rv in ROW_BLOCKS:
        for c in ROW_GROUP_SIZES:
            vpt = math.ceil(dv4 / c)
            if vpt > MAX_OUTPUT_VEC4S:
                continue
            for kpt in KEYS_PER_INVOCATION:
                for br in ROWS_PER_WORKGROUP:
                    if br % (4 * rv) or br > max(4 * rv, rows_needed):
                        continue
                    tile = FlashTile(br, c * kpt, c, rv, vpt)
                    if tile.workgroup_size > min(MAX_WORKGROUP_SIZE, max_invocations):
                        continue
                    if tile.registers() > max_registers or tile.smem_bytes(d4, subgroup_size) > smem_limit:
                        continue
                    fitting.append(tile)
    weights = TileScoreWeights()
    return sorted(fitting, key=lambda tile: -_tile_score(tile, dv4, sq, weights))


# Tiles measured best on an adapter with 48 KiB of workgroup storage (H200, 2026-11-30:
# benchmarks/results/gpu_sweep_nvidia-h200*.json, with subgroup reductions and trusted
# shaders), by (D4, DV4, io); a tuner cache entry (tuner.py) for the adapter wins over them.
# Used when they fit the adapter and Sq fills them; else the ranking above. 16 lanes per row
# group: one vec4 output column each at D=64.
TUNED_TILES: Mapping[tuple[int, int, str], FlashTile] = MappingProxyType(
    {
        (16, 16, "f32"): FlashTile(br=64, bc=32, c=16, rv=1, vpt=1),
        (16, 16, "f16"): FlashTile(br=64, bc=32, c=16, rv=1, vpt=1),
        # D=128: 64 rows x 16 keys, 8 lanes a row group (4 output vec4s each), 45.5 KiB with
        # subgroup reductions. 13:14 sweep: f32 8.04 ms, f16 7.89, against 9.73 for the former
        # 32 x 32 x 16 (the 08:05 sweep timed it at 20.3 ms, with red_tile still declared and
        # numpy-fed calls; which of the two made the difference was not isolated).
        (32, 32, "f32"): FlashTile(br=64, bc=16, c=8, rv=1, vpt=4),
        (32, 32, "f16"): FlashTile(br=64, bc=16, c=8, rv=1, vpt=4),
    }
)


def choose_flash_tile(d4: int, dv4: int, sq: int, io: str, limits: DeviceLimits, subgroup_size: int = 0) -> FlashTile:
    """The tile to run for head dims of d4/dv4 vec4s, Sq query rows and io ('f32' or 'f16') on a
    device whose subgroups have subgroup_size lanes (0: none)."""
    smem, invocations = limits.workgroup_storage_bytes, limits.invocations_per_workgroup
    tuned = TUNED_TILES.get((d4, dv4, io))
    if (
        tuned is not None
        and sq >= tuned.br
        and tuned.smem_bytes(d4, subgroup_size) <= smem
        and tuned.workgroup_size <= invocations
    ):
        return tuned
    tiles = flash_tiles(d4, dv4, sq, smem, invocations, subgroup_size=subgroup_size)
    if not tiles:
        raise RuntimeError(f"no flash tile fits this adapter for head dims {4 * d4}/{4 * dv4}")
    return tiles[0]
