"""``ortflash regress MANIFEST``: its options, and a run from manifest to table, reports and exit code.

Exit 0 when every check passes; 1 on any regression (fewer blocks fused than expected, an output
beyond tolerance, a file ONNX Runtime cannot load, a slowdown beyond the baseline's margin);
2 for a manifest or option that cannot be used (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from ..arg_types import STDOUT, console_for, positive_int
from ..errors import OrtflashError
from ..report import result_document
from . import reports, update
from .manifest import Manifest, ModelCheck, load_manifest
from .model_checks import CheckResult, run_checks

if TYPE_CHECKING:
    from rich.console import Console

EXIT_OK, EXIT_REGRESSED = 0, 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``ortflash regress`` (--quiet and --json come from the shared parent parser)."""
    p.add_argument("manifest", help="a .toml or .json manifest of models and what each must do (see docs/testing.md)")
    p.add_argument(
        "-j",
        "--jobs",
        type=positive_int,
        default=1,
        help="check this many models at once, in worker processes (default 1)",
    )
    p.add_argument("--junit-xml", metavar="PATH", help="also write the results as JUnit XML (one testcase per row)")
    p.add_argument(
        "--update",
        action="store_true",
        help="rewrite the manifest's expected block counts from this run, after printing the diff",
    )


def _run(checks: list[ModelCheck], jobs: int, console: Console) -> list[CheckResult]:
    """Every row, with a progress bar on a terminal and a line per finished model elsewhere (CI logs)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not console.is_terminal or console.quiet:
        finished = [0]

        def line(check: ModelCheck, rows: list[CheckResult]) -> None:
            finished[0] += 1
            failed = [r.target for r in rows if not r.ok]
            state = f"REGRESSION in {', '.join(failed)}" if failed else "ok"
            seconds = sum(r.seconds for r in rows)
            console.print(f"[{finished[0]}/{len(checks)}] {check.shown}: {state} ({seconds:.1f} s)", markup=False)

        return run_checks(checks, jobs, line)
    columns = (
        TextColumn("regress"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("", total=len(checks))

        def advance(check: ModelCheck, rows: list[CheckResult]) -> None:
            progress.update(task, advance=1, description=check.shown)

        return run_checks(checks, jobs, advance)


def run(args: argparse.Namespace) -> int:
    """The command: read the manifest, check every model, print, write the reports; the exit code."""
    console = console_for(args)
    if args.junit_xml:
        reports.check_writable(args.junit_xml, "--junit-xml")
    manifest = load_manifest(args.manifest)
    for pattern in manifest.unmatched:
        console.print(f"note: {pattern}: no file matches", markup=False)
    rows = _run(manifest.checks, args.jobs, console)
    reports.print_table(rows, console)
    for row in rows:
        for note in row.notes:
            console.print(f"note: {row.name}: {note}", markup=False)
    code = EXIT_OK if all(r.ok for r in rows) and not manifest.unmatched else EXIT_REGRESSED
    if manifest.unmatched:
        console.print(f"[red]{len(manifest.unmatched)} manifest path(s) match no file[/]")
    console.print(reports.summary(rows, len(manifest.checks)), markup=False)
    updated = False
    if args.update:
        updated = _update(args.manifest, manifest, rows, console)
        # the counts are now what was measured; what else failed still fails
        code = EXIT_OK if all(r.ok or _only_counts(r) for r in rows) and not manifest.unmatched else EXIT_REGRESSED
    document = result_document(
        "regress",
        code,
        model=args.manifest,
        regress=reports.regress_dict(args.manifest, rows, updated),
    )
    if args.json:
        text = json.dumps(document, indent=2, allow_nan=False) + "\n"
        if args.json == STDOUT:
            sys.stdout.write(text)
        else:
            reports.write_text(args.json, text, "--json")
    if args.junit_xml:
        reports.write_text(args.junit_xml, reports.junit_xml(rows), "--junit-xml")
    return code


def _only_counts(row: CheckResult) -> bool:
    """A row whose every problem is a block count, which --update has just rewritten."""
    return row.count_regressed and len(row.problems) == 1


def _update(path: str, manifest: Manifest, rows: list[CheckResult], console: Console) -> bool:
    with open(path) as f:
        old_text = f.read()
    document = update.updated_document(manifest, rows)
    new_text = update.render(path, document)
    if update.parse(path, new_text) != document:
        raise OrtflashError(f"{path}: the updated manifest would not read back as written (a bug in ortflash)")
    if update.parse(path, old_text) == document:
        console.print(f"update: {path} already records this run", markup=False)
        return False
    console.print(update.diff_text(os.path.basename(path), old_text, new_text), markup=False, highlight=False, end="")
    with open(path, "w") as f:
        f.write(new_text)
    console.print(f"update: wrote {path}", markup=False)
    return True
