"""``regress --update``: the manifest with its block counts taken from a run, as a diff, then written.

Only ``blocks`` change. An entry whose files (a glob) fused different counts is split into one
entry per file, so each keeps its own expectation. The file is rewritten in its own format
(TOML or JSON); a TOML file's comments are not kept, which the diff shows before anything is written.
"""

from __future__ import annotations

import copy
import difflib
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from .manifest import Manifest, toml_loads
from .model_checks import BENCH_ROW, CheckResult

WRITTEN_BY = "# ortflash regress manifest (schema: README, Keeping your models green)"


def updated_document(manifest: Manifest, rows: Sequence[CheckResult]) -> dict[str, Any]:
    """The manifest's document with each entry's ``blocks`` set to what this run fused."""
    counts: dict[str, dict[str, int]] = {}
    for row in rows:
        if row.target != BENCH_ROW and row.fused is not None:
            counts.setdefault(row.model, {})[row.target] = row.fused
    doc = copy.deepcopy(manifest.document)
    entries: list[dict[str, Any]] = doc.get("model", [])
    new_entries: list[dict[str, Any]] = []
    for index, entry in enumerate(entries):
        files = [c for c in manifest.checks if c.entry == index]
        measured = [counts[c.shown] for c in files if c.shown in counts]
        if not measured:  # nothing ran for it (no file, or the file did not load): left as it was
            new_entries.append(entry)
        elif all(m == measured[0] for m in measured):
            new_entries.append({**entry, "blocks": dict(measured[0])})
        else:
            for check in files:
                single = {**entry, "path": check.shown.replace(os.sep, "/")}
                if check.shown in counts:
                    single["blocks"] = dict(counts[check.shown])
                new_entries.append(single)
    doc["model"] = new_entries
    return doc


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return {math.inf: "inf", -math.inf: "-inf"}.get(value, "nan")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def _toml_key(key: str) -> str:
    bare = key and all(c.isascii() and (c.isalnum() or c in "-_") for c in key)
    return key if bare else json.dumps(key)


def to_toml(doc: Mapping[str, Any]) -> str:
    """The manifest as TOML: top-level values, then [defaults], then one [[model]] per entry."""
    lines = [WRITTEN_BY]
    tables = {k: v for k, v in doc.items() if k in ("defaults", "model")}
    lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in doc.items() if k not in tables]
    if "defaults" in tables:
        lines += ["", "[defaults]"]
        lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in tables["defaults"].items()]
    for entry in tables.get("model", []):
        lines += ["", "[[model]]"]
        lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in entry.items()]
    return "\n".join(lines) + "\n"


def render(path: str, doc: Mapping[str, Any]) -> str:
    return to_toml(doc) if path.endswith(".toml") else json.dumps(doc, indent=2) + "\n"


def parse(path: str, text: str) -> dict[str, Any]:
    """A manifest's text as its document (the format by the file's suffix)."""
    parsed: dict[str, Any] = toml_loads(text, path) if path.endswith(".toml") else json.loads(text)
    return parsed


def diff_text(path: str, old_text: str, new_text: str) -> str:
    """A unified diff of the manifest file; empty when nothing changes."""
    return "".join(
        difflib.unified_diff(
            old_text.splitlines(keepends=True), new_text.splitlines(keepends=True), path, f"{path} (updated)"
        )
    )
