"""Whether a model optimize is about to write opens, and runs, in ONNX Runtime.

Every model is opened before it is written. A model with lowered nodes (MultiHeadAttention,
GroupQueryAttention, ONNX Attention) is also run once, because ONNX Runtime checks some of
those ops' input constraints only at run time: on the inputs given, when the original model
runs on them too (a model the original cannot run on proves nothing, and is noted instead).
Both open and run at ONNX Runtime's default optimization level, as the model will be deployed.

The run never takes the memory of a full-size run: where, at the inputs' shapes, the original
holds a tensor larger than ``RUN_BUDGET_BYTES`` (a static float16 block at 4096 keys: its
384 MiB score tensor, and a 1.8 GiB peak for both runs), the model is opened only and a note
says so (``--verify`` runs it, as asked). A model whose length is free runs at the inputs'
small length anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnx

from ..checks.sessions import ModelSource, open_session, run_model, run_session
from ..errors import OrtflashError

if TYPE_CHECKING:
    from ..report import Report

# Pre-packing copies every MatMul weight into a second, packed buffer when a session opens: on a
# 1.2 GiB model it made the open 3.6-5.0 s and 1.48 GiB, against 0.62 s and 310 MiB without it
# (bert24 of benchmarks/large_model.py, 2026-11-30). It changes how weights are laid out in
# memory, not what the session accepts or computes, so the check runs without it.
_CHECK_CONFIG = {"session.disable_prepacking": "1"}

# The largest tensor a load check's run may hold (the run itself holds a few of that size, the
# original's and the new model's runs one after the other).
RUN_BUDGET_BYTES = 128 * 2**20
# Initializers up to this many elements keep their values for shape inference (Reshape targets,
# axes, scales); larger ones (weights) become typed inputs, so no weight is copied or read.
_SMALL_CONSTANT = 64


@dataclass(frozen=True)
class FirstRun:
    """What opening (and running) the new model found."""

    problem: str | None = None  # why ONNX Runtime cannot load or run it; None when it can
    note: str | None = None  # why it was opened but not run, where a run was asked for


def first_run(
    model: onnx.ModelProto,
    *,
    weights_dir: str | None = None,
    original: ModelSource | None = None,
    feeds: Mapping[str, np.ndarray] | None = None,
) -> FirstRun:
    """Open ``model``; with ``original`` and ``feeds`` given, also run it once on ``feeds``.

    ``weights_dir``: where ``model``'s external weights are. The original is run first: where
    it fails on ``feeds`` too, ``model`` is not run and the note says why.
    """
    try:
        session = open_session(model, what="the optimized model", weights_dir=weights_dir, config=_CHECK_CONFIG)
    except OrtflashError as exc:
        return FirstRun(problem=f"{exc} (at its default optimization level)")
    if original is None or feeds is None:
        return FirstRun()
    try:
        run_model(original, dict(feeds), what="the original model")
    except OrtflashError as exc:
        return FirstRun(note=f"the lowered model was not run once: the original does not run on these inputs ({exc})")
    try:
        run_session(session, dict(feeds), what="the optimized model")
    except OrtflashError as exc:
        return FirstRun(problem=f"{exc} (on inputs the original model runs on)")
    return FirstRun()


def largest_tensor(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> tuple[int, str] | None:
    """(bytes, value name) of the largest value a run of ``model`` on inputs of ``feeds``' shapes
    holds, from ONNX shape inference (where it proves every dim); None where it proves none."""
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    graph = light.graph
    graph.node.extend(model.graph.node)
    graph.output.extend(model.graph.output)
    named = set()
    for vi in model.graph.input:
        typed = graph.input.add()
        typed.CopyFrom(vi)
        named.add(vi.name)
        if vi.name in feeds and typed.type.HasField("tensor_type"):
            shape = typed.type.tensor_type.shape
            shape.ClearField("dim")
            for n in feeds[vi.name].shape:
                shape.dim.add().dim_value = int(n)
    for init in model.graph.initializer:
        if init.name in named:
            continue
        elements = int(np.prod(init.dims)) if init.dims else 1
        if elements <= _SMALL_CONSTANT and init.data_location != onnx.TensorProto.EXTERNAL:
            graph.initializer.append(init)
        else:
            graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    try:
        inferred = onnx.shape_inference.infer_shapes(light, data_prop=True)
    except Exception:  # noqa: BLE001 - inference failing is only an unknown size
        return None
    best: tuple[int, str] | None = None
    for vi in (*inferred.graph.value_info, *inferred.graph.output):
        tensor = vi.type.tensor_type
        if not tensor.elem_type or not tensor.HasField("shape"):
            continue
        dims = [int(d.dim_value) for d in tensor.shape.dim if d.HasField("dim_value")]
        if len(dims) != len(tensor.shape.dim):
            continue
        try:
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).itemsize
        except (KeyError, TypeError, ValueError):
            continue
        size = int(np.prod(dims, dtype=np.int64)) * itemsize
        if best is None or size > best[0]:
            best = (size, vi.name)
    return best


def _too_large_to_run(original: ModelSource, feeds: Mapping[str, np.ndarray]) -> str | None:
    """Why the load check does not run the models on ``feeds`` (a tensor over the budget), or None."""
    from ..model_io import load

    largest = largest_tensor(load(original), feeds)
    if largest is None or largest[0] <= RUN_BUDGET_BYTES:
        return None
    mib = 2**20
    return (
        f"the lowered model was opened, not run once: at these input shapes the original holds a "
        f"{largest[0] / mib:,.0f} MiB tensor ({largest[1]}), more than the load check spends "
        f"({RUN_BUDGET_BYTES // mib} MiB); --verify runs it"
    )


def load_check(
    original: ModelSource,
    make_inputs: Callable[[], Mapping[str, np.ndarray]],
    *,
    weights_dir: str | None = None,
    note: Callable[[str], None] | None = None,
) -> Callable[[onnx.ModelProto, Report], str | None]:
    """optimize's check of a candidate model: why ONNX Runtime cannot open it, or, where its report
    has lowered blocks, run it once on ``make_inputs()`` (where the original runs on them); None
    when it can. ``note`` is told why a lowered model was opened but not run."""

    def check(model: onnx.ModelProto, report: Report) -> str | None:
        if not any(b.lowered_to for b in report.blocks):
            return first_run(model, weights_dir=weights_dir).problem
        try:
            feeds = make_inputs()
        except OrtflashError as exc:
            if note is not None:
                note(f"the lowered model was not run once: no random inputs for it ({exc})")
            return first_run(model, weights_dir=weights_dir).problem
        too_large = _too_large_to_run(original, feeds)
        if too_large is not None:
            if note is not None:
                note(too_large)
            return first_run(model, weights_dir=weights_dir).problem
        checked = first_run(model, weights_dir=weights_dir, original=original, feeds=feeds)
        if checked.note and note is not None:
            note(checked.note)
        return checked.problem

    return check


def input_problem(path: str) -> str | None:
    """Why ONNX Runtime cannot open the user's model itself (None when it can), in the words a
    new model's load check uses: a model made from an input ONNX Runtime cannot load is not the
    fault of the rewrite, and the input is what to fix (an IR version newer than ONNX Runtime
    reads: onnx 1.23's make_model writes IR 14, ONNX Runtime 1.31 reads up to 13)."""
    import onnxruntime as ort

    try:
        open_session(path, what=f"the input model {path} (ONNX Runtime {ort.__version__})", config=_CHECK_CONFIG)
    except OrtflashError as exc:
        return str(exc)
    return None
