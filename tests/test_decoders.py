"""Decoders as people export them (issue 12): a KV cache, the merged form (an If choosing the
with-cache or without-cache branch), models without shapes, old opsets, and inputs that fit."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ortflash
from ortflash.checks.feeds import decoder_cases, make_feeds
from ortflash.cli import main

HEADS, HEAD_DIM = 2, 8
HIDDEN = HEADS * HEAD_DIM
OPSET = 17
IR_VERSION = 8  # what opset 17 came with; ONNX Runtime 1.31 loads up to 13
F32 = TensorProto.FLOAT


def _weights(rng: np.random.Generator) -> list[onnx.TensorProto]:
    arrays = {f"W{x}": rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32) * 0.3 for x in "qkvo"}
    arrays["heads_shape"] = np.array([0, 0, HEADS, HEAD_DIM], np.int64)
    arrays["hidden_shape"] = np.array([0, 0, HIDDEN], np.int64)
    arrays["root_d"] = np.array(np.sqrt(HEAD_DIM), np.float32)
    arrays["one"] = np.array(1.0, np.float32)
    arrays["neg"] = np.array(-10000.0, np.float32)
    arrays["axes_12"] = np.array([1, 2], np.int64)
    arrays["zero"], arrays["two"] = np.array([0], np.int64), np.array([2], np.int64)
    arrays["heads_tail"], arrays["hidden_tail"] = np.array([HEADS, HEAD_DIM], np.int64), np.array([HIDDEN], np.int64)
    return [onnx.numpy_helper.from_array(a, name) for name, a in arrays.items()]


def _shape_from_x(p: str, tail: str) -> tuple[list[onnx.NodeProto], str]:
    """Concat(Slice(Shape(x), 0, 2), tail): the reshape target as Paddle2ONNX writes it, which ONNX's
    shape inference (opset 12) does not follow, so every rank after it is unknown."""
    n = helper.make_node
    nodes = [
        n("Shape", ["x"], [f"{p}{tail}_x_shape"]),
        n("Slice", [f"{p}{tail}_x_shape", "zero", "two"], [f"{p}{tail}_lead"]),
        n("Concat", [f"{p}{tail}_lead", tail], [f"{p}{tail}_target"], axis=0),
    ]
    return nodes, f"{p}{tail}_target"


def _layer(
    p: str, cached: bool, opset: int = OPSET, shapes_from_x: bool = False
) -> tuple[list[onnx.NodeProto], str, str, str]:
    """One attention layer reading x, attention_mask (and past_key/past_value when cached); its nodes,
    the output and the present key and value (Concat(past, new) on the sequence axis)."""
    n = helper.make_node
    nodes = []
    heads = {}
    heads_shape, hidden_shape = "heads_shape", "hidden_shape"
    if shapes_from_x:
        split, heads_shape = _shape_from_x(p, "heads_tail")
        merge, hidden_shape = _shape_from_x(p, "hidden_tail")
        nodes += split + merge
    for x in "qkv":
        nodes += [
            n("MatMul", ["x", f"W{x}"], [f"{p}{x}_proj"]),
            n("Reshape", [f"{p}{x}_proj", heads_shape], [f"{p}{x}_split"]),
            n("Transpose", [f"{p}{x}_split"], [f"{p}{x}_bhsd"], perm=[0, 2, 1, 3]),
        ]
        heads[x] = f"{p}{x}_bhsd"
    k, v = heads["k"], heads["v"]
    if cached:
        nodes += [
            n("Concat", ["past_key", k], [f"{p}present_key"], axis=2),
            n("Concat", ["past_value", v], [f"{p}present_value"], axis=2),
        ]
    else:
        nodes += [n("Identity", [k], [f"{p}present_key"]), n("Identity", [v], [f"{p}present_value"])]
    k, v = f"{p}present_key", f"{p}present_value"
    nodes += [
        n("Cast", ["attention_mask"], [f"{p}mask_f"], to=F32),
        n("Sub", ["one", f"{p}mask_f"], [f"{p}masked"]),
        n("Mul", [f"{p}masked", "neg"], [f"{p}bias_2d"]),
        n("Unsqueeze", [f"{p}bias_2d", "axes_12"], [f"{p}bias"])
        if opset >= 13
        else n("Unsqueeze", [f"{p}bias_2d"], [f"{p}bias"], axes=[1, 2]),
        n("Transpose", [k], [f"{p}kt"], perm=[0, 1, 3, 2]),
        n("MatMul", [heads["q"], f"{p}kt"], [f"{p}scores"]),
        n("Div", [f"{p}scores", "root_d"], [f"{p}scaled"]),
        n("Add", [f"{p}scaled", f"{p}bias"], [f"{p}biased"]),
        n("Softmax", [f"{p}biased"], [f"{p}probs"], axis=-1, name=f"{p}softmax"),
        n("MatMul", [f"{p}probs", v], [f"{p}context"]),
        n("Transpose", [f"{p}context"], [f"{p}context_bshd"], perm=[0, 2, 1, 3]),
        n("Reshape", [f"{p}context_bshd", hidden_shape], [f"{p}merged"]),
        n("MatMul", [f"{p}merged", "Wo"], [f"{p}out"]),
    ]
    return nodes, f"{p}out", k, v


def _io(cached: bool) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    total = "total_sequence_length" if cached else "sequence_length"
    inputs = [
        helper.make_tensor_value_info("x", F32, ["batch_size", "sequence_length", HIDDEN]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", total]),
    ]
    if cached:
        inputs += [
            helper.make_tensor_value_info(f"past_{kv}", F32, ["batch_size", HEADS, "past_sequence_length", HEAD_DIM])
            for kv in ("key", "value")
        ]
    outputs = [
        helper.make_tensor_value_info("logits", F32, ["batch_size", "sequence_length", HIDDEN]),
        helper.make_tensor_value_info("present_key", F32, ["batch_size", HEADS, total, HEAD_DIM]),
        helper.make_tensor_value_info("present_value", F32, ["batch_size", HEADS, total, HEAD_DIM]),
    ]
    return inputs, outputs


def cached_decoder(seed: int = 0) -> onnx.ModelProto:
    """One layer with past_key/past_value inputs and present outputs, as exporters write a decoder."""
    nodes, out, k, v = _layer("l0/", cached=True)
    nodes += [
        helper.make_node("Identity", [x], [y]) for x, y in ((out, "logits"), (k, "present_key"), (v, "present_value"))
    ]
    inputs, outputs = _io(cached=True)
    graph = helper.make_graph(nodes, "cached_decoder", inputs, outputs, _weights(np.random.default_rng(seed)))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def merged_decoder(seed: int = 0) -> onnx.ModelProto:
    """The merged form: If(use_cache_branch) runs the cached layer or the one without a cache, each
    reading the weights and inputs of the main graph (outer-scope references)."""
    branches = {}
    for cached, label in ((True, "with_past"), (False, "no_past")):
        nodes, out, k, v = _layer(f"{label}/", cached=cached)
        outs = [f"{label}/logits", f"{label}/present_key_out", f"{label}/present_value_out"]
        nodes += [helper.make_node("Identity", [x], [y]) for x, y in zip((out, k, v), outs)]
        branches[label] = helper.make_graph(
            nodes, label, [], [helper.make_tensor_value_info(o, F32, None) for o in outs]
        )
    inputs, outputs = _io(cached=True)
    inputs.append(helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1]))
    choose = helper.make_node(
        "If",
        ["use_cache_branch"],
        ["logits", "present_key", "present_value"],
        name="optimum::if",
        then_branch=branches["with_past"],
        else_branch=branches["no_past"],
    )
    graph = helper.make_graph([choose], "merged_decoder", inputs, outputs, _weights(np.random.default_rng(seed)))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def shapeless_encoder_layer(seed: int = 0) -> onnx.ModelProto:
    """Opset 12, no value_info, reshape targets built from Shape(x): like a Paddle2ONNX export."""
    nodes, out, _, _ = _layer("l0/", cached=False, opset=12, shapes_from_x=True)
    nodes.append(helper.make_node("Identity", [out], ["logits"]))
    inputs, _ = _io(cached=False)
    graph = helper.make_graph(
        nodes,
        "shapeless",
        inputs,
        [helper.make_tensor_value_info("logits", F32, None)],
        _weights(np.random.default_rng(seed)),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)], ir_version=7)


def _decoder_feeds(rng: np.random.Generator, batch: int, new: int, past: int, use_cache: bool) -> dict[str, np.ndarray]:
    total = past + new
    mask = np.ones((batch, total), np.int64)
    mask[0, : total // 3] = 0
    return {
        "x": rng.standard_normal((batch, new, HIDDEN)).astype(np.float32),
        "attention_mask": mask,
        "past_key": rng.standard_normal((batch, HEADS, past, HEAD_DIM)).astype(np.float32),
        "past_value": rng.standard_normal((batch, HEADS, past, HEAD_DIM)).astype(np.float32),
        "use_cache_branch": np.array([use_cache]),
    }


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(
        model.SerializeToString(), ortflash.session_options(), providers=["CPUExecutionProvider"]
    )
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in feeds.items() if k in names})


# ---------------------------------------------------------------------------------------------
# 1. attention in subgraphs
def test_merged_decoder_fuses_both_branches_and_names_them() -> None:
    model = merged_decoder()
    fused, report = ortflash.optimize(model, target="ortflash")
    assert report.fused == 2, report.blocks
    names = sorted(b.name for b in report.blocks)
    assert names == ["optimum::if.else_branch/no_past/softmax", "optimum::if.then_branch/with_past/softmax"]
    choose = (
        fused.graph.node[-1]
        if fused.graph.node[-1].op_type == "If"
        else next(n for n in fused.graph.node if n.op_type == "If")
    )
    for attr in choose.attribute:
        ops = [n.op_type for n in attr.g.node]
        assert "FlashAttention" in ops and "Softmax" not in ops, (attr.name, ops)
    onnx.checker.check_model(fused)
    rng = np.random.default_rng(1)
    for use_cache, past in ((True, 5), (False, 0)):
        feeds = _decoder_feeds(rng, batch=2, new=4, past=past, use_cache=use_cache)
        for want, got in zip(_run(model, feeds), _run(fused, feeds)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("target", ["contrib", "onnx"])
def test_merged_decoder_lowers_in_both_branches(target: str) -> None:
    model = merged_decoder()
    lowered, report = ortflash.optimize(model, target=target)
    assert report.fused == 2
    assert all(b.lowered_to for b in report.blocks), [(b.name, b.reason) for b in report.blocks]
    rng = np.random.default_rng(2)
    for use_cache, past in ((True, 3), (False, 0)):
        feeds = _decoder_feeds(rng, batch=2, new=4, past=past, use_cache=use_cache)
        for want, got in zip(_run(model, feeds), _run(lowered, feeds)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _no_attention_model() -> onnx.ModelProto:
    """A model with an If whose branches ORT's optimizer treats differently once shapes are annotated."""
    then = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["t"]), helper.make_node("Relu", ["t"], ["t_out"])],
        "then",
        [],
        [helper.make_tensor_value_info("t_out", F32, None)],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e_out"])], "else", [], [helper.make_tensor_value_info("e_out", F32, None)]
    )
    weight = onnx.numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
        "plain",
        [helper.make_tensor_value_info("x", F32, ["b", 8]), helper.make_tensor_value_info("c", TensorProto.BOOL, [1])],
        [helper.make_tensor_value_info("y", F32, None)],
        [weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def test_a_model_with_nothing_fused_is_written_byte_identical(tmp_path: Path) -> None:
    model = _no_attention_model()
    out, report = ortflash.optimize(model, target="ortflash")
    assert report.fused == 0 and out is model
    src = tmp_path / "plain.onnx"
    onnx.save(model, src)
    dst = tmp_path / "plain.flash.onnx"
    assert main(["optimize", str(src), "-o", str(dst), "-q", "--target", "ortflash"]) == 0
    assert dst.read_bytes() == src.read_bytes()


def test_fused_subgraphs_keep_no_inferred_value_info() -> None:
    fused, _ = ortflash.optimize(merged_decoder(), target="ortflash")
    choose = next(n for n in fused.graph.node if n.op_type == "If")
    assert all(not a.g.value_info for a in choose.attribute)
    assert not fused.graph.value_info


# ---------------------------------------------------------------------------------------------
# 2. models without shapes, and old opsets
def _encoder_feeds(rng: np.random.Generator) -> dict[str, np.ndarray]:
    mask = np.ones((2, 6), np.int64)
    mask[1, :2] = 0
    return {"x": rng.standard_normal((2, 6, HIDDEN)).astype(np.float32), "attention_mask": mask}


def test_a_shapeless_model_fuses_with_symbolic_shape_inference() -> None:
    model = shapeless_encoder_layer()
    fused, report = ortflash.optimize(model, target="ortflash")
    assert report.shape_inference == "onnxruntime-symbolic"
    assert report.fused == 1, report.blocks
    assert report.blocks[0].heads == HEADS
    feeds = _encoder_feeds(np.random.default_rng(3))
    np.testing.assert_allclose(_run(fused, feeds)[0], _run(model, feeds)[0], rtol=1e-4, atol=1e-5)


def test_a_model_with_shapes_keeps_onnx_shape_inference() -> None:
    _, report = ortflash.optimize(cached_decoder(), target="ortflash")
    assert report.shape_inference == "onnx" and report.fused == 1


def test_an_opset_12_model_is_converted_for_contrib() -> None:
    model = shapeless_encoder_layer()
    lowered, report = ortflash.optimize(model, target="contrib")
    assert report.fused == 1 and report.blocks[0].lowered_to.endswith("MultiHeadAttention"), report.blocks
    assert any("from 12 to 13" in note for note in report.notes), report.notes
    assert max(i.version for i in lowered.opset_import if i.domain in ("", "ai.onnx")) == 13
    feeds = _encoder_feeds(np.random.default_rng(4))
    np.testing.assert_allclose(_run(lowered, feeds)[0], _run(model, feeds)[0], rtol=1e-4, atol=1e-5)


def test_the_opset_is_not_converted_for_other_targets() -> None:
    fused, report = ortflash.optimize(shapeless_encoder_layer(), target="ortflash")
    assert not report.notes
    assert max(i.version for i in fused.opset_import if i.domain in ("", "ai.onnx")) == 12


# ---------------------------------------------------------------------------------------------
# 3. inputs that make sense for decoders
def test_decoder_feeds_are_a_decode_step_with_total_equal_past_plus_new() -> None:
    feeds = make_feeds(cached_decoder(), seq_len=5, batch=3)
    assert feeds["x"].shape == (3, 1, HIDDEN)
    assert feeds["past_key"].shape == feeds["past_value"].shape == (3, HEADS, 5, HEAD_DIM)
    assert feeds["attention_mask"].shape == (3, 6)


def test_decoder_cases_are_a_prefill_and_a_decode_step() -> None:
    cases = decoder_cases(cached_decoder(), seq_len=5, batch=3)
    assert [words.split(":")[0] for words, _ in cases] == ["prefill", "decode"]
    prefill, decode = (make_feeds(cached_decoder(), seq_len=5, batch=3, dims=d) for _, d in cases)
    assert (prefill["x"].shape[1], prefill["past_key"].shape[2], prefill["attention_mask"].shape[1]) == (5, 0, 5)
    assert (decode["x"].shape[1], decode["past_key"].shape[2], decode["attention_mask"].shape[1]) == (1, 5, 6)
    assert decoder_cases(shapeless_encoder_layer()) == []


def test_dims_override_a_length_and_the_total_follows() -> None:
    feeds = make_feeds(cached_decoder(), dims={"sequence_length": 1, "past_sequence_length": 7})
    assert feeds["x"].shape[1] == 1 and feeds["past_key"].shape[2] == 7 and feeds["attention_mask"].shape[1] == 8


def _position_model() -> onnx.ModelProto:
    """A decoder's inputs as dynamo names them: the batch is s10, positions and ids int64."""
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["s10", "s7"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["s10", "s7"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["s10", "s7 + s3"]),
        helper.make_tensor_value_info("past_key_values.0.key", F32, ["s10", 2, "s3", 8]),
    ]
    table = onnx.numpy_helper.from_array(np.zeros((50, 4), np.float32), "embed")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["embed", "input_ids"], ["h"])],
        "ids",
        inputs,
        [helper.make_tensor_value_info("h", F32, None)],
        [table],
    )
    return helper.make_model(graph)


def test_positions_follow_the_past_and_ids_stay_in_the_vocabulary() -> None:
    feeds = make_feeds(_position_model(), seq_len=4, batch=2, dims={"s3": 6, "s7": 4})
    assert feeds["input_ids"].shape == (2, 4) and feeds["input_ids"].max() < 50
    assert feeds["attention_mask"].shape == (2, 10)
    np.testing.assert_array_equal(feeds["position_ids"][1], np.arange(6, 10))


@pytest.mark.parametrize("build", [cached_decoder, merged_decoder])
@pytest.mark.parametrize("dims", [["--dim", "past_sequence_length=0"], []], ids=["prefill", "decode"])
def test_optimize_verify_passes_on_a_decoder_with_no_feeds(
    build: Callable[[], onnx.ModelProto], dims: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "decoder.onnx"
    onnx.save(build(), src)
    out = tmp_path / "decoder.flash.onnx"
    assert main(["optimize", str(src), "-o", str(out), "--verify", *dims]) == 0, capsys.readouterr().out
    assert out.exists()


def test_dim_flag_rejects_a_malformed_setting(tmp_path: Path) -> None:
    src = tmp_path / "decoder.onnx"
    onnx.save(cached_decoder(), src)
    with pytest.raises(SystemExit) as exit_info:
        main(["verify", str(src), str(src), "--dim", "sequence_length"])
    assert exit_info.value.code == 2


def loop_encoder(seed: int = 0) -> onnx.ModelProto:
    """The layer as a Loop body run twice: x is a loop-carried value, the weights and the mask come
    from the main graph."""
    nodes, out, _, _ = _layer("body/", cached=False)
    nodes += [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Identity", [out], ["x_next"])]
    body = helper.make_graph(
        nodes,
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", F32, None),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x_next", F32, None),
        ],
    )
    weights = _weights(np.random.default_rng(seed))
    weights += [
        onnx.numpy_helper.from_array(np.array(2, np.int64), "trips"),
        onnx.numpy_helper.from_array(np.array(True), "keep_going"),
    ]
    inputs, _ = _io(cached=False)
    inputs[0].name = "x0"
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "keep_going", "x0"], ["logits"], body=body, name="layers")],
        "looped",
        inputs,
        [helper.make_tensor_value_info("logits", F32, None)],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def test_a_block_in_a_loop_body_fuses_and_matches() -> None:
    model = loop_encoder()
    fused, report = ortflash.optimize(model, target="ortflash")
    assert [(b.name, b.fused) for b in report.blocks] == [("layers.body/body/softmax", True)], report.blocks
    feeds = _encoder_feeds(np.random.default_rng(5))
    feeds["x0"] = feeds.pop("x")
    np.testing.assert_allclose(_run(fused, feeds)[0], _run(model, feeds)[0], rtol=1e-4, atol=1e-5)


def test_a_mask_length_written_as_past_plus_one_makes_one_new_token() -> None:
    model = cached_decoder()
    for vi in model.graph.input:
        if vi.name == "attention_mask":
            vi.type.tensor_type.shape.dim[1].dim_param = "past_sequence_length + 1"
    feeds = make_feeds(model, seq_len=6)
    assert (feeds["x"].shape[1], feeds["past_key"].shape[2], feeds["attention_mask"].shape[1]) == (1, 6, 7)
