"""Byte check: does a change leave ``optimize``'s behaviour as it was?

For every model of ``models/*.onnx`` and ``tests/data/**/*.onnx``, run ``ortflash optimize`` in
process (``ortflash.cli.main``, so the load check, the report and the JSON document are the
command's own) for each variant: every target (``--target ortflash|contrib|onnx|cuda|webgpu``),
the default (no target), ``--ep cpu|cuda|webgpu`` and ``--online-softmax``; and write, per case,
the sha256 of every file the run wrote, of its ``--json`` document and of its console output
(paths made relative) to a JSON manifest.

    python benchmarks/byte_check.py run MANIFEST.json [--root DIR] [--only SUBSTR]
    python benchmarks/byte_check.py compare BASE.json NEW.json

``--root`` is the checkout whose models are read (default: this script's checkout); the ortflash
imported is whatever ``PYTHONPATH`` gives (a baseline: ``PYTHONPATH=/tmp/bc_base``). ``compare``
prints the counts (cases, identical models / reports / logs) and every case that differs, and
exits 1 when one does. The run is CPU-heavy (about 700 optimize calls): run it under ``nice``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS: dict[str, list[str]] = {
    "target_ortflash": ["--target", "ortflash"],
    "target_contrib": ["--target", "contrib"],
    "target_onnx": ["--target", "onnx"],
    "target_cuda": ["--target", "cuda"],
    "target_webgpu": ["--target", "webgpu"],
    "default": [],
    "ep_cpu": ["--ep", "cpu"],
    "ep_cuda": ["--ep", "cuda"],
    "ep_webgpu": ["--ep", "webgpu"],
    "online_softmax": ["--online-softmax"],
}
OUT_NAME = "out.onnx"
HERE = Path(__file__).resolve().parent.parent


def models(root: Path) -> list[str]:
    """The models checked, as paths relative to ``root``, in a fixed order."""
    found = sorted(root.glob("models/*.onnx")) + sorted(root.glob("tests/data/**/*.onnx"))
    return [str(p.relative_to(root)) for p in found]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _files_sha(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): _sha(p.read_bytes()) for p in sorted(folder.rglob("*")) if p.is_file()}


def _scrub(text: str, out_dir: Path, root: Path) -> str:
    return text.replace(str(out_dir), "<out>").replace(str(root), "<root>")


def run_case(main, model: str, flags: list[str], root: Path) -> dict:
    """One optimize call: the hashes of what it wrote, its JSON document and its console output."""
    with tempfile.TemporaryDirectory(prefix="bc_") as tmp:
        out_dir = Path(tmp) / "out"
        out_dir.mkdir()
        json_path = Path(tmp) / "report.json"
        argv = ["optimize", model, "-o", str(out_dir / OUT_NAME), "--json", str(json_path), *flags]
        log = io.StringIO()
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            try:
                code = main(argv)
            except SystemExit as stop:
                code = stop.code
            except Exception as exc:  # a crash is a result too: it must stay the same
                code = f"raised {type(exc).__name__}: {exc}"
        document = _scrub(json_path.read_text(), out_dir, root) if json_path.exists() else ""
        return {
            "exit": code,
            "files": _files_sha(out_dir),
            "report": _sha(document.encode()),
            "log": _sha(_scrub(log.getvalue(), out_dir, root).encode()),
        }


def _git_head(root: Path) -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def run(manifest: Path, root: Path, only: str | None) -> None:
    os.chdir(root)  # models are named relative to the root, in the documents too
    import ortflash
    from ortflash.cli import main

    cases: dict[str, dict] = {}
    started = time.time()
    names = [m for m in models(root) if only is None or only in m]
    for i, model in enumerate(names):
        for variant, flags in VARIANTS.items():
            cases[f"{model}|{variant}"] = run_case(main, model, flags, root)
        print(f"[{i + 1}/{len(names)}] {model} ({time.time() - started:.0f} s)", file=sys.stderr, flush=True)
    document = {
        "root": str(root),
        "head": _git_head(root),
        "ortflash": str(Path(ortflash.__file__).resolve().parent),
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "models": len(names),
        "variants": list(VARIANTS),
        "cases": cases,
    }
    manifest.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    print(f"{len(cases)} cases ({len(names)} models x {len(VARIANTS)} variants) -> {manifest}", file=sys.stderr)


def compare(base_path: Path, new_path: Path) -> int:
    base = json.loads(base_path.read_text())["cases"]
    new = json.loads(new_path.read_text())["cases"]
    keys = sorted(set(base) | set(new))
    same = {"models": 0, "reports": 0, "logs": 0, "exit codes": 0}
    differ: list[str] = []
    for key in keys:
        a, b = base.get(key), new.get(key)
        if a is None or b is None:
            differ.append(f"{key}: only in {'new' if a is None else 'base'}")
            continue
        parts = {
            "models": a["files"] == b["files"],
            "reports": a["report"] == b["report"],
            "logs": a["log"] == b["log"],
            "exit codes": a["exit"] == b["exit"],
        }
        for part, equal in parts.items():
            same[part] += equal
        if not all(parts.values()):
            differ.append(f"{key}: differs in " + ", ".join(p for p, equal in parts.items() if not equal))
    print(f"{len(keys)} cases; identical: " + ", ".join(f"{part} {n}/{len(keys)}" for part, n in same.items()))
    by_variant: dict[str, int] = {}
    for line in differ:
        variant = line.split(":")[0].split("|")[-1]
        by_variant[variant] = by_variant.get(variant, 0) + 1
    if by_variant:
        print("differing cases by variant: " + ", ".join(f"{v} {n}" for v, n in sorted(by_variant.items())))
    for line in differ:
        print(line)
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("run", help="optimize every model x variant and write the manifest")
    r.add_argument("manifest", type=Path)
    r.add_argument("--root", type=Path, default=HERE)
    r.add_argument("--only", help="only the models whose path contains this")
    c = sub.add_parser("compare", help="diff two manifests")
    c.add_argument("base", type=Path)
    c.add_argument("new", type=Path)
    args = parser.parse_args()
    if args.mode == "run":
        run(args.manifest.resolve(), args.root.resolve(), args.only)
        return 0
    return compare(args.base, args.new)


if __name__ == "__main__":
    sys.exit(main())
