"""The ortflash command line: one function per command, found through one table.

Exit codes are named below. Only a problem with the user's input (an ``OrtflashError``,
which every check raises for a model or inputs ONNX Runtime cannot take) becomes exit 2
with one line on stderr; any other exception is a bug in ortflash and shows its traceback.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import onnx

from . import __version__, spec
from .checks.compare import (
    FLOAT16_TOLERANCE,
    FLOAT32_TOLERANCE,
    OutputDiff,
    tolerance,
    tolerance_text,
)
from .errors import OrtflashError
from .kernels.config import BACKENDS, DEFAULT_BACKEND
from .model_io import external_locations, load
from .optimize import optimize, save
from .policy import SoftmaxPolicy
from .report import Report, result_document

if TYPE_CHECKING:
    from rich.console import Console

    from .checks.validate import NodeCheck
    from .checks.verify import Verification

EXIT_OK = 0
EXIT_MISMATCH = 1  # a check ran and failed: outputs differ, or ONNX Runtime cannot load what was made
EXIT_USAGE = 2  # bad input or usage: one line on stderr
EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130, as a shell reports a run stopped by Ctrl-C

ONNX_SUFFIX = ".onnx"
OPTIMIZED_SUFFIX = ".flash.onnx"
# A model whose --verify failed is written under this name (OUT.unverified.onnx), never at OUT.
UNVERIFIED_SUFFIX = ".unverified.onnx"
# `validate --backend wgsl`: the name the CLI used for the wgpu backend before the names were shared
BACKEND_ALIASES = MappingProxyType({"wgsl": "wgpu"})
# `--json -`: the JSON goes to stdout, and the tables to stderr
STDOUT = "-"
# Console width when the output is a pipe or a file: wide enough that no table folds or splits a
# number; rich pads only to the width a table needs.
PIPE_WIDTH = 100_000


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse prints usage + error otherwise)
        self.exit(EXIT_USAGE, f"ortflash: error: {message} (see {self.prog} --help)\n")


def _int_at_least(text: str, minimum: int, requirement: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{requirement}, got {value}")
    return value


def _positive_int(text: str) -> int:
    return _int_at_least(text, 1, "must be a positive integer")


def _nonneg_int(text: str) -> int:
    return _int_at_least(text, 0, "must be >= 0")


def _add_policy(p: argparse.ArgumentParser, overrides: bool) -> None:
    """The softmax options; ``overrides``: they override the fused nodes' own (verify)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--online-softmax",
        action="store_true",
        help="the proposal's switch: online softmax for key lengths >= --min-seq-len (same as --softmax auto)",
    )
    g.add_argument(
        "--softmax",
        choices=spec.SOFTMAX_MODES,
        help="softmax of every fused node" + (" (default: each node's own)" if overrides else " (default naive)"),
    )
    keep = " with a softmax option; alone it overrides only this, each node keeping its softmax" if overrides else ""
    p.add_argument(
        "--block-size",
        type=_positive_int,
        help=f"keys per tile in the online softmax (default {spec.ATTRIBUTES['block_size'].default}{keep})",
    )
    p.add_argument(
        "--min-seq-len",
        type=_nonneg_int,
        help=f"under auto, the key length from which online is used "
        f"(default {spec.ATTRIBUTES['min_seq_len'].default}{keep})",
    )


def _policy(args: argparse.Namespace) -> SoftmaxPolicy | None:
    """The policy the softmax options ask for; None when none is given."""
    return SoftmaxPolicy.from_options(
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


def _add_feeds(p: argparse.ArgumentParser) -> None:
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
        "--seq-len", type=_positive_int, default=16, help="sequence length of random inputs (default %(default)s)"
    )
    p.add_argument("--batch", type=_positive_int, default=2, help="batch size of random inputs (default %(default)s)")
    (rtol, atol), (rtol16, atol16) = FLOAT32_TOLERANCE, FLOAT16_TOLERANCE
    p.add_argument(
        "--rtol", type=float, default=None, help=f"relative tolerance (default {rtol:g}; {rtol16:g} for float16 models)"
    )
    p.add_argument(
        "--atol", type=float, default=None, help=f"absolute tolerance (default {atol:g}; {atol16:g} for float16 models)"
    )


def _add_num_heads(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--num-heads",
        type=_positive_int,
        help="head count of blocks whose count cannot be proved from shapes or initializers (for "
        "instance MultiHeadAttention nodes ONNX Runtime's optimizer wrote without it)",
    )


def _pipeline_options(args: argparse.Namespace) -> dict[str, Any]:
    """What ortflash.optimize takes beyond the policy and the target: --num-heads, where given."""
    if getattr(args, "num_heads", None) is None:
        return {}
    # the pipeline grows the parameter on its own schedule; until then the flag says so in one line
    if "num_heads" not in inspect.signature(optimize).parameters:
        raise OrtflashError("--num-heads: this ortflash's optimize() does not take a head count yet")
    return {"num_heads": args.num_heads}


def _output_options() -> _Parser:
    """--quiet and --json, shared by every command but bench (which writes its own result files)."""
    p = _Parser(add_help=False)
    p.add_argument(
        "-q", "--quiet", action="store_true", help="print nothing but errors (the exit code says the result)"
    )
    p.add_argument(
        "--json",
        metavar="PATH",
        help="also write the result as JSON (schema ortflash.result, "
        "see the README); - writes it to stdout and the tables to stderr",
    )
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ortflash", description="Fuse attention in ONNX models into one FlashAttention op, and prove it."
    )
    parser.add_argument("--version", action="version", version=f"ortflash {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    common = [_output_options()]

    p = sub.add_parser("optimize", parents=common, help="fuse attention blocks and write the new model")
    p.add_argument("model", help="input .onnx model (never modified, unless --in-place)")
    p.add_argument(
        "-o", "--output", help=f"output path (default: IN{OPTIMIZED_SUFFIX}); the input itself only with --in-place"
    )
    p.add_argument("--in-place", action="store_true", help="replace the input model with the optimized one")
    _add_policy(p, overrides=False)
    p.add_argument(
        "--target",
        choices=("ortflash", "contrib", "onnx"),
        default="ortflash",
        help="ortflash: FlashAttention nodes (run with ortflash.session_options()); contrib: ONNX Runtime's "
        "com.microsoft MultiHeadAttention/GroupQueryAttention; onnx: ONNX Attention (opset 23). A block no "
        "native op computes exactly stays FlashAttention (default %(default)s)",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="then run both models in ONNX Runtime and compare, each fused node in every softmax it runs "
        f"deployed; on a failure the model is written as OUT{UNVERIFIED_SUFFIX.removesuffix(ONNX_SUFFIX)}"
        f"{ONNX_SUFFIX} instead of OUT",
    )
    _add_feeds(p)

    _add_num_heads(p)

    p = sub.add_parser("inspect", parents=common, help="list every Softmax: fused or why not; writes nothing")
    p.add_argument("model")
    _add_num_heads(p)

    p = sub.add_parser("validate", parents=common, help="check each fused node's kernel against the naive ORT subgraph")
    p.add_argument("original")
    p.add_argument("--optimized", help="a fused model of ORIGINAL (default: optimize ORIGINAL now)")
    p.add_argument(
        "--backend",
        choices=(*BACKENDS, *BACKEND_ALIASES),
        default=DEFAULT_BACKEND,
        help="kernel to check: cpu (compiled), reference (numpy) or wgpu (the WGSL shaders; "
        "wgsl is another name for it) (default %(default)s)",
    )
    p.add_argument("--softmax", choices=("naive", "online"), help="softmax to run (default: each node's own)")
    p.add_argument("--block-size", type=_positive_int, help="keys per tile for online (default: each node's own)")
    _add_feeds(p)

    p = sub.add_parser(
        "web-check",
        parents=common,
        help="run a lowered model in onnxruntime-web / onnxruntime-node and compare with ONNX Runtime",
    )
    p.add_argument(
        "model", help="a model without FlashAttention nodes (ortflash optimize ... --target contrib or --target onnx)"
    )
    p.add_argument(
        "--runtime",
        choices=("web-wasm", "node-cpu", "node-webgpu"),
        default="web-wasm",
        help="web-wasm: onnxruntime-web's wasm backend under Node; node-cpu / node-webgpu: onnxruntime-node's "
        "CPU / WebGPU execution provider (default %(default)s)",
    )
    _add_feeds(p)

    from . import bench as _bench

    p = sub.add_parser(
        "bench", help="latency and peak memory of each variant against sequence length, one process each"
    )
    _bench.add_arguments(p)

    p = sub.add_parser("verify", parents=common, help="compare an optimized model with its original in ONNX Runtime")
    p.add_argument("original")
    p.add_argument("optimized")
    _add_policy(p, overrides=True)
    _add_feeds(p)
    return parser


# ---------------------------------------------------------------------------------------------
# Output: tables on a console, and the one JSON document


def _console(args: argparse.Namespace) -> Console:
    """Where the tables go: stdout (stderr when the JSON takes stdout), full width when not a terminal."""
    from rich.console import Console

    stream = sys.stderr if getattr(args, "json", None) == STDOUT else sys.stdout
    terminal = stream.isatty()
    return Console(
        file=stream, width=None if terminal else PIPE_WIDTH, quiet=getattr(args, "quiet", False), highlight=terminal
    )


def _check_json_target(path: str | None) -> None:
    """A --json file that cannot be written is bad usage: found before any work is done or anything written."""
    if path is None or path == STDOUT:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise OrtflashError(f"--json {path}: is a folder, not a file")
    if not os.path.isdir(folder):
        raise OrtflashError(f"--json {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise OrtflashError(f"--json {path}: the folder {folder} is not writable")


def _write_json(args: argparse.Namespace, document: dict[str, Any]) -> None:
    path = getattr(args, "json", None)
    if path is None:
        return
    text = json.dumps(document, indent=2, allow_nan=False) + "\n"
    if path == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as exc:
        raise OrtflashError(f"--json {path}: could not write it ({exc.strerror or exc})") from None


def _finite(value: float) -> float | None:
    """JSON has no infinity: an error that means nothing (incomparable outputs) is null."""
    return value if np.isfinite(value) else None


def _print_results(
    console: Console, title: str, columns: Sequence[str], rows: Sequence[tuple[Sequence[str], bool]], fold: bool = False
) -> bool:
    """One table row per compared value, ending in ok / DIFFERENT; True when all are ok."""
    from rich.markup import escape
    from rich.table import Table

    console.print(title, markup=False)  # a line of its own: a table title is padded to the table's width
    table = Table()
    for col in (*columns, "result"):
        table.add_column(col, overflow="fold" if fold else "ellipsis")
    for cells, ok in rows:
        table.add_row(*(escape(c) for c in cells), "[green]ok[/]" if ok else "[red]DIFFERENT[/]")
    console.print(table)
    return all(ok for _, ok in rows)


ERROR_COLUMNS = ("max abs err", "max rel err", "err / tolerance", "NaN mismatches")


def _error_cells(d: OutputDiff | NodeCheck) -> tuple[str, str, str, str]:
    """The ERROR_COLUMNS; a changed shape or dtype is said in words, not as an infinite error."""
    if d.problem:
        return d.problem, "", "", ""
    return f"{d.max_abs:.3g}", f"{d.max_rel:.3g}", f"{d.of_tolerance:.3g}", str(d.nan_mismatch)


def _print_diffs(diffs: Sequence[OutputDiff], console: Console, title: str) -> bool:
    rows = [((d.name, *_error_cells(d)), d.ok) for d in diffs]
    return _print_results(console, title, ("output", *ERROR_COLUMNS), rows)


# ---------------------------------------------------------------------------------------------
# Commands


def _load_feeds(args: argparse.Namespace, model: onnx.ModelProto) -> dict[str, np.ndarray]:
    from .checks.feeds import make_feeds, read_feeds

    return (
        read_feeds(args.feeds)
        if args.feeds
        else make_feeds(model, seq_len=args.seq_len, batch=args.batch, dims=dict(args.dim))
    )


def _load_with_weights(path: str) -> onnx.ModelProto:
    """The model with its external weights read in (validate runs the graph from memory)."""
    model = load(path)
    return onnx.load(path) if external_locations(model) else model


def _prove(
    original: str,
    optimized: str | onnx.ModelProto,
    policy: SoftmaxPolicy | None,
    args: argparse.Namespace,
    console: Console,
    weights_dir: str | None = None,
) -> Verification:
    """Compare, each fused node in every softmax it runs deployed, and print what was run and found."""
    from .checks.feeds import read_feeds
    from .checks.verify import prove, run_summary

    feeds = read_feeds(args.feeds) if args.feeds else None
    result = prove(
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
    )
    for run in result.runs:
        console.print(run_summary(run), markup=False)
        _print_diffs(run.diffs, console, f"ONNX Runtime: original vs optimized, {run.why}")
    for note in result.notes:
        console.print(f"note: {note}", markup=False)
    console.print(f"tolerance: {tolerance_text(result.rtol, result.atol)}", markup=False)
    console.print("verified: outputs match" if result.ok else "[red]verification FAILED[/]: outputs differ")
    return result


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


def _unloadable(model: onnx.ModelProto, weights_dir: str) -> str | None:
    """Why ONNX Runtime (default optimization level, ortflash's custom op) cannot load ``model``; None if it can."""
    from .checks.run import open_session

    try:
        open_session(model, what="the optimized model", weights_dir=weights_dir)
    except OrtflashError as exc:
        return str(exc)
    return None


def _optimize(args: argparse.Namespace, console: Console) -> int:
    out_path = _output_path(args)
    override = _policy(args)
    policy = override.applied_to(SoftmaxPolicy()) if override else SoftmaxPolicy()
    original = load(args.model)
    model, report = optimize(original, policy=policy, target=args.target, **_pipeline_options(args))
    report.model = args.model
    _print_report(report, original, model, console)
    if args.target != "ortflash":
        kept = [b for b in report.blocks if b.fused and b.target == "ortflash"]
        if kept:
            console.print(
                f"[yellow]{len(kept)} block(s) stay FlashAttention[/]: the output still needs "
                "ortflash (ortflash.session_options()) to run"
            )
    source_dir = os.path.dirname(os.path.abspath(args.model))

    def finish(code: int, output: str | None, verification: Verification | None = None) -> int:
        _write_json(
            args,
            result_document(
                "optimize",
                code,
                model=args.model,
                output=output,
                report=report,
                verification=verification.to_dict() if verification else None,
            ),
        )
        return code

    # Nothing ONNX Runtime cannot load is ever written: the model is opened before it is saved
    problem = _unloadable(model, source_dir)
    if problem is not None:
        print(
            f"ortflash: error: {problem} (at its default optimization level); nothing written to {out_path}",
            file=sys.stderr,
        )
        return finish(EXIT_MISMATCH, None)
    verification = None
    if args.verify:  # each fused node as written, the policy just chosen
        verification = _prove(args.model, model, None, args, console, weights_dir=source_dir)
        if not verification.ok:
            unverified = _unverified_path(out_path)
            save(model, unverified, source_dir=source_dir)
            console.print(f"wrote the unverified model to {unverified}; nothing written to {out_path}", markup=False)
            return finish(EXIT_MISMATCH, unverified, verification)
    save(model, out_path, source_dir=source_dir)
    console.print(f"wrote {out_path}", markup=False)
    return finish(EXIT_OK, out_path, verification)


def _print_report(report: Report, original: onnx.ModelProto, optimized: onnx.ModelProto, console: Console) -> None:
    """The report table, rows feeding a quantizer marked, and what to do about those."""
    from .checks.rounding import mark_rounding_sensitive

    marked = mark_rounding_sensitive(original, optimized, report)
    report.print(console)
    if marked:
        console.print(
            f"note: {len(marked)} fused block(s) feed a quantizer, where a float32 rounding difference can "
            "become a different integer: verify with real inputs (--verify --feeds F.npz)",
            markup=False,
        )


def _inspect(args: argparse.Namespace, console: Console) -> int:
    original = load(args.model)
    optimized, report = optimize(original, **_pipeline_options(args))
    report.model = args.model
    _print_report(report, original, optimized, console)
    _write_json(args, result_document("inspect", EXIT_OK, model=args.model, report=report))
    return EXIT_OK


def _verify_command(args: argparse.Namespace, console: Console) -> int:
    load(args.original), load(args.optimized)  # one-line errors for bad files, before any work
    result = _prove(args.original, args.optimized, _policy(args), args, console)
    code = EXIT_OK if result.ok else EXIT_MISMATCH
    _write_json(
        args, result_document("verify", code, model=args.original, output=args.optimized, verification=result.to_dict())
    )
    return code


def _backend_label(backend: str) -> str:
    if backend == "wgpu":
        from .kernels.wgpu import kernel as wgpu_kernel

        info = wgpu_kernel.adapter_info()  # device, backend, driver, features...
        details = ", ".join(str(info[k]) for k in ("backend", "driver") if info.get(k))
        return f"WGSL on {info.get('device', 'an unnamed adapter')}" + (f" ({details})" if details else "")
    return {"cpu": "the compiled CPU kernel", "reference": "numpy (CPU)"}[backend]


def _validate(args: argparse.Namespace, console: Console) -> int:
    from .checks.validate import validate

    backend = BACKEND_ALIASES.get(args.backend, args.backend)
    original = _load_with_weights(args.original)
    optimized = _load_with_weights(args.optimized) if args.optimized else optimize(original)[0]
    feeds = _load_feeds(args, original)
    rtol, atol = tolerance(original, args.rtol, args.atol)
    checks = validate(original, optimized, feeds, backend=backend, policy=_policy(args), rtol=rtol, atol=atol)
    ok = True
    if not checks:
        console.print("no FlashAttention node to validate")
    else:
        rows = [((c.node, c.replaces, c.mode, c.shapes, *_error_cells(c)), c.ok) for c in checks]
        ok = _print_results(
            console,
            f"each fused node, {_backend_label(backend)}, against the naive ONNX Runtime subgraph",
            ("node", "replaces", "softmax", "shapes", *ERROR_COLUMNS),
            rows,
            fold=True,
        )
        console.print(f"tolerance: {tolerance_text(rtol, atol)}", markup=False)
        console.print(f"validated: {len(checks)} fused nodes agree" if ok else "[red]validation FAILED[/]")
    code = EXIT_OK if ok else EXIT_MISMATCH
    nodes = [
        {
            **asdict(c),
            "max_abs": _finite(c.max_abs),
            "max_rel": _finite(c.max_rel),
            "of_tolerance": _finite(c.of_tolerance),
            "problem": c.problem or None,
        }
        for c in checks
    ]
    _write_json(
        args,
        result_document(
            "validate",
            code,
            model=args.original,
            output=args.optimized,
            validation={"backend": backend, "rtol": rtol, "atol": atol, "ok": ok, "nodes": nodes},
        ),
    )
    return code


def _web_check(args: argparse.Namespace, console: Console) -> int:
    from .checks.verify import diff_dict
    from .checks.web_check import web_check

    model = load(args.model)
    rtol, atol = tolerance(model, args.rtol, args.atol)
    diffs = web_check(model, _load_feeds(args, model), runtime=args.runtime, rtol=rtol, atol=atol)
    ok = _print_diffs(diffs, console, f"ONNX Runtime (Python, CPU) vs {args.runtime}")
    console.print(f"tolerance: {tolerance_text(rtol, atol)}", markup=False)
    console.print(
        f"web-check: outputs match in {args.runtime}"
        if ok
        else f"[red]web-check FAILED[/]: outputs differ in {args.runtime}"
    )
    code = EXIT_OK if ok else EXIT_MISMATCH
    _write_json(
        args,
        result_document(
            "web-check",
            code,
            model=args.model,
            web_check={
                "runtime": args.runtime,
                "rtol": rtol,
                "atol": atol,
                "ok": ok,
                "outputs": [diff_dict(d) for d in diffs],
            },
        ),
    )
    return code


def _bench(args: argparse.Namespace, console: Console) -> int:
    from . import bench

    return bench.run(args)


Command = Callable[[argparse.Namespace, "Console"], int]
COMMANDS: Mapping[str, Command] = MappingProxyType(
    {
        "optimize": _optimize,
        "inspect": _inspect,
        "verify": _verify_command,
        "validate": _validate,
        "web-check": _web_check,
        "bench": _bench,
    }
)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        _check_json_target(getattr(args, "json", None))
        return COMMANDS[args.command](args, _console(args))
    except OrtflashError as exc:
        print(f"ortflash: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("ortflash: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
