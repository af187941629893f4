"""ortflash.bench: result structure and files (no timing assertions: machines are shared and noisy)."""

import json
import math
import os

import pytest

from ortflash import bench as B

ZOO = os.path.join(os.path.dirname(__file__), "..", "models")


def _tiny_zoo_model():
    for name in ("bert_sdpa_dynamo.onnx", "bert_eager_torchscript.onnx", "bert_eager_dynamo.onnx", "bert_sdpa_torchscript.onnx"):
        path = os.path.join(ZOO, name)
        if os.path.exists(path):
            return path
    pytest.skip("no BERT model in models/")


def _number(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


def test_bench_runs_each_variant_and_writes_results(tmp_path):
    path = _tiny_zoo_model()
    res = B.bench(path, seq_lens=(8, 16), variants=("original", "online"), batch=1, repeats=2, out_dir=tmp_path,
                  profile=8, progress=False, name="tiny")
    runs = res["runs"]
    assert [(r["seq_len"], r["variant"]) for r in runs] == [(8, "original"), (8, "online"), (16, "original"), (16, "online")]
    pids = set()
    for r in runs:
        assert r["status"] == "ok", r.get("error")
        lat, mem = r["latency_ms"], r["memory_mb"]
        assert _number(lat["median"]) and lat["median"] > 0
        assert len(lat["runs"]) == 2 and all(t > 0 for t in lat["runs"])
        assert _number(lat["cpu_median"])
        for key in ("inference_peak", "process_peak", "ru_maxrss"):
            assert _number(mem[key]), key
        assert mem["inference_peak"] >= 0 and mem["process_peak"] > 0 and mem["ru_maxrss"] > 0
        assert r["feeds"] and all(r["seq_len"] in shape for shape in r["feeds"].values())
        pids.add(r["pid"])
    assert len(pids) == 4  # one process per (variant, S)

    online = [r for r in runs if r["variant"] == "online"]
    for r in online:
        assert r["build"]["fused"] >= 1
        assert any(k.endswith("FlashAttention") for k in r["ort_graph_ops"])
        assert r["bridge_ms"]["kernel"] > 0 and r["bridge_ms"]["hook"] >= r["bridge_ms"]["kernel"]
    assert "per_op_ms" in online[0]["profile"]  # profiled at S=8 only
    assert "profile" not in online[1]
    assert {"original", "online"} <= set(res["ratios"]["8"])
    assert _number(res["ratios"]["16"]["online"]["speedup"])

    assert res["machine"]["usable_cores"] >= 1 and res["versions"]["onnxruntime"]
    for key in ("json", "md"):
        assert os.path.getsize(res["files"][key]) > 0
    on_disk = json.loads((tmp_path / "tiny.json").read_text())
    assert on_disk["runs"][0]["latency_ms"]["median"] == runs[0]["latency_ms"]["median"]
    md = (tmp_path / "tiny.md").read_text()
    assert "| 16 |" in md and "online" in md
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "png" not in res["files"]
    else:
        assert (tmp_path / "tiny.png").stat().st_size > 0


def test_failed_or_unknown_variants_are_recorded(tmp_path):
    path = _tiny_zoo_model()
    with pytest.raises(ValueError):
        B.bench(path, seq_lens=(8,), variants=("original", "fastest"), progress=False)
    res = B.bench(path, seq_lens=(8, 16), variants=(f"broken={tmp_path / 'missing.onnx'}",), repeats=1,
                  profile=False, progress=False, plot=False)
    first, second = res["runs"]
    assert first["status"] == "error" and "missing.onnx" in first["error"]
    assert second["status"] == "skipped"  # not run again at a larger S


def test_merge_rounds_pools_timed_runs():
    def run(times, mem):
        return {"status": "ok", "variant": "v", "seq_len": 8,
                "latency_ms": {"median": sorted(times)[len(times) // 2], "runs": times, "cpu_runs": times},
                "memory_mb": {"inference_peak": mem, "process_peak": 100 + mem}}

    merged = B.merge_rounds([run([1.0, 2.0, 3.0], 5.0), run([10.0, 11.0, 12.0], 7.0)])
    assert merged["latency_ms"]["median"] == 6.5 and merged["latency_ms"]["repeats"] == 6
    assert merged["memory_mb"]["inference_peak"] == 7.0 and merged["rounds"] == 2
    only = B.merge_rounds([{"status": "timeout", "variant": "v", "seq_len": 8}])
    assert only["status"] == "timeout"


def test_variant_names_and_cli_arguments():
    assert B.parse_variant("online@256") == ("online@256", "online", 256, None)
    assert B.parse_variant("mha=x.onnx") == ("mha", "file", None, "x.onnx")
    with pytest.raises(ValueError):
        B.parse_variant("online@0")
    import argparse

    p = argparse.ArgumentParser()
    B.add_arguments(p)
    args = p.parse_args(["m.onnx", "--seq-lens", "512,1024", "--variants", "original,online@128", "--out", "d"])
    assert args.seq_lens == [512, 1024] and args.variants == ["original", "online@128"] and args.out == "d"


def test_memory_probe_sees_an_allocation():
    import numpy as np

    probe = B.PeakProbe()
    before = B._rss()
    probe.start()
    x = np.ones(64 * 2**20 // 8)  # 64 MiB, touched
    del x
    peak = probe.stop()
    assert peak - before > 32 * 2**20
