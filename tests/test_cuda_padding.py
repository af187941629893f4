"""The cuda and webgpu targets' fully-masked-row guard where the EP's ReduceMax gives float32's lowest
for a row of -inf (the CUDA EP: onnxruntime issue 32256) and its attention kernel gives a finite row
there (cuDNN's, benchmarks/results/cuda_capabilities.md: dead_rows_neginf_f16), both written into
the graph and run on the CPU EP as tests/test_cuda_table.py does; and --ep cuda's form for a
float16 padding block (benchmarks/results/cuda_cudnn_cache.md). CI has no GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ortflash
from ortflash.lowering import cuda, lower

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import cuda_capabilities as caps  # noqa: E402 - the probe's exported blocks (onnx only)
import cuda_forms  # noqa: E402

F32_LOWEST = float(np.finfo(np.float32).min)


def _like_the_cuda_ep(model: onnx.ModelProto) -> onnx.ModelProto:
    """ReduceMax as the CUDA EP computes it (float32's lowest, not -inf, for a row of -inf) and
    MultiHeadAttention's rows of NaN as cuDNN's finite ones (here 0)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    g.initializer.append(helper.make_tensor("like_cuda__lowest", TensorProto.FLOAT, [], [F32_LOWEST]))
    nodes = []
    for n in list(g.node):
        nodes.append(n)
        raw = n.output[0]
        if n.op_type == "ReduceMax":
            n.output[0] = f"{raw}__on_cpu"
            nodes.append(helper.make_node("Max", [f"{raw}__on_cpu", "like_cuda__lowest"], [raw]))
        elif n.op_type == "MultiHeadAttention":
            n.output[0] = f"{raw}__on_cpu"
            zero = helper.make_node("CastLike", ["like_cuda__lowest", f"{raw}__on_cpu"], [f"{raw}__lowest"])
            nan = helper.make_node("IsNaN", [f"{raw}__on_cpu"], [f"{raw}__nan"])
            sub = helper.make_node("Sub", [f"{raw}__lowest", f"{raw}__lowest"], [f"{raw}__zero"])
            nodes += [
                zero,
                nan,
                sub,
                helper.make_node("Where", [f"{raw}__nan", f"{raw}__zero", f"{raw}__on_cpu"], [raw]),
            ]
    g.ClearField("node")
    g.node.extend(nodes)
    return m


def _dead_row_block() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The probe's float16 block with its bias fed ([1, 1, S, S]), a quarter of the keys masked by
    float16's lowest and query rows 3 and 5 masked by -inf on every key."""
    case = caps.Case("padding", "float16", 64, 16, 1, 2)
    model = caps.build("unfused", case)
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((1, 2, 16, 64)).astype(np.float16) for n in ("q", "k", "v")}
    bias = np.zeros((1, 1, 16, 16), np.float16)
    bias[..., 12:] = np.finfo(np.float16).min
    bias[..., [3, 5], :] = -np.inf
    feeds["bias"] = bias
    return model, feeds


@pytest.mark.parametrize("target", ["cuda", "webgpu"])
def test_rows_of_minus_inf_are_nan_whatever_reduce_max_and_the_kernel_give(target: str) -> None:
    """Before: the guard found a row of -inf by out + 0·ReduceMax(bias row), which stays finite where
    ReduceMax gives float32's lowest; with the kernel's finite row the output had no NaN there."""
    model, feeds = _dead_row_block()
    fused, report = ortflash.optimize(model, target="ortflash")
    assert report.fused == 1
    lowered, notes = lower(fused, target)
    assert notes and all(n.lowered for n in notes), [n.reason for n in notes]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    like_cuda = _like_the_cuda_ep(lowered)
    got = ort.InferenceSession(like_cuda.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert int(np.isnan(want).sum()) == 2 * 2 * 64  # rows 3 and 5 of both heads
    assert np.array_equal(np.isnan(want), np.isnan(got)), int((np.isnan(want) != np.isnan(got)).sum())
    ok = ~np.isnan(want)
    assert float(np.abs(want[ok].astype(np.float32) - got[ok].astype(np.float32)).max()) <= 2e-3


def test_cuda_guard_reduces_with_the_keys_axis_first() -> None:
    """The row statistics and V's mean reduce axis 0 after a Transpose (cuda.ROW_REDUCE), the form
    measured fast at batch 2 (benchmarks/results/cuda_cudnn_cache.md); "direct" reduces in place."""
    static = cuda_forms.block("padding", 64, "float16", 2048)
    for value in list(static.graph.input) + list(static.graph.output):
        value.type.tensor_type.shape.dim[0].dim_value = 2
    lowered, _ = ortflash.optimize(static, ep="cuda")
    reduces = [n for n in lowered.graph.node if n.op_type.startswith("Reduce")]
    assert sorted(n.op_type for n in reduces) == ["ReduceMax", "ReduceMax", "ReduceMean", "ReduceMin"]
    consts = {n.output[0]: n for n in lowered.graph.node if n.op_type == "Constant"}
    inits = {t.name: t for t in lowered.graph.initializer}
    assert cuda.ROW_REDUCE == "outer_first"
    for n in reduces:
        axes = n.input[1]
        t = inits[axes] if axes in inits else next(a.t for a in consts[axes].attribute if a.name == "value")
        assert onnx.numpy_helper.to_array(t).tolist() == [0], n.name
        assert any(m.op_type == "Transpose" and n.output[0] in m.input for m in lowered.graph.node), n.name


def test_ep_cuda_writes_a_float16_padding_block_in_float16() -> None:
    """--ep cuda on a float16 padding block (S static, past the table's 2048): MultiHeadAttention on
    float16 operands, as --target cuda writes it (1.66 ms at batch 2, S=4096 on the H200, where the
    block computed in float32 would run the EP's float32 kernels)."""
    static = cuda_forms.block("padding", 64, "float16", 4096)
    lowered, report = ortflash.optimize(static, ep="cuda")
    types = {i.name: i.type.tensor_type.elem_type for i in lowered.graph.input}
    inferred = onnx.shape_inference.infer_shapes(lowered)
    types.update({v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info})
    mha = [n for n in lowered.graph.node if n.op_type == "MultiHeadAttention"]
    assert len(mha) == 1 and report.blocks[0].fused
    assert [types.get(x) for x in mha[0].input[:3]] == [TensorProto.FLOAT16] * 3
    assert "CastLike" not in {n.op_type for n in lowered.graph.node}
