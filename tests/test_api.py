"""Issue 15: the public checking API (ortflash.verify / validate / make_feeds) on good and broken models."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from attention_graphs import Variant, build, tamper_scale

import ortflash
from ortflash import OrtflashError

VARIANT = Variant(bias_shapes=(("B", 1, 1, "T"),), nan_guard=True)


@pytest.fixture(scope="module")
def original() -> onnx.ModelProto:
    return build(VARIANT)


@pytest.fixture(scope="module")
def fused(original: onnx.ModelProto) -> onnx.ModelProto:
    model, report = ortflash.optimize(original, softmax="auto", block_size=8, min_seq_len=16, target="ortflash")
    assert report.fused == 1
    return model


def test_the_api_is_exported():
    for name in ("verify", "validate", "make_feeds", "VerifyResult", "ValidateResult", "OutputDiff", "NodeCheck"):
        assert name in ortflash.__all__ and hasattr(ortflash, name)


@pytest.mark.parametrize("form", ["path", "proto", "ir"])
def test_verify_takes_a_path_a_proto_or_an_ir_model(tmp_path, original, fused, form):
    paths = {"original": str(tmp_path / "a.onnx"), "fused": str(tmp_path / "a.flash.onnx")}
    onnx.save(original, paths["original"])
    onnx.save(fused, paths["fused"])
    as_form = {
        "path": lambda m, key: paths[key],
        "proto": lambda m, key: m,
        "ir": lambda m, key: ir.serde.deserialize_model(m),
    }[form]
    result = ortflash.verify(as_form(original, "original"), as_form(fused, "fused"), seq_len=9)
    assert isinstance(result, ortflash.VerifyResult)
    assert result.ok and (result.rtol, result.atol) == (1e-4, 1e-5)
    # an auto node runs naive at 9 keys, then online where verify reruns at its min_seq_len (16)
    assert result.softmax_modes == {"naive", "online"}
    assert [run.inputs["q"][2] for run in result.runs] == [9, 16]
    assert set(result.outputs) == {"out"} and result.outputs["out"].max_abs < 1e-5


def test_verify_on_given_feeds_keeps_them_and_says_what_it_forced(original, fused):
    feeds = ortflash.make_feeds(original, seq_len=5, batch=1)
    result = ortflash.verify(original, fused, feeds)
    assert result.ok
    assert all(run.inputs["q"] == list(feeds["q"].shape) for run in result.runs)
    assert len(result.runs) == 2 and "online softmax forced" in result.notes[0]


def test_verify_fails_on_a_tampered_scale_and_points_at_the_worst_element(original, fused):
    broken = tamper_scale(onnx.ModelProto.FromString(fused.SerializeToString()), 1.5)
    result = ortflash.verify(original, broken)
    assert not result.ok
    diff = result.outputs["out"]
    assert diff.of_tolerance > 1 and diff.max_abs > 1e-3
    assert diff.worst_index is not None and len(diff.worst_index) == 4
    # the worst element is the one furthest outside the tolerance, err / (atol + rtol |expected|)
    allowed = result.atol + result.rtol * abs(diff.worst_expected)
    assert abs(diff.worst_actual - diff.worst_expected) / allowed == pytest.approx(diff.of_tolerance, rel=1e-3)
    assert result.to_dict()["ok"] is False


def test_verify_of_a_file_onnx_runtime_cannot_load_is_an_error(tmp_path, original, fused):
    broken = onnx.ModelProto.FromString(fused.SerializeToString())
    node = next(n for n in broken.graph.node if n.op_type == "FlashAttention")
    del node.input[3:]  # the bridge takes exactly five inputs
    with pytest.raises(OrtflashError, match="could not load the optimized model"):
        ortflash.verify(original, broken)
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model")
    with pytest.raises(OrtflashError, match="not a readable ONNX model"):
        ortflash.verify(original, str(garbage))


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_validate_checks_each_node_and_fails_on_a_tampered_scale(original, fused, backend):
    good = ortflash.validate(original, fused, backend=backend)
    assert isinstance(good, ortflash.ValidateResult)
    assert good.ok and len(good.nodes) == 1 and good.nodes[0].max_abs < 1e-5 and good.backend == backend
    broken = tamper_scale(onnx.ModelProto.FromString(fused.SerializeToString()), 1.5)
    bad = ortflash.validate(original, broken, backend=backend)
    assert not bad.ok and bad.nodes[0].of_tolerance > 1


def test_validate_optimizes_when_no_optimized_model_is_given(original):
    result = ortflash.validate(original, seq_len=7, batch=1)
    assert result.ok and len(result.nodes) == 1 and "Q[1, 2, 7, " in result.nodes[0].shapes


def test_make_feeds_takes_any_model_form_and_named_dims(tmp_path, original):
    path = tmp_path / "a.onnx"
    onnx.save(original, str(path))
    by_path = ortflash.make_feeds(str(path), dims={"S": 3, "T": 5}, batch=1)
    by_ir = ortflash.make_feeds(ir.serde.deserialize_model(original), dims={"S": 3, "T": 5}, batch=1)
    assert by_path["q"].shape[2] == 3 and by_path["k"].shape[2] == 5 and by_path["q"].shape[0] == 1
    assert all(np.array_equal(by_path[k], by_ir[k]) for k in by_path)


def test_make_feeds_reads_a_name_only_at_axis_0_as_the_batch():
    """Paddle2ONNX names an image batch "DynamicDimension.0": it is the batch (2), not a length (16)."""
    x = onnx.helper.make_tensor_value_info(
        "x", onnx.TensorProto.FLOAT, ["DynamicDimension.0", 3, 48, "DynamicDimension.1"]
    )
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "ocr", [x], [y])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    assert ortflash.make_feeds(model)["x"].shape == (2, 3, 48, 16)
    assert ortflash.make_feeds(model, dims={"DynamicDimension.1": 320}, batch=1)["x"].shape == (1, 3, 48, 320)
    assert ortflash.make_feeds(model, dims={"DynamicDimension.0": 3})["x"].shape == (3, 3, 48, 16)


def test_validate_and_make_feeds_of_an_unloadable_file_are_errors(tmp_path, original):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x08\x07not a model")
    with pytest.raises(OrtflashError, match="not a readable ONNX model"):
        ortflash.validate(str(garbage))
    with pytest.raises(OrtflashError, match="not a readable ONNX model"):
        ortflash.validate(original, str(garbage))
    with pytest.raises(OrtflashError, match="no such file"):
        ortflash.make_feeds(str(tmp_path / "missing.onnx"))


def test_validate_of_a_model_whose_block_no_longer_fuses_checks_no_node():
    result = ortflash.validate(build(Variant(softmax_axis=2)))
    assert result.nodes == () and result.ok
