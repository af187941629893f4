"""The models and inputs a command reads from its arguments: --dim checked against the model,
--feeds or random inputs, a model with its external weights."""

from __future__ import annotations

import argparse

import numpy as np
import onnx

from ..model_io import external_locations, load


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
