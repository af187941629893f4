"""The models and inputs a command reads from its arguments: --dim and --seq-lens checked against
the model, --feeds or random inputs, a model with its external weights."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import numpy as np
import onnx

from ..errors import OrtflashError
from ..model_io import external_locations, load

if TYPE_CHECKING:
    from ..report import Report


def check_dims(args: argparse.Namespace, model: onnx.ModelProto) -> None:
    """A --dim naming no input dim of the model is bad usage, said before any work."""
    from ..checks.feeds import check_dim_names

    check_dim_names(model, dict(args.dim))


def load_feeds(args: argparse.Namespace, model: onnx.ModelProto) -> dict[str, np.ndarray]:
    from ..checks.feeds import make_feeds, read_feeds

    check_dims(args, model)
    return (
        read_feeds(args.feeds)
        if args.feeds
        else make_feeds(model, seq_len=args.seq_len, batch=args.batch, dims=dict(args.dim))
    )


def load_with_weights(path: str) -> onnx.ModelProto:
    """The model with its external weights read in (validate runs the graph from memory)."""
    model = load(path)
    return onnx.load(path) if external_locations(model) else model


def check_seq_lens(args: argparse.Namespace, model: onnx.ModelProto, report: Report) -> list[str]:
    """--seq-lens against the model: a length a static model cannot take is bad usage (the blocks
    of a model whose inputs are fixed run at their one key length); the notes, one per length,
    where the original does not run at it (a learned position table shorter than it), say so."""
    from ..bench.inputs import has_sequence_dim, unsupported_length

    lengths = list(getattr(args, "seq_lens", None) or ())
    if not lengths:
        return []
    try:
        free = has_sequence_dim(model, dict(getattr(args, "dim", None) or ()))
    except OrtflashError:  # no random inputs for it: whether its length is free is not known
        free = True
    if not free:
        fixed = sorted({b.key_len for b in report.blocks if b.key_len})
        wrong = [s for s in lengths if s not in fixed]
        if fixed and wrong:
            shapes = ", ".join(
                f"{vi.name} {[d.dim_value if d.HasField('dim_value') else d.dim_param for d in vi.type.tensor_type.shape.dim]}"
                for vi in model.graph.input[:3]
            ) + (", ..." if len(model.graph.input) > 3 else "")
            raise OrtflashError(
                f"--seq-lens {','.join(map(str, wrong))}: the model's inputs are fixed ({shapes}), so its blocks run "
                f"at {' and '.join(map(str, fixed))} keys only: leave out --seq-lens, or give "
                f"{','.join(map(str, fixed))}"
            )
        return []
    return [
        f"--seq-lens {s}: the original model does not run at that length ({why}); its blocks were judged at it anyway"
        for s in lengths
        if (why := unsupported_length(model, s)) is not None
    ]
