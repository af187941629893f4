"""ONNX Runtime's CUDA EP, ONNX Attention-23 in float32: a query row whose attn_mask is one finite
value at or below -2**127 everywhere (every key masked; here float32-lowest moved one float up,
as ortflash's onnx lowering writes a transformers mask so that the CPU EP does not take it for its
own sentinel) comes out as zeros on the CUDA EP, and as the mean of V (the softmax of equal
scores) on the CPU EP. With -inf or -1e4 as the fill, or exactly float32-lowest, both EPs agree.
Seen in causal decoders with left padding (GPT-2, Llama, GPT-J, Phi-3 exports; benchmarks/
results/cuda_zoo.md), found by benchmarks/cuda_zoo.py's bisection; onnxruntime-gpu 1.31.1, H200.

    python tests/data/cuda_defects/attention23_lowest_rows.py      # exit 0: the defect shows
    python tests/data/cuda_defects/attention23_lowest_rows.py --expect-fixed

Prints "SKIP: ..." and exits 0 where onnxruntime has no CUDA EP."""

from __future__ import annotations

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "attention23_lowest_rows.onnx")
PAD = 12  # item 1 is left-padded over 12 keys: its query rows 0..11 see no key


def feeds(fill: float) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 2, 37, 32)).astype(np.float32) for _ in range(3))
    keep = np.tril(np.ones((37, 37), bool))[None].repeat(2, 0)
    keep[1, :, :PAD] = False
    return {"q": q, "k": k, "v": v, "mask": np.where(keep, 0.0, fill).astype(np.float32)[:, None]}


def main() -> int:
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        print(f"SKIP: no CUDAExecutionProvider in {ort.get_available_providers()}")
        return 0
    print(f"onnxruntime {ort.__version__}")
    cpu = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
    cuda = ort.InferenceSession(MODEL, providers=[("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"])
    lowest = float(np.finfo(np.float32).min)
    above_lowest = float(np.nextafter(np.float32(lowest), np.float32(0)))
    shows = False
    for name, fill in (("lowest + 1 ulp", above_lowest), ("lowest", lowest), ("-inf", -np.inf), ("-1e4", -1e4)):
        f = feeds(fill)
        want, got = cpu.run(None, f)[0], cuda.run(None, f)[0]
        err = float(np.nanmax(np.abs(want - got)))
        row = f"item 1, head 0, query row 0: CPU EP {np.round(want[1, 0, 0, :4], 4)}, CUDA EP {np.round(got[1, 0, 0, :4], 4)}"
        print(f"fill {name}: max abs difference {err:.3g}; {row}")
        if name == "lowest + 1 ulp":
            mean_v = f["v"][1, 0].mean(0)[:4]
            print(f"  mean of V (what FlashAttention gives for such a row): {np.round(mean_v, 4)}")
            shows = err > 1e-3
    print("defect shows" if shows else "defect does not show")
    return 0 if shows != ("--expect-fixed" in sys.argv) else 1


if __name__ == "__main__":
    sys.exit(main())
