"""Bench inputs that follow what the model declares: its sequence dims, its fixed dims, its position table.

A model's inputs say which dims a sequence length may set (symbolic, non-batch dims) and which
are fixed (an image model's [batch, 3, 32, 32] has no sequence dim at all). A learned position
table caps the length the graph can run: asking for more ends in ONNX Runtime errors such as
"invalid expand shape", so bench refuses those lengths with the reason instead.
"""

from __future__ import annotations

import numpy as np
import onnx

from ..checks.feeds import make_feeds

# The sequence-length label of a model that has no sequence dim: it runs at its one fixed size.
FIXED_SIZE = 0

# Initializer names of learned absolute position tables (BERT/BART/ViT-style and GPT-2's wpe).
_POSITION_TABLE_NAMES = ("position", "wpe", "pos_emb")


def bench_feeds(
    model: onnx.ModelProto, seq_len: int, batch: int, dims: dict[str, int] | None = None
) -> dict[str, np.ndarray]:
    """The inputs one measurement runs on: padding attention masks, seed 0, the model's fixed dims kept."""
    return make_feeds(model, seq_len=max(seq_len, 1), batch=batch, seed=0, dims=dims)


def has_sequence_dim(model: onnx.ModelProto, dims: dict[str, int] | None = None) -> bool:
    """Whether a sequence length changes any input shape (make_feeds decides which dims it sets)."""

    def shapes(s: int) -> list[tuple[int, ...]]:
        return [v.shape for v in bench_feeds(model, s, batch=1, dims=dims).values()]

    return shapes(2) != shapes(3)


def position_limit(model: onnx.ModelProto) -> tuple[int, str] | None:
    """(rows, initializer) of the smallest learned position table a Gather reads, if any."""
    tables = {
        i.name: i.dims[0]
        for i in model.graph.initializer  # [positions, hidden]
        if len(i.dims) == 2 and any(k in i.name.lower() for k in _POSITION_TABLE_NAMES) and "position_ids" not in i.name
    }
    found = [
        (tables[n.input[0]], n.input[0])
        for n in model.graph.node
        if n.op_type == "Gather" and n.input and n.input[0] in tables
    ]
    # position_ids buffers [1, N] sliced or expanded by dynamo exports carry the same N
    found += [
        (i.dims[-1], i.name)
        for i in model.graph.initializer
        if "position_ids" in i.name and len(i.dims) == 2 and i.dims[0] == 1
    ]
    return min(found) if found else None


def unsupported_length(model: onnx.ModelProto, seq_len: int) -> str | None:
    """Why the model cannot run at this sequence length, or None when it can."""
    limit = position_limit(model)
    if limit is not None and seq_len > limit[0]:
        return f"S={seq_len} exceeds the model's {limit[0]} positions (initializer {limit[1]})"
    return None
