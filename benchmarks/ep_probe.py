"""What the scripts that probe an ONNX Runtime EP on the GPU machine share (cuda_capabilities.py,
webgpu_capabilities.py, cuda_zoo.py, webgpu_zoo.py, crossover_webgpu.py): their make / run / table
command line, the single-block graph pieces their make steps write, how a run is judged right
(``error``, ``compare``), which EP ran each node (``placements``), the GPU's name and the markdown's
writing.

Numpy and the standard library at import: the run step imports this on the GPU machine, which has
no onnx (the make step's pieces import it inside).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

TOLERANCE = {"float32": (1e-4, 1e-5), "float16": (2e-2, 2e-3)}  # (rtol, atol) per element
# the ops of an attention block, fused or decomposed: the probes report which of them ran on the CPU EP
ATTENTION_OPS = ("MultiHeadAttention", "GroupQueryAttention", "Attention", "MatMul", "FusedMatMul", "Softmax")


# ------------------------------------------------------------------------------------------------
# the command line


class StepCommandLine:
    """``make FOLDER``, ``run FOLDER --out OUT`` and ``table JSON [--md MD] [--device DEVICE]``.

    A script adds its own options to ``make``, ``run`` and ``table`` (argparse sub-parsers), then
    ``call`` parses and runs the step asked for."""

    def __init__(self, doc: str | None, md: str, device: str | None = "NVIDIA H200") -> None:
        self.parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
        steps = self.parser.add_subparsers(dest="cmd", required=True)
        self.make = steps.add_parser("make")
        self.make.add_argument("folder")
        self.run = steps.add_parser("run")
        self.run.add_argument("folder")
        self.run.add_argument("--out", required=True)
        self.table = steps.add_parser("table")
        self.table.add_argument("json")
        self._md, self._device = md, device

    def call(
        self,
        argv: list[str] | None,
        make: Callable[[argparse.Namespace], object],
        run: Callable[[argparse.Namespace], object],
        table: Callable[[argparse.Namespace], object],
    ) -> int:
        # --md and --device last, after the script's own table options: where the scripts list them
        self.table.add_argument("--md", default=self._md)
        if self._device is not None:
            self.table.add_argument("--device", default=self._device)
        args = self.parser.parse_args(argv)
        {"make": make, "run": run, "table": table}[args.cmd](args)
        return 0


def write_table(md_path: str, lines: list[str]) -> None:
    with open(md_path, "w") as f:
        f.write("\n".join(lines) + "\n")


# ------------------------------------------------------------------------------------------------
# make (needs onnx)


def unfused_nodes(has_bias: bool) -> list[Any]:
    """The decomposed block exporters write, ``Softmax(q·kᵀ·scale [+ bias])·v`` over inputs q, k, v
    (and bias), the initializer scale, to output o."""
    from onnx import helper

    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"]),
        helper.make_node("Mul", ["qk", "scale"], ["s0"]),
    ]
    last = "s0"
    if has_bias:
        nodes.append(helper.make_node("Add", ["s0", "bias"], ["s1"]))
        last = "s1"
    return nodes + [helper.make_node("Softmax", [last], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["o"])]


def group_query_attention(inputs: list[str], heads: int, kv_heads: int, scale: float) -> Any:
    """com.microsoft GroupQueryAttention writing o and its present key / value (pk, pv)."""
    from onnx import helper

    return helper.make_node(
        "GroupQueryAttention",
        inputs,
        ["o", "pk", "pv"],
        domain="com.microsoft",
        num_heads=heads,
        kv_num_heads=kv_heads,
        scale=scale,
    )


def checked_model(graph: Any, opset: int, contrib: bool) -> Any:
    """The graph as a checked IR 10 model of the ONNX opset (and com.microsoft 1)."""
    import onnx
    from onnx import helper

    opsets = [helper.make_opsetid("", opset)]
    if contrib:
        opsets.append(helper.make_opsetid("com.microsoft", 1))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def save_models(folder: str, models: Iterable[tuple[str, Any]]) -> None:
    """Each (stem, model) as FOLDER/stem.onnx, then how many."""
    import onnx

    os.makedirs(folder, exist_ok=True)
    count = 0
    for stem, model in models:
        onnx.save_model(model, os.path.join(folder, f"{stem}.onnx"))
        count += 1
    print(f"{count} models in {folder}")


# ------------------------------------------------------------------------------------------------
# run (numpy, onnxruntime)


def error(expected: np.ndarray, actual: np.ndarray, dtype: str) -> dict[str, Any]:
    """Right within TOLERANCE[dtype] (|a - e| <= atol + rtol |e|) with NaN in the same places; the
    largest difference, equal infinities counting as none."""
    e, a = expected.astype(np.float64), actual.astype(np.float64)
    nan_mismatch = int(np.sum(np.isnan(e) != np.isnan(a)))
    both = ~(np.isnan(e) | np.isnan(a))
    with np.errstate(invalid="ignore"):
        diff = np.where(e[both] == a[both], 0.0, np.abs(e[both] - a[both]))  # equal infinities: no error
    max_abs = float(diff.max()) if diff.size else 0.0
    rtol, atol = TOLERANCE[dtype]
    ok = nan_mismatch == 0 and bool(np.all(diff <= atol + rtol * np.abs(e[both])))
    return {"ok": ok, "max_abs": max_abs, "nan_mismatch": nan_mismatch, "nan_expected": int(np.isnan(e).sum())}


def compare(want: list[np.ndarray], got: list[np.ndarray], dtype: str = "float32") -> dict[str, Any]:
    """Every output of a model: floats by ``error`` (a float16 output at float16's tolerance, the
    others at dtype's), the rest equal; the worst difference and the NaN mismatches summed."""
    worst, nan_mismatch, ok = 0.0, 0, True
    for w, g in zip(want, got):
        if not np.issubdtype(w.dtype, np.floating):
            ok = ok and bool(np.array_equal(w, g))
            continue
        r = error(w, g, "float16" if w.dtype == np.float16 else dtype)
        worst, nan_mismatch, ok = max(worst, r["max_abs"]), nan_mismatch + r["nan_mismatch"], ok and r["ok"]
    return {"ok": ok, "max_abs": worst, "nan_mismatch": nan_mismatch}


def session_options(ort: Any, profile_prefix: str | None) -> Any:
    """ONNX Runtime session options, errors only in the log; profiled to profile_prefix if given."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return so


def placements(profile_path: str) -> dict[str, dict[str, str]]:
    """{node name: {"op": op type, "provider": EP}} from an ORT profile."""
    with open(profile_path) as f:
        events = json.load(f)
    out: dict[str, dict[str, str]] = {}
    for ev in events:
        args = ev.get("args", {})
        if ev.get("cat") != "Node" or "provider" not in args:
            continue
        name = ev["name"].removesuffix("_kernel_time").removesuffix("_fence_before").removesuffix("_fence_after")
        out[name] = {"op": args.get("op_name", "?"), "provider": args["provider"]}
    return out


def optimized_with_gpu_if(model: Any, ep: str) -> tuple[Any, Any]:
    """``ortflash.optimize(model, ep=ep)`` with the length If allowed on ``ep``
    (forms.LOWERED_DISPATCH_EPS forced, as a measurement of the If needs; not written by default)."""
    import ortflash
    from ortflash.pipeline import forms

    saved = forms.LOWERED_DISPATCH_EPS
    forms.LOWERED_DISPATCH_EPS = (ep,)
    try:
        return ortflash.optimize(model, ep=ep)
    finally:
        forms.LOWERED_DISPATCH_EPS = saved


def gpu() -> str:
    """The GPU and its driver, as nvidia-smi says."""
    import subprocess

    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi: {exc}"
