"""``optimize --tune`` (issue 20): the candidates measured here, the fastest kept only where it is
at least as fast as the original at every length, and the choice cached by model, EP, machine and
versions. What is timed is not asserted (speed belongs to benchmarks); what is chosen from the
measured numbers, and what the cache returns, is."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import onnx
import pytest

from ortflash.errors import OrtflashError
from ortflash.model_io import load
from ortflash.pipeline import tune
from ortflash.pipeline.tune import TuneSettings, optimize_tuned

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def _stack(tmp_path: Path) -> Path:
    from cpu_attention import build_model

    path = tmp_path / "stack.onnx"
    onnx.save(build_model(layers=1, stack="padding", heads=2, head_dim=32), path)
    return path


@pytest.mark.parametrize(
    ("ratios", "chosen"),
    [
        ({"fused": {64: 0.94, 1024: 1.40}}, "original"),  # slower at one length: never taken
        ({"fused": {64: 1.02, 1024: 1.40}}, "fused"),
        ({"fused": {64: 1.02, 1024: 1.60}, "table": {64: 1.10, 1024: 1.30}}, "fused"),  # geomean 1.28 > 1.20
        ({"fused": {64: 1.00, 1024: 1.10}, "table": {64: 1.10, 1024: 1.30}}, "table"),
        ({"fused": {64: None, 1024: 3.0}}, "original"),  # a failed run is not a win
        ({}, "original"),
    ],
)
def test_the_fastest_candidate_is_taken_only_where_it_is_never_slower(ratios, chosen):
    assert tune.choose_fastest(ratios) == chosen


def test_the_key_changes_with_the_model_the_lengths_the_ep_and_the_policy(tmp_path):
    model = onnx.load(_stack(tmp_path))
    base = tune.cache_key(model, ep="cpu", seq_lens=[64], policy="naive", target=None)
    assert base == tune.cache_key(model, ep="cpu", seq_lens=[64], policy="naive", target=None)
    other = onnx.ModelProto()
    other.CopyFrom(model)
    other.graph.initializer[0].float_data.append(0.0)  # one weight more
    assert base != tune.cache_key(other, ep="cpu", seq_lens=[64], policy="naive", target=None)
    assert base != tune.cache_key(model, ep="cpu", seq_lens=[128], policy="naive", target=None)
    assert base != tune.cache_key(model, ep="webgpu", seq_lens=[64], policy="naive", target=None)
    assert base != tune.cache_key(model, ep="cpu", seq_lens=[64], policy="auto", target=None)
    assert {"cpu", "cores", "ortflash", "onnxruntime", "onnx"} <= set(tune.machine())


def _cached(cache: Path, path: Path, seq_lens: tuple[int, ...], chosen: str, ratios: dict) -> None:
    from ortflash.op.policy import SoftmaxPolicy

    policy = json.dumps(SoftmaxPolicy.for_new_nodes().attributes(), sort_keys=True)  # the default policy
    key = tune.cache_key(
        load(path), ep="cpu", seq_lens=seq_lens, policy=policy, target=None, weights_dir=str(path.parent)
    )
    cache.mkdir(parents=True, exist_ok=True)
    doc = {"schema": tune.CACHE_SCHEMA, "chosen": chosen, "ratios": ratios}
    (cache / f"{key}.json").write_text(json.dumps(doc))


def test_a_cached_choice_is_taken_without_timing_anything(tmp_path, monkeypatch):
    path, cache = _stack(tmp_path), tmp_path / "cache"

    def no_timing(*args, **kw):
        raise AssertionError("a cached choice must not be measured again")

    import ortflash.bench.sweep as sweep

    monkeypatch.setattr(sweep, "bench", no_timing)
    settings = TuneSettings(seq_lens=(2048,), cache_dir=str(cache))
    _cached(cache, path, (2048,), "original", {"fused": {"2048": 0.8}})
    out, report = optimize_tuned(path, settings, seq_lens=[2048])
    assert report.fused == 0 and out.SerializeToString() == onnx.load(path).SerializeToString()
    assert report.target is not None and "cached measurement" in report.target.why
    assert report.blocks[0].reason == "the original ops measured faster here (--tune)"  # not "kept: kept the ..."
    assert "fused 0.80x" in report.blocks[0].detail and "took original" in report.blocks[0].detail

    _cached(cache, path, (2048,), "fused", {"fused": {"2048": 1.5}})
    out, report = optimize_tuned(path, settings, seq_lens=[2048])
    assert report.fused == 1 and [n.op_type for n in out.graph.node].count("FlashAttention") == 1
    assert report.blocks[0].reason.endswith("measured fastest here (--tune)")
    assert "took fused" in report.blocks[0].detail


def test_a_tuned_fused_model_is_not_said_to_keep_the_original_ops(tmp_path, monkeypatch):
    """Issue 33 item 15: '1 of 1 fused' beside the cost table's 'every fused block then kept the
    original ops' (at 64 keys the table keeps the block; the measurement fused it)."""
    path, cache = _stack(tmp_path), tmp_path / "cache"
    import ortflash.bench.sweep as sweep

    monkeypatch.setattr(sweep, "bench", lambda *a, **k: pytest.fail("a cached choice is not measured"))
    _cached(cache, path, (64,), "fused", {"fused": {"64": 1.3}})
    out, report = optimize_tuned(path, TuneSettings(seq_lens=(64,), cache_dir=str(cache)), seq_lens=[64])
    assert report.fused == 1 and "took fused" in report.target.why
    assert "then kept the original ops" not in report.target.why


def test_a_measurement_is_written_to_the_cache_and_the_choice_follows_its_numbers(tmp_path):
    path, cache = _stack(tmp_path), tmp_path / "cache"
    settings = TuneSettings(seq_lens=(32, 256), cache_dir=str(cache), repeats=3, rounds=1)
    out, report = optimize_tuned(path, settings, seq_lens=[32, 256])
    (entry,) = cache.glob("*.json")
    doc = json.loads(entry.read_text())
    assert set(doc["ratios"]) == {"fused"} and set(doc["ratios"]["fused"]) == {"32", "256"}
    ratios = {label: {int(s): r for s, r in by_len.items()} for label, by_len in doc["ratios"].items()}
    assert doc["chosen"] == tune.choose_fastest(ratios)
    assert report.fused == (0 if doc["chosen"] == "original" else 1)
    assert doc["machine"]["cores"] and doc["date"]


def test_tune_with_a_named_target_or_another_ep_is_refused(tmp_path):
    from ortflash.errors import OrtflashError

    path = _stack(tmp_path)
    with pytest.raises(OrtflashError, match="--tune"):
        optimize_tuned(path, TuneSettings(seq_lens=(64,)), target="ortflash", seq_lens=[64])
    with pytest.raises(OrtflashError, match="--tune"):
        optimize_tuned(path, TuneSettings(seq_lens=(64,)), ep="webgpu", seq_lens=[64])


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--tune"], "give --seq-lens"),
        (["--tune", "--seq-lens", "64", "--target", "ortflash"], "--target ortflash is written as asked"),
        (["--tune-cache", "x"], "--tune-cache goes with --tune"),
    ],
)
def test_the_cli_refuses_a_tune_it_cannot_measure_in_one_line(tmp_path, options, says):
    import subprocess

    path = _stack(tmp_path)
    before = path.read_bytes()
    run = subprocess.run(
        [sys.executable, "-m", "ortflash", "optimize", str(path), "-o", str(tmp_path / "out.onnx"), *options],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and says in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert path.read_bytes() == before and not (tmp_path / "out.onnx").exists()


def _stack_with_weights_in(tmp_path: Path, location: str) -> Path:
    """The stack saved with its weights in ``location`` (not MODEL.data), as Hugging Face and
    torch exports name them."""
    from cpu_attention import build_model

    path = tmp_path / "model.onnx"
    model = build_model(layers=1, stack="padding", heads=2, head_dim=32)
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=location)
    assert (tmp_path / location).stat().st_size > 10_000
    return path


@pytest.mark.parametrize("location", ["model.onnx_data", "model.onnx.data"])
def test_tune_times_a_model_whose_weights_are_where_its_tensors_say(tmp_path, location):
    path, cache = _stack_with_weights_in(tmp_path, location), tmp_path / "cache"
    settings = TuneSettings(seq_lens=(32,), cache_dir=str(cache), repeats=1, rounds=1)
    out, report = optimize_tuned(path, settings, seq_lens=[32])
    (entry,) = cache.glob("*.json")
    ratios = json.loads(entry.read_text())["ratios"]
    assert set(ratios) == {"fused"} and ratios["fused"]["32"] is not None and ratios["fused"]["32"] > 0
    assert "-/-" not in report.target.why and "fused -;" not in report.target.why


def test_the_key_hashes_the_external_weights_not_only_the_graph(tmp_path, monkeypatch):
    """Two models of one graph whose external data differs are two models: one's cached timings are
    not the other's (the key hashed the graph only, which names the data file, not its bytes)."""
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    path_a, path_b = _stack_with_weights_in(first, "model.onnx_data"), _stack_with_weights_in(second, "model.onnx_data")
    data = bytearray((second / "model.onnx_data").read_bytes())
    data[:4] = bytes(4)  # other weights, the same graph
    (second / "model.onnx_data").write_bytes(bytes(data))
    assert load(path_a).SerializeToString() == load(path_b).SerializeToString()

    def key(path: Path) -> str:
        return tune.cache_key(
            load(path), ep="cpu", seq_lens=[32], policy="naive", target=None, weights_dir=str(path.parent)
        )

    assert key(path_a) != key(path_b)
    copy = tmp_path / "c"
    copy.mkdir()
    path_c = _stack_with_weights_in(copy, "model.onnx_data")  # the same weights elsewhere: the same key
    assert key(path_a) == key(path_c)

    cache = tmp_path / "cache"
    _cached(cache, path_a, (32,), "fused", {"fused": {"32": 1.5}})
    import ortflash.bench.sweep as sweep

    timed: list[object] = []
    real = sweep.bench
    monkeypatch.setattr(sweep, "bench", lambda *a, **k: timed.append(a) or real(*a, **k))
    settings = TuneSettings(seq_lens=(32,), cache_dir=str(cache), repeats=1, rounds=1)
    optimize_tuned(path_b, settings, seq_lens=[32])
    assert timed, "b's weights are not a's: b is measured, not read from a's cache entry"
    assert len(list(cache.glob("*.json"))) == 2


def test_a_timing_that_failed_is_an_error_and_is_not_cached(tmp_path):
    path, cache = _stack_with_weights_in(tmp_path, "model.onnx_data"), tmp_path / "cache"
    data = tmp_path / "model.onnx_data"
    data.write_bytes(data.read_bytes()[:1000])  # ONNX Runtime cannot read the weights: every cell fails
    settings = TuneSettings(seq_lens=(32,), cache_dir=str(cache), repeats=1, rounds=1)
    with pytest.raises(OrtflashError, match=r"--tune could not time original at S=32 \(error: .*nothing cached"):
        optimize_tuned(path, settings, seq_lens=[32])
    assert list(cache.glob("*.json")) == []


def test_a_cached_failed_timing_is_measured_again(tmp_path):
    path, cache = _stack_with_weights_in(tmp_path, "model.onnx_data"), tmp_path / "cache"
    _cached(cache, path, (32,), "original", {"fused": {"32": None}})  # what an earlier version cached
    settings = TuneSettings(seq_lens=(32,), cache_dir=str(cache), repeats=1, rounds=1)
    optimize_tuned(path, settings, seq_lens=[32])
    (entry,) = cache.glob("*.json")
    assert json.loads(entry.read_text())["ratios"]["fused"]["32"] is not None


def test_the_cli_says_a_failed_tune_in_one_line_exit_2(tmp_path):
    import subprocess

    path = _stack_with_weights_in(tmp_path, "model.onnx_data")
    data = tmp_path / "model.onnx_data"
    data.write_bytes(data.read_bytes()[:1000])
    cache = tmp_path / "cache"
    run = subprocess.run(
        [sys.executable, "-m", "ortflash", "optimize", str(path), "-o", str(tmp_path / "out.onnx")]
        + ["--tune", "--seq-lens", "32", "--tune-cache", str(cache)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "--tune could not time" in run.stderr and not (tmp_path / "out.onnx").exists()
    assert not cache.exists() or list(cache.glob("*.json")) == []
