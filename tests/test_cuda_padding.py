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


def _batch2_padding_block() -> onnx.ModelProto:
    static = cuda_forms.block("padding", 64, "float16", 2048)
    for value in list(static.graph.input) + list(static.graph.output):
        value.type.tensor_type.shape.dim[0].dim_value = 2
    return static


def test_cuda_guard_counts_keys_by_matmul_with_no_reduction() -> None:
    """The float16 padding block at batch 2 (its bias a float16 tensor: no finite value absorbs a
    score, so no row is one such value): the dead rows are found by one MatMul counting the keys
    above -inf, and nothing is reduced (cuda._rows_by_counts; the guard's reductions took 440 of
    690 us there, benchmarks/results/cuda_padding_batch.md). Before: ReduceMax x2, ReduceMin,
    ReduceMean."""
    assert cuda.ROW_REDUCE == "counts"
    lowered, _ = ortflash.optimize(_batch2_padding_block(), ep="cuda")
    ops = [n.op_type for n in lowered.graph.node]
    assert [op for op in ops if op.startswith("Reduce")] == []
    assert ops.count("MatMul") == 1 and ops.count("MultiHeadAttention") == 1


def test_cuda_guard_reduces_with_the_keys_axis_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """ROW_REDUCE outer_first: the row statistics and V's mean reduce axis 0 after a Transpose;
    "direct" reduces in place (benchmarks/cuda_cudnn_cache.py compares them)."""
    monkeypatch.setattr(cuda, "ROW_REDUCE", "outer_first")
    lowered, _ = ortflash.optimize(_batch2_padding_block(), ep="cuda")
    reduces = [n for n in lowered.graph.node if n.op_type.startswith("Reduce")]
    assert sorted(n.op_type for n in reduces) == ["ReduceMax", "ReduceMax", "ReduceMean", "ReduceMin"]
    consts = {n.output[0]: n for n in lowered.graph.node if n.op_type == "Constant"}
    inits = {t.name: t for t in lowered.graph.initializer}
    for n in reduces:
        axes = n.input[1]
        t = inits[axes] if axes in inits else next(a.t for a in consts[axes].attribute if a.name == "value")
        assert onnx.numpy_helper.to_array(t).tolist() == [0], n.name
        assert any(m.op_type == "Transpose" and n.output[0] in m.input for m in lowered.graph.node), n.name


def _masked_block(kind: str, dtype: int) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """B2 H2 S8 D16 attention with batch item 1 padded everywhere and item 0 on its last 3 keys:
    "lowest" transformers' Where(mask, 0, float32-lowest) bias (rows of one absorbing value: the
    mean of V), "neginf" the same with -inf (rows of NaN), "both" a causal Where(j <= i, 0, lowest)
    plus an -inf padding row (rows of lowest and -inf: neither)."""
    np_dt = helper.tensor_dtype_to_np_dtype(dtype)
    b, h, s, d = 2, 2, 8, 16
    inits = [
        helper.make_tensor("scale", dtype, [], [0.25]),
        helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
        helper.make_tensor("lowest", TensorProto.FLOAT, [], [F32_LOWEST]),
        helper.make_tensor("neginf", TensorProto.FLOAT, [], [-np.inf]),
        helper.make_tensor("axes_12", TensorProto.INT64, [2], [1, 2]),
        helper.make_tensor("tril", TensorProto.BOOL, [s, s], np.tril(np.ones((s, s), bool)).reshape(-1).tolist()),
    ]
    fill = "neginf" if kind == "neginf" else "lowest"
    nodes = [
        helper.make_node("Cast", ["attention_mask"], ["keep"], to=TensorProto.BOOL),
        helper.make_node("Unsqueeze", ["keep", "axes_12"], ["keep4"]),
        helper.make_node("Where", ["keep4", "zero", fill if kind != "both" else "neginf"], ["pad_bias"]),
    ]
    if kind == "both":
        nodes += [
            helper.make_node("Where", ["tril", "zero", "lowest"], ["causal_bias"]),
            helper.make_node("Add", ["pad_bias", "causal_bias"], ["bias32"]),
        ]
    else:
        nodes.append(helper.make_node("Identity", ["pad_bias"], ["bias32"]))
    nodes += [
        helper.make_node("Cast", ["bias32"], ["bias"], to=dtype),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"]),
        helper.make_node("Mul", ["qk", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "bias"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["out"]),
    ]
    io = [helper.make_tensor_value_info(n, dtype, [b, h, s, d]) for n in ("q", "k", "v")]
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [b, s])
    graph = helper.make_graph(
        nodes, kind, io + [mask], [helper.make_tensor_value_info("out", dtype, [b, h, s, d])], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal((b, h, s, d)).astype(np_dt) for n in ("q", "k", "v")}
    attention_mask = np.ones((b, s), np.int64)
    attention_mask[0, -3:] = 0
    attention_mask[1] = 0
    feeds["attention_mask"] = attention_mask
    return model, feeds


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.FLOAT16])
@pytest.mark.parametrize("kind", ["lowest", "neginf", "both"])
def test_counted_rows_are_the_reduced_rows(kind: str, dtype: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard by counts and by reductions write the same output, NaN where the other has NaN,
    on padded rows of each kind (run on the CPU EP as the CUDA EP computes ReduceMax); and the
    counts take the block where its value set allows (no ReduceMax or ReduceMin written)."""
    model, feeds = _masked_block(kind, dtype)
    fused, report = ortflash.optimize(model, target="ortflash")
    assert report.fused == 1
    outs = {}
    for how in ("counts", "outer_first"):
        monkeypatch.setattr(cuda, "ROW_REDUCE", how)
        lowered, notes = lower(fused, "cuda")
        assert notes and all(n.lowered for n in notes), [n.reason for n in notes]
        ops = {n.op_type for n in lowered.graph.node}
        assert ("ReduceMax" in ops) == (how != "counts"), (how, sorted(ops))
        session = ort.InferenceSession(
            _like_the_cuda_ep(lowered).SerializeToString(), providers=["CPUExecutionProvider"]
        )
        outs[how] = session.run(None, feeds)[0].astype(np.float32)
    got, want = outs["counts"], outs["outer_first"]
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    assert float(np.abs(got[ok] - want[ok]).max()) <= (1e-6 if dtype == TensorProto.FLOAT else 1e-3)
    original = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    first = original.run(None, feeds)[0].astype(np.float32)
    # the rows that see a key (float16: ORT's CPU Softmax gives no NaN for a row of -inf, as
    # FlashAttention and both guards do)
    seen = ok if dtype == TensorProto.FLOAT else np.broadcast_to(~np.isnan(got).all(axis=-1, keepdims=True), got.shape)
    assert np.array_equal(np.isnan(got[seen]), np.isnan(first[seen]))
    assert float(np.abs(got[seen] - first[seen]).max()) <= (1e-5 if dtype == TensorProto.FLOAT else 2e-3)
    if kind == "lowest" and dtype == TensorProto.FLOAT:  # batch item 1: every row the mean of V
        mean_v = feeds["v"][1].mean(axis=1, keepdims=True)
        assert float(np.abs(got[1] - mean_v).max()) <= 1e-6
    if kind == "neginf" or dtype == TensorProto.FLOAT16:  # (float32-lowest is -inf in float16)
        assert bool(np.isnan(got[1]).all()) and not np.isnan(got[0]).any()


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
