#!/usr/bin/env python
"""Count attention blocks by mask kind (forms.MASK_KINDS) on sets of models, forced fusion
(``--target ortflash --online-softmax``), to see how many expanded padding masks read as
'padding' rather than 'bias' (issue 30 item 3).

    python benchmarks/expanded_mask_counts.py --set zoo models/*.onnx --json /tmp/after_zoo.json
    python benchmarks/expanded_mask_counts.py --set outside /tmp/outside/*.onnx --json /tmp/after_out.json
    python benchmarks/expanded_mask_counts.py --compare before.json after.json

Each model runs in its own process (a model that crashes the optimizer is a row, not the end);
one row per block: model, block name, fused, mask kind, the report's mask column.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

_ONE = r"""
import json, sys, ortflash
from ortflash.errors import OrtflashError
try:
    _, report = ortflash.optimize(sys.argv[1], target="ortflash", online_softmax=True)
except OrtflashError as e:
    print(json.dumps({"error": str(e)})); sys.exit(0)
print(json.dumps({"blocks": [
    {"name": b.name, "fused": b.fused, "mask_kind": b.mask_kind, "mask": b.mask, "reason": b.reason}
    for b in report.blocks]}))
"""


def count(paths: list[str]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for path in paths:
        done = subprocess.run([sys.executable, "-c", _ONE, path], capture_output=True, text=True, timeout=1200)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode or not lines:
            rows.append({"model": Path(path).name, "error": (done.stderr.strip().splitlines() or ["?"])[-1]})
            continue
        out = json.loads(lines[-1])
        if "error" in out:
            rows.append({"model": Path(path).name, "error": out["error"]})
        for block in out.get("blocks", []):
            rows.append({"model": Path(path).name, **block})
        kinds = Counter(str(b["mask_kind"] or "-") for b in out.get("blocks", []))
        print(f"{Path(path).name:48s} {dict(kinds)}", file=sys.stderr)
    return rows


def kinds(rows: list[dict[str, object]]) -> Counter[str]:
    return Counter(str(r.get("mask_kind") or "-") for r in rows if "error" not in r)


def compare(before: list[dict[str, object]], after: list[dict[str, object]]) -> str:
    key = {(r["model"], r.get("name")): r for r in before if "error" not in r}
    moved = Counter()
    lines = []
    for r in after:
        if "error" in r:
            continue
        b = key.get((r["model"], r.get("name")))
        if b is None:
            continue
        was, now = b.get("mask_kind") or "-", r.get("mask_kind") or "-"
        if was != now:
            moved[(was, now)] += 1
            lines.append(f"| {r['model']} | {r['name']} | {was} | {now} | {r.get('mask', '')} |")
    head = [f"blocks: {sum(kinds(after).values())}; before {dict(kinds(before))}; after {dict(kinds(after))}"]
    head += [f"moved {w} -> {n}: {c}" for (w, n), c in sorted(moved.items())]
    return "\n".join(head + ["", "| model | block | before | after | mask (after) |", "|---|---|---|---|---|", *lines])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*")
    ap.add_argument("--set", default="models")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE.json", "AFTER.json"))
    args = ap.parse_args()
    if args.compare:
        before, after = (json.loads(Path(p).read_text())["rows"] for p in args.compare)
        print(compare(before, after))
        return
    rows = count(sorted(args.models))
    print(f"{args.set}: {len({r['model'] for r in rows})} models, kinds {dict(kinds(rows))}")
    if args.json:
        Path(args.json).write_text(json.dumps({"set": args.set, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
