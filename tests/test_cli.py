"""The command line: reports, exit codes, and never touching the input file."""

import hashlib
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from attention_graphs import Variant, build, tamper_scale

import ortflash
from ortflash.cli import main


@pytest.fixture()
def model_path(tmp_path):
    path = tmp_path / "attn.onnx"
    onnx.save(build(Variant(bias_shapes=(("B", 1, 1, "T"),), nan_guard=True)), str(path))
    return str(path)


def _digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_optimize_writes_default_output_and_verifies(model_path, capsys):
    before = _digest(model_path)
    assert main(["optimize", model_path, "--online-softmax", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "1 of 1" in out and "verified" in out
    flash = model_path[: -len(".onnx")] + ".flash.onnx"
    assert os.path.exists(flash) and _digest(model_path) == before
    node = next(n for n in onnx.load(flash).graph.node if n.op_type == "FlashAttention")
    assert ortflash.spec.node_attributes(node)["softmax"] == "auto"


def test_verify_fails_with_exit_1_on_a_tampered_model(model_path, tmp_path):
    fused, _ = ortflash.optimize(model_path)
    tamper_scale(fused, 1.5)
    bad = str(tmp_path / "bad.onnx")
    onnx.save(fused, bad)
    assert main(["verify", model_path, bad]) == 1
    good = str(tmp_path / "good.onnx")
    onnx.save(ortflash.optimize(model_path)[0], good)
    assert main(["verify", model_path, good, "--softmax", "online", "--block-size", "5", "--seq-len", "40"]) == 0


def test_verify_with_feeds_file(model_path, tmp_path):
    from ortflash.verify import make_feeds

    out = str(tmp_path / "o.onnx")
    assert main(["optimize", model_path, "-o", out]) == 0
    feeds = make_feeds(onnx.load(model_path), seq_len=9)
    np.savez(tmp_path / "f.npz", **feeds)
    assert main(["verify", model_path, out, "--feeds", str(tmp_path / "f.npz")]) == 0


@pytest.mark.parametrize(
    "argv_tail",
    [
        ["optimize", "{missing}"],
        ["optimize", "{text}"],
        ["optimize", "{model}", "--block-size", "0"],
        ["optimize", "{model}", "--block-size", "-4"],
        ["optimize", "{model}", "--softmax", "fast"],
        ["optimize", "{model}", "-o", "{nofolder}"],
        ["optimize", "{model}", "--bogus"],
        ["verify", "{model}", "{missing}"],
        ["inspect", "{random}"],
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv_tail, model_path, tmp_path):
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a model\n")
    rnd = tmp_path / "random.onnx"
    rnd.write_bytes(np.random.default_rng(0).bytes(4096))
    names = {"missing": str(tmp_path / "missing.onnx"), "text": str(text), "model": model_path,
             "nofolder": str(tmp_path / "no" / "such" / "out.onnx"), "random": str(rnd)}
    argv = [a.format(**names) for a in argv_tail]
    before = _digest(model_path)
    proc = subprocess.run([sys.executable, "-m", "ortflash", *argv], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ortflash: error:"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert _digest(model_path) == before
