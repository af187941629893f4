"""The zoo's worst verification error per target and per CPU kernel build: the README's figures.

Runs ``ortflash regress models/regress.toml`` once per compiled kernel build this CPU runs
(``ORTFLASH_CPU_ISA`` = avx512, avx2, generic; the FlashAttention target's error depends on it,
the lowered targets run ONNX Runtime's own ops), and writes, per build and target, the largest
``max_abs`` of any model with the model it comes from, to ``benchmarks/results/zoo_errors.json``
and ``.md``. ``tests/test_polish.py`` checks that the README quotes these numbers.

    python benchmarks/zoo_errors.py [-j 2] [--isa avx2 --isa generic]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from typing import Any

import onnxruntime

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MANIFEST = os.path.join(ROOT, "models", "regress.toml")
RESULTS = os.path.join(ROOT, "benchmarks", "results", "zoo_errors")


def _cpu() -> tuple[str, list[str]]:
    """The CPU's model name and which of the builds' ISA flags it has."""
    name, flags = platform.processor(), set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    return name, sorted(flags & {"avx2", "avx512f", "fma", "f16c"})


def _runnable_builds() -> list[str]:
    from ortflash.kernels import cpu

    features = cpu._cpu_features()
    return [isa for isa, needs in cpu.ISA_REQUIREMENTS.items() if set(needs) <= features]


def _kernel_build(isa: str) -> str:
    """When the compiled build of ``isa`` was built (its module file's time): the numbers are that build's."""
    from ortflash.kernels import cpu

    path = cpu._import_build(isa).__file__ or ""
    built = datetime.datetime.fromtimestamp(os.path.getmtime(path), datetime.timezone.utc)
    return f"{os.path.basename(path)}, built {built:%Y-%m-%d %H:%M UTC}"


def _worst(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per target: the largest max_abs over every model, and which model gives it."""
    worst: dict[str, dict[str, Any]] = {}
    for row in document["regress"]["results"]:
        value = row["max_abs"]
        if value is None:
            continue
        entry = worst.setdefault(row["target"], {"max_abs": -1.0, "model": "", "models": 0, "exact": 0})
        entry["models"] += 1
        entry["exact"] += value == 0
        if value > entry["max_abs"]:
            entry.update(max_abs=value, model=row["model"])
    return worst


def run(isa: str, jobs: int) -> tuple[dict[str, dict[str, Any]], bool]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "regress.json")
        env = {**os.environ, "ORTFLASH_CPU_ISA": isa}
        command = [sys.executable, "-m", "ortflash", "regress", MANIFEST, "-j", str(jobs), "-q", "--json", out]
        done = subprocess.run(command, env=env, cwd=ROOT, check=False)
        with open(out) as f:
            document = json.load(f)
    return _worst(document), done.returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--isa", action="append", help="a build to run (default: every build this CPU runs)")
    parser.add_argument("--commit", help="the commit measured, where this copy is no git checkout")
    parser.add_argument(
        "--machine",
        default="shared by several engineers while it ran: errors are exact, times are not recorded",
        help="how the machine was used while it ran, for the results",
    )
    args = parser.parse_args()
    cpu_name, flags = _cpu()
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    document: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_name,
        "cpu_flags": flags,
        "machine": args.machine,
        "commit": args.commit or git.stdout.strip(),
        "onnxruntime": onnxruntime.__version__,
        "manifest": "models/regress.toml",
        "builds": {},
    }
    for isa in args.isa or _runnable_builds():
        worst, ok = run(isa, args.jobs)
        document["builds"][isa] = {"kernel": _kernel_build(isa), "regress_ok": ok, "targets": worst}
    with open(RESULTS + ".json", "w") as f:
        json.dump(document, f, indent=1)
        f.write("\n")
    lines = [
        "# Worst verification error on the zoo, per kernel build",
        "",
        f"- date: {document['date']}; commit {document['commit']}; ONNX Runtime {document['onnxruntime']}",
        f"- CPU: {cpu_name} (flags: {', '.join(flags)}); {document['machine']}",
        "- `python benchmarks/zoo_errors.py`: `ortflash regress models/regress.toml` per build (ORTFLASH_CPU_ISA)",
        "",
        *(f"- {isa}: {build['kernel']}" for isa, build in document["builds"].items()),
        "",
        "| build | target | worst max abs err | model | models | bit-identical |",
        "|---|---|---:|---|---:|---:|",
    ]
    for isa, build in document["builds"].items():
        for target, entry in build["targets"].items():
            lines.append(
                f"| {isa} | {target} | {entry['max_abs']:.3g} | {entry['model']} | {entry['models']} | {entry['exact']} |"
            )
    with open(RESULTS + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
