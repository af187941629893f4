"""Shared by the reproductions beside it: run one model on ONNX Runtime's CPU EP and on its WebGPU
EP (the plugin: pip install onnxruntime onnxruntime-ep-webgpu) on the same inputs, print expected
against actual. Needs only numpy and onnxruntime (+ onnxruntime-ep-webgpu for the WebGPU side).

Exit status: 0 when the defect shows (or, with --expect-fixed, when it does not), 1 otherwise, and
0 with a line starting "SKIP:" where no WebGPU adapter exists."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def webgpu_session(path: str, profile: bool = False):  # type: ignore[no-untyped-def]
    """An InferenceSession on the WebGPU plugin EP, or None (with the reason printed) without one."""
    import onnxruntime as ort

    try:
        import onnxruntime_ep_webgpu as wep
    except ImportError:
        print("SKIP: onnxruntime-ep-webgpu is not installed")
        return None
    ort.register_execution_provider_library("webgpu", wep.get_library_path())
    devices = [d for d in ort.get_ep_devices() if d.ep_name == wep.get_ep_name()]
    if not devices:
        print("SKIP: no WebGPU adapter on this machine")
        return None
    so = ort.SessionOptions()
    so.add_provider_for_devices(devices[:1], {})
    so.log_severity_level = 4
    so.enable_profiling = profile
    return ort.InferenceSession(path, so)


def main(
    model: str, feeds: dict[str, np.ndarray], what: str, defect: Callable[[np.ndarray, np.ndarray | None, str], bool]
) -> int:
    """defect(expected, actual or None, error text) -> whether the defect showed."""
    import onnxruntime as ort

    path = os.path.join(HERE, model)
    print(f"{model}: {what}")
    print(f"onnxruntime {ort.__version__}")
    sess = webgpu_session(path)
    if sess is None:
        return 0
    expected = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    print(f"providers: {sess.get_providers()}")
    actual, error = None, ""
    try:
        actual = sess.run(None, feeds)[0]
    except Exception as exc:  # noqa: BLE001 - the error is the result
        error = str(exc).splitlines()[0]
    if actual is None:
        print(f"actual (WebGPU EP): error: {error}")
    else:
        e, a = expected.astype(np.float64), actual.astype(np.float64)
        nan_e, nan_a = np.isnan(e), np.isnan(a)
        both = ~(nan_e | nan_a)
        diff = np.where(both, np.abs(e - a), 0.0)
        worst = np.unravel_index(int(np.argmax(diff)), diff.shape)
        print(
            f"expected (CPU EP):   NaN count {int(nan_e.sum())}, value at {tuple(int(i) for i in worst)}: {e[worst]:.6g}"
        )
        print(
            f"actual (WebGPU EP):  NaN count {int(nan_a.sum())}, value at {tuple(int(i) for i in worst)}: {a[worst]:.6g}"
        )
        print(f"max abs error {float(diff.max()):.6g}; NaN mismatches {int((nan_e != nan_a).sum())}")
        if (nan_e != nan_a).any():
            first = np.unravel_index(int(np.argmax(nan_e != nan_a)), e.shape)
            print(
                f"first NaN mismatch at {tuple(int(i) for i in first)}: expected {e[first]:.6g}, actual {a[first]:.6g}"
            )
    shown = defect(expected, actual, error)
    print("REPRODUCED" if shown else "not reproduced (fixed in this version?)")
    return 0 if shown != ("--expect-fixed" in sys.argv) else 1


def differs(expected: np.ndarray, actual: np.ndarray | None, error: str, atol: float = 1e-4) -> bool:
    if actual is None:
        return True
    e, a = expected.astype(np.float64), actual.astype(np.float64)
    if (np.isnan(e) != np.isnan(a)).any():
        return True
    both = ~np.isnan(e)
    return bool(np.abs(e[both] - a[both]).max() > atol + 1e-3 * np.abs(e[both]).max())
