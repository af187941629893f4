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
``session.run`` calls, ``--threads`` intra-op threads. Ratios are against ``original`` in the same
run. Each variant's output is compared with the original's (max abs difference).

    python benchmarks/decode_step.py --torch-python /work/zooenv/bin/python
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
        out, report = ortflash.optimize(model, softmax="auto", **options)
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

    options = ortflash.session_options() if variant == "ortflash" else ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feeds = decode_feeds(past)
    for _ in range(warmup):
        result = session.run(None, feeds)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = session.run(None, feeds)
        times.append(time.perf_counter() - start)
    np.save(out + ".npy", result[0])
    Path(out).write_text(json.dumps({"median_ms": 1000 * statistics.median(times), "min_ms": 1000 * min(times)}))


def machine() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} logical CPUs"
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="/tmp/ortflash-decode")
    ap.add_argument("--torch-python", default=sys.executable)
    ap.add_argument("--pasts", default=",".join(map(str, PASTS)))
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--worker", nargs=3, metavar=("VARIANT", "MODEL", "PAST"), help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        variant, path, past = args.worker
        worker(variant, path, int(past), args.warmup, args.repeats, args.threads, args.result)
        return 0

    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    paths, ops = build_models(workdir, args.torch_python)
    rows = []
    for past in (int(p) for p in args.pasts.split(",")):
        for variant in VARIANTS:
            result = workdir / f"{variant}_{past}.json"
            command = [sys.executable, __file__, "--worker", variant, str(paths[variant]), str(past)]
            command += ["--warmup", str(args.warmup), "--repeats", str(args.repeats), "--threads", str(args.threads)]
            subprocess.run(command + ["--result", str(result)], check=True)
            timing = json.loads(result.read_text())
            rows.append({"past": past, "variant": variant, "ops": ops[variant], **timing})
        reference = np.load(workdir / f"original_{past}.json.npy")
        base = next(r["median_ms"] for r in rows if r["past"] == past and r["variant"] == "original")
        for r in rows:
            if r["past"] == past:
                r["vs_original"] = base / r["median_ms"]
                got = np.load(workdir / f"{r['variant']}_{past}.json.npy")
                r["max_abs_diff"] = float(np.abs(got - reference).max())

    import onnxruntime

    meta = {
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "onnxruntime": onnxruntime.__version__,
        "threads": args.threads,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "model": f"Llama decoder, hidden {HIDDEN}, {HEADS} query / {KV_HEADS} key-value heads of {HEAD_DIM}, "
        f"FFN {FFN}, {LAYERS} layers, TorchScript export (opset 17), batch 1, 1 new token",
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode_step.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    lines = [
        "# Decode step against a KV cache (`benchmarks/decode_step.py`)",
        "",
        f"{meta['date']}, {meta['machine']}, ONNX Runtime {meta['onnxruntime']}, {args.threads} intra-op thread(s); "
        f"{meta['model']}; median of {args.repeats} `session.run` calls after {args.warmup} warm-ups, "
        "each variant in its own process. Speed-up: original's time / the variant's (> 1 is faster).",
        "",
        "| past | variant | attention ops | median ms | min ms | speed-up vs original | max abs diff vs original |",
        "|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['past']} | {r['variant']} | {r['ops']} | {r['median_ms']:.3f} | "
            f"{r['min_ms']:.3f} | {r['vs_original']:.2f}x | {r['max_abs_diff']:.2e} |"
        )
    (out / "decode_step.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
