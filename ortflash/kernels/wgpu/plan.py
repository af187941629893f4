"""Dispatch planning: which pipelines one call runs, over which grids, with which parameters.

Pure functions of the problem, the operands' layout and the device's limits; nothing here
touches the device, so a plan is complete (including the size of the naive kernel's score
buffer) before any buffer is made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .assemble import NAIVE_SOFTMAX_WORKGROUP, NAIVE_TILE, naive_constants
from .limits import BindingTooLarge, DeviceLimits
from .params import Problem
from .tiles import FlashTile, choose_flash_tile

KERNELS = ("flash", "naive")
# A ceiling on the naive kernel's score buffer (2 GiB) whatever the adapter allows.
MAX_SCORE_BUFFER_BYTES = 1 << 31
# float32 scores: bytes per score in the naive kernel's buffer.
_SCORE_BYTES = 4

assert NAIVE_SOFTMAX_WORKGROUP & (NAIVE_SOFTMAX_WORKGROUP - 1) == 0, "softmax_pass reduces by halving"


@dataclass(frozen=True)
class Dispatch:
    """One dispatch of a compute pass: an entry point of the plan's kernel, its grid, its Params."""

    entry: str
    grid: tuple[int, int, int]
    params: np.ndarray  # one PARAMS_DTYPE record


@dataclass(frozen=True)
class Plan:
    """Everything one call runs, in order, and what it needs beyond the operands."""

    kernel: str  # 'flash' or 'naive': the .wgsl file
    io: str  # 'f32' or 'f16'
    constants: dict[str, int]  # the kernel's specialisation constants
    dispatches: list[Dispatch]
    score_bytes: int = 0  # size of the naive kernel's score buffer; 0 when there is none
    summary: dict[str, Any] = field(default_factory=dict)  # what ran, for Runner.last_plan


def check_kernel(kernel: str) -> None:
    """ValueError unless `kernel` names one of KERNELS."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be 'flash' or 'naive', got {kernel!r}")


def _split(total: int, per: int) -> list[tuple[int, int]]:
    """(start, count) pieces of range(total), `per` at a time."""
    return [(start, min(per, total - start)) for start in range(0, total, per)]


def _with_fields(params: np.ndarray, **values: int) -> np.ndarray:
    record = params.copy()
    for name, value in values.items():
        record[name] = value
    return record


def plan_flash(
    problem: Problem,
    io: str,
    params: np.ndarray,
    tile: FlashTile | None,
    limits: DeviceLimits,
    subgroup_size: int = 0,
) -> Plan:
    """flash.wgsl: one workgroup per tile of query rows of one (batch, head); `tile` overrides the choice.

    subgroup_size: lanes per subgroup of the device (0: no subgroup operations); row
    reductions use shuffles when a row group fits in one subgroup.
    """
    d4, dv4 = problem.d4, problem.dv4
    tile = tile or choose_flash_tile(d4, dv4, problem.seq_q, io, limits, subgroup_size)
    smem = tile.smem_bytes(d4, subgroup_size)
    if smem > limits.workgroup_storage_bytes:
        raise ValueError(f"{tile} needs {smem} bytes of workgroup storage")
    row_tiles = -(-problem.seq_q // tile.br)
    # flash.wgsl numbers the workgroups of a dispatch linearly (causal order) in a u32.
    heads_per_dispatch = max(1, min(limits.workgroups_per_dimension, (2**32 - 1) // row_tiles))
    dispatches = [
        Dispatch("main", (row_tiles, count, 1), _with_fields(params, bh0=bh0))
        for bh0, count in _split(problem.heads, heads_per_dispatch)
    ]
    constants = tile.constants(d4, dv4, subgroup_size)
    summary = {"kernel": "flash", "tile": tile, "io": io, "dispatches": len(dispatches), "subgroups": constants["SG"]}
    return Plan("flash", io, constants, dispatches, summary=summary)


def plan_naive(
    problem: Problem, io: str, params: np.ndarray, score_chunk_bytes: int | None, limits: DeviceLimits
) -> Plan:
    """naive.wgsl's three passes per chunk of (heads, rows) whose scores fit one buffer.

    The cap on that buffer is the adapter's binding and buffer limits, or
    ``score_chunk_bytes`` when smaller. Whole heads are grouped while one
    head's scores fit; else each head is cut into row chunks (whole row tiles
    where possible).
    """
    cap = min(limits.storage_binding_bytes, limits.buffer_bytes, score_chunk_bytes or MAX_SCORE_BUFFER_BYTES)
    sq, sk = problem.seq_q, problem.seq_k
    row_bytes = _SCORE_BYTES * sk
    if row_bytes > cap:
        raise BindingTooLarge(f"one score row of {sk} keys ({row_bytes} bytes) exceeds the score buffer cap {cap}")
    max_dim = limits.workgroups_per_dimension
    head_bytes = row_bytes * sq
    chunks: list[tuple[int, int, int, int]]  # (bh0, heads, row0, rows)
    if head_bytes <= cap and sq <= max_dim:
        heads_per = max(1, min(cap // head_bytes, max_dim))
        chunks = [(bh0, heads, 0, sq) for bh0, heads in _split(problem.heads, heads_per)]
    else:
        rows_per = min(cap // row_bytes, max_dim)
        if rows_per >= NAIVE_TILE:
            rows_per -= rows_per % NAIVE_TILE
        chunks = [(bh, 1, row0, rows) for bh in range(problem.heads) for row0, rows in _split(sq, rows_per)]
    score_bytes = max(heads * rows for _, heads, _, rows in chunks) * row_bytes

    def tiles_of(n: int) -> int:
        return -(-n // NAIVE_TILE)

    dispatches = []
    for bh0, heads, row0, rows in chunks:
        record = _with_fields(params, bh0=bh0, row0=row0, rows=rows)
        dispatches += [
            Dispatch("scores_pass", (tiles_of(sk), tiles_of(rows), heads), record),
            Dispatch("softmax_pass", (rows, 1, heads), record),  # one workgroup per score row
            Dispatch("weighted_sum_pass", (tiles_of(problem.dv4), tiles_of(rows), heads), record),
        ]
    summary = {"kernel": "naive", "io": io, "chunks": len(chunks), "score_bytes": score_bytes}
    return Plan("naive", io, naive_constants(problem.d4, problem.dv4), dispatches, score_bytes, summary)


def plan(
    kernel: str,
    problem: Problem,
    io: str,
    params: np.ndarray,
    *,
    tile: FlashTile | None,
    score_chunk_bytes: int | None,
    limits: DeviceLimits,
    subgroup_size: int = 0,
) -> Plan:
    """The plan of `kernel` ('flash' or 'naive') for one call."""
    check_kernel(kernel)
    if kernel == "flash":
        return plan_flash(problem, io, params, tile, limits, subgroup_size)
    return plan_naive(problem, io, params, score_chunk_bytes, limits)
