"""Held-out exports (models/outside_models.py --out DIR) on ONNX Runtime's WebGPU plugin EP: the
original against ``--target webgpu`` (this tree and, where made, an earlier tree's), and
``--ep webgpu --seq-lens 128`` (the cost table's choice), at S = 32..512 (issue 31 item 2).

    python benchmarks/webgpu_outside.py make build/wout --src /work/outside [--before-python CMD]  # here
    python benchmarks/webgpu_outside.py run build/wout --out OUT        # GPU machine (numpy, onnxruntime, plugin)
    python benchmarks/webgpu_outside.py table OUT/webgpu_outside.json  # here: the .md

Per model: right or wrong against the original on the CPU EP (batch 2, 37 positions, make_feeds's
padded masks); then every variant in one process, batch 1, alternating order over ROUNDS rounds of
REPEATS host-to-host runs (median); ratio = original ms / variant ms. One profiled run per variant
at PROFILE_SEQ counts the nodes the EP left to the CPU and the GPU->CPU copies (MemcpyToHost).
The cost table (lowering/webgpu.py CROSSOVERS) is read from the webgpu variant's ratios by mask kind and
head dim: crossover.py's rule over every model of that kind.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ep_probe  # noqa: E402
import webgpu_capabilities as wcaps  # noqa: E402
import webgpu_zoo as wz  # noqa: E402

SEQ_LENS = (32, 64, 128, 256, 512)
CHECK = {"seq": 37, "batch": 2}
PROFILE_SEQ = 128
ROUNDS = 4
REPEATS = 10
# variant -> the `ortflash optimize` arguments that write it (None: the original file)
VARIANTS: dict[str, list[str] | None] = {
    "original": None,
    "webgpu": ["--target", "webgpu"],
    "ep_webgpu": ["--ep", "webgpu", "--seq-lens", "128"],
}
BEFORE = "webgpu_before"


def _optimize(python: list[str], src: str, dst: str, args: list[str]) -> bool:
    """`ortflash optimize` in a process of its own, from the root folder (so that `python -m` imports
    the ortflash its PYTHONPATH names, not this tree's)."""
    src, dst = os.path.abspath(src), os.path.abspath(dst)
    done = subprocess.run(
        [*python, "-m", "ortflash", "optimize", src, "-o", dst, "-q", *args], cwd="/", capture_output=True, text=True
    )
    if done.returncode != 0 or not os.path.exists(dst):
        print("  optimize failed", args, done.stderr.strip().splitlines()[-1:] if done.stderr else done.returncode)
        return False
    return True


def _blocks(path: str) -> dict[str, Any]:
    """Mask kind and head dim of each fused block, as the cost table reads them (ortflash here)."""
    import onnx

    import ortflash

    _, report = ortflash.optimize(onnx.load(path), target="ortflash")
    rows = [{"kind": b.mask_kind, "head_dim": b.head_dim} for b in report.blocks if b.fused]
    return {"fused": report.fused, "rows": rows}


def _lowered(path: str | None) -> int:
    """How many native attention nodes the webgpu variant holds (0: every block kept its ops)."""
    import onnx

    if path is None:
        return 0
    model = onnx.load(path, load_external_data=False)
    return sum(n.op_type in ("MultiHeadAttention", "GroupQueryAttention") for n in model.graph.node)


def make(folder: str, src: str, before_python: str | None, only: str | None) -> None:
    import fnmatch

    import onnx

    from ortflash.checks.feeds import make_feeds

    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f"tmp_{os.getpid()}")
    os.makedirs(tmp, exist_ok=True)
    index = []
    python = [sys.executable]
    before = before_python.split() if before_python else None
    for path in sorted(glob.glob(os.path.join(src, "*.onnx"))):
        stem = os.path.basename(path)[: -len(".onnx")]
        if only and not any(fnmatch.fnmatch(stem, g) for g in only.split(",")):
            continue
        model = onnx.load(path)
        if any(i.name.startswith("past") for i in model.graph.input):
            continue  # KV-cache decoders: item 4, not this table
        made: dict[str, str] = {}
        variants = dict(VARIANTS)
        if before:
            variants[BEFORE] = ["--target", "webgpu"]
        for variant, args in variants.items():
            if args is None:
                made[variant] = path
                continue
            dst = os.path.join(tmp, f"{stem}.{variant}.onnx")
            if _optimize(before if variant == BEFORE else python, path, dst, args):  # type: ignore[arg-type]
                made[variant] = dst
        table = wz._shared_weights(model, os.path.join(folder, f"{stem}.data"))
        for variant, p in made.items():
            wz._save_sharing(onnx.load(p), os.path.join(folder, f"{stem}.{variant}.onnx"), f"{stem}.data", table)
        check = make_feeds(model, seq_len=CHECK["seq"], batch=CHECK["batch"], seed=0)
        np.savez(os.path.join(folder, f"{stem}.check.npz"), **check)
        timing = {}
        for s in SEQ_LENS:
            try:
                timing.update({f"{s}/{k}": v for k, v in make_feeds(model, seq_len=s, batch=1, seed=1).items()})
            except Exception:  # noqa: BLE001 - a fixed-size input (an image) takes one length
                pass
        np.savez(os.path.join(folder, f"{stem}.timing.npz"), **timing)
        info = _blocks(path)
        info["lowered"] = _lowered(made.get("webgpu"))
        index.append({"model": stem, "variants": sorted(made), **info})
        print(stem, sorted(made), info["fused"], flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    # one index per make process (several may fill one folder side by side); run reads them all
    json.dump(index, open(os.path.join(folder, f"index_{os.getpid()}.json"), "w"), indent=1)


# ------------------------------------------------------------------------------------------------
# run (GPU machine: numpy, onnxruntime + onnxruntime-ep-webgpu)


def _profile_summary(path: str, ep: str) -> dict[str, Any]:
    events = json.load(open(path))
    by_op: dict[str, float] = {}
    cpu_ops: dict[str, int] = {}
    copies = 0
    names = set()
    for ev in events:
        args = ev.get("args", {})
        if ev.get("cat") != "Node" or "provider" not in args or not ev["name"].endswith("_kernel_time"):
            continue
        op = args.get("op_name", "?")
        names.add(ev["name"])
        by_op[op] = by_op.get(op, 0.0) + float(ev.get("dur", 0))
        if op == "MemcpyToHost":
            copies += 1
        if args["provider"] != ep and not op.startswith("Memcpy"):
            cpu_ops[op] = cpu_ops.get(op, 0) + 1
    return {
        "nodes_run": len(names),
        "to_host_copies": copies,
        "cpu_ops": cpu_ops,
        "us_by_op": {k: round(v, 1) for k, v in sorted(by_op.items(), key=lambda kv: -kv[1])[:12]},
    }


def run(folder: str, out_dir: str, budget_s: float) -> None:
    import onnxruntime as ort

    ep = wcaps.register_webgpu(ort)
    os.makedirs(out_dir, exist_ok=True)
    started = time.perf_counter()
    index = sorted(
        (e for p in glob.glob(os.path.join(folder, "index_*.json")) for e in json.load(open(p))),
        key=lambda e: e["model"],
    )
    rows: list[dict[str, Any]] = []
    prefix = os.path.join(out_dir, "prof")
    for entry in index:
        if time.perf_counter() - started > budget_s:
            rows.append({"model": entry["model"], "skipped": "budget"})
            continue
        stem = entry["model"]
        base = os.path.join(folder, stem)
        check = dict(np.load(base + ".check.npz"))
        timing_all = dict(np.load(base + ".timing.npz"))
        row: dict[str, Any] = {"model": stem, "fused": entry["fused"], "blocks": entry["rows"], "variants": {}}
        row["lowered"] = entry.get("lowered")
        try:
            want = ort.InferenceSession(base + ".original.onnx", providers=["CPUExecutionProvider"]).run(None, check)
        except Exception as exc:  # noqa: BLE001
            row["error"] = f"cpu: {str(exc).splitlines()[0][:200]}"
            rows.append(row)
            continue
        sessions = {}
        for variant in entry["variants"]:
            v: dict[str, Any] = {}
            try:
                sess = ort.InferenceSession(f"{base}.{variant}.onnx", wcaps.webgpu_session_options(ort, None))
                if not any(ep in p for p in sess.get_providers()):
                    raise RuntimeError(f"the WebGPU EP was not taken: {sess.get_providers()}")
                v.update(ep_probe.compare(want, sess.run(None, check)))
                sessions[variant] = sess
                psess = ort.InferenceSession(f"{base}.{variant}.onnx", wcaps.webgpu_session_options(ort, prefix))
                feeds = {
                    k.split("/", 1)[1]: x for k, x in timing_all.items() if k.startswith(f"{PROFILE_SEQ}/")
                } or check
                for _ in range(3):
                    psess.run(None, feeds)
                v["profile"] = _profile_summary(psess.end_profiling(), ep)
            except Exception as exc:  # noqa: BLE001 - reported per row
                v["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            finally:
                for left in glob.glob(prefix + "*"):
                    os.remove(left)
            row["variants"][variant] = v
        row["ms"] = {}
        for s in SEQ_LENS:
            feeds = {k.split("/", 1)[1]: x for k, x in timing_all.items() if k.startswith(f"{s}/")}
            if not feeds:
                continue
            try:
                for sess in sessions.values():
                    sess.run(None, feeds)
            except Exception as exc:  # noqa: BLE001 - a length the model does not take
                row["ms"][str(s)] = {"error": str(exc).splitlines()[0][:120]}
                continue
            times: dict[str, list[float]] = {k: [] for k in sessions}
            order = list(sessions)
            for r in range(ROUNDS):
                for variant in order if r % 2 == 0 else order[::-1]:
                    sess = sessions[variant]
                    sess.run(None, feeds)
                    for _ in range(REPEATS):
                        t0 = time.perf_counter()
                        sess.run(None, feeds)
                        times[variant].append((time.perf_counter() - t0) * 1e3)
            row["ms"][str(s)] = {k: round(statistics.median(t), 4) for k, t in times.items()}
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("model", "ms")}), flush=True)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"gpu": ep_probe.gpu(), "ep": ep, "onnxruntime": ort.__version__},
        "seq_lens": list(SEQ_LENS),
        "rounds": ROUNDS,
        "repeats": REPEATS,
        "rows": rows,
    }
    # the plugin module has no __version__; its EP device's metadata says it
    result["machine"]["onnxruntime_ep_webgpu"] = next(
        (dict(d.ep_metadata).get("version", "?") for d in ort.get_ep_devices() if d.ep_name == ep), "?"
    )
    json.dump(result, open(os.path.join(out_dir, "webgpu_outside.json"), "w"), indent=1)


# ------------------------------------------------------------------------------------------------
# table (here)


def ratios(row: dict[str, Any], variant: str) -> dict[int, float]:
    out = {}
    for s, ms in row.get("ms", {}).items():
        if variant in ms and "original" in ms and ms[variant]:
            out[int(s)] = ms["original"] / ms[variant]
    return out


def geomean(values: list[float]) -> float | None:
    return float(np.exp(np.mean(np.log(values)))) if values else None


def table(json_path: str, md_path: str) -> None:
    data = json.load(open(json_path))
    rows = [r for r in data["rows"] if "ms" in r]
    variants = [v for v in ("webgpu", "webgpu_before", "ep_webgpu") if any(v in r["variants"] for r in rows)]
    lines = [
        "# Held-out exports on ONNX Runtime's WebGPU EP: `--target webgpu` and `--ep webgpu` against the original",
        "",
        f"- date: {data['date']}; {data['machine']}",
        "- command: `bash benchmarks/webgpu_gpu_run.sh outside` after "
        "`python benchmarks/webgpu_outside.py make build/webgpu_run/wout --src /work/outside --before-python ...`",
        f"- models: models/outside_models.py's exports (tiny random-weight configs: 2 layers, few heads, small hidden "
        f"sizes), batch 1; ratio = original ms / variant ms (host to host, median of {data['rounds']}x{data['repeats']} "
        "runs, variants alternating in one process); right: against the original on the CPU EP at batch 2, 37 "
        "positions, padded masks",
        "- webgpu_before: `--target webgpu` with ortflash/lowering/webgpu.py and layout.py as at 04b3548 (the guard of "
        "13 nodes per block, two of them And, which the EP leaves to the CPU); webgpu: `--target webgpu` after ee43c07 "
        "(the guard folded, the bias shared by the blocks); ep_webgpu: `--ep webgpu --seq-lens 128` (the cost table "
        f"of the tree the models were made with: {data.get('table', 'forms.WEBGPU_CROSSOVERS before this change')})",
        "",
        "| model | blocks (kind, D) | right | "
        + " | ".join(f"{v} S={s}" for v in variants for s in (32, 128, 512))
        + " |",
        "|---|---|---|" + "---|" * (3 * len(variants)),
    ]
    at: dict[str, dict[int, list[float]]] = {v: {} for v in variants}
    for r in rows:
        kinds = sorted({f"{b['kind']} {b['head_dim']}" for b in r["blocks"]})
        right = []
        for v in ["original", *variants]:
            got = r["variants"].get(v)
            if got is not None:
                right.append(f"{v}: " + ("fails to load" if "error" in got else "yes" if got.get("ok") else "**NO**"))
        cells = []
        for v in variants:
            rat = ratios(r, v)
            for s, x in rat.items():
                at[v].setdefault(s, []).append(x)
            cells += [f"{rat[s]:.2f}" if s in rat else "-" for s in (32, 128, 512)]
        lines.append(f"| {r['model']} | {', '.join(kinds) or '-'} | {'; '.join(right)} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| variant | " + " | ".join(f"S={s}" for s in data["seq_lens"]) + " |",
        "|---|" + "---|" * len(data["seq_lens"]),
    ]
    for v in variants:
        cells = []
        for s in data["seq_lens"]:
            xs = at[v].get(s, [])
            g = geomean(xs)
            cells.append("-" if g is None else f"{g:.2f} ({min(xs):.2f}-{max(xs):.2f}, n={len(xs)})")
        lines.append(f"| {v} geomean (min-max) | " + " | ".join(cells) + " |")
    if data.get("notes"):
        lines += ["", "## What it shows", ""] + [f"- {n}" for n in data["notes"]]
    lines += ["", "## Nodes at S=128 (one profiled run): run / left on the CPU / GPU->CPU copies", ""]
    lines += [
        "(nodes in the profile, kernel events on the CPU over 3 runs, MemcpyToHost events)",
        "",
        "| model | " + " | ".join(["original", *variants]) + " |",
        "|---|" + "---|" * (1 + len(variants)),
    ]
    for r in rows:
        cells = []
        for v in ["original", *variants]:
            p = r["variants"].get(v, {}).get("profile")
            cells.append(
                "-" if p is None else f"{p['nodes_run']} / {sum(p['cpu_ops'].values())} / {p['to_host_copies']}"
            )
        lines.append(f"| {r['model']} | " + " | ".join(cells) + " |")
    ep_probe.write_table(md_path, lines)


def main(argv: list[str] | None = None) -> int:
    steps = ep_probe.StepCommandLine(__doc__, md="benchmarks/results/webgpu_outside.md", device=None)
    steps.make.add_argument("--src", default="/work/outside", help="folder of held-out exports")
    steps.make.add_argument("--before-python", help="a python command line whose ortflash is the earlier tree")
    steps.make.add_argument("--only", help="model stems matching one of these globs (comma-separated)")
    steps.run.add_argument("--budget-s", type=float, default=420.0)
    return steps.call(
        argv,
        make=lambda args: make(args.folder, args.src, args.before_python, args.only),
        run=lambda args: run(args.folder, args.out, args.budget_s),
        table=lambda args: table(args.json, args.md),
    )


if __name__ == "__main__":
    sys.exit(main())
