"""The compiled kernel on one causal prefill call, two ways in one process, alternating:
is_causal=1 with a [B, 1, 1, S] padding bias (what the causal proof writes) against the same
numbers as a materialised [B, 1, S, S] causal + padding bias (what the block had before).

    python benchmarks/causal_proof_kernel.py [--seq 4096] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ortflash.kernels import cpu

LOWEST = float(np.finfo(np.float32).min)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--softmax", default="online")
    args = ap.parse_args()
    s, rng = args.seq, np.random.default_rng(0)
    q = rng.standard_normal((1, args.heads, s, args.head_dim)).astype(np.float32)
    k, v = (rng.standard_normal((1, args.kv_heads, s, args.head_dim)).astype(np.float32) for _ in range(2))
    padding = np.zeros((1, 1, 1, s), np.float32)
    padding[..., : s // 16] = LOWEST  # left padding
    full = np.where(np.tril(np.ones((s, s), bool)), padding, np.float32(LOWEST)).astype(np.float32)
    common = dict(scale=args.head_dim**-0.5, mask_fill=LOWEST, softmax=args.softmax)
    proved = dict(bias=padding, is_causal=1)
    materialised = dict(bias=full, is_causal=0)  # [1, 1, S, S]
    a = cpu.flash_attention(q, k, v, proved["bias"], is_causal=1, **common)
    b = cpu.flash_attention(q, k, v, materialised["bias"], is_causal=0, **common)
    assert np.allclose(a, b, rtol=1e-5, atol=1e-6), np.abs(a - b).max()
    times: dict[str, list[float]] = {"proved": [], "materialised": []}
    for _ in range(args.rounds):
        for name, form in (("proved", proved), ("materialised", materialised)):
            start = time.perf_counter()
            cpu.flash_attention(q, k, v, form["bias"], is_causal=form["is_causal"], **common)
            times[name].append(time.perf_counter() - start)
    p, m = statistics.median(times["proved"]), statistics.median(times["materialised"])
    print(f"isa {cpu.isa()}, S={s}, {args.heads} heads / {args.kv_heads} kv, D={args.head_dim}, {args.softmax}")
    print(f"proved (is_causal=1, [1,1,1,S] bias): {p * 1e3:.1f} ms median of {args.rounds}")
    print(f"materialised ([1,1,S,S] bias):        {m * 1e3:.1f} ms median of {args.rounds}")
    print(f"ratio: {m / p:.2f}x")


if __name__ == "__main__":
    main()
