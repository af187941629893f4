"""GPU attention benchmark: ortflash's WGSL kernels against PyTorch SDPA and ONNX Runtime's WebGPU EP.

Meant for a Linux machine with an NVIDIA GPU and no package registry (/work/shared/GPU.md says
what has to travel: the wgpu wheels, the Vulkan loader debs, optionally onnxruntime with
onnxruntime-ep-webgpu). One process; the same random inputs for every contender (float32 drawn
once per shape, float16 made from them):

  flash WGSL f32 / f16     flash.wgsl through ortflash.kernels.wgpu.device
  ... resident             the same with Q, K, V and O left on the GPU (DeviceTensor), no host copies
  naive WGSL f32           naive.wgsl (three passes, score rows in device memory)
  torch SDPA CUDA f32/f16  torch.nn.functional.scaled_dot_product_attention, when torch sees a GPU
  ORT WebGPU MHA f32/f16   com.microsoft MultiHeadAttention on ORT's WebGPU EP, in a child process
                           whose PYTHONPATH is --ort-site: the plugin EP (onnxruntime +
                           onnxruntime-ep-webgpu, registered with register_execution_provider_library)
                           when that folder has it, else the onnxruntime-webgpu build

Method (the reasons are in benchmarks/results/gpu_attention_nvidia-h200.md):
- torch is imported and asked for CUDA first (seconds, with the GPU idle); then every (kernel, D,
  dtype, mask) pipeline is compiled on the smallest size and the GPU kept busy for --prewarm-s with
  resident S<=4096 calls (the first size of a run used to be measured 2-5x slow: an idle GPU
  between the pre-warm and the first row); the first shape is timed once more at the end
  ("re-timed last") to show it was not cold;
- --tune: the tile sweep (resident tensors) fills a tuner cache (tuner.py: adapter, driver, D,
  dtype) and every WGSL row takes its tile from it, as a user's Runner(tile_cache=...) would;
  the ablation times each kernel option off in turn, causal heaviest-first order included;
- every (contender, shape, dtype, mask) is warmed up before it is timed: calls repeat until at
  least --warmup-s seconds and 2 calls have passed, so compilation, allocation and the GPU's
  clock ramp stay out of the numbers (the first size of a run used to be measured cold);
- host-to-host time (numpy in, numpy out) and device time side by side for every contender:
  WGSL from timestamp queries around the compute pass, torch from CUDA events, ORT (no device
  timer) as the per-run host time of runs whose tensors stay on the GPU (IO binding), closed
  by one read-back (its synchronize_outputs() does not wait for the GPU), where it allows;
  medians of --reps calls;
- masks: none, causal (top-left), and padding (a boolean key mask [B, 1, 1, S] hiding the last
  quarter of the keys); every row counts 4 * S^2 * D * H FLOPs, so skipped causal tiles show as
  a higher rate;
- correctness of every row against float64 (numpy, on 64 query rows of the first and the last
  head): ||out - ref|| / ||ref|| and the largest absolute error.

    python benchmarks/gpu_attention.py --tune --ort-site /tmp/epw          # as recorded
    python benchmarks/gpu_attention.py --sweep-only                          # only the tile sweep

Results go to benchmarks/results/gpu_attention_<device><tag>.{md,json}, the sweep to
gpu_sweep_<device><tag>.json and the tuner cache it filled to gpu_sweep_<device><tag>_tile_cache.json.
On the H200 device machine: GPU_ATTENTION_ARGS="..." bash benchmarks/webgpu_gpu_run.sh wgsl-tests attention
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

B, H = 1, 16
SEED = 1234
MASKS = ("none", "causal", "padding")
# Query rows compared with float64, evenly spread (the last row included), in two heads.
CHECK_ROWS = 64
CHECK_HEADS = (0, H - 1)
PADDED_FRACTION = 0.25  # of the keys, hidden by the padding mask

Log = Callable[[str], None]


@dataclass(frozen=True)
class Timing:
    """Medians of one contender on one shape: host-to-host and device milliseconds."""

    host_ms: float | None
    device_ms: float | None
    extra: dict[str, Any]


def inputs(s: int, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The shared inputs of one shape: Q, K, V float32 [B, H, S, D], unit normal."""
    rng = np.random.default_rng(SEED + s * 7 + d)
    shape = (B, H, s, d)
    return tuple(rng.standard_normal(shape, dtype=np.float32) for _ in range(3))  # type: ignore[return-value]


def padding_mask(s: int) -> np.ndarray:
    """Boolean key mask [B, 1, 1, S]: the last PADDED_FRACTION of the keys are padding (False)."""
    mask = np.ones((B, 1, 1, s), bool)
    mask[..., s - int(s * PADDED_FRACTION) :] = False
    return mask


def check_rows(s: int) -> np.ndarray:
    return np.unique(np.linspace(0, s - 1, min(CHECK_ROWS, s)).astype(np.int64))


def reference64(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask_kind: str) -> np.ndarray:
    """float64 attention of CHECK_ROWS query rows of the CHECK_HEADS heads: [B, len(heads), rows, D]."""
    rows = check_rows(q.shape[2])
    heads = list(CHECK_HEADS)
    qh = q[:, heads][:, :, rows].astype(np.float64)
    kh, vh = k[:, heads].astype(np.float64), v[:, heads].astype(np.float64)
    scores = qh @ kh.transpose(0, 1, 3, 2) * q.shape[-1] ** -0.5
    keys = np.arange(k.shape[2])
    if mask_kind == "causal":
        scores = np.where(keys[None, :] <= rows[:, None], scores, -np.inf)
    elif mask_kind == "padding":
        scores = np.where(padding_mask(k.shape[2])[:, :, 0:1, :], scores, -np.inf)
    scores -= scores.max(-1, keepdims=True)
    p = np.exp(scores)
    return (p / p.sum(-1, keepdims=True)) @ vh


def errors(out: np.ndarray, ref: np.ndarray, s: int) -> dict[str, float]:
    """Relative (norm) and largest absolute error of out's checked rows against the float64 reference."""
    got = out[:, list(CHECK_HEADS)][:, :, check_rows(s)].astype(np.float64)
    diff = got - ref
    return {"rel_err": float(np.linalg.norm(diff) / np.linalg.norm(ref)), "max_abs_err": float(np.abs(diff).max())}


def tflops(s: int, d: int, ms: float | None) -> float | None:
    return None if not ms else 4.0 * s * s * d * H / (ms * 1e-3) / 1e12


def median(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return float(np.median(vals)) if vals else None


def warm_up(call: Callable[[], Any], seconds: float) -> None:
    """Run `call` until `seconds` and at least two calls have passed (compile, allocate, clock ramp)."""
    t_end = time.perf_counter() + seconds
    for n in range(1_000_000):
        call()
        if n >= 1 and time.perf_counter() >= t_end:
            return


def reps_for(s: int, reps: int) -> int:
    return max(2, reps if s <= 8192 else reps // 2)


# --------------------------------------------------------------------------- WGSL


def wgsl_attrs(d: int, mask_kind: str) -> dict[str, Any]:
    from ortflash.op import spec

    return spec.validate({"scale": d**-0.5, "is_causal": int(mask_kind == "causal")})


def bench_wgsl(
    runner: Any,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    kernel: str,
    dtype: type,
    mask_kind: str,
    reps: int,
    warmup_s: float,
    tile: Any = None,
) -> tuple[np.ndarray, Timing, dict[str, Any]]:
    """Warm up, then time `reps` calls of the WGSL `kernel`: host-to-host and device medians."""
    attrs = wgsl_attrs(q.shape[-1], mask_kind)
    mask = padding_mask(q.shape[2]) if mask_kind == "padding" else None
    qq, kk, vv = (t.astype(dtype) for t in (q, k, v))

    def call() -> np.ndarray:
        return runner.attention(qq, kk, vv, mask=mask, attrs=attrs, kernel=kernel, tile=tile)

    warm_up(call, warmup_s)
    host, dev, stages = [], [], []
    out = None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = call()
        host.append((time.perf_counter() - t0) * 1e3)
        dev.append(runner.last_device_ms)
        stages.append(dict(runner.last_timing))
    extra = {key: float(np.median([st[key] for st in stages])) for key in stages[0]}
    return out, Timing(median(host), median(dev), extra), dict(runner.last_plan)


def bench_wgsl_resident(
    runner: Any,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    dtype: type,
    mask_kind: str,
    reps: int,
    warmup_s: float,
    tile: Any = None,
) -> tuple[np.ndarray, Timing]:
    """The flash kernel with Q, K, V and O resident (DeviceTensors; one upload before timing, out=
    reused): host time from the call to sync() returning, against the device time of the same calls."""
    attrs = wgsl_attrs(q.shape[-1], mask_kind)
    mask = padding_mask(q.shape[2]) if mask_kind == "padding" else None
    qd, kd, vd = (runner.to_device(t.astype(dtype)) for t in (q, k, v))
    out = runner.empty_tensor(q.shape, qd.dtype)

    def call() -> None:
        runner.attention_resident(qd, kd, vd, mask=mask, attrs=attrs, kernel="flash", tile=tile, out=out)
        runner.sync()

    warm_up(call, warmup_s)
    host, dev = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        host.append((time.perf_counter() - t0) * 1e3)
        dev.append(runner.last_device_ms)
    result = runner.to_host(out, np.float32)
    for t in (qd, kd, vd, out):
        t.destroy()
    return result, Timing(median(host), median(dev), {"tile": tile_text(runner.last_plan)})


def tile_text(plan: dict[str, Any]) -> str:
    """The flash tile of a plan, short (br/bc/c/rv/vpt/K-V split, sg: subgroup reductions)."""
    t = plan.get("tile")
    if plan.get("kernel") != "flash" or t is None:
        return ""
    return f"{t.br}x{t.bc} c{t.c} rv{t.rv} vpt{t.vpt} kvs{t.kv_split} sg{plan.get('subgroups', 0)}"


def prewarm(runner: Any, args: argparse.Namespace, log: Log) -> dict[str, Any]:
    """Before any timing: compile every (kernel, D, dtype, mask) pipeline the run uses, on the
    smallest size, then keep the GPU busy for --prewarm-s on the first measured shape, so that the
    first measured size is not the one that pays for compilation and the clock ramp."""
    t0 = time.perf_counter()
    s = min(args.sizes)
    compiled = 0
    for d in args.dims:
        q, k, v = inputs(s, d)
        for mask_kind in args.masks:
            kernels = ["flash", "naive"] if mask_kind == "none" else ["flash"]
            for kernel in kernels:
                for dtype in (np.float32, np.float16):
                    qq, kk, vv = (t.astype(dtype) for t in (q, k, v))
                    mask = padding_mask(s) if mask_kind == "padding" else None
                    runner.attention(qq, kk, vv, mask=mask, attrs=wgsl_attrs(d, mask_kind), kernel=kernel)
                    compiled += 1
    # Busy with tensors that stay on the GPU: numpy calls leave it idle during their host copies,
    # and an idle GPU clocks down again (the first rows of earlier runs came out slow so).
    busy_s = min(4096, max(args.sizes))  # a shape that keeps the GPU loaded between calls
    q, k, v = (runner.to_device(t) for t in inputs(busy_s, args.dims[0]))
    out = runner.empty_tensor(q.shape, q.dtype)
    attrs = wgsl_attrs(args.dims[0], "none")

    def busy() -> None:
        runner.attention_resident(q, k, v, attrs=attrs, kernel="flash", out=out)
        runner.sync()

    warm_up(busy, args.prewarm_s)
    for t in (q, k, v, out):
        t.destroy()
    seconds = time.perf_counter() - t0
    log(
        f"pre-warm: {compiled} (kernel, D, dtype, mask) calls at S={s}, then {args.prewarm_s} s busy "
        f"(resident, S={busy_s}): {seconds:.1f} s"
    )
    return {"calls": compiled, "S": s, "busy_S": busy_s, "busy_s": args.prewarm_s, "seconds": seconds}


# --------------------------------------------------------------------------- PyTorch


def torch_available() -> tuple[bool, str]:
    try:
        import torch

        return torch.cuda.is_available(), f"torch {torch.__version__}"
    except Exception as e:  # noqa: BLE001 -- reported in the results
        return False, f"torch not importable ({type(e).__name__})"


def bench_torch(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, dtype_name: str, mask_kind: str, reps: int, warmup_s: float
) -> tuple[np.ndarray, Timing]:
    import torch
    import torch.nn.functional as F

    scale = q.shape[-1] ** -0.5
    causal = mask_kind == "causal"
    mask = torch.from_numpy(padding_mask(q.shape[2])).cuda() if mask_kind == "padding" else None
    host_inputs = [torch.from_numpy(t.astype({"f32": np.float32, "f16": np.float16}[dtype_name])) for t in (q, k, v)]

    def host_call() -> np.ndarray:
        qq, kk, vv = (t.to("cuda") for t in host_inputs)
        out = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, is_causal=causal, scale=scale)
        return out.cpu().numpy()

    warm_up(host_call, warmup_s)
    host = []
    out = None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = host_call()
        host.append((time.perf_counter() - t0) * 1e3)
    resident = [t.to("cuda") for t in host_inputs]

    def device_call() -> None:
        F.scaled_dot_product_attention(*resident, attn_mask=mask, is_causal=causal, scale=scale)

    def synced_call() -> None:
        # Launches are asynchronous: unsynchronised, a timed warm-up would queue seconds of work.
        device_call()
        torch.cuda.synchronize()

    warm_up(synced_call, warmup_s)
    dev = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        device_call()
        e1.record()
        torch.cuda.synchronize()
        dev.append(e0.elapsed_time(e1))
    resident.clear()  # free the GPU copies before the next shape
    torch.cuda.empty_cache()
    return out, Timing(median(host), median(dev), {})


# --------------------------------------------------------------------------- ORT WebGPU (child)


def ort_session(ort: Any, model_bytes: bytes) -> Any:
    """A session on ORT's WebGPU EP: the plugin EP when onnxruntime_ep_webgpu is importable, else
    the WebGpuExecutionProvider of an onnxruntime-webgpu build. Raises when it fell back to the CPU."""
    so = ort.SessionOptions()
    try:
        import onnxruntime_ep_webgpu as wep
    except ImportError:
        sess = ort.InferenceSession(model_bytes, so, providers=["WebGpuExecutionProvider"])
    else:
        if not getattr(ort_session, "registered", False):
            ort.register_execution_provider_library("webgpu", wep.get_library_path())
            ort_session.registered = True  # type: ignore[attr-defined]
        devices = [dev for dev in ort.get_ep_devices() if dev.ep_name == wep.get_ep_name()]
        if not devices:
            raise RuntimeError("the WebGPU plugin EP lists no device")
        so.add_provider_for_devices(devices[:1], {})
        sess = ort.InferenceSession(model_bytes, so)
    if not any("WebGpu" in p for p in sess.get_providers()):
        raise RuntimeError(f"WebGPU EP not used: {sess.get_providers()}")
    return sess


def mha_model(s: int, d: int, onnx_dtype: int, mask_kind: str) -> bytes:
    from onnx import TensorProto, helper

    hidden = H * d
    names = ["query", "key", "value"]
    attrs: dict[str, Any] = {"num_heads": H, "scale": float(d**-0.5)}
    if mask_kind == "causal":
        attrs["unidirectional"] = 1
    inputs_ = [helper.make_tensor_value_info(n, onnx_dtype, [B, s, hidden]) for n in names]
    if mask_kind == "padding":
        names += ["", "key_padding_mask"]
        inputs_.append(helper.make_tensor_value_info("key_padding_mask", TensorProto.INT32, [B, s]))
    node = helper.make_node("MultiHeadAttention", names, ["out"], domain="com.microsoft", **attrs)
    graph = helper.make_graph(
        [node], "mha", inputs_, [helper.make_tensor_value_info("out", onnx_dtype, [B, s, hidden])]
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 8
    return model.SerializeToString()


def ort_worker(args: argparse.Namespace) -> int:
    """Runs in the child process: MultiHeadAttention on the WebGPU EP, one JSON line per record."""
    import onnxruntime as ort
    from onnx import TensorProto

    print(json.dumps({"ort_version": ort.__version__, "ort_file": ort.__file__}), flush=True)
    dtypes = {"f32": (np.float32, TensorProto.FLOAT), "f16": (np.float16, TensorProto.FLOAT16)}
    for d in args.dims:
        for s in args.sizes:
            if s > args.ort_max_s:
                continue
            q, k, v = inputs(s, d)
            for mask_kind in args.masks:
                for dtype_name in args.ort_dtypes:
                    rec: dict[str, Any] = {"kind": "ort", "S": s, "D": d, "mask": mask_kind, "dtype": dtype_name}
                    try:
                        np_dtype, onnx_dtype = dtypes[dtype_name]
                        sess = ort_session(ort, mha_model(s, d, onnx_dtype, mask_kind))
                        rec["providers"] = sess.get_providers()
                        feeds = {
                            name: np.ascontiguousarray(t.transpose(0, 2, 1, 3).reshape(B, s, H * d)).astype(np_dtype)
                            for name, t in (("query", q), ("key", k), ("value", v))
                        }
                        if mask_kind == "padding":
                            feeds["key_padding_mask"] = padding_mask(s).reshape(B, s).astype(np.int32)
                        warm_up(lambda sess=sess, feeds=feeds: sess.run(None, feeds), args.warmup_s)
                        times = []
                        for _ in range(reps_for(s, args.reps)):
                            t0 = time.perf_counter()
                            out = sess.run(None, feeds)[0]
                            times.append((time.perf_counter() - t0) * 1e3)
                        rec["host_ms"] = median(times)
                        o = out.reshape(B, s, H, d).transpose(0, 2, 1, 3)
                        np.save(
                            Path(args.ort_dump) / f"ort_{dtype_name}_{mask_kind}_{s}_{d}.npy",
                            o[:, list(CHECK_HEADS)][:, :, check_rows(s)].astype(np.float32),
                        )
                        rec["resident_ms"], rec["resident_error"] = ort_resident_ms(ort, sess, feeds, s, args)
                        del sess
                    except Exception as e:  # noqa: BLE001 -- recorded, the run goes on
                        rec["error"] = f"{type(e).__name__}: {str(e)[:240]}"
                    print(json.dumps(rec), flush=True)
    return 0


def ort_resident_ms(
    ort: Any, sess: Any, feeds: dict[str, np.ndarray], s: int, args: argparse.Namespace
) -> tuple[float | None, str]:
    """Per-run host time of N runs whose inputs and output stay on the GPU (IO binding), closed by
    one read-back of the output, or why not. On the H200 (ORT 1.32 + WebGPU plugin EP 0.4.0)
    synchronize_outputs() returned before the GPU had finished (0.5 ms at S=4096 would be
    140 TFLOP/s), so only the read-back makes the time an honest upper bound."""
    try:
        io = sess.io_binding()
        for name, arr in feeds.items():
            io.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(arr, "webgpu", 0))
        io.bind_output("out", "webgpu")
        runs = reps_for(s, args.reps)
        for _ in range(2):  # warm-up, drained by the read-back
            sess.run_with_iobinding(io)
        io.copy_outputs_to_cpu()
        t0 = time.perf_counter()
        for _ in range(runs):
            sess.run_with_iobinding(io)
        io.copy_outputs_to_cpu()
        return (time.perf_counter() - t0) * 1e3 / runs, ""
    except Exception as e:  # noqa: BLE001 -- recorded
        return None, f"{type(e).__name__}: {str(e)[:90]}"


def run_ort(args: argparse.Namespace, log: Log) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run the WebGPU EP child; its records and its version line."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([args.ort_site, str(ROOT)])
    Path(args.ort_dump).mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        __file__,
        "--ort-worker",
        "--ort-dump",
        args.ort_dump,
        "--reps",
        str(args.reps),
        "--warmup-s",
        str(args.warmup_s),
        "--ort-max-s",
        str(args.ort_max_s),
        "--ort-dtypes",
        *args.ort_dtypes,
        "--masks",
        *args.masks,
        "--sizes",
        *map(str, args.ort_sizes or args.sizes),
        "--dims",
        *map(str, args.dims),
    ]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.ort_timeout)
        lines = proc.stdout.splitlines()
        if proc.returncode:
            log(f"ORT child exited {proc.returncode}: {proc.stderr[-800:]}")
    except subprocess.TimeoutExpired as e:
        out = e.stdout or ""
        lines = (out.decode(errors="replace") if isinstance(out, bytes) else out).splitlines()
        log(f"ORT child timed out after {args.ort_timeout} s")
    records, header = [], {}
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "ort_version" in rec:
            header = rec
        elif rec.get("kind") == "ort":
            records.append(rec)
            log(f"ORT child: {json.dumps(rec)}")
    return records, header


# --------------------------------------------------------------------------- tile sweep


def sweep(args: argparse.Namespace, runner: Any, log: Log) -> list[dict[str, Any]]:
    """Device time of candidate flash tiles at --sweep-s (no mask), both K/V layouts, for tuning."""
    from dataclasses import asdict, replace

    from ortflash.kernels.wgpu.tiles import TUNED_TILES, flash_tiles

    s = args.sweep_s
    rows = []
    for d in args.dims:
        q, k, v = inputs(s, d)
        ranked = flash_tiles(
            d // 4,
            d // 4,
            s,
            runner.limits["max-compute-workgroup-storage-size"],
            runner.limits["max-compute-invocations-per-workgroup"],
            max_registers=args.max_registers,
            subgroup_size=runner.subgroup_size,
        )
        # One key per invocation starves the score phase, except where the head dim leaves no room
        # for more (D=128 with 64 query rows: 16 keys a tile).
        tiles = [
            t for t in ranked if t.br >= 32 and 32 <= t.workgroup_size <= 256 and (t.bc // t.c >= 2 or t.br >= 64)
        ][: args.sweep_top]
        # Always timed, whatever the cost model says: the family of the D=64 winner (one row block,
        # 16 lanes a row group) at every row count that fits.
        tiles += [t for t in ranked if t.c == 16 and t.rv == 1 and t.br >= 32 and t not in tiles]
        for io in ("f32", "f16"):  # the tiles measured best before, whatever the cost model says
            tuned = TUNED_TILES.get((d // 4, d // 4, io))
            if tuned is not None and tuned not in tiles:
                tiles.append(tuned)
        smem = runner.limits["max-compute-workgroup-storage-size"]
        candidates = [
            *tiles,
            *(
                replace(t, kv_split=1)
                for t in tiles
                if replace(t, kv_split=1).smem_bytes(d // 4, runner.subgroup_size) <= smem
            ),
        ]
        for dtype in (np.float32, np.float16):
            timed = []
            for t in candidates:
                try:
                    # Resident tensors: the kernel without host copies around it, the GPU kept loaded.
                    _, timing = bench_wgsl_resident(runner, q, k, v, dtype, "none", 5, args.sweep_warmup_s, tile=t)
                    plan = dict(runner.last_plan)
                except Exception as e:  # noqa: BLE001 -- a tile that fails is logged and skipped
                    log(f"sweep D={d} {t} failed: {type(e).__name__}: {e}")
                    continue
                dev = timing.device_ms
                rows.append(
                    {
                        "D": d,
                        "dtype": np.dtype(dtype).name,
                        "tile": asdict(t),
                        "device_ms": dev,
                        "tflops_device": tflops(s, d, dev),
                        "subgroups": plan.get("subgroups"),
                    }
                )
                timed.append((dev or 1e9, t))
                log(
                    f"sweep D={d} {np.dtype(dtype).name:8s} {t} sg={plan.get('subgroups')} "
                    f"dev {dev:.3f} ms {tflops(s, d, dev):6.2f} TFLOP/s"
                )
            # float16 differs only in its loads: time the float32 front-runners only.
            candidates = [t for _, t in sorted(timed, key=lambda x: x[0])[: args.sweep_f16_top]]
    return rows


def ablation(args: argparse.Namespace, tiles: dict[tuple[int, str], Any], log: Log) -> list[dict[str, Any]]:
    """The best tile of D=64 f32 with each of this issue's kernel changes turned off in turn."""
    from dataclasses import asdict, replace

    from ortflash.kernels.wgpu.device import Runner

    s, d = args.sweep_s, 64
    q, k, v = inputs(s, d)
    rows = []
    for dtype_name in ("float32", "float16"):
        tile = tiles.get((d, dtype_name))
        if tile is None:
            continue
        variants = [
            ("as tuned", {}, tile, "none"),
            ("naga run-time checks on", {"trusted_shaders": False}, tile, "none"),
            ("no subgroups", {"use_subgroups": False}, tile, "none"),
            (
                "K/V tiles shared" if tile.kv_split else "K/V tiles split",
                {},
                replace(tile, kv_split=1 - tile.kv_split),
                "none",
            ),
            ("causal, heaviest row tiles first", {}, tile, "causal"),
            ("causal, grid order", {"causal_heavy_first": False}, tile, "causal"),
        ]
        for name, options, t, mask_kind in variants:
            try:
                dev_runner = Runner(**options)
                _, timing = bench_wgsl_resident(
                    dev_runner, q, k, v, np.dtype(dtype_name).type, mask_kind, 5, args.sweep_warmup_s, tile=t
                )
                plan = dict(dev_runner.last_plan)
                rows.append(
                    {
                        "variant": name,
                        "dtype": dtype_name,
                        "tile": asdict(t),
                        "device_ms": timing.device_ms,
                        "tflops_device": tflops(s, d, timing.device_ms),
                        "subgroups": plan.get("subgroups"),
                    }
                )
                log(
                    f"ablation {dtype_name} {name:26s} {t} dev {timing.device_ms:.3f} ms "
                    f"{tflops(s, d, timing.device_ms):6.2f} TFLOP/s"
                )
                del dev_runner
            except Exception as e:  # noqa: BLE001 -- logged
                log(f"ablation {name} failed: {type(e).__name__}: {e}")
    return rows


# --------------------------------------------------------------------------- main


def sizes_for(args: argparse.Namespace, mask_kind: str, d: int) -> list[int]:
    sizes = args.sizes if mask_kind == "none" else [s for s in args.sizes if s <= args.mask_max_s]
    if d > 64 and args.large_d_max_s:
        sizes = [s for s in sizes if s <= args.large_d_max_s]
    return sizes


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768, 65536])
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--masks", nargs="+", default=list(MASKS), choices=MASKS)
    ap.add_argument("--mask-max-s", type=int, default=16384, help="largest S for the causal and padding rows")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup-s", type=float, default=0.3, help="warm-up seconds per contender and shape")
    ap.add_argument("--naive-max-s", type=int, default=8192, help="largest S for the naive kernel")
    ap.add_argument("--large-d-max-s", type=int, default=None, help="largest S for D > 64 (default: all sizes)")
    ap.add_argument("--prewarm-s", type=float, default=2.0, help="seconds of GPU work before the first timing")
    ap.add_argument("--no-resident", action="store_true", help="skip the rows whose tensors stay on the GPU")
    ap.add_argument("--ort-site", default=None, help="PYTHONPATH folder holding onnxruntime (+ onnxruntime_ep_webgpu)")
    ap.add_argument("--ort-max-s", type=int, default=16384)
    ap.add_argument("--ort-sizes", type=int, nargs="+", default=None, help="S for ORT (default: --sizes)")
    ap.add_argument("--ort-dtypes", nargs="+", default=["f32", "f16"])
    ap.add_argument("--ort-timeout", type=int, default=240)
    ap.add_argument("--ort-dump", default="/tmp/ortflash_ort_dump")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--tune", action="store_true", help="sweep tiles first, then run flash with the best per D, dtype")
    ap.add_argument("--sweep-only", action="store_true", help="only the tile sweep and the ablation")
    ap.add_argument("--sweep-s", type=int, default=4096)
    ap.add_argument("--sweep-top", type=int, default=16)
    ap.add_argument("--sweep-f16-top", type=int, default=6)
    ap.add_argument("--sweep-warmup-s", type=float, default=0.1)
    ap.add_argument("--max-registers", type=int, default=200)
    ap.add_argument("--tile-cache", default=None, help="the tuner cache file --tune fills (default: in --out-dir)")
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--tag", default="", help="suffix for the results file names")
    ap.add_argument("--ort-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.ort_worker:
        return ort_worker(args)

    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.0f} s] {msg}", flush=True)

    from dataclasses import asdict

    from ortflash.kernels.wgpu.device import Runner
    from ortflash.kernels.wgpu.tiles import FlashTile

    runner = Runner()
    info = runner.info
    log(f"adapter: {json.dumps(info)}")
    slug = re.sub(r"[^a-z0-9]+", "-", info["device"].lower()).strip("-")[:40] or "unknown"
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "adapter": info,
        "host": platform.node(),
        "python": platform.python_version(),
        "B": B,
        "H": H,
        "flops": "4 * S^2 * D * H",
        "args": vars(args),
    }
    try:
        meta["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    except Exception:  # noqa: BLE001 -- no nvidia-smi
        meta["nvidia_smi"] = None

    best_tiles: dict[tuple[int, str], FlashTile] = {}
    if args.tune or args.sweep_only:
        rows = sweep(args, runner, log)
        best: dict[tuple[int, str], dict[str, Any]] = {}
        for r in rows:
            key = (r["D"], r["dtype"])
            if r["device_ms"] and (key not in best or r["device_ms"] < best[key]["device_ms"]):
                best[key] = r
        for key, r in sorted(best.items()):
            best_tiles[key] = FlashTile(**r["tile"])
            log(f"best D={key[0]} {key[1]}: {best_tiles[key]} {r['device_ms']:.3f} ms {r['tflops_device']:.2f} TFLOP/s")
        meta["tiles"] = {f"D={d} {dt}": asdict(t) for (d, dt), t in best_tiles.items()}
        # The rows below take their tiles the way a user's runner does: from the tuner's cache,
        # keyed by adapter, driver, head dims and dtype (tuner.py), which the sweep fills here.
        from ortflash.kernels.wgpu.tuner import TileCache, TuneKey

        cache = TileCache(
            Path(args.tile_cache) if args.tile_cache else out_dir / f"gpu_sweep_{slug}{args.tag}_tile_cache.json"
        )
        for (d, dt), t in best_tiles.items():
            io = "f16" if dt == "float16" else "f32"
            ms = next(r["device_ms"] for r in rows if r["D"] == d and r["dtype"] == dt and FlashTile(**r["tile"]) == t)
            cache.put(TuneKey.of(info, d // 4, d // 4, io), t, ms)
        runner.tile_cache = cache
        meta["tile_cache"] = str(cache.path)
        meta["ablation"] = ablation(args, best_tiles, log)
        path = out_dir / f"gpu_sweep_{slug}{args.tag}.json"
        path.write_text(json.dumps({"meta": meta, "S": args.sweep_s, "rows": rows}, indent=1))
        log(f"wrote {path}")
        if args.sweep_only:
            return 0

    ort_records, ort_header = ([], {})
    if args.ort_site:  # first: a run cut short by its time limit still has it
        ort_records, ort_header = run_ort(args, log)
        log(f"ORT: {json.dumps(ort_header)}; {len(ort_records)} records")

    # torch first: its import and CUDA start-up take seconds, during which the GPU would idle and
    # clock down again after the pre-warm (the first rows of the 13:05 run read 2-5x slow so).
    use_torch, torch_note = (False, "disabled") if args.no_torch else torch_available()
    log(f"torch: {torch_note}, cuda={use_torch}")
    meta["prewarm"] = prewarm(runner, args, log)
    meta.update(torch=torch_note, ort=ort_header, ort_records=ort_records)
    results: list[dict[str, Any]] = []
    stem = f"gpu_attention_{slug}{args.tag}"

    def save() -> None:
        """Write what is known so far (a run cut short still leaves its results)."""
        (out_dir / f"{stem}.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
        (out_dir / f"{stem}.md").write_text(markdown(meta, results))

    for d in args.dims:
        for mask_kind in args.masks:
            for s in sizes_for(args, mask_kind, d):
                q, k, v = inputs(s, d)
                ref = reference64(q, k, v, mask_kind)
                reps = reps_for(s, args.reps)
                variants: list[tuple[str, str, Any]] = [
                    ("flash WGSL f32", "flash", np.float32),
                    ("flash WGSL f16", "flash", np.float16),
                ]
                if mask_kind == "none" and s <= args.naive_max_s:
                    variants.append(("naive WGSL f32", "naive", np.float32))
                for name, kernel, dtype in variants:
                    rec: dict[str, Any] = {"what": name, "S": s, "D": d, "mask": mask_kind}
                    try:
                        out, timing, plan = bench_wgsl(runner, q, k, v, kernel, dtype, mask_kind, reps, args.warmup_s)
                        rec.update(
                            host_ms=timing.host_ms,
                            device_ms=timing.device_ms,
                            stages=timing.extra,
                            plan={key: str(val) for key, val in plan.items()},
                            tile=tile_text(plan),
                            **errors(out, ref, s),
                        )
                        del out
                    except Exception as e:  # noqa: BLE001 -- recorded, the run goes on
                        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    results.append(rec)
                    log(fmt(rec))
                if not args.no_resident:
                    for name, dtype in (
                        ("flash WGSL f32 resident", np.float32),
                        ("flash WGSL f16 resident", np.float16),
                    ):
                        rec = {"what": name, "S": s, "D": d, "mask": mask_kind}
                        try:
                            out, timing = bench_wgsl_resident(runner, q, k, v, dtype, mask_kind, reps, args.warmup_s)
                            rec.update(
                                host_ms=timing.host_ms,
                                device_ms=timing.device_ms,
                                tile=timing.extra["tile"],
                                **errors(out, ref, s),
                            )
                            del out
                        except Exception as e:  # noqa: BLE001 -- recorded, the run goes on
                            rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                        results.append(rec)
                        log(fmt(rec))
                if use_torch:
                    for dt in ("f32", "f16"):
                        rec = {"what": f"torch SDPA CUDA {dt}", "S": s, "D": d, "mask": mask_kind}
                        try:
                            out, timing = bench_torch(q, k, v, dt, mask_kind, reps, args.warmup_s)
                            rec.update(host_ms=timing.host_ms, device_ms=timing.device_ms, **errors(out, ref, s))
                        except Exception as e:  # noqa: BLE001 -- recorded
                            rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                        results.append(rec)
                        log(fmt(rec))
                for orec in ort_records:
                    if (orec["S"], orec["D"], orec["mask"]) != (s, d, mask_kind):
                        continue
                    rec = {"what": f"ORT WebGPU MHA {orec['dtype']}", "S": s, "D": d, "mask": mask_kind}
                    for key in ("host_ms", "resident_ms", "resident_error", "error"):
                        if orec.get(key):
                            rec[key] = orec[key]
                    dump = Path(args.ort_dump) / f"ort_{orec['dtype']}_{mask_kind}_{s}_{d}.npy"
                    if dump.exists() and not rec.get("error"):
                        got = np.load(dump).astype(np.float64)
                        rec["rel_err"] = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
                        rec["max_abs_err"] = float(np.abs(got - ref).max())
                    results.append(rec)
                    log(fmt(rec))
                save()
    # The first shape once more, last: a row that was measured cold reads slower than here.
    d, s = args.dims[0], min(sizes_for(args, "none", args.dims[0]))
    q, k, v = inputs(s, d)
    ref = reference64(q, k, v, "none")
    for name, dtype in (("flash WGSL f32", np.float32), ("flash WGSL f16", np.float16)):
        rec = {"what": f"{name} (re-timed last)", "S": s, "D": d, "mask": "none"}
        out, timing, plan = bench_wgsl(runner, q, k, v, "flash", dtype, "none", reps_for(s, args.reps), args.warmup_s)
        rec.update(host_ms=timing.host_ms, device_ms=timing.device_ms, stages=timing.extra, tile=tile_text(plan))
        rec.update(errors(out, ref, s))
        results.append(rec)
        log(fmt(rec))
    save()
    log(f"wrote {out_dir / stem}.md and .json")
    log(summary(results))
    return 0


def fmt(rec: dict[str, Any]) -> str:
    s, d = rec["S"], rec["D"]
    head = f"{rec['what']:22s} {rec['mask']:7s} S={s:6d} D={d:3d}"
    if rec.get("error"):
        return f"{head}  {rec['error']}"
    parts = [head, f"host {rec['host_ms']:9.2f} ms {tflops(s, d, rec['host_ms']):6.2f} TF/s"]
    if rec.get("device_ms"):
        parts.append(f"device {rec['device_ms']:9.3f} ms {tflops(s, d, rec['device_ms']):6.2f} TF/s")
    if rec.get("resident_ms"):
        parts.append(f"resident {rec['resident_ms']:9.2f} ms")
    if "rel_err" in rec:
        parts.append(f"rel {rec['rel_err']:.1e} abs {rec['max_abs_err']:.1e}")
    return "  ".join(parts)


def markdown(meta: dict[str, Any], results: list[dict[str, Any]]) -> str:
    a = meta["adapter"]
    f = lambda x, p=2: "" if x is None else f"{x:.{p}f}"  # noqa: E731
    out = [
        "# GPU attention benchmark",
        "",
        f"- date: {meta['date']}",
        f"- adapter: {a['device']} ({a['backend']}, {a['adapter_type']}), driver: {a['driver']}",
        f"- nvidia-smi: {meta.get('nvidia_smi')}",
        f"- features: shader-f16={a['shader_f16']}, timestamp-query={a['timestamp_query']}, subgroup size "
        f"{a.get('subgroup_size')}, workgroup storage {a['max_workgroup_storage']} B, trusted shaders "
        f"{a.get('trusted_shaders')}",
        f"- torch: {meta.get('torch')}; ORT: {meta.get('ort', {}).get('ort_version', 'not run')}",
        f"- flash tiles: {json.dumps(meta.get('tiles', 'runner default'))}",
        f"- B={meta['B']}, H={meta['H']}, Sq=Sk=S, Dv=D; every row counts {meta['flops']} FLOPs (causal too)",
        "- method: every contender, shape, dtype and mask warmed up (>= "
        f"{meta['args']['warmup_s']} s and 2 calls) before timing; medians of {meta['args']['reps']} calls "
        "(half that past S=8192). host: numpy in to numpy out. device: timestamp queries around the compute "
        "pass (WGSL) or CUDA events (torch); ORT has no device timer: (resident) is the per-run host time of "
        "runs whose tensors stay on the GPU (IO binding), closed by one read-back: an upper bound. error: ||out - ref|| / ||ref|| against float64 on "
        f"{CHECK_ROWS} query rows of heads {CHECK_HEADS}. padding: bool key mask hiding the last "
        f"{PADDED_FRACTION:.0%} of the keys",
        "",
        "- resident rows: Q, K, V and O stay on the GPU (DeviceTensor, uploaded once before timing); host ms is "
        "the call plus sync() (submit, kernel, wait), device ms the timestamps of the same calls",
        "- host stages (WGSL numpy rows, medians, ms): prepare+stage = host layout and memcpy into the mapped "
        "staging buffers; wait = uploads, kernel and read-back copy on the device; read = copy out of the mapped buffer",
        "",
        "| what | mask | D | S | host ms | device ms | device TFLOP/s | host / device | rel. error vs f64 "
        "| host stages: prepare+stage / wait / read | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s, d = r["S"], r["D"]
        host, dev = r.get("host_ms"), r.get("device_ms")
        dev_txt = f(dev, 3)
        if dev is None and r.get("resident_ms"):
            dev = r["resident_ms"]
            dev_txt = f"({dev:.3f})"
        ratio = f(host / dev) if host and dev else ""
        err = f"{r['rel_err']:.1e}" if "rel_err" in r else ""
        st = r.get("stages") or {}
        stages = (
            f"{st['prepare_ms'] + st['stage_ms']:.2f} / {st['wait_ms']:.2f} / {st['read_ms']:.2f}"
            if {"prepare_ms", "stage_ms", "wait_ms", "read_ms"} <= set(st)
            else ""
        )
        out.append(
            f"| {r['what']} | {r['mask']} | {d} | {s} | {f(host)} | {dev_txt} | {f(tflops(s, d, dev))} "
            f"| {ratio} | {err} | {stages} | {r.get('error', '') or r.get('resident_error', '') or r.get('tile', '')} |"
        )
    return "\n".join(out) + "\n"


def summary(results: list[dict[str, Any]]) -> str:
    def get(what: str, s: int, d: int, mask: str, key: str) -> Any:
        for r in results:
            if (r["what"], r["S"], r["D"], r["mask"]) == (what, s, d, mask) and r.get(key):
                return r[key]
        return None

    lines = ["", "targets (B=1, H=16, S=4096):"]
    for dt in ("f32", "f16"):
        for d in (64, 128):
            dev = get(f"flash WGSL {dt}", 4096, d, "none", "device_ms")
            host = get(f"flash WGSL {dt}", 4096, d, "none", "host_ms")
            causal = get(f"flash WGSL {dt}", 4096, d, "causal", "device_ms")
            if dev:
                lines.append(
                    f"  flash {dt} D={d}: {tflops(4096, d, dev):.1f} TFLOP/s device, host/device "
                    f"{host / dev:.2f}" + (f", causal speed-up {dev / causal:.2f}x" if causal else "")
                )
    for dt in ("f32", "f16"):
        dev = get(f"flash WGSL {dt} resident", 4096, 64, "none", "device_ms")
        host = get(f"flash WGSL {dt} resident", 4096, 64, "none", "host_ms")
        if dev and host:
            lines.append(f"  resident flash {dt} D=64: host (call + sync) / device {host / dev:.2f}")
    ort = get("ORT WebGPU MHA f32", 4096, 64, "none", "host_ms")
    host = get("flash WGSL f32", 4096, 64, "none", "host_ms")
    if ort and host:
        lines.append(f"  host-to-host vs ORT WebGPU MHA f32 D=64: {ort / host:.2f}x")
    torch32 = get("torch SDPA CUDA f32", 4096, 64, "none", "device_ms")
    dev = get("flash WGSL f32", 4096, 64, "none", "device_ms")
    if torch32 and dev:
        lines.append(f"  flash f32 / torch SDPA f32 throughput (device): {torch32 / dev:.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
