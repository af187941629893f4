"""Copies between numpy arrays and mapped wgpu staging memory, on several threads.

One thread copies 6-7 GB/s on the H200's host (48 MiB of Q, K, V into the staging buffers took
7 ms at S=4096, two times the kernel); numpy releases the GIL while it copies contiguous
blocks, so a few threads each copying one slab of rows share the host's memory bandwidth.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise

import numpy as np

# Below this many bytes per thread, starting threads costs more than it saves.
MIN_SLAB_BYTES = 2 << 20
MAX_THREADS = 8


class HostCopier:
    """``copy(dst, src)`` = ``np.copyto(dst, src, casting="unsafe")``, split over threads by rows."""

    def __init__(self, threads: int | None = None) -> None:
        self.threads = max(1, min(MAX_THREADS, threads or os.cpu_count() or 1))
        self._pool = ThreadPoolExecutor(self.threads, "ortflash-copy") if self.threads > 1 else None

    def copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        """dst[...] = src (dtype converted), for arrays of one shape whose first axis may be split."""
        if dst.shape != src.shape:
            raise ValueError(f"copy between shapes {dst.shape} and {src.shape}")
        rows = dst.shape[0] if dst.ndim else 1
        nbytes = max(dst.nbytes, src.nbytes)
        slabs = min(self.threads, rows, max(1, nbytes // MIN_SLAB_BYTES))
        if self._pool is None or slabs <= 1:
            np.copyto(dst, src, casting="unsafe")
            return
        bounds = np.linspace(0, rows, slabs + 1).astype(int)
        futures = [
            self._pool.submit(np.copyto, dst[lo:hi], src[lo:hi], casting="unsafe")
            for lo, hi in pairwise(bounds)
            if hi > lo
        ]
        for future in futures:
            future.result()
