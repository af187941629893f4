"""ONNX Runtime's CUDA EP, com.microsoft.MultiHeadAttention in float16 on cuDNN's flash attention:
the cuDNN graph can be built anew on every call, tens of ms each, and every one is kept (the process
grows about 2 MiB a call), while the same session with cuDNN's API log on (CUDNN_LOGLEVEL_DBG=3)
finalizes one graph and runs it in 0.5 ms. ORT keys its cache of cuDNN graphs
(contrib_ops/cuda/bert/cudnn_fmha/cudnn_flash_attention.cc, mha_graph_cache) by a byte-wise hash of
GraphParams, declared without an initializer: its padding bytes hold what the stack held, so two equal
keys can hash apart, and whether a node hits its own graph follows the call path, not its shapes.
Seen on the zoo's long causal block lowered to MultiHeadAttention unidirectional=1 (B1 H16 S4096 D64:
35-54 ms a call; benchmarks/results/cuda_cudnn_causal.md); onnxruntime-gpu 1.31.1, cuDNN 9.19, H200.

    python tests/data/cuda_defects/mha_causal_cudnn_rebuild.py      # exit 0: the defect shows
    python tests/data/cuda_defects/mha_causal_cudnn_rebuild.py --expect-fixed

Each model runs in a process of its own, once with cuDNN's log off and once with it on. Prints
"SKIP: ..." and exits 0 where onnxruntime has no CUDA EP."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ("mha_causal_cudnn_rebuild.onnx", "mha_causal_minimal.onnx")  # as ortflash writes it; its core alone
CALLS = 20


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def one_model(path: str) -> dict[str, float]:
    """In this process: a warm-up call, then CALLS calls with inputs and outputs bound on the GPU."""
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    sess = ort.InferenceSession(path, providers=["CUDAExecutionProvider"])
    rng = np.random.default_rng(0)
    binding = sess.io_binding()
    for i in sess.get_inputs():
        x = rng.standard_normal([int(d) for d in i.shape], dtype=np.float32).astype(np.float16)
        binding.bind_ortvalue_input(i.name, ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0))
    for o in sess.get_outputs():
        binding.bind_output(o.name, "cuda", 0)
    sess.run_with_iobinding(binding)
    rss0, times = rss_mib(), []
    for _ in range(CALLS):
        t0 = time.perf_counter()
        sess.run_with_iobinding(binding)
        binding.synchronize_outputs()
        times.append((time.perf_counter() - t0) * 1e3)
    return {"median_ms": round(statistics.median(times), 3), "rss_growth_mib": round(rss_mib() - rss0, 1)}


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        print(json.dumps(one_model(sys.argv[2])))
        return 0
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        print(f"SKIP: no CUDAExecutionProvider in {ort.get_available_providers()}")
        return 0
    print(f"onnxruntime {ort.__version__}; {CALLS} bound calls after one warm-up, a process per run")
    shows = False
    for name in MODELS:
        got = {}
        for log in (False, True):
            env = dict(os.environ)
            log_file = os.path.join(tempfile.gettempdir(), f"cudnn_api_{os.getpid()}.log")
            if log:  # to a file, as benchmarks/cuda_cudnn_cache.py logged it
                env.update(CUDNN_LOGLEVEL_DBG="3", CUDNN_LOGDEST_DBG=log_file)
            done = subprocess.run(
                [sys.executable, __file__, "--one", os.path.join(HERE, name)],
                capture_output=True,
                text=True,
                env=env,
                timeout=300,
            )
            if os.path.exists(log_file):
                os.remove(log_file)
            try:
                got[log] = json.loads(done.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                print(f"{name}: the run failed: {(done.stderr or done.stdout)[-300:]}")
                return 2
        off, on = got[False], got[True]
        rebuilt = off["median_ms"] > 10 * on["median_ms"] and off["rss_growth_mib"] > 10
        print(
            f"{name}: cuDNN log off {off['median_ms']} ms a call, the process +{off['rss_growth_mib']} MiB; "
            f"log on {on['median_ms']} ms, +{on['rss_growth_mib']} MiB"
            + (": a graph built on every call" if rebuilt else "")
        )
        shows = shows or rebuilt
    print("defect shows" if shows else "defect does not show")
    return 0 if shows != ("--expect-fixed" in sys.argv) else 1


if __name__ == "__main__":
    raise SystemExit(main())
