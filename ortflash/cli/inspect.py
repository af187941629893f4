"""``ortflash inspect MODEL``: every Softmax, fused or why not; writes nothing."""

from __future__ import annotations

import argparse

from ..arg_types import console_for
from ..lowering import TARGETS
from ..model_io import load
from ..pipeline.optimize import AUTO, EXECUTION_PROVIDERS, optimize
from ..report import result_document
from .args import EXIT_OK, add_pipeline_options, check_target_and_ep, pipeline_options
from .inputs import check_seq_lens
from .output import print_report, write_json

HELP = "list every Softmax: fused or why not (under a --target too); writes nothing"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model")
    add_pipeline_options(p)
    p.add_argument(
        "--target",
        choices=(*TARGETS, AUTO),
        default=None,
        help="the rows optimize --target TARGET would write: which blocks it lowers to which op, and why the "
        "others stay (default: as optimize without --target)",
    )
    p.add_argument("--ep", choices=EXECUTION_PROVIDERS, help="as optimize's --ep: the target it would pick")


def run(args: argparse.Namespace) -> int:
    console = console_for(args)
    check_target_and_ep(args, AUTO)
    # a path: external weights are found for the load check
    _, report = optimize(args.model, target=args.target, ep=args.ep, **pipeline_options(args))
    report.model = args.model
    report.notes.extend(check_seq_lens(args, load(args.model), report))  # a length a static model cannot take: exit 2
    print_report(report, console)
    write_json(args, result_document("inspect", EXIT_OK, model=args.model, report=report))
    return EXIT_OK
