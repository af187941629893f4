"""Raising the default-domain opset op by op (ortflash/pipeline/opset.py, issue 22 item 4): blocks
of models onnx.version_converter cannot convert (ONNX Runtime's LayerNormalization below opset
17, com.microsoft nodes without their domain imported, ops without an ONNX schema) lower to
Attention-23 under --target onnx and verify; each changed op is carried over to what ONNX Runtime
computes the same; an op that cannot be carried over is refused with its name."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from attention_graphs import F32, initializer, projected_block, tensor
from onnx import TensorProto, helper

import ortflash
from ortflash.op import spec
from ortflash.pipeline.opset import OpsetNotRaised, raise_default_opset

WIDTH = 32  # projected_block's heads · head_dim


def all_op_types(model: onnx.ModelProto) -> list[str]:
    def of(graph: onnx.GraphProto) -> list[str]:
        types = []
        for node in graph.node:
            types.append(node.op_type)
            for attr in node.attribute:
                for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                    types += of(sub)
        return types

    return of(model.graph)


def default_opset(model: onnx.ModelProto) -> int:
    return next(i.version for i in model.opset_import if i.domain == "")


def lowered_to_attention_and_verified(model: onnx.ModelProto) -> onnx.ModelProto:
    """optimize --target onnx: every block is Attention-23 and the model matches the original."""
    out, report = ortflash.optimize(model, target="onnx")
    assert report.fused == 1, [b.reason for b in report.blocks]
    assert spec.OP_TYPE not in all_op_types(out), [b.reason for b in report.blocks]
    assert all_op_types(out).count("Attention") == 1
    assert default_opset(out) == 23
    result = ortflash.verify(model, out, seq_len=5)
    assert result.ok, result.outputs
    return out


def with_upstream(
    opset: int, nodes: list, inputs: list | None = None, inits: list | None = None, domains=()
) -> onnx.ModelProto:
    """projected_block's attention over x, where x = nodes(x_in, ...)."""
    model = projected_block("Identity", opset=opset)
    model.graph.node[0].input[0] = "x_up"
    model.graph.input[0].name = "x_in"
    model.graph.node.insert(0, helper.make_node("Identity", ["x_top"], ["x_up"]))
    for node in reversed(nodes):
        model.graph.node.insert(0, node)
    model.graph.input.extend(inputs or [])
    model.graph.initializer.extend(inits or [])
    model.opset_import.extend(helper.make_opsetid(d, 1) for d in domains)
    return model


def run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})


def assert_same_in_ort(model: onnx.ModelProto, raised: onnx.ModelProto, feeds: dict) -> None:
    assert default_opset(raised) == 23 and default_opset(model) < 23
    want, got = run(model, feeds), run(raised, feeds)
    assert len(want) == len(got)
    for w, g in zip(want, got):
        assert w.shape == g.shape
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


def one_op_model(opset: int, nodes: list, inputs: list, outputs: list, inits: list | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "one_op", inputs, outputs, inits or [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=7)


RNG = np.random.default_rng(3)


# ---------------------------------------------------------------- through optimize --target onnx


@pytest.mark.parametrize("opset", [12, 16, 17])
def test_bert_block_with_layer_normalization_lowers_to_attention_23(opset):
    # Below 17, LayerNormalization is ONNX Runtime's own (ONNX domain, since 1), which
    # onnx.version_converter has no adapter for: today the block stays FlashAttention at 12 and 16.
    out = lowered_to_attention_and_verified(projected_block("LayerNormalization", opset=opset))
    assert "LayerNormalization" in all_op_types(out)


@pytest.mark.parametrize("imported", [True, False])
def test_skip_layer_normalization_is_left_alone(imported):
    # ONNX Runtime runs com.microsoft nodes without the domain imported; the converter refused them.
    model = projected_block("SkipLayerNormalization", opset=12)
    if not imported:
        del model.opset_import[1]
    out = lowered_to_attention_and_verified(model)
    assert "SkipLayerNormalization" in all_op_types(out)
    assert {i.domain: i.version for i in out.opset_import}.get("com.microsoft") == (1 if imported else None)


def test_an_op_only_onnx_runtime_has_a_schema_for_carries_over():
    # SimplifiedLayerNormalization (RMSNorm) is registered by ONNX Runtime in the ONNX domain at
    # version 1 only: the same op at 14 and at 23. The converter: "Op has no registered schema".
    nodes = [helper.make_node("SimplifiedLayerNormalization", ["x_in", "g"], ["x_top"], axis=-1, epsilon=1e-5)]
    model = with_upstream(14, nodes, inits=[initializer("g", RNG.uniform(0.5, 1.5, WIDTH), np.float32)])
    lowered_to_attention_and_verified(model)


def test_axes_and_split_attributes_and_an_if_branch_lower_at_opset_12():
    # Squeeze/Unsqueeze/Split (13) and ReduceMean (18) with attributes, one If branch reducing with
    # ReduceSum's axes attribute (13) and Softmax over a middle axis (13): all rewritten.
    then_nodes = [
        helper.make_node("ReduceSum", ["x_c"], ["t_sum"], axes=[1], keepdims=1),
        helper.make_node("Softmax", ["x_c"], ["t_p"], axis=1),
        helper.make_node("Mul", ["t_p", "t_sum"], ["t_out"]),
    ]
    then_branch = helper.make_graph(then_nodes, "then", [], [tensor("t_out", ["B", "S", WIDTH])])
    else_branch = helper.make_graph(
        [
            helper.make_node("Unsqueeze", ["x_c"], ["e_u"], axes=[0]),
            helper.make_node("Squeeze", ["e_u"], ["e_out"], axes=[0]),
        ],
        "else",
        [],
        [tensor("e_out", ["B", "S", WIDTH])],
    )
    nodes = [
        helper.make_node("Unsqueeze", ["x_in"], ["x_u"], axes=[1]),
        helper.make_node("Squeeze", ["x_u"], ["x_s"], axes=[1]),
        helper.make_node("Split", ["x_s"], ["x_a", "x_b"], axis=2, split=[WIDTH // 4, 3 * WIDTH // 4]),
        helper.make_node("Concat", ["x_b", "x_a"], ["x_cat"], axis=2),
        helper.make_node("ReduceMean", ["x_cat"], ["x_mean"], axes=[-1], keepdims=1),
        helper.make_node("Sub", ["x_cat", "x_mean"], ["x_c"]),
        helper.make_node("ReduceMax", ["x_in"], ["x_max"], keepdims=0),
        helper.make_node("Greater", ["x_max", "zero"], ["cond"]),
        helper.make_node("If", ["cond"], ["x_top"], then_branch=then_branch, else_branch=else_branch),
    ]
    model = with_upstream(12, nodes, inits=[initializer("zero", 0.0, np.float32)])
    out = lowered_to_attention_and_verified(model)
    types = all_op_types(out)
    assert types.count("Flatten") == 1 and {"Squeeze", "Unsqueeze", "Split", "ReduceMean", "ReduceSum"} <= set(types)


def test_an_op_that_cannot_be_carried_over_keeps_the_block_with_its_name():
    # Resize-10 -> 11 changes its inputs (roi) and coordinate modes: not converted, so the block keeps
    # its original ops (a named portable target never leaves a FlashAttention node: issue 33 item 1).
    nodes = [helper.make_node("Resize", ["x_in", "ones"], ["x_top"], name="upsample_0", mode="nearest")]
    model = with_upstream(10, nodes, inits=[initializer("ones", [1.0, 1.0, 1.0], np.float32)])
    out, report = ortflash.optimize(model, target="onnx")
    assert report.fused == 0 and all_op_types(out).count(spec.OP_TYPE) == 0 and "Softmax" in all_op_types(out)
    assert "Resize (node 'upsample_0') changed at opset 11" in report.blocks[0].reason, report.blocks[0].reason
    assert default_opset(out) == 10


# ---------------------------------------------------------------- op by op, in ONNX Runtime


def test_untouched_ops_carry_over_as_they_are_and_other_domains_stay():
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y0"]),
        helper.make_node("Erf", ["y0"], ["y1"]),
        helper.make_node("FastGelu", ["y1"], ["y"], domain="com.microsoft"),
    ]
    model = one_op_model(
        11,
        nodes,
        [tensor("x", [2, 3, 4])],
        [tensor("y", [2, 3, 4])],
        [initializer("w", RNG.standard_normal((4, 4)), np.float32)],
    )
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    raised = raise_default_opset(model, 23)
    assert [n.op_type for n in raised.graph.node] == ["MatMul", "Erf", "FastGelu"]
    for before, after in zip(model.graph.node, raised.graph.node):
        assert before == after
    assert {i.domain: i.version for i in raised.opset_import} == {"": 23, "com.microsoft": 1}
    assert_same_in_ort(model, raised, {"x": RNG.standard_normal((2, 3, 4)).astype(np.float32)})


@pytest.mark.parametrize(
    ("axis", "rank_known"), [(-1, False), (2, True), (1, True), (1, False), (0, True), (-2, False)]
)
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
def test_softmax_axis_before_13_is_kept_exactly(op, axis, rank_known):
    x = tensor("x", [2, 3, 4] if rank_known else None)
    if not rank_known:
        x.type.tensor_type.ClearField("shape")
    model = one_op_model(
        12, [helper.make_node(op, ["x"], ["y"], axis=axis)], [x], [helper.make_tensor_value_info("y", F32, None)]
    )
    raised = raise_default_opset(model, 23)
    reshaped = not (axis == -1 or (rank_known and axis == 2))
    assert [n.op_type for n in raised.graph.node] == (["Flatten", "Shape", op, "Reshape"] if reshaped else [op])
    data = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    assert_same_in_ort(model, raised, {"x": data})
    # the flattened reading is what the old op meant: softmax over the dims from axis on, jointly
    if op == "Softmax" and axis == 1:
        flat = data.reshape(2, 12)
        expected = np.exp(flat - flat.max(1, keepdims=True))
        np.testing.assert_allclose(
            run(raised, {"x": data})[0], (expected / expected.sum(1, keepdims=True)).reshape(2, 3, 4), rtol=1e-5
        )


def test_reduce_axes_attributes_become_inputs():
    ops = [("ReduceSum", [1]), ("ReduceMean", [-1, 0]), ("ReduceMax", None), ("ReduceL2", [2]), ("ReduceProd", [0])]
    nodes = [
        helper.make_node(op, ["x"], [f"y{i}"], **({"axes": axes} if axes else {}), keepdims=i % 2)
        for i, (op, axes) in enumerate(ops)
    ]
    outputs = [helper.make_tensor_value_info(f"y{i}", F32, None) for i in range(len(ops))]
    model = one_op_model(12, nodes, [tensor("x", [2, 3, 4])], outputs)
    raised = raise_default_opset(model, 23)
    assert [n.op_type for n in raised.graph.node].count("Constant") == 4
    assert all(
        not n.attribute or {a.name for a in n.attribute} == {"keepdims"}
        for n in raised.graph.node
        if n.op_type.startswith("Reduce")
    )
    assert_same_in_ort(model, raised, {"x": RNG.standard_normal((2, 3, 4)).astype(np.float32)})


def test_split_with_and_without_sizes_and_squeeze_without_axes_at_opset_11():
    nodes = [
        helper.make_node("Split", ["x"], ["a", "b"], axis=1, split=[1, 3]),
        helper.make_node("Split", ["x"], ["c", "d"], axis=2),
        helper.make_node("Squeeze", ["a"], ["e"]),
        helper.make_node("Unsqueeze", ["e"], ["f"], axes=[0, -1]),
    ]
    outputs = [helper.make_tensor_value_info(n, F32, None) for n in ("b", "c", "d", "f")]
    model = one_op_model(11, nodes, [tensor("x", [1, 4, 6])], outputs)
    raised = raise_default_opset(model, 23)
    equal_split = raised.graph.node[[n.output[0] for n in raised.graph.node].index("c")]
    assert [(a.name, a.i) for a in equal_split.attribute if a.name == "num_outputs"] == [("num_outputs", 2)]
    assert_same_in_ort(model, raised, {"x": RNG.standard_normal((1, 4, 6)).astype(np.float32)})


def test_clip_pad_and_dropout_attributes_of_opset_10():
    nodes = [
        helper.make_node("Clip", ["x"], ["c0"], min=-0.5, max=0.75),
        helper.make_node("Clip", ["x"], ["c1"]),  # the float32 extremes: infinities are clamped
        helper.make_node("Pad", ["x"], ["p"], pads=[0, 1, 0, 2], value=1.5),
        helper.make_node("Pad", ["x"], ["q"], pads=[1, 0, 1, 0], mode="reflect"),
        helper.make_node("Dropout", ["x"], ["dr"], ratio=0.3),
    ]
    outputs = [helper.make_tensor_value_info(n, F32, None) for n in ("c0", "c1", "p", "q", "dr")]
    model = one_op_model(10, nodes, [tensor("x", [3, 4])], outputs)
    raised = raise_default_opset(model, 23)
    data = RNG.standard_normal((3, 4)).astype(np.float32)
    data[0, 0], data[1, 1] = np.inf, -np.inf
    assert_same_in_ort(model, raised, {"x": data})
    assert run(raised, {"x": data})[1][0, 0] == np.finfo(np.float32).max


def test_an_if_branch_reading_outer_values_is_raised_too():
    then_branch = helper.make_graph(
        [helper.make_node("Unsqueeze", ["x"], ["t"], axes=[0])], "then", [], [tensor("t", [1, 2, 3])]
    )
    else_branch = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["x"], ["e0"], axes=[0], keepdims=1),
            helper.make_node("Unsqueeze", ["e0"], ["e"], axes=[0]),
        ],
        "else",
        [],
        [tensor("e", [1, 1, 3])],
    )
    node = helper.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch)
    model = one_op_model(
        11,
        [node],
        [tensor("x", [2, 3]), tensor("cond", [], TensorProto.BOOL)],
        [helper.make_tensor_value_info("y", F32, None)],
    )
    raised = raise_default_opset(model, 23)
    branches = {a.name: a.g for a in raised.graph.node[0].attribute}
    assert [n.op_type for n in branches["then_branch"].node] == ["Constant", "Unsqueeze"]
    assert [n.op_type for n in branches["else_branch"].node] == ["Constant", "ReduceSum", "Constant", "Unsqueeze"]
    for cond in (True, False):
        assert_same_in_ort(model, raised, {"x": RNG.standard_normal((2, 3)).astype(np.float32), "cond": np.array(cond)})


def test_layer_normalization_of_mixed_types_is_refused():
    # ONNX Runtime's LayerNormalization-1 takes a float32 scale over float16 X; 17 does not.
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], name="ln")]
    inits = [initializer("g", np.ones(4), np.float32), initializer("b", np.zeros(4), np.float32)]
    model = one_op_model(
        16, nodes, [tensor("x", [2, 4], TensorProto.FLOAT16)], [tensor("y", [2, 4], TensorProto.FLOAT16)], inits
    )
    with pytest.raises(OpsetNotRaised, match=r"LayerNormalization \(node 'ln'\).*mixed"):
        raise_default_opset(model, 23)


@pytest.mark.parametrize(
    ("node", "opset", "message"),
    [
        (helper.make_node("Upsample", ["x", "s"], ["y"], name="up"), 9, r"Upsample \(node 'up'\) changed at opset 10"),
        (helper.make_node("Mystery", ["x"], ["y"]), 17, r"Mystery has no schema at opset 17"),
        (helper.make_node("Erf", ["n"], ["y"], name="int_erf"), 11, r"Erf \(node 'int_erf'\) changed at opset 13"),
    ],
)
def test_ops_that_cannot_be_carried_over_are_refused_by_name(node, opset, message):
    inputs = [tensor("x", [1, 1, 2, 2]), tensor("n", [2], TensorProto.INT32)]
    model = one_op_model(
        opset,
        [node],
        inputs,
        [helper.make_tensor_value_info("y", F32, None)],
        [initializer("s", [1.0, 1.0, 2.0, 2.0], np.float32)],
    )
    with pytest.raises(OpsetNotRaised, match=message):
        raise_default_opset(model, 23)


def test_a_model_at_the_target_or_above_comes_back_unchanged():
    model = projected_block("LayerNormalization", opset=23)
    assert raise_default_opset(model, 23) is model


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_11_carries_over_and_its_tf_half_pixel_for_nn_is_refused(mode):
    node = helper.make_node(
        "Resize", ["x", "roi", "scales"], ["y"], mode=mode, coordinate_transformation_mode="half_pixel"
    )
    inits = [initializer("roi", np.zeros(0), np.float32), initializer("scales", [1.0, 1.0, 2.0, 1.5], np.float32)]
    model = one_op_model(
        11, [node], [tensor("x", [1, 2, 3, 4])], [helper.make_tensor_value_info("y", F32, None)], inits
    )
    raised = raise_default_opset(model, 23)
    assert [n.op_type for n in raised.graph.node] == ["Resize"]
    assert_same_in_ort(model, raised, {"x": RNG.standard_normal((1, 2, 3, 4)).astype(np.float32)})
    next(
        a for a in model.graph.node[0].attribute if a.name == "coordinate_transformation_mode"
    ).s = b"tf_half_pixel_for_nn"
    with pytest.raises(OpsetNotRaised, match="tf_half_pixel_for_nn"):
        raise_default_opset(model, 23)
