"""What the commands print and write: result tables on a console, the report table, and the one
JSON document (``--json``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..arg_types import STDOUT
from ..errors import OrtflashError

if TYPE_CHECKING:
    from rich.console import Console

    from ..checks.compare import OutputDiff
    from ..checks.validate import NodeCheck
    from ..report import Report


def check_json_target(path: str | None) -> None:
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


def write_json(args: argparse.Namespace, document: dict[str, Any]) -> None:
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


def finite(value: float) -> float | None:
    """JSON has no infinity: an error that means nothing (incomparable outputs) is null."""
    return value if np.isfinite(value) else None


def print_results(
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


def error_cells(d: OutputDiff | NodeCheck) -> tuple[str, str, str, str]:
    """The ERROR_COLUMNS; a changed shape or dtype is said in words, not as an infinite error."""
    if d.problem:
        return d.problem, "", "", ""
    return f"{d.max_abs:.3g}", f"{d.max_rel:.3g}", f"{d.of_tolerance:.3g}", str(d.nan_mismatch)


def print_diffs(diffs: Sequence[OutputDiff], console: Console, title: str) -> bool:
    rows = [((d.name, *error_cells(d)), d.ok) for d in diffs]
    return print_results(console, title, ("output", *ERROR_COLUMNS), rows)


def print_report(report: Report, console: Console) -> None:
    """The report table, rows feeding a quantizer marked, and what to do about those."""
    marked = [b.name for b in report.blocks if b.fused and b.rounding]
    report.print(console)
    if marked:
        console.print(
            f"note: {len(marked)} fused block(s) feed a quantizer, where a float32 rounding difference can "
            "become a different integer: verify with real inputs (--verify --feeds F.npz)",
            markup=False,
        )


def quantizer_caveat(report: Report, args: argparse.Namespace) -> str:
    """Why --verify on random inputs cannot vouch for this model ('' where it can): fused blocks feed
    a quantizer, whose integers a float32 rounding difference can change on the user's inputs only
    (Kokoro int8: 40,200 audio samples instead of 42,000, with random inputs matching), and no
    --feeds gave those inputs. The rows are the ones print_report marks, whatever the target."""
    marked = [b.name for b in report.blocks if b.fused and b.rounding]
    if not marked or getattr(args, "feeds", None):
        return ""
    return (
        f"{len(marked)} fused block(s) feed a quantizer, where a float32 rounding difference can become another "
        "integer on real inputs: random inputs cannot vouch for it; verify with your inputs (--verify --feeds F.npz)"
    )


def write_error_json(command: str, json_path: str | None, model: str | None, code: int, message: str) -> None:
    """A run that ended in an error (exit 2: bad input or usage; 130: interrupted; 1: a bug in
    ortflash) still writes its --json document, of the same shape, so a script reading the file
    never picks up an earlier run's: ``exit_code``, ``ok`` false, ``model`` (null where the command
    line did not parse), the other results null, and the error line as the last of ``notes``.
    Nothing is raised: the error itself is what the user is told."""
    from ..report import result_document

    if json_path is None:
        return
    document = result_document(command, code, model=model or "", notes=[f"error: {message}"])
    document["model"] = model
    try:
        check_json_target(json_path)
        write_json(argparse.Namespace(json=json_path), document)
    except OrtflashError:
        pass  # a --json target that cannot be written was the error, or is said by it
