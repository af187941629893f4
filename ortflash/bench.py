"""ortflash.bench: latency and peak memory of a model's variants against sequence length.

Every (variant, sequence length) pair runs in its OWN worker process
(``python -m ortflash.bench --worker CFG.json``), so one variant's memory, arena
or thread pools never touch another's measurement. A worker:

1. builds its variant from the model file:
   ``original``  the model as given;
   ``naive`` / ``online``  ``ortflash.optimize`` with that softmax (online from key length 0,
                 ``block_size`` keys per tile), run through ortflash's numpy kernel in
                 onnxruntime-extensions' Python-op bridge;
   ``contrib`` / ``onnx``  the naive fusion lowered by ``ortflash.rewrites.lower.lower(model,
                 target)`` to com.microsoft MultiHeadAttention or ONNX Attention-23 (recorded as
                 unavailable when that module is missing);
   ``LABEL=PATH.onnx``  any other model file, run as it is (same inputs);
2. creates an ONNX Runtime CPU session (default session options: all graph optimizations, the
   CPU memory arena, ORT's default thread count), counts the attention-related ops left in
   ORT's *optimized* graph (so an ORT-side fusion of the "original" would show);
3. runs it on ``ortflash.verify.make_feeds(model, seq_len=S, batch=B, seed=0)`` (padding
   attention masks: item 0 is padded at the end), the first run cold, then warm-ups, then the
   timed runs (``repeats``, fewer when one run is long: see ``time_budget_s``);
4. reports the median latency and memory (below) and, for the ortflash variants, where the time of
   the FlashAttention nodes goes (numpy kernel vs the Python-op bridge), plus an optional ORT
   profile run (per-op time).

Memory, in MiB (``memory_mb`` of each result):
  ``inference_peak``  peak resident set size during the runs minus the RSS just before the first
                      run: what inference allocates (activations, workspaces, arena growth).
                      Linux: the kernel's high-water mark (VmHWM) is reset by writing 5 to
                      /proc/self/clear_refs before the runs and read after them, so the peak is
                      exact, not sampled. Elsewhere a 1 ms RSS sampling thread estimates it.
  ``process_peak``    VmHWM from session creation to the end of the timed runs (absolute: the
                      interpreter, onnxruntime, the weights, and inference).
  ``ru_maxrss``       getrusage's peak RSS of the whole worker, model building included.
The memory targets in the benchmarks compare ``inference_peak``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

VARIANTS = ("original", "naive", "online", "contrib", "onnx")
DEFAULT_SEQ_LENS = (512, 1024, 2048, 4096, 8192)
ORTFLASH_VARIANTS = ("naive", "online")
LOWERED_VARIANTS = ("contrib", "onnx")
ATTENTION_OPS = (
    "FlashAttention", "Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention",
    "PackedMultiHeadAttention", "DecoderMaskedMultiHeadAttention", "DecoderAttention", "SparseAttention",
    "Softmax",
)
MIB = 2**20
_ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- machine, versions


def machine_info() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    mem = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "cpu": cpu,
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "memory_gib": mem,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


VERSIONED = ("ortflash", "onnxruntime", "onnxruntime-extensions", "onnx", "onnx-ir", "numpy", "onnxscript")


def versions(packages=VERSIONED) -> dict:
    """Installed versions of the packages that decide a result, for the results files."""
    from importlib import metadata

    out = {}
    for pkg in packages:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def _loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# ----------------------------------------------------------------------------- memory


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource

        return _maxrss_bytes(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _maxrss_bytes(v: int) -> int:
    return v if sys.platform == "darwin" else v * 1024


def _hwm() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakProbe:
    """Peak RSS between start() and stop(): the kernel's reset high-water mark, else sampling."""

    def __init__(self, interval: float = 0.001):
        self.exact = _reset_hwm() and _hwm() is not None and _hwm() <= _rss() + 4 * MIB
        self.method = ("VmHWM reset through /proc/self/clear_refs (exact)" if self.exact
                       else f"RSS sampled every {interval * 1000:g} ms (estimate)")
        self.interval = interval
        self._peak = 0
        self._stop = threading.Event()
        self._thread = None

    def start(self) -> None:
        if self.exact:
            _reset_hwm()
            return
        self._peak = _rss()
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self):
        while not self._stop.is_set():
            self._peak = max(self._peak, _rss())
            time.sleep(self.interval)

    def stop(self) -> int:
        if self.exact:
            return max(_hwm() or 0, _rss())
        self._stop.set()
        self._thread.join()
        return max(self._peak, _rss())


# ----------------------------------------------------------------------------- worker


def _count_ops(model) -> dict:
    counts = {}
    def walk(graph):
        for n in graph.node:
            if n.op_type in ATTENTION_OPS:
                key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
                counts[key] = counts.get(key, 0) + 1
            for a in n.attribute:
                if a.g is not None and a.g.node:
                    walk(a.g)
                for g in a.graphs:
                    walk(g)
    walk(model.graph)
    return counts


def _uses_custom_ops(model) -> bool:
    from . import spec

    return any(n.domain == spec.DOMAIN for n in model.graph.node)


def lower_function():
    """ortflash.rewrites.lower.lower when that module exists, else None."""
    try:
        from .rewrites.lower import lower
    except ImportError:
        return None
    return lower


def parse_variant(variant: str) -> tuple[str, str, int | None, str | None]:
    """'online@512' -> (label, kind, block size, path); 'mha=m.onnx' -> ('mha', 'file', None, 'm.onnx')."""
    if "=" in variant:
        label, path = variant.split("=", 1)
        return label, "file", None, path
    kind, _, bs = variant.partition("@")
    if kind not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}: use one of {', '.join(VARIANTS)} "
                         "(optionally @BLOCK_SIZE) or LABEL=PATH.onnx")
    if bs and (not bs.isdigit() or int(bs) < 1):
        raise ValueError(f"{variant!r}: the block size after @ must be a positive integer")
    return variant, kind, int(bs) if bs else None, None


def build_variant(model_path: str, variant: str, block_size: int = 64) -> tuple:
    """(ModelProto, info dict, softmax mode or None, block size) of one variant; raises with a reason."""
    from .optimize import load, optimize

    label, kind, bs, path = parse_variant(variant)
    block_size = bs or block_size
    if kind == "file":
        return load(path), {"source": path}, None, block_size
    original = load(model_path)
    if kind == "original":
        return original, {}, None, block_size
    if kind in ORTFLASH_VARIANTS:
        model, report = optimize(original, softmax=kind, block_size=block_size, min_seq_len=0)
        info = {"blocks": len(report.blocks), "fused": report.fused, "block_size": block_size}
        if not report.fused:
            info["note"] = "no block fused: the variant is the original model"
        return model, info, kind, block_size
    lower = lower_function()
    if lower is None:
        raise _Unavailable("ortflash.rewrites.lower is not in this tree")
    fused, report = optimize(original, softmax="naive", block_size=block_size, min_seq_len=0)
    lowered, notes = lower(fused, kind)
    if not isinstance(lowered, type(original)):  # an onnx_ir model
        import onnx_ir as ir

        lowered = ir.serde.serialize_model(lowered)
    info = {"blocks": len(report.blocks), "fused": report.fused,
            "lower_notes": [str(n) for n in (notes or [])][:20]}
    return lowered, info, None, block_size


class _Unavailable(RuntimeError):
    """A variant this tree cannot build (not a failure of the variant)."""


class _BridgeTimer:
    """Times the FlashAttention nodes' Python side: the numpy kernel, the op body, and the
    whole bridge hook (body + onnxruntime-extensions' flatten().tolist() of the output)."""

    def __init__(self):
        from onnxruntime_extensions import _ocos

        from .kernels import ort_bridge as ort_op

        self.t = {"kernel": 0.0, "body": 0.0, "hook": 0.0, "calls": 0}
        kernel_of = ort_op._kernel

        def timed_kernel(backend):
            k = kernel_of(backend)

            def run(*a, **kw):
                t0 = time.perf_counter()
                try:
                    return k(*a, **kw)
                finally:
                    self.t["kernel"] += time.perf_counter() - t0
            return run

        ort_op._kernel = timed_kernel
        for opdef in _ocos.Opdef._odlist.values():
            if getattr(opdef, "op_type", None) == "FlashAttention":
                body = opdef.body

                def timed_body(*a, _body=body, **kw):
                    t0 = time.perf_counter()
                    try:
                        return _body(*a, **kw)
                    finally:
                        self.t["body"] += time.perf_counter() - t0
                opdef.body = timed_body
        hook = _ocos._on_pyop_invocation

        def timed_hook(k_id, feed, attributes):
            t0 = time.perf_counter()
            try:
                return hook(k_id, feed, attributes)
            finally:
                self.t["hook"] += time.perf_counter() - t0
                self.t["calls"] += 1
        _ocos.PyCustomOpDef.install_hooker(timed_hook)

    def take(self) -> dict:
        out = dict(self.t)
        for k in self.t:
            self.t[k] = 0 if k == "calls" else 0.0
        return out


def _session(model, mode, block_size, so):
    import onnxruntime as ort

    if mode is not None:
        from .session import InferenceSession

        return InferenceSession(model, softmax=mode, block_size=block_size, min_seq_len=0, sess_options=so)
    if _uses_custom_ops(model):
        from .kernels import ort_bridge as ort_op

        so.register_custom_ops_library(ort_op.library_path())
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _session_options(threads: int | None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    return so


def _profile(model, mode, block_size, feeds, tmp, timer=None, threads=None) -> dict:
    """One warm, profiled run in a fresh session: milliseconds per op type."""
    so = _session_options(threads)
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tmp, "profile")
    sess = _session(model, mode, block_size, so)
    sess.run(None, feeds)
    inner = getattr(sess, "_session", sess)
    # the profile covers both runs; keep the second (warm) one
    if timer:
        timer.take()
    sess.run(None, feeds)
    hook = timer.take()["hook"] * 1000 if timer else None
    path = inner.end_profiling()
    with open(path) as f:
        events = json.load(f)
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    start = runs[-1]["ts"] if runs else 0
    per_op, nodes = {}, 0.0
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time") or e["ts"] < start:
            continue
        op = e.get("args", {}).get("op_name", "?")
        per_op[op] = per_op.get(op, 0.0) + e["dur"] / 1000
        nodes += e["dur"] / 1000
    os.remove(path)
    total = runs[-1]["dur"] / 1000 if runs else None
    top = dict(sorted(per_op.items(), key=lambda kv: -kv[1])[:8])
    out = {"run_ms": total, "nodes_ms": round(nodes, 3), "per_op_ms": {k: round(v, 3) for k, v in top.items()}}
    if hook is not None:
        out["bridge_hook_ms"] = round(hook, 3)
    return out


def _status(path, text):
    if path:
        try:
            with open(path, "w") as f:
                f.write(text)
        except OSError:
            pass


def run_worker(cfg: dict) -> dict:
    """Build one variant, run it at one sequence length, measure. Runs inside the worker process."""
    import resource

    from .verify import make_feeds

    status = cfg.get("status_file")
    out = {"variant": cfg["variant"], "seq_len": cfg["seq_len"], "batch": cfg["batch"], "pid": os.getpid()}
    _status(status, "building")
    t0 = time.perf_counter()
    model, info, mode, block_size = build_variant(cfg["model"], cfg["variant"], cfg["block_size"])
    out["build"] = {**info, "seconds": round(time.perf_counter() - t0, 2), "model_ops": _count_ops(model)}
    feeds = make_feeds(model, seq_len=cfg["seq_len"], batch=cfg["batch"], seed=0, dims=cfg.get("dims"))
    out["feeds"] = {k: list(v.shape) for k, v in feeds.items()}
    timer = _BridgeTimer() if mode is not None else None

    probe = PeakProbe()
    out["memory_method"] = probe.method
    tmp = tempfile.mkdtemp(prefix="ortflash-bench-")
    so = _session_options(cfg.get("threads"))
    opt_path = os.path.join(tmp, "optimized.onnx")
    so.optimized_model_filepath = opt_path
    _status(status, "creating the session")
    rss_build = _rss()
    probe.start()
    t0 = time.perf_counter()
    sess = _session(model, mode, block_size, so)
    out["session_seconds"] = round(time.perf_counter() - t0, 2)
    peak_session = probe.stop()
    try:
        import onnx

        out["ort_graph_ops"] = _count_ops(onnx.load(opt_path, load_external_data=False))
    except Exception as exc:  # the optimized graph is informative only
        out["ort_graph_ops"] = {"error": f"{type(exc).__name__}: {str(exc)[:120]}"}
    for p in Path(tmp).glob("optimized.onnx*"):
        p.unlink()

    names = [o.name for o in sess.get_outputs()]
    rss_before = _rss()
    _status(status, "cold run")
    probe.start()
    t0 = time.perf_counter()
    sess.run(names, feeds)
    cold = time.perf_counter() - t0
    if timer:
        timer.take()
    for i in range(cfg["warmup"] - 1):
        _status(status, f"warm-up {i + 2}/{cfg['warmup']}")
        sess.run(names, feeds)
    peak_warm = probe.stop()
    if timer:
        timer.take()

    budget = cfg.get("time_budget_s") or 0
    repeats = cfg["repeats"]
    if budget and cold > 0:
        repeats = min(repeats, max(cfg.get("min_repeats", 3), int(budget / cold)))
    times, cpu, bridge = [], [], []
    probe.start()
    for i in range(repeats):
        _status(status, f"run {i + 1}/{repeats}")
        c0 = time.process_time()
        t0 = time.perf_counter()
        sess.run(names, feeds)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        if timer:
            bridge.append(timer.take())
    peak_timed = probe.stop()
    ru = _maxrss_bytes(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)

    med = statistics.median(times)
    out["latency_ms"] = {
        "median": round(med * 1000, 3),
        "min": round(min(times) * 1000, 3),
        "max": round(max(times) * 1000, 3),
        "cold": round(cold * 1000, 3),
        "runs": [round(t * 1000, 3) for t in times],
        "repeats": repeats,
        "warmup": cfg["warmup"],
        # CPU time of all the worker's threads during a run (spinning thread-pool threads included):
        # less sensitive than wall time to other jobs on a shared machine
        "cpu_median": round(statistics.median(cpu) * 1000, 3),
        "cpu_runs": [round(t * 1000, 3) for t in cpu],
    }
    out["memory_mb"] = {
        "inference_peak": round((max(peak_warm, peak_timed) - rss_before) / MIB, 1),
        "steady_peak": round((peak_timed - rss_before) / MIB, 1),
        "process_peak": round(max(peak_session, peak_warm, peak_timed) / MIB, 1),
        "session_growth": round((rss_before - rss_build) / MIB, 1),
        "ru_maxrss": round(ru / MIB, 1),
    }
    if timer and bridge:
        k = statistics.median(b["kernel"] for b in bridge) * 1000
        body = statistics.median(b["body"] for b in bridge) * 1000
        hook = statistics.median(b["hook"] for b in bridge) * 1000
        out["bridge_ms"] = {
            "kernel": round(k, 3),  # numpy FlashAttention alone, all nodes of one run
            "op_body": round(body, 3),  # + unpacking the neutral inputs, ascontiguousarray
            "hook": round(hook, 3),  # + output.flatten().tolist() in onnxruntime-extensions
            "tolist": round(hook - body, 3),
            "calls_per_run": bridge[0]["calls"],
        }
    del sess
    if cfg.get("profile"):
        _status(status, "profile run")
        try:
            out["profile"] = _profile(model, mode, block_size, feeds, tmp, timer, cfg.get("threads"))
            if "bridge_ms" in out:
                node = out["profile"]["per_op_ms"].get("FlashAttention")
                hook = out["profile"].get("bridge_hook_ms")
                if node is not None and hook is not None:
                    out["bridge_ms"]["ort_node"] = node
                    # C++ side of the bridge (inputs into numpy, the Python list back into a
                    # tensor): the nodes' time in ORT's profile minus the Python hook, same run
                    out["bridge_ms"]["marshal"] = round(node - hook, 3)
        except Exception as exc:
            out["profile"] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    try:
        os.rmdir(tmp)
    except OSError:
        pass
    out["status"] = "ok"
    out["numpy_threads_env"] = {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS") if k in os.environ}
    return out


def _worker_main(cfg_path: str) -> int:
    with open(cfg_path) as f:
        cfg = json.load(f)
    try:
        res = run_worker(cfg)
    except MemoryError:
        res = {"status": "error", "error": "MemoryError"}
    except _Unavailable as exc:
        res = {"status": "unavailable", "error": f"unavailable: {exc}"}
    except Exception as exc:  # reported to the parent as a failed measurement
        msg = str(exc).strip().splitlines()
        res = {"status": "error", "error": f"{type(exc).__name__}: {msg[0][:300] if msg else ''}"}
    with open(cfg["result_file"], "w") as f:
        json.dump(res, f)
    return 0


# ----------------------------------------------------------------------------- parent


def _run_one(cfg: dict, timeout: float, tick=None) -> dict:
    with tempfile.TemporaryDirectory(prefix="ortflash-bench-") as tmp:
        cfg = {**cfg, "result_file": os.path.join(tmp, "result.json"), "status_file": os.path.join(tmp, "status")}
        cfg_path = os.path.join(tmp, "cfg.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        env = dict(os.environ)
        env["PYTHONPATH"] = str(_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        if cfg.get("threads"):  # numpy's BLAS reads these when it loads
            for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
                env[var] = str(cfg["threads"])
        log = open(os.path.join(tmp, "log"), "w+")
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "ortflash.bench", "--worker", cfg_path],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
        timed_out = False
        while proc.poll() is None:
            if time.monotonic() - t0 > timeout:
                proc.kill()
                proc.wait()
                timed_out = True
                break
            if tick:
                try:
                    with open(cfg["status_file"]) as f:
                        tick(f.read())
                except OSError:
                    pass
            time.sleep(0.2)
        wall = round(time.monotonic() - t0, 1)
        base = {"variant": cfg["variant"], "seq_len": cfg["seq_len"], "batch": cfg["batch"], "wall_s": wall}
        if timed_out:
            return {**base, "status": "timeout", "error": f"no result within {timeout:g} s"}
        try:
            with open(cfg["result_file"]) as f:
                return {**json.load(f), **base}
        except (OSError, json.JSONDecodeError):
            log.seek(0)
            tail = [line for line in log.read().strip().splitlines() if line.strip()][-3:]
            why = "killed (out of memory?)" if proc.returncode in (-9, 137) else f"exit code {proc.returncode}"
            return {**base, "status": "error", "error": f"worker {why}: {' | '.join(tail)[-300:]}"}
        finally:
            log.close()


def bench(
    model_path,
    seq_lens=DEFAULT_SEQ_LENS,
    variants=VARIANTS,
    batch: int = 1,
    repeats: int = 5,
    out_dir=None,
    *,
    warmup: int = 1,
    block_size: int = 64,
    time_budget_s: float = 60.0,
    timeout_s: float = 900.0,
    rounds: int = 1,
    rounds_max_seq: int | None = None,
    threads: int | None = None,
    max_seq_len: dict | None = None,
    profile: bool | int = True,
    dims: dict | None = None,
    name: str = "bench",
    title: str | None = None,
    notes: list | None = None,
    plot: bool = True,
    console=None,
    progress: bool = True,
) -> dict:
    """Median latency and peak memory of each variant at each sequence length, one process each.

    Returns the results dict; with ``out_dir`` also writes NAME.json, NAME.md and (matplotlib
    installed) NAME.png there. ``max_seq_len={"naive": 4096}`` skips a variant above a length;
    a variant that times out or fails is not run at larger lengths. ``profile``: True, False, or
    the largest sequence length to profile (one extra warm run in a second session).
    ``time_budget_s``: fewer timed runs (at least 3) when ``repeats`` cold-run times exceed it.
    ``rounds``: measure every (variant, S) that many times, in alternating order (forward, reversed),
    each time in a fresh process (only up to ``rounds_max_seq`` when given); latency is then the
    median over all rounds' timed runs and memory the largest round's. ``threads``: ONNX Runtime's
    intra-op threads and numpy's BLAS threads in every worker (default: each library's own).
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = console or Console()
    model_path = os.fspath(model_path)
    if not os.path.exists(model_path):
        from .optimize import OrtflashError

        raise OrtflashError(f"{model_path}: no such file")
    seq_lens = [int(s) for s in seq_lens]
    variants = list(variants)
    for v in variants:
        parse_variant(v)  # a bad name fails here, before any worker starts
    max_seq_len = dict(max_seq_len or {})
    results = {
        "name": name,
        "title": title or f"ortflash bench: {os.path.basename(model_path)}",
        "model": model_path,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_info(),
        "versions": versions(),
        "config": {"seq_lens": seq_lens, "variants": variants, "batch": batch, "repeats": repeats, "warmup": warmup,
                   "block_size": block_size, "time_budget_s": time_budget_s, "timeout_s": timeout_s,
                   "max_seq_len": max_seq_len, "profile": profile,
                   "rounds": rounds, "rounds_max_seq": rounds_max_seq, "threads": threads},
        "lower_available": lower_function() is not None,
        "notes": list(notes or []),
        "loadavg_start": _loadavg(),
        "runs": [],
    }
    stopped: dict[str, str] = {}
    todo = []
    for s in seq_lens:
        n = rounds if rounds_max_seq is None or s <= rounds_max_seq else 1
        for r in range(max(1, n)):
            # round 0 in the given order, then reversed, and so on: a load that drifts during the
            # run then weighs on every variant alike
            todo += [(s, v, r) for v in (variants if r % 2 == 0 else variants[::-1])]
    raw: dict[tuple, list] = {}
    # Every worker reads the same bytes, even if the file is rewritten while the benchmark runs.
    snapshot = tempfile.TemporaryDirectory(prefix="ortflash-bench-model-")
    model_copy = os.path.join(snapshot.name, os.path.basename(model_path))
    shutil.copyfile(model_path, model_copy)
    for extra in Path(model_path).parent.glob(Path(model_path).name + ".data"):
        shutil.copyfile(extra, os.path.join(snapshot.name, extra.name))
    with snapshot, Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, disable=not progress, transient=False) as bar:
        task = bar.add_task("bench", total=len(todo))
        for s, v, rnd in todo:
            label = parse_variant(v)[0]
            base = {"variant": label, "seq_len": s, "batch": batch, "round": rnd}
            runs = raw.setdefault((s, v), [])
            if v in stopped:
                runs.append({**base, "status": "skipped", "error": stopped[v]})
                bar.advance(task)
                continue
            if label in max_seq_len and s > max_seq_len[label]:
                runs.append({**base, "status": "skipped", "error": f"above the chosen limit S <= {max_seq_len[label]}"})
                bar.advance(task)
                continue
            prof = (profile if isinstance(profile, bool) else s <= int(profile)) and rnd == 0
            cfg = {"model": model_copy, "variant": v, "seq_len": s, "batch": batch, "repeats": repeats,
                   "warmup": max(1, warmup), "block_size": block_size, "time_budget_s": time_budget_s,
                   "profile": prof, "dims": dims, "threads": threads}
            desc = f"S={s:<5d} {label:<9s}" + (f" round {rnd + 1}" if rounds > 1 else "")
            bar.update(task, description=desc)
            res = _run_one(cfg, timeout_s, tick=lambda text, d=desc: bar.update(task, description=f"{d} {text}"))
            res.update(variant=label, round=rnd)
            runs.append(res)
            if res["status"] == "ok":
                bar.console.print(f"  {desc} {res['latency_ms']['median']:10.1f} ms  "
                                  f"{res['memory_mb']['inference_peak']:8.1f} MiB  ({res['wall_s']} s)")
            else:
                bar.console.print(f"  {desc} {res['status']}: {res.get('error', '')}")
                if res["status"] in ("timeout", "error", "unavailable"):
                    stopped[v] = (f"not run: {res['status']} at S={s}" if res["status"] != "unavailable"
                                  else res.get("error", "unavailable"))
            bar.advance(task)
    results["runs"] = [merge_rounds(raw[(s, v)]) for s in seq_lens for v in variants if (s, v) in raw]
    results["loadavg_end"] = _loadavg()
    results["ratios"] = ratios(results)
    print_table(results, console)
    if out_dir is not None:
        paths = write_results(results, out_dir, name, plot=plot, console=console)
        results["files"] = paths
    return results


# ----------------------------------------------------------------------------- reporting


def merge_rounds(runs: list[dict]) -> dict:
    """One result from the rounds of one (variant, S): all timed runs pooled, the largest memory."""
    ok = [r for r in runs if r.get("status") == "ok"]
    if not ok:
        return dict(runs[-1])
    if len(ok) == 1 and len(runs) == 1:
        return dict(ok[0])
    out = dict(ok[0])
    times = [t for r in ok for t in r["latency_ms"]["runs"]]
    cpu = [t for r in ok for t in r["latency_ms"].get("cpu_runs", [])]
    out["latency_ms"] = {**ok[0]["latency_ms"], "median": round(statistics.median(times), 3), "min": min(times),
                         "max": max(times), "runs": times, "repeats": len(times),
                         "round_medians": [r["latency_ms"]["median"] for r in ok]}
    if cpu:
        out["latency_ms"].update(cpu_median=round(statistics.median(cpu), 3), cpu_runs=cpu)
    out["memory_mb"] = {k: max(r["memory_mb"][k] for r in ok) for k in ok[0]["memory_mb"]}
    out["memory_mb"]["round_inference_peaks"] = [r["memory_mb"]["inference_peak"] for r in ok]
    if all("bridge_ms" in r for r in ok):
        out["bridge_ms"] = {**ok[0]["bridge_ms"], **{k: round(statistics.median(r["bridge_ms"][k] for r in ok), 3)
                                                     for k in ("kernel", "op_body", "hook", "tolist")}}
    out["rounds"] = len(ok)
    out["wall_s"] = round(sum(r.get("wall_s", 0) for r in runs), 1)
    failed = [r for r in runs if r.get("status") != "ok"]
    if failed:
        out["failed_rounds"] = [{"round": r.get("round"), "status": r.get("status"), "error": r.get("error")} for r in failed]
    return out


def _ok(results, variant, s):
    for r in results["runs"]:
        if r["variant"] == variant and r["seq_len"] == s and r.get("status") == "ok":
            return r
    return None


def _variants(results):
    seen = []
    for r in results["runs"]:
        if r["variant"] not in seen:
            seen.append(r["variant"])
    return seen


def ratios(results, baseline: str = "original") -> dict:
    """Per sequence length and variant: speedup (baseline time / variant time) and memory ratios."""
    out = {}
    for s in results["config"]["seq_lens"]:
        base = _ok(results, baseline, s)
        if not base:
            continue
        row = {}
        for v in _variants(results):
            r = _ok(results, v, s)
            if not r:
                continue
            bm, rm = base["memory_mb"], r["memory_mb"]
            bc, rc = base["latency_ms"].get("cpu_median"), r["latency_ms"].get("cpu_median")
            row[v] = {
                "speedup": round(base["latency_ms"]["median"] / r["latency_ms"]["median"], 3),
                "cpu_speedup": round(bc / rc, 3) if bc and rc else None,
                "inference_memory": round(rm["inference_peak"] / bm["inference_peak"], 3) if bm["inference_peak"] > 0 else None,
                "process_memory": round(rm["process_peak"] / bm["process_peak"], 3),
            }
        out[str(s)] = row
    return out


def _cell(results, v, s, key):
    r = _ok(results, v, s)
    if not r:
        for x in results["runs"]:
            if x["variant"] == v and x["seq_len"] == s:
                return {"skipped": "skip", "timeout": "timeout", "unavailable": "n/a"}.get(x.get("status"), "error")
        return ""
    rat = results.get("ratios", {}).get(str(s), {}).get(v, {})
    if key in ("latency", "cpu"):
        val = r["latency_ms"]["median" if key == "latency" else "cpu_median"]
        if val is None:
            return ""
        text = f"{val:,.0f} ms" if val >= 100 else f"{val:.1f} ms"
        sp = rat.get("speedup" if key == "latency" else "cpu_speedup")
        return text + (f" ({sp:.2f}x)" if sp is not None and v != "original" else "")
    mem = r["memory_mb"]["inference_peak" if key == "memory" else "process_peak"]
    ratio = rat.get("inference_memory" if key == "memory" else "process_memory")
    return f"{mem:,.0f} MiB" + (f" ({ratio:.2f}x)" if ratio is not None and v != "original" else "")


def print_table(results, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    variants = _variants(results)
    for key, title in (("latency", "median latency (speedup vs original)"),
                       ("memory", "inference peak memory above the loaded session (ratio vs original)")):
        table = Table(title=f"{results['title']}: {title}", title_justify="left")
        table.add_column("S", justify="right")
        for v in variants:
            table.add_column(v, justify="right")
        for s in results["config"]["seq_lens"]:
            table.add_row(str(s), *[_cell(results, v, s, key) for v in variants])
        # a log or pipe gets the whole table unfolded; a terminal gets its own width
        console.print(table, width=None if console.is_terminal else max(console.width, 12 + 20 * len(variants)))


def _md_table(results, key) -> list[str]:
    variants = _variants(results)
    lines = ["| S | " + " | ".join(variants) + " |", "|---:|" + "---:|" * len(variants)]
    for s in results["config"]["seq_lens"]:
        lines.append(f"| {s} | " + " | ".join(_cell(results, v, s, key) for v in variants) + " |")
    return lines


def markdown(results) -> str:
    m, v = results["machine"], results["versions"]
    c = results["config"]
    lines = [
        f"# {results['title']}",
        "",
        f"- date: {results['date']}",
        f"- machine: {m['cpu']}, {m['usable_cores']} usable cores ({m['logical_cores']} logical), "
        f"{m['memory_gib']} GiB, {m['os']}, Python {m['python']}",
        f"- load average at start / end: {results.get('loadavg_start')} / {results.get('loadavg_end')} "
        "(other jobs share this machine: compare the ratios, measured side by side)",
        "- versions: " + ", ".join(f"{k} {x}" for k, x in v.items()),
        f"- threads per worker: {c.get('threads') or 'the libraries default (ORT: one per physical core; numpy BLAS: all cores)'}; "
        f"rounds: {c.get('rounds', 1)}" + (f" (S <= {c['rounds_max_seq']}, one above)" if c.get("rounds_max_seq") and c.get("rounds", 1) > 1 else ""),
        f"- model: `{results['model']}`; batch {c['batch']}; block size {c['block_size']}; "
        f"{c['warmup']} untimed run(s) then up to {c['repeats']} timed runs (at least 3 when one run "
        f"exceeds {c['time_budget_s']:g} s / repeats)",
        "- each (variant, S) ran in its own process; latency is the median of the timed runs of "
        "`session.run` (inputs from `ortflash.verify.make_feeds`, seed 0, padding attention mask)",
        "- memory: peak resident set size during the runs minus the RSS just before the first run "
        "(Linux VmHWM, reset through /proc/self/clear_refs: exact, not sampled), so the interpreter, "
        "onnxruntime and the weights are left out; process peaks are in the JSON",
    ]
    for note in results.get("notes", []):
        lines.append(f"- {note}")
    lines += ["", "## Median latency (speedup vs original, higher is better)", ""] + _md_table(results, "latency")
    lines += ["", "## CPU time per run, all threads (ratio original / variant; less sensitive to other jobs than "
              "wall time, but counts spinning thread-pool threads)", ""] + _md_table(results, "cpu")
    lines += ["", "## Inference peak memory (ratio vs original, lower is better)", ""] + _md_table(results, "memory")
    lines += ["", "## Process peak RSS (session creation and runs, absolute)", ""] + _md_table(results, "process")
    bridge = [r for r in results["runs"] if r.get("status") == "ok" and "bridge_ms" in r]
    if bridge:
        lines += ["", "## Where the ortflash (numpy, Python-op bridge) time goes, per run", "",
                  "kernel: the numpy FlashAttention alone; tolist: onnxruntime-extensions turning the output into "
                  "a Python list (`flatten().tolist()`); marshal: the C++ side of the bridge (inputs into numpy, "
                  "the list back into a tensor), from ORT's profile of the FlashAttention nodes minus the Python "
                  "hook time (the profile is a separate warm run, so columns can disagree by the run-to-run noise); "
                  "share: (ORT node time - kernel time) / median latency.", "",
                  "| S | variant | latency | kernel | op body | tolist | marshal | ORT node | bridge share |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in bridge:
            b = r["bridge_ms"]
            node = b.get("ort_node")
            fmt = lambda x: "" if x is None else f"{x:,.1f}"  # noqa: E731
            if node is not None:
                share = f"{100 * (node - b['kernel']) / r['latency_ms']['median']:.0f}%"
            else:  # no profile run at this length: the Python side only, a lower bound
                share = f">= {100 * (b['hook'] - b['kernel']) / r['latency_ms']['median']:.0f}% (tolist only)"
            lines.append(f"| {r['seq_len']} | {r['variant']} | {fmt(r['latency_ms']['median'])} | {fmt(b['kernel'])} | "
                         f"{fmt(b['op_body'])} | {fmt(b['tolist'])} | {fmt(b.get('marshal'))} | {fmt(node)} | {share} |")
    ops = {}
    for r in results["runs"]:
        if r.get("status") == "ok":
            ops.setdefault(r["variant"], r.get("ort_graph_ops"))
    if ops:
        lines += ["", "## Attention ops in ORT's optimized graph (first sequence length run)", ""]
        for var, counts in ops.items():
            lines.append(f"- {var}: " + (", ".join(f"{k} {n}" for k, n in (counts or {}).items()) or "none"))
    bad = [r for r in results["runs"] if r.get("status") != "ok"]
    if bad:
        lines += ["", "## Not measured", ""]
        for r in bad:
            lines.append(f"- S={r['seq_len']} {r['variant']}: {r['status']}: {r.get('error', '')}")
    lines.append("")
    return "\n".join(lines)


def plot_results(results, path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for v in _variants(results):
        pts = [(s, _ok(results, v, s)) for s in results["config"]["seq_lens"]]
        pts = [(s, r) for s, r in pts if r]
        if not pts:
            continue
        xs = [s for s, _ in pts]
        style = {"color": "black", "linewidth": 2.5, "linestyle": "--"} if v == "original" else {}
        axes[0].plot(xs, [r["latency_ms"]["median"] for _, r in pts], marker="o", label=v, **style)
        axes[1].plot(xs, [max(r["memory_mb"]["inference_peak"], 0.1) for _, r in pts], marker="o", label=v, **style)
    for ax, ylabel in zip(axes, ("median latency (ms)", "inference peak memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(results["config"]["seq_lens"])
        ax.set_xticklabels([str(s) for s in results["config"]["seq_lens"]])
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    m = results["machine"]
    fig.suptitle(f"{results['title']}\n{m['cpu']}, {m['usable_cores']} cores, {results['date']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def write_results(results, out_dir, name="bench", *, plot=True, console=None) -> dict:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": str(out_dir / f"{name}.json"), "md": str(out_dir / f"{name}.md")}
    with open(paths["json"], "w") as f:
        json.dump({k: x for k, x in results.items() if k != "files"}, f, indent=1)
        f.write("\n")
    Path(paths["md"]).write_text(markdown(results))
    if plot:
        png = plot_results(results, out_dir / f"{name}.png")
        if png:
            paths["png"] = png
        elif console is not None:
            console.print("[yellow]matplotlib is not installed: no plot written[/] "
                          "(pip install 'ortflash[plot]' or matplotlib; the JSON and markdown have every number)")
    if console is not None:
        console.print("wrote " + ", ".join(paths.values()))
    return paths


# ----------------------------------------------------------------------------- command line


def _int_list(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers")
    return vals


def _variant_list(text: str) -> list[str]:
    vals = [x for x in text.replace(" ", "").split(",") if x]
    for v in vals:
        try:
            parse_variant(v)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return vals


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `ortflash bench` (the CLI's sub-parser calls this)."""
    p.add_argument("model", help="the .onnx model to measure")
    p.add_argument("--seq-lens", type=_int_list, default=list(DEFAULT_SEQ_LENS),
                   help="comma-separated sequence lengths (default %(default)s)")
    p.add_argument("--variants", type=_variant_list, default=list(VARIANTS),
                   help="comma-separated: original,naive,online,contrib,onnx (naive/online@BLOCK for another tile, "
                        "e.g. online@512) or LABEL=PATH.onnx (default all five)")
    p.add_argument("--batch", type=int, default=1, help="batch size (default %(default)s)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per measurement (default %(default)s)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs first (default %(default)s)")
    p.add_argument("--block-size", type=int, default=64, help="online softmax tile (default %(default)s)")
    p.add_argument("--threads", type=int, default=None,
                   help="ONNX Runtime intra-op and numpy BLAS threads per worker (default: the libraries' own)")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure each (variant, S) this many times, alternating the order (default %(default)s)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per worker before it is killed (default %(default)s)")
    p.add_argument("--no-profile", action="store_true", help="skip the extra ORT-profiled run")
    p.add_argument("--out", default="bench-results", help="folder for bench.json/.md/.png (default %(default)s)")
    p.add_argument("--name", default="bench", help="file stem of the results (default %(default)s)")


def run(args) -> int:
    """`ortflash bench`: returns an exit code (0 when every requested measurement succeeded)."""
    res = bench(args.model, seq_lens=args.seq_lens, variants=args.variants, batch=args.batch,
                repeats=args.repeats, warmup=args.warmup, rounds=args.rounds, threads=args.threads, block_size=args.block_size, timeout_s=args.timeout,
                profile=not args.no_profile, out_dir=args.out, name=args.name)
    return 0 if all(r.get("status") in ("ok", "skipped") for r in res["runs"]) else 1


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return _worker_main(argv[1])
    p = argparse.ArgumentParser(prog="python -m ortflash.bench", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    from .optimize import OrtflashError

    try:
        return run(args)
    except OrtflashError as exc:
        print(f"ortflash bench: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
