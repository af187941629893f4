"""Issue 25 item 1: FuseAttention and Lower as onnx_ir passes, alone, in a PassManager, and after
onnxscript's optimizer; their modified flag, their report, and models with external weights."""

from __future__ import annotations

import json
import os

import onnx
import onnx_ir as ir
import onnxscript.optimizer
import pytest
from attention_graphs import Variant, build

import ortflash
from ortflash.op import spec
from ortflash.passes import LOWERING_KEY, REPORT_KEY, FuseAttention, FusionResult, Lower, LoweringResult

ROOT = os.path.join(os.path.dirname(__file__), "..")
BERT = os.path.join(ROOT, "models", "bert_sdpa_dynamo.onnx")


def ops(model: ir.Model) -> list[str]:
    return sorted(f"{n.domain}.{n.op_type}" for n in model.graph.all_nodes() if n.domain not in ("", "ai.onnx"))


def test_fuse_attention_fuses_returns_the_report_and_leaves_its_input_alone():
    model = ir.serde.deserialize_model(build(Variant()))
    result = FuseAttention(target="ortflash")(model)
    assert isinstance(result, FusionResult) and result.modified
    assert result.model is not model
    assert ops(result.model) == [f"{spec.DOMAIN}.{spec.OP_TYPE}"]
    assert ops(model) == [] and REPORT_KEY not in model.metadata_props
    assert result.report.fused == 1 and len(result.report.blocks) == 1
    written = json.loads(result.model.metadata_props[REPORT_KEY])
    assert written["fused"] == 1 and written["blocks"][0]["name"] == "Softmax_0"
    assert written["target"]["chosen"] == "ortflash"


def test_a_block_that_does_not_fuse_is_not_modified_and_writes_no_metadata():
    result = FuseAttention(target="ortflash")(ir.serde.deserialize_model(build(Variant(softmax_axis=2))))
    assert not result.modified
    assert result.report.fused == 0 and "Softmax is over axis 2" in result.report.blocks[0].reason
    assert ops(result.model) == [] and REPORT_KEY not in result.model.metadata_props


def test_blocks_the_cost_table_keeps_are_not_a_modification():
    # the default target keeps a block that would be slower fused: at 16 keys every form is
    result = FuseAttention(seq_lens=[16])(ir.serde.deserialize_model(build(Variant())))
    assert not result.modified and result.report.fused == 0
    assert ops(result.model) == []


def test_fuse_attention_with_a_native_target_lowers_in_the_same_pass():
    result = FuseAttention(target="contrib")(ir.serde.deserialize_model(build(Variant())))
    assert result.modified and ops(result.model) == ["com.microsoft.MultiHeadAttention"]
    assert json.loads(result.model.metadata_props[REPORT_KEY])["blocks"][0]["lowered_to"] == (
        "com.microsoft.MultiHeadAttention"
    )


def test_lower_lowers_flash_attention_nodes_and_updates_the_report_rows():
    fused = FuseAttention(target="ortflash")(ir.serde.deserialize_model(build(Variant()))).model
    result = Lower("onnx")(fused)
    assert isinstance(result, LoweringResult) and result.modified
    assert ops(result.model) == [] and [n.op_type for n in result.model.graph if n.op_type == "Attention"] == [
        "Attention"
    ]
    assert result.model.opset_imports[""] == 23
    assert [n.lowered for n in result.notes] == [True]
    assert json.loads(result.model.metadata_props[LOWERING_KEY])[0]["op"] == result.notes[0].op
    assert json.loads(result.model.metadata_props[REPORT_KEY])["blocks"][0]["lowered_to"] == result.notes[0].op
    # the FlashAttention model handed in is untouched
    assert ops(fused) == [f"{spec.DOMAIN}.{spec.OP_TYPE}"]


def test_lower_that_lowers_nothing_is_not_modified_and_says_why():
    fused = FuseAttention(target="ortflash")(ir.serde.deserialize_model(build(Variant(scale=-0.125)))).model
    result = Lower("contrib")(fused)
    assert not result.modified
    assert [n.lowered for n in result.notes] == [False] and "negative" in result.notes[0].reason
    assert LOWERING_KEY not in result.model.metadata_props
    assert not Lower("ortflash")(fused).modified


def test_a_pass_manager_stops_when_a_second_step_changes_nothing_and_keeps_the_first_report():
    model = ir.serde.deserialize_model(build(Variant()))
    manager = ir.passes.PassManager([FuseAttention(target="ortflash"), Lower("contrib")], steps=3)
    result = manager(model)
    assert result.modified and ops(result.model) == ["com.microsoft.MultiHeadAttention"]
    again = manager(result.model)
    assert not again.modified
    assert json.loads(again.model.metadata_props[REPORT_KEY])["fused"] == 1


def test_the_onnxscript_pipeline_on_a_zoo_model_loads_and_matches_the_original(tmp_path):
    model = ir.load(BERT)
    onnxscript.optimizer.optimize_ir(model)
    result = ir.passes.PassManager([FuseAttention(target="ortflash"), Lower("contrib")])(model)
    ir.save(result.model, str(tmp_path / "bert.onnx"))
    saved = onnx.load(str(tmp_path / "bert.onnx"))
    assert sum(n.op_type == "MultiHeadAttention" for n in saved.graph.node) == 2
    check = ortflash.verify(BERT, str(tmp_path / "bert.onnx"))
    assert check.ok and check.outputs["last_hidden_state"].max_abs < 1e-5


def test_external_weights_are_read_from_the_input_models_folder(tmp_path, monkeypatch):
    source = tmp_path / "source"
    source.mkdir()
    # the zoo model's weights on disk; its scales, of a few bytes, stay inline (the rules read them)
    onnx.save(
        onnx.load(BERT), str(source / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=1024
    )
    model = ir.load(str(source / "m.onnx"))
    assert sum(isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values()) > 10
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # a relative location must not be read from the working directory
    result = ir.passes.PassManager([FuseAttention(target="ortflash")])(model)
    assert result.modified
    # every weight read from where the input's were, and written beside the new file
    ir.save(result.model, str(elsewhere / "fused.onnx"), external_data="fused.data")
    assert os.path.getsize(elsewhere / "fused.data") > 100_000
    check = ortflash.verify(BERT, str(elsewhere / "fused.onnx"))
    assert check.ok and check.outputs["last_hidden_state"].max_abs < 1e-5


@pytest.mark.parametrize("bad", ["nope", "Contrib"])
def test_a_bad_target_is_an_ortflash_error(bad):
    model = ir.serde.deserialize_model(build(Variant()))
    with pytest.raises(ortflash.OrtflashError):
        FuseAttention(target=bad)(model)
    with pytest.raises(ortflash.OrtflashError):
        Lower(bad)(model)


def test_attention_onnxscript_already_fused_is_left_with_a_note():
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    model = onnxscript.optimizer.optimize(ir.load(BERT))
    fused_by_onnxscript, _ = optimize_for_ort(model)
    result = FuseAttention(target="ortflash")(fused_by_onnxscript)
    # onnxscript wrote both blocks as packed com.microsoft Attention: no Softmax or ONNX Attention is left
    assert not result.modified and result.report.blocks == []
    assert result.report.notes == [
        "the model already has 2 com.microsoft attention nodes (2 Attention), which ortflash leaves unchanged "
        "(ONNX Runtime's own fused attention; ortflash reads Softmax blocks and the standard ONNX Attention op)"
    ]
