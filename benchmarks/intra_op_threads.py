"""Does the FlashAttention node keep to the session's intra-op thread count? (a finding for issue 30 item 2)

Opens MODEL (the original, plain ``ort.SessionOptions``, or a fused file, ``ortflash.session_options()``)
with ``intra_op_num_threads = --intra`` and prints the median wall and CPU time of one run at
``--seq-len`` (batch 1, ``ortflash.make_feeds`` of the original ORIGINAL). Run it once as is and once
under ``taskset -c 0``: where the CPU time of a fused file exceeds its wall time at one intra-op
thread, its kernel ran more threads than the session was given.

    python benchmarks/intra_op_threads.py FUSED.onnx --original ORIGINAL.onnx --seq-len 512
    taskset -c 0 python benchmarks/intra_op_threads.py FUSED.onnx --original ORIGINAL.onnx --seq-len 512
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import onnxruntime as ort

import ortflash


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--original", required=True, help="the export whose inputs make_feeds reads")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--intra", type=int, default=1)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--fused", action="store_true", help="open with ortflash.session_options()")
    args = ap.parse_args()
    so = ortflash.session_options() if args.fused else ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = args.intra, 1
    session = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    feeds = {k: v for k, v in ortflash.make_feeds(args.original, seq_len=args.seq_len, batch=1).items() if k in names}
    for _ in range(3):
        session.run(None, feeds)
    wall, cpu = [], []
    for _ in range(args.runs):
        w0, c0 = time.perf_counter(), time.process_time()
        session.run(None, feeds)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    print(
        f"{os.path.basename(args.model)} S={args.seq_len} intra_op_num_threads={args.intra} "
        f"cores={len(os.sched_getaffinity(0))} wall {1e3 * np.median(wall):.1f} ms cpu {1e3 * np.median(cpu):.1f} ms"
    )


if __name__ == "__main__":
    main()
