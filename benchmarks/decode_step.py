"""One decode step against a KV cache: the original graph against ortflash and its lowerings.

Project issue 12 item 1 ("benchmark a decode step at past = 2048 and 8192"). A Llama decoder with
a KV cache, the zoo's ``llama_cache`` configuration scaled up (hidden 512, 8 query heads / 2
key-value heads of 64, FFN 1024, 2 layers, vocab 100, random weights), is exported with the
TorchScript exporter by models/generate.py's CacheDecoderWrapper into ``--workdir`` (never
committed; the export needs torch and transformers: ``--torch-python`` names an interpreter that
has them, by default this one). Then, from it:

- ``original``: the export as it is (plain onnxruntime session);
- ``ortflash``: ``ortflash.optimize(softmax="auto")``, FlashAttention nodes through
  ``ortflash.session_options()`` (online softmax from 1024 keys), the cache append outside;
- ``contrib``: ``target="contrib"``: GroupQueryAttention with past_key/past_value;
- ``onnx``: ``target="onnx"``: Attention-23 with past_key/past_value.

Each variant and past length runs in its own process: batch 1, one new token, ``past`` cached
tokens, attention mask all ones, ``--warmup`` runs, then the median of ``--repeats`` timed
``session.run`` calls, ``--threads`` intra-op threads. ``--rounds`` repeats that, interleaved (each
round runs every variant once, in a rotated order), since one pass on a shared machine moves by
+-30%: a ratio is taken against ``original`` in the same round, and the median over rounds is
reported, with the load average before and after. ``--tree LABEL=DIR`` adds a variant that runs
the ``ortflash`` model with the ortflash package found in DIR (another checkout's tree, for a
before/after comparison of the bridge). Each variant's output is compared with the original's
(max abs difference). The dated section is appended to ``results/decode_step.md``.

    python benchmarks/decode_step.py --torch-python /work/zooenv/bin/python --rounds 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VARIANTS = ("original", "ortflash", "contrib", "onnx")
PASTS = (2048, 8192)
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, LAYERS, FFN = 512, 8, 2, 64, 2, 1024

EXPORT = f"""
import sys, torch
sys.path.insert(0, {str(ROOT / "models")!r})
import generate as G
from transformers import LlamaConfig, LlamaModel

def build(attn_impl):
    cfg = LlamaConfig(vocab_size=G.VOCAB, hidden_size={HIDDEN}, intermediate_size={FFN},
                      num_hidden_layers={LAYERS}, num_attention_heads={HEADS}, num_key_value_heads={KV_HEADS},
                      head_dim={HEAD_DIM}, max_position_embeddings=16384, use_cache=True, bos_token_id=0,
                      eos_token_id=0, pad_token_id=0, initializer_range=0.02)
    G._set_impl(cfg, attn_impl)
    return G.CacheDecoderWrapper(LlamaModel(cfg))

torch.manual_seed(0)
arch = G._cache_arch("llama_decode_bench", build, {HEADS}, {KV_HEADS}, {HEAD_DIM}, "benchmark decoder")
wrapper = arch.build("eager").eval()
with torch.no_grad():
    G.export_torchscript(wrapper, arch, G.export_example(arch), G.Path(sys.argv[1]))
G.postprocess(G.Path(sys.argv[1]))
"""


def build_models(workdir: Path, torch_python: str) -> tuple[dict[str, Path], dict[str, str]]:
    """The export and its three optimized forms, written into workdir, and each one's attention ops."""
    import onnx

    import ortflash

    paths = {v: workdir / f"llama_decode_{v}.onnx" for v in VARIANTS}
    if not paths["original"].exists():
        subprocess.run([torch_python, "-c", EXPORT, str(paths["original"])], check=True, capture_output=True)
    model = onnx.load(str(paths["original"]))
    ops = {"original": "MatMul/Softmax (as exported)"}
    for variant, options in (
        ("ortflash", {}),
        ("contrib", {"target": "contrib"}),
        ("onnx", {"target": "onnx"}),
    ):
        out, report = ortflash.optimize(model, softmax="auto", **{"target": "ortflash", **options})
        assert report.fused == LAYERS, [b.reason for b in report.blocks]
        ortflash.save(out, str(paths[variant]))
        ops[variant] = ", ".join(sorted({b.target for b in report.blocks}))
    return paths, ops


def decode_feeds(past: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {
        "input_ids": rng.integers(3, 100, size=(1, 1), dtype=np.int64),
        "attention_mask": np.ones((1, past + 1), np.int64),
    }
    for i in range(LAYERS):
        for kv in ("key", "value"):
            feeds[f"past_key_values.{i}.{kv}"] = rng.standard_normal((1, KV_HEADS, past, HEAD_DIM)).astype(np.float32)
    return feeds


def worker(variant: str, path: str, past: int, warmup: int, repeats: int, threads: int, out: str) -> None:
    import onnxruntime as ort

    import ortflash

    fused = variant not in ("original", "contrib", "onnx")  # ortflash, or a --tree variant
    options = ortflash.session_options() if fused else ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feeds = decode_feeds(past)
    for _ in range(warmup):
        result = session.run(None, feeds)
    times, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = session.run(None, feeds)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    np.save(out + ".npy", result[0])
    Path(out).write_text(
        json.dumps(
            {
                "median_ms": 1000 * statistics.median(times),
                "min_ms": 1000 * min(times),
                "cpu_ms": 1000 * statistics.median(cpu),
                "ortflash": ortflash.__file__,
            }
        )
    )


def machine() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} logical CPUs"
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_worker(
    variant: str, model: Path, past: int, args: argparse.Namespace, result: Path, tree: str | None
) -> dict[str, Any]:
    command = [sys.executable, __file__, "--worker", variant, str(model), str(past)]
    command += ["--warmup", str(args.warmup), "--repeats", str(args.repeats), "--threads", str(args.threads)]
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (tree, env.get("PYTHONPATH"))))
    subprocess.run(command + ["--result", str(result)], check=True, env=env)
    timing = json.loads(result.read_text())
    if tree and not timing["ortflash"].startswith(str(Path(tree).resolve())):
        raise SystemExit(f"--tree {tree}: the worker imported {timing['ortflash']}")
    return dict(timing)


def summarise(rounds: list[dict[tuple[int, str], dict[str, Any]]], past: int, variant: str) -> dict[str, Any]:
    """One variant at one past length over the rounds: medians, and the ratio to the same round's original."""
    runs = [r[(past, variant)] for r in rounds]
    ratios = [r[(past, "original")]["median_ms"] / r[(past, variant)]["median_ms"] for r in rounds]
    return {
        "past": past,
        "variant": variant,
        "round_ms": [t["median_ms"] for t in runs],
        "median_ms": statistics.median(t["median_ms"] for t in runs),
        "min_ms": min(t["min_ms"] for t in runs),
        "cpu_ms": statistics.median(t["cpu_ms"] for t in runs),
        "round_ratios": ratios,
        "vs_original": statistics.median(ratios),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="/tmp/ortflash-decode")
    ap.add_argument("--torch-python", default=sys.executable)
    ap.add_argument("--pasts", default=",".join(map(str, PASTS)))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--tree", action="append", default=[], metavar="LABEL=DIR")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--worker", nargs=3, metavar=("VARIANT", "MODEL", "PAST"), help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        variant, path, past = args.worker
        worker(variant, path, int(past), args.warmup, args.repeats, args.threads, args.result)
        return 0

    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    trees = dict(item.split("=", 1) for item in args.tree if "=" in item)
    bad_trees = [t for t in args.tree if "=" not in t] + [d for d in trees.values() if not Path(d).is_dir()]
    if unknown or "original" not in variants or bad_trees or set(trees) & set(VARIANTS) or args.rounds < 1:
        print(
            "error: --variants names original and some of " + ", ".join(VARIANTS) + "; --tree LABEL=DIR "
            "(a new label, an existing folder); --rounds >= 1",
            file=sys.stderr,
        )
        return 2
    labels = variants + [label for label in trees if label not in variants]
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    paths, ops = build_models(workdir, args.torch_python)
    for label in trees:
        paths[label], ops[label] = paths["ortflash"], f"ortflash, bridge of {trees[label]}"
    pasts = [int(p) for p in args.pasts.split(",")]
    load = [os.getloadavg()[0]]
    started = datetime.datetime.now(datetime.timezone.utc)
    rounds: list[dict[tuple[int, str], dict[str, Any]]] = []
    for n in range(args.rounds):
        timings: dict[tuple[int, str], dict[str, Any]] = {}
        order = labels[n % len(labels) :] + labels[: n % len(labels)]
        for past in pasts:
            for variant in order:
                result = workdir / f"{variant}_{past}.json"
                timings[(past, variant)] = run_worker(variant, paths[variant], past, args, result, trees.get(variant))
        rounds.append(timings)
        load.append(os.getloadavg()[0])
    rows = []
    for past in pasts:
        reference = np.load(workdir / f"original_{past}.json.npy")
        for variant in labels:
            row = summarise(rounds, past, variant)
            got = np.load(workdir / f"{variant}_{past}.json.npy")
            row["ops"] = ops[variant]
            row["max_abs_diff"] = float(np.abs(got - reference).max())
            rows.append(row)

    import onnxruntime

    finished = datetime.datetime.now(datetime.timezone.utc)
    meta = {
        "date": started.date().isoformat(),
        "time_utc": f"{started:%H:%M}-{finished:%H:%M}",
        "load_average_1min": load,
        "machine": machine(),
        "onnxruntime": onnxruntime.__version__,
        "threads": args.threads,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "rounds": args.rounds,
        "model": f"Llama decoder, hidden {HIDDEN}, {HEADS} query / {KV_HEADS} key-value heads of {HEAD_DIM}, "
        f"FFN {FFN}, {LAYERS} layers, TorchScript export (opset 17), batch 1, 1 new token",
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode_step.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    lines = [
        "",
        f"## {meta['date']} {meta['time_utc']} UTC: {args.rounds} interleaved rounds (`benchmarks/decode_step.py`)",
        "",
        f"{meta['machine']}, ONNX Runtime {meta['onnxruntime']}, {args.threads} intra-op thread(s); {meta['model']}; "
        f"per round and variant its own process, {args.warmup} warm-ups, median of {args.repeats} `session.run` "
        f"calls; rounds interleaved in rotated order. Load average (1 min) before and after each round: "
        + ", ".join(f"{x:.2f}" for x in load)
        + ". Speed-up: the same round's original time / the variant's; the median over rounds (> 1 is faster).",
        "",
        "| past | variant | attention ops | median ms | per round ms | CPU ms | min ms | speed-up per round | "
        "speed-up (median) | max abs diff |",
        "|---:|---|---|---:|---|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['past']} | {r['variant']} | {r['ops']} | {r['median_ms']:.3f} | "
            + " / ".join(f"{t:.2f}" for t in r["round_ms"])
            + f" | {r['cpu_ms']:.3f} | {r['min_ms']:.3f} | "
            + " / ".join(f"{x:.2f}x" for x in r["round_ratios"])
            + f" | {r['vs_original']:.2f}x | {r['max_abs_diff']:.2e} |"
        )
    with (out / "decode_step.md").open("a") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
