"""--seq-lens checked against the model (issue 33 item 12): a static [.., 64, ..] model was fused
"for 2048", and a model whose position table stops at 128 was judged at 256 without a word. A
length a static model cannot take is refused (one line, exit 2, nothing written); a length the
original does not run at is named in a note."""

from __future__ import annotations

import json
import os

import onnx
import pytest
from attention_graphs import Variant, build

from ortflash.cli import main

BERT = os.path.join(os.path.dirname(__file__), os.pardir, "models", "bert_eager_torchscript.onnx")  # 128 positions


def _static(tmp_path, seq: int = 64) -> str:
    model = build(Variant())
    for vi in (*model.graph.input, *model.graph.output):
        for dim in vi.type.tensor_type.shape.dim:
            if dim.dim_param in ("B", "S", "T"):
                dim.dim_value = 1 if dim.dim_param == "B" else seq
    path = str(tmp_path / "static.onnx")
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("command", ["optimize", "inspect"])
def test_a_length_a_static_model_cannot_take_is_refused(command, tmp_path, capsys):
    path, out = _static(tmp_path), tmp_path / "out.onnx"
    argv = [command, path, "--seq-lens", "64,2048"] + (["-o", str(out)] if command == "optimize" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ortflash: error: --seq-lens 2048: the model's inputs are fixed")
    assert "run at 64 keys only" in err[0] and not out.exists()


def test_the_static_length_itself_is_taken(tmp_path):
    path, out = _static(tmp_path), tmp_path / "out.onnx"
    assert main(["optimize", path, "-o", str(out), "--seq-lens", "64", "-q"]) == 0 and out.exists()


def test_a_length_past_the_position_table_is_named_in_a_note(tmp_path, capsys):
    doc = tmp_path / "r.json"
    assert main(["inspect", BERT, "--seq-lens", "64,256", "--json", str(doc)]) == 0
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if line.startswith("note: --seq-lens")]
    assert notes == [
        "note: --seq-lens 256: the original model does not run at that length (S=256 exceeds the model's 128 "
        "positions (initializer m.embeddings.position_embeddings.weight)); its blocks were judged at it anyway"
    ]
    assert [n for n in json.loads(doc.read_text())["notes"] if n.startswith("--seq-lens")] == [
        notes[0].removeprefix("note: ")
    ]
    assert main(["inspect", BERT, "--seq-lens", "64,128", "-q", "--json", str(doc)]) == 0
    assert not [n for n in json.loads(doc.read_text())["notes"] if n.startswith("--seq-lens")]
