"""ortflash.bench: structure and behaviour (no timing assertions: machines are shared and noisy)."""

import json
import math
import os
import subprocess
import sys

import onnx
import pytest

from ortflash import bench as B
from ortflash.bench import inputs, probes, sgemm, sweep, worker
from ortflash.errors import OrtflashError

ZOO = os.path.join(os.path.dirname(__file__), "..", "models")


def _zoo_model(*names):
    for name in names:
        path = os.path.join(ZOO, name)
        if os.path.exists(path):
            return path
    pytest.skip(f"none of {names} in models/")


def _tiny_zoo_model():
    return _zoo_model(
        "bert_sdpa_dynamo.onnx", "bert_eager_torchscript.onnx", "bert_eager_dynamo.onnx", "bert_sdpa_torchscript.onnx"
    )


def _number(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


def test_bench_runs_each_variant_and_writes_results(tmp_path):
    path = _tiny_zoo_model()
    res = B.bench(
        path,
        seq_lens=(8, 16),
        variants=("original", "online"),
        batch=1,
        repeats=2,
        out_dir=tmp_path,
        profile=8,
        progress=False,
        name="tiny",
        sgemm_size=256,
    )
    runs = res["runs"]
    assert [(r["seq_len"], r["variant"]) for r in runs] == [
        (8, "original"),
        (8, "online"),
        (16, "original"),
        (16, "online"),
    ]
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
        # the kernel called directly on the fused nodes' own inputs, beside the session's time
        assert r["kernel_ms"]["median"] > 0 and r["kernel_ms"]["nodes"] == r["build"]["fused"]
        assert r["session_over_kernel"] == pytest.approx(r["latency_ms"]["median"] / r["kernel_ms"]["median"], rel=1e-2)
        # attention's two products over the fused nodes' own shapes, as GFLOP/s of the direct kernel
        # and as a fraction of the same run's sgemm rate
        assert r["attention_flops"] > 0 and r["attention_flops"] % (4 * r["seq_len"] ** 2) == 0
        assert r["kernel_gflops"] == pytest.approx(r["attention_flops"] / r["kernel_ms"]["median"] / 1e6, rel=1e-2)
        assert r["kernel_vs_sgemm"] == pytest.approx(r["kernel_gflops"] / res["sgemm"]["gflops"], rel=1e-2)
    assert "original" not in [r["variant"] for r in runs if "kernel_ms" in r]
    assert "kernel_gflops" not in runs[0]
    rate = res["sgemm"]
    assert rate["start"]["status"] == rate["end"]["status"] == "ok" and rate["start"]["size"] == 256
    assert rate["gflops"] == max(rate["start"]["gflops"], rate["end"]["gflops"]) > 0
    assert "numpy.matmul float32 256 x 256 x 256" in rate["method"]
    assert "per_op_ms" in online[0]["profile"]  # profiled at S=8 only
    assert online[0]["node_over_kernel"] > 0  # the FlashAttention nodes in ORT vs the kernel alone
    assert "profile" not in online[1]
    assert {"original", "online"} <= set(res["ratios"]["8"])
    assert _number(res["ratios"]["16"]["online"]["speedup"])

    assert res["machine"]["usable_cores"] >= 1 and res["versions"]["onnxruntime"]
    for key in ("json", "md"):
        assert os.path.getsize(res["files"][key]) > 0
    on_disk = json.loads((tmp_path / "tiny.json").read_text())
    assert on_disk["runs"][0]["latency_ms"]["median"] == runs[0]["latency_ms"]["median"]
    md = (tmp_path / "tiny.md").read_text()
    assert "| 16 |" in md and "online" in md and "session / kernel" in md
    assert "of sgemm" in md and f"sgemm rate: {rate['gflops']} GFLOP/s" in md
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "png" not in res["files"]
    else:
        assert (tmp_path / "tiny.png").stat().st_size > 0


def _hook_objects():
    """Every object a benchmark could have swapped: module attributes of the bridge and of
    onnxruntime-extensions' Python-op module, the registered op bodies, and ortflash's modules."""
    from onnxruntime_extensions import _ocos

    from ortflash.kernels import native_op, ort_bridge

    # the plain sessions' op is chosen once per process (native_op.provide_contrib_op): choose it
    # before the snapshot, so a first choice made by the benchmark is not read as a swap
    native_op.provide_contrib_op()
    seen = {}
    for mod in [m for name, m in sys.modules.items() if name.startswith("ortflash") and m is not None] + [_ocos]:
        for attr, value in list(vars(mod).items()):
            seen[(mod.__name__, attr)] = value
    for op_id, opdef in _ocos.Opdef._odlist.items():
        seen[("opdef", op_id)] = opdef.body
    seen[("class", "PyCustomOpDef.install_hooker")] = _ocos.PyCustomOpDef.__dict__.get("install_hooker")
    assert ort_bridge  # imported: its hook is installed before the snapshot
    return seen


def test_worker_runs_the_production_bridge_untouched(tmp_path):
    before = _hook_objects()
    cfg = {
        "model": _tiny_zoo_model(),
        "variant": "online",
        "seq_len": 8,
        "batch": 1,
        "repeats": 1,
        "warmup": 1,
        "block_size": 64,
        "profile": True,
        "threads": None,
        "result_file": str(tmp_path / "r.json"),
    }
    res = worker.run_worker(cfg)  # in this process, so a patch would be visible here
    assert res["status"] == "ok" and res["kernel_ms"]["median"] > 0
    after = _hook_objects()
    replaced = [key for key, obj in before.items() if key in after and after[key] is not obj]
    assert not replaced, f"the bench worker replaced {replaced}"


def test_failed_or_unknown_variants_are_recorded(tmp_path):
    path = _tiny_zoo_model()
    with pytest.raises(OrtflashError, match="unknown variant 'fastest'"):  # one line, exit 2 in the CLI
        B.bench(path, seq_lens=(8,), variants=("original", "fastest"), progress=False)
    with pytest.raises(OrtflashError, match="missing.onnx: no such file"):  # before any worker starts
        B.bench(path, seq_lens=(8,), variants=(f"broken={tmp_path / 'missing.onnx'}",), progress=False)
    # a model file that reads but that ONNX Runtime cannot open: an error cell, not run at larger S
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"], domain="no.such.domain")],
        "broken",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    broken = tmp_path / "broken.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), broken)
    res = B.bench(
        path,
        seq_lens=(8, 16),
        variants=(f"broken={broken}",),
        repeats=1,
        profile=False,
        progress=False,
        plot=False,
    )
    first, second = res["runs"]
    assert first["status"] == "error" and "ONNXRuntimeError" in first["error"], first
    assert second["status"] == "skipped"  # not run again at a larger S


def test_merge_rounds_pools_timed_runs():
    def run(times, mem):
        return {
            "status": "ok",
            "variant": "v",
            "seq_len": 8,
            "latency_ms": {"median": sorted(times)[len(times) // 2], "runs": times, "cpu_runs": times},
            "memory_mb": {"inference_peak": mem, "process_peak": 100 + mem},
        }

    merged = B.merge_rounds([run([1.0, 2.0, 3.0], 5.0), run([10.0, 11.0, 12.0], 7.0)])
    assert merged["latency_ms"]["median"] == 6.5 and merged["latency_ms"]["repeats"] == 6
    assert merged["memory_mb"]["inference_peak"] == 7.0 and merged["rounds"] == 2
    only = B.merge_rounds([{"status": "timeout", "variant": "v", "seq_len": 8}])
    assert only["status"] == "timeout"


def test_variant_names_and_cli_arguments():
    assert B.parse_variant("online@256") == ("online@256", "online", 256, None)
    assert B.parse_variant("reference@128").kind == "reference"
    assert B.parse_variant("mha=x.onnx") == ("mha", "file", None, "x.onnx")
    assert B.parse_variant("torch-sdpa").kind == "torch-sdpa"
    for bad in ("online@0", "contrib@64", "fastest"):
        with pytest.raises(ValueError):
            B.parse_variant(bad)
    import argparse

    p = argparse.ArgumentParser()
    B.add_arguments(p)
    args = p.parse_args(
        [
            "m.onnx",
            "--seq-lens",
            "512,1024",
            "--variants",
            "original,online@128",
            "--out",
            "d",
            "--isa",
            "avx2",
            "--baseline",
            "b.json",
            "--max-slowdown",
            "2.5",
        ]
    )
    assert args.seq_lens == [512, 1024] and args.variants == ["original", "online@128"] and args.out == "d"
    assert args.isa == "avx2" and args.baseline == "b.json" and args.max_slowdown == 2.5
    assert p.parse_args(["m.onnx"]).block_size == 128  # spec's default


def test_attention_flops_count_the_two_products_of_the_visible_pairs():
    assert sgemm.attention_flops((1, 12, 4096, 64), (1, 12, 4096, 64), (1, 12, 4096, 64), 0) == 4 * 4096**2 * 64 * 12
    assert sgemm.visible_pairs(4, 4, 1) == 10  # 1 + 2 + 3 + 4: about half, the diagonal included
    assert sgemm.visible_pairs(2, 4, 2) == 3 + 4  # is_causal=2: the rows end at the last keys
    assert sgemm.visible_pairs(4, 2, 2) == 0 + 0 + 1 + 2
    # GQA and Dv != D: per query head, 2 * pairs * (D + Dv)
    assert sgemm.attention_flops((2, 8, 3, 16), (2, 2, 5, 16), (2, 2, 5, 24), 0) == 2 * 2 * 8 * 15 * (16 + 24)
    runs = [{"status": "ok", "attention_flops": 2e9, "kernel_ms": {"median": 20.0}}, {"status": "ok"}]
    sgemm.kernel_rates(runs, 200.0)
    assert (runs[0]["kernel_gflops"], runs[0]["kernel_vs_sgemm"]) == (100.0, 0.5) and "kernel_gflops" not in runs[1]


@pytest.mark.parametrize(
    "option", [["--block-size", "0"], ["--repeats", "0"], ["--max-slowdown", "0.5"], ["--sgemm-size", "-1"]]
)
def test_bad_numbers_exit_2_with_one_line(option):
    proc = subprocess.run(
        [sys.executable, "-m", "ortflash", "bench", _tiny_zoo_model(), *option],
        check=False,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and option[0] in errors[0], proc.stderr


def test_feeds_follow_the_models_declared_dims():
    bert = onnx.load(_tiny_zoo_model(), load_external_data=False)
    feeds = inputs.bench_feeds(bert, 64, batch=1)
    assert all(v.shape == (1, 64) for v in feeds.values())
    # the position table caps S: a clear refusal instead of ORT's "invalid expand shape"
    assert "128 positions" in inputs.unsupported_length(bert, 256)
    assert inputs.unsupported_length(bert, 128) is None
    keep, notes = sweep.plan_lengths(_tiny_zoo_model(), [64, 256], None)
    assert keep == [64] and "S=256" in notes[0]
    with pytest.raises(OrtflashError, match="128 positions"):
        sweep.plan_lengths(_tiny_zoo_model(), [256], None)

    vit_path = _zoo_model("vit_sdpa_dynamo.onnx", "vit_eager_dynamo.onnx", "vit_sdpa_torchscript.onnx")
    vit = onnx.load(vit_path, load_external_data=False)
    assert not inputs.has_sequence_dim(vit)
    assert [v.shape for v in inputs.bench_feeds(vit, 256, batch=1).values()] == [(1, 3, 32, 32)]
    keep, notes = sweep.plan_lengths(vit_path, None, None)
    assert keep == [inputs.FIXED_SIZE] and "no sequence dimension" in notes[0]
    with pytest.raises(OrtflashError, match="no sequence dimension"):
        sweep.plan_lengths(vit_path, [256], None)


def test_bert_at_s256_is_refused_in_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "ortflash", "bench", _tiny_zoo_model(), "--seq-lens", "256"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "invalid expand shape" not in proc.stderr + proc.stdout
    assert proc.stderr.strip().count("\n") == 0 and "128 positions" in proc.stderr


def test_baseline_guard_exit_codes(tmp_path):
    model = _tiny_zoo_model()
    common = [
        model,
        "--seq-lens",
        "16",
        "--variants",
        "original,online",
        "--repeats",
        "2",
        "--no-profile",
        "--out",
        str(tmp_path),
    ]
    assert B.main(common + ["--name", "first"]) == 0
    first = json.loads((tmp_path / "first.json").read_text())
    own = B.compare_baseline(first, first, 1.0)  # the JSON bench writes is a valid baseline
    assert own.ok and any("online at S=16" in line for line in own.lines)
    # a generous margin: this run against the first one's JSON
    assert (
        B.main(common + ["--name", "second", "--baseline", str(tmp_path / "first.json"), "--max-slowdown", "20"]) == 0
    )
    doctored = json.loads((tmp_path / "first.json").read_text())
    for r in doctored["runs"]:
        if r["variant"] == "online":  # pretend online once ran 1000x faster than it does
            r["latency_ms"]["median"] /= 1000
    (tmp_path / "doctored.json").write_text(json.dumps(doctored))
    check = B.compare_baseline(first, doctored, 20)
    assert not check.ok and "online at S=16" in check.regressions[0]
    assert (
        B.main(common + ["--name", "third", "--baseline", str(tmp_path / "doctored.json"), "--max-slowdown", "20"]) == 1
    )
    assert "REGRESSION" in (tmp_path / "third.md").read_text()
    with pytest.raises(OrtflashError):
        B.load_baseline(tmp_path / "third.md")


def test_memory_probe_sees_an_allocation():
    import numpy as np

    probe = probes.PeakProbe()
    before = probes.rss()
    probe.start()
    x = np.ones(64 * 2**20 // 8)  # 64 MiB, touched
    del x
    peak = probe.stop()
    assert peak - before > 32 * 2**20


def test_cpu_attention_stacks_fuse(tmp_path):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    try:
        import cpu_attention
    finally:
        sys.path.pop(0)
    import ortflash

    for stack in cpu_attention.STACKS:
        model = cpu_attention.build_model(1, stack=stack)
        fused, report = ortflash.optimize(model, softmax="online", min_seq_len=0, target="ortflash")
        assert report.fused == 1, stack
        node = next(n for n in fused.graph.node if n.op_type == "FlashAttention")
        causal = next(a.i for a in node.attribute if a.name == "is_causal")
        assert causal == (stack in ("causal", "causal_mask")), stack
        feeds = inputs.bench_feeds(model, 256, batch=1)
        assert feeds["hidden_states"].shape == (1, 256, 768)


def _bench_doc(threads, wall, cpu):
    """A results document of `ortflash bench`: original and online at S=1024, (wall, cpu) ms each."""
    runs = [
        {"variant": v, "seq_len": 1024, "status": "ok", "latency_ms": {"median": w, "cpu_median": c}}
        for v, w, c in (("original", wall[0], cpu[0]), ("online", wall[1], cpu[1]))
    ]
    return {"config": {"seq_lens": [1024], "threads": threads}, "runs": runs}


def test_the_guard_reads_cpu_time_at_one_thread_and_catches_a_1_3x_regression_that_load_hides():
    from ortflash.bench.baseline import compare

    baseline = _bench_doc(1, wall=(100.0, 80.0), cpu=(100.0, 80.0))
    # a loaded run: the wall clock of the original doubled, so the wall ratio looks better, but the
    # fused op's own work (CPU time) is 1.35x the baseline's ratio
    loaded = _bench_doc(1, wall=(200.0, 110.0), cpu=(100.0, 108.0))
    check = compare(loaded, baseline, max_slowdown=1.3)
    assert not check.ok and "cpu time" in check.regressions[0]
    quiet = _bench_doc(1, wall=(100.0, 82.0), cpu=(100.0, 84.0))
    assert compare(quiet, baseline, max_slowdown=1.3).ok
    # runs at the libraries' own threads are compared on wall time, as before
    assert compare(_bench_doc(None, wall=(200.0, 110.0), cpu=(100.0, 108.0)), baseline, max_slowdown=1.3).ok


@pytest.mark.parametrize("location", ["model.onnx_data", "model.onnx.data", "weights/w.bin"])
def test_bench_reads_the_weights_where_the_models_tensors_say(tmp_path, location):
    """Issue 33 item 7: every cell failed, the original's too, where the weights were not in MODEL.data."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    from cpu_attention import build_model

    path = tmp_path / "khmersm.onnx"  # a model named otherwise than its weights file, as exports ship
    (tmp_path / "weights").mkdir()
    model = build_model(layers=1, stack="padding", heads=2, head_dim=32)
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=location)
    res = B.bench(
        path, seq_lens=(16,), variants=("original", "online"), repeats=1, profile=False, progress=False, sgemm_size=0
    )
    assert [(r["variant"], r["status"]) for r in res["runs"]] == [("original", "ok"), ("online", "ok")], [
        r.get("error") for r in res["runs"]
    ]


def _bad_inputs(tmp_path):
    """(model, extra options) of each bad input of issue 33 item 8."""
    good = _tiny_zoo_model()
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(open(good, "rb").read()[:300])
    text = tmp_path / "notes.onnx"
    text.write_text("not a model\n")
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    folder = tmp_path / "a_folder"
    folder.mkdir()
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    return {
        "truncated": (truncated, []),
        "not onnx": (text, []),
        "empty": (empty, []),
        "a folder": (folder, []),
        "--out is a file": (good, ["--out", str(a_file)]),
        "--out under a file": (good, ["--out", str(a_file / "sub")]),
        "a variant's file is not onnx": (good, ["--variants", f"original,mine={text}"]),
    }


@pytest.mark.parametrize(
    "case",
    [
        "truncated",
        "not onnx",
        "empty",
        "a folder",
        "--out is a file",
        "--out under a file",
        "a variant's file is not onnx",
    ],
)
def test_bad_input_is_one_line_exit_2_before_anything_runs(tmp_path, case):
    model, options = _bad_inputs(tmp_path)[case]
    proc = subprocess.run(
        [sys.executable, "-m", "ortflash", "bench", str(model), "--seq-lens", "16", "--sgemm-size", "0", *options],
        check=False,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("ortflash: error: "), proc.stderr
    assert "sequence dimension" not in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == "" and not (tmp_path / "bench-results").exists()


def test_a_variant_given_as_a_file_runs_its_nodes_on_the_native_op(tmp_path):
    # `--variants original,default=D.onnx` times what `optimize` wrote: its FlashAttention nodes must run
    # as a user's ortflash.InferenceSession runs them (the native op), not through the Python bridge
    import ortflash
    from ortflash.bench import variants

    fused, report = ortflash.optimize(onnx.load("models/bert_sdpa_dynamo.onnx"), target="ortflash")
    assert report.fused == 2
    path = tmp_path / "fused.onnx"
    onnx.save(fused, str(path))
    built = variants.build_variant("models/bert_sdpa_dynamo.onnx", variants.parse_variant(f"fused={path}"))
    session, _ = variants.open_session(built, built.model, variants.session_options(1), 1)
    assert isinstance(session, ortflash.InferenceSession)
    assert session.native_nodes == 2
