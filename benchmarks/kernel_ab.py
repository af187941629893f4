"""Two builds of the CPU kernel side by side in one process (issue 30 item 2).

The AVX-512 module of each tree (built in place) is called alternately on the same arrays, 7
alternated loops each, the minimum per call, one thread; naive and online, with a zero
[B, 1, 1, S] bias and with its last third padded (float32 lowest). Bit-identity of the two builds'
outputs is checked per cell.

    python benchmarks/kernel_ab.py OLD_TREE NEW_TREE 64,128,256,512 HEADS HEAD_DIM
"""

import glob
import importlib.machinery
import importlib.util
import sys
import time
from types import ModuleType

import numpy as np

LOOPS = 7


def load_kernel(tree: str) -> ModuleType:
    """The AVX-512 kernel module built in place in `tree`."""
    path = glob.glob(f"{tree}/ortflash/kernels/_flash_avx512*.so")[0]
    loader = importlib.machinery.ExtensionFileLoader("_flash_avx512", path)
    spec = importlib.util.spec_from_file_location("_flash_avx512", path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def cell(kernels: dict[str, ModuleType], q, k, v, bias, online: bool) -> str:
    """One (online, padded) cell: best time per call of each build, and whether outputs agree."""
    heads, seq, head_dim = q.shape[1], q.shape[2], q.shape[3]
    query_tile = 64 if heads * seq > 256 else 16
    outs = {tag: np.empty_like(q) for tag in kernels}

    def call(tag: str) -> None:
        kernels[tag].flash_attention(
            q, k, v, outs[tag], bias, None, head_dim**-0.5, 0, float("-inf"), False, 0.0,
            online, 128, query_tile, 1, False, -1, -1,
        )  # fmt: skip

    reps = max(3, int(1e7 / (seq * seq * heads * head_dim)))
    best = dict.fromkeys(kernels, 1e9)
    for _ in range(LOOPS):
        for tag in kernels:
            start = time.perf_counter()
            for _ in range(reps):
                call(tag)
            best[tag] = min(best[tag], (time.perf_counter() - start) / reps)
    same = np.array_equal(outs["old"], outs["new"])
    diff = "" if same else f" d={float(np.abs(outs['old'] - outs['new']).max()):.1e}"
    ratio = best["old"] / best["new"]
    return f"{best['old'] * 1e6:7.1f}->{best['new'] * 1e6:7.1f} ({ratio:.2f}x{diff})"


def main() -> None:
    kernels = {"old": load_kernel(sys.argv[1]), "new": load_kernel(sys.argv[2])}
    assert kernels["old"] is not kernels["new"]
    rng = np.random.default_rng(0)
    heads, head_dim = int(sys.argv[4]), int(sys.argv[5])
    for seq in [int(s) for s in sys.argv[3].split(",")]:
        q, k, v = (rng.standard_normal((1, heads, seq, head_dim), dtype=np.float32) for _ in range(3))
        row = []
        for online in (False, True):
            for padded in (False, True):
                bias = np.zeros((1, 1, 1, seq), np.float32)
                if padded:
                    bias[..., -(seq // 3) :] = np.finfo(np.float32).min
                tag = f"{'on' if online else 'nv'}{'P' if padded else '-'}"
                row.append(f"{tag} {cell(kernels, q, k, v, bias, online)}")
        print(seq, " | ".join(row), flush=True)


if __name__ == "__main__":
    main()
