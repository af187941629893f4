"""The opset pass carries quantized models over to opset 23 (issue 33 item 2): a step of
QuantizeLinear / DequantizeLinear whose new attributes, left at their defaults, keep the old
meaning (block_size 0, output_dtype 0, saturate, precision) carries a node that leaves them so;
a node that sets one, or whose types the new schema does not bind the same way, is refused by
name; Softmax-13's axis is no such step.

Seen before: --target onnx on a model from ONNX Runtime's quantize_dynamic kept every block
("DequantizeLinear ... changed at opset 19 ... in a way ortflash does not convert")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from attention_graphs import F32, initializer, tensor
from onnx import TensorProto, helper

import ortflash
from ortflash.model_io import graphs_of
from ortflash.pipeline.opset import OpsetNotRaised, _Raiser, raise_default_opset
from ortflash.pipeline.opset_table import SAME_MEANING

MODELS = Path(__file__).resolve().parents[1] / "models"
RNG = np.random.default_rng(5)


def qdq_model(
    opset: int, quantize_attrs: dict | None = None, dequantize_attrs: dict | None = None, quantize: bool = True
) -> onnx.ModelProto:
    """x (float32 [2, 4]) -> QuantizeLinear (per tensor, uint8) -> DequantizeLinear -> MatMul with a
    per-column (axis 1) int8 weight's DequantizeLinear: the QDQ shape ONNX Runtime's quantizer writes."""
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="q", **(quantize_attrs or {})),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="dq", **(dequantize_attrs or {})),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], name="dqw", axis=1),
        helper.make_node("MatMul", ["xd", "wd"], ["y"], name="mm"),
    ]
    inits = [
        initializer("xs", 0.02, np.float32),
        initializer("xz", 128, np.uint8),
        initializer("w", RNG.integers(-127, 128, (4, 3)), np.int8),
        initializer("ws", [0.01, 0.02, 0.03], np.float32),
        initializer("wz", [0, 0, 0], np.int8),
    ]
    inputs = [tensor("x", [2, 4])]
    if not quantize:  # the activations come quantized: DequantizeLinear nodes only
        del nodes[0]
        inputs = [tensor("xq", [2, 4], TensorProto.UINT8)]
    graph = helper.make_graph(nodes, "qdq", inputs, [helper.make_tensor_value_info("y", F32, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


@pytest.mark.parametrize("opset", [13, 17, 19, 21])
def test_a_dequantizing_model_is_raised_to_23_unchanged_and_computes_the_same(opset: int) -> None:
    model = qdq_model(opset, quantize=False)
    raised = raise_default_opset(model, 23)
    assert next(i.version for i in raised.opset_import if i.domain == "") == 23
    # carried over node for node: no attribute added, none rewritten
    assert [(n.op_type, list(n.input), list(n.attribute)) for n in raised.graph.node] == [
        (n.op_type, list(n.input), list(n.attribute)) for n in model.graph.node
    ]
    x = RNG.integers(0, 256, (2, 4)).astype(np.uint8)
    np.testing.assert_array_equal(run(raised, x), run(model, x))


def test_quantize_linear_stays_below_21() -> None:
    # its defaults keep the meaning, but ONNX Runtime's QDQ optimizer cannot load such models at 23
    with pytest.raises(OpsetNotRaised, match=r"QuantizeLinear \(node 'q'\) changed at opset 21 .*block_size"):
        raise_default_opset(qdq_model(19), 23)
    assert next(i.version for i in raise_default_opset(qdq_model(13), 19).opset_import if i.domain == "") == 19


def test_a_new_attribute_at_its_default_carries_over() -> None:
    raised = raise_default_opset(qdq_model(19, dequantize_attrs={"block_size": 0}, quantize=False), 23)
    assert [a.name for a in raised.graph.node[0].attribute] == ["block_size"]


@pytest.mark.parametrize(
    ("quantize", "dequantize", "message"),
    [
        (
            {},
            {"block_size": 2},
            r"DequantizeLinear \(node 'dq'\) changed at opset 21 .*sets the new attribute block_size \(2\)",
        ),
        ({"output_dtype": TensorProto.INT8}, {}, r"QuantizeLinear \(node 'q'\) changed at opset 21 .*attribute"),
        (
            {},
            {"output_dtype": TensorProto.FLOAT16},
            r"DequantizeLinear \(node 'dq'\) changed at opset 23 .*output_dtype",
        ),
    ],
)
def test_a_node_setting_a_new_attribute_away_from_its_default_is_refused_by_name(
    quantize: dict, dequantize: dict, message: str
) -> None:
    with pytest.raises(OpsetNotRaised, match=message):
        raise_default_opset(qdq_model(19, quantize, dequantize, quantize=bool(quantize)), 23)


def test_a_quantizer_whose_scale_type_opset_19_binds_to_x_differently_is_refused() -> None:
    # QuantizeLinear-13 takes an int32 x with a float scale; at 19 the scale has x's type.
    node = helper.make_node("QuantizeLinear", ["n", "s"], ["y"], name="q_int")
    graph = helper.make_graph(
        [node],
        "q",
        [tensor("n", [3], TensorProto.INT32)],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        [initializer("s", 0.5, np.float32)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    with pytest.raises(OpsetNotRaised, match=r"QuantizeLinear \(node 'q_int'\) changed at opset 19 .*one type"):
        raise_default_opset(model, 23)


def test_softmax_13_is_no_same_meaning_step_and_is_not_carried_as_it_is() -> None:
    assert not [step for step in SAME_MEANING if step[0] in ("Softmax", "LogSoftmax", "Hardmax")]
    old, new = onnx.defs.get_schema("Softmax", 11), onnx.defs.get_schema("Softmax", 13)
    node = helper.make_node("Softmax", ["x"], ["y"], axis=1)
    raiser = _Raiser(qdq_model(11), 23)
    assert raiser._step_misfit(node, old, new, SAME_MEANING.get(("Softmax", 13))) == "its attribute axis changes"
    # the pass writes the old reading out (flatten from axis 1 on), never the node unchanged
    graph = helper.make_graph([node], "s", [tensor("x", [2, 3, 4])], [helper.make_tensor_value_info("y", F32, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7)
    raised = raise_default_opset(model, 23)
    assert [n.op_type for n in raised.graph.node] == ["Flatten", "Shape", "Softmax", "Reshape"]
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(run(raised, x), run(model, x), rtol=1e-6)


def test_a_dynamically_quantized_bert_lowers_to_attention_23_loads_and_verifies(tmp_path: Path) -> None:
    from onnxruntime.quantization import quantize_dynamic

    quantized = tmp_path / "bert_int8.onnx"
    quantize_dynamic(MODELS / "bert_eager_torchscript.onnx", quantized)
    assert "DequantizeLinear" in {n.op_type for n in onnx.load(quantized).graph.node}
    model, report = ortflash.optimize(quantized, target="onnx")
    op_types = [n.op_type for g in graphs_of(model.graph) for n in g.node]
    assert op_types.count("Attention") == 2 and "FlashAttention" not in op_types
    assert report.fused == 2, [b.reason for b in report.blocks]
    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])  # without ortflash
    assert ortflash.verify(quantized, model).ok
