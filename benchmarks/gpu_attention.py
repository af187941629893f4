"""GPU attention benchmark: ortflash's WGSL kernels against ONNX Runtime's WebGPU EP and PyTorch.

Meant for a Linux machine with an NVIDIA GPU and no package registry
(/work/shared/GPU.md, or the project's notes, say what has to travel: the wgpu
wheels, optionally onnxruntime-webgpu, and the Vulkan loader). One run, the
same random inputs for every contender (float32 inputs drawn once per shape,
float16 made from them):

  flash WGSL float32 / float16   flash.wgsl through ortflash.shaders.runner
  naive WGSL float32             naive.wgsl (three passes, score rows in memory)
  ORT WebGPU EP                  com.microsoft MultiHeadAttention, run in a child
                                 process whose PYTHONPATH holds onnxruntime-webgpu
                                 (--ort-site), since that wheel installs a module
                                 named onnxruntime too
  PyTorch SDPA (CUDA)            when torch is importable and sees a GPU

Shapes: B=1, H=16, D in --dims, S in --sizes (Sq = Sk = S, no mask). Times:
host-to-host per call (numpy in, numpy out; median of --reps after a warm-up)
and device time (WGSL: timestamp queries around the compute pass; torch: CUDA
events). TFLOP/s = 4 * S^2 * D * H / time. Results go to
benchmarks/results/gpu_attention_<device>.{md,json}.

    python benchmarks/gpu_attention.py --tune --ort-site /tmp/ortweb   # as recorded
    python benchmarks/gpu_attention.py --sweep          # only time every flash tile at S=4096

On the device machine (after unpacking the Vulkan loader debs and installing the
wheels into /tmp/site, and onnxruntime-webgpu alone into /tmp/ortweb):

    export PYTHONPATH=/tmp/site:$PWD LD_LIBRARY_PATH=/usr/local/nvidia/lib64:$LD_LIBRARY_PATH \
        VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    python3 benchmarks/gpu_attention.py --tune --ort-site /tmp/ortweb

With only the libvulkan1 .deb and no LD_LIBRARY_PATH, wgpu found no adapter
there; with libvulkan1, libglvnd0, libegl1, libgl1, libglx0, libopengl0 and
libgles2 unpacked and LD_LIBRARY_PATH as above it found the H200 (NVIDIA's ICD,
libGLX_nvidia, needs libGLdispatch from libglvnd0; which of the two changes
mattered was not isolated).
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
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

B, H = 1, 16
SEED = 1234


def inputs(s: int, d: int):
    """The shared inputs of one shape: Q, K, V float32 [B, H, S, D], unit normal."""
    rng = np.random.default_rng(SEED + s * 7 + d)
    shape = (B, H, s, d)
    return tuple(rng.standard_normal(shape, dtype=np.float32) for _ in range(3))


def tflops(s: int, d: int, ms: float | None) -> float | None:
    return None if not ms else 4.0 * s * s * d * H / (ms * 1e-3) / 1e12


def median(xs):
    xs = [x for x in xs if x is not None]
    return float(np.median(xs)) if xs else None


def reps_for(s: int, reps: int) -> int:
    return max(2, reps if s <= 8192 else reps // 2)


# --------------------------------------------------------------------------- WGSL


def bench_wgsl(runner, q, k, v, kernel, dtype, reps, tile=None):
    from ortflash import spec

    attrs = spec.validate({"scale": q.shape[-1] ** -0.5})
    qq, kk, vv = (t.astype(dtype) for t in (q, k, v))
    out = runner.attention(qq, kk, vv, attrs=attrs, kernel=kernel, tile=tile)  # warm-up: compile, allocate
    host, dev = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = runner.attention(qq, kk, vv, attrs=attrs, kernel=kernel, tile=tile)
        host.append((time.perf_counter() - t0) * 1e3)
        dev.append(runner.last_device_ms)
    return out, median(host), median(dev), dict(runner.last_plan)


def reference_heads(q, k, v, heads=2):
    from ortflash.kernels import reference

    d = q.shape[-1]
    return reference.flash_attention(q[:, :heads], k[:, :heads], v[:, :heads], scale=d**-0.5)


# --------------------------------------------------------------------------- ORT WebGPU (child)


def ort_worker(args):
    """Runs in the child process: MultiHeadAttention on the WebGPU EP, one JSON line per shape."""
    from onnx import TensorProto, helper

    import onnxruntime as ort

    print(json.dumps({"ort_version": ort.__version__, "providers": ort.get_available_providers()}), flush=True)
    for d in args.dims:
        for s in args.sizes:
            if s > args.ort_max_s:
                continue
            rec = {"kind": "ort", "S": s, "D": d}
            try:
                q, k, v = inputs(s, d)
                for dtype_name, np_dtype, onnx_dtype in (("f32", np.float32, TensorProto.FLOAT), ("f16", np.float16, TensorProto.FLOAT16)):
                    if dtype_name not in args.ort_dtypes:
                        continue
                    hidden = H * d
                    node = helper.make_node(
                        "MultiHeadAttention", ["query", "key", "value"], ["out"], domain="com.microsoft",
                        num_heads=H, scale=float(d**-0.5),
                    )
                    vi = [helper.make_tensor_value_info(n, onnx_dtype, [B, s, hidden]) for n in ("query", "key", "value")]
                    graph = helper.make_graph([node], "mha", vi, [helper.make_tensor_value_info("out", onnx_dtype, [B, s, hidden])])
                    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
                    model.ir_version = 8
                    so = ort.SessionOptions()
                    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["WebGpuExecutionProvider"])
                    if "WebGpuExecutionProvider" not in sess.get_providers():
                        raise RuntimeError(f"WebGPU EP not used: {sess.get_providers()}")
                    feeds = {
                        "query": np.ascontiguousarray(q.transpose(0, 2, 1, 3).reshape(B, s, hidden)).astype(np_dtype),
                        "key": np.ascontiguousarray(k.transpose(0, 2, 1, 3).reshape(B, s, hidden)).astype(np_dtype),
                        "value": np.ascontiguousarray(v.transpose(0, 2, 1, 3).reshape(B, s, hidden)).astype(np_dtype),
                    }
                    out = sess.run(None, feeds)[0]
                    times = []
                    for _ in range(reps_for(s, args.reps)):
                        t0 = time.perf_counter()
                        out = sess.run(None, feeds)[0]
                        times.append((time.perf_counter() - t0) * 1e3)
                    o = out.reshape(B, s, H, d).transpose(0, 2, 1, 3)[:, :2].astype(np.float32)
                    np.save(Path(args.ort_dump) / f"ort_{dtype_name}_{s}_{d}.npy", o)
                    rec[dtype_name + "_host_ms"] = median(times)
                    try:  # inputs and output kept on the GPU (IO binding): closer to device time
                        io = sess.io_binding()
                        for name, arr in feeds.items():
                            io.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(arr, "webgpu", 0))
                        io.bind_output("out", "webgpu")
                        sess.run_with_iobinding(io)
                        io.synchronize_outputs()
                        times = []
                        for _ in range(reps_for(s, args.reps)):
                            t0 = time.perf_counter()
                            sess.run_with_iobinding(io)
                            io.synchronize_outputs()
                            times.append((time.perf_counter() - t0) * 1e3)
                        rec[dtype_name + "_resident_ms"] = median(times)
                        del io
                    except Exception as e:
                        rec[dtype_name + "_resident_error"] = f"{type(e).__name__}: {str(e)[:90]}"
                    del sess
            except Exception as e:  # record, keep going
                rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(json.dumps(rec), flush=True)


def run_ort(args, log):
    """Start the WebGPU EP child; return {(S, D): record} and its version line."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([args.ort_site, str(ROOT)])
    dump = Path(args.ort_dump)
    dump.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, __file__, "--ort-worker", "--ort-dump", str(dump), "--reps", str(args.reps),
           "--ort-max-s", str(args.ort_max_s), "--ort-dtypes", *args.ort_dtypes,
           "--sizes", *map(str, args.sizes), "--dims", *map(str, args.dims)]
    records, header = {}, {}
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.ort_timeout)
        lines = proc.stdout.splitlines()
        if proc.returncode:
            log(f"ORT child exited {proc.returncode}: {proc.stderr[-800:]}")
    except subprocess.TimeoutExpired as e:
        lines = (e.stdout or b"").decode(errors="replace").splitlines() if isinstance(e.stdout, bytes) else (e.stdout or "").splitlines()
        log(f"ORT child timed out after {args.ort_timeout} s")
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "ort_version" in rec:
            header = rec
        elif rec.get("kind") == "ort":
            records[(rec["S"], rec["D"])] = rec
    return records, header


# --------------------------------------------------------------------------- PyTorch


def bench_torch(q, k, v, dtype_name, reps):
    import torch
    import torch.nn.functional as F

    tdt = {"f32": torch.float32, "f16": torch.float16}[dtype_name]
    scale = q.shape[-1] ** -0.5
    host_inputs = [torch.from_numpy(t) for t in (q, k, v)]

    def call():
        qq, kk, vv = (t.to("cuda").to(tdt) for t in host_inputs)
        return F.scaled_dot_product_attention(qq, kk, vv, scale=scale).float().cpu().numpy()

    out = call()
    host = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = call()
        host.append((time.perf_counter() - t0) * 1e3)
    qq, kk, vv = (t.to("cuda").to(tdt) for t in host_inputs)
    F.scaled_dot_product_attention(qq, kk, vv, scale=scale)
    dev = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        F.scaled_dot_product_attention(qq, kk, vv, scale=scale)
        e1.record()
        torch.cuda.synchronize()
        dev.append(e0.elapsed_time(e1))
    del qq, kk, vv
    torch.cuda.empty_cache()
    return out, median(host), median(dev)


def torch_available():
    try:
        import torch

        return torch.cuda.is_available(), f"torch {torch.__version__}"
    except Exception as e:
        return False, f"torch not importable ({type(e).__name__})"


# --------------------------------------------------------------------------- sweep


def sweep(args, runner, log):
    """Device time of every flash tile that fits, S=4096, for tuning the runner's choice."""
    from ortflash.shaders.runner import flash_tiles

    s = args.sweep_s
    rows = []
    for d in args.dims:
        q, k, v = inputs(s, d)
        tiles = flash_tiles(d // 4, d // 4, s, runner.limits["max-compute-workgroup-storage-size"],
                            runner.limits["max-compute-invocations-per-workgroup"], max_registers=args.max_registers)
        # Workgroups of 32..256 invocations, at least 32 rows and 2 keys per invocation.
        tiles = [t for t in tiles if t.br >= 32 and 32 <= t.workgroup_size <= 256 and t.bc // t.c >= 2]
        tiles = tiles[: args.sweep_top]
        for dtype in (np.float32, np.float16):
            timed = []
            for t in tiles:
                try:
                    # 4 runs: the GPU clocks down while the next tile compiles, and
                    # the first runs after that are slower (2 runs gave noisy ranks).
                    _, host, dev, _ = bench_wgsl(runner, q, k, v, "flash", dtype, 4, tile=t)
                    rows.append({"D": d, "dtype": np.dtype(dtype).name, "tile": t.__dict__, "host_ms": host,
                                 "device_ms": dev, "tflops_device": tflops(s, d, dev)})
                    timed.append((dev, t))
                    log(f"sweep D={d} {np.dtype(dtype).name:8s} {t} dev {dev:.3f} ms {tflops(s, d, dev):6.2f} TFLOP/s")
                except Exception as e:
                    log(f"sweep D={d} {t} failed: {e}")
            # float16 differs only in its loads: try the float32 front-runners only.
            tiles = [t for _, t in sorted(timed, key=lambda x: x[0])[: args.sweep_f16_top]]
    return rows


# --------------------------------------------------------------------------- main


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768, 65536])
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--naive-max-s", type=int, default=32768, help="largest S for the naive kernel")
    ap.add_argument("--flash-f16", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--ort-site", default=None, help="PYTHONPATH target holding onnxruntime-webgpu")
    ap.add_argument("--ort-max-s", type=int, default=32768)
    ap.add_argument("--ort-dtypes", nargs="+", default=["f32", "f16"])
    ap.add_argument("--ort-timeout", type=int, default=240)
    ap.add_argument("--ort-dump", default="/tmp/ortflash_ort_dump")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="time every flash tile at --sweep-s instead")
    ap.add_argument("--sweep-s", type=int, default=4096)
    ap.add_argument("--sweep-top", type=int, default=40)
    ap.add_argument("--sweep-f16-top", type=int, default=8)
    ap.add_argument("--max-registers", type=int, default=200)
    ap.add_argument("--tune", action="store_true", help="sweep first, then benchmark flash with the best tile per D and dtype")
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--tag", default="", help="suffix for the results file names")
    ap.add_argument("--ort-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.ort_worker:
        return ort_worker(args)

    lines = []

    def log(msg):
        print(msg, flush=True)
        lines.append(msg)

    from ortflash.shaders.runner import Runner

    runner = Runner()
    info = runner.info
    log(f"adapter: {json.dumps(info)}")
    slug = re.sub(r"[^a-z0-9]+", "-", info["device"].lower()).strip("-")[:40] or "unknown"
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "adapter": info,
        "host": platform.node(),
        "python": platform.python_version(),
        "B": B,
        "H": H,
        "flops": "4 * S^2 * D * H",
    }
    try:
        meta["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20,
        ).stdout.strip()
    except Exception:
        meta["nvidia_smi"] = None

    best_tiles = {}  # (D, dtype name) -> FlashTile, from the sweep
    if args.sweep or args.tune:
        from ortflash.shaders.runner import FlashTile

        rows = sweep(args, runner, log)
        best = {}
        for r in rows:
            key = (r["D"], r["dtype"])
            if r["device_ms"] and (key not in best or r["device_ms"] < best[key]["device_ms"]):
                best[key] = r
        for (d, dt), r in sorted(best.items()):
            log(f"best D={d} {dt}: {r['tile']} {r['device_ms']:.3f} ms {r['tflops_device']:.2f} TFLOP/s")
            best_tiles[(d, dt)] = FlashTile(**r["tile"])
        path = out_dir / f"gpu_sweep_{slug}{args.tag}.json"
        path.write_text(json.dumps({"meta": meta, "S": args.sweep_s, "rows": rows}, indent=1))
        log(f"wrote {path}")
        meta["tiles"] = {f"D={d} {dt}": t.__dict__ for (d, dt), t in best_tiles.items()}
        if args.sweep:
            return 0

    # ONNX Runtime's WebGPU EP first (a child process, its own Dawn device), so a run
    # cut short by a time limit still has it; compared with flash once flash has run.
    ort, ort_header = ({}, {})
    if args.ort_site:
        ort, ort_header = run_ort(args, log)
        log(f"ORT: {json.dumps(ort_header)}")
        for key, rec in sorted(ort.items()):
            log(f"ORT child: {json.dumps(rec)}")

    use_torch, torch_note = (False, "disabled") if args.no_torch else torch_available()
    log(f"torch: {torch_note}, cuda={use_torch}")
    results = []
    notes = []
    stem = f"gpu_attention_{slug}{args.tag}"
    meta.update(torch=torch_note, ort={}, notes=notes, args=vars(args))

    def save():
        """Write what is known so far (a run cut short still leaves its results)."""
        (out_dir / f"{stem}.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
        (out_dir / f"{stem}.md").write_text(_markdown(meta, results))

    for d in args.dims:
        for s in args.sizes:
            q, k, v = inputs(s, d)
            reps = reps_for(s, args.reps)
            check = reference_heads(q, k, v) if s <= 4096 else None
            flash32 = None
            variants = [("flash WGSL f32", "flash", np.float32)]
            if args.flash_f16:
                variants.append(("flash WGSL f16", "flash", np.float16))
            variants.append(("naive WGSL f32", "naive", np.float32))
            for name, kernel, dtype in variants:
                rec = {"what": name, "S": s, "D": d}
                if kernel == "naive" and s > args.naive_max_s:
                    full = B * H * s * s * 4
                    rec["error"] = (f"not run: the score matrix is {full / 2**30:.0f} GiB "
                                    f"(over the GPU's memory); naive would need {full // (2**31)} chunks")
                    results.append(rec)
                    log(f"{name:18s} S={s:6d} D={d:3d}  {rec['error']}")
                    continue
                try:
                    tile = best_tiles.get((d, np.dtype(dtype).name)) if kernel == "flash" else None
                    out, host, dev, plan = bench_wgsl(runner, q, k, v, kernel, dtype, reps, tile=tile)
                    rec.update(host_ms=host, device_ms=dev, plan={k2: str(v2) for k2, v2 in plan.items()})
                    if check is not None:
                        rec["max_abs_err_vs_numpy"] = float(np.nanmax(np.abs(out[:, :2].astype(np.float32) - check)))
                    if kernel == "flash" and dtype == np.float32:
                        flash32 = out[:, :2].astype(np.float32)
                    del out
                except Exception as e:
                    rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                results.append(rec)
                log(_fmt(rec))
            if use_torch:
                for dt in ("f32", "f16"):
                    rec = {"what": f"torch SDPA CUDA {dt}", "S": s, "D": d}
                    try:
                        out, host, dev = bench_torch(q, k, v, dt, reps)
                        rec.update(host_ms=host, device_ms=dev)
                        if flash32 is not None:
                            rec["max_abs_diff_vs_flash_f32"] = float(np.abs(out[:, :2] - flash32).max())
                    except Exception as e:
                        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    results.append(rec)
                    log(_fmt(rec))
            if flash32 is not None:
                _flash_cache[(s, d)] = flash32  # what the ORT outputs are compared with
            save()

    if args.ort_site:
        for d in args.dims:
            for s in args.sizes:
                rec_child = ort.get((s, d))
                for dt in args.ort_dtypes:
                    rec = {"what": f"ORT WebGPU EP MHA {dt}", "S": s, "D": d}
                    if s > args.ort_max_s:
                        rec["error"] = "not run (--ort-max-s)"
                    elif rec_child is None:
                        rec["error"] = "no result from the child process"
                    elif rec_child.get(dt + "_host_ms") is not None:
                        rec["host_ms"] = rec_child[dt + "_host_ms"]
                        if rec_child.get(dt + "_resident_ms"):
                            # Not a device timer: host time of a run whose inputs and output stay on the GPU.
                            rec["resident_ms"] = rec_child[dt + "_resident_ms"]
                        elif rec_child.get(dt + "_resident_error"):
                            rec["resident_error"] = rec_child[dt + "_resident_error"]
                        dump = Path(args.ort_dump) / f"ort_{dt}_{s}_{d}.npy"
                        if dump.exists() and (s, d) in _flash_cache:
                            rec["max_abs_diff_vs_flash_f32"] = float(np.abs(np.load(dump) - _flash_cache[(s, d)]).max())
                    else:
                        rec["error"] = rec_child.get("error", "failed")
                    results.append(rec)
                    log(_fmt(rec))
    else:
        notes.append("ORT WebGPU EP not run (no --ort-site)")

    meta["ort"] = ort_header
    save()
    log(f"wrote {out_dir / stem}.md and .json")
    log(_summary(results))
    return 0


_flash_cache: dict = {}


def _fmt(rec):
    s, d = rec["S"], rec["D"]
    if rec.get("error"):
        return f"{rec['what']:22s} S={s:6d} D={d:3d}  {rec['error']}"
    parts = [f"{rec['what']:22s} S={s:6d} D={d:3d}  host {rec['host_ms']:9.2f} ms {tflops(s, d, rec['host_ms']):6.2f} TF/s"]
    if rec.get("device_ms"):
        parts.append(f"device {rec['device_ms']:9.2f} ms {tflops(s, d, rec['device_ms']):6.2f} TF/s")
    if rec.get("resident_ms"):
        parts.append(f"resident {rec['resident_ms']:9.2f} ms {tflops(s, d, rec['resident_ms']):6.2f} TF/s")
    for key in ("max_abs_err_vs_numpy", "max_abs_diff_vs_flash_f32", "resident_error"):
        if key in rec:
            parts.append(f"{key}={rec[key]:.2e}" if isinstance(rec[key], float) else f"{key}={rec[key]}")
    return "  ".join(parts)


def _markdown(meta, results):
    a = meta["adapter"]
    out = [
        "# GPU attention benchmark",
        "",
        f"- date: {meta['date']}",
        f"- adapter: {a['device']} ({a['backend']}, {a['adapter_type']}), driver: {a['driver']}",
        f"- nvidia-smi: {meta.get('nvidia_smi')}",
        f"- features: shader-f16={a['shader_f16']}, timestamp-query={a['timestamp_query']}, "
        f"workgroup storage {a['max_workgroup_storage']} B",
        f"- torch: {meta.get('torch')}; ORT: {meta.get('ort', {}).get('ort_version', 'not run')}",
        f"- flash tiles (from the sweep at S=4096, when tuned): {json.dumps(meta.get('tiles', 'runner default'))}",
        f"- B={meta['B']}, H={meta['H']}, Sq=Sk=S, Dv=D, no mask; TFLOP/s = {meta['flops']} / time",
        "- host: numpy in to numpy out, median after a warm-up. device: timestamp queries around the compute pass (WGSL)"
        " or CUDA events (torch). resident (ORT only, no device timer there): host time of a run whose inputs and"
        " output stay on the GPU (IO binding), which bounds its device time from above",
        "",
        "| what | D | S | host ms | host TFLOP/s | device (resident) ms | device (resident) TFLOP/s | check | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    f = lambda x, p=2: "" if x is None else f"{x:.{p}f}"  # noqa: E731
    for r in results:
        s, d = r["S"], r["D"]
        host = r.get("host_ms")
        dev = r.get("device_ms")
        dev_txt = f(dev, 3)
        if dev is None and r.get("resident_ms"):
            dev = r["resident_ms"]
            dev_txt = f"({dev:.3f})"
        chk = r.get("max_abs_err_vs_numpy", r.get("max_abs_diff_vs_flash_f32"))
        out.append(
            f"| {r['what']} | {d} | {s} | {f(host)} | {f(tflops(s, d, host))} | {dev_txt} | {f(tflops(s, d, dev))} "
            f"| {'' if chk is None else f'{chk:.1e}'} | {r.get('error', '') or r.get('resident_error', '')} |"
        )
    for n in meta.get("notes", []):
        out.append(f"\n{n}")
    return "\n".join(out) + "\n"


def _summary(results):
    def get(what, s, d, key):
        for r in results:
            if r["what"] == what and r["S"] == s and r["D"] == d and r.get(key):
                return r[key]
        return None

    lines = ["", "targets (B=1, H=16, D=64):"]
    f32_dev = get("flash WGSL f32", 4096, 64, "device_ms")
    f32_host = get("flash WGSL f32", 4096, 64, "host_ms")
    ort = get("ORT WebGPU EP MHA f32", 4096, 64, "host_ms")
    ort_res = get("ORT WebGPU EP MHA f32", 4096, 64, "resident_ms")
    if f32_dev:
        lines.append(f"  flash f32 at S=4096: {tflops(4096, 64, f32_dev):.1f} TFLOP/s device, "
                     f"{tflops(4096, 64, f32_host):.1f} host-to-host")
    if f32_dev and ort:
        lines.append(f"  vs WebGPU EP host-to-host ({tflops(4096, 64, ort):.2f} TFLOP/s): device {ort / f32_dev:.2f}x, "
                     f"host-to-host {ort / f32_host:.2f}x (target >= 4x)")
    if f32_dev and ort_res:
        lines.append(f"  vs WebGPU EP resident ({tflops(4096, 64, ort_res):.2f} TFLOP/s): {ort_res / f32_dev:.2f}x")
    n = get("naive WGSL f32", 8192, 64, "device_ms")
    fl = get("flash WGSL f32", 8192, 64, "device_ms")
    if n and fl:
        lines.append(f"  flash f32 vs naive WGSL at S=8192 (device): {n / fl:.2f}x (target >= 3x)")
    f16 = get("flash WGSL f16", 4096, 64, "device_ms")
    if f16:
        lines.append(f"  flash f16 at S=4096: {tflops(4096, 64, f16):.1f} TFLOP/s device (target >= 25)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
