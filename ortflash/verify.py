"""Run an original and an optimized model in ONNX Runtime on the same inputs and compare."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort


_BATCH_NAMES = ("batch", "batch_size", "b", "n", "s0")


def _gather_bound(model: onnx.ModelProto, name: str) -> int | None:
    """Rows of the embedding table an integer input indexes (token ids must stay below it)."""
    inits = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == name and node.input[0] in inits:
            return inits[node.input[0]].dims[0]
    return None


def _padding_mask(shape, rng, dtype):
    """1 for real tokens, 0 for padding: item 0 padded at the end, item 1 (if any) at the start."""
    m = np.ones(shape, dtype)
    if len(shape) >= 2 and shape[-1] > 2:
        cut = max(1, shape[-1] // 3)
        m[0, ..., -cut:] = 0
        if shape[0] > 1:
            m[1, ..., :cut] = 0
    return m


def make_feeds(model: onnx.ModelProto, *, seq_len: int = 16, batch: int = 2, seed: int = 0, dims: dict | None = None) -> dict:
    """Random inputs for every graph input, from its type and shape; attention masks pad."""
    rng = np.random.default_rng(seed)
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        t = vi.type.tensor_type
        shape = []
        for d in t.shape.dim:
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            elif dims and d.dim_param in dims:
                shape.append(dims[d.dim_param])
            elif d.dim_param.lower() in _BATCH_NAMES or "batch" in d.dim_param.lower():
                shape.append(batch)
            else:
                shape.append(seq_len)
        np_type = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
        lname = vi.name.lower()
        if np_type == np.bool_:
            feeds[vi.name] = _padding_mask(shape, rng, np.bool_)
        elif np.issubdtype(np_type, np.integer):
            if "mask" in lname:
                feeds[vi.name] = _padding_mask(shape, rng, np_type)
            elif "nonpad" in lname or "seqlen" in lname:
                # valid key counts, in [1, key length]; the key length is the sequence length here
                feeds[vi.name] = rng.integers(1, seq_len + 1, size=shape).astype(np_type)
            elif "position" in lname:
                feeds[vi.name] = np.broadcast_to(np.arange(shape[-1], dtype=np_type), shape).copy()
            elif "type" in lname:
                feeds[vi.name] = np.zeros(shape, np_type)
            else:
                high = _gather_bound(model, vi.name) or 100
                feeds[vi.name] = rng.integers(0, high, size=shape).astype(np_type)
        else:
            x = rng.standard_normal(shape).astype(np_type)
            if "mask" in lname:
                x = _padding_mask(shape, rng, np_type)
            feeds[vi.name] = x
    return feeds


@dataclass
class OutputDiff:
    name: str
    max_abs: float
    max_rel: float
    nan_mismatch: int
    ok: bool


def compare(expected: np.ndarray, actual: np.ndarray, name: str, rtol: float, atol: float) -> OutputDiff:
    if expected.shape != actual.shape:
        return OutputDiff(name, float("inf"), float("inf"), 0, False)
    if not np.issubdtype(expected.dtype, np.floating):
        bad = int(np.sum(expected != actual))
        return OutputDiff(name, float(bad), float(bad), 0, bad == 0)
    e, a = expected.astype(np.float64), actual.astype(np.float64)
    nan_mismatch = int(np.sum(np.isnan(e) != np.isnan(a)))
    # equal infinities agree (inf - inf would be NaN); an infinity against a number does not
    same_inf = np.isinf(e) & (e == a)
    both = ~(np.isnan(e) | np.isnan(a) | same_inf)
    with np.errstate(invalid="ignore"):
        diff = np.abs(e - a)[both]
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = float((diff / (np.abs(e[both]) + atol)).max()) if diff.size else 0.0
    ok = nan_mismatch == 0 and bool(np.all(diff <= atol + rtol * np.abs(e[both])))
    return OutputDiff(name, max_abs, max_rel, nan_mismatch, ok)


def default_tolerance(model: onnx.ModelProto) -> tuple[float, float]:
    """(rtol, atol): float32 rounding, looser where the model computes in float16."""
    f16 = any(o.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16 for o in model.graph.output)
    return (2e-2, 2e-3) if f16 else (1e-4, 1e-5)


def run_model(model, feeds: dict) -> dict:
    """Outputs by name; model is a ModelProto or a path (a path resolves external weights)."""
    from .kernels import ort_bridge as ort_op

    so = ort.SessionOptions()
    so.register_custom_ops_library(ort_op.library_path())
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    sess = ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def verify(original, optimized, feeds: dict, *, rtol=None, atol=None) -> list[OutputDiff]:
    """Worst error per output of optimized against original on the same feeds (protos or paths)."""
    d_rtol, d_atol = default_tolerance(original if isinstance(original, onnx.ModelProto)
                                       else onnx.load(str(original), load_external_data=False))
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    expected = run_model(original, feeds)
    actual = run_model(optimized, feeds)
    diffs = []
    for name, e in expected.items():
        if name not in actual:
            diffs.append(OutputDiff(name, float("inf"), float("inf"), 0, False))
            continue
        diffs.append(compare(e, actual[name], name, rtol, atol))
    return diffs
