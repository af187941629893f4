"""``ortflash optimize MODEL``: fuse (and lower) attention blocks, check that ONNX Runtime loads
the result, optionally verify it, and write it; nothing ONNX Runtime cannot load is ever written."""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from functools import partial
from typing import TYPE_CHECKING

import onnx

from ..arg_types import console_for
from ..errors import OrtflashError
from ..lowering.targets import PROVIDERS, REGISTRY, TARGETS
from ..model_io import load
from ..pipeline.optimize import AUTO, EXECUTION_PROVIDERS, optimize, save
from ..pipeline.tune import TuneSettings, default_cache_dir, optimize_tuned
from ..report import Report, result_document
from .args import (
    EXIT_MISMATCH,
    EXIT_OK,
    add_feeds,
    add_opt_level,
    add_pipeline_options,
    add_policy,
    check_target_and_ep,
    new_nodes_policy,
    pipeline_options,
)
from .inputs import check_dims, check_seq_lens
from .output import print_report, quantizer_caveat, write_json
from .verify import verify_and_print

if TYPE_CHECKING:
    from rich.console import Console

    from ..checks.verify import Verification

HELP = "fuse attention blocks and write the new model"
ONNX_SUFFIX = ".onnx"
OPTIMIZED_SUFFIX = ".flash.onnx"
# A model whose --verify failed is written under this name (OUT.unverified.onnx), never at OUT.
UNVERIFIED_SUFFIX = ".unverified.onnx"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="input .onnx model (never modified, unless --in-place)")
    p.add_argument(
        "-o", "--output", help=f"output path (default: IN{OPTIMIZED_SUFFIX}); the input itself only with --in-place"
    )
    p.add_argument("--in-place", action="store_true", help="replace the input model with the optimized one")
    add_policy(p, overrides=False)
    p.add_argument(
        "--target",
        choices=(*TARGETS, AUTO),
        default=None,
        help="; ".join(f"{t.name}: {t.summary}" for t in REGISTRY.values()) + ". Under a "
        "portable target, a block its op cannot compute exactly keeps its original ops. auto (with --ep): per model, the first target that "
        "runs natively on that EP, lowers every block and loads (default: ortflash, or contrib / onnx where "
        "fused blocks feed a quantizer)",
    )
    p.add_argument(
        "--ep",
        choices=EXECUTION_PROVIDERS,
        help="the ONNX Runtime execution provider the model is for; without --target, or with --target auto, "
        "it picks the target "
        "(in order: " + "; ".join(f"{ep.name}: {', '.join(ep.targets)}" for ep in PROVIDERS.values()) + ")",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="then run both models in ONNX Runtime and compare, each fused node in every softmax it runs "
        f"deployed; on a failure the model is written as OUT{UNVERIFIED_SUFFIX.removesuffix(ONNX_SUFFIX)}"
        f"{ONNX_SUFFIX} instead of OUT",
    )
    add_feeds(p)
    add_opt_level(p, " with --verify")
    p.add_argument(
        "--no-causal-proof",
        action="store_true",
        help="keep every block's mask tensor as the graph computes it: no is_causal read from the mask "
        "subgraph (for comparisons, and as an escape hatch)",
    )
    add_pipeline_options(p)
    p.add_argument(
        "--tune",
        action="store_true",
        help="where --target is left open: time the original, every block fused and the cost table's choice on "
        "this machine at --seq-lens (or the model's fixed size), each in its own process, and keep the fastest "
        "that is never slower than the original (ortflash/pipeline/tune.py); the choice is cached",
    )
    p.add_argument(
        "--tune-cache",
        metavar="DIR",
        default=None,
        help="where --tune caches its choices, keyed by the model's hash, the EP, this machine and the versions "
        "(default: $XDG_CACHE_HOME/ortflash/tune, else ~/.cache/ortflash/tune); --tune-cache none: no cache",
    )


def _tune_settings(args: argparse.Namespace) -> TuneSettings | None:
    """--tune's lengths and cache folder, or None without --tune."""
    if not args.tune:
        if args.tune_cache is not None:
            raise OrtflashError("--tune-cache goes with --tune")
        return None
    cache = args.tune_cache if args.tune_cache is not None else default_cache_dir()
    return TuneSettings(tuple(args.seq_lens or ()), cache_dir=None if cache == "none" else cache)


def _verification_document(verification: Verification | None, caveat: str) -> dict | None:
    """--json's verification; ``vouched`` false, with the reason as a note, where matching outputs
    on random inputs do not vouch for the model (issue 33 item 3)."""
    if verification is None:
        return None
    document = verification.to_dict()
    document["vouched"] = bool(verification.ok and not caveat)
    if caveat:
        document["notes"] = [*document["notes"], f"not vouched for: {caveat}"]
    return document


def _unverified_path(out_path: str) -> str:
    return out_path.removesuffix(ONNX_SUFFIX) + UNVERIFIED_SUFFIX


def _output_path(args: argparse.Namespace) -> str:
    """Where optimize writes: -o, the input with --in-place, or IN.flash.onnx; the input only with --in-place."""
    if args.in_place and args.output:
        raise OrtflashError("give either -o or --in-place, not both")
    if args.in_place:
        return str(args.model)
    out_path: str = args.output or args.model.removesuffix(ONNX_SUFFIX) + OPTIMIZED_SUFFIX
    same = os.path.exists(out_path) and os.path.exists(args.model) and os.path.samefile(out_path, args.model)
    if same or os.path.abspath(out_path) == os.path.abspath(args.model):
        raise OrtflashError(f"-o {out_path} is the input model: give --in-place to replace it, or another -o")
    folder = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(folder):  # said before any work, not after a long --verify
        raise OrtflashError(f"{out_path}: the output folder {folder} does not exist")
    return out_path


def _unrunnable(
    model: onnx.ModelProto, report: Report, original: onnx.ModelProto, args: argparse.Namespace, console: Console
) -> str | None:
    """The pipeline's load check (pipeline/first_run.py) on the random inputs the options ask for:
    why ONNX Runtime cannot load ``model``, or, lowered, run it once; None if it can."""
    from ..checks.feeds import make_feeds
    from ..pipeline.first_run import load_check

    check = load_check(
        args.model,
        lambda: make_feeds(original, seq_len=args.seq_len, batch=args.batch, dims=dict(args.dim)),
        weights_dir=os.path.dirname(os.path.abspath(args.model)),
        note=lambda text: console.print(f"note: {text}", markup=False),
    )
    return check(model, report)


def _older_file(path: str) -> str:
    """What a message that nothing was written to ``path`` must add where a file is there already:
    a script that ignores the exit code would pick it up as this run's result."""
    if not os.path.exists(path):
        return ""
    modified = datetime.datetime.fromtimestamp(os.path.getmtime(path)).astimezone()
    return f", which still holds an older file (modified {modified:%Y-%m-%d %H:%M:%S %Z}), not this run's"


def _refuse_unloadable_input(path: str) -> None:
    """Where a new model does not load, an input ONNX Runtime cannot load either is bad input (exit 2)."""
    from ..pipeline.first_run import input_problem

    unloadable = input_problem(path)
    if unloadable is not None:
        raise OrtflashError(f"{unloadable}; nothing written")


def run(args: argparse.Namespace) -> int:
    console = console_for(args)
    check_target_and_ep(args, AUTO)
    out_path = _output_path(args)
    policy = new_nodes_policy(args)
    original = load(args.model)
    check_dims(args, original)
    checked: dict[int, str | None] = {}  # id(model) -> its load check, so the chosen model is not opened twice

    def load_check(candidate: onnx.ModelProto, candidate_report: Report) -> str | None:
        checked[id(candidate)] = _unrunnable(candidate, candidate_report, original, args, console)
        return checked[id(candidate)]

    tune = _tune_settings(args)
    # The path, not `original`: optimize reads a model file's small external constants (a scale) from
    # its folder, and --tune times models whose external weights are there; a ModelProto names no folder.
    model, report = (optimize if tune is None else partial(optimize_tuned, settings=tune))(
        args.model,
        policy=policy,
        target=args.target,
        ep=args.ep,
        load_check=load_check,
        **pipeline_options(args),
    )
    report.model = args.model
    report.notes.extend(check_seq_lens(args, original, report))  # a length a static model cannot take: exit 2
    print_report(report, console)
    if report.target is not None and report.target.chosen != "ortflash":
        kept = [b for b in report.blocks if b.needs_ortflash]
        if kept:
            console.print(
                f"[yellow]{len(kept)} block(s) stay FlashAttention[/]: the output still needs "
                "ortflash (ortflash.session_options()) to run"
            )
    source_dir = os.path.dirname(os.path.abspath(args.model))
    caveat = quantizer_caveat(report, args) if args.verify else ""

    def finish(code: int, output: str | None, verification: Verification | None = None) -> int:
        write_json(
            args,
            result_document(
                "optimize",
                code,
                model=args.model,
                output=output,
                report=report,
                verification=_verification_document(verification, caveat),
            ),
        )
        return code

    # Nothing ONNX Runtime cannot load is ever written: the model is opened before it is saved, and
    # a model with lowered nodes is run once too (some native ops check their inputs only at run time)
    problem = checked[id(model)] if id(model) in checked else _unrunnable(model, report, original, args, console)
    if problem is not None:
        _refuse_unloadable_input(args.model)
        print(f"ortflash: error: {problem}; nothing written to {out_path}{_older_file(out_path)}", file=sys.stderr)
        return finish(EXIT_MISMATCH, None)
    verification = None
    if args.verify:  # each fused node as written, the policy just chosen
        verification = verify_and_print(
            args.model, model, None, args, console, weights_dir=source_dir, unvouched=caveat
        )
        if not verification.ok:
            unverified = _unverified_path(out_path)
            save(model, unverified, source_dir=source_dir)
            console.print(
                f"wrote the unverified model to {unverified}; nothing written to {out_path}{_older_file(out_path)}",
                markup=False,
            )
            return finish(EXIT_MISMATCH, unverified, verification)
    save(model, out_path, source_dir=source_dir)
    console.print(f"wrote {out_path}", markup=False)
    return finish(EXIT_OK, out_path, verification)
