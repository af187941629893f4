"""A portable target asked for by name lowers every block or keeps its original ops: never a
FlashAttention node in what it writes (issue 33 item 1, issue 31 item 0).

Seen before: --target onnx on a dynamically quantized model (its DequantizeLinear stops the opset
raise to 23) and --target cuda on GPT-Neo's local (sliding-window) blocks both wrote FlashAttention
nodes with exit 0, which plain ONNX Runtime cannot load."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnxruntime as ort
import pytest

import ortflash
from ortflash.model_io import graphs_of

MODELS = Path(__file__).resolve().parents[1] / "models"


def _op_types(model: onnx.ModelProto) -> set[str]:
    return {n.op_type for g in graphs_of(model.graph) for n in g.node}


def _plain_session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("target", ["cuda", "webgpu", "onnx", "contrib"])
def test_gpt_neo_under_a_portable_target_has_no_flash_attention(target: str) -> None:
    model, report = ortflash.optimize(MODELS / "gpt_neo_eager_torchscript.onnx", target=target)
    assert "FlashAttention" not in _op_types(model)
    assert len(report.blocks) == 2
    for block in report.blocks:
        assert block.fused == (block.lowered_to is not None)
    _plain_session(model)


def test_gpt_neo_under_cuda_keeps_both_blocks_with_the_reason() -> None:
    model, report = ortflash.optimize(MODELS / "gpt_neo_eager_torchscript.onnx", target="cuda")
    assert report.fused == 0
    assert all("not lowered to cuda" in block.reason for block in report.blocks)
    assert any("2 block(s) kept their original ops: --target cuda" in note for note in report.notes)
    assert _op_types(model) >= {"Softmax"}


def test_a_quantized_model_under_onnx_lowers_every_block_and_loads(tmp_path: Path) -> None:
    # Its opset is raised to 23 now (issue 33 item 2, tests/test_opset_quantized.py): both blocks lower.
    from onnxruntime.quantization import quantize_dynamic

    quantized = tmp_path / "bert_int8.onnx"
    quantize_dynamic(MODELS / "bert_eager_torchscript.onnx", quantized)
    assert "DynamicQuantizeLinear" in _op_types(onnx.load(quantized))
    model, report = ortflash.optimize(quantized, target="onnx")
    assert "FlashAttention" not in _op_types(model)
    assert report.fused == 2 and len(report.blocks) == 2
    _plain_session(model)
