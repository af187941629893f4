"""The files ortflash shares with the JavaScript runtimes: tensors as safetensors files (8-byte
little-endian header length, JSON header, raw little-endian bytes; web/README.md describes the
exchange), and the shipped web/ folder with its pinned Node packages, installed by ``npm ci``
into web/ (a source checkout) or a per-user cache copy on first use. The Node runtimes
(web_check.py) and the browser (browser.py) both run from that install.
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
from collections.abc import Mapping

import numpy as np

from ..errors import OrtflashError
from .sessions import MESSAGE_CHARS

# The Node runner and its pinned packages, shipped as package data.
PACKAGED_WEB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "web")
RUNNER_NAME = "run.mjs"
# what a cache copy needs (npm ci, the runner and its module)
WEB_FILES = (RUNNER_NAME, "safetensors.mjs", "package.json", "package-lock.json")
NODE_PACKAGES = ("onnxruntime-web", "onnxruntime-node")

NODE_TIMEOUT_S = 900

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
            timeout=NODE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise OrtflashError(f"npm ci in {folder} did not finish in {NODE_TIMEOUT_S} s") from None
    if proc.returncode != 0 or not _installed():
        lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
        err = next(
            (ln for ln in lines if ln.lower().startswith(("npm err", "npm error"))),
            lines[-1] if lines else f"exit status {proc.returncode}",
        )
        raise OrtflashError(f"npm ci in {folder} failed: {err[:MESSAGE_CHARS]}")
    return node


def check_node_tools() -> None:
    """Fail on a missing node (or npm, where the packages are not installed yet) before any work."""
    _node_tools(need_npm=not _installed())
