"""Forms seen in shipped models and in exports made the way people ship them (issue 12's general
case; benchmarks/results/outside_models.md, 2026-11-30 second round): PP-OCR's Paddle2ONNX
recognisers, Optimum's decoders with a cache, CodeGen's fused QKV split, MPT's ALiBi beside a
causal mask. Each on a hand-built block that the rules left alone before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from test_causal_proof import _cached_decoder, _cached_feeds

import ortflash
from ortflash.model_io import graphs_of
from ortflash.op import spec

B, H, S, D = 2, 4, 6, 8


def _run(model: onnx.ModelProto, f: dict[str, np.ndarray]) -> list[np.ndarray]:
    f = {i.name: f[i.name] for i in model.graph.input}
    if any(n.domain == spec.DOMAIN for g in graphs_of(model.graph) for n in g.node):
        return ortflash.InferenceSession(model, softmax="naive").run(None, f)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, f)


def _model(nodes: list, inputs: list, inits: list, opset: int = 17) -> onnx.ModelProto:
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "block", inputs, [out], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _const(name: str, value: object, dtype: type = np.int64) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.asarray(value, dtype), name)


def _qkv_inputs(keys: str = "S") -> list[onnx.ValueInfoProto]:
    return [
        helper.make_tensor_value_info("q", TensorProto.FLOAT, ["B", H, "S", D]),
        helper.make_tensor_value_info("k", TensorProto.FLOAT, ["B", H, keys, D]),
        helper.make_tensor_value_info("v", TensorProto.FLOAT, ["B", H, keys, D]),
    ]


def _feeds(model: onnx.ModelProto, rng: np.random.Generator) -> dict[str, np.ndarray]:
    sizes = {"B": B, "S": S, "T": S + 3}
    f = {}
    for i in model.graph.input:
        dims = [d.dim_value or sizes[d.dim_param] for d in i.type.tensor_type.shape.dim]
        f[i.name] = rng.standard_normal(dims).astype(np.float32)
    return f


# ------------------------------------------------ Paddle2ONNX: Identity (dropout) and x·s + 0


def paddle_block(after_softmax: str) -> onnx.ModelProto:
    """PP-OCR's SVTR attention as Paddle2ONNX writes it: Q scaled by Paddle's scale op, x·s + 0,
    then an Identity; the probabilities through a dropout (Identity at opset 11, or Dropout)."""
    inits = [_const("s", 0.35, np.float32), _const("zero", 0.0, np.float32)]
    nodes = [
        helper.make_node("Mul", ["q", "s"], ["q_scaled"]),
        helper.make_node("Add", ["q_scaled", "zero"], ["q_biased"]),
        helper.make_node("Identity", ["q_biased"], ["q_id"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q_id", "kt"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
    ]
    if after_softmax == "Identity":
        nodes.append(helper.make_node("Identity", ["p"], ["p_kept"]))
    elif after_softmax == "Dropout":
        nodes.append(helper.make_node("Dropout", ["p", "ratio"], ["p_kept"]))
        inits.append(_const("ratio", 0.1, np.float32))
    else:  # Dropout(p, ratio, training_mode) with a constant training_mode
        training = after_softmax == "Dropout(training)"
        nodes.append(helper.make_node("Dropout", ["p", "ratio", "training"], ["p_kept"]))
        inits += [_const("ratio", 0.0, np.float32), _const("training", training, np.bool_)]
    nodes.append(helper.make_node("MatMul", ["p_kept", "v"], ["out"]))
    return _model(nodes, _qkv_inputs(), inits)


@pytest.mark.parametrize("target", ["ortflash", "contrib", "onnx"])
@pytest.mark.parametrize("after_softmax", ["Identity", "Dropout", "Dropout(inference)"])
def test_paddle_identity_dropout_and_zero_bias_fuse(after_softmax: str, target: str) -> None:
    """Before: "the attention probabilities feed Identity …, not a MatMul with V" (PP-OCRv6's
    rec model: 0 of 2 attention blocks)."""
    model = paddle_block(after_softmax)
    fused, report = ortflash.optimize(model, softmax="naive", target=target)
    assert report.fused == 1, report.blocks[0].reason
    assert report.blocks[0].scale == pytest.approx(0.35)
    assert report.blocks[0].heads == H
    if target != "ortflash":
        assert report.blocks[0].lowered_to, report.blocks[0].reason
    assert not {"Softmax", "Dropout"} & {n.op_type for n in fused.graph.node}
    f = _feeds(model, np.random.default_rng(1))
    np.testing.assert_allclose(_run(fused, f)[0], _run(model, f)[0], rtol=1e-5, atol=1e-6)


def test_dropout_in_training_mode_stays() -> None:
    _, report = ortflash.optimize(paddle_block("Dropout(training)"), softmax="naive", target="ortflash")
    assert report.fused == 0
    assert "training mode" in report.blocks[0].reason


def test_a_nonzero_bias_on_q_is_not_read_as_a_scale() -> None:
    """x·s + 0.5 is not x·s: Q is then the Add's output, with no scale folded from below it."""
    model = paddle_block("Identity")
    zero = next(i for i in model.graph.initializer if i.name == "zero")
    zero.CopyFrom(_const("zero", 0.5, np.float32))
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    assert report.fused == 1
    assert report.blocks[0].scale == pytest.approx(1.0)
    f = _feeds(model, np.random.default_rng(2))
    np.testing.assert_allclose(_run(fused, f)[0], _run(model, f)[0], rtol=1e-5, atol=1e-6)


# ------------------------------------------------ CodeGen: heads through a fused-QKV Split


def fused_qkv_split_block(opset: int = 17) -> onnx.ModelProto:
    """x [B, S, 64] @ W [64, 3·H·D], viewed [B, S, -1, 3·D] from runtime shapes, Split on the last
    axis into Q, K, V [B, S, H, D] (CodeGen's mp_num layout), transposed to [B, H, S, D]."""
    rng = np.random.default_rng(0)
    hidden = H * D
    inits = [
        _const("w", rng.standard_normal((hidden, 3 * hidden)) * 0.2, np.float32),
        _const("i0", 0),
        _const("i1", 1),
        _const("ax0", [0]),
        _const("tail", [-1, 3 * D]),
        _const("scale", D**-0.5, np.float32),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["qkv"]),
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Gather", ["x_shape", "i0"], ["b"], axis=0),
        helper.make_node("Gather", ["x_shape", "i1"], ["s"], axis=0),
        *(
            helper.make_node("Unsqueeze", [x, "ax0"], [f"{x}1"])
            if opset >= 13
            else helper.make_node("Unsqueeze", [x], [f"{x}1"], axes=[0])
            for x in ("b", "s")
        ),
        helper.make_node("Concat", ["b1", "s1", "tail"], ["target"], axis=0),
        helper.make_node("Reshape", ["qkv", "target"], ["qkv4"]),
    ]
    if opset >= 13:
        inits.append(_const("sizes", [D, D, D]))
        nodes.append(helper.make_node("Split", ["qkv4", "sizes"], ["q4", "k4", "v4"], axis=-1))
    else:
        nodes.append(helper.make_node("Split", ["qkv4"], ["q4", "k4", "v4"], axis=-1, split=[D, D, D]))
    nodes += [helper.make_node("Transpose", [f"{x}4"], [x], perm=[0, 2, 1, 3]) for x in ("q", "k", "v")]
    nodes += [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
        helper.make_node("Softmax", ["scaled"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["pv"]),
        helper.make_node("Transpose", ["pv"], ["out"], perm=[0, 2, 1, 3]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", hidden])
    return _model(nodes, [x], inits, opset)


@pytest.mark.parametrize("opset", [17, 11])
def test_heads_of_a_fused_qkv_split_are_read_and_lower_to_contrib(opset: int) -> None:
    """Before: "the head counts (dim 1 of Q and K) are not static; MultiHeadAttention needs
    num_heads" (CodeGen, both exporters: 0 of 2 blocks lowered to contrib)."""
    model = fused_qkv_split_block(opset)
    fused, report = ortflash.optimize(model, softmax="naive", target="contrib")
    assert report.fused == 1
    assert (report.blocks[0].heads, report.blocks[0].head_dim) == (H, D)
    assert report.blocks[0].lowered_to == "com.microsoft.MultiHeadAttention", report.blocks[0].reason
    f = _feeds(model, np.random.default_rng(3))
    np.testing.assert_allclose(_run(fused, f)[0], _run(model, f)[0], rtol=1e-5, atol=1e-6)


# ------------------------------------------------ MPT: an ALiBi bias beside a causal mask


def alibi_and_causal_block(mask_form: str = "where") -> onnx.ModelProto:
    """scores + alibi [1, H, 1, S], then where(j > i, lowest, ·) from Ranges of S (MPT's eager
    export); mask_form "two": a second query-dependent mask (not one causal tensor)."""
    lowest = float(np.finfo(np.float32).min)
    inits = [
        _const("i2", [2]),
        _const("i3", [3]),
        _const("zero", 0),
        _const("one", 1),
        _const("ax0", [0]),
        _const("ax1", [1]),
        _const("ax01", [0, 1]),
        _const("scale", D**-0.5, np.float32),
        _const("lowest", lowest, np.float32),
    ]
    nodes = [
        helper.make_node("Shape", ["q"], ["q_shape"]),
        helper.make_node("Slice", ["q_shape", "i2", "i3"], ["s_vec"]),
        helper.make_node("Squeeze", ["s_vec", "ax0"], ["s"]),
        helper.make_node("Range", ["zero", "s", "one"], ["pos"]),
        helper.make_node("Unsqueeze", ["pos", "ax1"], ["rows"]),
        helper.make_node("Unsqueeze", ["pos", "ax0"], ["cols"]),
        helper.make_node("Greater", ["cols", "rows"], ["ahead2"]),
        helper.make_node("Unsqueeze", ["ahead2", "ax01"], ["ahead"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "alibi"], ["biased"]),
        helper.make_node("Where", ["ahead", "lowest", "biased"], ["masked"]),
    ]
    last = "masked"
    if mask_form == "two":  # a band: also j < i - 2 masked
        inits.append(_const("two", 2))
        nodes += [
            helper.make_node("Sub", ["rows", "two"], ["rows_back"]),
            helper.make_node("Less", ["cols", "rows_back"], ["behind2"]),
            helper.make_node("Unsqueeze", ["behind2", "ax01"], ["behind"]),
            helper.make_node("Where", ["behind", "lowest", "masked"], ["banded"]),
        ]
        last = "banded"
    nodes += [
        helper.make_node("Softmax", [last], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["out"]),
    ]
    alibi = helper.make_tensor_value_info("alibi", TensorProto.FLOAT, [1, H, 1, "S"])
    return _model(nodes, [*_qkv_inputs(), alibi], inits)


@pytest.mark.parametrize("target", ["ortflash", "contrib", "onnx"])
def test_causal_mask_beside_an_alibi_bias_is_proved(target: str) -> None:
    """Before: the block had two score tensors (ALiBi and the mask), so no causal proof was tried
    and the report said nothing (MPT: 0 of 2 blocks causal)."""
    model = alibi_and_causal_block()
    fused, report = ortflash.optimize(model, softmax="naive", target=target)
    assert report.fused == 1
    block = report.blocks[0]
    assert block.reason.startswith("causal (is_causal=1") or "causal (is_causal=1" in block.reason, block.reason
    assert "bias [1, 4, 1, 'S']" in block.mask
    if target == "ortflash":
        (node,) = [n for n in fused.graph.node if n.domain == spec.DOMAIN]
        assert helper.get_node_attr_value(node, "is_causal") == 1
        assert len(node.input) >= 4 and node.input[3], "the ALiBi bias is kept"
        assert "Greater" not in [n.op_type for n in fused.graph.node]
    f = _feeds(model, np.random.default_rng(4))
    np.testing.assert_allclose(_run(fused, f)[0], _run(model, f)[0], rtol=1e-5, atol=1e-6)


def test_two_query_dependent_masks_keep_their_tensors() -> None:
    """A band (two comparisons, two Where) is not one causal tensor: no proof, same outputs."""
    model = alibi_and_causal_block("two")
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    assert report.fused == 1
    assert "is_causal" not in report.blocks[0].reason
    f = _feeds(model, np.random.default_rng(5))
    np.testing.assert_allclose(_run(fused, f)[0], _run(model, f)[0], rtol=1e-5, atol=1e-6)


# ------------------------------------------------ Optimum: cache_position = Range(past, past + new)


def cache_position_decoder() -> onnx.ModelProto:
    """test_causal_proof's cached decoder with the query positions written as transformers' cache
    position is: Range(past, past + new) instead of Range(0, new) + past."""
    model = _cached_decoder()
    graph = model.graph
    (add,) = [n for n in graph.node if list(n.output) == ["i"]]
    (shifted,) = [n for n in graph.node if list(n.output) == ["ar_new"]]
    add.CopyFrom(helper.make_node("Range", ["past", "total", "one"], ["i"]))
    graph.node.remove(shifted)
    return model


def test_cache_position_range_is_proved_bottom_right_causal() -> None:
    """Before: "not proved causal: a Range that does not start at 0 with step 1" (Optimum's GPT-2,
    Llama and Whisper decoders with a cache: 0 blocks causal)."""
    model = cache_position_decoder()
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    assert report.fused == 2
    assert all("is_causal=2" in b.reason for b in report.blocks), [b.reason for b in report.blocks]
    rng = np.random.default_rng(6)
    for past, new in ((0, 7), (6, 1), (5, 4)):
        f = _cached_feeds(rng, past, new)
        for got, want in zip(_run(fused, f), _run(model, f)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------ Optimum's merged decoders: one name in two branches


def _branch(name: str, tail: list[int]) -> onnx.GraphProto:
    """view = Reshape(x, [B, *tail]) and its flattening; every branch names its values alike."""

    def const(out: str, value: object) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [out], value=onnx.numpy_helper.from_array(np.asarray(value, np.int64)))

    nodes = [
        const("i0", 0),
        const("ax0", [0]),
        const("flat", [-1]),
        const("tail", tail),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "i0"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
        helper.make_node("Concat", ["b1", "tail"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["view"]),
        helper.make_node("Reshape", ["view", "flat"], [f"out_{name}"]),
    ]
    out = helper.make_tensor_value_info(f"out_{name}", TensorProto.FLOAT, None)
    return helper.make_graph(nodes, name, [], [out])


def test_shapes_of_a_name_computed_in_both_branches_are_each_branch_own() -> None:
    """ONNX's data propagation keys shape data by value name across graphs: the else branch's
    [B, -1, 4, 8] view was given the rank 2 of the then branch's [B, -1] (Optimum's merged Marian
    and Whisper decoders: a cross-attention K "of rank 3", so the block was left alone)."""
    from ortflash.model_shapes import with_shapes

    node = helper.make_node(
        "If", ["c"], ["y"], then_branch=_branch("then", [-1]), else_branch=_branch("else", [-1, 4, 8])
    )
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 32]),
        helper.make_tensor_value_info("c", TensorProto.BOOL, [1]),
    ]
    graph = helper.make_graph([node], "merged", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    inferred, _ = with_shapes(model)
    ranks = {
        a.name: [len(v.type.tensor_type.shape.dim) for v in a.g.value_info if v.name == "view"]
        for a in inferred.graph.node[0].attribute
    }
    assert ranks == {"then_branch": [2], "else_branch": [4]}
    names = {x for g in graphs_of(inferred.graph) for n in g.node for x in [*n.input, *n.output]}
    assert names == {x for g in graphs_of(model.graph) for n in g.node for x in [*n.input, *n.output]}


# ------------------------------------------------ Optimum exports (tests/data/outside, optimum-onnx 0.1.0)

DATA = Path(__file__).parent / "data" / "outside"


def _whisper_feeds(rng: np.random.Generator, past: int, new: int, encoder: int = 5) -> dict[str, np.ndarray]:
    f = {"input_ids": rng.integers(3, 100, size=(2, new), dtype=np.int64)}
    f["encoder_hidden_states"] = rng.standard_normal((2, encoder, 64)).astype(np.float32)
    for kind, length in (("decoder", past), ("encoder", encoder)):
        for x in ("key", "value"):
            f[f"past_key_values.0.{kind}.{x}"] = rng.standard_normal((2, 2, length, 32)).astype(np.float32)
    return f


@pytest.mark.parametrize("target", ["ortflash", "contrib"])
def test_optimum_whisper_decoder_with_past_is_proved_causal(target: str) -> None:
    """Optimum's Whisper decoder_with_past_model: the query positions are Range(past, past + new)
    (the cache position) and the position ids are Tiled over the batch from [1, new]. Before:
    "not proved causal: a Range that does not start at 0 with step 1"."""
    model = onnx.load(DATA / "optimum_whisper_decoder_with_past_model.onnx")
    fused, report = ortflash.optimize(model, softmax="naive", target=target)
    assert report.fused == 2
    self_attn = next(b for b in report.blocks if "self_attn" in b.name)
    assert "causal (is_causal=2" in self_attn.reason, self_attn.reason
    rng = np.random.default_rng(7)
    for past, new in ((3, 1), (4, 2)):
        f = _whisper_feeds(rng, past, new)
        for got, want in zip(_run(fused, f), _run(model, f)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("target", ["ortflash", "contrib"])
def test_optimum_merged_whisper_decoder_fuses_both_branches(target: str) -> None:
    """decoder_model_merged.onnx: the If's branches share value names; with ONNX's data
    propagation the else branch's cross-attention K read as rank 3 and stayed (3 of 4 fused)."""
    model = onnx.load(DATA / "optimum_whisper_decoder_model_merged.onnx")
    fused, report = ortflash.optimize(model, softmax="naive", target=target)
    assert report.fused == 4, [b.reason for b in report.blocks if not b.fused]
    if target == "contrib":
        assert [b.lowered_to for b in report.blocks] == ["com.microsoft.MultiHeadAttention"] * 4, report.blocks
    rng = np.random.default_rng(8)
    for past, new, cached in ((0, 3, False), (3, 1, True)):
        f = _whisper_feeds(rng, past, new) | {"use_cache_branch": np.array([cached])}
        for got, want in zip(_run(fused, f), _run(model, f)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("stem", ["optimum_whisper_decoder_with_past_model", "optimum_whisper_decoder_model_merged"])
def test_verify_keeps_the_encoder_length_of_a_cross_attention_cache(stem, tmp_path, capsys):
    """Optimum's past_key_values.N.encoder.* hold the encoder's keys: they do not grow with the
    decoder's cache, so the prefill case must not give them 0 keys (it did, and --verify failed)."""
    from ortflash.checks.feeds import decoder_cases
    from ortflash.cli import main

    path = str(DATA / f"{stem}.onnx")
    model = onnx.load(path)
    cases = dict(decoder_cases(model))
    assert len(cases) == 2
    for dims in cases.values():
        assert dims.get("encoder_sequence_length", 16) == 16, dims
    prefill = next(d for words, d in cases.items() if words.startswith("prefill"))
    assert prefill["past_decoder_sequence_length"] == 0 and prefill["decoder_sequence_length"] == 16
    for target in (["--target", "onnx"], []):
        assert main(["optimize", path, "-o", str(tmp_path / "out.onnx"), "--verify", *target]) == 0
    assert "verified: outputs match" in capsys.readouterr().out
