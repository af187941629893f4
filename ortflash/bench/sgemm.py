"""The machine's float32 matrix-product rate, measured in the bench's own run, and the kernel's
attention rate as a fraction of it (issue 20, item 4).

The rate is numpy's ``matmul`` of two float32 N x N matrices (2 N^3 FLOPs; numpy's BLAS, OpenBLAS
in the wheels), in a process of its own with the worker's environment, so the BLAS threads are
the ones a worker gets (``--threads`` sets them). Attention's work is counted as its two products:
2 * Sq * Sk * (D + Dv) FLOPs per (batch, query head) over the key positions each query row sees
(all of them, or the causal ones: about half for is_causal with Sq = Sk). Softmax, masking and the
rest are not counted, so 100% means the kernel ran its products at the BLAS's rate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any

DEFAULT_SIZE = 2048
METHOD = "numpy.matmul float32 N x N x N"


def visible_pairs(sq: int, sk: int, is_causal: int) -> int:
    """(query, key) pairs a call scores: all, or those with key j <= i + offset (spec.causal_offset)."""
    if not is_causal:
        return sq * sk
    offset = sk - sq if is_causal == 2 else 0
    return sum(min(sk, max(0, i + offset + 1)) for i in range(sq))


def attention_flops(shape_q: Iterable[int], shape_k: Iterable[int], shape_v: Iterable[int], is_causal: int) -> int:
    """FLOPs of the two products of one FlashAttention call (q [B, Hq, Sq, D], k [B, Hkv, Sk, D], v [.., Dv])."""
    b, hq, sq, d = shape_q
    sk = tuple(shape_k)[2]
    dv = tuple(shape_v)[3]
    return 2 * b * hq * visible_pairs(sq, sk, is_causal) * (d + dv)


def measure(size: int = DEFAULT_SIZE, repeats: int = 5) -> dict[str, Any]:
    """Best GFLOP/s of ``repeats`` timed products (after one warm-up), in this process."""
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    out = np.empty((size, size), np.float32)
    np.matmul(a, b, out=out)
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        np.matmul(a, b, out=out)
        times.append(time.perf_counter() - t0)
    flops = 2.0 * size**3
    return {
        "method": METHOD.replace("N", str(size)),
        "size": size,
        "gflops": round(flops / min(times) / 1e9, 2),
        "median_gflops": round(flops / sorted(times)[len(times) // 2] / 1e9, 2),
        "runs_ms": [round(t * 1000, 3) for t in times],
        "blas": _blas_name(np),
        "blas_threads_env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS") if k in os.environ},
    }


def _blas_name(np: Any) -> str:
    try:
        info = np.show_config(mode="dicts")
        return str(info["Build Dependencies"]["blas"]["name"])
    except Exception:  # noqa: BLE001 (informative only; older numpy has no dict mode)
        return "unknown"


def measure_in_process(size: int, env: Mapping[str, str], timeout_s: float = 300.0) -> dict[str, Any]:
    """:func:`measure` in a fresh process with ``env`` (a worker's: its BLAS thread settings)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "ortflash.bench.sgemm", str(size)],
            capture_output=True,
            text=True,
            env=dict(env),
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "error": f"no result within {timeout_s:g} s"}
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [""])[-1]
        return {"status": "error", "error": f"exit code {proc.returncode}: {tail[-300:]}"}
    return {"status": "ok", **json.loads(proc.stdout)}


def summary(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The rate of the run: the better of the measurements at its start and end (load only lowers it)."""
    ok = [m for m in (before, after) if m.get("status") == "ok"]
    out: dict[str, Any] = {"start": dict(before), "end": dict(after)}
    if ok:
        out.update(method=ok[0]["method"], blas=ok[0]["blas"], gflops=max(m["gflops"] for m in ok))
    return out


def kernel_rates(runs: list[dict[str, Any]], sgemm_gflops: float | None) -> None:
    """Add kernel_gflops (attention FLOPs / the direct kernel's median) and kernel_vs_sgemm to each run."""
    for r in runs:
        flops, kernel = r.get("attention_flops"), r.get("kernel_ms", {}).get("median")
        if r.get("status") != "ok" or not flops or not kernel:
            continue
        r["kernel_gflops"] = float(f"{flops / (kernel / 1000) / 1e9:.4g}")
        if sgemm_gflops:
            r["kernel_vs_sgemm"] = float(f"{r['kernel_gflops'] / sgemm_gflops:.4g}")


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_SIZE)))
