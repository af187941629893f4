"""Run a model in ONNX Runtime's JavaScript runtimes (onnxruntime-web, onnxruntime-node) and compare.

`web_check(model, feeds, runtime)` runs the model in Python's onnxruntime (CPU) and in a Node
process (web/run.mjs) on the same inputs and compares every output with `verify.compare`.
Tensors go to and from Node as safetensors files (8-byte little-endian header length, JSON
header, raw little-endian bytes); web/README.md describes the exchange.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from .optimize import OrtflashError, load
from .verify import OutputDiff, compare, default_tolerance, make_feeds

RUNTIMES = ("web-wasm", "node-cpu", "node-webgpu")

WEB_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "web")
RUNNER = os.path.join(WEB_DIR, "run.mjs")

# What onnxruntime-web / onnxruntime-node 1.30 load, found by experiment (web/README.md):
# higher IR versions or opsets are refused at session creation.
MAX_IR_VERSION = 13
MAX_OPSET = {"": 26, "ai.onnx": 26, "ai.onnx.ml": 5, "com.microsoft": 1}
# Domains whose ops the JavaScript runtimes implement (onnxruntime-extensions is not in them).
WEB_DOMAINS = ("", "ai.onnx", "com.microsoft", "ai.onnx.ml")

_NODE_TIMEOUT_S = 900

# numpy dtype <-> safetensors dtype
_TO_ST = {
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
_FROM_ST = {v: k for k, v in _TO_ST.items()}


def write_tensors(path: str, tensors: Mapping[str, np.ndarray]) -> None:
    """Write arrays as a safetensors file (little-endian, C order)."""
    header, chunks, offset = {}, [], 0
    for name, arr in tensors.items():
        arr = np.asarray(arr)
        if arr.dtype not in _TO_ST:
            raise OrtflashError(f"input {name!r} has dtype {arr.dtype}, which the web runtimes cannot take")
        data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": _TO_ST[arr.dtype], "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for c in chunks:
            f.write(c)


def read_tensors(path: str) -> dict[str, np.ndarray]:
    """Read a safetensors file written by web/run.mjs, in the order it lists its tensors."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {}) or {}
    order = json.loads(meta["order"]) if "order" in meta else list(header)
    base = 8 + n
    out = {}
    for name in order:
        info = header[name]
        dtype = _FROM_ST[info["dtype"]].newbyteorder("<")
        begin, end = info["data_offsets"]
        arr = np.frombuffer(raw[base + begin:base + end], dtype=dtype).reshape(info["shape"])
        out[name] = arr.astype(arr.dtype.newbyteorder("="))
    return out


# ---------------------------------------------------------------------------------------------
# Node and its packages


def _node_tools(need_npm: bool) -> tuple[str, str | None]:
    """node (always needed) and npm (needed only to install web/node_modules)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or (need_npm and not npm):
        missing = " and ".join(n for n, p in (("node", node), ("npm", npm if need_npm else "-")) if not p)
        raise OrtflashError(f"web-check needs Node.js: {missing} not found on PATH "
                            "(install Node.js 18 or newer with npm, e.g. apt-get install nodejs npm)")
    return node, npm


def _installed() -> bool:
    return all(os.path.exists(os.path.join(WEB_DIR, "node_modules", pkg, "package.json"))
               for pkg in ("onnxruntime-web", "onnxruntime-node"))


def ensure_node_packages() -> str:
    """Path of `node`; installs web/node_modules (npm ci) the first time."""
    if _installed():
        return _node_tools(need_npm=False)[0]
    node, npm = _node_tools(need_npm=True)
    print(f"ortflash: installing onnxruntime-web and onnxruntime-node into {os.path.join(WEB_DIR, 'node_modules')} "
          "(npm ci, first use only)", file=sys.stderr, flush=True)
    env = dict(os.environ, ONNXRUNTIME_NODE_INSTALL="skip")  # the Linux/macOS/Windows CPU bindings are bundled
    try:
        proc = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=WEB_DIR, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=_NODE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise OrtflashError(f"npm ci in {WEB_DIR} did not finish in {_NODE_TIMEOUT_S} s") from None
    if proc.returncode != 0 or not _installed():
        lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
        err = next((ln for ln in lines if ln.lower().startswith(("npm err", "npm error"))),
                   lines[-1] if lines else f"exit status {proc.returncode}")
        raise OrtflashError(f"npm ci in {WEB_DIR} failed: {err[:300]}")
    return node


# ---------------------------------------------------------------------------------------------
# What the web runtimes can load


def check_web_compatible(model: onnx.ModelProto) -> None:
    """Raise OrtflashError when the JavaScript runtimes cannot run this model as it is."""
    from . import spec

    def nodes(graph):
        for n in graph.node:
            yield n
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    yield from nodes(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for g in a.graphs:
                        yield from nodes(g)

    functions = {(f.domain, f.name) for f in model.functions}
    everywhere = [n for n in nodes(model.graph)] + [n for f in model.functions for n in nodes(f)]
    flash = custom = None
    for n in everywhere:
        if n.op_type == spec.OP_TYPE and n.domain == spec.DOMAIN:
            flash = flash or n
        elif n.domain not in WEB_DOMAINS and (n.domain, n.op_type) not in functions and custom is None:
            custom = n
    if flash is not None:
        raise OrtflashError(
            f"the model still has {spec.OP_TYPE} nodes ({flash.name or 'unnamed'}), which run only in Python's "
            f"ONNX Runtime with ortflash's custom op: lower them first with "
            f"`ortflash optimize ... --target contrib` (com.microsoft MultiHeadAttention) "
            f"or `--target onnx` (ONNX Attention, opset 23)")
    if custom is not None:
        raise OrtflashError(
            f"node {custom.name or custom.op_type} is {custom.op_type} in the custom domain {custom.domain!r}, "
            f"which onnxruntime-web/onnxruntime-node cannot run (they implement {', '.join(repr(d) for d in WEB_DOMAINS[1:])})")
    if model.ir_version > MAX_IR_VERSION:
        raise OrtflashError(
            f"the model has IR version {model.ir_version}; onnxruntime-web 1.30 loads IR version {MAX_IR_VERSION} "
            f"at most (save it with an older onnx or set model.ir_version = {MAX_IR_VERSION})")
    for imp in model.opset_import:
        limit = MAX_OPSET.get(imp.domain)
        if limit is not None and imp.version > limit:
            raise OrtflashError(
                f"the model imports opset {imp.version} of {imp.domain or 'ai.onnx'}; onnxruntime-web 1.30 "
                f"supports {limit} at most")


# ---------------------------------------------------------------------------------------------
# Running


def _python_run(model: onnx.ModelProto, feeds: dict) -> dict:
    import onnxruntime as ort

    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(names, feeds)))
    except Exception as exc:
        raise OrtflashError(f"ONNX Runtime (Python) could not run the model: {clean_ort_message(str(exc))[:300]}") from None


def _first_line(exc) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


_ORT_PREFIX = re.compile(r"^(?:\[ONNXRuntimeError\] : \d+ : \w+ : )?(?:Can't create a session\. )?"
                         r"(?:ERROR_CODE: \d+, ERROR_MESSAGE: )?")
_SOURCE_LOCATION = re.compile(r"^\S+\.(?:cc|cpp|h|hpp):\d+ ")


def clean_ort_message(text: str) -> str:
    """An ONNX Runtime error without its wrapper, source location and C++ signature."""
    text = _ORT_PREFIX.sub("", text.strip())
    if _SOURCE_LOCATION.match(text):
        rest = _SOURCE_LOCATION.sub("", text, count=1)
        depth, start = 0, rest.find("(")
        for i in range(max(start, 0), len(rest) if start >= 0 else 0):  # skip the signature's balanced (...)
            depth += {"(": 1, ")": -1}.get(rest[i], 0)
            if depth == 0:
                rest = rest[i + 1:]
                if rest.startswith("::<lambda()>"):
                    rest = rest[len("::<lambda()>"):]
                break
        text = rest.strip() or text
    return text


def run_node(model: onnx.ModelProto, feed_sets: Sequence[dict], runtime: str = "web-wasm", *, threads: int = 1) -> list[dict]:
    """Run the model in one Node process on every set of feeds; outputs per set."""
    if runtime not in RUNTIMES:
        raise OrtflashError(f"unknown runtime {runtime!r} (one of {', '.join(RUNTIMES)})")
    node = ensure_node_packages()
    with tempfile.TemporaryDirectory(prefix="ortflash-web-") as tmp:
        model_path = os.path.join(tmp, "model.onnx")
        try:
            onnx.save_model(model, model_path)  # one file: external data (if any) was loaded inline
        except ValueError as exc:  # over 2 GiB
            raise OrtflashError(f"cannot pass the model to Node: {_first_line(exc)}") from None
        args = [node, RUNNER, "--runtime", runtime, "--model", model_path, "--threads", str(threads)]
        outs = []
        for i, feeds in enumerate(feed_sets):
            inp, out = os.path.join(tmp, f"in{i}.safetensors"), os.path.join(tmp, f"out{i}.safetensors")
            write_tensors(inp, feeds)
            args += [inp, out]
            outs.append(out)
        try:
            proc = subprocess.run(args, cwd=WEB_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  timeout=_NODE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise OrtflashError(f"{runtime}: Node did not finish in {_NODE_TIMEOUT_S} s") from None
        lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
        try:
            status = json.loads(lines[-1])
        except (IndexError, ValueError):
            err = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
            detail = err[0] if err else f"exit status {proc.returncode}"
            raise OrtflashError(f"{runtime}: the Node runner failed: {detail[:300]}") from None
        if not status.get("ok"):
            stage, msg = status.get("stage"), clean_ort_message(status.get("message", ""))
            if runtime == "node-webgpu" and "adapter" in msg.lower():
                at = msg.find("Failed to get a WebGPU adapter")
                msg = msg[at:] if at >= 0 else msg
                raise OrtflashError(f"node-webgpu: no usable WebGPU adapter on this machine ({msg[:200]}); "
                                    "use --runtime node-cpu or web-wasm here")
            what = {"load": "could not load the model", "run": "could not run the model"}.get(stage, "failed")
            raise OrtflashError(f"{runtime} {what}: {msg[:400]}")
        return [read_tensors(o) for o in outs]


def web_check(model_path_or_proto, feeds=None, runtime: str = "web-wasm", rtol=None, atol=None) -> list[OutputDiff]:
    """Run the model in Python's ONNX Runtime (CPU) and in `runtime` on the same inputs; compare outputs.

    `feeds`: one dict of inputs, a list of dicts (all run in one Node process; the output names
    then carry the index, `logits#1`), or None for random inputs from `make_feeds`.
    `runtime`: `web-wasm` (onnxruntime-web, wasm backend, under Node), `node-cpu` (onnxruntime-node,
    CPU EP) or `node-webgpu` (onnxruntime-node, WebGPU EP). Tolerances default to
    `verify.default_tolerance`.
    """
    if runtime not in RUNTIMES:
        raise OrtflashError(f"unknown runtime {runtime!r} (one of {', '.join(RUNTIMES)})")
    model = load(model_path_or_proto)
    check_web_compatible(model)
    if feeds is None:
        feed_sets = [make_feeds(model)]
    elif isinstance(feeds, Mapping):
        feed_sets = [dict(feeds)]
    else:
        feed_sets = [dict(f) for f in feeds]
        if not feed_sets:
            raise OrtflashError("no feeds given")
    d_rtol, d_atol = default_tolerance(model)
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    _node_tools(need_npm=not _installed())  # fail on a missing Node before spending time in Python's runtime
    expected = [_python_run(model, f) for f in feed_sets]
    actual = run_node(model, feed_sets, runtime)
    diffs = []
    many = len(feed_sets) > 1
    for i, (exp, act) in enumerate(zip(expected, actual)):
        for name, e in exp.items():
            label = f"{name}#{i}" if many else name
            if name not in act:
                diffs.append(OutputDiff(label, float("inf"), float("inf"), 0, False))
            else:
                diffs.append(compare(e, act[name], label, rtol, atol))
    return diffs
