"""The compiled kernel against the ops it replaces, per S, at one thread (issue 30 items 1-2, AVX2 build).

One attention node, B=1, H heads, head dim D, Sq = Sk = S, float32, no mask (``nomask``) or a full
float32 bias [1, H, S, S] (``bias``). Variants, each in a process of its own, rounds alternated:

``empty``          an ONNX Runtime session of one Identity node on the same feeds (the run's own cost);
``original``       MatMul(Q, Transpose(K)) -> Mul(scale) [-> Add(bias)] -> Softmax -> MatMul(V) in ONNX
                   Runtime (CPU EP, one intra-op thread: MLAS sgemm and Softmax), what an export runs;
``MODE@LABEL``     the compiled module of build LABEL (``--build LABEL=DIR``: DIR holds its
                   ``_flash_<isa>*.so``) called directly at one thread, MODE ``naive`` or ``online``
                   (block 128, the query tile ortflash.kernels.cpu picks).

Times are CPU time (``time.process_time``) per call, the median of the timed loops after warm-up
runs. ``ops`` = original - empty is what the replaced nodes cost; a kernel's ratio is ops / kernel
(higher is better). Results: ``results/<out>.{md,json}``.

    python benchmarks/kernel_speed.py --build before=/tmp/c_before --build after=ortflash/kernels \\
        --rounds 2 --out kernel_speed_avx2
"""

from __future__ import annotations

import argparse
import datetime
import glob
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def feeds(heads: int, seq: int, dim: int, kind: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {n: rng.standard_normal((1, heads, seq, dim), dtype=np.float32) for n in ("q", "k", "v")}
    if kind == "bias":
        out["bias"] = rng.standard_normal((1, heads, seq, seq), dtype=np.float32)
    return out


def original_model(heads: int, dim: int, kind: str, empty: bool) -> bytes:
    from onnx import TensorProto, helper

    names = ["q", "k", "v"] + (["bias"] if kind == "bias" else [])
    dims = {"q": ["B", heads, "S", dim], "k": ["B", heads, "S", dim], "v": ["B", heads, "S", dim]}
    dims["bias"] = ["B", heads, "S", "S"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims[n]) for n in names]
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [], [dim**-0.5])
    if empty:
        nodes = [helper.make_node("Identity", ["q"], ["out"])]
    else:
        nodes = [
            helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", ["q", "kt"], ["qk"]),
            helper.make_node("Mul", ["qk", "scale"], ["scores" if kind == "bias" else "logits"]),
        ]
        if kind == "bias":
            nodes.append(helper.make_node("Add", ["scores", "bias"], ["logits"]))
        nodes += [
            helper.make_node("Softmax", ["logits"], ["p"], axis=-1),
            helper.make_node("MatMul", ["p", "v"], ["out"]),
        ]
    graph = helper.make_graph(nodes, "attention", inputs, [out], initializer=[scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def load_build(directory: str, isa: str) -> Any:
    name = f"_flash_{isa}"
    [path] = glob.glob(os.path.join(directory, f"{name}.*.so"))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed(run: Any, budget_s: float, samples: int) -> float:
    """Median CPU milliseconds per call over ``samples`` loops of about budget_s / samples each."""
    start = time.perf_counter()
    calls = 0
    while time.perf_counter() - start < 0.1 or calls < 3:  # warm-up, and the calls per loop
        run()
        calls += 1
    per_loop = max(1, int(calls / (time.perf_counter() - start) * budget_s / samples))
    times = []
    for _ in range(samples):
        t0 = time.process_time()
        for _ in range(per_loop):
            run()
        times.append((time.process_time() - t0) / per_loop * 1e3)
    return statistics.median(times)


def worker(variant: str, heads: int, dim: int, kind: str, seqs: list[int], cfg: dict[str, Any]) -> dict[str, float]:
    mode, _, label = variant.partition("@")
    result: dict[str, float] = {}
    if mode in ("empty", "original"):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        session = ort.InferenceSession(
            original_model(heads, dim, kind, mode == "empty"), so, providers=["CPUExecutionProvider"]
        )
        for seq in seqs:
            f = feeds(heads, seq, dim, kind)
            result[str(seq)] = timed(lambda f=f: session.run(None, f), cfg["budget"], cfg["samples"])
        return result
    module = load_build(cfg["builds"][label], cfg["isa"])
    sys.path.insert(0, str(ROOT))
    from ortflash.kernels.cpu import query_tile

    for seq in seqs:
        f = feeds(heads, seq, dim, kind)
        out = np.empty_like(f["q"])
        args = (f["q"], f["k"], f["v"], out, f.get("bias"), None, dim**-0.5, 0, float("-inf"), False, 0.0)
        rest = (mode == "online", 128, query_tile(heads, seq, 1), 1)
        result[str(seq)] = timed(
            lambda args=args, rest=rest: module.flash_attention(*args, *rest), cfg["budget"], cfg["samples"]
        )
    return result


def machine() -> dict[str, Any]:
    cpu, flags = "unknown", set()
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name") and cpu == "unknown":
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    return {
        "cpu": cpu,
        "isa_flags": [x for x in ("avx512f", "avx2", "fma") if x in flags],
        "cores": len(os.sched_getaffinity(0)),
    }


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def markdown(res: dict[str, Any]) -> str:
    cfg = res["config"]
    lines = [
        "# The compiled kernel against MLAS sgemm + Softmax, one thread",
        "",
        f"- date: {res['date']}; machine: {res['machine']['cpu']}, {res['machine']['cores']} cores, "
        f"flags {', '.join(res['machine']['isa_flags'])}; kernel build {cfg['isa']}",
        f"- load average at start / end: {res['load_start']} / {res['load_end']} (shared machine)",
        f"- ortflash commit {res['commit']}; builds: " + ", ".join(f"{k} = {v}" for k, v in cfg["builds"].items()),
        f"- command: `{res['command']}`",
        f"- B=1, H={cfg['heads']}, Sq=Sk=S, float32; {cfg['rounds']} rounds alternated, each variant in its own "
        f"process, CPU time per call (median of {cfg['samples']} loops), one thread",
        "- ops = original - empty (the replaced nodes' own time in ONNX Runtime); ratio = ops / kernel "
        "(higher is better; > 1 the kernel wins); per-round ratios, median of rounds",
        "",
    ]
    for kind in cfg["kinds"]:
        for dim in cfg["dims"]:
            kernels = [v for v in cfg["variants"] if "@" in v]
            lines += [f"## {kind}, D={dim}", ""]
            lines.append("| S | ops (us) | " + " | ".join(f"{v} (us, ratio)" for v in kernels) + " |")
            lines.append("|---:|---:|" + "---:|" * len(kernels))
            for seq in cfg["seqs"]:
                cell = res["cells"][f"{kind}/{dim}/{seq}"]
                row = f"| {seq} | {cell['ops_us']:.1f} | "
                row += " | ".join(f"{cell[v]['us']:.1f} ({cell[v]['ratio']:.2f}x)" for v in kernels)
                lines.append(row + " |")
            lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", action="append", default=[], help="LABEL=DIR holding _flash_<isa>*.so")
    p.add_argument("--isa", default="avx2")
    p.add_argument("--modes", default="naive,online")
    p.add_argument("--seq-lens", default="32,64,128,256,512,1024")
    p.add_argument("--dims", default="32,64")
    p.add_argument("--kinds", default="nomask,bias")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--budget", type=float, default=0.6, help="seconds of timed calls per S")
    p.add_argument("--samples", type=int, default=5)
    p.add_argument("--out", default="", help="results/<out>.{md,json}; empty: print only")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        builds = dict(b.split("=", 1) for b in args.build)
        seqs = [int(s) for s in args.seq_lens.split(",")]
        dims = [int(d) for d in args.dims.split(",")]
    except ValueError as error:
        print(f"kernel_speed: bad argument: {error}", file=sys.stderr)
        return 2
    kinds = args.kinds.split(",")
    if not builds or any(k not in ("nomask", "bias") for k in kinds):
        print("kernel_speed: give --build LABEL=DIR and --kinds from nomask,bias", file=sys.stderr)
        return 2
    cfg = {"builds": builds, "isa": args.isa, "budget": args.budget, "samples": args.samples}
    if args.worker:
        variant, dim, kind = args.worker.split(",")
        print(json.dumps(worker(variant, args.heads, int(dim), kind, seqs, cfg)))
        return 0
    variants = ["empty", "original"] + [f"{m}@{b}" for b in builds for m in args.modes.split(",")]
    load_start = [round(x, 2) for x in os.getloadavg()]
    rounds: list[dict[str, dict[str, float]]] = []
    for r in range(args.rounds):
        got: dict[str, dict[str, float]] = {}
        order = variants if r % 2 == 0 else variants[::-1]
        for kind in kinds:
            for dim in dims:
                for v in order:
                    cmd = [sys.executable, __file__, "--worker", f"{v},{dim},{kind}", "--seq-lens", args.seq_lens]
                    cmd += ["--heads", str(args.heads), "--budget", str(args.budget), "--samples", str(args.samples)]
                    cmd += ["--isa", args.isa] + [x for b in args.build for x in ("--build", b)]
                    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                    got[f"{v}/{dim}/{kind}"] = json.loads(done.stdout.strip().splitlines()[-1])
                    print(f"round {r} {kind} D={dim} {v}: {got[f'{v}/{dim}/{kind}']}", file=sys.stderr)
        rounds.append(got)
    cells: dict[str, Any] = {}
    for kind in kinds:
        for dim in dims:
            for seq in seqs:
                s = str(seq)

                def ops(g: dict[str, dict[str, float]], dim: int = dim, kind: str = kind, s: str = s) -> float:
                    return g[f"original/{dim}/{kind}"][s] - g[f"empty/{dim}/{kind}"][s]

                cell: dict[str, Any] = {"ops_us": statistics.median(ops(g) for g in rounds) * 1e3}
                for v in variants[2:]:
                    cell[v] = {
                        "us": statistics.median(g[f"{v}/{dim}/{kind}"][s] for g in rounds) * 1e3,
                        "ratio": statistics.median(ops(g) / g[f"{v}/{dim}/{kind}"][s] for g in rounds),
                        "rounds_ratio": [ops(g) / g[f"{v}/{dim}/{kind}"][s] for g in rounds],
                    }
                cells[f"{kind}/{dim}/{seq}"] = cell
    res = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "load_start": load_start,
        "load_end": [round(x, 2) for x in os.getloadavg()],
        "commit": commit(),
        "command": "python benchmarks/kernel_speed.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "config": {
            **cfg,
            "heads": args.heads,
            "rounds": args.rounds,
            "seqs": seqs,
            "dims": dims,
            "kinds": kinds,
            "variants": variants,
        },
        "rounds": rounds,
        "cells": cells,
    }
    text = markdown(res)
    print(text)
    if args.out:
        (HERE / "results" / f"{args.out}.md").write_text(text)
        (HERE / "results" / f"{args.out}.json").write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
