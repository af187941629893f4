"""Reading a block is pure (issue 32 item 3): the Softmax front end's read never changes the
graph, whether the block is then refused, kept or written; the Einsum rewrites it needs are
performed only when the block is written."""

import os

import onnx
import onnx_ir as ir
import pytest
from attention_graphs import EINSUM_FORMS, Variant, build, einsum_block, keras_einsum_block

import ortflash
from ortflash.errors import NotFused
from ortflash.fusion.softmax import SoftmaxFrontEnd
from ortflash.graph.ir_utils import const_array, default_opset
from ortflash.model_shapes import with_shapes

ZOO = os.path.join(os.path.dirname(__file__), "..", "models")


def _second_keras_block(model: onnx.ModelProto, qk_eq: str) -> onnx.ModelProto:
    """model with a second Keras block over the same Q, K and V, its Q·Kᵀ equation qk_eq."""
    model.graph.node.extend(
        [
            onnx.helper.make_node("Einsum", ["k", "q_s"], ["s0b"], equation=qk_eq),
            onnx.helper.make_node("Softmax", ["s0b"], ["pb"], axis=-1),
            onnx.helper.make_node("Einsum", ["pb", "v"], ["outb"], equation="acbe,aecd->abcd"),
        ]
    )
    model.graph.output.append(onnx.helper.make_tensor_value_info("outb", onnx.TensorProto.FLOAT, None))
    return model


MODELS = {
    **{f"einsum_{form}": (lambda form=form: einsum_block(form)) for form in sorted(EINSUM_FORMS)},
    "keras": keras_einsum_block,
    "keras_query_first": lambda: keras_einsum_block(qk_eq="abcd,aecd->acbe", key_first=False),
    "keras_heads_first_output": lambda: keras_einsum_block(pv_eq="acbe,aecd->acbd"),
    # the P·V Einsum is read (and its rewrite planned), then the Q·Kᵀ Einsum is refused
    "keras_qk_refused": lambda: keras_einsum_block(qk_eq="aecd,abce->acbe"),
    "keras_pv_refused": lambda: keras_einsum_block(pv_eq="acbe,abcd->aecd"),
    "rank3": lambda: build(Variant(rank=3, bias_shapes=(("BH", "S", "T"),))),
    "zoo_bert": lambda: onnx.load(os.path.join(ZOO, "bert_sdpa_dynamo.onnx")),
    "zoo_llama_cache": lambda: onnx.load(os.path.join(ZOO, "llama_cache_eager_torchscript.onnx")),
}


def _uses(graph: ir.Graph) -> dict[int, list[tuple[int, int]]]:
    """Every value's readers, by identity: what a read that changed nothing leaves as it was."""
    values = {id(v): v for n in graph for v in (*n.inputs, *n.outputs) if v is not None}
    values.update({id(v): v for v in graph.inputs})
    return {key: sorted((id(u.node), u.idx) for u in v.uses()) for key, v in values.items()}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_reading_every_softmax_changes_nothing(name):
    model = ir.serde.deserialize_model(with_shapes(MODELS[name]())[0])
    graph = model.graph
    # onnx_ir's get_const_tensor (graph/ir_utils.const_array) names a Constant node's tensor
    # after its output the first time it is read, which the serialized model shows: read every
    # constant once before, so that only what the rules do is compared
    for node in graph:
        if node.op_type == "Constant":
            const_array(node.outputs[0])
    before, uses_before = ir.serde.serialize_model(model).SerializeToString(), _uses(graph)
    front_end = SoftmaxFrontEnd()
    read = refused = 0
    for node in front_end.candidates(graph):
        try:
            block = front_end.read(node, default_opset(MODELS[name]()))
        except NotFused:
            refused += 1
            continue
        read += 1
        front_end.columns(block)  # a kept block is described, and left as it was
    assert read + refused == len(front_end.candidates(graph)) > 0
    assert ir.serde.serialize_model(model).SerializeToString() == before
    assert _uses(graph) == uses_before


def test_a_refused_keras_block_beside_a_fused_one_keeps_its_einsums():
    """The P·V Einsum of the second block is read before its Q·Kᵀ Einsum is refused; the first
    block is fused. The second block's Einsums stay as the input wrote them (the rules used to
    rewrite the P·V Einsum while reading, and leave the rewrite)."""
    model = _second_keras_block(keras_einsum_block(), "aecd,abce->acbe")
    fused, report = ortflash.optimize(model, target="ortflash")
    assert [b.fused for b in report.blocks] == [True, False]
    assert "is not a batched Q·Kᵀ" in report.blocks[1].reason
    einsums = {
        n.output[0]: onnx.helper.get_attribute_value(n.attribute[0]) for n in fused.graph.node if n.op_type == "Einsum"
    }
    assert einsums == {"s0b": b"aecd,abce->acbe", "outb": b"acbe,aecd->abcd"}
    assert [n.name for n in fused.graph.node if n.op_type == "Transpose" and n.name.startswith("outb")] == []


def test_keras_blocks_fused_write_the_planned_rewrites():
    """The rewrites planned while reading are performed when the block is written: Q through its
    Transpose, the P·V output transposed to the written order; the model computes the same."""
    model = _second_keras_block(keras_einsum_block(), "aecd,abcd->acbe")
    fused, report = ortflash.optimize(model, target="ortflash")
    assert report.fused == 2, [b.reason for b in report.blocks]
    names = [n.name for n in fused.graph.node if n.op_type == "Transpose"]
    for scores, out in (("s0", "out"), ("s0b", "outb")):
        assert f"{scores}/Transpose_q" in names and f"{out}/Transpose_to_written" in names
    assert ortflash.verify(model, fused, seq_len=5).ok
