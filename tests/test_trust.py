"""Issue 13: verify proves the configured path, nothing unloadable is written, the CLI fits a user's habits,
and the package ships what its commands need."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest
import tomllib
from attention_graphs import Variant, build
from onnx import TensorProto, helper

import ortflash
from ortflash.cli import main
from ortflash.cli import optimize as cli
from ortflash.op.policy import SoftmaxPolicy
from ortflash.report import Block

ROOT = os.path.join(os.path.dirname(__file__), "..")
ZOO = os.path.join(ROOT, "models")
LONG_NAME = "encoder/layer.0/attention/self/a_softmax_node_name_long_enough_to_fold_an_eighty_column_table/Softmax"


def _readme() -> str:
    """The command-line page (docs/command-line.md), where the README's JSON output section went."""
    with open(os.path.join(ROOT, "docs", "command-line.md")) as f:
        return f.read()


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _cli(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ortflash", *args], capture_output=True, text=True, cwd=cwd, timeout=600, check=False
    )


@pytest.fixture()
def model_path(tmp_path):
    path = tmp_path / "attn.onnx"
    onnx.save(build(Variant(bias_shapes=(("B", 1, 1, "T"),), nan_guard=True)), str(path))
    return str(path)


@pytest.fixture()
def online_kernel_is_wrong(monkeypatch):
    """The compiled kernel, off by one wherever it runs the online softmax: only a check that runs online sees it."""
    from ortflash.kernels import cpu

    real = cpu.flash_attention

    def wrong_online(q, k, v, bias, mask, **attrs):
        out = real(q, k, v, bias, mask, **attrs)
        mode = SoftmaxPolicy.from_attributes(attrs).choose(k.shape[2])
        return out + 1.0 if mode == "online" else out

    monkeypatch.setattr(cpu, "flash_attention", wrong_online)


# ------------------------------------------------------------------------------------------
# 1. verify proves the configured path


def test_verify_runs_auto_nodes_online_at_min_seq_len_when_the_model_takes_it(model_path, tmp_path, capsys):
    out = str(tmp_path / "o.onnx")
    assert (
        main(["optimize", model_path, "-o", out, "--online-softmax", "--verify", "--json", "-", "--target", "ortflash"])
        == 0
    )
    captured = capsys.readouterr()
    verification = json.loads(captured.out)["verification"]
    runs = verification["runs"]
    assert [sorted(set(r["softmax"].values())) for r in runs] == [["naive"], ["online"]]
    assert runs[1]["inputs"]["q"][2] == 1024 and verification["notes"] == []
    assert (verification["rtol"], verification["atol"]) == (1e-4, 1e-5)
    # what was run is printed: modes, shapes, tolerances
    assert "softmax: online in 1 fused node (key lengths 1024)" in captured.err
    assert "q [2, 2, 1024, 32]" in captured.err and "rtol 0.0001, atol 1e-05" in captured.err


def test_quick_start_verify_runs_the_online_softmax(tmp_path, online_kernel_is_wrong, capsys):
    """The bundled BERT stops at 128 positions, under min_seq_len: online is forced, and said so."""
    out = str(tmp_path / "bert.flash.onnx")
    src = os.path.join(ZOO, "bert_sdpa_dynamo.onnx")
    assert main(["optimize", src, "-o", out, "--online-softmax", "--verify", "--target", "ortflash"]) == 1
    text = capsys.readouterr().out
    assert "online softmax forced" in text and "does not run at length 1024" in text
    assert "verification FAILED" in text


def test_verify_command_exercises_online_too(model_path, tmp_path, online_kernel_is_wrong):
    fused, _ = ortflash.optimize(model_path, online_softmax=True, target="ortflash")
    out = str(tmp_path / "auto.onnx")
    onnx.save(fused, out)
    assert main(["verify", model_path, out]) == 1
    naive = str(tmp_path / "naive.onnx")
    onnx.save(ortflash.optimize(model_path, target="ortflash")[0], naive)
    assert main(["verify", model_path, naive]) == 0  # naive nodes never run online


def test_a_failed_optimize_verify_leaves_nothing_at_the_target(model_path, tmp_path, online_kernel_is_wrong, capsys):
    out = tmp_path / "out" / "m.flash.onnx"
    out.parent.mkdir()
    assert main(["optimize", model_path, "-o", str(out), "--online-softmax", "--verify", "--target", "ortflash"]) == 1
    assert not out.exists()
    assert sorted(p.name for p in out.parent.iterdir()) == ["m.flash.unverified.onnx"]
    assert "unverified" in capsys.readouterr().out


def _pair(tmp_path, change: onnx.NodeProto, out_type: int, out_shape: list[int]) -> tuple[str, str]:
    """An identity model and a version of it whose output changed shape or type."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    version = {"opset_imports": [helper.make_opsetid("", 17)], "ir_version": 8}
    original = helper.make_model(
        helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])],
            "g",
            [x],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        ),
        **version,
    )
    inits = [onnx.numpy_helper.from_array(np.array([3, 2], np.int64), "shape")]
    changed = helper.make_model(
        helper.make_graph([change], "g", [x], [helper.make_tensor_value_info("y", out_type, out_shape)], inits),
        **version,
    )
    paths = str(tmp_path / "a.onnx"), str(tmp_path / "b.onnx")
    onnx.save(original, paths[0])
    onnx.save(changed, paths[1])
    return paths


@pytest.mark.parametrize(
    ("change", "out_type", "out_shape", "words"),
    [
        (
            helper.make_node("Reshape", ["x", "shape"], ["y"]),
            TensorProto.FLOAT,
            [3, 2],
            "shape changed from [2, 3] to [3, 2]",
        ),
        (
            helper.make_node("Cast", ["x"], ["y"], to=TensorProto.DOUBLE),
            TensorProto.DOUBLE,
            [2, 3],
            "dtype changed from float32 to float64",
        ),
    ],
)
def test_a_changed_output_is_said_in_words(tmp_path, capsys, change, out_type, out_shape, words):
    a, b = _pair(tmp_path, change, out_type, out_shape)
    assert main(["verify", a, b, "--json", str(tmp_path / "r.json")]) == 1
    text = capsys.readouterr().out
    assert words in text and "inf" not in text
    output = json.loads((tmp_path / "r.json").read_text())["verification"]["runs"][0]["outputs"][0]
    assert output["problem"] == words and output["max_abs"] is None


def test_err_over_tolerance_shows_why_a_large_relative_error_can_pass():
    from ortflash.checks.compare import compare

    near_zero = compare(np.array([1e-7, 1.0], np.float32), np.array([1e-6, 1.0], np.float32), "o", 1e-4, 1e-5)
    assert near_zero.ok and near_zero.max_rel > 1e-4 and 0 < near_zero.of_tolerance <= 1
    off = compare(np.array([1.0], np.float32), np.array([1.001], np.float32), "o", 1e-4, 1e-5)
    assert not off.ok and off.of_tolerance > 1


# ------------------------------------------------------------------------------------------
# 2. never write a model ONNX Runtime cannot load


def test_a_model_onnx_runtime_cannot_load_is_never_written(model_path, tmp_path, monkeypatch, capsys):
    broken = build(Variant())
    broken.graph.node.append(helper.make_node("NoSuchOp", ["out"], ["never"]))
    monkeypatch.setattr(cli, "optimize", lambda model, **kw: (broken, ortflash.Report(model_path)))
    out = tmp_path / "out" / "m.onnx"
    out.parent.mkdir()
    assert main(["optimize", model_path, "-o", str(out), "--target", "ortflash"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "could not load the optimized model" in err[0] and "NoSuchOp" in err[0]
    assert list(out.parent.iterdir()) == []


def _runs_only_at_length_7(name: str, reshape: bool) -> onnx.ModelProto:
    """x[N] -> y: an Identity, or (``reshape``) a Reshape to [7] that loads but fails at any other N."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])
    if reshape:
        nodes = [helper.make_node("Reshape", ["x", "seven"], ["y"], name="impossible")]
        inits = [helper.make_tensor("seven", TensorProto.INT64, [1], [7])]
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [7])
    else:
        nodes, inits = [helper.make_node("Identity", ["x"], ["y"])], []
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])
    graph = helper.make_graph(nodes, name, [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _lowered_report(path: str) -> ortflash.Report:
    return ortflash.Report(path, blocks=[Block("softmax", True, lowered_to="com.microsoft.MultiHeadAttention")])


def test_first_run_finds_a_model_that_loads_but_fails_to_run():
    from ortflash.checks.feeds import make_feeds
    from ortflash.pipeline.first_run import first_run

    original = _runs_only_at_length_7("original", reshape=False)
    broken = _runs_only_at_length_7("broken", reshape=True)
    assert first_run(broken).problem is None  # it loads: only a run shows the problem
    checked = first_run(broken, original=original, feeds=make_feeds(original))
    assert checked.problem is not None and "could not run the optimized model" in checked.problem
    assert checked.note is None
    assert first_run(original, original=original, feeds=make_feeds(original)) == first_run(original)


def test_a_lowered_model_that_fails_to_run_is_never_written(tmp_path, monkeypatch, capsys):
    original = str(tmp_path / "plain.onnx")
    onnx.save(_runs_only_at_length_7("original", reshape=False), original)
    broken = _runs_only_at_length_7("broken", reshape=True)
    monkeypatch.setattr(cli, "optimize", lambda model, **kw: (broken, _lowered_report(original)))
    out = tmp_path / "out" / "m.onnx"
    out.parent.mkdir()
    assert main(["optimize", original, "--target", "contrib", "-o", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "could not run the optimized model" in err[0] and "nothing written" in err[0]
    assert list(out.parent.iterdir()) == []


def test_a_lowered_model_is_not_run_where_the_original_cannot_run(tmp_path, monkeypatch, capsys):
    original = str(tmp_path / "fixed.onnx")
    onnx.save(_runs_only_at_length_7("original", reshape=True), original)  # fails on N = 16 too
    lowered = _runs_only_at_length_7("lowered", reshape=True)
    monkeypatch.setattr(cli, "optimize", lambda model, **kw: (lowered, _lowered_report(original)))
    out = tmp_path / "m.onnx"
    assert main(["optimize", original, "--target", "onnx", "-o", str(out)]) == 0
    assert "the lowered model was not run once: the original does not run" in capsys.readouterr().out
    assert out.exists()


def test_a_really_lowered_model_runs_once_and_is_written(model_path, tmp_path, monkeypatch):
    from ortflash.pipeline import first_run

    real, ran = first_run.first_run, []

    def spy(model: onnx.ModelProto, **kwargs: object) -> first_run.FirstRun:
        checked = real(model, **kwargs)
        ran.append(kwargs.get("feeds") is not None and checked == first_run.FirstRun())
        return checked

    monkeypatch.setattr(first_run, "first_run", spy)
    out, doc = tmp_path / "m.onnx", tmp_path / "m.json"
    assert main(["optimize", model_path, "--target", "contrib", "-o", str(out), "--json", str(doc)]) == 0
    block = json.loads(doc.read_text())["blocks"][0]
    assert out.exists() and block["fused"] and block["lowered_to"]
    assert ran == [True]  # run once, no problem and no note


# ------------------------------------------------------------------------------------------
# 3. CLI habits


def test_version():
    r = _cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"ortflash {ortflash.__version__}"


@pytest.mark.parametrize(("argv", "see"), [([], "see ortflash --help"), (["optimize"], "see ortflash optimize --help")])
def test_usage_errors_name_the_right_help(argv, see):
    r = _cli(*argv)
    assert r.returncode == 2 and see in r.stderr and "ortflash ortflash" not in r.stderr


def _renamed_softmax(tmp_path, name: str) -> str:
    model = build(Variant())
    next(n for n in model.graph.node if n.op_type == "Softmax").name = name
    path = str(tmp_path / "named.onnx")
    onnx.save(model, path)
    return path


def test_piped_tables_are_full_width(every_form_fuses, tmp_path):
    r = _cli("inspect", _renamed_softmax(tmp_path, LONG_NAME), "--seq-lens", "4096")
    assert r.returncode == 0
    row = next(line for line in r.stdout.splitlines() if LONG_NAME in line)  # one line, not folded
    # the whole row, its result cell included, on the name's line; plain: no colour codes in a pipe
    assert row.rstrip().endswith("│") and "--seq-lens" not in row.split("│")[1] and "\x1b[" not in r.stdout


def test_brackets_in_names_are_printed(tmp_path):
    r = _cli("inspect", _renamed_softmax(tmp_path, "attn[plot]/Softmax"))
    assert r.returncode == 0 and "attn[plot]/Softmax" in r.stdout


def test_quiet(model_path, tmp_path, capsys):
    out = tmp_path / "o.onnx"
    assert main(["optimize", model_path, "-o", str(out), "--verify", "--quiet", "--target", "ortflash"]) == 0
    assert capsys.readouterr().out == "" and out.exists()


def test_output_equal_to_the_input_is_refused_unless_in_place(model_path, tmp_path, monkeypatch):
    before = _digest(model_path)
    monkeypatch.chdir(tmp_path)
    for out in (model_path, "attn.onnx", "./attn.onnx"):
        r = _cli("optimize", model_path, "-o", out, cwd=str(tmp_path))
        assert r.returncode == 2 and "--in-place" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert _digest(model_path) == before
    assert main(["optimize", model_path, "--in-place", "--target", "ortflash"]) == 0
    assert any(n.op_type == "FlashAttention" for n in onnx.load(model_path).graph.node)


def test_json_to_stdout_is_only_json(model_path, tmp_path, capsys):
    assert main(["optimize", model_path, "-o", str(tmp_path / "o.onnx"), "--json", "-", "--target", "ortflash"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["command"] == "optimize" and doc["fused"] == 1 and "1 of 1" in captured.err
    assert not os.path.exists("-")


def test_json_into_a_missing_folder_is_exit_2_before_anything_is_written(model_path, tmp_path):
    out = tmp_path / "o.onnx"
    r = _cli("optimize", model_path, "-o", str(out), "--json", str(tmp_path / "nodir" / "r.json"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "nodir" in r.stderr
    assert not out.exists()


def test_every_command_writes_one_versioned_json_schema(every_form_fuses, model_path, tmp_path):
    out = str(tmp_path / "o.onnx")
    runs = {
        "optimize": ["optimize", model_path, "-o", out, "--verify", "--target", "ortflash"],
        "inspect": ["inspect", model_path],
        "verify": ["verify", model_path, out],
        "validate": ["validate", model_path, "--optimized", out, "--backend", "reference"],
    }
    docs = {}
    for command, argv in runs.items():
        path = tmp_path / f"{command}.json"
        assert main([*argv, "--json", str(path)]) == 0
        docs[command] = json.loads(path.read_text())
    keys = {tuple(sorted(d)) for d in docs.values()}
    assert len(keys) == 1, keys
    for command, doc in docs.items():
        assert (doc["schema"], doc["schema_version"], doc["command"], doc["exit_code"], doc["ok"]) == (
            "ortflash.result",
            7,
            command,
            0,
            True,
        )
    assert docs["validate"]["validation"]["nodes"][0]["ok"] is True
    assert docs["verify"]["verification"]["ok"] is True and docs["inspect"]["blocks"][0]["fused"] is True


def test_the_readme_documents_the_json_schema():
    readme = _readme()  # the command-line page, where the README's JSON section went
    assert "ortflash.result" in readme and "schema_version" in readme


# ------------------------------------------------------------------------------------------
# 5. report truths: rounding-sensitive blocks, --num-heads


def _feeding_a_quantizer(tmp_path, quantizer: onnx.NodeProto) -> str:
    model = build(Variant())
    model.graph.node.append(quantizer)
    model.graph.output.extend(helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in quantizer.output)
    path = str(tmp_path / "quantized.onnx")
    onnx.save(model, path)
    return path


@pytest.mark.parametrize(
    ("quantizer", "words"),
    [
        (helper.make_node("DynamicQuantizeLinear", ["out"], ["y", "y_scale", "y_zero"]), "DynamicQuantizeLinear"),
        (helper.make_node("Cast", ["out"], ["y"], to=TensorProto.INT32), "Cast to an integer type"),
    ],
)
def test_blocks_feeding_a_quantizer_are_marked(every_form_fuses, tmp_path, capsys, quantizer, words):
    path = _feeding_a_quantizer(tmp_path, quantizer)
    assert main(["inspect", path, "--json", "-"]) == 0
    captured = capsys.readouterr()
    assert re.fullmatch(f"{words} [1-6] nodes? on", json.loads(captured.out)["blocks"][0]["rounding"])
    assert "feeds a quantizer" in captured.err and "--feeds" in captured.err


def test_an_integer_cast_of_the_output_shape_is_not_a_quantizer(tmp_path, capsys):
    """Bloom: the tensor after a block reaches Shape -> Gather -> Cast(int64), a shape computation."""
    model = build(Variant())
    model.graph.node.extend(
        [
            helper.make_node("Shape", ["out"], ["out_shape"]),
            helper.make_node("Cast", ["out_shape"], ["out_dims"], to=TensorProto.INT32),
        ]
    )
    model.graph.output.append(helper.make_tensor_value_info("out_dims", TensorProto.INT32, None))
    path = str(tmp_path / "shape_cast.onnx")
    onnx.save(model, path)
    assert main(["inspect", path, "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["blocks"][0]["rounding"] == ""


def test_blocks_far_from_a_quantizer_are_not_marked(model_path, capsys):
    assert main(["inspect", model_path, "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["blocks"][0]["rounding"] == ""


def test_num_heads_is_a_positive_integer(model_path):
    r = _cli("inspect", model_path, "--num-heads", "0")
    assert r.returncode == 2 and "--num-heads" in r.stderr


def test_num_heads_reaches_the_pipeline(model_path):
    assert main(["inspect", model_path, "--num-heads", "2"]) == 0


def _unprovable_heads(tmp_path) -> str:
    """Q, K and V [B, H, S, 32] with H a named dim: nothing proves the head count."""
    model = build(Variant(bias_shapes=(("B", 1, 1, "T"),)))
    for vi in model.graph.input[:3]:
        vi.type.tensor_type.shape.dim[1].dim_param = "H"
    path = str(tmp_path / "heads_unknown.onnx")
    onnx.save(model, path)
    return path


def test_num_heads_lets_a_block_whose_count_nothing_proves_lower(tmp_path, capsys):
    path, out, doc = _unprovable_heads(tmp_path), tmp_path / "m.onnx", tmp_path / "m.json"
    assert main(["optimize", path, "--target", "contrib", "-o", str(out), "--json", str(doc)]) == 0
    (block,) = json.loads(doc.read_text())["blocks"]
    assert block["lowered_to"] is None and "needs num_heads" in block["reason"] and block["heads"] is None
    argv = ["optimize", path, "--target", "contrib", "--num-heads", "2", "--dim", "H=2", "-o", str(out)]
    assert main([*argv, "--verify", "--json", str(doc)]) == 0
    (block,) = json.loads(doc.read_text())["blocks"]
    assert (block["lowered_to"], block["heads"], block["kv_heads"]) == ("com.microsoft.MultiHeadAttention", 2, 2)
    assert "given (--num-heads), not proved" in block["reason"]
    ops = [n.op_type for n in onnx.load(str(out)).graph.node]
    assert ops.count("MultiHeadAttention") == 1 and "FlashAttention" not in ops
    capsys.readouterr()
    # a wrong count is not trusted: the lowered model fails its first run, and nothing is written
    out.unlink()
    assert main([*argv[:5], "3", *argv[6:]]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing written" in err[0] and not out.exists()


def test_num_heads_never_overrides_a_proved_count(model_path, tmp_path, capsys):
    out = tmp_path / "m.onnx"
    assert main(["optimize", model_path, "--num-heads", "3", "-o", str(out), "--target", "ortflash"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "2 query heads, proved" in err[0] and not out.exists()
    with pytest.raises(ortflash.OrtflashError, match="--num-heads 3"):
        ortflash.optimize(model_path, num_heads=3, target="ortflash")


@pytest.mark.parametrize(
    ("file", "heads", "kv_heads"), [("llama_sdpa_torchscript.onnx", 4, 2), ("bert_eager_torchscript.onnx", 2, 2)]
)
def test_heads_are_numbers_where_shapes_prove_them(every_form_fuses, capsys, file, heads, kv_heads):
    """TorchScript exports reshape heads from runtime shapes: the rules read unk__24 there; the numbers are provable."""
    assert main(["inspect", os.path.join(ZOO, file), "--json", "-"]) == 0
    blocks = json.loads(capsys.readouterr().out)["blocks"]
    assert [(b["heads"], b["kv_heads"], b["head_dim"]) for b in blocks] == [(heads, kv_heads, 32)] * len(blocks)


def test_heads_in_json_are_ints_or_null(every_form_fuses, tmp_path, capsys):
    assert main(["inspect", _unprovable_heads(tmp_path), "--json", "-"]) == 0
    captured = capsys.readouterr()
    (block,) = json.loads(captured.out)["blocks"]
    assert (block["heads"], block["kv_heads"], block["head_dim"]) == (None, None, 32)
    assert "unk__" not in captured.err and " H " not in captured.err


# ------------------------------------------------------------------------------------------
# 5b. which target: --target auto --ep, and the default for blocks that feed a quantizer


def test_auto_needs_an_execution_provider(model_path, tmp_path, capsys):
    out = tmp_path / "m.onnx"
    assert main(["optimize", model_path, "--target", "auto", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "execution provider" in err[0] and not out.exists()


@pytest.mark.parametrize(("ep", "chosen", "auto"), [("cpu", "contrib", ["--target", "auto"]), ("cuda", "cuda", [])])
def test_auto_takes_the_first_target_of_the_eps_order(every_form_fuses, model_path, tmp_path, capsys, ep, chosen, auto):
    doc = tmp_path / "r.json"
    assert main(["optimize", model_path, *auto, "--ep", ep, "-o", str(tmp_path / "m.onnx"), "--json", str(doc)]) == 0
    result = json.loads(doc.read_text())
    assert (result["target"]["requested"], result["target"]["chosen"], result["target"]["ep"]) == ("auto", chosen, ep)
    assert result["target"]["tried"] == []
    assert result["blocks"][0]["lowered_to"] == "com.microsoft.MultiHeadAttention"
    assert f"target: {chosen}:" in capsys.readouterr().out


def test_auto_falls_back_when_the_first_target_does_not_lower_every_block(every_form_fuses, tmp_path, capsys):
    """contrib needs a static head count; ONNX Attention does not: auto for the CPU takes onnx, and says why."""
    doc = tmp_path / "r.json"
    path = _unprovable_heads(tmp_path)
    assert (
        main(["optimize", path, "--target", "auto", "--ep", "cpu", "-o", str(tmp_path / "m.onnx"), "--json", str(doc)])
        == 0
    )
    result = json.loads(doc.read_text())
    assert result["target"]["chosen"] == "onnx" and result["blocks"][0]["lowered_to"] == "Attention"
    assert result["target"]["tried"] == ["contrib: 1 of 1 fused blocks not lowered (Softmax_0)"]
    assert "raised the default opset from 17 to 23 for --target onnx" in " ".join(result["notes"])
    assert "passed over contrib" in capsys.readouterr().out


def test_auto_falls_back_when_onnx_runtime_cannot_take_the_first_target(every_form_fuses, model_path):
    def refuses_contrib(model: onnx.ModelProto, report: ortflash.Report) -> str | None:
        return "refused" if any(n.domain == "com.microsoft" for n in model.graph.node) else None

    model, report = ortflash.optimize(model_path, target="auto", ep="cpu", load_check=refuses_contrib)
    assert report.target is not None and report.target.chosen == "onnx"
    assert report.target.tried == ["contrib: ONNX Runtime cannot take it (refused)"]
    assert [n.op_type for n in model.graph.node].count("Attention") == 1


def test_the_default_target_prefers_native_ops_for_blocks_feeding_a_quantizer(every_form_fuses, tmp_path, capsys):
    quantizer = helper.make_node("DynamicQuantizeLinear", ["out"], ["y", "y_scale", "y_zero"])
    path, doc = _feeding_a_quantizer(tmp_path, quantizer), tmp_path / "r.json"
    assert main(["optimize", path, "-o", str(tmp_path / "m.onnx"), "--json", str(doc)]) == 0
    result = json.loads(doc.read_text())
    assert result["target"]["requested"] is None and result["target"]["chosen"] == "contrib"
    assert "feed a quantizer" in result["target"]["why"] and result["blocks"][0]["lowered_to"].endswith(
        "MultiHeadAttention"
    )
    assert "target: contrib: 1 fused block(s) feed a quantizer" in capsys.readouterr().out
    assert main(["optimize", path, "--target", "ortflash", "-o", str(tmp_path / "f.onnx"), "--json", str(doc)]) == 0
    assert json.loads(doc.read_text())["blocks"][0]["lowered_to"] is None


def test_blocks_far_from_a_quantizer_keep_the_ortflash_default(every_form_fuses, model_path):
    _, report = ortflash.optimize(model_path)
    assert report.target is not None and (report.target.chosen, report.target.why) == ("ortflash", "the default")


# ------------------------------------------------------------------------------------------
# 5c. opsets, and files nobody asked for


def _with_opset(domain: str, version: int) -> onnx.ModelProto:
    model = build(Variant())
    if domain:
        model.opset_import.append(helper.make_opsetid(domain, version))
    else:
        next(o for o in model.opset_import if o.domain == "").version = version
    return model


@pytest.mark.parametrize("domain", ["", "ai.onnx.ml"])
def test_opsets_newer_than_onnx_knows_are_refused(tmp_path, capsys, domain):
    path, out = str(tmp_path / "new.onnx"), tmp_path / "out.onnx"
    onnx.save(_with_opset(domain, 99), path)
    for target in (["ortflash"], ["onnx"], ["auto", "--ep", "cpu"]):  # --ep goes with auto only (issue 24 item 10)
        assert main(["optimize", path, "--target", *target, "-o", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "opset 99" in err[0] and onnx.__version__ in err[0]
        assert not out.exists()


def test_the_conversion_to_opset_23_is_reported(model_path, capsys):
    assert main(["inspect", model_path]) == 0
    assert "converted" not in capsys.readouterr().out
    _, report = ortflash.optimize(model_path, target="onnx")
    assert report.notes == ["raised the default opset from 17 to 23 for --target onnx, op by op (pipeline/opset.py)"]


def test_symbolic_shape_inference_writes_nothing_into_the_current_folder(tmp_path, monkeypatch):
    """ONNX Runtime's symbolic inference saves sym_shape_infer_temp.onnx into the cwd where it cannot
    infer every shape (here: an op it does not know, whose output a Softmax reads)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    nodes = [
        helper.make_node("Mystery", ["x"], ["y"], domain="test.mystery"),
        helper.make_node("Softmax", ["y"], ["z"], axis=-1),
    ]
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("test.mystery", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    monkeypatch.chdir(tmp_path)
    _, report = ortflash.optimize(model, target="ortflash")
    assert report.fused == 0 and report.shape_inference == "onnx"
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------------------------------
# 4. packaging


def _pyproject() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def test_wgpu_is_a_core_dependency():
    assert any(re.match(r"wgpu\b", d) for d in _pyproject()["project"]["dependencies"])


def test_the_node_runner_and_py_typed_ship_as_package_data():
    patterns = _pyproject()["tool"]["setuptools"]["package-data"]["ortflash"]
    package = os.path.join(ROOT, "ortflash")
    shipped = {os.path.relpath(p, package) for pattern in patterns for p in glob.glob(os.path.join(package, pattern))}
    from ortflash.checks import browser
    from ortflash.checks import web_files as wc

    assert {"py.typed", *(f"checks/web/{n}" for n in (*wc.WEB_FILES, *browser.PAGE_FILES))} <= shipped
    assert not any("node_modules" in p for p in shipped)


def test_web_check_installs_into_a_user_cache_when_the_package_has_no_node_modules(tmp_path, monkeypatch):
    from ortflash.checks import web_files as wc

    shipped = tmp_path / "site-packages" / "web"
    shipped.mkdir(parents=True)
    for name in wc.WEB_FILES:
        shutil.copy(os.path.join(wc.PACKAGED_WEB_DIR, name), shipped / name)
    monkeypatch.setattr(wc, "PACKAGED_WEB_DIR", str(shipped))
    monkeypatch.setenv("ORTFLASH_CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    def fake_npm(args, **kw):
        calls.append(kw["cwd"])
        for pkg in wc.NODE_PACKAGES:
            os.makedirs(os.path.join(kw["cwd"], "node_modules", pkg))
            open(os.path.join(kw["cwd"], "node_modules", pkg, "package.json"), "w").close()
        return subprocess.CompletedProcess(args, 0, stdout="", stderr="")

    monkeypatch.setattr(wc.subprocess, "run", fake_npm)
    monkeypatch.setattr(wc.shutil, "which", lambda name: f"/usr/bin/{name}")
    wc.ensure_node_packages()
    wc.ensure_node_packages()  # installed now: no second npm ci
    (cwd,) = calls
    assert cwd.startswith(str(tmp_path / "cache")) and cwd == wc.web_dir()
    assert sorted(os.listdir(cwd)) == sorted([*wc.WEB_FILES, "node_modules"])
    assert not (shipped / "node_modules").exists()


def test_the_api_takes_an_onnx_ir_model():
    import onnx_ir as ir

    model = ir.serde.deserialize_model(build(Variant()))
    _, report = ortflash.optimize(model, target="ortflash")
    assert report.fused == 1


def test_the_load_check_opens_without_weight_prepacking(monkeypatch):
    """ORT's pre-packing copies every MatMul weight when a session opens: the check before writing
    took a 1.2 GiB model to 1.5 GiB of memory and 2x load+save's time with it (large_model.md)."""
    from ortflash.checks import sessions as run_mod
    from ortflash.pipeline import first_run as fr

    seen = []
    real_open = run_mod.open_session

    def open_and_record(*args, **kwargs):
        session = real_open(*args, **kwargs)
        options = session._session.get_session_options()
        seen.append(options.get_session_config_entry("session.disable_prepacking"))
        return session

    monkeypatch.setattr(fr, "open_session", open_and_record)
    model = onnx.load(os.path.join(ZOO, "bert_sdpa_dynamo.onnx"))
    assert fr.first_run(model).problem is None
    assert seen == ["1"]
