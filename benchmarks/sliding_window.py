"""Sliding-window attention on the CPU kernel: one FlashAttention node with is_causal and a window
against the same node with is_causal alone, same shape (issue 22 item 1's target: at S = 4 x
window, the windowed call at least 3x faster than full causal).

Each model is one FlashAttention node as ortflash.optimize writes it (the window travels in the
side channel), run in an ortflash.InferenceSession, the path users run; each (variant, S) in its
own process, in rounds that alternate the order. The fill is float32-lowest, what the proof
writes for Mistral's exported masks, so the keys left of the window enter in closed form. Wall
and CPU time are both recorded; the kernel runs on one thread by default, so that other load on
a shared machine moves neither much (--threads to change it).

    python benchmarks/sliding_window.py                          # W = 256, 1024; S = 4 W
    python benchmarks/sliding_window.py --windows 512 --rounds 1 --out /tmp/r
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
HEADS, KV_HEADS, HEAD_DIM = 8, 2, 64  # Mistral's grouping (4 query heads per key/value head)
LOWEST = float(np.finfo(np.float32).min)
# causal: is_causal alone; window: is_causal + window_left; band: the window as the [1, 1, S, S] bool
# mask today's fusion kept before the proof (no tile skipped, the mask read in full).
VARIANTS = ("causal-naive", "window-naive", "band-naive", "causal-online", "window-online", "band-online")
TARGET_RATIO = 3.0


def node_model(kind: str, window: int, mode: str) -> onnx.ModelProto:
    """One FlashAttention node over q [1, H, S, D], k, v [1, Hkv, S, D] (kind: VARIANTS' first
    word); the window: the keys a query sees, itself included (window_left = window - 1)."""
    from ortflash.op import side_channel, spec

    attrs = spec.validate(
        {
            "scale": HEAD_DIM**-0.5,
            "is_causal": 0 if kind == "band" else 1,
            "mask_fill": LOWEST,
            "softmax": mode,
            "window_left": window - 1 if kind == "window" else -1,
        }
    )
    node_attrs = {name: attrs[name] for name in spec.DECLARED}
    node_attrs["exact_floats"] = side_channel.SideChannel.of_attributes(attrs).encode()
    node_attrs.update({n: attrs[n] for n in spec.SIDE_CHANNEL_INTS if attrs[n] != spec.ATTRIBUTES[n].default})
    inputs = [
        helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, HEADS, "S", HEAD_DIM]),
        helper.make_tensor_value_info("k", TensorProto.FLOAT, [1, KV_HEADS, "S", HEAD_DIM]),
        helper.make_tensor_value_info("v", TensorProto.FLOAT, [1, KV_HEADS, "S", HEAD_DIM]),
    ]
    inits = [onnx.numpy_helper.from_array(np.array(0.0, np.float32), "no_bias")]
    if kind == "band":
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, 1, "S", "S"]))
    else:
        inits.append(onnx.numpy_helper.from_array(np.array(True), "mask"))
    node = helper.make_node(spec.OP_TYPE, ["q", "k", "v", "no_bias", "mask"], ["o"], domain=spec.DOMAIN, **node_attrs)
    out = helper.make_tensor_value_info("o", TensorProto.FLOAT, [1, HEADS, "S", HEAD_DIM])
    graph = helper.make_graph([node], "sliding_window", inputs, [out], inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(spec.DOMAIN, spec.DOMAIN_VERSION)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def feeds(seq: int, kind: str, window: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {
        "q": rng.standard_normal((1, HEADS, seq, HEAD_DIM), dtype=np.float32),
        "k": rng.standard_normal((1, KV_HEADS, seq, HEAD_DIM), dtype=np.float32),
        "v": rng.standard_normal((1, KV_HEADS, seq, HEAD_DIM), dtype=np.float32),
    }
    if kind == "band":  # key j visible from query i: i - window < j <= i
        ones = np.ones((seq, seq), bool)
        out["mask"] = (np.tril(ones) & ~np.tril(ones, -window))[None, None]
    return out


def worker(variant: str, window: int, seq: int, cfg: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Time one variant in this process: the model written, a session opened, runs timed."""
    import ortflash
    from ortflash.kernels import cpu

    kind, mode = variant.split("-")
    path = workdir / f"{variant}_{window}.onnx"
    onnx.save(node_model(kind, window, mode), str(path))
    session = ortflash.InferenceSession(str(path), threads=cfg["threads"])
    f = feeds(seq, kind, window)
    out = session.run(None, f)[0]
    for _ in range(cfg["warmup"]):
        session.run(None, f)
    wall, cpu_time = [], []
    for _ in range(cfg["repeats"]):
        c0, t0 = time.process_time(), time.perf_counter()
        session.run(None, f)
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu_time.append((time.process_time() - c0) * 1e3)
    return {
        "median_ms": round(statistics.median(wall), 3),
        "cpu_median_ms": round(statistics.median(cpu_time), 3),
        "samples_ms": [round(x, 3) for x in wall],
        "isa": cpu.isa(),
        "output_checksum": round(float(np.abs(out).sum()), 3),
    }


def run_worker(args: argparse.Namespace, variant: str, window: int, workdir: Path) -> dict[str, Any]:
    result = workdir / "result.json"
    cmd = [sys.executable, __file__, "--worker", variant, "--windows", str(window), "--workdir", str(workdir)]
    cmd += ["--warmup", str(args.warmup), "--repeats", str(args.repeats), "--threads", str(args.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False, cwd=tempfile.gettempdir())
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][-300:]}
    return json.loads(result.read_text())


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"cpu": cpu, "cores": len(os.sched_getaffinity(0)), "loadavg": list(os.getloadavg())}


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per window and variant: the median over rounds of wall and CPU medians; per mode the
    ratios causal / window (how many times faster the window runs) and the target's verdict."""
    out: dict[str, Any] = {}
    windows = sorted({w for r in rounds for w in r})
    for w in windows:
        per: dict[str, Any] = {}
        for variant in VARIANTS:
            runs = [r[w][variant] for r in rounds if "median_ms" in r.get(w, {}).get(variant, {})]
            if not runs:
                per[variant] = {"error": next((r[w][variant].get("error") for r in rounds if variant in r[w]), "?")}
                continue
            per[variant] = {
                "median_ms": round(statistics.median(x["median_ms"] for x in runs), 3),
                "cpu_median_ms": round(statistics.median(x["cpu_median_ms"] for x in runs), 3),
                "round_medians_ms": [x["median_ms"] for x in runs],
                "isa": runs[0]["isa"],
            }
        for mode in ("naive", "online"):
            c, win, band = (per.get(f"{kind}-{mode}", {}) for kind in ("causal", "window", "band"))
            if "median_ms" in c and "median_ms" in win:
                wall = c["median_ms"] / win["median_ms"]
                cpu_ratio = c["cpu_median_ms"] / win["cpu_median_ms"]
                per[f"ratio_{mode}"] = {
                    "wall": round(wall, 2),
                    "cpu": round(cpu_ratio, 2),
                    "met": bool(cpu_ratio >= TARGET_RATIO),
                }
                if "median_ms" in band:
                    per[f"ratio_{mode}"]["band_over_window_cpu"] = round(
                        band["cpu_median_ms"] / win["cpu_median_ms"], 2
                    )
        out[str(w)] = per
    return out


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        "# Sliding-window attention on the CPU kernel (issue 22 item 1)",
        "",
        f"- date: {results['date']}; machine: {m['cpu']}, {m['cores']} cores, load average at start "
        f"{', '.join(f'{x:.2f}' for x in m['loadavg'])}; kernel threads: {results['config']['threads']}",
        f"- one FlashAttention node, B=1, {HEADS} query / {KV_HEADS} key-value heads, head dim {HEAD_DIM}, "
        "mask_fill float32-lowest (as proved from Mistral's exported masks), is_causal=1; the window keeps "
        "the query and the window - 1 keys before it (window_left = window - 1)",
        f"- each (variant, window) in its own process, {results['config']['rounds']} rounds alternating the order, "
        f"{results['config']['repeats']} timed runs after {results['config']['warmup']} warm-up; medians",
        f"- command: `{results['command']}`",
        "",
        "| window | S | mode | full causal ms (CPU ms) | window ms (CPU ms) | band mask ms (CPU ms) "
        "| causal / window, wall | CPU | band mask / window, CPU | target: causal / window >= 3x (CPU) |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for w, per in results["summary"].items():
        for mode in ("naive", "online"):
            c, win, ratio = per.get(f"causal-{mode}", {}), per.get(f"window-{mode}", {}), per.get(f"ratio_{mode}")
            band = per.get(f"band-{mode}", {})
            if ratio is None:
                lines.append(
                    f"| {w} | {4 * int(w)} | {mode} | {c.get('error', '')} | {win.get('error', '')} | | | | | n/a |"
                )
                continue
            shown = f"{band['median_ms']:.2f} ({band['cpu_median_ms']:.2f})" if "median_ms" in band else "-"
            lines.append(
                f"| {w} | {4 * int(w)} | {mode} | {c['median_ms']:.2f} ({c['cpu_median_ms']:.2f}) | "
                f"{win['median_ms']:.2f} ({win['cpu_median_ms']:.2f}) | {shown} | {ratio['wall']:.2f}x | "
                f"{ratio['cpu']:.2f}x | {ratio.get('band_over_window_cpu', '-')}x | {'met' if ratio['met'] else 'missed'} |"
            )
    lines += [
        "",
        "The bound: at S = 4 W full causal scores sum(i + 1) = S²/2 = 8 W² (query, key) pairs, the window "
        "sum(min(i + 1, W)) = W²/2 + 3 W² = 3.5 W², so skipping every pair outside the band gives at most "
        "8 / 3.5 = 2.29x over full causal at the same shape; 3x is out of reach by skipping alone, and the "
        "tiles (64 query rows x 64- or 128-key tiles, which read about W + 64 keys per row tile) keep the "
        "kernel below the bound at small W. Against the band as a mask tensor (what the fusion kept before "
        "the window was proved: every tile multiplied, the [S, S] mask read) the bound is 16 / 3.5 = 4.6x.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", default="256,1024", help="comma-separated windows W; S = 4 W")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="kernel threads per worker")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--name", default="sliding_window")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--workdir", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        windows = [int(w) for w in args.windows.split(",") if w]
    except ValueError:
        print(f"error: --windows takes comma-separated integers, got {args.windows!r}", file=sys.stderr)
        return 2
    if not windows or min(windows) < 1:
        print("error: --windows needs at least one window of 1 key or more", file=sys.stderr)
        return 2
    cfg = {"warmup": args.warmup, "repeats": args.repeats, "threads": args.threads}
    if args.worker:
        workdir = Path(args.workdir)
        result = worker(args.worker, windows[0], 4 * windows[0], cfg, workdir)
        (workdir / "result.json").write_text(json.dumps(result))
        return 0
    start_machine = machine()
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))
        this: dict[int, dict[str, Any]] = {}
        for w in windows:
            this[w] = {}
            for variant in order:
                with tempfile.TemporaryDirectory(prefix="ortflash-sliding-window-") as tmp:
                    this[w][variant] = run_worker(args, variant, w, Path(tmp))
                print(f"round {r} W={w} {variant}: {this[w][variant]}", flush=True)
        rounds.append(this)
    results = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": start_machine,
        "config": {**cfg, "rounds": args.rounds, "windows": windows},
        "command": "python benchmarks/sliding_window.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "rounds": [{str(w): v for w, v in r.items()} for r in rounds],
        "summary": summarise(rounds),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(results, indent=1))
    (out / f"{args.name}.md").write_text(markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
