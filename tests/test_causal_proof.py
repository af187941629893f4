"""Causality proved from the mask subgraph (fusion/causal, read by graph/interpret), the op
contract's is_causal=2 and bias_after_mask through the ONNX Runtime bridge.

Hand-built decoders build their [B, 1, S, S] mask as HF's masking_utils does (a Range, two
Unsqueezes, a comparison, the padding read from attention_mask): where the mask is exactly causal x
key padding, the fused node has is_causal and a [B, 1, 1, S] padding part, and the [B, 1, S, S]
tensor is gone; where it is not (another frontier, a fill that does not absorb the scores, a
padding part that depends on the query), the block keeps its tensor and says why. Sliding windows
(a band of two frontiers): tests/test_sliding_window.py."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from attention_graphs import Nodes
from onnx import TensorProto, helper

import ortflash
from ortflash.kernels import reference
from ortflash.op import side_channel, spec

LOWEST = float(np.finfo(np.float32).min)
B, H, S, D = 2, 2, 11, 8
ZOO = os.path.join(os.path.dirname(__file__), "..", "models")


def _decoder(
    fill: float = LOWEST,
    frontier: str = "le",  # le: j <= i; window: and j > i - 4; shift: j <= i + 1; ge: j >= i
    padding: str = "unsqueeze",  # unsqueeze | gathernd | by_query (depends on i) | none
    form: str = "bias",  # bias: Add(s, Where(m, 0, fill)); mask: Where(m, s, fill)
    dtype: int = TensorProto.FLOAT,  # of Q, K, V, the scores and the bias
    beside: bool = False,  # a key padding bias Where(attention_mask, 0, fill) added to the scores first
) -> onnx.ModelProto:
    """Two attention blocks sharing one mask built from attention_mask [B, S] (int64); padding
    "ones": HF's decoder mask where none is given, a Cast of a ConstantOfShape of ones."""
    f = helper.tensor_dtype_to_np_dtype(dtype)
    g = Nodes()
    const, node, nodes, inits = g.const, g.node, g.nodes, g.inits

    shape = node("Shape", ["attention_mask"], "shape_m", start=1, end=2)
    length = node("Squeeze", [shape, const("ax0", [0])], "length")
    ar = node("Range", [const("zero", 0), length, const("one", 1)], "ar")
    kv = node("Unsqueeze", [ar, const("ax012", [0, 1, 2])], "kv")  # [1, 1, 1, S]: j
    qi = node("Unsqueeze", [ar, const("ax013", [0, 1, 3])], "qi")  # [1, 1, S, 1]: i
    if frontier == "shift":
        qi = node("Add", [qi, const("one_b", 1)], "qi1")
    causal = node("GreaterOrEqual" if frontier == "ge" else "LessOrEqual", [kv, qi], "causal")
    if frontier == "window":
        low = node("Sub", [qi, const("four", 4)], "low")
        causal = node("And", [causal, node("Greater", [kv, low], "inside")], "band")
    keep = node("Cast", ["attention_mask"], "keep", to=TensorProto.BOOL)
    if padding == "unsqueeze":
        pad = node("Unsqueeze", [keep, const("ax12", [1, 2])], "pad")
    elif padding == "gathernd":  # dynamo's form: index tuples (b, j) built from two Ranges
        batch = node("Squeeze", [node("Shape", ["attention_mask"], "shape_b", start=0, end=1), "ax0"], "batch")
        br = node("Range", ["zero", batch, "one"], "br")
        bi = node("Unsqueeze", [br, const("ax123", [1, 2, 3])], "bi")  # [B, 1, 1, 1]
        target = node("Shape", [node("Max", [bi, kv], "bkv")], "target")
        b_idx = node("Unsqueeze", [node("Expand", [bi, target], "be"), const("axl", [-1])], "b_idx")
        j_idx = node("Unsqueeze", [node("Expand", [kv, target], "je"), "axl"], "j_idx")
        index = node("Concat", [b_idx, j_idx], "index", axis=-1)
        pad = node("GatherND", [keep, index], "pad")
    elif padding == "ones":
        one = helper.make_tensor("one_f", TensorProto.FLOAT, [1], [1.0])
        ones = node("ConstantOfShape", [node("Shape", ["attention_mask"], "shape_bs")], "ones", value=one)
        pad = node("Unsqueeze", [node("Cast", [ones], "ones_b", to=TensorProto.BOOL), const("ax12", [1, 2])], "pad")
    elif padding == "by_query":  # the padding part reads the query position too
        pad = node("Less", [qi, const("five", 5)], "pad")
    if padding != "none":
        causal = node("And", [causal, pad], "both")
    inputs = [helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["B", "S"])]
    if form == "bias":
        bias = node("Where", [causal, const("zero_f", 0.0, f), const("fill", fill, f)], "bias")
    if beside:
        keys = node("Unsqueeze", [keep, const("ax12_b", [1, 2])], "keys")
        key_bias = node("Where", [keys, "zero_f", "fill"], "key_bias")
    for layer in range(2):
        q, k, v = (f"{x}{layer}" for x in "qkv")
        inputs += [helper.make_tensor_value_info(x, dtype, ["B", H, "S", D]) for x in (q, k, v)]
        s = node("MatMul", [q, node("Transpose", [k], f"kt{layer}", perm=[0, 1, 3, 2])], f"s{layer}")
        s = node("Mul", [s, const("scale", D**-0.5, f)], f"ss{layer}")
        if beside:
            s = node("Add", [s, key_bias], f"sk{layer}")
        if form == "bias":
            s = node("Add", [s, bias], f"sb{layer}")
        else:
            s = node("Where", [causal, s, const("fill_m", fill, f)], f"sm{layer}")
        p = node("Softmax", [s], f"p{layer}", axis=-1)
        node("MatMul", [p, v], f"out{layer}")
    outputs = [helper.make_tensor_value_info(f"out{i}", dtype, None) for i in range(2)]
    graph = helper.make_graph(nodes, "decoder", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _feeds(rng: np.random.Generator, seq: int = S) -> dict[str, np.ndarray]:
    f = {"attention_mask": np.ones((B, seq), np.int64)}
    f["attention_mask"][1, :3] = 0  # left padding: rows 0..2 of item 1 see no key
    f["attention_mask"][0, -2:] = 0  # right padding
    for layer in range(2):
        for x in "qkv":
            f[f"{x}{layer}"] = rng.standard_normal((B, H, seq, D)).astype(np.float32)
    return f


def _run(model: onnx.ModelProto, f: dict, **session: object) -> list[np.ndarray]:
    if any(n.domain == spec.DOMAIN for n in model.graph.node):
        return ortflash.InferenceSession(model, **session).run(None, f)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, f)


def _flash_nodes(model: onnx.ModelProto) -> list[dict]:
    return [
        {a.name: helper.get_attribute_value(a) for a in n.attribute}
        for n in model.graph.node
        if n.op_type == spec.OP_TYPE
    ]


def _largest_intermediate(model: onnx.ModelProto, f: dict) -> dict[str, tuple[int, ...]]:
    """The shape of every value the model computes that is not an input, by running it with
    every node output exposed (what ONNX Runtime materialises)."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    names = [o for n in exposed.graph.node for o in n.output if o]
    del exposed.graph.output[:]
    exposed.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in names)
    values = _run(exposed, f)
    return {name: v.shape for name, v in zip(names, values)}


@pytest.mark.parametrize("form", ["bias", "mask"])
@pytest.mark.parametrize("padding", ["unsqueeze", "gathernd", "none"])
@pytest.mark.parametrize("fill", [LOWEST, -np.inf])
def test_causal_mask_is_proved_and_the_square_tensor_is_gone(form, padding, fill):
    model = _decoder(fill=fill, padding=padding, form=form)
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    assert report.fused == 2, [b.reason for b in report.blocks]
    assert all("is_causal=1" in b.reason for b in report.blocks), [b.reason for b in report.blocks]
    attrs = _flash_nodes(fused)
    assert [a["is_causal"] for a in attrs] == [1, 1]
    assert all(a["mask_fill"] == pytest.approx(fill) for a in attrs)
    f = _feeds(np.random.default_rng(0))
    shapes = _largest_intermediate(fused, f)
    square = [name for name, shape in shapes.items() if len(shape) == 4 and shape[-2:] == (S, S)]
    assert not square, square  # no [B, 1, S, S] (nor [1, 1, S, S]) left
    assert not {"LessOrEqual", "GatherND", "Range"} & {n.op_type for n in fused.graph.node}
    want = _run(model, f)
    for mode in ("naive", "online"):
        got = _run(fused, f, softmax=mode, block_size=4)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
            np.testing.assert_allclose(np.nan_to_num(g), np.nan_to_num(w), rtol=1e-5, atol=1e-6)


def _static_batch(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    """model with its batch dim "B" a number (a batch-1 export's [1, S] attention_mask)."""
    for value in [*model.graph.input, *model.graph.output]:
        if value.type.tensor_type.HasField("shape"):
            for dim in value.type.tensor_type.shape.dim:
                if dim.dim_param == "B":
                    dim.dim_value = batch
    return model


@pytest.mark.parametrize("padding", ["unsqueeze", "gathernd"])
def test_a_batch_1_export_reads_its_padding_part_at_batch_0_and_is_proved(padding):
    """attention_mask [1, S]: the padding part reads its static size-1 batch axis at index 0, which is
    the whole axis; proved causal + padding (was refused: "at other than its own indices"), and the
    fused op matches the graph on a left-padded row (rows that see no key included)."""
    model = _static_batch(_decoder(padding=padding), 1)
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    assert [b.mask_kind for b in report.blocks] == ["causal_padding"] * 2, [b.reason for b in report.blocks]
    assert [a["is_causal"] for a in _flash_nodes(fused)] == [1, 1]
    f = {k: x[1:] for k, x in _feeds(np.random.default_rng(4)).items()}  # item 1: three left-padded keys
    assert f["attention_mask"].shape == (1, S) and not f["attention_mask"][0, :3].any()
    want = _run(model, f)
    for mode in ("naive", "online"):
        for g, w in zip(_run(fused, f, softmax=mode, block_size=4), want):
            np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
            np.testing.assert_allclose(np.nan_to_num(g), np.nan_to_num(w), rtol=1e-5, atol=1e-6)


def test_a_padding_part_that_reads_batch_row_0_for_every_item_agrees():
    """attention_mask [2, S] sliced to row 0 and read for both items: whatever the proof says of it, the
    fused model computes the graph's outputs (the rows differ, so reading each item's own row would not)."""
    model = _static_batch(_decoder(padding="unsqueeze"), 2)
    (unsqueeze,) = [n for n in model.graph.node if n.output[0] == "pad"]
    model.graph.initializer.extend(
        helper.make_tensor(name, TensorProto.INT64, [1], [value]) for name, value in (("r0", 0), ("r1", 1))
    )
    at = list(model.graph.node).index(unsqueeze)
    model.graph.node.insert(at, helper.make_node("Slice", ["keep", "r0", "r1", "r0"], ["keep0"]))
    unsqueeze.input[0] = "keep0"  # [1, S]: row 0, broadcast over both items
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    assert report.fused == 2, [b.reason for b in report.blocks]
    f = _feeds(np.random.default_rng(5))
    assert (f["attention_mask"][0] != f["attention_mask"][1]).any()
    for g, w in zip(_run(fused, f), _run(model, f)):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_allclose(np.nan_to_num(g), np.nan_to_num(w), rtol=1e-5, atol=1e-6)


def test_a_unit_source_axis_takes_the_first_free_mask_axis_between_its_neighbours():
    from ortflash.fusion.causal.write import _place_unit_axes

    assert _place_unit_axes([None, 3]) == [0, 3]  # attention_mask [1, S] -> [1, 1, 1, S]
    assert _place_unit_axes([0, None, 3]) == [0, 1, 3]
    assert _place_unit_axes([None, None, 3]) == [0, 1, 3]
    assert _place_unit_axes([None, 0]) is None  # no mask axis before axis 0


NOT_PROVED = {
    "shift": (dict(frontier="shift"), "neither top-left (0) nor bottom-right"),
    "anti_causal": (dict(frontier="ge"), "not one constant"),
    "by_query": (dict(padding="by_query"), "j <= i + c"),
    "finite_fill": (dict(fill=-1e4), "exact only for -inf or fills <= -2**127"),
}


@pytest.mark.parametrize("name", sorted(NOT_PROVED))
def test_masks_that_are_not_causal_keep_their_tensor_and_say_why(name):
    kwargs, reason = NOT_PROVED[name]
    model = _decoder(**kwargs)  # type: ignore[arg-type]
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    assert report.fused == 2
    assert all(reason in b.reason for b in report.blocks), [b.reason for b in report.blocks]
    assert [a["is_causal"] for a in _flash_nodes(fused)] == [0, 0]
    f = _feeds(np.random.default_rng(1))
    for g, w in zip(_run(fused, f), _run(model, f)):
        np.testing.assert_allclose(np.nan_to_num(g), np.nan_to_num(w), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["gpt2_sdpa_torchscript", "llama_sdpa_dynamo"])  # tests/test_zoo.py: all 8
def test_zoo_decoder_prefill_has_no_square_mask_left(name):
    """The exported HF masks (both exporters): is_causal on every block, and at run time no
    [B, 1, S, S] value anywhere in the fused model."""
    model = onnx.load(os.path.join(ZOO, f"{name}.onnx"))
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    assert all(a["is_causal"] == 1 for a in _flash_nodes(fused)), [b.reason for b in report.blocks]
    from ortflash.checks.feeds import make_feeds

    f = make_feeds(model, seq_len=9, batch=2)
    shapes = _largest_intermediate(fused, f)
    assert not [n for n, s in shapes.items() if len(s) == 4 and s[-2:] == (9, 9) and s[1] == 1]


def test_bridge_passes_bias_after_mask_and_bottom_right_causal():
    """bias_after_mask is not declared to the bridge: it reaches the kernel through the
    exact_floats side channel; is_causal=2 is a plain int attribute."""
    attrs = spec.validate({"scale": 0.5, "is_causal": 2, "mask_fill": -100.0, "bias_after_mask": 1})
    declared = {name: attrs[name] for name in spec.DECLARED}
    declared["exact_floats"] = side_channel.SideChannel.of_attributes(attrs).encode()
    assert "bias_after_mask=1" in declared["exact_floats"]
    node = helper.make_node(spec.OP_TYPE, ["q", "k", "v", "bias", "mask"], ["o"], domain=spec.DOMAIN, **declared)
    node.attribute.append(helper.make_attribute("bias_after_mask", 1))  # as the emitter writes it
    io = [helper.make_tensor_value_info(x, TensorProto.FLOAT, None) for x in ("q", "k", "v", "bias")]
    io.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, None))
    graph = helper.make_graph([node], "g", io, [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(spec.DOMAIN, 1)], ir_version=8
    )
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 9, 8)).astype(np.float32)  # Sq > Sk: the first 3 rows see no key
    k, v = (rng.standard_normal((1, 2, 6, 8)).astype(np.float32) for _ in range(2))
    bias = rng.standard_normal((1, 1, 9, 6)).astype(np.float32)
    mask = rng.random((1, 1, 9, 6)) > 0.3
    sess = ort.InferenceSession(model.SerializeToString(), ortflash.session_options())
    got = sess.run(None, {"q": q, "k": k, "v": v, "bias": bias, "mask": mask})[0]
    want = reference.flash_attention(q, k, v, bias, mask, scale=0.5, is_causal=2, mask_fill=-100.0, bias_after_mask=1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    other = reference.flash_attention(q, k, v, bias, mask, scale=0.5, is_causal=2, mask_fill=-100.0)
    assert np.abs(other - want).max() > 0.1  # the side channel is what made it right


def test_a_sliced_causal_buffer_is_read_element_by_element():
    """GPT-2's (and GPT-Neo's) registered tril buffer, sliced to the sequence length, as the mask
    of a Where: the constant is checked to be exactly j <= i, then sliced by the proved length."""
    h = helper
    limit = 16
    buffer = onnx.numpy_helper.from_array(np.tril(np.ones((1, 1, limit, limit), bool)), "buffer")
    zero_bad = np.tril(np.ones((1, 1, limit, limit), bool))
    zero_bad[0, 0, 5, 2] = False  # one element off: not a causal buffer
    inits = [
        buffer,
        onnx.numpy_helper.from_array(zero_bad, "broken"),
        onnx.numpy_helper.from_array(np.array([0, 0], np.int64), "starts"),
        onnx.numpy_helper.from_array(np.array([2, 3], np.int64), "axes"),
        onnx.numpy_helper.from_array(np.array(D**-0.5, np.float32), "scale"),
        onnx.numpy_helper.from_array(np.array(-np.inf, np.float32), "fill"),
    ]

    def model(source: str) -> onnx.ModelProto:
        nodes = [
            h.make_node("Shape", ["q0"], ["len"], start=2, end=3),
            h.make_node("Concat", ["len", "len"], ["ends"], axis=0),
            h.make_node("Slice", [source, "starts", "ends", "axes"], ["causal"]),
            h.make_node("Transpose", ["k0"], ["kt"], perm=[0, 1, 3, 2]),
            h.make_node("MatMul", ["q0", "kt"], ["s"]),
            h.make_node("Mul", ["s", "scale"], ["ss"]),
            h.make_node("Where", ["causal", "ss", "fill"], ["sm"]),
            h.make_node("Softmax", ["sm"], ["p"], axis=-1),
            h.make_node("MatMul", ["p", "v0"], ["out0"]),
        ]
        io = [h.make_tensor_value_info(x, TensorProto.FLOAT, ["B", H, "S", D]) for x in ("q0", "k0", "v0")]
        graph = h.make_graph(nodes, "g", io, [h.make_tensor_value_info("out0", TensorProto.FLOAT, None)], inits)
        m = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
        m.ir_version = 8
        return m

    rng = np.random.default_rng(3)
    f = {x: rng.standard_normal((B, H, 9, D)).astype(np.float32) for x in ("q0", "k0", "v0")}
    for source, proved in (("buffer", True), ("broken", False)):
        original = model(source)
        fused, report = ortflash.optimize(original, softmax="naive", target="ortflash")
        assert report.fused == 1
        assert (_flash_nodes(fused)[0]["is_causal"] == 1) is proved, report.blocks[0].reason
        if proved:
            assert "Slice" not in {n.op_type for n in fused.graph.node}
        np.testing.assert_allclose(_run(fused, f)[0], _run(original, f)[0], rtol=1e-5, atol=1e-6)


def test_the_causal_proof_can_be_switched_off(tmp_path):
    """optimize(prove_causal=False) and the CLI's --no-causal-proof keep the [B, 1, S, S] tensor
    (is_causal 0 on every node, the mask subgraph still there), with the same outputs."""
    from ortflash.cli import main

    model = _decoder()
    on, _ = ortflash.optimize(model, softmax="naive", target="ortflash")
    off, report = ortflash.optimize(model, softmax="naive", prove_causal=False, target="ortflash")
    assert report.fused == 2
    assert [a["is_causal"] for a in _flash_nodes(on)] == [1, 1]
    assert [a["is_causal"] for a in _flash_nodes(off)] == [0, 0]
    assert not any("causal" in b.reason for b in report.blocks), [b.reason for b in report.blocks]
    assert sum(n.op_type == "LessOrEqual" for n in off.graph.node) == 1
    f = _feeds(np.random.default_rng(2))
    for g, w in zip(_run(off, f), _run(model, f)):
        np.testing.assert_allclose(np.nan_to_num(g), np.nan_to_num(w), rtol=1e-5, atol=1e-6)
    src = tmp_path / "decoder.onnx"
    onnx.save(model, src)
    for flag, want in (([], 1), (["--no-causal-proof"], 0)):
        out = tmp_path / f"out{len(flag)}.onnx"
        assert main(["optimize", str(src), "-o", str(out), "--quiet", "--target", "ortflash", *flag]) == 0
        assert [a["is_causal"] for a in _flash_nodes(onnx.load(out))] == [want, want]


def _cached_decoder(padding: str = "gathernd", extra_offset: int = 0, fill: float = LOWEST) -> onnx.ModelProto:
    """Two blocks of a KV-cache decoder, as HF's masking_utils exports them: K and V are
    Concat(past, new); the mask compares j over Range(past + new) with i = Range(new) + past, and
    reads attention_mask [B, T] (its own length symbol T) at (b, j), by GatherND (dynamo) or a
    Gather from its Flatten at b * T + j (TorchScript), or not at all (padding "none").
    extra_offset: i + past + extra_offset."""
    g = Nodes()
    const, node, nodes, inits = g.const, g.node, g.nodes, g.inits

    const("ax0", [0])
    past = node("Squeeze", [node("Shape", ["past_k0"], "shape_p", start=2, end=3), "ax0"], "past")
    new = node("Squeeze", [node("Shape", ["q0"], "shape_s", start=2, end=3), "ax0"], "new")
    total = node("Add", [past, new], "total")
    j = node("Range", [const("zero", 0), total, const("one", 1)], "j")
    kv = node("Unsqueeze", [j, const("ax012", [0, 1, 2])], "kv")  # [1, 1, 1, P + S]
    i = node("Add", [node("Range", ["zero", new, "one"], "ar_new"), past], "i")
    if extra_offset:
        i = node("Add", [i, const("extra", extra_offset)], "i_shifted")
    qi = node("Unsqueeze", [i, const("ax013", [0, 1, 3])], "qi")  # [1, 1, S, 1]
    causal = node("LessOrEqual", [kv, qi], "causal")
    keep = node("Cast", ["attention_mask"], "keep", to=TensorProto.BOOL)
    batch = node("Squeeze", [node("Shape", ["attention_mask"], "shape_b", start=0, end=1), "ax0"], "batch")
    bi = node("Unsqueeze", [node("Range", ["zero", batch, "one"], "br"), const("ax123", [1, 2, 3])], "bi")
    if padding == "gathernd":
        target = node("Shape", [node("Max", [bi, kv], "bkv")], "target")
        b_idx = node("Unsqueeze", [node("Expand", [bi, target], "be"), const("axl", [-1])], "b_idx")
        j_idx = node("Unsqueeze", [node("Expand", [kv, target], "je"), "axl"], "j_idx")
        pad = node("GatherND", [keep, node("Concat", [b_idx, j_idx], "index", axis=-1)], "pad")
    elif padding == "gather":  # TorchScript: Gather(Flatten(keep), b * T + j)
        length = node("Squeeze", [node("Shape", ["attention_mask"], "shape_t", start=1, end=2), "ax0"], "length")
        flat_index = node("Add", [kv, node("Mul", [bi, length], "row")], "flat_index")
        flat = node("Flatten", [keep], "flat", axis=2)
        pad = node("Squeeze", [node("Gather", [flat, flat_index], "picked", axis=0), const("ax4", [4])], "pad")
    both = causal if padding == "none" else node("And", [causal, pad], "both")
    bias = node("Where", [both, const("zero_f", 0.0, np.float32), const("fill", fill, np.float32)], "bias")
    inputs = [helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["B", "T"])]
    for layer in range(2):
        dims = {"q": "S", "past_k": "P", "past_v": "P", "k": "S", "v": "S"}
        inputs += [
            helper.make_tensor_value_info(f"{x}{layer}", TensorProto.FLOAT, ["B", H, s, D]) for x, s in dims.items()
        ]
        k = node("Concat", [f"past_k{layer}", f"k{layer}"], f"all_k{layer}", axis=2)
        v = node("Concat", [f"past_v{layer}", f"v{layer}"], f"all_v{layer}", axis=2)
        s = node("MatMul", [f"q{layer}", node("Transpose", [k], f"kt{layer}", perm=[0, 1, 3, 2])], f"s{layer}")
        s = node("Add", [node("Mul", [s, const("scale", D**-0.5, np.float32)], f"ss{layer}"), bias], f"sb{layer}")
        node("MatMul", [node("Softmax", [s], f"p{layer}", axis=-1), v], f"out{layer}")
    outputs = [helper.make_tensor_value_info(f"out{i}", TensorProto.FLOAT, None) for i in range(2)]
    graph = helper.make_graph(nodes, "cached_decoder", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _cached_feeds(rng: np.random.Generator, past: int, new: int, longer: int = 0) -> dict[str, np.ndarray]:
    """attention_mask [B, past + new + longer]: item 1 left-padded (its first 2 keys masked)."""
    f = {"attention_mask": np.ones((B, past + new + longer), np.int64)}
    f["attention_mask"][1, :2] = 0
    for layer in range(2):
        for x, n in (("q", new), ("past_k", past), ("past_v", past), ("k", new), ("v", new)):
            f[f"{x}{layer}"] = rng.standard_normal((B, H, n, D)).astype(np.float32)
    return f


@pytest.mark.parametrize("padding", ["gathernd", "gather"])
def test_kv_cache_mask_is_proved_bottom_right_causal(padding):
    """j <= i + past, with Sk = past + new read from the K Concat: is_causal=2 and a [B, 1, 1, Sk]
    padding part read from attention_mask, sliced to Sk where the mask is longer (the graph reads
    only that prefix); the same outputs in prefill, decode and a chunk after a cache."""
    model = _cached_decoder(padding)
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    assert report.fused == 2
    assert all("is_causal=2" in b.reason for b in report.blocks), [b.reason for b in report.blocks]
    assert [a["is_causal"] for a in _flash_nodes(fused)] == [2, 2]
    assert not {"LessOrEqual", "GatherND", "Gather"} & {n.op_type for n in fused.graph.node}
    rng = np.random.default_rng(4)
    for past, new, longer in ((0, 7, 0), (6, 1, 0), (5, 4, 0), (5, 4, 3)):
        f = _cached_feeds(rng, past, new, longer)
        if past + new == 7:  # prefill: no [B, 1, S, S] value left
            square = [n for n, s in _largest_intermediate(fused, f).items() if len(s) == 4 and s[-2:] == (7, 7)]
            assert not square, square
        want = _run(model, f)
        for mode in ("naive", "online"):
            for g, w in zip(_run(fused, f, softmax=mode, block_size=4), want):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_kv_cache_mask_with_another_offset_keeps_its_tensor():
    """j <= i + past + 1 is not Sk - Sq: the block keeps its [B, 1, S, P + S] bias and says why."""
    model = _cached_decoder(extra_offset=1)
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    assert report.fused == 2
    assert all("neither top-left (0) nor bottom-right" in b.reason for b in report.blocks), report.blocks[0].reason
    assert [a["is_causal"] for a in _flash_nodes(fused)] == [0, 0]
    f = _cached_feeds(np.random.default_rng(5), 5, 4)
    for g, w in zip(_run(fused, f), _run(model, f)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["llama_cache_sdpa_dynamo", "gpt2_cache_eager_torchscript"])  # tests/test_zoo.py: all
def test_zoo_kv_cache_decoders_are_proved_bottom_right_causal(name):
    """The exported cache masks (dynamo's GatherND, TorchScript's Gather from a Flatten), with
    attention_mask's own length symbol: is_causal=2 on every block, and the same outputs in a
    chunk of 3 new tokens after 5 cached ones."""
    from ortflash.checks.feeds import make_feeds

    model = onnx.load(os.path.join(ZOO, f"{name}.onnx"))
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    assert report.fused == 2
    assert [a["is_causal"] for a in _flash_nodes(fused)] == [2, 2], [b.reason for b in report.blocks]
    f = make_feeds(model, seq_len=3, batch=2, dims={"past": 5, "seq": 3})
    for g, w in zip(_run(fused, f), _run(model, f)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_absorbing_fill_absorbs_scores_below_2_to_102_and_not_all_below_2_to_103():
    """spec.ABSORBING_FILL's bound, in float32: every fill at or below it absorbs |s| < 2**102
    (fill + s == fill); -2**127 itself does not absorb a positive s just above 2**102, since the
    next float32 towards zero is 2**103 away (the bound once written as 2**103 was wrong)."""
    from ortflash.fusion.causal.proof import absorbs_scores

    f32 = np.float32
    fills = np.array([spec.ABSORBING_FILL, np.finfo(np.float32).min, -1.5 * 2.0**127], f32)
    below = np.nextafter(f32(2.0**102), f32(0))
    scores = np.concatenate([np.random.default_rng(0).uniform(-1, 1, 1000) * 2.0**102, [below, -below, 0.0]])
    scores = scores.astype(f32)
    assert np.abs(scores).max() < 2.0**102
    for fill in fills:
        assert ((fill + scores) == fill).all()
    above = np.nextafter(f32(2.0**102), f32(np.inf))
    assert f32(spec.ABSORBING_FILL) + above != f32(spec.ABSORBING_FILL)
    assert f32(spec.ABSORBING_FILL) + f32(1.5 * 2.0**102) != f32(spec.ABSORBING_FILL)  # below 2**103
    assert absorbs_scores(spec.ABSORBING_FILL) and absorbs_scores(-np.inf)
    assert not absorbs_scores(float(np.nextafter(f32(spec.ABSORBING_FILL), f32(0))))
