"""Every rule on hand-built graphs: fused ones compute what the original computed in
ONNX Runtime; near misses stay as they were, with the reason."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from attention_graphs import F16, Variant, build, feeds

import ortflash
import ortflash.kernels.reference
from ortflash.op import spec

SHAPES = [{"B": 2, "S": 37, "T": 53, "BH": 4}, {"B": 1, "S": 1, "T": 130, "BH": 2}]

FUSING = {
    "div_scores": Variant(),
    "mul_scores": Variant(scale_site="mul_scores", scale=0.3),
    "split_qk": Variant(scale_site="split_qk", scale=0.125),
    "q_only": Variant(scale_site="q_only", scale=0.25),
    "no_scale": Variant(scale_site="none", scale=1.0),
    "pretransposed_k": Variant(k_form="pretransposed"),
    "bshd_k": Variant(k_form="bshd"),
    "padding_bias": Variant(bias_shapes=(("B", 1, 1, "T"),)),
    "two_biases": Variant(bias_shapes=(("B", 1, 1, "T"), (1, 2, "S", "T"))),
    "full_bias": Variant(bias_shapes=(("B", 2, "S", "T"),)),
    "where_keep": Variant(where_mask="keep", mask_shape=("B", 1, "S", "T")),
    "where_drop_guard": Variant(where_mask="drop", nan_guard=True),
    "where_lowest": Variant(where_mask="keep", fill=float(np.finfo(np.float32).min)),
    "bias_then_where": Variant(bias_shapes=(("B", 1, 1, "T"),), where_mask="keep", nan_guard=True),
    "rank3": Variant(rank=3, bias_shapes=(("BH", "S", "T"),)),
    "rank3_pretransposed": Variant(rank=3, k_form="pretransposed", scale_site="mul_scores"),
    "float16_softmax_in_float32": Variant(dtype=F16, softmax_cast=True, bias_shapes=(("B", 1, 1, "T"),)),
    "opset12_axis_last": Variant(opset=12, softmax_axis=3),
}


def _run(model, f, **policy):
    if any(n.domain == spec.DOMAIN for n in model.graph.node):
        return ortflash.InferenceSession(model, **policy).run(None, f)[0]
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, f)[0]


def _op_types(model):
    return [n.op_type for n in model.graph.node]


@pytest.mark.parametrize("name", sorted(FUSING))
def test_rule_fuses_and_matches_ort(name):
    variant = FUSING[name]
    model = build(variant)
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    assert report.fused == 1, report.blocks[0].reason
    assert _op_types(fused).count("FlashAttention") == 1
    assert "Softmax" not in _op_types(fused) and "MatMul" not in _op_types(fused)
    assert report.blocks[0].scale == pytest.approx(variant.scale, rel=1e-6)
    tol = 2e-3 if variant.dtype == F16 else 2e-5
    for i, dims in enumerate(SHAPES):
        f = feeds(model, dims, np.random.default_rng(i))
        want = _run(model, f).astype(np.float64)
        for mode in ("naive", "online"):
            got = _run(fused, f, softmax=mode, block_size=16).astype(np.float64)
            assert np.array_equal(np.isnan(got), np.isnan(want))
            np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=tol * 10, atol=tol)


def _near_miss(model_fn, reason_part):
    model = model_fn()
    fused, report = ortflash.optimize(model, target="ortflash")
    assert report.fused == 0
    assert reason_part in report.blocks[0].reason
    assert _op_types(fused) == _op_types(model)
    return report


def test_softmax_on_another_axis_is_not_fused():
    _near_miss(lambda: build(Variant(softmax_axis=2)), "not the last axis")


def test_opset12_default_axis_is_not_fused():
    def model():
        m = build(Variant(opset=12))
        for n in m.graph.node:
            if n.op_type == "Softmax":
                del n.attribute[:]  # opset < 13 default axis=1 flattens, not a row softmax
        return m

    _near_miss(model, "axis 1")


def test_per_element_multiplier_on_scores_is_not_fused():
    def model():
        m = build(Variant(scale_site="mul_scores"))
        c = next(i for i in m.graph.initializer if i.name == "c")
        c.CopyFrom(onnx.numpy_helper.from_array(np.full((1, 2, 1, 1), 0.3, np.float32), "c"))
        return m

    _near_miss(model, "not by one constant number")


def test_runtime_multiplier_on_scores_is_not_fused():
    def model():
        m = build(Variant(scale_site="mul_scores"))
        m.graph.initializer.remove(next(i for i in m.graph.initializer if i.name == "c"))
        m.graph.input.append(onnx.helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, []))
        return m

    _near_miss(model, "not by one constant number")


def test_softmax_over_a_weight_matmul_is_not_attention():
    def model():
        m = build(Variant(k_form="pretransposed"))
        k = next(i for i in m.graph.input if i.name == "k")
        m.graph.input.remove(k)
        m.graph.initializer.append(onnx.numpy_helper.from_array(np.ones((1, 2, 32, 5), np.float32), "k"))
        return m

    _near_miss(model, "constant")


def test_probabilities_read_elsewhere_keep_the_block():
    def model():
        m = build(Variant())
        m.graph.output.append(onnx.helper.make_tensor_value_info("p", onnx.TensorProto.FLOAT, None))
        return m

    _near_miss(model, "graph output")


def test_a_softmax_that_is_a_graph_output_is_not_called_attention():
    """A classifier's or CTC head's Softmax: the reason names the Softmax, not attention probabilities."""
    x = onnx.helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["B", "T", 10])
    y = onnx.helper.make_tensor_value_info("probs", onnx.TensorProto.FLOAT, ["B", "T", 10])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)], "ctc", [x], [y])
    report = _near_miss(lambda: onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), "")
    assert report.blocks[0].reason == "the Softmax output probs is a graph output, not only read by a MatMul with V"


def test_scale_after_bias_is_not_fused():
    def model():
        m = build(Variant(scale_site="none", bias_shapes=(("B", 1, 1, "T"),)))
        g = m.graph
        g.initializer.append(onnx.numpy_helper.from_array(np.array(0.5, np.float32), "late"))
        sm = next(n for n in g.node if n.op_type == "Softmax")
        sm.input[0] = "late_out"
        idx = list(g.node).index(sm)
        g.node.insert(idx, onnx.helper.make_node("Mul", ["sb0", "late"], ["late_out"]))
        return m

    _near_miss(model, "scaled after the bias")


def test_scores_also_graph_output_are_kept_and_block_fused():
    model = build(Variant(bias_shapes=(("B", 1, 1, "T"),)))
    model.graph.output.append(onnx.helper.make_tensor_value_info("s1", onnx.TensorProto.FLOAT, None))
    fused, report = ortflash.optimize(model, target="ortflash")
    assert report.fused == 1 and "kept" in report.blocks[0].reason
    f = feeds(model, SHAPES[0], np.random.default_rng(0))
    sess = ortflash.InferenceSession(fused)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for got, want in zip(sess.run(None, f), ref.run(None, f)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_model_without_attention_is_unchanged():
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])
    model = onnx.helper.make_model(onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]))
    fused, report = ortflash.optimize(model, target="ortflash")
    assert report.blocks == [] and "no Softmax" in report.summary()
    assert _op_types(fused) == ["Relu"]


@pytest.mark.parametrize("static", [True, False])
def test_grouped_query_repeat_is_read_without_materialising(static):
    from attention_graphs import build_gqa

    model = build_gqa(heads=4, kv_heads=2, static=static)
    fused, report = ortflash.optimize(model, target="ortflash")
    assert report.fused == 1 and report.blocks[0].kv_heads == 2 and report.blocks[0].heads == 4
    node = next(n for n in fused.graph.node if n.op_type == "FlashAttention")
    assert list(node.input[:3]) == ["q", "k", "v"]  # the un-repeated K and V
    assert not {"Expand", "Reshape"} & set(_op_types(fused))
    f = feeds(model, {"B": 2, "S": 9, "T": 11}, np.random.default_rng(0))
    want = _run(model, f)
    for mode in ("naive", "online"):
        np.testing.assert_allclose(_run(fused, f, softmax=mode, block_size=4), want, rtol=1e-4, atol=2e-5)


def test_lowest_fill_and_bias_survive_the_bridge_exactly():
    """Found by the fuzz run: the ORT bridge passed mask_fill as -3.40282e+38 (6 digits), which
    is above float32's lowest, so masked keys outranked keys padded with the real lowest."""
    variant = Variant(
        scale=1.0,
        bias_shapes=((1, 1, 1),),
        where_mask="keep",
        mask_shape=("BH", "S", "T"),
        fill=float(np.finfo(np.float32).min),
        rank=3,
        heads=1,
        head_dim=8,
    )
    model = build(variant)
    fused, report = ortflash.optimize(model, target="ortflash")
    assert report.fused == 1
    f = feeds(model, {"B": 1, "S": 1, "T": 3, "BH": 1}, np.random.default_rng(103))
    np.testing.assert_allclose(_run(fused, f), _run(model, f), rtol=1e-5, atol=1e-6)


def test_scale_with_more_than_six_digits_is_exact_in_the_kernel(monkeypatch):
    import ortflash.kernels.cpu as ref  # the default backend's kernel

    seen = {}
    real = ref.flash_attention

    def spy(*args, **attrs):
        seen.update(attrs)
        return real(*args, **attrs)

    monkeypatch.setattr(ref, "flash_attention", spy)
    model = build(Variant(scale=float(np.float32(1 / np.sqrt(32))), scale_site="mul_scores"))
    fused, _ = ortflash.optimize(model, target="ortflash")
    _run(fused, feeds(model, SHAPES[0], np.random.default_rng(0)))
    assert seen["scale"] == float(np.float32(1 / np.sqrt(32)))


def test_plain_onnxruntime_session_with_ortflash_options_runs_a_fused_model(tmp_path):
    model = build(Variant(bias_shapes=(("B", 1, 1, "T"),)))
    fused, _ = ortflash.optimize(model, softmax="online", block_size=8, min_seq_len=0, target="ortflash")
    path = str(tmp_path / "fused.onnx")
    ortflash.save(fused, path)
    f = feeds(model, SHAPES[0], np.random.default_rng(0))
    sess = ort.InferenceSession(path, ortflash.session_options(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, f)[0], _run(model, f), rtol=1e-4, atol=1e-5)


def _mask_then_bias(fill: float, bias_before_mask: bool = False) -> onnx.ModelProto:
    """GPT-Neo's order: where(mask, q @ kᵀ, fill) + bias (optionally a second bias before the mask)."""
    model = build(
        Variant(scale_site="none", scale=1.0, where_mask="keep", mask_shape=("B", 1, "S", "T"), fill=fill, head_dim=8)
    )
    g = model.graph
    where = next(n for n in g.node if n.op_type == "Where")
    if bias_before_mask:
        g.input.append(onnx.helper.make_tensor_value_info("bias_first", onnx.TensorProto.FLOAT, ["B", 1, 1, "T"]))
        g.node.insert(list(g.node).index(where), onnx.helper.make_node("Add", ["s0", "bias_first"], ["s0b"]))
        where.input[1] = "s0b"
    g.input.append(onnx.helper.make_tensor_value_info("bias_after", onnx.TensorProto.FLOAT, ["B", 1, "S", "T"]))
    softmax = next(n for n in g.node if n.op_type == "Softmax")
    g.node.insert(list(g.node).index(softmax), onnx.helper.make_node("Add", ["sm", "bias_after"], ["sma"]))
    softmax.input[0] = "sma"
    return model


@pytest.mark.parametrize("fill", [-100.0, float(np.finfo(np.float32).min)])
def test_bias_added_after_the_mask_fuses_in_that_order(fill):
    """GPT-Neo's eager export applies its causal Where first and adds the padding bias after it.
    The bias is a graph input (no bounds), so the fill cannot absorb it: the node gets
    bias_after_mask=1 and computes fill + bias at masked positions, as the graph does."""
    model = _mask_then_bias(fill)
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    assert report.fused == 1, report.blocks[0].reason
    node = next(n for n in fused.graph.node if n.op_type == "FlashAttention")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["bias_after_mask"] == 1 and b"bias_after_mask=1" in attrs["exact_floats"]
    assert "bias after mask" in report.blocks[0].mask
    dims = {"B": 2, "S": 9, "T": 40}
    f = feeds(model, dims, np.random.default_rng(7))
    f["mask"][0, 0, 3] = False  # a fully masked row: fill + bias decides its softmax
    want = _run(model, f)
    for mode in ("naive", "online"):
        got = _run(fused, f, softmax=mode, block_size=16)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if fill == -100.0:  # the other order gives a different answer here: the attribute is what makes it right
        other = ortflash.kernels.reference.flash_attention(
            f["q"], f["k"], f["v"], f["bias_after"], f["mask"], mask_fill=fill
        )
        assert np.abs(other - want).max() > 1e-2


def test_biases_on_both_sides_of_the_mask_are_not_fused():
    _near_miss(lambda: _mask_then_bias(-100.0, bias_before_mask=True), "biases on both sides of a mask")


# ---------------------------------------------------------------- Keras MultiHeadAttention through tf2onnx (issue 22)

KERAS_FORMS = {  # name -> keras_einsum_block arguments
    "key_first": {},
    "query_first": {"qk_eq": "abcd,aecd->acbe", "key_first": False},
    "padding_bias": {"bias": True},
    "heads_first_output": {"pv_eq": "acbe,aecd->acbd"},
}


@pytest.mark.parametrize("target", ["ortflash", "contrib", "onnx"])
@pytest.mark.parametrize("form", sorted(KERAS_FORMS))
def test_keras_einsum_attention_over_bshd_fuses_and_matches_ort(form, target):
    """tf2onnx's 3D BERT: Einsum(key, query) 'aecd,abcd->acbe' and P·V 'acbe,aecd->abcd' straight
    into [B, S, H, D]; read as Transpose(q) and a Transpose of the fused output."""
    from attention_graphs import keras_einsum_block

    model = keras_einsum_block(**KERAS_FORMS[form])
    fused, report = ortflash.optimize(model, softmax="naive", target=target)
    assert report.fused == 1, report.blocks[0].reason
    assert not {"Einsum", "Softmax"} & set(_op_types(fused)), _op_types(fused)
    assert len(set(_op_types(fused)) & {"FlashAttention", "MultiHeadAttention", "Attention"}) == 1
    for i, dims in enumerate([{"B": 2, "S": 5, "T": 7}, {"B": 1, "S": 1, "T": 9}]):
        f = feeds(model, dims, np.random.default_rng(i))
        want, got = _run(model, f), _run(fused, f, softmax="naive")
        heads_first = form == "heads_first_output"
        assert (
            got.shape == want.shape == ((dims["B"], 2, dims["S"], 8) if heads_first else (dims["B"], dims["S"], 2, 8))
        )
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_probs_einsum_contracting_the_query_axis_is_not_fused():
    from attention_graphs import keras_einsum_block

    # 'acbe,abcd->aecd' sums P over its rows (Keras's backward equation), not over the keys
    _near_miss(lambda: keras_einsum_block(pv_eq="acbe,abcd->aecd"), "(acbe,abcd->aecd) is not a batched P·V")


def test_scores_einsum_that_is_not_q_kt_is_not_fused_and_the_pv_rewrite_is_not_written():
    from attention_graphs import keras_einsum_block

    # the key's head dim is summed away on its own: no shared contracted axis
    _near_miss(lambda: keras_einsum_block(qk_eq="aecd,abce->acbe"), "(aecd,abce->acbe) is not a batched Q·Kᵀ")


def test_two_keras_blocks_over_one_query_write_unique_names():
    """The rewrites name their values after each Einsum's output (unique), not after node names
    (empty here, and free to repeat)."""
    from attention_graphs import keras_einsum_block

    model = keras_einsum_block()
    model.graph.node.extend(
        [
            onnx.helper.make_node("Einsum", ["k", "q_s"], ["s0b"], equation="aecd,abcd->acbe"),
            onnx.helper.make_node("Softmax", ["s0b"], ["pb"], axis=-1),
            onnx.helper.make_node("Einsum", ["pb", "v"], ["outb"], equation="acbe,aecd->abcd"),
        ]
    )
    model.graph.output.append(onnx.helper.make_tensor_value_info("outb", onnx.TensorProto.FLOAT, None))
    fused, report = ortflash.optimize(model, target="ortflash")
    assert report.fused == 2, [b.reason for b in report.blocks]
    names = [o for n in fused.graph.node for o in n.output]
    assert len(names) == len(set(names))
    assert ortflash.verify(model, fused, seq_len=5).ok
