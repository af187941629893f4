"""Where the CUDA EP's slow lowered blocks lose their time (issue 31): the static-shape padding block at
batch 2 (1.65-1.74 ms against 0.50-0.59 "symbolic" in cuda_forms.md), the fed-bias block that ran
41-64 ms static, and the length If whose lowered branch ran 56 ms (decode_gpu.md). Three steps:

    python benchmarks/cuda_cudnn_cache.py make build/snap_e/cudnn_run     # here: the models (no weights)
    python3 benchmarks/cuda_cudnn_cache.py run FOLDER --out OUT           # GPU machine: onnxruntime-gpu, torch
    python benchmarks/cuda_cudnn_cache.py table OUT/cuda_cudnn_cache.json # here: the .md

What the run records, per model: the median of alternating rounds (inputs and outputs bound on the GPU)
and every call's time of one round (a cuDNN graph built per call shows as tens of ms on each); the
kernels ORT printed (ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO); the GPU kernels of three runs as CUPTI saw
them (torch.profiler: which kernel ORT picked, and how much of the wall the GPU was busy); and, in a
process of its own with cuDNN's API log on (CUDNN_LOGLEVEL_DBG=3), how many cuDNN graphs were finalized
and executed over 1 + RUNS runs: one build and RUNS + 1 executions is a cached graph, RUNS + 1 builds a
graph built on every call. PyTorch's SDPA with its default backend on the same padding shapes is the peer.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ep_probe  # noqa: E402

HEADS, HEAD_DIM = 16, 64
PADDING_CASES = ((1, 4096), (2, 2048), (2, 4096), (4, 4096))  # (batch, key length) of the exported padding block
FEDBIAS_SEQ = 4096
CAUSAL_SEQ = 4096
IF_PREFILL, IF_PAST = 2048, 2048
ROUNDS, REPEATS, RUNS = 3, 10, 5
LOGGED = re.compile(r"function (cudnn\w+)\(\) called")
# a dry run of the run step where no GPU is (CUDNN_CACHE_DRY=1): the CPU EP, host buffers, no torch
DRY = bool(os.environ.get("CUDNN_CACHE_DRY"))
EP, DEVICE = ("CPUExecutionProvider", "cpu") if DRY else ("CUDAExecutionProvider", "cuda")


def _named_dims(model: Any, names: dict[int, str]) -> Any:
    """A copy of model with dims of its inputs and outputs named (axis -> name)."""
    import onnx

    out = onnx.ModelProto.FromString(model.SerializeToString())
    for value in list(out.graph.input) + list(out.graph.output):
        for axis, name in names.items():
            dims = value.type.tensor_type.shape.dim
            if axis < len(dims):
                dims[axis].dim_param = name
    return out


def _ops(model: Any) -> dict[str, int]:
    from ortflash.model_io import graphs_of

    ops: dict[str, int] = {}
    for g in graphs_of(model.graph):
        for n in g.node:
            ops[n.op_type] = ops.get(n.op_type, 0) + 1
    return ops


def _save(
    folder: str, index: list[dict[str, Any]], group: str, stem: str, variants: dict[str, Any], **facts: Any
) -> None:
    import onnx

    files = {}
    for name, m in variants.items():
        files[name] = f"{stem}.{name}.onnx"
        onnx.save(m, os.path.join(folder, files[name]))
    index.append(
        {"group": group, "stem": stem, "files": files, "ops": {k: _ops(m) for k, m in variants.items()}, **facts}
    )
    print(stem, {k: _ops(m) for k, m in variants.items() if k != "original"}, flush=True)


def make(
    folder: str,
    old: str | None = None,
    padding_cases: tuple[tuple[int, int], ...] = PADDING_CASES,
    groups: tuple[str, ...] = ("padding", "fedbias", "if"),
) -> None:
    """The models of ``groups``: the padding blocks at ``padding_cases`` ((batch, length) each), the
    fed-bias block, the length If. With ``old`` (a folder an earlier tree's make wrote), its padding
    blocks' cuda target as the variant ``old_cuda`` (the guard as it was), and this tree's guard by
    reductions over the keys, the keys' axis moved to the front (``target_cuda_reduce``,
    cuda.ROW_REDUCE = "outer_first", the default before "counts")."""
    import cuda_forms as cf
    import onnx

    import ortflash
    from ortflash.lowering import cuda, lower

    os.makedirs(folder, exist_ok=True)
    index: list[dict[str, Any]] = []
    for batch, seq in padding_cases if "padding" in groups else ():  # cuda_forms.block at this batch, static and named
        static = cf.block("padding", HEAD_DIM, "float16", seq)
        for value in list(static.graph.input) + list(static.graph.output):
            value.type.tensor_type.shape.dim[0].dim_value = batch
        for shape, model in (("static", static), ("symbolic", _named_dims(static, {0: "batch", 1: "seq"}))):
            fused, report = ortflash.optimize(model, target="ortflash")
            assert report.fused == 1, report
            variants = {"original": model, "ep_cuda": ortflash.optimize(model, ep="cuda")[0]}
            if shape == "symbolic":  # what --ep cuda --seq-lens S writes (the user says the length)
                variants["ep_cuda_seq_lens"] = ortflash.optimize(model, ep="cuda", seq_lens=[seq])[0]
            variants.update({f"target_{t}": lower(fused, t)[0] for t in ("cuda", "onnx")})
            saved_reduce = getattr(cuda, "ROW_REDUCE", None)  # None: a tree before the switch
            if saved_reduce is not None:
                cuda.ROW_REDUCE = "outer_first"  # type: ignore[attr-defined]
                try:
                    variants["target_cuda_reduce"] = lower(fused, "cuda")[0]
                finally:
                    cuda.ROW_REDUCE = saved_reduce  # type: ignore[attr-defined]
            earlier = os.path.join(old or "", f"padding_b{batch}_s{seq}_{shape}.target_cuda.onnx")
            if old and os.path.exists(earlier):
                variants["old_cuda"] = onnx.load(earlier)
            _save(
                folder,
                index,
                "padding",
                f"padding_b{batch}_s{seq}_{shape}",
                variants,
                batch=batch,
                seq=seq,
                shape=shape,
            )
    if "fedbias" in groups:
        make_fedbias(folder, index)
    if "if" in groups:
        make_if(folder, index)
    if "causal" in groups:
        make_causal(folder, index)
    json.dump(index, open(os.path.join(folder, "index.json"), "w"), indent=1)


def make_fedbias(folder: str, index: list[dict[str, Any]]) -> None:
    """The probe's unfused block with its [1, 1, S, S] bias fed whole, static and symbolic."""
    import cuda_capabilities as caps
    import onnx

    import ortflash
    from ortflash.lowering import lower

    case = caps.Case("padding", "float16", HEAD_DIM, FEDBIAS_SEQ, 1, HEADS)
    fed = caps.build("unfused", case)
    for shape, model in (("static", fed), ("symbolic", _named_dims(fed, {0: "batch", 2: "seq"}))):
        if shape == "symbolic":  # the bias [1, 1, S, S]: both of its last dims are the length
            for value in model.graph.input:
                if value.name == "bias":
                    value.type.tensor_type.shape.dim[2].dim_param = "seq"
                    value.type.tensor_type.shape.dim[3].dim_param = "seq"
                    value.type.tensor_type.shape.dim[0].dim_value = 1
        fused, _ = ortflash.optimize(model, target="ortflash")
        low = lower(fused, "cuda")[0]
        variants = {"original": model, "target_cuda": low}
        if shape == "static":  # MultiHeadAttention reading the fed bias itself, as ORT's optimizer left it
            direct = onnx.ModelProto.FromString(low.SerializeToString())
            next(n for n in direct.graph.node if n.op_type == "MultiHeadAttention").input[5] = "bias"
            variants["cuda_direct"] = direct
        _save(
            folder, index, "fedbias", f"fedbias_s{FEDBIAS_SEQ}_{shape}", variants, batch=1, seq=FEDBIAS_SEQ, shape=shape
        )


def make_causal(folder: str, index: list[dict[str, Any]]) -> None:
    """The zoo's long causal block (cuda_zoo._long_blocks: q, k, v [1, H, S, D] float16, the causal
    mask built in the graph; its `--target cuda` ran 71 ms a call at S=4096 in cuda_zoo.md) static and
    symbolic, with the cuda target's choice, each causal form forced, --ep cuda and the onnx target."""
    import cuda_capabilities as caps
    import webgpu_zoo as wz
    from onnxruntime.transformers import float16

    import ortflash
    from ortflash.lowering import cuda, lower

    base = wz.causal_in_graph(caps.build("unfused", caps.Case("none", "float32", HEAD_DIM, CAUSAL_SEQ, 1, HEADS)))
    static = float16.convert_float_to_float16(base, keep_io_types=False)
    for shape, model in (("static", static), ("symbolic", _named_dims(static, {2: "seq"}))):
        fused, report = ortflash.optimize(model, target="ortflash")
        assert report.fused == 1, report
        variants = {"original": model, "ep_cuda": ortflash.optimize(model, ep="cuda")[0]}
        variants["target_cuda"] = lower(fused, "cuda")[0]
        choose = cuda.choose_form
        try:
            for form in ("gqa", "mha_causal", "mha_bias"):
                cuda.choose_form = lambda call, dims, half, opset, f=form: (f, f"{f}, forced")  # type: ignore[assignment]
                variants[f"target_cuda_{form}"] = lower(fused, "cuda")[0]
        finally:
            cuda.choose_form = choose  # type: ignore[assignment]
        variants["target_onnx"] = lower(fused, "onnx")[0]
        _save(folder, index, "causal", f"causal_s{CAUSAL_SEQ}_{shape}", variants, batch=1, seq=CAUSAL_SEQ, shape=shape)


def make_if(folder: str, index: list[dict[str, Any]]) -> None:
    """The cached decoder block with the length If (LOWERED_DISPATCH_EPS forced to cuda)."""
    import decode_gpu as dg
    import onnx

    import ortflash

    block = dg._cached_block(onnx.TensorProto.FLOAT16)
    with_if = ep_probe.optimized_with_gpu_if(block, "cuda")[0]  # the If as decode_gpu.py measured it
    assert _ops(with_if).get("If") == 1 and _ops(with_if).get("MultiHeadAttention") == 1, _ops(with_if)
    variants = {"original": block, "target_cuda": ortflash.optimize(block, target="cuda")[0], "ep_cuda_if": with_if}
    _save(folder, index, "if", "cached_block_f16", variants, batch=1, seq=IF_PREFILL, shape="symbolic")


# ------------------------------------------------------------------------------------------------
# run (the GPU machine: numpy, onnxruntime-gpu, torch; no onnx)


def feeds_for(entry: dict[str, Any], case: str = "") -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    b, s = entry["batch"], entry["seq"]
    half = np.float16

    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32).astype(half)

    if entry["group"] == "padding":
        mask = np.ones((b, s), np.int64)
        mask[:, s - s // 4 :] = 0
        if b > 1:  # the second item padded on the left
            mask[1] = mask[1, ::-1]
        return {
            "q3": normal(b, s, HEADS * HEAD_DIM),
            "k3": normal(b, s, HEADS * HEAD_DIM),
            "v3": normal(b, s, HEADS * HEAD_DIM),
            "attention_mask": mask,
        }
    if entry["group"] == "causal":
        return {n: normal(1, HEADS, s, HEAD_DIM) for n in ("q", "k", "v")}
    if entry["group"] == "fedbias":
        keep = np.ones((1, 1, s, s), bool)
        keep[..., s - s // 4 :] = False
        bias = np.where(keep, 0.0, np.finfo(np.float16).min).astype(half)
        return {
            "q": normal(1, HEADS, s, HEAD_DIM),
            "k": normal(1, HEADS, s, HEAD_DIM),
            "v": normal(1, HEADS, s, HEAD_DIM),
            "bias": bias,
        }
    seq, past = (1, IF_PAST) if case == "decode" else (IF_PREFILL, 0)
    return {
        "query": normal(1, HEADS, seq, HEAD_DIM),
        "key": normal(1, HEADS, seq, HEAD_DIM),
        "value": normal(1, HEADS, seq, HEAD_DIM),
        "past_key": normal(1, HEADS, past, HEAD_DIM),
        "past_value": normal(1, HEADS, past, HEAD_DIM),
    }


def _session(ort: Any, path: str, sdpa_kernel: str | None = None) -> Any:
    opts = {"device_id": "0", **({"sdpa_kernel": sdpa_kernel} if sdpa_kernel else {})}
    providers = [EP] if DRY else [("CUDAExecutionProvider", opts)]
    sess = ort.InferenceSession(path, ep_probe.session_options(ort, None), providers=providers)
    if sess.get_providers()[0] != EP:
        raise SystemExit(f"the CUDA EP did not take {path}")
    return sess


def _timer(ort: Any, sess: Any, feeds: dict[str, np.ndarray]) -> Any:
    binding = sess.io_binding()
    for name, x in feeds.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(x, DEVICE, 0))
    for out in sess.get_outputs():
        binding.bind_output(out.name, DEVICE, 0)

    def once() -> float:
        binding.synchronize_inputs()
        t0 = time.perf_counter()
        sess.run_with_iobinding(binding)
        binding.synchronize_outputs()
        return (time.perf_counter() - t0) * 1e3

    return once


def _gpu_kernels(once: Any, runs: int = 3) -> dict[str, Any]:
    """The GPU kernels of `runs` calls as CUPTI saw them: per-call µs by kernel, busy µs, wall ms."""
    from torch.profiler import ProfilerActivity, profile

    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            once()
    wall = (time.perf_counter() - t0) * 1e3 / runs
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if us:
            rows.append({"kernel": e.key[:140], "calls": e.count / runs, "us": round(us / runs, 1)})
    rows.sort(key=lambda r: -r["us"])
    return {"wall_ms": round(wall, 3), "busy_us": round(sum(r["us"] for r in rows), 1), "top": rows[:12]}


def _kernels_printed(sess: Any, feeds: dict[str, np.ndarray]) -> tuple[list[np.ndarray], list[str]]:
    import cuda_capabilities as caps

    with caps.captured_stdout() as lines:
        outs = sess.run(None, feeds)
    return outs, caps.kernels_from(lines)


def cudnn_calls(path: str, feeds_npz: str, sdpa_kernel: str | None) -> dict[str, Any]:
    """In this process (cuDNN's API log set by the caller): 1 + RUNS runs, their ms, the cuDNN calls logged."""
    import onnxruntime as ort

    if not DRY:
        ort.preload_dlls()
    feeds = dict(np.load(feeds_npz))
    sess = _session(ort, path, sdpa_kernel)
    once = _timer(ort, sess, feeds)
    times = [round(once(), 3) for _ in range(1 + RUNS)]
    return {"ms": times}


def _count_log(log: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    if os.path.exists(log):
        with open(log, errors="replace") as f:
            for line in f:
                m = LOGGED.search(line)
                if m and m.group(1).startswith("cudnnBackend"):
                    counts[m.group(1)] = counts.get(m.group(1), 0) + 1
        os.remove(log)
    return counts


def rss_mib() -> float:
    """This process's resident memory (a cuDNN graph built per call grows it: the cache keeps each)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def logged_run(
    out_dir: str, path: str, feeds: dict[str, np.ndarray], sdpa_kernel: str | None = None, logged: bool = True
) -> dict[str, Any]:
    """1 + RUNS runs in a fresh process; with cuDNN's API log on (logged) or off (the same process
    history but for the log: whether a per-call cost follows the model or the process)."""
    npz = os.path.join(out_dir, "feeds.npz")
    np.savez(npz, **feeds)
    log = os.path.join(out_dir, "cudnn_api.log")
    env = {**os.environ, **({"CUDNN_LOGLEVEL_DBG": "3", "CUDNN_LOGDEST_DBG": log} if logged else {})}
    args = [sys.executable, os.path.abspath(__file__), "probe", path, npz] + ([sdpa_kernel] if sdpa_kernel else [])
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    os.remove(npz)
    got: dict[str, Any] = {"calls": _count_log(log)}
    try:
        got.update(json.loads(done.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        got["error"] = (done.stderr or done.stdout)[-300:]
    return got


def torch_peer(batch: int, seq: int) -> dict[str, Any]:
    """PyTorch's SDPA, default backend, on the padding block's shapes (a quarter of the keys masked)."""
    import cuda_capabilities as caps
    import torch
    import torch.nn.functional as F

    q, k, v = (torch.randn(batch, HEADS, seq, HEAD_DIM, device="cuda", dtype=torch.float16) for _ in range(3))
    keep = torch.ones(batch, 1, 1, seq, dtype=torch.bool, device="cuda")
    keep[..., seq - seq // 4 :] = False

    def call() -> Any:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return {
        "batch": batch,
        "seq": seq,
        "torch_ms": round(statistics.median(times), 4),
        "torch": torch.__version__,
        "backend": caps.sdpa_backend(call),
    }


def run(folder: str, out_dir: str) -> None:
    import onnxruntime as ort

    os.environ["ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO"] = "1"
    if not DRY:
        ort.preload_dlls()
    os.makedirs(out_dir, exist_ok=True)
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "gpu": ep_probe.gpu(),
        "onnxruntime": ort.__version__,
        "rows": [],
        "torch_sdpa": [],
        "logged": [],
    }
    out_json = os.path.join(out_dir, "cuda_cudnn_cache.json")
    index = json.load(open(os.path.join(folder, "index.json")))
    for entry in index:
        for case in ("prefill", "decode") if entry["group"] == "if" else ("",):
            feeds = feeds_for(entry, case)
            sessions, outs, timers = {}, {}, {}
            for v, file in entry["files"].items():
                try:
                    sessions[v] = _session(ort, os.path.join(folder, file))
                    outs[v], kernels = _kernels_printed(sessions[v], feeds)
                    timers[v] = (_timer(ort, sessions[v], feeds), kernels)
                except Exception as exc:  # noqa: BLE001 - recorded per variant
                    result["rows"].append({"stem": entry["stem"], "case": case, "variant": v, "error": str(exc)[:300]})
            times: dict[str, list[float]] = {v: [] for v in timers}
            first: dict[str, list[float]] = {}
            for r in range(ROUNDS):
                for v in list(timers) if r % 2 == 0 else list(timers)[::-1]:
                    once = timers[v][0]
                    got = [once() for _ in range(REPEATS)]
                    first.setdefault(v, [round(t, 3) for t in got])
                    times[v] += got
            for v, (once, kernels) in timers.items():
                row = {
                    "stem": entry["stem"],
                    "group": entry["group"],
                    "case": case,
                    "batch": entry["batch"],
                    "seq": entry["seq"],
                    "shape": entry["shape"],
                    "variant": v,
                    "kernels": kernels,
                    "ops": entry["ops"][v],
                    "ms": round(statistics.median(times[v]), 4),
                    "calls_ms": first[v],
                }
                if "original" in outs and v != "original":
                    row.update(
                        ep_probe.error(outs["original"][0].astype(np.float32), outs[v][0].astype(np.float32), "float16")
                    )
                if not DRY and (v != "original" or entry["group"] == "padding"):
                    try:
                        row["gpu"] = _gpu_kernels(once)
                    except Exception as exc:  # noqa: BLE001 - recorded
                        row["gpu"] = {"error": str(exc)[:200]}
                result["rows"].append(row)
                print(
                    json.dumps({k: row.get(k) for k in ("stem", "case", "variant", "ms", "kernels", "max_abs")}),
                    flush=True,
                )
            if entry["group"] != "padding" and not DRY:  # memory over 50 more calls: a graph kept per call grows it
                import torch

                for v, (once, _k) in timers.items():
                    rss0, free0 = rss_mib(), torch.cuda.mem_get_info()[0]
                    calls = [once() for _ in range(50)]
                    result["rows"].append(
                        {
                            "stem": entry["stem"],
                            "group": entry["group"],
                            "case": case,
                            "variant": v + "@50_calls",
                            "ms": round(statistics.median(calls), 4),
                            "rss_mib_growth": round(rss_mib() - rss0, 1),
                            "gpu_free_mib_drop": round((free0 - torch.cuda.mem_get_info()[0]) / 2**20, 1),
                        }
                    )
                    print(json.dumps(result["rows"][-1]), flush=True)
            if entry["group"] != "padding":  # the same sessions with ORT's cuDNN kernel left out (sdpa_kernel=2)
                kernel_sets = ("1", "2") if entry["group"] == "causal" else ("2",)  # 1: ORT's own flash only
                for v, kernel_set in ((x, k) for x in entry["files"] if x != "original" for k in kernel_sets):
                    try:
                        sess = _session(ort, os.path.join(folder, entry["files"][v]), kernel_set)
                        _, kernels = _kernels_printed(sess, feeds)
                        once = _timer(ort, sess, feeds)
                        got = [once() for _ in range(REPEATS)]
                        result["rows"].append(
                            {
                                "stem": entry["stem"],
                                "group": entry["group"],
                                "case": case,
                                "variant": f"{v}@sdpa_kernel={kernel_set}",
                                "kernels": kernels,
                                "ms": round(statistics.median(got), 4),
                                "calls_ms": [round(t, 3) for t in got],
                            }
                        )
                    except Exception as exc:  # noqa: BLE001
                        result["rows"].append(
                            {
                                "stem": entry["stem"],
                                "case": case,
                                "variant": f"{v}@{kernel_set}",
                                "error": str(exc)[:300],
                            }
                        )
            del sessions, timers
            json.dump(result, open(out_json, "w"), indent=1)
    for entry in index:  # cuDNN's own log: graphs finalized and executed per call
        for case in ("prefill",) if entry["group"] == "if" else ("",):
            for v in (
                x
                for x in entry["files"]
                if x != "original" and (entry["group"] != "padding" or x.startswith("ep_cuda"))
            ):
                if entry["group"] == "padding" and entry["batch"] == 2 and entry["seq"] == 2048:
                    continue
                for logged in (True, False) if entry["group"] != "padding" else (True,):
                    path = os.path.join(folder, entry["files"][v])
                    got = logged_run(out_dir, path, feeds_for(entry, case), logged=logged)
                    rec = {"stem": entry["stem"], "case": case, "variant": v, "runs": 1 + RUNS, "logged": logged}
                    result["logged"].append({**rec, **got})
                    print(json.dumps(result["logged"][-1]), flush=True)
                json.dump(result, open(out_json, "w"), indent=1)
    peer_cases = sorted({(e["batch"], e["seq"]) for e in index if e["group"] == "padding"})
    for batch, seq in () if DRY else peer_cases:
        try:
            result["torch_sdpa"].append(torch_peer(batch, seq))
        except Exception as exc:  # noqa: BLE001
            result["torch_sdpa"].append({"batch": batch, "seq": seq, "error": str(exc)[:200]})
        print(json.dumps(result["torch_sdpa"][-1]), flush=True)
    json.dump(result, open(out_json, "w"), indent=1)


def causal_table(data: dict[str, Any]) -> list[str]:
    """The causal group's rows: per variant the median, the first calls, the growth of the process
    over 50 more calls, the same node with ORT's cuDNN path left out (sdpa_kernel 1: ORT's flash,
    2: memory-efficient), and the cuDNN graphs finalized over 1 + RUNS runs with cuDNN's log on
    against the times with it off (the log itself changes whether the cache hits)."""
    rows = [r for r in data["rows"] if r.get("group") == "causal" or r.get("stem", "").startswith("causal_")]
    if not rows:
        return []
    by = {(r["stem"], r["variant"]): r for r in rows}
    logged = {(r["stem"], r["variant"], r["logged"]): r for r in data["logged"] if r["stem"].startswith("causal_")}
    base = {r["stem"]: r["ms"] for r in rows if r["variant"] == "original" and "ms" in r}
    lines = [
        "## The zoo's long causal block (cuda_zoo._long_blocks), float16, B1 H16 S4096 D64",
        "",
        "q, k, v [1, 16, S, 64] graph inputs, the causal mask built in the graph; static: S a number, symbolic: "
        "a name. ms: median of 3 alternating rounds of 10 bound calls; first calls: the first 4 of them (ms); "
        "+RSS: the process's growth over 50 more calls (MiB: a cuDNN graph kept per call grows it); "
        "sdpa 1 / 2: the same model in a session with `sdpa_kernel` 1 (ORT's flash only) / 2 (memory-efficient "
        "only); log on: cuDNN's API log set (CUDNN_LOGLEVEL_DBG=3), graphs finalized over 6 runs and the 6 runs' "
        "ms; log off: the 6 runs' ms in a like process without the log.",
        "",
        "| shape | variant | kernel | ms | vs original | first calls | +RSS MiB | sdpa 1 ms | sdpa 2 ms "
        "| finalized (log on) | runs, log on | runs, log off |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "@" in r["variant"] or "ms" not in r:
            continue
        stem, v = r["stem"], r["variant"]
        grown = by.get((stem, v + "@50_calls"), {})
        on, off = logged.get((stem, v, True), {}), logged.get((stem, v, False), {})

        def runs(x: dict[str, Any]) -> str:
            return " ".join(f"{t:.2f}" for t in x.get("ms", [])[1:])

        cells = [
            r["shape"],
            v,
            ",".join(r.get("kernels", [])) or "-",
            f"{r['ms']:.3f}",
            f"{base[stem] / r['ms']:.2f}x" if stem in base and v != "original" else "",
            " ".join(f"{t:.2f}" for t in r.get("calls_ms", [])[:4]),
            str(grown.get("rss_mib_growth", "")),
            *(
                f"{by[(stem, f'{v}@sdpa_kernel={k}')]['ms']:.3f}" if (stem, f"{v}@sdpa_kernel={k}") in by else ""
                for k in "12"
            ),
            str(on.get("calls", {}).get("cudnnBackendFinalize", "")) if on else "",
            runs(on),
            runs(off),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return ["", *lines]


def _padding_table(data: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """The padding blocks' rows: each variant against the original and PyTorch's default SDPA, and
    the guard (counts, the default, against reductions) by their GPU kernels."""
    peers = {(p["batch"], p["seq"]): p for p in data["torch_sdpa"] if "torch_ms" in p}
    base = {(r["batch"], r["seq"], r["shape"]): r["ms"] for r in rows if r["variant"] == "original"}
    lines = [
        "- block: cuda_forms.block('padding'), float16, H16 D64, a quarter of the keys padded (batch item 2 "
        "on the left); static: batch and length numbers; symbolic: both named. ms: median of 3 alternating "
        "rounds of 10 bound calls (wall, inputs and outputs on the GPU); reduce µs: the GPU time per call of "
        "kernels named *reduce* (CUPTI, 3 calls); torch: scaled_dot_product_attention with PyTorch's default "
        "backend (boolean [B, 1, 1, S] mask), CUDA events, median of 20",
        "- variants: ep_cuda (`--ep cuda`), ep_cuda_seq_lens (`--ep cuda --seq-lens S`, symbolic only), "
        "target_cuda (ROW_REDUCE counts, the default: the masked rows found by MatMuls), target_cuda_reduce "
        "(ROW_REDUCE outer_first, the default before: by reductions), target_onnx (Attention-23)",
        "",
        "| B | S | shape | variant | kernel | ms | vs original | / torch | reduce µs | GPU busy µs | err | ok |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        orig = base.get((r["batch"], r["seq"], r["shape"]))
        peer = peers.get((r["batch"], r["seq"]))
        gpu = r.get("gpu", {})
        reduce_us = sum(k["us"] for k in gpu.get("top", []) if "reduce" in k["kernel"].lower())
        cells = [
            str(r["batch"]),
            str(r["seq"]),
            r["shape"],
            r["variant"],
            ",".join(r["kernels"]) or "-",
            f"{r['ms']:.3f}",
            f"{orig / r['ms']:.2f}x" if orig and r["variant"] != "original" else "",
            f"{r['ms'] / peer['torch_ms']:.2f}" if peer else "",
            f"{reduce_us:.0f}" if gpu.get("top") else "",
            f"{gpu['busy_us']:.0f}" if "busy_us" in gpu else "",
            f"{r['max_abs']:.2g}" if "max_abs" in r else "",
            ("yes" if r.get("ok") else "NO") if "ok" in r else "",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## PyTorch SDPA, default backend", "", "| B | S | backend | ms | torch |", "|---|---|---|---|---|"]
    for p in data["torch_sdpa"]:
        if "torch_ms" in p:
            lines.append(f"| {p['batch']} | {p['seq']} | {p['backend']} | {p['torch_ms']:.3f} | {p['torch']} |")
    errors = [r for r in data["rows"] if "error" in r]
    if errors:
        lines += ["", "Errors: " + "; ".join(f"{r['stem']} {r['variant']}: {r['error'][:120]}" for r in errors)]
    return lines


def table(json_path: str, md_path: str) -> None:
    """The padding group's table (_padding_table) and the causal group's (causal_table), each where
    the run has its rows, then the run's findings."""
    data = json.load(open(json_path))
    rows = [r for r in data["rows"] if r.get("group") == "padding" and "ms" in r]
    lines = [
        "# ONNX Runtime's CUDA EP: "
        + ("the exported padding block at batch 1 and 2" if rows else "cuDNN's graph cache")
        + " (cuda_cudnn_cache.py)",
        "",
        f"- date: {data['date']}; GPU: {data['gpu']}; onnxruntime {data['onnxruntime']}",
    ]
    if rows:
        lines += _padding_table(data, rows)
    lines += causal_table(data)
    lines += ["", *data.get("findings", [])]
    ep_probe.write_table(md_path, lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "probe":  # the logged child process of logged_run
        print(json.dumps(cudnn_calls(argv[1], argv[2], argv[3] if len(argv) > 3 else None)))
        return 0
    steps = ep_probe.StepCommandLine(__doc__, md="benchmarks/results/cuda_cudnn_cache.md")
    steps.make.add_argument("--old", help="a folder an earlier tree's make wrote (its cuda target: old_cuda)")
    steps.make.add_argument(
        "--padding-cases",
        default=",".join(f"{b}x{s}" for b, s in PADDING_CASES),
        help="the padding blocks' BATCHxLENGTH, comma-separated",
    )
    steps.make.add_argument("--groups", default="padding,fedbias,if", help="of padding, fedbias, if, causal")
    return steps.call(
        argv,
        make=lambda a: make(
            a.folder,
            a.old,
            tuple((int(b), int(s)) for b, s in (c.split("x") for c in a.padding_cases.split(","))),
            tuple(a.groups.split(",")),
        ),
        run=lambda a: run(a.folder, a.out),
        table=lambda a: table(a.json, a.md),
    )


if __name__ == "__main__":
    sys.exit(main())
