"""The CUDA target against its measured capability table, and the Attention-23 rows the CUDA EP
gets wrong. CI has no GPU: these check the table's consistency and the written graphs on the CPU EP."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnxruntime.transformers import float16

import ortflash
from ortflash.checks.feeds import make_feeds
from ortflash.lowering import cuda, lower
from ortflash.lowering.cuda_measured import CAPABILITIES
from ortflash.lowering.measured import CapabilityTable
from ortflash.lowering.targets import PROVIDERS

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "cuda_capabilities.json"
MODELS = ROOT / "models"


def _measured() -> dict[tuple[str, str], dict]:
    data = json.loads(RESULTS.read_text())
    return {(r["form"], r["case"]): r for r in data["rows"] if "case" in r}


def test_every_table_row_is_the_committed_measurement() -> None:
    measured = _measured()
    for key, cap in CAPABILITIES.items():
        assert key in measured, f"{key} is not in {RESULTS.name}"
        row = measured[key]
        if "error" in row:  # refused at run time: neither on the GPU nor right
            assert (cap.on_gpu, cap.right) == (False, False), key
            continue
        assert cap.on_gpu == (row["nodes_on_cuda"] == row["nodes"]), key
        assert cap.right == row["ok"], key
        if cap.ms is not None:  # the default session's time: TF32 on in float32
            measured_ms = row["tf32_ms"] if row["dtype"] == "float32" else row["ms"]
            assert cap.ms == round(measured_ms, 3), key
            assert cap.kernel == (row["kernels"][0] if cap.on_gpu else ""), key


def test_the_measurement_says_what_the_choices_rest_on() -> None:
    measured = _measured()
    # float32 GroupQueryAttention runs on the CPU at every length measured; float16 on the GPU
    f32_gqa = [r for (f, c), r in measured.items() if f == "gqa" and "_f32_" in c]
    assert f32_gqa and all(r["nodes_on_cuda"] == 0 for r in f32_gqa)
    f16_gqa = [r for (f, c), r in measured.items() if f == "gqa" and "_f16_" in c and "error" not in r]
    assert f16_gqa and all(r["nodes_on_cuda"] == r["nodes"] for r in f16_gqa)
    # at S=4096 in float16, attention_bias takes a flash kernel and key_padding_mask the MATH one
    assert measured[("mha_bias", "padding_f16_d64_s4096")]["kernels"] == ["CUDNN_FLASH_ATTENTION"]
    assert measured[("mha_kpm", "padding_f16_d64_s4096")]["kernels"] == ["MATH"]


def test_cuda_is_first_for_the_cuda_ep_and_onnx_is_not_offered() -> None:
    assert PROVIDERS["cuda"].targets == ("cuda", "contrib")


def _lowered_ops(model: onnx.ModelProto) -> list[str]:
    return [
        n.op_type for n in model.graph.node if n.op_type in ("MultiHeadAttention", "GroupQueryAttention", "Attention")
    ]


def test_float32_grouped_causal_blocks_take_multi_head_attention_not_the_cpu_only_gqa() -> None:
    model = onnx.load(MODELS / "llama_sdpa_dynamo.onnx")
    fused, _ = ortflash.optimize(model, target="ortflash")
    cuda, notes = lower(fused, "cuda")
    assert _lowered_ops(cuda) == ["MultiHeadAttention"] * 2
    assert all("GroupQueryAttention runs on the CPU in float32" in n.reason for n in notes)
    feeds = make_feeds(model, seq_len=37, batch=2, seed=0)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(cuda.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def _causal_block(half: bool, s: int = 64, heads: int = 4, d: int = 32) -> onnx.ModelProto:
    """A float16 decomposed block with its causal mask built in the graph (ortflash proves it)."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import cuda_capabilities as caps
    import webgpu_zoo as wz

    block = wz.causal_in_graph(caps.build("unfused", caps.Case("none", "float32", d, s, 1, heads)))
    return float16.convert_float_to_float16(block, keep_io_types=False) if half else block


def test_float16_causal_block_takes_the_tables_fastest_form_and_computes_the_original() -> None:
    """S=64, D=32 at opset 21: the table's causal_f16_d64_s1024 row, where Attention-23 (0.047 ms) is
    fastest: the model is raised to opset 23 for it (cuda.opset_wanted); not MultiHeadAttention
    unidirectional=1 (0.064), whose cuDNN graph was rebuilt per call (cuda.REBUILT_PER_CALL_F16), nor
    GroupQueryAttention (0.097). In float16, and right on the CPU EP."""
    model = _causal_block(half=True)
    fused, report = ortflash.optimize(model, target="ortflash")
    assert report.fused == 1
    lowered, notes = lower(fused, "cuda")
    attention = [n for n in lowered.graph.node if n.op_type == "Attention"]
    assert len(attention) == 1 and notes[0].lowered
    assert not [n for n in lowered.graph.node if n.op_type in ("MultiHeadAttention", "GroupQueryAttention")]
    assert [o.version for o in lowered.opset_import if o.domain == ""] == [23] and lowered.ir_version >= 10
    assert "FLASH_ATTENTION kernel, 0.047 ms" in notes[0].reason
    assert "not mha_causal: its cuDNN graph was rebuilt on every call" in notes[0].reason
    assert "the model's default opset raised from 21 to 23 for it" in notes[0].reason
    types = {
        vi.name: vi.type.tensor_type.elem_type for vi in onnx.shape_inference.infer_shapes(lowered).graph.value_info
    }
    assert types[attention[0].input[0]] == TensorProto.FLOAT16  # no float32 casts around it
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((1, 4, 64, 32)).astype(np.float16) for n in "qkv"}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-2, atol=2e-3)


def test_a_model_whose_opset_cannot_be_raised_takes_the_fastest_form_at_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the default opset cannot be raised for Attention-23, the block is lowered at the model's
    own opset (GroupQueryAttention here) and the note says why; nothing is refused for it."""
    from ortflash import lowering
    from ortflash.pipeline.opset import OpsetNotRaised

    def refuse(model: onnx.ModelProto, version: int) -> onnx.ModelProto:
        raise OpsetNotRaised("no step for Foo-1 -> 23")

    monkeypatch.setattr(lowering, "raise_default_opset", refuse)
    fused, _ = ortflash.optimize(_causal_block(half=True), target="ortflash")
    lowered, notes = lower(fused, "cuda")
    assert _lowered_ops(lowered) == ["GroupQueryAttention"] and notes[0].lowered
    assert [o.version for o in lowered.opset_import if o.domain == ""] == [21]
    assert (
        "the model's opset not raised to 23 for Attention-23 (OpsetNotRaised: no step for Foo-1 -> 23)"
        in notes[0].reason
    )


def test_group_query_attention_where_the_table_has_it_fastest_keeps_its_present_outputs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A table whose fastest causal form is GroupQueryAttention: the node has present_key /
    present_value (the CUDA EP refuses it without them) and computes the original."""
    table = CapabilityTable({k: v for k, v in CAPABILITIES.items() if k[0] not in ("mha_causal", "attn23_causal_bsd")})
    monkeypatch.setattr(cuda, "CAPABILITIES", table)
    model = _causal_block(half=True)
    fused, _ = ortflash.optimize(model, target="ortflash")
    lowered, notes = lower(fused, "cuda")
    gqa = [n for n in lowered.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == 1 and notes[0].lowered
    assert len([o for o in gqa[0].output if o]) == 3
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((1, 4, 64, 32)).astype(np.float16) for n in "qkv"}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-2, atol=2e-3)


def test_float32_causal_block_is_the_tables_fastest_float32_form() -> None:
    """float32, S=64 at opset 21: causal_f32_d64_s1024, TF32 on (the EP's default): Attention-23 0.170
    needs opset 23; MultiHeadAttention unidirectional 0.183; GroupQueryAttention runs on the CPU."""
    fused, _ = ortflash.optimize(_causal_block(half=False), target="ortflash")
    lowered, notes = lower(fused, "cuda")
    assert _lowered_ops(lowered) == ["MultiHeadAttention"] and notes[0].lowered
    assert notes[0].reason.startswith("mha_causal:")


def _zero_rows_like_the_cuda_ep(model: onnx.ModelProto) -> onnx.ModelProto:
    """The CUDA EP's measured Attention-23 behaviour written into the graph: a query row whose
    attn_mask is <= -2**127 everywhere comes out as zeros (tests/data/cuda_defects)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    nodes = list(g.node)
    out_nodes = []
    for n in nodes:
        out_nodes.append(n)
        if n.op_type != "Attention" or len(n.input) < 4 or not n.input[3]:
            continue
        raw, mask = n.output[0], n.input[3]
        n.output[0] = f"{raw}__as_cpu"
        g.initializer.append(helper.make_tensor(f"{raw}__axes", TensorProto.INT64, [1], [-1]))
        g.initializer.append(helper.make_tensor(f"{raw}__limit", TensorProto.FLOAT, [], [-(2.0**127)]))
        g.initializer.append(helper.make_tensor(f"{raw}__zero", TensorProto.FLOAT, [], [0.0]))
        out_nodes += [
            helper.make_node("ReduceMax", [mask, f"{raw}__axes"], [f"{raw}__max"], keepdims=1),
            helper.make_node("LessOrEqual", [f"{raw}__max", f"{raw}__limit"], [f"{raw}__dead"]),
            helper.make_node("Where", [f"{raw}__dead", f"{raw}__zero", f"{raw}__as_cpu"], [raw]),
        ]
    g.ClearField("node")
    g.node.extend(out_nodes)
    return m


@pytest.mark.parametrize(
    "name", ["gpt2_eager_dynamo", "llama_sdpa_dynamo", "gpt_neo_eager_dynamo", "gpt_neo_eager_torchscript"]
)
def test_onnx_target_gives_the_mean_of_v_on_float32_lowest_rows_whatever_attention_gives(name: str) -> None:
    """The defect of issue 23: --target onnx was wrong on the CUDA EP for causal decoders with left
    padding (GPT-2 3.18, Llama 6.45). The written model now selects the mean of V itself. GPT-Neo
    (issue 31: 3.9 off on the H200): its left-padded rows mix the fill with -inf (causality and
    the window folded into the mask), so only a mean over the keys at the fill is right there."""
    model = onnx.load(MODELS / f"{name}.onnx")
    fused, _ = ortflash.optimize(model, target="ortflash")
    lowered, notes = lower(fused, "onnx")
    assert all(n.lowered for n in notes)
    like_cuda = _zero_rows_like_the_cuda_ep(lowered)
    feeds = make_feeds(model, seq_len=37, batch=2, seed=0)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(like_cuda.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    worst = max(float(np.max(np.abs(w - g))) for w, g in zip(want, got))
    assert worst <= 1e-4, worst
    assert not math.isnan(worst)


def _reduce_max_like_the_cuda_ep(model: onnx.ModelProto) -> onnx.ModelProto:
    """The CUDA EP's ReduceMax written into the graph: float32's lowest, not -inf, for a row of -inf
    (onnxruntime issue 32256; the CPU EP and the ONNX spec give -inf)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    g.initializer.append(helper.make_tensor("cuda_reduce_max__lowest", TensorProto.FLOAT, [], [-3.4028234663852886e38]))
    out_nodes = []
    for n in list(g.node):
        out_nodes.append(n)
        if n.op_type == "ReduceMax":
            raw = n.output[0]
            n.output[0] = f"{raw}__as_cpu"
            out_nodes.append(helper.make_node("Max", [f"{raw}__as_cpu", "cuda_reduce_max__lowest"], [raw]))
    g.ClearField("node")
    g.node.extend(out_nodes)
    return m


@pytest.mark.parametrize(
    "path",
    [
        ROOT / "tests" / "data" / "outside" / "clip_text_sdpa_torchscript.onnx",
        MODELS / "gpt_neo_eager_dynamo.onnx",
        MODELS / "gpt2_eager_dynamo.onnx",
    ],
)
def test_onnx_target_finds_rows_of_minus_inf_whatever_reduce_max_gives(path: Path) -> None:
    """Measured on the H200 (benchmarks/results/cuda_held_out.md): --target onnx gave NaN on 4
    held-out causal exports (CLIP's sdpa TorchScript export: every output of the left-padded item),
    because the guard found a row of -inf by its ReduceMax, which the CUDA EP makes float32's
    lowest, and so took the mean of V over no keys (0/0) there. The guard must not rest on it."""
    model = onnx.load(path)
    fused, _ = ortflash.optimize(model, target="ortflash")
    lowered, notes = lower(fused, "onnx")
    assert notes and all(n.lowered for n in notes)
    like_cuda = _zero_rows_like_the_cuda_ep(_reduce_max_like_the_cuda_ep(lowered))
    feeds = make_feeds(model, seq_len=37, batch=2, seed=0)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(like_cuda.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    nan_mismatch = sum(int(np.sum(np.isnan(w) != np.isnan(g))) for w, g in zip(want, got))
    worst = max(float(np.nanmax(np.abs(w - g))) for w, g in zip(want, got))
    assert nan_mismatch == 0, nan_mismatch
    assert worst <= 1e-4, worst


def test_float32_cached_step_with_one_kv_head_per_query_head_keeps_the_append_inside_the_op() -> None:
    """A decode step of GPT-2 with a cache: MultiHeadAttention with past_key/past_value (0.50 ms
    against the original's 0.53 at past 127; the append outside and the guards took 0.86)."""
    model = onnx.load(MODELS / "gpt2_cache_eager_torchscript.onnx")
    fused, _ = ortflash.optimize(model, target="ortflash")
    lowered, notes = lower(fused, "cuda")
    mha = [n for n in lowered.graph.node if n.op_type == "MultiHeadAttention"]
    assert len(mha) == 2 and all(len(n.input) >= 8 and n.input[6] and n.input[7] for n in mha)  # past_key, past_value
    assert all("cached float32 step" in n.reason for n in notes)
    feeds = make_feeds(model, seq_len=16, batch=2, seed=0)  # one decode step after 16 cached tokens
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_onnx_target_writes_the_mean_of_v_where_head_counts_are_not_static() -> None:
    """optimum's merged Whisper decoder: a block whose head counts are not proved still lowers
    (the mean of V taken by Attention itself with Q = 0) and computes the original's numbers."""
    path = ROOT / "tests" / "data" / "outside" / "optimum_whisper_decoder_model_merged.onnx"
    model = onnx.load(path)
    fused, _ = ortflash.optimize(model, target="ortflash")
    lowered, notes = lower(fused, "onnx")
    assert [n.lowered for n in notes] == [True] * 4
    feeds = make_feeds(model, seq_len=16, batch=2, seed=0)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for w, g in zip(want, got):
        if w.dtype.kind == "f" and w.size:
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
