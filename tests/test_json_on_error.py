"""--json on an error (issue 33 item 10): every command that ends in exit 2 still writes one
document of the documented shape (never leaving an earlier run's file), and ``--json -`` stays
one JSON document on stdout."""

from __future__ import annotations

import json

import onnx
import pytest
from attention_graphs import Variant, build

from ortflash.cli import main

STALE = {"schema": "ortflash.result", "exit_code": 0, "model": "another.onnx", "ok": True}


@pytest.fixture()
def files(tmp_path):
    model = tmp_path / "attn.onnx"
    onnx.save(build(Variant()), str(model))
    text = tmp_path / "notes.onnx"
    text.write_text("not a model\n")
    return {"model": str(model), "text": str(text), "missing": str(tmp_path / "missing.onnx")}


def _good_keys(files, tmp_path) -> set[str]:
    doc = tmp_path / "good.json"
    assert main(["inspect", files["model"], "--json", str(doc), "-q"]) == 0
    return set(json.loads(doc.read_text()))


BAD = {
    "optimize": (["optimize", "{text}"], "text"),
    "inspect": (["inspect", "{missing}"], "missing"),
    "validate": (["validate", "{text}"], "text"),
    "web-check": (["web-check", "{missing}"], "missing"),
    "verify": (["verify", "{model}", "{missing}"], "model"),
    "regress": (["regress", "{missing}"], "missing"),
}


@pytest.mark.parametrize("command", list(BAD))
def test_an_exit_2_writes_the_document_over_an_earlier_runs_file(command, files, tmp_path, capsys):
    argv, model_key = BAD[command]
    doc = tmp_path / "result.json"
    doc.write_text(json.dumps(STALE))
    assert main([a.format(**files) for a in argv] + ["--json", str(doc)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ortflash: error: ")
    written = json.loads(doc.read_text())
    assert set(written) == _good_keys(files, tmp_path)
    assert (written["command"], written["exit_code"], written["ok"]) == (command, 2, False)
    assert written["model"] == files[model_key]
    assert written["notes"][-1] == "error: " + err[0].removeprefix("ortflash: error: ")
    assert written["fused"] is None and written["blocks"] is None and written["verification"] is None


def test_json_to_stdout_on_an_error_is_one_document(files, capsys):
    assert main(["optimize", files["text"], "--json", "-"]) == 2
    captured = capsys.readouterr()
    written = json.loads(captured.out)  # nothing else on stdout
    assert written["exit_code"] == 2 and written["command"] == "optimize"
    assert captured.err.startswith("ortflash: error: ")


def test_a_command_line_that_does_not_parse_writes_the_document_too(files, tmp_path):
    doc = tmp_path / "result.json"
    doc.write_text(json.dumps(STALE))
    with pytest.raises(SystemExit) as stop:
        main(["optimize", files["model"], "--block-size", "0", "--json", str(doc)])
    assert stop.value.code == 2
    written = json.loads(doc.read_text())
    assert (written["command"], written["exit_code"], written["model"]) == ("optimize", 2, None)
    assert written["notes"] == ["error: the command line did not parse"]


def test_an_interrupt_writes_exit_130(files, tmp_path, monkeypatch):
    from ortflash.cli import inspect as inspect_command

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(inspect_command, "optimize", interrupted)
    doc = tmp_path / "result.json"
    doc.write_text(json.dumps(STALE))
    assert main(["inspect", files["model"], "--json", str(doc)]) == 130
    assert json.loads(doc.read_text())["exit_code"] == 130


def test_a_json_option_without_its_path_is_still_one_line(files):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "ortflash", "optimize", files["model"], "--json"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
