"""optimize on a model ortflash already fused, with a portable target (issue 33 item 13): its
FlashAttention nodes are lowered for the target, as ortflash.lower does, or the command fails
with one line (exit 2) saying how, where the target cannot lower them.

Seen before: "nothing to fuse; the model is written unchanged", FlashAttention kept, exit 0, a
model plain ONNX Runtime cannot load although --target contrib/onnx/webgpu/cuda was asked for."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnxruntime as ort
import pytest

import ortflash
from ortflash.cli import main
from ortflash.model_io import graphs_of

MODELS = Path(__file__).resolve().parents[1] / "models"
NATIVE = {"Attention", "MultiHeadAttention", "GroupQueryAttention"}


def _op_types(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for g in graphs_of(model.graph) for n in g.node]


@pytest.fixture(scope="module")
def fused_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, report = ortflash.optimize(MODELS / "bert_eager_torchscript.onnx", target="ortflash")
    assert report.fused == 2
    path = tmp_path_factory.mktemp("fused") / "bert_fused.onnx"
    onnx.save(model, path)
    return path


@pytest.mark.parametrize(("target", "op"), [("contrib", "MultiHeadAttention"), ("onnx", "Attention")])
def test_the_cli_lowers_an_already_fused_model_for_the_target(
    fused_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str, op: str
) -> None:
    out = tmp_path / "out.onnx"
    assert main(["optimize", str(fused_bert), "-o", str(out), "--target", target]) == 0
    written = onnx.load(out)
    assert "FlashAttention" not in _op_types(written)
    assert _op_types(written).count(op) == 2
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])  # without ortflash
    said = capsys.readouterr().out
    assert "2 FlashAttention node(s) lowered" in said and "written unchanged" not in said
    assert ortflash.verify(MODELS / "bert_eager_torchscript.onnx", written).ok


def test_ortflash_keeps_an_already_fused_model_unchanged(fused_bert: Path) -> None:
    original = onnx.load(fused_bert)
    model, report = ortflash.optimize(original, target="ortflash")
    assert model is original and not report.rewritten


def test_a_target_that_cannot_lower_the_nodes_fails_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GPT-Neo's local (sliding-window) blocks: --target cuda lowers neither (test_named_targets_lower_or_keep)
    model, report = ortflash.optimize(MODELS / "gpt_neo_eager_torchscript.onnx", target="ortflash")
    assert report.fused == 2
    fused = tmp_path / "neo_fused.onnx"
    onnx.save(model, fused)
    out = tmp_path / "out.onnx"
    assert main(["optimize", str(fused), "-o", str(out), "--target", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    assert "already has 2 FlashAttention node(s)" in err[0] and "--target cuda cannot lower" in err[0]
    assert "optimize the model from before ortflash" in err[0]
    assert not out.exists()
