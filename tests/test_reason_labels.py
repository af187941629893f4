"""A refusal names the node it refused: by name, or by op type and output where the node has none
(exporters and onnx.helper leave node names empty; "Cast  is not between ..." named nothing)."""

from __future__ import annotations

import onnx
import onnx_ir as ir
from attention_graphs import F16, Variant, build

import ortflash
from ortflash.graph import ir_utils as u


def _double_softmax() -> onnx.ModelProto:
    """A float16 block whose scores are cast to float64 for the Softmax, and back: no node is named."""
    model = build(Variant(softmax_cast=True, dtype=F16))
    cast = next(n for n in model.graph.node if n.op_type == "Cast" and n.output[0] == "s32")
    cast.attribute[0].i = onnx.TensorProto.DOUBLE
    assert not any(n.name for n in model.graph.node)
    return model


def test_an_unnamed_cast_is_named_by_its_output():
    _, report = ortflash.optimize(_double_softmax(), target="ortflash")
    assert [b.reason for b in report.blocks] == ["Cast (output p16) is not between float32 and float16"]


def test_label_of_nodes_and_values():
    graph = ir.serde.deserialize_model(_double_softmax()).graph
    cast = next(n for n in graph if n.op_type == "Cast")
    assert u.label(cast) == "Cast (output s32)" and u.label(cast.outputs[0]) == "s32"
    cast.name = "/attn/Cast"
    assert u.label(cast) == "Cast /attn/Cast"
    cast.outputs[0].name = None
    assert u.label(cast.outputs[0]) == "output 0 of Cast /attn/Cast"
    cast.name = None
    assert u.label(cast) == "an unnamed Cast"


def test_the_walker_names_an_unnamed_node_after_the_softmax():
    """The Softmax's output feeds an unnamed Relu: "feeds Relu , not a MatMul" named nothing."""
    model = build(Variant())
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    reader = next(n for n in model.graph.node if softmax.output[0] in n.input)
    relu = onnx.helper.make_node("Relu", [softmax.output[0]], ["p_relu"])
    reader.input[list(reader.input).index(softmax.output[0])] = "p_relu"
    model.graph.node.insert(list(model.graph.node).index(reader), relu)
    _, report = ortflash.optimize(model, target="ortflash")
    assert [b.reason for b in report.blocks] == ["the Softmax output feeds Relu (output p_relu), not a MatMul with V"]
