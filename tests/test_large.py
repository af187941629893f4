"""Models with external weights through the CLI, small and fast (benchmarks/large_model.py has the big ones).

The encoder is benchmarks/large_model.py's generator at toy size (2 layers, hidden 64): weights in
one external data file, the small tensors inline. Every run is ``python -m ortflash`` in its own
process, so exit codes and stderr are the real ones.
"""

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "large_model.py"
SMALL = dict(layers=2, hidden=64, heads=4, ffn=128, vocab=100, max_pos=64)


def _generator():
    spec = importlib.util.spec_from_file_location("large_model_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A pristine copy of the model folder; each test copies it so tests can't disturb each other."""
    folder = tmp_path_factory.mktemp("pristine")
    summary = _generator().build_encoder(str(folder / "enc.onnx"), **SMALL)
    assert summary["data"] == "enc.data" and summary["data_bytes"] > 0
    return folder


@pytest.fixture()
def src(built, tmp_path):
    folder = tmp_path / "src"
    folder.mkdir()
    for f in built.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    return folder


def _sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _digests(folder):
    return {p.name: _sha(p) for p in sorted(Path(folder).iterdir()) if p.is_file()}


def _locations(path):
    model = onnx.load(str(path), load_external_data=False)
    return {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}


def _cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "ortflash", *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def _run_ort(path, seq=8):
    import onnxruntime as ort

    import ortflash

    rng = np.random.default_rng(0)
    feeds = {
        "input_ids": rng.integers(0, SMALL["vocab"], (2, seq), dtype=np.int64),
        "attention_mask": np.ones((2, seq), np.int64),
    }
    feeds["attention_mask"][1, -3:] = 0
    sess = ort.InferenceSession(str(path), ortflash.session_options(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def test_the_generated_model_keeps_its_weights_outside(src):
    model = onnx.load(str(src / "enc.onnx"), load_external_data=False)
    external = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert external and _locations(src / "enc.onnx") == {"enc.data"}
    assert sum(1 for n in model.graph.node if n.op_type == "Softmax") == SMALL["layers"]
    onnx.checker.check_model(str(src / "enc.onnx"), full_check=True)


def test_optimize_into_another_folder_copies_the_data(src, tmp_path):
    before = _digests(src)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "enc.flash.onnx"
    report = tmp_path / "report.json"
    r = _cli("optimize", src / "enc.onnx", "-o", out, "--verify", "--json", report, "--target", "ortflash")
    assert r.returncode == 0, r.stderr
    assert "verified" in r.stdout
    assert json.loads(report.read_text())["fused"] == SMALL["layers"]
    # the input folder is exactly as it was; the output folder holds the model and its renamed data copy
    assert _digests(src) == before
    copied = out_dir / "enc.flash.onnx.enc.data"
    assert sorted(p.name for p in out_dir.iterdir()) == ["enc.flash.onnx", copied.name]
    assert _sha(copied) == before["enc.data"]
    assert _locations(out) == {copied.name}
    assert sum(n.op_type == "FlashAttention" for n in onnx.load(str(out), load_external_data=False).graph.node) == 2
    # the output stands alone: without the source folder it runs and gives the original's outputs
    expected = _run_ort(src / "enc.onnx")
    for f in src.iterdir():
        f.unlink()
    src.rmdir()
    np.testing.assert_allclose(_run_ort(out), expected, rtol=1e-4, atol=1e-5)


def test_optimize_into_the_same_folder_shares_the_data(src, tmp_path):
    before = _digests(src)
    out = src / "enc.flash.onnx"
    r = _cli(
        "optimize", src / "enc.onnx", "-o", out, "--verify", "--json", tmp_path / "report.json", "--target", "ortflash"
    )
    assert r.returncode == 0, r.stderr
    assert "verified" in r.stdout
    assert json.loads((tmp_path / "report.json").read_text())["fused"] == SMALL["layers"]
    after = _digests(src)
    assert sorted(after) == sorted([*before, "enc.flash.onnx"])  # no second data file, no leftovers
    assert {k: after[k] for k in before} == before
    assert _locations(out) == {"enc.data"}


def test_default_output_name_next_to_the_input(src):
    before = _digests(src)
    r = _cli("optimize", "enc.onnx", cwd=src)  # relative paths: the data is shared, not copied onto itself
    assert r.returncode == 0, r.stderr
    assert sorted(_digests(src)) == sorted([*before, "enc.flash.onnx"])
    assert _digests(src)["enc.data"] == before["enc.data"]
    assert _locations(src / "enc.flash.onnx") == {"enc.data"}


def _one_error_line(r):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ortflash: error:"), r.stderr
    return lines[0]


def test_missing_external_data_is_exit_2_with_one_line(src, tmp_path):
    (src / "enc.data").unlink()
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    line = _one_error_line(_cli("optimize", src / "enc.onnx", "-o", out_dir / "enc.flash.onnx", "--verify"))
    assert "enc.data" in line
    assert list(out_dir.iterdir()) == []  # nothing written, no temporary left behind
    assert sorted(p.name for p in src.iterdir()) == ["enc.onnx"]


@pytest.mark.parametrize("weights", ["external", "inline"])
def test_truncated_model_is_exit_2_with_one_line(src, tmp_path, weights):
    if weights == "external":
        path = src / "enc.onnx"  # the graph file; its data file is intact beside it
    else:
        path = tmp_path / "inline.onnx"
        onnx.save(onnx.load(str(src / "enc.onnx")), str(path))  # weights inside the file
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    out = tmp_path / "never.onnx"
    line = _one_error_line(_cli("optimize", path, "-o", out))
    assert str(path) in line
    assert not out.exists()
