"""The compiled kernel's persistent worker pool: concurrent callers, a forked child and repeated
calls (reused scratch buffers) all give the one-thread result bit for bit."""

from __future__ import annotations

import multiprocessing
import threading

import numpy as np
import pytest

from ortflash.kernels import cpu

pytestmark = pytest.mark.skipif(not cpu.available(), reason="no compiled CPU kernel")

ATTRS = {"scale": 32**-0.5}


def _operands(seq: int, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((1, 12, seq, 32), dtype=np.float32) for _ in range(3))
    bias = np.zeros((1, 1, seq, seq), np.float32)
    bias[..., seq - seq // 4 :] = np.finfo(np.float32).min  # padded keys: the skip path too
    return q, k, v, bias


def _run(seq: int, seed: int, threads: int) -> np.ndarray:
    q, k, v, bias = _operands(seq, seed)
    return cpu.flash_attention(q, k, v, bias, None, threads=threads, softmax="online", **ATTRS)


def _child(conn: object) -> None:
    conn.send(_run(256, 3, 2))  # type: ignore[attr-defined]


def test_repeated_calls_reuse_buffers_and_match_one_thread() -> None:
    want = {seq: _run(seq, 1, 1) for seq in (16, 64, 256, 512)}
    for _ in range(3):
        for seq in (512, 16, 256, 64):  # sizes alternate: a reused buffer is larger than needed
            np.testing.assert_array_equal(_run(seq, 1, 2), want[seq])


def test_concurrent_callers_match_one_thread() -> None:
    want = [_run(256, seed, 1) for seed in range(4)]
    got: list[np.ndarray | None] = [None] * 4

    def call(i: int) -> None:
        for _ in range(5):
            got[i] = _run(256, i, 2)

    workers = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_forked_child_runs_the_kernel_with_threads() -> None:
    _run(256, 3, 2)  # the parent's pool exists before the fork
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child,))
    proc.start()
    assert parent.poll(60), "the forked child's kernel call did not return"
    got = parent.recv()
    proc.join(10)
    assert proc.exitcode == 0
    np.testing.assert_array_equal(got, _run(256, 3, 1))
