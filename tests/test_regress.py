"""Issue 15: `ortflash regress MANIFEST` on good and deliberately broken models, its reports, --update, -j."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import textwrap
import xml.etree.ElementTree as ET

import onnx
import pytest
import tomllib
from attention_graphs import Variant, build, tamper_scale

from ortflash.cli import main
from ortflash.regress import model_checks
from ortflash.regress.manifest import load_manifest

ROOT = os.path.join(os.path.dirname(__file__), "..")
ZOO = os.path.join(ROOT, "models")


def _write(folder, name: str, text: str) -> str:
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(textwrap.dedent(text))
    return path


@pytest.fixture()
def manifest(tmp_path) -> str:
    """Two small models that fuse one block each, expected to fuse it for ortflash and onnx."""
    onnx.save(build(Variant(bias_shapes=(("B", 1, 1, "T"),))), str(tmp_path / "a.onnx"))
    onnx.save(build(Variant(nan_guard=True)), str(tmp_path / "b.onnx"))
    return _write(
        str(tmp_path),
        "models.toml",
        """
        version = 1

        [defaults]
        softmax = "auto"
        block_size = 8
        min_seq_len = 16

        [[model]]
        path = "*.onnx"
        blocks = { ortflash = 1, onnx = 1 }
        cases = [{ batch = 1, seq_len = 7 }, { batch = 2, seq_len = 21 }]
        """,
    )


def _json(path) -> dict:
    with open(path) as f:
        return json.load(f)


def test_a_green_manifest_exits_0_with_json_and_junit_reports(manifest, tmp_path, capsys):
    out_json, out_xml = str(tmp_path / "r.json"), str(tmp_path / "r.xml")
    assert main(["regress", manifest, "--json", out_json, "--junit-xml", out_xml]) == 0
    printed = capsys.readouterr().out
    assert "regress: 4 checks of 2 models ok" in printed and "[2/2] b.onnx: ok" in printed
    doc = _json(out_json)
    assert (doc["schema"], doc["schema_version"], doc["command"], doc["exit_code"]) == (
        "ortflash.result",
        7,
        "regress",
        0,
    )
    results = doc["regress"]["results"]
    assert [(r["model"], r["target"], r["fused_blocks"], r["expected_blocks"], r["ok"]) for r in results] == [
        ("a.onnx", "ortflash", 1, 1, True),
        ("a.onnx", "onnx", 1, 1, True),
        ("b.onnx", "ortflash", 1, 1, True),
        ("b.onnx", "onnx", 1, 1, True),
    ]
    # both cases ran, and the FlashAttention rows ran both softmaxes (7 keys naive, 21 online)
    assert all(len(r["verifications"]) == 2 for r in results)
    assert results[0]["softmax"] == ["naive", "online"] and results[0]["of_tolerance"] < 1
    suite = ET.parse(out_xml).getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures")) == ("4", "0")
    assert [(c.get("classname"), c.get("name")) for c in suite.iter("testcase")][:2] == [
        ("a.onnx", "ortflash"),
        ("a.onnx", "onnx"),
    ]


def test_a_block_that_no_longer_fuses_is_a_regression(tmp_path, capsys):
    onnx.save(build(Variant(softmax_axis=2)), str(tmp_path / "m.onnx"))
    path = _write(str(tmp_path), "m.toml", '[[model]]\npath = "m.onnx"\nblocks = { ortflash = 1 }\n')
    out_xml = str(tmp_path / "r.xml")
    assert main(["regress", path, "--junit-xml", out_xml]) == 1
    printed = capsys.readouterr().out
    assert "REGRESSION: 0 of 1 expected blocks fused; kept Softmax_0: Softmax is over axis 2" in printed
    failure = ET.parse(out_xml).getroot().find("testsuite/testcase/failure")
    assert failure is not None and failure.get("message").startswith("0 of 1 expected blocks fused")


def test_a_tampered_scale_is_an_error_beyond_tolerance(manifest, monkeypatch, capsys, tmp_path):
    """An ortflash whose optimize writes a wrong scale: the numbers give it away."""
    real = model_checks.optimize

    def optimize_with_a_wrong_scale(model, **options):
        optimized, report = real(model, **options)
        return tamper_scale(optimized, 1.5) if options.get("target") == "ortflash" else optimized, report

    monkeypatch.setattr(model_checks, "optimize", optimize_with_a_wrong_scale)
    out_json = str(tmp_path / "r.json")
    assert main(["regress", manifest, "--json", out_json]) == 1
    rows = {(r["model"], r["target"]): r for r in _json(out_json)["regress"]["results"]}
    assert not rows["a.onnx", "ortflash"]["ok"] and rows["a.onnx", "onnx"]["ok"]
    problem = rows["a.onnx", "ortflash"]["problems"][0]
    assert re.match(
        r"outputs differ \(inputs b1s7, as configured\): out: max abs err \S+ at \[0, \d, \d, \d+\]", problem
    )
    assert rows["a.onnx", "ortflash"]["of_tolerance"] > 1
    assert "regress: 2 of 4 checks of 2 models regressed" in capsys.readouterr().out


def test_an_unloadable_file_is_a_regression(tmp_path, capsys):
    (tmp_path / "broken.onnx").write_bytes(b"\x08\x07not a model")
    path = _write(
        str(tmp_path),
        "m.toml",
        '[[model]]\npath = "broken.onnx"\nblocks = { ortflash = 2 }\n[[model]]\npath = "gone.onnx"\n',
    )
    out_json = str(tmp_path / "r.json")
    assert main(["regress", path, "--json", out_json]) == 1
    results = _json(out_json)["regress"]["results"]
    assert [(r["model"], r["ok"]) for r in results] == [("broken.onnx", False), ("gone.onnx", False)]
    assert results[0]["problems"][0].startswith("unloadable: ") and "no such file" in results[1]["problems"][0]


def test_an_optimized_model_onnx_runtime_cannot_load_is_a_regression(manifest, monkeypatch, tmp_path):
    real = model_checks.optimize

    def optimize_dropping_inputs(model, **options):
        optimized, report = real(model, **options)
        for node in optimized.graph.node:
            if node.op_type == "FlashAttention":
                del node.input[3:]
        return optimized, report

    monkeypatch.setattr(model_checks, "optimize", optimize_dropping_inputs)
    out_json = str(tmp_path / "r.json")
    assert main(["regress", manifest, "--json", out_json]) == 1
    row = _json(out_json)["regress"]["results"][0]
    assert row["target"] == "ortflash" and "ONNX Runtime cannot use the optimized model" in row["problems"][0]


def test_update_shows_the_diff_then_records_the_counts(tmp_path, capsys):
    onnx.save(build(Variant(scale=-0.125)), str(tmp_path / "neg.onnx"))  # fuses, but stays FlashAttention for onnx
    onnx.save(build(Variant()), str(tmp_path / "plain.onnx"))
    path = _write(str(tmp_path), "m.toml", '[[model]]\npath = "*.onnx"\nblocks = { ortflash = 1, onnx = 1 }\n')
    assert main(["regress", path, "--update"]) == 0
    printed = capsys.readouterr().out
    assert '-path = "*.onnx"' in printed and '+path = "neg.onnx"' in printed and "update: wrote" in printed
    with open(path, "rb") as f:
        written = tomllib.load(f)
    assert [(m["path"], m["blocks"]) for m in written["model"]] == [
        ("neg.onnx", {"ortflash": 1, "onnx": 0}),
        ("plain.onnx", {"ortflash": 1, "onnx": 1}),
    ]
    assert main(["regress", path]) == 0  # the manifest now records this run
    assert main(["regress", path, "--update"]) == 0 and "already records this run" in capsys.readouterr().out


def test_jobs_run_models_in_worker_processes_with_the_same_rows(manifest, tmp_path):
    one, two = str(tmp_path / "1.json"), str(tmp_path / "2.json")
    assert main(["regress", manifest, "--json", one]) == 0
    assert main(["regress", manifest, "-j", "2", "--json", two]) == 0

    def rows(path):
        return [(r["model"], r["target"], r["fused_blocks"], r["max_abs"]) for r in _json(path)["regress"]["results"]]

    assert rows(one) == rows(two)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[model]]\npath = "a.onnx"\nblock = { ortflash = 1 }\n', "unknown key 'block'"),
        ('[[model]]\npath = "a.onnx"\nblocks = { tensorrt = 1 }\n', "unknown target 'tensorrt'"),
        ('[[model]]\npath = "a.onnx"\nblocks = { ortflash = -1 }\n', "blocks.ortflash must be an integer >= 0"),
        ("[[model]]\nblocks = { ortflash = 1 }\n", "each [[model]] needs a path"),
        ("version = 9\n", "reads manifest version 1"),
        ("[[model]\n", "not a valid manifest"),
    ],
)
def test_a_bad_manifest_is_one_line_and_exit_2(tmp_path, capsys, text, message):
    path = _write(str(tmp_path), "m.toml", text)
    assert main(["regress", path]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_missing_manifest_or_report_folder_is_exit_2(tmp_path, manifest, capsys):
    assert main(["regress", str(tmp_path / "none.toml")]) == 2
    assert main(["regress", manifest, "--junit-xml", str(tmp_path / "no" / "r.xml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_slowdown_beyond_the_baseline_margin_is_a_regression(tmp_path):
    """A baseline that says the online variant once ran in 1% of the original's time: no run today can match."""
    onnx.save(build(Variant(bias_shapes=(("B", 1, 1, "T"),))), str(tmp_path / "a.onnx"))

    def run(variant, ms):
        return {"variant": variant, "seq_len": 64, "status": "ok", "latency_ms": {"median": ms}}

    baseline = {"config": {"repeats": 1, "warmup": 1}, "runs": [run("original", 100.0), run("online", 1.0)]}
    (tmp_path / "bench.json").write_text(json.dumps(baseline))
    path = _write(
        str(tmp_path),
        "m.toml",
        '[[model]]\npath = "a.onnx"\nblocks = { ortflash = 1 }\nbaseline = { file = "bench.json", max_slowdown = 2 }\n',
    )
    (check,) = load_manifest(path).checks
    rows = model_checks.check_model(check)
    assert [(r.target, r.ok) for r in rows] == [("ortflash", True), ("bench", False)]
    assert rows[1].problems[0].startswith("REGRESSION online at S=64")


def test_the_zoo_manifest_covers_every_zoo_model_with_its_block_count():
    """models/regress.toml is written from models/manifest.json by models/regress_manifest.py: rerun it
    when the zoo changes (this fails until then)."""
    with open(os.path.join(ZOO, "manifest.json")) as f:
        zoo = {m["file"]: m for m in json.load(f)["models"] if m.get("file") and m.get("check", {}).get("ok", True)}
    checks = {c.shown: c for c in load_manifest(os.path.join(ZOO, "regress.toml")).checks}
    assert set(checks) == set(zoo)
    assert all(checks[f].blocks["ortflash"] == zoo[f]["attention_blocks"] for f in zoo)
    assert all(set(checks[f].blocks) == {"ortflash", "contrib", "onnx"} for f in zoo)


def _readme_section() -> str:
    """The page that was the README's "Keeping your models green" section: docs/testing.md."""
    with open(os.path.join(ROOT, "docs", "testing.md")) as f:
        return f.read()


def test_the_readme_manifest_and_ci_step_run(tmp_path, monkeypatch):
    section = _readme_section()
    (manifest,) = re.findall(r"```toml\n(.*?)```", section, re.DOTALL)
    (ci_job,) = re.findall(r"```yaml\n(.*?)```", section, re.DOTALL)
    (command,) = [line.strip() for line in ci_job.splitlines() if line.strip().startswith("ortflash regress")]
    os.makedirs(tmp_path / "models")
    shutil.copy(os.path.join(ZOO, "bert_sdpa_dynamo.onnx"), tmp_path / "models" / "encoder.onnx")
    (tmp_path / "models" / "regress.toml").write_text(manifest)
    monkeypatch.chdir(tmp_path)
    assert main(shlex.split(command)[1:]) == 0
    assert ET.parse(tmp_path / "regress.xml").getroot().find("testsuite").get("failures") == "0"


def test_a_json_manifest_reads_as_the_same_toml_one(manifest, tmp_path):
    with open(manifest, "rb") as f:
        document = tomllib.load(f)
    as_json = tmp_path / "models.json"
    as_json.write_text(json.dumps(document))
    assert load_manifest(str(as_json)).checks == load_manifest(manifest).checks
    assert [c.shown for c in load_manifest(manifest).checks] == ["a.onnx", "b.onnx"]


def test_more_blocks_than_expected_is_a_note_and_a_glob_matching_nothing_fails(tmp_path, capsys):
    onnx.save(build(Variant()), str(tmp_path / "m.onnx"))
    more = _write(str(tmp_path), "more.toml", '[[model]]\npath = "m.onnx"\nblocks = { ortflash = 0 }\n')
    out_json = str(tmp_path / "r.json")
    assert main(["regress", more, "--json", out_json]) == 0
    (row,) = _json(out_json)["regress"]["results"]
    assert row["ok"] and row["notes"] == ["1 block fused, 0 expected (regress --update records it)"]
    nothing = _write(str(tmp_path), "none.toml", '[[model]]\npath = "gone/*.onnx"\n')
    assert main(["regress", nothing]) == 1
    printed = capsys.readouterr().out
    assert "note: gone/*.onnx: no file matches" in printed
    # issue 33 item 15: not "0 checks of 0 models ok" under an exit 1
    assert printed.strip().splitlines()[-1] == "regress: no model matched the manifest: nothing checked"
    assert "0 checks" not in printed
