"""Run a model in ONNX Runtime's JavaScript runtimes (onnxruntime-web, onnxruntime-node) and compare.

`web_check(model, feeds, runtime)` runs the model in Python's onnxruntime (CPU) and in a Node
process (web/run.mjs beside this module) on the same inputs and compares every output with
`compare.compare`. web/ ships inside the package (the runner, package.json and its lock): Node
runs there when its node_modules are installed (a source checkout), otherwise in a per-user
cache copy where `npm ci` runs on first use, so web-check works after a plain `pip install`.
Tensors go to and from Node as safetensors files (8-byte little-endian header length, JSON
header, raw little-endian bytes); web/README.md describes the exchange.
"""

from __future__ import annotations

import filecmp
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from .. import spec
from ..errors import OrtflashError
from ..model_io import graphs_of, load
from .compare import OutputDiff, compare_outputs, tolerance
from .feeds import make_feeds
from .run import MESSAGE_CHARS, ModelSource, clean_ort_message, one_line, run_model

NODE_RUNTIMES = ("web-wasm", "node-cpu", "node-webgpu")
# python-webgpu: the stock onnxruntime wheel with onnxruntime-ep-webgpu registered (plugin EP);
# browser-*: onnxruntime-web in headless Chromium driven by selenium (web/browser/ is the page).
BROWSER_RUNTIMES = ("browser-wasm", "browser-webgpu")
RUNTIMES = (*NODE_RUNTIMES, "python-webgpu", *BROWSER_RUNTIMES)

# The Node runner and its pinned packages, shipped as package data.
PACKAGED_WEB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "web")
RUNNER_NAME = "run.mjs"
# what a cache copy needs (npm ci, the runner and its module)
WEB_FILES = (RUNNER_NAME, "safetensors.mjs", "package.json", "package-lock.json")
NODE_PACKAGES = ("onnxruntime-web", "onnxruntime-node")

# What onnxruntime-web / onnxruntime-node 1.30 load, found by experiment (web/README.md):
# higher IR versions or opsets are refused at session creation.
MAX_IR_VERSION = 13
MAX_OPSET = {"": 26, "ai.onnx": 26, "ai.onnx.ml": 5, "com.microsoft": 1}
# Domains whose ops the JavaScript runtimes implement (onnxruntime-extensions is not in them).
WEB_DOMAINS = ("", "ai.onnx", "com.microsoft", "ai.onnx.ml")

_NODE_TIMEOUT_S = 900

# numpy dtype <-> safetensors dtype
_TO_ST: dict[np.dtype, str] = {
    np.dtype(np.float32): "F32",
    np.dtype(np.float64): "F64",
    np.dtype(np.float16): "F16",
    np.dtype(np.int64): "I64",
    np.dtype(np.int32): "I32",
    np.dtype(np.int16): "I16",
    np.dtype(np.int8): "I8",
    np.dtype(np.uint64): "U64",
    np.dtype(np.uint32): "U32",
    np.dtype(np.uint16): "U16",
    np.dtype(np.uint8): "U8",
    np.dtype(np.bool_): "BOOL",
}
_FROM_ST: dict[str, np.dtype] = {v: k for k, v in _TO_ST.items()}


def write_tensors(path: str, tensors: Mapping[str, np.ndarray]) -> None:
    """Write arrays as a safetensors file (little-endian, C order)."""
    header, chunks, offset = {}, [], 0
    for name, arr in tensors.items():
        arr = np.asarray(arr)
        if arr.dtype not in _TO_ST:
            raise OrtflashError(f"input {name!r} has dtype {arr.dtype}, which the web runtimes cannot take")
        data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {
            "dtype": _TO_ST[arr.dtype],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        f.writelines(chunks)


def read_tensors(path: str) -> dict[str, np.ndarray]:
    """Read a safetensors file written by web/run.mjs, in the order it lists its tensors."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8 : 8 + n])
    meta = header.pop("__metadata__", {}) or {}
    order = json.loads(meta["order"]) if "order" in meta else list(header)
    base = 8 + n
    out = {}
    for name in order:
        info = header[name]
        dtype = _FROM_ST[info["dtype"]].newbyteorder("<")
        begin, end = info["data_offsets"]
        arr = np.frombuffer(raw[base + begin : base + end], dtype=dtype).reshape(info["shape"])
        out[name] = arr.astype(arr.dtype.newbyteorder("="))
    return out


# ---------------------------------------------------------------------------------------------
# Node and its packages


def _node_tools(need_npm: bool) -> tuple[str, str | None]:
    """node (always needed) and npm (needed only to install web/node_modules)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or (need_npm and not npm):
        missing = " and ".join(n for n, p in (("node", node), ("npm", npm if need_npm else "-")) if not p)
        raise OrtflashError(
            f"web-check needs Node.js: {missing} not found on PATH "
            "(install Node.js 18 or newer with npm, e.g. apt-get install nodejs npm)"
        )
    return node, npm


def _has_packages(folder: str) -> bool:
    return all(os.path.exists(os.path.join(folder, "node_modules", pkg, "package.json")) for pkg in NODE_PACKAGES)


def _cache_root() -> str:
    """Where a user's copies of the Node tooling live (read at call time: no module-level settings)."""
    if os.environ.get("ORTFLASH_CACHE_DIR"):
        return os.environ["ORTFLASH_CACHE_DIR"]
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "ortflash")


def _cache_dir() -> str:
    """The cache copy for these exact files: a new ortflash with other pins gets a fresh folder."""
    digest = hashlib.sha256()
    for name in WEB_FILES:
        with open(os.path.join(PACKAGED_WEB_DIR, name), "rb") as f:
            digest.update(f.read())
    return os.path.join(_cache_root(), f"web-{digest.hexdigest()[:12]}")


def web_dir() -> str:
    """The folder Node runs in: the shipped web/ where its packages are installed, else the cache copy."""
    missing = [n for n in WEB_FILES if not os.path.exists(os.path.join(PACKAGED_WEB_DIR, n))]
    if missing:
        raise OrtflashError(
            f"web-check's Node runner is incomplete: {', '.join(missing)} missing from "
            f"{PACKAGED_WEB_DIR} (reinstall ortflash)"
        )
    return PACKAGED_WEB_DIR if _has_packages(PACKAGED_WEB_DIR) else _cache_dir()


def _installed() -> bool:
    return _has_packages(web_dir())


def _copy_runner(folder: str) -> None:
    """Put the shipped runner and its package files into ``folder`` (a cache copy), where missing or older."""
    if folder == PACKAGED_WEB_DIR:
        return
    try:
        os.makedirs(folder, exist_ok=True)
        for name in WEB_FILES:
            src, dst = os.path.join(PACKAGED_WEB_DIR, name), os.path.join(folder, name)
            if not os.path.exists(dst) or not filecmp.cmp(src, dst, shallow=False):
                shutil.copyfile(src, dst)
    except OSError as exc:
        raise OrtflashError(
            f"web-check could not prepare its Node folder {folder}: {exc.strerror or exc} "
            "(set ORTFLASH_CACHE_DIR to a writable folder)"
        ) from None


def ensure_node_packages() -> str:
    """Path of `node`; installs the pinned Node packages (npm ci) into web_dir() the first time."""
    folder = web_dir()
    _copy_runner(folder)
    if _installed():
        return _node_tools(need_npm=False)[0]
    node, npm = _node_tools(need_npm=True)
    assert npm is not None  # _node_tools raised otherwise
    print(
        f"ortflash: installing onnxruntime-web and onnxruntime-node into {os.path.join(folder, 'node_modules')} "
        "(npm ci, first use only)",
        file=sys.stderr,
        flush=True,
    )
    env = dict(os.environ, ONNXRUNTIME_NODE_INSTALL="skip")  # the Linux/macOS/Windows CPU bindings are bundled
    try:
        proc = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=folder,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=_NODE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise OrtflashError(f"npm ci in {folder} did not finish in {_NODE_TIMEOUT_S} s") from None
    if proc.returncode != 0 or not _installed():
        lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
        err = next(
            (ln for ln in lines if ln.lower().startswith(("npm err", "npm error"))),
            lines[-1] if lines else f"exit status {proc.returncode}",
        )
        raise OrtflashError(f"npm ci in {folder} failed: {err[:MESSAGE_CHARS]}")
    return node


# ---------------------------------------------------------------------------------------------
# What the web runtimes can load


def check_web_compatible(model: onnx.ModelProto) -> None:
    """Raise OrtflashError when the JavaScript runtimes cannot run this model as it is."""

    functions = {(f.domain, f.name) for f in model.functions}
    bodies = [model.graph, *model.functions]
    everywhere = [n for body in bodies for g in graphs_of(body) for n in g.node]
    flash = custom = None
    for n in everywhere:
        if n.op_type == spec.OP_TYPE and n.domain == spec.DOMAIN:
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
    node = ensure_node_packages()
    folder = web_dir()
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
            proc = subprocess.run(
                args, cwd=folder, capture_output=True, text=True, timeout=_NODE_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            raise OrtflashError(f"{runtime}: Node did not finish in {_NODE_TIMEOUT_S} s") from None
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
        from .webgpu_ep import webgpu_session

        session = webgpu_session(model)  # fails on a missing plugin or adapter before any run
    elif runtime in BROWSER_RUNTIMES:
        from .browser import browser_tools

        browser_tools()  # fail on a missing Chromium, chromedriver or selenium first
    else:
        _node_tools(need_npm=not _installed())  # fail on a missing Node before spending time in Python's runtime
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
