"""The command line: reports, exit codes, and never touching the input file."""

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from attention_graphs import Variant, build, tamper_scale

import ortflash
from ortflash.cli import main
from ortflash.op import spec
from ortflash.op.node import node_attributes


@pytest.fixture()
def model_path(tmp_path):
    path = tmp_path / "attn.onnx"
    onnx.save(build(Variant(bias_shapes=(("B", 1, 1, "T"),), nan_guard=True)), str(path))
    return str(path)


def _digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_optimize_writes_default_output_and_verifies(model_path, capsys):
    before = _digest(model_path)
    assert main(["optimize", model_path, "--online-softmax", "--verify", "--target", "ortflash"]) == 0
    out = capsys.readouterr().out
    assert "1 of 1" in out and "verified" in out
    flash = model_path[: -len(".onnx")] + ".flash.onnx"
    assert os.path.exists(flash) and _digest(model_path) == before
    node = next(n for n in onnx.load(flash).graph.node if n.op_type == "FlashAttention")
    assert node_attributes(node)["softmax"] == "auto"


def test_verify_fails_with_exit_1_on_a_tampered_model(model_path, tmp_path):
    fused, _ = ortflash.optimize(model_path, target="ortflash")
    tamper_scale(fused, 1.5)
    bad = str(tmp_path / "bad.onnx")
    onnx.save(fused, bad)
    assert main(["verify", model_path, bad]) == 1
    good = str(tmp_path / "good.onnx")
    onnx.save(ortflash.optimize(model_path, target="ortflash")[0], good)
    assert main(["verify", model_path, good, "--softmax", "online", "--block-size", "5", "--seq-len", "40"]) == 0


def test_verify_with_feeds_file(model_path, tmp_path):
    from ortflash.checks.feeds import make_feeds

    out = str(tmp_path / "o.onnx")
    assert main(["optimize", model_path, "-o", out, "--target", "ortflash"]) == 0
    feeds = make_feeds(onnx.load(model_path), seq_len=9)
    np.savez(tmp_path / "f.npz", **feeds)
    assert main(["verify", model_path, out, "--feeds", str(tmp_path / "f.npz")]) == 0


@pytest.mark.parametrize(
    "argv_tail",
    [
        ["optimize", "{missing}", "--target", "ortflash"],
        ["optimize", "{text}", "--target", "ortflash"],
        ["optimize", "{model}", "--block-size", "0", "--target", "ortflash"],
        ["optimize", "{model}", "--block-size", "-4", "--target", "ortflash"],
        ["optimize", "{model}", "--softmax", "fast", "--target", "ortflash"],
        ["optimize", "{model}", "-o", "{nofolder}", "--target", "ortflash"],
        ["optimize", "{model}", "--bogus", "--target", "ortflash"],
        ["verify", "{model}", "{missing}"],
        ["inspect", "{random}"],
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv_tail, model_path, tmp_path):
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a model\n")
    rnd = tmp_path / "random.onnx"
    rnd.write_bytes(np.random.default_rng(0).bytes(4096))
    names = {
        "missing": str(tmp_path / "missing.onnx"),
        "text": str(text),
        "model": model_path,
        "nofolder": str(tmp_path / "no" / "such" / "out.onnx"),
        "random": str(rnd),
    }
    argv = [a.format(**names) for a in argv_tail]
    before = _digest(model_path)
    proc = subprocess.run([sys.executable, "-m", "ortflash", *argv], capture_output=True, text=True, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ortflash: error:"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert _digest(model_path) == before


def _run_attributes(node: onnx.NodeProto) -> dict:
    """A bridge node's attributes, or a native node's (kernels/native_op: plain, the spec's names)."""
    if node.domain == spec.DOMAIN:
        return node_attributes(node)
    values = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    return {name: v.decode() if isinstance(v, bytes) else v for name, v in values.items()}


def _fused_attributes_run(monkeypatch) -> list[dict]:
    """Record the FlashAttention attributes of every model ONNX Runtime is handed."""
    import onnxruntime as ort

    seen = []
    real = ort.InferenceSession

    def recording(model, *args, **kwargs):
        if isinstance(model, bytes):
            nodes = onnx.load_from_string(model).graph.node
            seen.extend(_run_attributes(n) for n in nodes if n.op_type == "FlashAttention")
        return real(model, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", recording)
    return seen


@pytest.mark.parametrize(
    ("options", "block_size", "min_seq_len"), [(["--block-size", "7"], 7, 1024), (["--min-seq-len", "0"], 128, 0)]
)
def test_verify_block_size_alone_retiles_every_node_and_keeps_its_softmax(
    model_path, tmp_path, monkeypatch, options, block_size, min_seq_len
):
    out = str(tmp_path / "auto.onnx")
    assert main(["optimize", model_path, "-o", out, "--online-softmax", "--target", "ortflash"]) == 0
    seen = _fused_attributes_run(monkeypatch)
    assert main(["verify", model_path, out, *options]) == 0
    assert [(a["softmax"], a["block_size"], a["min_seq_len"]) for a in seen] == [("auto", block_size, min_seq_len)]


def test_verify_softmax_overrides_every_node(model_path, tmp_path, monkeypatch):
    out = str(tmp_path / "naive.onnx")
    assert main(["optimize", model_path, "-o", out, "--block-size", "32", "--target", "ortflash"]) == 0
    seen = _fused_attributes_run(monkeypatch)
    assert main(["verify", model_path, out, "--softmax", "online"]) == 0
    assert [(a["softmax"], a["block_size"]) for a in seen] == [("online", 128)]


def test_an_ortflash_bug_is_not_reported_as_bad_input(model_path, tmp_path, monkeypatch):
    import ortflash.checks.prover as verify_module

    def broken(*args, **kwargs):
        raise KeyError("a bug")

    out = str(tmp_path / "o.onnx")
    assert main(["optimize", model_path, "-o", out, "--target", "ortflash"]) == 0
    monkeypatch.setattr(verify_module, "compare_outputs", broken)
    with pytest.raises(KeyError):
        main(["verify", model_path, out])


def test_inputs_onnx_runtime_cannot_take_are_bad_input(model_path, tmp_path, capsys):
    out = str(tmp_path / "o.onnx")
    assert main(["optimize", model_path, "-o", out, "--target", "ortflash"]) == 0
    np.savez(tmp_path / "wrong.npz", x=np.zeros(3, np.float32))
    assert main(["verify", model_path, out, "--feeds", str(tmp_path / "wrong.npz")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ortflash: error: ONNX Runtime could not run the original model")


def test_interrupt_exits_130(model_path, monkeypatch, capsys):
    from ortflash import cli
    from ortflash.cli import inspect as inspect_command

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(inspect_command, "optimize", interrupted)
    assert main(["inspect", model_path]) == cli.EXIT_INTERRUPTED == 130
    assert capsys.readouterr().err.strip() == "ortflash: interrupted"


@pytest.mark.parametrize(
    ("path", "default"),
    [("m.onnx", "m.flash.onnx"), ("m.model", "m.model.flash.onnx"), ("dir.onnx/m.onnx", "dir.onnx/m.flash.onnx")],
)
def test_default_output_name(path, default, tmp_path, monkeypatch):
    from ortflash.cli import optimize as cli

    written = []
    monkeypatch.chdir(tmp_path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    monkeypatch.setattr(cli, "optimize", lambda model, **kw: (model, ortflash.Report(path)))
    monkeypatch.setattr(cli, "load", lambda p: onnx.ModelProto())
    monkeypatch.setattr(cli, "save", lambda model, out, source_dir: written.append(out))
    monkeypatch.setattr(cli, "_unrunnable", lambda *args: None)
    assert main(["optimize", path, "--target", "ortflash"]) == 0
    assert written == [default]


def test_optimize_says_which_com_microsoft_attention_nodes_it_leaves(tmp_path, capsys):
    """A model ORT's transformers optimizer already fused has no Softmax: 0 blocks, and one line says why."""
    from onnx import TensorProto, helper

    hidden = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", "S", 16]) for n in ("q", "k", "v")]
    mha = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["out"], domain="com.microsoft", num_heads=2)
    graph = helper.make_graph(
        [mha], "fused_by_ort", hidden, [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)]
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 8
    path = str(tmp_path / "mha.onnx")
    onnx.save(model, path)
    json_path = str(tmp_path / "result.json")
    assert main(["optimize", path, "-o", str(tmp_path / "out.onnx"), "--json", json_path]) == 0
    out = capsys.readouterr().out
    line = (
        "note: the model already has 1 com.microsoft attention node (1 MultiHeadAttention), which ortflash leaves "
        "unchanged (ONNX Runtime's own fused attention; ortflash reads Softmax blocks and the standard ONNX "
        "Attention op)"
    )
    assert line in " ".join(out.split()), out
    with open(json_path) as f:
        assert json.load(f)["notes"] == [line.removeprefix("note: ")]
    # the pipeline's note: inspect and the API say it too
    assert main(["inspect", path]) == 0
    assert line in " ".join(capsys.readouterr().out.split())
    assert ortflash.optimize(path)[1].notes == [line.removeprefix("note: ")]


def test_optimize_reads_an_external_scale_from_the_models_folder(tmp_path, monkeypatch, capsys):
    """The command handed optimize the loaded ModelProto, which names no folder: a scale saved as
    external data was not read from another working directory, and the block was kept."""
    folder, elsewhere = tmp_path / "model", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()
    path = str(folder / "a.onnx")
    onnx.save(build(Variant()), path, save_as_external_data=True, location="a.data", size_threshold=0)
    monkeypatch.chdir(elsewhere)
    out = str(folder / "a.flash.onnx")
    assert main(["optimize", path, "-o", out, "--target", "ortflash", "--json", "-"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["fused"] == 1, document["blocks"]
    assert [n.op_type for n in onnx.load(out).graph.node].count("FlashAttention") == 1
