"""What a regress run shows and writes: the table, the ``regress`` object of the JSON document, JUnit XML."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import OrtflashError
from .model_checks import BENCH_ROW, CheckResult

if TYPE_CHECKING:
    from rich.console import Console

JUNIT_SUITE = "ortflash regress"


def _blocks_cell(row: CheckResult) -> str:
    if row.target == BENCH_ROW or row.fused is None:
        return ""
    expected = "?" if row.expected is None else str(row.expected)
    return f"{row.fused} / {expected}"


def _error_cell(row: CheckResult) -> str:
    if row.of_tolerance is None:
        return ""
    return f"{row.max_abs:.2g} ({row.of_tolerance:.2g} of tol)"


def print_table(rows: Sequence[CheckResult], console: Console) -> None:
    """One row per model and target: blocks fused / expected, worst error, softmaxes run, time, result."""
    from rich.markup import escape
    from rich.table import Table

    table = Table()
    for column in ("model", "target", "blocks", "max abs err", "softmax", "time", "result"):
        table.add_column(column, overflow="fold")
    for row in rows:
        if row.ok:
            result = "[green]ok[/]" + (f"; {escape(row.count_note)}" if row.count_note else "")
        else:
            result = "[red]REGRESSION[/]: " + escape("; ".join(row.problems))
        table.add_row(
            escape(row.model),
            row.target,
            _blocks_cell(row),
            _error_cell(row),
            ", ".join(row.softmax),
            f"{row.seconds:.1f} s",
            result,
        )
    console.print(table)


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def summary(rows: Sequence[CheckResult], models: int) -> str:
    """The last line: how many checks of how many models passed; a manifest that matched no
    model says so (not "0 checks of 0 models ok")."""
    if not models:
        return "regress: no model matched the manifest: nothing checked"
    failed = [r for r in rows if not r.ok]
    of = f"{_count(len(rows), 'check')} of {_count(models, 'model')}"
    if not failed:
        return f"regress: {of} ok"
    return f"regress: {len(failed)} of {of} regressed"


def _finite(value: float | None) -> float | None:
    return value if value is not None and np.isfinite(value) else None


def row_dict(row: CheckResult) -> dict[str, Any]:
    return {
        "model": row.model,
        "target": row.target,
        "ok": row.ok,
        "expected_blocks": row.expected,
        "fused_blocks": row.fused,
        "attention_nodes": row.found,
        "max_abs": _finite(row.max_abs),
        "of_tolerance": _finite(row.of_tolerance),
        "softmax": list(row.softmax),
        "seconds": round(row.seconds, 3),
        "problems": list(row.problems),
        "notes": [row.count_note, *row.notes] if row.count_note else list(row.notes),
        "verifications": row.verifications,
    }


def regress_dict(manifest: str, rows: Sequence[CheckResult], updated: bool) -> dict[str, Any]:
    """The ``regress`` object of the JSON document (schema ``ortflash.result``, command ``regress``)."""
    return {
        "manifest": manifest,
        "ok": all(r.ok for r in rows),
        "checks": len(rows),
        "failed": sum(not r.ok for r in rows),
        "updated": updated,
        "results": [row_dict(r) for r in rows],
    }


def _xml_text(text: str) -> str:
    """Text XML 1.0 can hold: control characters (from a model's node names, say) become spaces."""
    return "".join(c if c in "\t\n\r" or ord(c) >= 0x20 else " " for c in text)


def junit_xml(rows: Sequence[CheckResult]) -> str:
    """One JUnit testcase per row (class: the model, name: the target), a failure per regressed row."""
    suite = ET.Element(
        "testsuite",
        name=JUNIT_SUITE,
        tests=str(len(rows)),
        failures=str(sum(not r.ok for r in rows)),
        errors="0",
        skipped="0",
        time=f"{sum(r.seconds for r in rows):.3f}",
    )
    for row in rows:
        case = ET.SubElement(
            suite, "testcase", classname=_xml_text(row.model), name=row.target, time=f"{row.seconds:.3f}"
        )
        if not row.ok:
            failure = ET.SubElement(case, "failure", message=_xml_text(row.problems[0][:500]), type="regression")
            failure.text = _xml_text("\n".join(row.problems))
        if row.notes:
            ET.SubElement(case, "system-out").text = _xml_text("\n".join(row.notes))
    root = ET.Element("testsuites", name=JUNIT_SUITE)
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def check_writable(path: str, option: str) -> None:
    """A report file that cannot be written is bad usage, found before any model is run."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise OrtflashError(f"{option} {path}: is a folder, not a file")
    if not os.path.isdir(folder):
        raise OrtflashError(f"{option} {path}: the folder {folder} does not exist")


def write_text(path: str, text: str, option: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as exc:
        raise OrtflashError(f"{option} {path}: could not write it ({exc.strerror or exc})") from None
