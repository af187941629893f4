"""Where a fused model's time goes at short lengths (issue 30 item 1), per sequence length.

For each real-size export (models/real_size_exports.py) and each S, four sessions, each in its own
process: the original in a plain onnxruntime.InferenceSession with ORT's default options
(``original``: intra-op spinning on) and with spinning off (``original-nospin``); the model fused
with ``ortflash.optimize(target="ortflash", softmax="online")`` in ``ortflash.InferenceSession`` as
users open it (``fused``) and with spinning set on by the caller (``fused-spin``). Each reports:

- ``run_us``: median wall time of one ``session.run`` (unprofiled session), and its CPU time;
- from ORT's profiler (a second, profiled session; per-node ``kernel_time`` events, summed per
  run): ``attention_us``, the nodes fusion replaces (the original's nodes missing from the fused
  model) or the FlashAttention nodes, and ``rest_us``, every other node;
- fused only, the FlashAttention node taken apart (one node's call, its feeds recorded from a run):
  ``bridge_us``: ORT's node time with our hook swapped for one returning a ready output (the
  onnxruntime-extensions PyOp's entry and exit, its input copies into new numpy arrays and the
  output copy back); ``copies_us``: numpy copies of the same inputs and output (what the copies
  alone cost); ``invoke_us``: our hook ``_invoke`` called directly (Python side + kernel);
  ``kernel_us``: the compiled module alone at the thread count the call uses, and
  ``kernel_1t_us`` at one thread.

    python benchmarks/short_seq_breakdown.py --label before --out benchmarks/results/short_seq_breakdown
    python benchmarks/short_seq_breakdown.py --models /work/exports/minilm_l3_eager_torchscript.onnx --seq-lens 16,128
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

EXPORTS = Path("/work/exports")
DEFAULT_MODELS = (
    "minilm_l3_eager_torchscript",
    "minilm_l6_eager_torchscript",
    "minilm_l6_sdpa_dynamo",
    "bert_h6d64_l4_eager_torchscript",
    "vit_s_l6_eager_torchscript",
)
VARIANTS = ("original", "original-nospin", "fused", "fused-spin")
SPINNING_KEY = "session.intra_op.allow_spinning"
SEQ_LENS = (16, 32, 64, 128, 197, 256, 512)


def model_feeds(session: Any, seq: int, batch: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out: dict[str, np.ndarray] = {}
    for arg in session.get_inputs():
        shape = [d if isinstance(d, int) else (batch if i == 0 else seq) for i, d in enumerate(arg.shape)]
        if arg.name == "attention_mask":
            out[arg.name] = np.ones(shape, np.int64)
        elif "int64" in arg.type:
            out[arg.name] = rng.integers(1, 1000, size=shape, dtype=np.int64)
        else:
            out[arg.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def fixed_seq(path: Path) -> int | None:
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    for vi in m.graph.input:
        if vi.name == "pixel_values":
            side = vi.type.tensor_type.shape.dim[2].dim_value
            return (side // 16) ** 2 + 1
    return None


def open_session(variant: str, path: Path, profile_prefix: str | None = None) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    if variant == "original-nospin":
        so.add_session_config_entry(SPINNING_KEY, "0")
    if variant == "fused-spin":
        so.add_session_config_entry(SPINNING_KEY, "1")
    if variant.startswith("original"):
        return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    import ortflash

    return ortflash.InferenceSession(str(path), sess_options=so)


def raw(session: Any) -> Any:
    return getattr(session, "_session", session)


def time_runs(run: Any, warmup: int, repeats: int, budget_s: float = 1.0) -> dict[str, float]:
    """Median wall and CPU microseconds per call over `repeats` loops (calls per loop sized to ~budget/repeats)."""
    for _ in range(warmup):
        run()
    t0 = time.perf_counter()
    run()
    one = max(time.perf_counter() - t0, 1e-6)
    calls = max(1, int(budget_s / repeats / one))
    wall, cpu = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(calls):
            run()
        wall.append((time.perf_counter() - t0) / calls * 1e6)
        cpu.append((time.process_time() - c0) / calls * 1e6)
    return {"us": round(statistics.median(wall), 1), "cpu_us": round(statistics.median(cpu), 1)}


def profile_split(
    variant: str, path: Path, feeds: dict[str, np.ndarray], attention: set[str], runs: int, workdir: Path
) -> dict[str, float]:
    """Per-run node time (profiler), summed over the attention nodes and over the rest."""
    sess = open_session(variant, path, str(workdir / f"prof_{variant}"))
    for _ in range(runs):  # the first runs warm up; only the last half is counted
        sess.run(None, feeds)
    prof = raw(sess).end_profiling()
    events = json.loads(Path(prof).read_text())
    os.unlink(prof)
    runs_seen = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    counted = runs_seen[len(runs_seen) // 2 :]  # the first half warms up
    att = [0.0] * len(counted)
    rest = [0.0] * len(counted)
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        at = next((i for i, r in enumerate(counted) if r["ts"] <= e["ts"] <= r["ts"] + r["dur"]), None)
        if at is None:
            continue
        name = e["name"][: -len("_kernel_time")]
        if name in attention or e.get("args", {}).get("op_name") == "FlashAttention":
            att[at] += e["dur"]
        else:
            rest[at] += e["dur"]
    med = statistics.median
    return {
        "attention_us": round(med(att), 1),
        "rest_us": round(med(rest), 1),
        "profiled_run_us": round(med(r["dur"] for r in counted), 1),
    }


def node_breakdown(path: Path, feeds: dict[str, np.ndarray], cfg: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """One FlashAttention call taken apart (private names of the bridge: a diagnostic)."""
    from onnxruntime_extensions import PyCustomOpDef

    from ortflash.kernels import cpu, ort_bridge

    sess = open_session("fused", path)
    seen: dict[str, Any] = {}

    def recording(op_id: int, feed: Any, attributes: Any) -> Any:
        seen.setdefault("call", (op_id, feed, attributes))
        return ort_bridge.INVOKE_HOOK(op_id, feed, attributes)

    PyCustomOpDef.install_hooker(recording)
    sess.run(None, feeds)
    PyCustomOpDef.install_hooker(ort_bridge.INVOKE_HOOK)
    op_id, feed, attributes = seen["call"]
    out = ort_bridge.INVOKE_HOOK(op_id, feed, attributes)[2]
    q, k, v, bias, mask = feed
    shape = (q.shape[0], q.shape[1], q.shape[2], v.shape[3])
    ready = np.zeros(shape, np.float32).reshape(-1)
    res: dict[str, Any] = {"node_shape": {"q": list(q.shape), "bias": list(bias.shape), "mask": list(mask.shape)}}

    def ready_output(op_id: int, feed: Any, attributes: Any) -> Any:
        return (op_id, shape, ready)

    n_nodes = sum(
        1
        for n in __import__("onnx").load(str(path), load_external_data=False).graph.node
        if n.op_type == "FlashAttention"
    )
    PyCustomOpDef.install_hooker(ready_output)
    split = profile_split("fused", path, feeds, set(), cfg["profile_runs"], workdir)
    PyCustomOpDef.install_hooker(ort_bridge.INVOKE_HOOK)
    res["bridge_us"] = round(split["attention_us"] / n_nodes, 1)
    res["copies_us"] = time_runs(
        lambda: ([np.array(x, copy=True) for x in feed], np.array(out, copy=True)), cfg["warmup"], cfg["repeats"], 0.3
    )["us"]
    res["invoke_us"] = time_runs(
        lambda: ort_bridge.INVOKE_HOOK(op_id, feed, attributes), cfg["warmup"], cfg["repeats"], 0.5
    )["us"]
    cast = ort_bridge._cast_attributes(op_id, tuple(attributes.items()))
    node = ort_bridge.node_call(cast)
    prepared = node.prepared
    bias_or_none, mask_or_none = __import__("ortflash").op.spec.absent_as_none(bias, mask)
    if prepared is not None:
        res["prepared_us"] = time_runs(
            lambda: prepared(q, k, v, bias_or_none, mask_or_none), cfg["warmup"], cfg["repeats"], 0.5
        )["us"]
        c = prepared.call
        result = np.empty(shape, np.float32)
        b4 = None if bias_or_none is None else cpu._as_4d(bias_or_none)
        m4 = None if mask_or_none is None else cpu._as_4d(mask_or_none)

        def kernel(threads: int) -> Any:
            tile = cpu.query_tile(q.shape[0] * q.shape[1], q.shape[2], threads)
            return lambda: prepared.module.flash_attention(
                q, k, v, result, b4, m4, c.scale, c.is_causal, c.mask_fill, c.zero_rows, c.softcap,
                c.policy.choose(k.shape[2]) == "online", c.block_size, tile, threads, c.bias_after_mask,
                c.window_left, c.window_right)  # fmt: skip

        res["threads"] = prepared.threads
        res["kernel_us"] = time_runs(kernel(prepared.threads), cfg["warmup"], cfg["repeats"], 0.5)["us"]
        res["kernel_1t_us"] = time_runs(kernel(1), cfg["warmup"], cfg["repeats"], 0.5)["us"]
    res["flash_nodes"] = n_nodes
    return res


def worker(variant: str, path: Path, original: Path, fused: Path, seqs: list[int], cfg: dict[str, Any]) -> Any:
    import onnx

    names_orig = {n.name for n in onnx.load(str(original), load_external_data=False).graph.node}
    names_fused = {n.name for n in onnx.load(str(fused), load_external_data=False).graph.node}
    attention = names_orig - names_fused
    sess = open_session(variant, path)
    workdir = Path(tempfile.mkdtemp(prefix="ssb_"))
    rows = {}
    for seq in seqs:
        feeds = model_feeds(sess, seq)
        row: dict[str, Any] = {
            "run": time_runs(lambda feeds=feeds: sess.run(None, feeds), cfg["warmup"], cfg["repeats"], cfg["budget_s"])
        }
        row.update(profile_split(variant, path, feeds, attention, cfg["profile_runs"], workdir))
        if variant == "fused":
            row["node"] = node_breakdown(path, feeds, cfg, workdir)
        rows[str(seq)] = row
    return rows


def machine() -> dict[str, Any]:
    cpu, flags = "unknown", set()
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name") and cpu == "unknown":
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    isa = [x for x in ("avx512f", "avx512bw", "avx512vl", "avx2", "fma") if x in flags]
    return {"cpu": cpu, "isa_flags": isa, "cores": len(os.sched_getaffinity(0))}


def markdown(res: dict[str, Any]) -> str:
    m = res["machine"]
    lines = [
        f"# Where a fused model's time goes at short lengths: {res['label']} (issue 30 item 1)",
        "",
        f"- date: {res['date']}; command: `{res['command']}`",
        f"- machine: {m['cpu']}, ISA flags {', '.join(m['isa_flags'])}, {m['cores']} cores; kernel build: "
        f"{res.get('isa', '?')}; ortflash tree: {res.get('tree') or 'this checkout'}",
        f"- load average at start / end: {res['load_start']} / {res['load_end']} (a shared 2-core machine)",
        "- B = 1; each variant in its own process; `run`: median wall µs per session.run (CPU µs in brackets);"
        " `att` / `rest`: ORT profiler node time per run of the attention nodes (the original's nodes that"
        " fusion replaces, or the FlashAttention nodes) and of every other node",
        "- per FlashAttention node (µs, one call): `bridge`: ORT's node time with the hook returning a ready"
        " output (extensions PyOp entry/exit + its input and output copies); `copies`: numpy copies of the"
        " same arrays; `py`: our hook minus the kernel (`_invoke` - kernel); `kern`: the compiled module at"
        " the call's thread count (threads in brackets) and `1t` at one thread; `node`: the profiler's"
        " FlashAttention node time",
        "",
    ]
    for model, per in res["models"].items():
        lines += [
            f"## {model}",
            "",
            "| S | original run | orig att | orig rest | orig-nospin run | rest | fused run | fused att | "
            "fused rest | fused-spin run | att | rest | node | bridge | copies | py | kern (t) | 1t |",
            "|---|" + "---:|" * 17,
        ]
        for seq in per.get("original", {}):

            def g(v: str, k: str, per: dict[str, Any] = per, seq: str = seq) -> Any:
                r = per.get(v, {}).get(seq, {})
                return r.get(k, "-") if k != "run" else (f"{r['run']['us']} ({r['run']['cpu_us']})" if r else "-")

            nd = per.get("fused", {}).get(seq, {}).get("node", {})
            flash_n = max(1, nd.get("flash_nodes", 1))
            node_us = round(per["fused"][seq]["attention_us"] / flash_n, 1) if "fused" in per else "-"
            py = round(nd["invoke_us"] - nd["kernel_us"], 1) if "kernel_us" in nd else "-"
            lines.append(
                f"| {seq} | {g('original', 'run')} | {g('original', 'attention_us')} | {g('original', 'rest_us')} | "
                f"{g('original-nospin', 'run')} | {g('original-nospin', 'rest_us')} | {g('fused', 'run')} | "
                f"{g('fused', 'attention_us')} | {g('fused', 'rest_us')} | {g('fused-spin', 'run')} | "
                f"{g('fused-spin', 'attention_us')} | {g('fused-spin', 'rest_us')} | {node_us} | "
                f"{nd.get('bridge_us', '-')} | {nd.get('copies_us', '-')} | {py} | "
                f"{nd.get('kernel_us', '-')} ({nd.get('threads', '-')}) | {nd.get('kernel_1t_us', '-')} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", type=Path)
    ap.add_argument("--seq-lens", default=",".join(map(str, SEQ_LENS)))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--budget-s", type=float, default=1.5, help="timed seconds per (variant, S)")
    ap.add_argument("--profile-runs", type=int, default=40)
    ap.add_argument("--label", default="before")
    ap.add_argument("--tree", help="run the workers with the ortflash package of this folder first on PYTHONPATH")
    ap.add_argument("--out", type=Path, help="write OUT.json and OUT.md")
    ap.add_argument("--worker", nargs=4, metavar=("VARIANT", "PATH", "ORIGINAL", "FUSED"), help=argparse.SUPPRESS)
    ap.add_argument("--cfg", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    seqs = [int(s) for s in args.seq_lens.split(",")]
    if args.worker:
        variant, path, original, fused = args.worker
        rows = worker(variant, Path(path), Path(original), Path(fused), seqs, json.loads(args.cfg))
        print("RESULT " + json.dumps(rows))
        return 0
    import ortflash

    cfg = {"warmup": args.warmup, "repeats": args.repeats, "budget_s": args.budget_s, "profile_runs": args.profile_runs}
    models = args.models or [EXPORTS / f"{m}.onnx" for m in DEFAULT_MODELS]
    tmp = Path(tempfile.mkdtemp(prefix="ssb_models_"))
    env = dict(os.environ)
    if args.tree:
        env["PYTHONPATH"] = args.tree + os.pathsep + env.get("PYTHONPATH", "")
    res: dict[str, Any] = {
        "label": args.label,
        "command": "python " + " ".join(sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "load_start": [round(x, 2) for x in os.getloadavg()],
        "tree": args.tree,
        "config": cfg,
        "models": {},
    }
    for path in models:
        import onnx

        fused_model, report = ortflash.optimize(str(path), softmax="online", target="ortflash", min_seq_len=0)
        fused_path = tmp / f"{path.stem}.fused.onnx"
        onnx.save(fused_model, str(fused_path))
        model_seqs = [fixed_seq(path)] if fixed_seq(path) else seqs
        per: dict[str, Any] = {"fused_blocks": f"{report.fused} of {len(report.blocks)}"}
        for variant in args.variants.split(","):
            target = path if variant.startswith("original") else fused_path
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                variant,
                str(target),
                str(path),
                str(fused_path),
                "--seq-lens",
                ",".join(map(str, model_seqs)),
                "--cfg",
                json.dumps(cfg),
            ]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200, check=False)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                per[variant] = {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][-300:]}
                print(path.stem, variant, per[variant])
                continue
            per[variant] = json.loads(line[len("RESULT ") :])
            print(path.stem, variant, json.dumps(per[variant])[:400], flush=True)
        res["models"][path.stem] = per
    proc = subprocess.run(
        [sys.executable, "-c", "from ortflash.kernels import cpu; print(cpu.isa())"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    res["isa"] = proc.stdout.strip()
    res["load_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
