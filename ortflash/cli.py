"""The ortflash command line: one function per command, found through one table.

The parser and the exit codes are in ``ortflash.cli_arguments``. Over 400 lines because six
commands each print their own tables and JSON; the checks and the pipeline they call live elsewhere. Only a problem with the user's input (an ``OrtflashError``,
which every check raises for a model or inputs ONNX Runtime cannot take) becomes exit 2
with one line on stderr; any other exception is a bug in ortflash and shows its traceback.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from .arg_types import PIPE_WIDTH
from .checks.compare import (
    OutputDiff,
    tolerance,
    tolerance_text,
)
from .cli_arguments import (
    BACKEND_ALIASES,
    EXIT_INTERRUPTED,
    EXIT_MISMATCH,
    EXIT_OK,
    EXIT_USAGE,
    ONNX_SUFFIX,
    OPTIMIZED_SUFFIX,
    STDOUT,
    UNVERIFIED_SUFFIX,
    build_parser,
    new_nodes_policy,
    pipeline_options,
    policy_from_args,
)
from .errors import OrtflashError
from .model_io import external_locations, load
from .optimize import AUTO, optimize, save
from .policy import SoftmaxPolicy
from .report import Report, result_document

if TYPE_CHECKING:
    from rich.console import Console

    from .checks.validate import NodeCheck
    from .checks.verify import Verification


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


def _check_dims(args: argparse.Namespace, model: onnx.ModelProto) -> None:
    """A --dim naming no input dim of the model is bad usage, said before any work."""
    from .checks.feeds import check_dim_names

    check_dim_names(model, dict(args.dim))


def _load_feeds(args: argparse.Namespace, model: onnx.ModelProto) -> dict[str, np.ndarray]:
    from .checks.feeds import make_feeds, read_feeds

    _check_dims(args, model)
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
        opt_level=args.ort_opt_level,
    )
    console.print(f"ONNX Runtime graph optimization level: {result.ort_opt_level} (both models)", markup=False)
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


def _unrunnable(
    model: onnx.ModelProto, report: Report, original: onnx.ModelProto, args: argparse.Namespace, console: Console
) -> str | None:
    """Why ONNX Runtime (default optimization level, ortflash's custom op) cannot load ``model``, or,
    where blocks were lowered to native ops, run it once on random inputs; None if it can."""
    from .checks.feeds import make_feeds
    from .checks.first_run import first_run

    weights_dir = os.path.dirname(os.path.abspath(args.model))
    if not any(b.lowered_to for b in report.blocks):
        return first_run(model, weights_dir=weights_dir).problem
    try:
        feeds = make_feeds(original, seq_len=args.seq_len, batch=args.batch, dims=dict(args.dim))
    except OrtflashError as exc:
        console.print(f"note: the lowered model was not run once: no random inputs for it ({exc})", markup=False)
        return first_run(model, weights_dir=weights_dir).problem
    checked = first_run(model, weights_dir=weights_dir, original=args.model, feeds=feeds)
    if checked.note:
        console.print(f"note: {checked.note}", markup=False)
    return checked.problem


def _older_file(path: str) -> str:
    """What a message that nothing was written to ``path`` must add where a file is there already:
    a script that ignores the exit code would pick it up as this run's result."""
    if not os.path.exists(path):
        return ""
    modified = datetime.datetime.fromtimestamp(os.path.getmtime(path)).astimezone()
    return f", which still holds an older file (modified {modified:%Y-%m-%d %H:%M:%S %Z}), not this run's"


def _refuse_unloadable_input(path: str) -> None:
    """Where a new model does not load, an input ONNX Runtime cannot load either is bad input (exit 2)."""
    from .checks.first_run import input_problem

    unloadable = input_problem(path)
    if unloadable is not None:
        raise OrtflashError(f"{unloadable}; nothing written")


def _optimize(args: argparse.Namespace, console: Console) -> int:
    if args.ep is not None and args.target not in (None, AUTO):
        raise OrtflashError(
            f"--ep {args.ep} picks the target, so it goes with --target {AUTO} or no --target, not with "
            f"--target {args.target}: give one of them"
        )
    out_path = _output_path(args)
    policy = new_nodes_policy(args)
    original = load(args.model)
    _check_dims(args, original)
    checked: dict[int, str | None] = {}  # id(model) -> its load check, so the chosen model is not opened twice

    def load_check(candidate: onnx.ModelProto, candidate_report: Report) -> str | None:
        checked[id(candidate)] = _unrunnable(candidate, candidate_report, original, args, console)
        return checked[id(candidate)]

    model, report = optimize(
        original, policy=policy, target=args.target, ep=args.ep, load_check=load_check, **pipeline_options(args)
    )
    report.model = args.model
    _print_report(report, console)
    if report.target is not None and report.target.chosen != "ortflash":
        kept = [b for b in report.blocks if b.needs_ortflash]
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

    # Nothing ONNX Runtime cannot load is ever written: the model is opened before it is saved, and
    # a model with lowered nodes is run once too (some native ops check their inputs only at run time)
    problem = checked[id(model)] if id(model) in checked else _unrunnable(model, report, original, args, console)
    if problem is not None:
        _refuse_unloadable_input(args.model)
        print(f"ortflash: error: {problem}; nothing written to {out_path}{_older_file(out_path)}", file=sys.stderr)
        return finish(EXIT_MISMATCH, None)
    verification = None
    if args.verify:  # each fused node as written, the policy just chosen
        verification = _prove(args.model, model, None, args, console, weights_dir=source_dir)
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


def _print_report(report: Report, console: Console) -> None:
    """The report table, rows feeding a quantizer marked, and what to do about those."""
    marked = [b.name for b in report.blocks if b.fused and b.rounding]
    report.print(console)
    if marked:
        console.print(
            f"note: {len(marked)} fused block(s) feed a quantizer, where a float32 rounding difference can "
            "become a different integer: verify with real inputs (--verify --feeds F.npz)",
            markup=False,
        )


def _inspect(args: argparse.Namespace, console: Console) -> int:
    _, report = optimize(args.model, **pipeline_options(args))  # a path: external weights are found for the load check
    report.model = args.model
    _print_report(report, console)
    _write_json(args, result_document("inspect", EXIT_OK, model=args.model, report=report))
    return EXIT_OK


def _verify_command(args: argparse.Namespace, console: Console) -> int:
    original, _ = load(args.original), load(args.optimized)  # one-line errors for bad files, before any work
    _check_dims(args, original)
    result = _prove(args.original, args.optimized, policy_from_args(args), args, console)
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
    from .checks.validate import check_derived, in_subgraphs, validate

    backend = BACKEND_ALIASES.get(args.backend, args.backend)
    original = _load_with_weights(args.original)
    optimized = _load_with_weights(args.optimized) if args.optimized else optimize(original, target="ortflash")[0]
    if args.optimized:
        check_derived(original, optimized, args.original, args.optimized)
    feeds = _load_feeds(args, original)
    rtol, atol = tolerance(original, args.rtol, args.atol)
    try:
        checks = validate(
            original, optimized, feeds, backend=backend, policy=policy_from_args(args), rtol=rtol, atol=atol
        )
    except OrtflashError as exc:
        from .checks.feeds import with_batch_hint

        raise (exc if args.feeds else with_batch_hint(exc, args.batch)) from None
    ok = True
    unchecked = in_subgraphs(optimized)
    if unchecked:
        console.print(
            f"{unchecked} fused node{'s' if unchecked != 1 else ''} inside If/Loop/Scan bodies not validated node by "
            "node (ONNX Runtime cannot expose a subgraph's values); `ortflash verify` checks them end to end",
            markup=False,
        )
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


def _regress(args: argparse.Namespace, console: Console) -> int:
    from .regress.command import run

    return run(args, console)


Command = Callable[[argparse.Namespace, "Console"], int]
COMMANDS: Mapping[str, Command] = MappingProxyType(
    {
        "optimize": _optimize,
        "inspect": _inspect,
        "verify": _verify_command,
        "validate": _validate,
        "web-check": _web_check,
        "bench": _bench,
        "regress": _regress,
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
