"""A FlashAttention node read back by op/node.py: the attributes with the side channel resolved,
the bridge's neutral placeholders as an absent bias or mask, and one named error for a node
outside the contract, which the lowering passes on word for word (issue 21 item 5)."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

from ortflash.errors import NotLowered
from ortflash.lowering import lower
from ortflash.lowering.read import read_call
from ortflash.op import side_channel, spec
from ortflash.op.node import NodeOutsideContract, is_flash_attention, node_attributes, read_node

# float32's nearest to 1/sqrt(8), more digits than the bridge's 6 (the side channel carries them)
SCALE = float(np.float32(1 / math.sqrt(8)))


def _model(inputs: list[str] | None = None, bias: np.ndarray | None = None, **attrs: object) -> onnx.ModelProto:
    """One FlashAttention node as the emitter writes it: declared attributes, the side channel, and
    the neutral placeholders (bias 0.0, mask True) for what is absent."""
    full = spec.validate({"scale": SCALE, **attrs})
    declared: dict[str, object] = {name: full[name] for name in spec.DECLARED}
    declared["exact_floats"] = side_channel.SideChannel.of_attributes(full).encode()
    names = inputs or ["q", "k", "v", "bias", "mask"]
    node = h.make_node(spec.OP_TYPE, names, ["o"], domain=spec.DOMAIN, name="fa", **declared)
    shape = [1, 2, 4, 8]
    io = [h.make_tensor_value_info(x, TP.FLOAT, shape) for x in ("q", "k", "v")]
    inits = [
        onnx.numpy_helper.from_array(np.array(0.0, np.float32) if bias is None else bias, "bias"),
        onnx.numpy_helper.from_array(np.array(True), "mask"),
    ]
    graph = h.make_graph([node], "g", io, [h.make_tensor_value_info("o", TP.FLOAT, shape)], initializer=inits)
    opsets = [h.make_opsetid("", 17), h.make_opsetid(spec.DOMAIN, spec.DOMAIN_VERSION)]
    return h.make_model(graph, opset_imports=opsets, ir_version=8)


def _ir_node(model: onnx.ModelProto) -> ir.Node:
    return next(n for n in ir.serde.deserialize_model(model).graph if is_flash_attention(n))


def test_attributes_read_the_side_channel_alike_from_both_node_forms():
    model = _model(is_causal=1, window_left=3)
    proto = model.graph.node[0]
    assert "window_left" not in {a.name for a in proto.attribute}  # undeclared: only the side channel has it
    from_proto, from_ir = node_attributes(proto), node_attributes(_ir_node(model))
    assert from_proto == from_ir
    assert from_proto["window_left"] == 3 and from_proto["scale"] == SCALE


def test_read_node_takes_the_placeholders_for_absent():
    call = read_node(_ir_node(_model(is_causal=1, bias_after_mask=1)))
    assert call.bias is None and call.mask is None
    assert call.is_causal == 1 and call.scale == SCALE
    assert not call.bias_after_mask  # after the fills, but with no bias: nothing to move


def test_a_real_bias_is_kept():
    bias = np.full((1, 1, 4, 4), -1.0, np.float32)
    call = read_node(_ir_node(_model(bias=bias, bias_after_mask=1, is_causal=1)))
    assert call.bias is not None and call.bias.name == "bias" and call.bias_after_mask


def test_a_node_outside_the_contract_is_one_named_error_and_the_lowering_note_says_the_same():
    model = _model(inputs=["q", "k", "v", "bias"])
    with pytest.raises(NodeOutsideContract, match=r"^4 inputs, the contract has 5 \(Q, K, V, bias, mask\)$"):
        read_node(_ir_node(model))
    _, notes = lower(model, "contrib")
    assert notes[0].reason.startswith("4 inputs, the contract has 5 (Q, K, V, bias, mask); ")

    bad = _model()
    next(a for a in bad.graph.node[0].attribute if a.name == "masked_rows").s = b"half"
    with pytest.raises(NodeOutsideContract, match="^attributes outside the FlashAttention contract: masked_rows"):
        read_node(_ir_node(bad))
    with pytest.raises(spec.SpecError, match="^masked_rows must be one of"):
        node_attributes(bad.graph.node[0])


def test_the_lowering_adds_the_native_refusals():
    node = _ir_node(_model(scale=-SCALE))
    assert read_node(node).scale == -SCALE  # in the contract
    with pytest.raises(NotLowered, match="is negative: native attention ops take a positive scale"):
        read_call(node)
