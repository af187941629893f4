"""The native FlashAttention op against onnxruntime-extensions' Python bridge (issue 30 item 2).

Two measurements, each variant and case in a process of its own, rounds alternated, CPU time at one
thread (``time.process_time`` around ``session.run``: robust to the other jobs of a shared machine):

``overhead``  one FlashAttention node (B=1, H=12, D=32, no mask) at S = 16..512: a session run through
              the native op, through the bridge, and the compiled kernel called directly
              (``cpu.prepare``), and a run of one Identity node on the same feeds (``empty``: what
              ONNX Runtime's run costs itself); a path's per-node overhead is its run minus both.
``models``    the forced fusion (``optimize(target="ortflash", softmax="online", min_seq_len=0)``, as
              ``ortflash bench --variants original,online`` builds it) against the original model, with
              the fused model run natively and through the bridge: the ratio original / fused per S.
``check``     correctness on whole models: native against bridge outputs, batch 2 with padding masks.

    python benchmarks/native_op.py overhead --out /tmp/native_overhead.json
    python benchmarks/native_op.py check --models minilm_l6_sdpa_dynamo,zoo:t5_sdpa_dynamo --seq-lens 16,197
    python benchmarks/native_op.py models --models minilm_l3_eager_torchscript,zoo:bert_sdpa_dynamo \
        --seq-lens 16,32,64,128,512 --rounds 3 --out /tmp/native_models.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXPORTS = Path("/work/exports")
OVERHEAD_PATHS = ("kernel", "native", "bridge", "empty")
MODEL_VARIANTS = ("original", "native", "bridge")


def model_path(name: str) -> Path:
    """A real-size export by name, or a zoo model given as zoo:NAME."""
    return ROOT / "models" / f"{name[4:]}.onnx" if name.startswith("zoo:") else EXPORTS / f"{name}.onnx"


def _timed(run: Any, budget_s: float, least: int) -> dict[str, float]:
    """Median CPU and wall milliseconds of run() over at least ``least`` calls or ``budget_s`` seconds."""
    for _ in range(10):
        run()
    cpu, wall = [], []
    start = time.perf_counter()
    while len(cpu) < least or time.perf_counter() - start < budget_s:
        c0, t0 = time.process_time(), time.perf_counter()
        run()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"cpu_ms": statistics.median(cpu) * 1e3, "wall_ms": statistics.median(wall) * 1e3, "runs": len(cpu)}


def _one_node(s: int, heads: int = 12, head_dim: int = 32) -> tuple[Any, dict[str, Any]]:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    from ortflash.op import spec
    from ortflash.op.side_channel import SideChannel

    attrs = spec.validate({"scale": head_dim**-0.5})
    declared = {n: attrs[n] for n in spec.DECLARED if n != "exact_floats"}
    declared["exact_floats"] = SideChannel.of_attributes(attrs).encode()
    inits = [
        onnx.numpy_helper.from_array(np.array(0.0, np.float32), "bias"),
        onnx.numpy_helper.from_array(np.array(True), "mask"),
    ]
    node = helper.make_node(spec.OP_TYPE, ["q", "k", "v", "bias", "mask"], ["o"], domain=spec.DOMAIN, **declared)
    dims = [1, heads, s, head_dim]
    graph = helper.make_graph(
        [node],
        "one",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims) for n in "qkv"],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, dims)],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(spec.DOMAIN, 1)]
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(dims, dtype=np.float32) for n in "qkv"}
    return helper.make_model(graph, opset_imports=opsets, ir_version=8), {"feeds": feeds, "attrs": attrs}


def _session_options() -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    return so


def overhead_worker(s: int, path: str, budget_s: float) -> dict[str, Any]:
    import ortflash
    from ortflash.kernels import cpu

    model, case = _one_node(s)
    f = case["feeds"]
    if path == "empty":  # ONNX Runtime's own cost of a run on the same feeds: one Identity node
        import onnx
        import onnxruntime as ort

        graph = model.graph
        del graph.node[:]
        graph.node.append(onnx.helper.make_node("Identity", ["q"], ["o"]))
        del graph.initializer[:]
        plain = ort.InferenceSession(model.SerializeToString(), _session_options(), providers=["CPUExecutionProvider"])
        return _timed(lambda: plain.run(None, f), budget_s, 200)
    if path == "kernel":
        prepared = cpu.prepare(case["attrs"], threads=1)
        assert prepared is not None
        return _timed(lambda: prepared(f["q"], f["k"], f["v"], None, None), budget_s, 200)
    session = ortflash.InferenceSession(model, threads=1, sess_options=_session_options(), native=path == "native")
    assert session.native_nodes == (1 if path == "native" else 0)
    return _timed(lambda: session.run(None, f), budget_s, 200)


def _fused_once(name: str, original: Any) -> Any:
    """The forced fusion of a model, written once per run folder for the workers that follow."""
    import onnx

    import ortflash

    cached = Path(os.environ.get("NATIVE_OP_CACHE", "/tmp/native_op_fused")) / f"{name.replace(':', '_')}.onnx"
    if cached.exists():
        return onnx.load(str(cached))
    fused, _ = ortflash.optimize(original, softmax="online", min_seq_len=0, target="ortflash")
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(f".{os.getpid()}.tmp")
    onnx.save(fused, str(partial))
    partial.rename(cached)
    return fused


def models_worker(name: str, variant: str, s: int, budget_s: float) -> dict[str, Any]:
    import onnx
    import onnxruntime as ort

    import ortflash
    from ortflash.bench.inputs import bench_feeds

    path = model_path(name)
    original = onnx.load(str(path))
    f = bench_feeds(original, s, batch=1)
    if variant == "original":
        session: Any = ort.InferenceSession(str(path), _session_options(), providers=["CPUExecutionProvider"])
        nodes = 0
    else:
        fused = _fused_once(name, original)
        session = ortflash.InferenceSession(
            fused,
            threads=1,
            softmax="online",
            min_seq_len=0,
            sess_options=_session_options(),
            native=variant == "native",
        )
        nodes = session.native_nodes
    return {**_timed(lambda: session.run(None, f), budget_s, 20), "native_nodes": nodes}


def run_check(models: list[str], seq_lens: list[int]) -> dict[str, Any]:
    """Native against bridge on whole models: forced fusion (naive and online), batch 2 with padding masks;
    the largest difference of any output (0.0: bit-identical) and the node counts."""
    import numpy as np
    import onnx

    import ortflash
    from ortflash.bench.inputs import bench_feeds
    from ortflash.kernels import native_op

    out: dict[str, Any] = {"machine": _machine(), "models": {}}
    for name in models:
        original = onnx.load(str(model_path(name)))
        for softmax in ("naive", "online"):
            fused, report = ortflash.optimize(original, softmax=softmax, min_seq_len=0, target="ortflash")
            native = ortflash.InferenceSession(fused, threads=1)
            bridge = ortflash.InferenceSession(fused, threads=1, native=False)
            for s in seq_lens:
                f = bench_feeds(original, s, batch=2)
                before = native_op.calls()
                got = native.run(None, f)
                calls = native_op.calls() - before
                want = bridge.run(None, f)
                diff = max(
                    float(np.max(np.abs(a.astype(np.float64) - b))) if a.size else 0.0 for a, b in zip(got, want)
                )
                row = {
                    "fused": report.fused,
                    "native_nodes": native.native_nodes,
                    "native_calls": calls,
                    "max_diff": diff,
                }
                out["models"].setdefault(name, {})[f"{softmax} S={s}"] = row
                print(name, softmax, s, row, file=sys.stderr, flush=True)
    return out


def _spawn(args: list[str]) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, __file__, "worker", *args], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _machine() -> dict[str, Any]:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    model = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")), "?")
    return {"cpu": model, "cores": os.cpu_count(), "load_start": os.getloadavg(), "date": time.strftime("%F %T %Z")}


def run_overhead(seq_lens: list[int], rounds: int, budget_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {"machine": _machine(), "runs": {}}
    for r in range(rounds):
        order = OVERHEAD_PATHS if r % 2 == 0 else tuple(reversed(OVERHEAD_PATHS))
        for s in seq_lens:
            for path in order:
                res = _spawn(["overhead", str(s), path, str(budget_s)])
                out["runs"].setdefault(str(s), {}).setdefault(path, []).append(res)
                print(f"round {r + 1} S={s} {path}: {res}", file=sys.stderr, flush=True)
    out["machine"]["load_end"] = os.getloadavg()
    out["summary"] = {
        s: {p: round(statistics.median(x["cpu_ms"] * 1e3 for x in rs if "cpu_ms" in x), 1) for p, rs in paths.items()}
        for s, paths in out["runs"].items()
    }  # microseconds, median over rounds
    return out


def run_models(
    models: list[str], seq_lens: list[int], rounds: int, budget_s: float, variants: tuple[str, ...] = MODEL_VARIANTS
) -> dict[str, Any]:
    out: dict[str, Any] = {"machine": _machine(), "runs": {}, "variants": list(variants)}
    for r in range(rounds):
        order = variants if r % 2 == 0 else tuple(reversed(variants))
        for name in models:
            for s in seq_lens:
                for variant in order:
                    res = _spawn(["models", name, variant, str(s), str(budget_s)])
                    out["runs"].setdefault(name, {}).setdefault(str(s), {}).setdefault(variant, []).append(res)
                    print(f"round {r + 1} {name} S={s} {variant}: {res}", file=sys.stderr, flush=True)
    out["machine"]["load_end"] = os.getloadavg()
    ratios: dict[str, Any] = {}
    every: dict[str, list[float]] = {"native": [], "bridge": []}
    for name, by_s in out["runs"].items():
        for s, variants in by_s.items():
            med = {
                v: statistics.median(x["cpu_ms"] for x in rs if "cpu_ms" in x)
                for v, rs in variants.items()
                if any("cpu_ms" in x for x in rs)
            }
            if "original" not in med:
                continue
            row = {v: round(med["original"] / med[v], 3) for v in ("native", "bridge") if v in med}
            row["original_ms"] = round(med["original"], 3)
            ratios.setdefault(name, {})[s] = row
            for v in every:
                if v in row:
                    every[v].append(row[v])
    out["ratios"] = ratios
    out["overall"] = {
        v: {"geomean": round(math.exp(sum(map(math.log, xs)) / len(xs)), 3), "worst": min(xs)}
        for v, xs in every.items()
        if xs
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("overhead", "models", "check", "worker"))
    parser.add_argument("rest", nargs="*")
    parser.add_argument("--models", default="minilm_l3_eager_torchscript,minilm_l6_eager_torchscript")
    parser.add_argument("--seq-lens", default="16,32,64,128,512")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=1.0, help="seconds of timed runs per worker")
    parser.add_argument(
        "--variants",
        default=",".join(MODEL_VARIANTS),
        help="models: which of original,native,bridge to run (original is needed for the ratios)",
    )
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.part == "worker":
        kind, *rest = args.rest
        if kind == "overhead":
            result = overhead_worker(int(rest[0]), rest[1], float(rest[2]))
        else:
            result = models_worker(rest[0], rest[1], int(rest[2]), float(rest[3]))
        print(json.dumps(result))
        return
    seq_lens = [int(x) for x in args.seq_lens.split(",")]
    if args.part == "overhead":
        result = run_overhead(seq_lens, args.rounds, args.budget)
    elif args.part == "check":
        result = run_check(args.models.split(","), seq_lens)
    else:
        variants = tuple(v for v in MODEL_VARIANTS if v in args.variants.split(","))
        if "original" not in variants:
            print("native_op.py: --variants must include original", file=sys.stderr)
            raise SystemExit(2)
        result = run_models(args.models.split(","), seq_lens, args.rounds, args.budget, variants)
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(json.dumps({k: result[k] for k in ("summary", "ratios", "overall", "machine") if k in result}, indent=1))


if __name__ == "__main__":
    main()
