"""--target webgpu writes the guard for fully masked rows in as few nodes as the mask allows (issue 31
item 2): none where no row can be fully masked, one Where on the row maximum where the bias has one
absorbing value (transformers' padding mask folded with a causal fill), and one bias and one row
maximum per graph for the blocks that read the same mask at the same lengths. Each form must still
compute what FlashAttention computes, fully masked rows included (CPU EP here; the WebGPU EP in
benchmarks/results/webgpu_outside.md)."""

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from attention_graphs import swap_for_zeros
from onnx import TensorProto as TP
from onnx import helper as h

import ortflash
from ortflash.checks.compare import compare
from ortflash.checks.sessions import run_model
from ortflash.lowering import OP_GQA, OP_MHA, lower
from ortflash.lowering.masked_rows import value_set
from ortflash.op import side_channel, spec

LOWEST = float(np.finfo(np.float32).min)


def _fa_node(inputs, out, name, **attrs):
    node_attrs = spec.validate(attrs)
    node_attrs["exact_floats"] = side_channel.SideChannel.of_attributes(node_attrs).encode()
    for k in spec.SIDE_CHANNEL_INTS:
        node_attrs.pop(k, None)
    return h.make_node(spec.OP_TYPE, inputs, [out], domain=spec.DOMAIN, name=name, **node_attrs)


def padded_model(layers=2, fill=LOWEST, is_causal=1, d=12, masked_rows="nan"):
    """`layers` FlashAttention blocks over q, k, v [B, 4, S, d], each reading one padding bias built
    in the graph from a bool attention mask, Where(am, 0, fill) [B, 1, 1, S], as exporters write it."""
    inputs = [h.make_tensor_value_info(n, TP.FLOAT, ["B", 4, "S", d]) for n in "qkv"]
    inputs.append(h.make_tensor_value_info("am", TP.BOOL, ["B", 1, 1, "S"]))
    inits = [
        onnx.numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        onnx.numpy_helper.from_array(np.array(fill, np.float32), "fill"),
        onnx.numpy_helper.from_array(np.array(True), "no_mask"),
    ]
    nodes = [h.make_node("Where", ["am", "zero", "fill"], ["pad_bias"])]
    outputs = []
    for i in range(layers):
        o = f"o{i}"
        attrs = dict(scale=0.3, is_causal=is_causal, mask_fill=fill, masked_rows=masked_rows)
        nodes.append(_fa_node(["q", "k", "v", "pad_bias", "no_mask"], o, f"fa{i}", **attrs))
        outputs.append(h.make_tensor_value_info(o, TP.FLOAT, ["B", 4, "S", d]))
    graph = h.make_graph(nodes, "padded", inputs, outputs, inits)
    opsets = [h.make_opsetid("", 17), h.make_opsetid(spec.DOMAIN, spec.DOMAIN_VERSION)]
    return h.make_model(graph, opset_imports=opsets, ir_version=8)


def padded_feeds(seed, b=2, s=7, d=12):
    """Item 1 padded on the left over 3 keys: under the causal mask its first 3 rows see no key."""
    rng = np.random.default_rng(seed)
    f = {n: rng.standard_normal((b, 4, s, d)).astype(np.float32) for n in "qkv"}
    am = np.ones((b, 1, 1, s), bool)
    am[1, ..., :3] = False
    f["am"] = am
    return f


def plain_run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def ops(model):
    return [n.op_type for n in model.graph.node]


@pytest.mark.parametrize("fill", [LOWEST, -np.inf])
def test_one_absorbing_value_takes_one_where_and_the_blocks_share_the_bias(fill):
    model = padded_model(fill=fill)
    lowered, notes = lower(model, "webgpu")
    assert [n.op for n in notes] == [OP_MHA, OP_MHA] and all(n.lowered for n in notes)
    written = ops(lowered)
    # one causal bias and one row maximum for both blocks; no ReduceMin, And or IsNaN (the general guard's)
    assert written.count("Range") == 2 and written.count("ReduceMax") == 1, written
    assert {"ReduceMin", "And", "IsNaN", "Greater"}.isdisjoint(written), written
    assert written.count("Where") == 1 + 1 + 2  # the model's own, the causal fold, one guard per block
    assert written.count("ReduceMean") == (2 if fill == LOWEST else 0)
    assert "one absorbing value" in notes[0].reason
    for seed in range(2):
        f = padded_feeds(seed)
        want, got = run_model(model, f), plain_run(lowered, f)
        for name in ("o0", "o1"):
            assert compare(want[name], got[name], name, 1e-4, 1e-5).ok
        if fill == LOWEST:
            np.testing.assert_allclose(
                got["o0"][1, :, :3], np.broadcast_to(f["v"][1].mean(1)[:, None], (4, 3, 12)), rtol=1e-5
            )
        else:
            assert np.isnan(want["o0"][1, :, :3]).all() and np.isnan(got["o0"][1, :, :3]).all()


def test_the_one_value_guard_writes_the_rows_whatever_the_native_op_gives():
    """As test_webgpu_target's swapped-op tests: MultiHeadAttention replaced by zeros, the fully
    masked rows must still be the mean of V and every other row the op's zeros."""
    model = padded_model(layers=1)
    lowered = swap_for_zeros(lower(model, "webgpu")[0])  # MHA -> zeros of its shape
    f = padded_feeds(0)
    got = plain_run(lowered, f)["o0"]  # [B, H, S, D]
    np.testing.assert_allclose(got[1, :, :3], np.broadcast_to(f["v"][1].mean(1)[:, None], (4, 3, 12)), rtol=1e-5)
    assert np.all(got[1, :, 3:] == 0) and np.all(got[0] == 0)


def test_masked_rows_zero_with_neginf_fills_zeros_the_rows():
    model = padded_model(layers=1, fill=-np.inf, masked_rows="zero")
    lowered, (note,) = lower(model, "webgpu")
    assert "IsNaN" not in ops(lowered) and "0 (masked_rows zero)" in note.reason
    f = padded_feeds(1)
    want, got = run_model(model, f)["o0"], plain_run(lowered, f)["o0"]
    assert compare(want, got, "o0", 1e-4, 1e-5).ok and np.all(got[1, :, :3] == 0)


def test_unknown_bias_values_keep_the_general_guard():
    """A bias fed as a graph input may hold anything: the ReduceMax/ReduceMin guard stays."""
    model = padded_model(layers=1)
    g = model.graph
    g.node.remove(g.node[0])
    g.input.append(h.make_tensor_value_info("pad_bias", TP.FLOAT, ["B", 1, 1, "S"]))
    lowered, (note,) = lower(model, "webgpu")
    written = ops(lowered)
    assert "ReduceMin" in written and "mean of V by Where" in note.reason


@pytest.mark.parametrize("d, op", [(8, OP_GQA), (12, OP_MHA)])
def test_causal_only_blocks_need_no_guard(d, op):
    """Sq == Sk, causal, no mask: row i keeps key i, so no guard and no NaN guard for masked_rows
    "zero" (GroupQueryAttention for head size 8, MultiHeadAttention with the causal bias for 12)."""
    inputs = [h.make_tensor_value_info(n, TP.FLOAT, ["B", 4, "S", d]) for n in "qkv"]
    inits = [
        onnx.numpy_helper.from_array(np.array(0.0, np.float32), "no_bias"),
        onnx.numpy_helper.from_array(np.array(True), "no_mask"),
    ]
    node = _fa_node(["q", "k", "v", "no_bias", "no_mask"], "o", "fa", scale=0.3, is_causal=1, masked_rows="zero")
    out = h.make_tensor_value_info("o", TP.FLOAT, ["B", 4, "S", d])
    opsets = [h.make_opsetid("", 17), h.make_opsetid(spec.DOMAIN, spec.DOMAIN_VERSION)]
    model = h.make_model(h.make_graph([node], "c", inputs, [out], inits), opset_imports=opsets, ir_version=8)
    lowered, (note,) = lower(model, "webgpu")
    written = ops(lowered)
    assert note.op == op and {"IsNaN", "ReduceMax", "ReduceMin"}.isdisjoint(written), written
    rng = np.random.default_rng(0)
    f = {n: rng.standard_normal((2, 4, 9, d)).astype(np.float32) for n in "qkv"}
    assert compare(run_model(model, f)["o"], plain_run(lowered, f)["o"], "o", 1e-4, 1e-5).ok


def _value_set_of(nodes, inits, out, inputs=()):
    graph = h.make_graph(nodes, "v", list(inputs), [h.make_tensor_value_info(out, TP.FLOAT, None)], inits)
    model = ir.serde.deserialize_model(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]))
    value = next(o for n in model.graph for o in n.outputs if o.name == out)
    return value_set(value)


def test_value_set_follows_where_casts_and_arithmetic():
    am = h.make_tensor_value_info("am", TP.BOOL, ["B", "S"])
    x = h.make_tensor_value_info("x", TP.FLOAT, ["B", "S"])
    one = onnx.numpy_helper.from_array(np.array(1.0, np.float32), "one")
    low = onnx.numpy_helper.from_array(np.array(LOWEST, np.float32), "low")
    # BERT's (1 - mask) * lowest, the mask a Cast of a bool
    nodes = [
        h.make_node("Cast", ["am"], ["m"], to=TP.FLOAT),
        h.make_node("Sub", ["one", "m"], ["inv"]),
        h.make_node("Mul", ["inv", "low"], ["bias"]),
        h.make_node("Unsqueeze", ["bias", "ax"], ["bias4"]),
    ]
    ax = onnx.numpy_helper.from_array(np.array([1], np.int64), "ax")
    assert _value_set_of(nodes, [one, low, ax], "bias4", [am]) == {0.0, LOWEST}
    assert _value_set_of([h.make_node("Where", ["am", "one", "x"], ["y"])], [one], "y", [am, x]) is None
    # -inf * 0 is NaN: not a known set
    ninf = onnx.numpy_helper.from_array(np.array(-np.inf, np.float32), "ninf")
    nodes = [h.make_node("Cast", ["am"], ["m"], to=TP.FLOAT), h.make_node("Mul", ["m", "ninf"], ["y"])]
    assert _value_set_of(nodes, [ninf], "y", [am]) is None


def test_an_export_lowers_with_the_one_value_guard_and_matches():
    """A real export: GPT-2 (causal + a padding mask built from attention_mask), both blocks share one bias."""
    import os

    from ortflash.checks.feeds import make_feeds

    model = onnx.load(os.path.join(os.path.dirname(__file__), "..", "models", "gpt2_eager_dynamo.onnx"))
    fused, _ = ortflash.optimize(model, target="ortflash")
    lowered, notes = lower(fused, "webgpu")
    assert len(notes) == 2 and all("one absorbing value" in n.reason for n in notes), [n.reason for n in notes]
    assert ops(lowered).count("ReduceMax") == 1
    f = make_feeds(model, seq_len=21, batch=2, seed=0)  # an item padded at the start: fully masked rows
    want, got = plain_run(model, f), plain_run(lowered, f)
    for name in want:
        assert compare(want[name], got[name], name, 1e-4, 1e-5).ok


def test_bias_after_mask_guard_takes_no_and_and_one_row_maximum():
    """GPT-Neo (the bias added after the fills, the masked-mean guard): the guard's row test is
    Where/LessOrEqual, not And (the WebGPU EP runs And on the CPU, behind a GPU->CPU copy), and the
    row maximum is reduced once per block (was twice: the row test's and the masked mean's), so
    ReduceMax is 2 per block (that and key_dead_rows'); right on the padded rows."""
    import os

    from ortflash.checks.feeds import make_feeds

    model = onnx.load(os.path.join(os.path.dirname(__file__), "..", "models", "gpt_neo_eager_dynamo.onnx"))
    fused, _ = ortflash.optimize(model, target="ortflash")
    lowered, notes = lower(fused, "webgpu")
    assert [n.op for n in notes] == [OP_MHA, OP_MHA]
    written, own = ops(lowered), ops(model)
    assert written.count("ReduceMax") == 4 and "ReduceMin" not in written, written
    # the export's own And nodes and one in the window's bias; none in either guard (was 2 more)
    assert written.count("And") == own.count("And") + 1, (written.count("And"), own.count("And"))
    f = make_feeds(model, seq_len=21, batch=2, seed=0)  # an item padded at the start: fully masked rows
    want, got = plain_run(model, f), plain_run(lowered, f)
    for name in want:
        assert compare(want[name], got[name], name, 1e-4, 1e-5).ok
