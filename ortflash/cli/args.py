"""What the commands share in their parsers: exit codes, the one-line-error parser, and the
option groups (softmax policy, inputs and tolerances, ORT optimization level, head count, key
lengths, --quiet/--json); argument types are in ``ortflash.arg_types``."""

from __future__ import annotations

import argparse
import math
import signal
from typing import Any, NoReturn

from ..arg_types import int_at_least, positive_int, positive_ints
from ..checks.compare import FLOAT16_TOLERANCE, FLOAT32_TOLERANCE
from ..op import spec
from ..op.policy import SoftmaxPolicy

EXIT_OK = 0
EXIT_MISMATCH = 1  # a check ran and failed: outputs differ, or ONNX Runtime cannot load what was made
EXIT_USAGE = 2  # bad input or usage: one line on stderr
EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130, as a shell reports a run stopped by Ctrl-C


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse prints usage + error otherwise)
        self.exit(EXIT_USAGE, f"ortflash: error: {message} (see {self.prog} --help)\n")


def _nonneg_int(text: str) -> int:
    return int_at_least(text, 0, "must be >= 0")


def _tolerance(text: str) -> float:
    """argparse type of --rtol/--atol: a finite number >= 0 (a negative one fails every comparison)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def add_policy(p: argparse.ArgumentParser, overrides: bool) -> None:
    """The softmax options; ``overrides``: they override the fused nodes' own (verify)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--online-softmax",
        action="store_true",
        help="the proposal's switch: online softmax for key lengths >= --min-seq-len (same as --softmax auto)"
        + (
            ""
            if overrides
            else "; it sets the softmax of the nodes written, while which blocks are fused is still the measured "
            "cost table's choice where --target is left open (--target ortflash fuses every block)"
        ),
    )
    g.add_argument(
        "--softmax",
        choices=spec.SOFTMAX_MODES,
        help="softmax of every fused node" + (" (default: each node's own)" if overrides else " (default naive)"),
    )
    keep = " with a softmax option; alone it overrides only this, each node keeping its softmax" if overrides else ""
    p.add_argument(
        "--block-size",
        type=positive_int,
        help=f"keys per tile in the online softmax (default {spec.ATTRIBUTES['block_size'].default}{keep})",
    )
    p.add_argument(
        "--min-seq-len",
        type=_nonneg_int,
        help=f"under auto, the key length from which online is used "
        f"(default {spec.ATTRIBUTES['min_seq_len'].default}{keep})",
    )


def policy_from_args(args: argparse.Namespace) -> SoftmaxPolicy | None:
    """The policy the softmax options ask for; None when none is given."""
    return SoftmaxPolicy.from_options(
        getattr(args, "softmax", None),
        getattr(args, "online_softmax", False) or None,
        getattr(args, "block_size", None),
        getattr(args, "min_seq_len", None),
    )


def new_nodes_policy(args: argparse.Namespace) -> SoftmaxPolicy:
    """The policy optimize writes on the nodes it creates: the options given, the defaults for the rest."""
    return SoftmaxPolicy.for_new_nodes(
        getattr(args, "softmax", None),
        getattr(args, "online_softmax", False) or None,
        getattr(args, "block_size", None),
        getattr(args, "min_seq_len", None),
    )


def _dim_setting(text: str) -> tuple[str, int]:
    """NAME=VALUE of --dim: a named input dim and its size."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, _nonneg_int(value)


def add_feeds(p: argparse.ArgumentParser) -> None:
    """The inputs a check runs on (--feeds, or random ones: --dim, --seq-len, --batch) and --rtol/--atol."""
    p.add_argument("--feeds", help=".npz file of inputs (default: random inputs with padded attention masks)")
    p.add_argument(
        "--dim",
        type=_dim_setting,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="size of a named input dim in random inputs (repeatable; a decoder's mask length "
        "follows its past and new lengths unless set too)",
    )
    p.add_argument(
        "--seq-len", type=positive_int, default=16, help="sequence length of random inputs (default %(default)s)"
    )
    p.add_argument("--batch", type=positive_int, default=2, help="batch size of random inputs (default %(default)s)")
    (rtol, atol), (rtol16, atol16) = FLOAT32_TOLERANCE, FLOAT16_TOLERANCE
    p.add_argument(
        "--rtol",
        type=_tolerance,
        default=None,
        help=f"relative tolerance (default {rtol:g}; {rtol16:g} for float16 models)",
    )
    p.add_argument(
        "--atol",
        type=_tolerance,
        default=None,
        help=f"absolute tolerance (default {atol:g}; {atol16:g} for float16 models)",
    )


def add_opt_level(p: argparse.ArgumentParser, when: str = "") -> None:
    """--ort-opt-level: the ONNX Runtime graph optimization level verify runs both models at."""
    from ..checks.sessions import ORT_OPT_LEVELS
    from ..checks.verify import VERIFY_OPT_LEVEL

    p.add_argument(
        "--ort-opt-level",
        choices=tuple(ORT_OPT_LEVELS),
        default=VERIFY_OPT_LEVEL,
        help=f"ONNX Runtime graph optimization level both models run at{when} (default %(default)s: the "
        "graphs as written, so ONNX Runtime's own fusions of the original cannot make a difference)",
    )


def add_pipeline_options(p: argparse.ArgumentParser) -> None:
    """The options of which blocks are fused and how that :func:`pipeline_options` reads (but
    --no-causal-proof, which only optimize has): --num-heads, and the cost table's --cpu-class and
    --seq-lens."""
    from ..pipeline.forms import CPU_CLASSES

    p.add_argument(
        "--num-heads",
        type=positive_int,
        help="head count of blocks whose count cannot be proved from shapes or initializers (for "
        "instance MultiHeadAttention nodes ONNX Runtime's optimizer wrote without it)",
    )
    p.add_argument(
        "--cpu-class",
        choices=CPU_CLASSES,
        help="whose measured CPU cost table decides where --target is left open: avx512, avx2 or generic "
        "(default: the class of the kernel build this machine runs); each row's detail names the table",
    )
    p.add_argument(
        "--seq-lens",
        type=positive_ints,
        metavar="N[,N...]",
        help="the key lengths the model runs at: where --target is left open, a block is fused only where the "
        "measured cost table says the fused form is faster than the original ops at every one of them "
        "(default: a block's static length; a block whose length is known only at run time keeps its ops)",
    )


def check_target_and_ep(args: argparse.Namespace, auto: str) -> None:
    """--ep picks the target, so it goes with --target auto or none (optimize, inspect)."""
    from ..errors import OrtflashError

    if args.ep is not None and args.target not in (None, auto):
        raise OrtflashError(
            f"--ep {args.ep} picks the target, so it goes with --target {auto} or no --target, not with "
            f"--target {args.target}: give one of them"
        )


def pipeline_options(args: argparse.Namespace) -> dict[str, Any]:
    """What ortflash.optimize takes beyond the policy and the target: --num-heads, where given,
    --no-causal-proof, --seq-lens and --cpu-class."""
    return {
        "num_heads": getattr(args, "num_heads", None),
        "prove_causal": not getattr(args, "no_causal_proof", False),
        "seq_lens": getattr(args, "seq_lens", None),
        "cpu_class": getattr(args, "cpu_class", None),
    }


def output_options() -> Parser:
    """--quiet and --json, shared by every command but bench (which writes its own result files)."""
    p = Parser(add_help=False)
    p.add_argument(
        "-q", "--quiet", action="store_true", help="print nothing but errors (the exit code says the result)"
    )
    p.add_argument(
        "--json",
        metavar="PATH",
        help="also write the result as JSON (schema ortflash.result, "
        "see docs/command-line.md); - writes it to stdout and the tables to stderr",
    )
    return p
