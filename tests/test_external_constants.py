"""Constants stored as external data (onnx.save(..., save_as_external_data=True, size_threshold=0)):
a scale, a shape or a fill is read from the model's own folder, never against the working directory,
and a weight is never read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from attention_graphs import Variant, build

import ortflash
from ortflash.graph import ir_utils as u


def _save_external(model: onnx.ModelProto, folder, data: str = "a.data") -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = str(folder / "a.onnx")
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=data, size_threshold=0)
    return path


def _scale_operand(graph: ir.Graph) -> ir.Value:
    div = next(n for n in graph if n.op_type == "Div")
    value = div.inputs[1]
    assert value is not None and isinstance(value.const_value, ir.ExternalTensor)
    return value


def _graph_of(path: str) -> ir.Graph:
    """The graph as the pipeline reads it: loaded without its external data, then deserialized."""
    return ir.serde.deserialize_model(onnx.load(path, load_external_data=False)).graph


def test_an_external_scale_is_read_from_the_models_folder(tmp_path, monkeypatch):
    path = _save_external(build(Variant(scale=0.125)), tmp_path / "model")
    monkeypatch.chdir(tmp_path)
    graph = _graph_of(path)
    u.root_external_data(graph, tmp_path / "model")
    assert u.scalar(_scale_operand(graph)) == 8.0


def test_an_external_constant_is_not_read_against_the_working_directory(tmp_path, monkeypatch):
    """deserialize_model leaves base_dir empty, which onnx-ir resolves against the cwd: a file of
    the same name there (here another model's, whose Div constant is 0.5) was read as this model's scale."""
    path = _save_external(build(Variant(scale=0.125)), tmp_path / "model")
    _save_external(build(Variant(scale=2.0)), tmp_path / "elsewhere")
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert u.scalar(_scale_operand(_graph_of(path))) is None


def test_an_external_weight_is_never_read(tmp_path):
    weight = np.ones((u.MAX_EXTERNAL_ELEMENTS + 1,), np.float32)
    small = np.full((u.MAX_EXTERNAL_ELEMENTS,), 3.0, np.float32)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Add", ["w", "s"], ["out"])],
        "weights",
        [],
        [onnx.helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(weight, "w"), onnx.numpy_helper.from_array(small, "s")],
    )
    path = _save_external(onnx.helper.make_model(graph), tmp_path)
    irg = _graph_of(path)
    u.root_external_data(irg, tmp_path)
    assert u.const_array(irg.initializers["w"]) is None
    assert u.const_array(irg.initializers["s"]).tolist() == small.tolist()


def test_a_block_whose_scale_is_external_fuses(tmp_path, monkeypatch):
    path = _save_external(build(Variant(scale=0.125)), tmp_path / "model")
    monkeypatch.chdir(tmp_path)
    _, report = ortflash.optimize(path, target="ortflash")
    assert report.fused == 1, [b.reason for b in report.blocks]


def test_blocks_of_a_model_whose_every_constant_is_external_lower(tmp_path, monkeypatch):
    """The lowering proves head counts from constants (the dynamo export's Reshape shapes): read
    from the model's folder, the blocks of a model saved with size_threshold=0 lower as they do
    inline (2 of 2 for the bundled BERT; 0 when the lowering read no external constant)."""
    source = str(Path(__file__).resolve().parents[1] / "models" / "bert_sdpa_dynamo.onnx")
    _, inline = ortflash.optimize(source, target="contrib")
    path = _save_external(onnx.load(source), tmp_path / "model")  # onnx.save makes the proto's tensors external
    monkeypatch.chdir(tmp_path)
    _, external = ortflash.optimize(path, target="contrib")
    assert [b.lowered_to for b in external.blocks] == [b.lowered_to for b in inline.blocks]
    assert sum(b.lowered_to is not None for b in external.blocks) == 2
