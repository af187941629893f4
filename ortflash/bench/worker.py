"""One measurement: one variant at one sequence length, in a process of its own.

``python -m ortflash.bench.worker CFG.json`` builds the variant, opens its session the way
users do (``ortflash.InferenceSession`` for fused models, the production bridge untouched),
runs it on the bench inputs (the first run cold, then warm-ups, then the timed runs), and
writes the result JSON named in the config. For fused variants it then calls the node's
kernel directly on the inputs the fused nodes received, so ``kernel_ms`` beside the session's
median shows what the ONNX Runtime bridge costs.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx

from ..op import spec
from ..op.policy import SoftmaxPolicy
from . import direct, sgemm
from .inputs import bench_feeds
from .probes import MIB, PeakProbe, maxrss, rss
from .variants import (
    BuiltVariant,
    Unavailable,
    build_variant,
    count_ops,
    open_plain_session,
    open_session,
    parse_variant,
    session_options,
)

ISA_ENV = "ORTFLASH_CPU_ISA"


def _status(path: str | None, text: str) -> None:
    """Progress for the parent's spinner (best effort)."""
    if path:
        try:
            Path(path).write_text(text)
        except OSError:
            pass


def _measure(run_once: Callable[[], object], cfg: dict[str, Any], probe: PeakProbe) -> dict[str, Any]:
    """Latency (wall and CPU) and memory of run_once: cold run, warm-ups, then timed runs."""
    status = cfg.get("status_file")
    rss_before = rss()
    _status(status, "cold run")
    probe.start()
    t0 = time.perf_counter()
    run_once()
    cold = time.perf_counter() - t0
    for i in range(cfg["warmup"] - 1):
        _status(status, f"warm-up {i + 2}/{cfg['warmup']}")
        run_once()
    peak_warm = probe.stop()
    repeats = cfg["repeats"]
    budget = cfg.get("time_budget_s") or 0
    if budget and cold > 0:  # fewer timed runs (never below min_repeats) when one run is long
        repeats = min(repeats, max(cfg.get("min_repeats", 3), int(budget / cold)))
    times, cpu = [], []
    probe.start()
    for i in range(repeats):
        _status(status, f"run {i + 1}/{repeats}")
        c0, t0 = time.process_time(), time.perf_counter()
        run_once()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    peak_timed = probe.stop()
    return {
        "latency_ms": {
            "median": round(statistics.median(times) * 1000, 3),
            "min": round(min(times) * 1000, 3),
            "max": round(max(times) * 1000, 3),
            "cold": round(cold * 1000, 3),
            "runs": [round(t * 1000, 3) for t in times],
            "repeats": repeats,
            "warmup": cfg["warmup"],
            # CPU time of all the worker's threads during a run (spinning thread-pool threads
            # included): less sensitive than wall time to other jobs on a shared machine
            "cpu_median": round(statistics.median(cpu) * 1000, 3),
            "cpu_runs": [round(t * 1000, 3) for t in cpu],
        },
        "memory_mb": {
            "inference_peak": round((max(peak_warm, peak_timed) - rss_before) / MIB, 1),
            "steady_peak": round((peak_timed - rss_before) / MIB, 1),
            "process_peak": round(max(peak_warm, peak_timed) / MIB, 1),
        },
    }


def _profile(built: BuiltVariant, feeds: dict, tmp: str, threads: int | None) -> dict[str, Any]:
    """One warm, profiled run in a fresh session: milliseconds per op type."""
    so = session_options(threads)
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tmp, "profile")
    sess = open_plain_session(built, built.model, so, threads)
    sess.run(None, feeds)
    sess.run(None, feeds)  # the profile covers both runs: keep the second (warm) one
    with open(sess.end_profiling()) as f:
        events = json.load(f)
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    start = runs[-1]["ts"] if runs else 0
    per_op: dict[str, float] = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time") and e["ts"] >= start:
            op = e.get("args", {}).get("op_name", "?")
            per_op[op] = per_op.get(op, 0.0) + e["dur"] / 1000
    for p in Path(tmp).glob("profile*"):
        p.unlink()
    top = dict(sorted(per_op.items(), key=lambda kv: -kv[1])[:8])
    # FlashAttention's own time always, for node_over_kernel: on the native op it is cheap enough at
    # short lengths to fall out of the top eight op types
    if spec.OP_TYPE in per_op:
        top[spec.OP_TYPE] = per_op[spec.OP_TYPE]
    return {
        "run_ms": runs[-1]["dur"] / 1000 if runs else None,
        "nodes_ms": round(sum(per_op.values()), 3),
        "per_op_ms": {k: round(v, 3) for k, v in top.items()},
    }


def _capture(built: BuiltVariant, feeds: dict, threads: int | None) -> list[direct.NodeCall]:
    """The fused nodes' inputs, from one run of the variant's session on the exposing model."""
    exposing = direct.exposing_inputs(built.model)
    sess, _ = open_session(built, exposing, session_options(threads), threads)
    return direct.capture_calls(built.model, lambda names: sess.run(names, feeds))


def _measure_session(built: BuiltVariant, feeds: dict, cfg: dict[str, Any], tmp: str) -> dict[str, Any]:
    status, threads = cfg.get("status_file"), cfg.get("threads")
    out: dict[str, Any] = {}
    probe = PeakProbe()
    out["memory_method"] = probe.method
    so = session_options(threads)
    opt_path = os.path.join(tmp, "optimized.onnx")
    so.optimized_model_filepath = opt_path
    _status(status, "creating the session")
    rss_build = rss()
    probe.start()
    t0 = time.perf_counter()
    sess, backend = open_session(built, built.model, so, threads)
    out["session_seconds"] = round(time.perf_counter() - t0, 2)
    peak_session = probe.stop()
    try:
        out["ort_graph_ops"] = count_ops(onnx.load(opt_path, load_external_data=False))
    except Exception as exc:  # noqa: BLE001 (the optimized graph is informative only)
        out["ort_graph_ops"] = {"error": f"{type(exc).__name__}: {str(exc)[:120]}"}
    for p in Path(tmp).glob("optimized.onnx*"):
        p.unlink()
    names = [o.name for o in sess.get_outputs()]
    rss_loaded = rss()
    timed = functools.partial(sess.run, names, feeds)
    out.update(_measure(timed, cfg, probe))
    mem = out["memory_mb"]
    mem["process_peak"] = round(max(mem["process_peak"] * MIB, peak_session) / MIB, 1)
    mem["session_growth"] = round((rss_loaded - rss_build) / MIB, 1)
    mem["ru_maxrss"] = round(maxrss() / MIB, 1)
    del timed, sess  # its memory is not the kernel timing's
    if backend is not None and built.info.get("fused"):
        _status(status, "kernel called directly")
        calls = _capture(built, feeds, threads)
        policy = SoftmaxPolicy.for_new_nodes(built.softmax, None, built.block_size, 0)
        k = direct.time_kernel(calls, backend, policy, threads, out["latency_ms"]["repeats"])
        out["kernel_ms"] = k
        out["attention_flops"] = sum(
            sgemm.attention_flops(c.q.shape, c.k.shape, c.v.shape, int(c.attrs.get("is_causal", 0))) for c in calls
        )
        out["backend"] = backend
        out["isa"] = k.get("isa")
        out["session_over_kernel"] = round(out["latency_ms"]["median"] / k["median"], 3) if k["median"] else None
    if cfg.get("profile"):
        _status(status, "profile run")
        try:
            out["profile"] = _profile(built, feeds, tmp, threads)
        except Exception as exc:  # noqa: BLE001 (per-op times are informative only)
            out["profile"] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        node_ms = out["profile"].get("per_op_ms", {}).get(spec.OP_TYPE)
        if node_ms and out.get("kernel_ms", {}).get("median"):
            # the FlashAttention nodes' time inside ORT against the same kernel called directly:
            # what the bridge costs, without the rest of the graph that session_over_kernel includes
            out["ort_node_ms"] = node_ms
            out["node_over_kernel"] = round(node_ms / out["kernel_ms"]["median"], 3)
    return out


def _measure_torch_peer(built: BuiltVariant, feeds: dict, cfg: dict[str, Any]) -> dict[str, Any]:
    """PyTorch's CPU SDPA over the fused nodes' inputs: one pass over all nodes counts as one run."""
    _status(cfg.get("status_file"), "capturing the attention inputs")
    fused = BuiltVariant(parse_variant("reference"), built.model, built.block_size, built.info)
    calls = _capture(fused, feeds, cfg.get("threads"))
    if not calls:
        raise Unavailable("no block fused: nothing for the peer to run")
    sdpa = direct.torch_sdpa_runner(cfg.get("threads"))
    probe = PeakProbe()
    out: dict[str, Any] = {"memory_method": probe.method, "attention_nodes": len(calls)}
    out.update(_measure(lambda: [sdpa(c) for c in calls], cfg, probe))
    out["memory_mb"]["ru_maxrss"] = round(maxrss() / MIB, 1)
    import torch

    out["torch_threads"] = torch.get_num_threads()
    return out


def run_worker(cfg: dict[str, Any]) -> dict[str, Any]:
    """Build one variant, run it at one sequence length, measure. Runs inside the worker process."""
    status = cfg.get("status_file")
    out: dict[str, Any] = {
        "variant": cfg["variant"],
        "seq_len": cfg["seq_len"],
        "batch": cfg["batch"],
        "pid": os.getpid(),
        "isa_env": os.environ.get(ISA_ENV),
    }
    _status(status, "building")
    t0 = time.perf_counter()
    built = build_variant(cfg["model"], parse_variant(cfg["variant"]), cfg["block_size"])
    out["build"] = {**built.info, "seconds": round(time.perf_counter() - t0, 2), "model_ops": count_ops(built.model)}
    feeds = bench_feeds(built.model, cfg["seq_len"], cfg["batch"], cfg.get("dims"))
    out["feeds"] = {k: list(v.shape) for k, v in feeds.items()}
    if built.name.kind == "torch-sdpa":
        out.update(_measure_torch_peer(built, feeds, cfg))
    else:
        with tempfile.TemporaryDirectory(prefix="ortflash-bench-") as tmp:
            out.update(_measure_session(built, feeds, cfg, tmp))
    out["status"] = "ok"
    out["numpy_threads_env"] = {
        k: os.environ[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS") if k in os.environ
    }
    return out


def main(cfg_path: str) -> int:
    """Run the worker of a config file and write its result (a failure is a result too)."""
    with open(cfg_path) as f:
        cfg = json.load(f)
    try:
        res = run_worker(cfg)
    except MemoryError:
        res = {"status": "error", "error": "MemoryError"}
    except Unavailable as exc:
        res = {"status": "unavailable", "error": f"unavailable: {exc}"}
    except Exception as exc:  # noqa: BLE001 (reported to the parent as a failed measurement)
        msg = str(exc).strip().splitlines()
        res = {"status": "error", "error": f"{type(exc).__name__}: {msg[0][:300] if msg else ''}"}
    with open(cfg["result_file"], "w") as f:
        json.dump(res, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
