"""Run a model in ONNX Runtime's JavaScript runtimes (onnxruntime-web, onnxruntime-node) and compare.

`web_check(model, feeds, runtime)` runs the model in Python's onnxruntime (CPU) and in a Node
process (web/run.mjs beside this module) on the same inputs and compares every output with
`compare.compare`. web/ ships inside the package (the runner, package.json and its lock): Node
runs there when its node_modules are installed (a source checkout), otherwise in a per-user
cache copy where `npm ci` runs on first use, so web-check works after a plain `pip install`
(web_files.py: the install, and the safetensors files tensors go to and from Node in).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from ..errors import OrtflashError
from ..model_io import graphs_of, load
from ..op import spec
from ..op.node import is_flash_attention
from . import web_files
from .browser import BROWSER_RUNTIMES
from .compare import OutputDiff, compare_outputs, tolerance
from .feeds import make_feeds
from .sessions import MESSAGE_CHARS, ModelSource, clean_ort_message, one_line, run_model
from .web_files import NODE_TIMEOUT_S, RUNNER_NAME, read_tensors, write_tensors

NODE_RUNTIMES = ("web-wasm", "node-cpu", "node-webgpu")
# python-webgpu: the stock onnxruntime wheel with onnxruntime-ep-webgpu registered (plugin EP);
# browser-*: onnxruntime-web in headless Chromium driven by selenium (browser.py).
RUNTIMES = (*NODE_RUNTIMES, "python-webgpu", *BROWSER_RUNTIMES)

# What onnxruntime-web / onnxruntime-node 1.30 load, found by experiment (web/README.md):
# higher IR versions or opsets are refused at session creation.
MAX_IR_VERSION = 13
MAX_OPSET = {"": 26, "ai.onnx": 26, "ai.onnx.ml": 5, "com.microsoft": 1}
# Domains whose ops the JavaScript runtimes implement (onnxruntime-extensions is not in them).
WEB_DOMAINS = ("", "ai.onnx", "com.microsoft", "ai.onnx.ml")

# ---------------------------------------------------------------------------------------------
# What the web runtimes can load


def check_web_compatible(model: onnx.ModelProto) -> None:
    """Raise OrtflashError when the JavaScript runtimes cannot run this model as it is."""

    functions = {(f.domain, f.name) for f in model.functions}
    bodies = [model.graph, *model.functions]
    everywhere = [n for body in bodies for g in graphs_of(body) for n in g.node]
    flash = custom = None
    for n in everywhere:
        if is_flash_attention(n):
            flash = flash or n
        elif n.domain not in WEB_DOMAINS and (n.domain, n.op_type) not in functions and custom is None:
            custom = n
    if flash is not None:
        raise OrtflashError(
            f"the model still has {spec.OP_TYPE} nodes ({flash.name or 'unnamed'}), which run only in Python's "
            f"ONNX Runtime with ortflash's custom op: optimize the model from before fusion with "
            f"`ortflash optimize ORIGINAL.onnx --target contrib` (com.microsoft MultiHeadAttention) "
            f"or `--target onnx` (ONNX Attention, opset 23), or lower this one in Python with "
            f"ortflash.lower(model, 'contrib')"
        )
    if custom is not None:
        raise OrtflashError(
            f"node {custom.name or custom.op_type} is {custom.op_type} in the custom domain {custom.domain!r}, "
            f"which onnxruntime-web/onnxruntime-node cannot run (they implement {', '.join(repr(d) for d in WEB_DOMAINS[1:])})"
        )
    if model.ir_version > MAX_IR_VERSION:
        raise OrtflashError(
            f"the model has IR version {model.ir_version}; onnxruntime-web 1.30 loads IR version {MAX_IR_VERSION} "
            f"at most (save it with an older onnx or set model.ir_version = {MAX_IR_VERSION})"
        )
    for imp in model.opset_import:
        limit = MAX_OPSET.get(imp.domain)
        if limit is not None and imp.version > limit:
            raise OrtflashError(
                f"the model imports opset {imp.version} of {imp.domain or 'ai.onnx'}; onnxruntime-web 1.30 "
                f"supports {limit} at most"
            )


# ---------------------------------------------------------------------------------------------
# Running


def run_node(
    model: onnx.ModelProto,
    feed_sets: Sequence[Mapping[str, np.ndarray]],
    runtime: str = "web-wasm",
    *,
    threads: int = 1,
) -> list[dict[str, np.ndarray]]:
    """Run the model in one Node process on every set of feeds; outputs per set."""
    if runtime not in NODE_RUNTIMES:
        raise OrtflashError(f"unknown runtime {runtime!r} (one of {', '.join(NODE_RUNTIMES)})")
    node = web_files.ensure_node_packages()
    folder = web_files.web_dir()
    with tempfile.TemporaryDirectory(prefix="ortflash-web-") as tmp:
        model_path = os.path.join(tmp, "model.onnx")
        try:
            onnx.save_model(model, model_path)  # one file: external data (if any) was loaded inline
        except ValueError as exc:  # over 2 GiB
            raise OrtflashError(f"cannot pass the model to Node: {one_line(str(exc), type(exc).__name__)}") from None
        args = [
            node,
            os.path.join(folder, RUNNER_NAME),
            "--runtime",
            runtime,
            "--model",
            model_path,
            "--threads",
            str(threads),
        ]
        outs = []
        for i, feeds in enumerate(feed_sets):
            inp, out = os.path.join(tmp, f"in{i}.safetensors"), os.path.join(tmp, f"out{i}.safetensors")
            write_tensors(inp, feeds)
            args += [inp, out]
            outs.append(out)
        try:
            proc = subprocess.run(args, cwd=folder, capture_output=True, text=True, timeout=NODE_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise OrtflashError(f"{runtime}: Node did not finish in {NODE_TIMEOUT_S} s") from None
        lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
        try:
            status = json.loads(lines[-1])
        except (IndexError, ValueError):
            err = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
            detail = err[0] if err else f"exit status {proc.returncode}"
            raise OrtflashError(f"{runtime}: the Node runner failed: {detail[:MESSAGE_CHARS]}") from None
        if not status.get("ok"):
            stage, msg = status.get("stage"), clean_ort_message(status.get("message", ""))
            if runtime == "node-webgpu" and "adapter" in msg.lower():
                at = msg.find("Failed to get a WebGPU adapter")
                msg = msg[at:] if at >= 0 else msg
                raise OrtflashError(
                    f"node-webgpu: no usable WebGPU adapter on this machine ({msg[:200]}); "
                    "use --runtime node-cpu or web-wasm here"
                )
            what = {"load": "could not load the model", "run": "could not run the model"}.get(stage, "failed")
            raise OrtflashError(f"{runtime} {what}: {msg[:400]}")
        return [read_tensors(o) for o in outs]


def _feed_sets(
    model: onnx.ModelProto, feeds: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]] | None
) -> list[dict[str, np.ndarray]]:
    if feeds is None:
        return [make_feeds(model)]
    if isinstance(feeds, Mapping):
        return [dict(feeds)]
    feed_sets = [dict(f) for f in feeds]
    if not feed_sets:
        raise OrtflashError("no feeds given")
    return feed_sets


def web_check(
    model_path_or_proto: ModelSource,
    feeds: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]] | None = None,
    runtime: str = "web-wasm",
    rtol: float | None = None,
    atol: float | None = None,
) -> list[OutputDiff]:
    """Run the model in Python's ONNX Runtime (CPU) and in `runtime` on the same inputs; compare outputs.

    `feeds`: one dict of inputs, a list of dicts (all run in one Node process; the output names
    then carry the index, `logits#1`), or None for random inputs from `make_feeds`.
    `runtime`: `web-wasm` (onnxruntime-web, wasm backend, under Node), `node-cpu` (onnxruntime-node,
    CPU EP), `node-webgpu` (onnxruntime-node, WebGPU EP), `python-webgpu` (Python's onnxruntime with
    the onnxruntime-ep-webgpu plugin), `browser-wasm` / `browser-webgpu` (onnxruntime-web in headless
    Chromium). Tolerances default to `compare.default_tolerance`.
    """
    if runtime not in RUNTIMES:
        raise OrtflashError(f"unknown runtime {runtime!r} (one of {', '.join(RUNTIMES)})")
    model = load(model_path_or_proto)
    check_web_compatible(model)
    feed_sets = _feed_sets(model, feeds)
    rtol, atol = tolerance(model, rtol, atol)
    if runtime == "python-webgpu":
        from .webgpu_plugin import webgpu_session

        session = webgpu_session(model)  # fails on a missing plugin or adapter before any run
    elif runtime in BROWSER_RUNTIMES:
        from .browser import browser_tools

        browser_tools()  # fail on a missing Chromium, chromedriver or selenium first
    else:
        web_files.check_node_tools()  # fail on a missing Node before spending time in Python's runtime
    expected = [run_model(model, f, what="the model in Python") for f in feed_sets]
    if runtime == "python-webgpu":
        names = [o.name for o in session.get_outputs()]
        actual = [dict(zip(names, session.run(names, dict(f)))) for f in feed_sets]
    elif runtime in BROWSER_RUNTIMES:
        from .browser import run_browser

        actual = run_browser([(model, feed_sets)], runtime)[0]
    else:
        actual = run_node(model, feed_sets, runtime)
    diffs = []
    many = len(feed_sets) > 1
    for i, (want, got) in enumerate(zip(expected, actual)):
        diffs += compare_outputs(want, got, rtol, atol, label=f"{{name}}#{i}" if many else "{name}")
    return diffs
