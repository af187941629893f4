"""ONNX Runtime's CUDA EP, the decomposed attention graph in float16 (MatMul -> Mul -> Add(mask) ->
Softmax -> MatMul, as exporters write it and as onnxruntime.transformers.float16 converts it): a
query row whose mask is float16-lowest (-65504) everywhere comes out about 1.0 away from the CPU
EP's (the mean of V there). This is the original graph, before ortflash: the float16 GPT-2, Llama,
GPT-J and Phi-3 zoo models are wrong by 1.7-3.2 on the CUDA EP against the same models on the CPU EP
(benchmarks/results/cuda_zoo.md, f16.original), and right after `--target cuda`, which writes such
rows out. Found by benchmarks/cuda_capabilities.py (unfused, causal_leftpad_f16_d64_s37);
onnxruntime-gpu 1.31.1, H200. The model is that probe's (python benchmarks/cuda_capabilities.py make).

    python tests/data/cuda_defects/unfused_f16_lowest_rows.py      # exit 0: the defect shows

Prints "SKIP: ..." and exits 0 where onnxruntime has no CUDA EP."""

from __future__ import annotations

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "unfused_f16_lowest_rows.onnx")
PAD = 12  # item 1 is left-padded over 12 keys: its query rows 0..11 see no key


def feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 4, 37, 64)).astype(np.float16) for _ in range(3))
    keep = np.tril(np.ones((37, 37), bool))[None].repeat(2, 0)
    keep[1, :, :PAD] = False
    bias = np.where(keep, 0.0, np.finfo(np.float16).min).astype(np.float16)[:, None]
    return {"q": q, "k": k, "v": v, "bias": bias}


def main() -> int:
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        print(f"SKIP: no CUDAExecutionProvider in {ort.get_available_providers()}")
        return 0
    print(f"onnxruntime {ort.__version__}")
    f = feeds()
    want = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"]).run(None, f)[0].astype(np.float32)
    cuda = ort.InferenceSession(MODEL, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    got = cuda.run(None, f)[0].astype(np.float32)
    err = np.abs(want - got)
    print(
        f"max abs difference {err.max():.3g}; rows of item 1 that differ by > 0.01: "
        f"{sorted({int(r) for r in np.argwhere(err[1] > 1e-2)[:, 1]})}"
    )
    print(
        f"item 1, head 0, query row 0: CPU EP {np.round(want[1, 0, 0, :4], 4)}, CUDA EP {np.round(got[1, 0, 0, :4], 4)}"
    )
    print(f"  mean of V: {np.round(f['v'][1, 0].astype(np.float32).mean(0)[:4], 4)}")
    shows = bool(err.max() > 0.1)
    print("defect shows" if shows else "defect does not show")
    return 0 if shows != ("--expect-fixed" in sys.argv) else 1


if __name__ == "__main__":
    sys.exit(main())
