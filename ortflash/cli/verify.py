"""``ortflash verify ORIGINAL OPTIMIZED``: both models in ONNX Runtime, each fused node in every
softmax it runs deployed; and ``prove``, the same comparison printed, which ``optimize --verify``
runs too."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import onnx

from ..arg_types import console_for
from ..checks.compare import tolerance_text
from ..model_io import load
from ..op.policy import SoftmaxPolicy
from ..report import result_document
from .args import EXIT_MISMATCH, EXIT_OK, add_feeds, add_opt_level, add_policy, policy_from_args
from .inputs import check_dims
from .output import print_diffs, write_json

if TYPE_CHECKING:
    from rich.console import Console

    from ..checks.verify import Verification

HELP = "compare an optimized model with its original in ONNX Runtime"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("original")
    p.add_argument("optimized")
    add_policy(p, overrides=True)
    add_feeds(p)
    add_opt_level(p)


def verify_and_print(
    original: str,
    optimized: str | onnx.ModelProto,
    policy: SoftmaxPolicy | None,
    args: argparse.Namespace,
    console: Console,
    weights_dir: str | None = None,
    unvouched: str = "",
) -> Verification:
    """Compare, each fused node in every softmax it runs deployed, and print what was run and found.
    ``unvouched``: why matching outputs do not vouch for the model (then never "verified")."""
    from rich.markup import escape

    from ..checks.feeds import read_feeds
    from ..checks.verify import run_summary, verify_every_softmax

    feeds = read_feeds(args.feeds) if args.feeds else None
    result = verify_every_softmax(
        original,
        optimized,
        feeds=feeds,
        seq_len=args.seq_len,
        batch=args.batch,
        dims=dict(args.dim),
        policy=policy,
        rtol=args.rtol,
        atol=args.atol,
        weights_dir=weights_dir,
        opt_level=args.ort_opt_level,
    )
    console.print(f"ONNX Runtime graph optimization level: {result.ort_opt_level} (both models)", markup=False)
    for run in result.runs:
        console.print(run_summary(run), markup=False)
        print_diffs(run.diffs, console, f"ONNX Runtime: original vs optimized, {run.why}")
    for note in result.notes:
        console.print(f"note: {note}", markup=False)
    console.print(f"tolerance: {tolerance_text(result.rtol, result.atol)}", markup=False)
    if result.ok and unvouched:
        console.print(f"[yellow]not vouched for[/]: outputs match, but {escape(unvouched)}")
    else:
        console.print("verified: outputs match" if result.ok else "[red]verification FAILED[/]: outputs differ")
    return result


def run(args: argparse.Namespace) -> int:
    console = console_for(args)
    original, _ = load(args.original), load(args.optimized)  # one-line errors for bad files, before any work
    check_dims(args, original)
    result = verify_and_print(args.original, args.optimized, policy_from_args(args), args, console)
    code = EXIT_OK if result.ok else EXIT_MISMATCH
    write_json(
        args, result_document("verify", code, model=args.original, output=args.optimized, verification=result.to_dict())
    )
    return code
