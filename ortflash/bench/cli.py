"""`ortflash bench`: its options, and running them (the CLI's sub-parser calls add_arguments and run)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..arg_types import positive_int
from ..errors import OrtflashError
from . import baseline as baseline_check
from . import sgemm
from .report import check_out_dir, make_console, write_results
from .sweep import DEFAULT_SEQ_LENS, bench
from .variants import DEFAULT_BLOCK_SIZE, DEFAULT_VARIANTS, VARIANTS, parse_variant

ISAS = ("avx512", "avx2", "generic")
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# the options run() hands to bench() under their own names (--timeout and --no-profile are renamed there)
_BENCH_OPTIONS = (
    "seq_lens",
    "variants",
    "batch",
    "repeats",
    "warmup",
    "rounds",
    "threads",
    "isa",
    "block_size",
    "sgemm_size",
    "name",
)


def _slowdown(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 1.0:
        raise argparse.ArgumentTypeError(f"must be at least 1 (1.15 allows 15% slower), got {text}")
    return value


def _int_list(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers")
    return vals


def _sgemm_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (not measured) or a matrix size, got {text}")
    return value


def _variant_list(text: str) -> list[str]:
    vals = [x for x in text.replace(" ", "").split(",") if x]
    for v in vals:
        try:
            parse_variant(v)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return vals


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `ortflash bench`."""
    p.add_argument("model", help="the .onnx model to measure")
    p.add_argument(
        "--seq-lens",
        type=_int_list,
        default=None,
        help=f"comma-separated sequence lengths (default {','.join(map(str, DEFAULT_SEQ_LENS))}; "
        "a model without a sequence dim runs at its one size)",
    )
    p.add_argument(
        "--variants",
        type=_variant_list,
        default=list(DEFAULT_VARIANTS),
        help=f"comma-separated: {','.join(VARIANTS)} (naive/online/reference@BLOCK for another tile, "
        "e.g. online@512) or LABEL=PATH.onnx (default %(default)s)",
    )
    p.add_argument("--batch", type=positive_int, default=1, help="batch size (default %(default)s)")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed runs per measurement (default %(default)s)")
    p.add_argument("--warmup", type=positive_int, default=1, help="untimed runs first (default %(default)s)")
    p.add_argument(
        "--block-size", type=positive_int, default=DEFAULT_BLOCK_SIZE, help="online softmax tile (default %(default)s)"
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="ONNX Runtime intra-op, kernel and BLAS threads per worker (default: the libraries' own)",
    )
    p.add_argument(
        "--isa",
        choices=ISAS,
        default=None,
        help="force this build of the compiled CPU kernel in the workers (ORTFLASH_CPU_ISA)",
    )
    p.add_argument(
        "--rounds",
        type=positive_int,
        default=1,
        help="measure each (variant, S) this many times, alternating the order (default %(default)s)",
    )
    p.add_argument(
        "--timeout", type=float, default=900.0, help="seconds per worker before it is killed (default %(default)s)"
    )
    p.add_argument("--no-profile", action="store_true", help="skip the extra ORT-profiled run")
    p.add_argument(
        "--sgemm-size",
        type=_sgemm_size,
        default=sgemm.DEFAULT_SIZE,
        metavar="N",
        help="the kernel's attention GFLOP/s is reported as a fraction of numpy's float32 N x N x N matmul rate, "
        "measured in the same run (default %(default)s; 0: not measured)",
    )
    p.add_argument(
        "--baseline",
        metavar="OLD.json",
        help="a results JSON of an earlier run: exit 1 when a variant's time ratio to original got worse",
    )
    p.add_argument(
        "--max-slowdown",
        type=_slowdown,
        default=1.15,
        help="with --baseline: the largest allowed (ratio / baseline ratio) (default %(default)s)",
    )
    p.add_argument("--out", default="bench-results", help="folder for NAME.json/.md/.png (default %(default)s)")
    p.add_argument("--name", default="bench", help="file stem of the results (default %(default)s)")


def run(args: argparse.Namespace) -> int:
    """Exit code: 0 when every measurement succeeded (and no regression), 1 otherwise."""
    console = make_console()
    check_out_dir(args.out, args.name)  # before the run, not after it
    old = baseline_check.load_baseline(args.baseline) if args.baseline else None
    res = bench(
        args.model,
        **{option: getattr(args, option) for option in _BENCH_OPTIONS},
        timeout_s=args.timeout,
        profile=not args.no_profile,
        out_dir=None,
        console=console,
    )
    code = EXIT_OK if all(r.get("status") in ("ok", "skipped", "unavailable") for r in res["runs"]) else EXIT_FAILED
    if old is not None:
        check = baseline_check.compare(res, old, args.max_slowdown)
        res["baseline_check"] = {
            "baseline": args.baseline,
            "max_slowdown": args.max_slowdown,
            "ok": check.ok,
            "lines": check.lines,
        }
        for line in check.lines:
            console.print(line, markup=False, highlight=False)
        if check.ok:
            console.print(f"bench: no regression against {args.baseline}", markup=False)
        else:
            console.print(f"bench: {len(check.regressions)} regression(s) against {args.baseline}", markup=False)
            code = EXIT_FAILED
    res["files"] = write_results(res, args.out, args.name, console=console)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ortflash.bench",
        description="latency and peak memory of a model's variants against sequence length",
    )
    add_arguments(p)
    args = p.parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        return run(args)
    except OrtflashError as exc:
        print(f"ortflash bench: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
