"""The CPU cost table's second source: real-size exports run with their blocks fused (issue 30 item 5).

benchmarks/crossover.py measures each row on a 12-head stack. A crossover read there does not
always carry to a real export (AVX2: the default, naive from the stack's 256 keys, ran 0.84x at
S=256 on a 6-head export of hidden 384), so each CPU row of ``forms.CPU_CROSSOVERS`` listed in
``forms.REAL_SIZE_FILES`` is the later of the stack's crossover and this file's bound, for the
FlashAttention forms (``forms.REAL_SIZE_FORMS``).

Per export, mask kind and head dim, the fused model's CPU-time ratio to the original at each length
where the fused form ran (``ortflash bench`` JSONs, one per export: each variant and length in its
own process, rounds alternated, one thread). The export's crossover is benchmarks/crossover.py's
rule (the least S >= 1.05x and >= 1x at every longer measured S); where an export won at no
measured length, the bound is past its longest one: the stack's next measured length, which was
not checked on the exports (``unchecked``). A row's bound is the latest over its exports.

    # from ortflash bench JSONs (variant FORCED: --target ortflash --online-softmax, fused at every S)
    python benchmarks/crossover_real_size.py bench /tmp/ex --variant forced --name crossover_real_size_avx512
    # from a committed markdown table of a default run (fused from --fused-from keys)
    python benchmarks/crossover_real_size.py markdown benchmarks/results/default_real_size_avx2.md \\
        --fused-from 256 --isa avx2 --name crossover_real_size_avx2
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from crossover import crossover  # noqa: E402  (benchmarks/ is not a package)

EXPORTS = Path("/work/exports")
RESULTS = ROOT / "benchmarks" / "results"


def export_bound(ratios: dict[int, float], stack_lengths: list[int]) -> tuple[int | None, bool]:
    """(bound, unchecked) for one export's fused ratios by length: its crossover, or, where it won at
    no measured length, the stack's least measured length past its longest (None: there is none)."""
    found = crossover(dict(ratios))
    if found is not None:
        return found, False
    past = [s for s in stack_lengths if s > max(ratios)]
    return (min(past) if past else None), True


def rows(models: dict[str, Any], stack_lengths: list[int]) -> dict[str, dict[str, Any]]:
    """mask kind -> head dim -> {bound, unchecked, exports}: the latest bound over its exports (None
    where one has none)."""
    found: dict[tuple[str, int], list[tuple[str, int | None, bool]]] = {}
    for name, m in models.items():
        bound, unchecked = export_bound({int(s): r for s, r in m["cpu_time_ratios"].items()}, stack_lengths)
        found.setdefault((m["kind"], m["head_dim"]), []).append((name, bound, unchecked))
    out: dict[str, dict[str, Any]] = {}
    for (kind, dim), got in sorted(found.items()):
        bounds = [b for _, b, _ in got]
        latest = None if None in bounds else max(b for b in bounds if b is not None)
        out.setdefault(kind, {})[str(dim)] = {
            "bound": latest,
            "unchecked": any(u for _, b, u in got if b == latest),
            "exports": [n for n, _, _ in got],
        }
    return out


def _blocks(path: Path) -> tuple[str, int | None, int | None]:
    """(mask kind, heads, head dim) of an export's blocks, as forced fusion reads them (one of each)."""
    import ortflash

    _, report = ortflash.optimize(str(path), online_softmax=True, target="ortflash", load_check=lambda m, r: None)
    kinds = {(b.mask_kind, b.heads, b.head_dim) for b in report.blocks if b.fused}
    assert len(kinds) == 1, (path, kinds)
    return next(iter(kinds))


def from_bench(folder: Path, variant: str, fixed: dict[str, int]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per export, from ``ortflash bench`` JSONs (NAME.json, the export /work/exports/NAME.onnx):
    ``variant``'s CPU-time ratios at every measured length (a model fused at every length); a model
    of one fixed size (bench's length 0) at its key length from ``fixed``."""
    models: dict[str, Any] = {}
    machine: dict[str, Any] = {}
    for path in sorted(folder.glob("*.json")):
        doc = json.loads(path.read_text())
        if "ratios" not in doc:
            continue
        kind, heads, head_dim = _blocks(EXPORTS / f"{path.stem}.onnx")
        at = {"0": str(fixed[path.stem])} if path.stem in fixed else {}
        models[path.stem] = {
            "kind": kind,
            "heads": heads,
            "head_dim": head_dim,
            "cpu_time_ratios": {
                at.get(s, s): r[variant]["cpu_speedup"] for s, r in doc["ratios"].items() if variant in r
            },
            "wall_ratios": {at.get(s, s): r[variant]["speedup"] for s, r in doc["ratios"].items() if variant in r},
            "date": doc["date"],
            "load_average": [doc.get("loadavg_start"), doc.get("loadavg_end")],
        }
        machine = doc["machine"]
    return models, machine


_ROW = re.compile(r"^\| (\w+) \| (\d+) x (\d+) \| (\d+) \| ([\d.]+)x \| ([\d.]+)x \|$")


def from_markdown(md: Path, fused_from: int) -> dict[str, Any]:
    """Per export, from a committed results table (``| model | H x D | S | cpu | wall |``) of a
    default run whose blocks ran fused from ``fused_from`` keys: the ratios at those lengths."""
    models: dict[str, Any] = {}
    for line in md.read_text().splitlines():
        hit = _ROW.match(line)
        if hit is None or int(hit[4]) < fused_from:
            continue
        m = models.setdefault(
            hit[1],
            {
                "kind": "padding",
                "heads": int(hit[2]),
                "head_dim": int(hit[3]),
                "cpu_time_ratios": {},
                "wall_ratios": {},
            },
        )
        m["cpu_time_ratios"][hit[4]] = float(hit[5])
        m["wall_ratios"][hit[4]] = float(hit[6])
    return models


def write(doc: dict[str, Any], name: str) -> None:
    (RESULTS / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    lines = [
        f"# Real-size exports fused: the CPU table's second source ({doc['kernel_isa']} class, {doc['date']})",
        "",
        f"- source: {doc['source']}; kernel build {doc['kernel_isa']}; metric: CPU time at 1 thread per worker",
        f"- the stack's measured lengths (benchmarks/crossover.py): {doc['stack_lengths']}",
        *(f"- {note}" for note in doc.get("notes", [])),
        "",
        "| export | kind | H x D | " + " | ".join(f"S={s}" for s in _lengths(doc)) + " | crossover |",
        "|---|---|---|" + "---:|" * len(_lengths(doc)) + "---|",
    ]
    for name_, m in doc["models"].items():
        bound, unchecked = export_bound({int(s): r for s, r in m["cpu_time_ratios"].items()}, doc["stack_lengths"])
        cells = " | ".join(f"{m['cpu_time_ratios'].get(str(s), '-')}" for s in _lengths(doc))
        said = f"past {max(map(int, m['cpu_time_ratios']))}: {bound} (unchecked)" if unchecked else str(bound)
        lines.append(f"| {name_} | {m['kind']} | {m['heads']} x {m['head_dim']} | {cells} | {said} |")
    lines += ["", "| kind | head dim | bound on naive/online | exports |", "|---|---|---|---|"]
    for kind, by_dim in doc["rows"].items():
        for dim, row in by_dim.items():
            flag = " (not measured on the exports there)" if row.get("unchecked") else ""
            lines.append(f"| {kind} | {dim} | {row['bound']}{flag} | {', '.join(row['exports'])} |")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")


def _lengths(doc: dict[str, Any]) -> list[int]:
    return sorted({int(s) for m in doc["models"].values() for s in m["cpu_time_ratios"]})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("how", choices=("bench", "markdown"))
    parser.add_argument("source", type=Path, help="bench: a folder of ortflash bench JSONs; markdown: the .md")
    parser.add_argument("--variant", default="forced", help="bench: the fused variant's label")
    parser.add_argument("--fused-from", type=int, default=0, help="markdown: the length the fused branch ran from")
    parser.add_argument("--isa", default=None, help="markdown: the kernel build it ran (bench: this machine's)")
    parser.add_argument(
        "--stack", default="crossover_cpu", help="the stack results files (comma-separated) whose lengths extend a row"
    )
    parser.add_argument("--note", action="append", default=[])
    parser.add_argument(
        "--fixed", action="append", default=[], help="bench: NAME=LEN, a fixed-size export's key length"
    )
    parser.add_argument("--name", required=True)
    args = parser.parse_args(argv)
    stack_lengths = sorted(
        {s for name in args.stack.split(",") for s in json.loads((RESULTS / f"{name}.json").read_text())["seq_lens"]}
    )
    if args.how == "bench":
        from ortflash.kernels import cpu

        fixed = {name: int(n) for name, n in (f.split("=") for f in args.fixed)}
        models, machine = from_bench(args.source, args.variant, fixed)
        isa, source = cpu.isa(), f"ortflash bench JSONs, variant {args.variant}"
    else:
        models, machine = from_markdown(args.source, args.fused_from), {}
        isa, source = (
            args.isa,
            f"{args.source.resolve().relative_to(ROOT)} (lengths >= {args.fused_from}: the fused branch)",
        )
    doc = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "kernel_isa": isa,
        "machine": machine,
        "source": source,
        "win": 1.05,
        "stack": args.stack,
        "stack_lengths": stack_lengths,
        "notes": args.note,
        "models": models,
        "rows": rows(models, stack_lengths),
    }
    write(doc, args.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
