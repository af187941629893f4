"""The form the cuda target writes per (element type, mask kind, head dim, length, static or symbolic
sequence dim), held to the committed capability table (ortflash/lowering/cuda.py's CAPABILITIES,
benchmarks/results/cuda_capabilities.json), and the static-shape cliff of MultiHeadAttention
(benchmarks/results/cuda_forms.md). CI has no GPU: the written graphs run on the CPU EP."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import ortflash
from ortflash.lowering import cuda, lower

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import cuda_forms  # noqa: E402 - the benchmark's exported blocks (onnx only)

OWN_CAUSAL_OPS = {"gqa": "GroupQueryAttention", "mha_causal": "MultiHeadAttention", "attn23_causal_bsd": "Attention"}

# (block, dtype, head dim, static length or None) -> the form the committed table makes fastest of
# those cuda.own_causal_forms allows: in float16 not MultiHeadAttention unidirectional=1, whose cuDNN
# graph was rebuilt on every call (benchmarks/results/cuda_cudnn_causal.md), though its rows are faster;
# Attention-23 where it is fastest whatever the model's opset (the lowering raises it: cuda.opset_wanted)
EXPECTED = [
    ("causal", "float16", 64, 1024, "attn23_causal_bsd"),  # 0.047 ms against GQA 0.097
    ("causal", "float16", 64, 2048, "attn23_causal_bsd"),  # read at the 1024 row
    ("causal", "float16", 64, 4096, "attn23_causal_bsd"),  # 0.213 against GQA 0.274 (mha_causal 0.137)
    ("causal", "float16", 64, 16384, "gqa"),  # 1.739 against Attention-23 1.951 (mha_causal 1.145)
    ("causal", "float16", 64, None, "attn23_causal_bsd"),  # symbolic: the 4096 row
    ("causal", "float16", 128, 1024, "attn23_causal_bsd"),  # 0.058 against GQA 0.107
    ("causal", "float16", 128, 4096, "gqa"),  # 0.326 against Attention-23 0.342
    ("causal", "float16", 128, None, "gqa"),
    ("causal", "float32", 64, 1024, "attn23_causal_bsd"),  # TF32 on: 0.170 against 0.183
    ("causal", "float32", 64, None, "attn23_causal_bsd"),  # 1.353 against 1.464
    ("padding", "float16", 64, 4096, "mha_bias"),
    ("padding", "float16", 64, None, "mha_bias"),
    ("padding", "float32", 64, None, "mha_bias"),
    # an exported float16 [S, S] mask filled with float16's lowest: proved causal since e41f442, so the
    # block takes the own causal form the table makes fastest, as a proved causal block does
    ("causal_mask", "float16", 128, 4096, "gqa"),  # opset 18, not raised: GroupQueryAttention is faster here
    ("causal_mask", "float16", 64, None, "attn23_causal_bsd"),  # opset 18 raised to 23 for it
    ("nomask", "float16", 64, None, "mha_bias"),
]


def _lowered(stack: str, dtype: str, d: int, s: int | None) -> tuple[onnx.ModelProto, onnx.ModelProto, str]:
    model = cuda_forms.block(stack, d, dtype, s)
    fused, report = ortflash.optimize(model, target="ortflash")
    assert report.fused == 1
    low, notes = lower(fused, "cuda")
    assert notes[0].lowered
    return model, low, notes[0].reason


@pytest.mark.parametrize(("stack", "dtype", "d", "s", "form"), EXPECTED)
def test_the_form_written_is_the_tables_fastest_right_form(
    stack: str, dtype: str, d: int, s: int | None, form: str
) -> None:
    _, low, reason = _lowered(stack, dtype, d, s)
    ops = [n for n in low.graph.node if n.op_type in ("MultiHeadAttention", "GroupQueryAttention", "Attention")]
    assert len(ops) == 1
    node = ops[0]
    if form == "mha_bias":  # every mask in attention_bias (none without a mask), no unidirectional
        assert node.op_type == "MultiHeadAttention"
        assert not [a for a in node.attribute if a.name == "unidirectional"]
        assert (len(node.input) == 6 and bool(node.input[5])) == (stack != "nomask")
        return
    case = cuda.table_case("causal", dtype == "float16", d, s)
    opset = next(o.version for o in low.opset_import if o.domain in ("", "ai.onnx"))
    assert opset == (23 if form == "attn23_causal_bsd" else 23 if stack == "causal" else 18)  # raised only for it
    assert cuda.CAPABILITIES.fastest(cuda.own_causal_forms(dtype == "float16", 23), case) == form  # the table
    assert node.op_type == OWN_CAUSAL_OPS[form]
    if form == "gqa":  # q, k, v, seqlens_k, total_sequence_length: no attention_bias (input 10)
        assert len([i for i in node.input if i]) == 5 and (len(node.input) < 11 or not node.input[10])
    else:
        assert len([i for i in node.input if i]) == 3  # q, k, v: its own causal mask, no bias
    cap = cuda.CAPABILITIES[(form, case)]
    assert reason.startswith(f"{form}:") and f"ORT's {cap.kernel} kernel, {cap.ms:.3f} ms" in reason


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_each_own_causal_form_computes_the_original_on_the_cpu_ep(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = cuda_forms.block("causal", 32, dtype, None)
    fused, _ = ortflash.optimize(model, target="ortflash")
    feeds = cuda_forms.feeds("causal", 32, dtype, 37)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    tol = (2e-2, 2e-3) if dtype == "float16" else (1e-4, 1e-5)
    for form in cuda.OWN_CAUSAL_FORMS:
        monkeypatch.setattr(cuda, "choose_form", lambda call, dims, half, opset, f=form: (f, f))
        low, _ = lower(fused, "cuda")
        assert [n.op_type for n in low.graph.node if n.op_type == OWN_CAUSAL_OPS[form]]
        got = ort.InferenceSession(low.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=tol[0], atol=tol[1])


def _static_fed_bias_blocks() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    original = cuda_forms.cliff_models()["cliff_fedbias"]  # float16, [1, 1, 4096, 4096] bias fed whole
    fused, _ = ortflash.optimize(original, target="ortflash")
    low, notes = lower(fused, "cuda")
    assert notes[0].lowered
    return original, low


def _bias_chain(model: onnx.ModelProto) -> list[str]:
    """The ops from MultiHeadAttention's attention_bias back to a graph input, first input each."""
    producer = {o: n for n in model.graph.node for o in n.output}
    mha = next(n for n in model.graph.node if n.op_type == "MultiHeadAttention")
    chain, value = [], mha.input[5]
    while value in producer:
        chain.append(producer[value].op_type)
        value = producer[value].input[0]
    return chain + [value]


def test_static_shape_bias_keeps_an_op_ort_does_not_fold_between_the_graph_input_and_the_node() -> None:
    """The static-shape cliff: on a model whose sequence dim is a number, ORT's basic optimizations
    (CUDA EP) removed the Cast pair float16 -> float32 -> float16 and the no-op Expand, and
    MultiHeadAttention read the [1, 1, S, S] graph input itself: 41-64 ms instead of 1.3
    (benchmarks/results/cuda_forms.md). The held bias puts a Where in that chain (1.39 ms there)."""
    _, low = _static_fed_bias_blocks()
    assert _bias_chain(low) == ["Expand", "Cast", "Where", "Equal", "Cast", "bias"]  # Where(bias == lowest, ..)


def test_the_held_bias_gives_the_same_float16_values(tmp_path: Path) -> None:
    """Where(bias == lowest, next float up, bias) then Cast to float16: lowest and its neighbour
    both become -inf, so the lowered block computes what it computed before (on the CPU EP, S=64)."""
    original = cuda_forms.cliff_models()["cliff_fedbias"]
    small = onnx.ModelProto.FromString(original.SerializeToString())
    for value in list(small.graph.input) + list(small.graph.output):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_value == cuda_forms.CLIFF_SEQ:
                dim.dim_value = 64
    fused, _ = ortflash.optimize(small, target="ortflash")
    low, _ = lower(fused, "cuda")
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((1, 16, 64, 64)).astype(np.float16) for n in "qkv"}
    keep = np.ones((1, 1, 64, 64), bool)
    keep[..., 48:] = False
    feeds["bias"] = np.where(keep, 0.0, np.finfo(np.float16).min).astype(np.float16)
    want = ort.InferenceSession(small.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = ort.InferenceSession(low.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-2, atol=2e-3)


def test_cliff_feeds_give_a_symbolic_batch_the_static_cases_batch() -> None:
    """A symbolic batch dim was fed as 1 (`shape[0] or 1`): the symbolic batch-2 block ran at batch 1
    beside the static one at batch 2, a false "static batch-2 cliff" (1.65 vs 0.50 ms). Each symbolic
    cliff model is fed with the static twin's input shapes, its batch recorded at make time."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    batches = {}
    for name, static in cuda_forms.cliff_models().items():
        batches[name] = batch = cuda_forms.batch_of(static)
        want = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in static.graph.input}
        symbolic = cuda_forms._symbolic(onnx.ModelProto.FromString(static.SerializeToString()))
        assert symbolic.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
        for model in (static, symbolic):
            sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            fed = cuda_forms.cliff_feeds(sess, batch)
            assert {k: list(x.shape) for k, x in fed.items()} == want, name
    assert batches == {"cliff_fedbias": 1, "cliff_batch2": 2, "cliff_stack": 1}
    with pytest.raises(ValueError, match="batch 2 in the model, 1 asked for"):  # a static batch is not overridden
        two = cuda_forms.cliff_models()["cliff_batch2"]
        cuda_forms.cliff_feeds(ort.InferenceSession(two.SerializeToString(), so, providers=["CPUExecutionProvider"]), 1)


@pytest.mark.parametrize(("dtype", "s"), [("float16", None), ("float16", 1024), ("float32", None)])
def test_a_causal_block_with_a_padding_part_takes_the_own_causal_mask_and_its_padding_row(
    dtype: str, s: int | None
) -> None:
    """Hugging Face's decoder mask (causal And attention_mask[j], -inf): MultiHeadAttention's own causal
    mask with the [B, 1, 1, S] padding row expanded as attention_bias, the dead rows read by one CumSum
    over that row; no [S, S] causal bias built and no reduction over one (the form before it)."""
    _, low, reason = _lowered("causal_padding", dtype, 64, s)
    ops = [n for n in low.graph.node if n.op_type == "MultiHeadAttention"]
    assert len(ops) == 1 and reason.startswith("MultiHeadAttention unidirectional=1")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in ops[0].attribute}
    assert attrs["unidirectional"] == 1 and len(ops[0].input) == 6 and ops[0].input[5]
    kinds = [n.op_type for n in low.graph.node]
    assert kinds.count("CumSum") == 1
    assert not {"ReduceMax", "ReduceMin", "LessOrEqual", "Range", "And"} & set(kinds)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("padded", ["right", "left"])
def test_the_causal_padding_form_computes_the_original_on_the_cpu_ep(dtype: str, padded: str) -> None:
    """Right padding (every query sees key 0) and left padding (the first 9 queries see no key: NaN
    in the graph, NaN written by the guard), at a float16 and a float32 tolerance."""
    model, low, _ = _lowered("causal_padding", dtype, 32, None)
    feeds = cuda_forms.feeds("causal_padding", 32, dtype, 37)
    mask = np.ones((2, 37), np.int64)
    mask[0, 30:] = 0
    if padded == "left":
        mask[1, :9] = 0
    feeds = {n: np.concatenate([v, v[:, ::-1]]) if n != "attention_mask" else mask for n, v in feeds.items()}
    run = {
        name: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        for name, m in (("want", model), ("got", low))
    }
    want, got = (run[k].astype(np.float32) for k in ("want", "got"))
    assert int(np.isnan(want).sum()) == (9 * 16 * 32 if padded == "left" else 0)
    assert np.array_equal(np.isnan(want), np.isnan(got))
    tol = (2e-2, 2e-3) if dtype == "float16" else (1e-4, 1e-5)
    np.testing.assert_allclose(got, want, rtol=tol[0], atol=tol[1])


def test_a_bias_that_varies_over_the_queries_keeps_the_causal_bias_form() -> None:
    """causal_padding_fits reads the bias's query axis: a [B, 1, S, S] bias with causality proved
    apart is not one padding row, so the block takes mha_bias (the causal bias + guard)."""
    model = cuda_forms.block("causal_padding", 64, "float16", None)
    fused, _ = ortflash.optimize(model, target="ortflash")
    call_bias = [n for n in fused.graph.node if n.op_type == "FlashAttention"][0].input[3]
    # the padding row [B, 1, 1, S] expanded over the queries before the node: no longer one row
    graph = fused.graph
    graph.initializer.append(onnx.helper.make_tensor("full_rows", onnx.TensorProto.INT64, [4], [1, 1, 37, 37]))
    node = [n for n in graph.node if n.op_type == "FlashAttention"][0]
    expand = onnx.helper.make_node("Expand", [call_bias, "full_rows"], ["bias_full"])
    graph.node.insert(list(graph.node).index(node), expand)
    node.input[3] = "bias_full"
    low, notes = lower(fused, "cuda")
    assert notes[0].lowered
    assert notes[0].reason.startswith("MultiHeadAttention with attention_bias")


@pytest.mark.parametrize("symbolic", [False, True])
def test_float16_causal_block_never_takes_the_form_that_rebuilt_its_cudnn_graph_per_call(symbolic: bool) -> None:
    """The zoo's long causal block (q, k, v [1, H, S, D] float16, the causal mask built in the graph,
    opset 21) ran 35-54 ms a call as MultiHeadAttention unidirectional=1 on the CUDA EP, its cuDNN graph
    built anew each call (benchmarks/results/cuda_cudnn_causal.md), and 0.32-0.37 ms as
    GroupQueryAttention: --target cuda and --ep cuda write Attention-23 (the table's fastest at D64
    4096, the model raised to opset 23 for it), never MultiHeadAttention, and the reason says why;
    --ep cuda with the length a name too (the D64 causal row wins from one key: cuda_forms_short_causal.md)."""
    import cuda_capabilities as caps
    import webgpu_zoo as wz
    from onnxruntime.transformers import float16

    base = wz.causal_in_graph(caps.build("unfused", caps.Case("none", "float32", 64, 4096, 1, 16)))
    model = float16.convert_float_to_float16(base, keep_io_types=False)
    if symbolic:
        for value in list(model.graph.input) + list(model.graph.output):
            value.type.tensor_type.shape.dim[2].dim_param = "seq"
    fused, _ = ortflash.optimize(model, target="ortflash")
    lowered, notes = lower(fused, "cuda")
    assert "not mha_causal: its cuDNN graph was rebuilt on every call" in notes[0].reason
    ep_model, report = ortflash.optimize(model, ep="cuda")
    assert "the model's default opset raised from 21 to 23 for it" in notes[0].reason
    assert [b.lowered_to for b in report.blocks] == ["Attention"]
    for out in (lowered, ep_model):
        ops = [n.op_type for n in out.graph.node if n.op_type in OWN_CAUSAL_OPS.values()]
        assert ops == ["Attention"], ops
        assert [o.version for o in out.opset_import if o.domain == ""] == [23] and out.ir_version >= 10
