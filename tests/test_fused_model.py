"""The FusedModel between fusion and lowering (issue 32 item 1): fusion hands on the model in
memory, the lowerings prove from the one shape inference of the call (the values fusion wrote typed
node by node) and lower clones, and each candidate is serialized once, when it is written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from attention_graphs import Variant, build
from test_kv_cache import cached_flash_model

from ortflash.model_shapes import with_flash_shapes, with_shapes, with_written_types
from ortflash.op.node import flash_nodes
from ortflash.op.policy import SoftmaxPolicy
from ortflash.pipeline.fused_model import fuse_model, lowered_for
from ortflash.pipeline.optimize import optimize

NO_CHECK = {"load_check": lambda m, r: None}


def _counting(monkeypatch, module, name: str) -> list[int]:
    calls: list[int] = []
    real = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


# a finite fill above float32's lowest: no native op computes it, so under --ep cpu contrib and
# onnx are both tried and passed over before ortflash (three candidates, two lowerings);
# opset 23, so no candidate raises the opset (the raiser runs an inference of its own)
_THREE_CANDIDATES = Variant(where_mask="keep", fill=-1e4, opset=23)


_LOWERABLE = Variant(where_mask="keep", opset=23)


@pytest.mark.parametrize("how", ["ep cpu, three candidates", "contrib", "onnx"])
def test_one_shape_inference_per_call_whatever_the_number_of_candidates(monkeypatch, how):
    """One inference, for the rules; the lowerings read the values fusion wrote typed node by node
    (model_shapes.with_written_types). Before: a second, after fusion, for every lowering together
    (and before that one per lowered candidate, 3 in all under --ep cpu here)."""
    calls = _counting(monkeypatch, onnx.shape_inference, "infer_shapes")
    if how.startswith("ep"):
        _, report = optimize(build(_THREE_CANDIDATES), ep="cpu", seq_lens=[4096], **NO_CHECK)
        assert report.target is not None and report.target.chosen == "ortflash"
        assert len(report.target.tried) == 2
    else:
        _, report = optimize(build(_LOWERABLE), target=how, **NO_CHECK)
        assert report.blocks[0].lowered_to is not None
    assert report.fused == 1
    assert len(calls) == 1


# graphs whose fused blocks write Transposes, Unsqueezes, Casts, Reshapes and Slices before the node
_TYPED_NODE_BY_NODE = {
    "where mask": Variant(where_mask="keep"),
    "bias and mask, opset 23": Variant(where_mask="drop", bias_shapes=(("B", 1, "S", "T"),), opset=23),
    "pretransposed K, mul scale": Variant(k_form="pretransposed", scale_site="mul_scores"),
    "bshd K": Variant(k_form="bshd"),
    "float16, softmax in float32": Variant(dtype=onnx.TensorProto.FLOAT16, softmax_cast=True, where_mask="keep"),
    "rank 3": Variant(rank=3),
    "opset 12": Variant(where_mask="keep", opset=12),
}


@pytest.mark.parametrize("variant", list(_TYPED_NODE_BY_NODE.values()), ids=list(_TYPED_NODE_BY_NODE))
def test_the_values_fusion_wrote_typed_node_by_node_are_what_the_whole_model_inference_gives(variant):
    """Byte for byte the model with_flash_shapes' second inference gives: the lowerings read the
    same types, so they write the same models (the byte check over models/ and tests/data/ too)."""
    fused = _fused(variant)
    assert fused.model is not None and fused.report.shape_inference == "onnx"
    proto = ir.serde.serialize_model(fused.model)
    node_by_node = with_written_types(proto)
    assert node_by_node is not None
    assert len(node_by_node.graph.value_info) > len(proto.graph.value_info)  # the written values typed
    whole = with_flash_shapes(proto)
    assert _bytes(node_by_node) == _bytes(whole)
    assert _bytes(ir.serde.deserialize_model(node_by_node)) == _bytes(fused.typed())


def _bytes(model) -> bytes:
    """The serialized model as the lowerings read it (value_info in the IR's order)."""
    if isinstance(model, onnx.ModelProto):
        model = ir.serde.deserialize_model(model)
    return ir.serde.serialize_model(model).SerializeToString()


def test_a_kv_cache_append_and_an_unnamed_dim_are_left_to_the_whole_model_inference():
    """Where node-by-node types cannot be proved the same, None: a KV-cache append (ONNX Runtime's
    symbolic inference types it) and a written value with a dim nothing names (the whole-model
    inference names it unk__N from its own counter)."""
    cached = cached_flash_model(hq=2, hkv=2, is_causal=1, bias="none")
    assert with_written_types(cached) is None
    # t5's relative-position bias: the Add fusion writes before the node has a dim no type names
    path = Path(__file__).parent.parent / "models" / "t5_eager_torchscript.onnx"
    proto = onnx.load(path)
    fused = fuse_model(proto, with_shapes(proto), SoftmaxPolicy.for_new_nodes(None, None, 64, 0), None)
    assert fused.model is not None and fused.report.fused > 0
    written = ir.serde.serialize_model(fused.model)
    assert with_written_types(written) is None
    whole = {vi.name: vi for vi in with_flash_shapes(written).graph.value_info}
    adds = [n.output[0] for n in written.graph.node if n.op_type == "Add" and n.name.startswith("ortflash/")]
    assert adds and all(any(d.dim_param.startswith("unk__") for d in whole[a].type.tensor_type.shape.dim) for a in adds)


def test_ortflash_s_own_target_runs_no_inference_after_fusion(monkeypatch):
    calls = _counting(monkeypatch, onnx.shape_inference, "infer_shapes")
    _, report = optimize(build(_THREE_CANDIDATES), target="ortflash", **NO_CHECK)
    assert report.fused == 1 and len(calls) == 1


def test_the_fused_model_is_read_back_once_whatever_the_number_of_candidates(monkeypatch):
    """No proto -> ir conversion per candidate: the input once for fusion, the fused model once for
    its typed copy (shared); every candidate lowers a clone. Before: once more per candidate."""
    reads = _counting(monkeypatch, ir.serde, "deserialize_model")
    _, report = optimize(build(_THREE_CANDIDATES), ep="cpu", seq_lens=[4096], **NO_CHECK)
    assert report.target is not None and len(report.target.tried) == 2
    assert len(reads) == 2


def _fused(variant: Variant):
    proto = build(variant)
    return fuse_model(proto, with_shapes(proto), SoftmaxPolicy.for_new_nodes(None, None, 64, 0), None)


@pytest.mark.parametrize("dtype", [onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16], ids=["float32", "float16"])
def test_the_node_writer_types_flash_attention_s_output(dtype):
    """[B, Hq, Sq, Dv] in the node's own element type (float32 between the casts of a float16
    block), in the model in memory, where no shape inference knows the op."""
    fused = _fused(Variant(dtype=dtype, heads=3, head_dim=16))
    assert fused.model is not None
    (node,) = flash_nodes(fused.model.graph)
    out = node.outputs[0]
    assert out.dtype == ir.DataType.FLOAT
    assert out.shape is not None and [str(d) for d in out.shape] == ["B", "3", "S", "16"]


def test_each_candidate_lowers_a_clone_and_the_fused_model_stays_as_fusion_wrote_it():
    fused = _fused(Variant(where_mask="keep"))
    assert fused.model is not None
    before = ir.serde.serialize_model(fused.model).SerializeToString()
    contrib, contrib_report, _ = lowered_for(fused, "contrib")
    onnx_model, onnx_report, _ = lowered_for(fused, "onnx")
    own, own_report, _ = lowered_for(fused, "ortflash")
    assert own is fused.model and contrib is not fused.model and onnx_model is not contrib
    assert contrib_report.blocks[0].lowered_to == "com.microsoft.MultiHeadAttention"
    assert onnx_report.blocks[0].lowered_to == "Attention"
    assert own_report.blocks[0].lowered_to is None and fused.report.blocks[0].lowered_to is None
    assert ir.serde.serialize_model(fused.model).SerializeToString() == before
    assert len(flash_nodes(fused.model.graph)) == 1 and not flash_nodes(contrib.graph)


def test_a_lowered_candidate_computes_what_the_fused_model_does():
    import onnxruntime as ort

    model = build(Variant(where_mask="keep"))
    lowered, report = optimize(model, target="contrib", **NO_CHECK)
    assert report.blocks[0].lowered_to == "com.microsoft.MultiHeadAttention"
    rng = np.random.default_rng(0)
    feeds = {
        "q": rng.standard_normal((2, 2, 5, 32), np.float32),
        "k": rng.standard_normal((2, 2, 7, 32), np.float32),
        "v": rng.standard_normal((2, 2, 7, 32), np.float32),
        "mask": rng.random((2, 1, 1, 7)) > 0.3,
    }
    feeds["mask"][:, :, :, 0] = True
    names = {i.name for i in model.graph.input}
    feeds = {k: v for k, v in feeds.items() if k in names}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert np.abs(want - got).max() < 1e-5
