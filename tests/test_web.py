"""web-check: lowered models give ONNX Runtime's answers in onnxruntime-web (wasm) and onnxruntime-node.

Node.js is required here: without it these tests fail (web_check raises), they do not skip; so are
Debian's chromium and chromium-driver for the browser tests (.ci/run installs them). Python's
WebGPU plugin EP runs where installed with an adapter; elsewhere its error must be one clean line.
"""

import json
import os
import shutil
import subprocess

import numpy as np
import onnx
import pytest
from attention_graphs import Variant, build
from onnx import TensorProto, helper

import ortflash
from ortflash.checks import web_check as wc
from ortflash.checks import web_files
from ortflash.checks.compare import compare_outputs, tolerance
from ortflash.checks.feeds import make_feeds
from ortflash.checks.sessions import run_model
from ortflash.errors import OrtflashError

ZOO = os.path.join(os.path.dirname(__file__), "..", "models")
MANIFEST = json.load(open(os.path.join(ZOO, "manifest.json")))
ENTRIES = [e for e in MANIFEST["models"] if e.get("file") and e.get("check", {}).get("ok", True)]
TARGETS = ("contrib", "onnx")
TARGET_OPS = {"contrib": {"MultiHeadAttention", "GroupQueryAttention"}, "onnx": {"Attention"}}
vi = helper.make_tensor_value_info


def test_node_is_installed():
    """CI must have Node.js; web-check is part of the product, not an optional extra."""
    assert shutil.which("node"), "node not found on PATH"
    assert shutil.which("npm"), "npm not found on PATH"
    out = subprocess.run(["node", "--version"], capture_output=True, text=True, check=True).stdout
    assert int(out.strip().lstrip("v").split(".")[0]) >= 18


# ------------------------------------------------------------------------------------------
# The zoo, lowered to each target, in web-wasm and node-cpu


_lowered_cache: dict = {}


def _lowered(entry, target):
    """(lowered model, reasons of the FlashAttention nodes lowering kept), cached per model and target."""
    key = (entry["file"], target)
    if key not in _lowered_cache:
        lower_mod = pytest.importorskip("ortflash.lowering", reason="ortflash.lowering not written yet")
        model = onnx.load(os.path.join(ZOO, entry["file"]))
        fused, _ = ortflash.optimize(model, target="ortflash")
        out = lower_mod.lower(fused, target)
        lowered, notes = out if isinstance(out, tuple) else (out, [])
        kept = [getattr(n, "reason", str(n)) for n in notes if not getattr(n, "lowered", True)]
        _lowered_cache[key] = (lowered, kept)
    return _lowered_cache[key]


def _zoo_feeds(model, entry):
    dynamic = entry.get("dynamic", {})
    cases = [(1, 7), (2, 21)] if dynamic.get("seq", True) else [(1, 16), (2, 16)]
    if not dynamic.get("batch", True):
        cases = [(1, s) for _, s in cases]
    return [
        make_feeds(model, seq_len=s, batch=b, dims=entry.get("feed_dims"), seed=i) for i, (b, s) in enumerate(cases)
    ]


# node-cpu runs the same onnxruntime-web kernels' CPU counterparts as web-wasm at about the same cost:
# the 28 original exports run in both, one export of each later addition (caches, GPT-Neo, merged,
# shape-less) in web-wasm only, to keep CI's time in bounds (`ortflash regress` checks them all).
_FIRST_ZOO = {
    e["file"]
    for e in ENTRIES
    if e["file"].split("_")[0] in ("bert", "gpt2", "vit", "t5", "bart", "whisper", "llama")
    and e["file"].count("_") == 2
}
# of the later additions, one export per kind (the first of each arch in the manifest)
_LATER_ZOO = {e["arch"]: e["file"] for e in reversed(ENTRIES) if e["file"] not in _FIRST_ZOO}
_JS_CASES = [
    pytest.param(entry, runtime, id=f"{entry['file'][:-5]}-{runtime}")
    for entry in ENTRIES
    if entry["file"] in _FIRST_ZOO or entry["file"] in _LATER_ZOO.values()
    for runtime in (("web-wasm", "node-cpu") if entry["file"] in _FIRST_ZOO else ("web-wasm",))
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("entry", "runtime"), _JS_CASES)
def test_zoo_lowered_runs_in_js_runtimes(entry, target, runtime):
    model, kept = _lowered(entry, target)
    if kept:  # a kept block may sit in a subgraph (an If branch of a merged decoder)
        # Lowering kept some blocks (it may, where the target op would compute something else):
        # such a model cannot run in the JS runtimes, and web_check must say so before starting Node.
        with pytest.raises(OrtflashError, match="--target contrib"):
            wc.web_check(model, runtime=runtime)
        pytest.xfail(f"{len(kept)} block(s) not lowered to {target}: {kept[0] if kept else '?'}")
    # One Node process per model and runtime, for both input sets.
    diffs = wc.web_check(model, _zoo_feeds(model, entry), runtime=runtime)
    assert len(diffs) == 2 * len(model.graph.output)
    assert all(d.ok for d in diffs), [(d.name, d.max_abs, d.max_rel, d.nan_mismatch) for d in diffs]


@pytest.mark.parametrize("target", TARGETS)
def test_zoo_lowering_emits_target_ops(target):
    """The web checks above are about the target's ops: the zoo must actually contain them."""
    count = sum(n.op_type in TARGET_OPS[target] for e in ENTRIES for n in _lowered(e, target)[0].graph.node)
    assert count > 0


# ------------------------------------------------------------------------------------------
# Hand-built com.microsoft MultiHeadAttention and ONNX Attention (opset 23) models


def _mha_model(dtype, with_bias):
    b, s, n, d = "B", "S", 2, 8
    inputs = [vi(x, dtype, [b, s, n * d]) for x in "qkv"]
    ins = ["q", "k", "v"]
    if with_bias:
        inputs.append(vi("ab", dtype, [b, 1, s, s]))
        ins += ["", "", "ab"]
    node = helper.make_node("MultiHeadAttention", ins, ["o"], domain="com.microsoft", num_heads=n, scale=0.3)
    graph = helper.make_graph([node], "mha", inputs, [vi("o", dtype, None)])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10
    return model


def _attention23_model(dtype, causal=False, mask=None):
    inputs = [vi("q", dtype, ["B", 4, "S", 8]), vi("k", dtype, ["B", 2, "S", 8]), vi("v", dtype, ["B", 2, "S", 8])]
    ins = ["q", "k", "v"]
    if mask is not None:
        inputs.append(vi("m", mask, ["B", 1, "S", "S"]))
        ins.append("m")
    node = helper.make_node("Attention", ins, ["o"], is_causal=int(causal))
    graph = helper.make_graph([node], "attn", inputs, [vi("o", dtype, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    return model


def _gqa_model(dtype):
    """Causal grouped-query attention without a past (the form lower.py may emit for causal GQA)."""
    node = helper.make_node(
        "GroupQueryAttention",
        ["q", "k", "v", "", "", "seqlens_k", "total_len"],
        ["o", "pk", "pv"],
        domain="com.microsoft",
        num_heads=4,
        kv_num_heads=2,
    )
    inputs = [
        vi("q", dtype, ["B", "S", 32]),
        vi("k", dtype, ["B", "S", 16]),
        vi("v", dtype, ["B", "S", 16]),
        vi("seqlens_k", TensorProto.INT32, ["B"]),
        vi("total_len", TensorProto.INT32, []),
    ]
    graph = helper.make_graph([node], "gqa", inputs, [vi("o", dtype, None)])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10
    return model


def _random_feeds(model, dims, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for x in model.graph.input:
        t = x.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else dims[d.dim_param] for d in t.shape.dim]
        np_dt = helper.tensor_dtype_to_np_dtype(t.elem_type)
        if np_dt == np.bool_:
            out[x.name] = rng.random(shape) > 0.3
        elif np.issubdtype(np_dt, np.integer):  # GroupQueryAttention's lengths: every key, no past
            out[x.name] = np.full(shape, dims["S"] - 1 if shape else dims["S"], np_dt)
        else:
            out[x.name] = rng.standard_normal(shape).astype(np_dt)
    return out


@pytest.mark.parametrize("runtime", ["web-wasm", "node-cpu"])
def test_attention_ops_run_in_js_runtimes(runtime):
    """MultiHeadAttention, GroupQueryAttention and Attention-23, float32 and float16, one Node start per model."""
    models = [
        _mha_model(TensorProto.FLOAT, True),
        _mha_model(TensorProto.FLOAT16, True),
        _mha_model(TensorProto.FLOAT, False),
        _gqa_model(TensorProto.FLOAT),
        _gqa_model(TensorProto.FLOAT16),
        _attention23_model(TensorProto.FLOAT, mask=TensorProto.BOOL),
        _attention23_model(TensorProto.FLOAT16, causal=True),
        _attention23_model(TensorProto.FLOAT, mask=TensorProto.FLOAT),
    ]
    for model in models:
        feeds = [_random_feeds(model, {"B": 2, "S": 5}, 0), _random_feeds(model, {"B": 1, "S": 9}, 1)]
        diffs = wc.web_check(model, feeds, runtime=runtime)
        assert len(diffs) == 2 and all(d.ok for d in diffs), diffs


@pytest.mark.parametrize("runtime", ["web-wasm", "node-cpu"])
def test_tensor_types_round_trip_exactly(runtime):
    """float32, float16, int64, int32 and bool go to Node and come back bit for bit."""
    types = {
        "f32": TensorProto.FLOAT,
        "f16": TensorProto.FLOAT16,
        "i64": TensorProto.INT64,
        "i32": TensorProto.INT32,
        "b": TensorProto.BOOL,
    }
    nodes = [helper.make_node("Identity", [k], [f"{k}_out"]) for k in types]
    graph = helper.make_graph(
        nodes, "id", [vi(k, t, None) for k, t in types.items()], [vi(f"{k}_out", t, None) for k, t in types.items()]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    rng = np.random.default_rng(3)
    feeds = {
        "f32": np.array([[1.5, -np.inf, np.nan], [0.0, -0.0, 3e38]], np.float32),
        "f16": rng.standard_normal((2, 3, 4)).astype(np.float16),
        "i64": np.array([-(2**62), 2**40 + 7, -1], np.int64),
        "i32": rng.integers(-(2**31), 2**31 - 1, size=(5,), dtype=np.int32),
        "b": rng.random((3, 1, 2)) > 0.5,
    }
    (out,) = wc.run_node(model, [feeds], runtime)
    assert list(out) == [f"{k}_out" for k in types]
    for k, x in feeds.items():
        y = out[f"{k}_out"]
        assert y.dtype == x.dtype and y.shape == x.shape
        assert x.tobytes() == y.tobytes()
    feeds["f32"] = rng.standard_normal((2, 3)).astype(np.float32)  # compare() wants finite floats
    diffs = wc.web_check(model, feeds, runtime=runtime)
    assert [d.name for d in diffs] == [f"{k}_out" for k in types] and all(d.ok for d in diffs)


def test_safetensors_files_round_trip(tmp_path):
    tensors = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "scalar": np.array(7, np.int64),
        "empty": np.zeros((0, 4), np.float16),
        "mask": np.array([True, False]),
    }
    path = str(tmp_path / "t.safetensors")
    wc.write_tensors(path, tensors)
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    assert (8 + n) % 8 == 0 and json.loads(raw[8 : 8 + n])["a"]["dtype"] == "F32"
    back = wc.read_tensors(path)
    assert list(back) == list(tensors)
    for k in tensors:
        assert back[k].dtype == tensors[k].dtype and np.array_equal(back[k], tensors[k])


def test_random_feeds_when_none_given():
    diffs = wc.web_check(_mha_model(TensorProto.FLOAT, True), runtime="node-cpu")
    assert [d.name for d in diffs] == ["o"] and diffs[0].ok


# ------------------------------------------------------------------------------------------
# Clean errors


def test_flash_attention_model_is_refused_with_the_targets_to_use():
    fused, report = ortflash.optimize(build(Variant()), target="ortflash")
    assert report.fused == 1
    with pytest.raises(OrtflashError) as err:
        wc.web_check(fused)
    msg = str(err.value)
    assert "FlashAttention" in msg and "--target contrib" in msg and "--target onnx" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("path", ["no/such/model.onnx", os.path.dirname(__file__), __file__])
def test_bad_model_path(path):
    with pytest.raises(OrtflashError):
        wc.web_check(path)


def _relu(ir_version=10, opsets=(("", 21),), domain="", op="Relu"):
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], domain=domain)],
        "g",
        [vi("x", TensorProto.FLOAT, [2, 3])],
        [vi("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = ir_version
    return model


def test_custom_domain_is_refused():
    model = _relu(opsets=(("", 21), ("my.ops", 1)), domain="my.ops", op="Fancy")
    with pytest.raises(OrtflashError, match="custom domain 'my.ops'"):
        wc.web_check(model)


def test_versions_beyond_onnxruntime_web_are_refused():
    with pytest.raises(OrtflashError, match="IR version 14"):
        wc.web_check(_relu(ir_version=wc.MAX_IR_VERSION + 1))
    with pytest.raises(OrtflashError, match="opset 27"):
        wc.web_check(_relu(opsets=(("", wc.MAX_OPSET[""] + 1),)))
    with pytest.raises(OrtflashError, match="opset 2 of com.microsoft"):
        wc.web_check(_relu(opsets=(("", 21), ("com.microsoft", 2))))


def test_the_version_limits_are_the_runtimes_own():
    """The highest IR version and opset accepted must load in both JS runtimes (one step up does not)."""
    top = _relu(ir_version=wc.MAX_IR_VERSION, opsets=(("", wc.MAX_OPSET[""]),))
    x = {"x": np.ones((2, 3), np.float32)}
    for runtime in ("web-wasm", "node-cpu"):
        assert wc.run_node(top, [x], runtime)[0]["y"].shape == (2, 3)
    with pytest.raises(OrtflashError, match="Unsupported model IR version: 14"):
        wc.run_node(_relu(ir_version=wc.MAX_IR_VERSION + 1), [x], "web-wasm")
    with pytest.raises(OrtflashError, match="till opset 26"):
        wc.run_node(_relu(opsets=(("", wc.MAX_OPSET[""] + 1),)), [x], "web-wasm")


def test_node_load_failure_is_one_clean_line():
    model = _relu(op="NoSuchOp")
    with pytest.raises(OrtflashError) as err:
        wc.run_node(model, [{"x": np.ones((2, 3), np.float32)}], "web-wasm")
    msg = str(err.value)
    assert msg.startswith("web-wasm could not load the model:") and "NoSuchOp" in msg
    assert "\n" not in msg and ".cc:" not in msg


def test_unknown_runtime():
    with pytest.raises(OrtflashError, match="unknown runtime"):
        wc.web_check(_relu(), runtime="browser")


def test_node_webgpu_runs_or_says_there_is_no_adapter():
    model = _mha_model(TensorProto.FLOAT, True)
    try:
        diffs = wc.web_check(model, runtime="node-webgpu", rtol=1e-3, atol=1e-4)
    except OrtflashError as exc:
        assert "WebGPU adapter" in str(exc) and "\n" not in str(exc)
    else:
        assert all(d.ok for d in diffs), diffs


def test_missing_node_is_a_clean_error(monkeypatch):
    monkeypatch.setattr(web_files.shutil, "which", lambda name: None)
    with pytest.raises(OrtflashError, match="needs Node.js: node not found on PATH"):
        wc.web_check(_relu())
    monkeypatch.setattr(web_files, "_installed", lambda: False)
    with pytest.raises(OrtflashError, match="needs Node.js: node and npm not found on PATH"):
        wc.web_check(_relu())


def test_npm_is_needed_only_to_install(monkeypatch):
    which = shutil.which
    monkeypatch.setattr(web_files.shutil, "which", lambda name: None if name == "npm" else which(name))
    assert wc.web_check(_relu(), runtime="node-cpu")[0].ok
    monkeypatch.setattr(web_files, "_installed", lambda: False)
    with pytest.raises(OrtflashError, match="npm not found on PATH"):
        wc.web_check(_relu())


def test_first_use_installs_the_node_packages(monkeypatch, capsys):
    calls = []
    state = {"installed": False}

    def fake_run(args, **kw):
        calls.append((args, kw))
        state["installed"] = True
        return subprocess.CompletedProcess(args, 0, stdout="", stderr="")

    monkeypatch.setattr(web_files, "_installed", lambda: state["installed"])
    monkeypatch.setattr(web_files.subprocess, "run", fake_run)
    web_files.ensure_node_packages()
    ((args, kw),) = calls
    assert args[1:3] == ["ci", "--no-audit"] and kw["cwd"] == web_files.web_dir()
    assert kw["env"]["ONNXRUNTIME_NODE_INSTALL"] == "skip"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "npm ci" in err
    web_files.ensure_node_packages()  # installed now: nothing more to run
    assert len(calls) == 1


def test_failed_install_is_a_clean_error(monkeypatch):
    monkeypatch.setattr(web_files, "_installed", lambda: False)
    monkeypatch.setattr(
        web_files.subprocess,
        "run",
        lambda args, **kw: subprocess.CompletedProcess(
            args, 1, stdout="npm error code E404\nnpm error 404 Not Found - GET https://registry/x\n"
        ),
    )
    with pytest.raises(OrtflashError, match="npm ci in .* failed: npm error code E404"):
        web_files.ensure_node_packages()


# ------------------------------------------------------------------------------------------
# A real browser (headless Chromium through selenium) and Python's WebGPU plugin EP

BROWSER_ZOO = ("gpt2_eager_dynamo", "llama_sdpa_dynamo", "t5_eager_dynamo", "whisper_sdpa_torchscript")
# the issue-11 zoo: seven families x {eager, sdpa} x {dynamo, torchscript}; later additions (KV cache
# models) have their own tests
ZOO_FAMILIES = ("bert", "gpt2", "vit", "t5", "bart", "whisper", "llama")
ZOO_28 = [e for e in ENTRIES if e["file"].split("_")[0] in ZOO_FAMILIES and e["file"].count("_") == 2]


def test_zoo_lowered_runs_in_the_browser():
    """Every lowered zoo model (contrib) and a few lowered to webgpu, in one headless Chromium
    (onnxruntime-web, wasm), against Python's onnxruntime."""
    from ortflash.checks.browser import run_browser

    jobs, expected = [], []
    picked = [(e, "contrib") for e in ZOO_28] + [(e, "webgpu") for e in ZOO_28 if e["file"][:-5] in BROWSER_ZOO]
    for entry, target in picked:
        model, kept = _lowered(entry, target)
        if kept:
            continue  # kept blocks: test_zoo_lowered_runs_in_js_runtimes says why
        feed_sets = _zoo_feeds(model, entry)
        jobs.append((model, feed_sets))
        expected.append([run_model(model, f) for f in feed_sets])
    assert len(ZOO_28) == 28 and len(jobs) == 28 + len(BROWSER_ZOO)
    results = run_browser(jobs, "browser-wasm")
    bad = []
    for (model, _), want_sets, got_sets in zip(jobs, expected, results):
        rtol, atol = tolerance(model, None, None)
        for want, got in zip(want_sets, got_sets):
            bad += [(model.graph.name, d) for d in compare_outputs(want, got, rtol, atol) if not d.ok]
    assert not bad, bad[:3]


def test_browser_wasm_web_check_on_hand_built_ops():
    model = _mha_model(TensorProto.FLOAT16, True)
    diffs = wc.web_check(model, [_random_feeds(model, {"B": 2, "S": 5}, 0)], runtime="browser-wasm")
    assert [d.name for d in diffs] == ["o"] and diffs[0].ok and diffs[0].max_abs < 2e-3


def test_browser_page_ships_in_the_package():
    import tomllib

    with open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml"), "rb") as f:
        data = tomllib.load(f)["tool"]["setuptools"]["package-data"]["ortflash"]
    page = os.path.join(web_files.PACKAGED_WEB_DIR, "browser")
    assert sorted(os.listdir(page)) == ["index.html", "page.mjs"]
    assert {f"checks/web/browser/{n}" for n in os.listdir(page)} <= set(data)


def test_python_webgpu_runs_or_exits_2_with_one_line(tmp_path, capsys):
    from ortflash.cli import main

    path = str(tmp_path / "mha.onnx")
    onnx.save_model(_mha_model(TensorProto.FLOAT, True), path)
    code = main(["web-check", path, "--runtime", "python-webgpu"])
    out = capsys.readouterr()
    if code == 2:
        lines = [ln for ln in out.err.splitlines() if ln.strip()]
        assert len(lines) == 1, lines
        assert "onnxruntime-ep-webgpu" in lines[0] or "WebGPU adapter" in lines[0]
    else:
        assert code == 0, out


def test_python_webgpu_names_what_is_missing(monkeypatch):
    """Without the plugin package: one line naming it (the import is what fails first)."""
    import builtins

    real_import = builtins.__import__

    def no_plugin(name, *args, **kwargs):
        if name == "onnxruntime_ep_webgpu":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_plugin)
    with pytest.raises(OrtflashError, match="needs the onnxruntime-ep-webgpu package") as err:
        wc.web_check(_mha_model(TensorProto.FLOAT, True), runtime="python-webgpu")
    assert "\n" not in str(err.value)


def test_browser_runtimes_name_the_extra_when_selenium_is_missing(monkeypatch, tmp_path, capsys):
    """selenium is the `browser` extra, not a core dependency: without it, exit 2 and one line naming it."""
    import sys

    import tomllib

    from ortflash.cli import main

    with open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert not any(d.startswith("selenium") for d in project["dependencies"])
    assert project["optional-dependencies"]["browser"] == ["selenium==4.51.0"]
    monkeypatch.setitem(sys.modules, "selenium", None)  # what `import selenium` sees when it is not installed
    path = str(tmp_path / "mha.onnx")
    onnx.save_model(_mha_model(TensorProto.FLOAT, True), path)
    assert main(["web-check", path, "--runtime", "browser-wasm"]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "pip install 'ortflash[browser]'" in lines[0], lines
