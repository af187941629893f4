"""A plain session (``onnxruntime.InferenceSession(path, ortflash.session_options())``) before and after it ran
FlashAttention on the native op (issue 30 leftover; tests/test_plain_native.py holds the numbers equal).

Each model is fused once with forced fusion (``ortflash optimize M --target ortflash --online-softmax``) and saved;
the user's file is then opened as it is, in a process of its own per (model, variant, S), rounds alternated, at
one thread (``taskset`` to one core: ONNX Runtime's pool and the kernel's default thread count both read the
affinity, so the file needs no thread setting), CPU time per ``session.run`` (``time.process_time``):

``original``  the model before fusion, in a plain onnxruntime session.
``bridge``    the fused file in a plain session on onnxruntime-extensions' Python bridge: the path plain sessions
              took before (the nodes moved to the bridge's domain, ``configure_model(native=False)``; the
              per-call Python is the bridge's as it was).
``native``    the fused file, unchanged, in a plain session: the native op reads its nodes itself.

    python benchmarks/session_options_native.py --models minilm_l6_eager_torchscript,bert_h6d64_l4_eager_torchscript \\
        --fused /tmp/fused --seq-lens 16,64,256 --rounds 3 --out benchmarks/results/session_options_native.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXPORTS = Path("/work/exports")
VARIANTS = ("original", "bridge", "native")


def worker(path: str, variant: str, seq: int, runs: int) -> dict[str, Any]:
    import onnxruntime as ort

    import ortflash
    from ortflash.kernels import native_op
    from ortflash.kernels.config import KernelConfig
    from ortflash.session import configure_model

    so = ortflash.session_options() if variant != "original" else ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    if variant == "bridge":
        model = configure_model(ortflash.model_io.load(path), config=KernelConfig("cpu", native=False))
        session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    else:
        session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feeds = ortflash.make_feeds(path, seq_len=seq, batch=1)
    for _ in range(5):
        session.run(None, feeds)
    before = native_op.calls()
    times = []
    for _ in range(runs):
        t0 = time.process_time()
        session.run(None, feeds)
        times.append(time.process_time() - t0)
    return {
        "cpu_ms": round(statistics.median(times) * 1000, 3),
        "native_calls_per_run": (native_op.calls() - before) / runs,
        "threads": len(os.sched_getaffinity(0)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="minilm_l6_eager_torchscript,bert_h6d64_l4_eager_torchscript")
    parser.add_argument("--fused", required=True, help="folder of the fused files, one per model, same names")
    parser.add_argument("--seq-lens", default="16,64,256")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--core", default="1")
    parser.add_argument("--out")
    parser.add_argument("--worker", nargs=3, metavar=("PATH", "VARIANT", "SEQ"))
    args = parser.parse_args()
    if args.worker:
        path, variant, seq = args.worker
        print(json.dumps(worker(path, variant, int(seq), args.runs)))
        return
    cells: dict[str, dict[str, list[float]]] = {}
    calls: dict[str, float] = {}
    for r in range(args.rounds):
        for name in args.models.split(","):
            for seq in (int(s) for s in args.seq_lens.split(",")):
                order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
                for variant in order:
                    path = EXPORTS / f"{name}.onnx" if variant == "original" else Path(args.fused) / f"{name}.onnx"
                    cmd = ["taskset", "-c", args.core, sys.executable, __file__, "--runs", str(args.runs)]
                    cmd += ["--fused", args.fused, "--worker", str(path), variant, str(seq)]
                    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
                    got = json.loads(out.stdout.strip().splitlines()[-1])
                    key = f"{name} S={seq}"
                    cells.setdefault(key, {}).setdefault(variant, []).append(got["cpu_ms"])
                    calls[f"{key} {variant}"] = got["native_calls_per_run"]
                    print(key, variant, got, file=sys.stderr, flush=True)
    result = {
        "cells": cells,
        "native_calls_per_run": calls,
        "load_average": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(sys.argv),
    }
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
