"""onnxruntime-web in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``) driven by selenium (``web-check --runtime browser-wasm|browser-webgpu``).

The page (web/browser/index.html, page.mjs) ships in the package. Each check copies it into a
temporary folder with links to onnxruntime-web's dist/ (web/node_modules, installed as for the Node
runtimes) and the model and input files, serves that folder from a local http server on 127.0.0.1,
and calls the page's ``ortflashRun`` once per model in one browser. Outputs come back as base64
safetensors (the exchange of web/README.md).
"""

from __future__ import annotations

import base64
import functools
import http.server
import os
import shutil
import socketserver
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import onnx

from ..errors import OrtflashError
from .sessions import one_line
from .web_files import PACKAGED_WEB_DIR, ensure_node_packages, read_tensors, web_dir, write_tensors

# onnxruntime-web's wasm and WebGPU backends in headless Chromium, driven by selenium (web/browser/ is the page)
BROWSER_RUNTIMES = ("browser-wasm", "browser-webgpu")

PAGE_FILES = ("browser/index.html", "browser/page.mjs", "safetensors.mjs")  # under web/, served side by side
ORT_FILES = (
    "ort.wasm.min.mjs",
    "ort-wasm-simd-threaded.mjs",
    "ort-wasm-simd-threaded.wasm",
    "ort.webgpu.min.mjs",
    "ort-wasm-simd-threaded.asyncify.mjs",
    "ort-wasm-simd-threaded.asyncify.wasm",
)
CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
CHROMEDRIVER_PATHS = ("/usr/bin/chromedriver",)
_RUN_TIMEOUT_S = 600
_INSTALL_HINT = "apt-get install chromium chromium-driver"

Job = tuple[onnx.ModelProto, Sequence[Mapping[str, np.ndarray]]]


def _first(paths: Sequence[str], name: str) -> str | None:
    found = shutil.which(name)
    return found or next((p for p in paths if os.path.exists(p)), None)


def browser_tools() -> tuple[str, str]:
    """(chromium, chromedriver) paths; raises a one-line OrtflashError where one is missing."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        raise OrtflashError("the browser runtimes need selenium: pip install 'ortflash[browser]'") from None
    chromium = os.environ.get("ORTFLASH_CHROMIUM") or _first(CHROMIUM_PATHS, "chromium")
    driver = os.environ.get("ORTFLASH_CHROMEDRIVER") or _first(CHROMEDRIVER_PATHS, "chromedriver")
    if not chromium or not driver:
        missing = " and ".join(n for n, p in (("chromium", chromium), ("chromedriver", driver)) if not p)
        raise OrtflashError(f"the browser runtimes need {missing} ({_INSTALL_HINT})")
    return chromium, driver


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".mjs": "text/javascript",
        ".js": "text/javascript",
        ".wasm": "application/wasm",
        ".onnx": "application/octet-stream",
        ".safetensors": "application/octet-stream",
    }

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


@contextmanager
def _served(folder: str) -> Iterator[str]:
    """A local http server for folder on a free port; its base URL."""
    handler = functools.partial(_QuietHandler, directory=folder)
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _stage(folder: str, installed_dir: str, jobs: Sequence[Job]) -> list[tuple[str, list[str]]]:
    """Page, onnxruntime-web files, models and inputs in folder; (model URL, input URLs) per job."""
    for name in PAGE_FILES:
        shutil.copyfile(os.path.join(PACKAGED_WEB_DIR, name), os.path.join(folder, os.path.basename(name)))
    dist = os.path.join(installed_dir, "node_modules", "onnxruntime-web", "dist")
    os.makedirs(os.path.join(folder, "ort"))
    for name in ORT_FILES:
        src = os.path.join(dist, name)
        if not os.path.exists(src):
            raise OrtflashError(f"onnxruntime-web's {name} is missing from {dist} (reinstall with npm ci there)")
        os.symlink(src, os.path.join(folder, "ort", name))
    urls = []
    for i, (model, feed_sets) in enumerate(jobs):
        try:
            onnx.save_model(model, os.path.join(folder, f"model{i}.onnx"))
        except ValueError as exc:  # over 2 GiB
            raise OrtflashError(
                f"cannot pass the model to the browser: {one_line(str(exc), type(exc).__name__)}"
            ) from None
        inputs = []
        for j, feeds in enumerate(feed_sets):
            write_tensors(os.path.join(folder, f"in{i}_{j}.safetensors"), feeds)
            inputs.append(f"in{i}_{j}.safetensors")
        urls.append((f"model{i}.onnx", inputs))
    return urls


def _driver(chromium: str, chromedriver: str, webgpu: bool) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--no-first-run"):
        options.add_argument(arg)
    if webgpu:
        options.add_argument("--enable-unsafe-webgpu")
        options.add_argument("--enable-features=Vulkan")
    try:
        return webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    except Exception as exc:  # noqa: BLE001 - selenium's errors carry multi-line driver logs
        raise OrtflashError(
            f"headless Chromium did not start: {one_line(str(exc), type(exc).__name__)[:300]}"
        ) from None


def run_browser(jobs: Sequence[Job], runtime: str = "browser-wasm") -> list[list[dict[str, np.ndarray]]]:
    """Run each (model, feed sets) job in one headless Chromium; outputs per job and feed set."""
    from selenium.webdriver.support.ui import WebDriverWait

    if runtime not in BROWSER_RUNTIMES:
        raise OrtflashError(f"unknown browser runtime {runtime!r} (one of {', '.join(BROWSER_RUNTIMES)})")
    chromium, chromedriver = browser_tools()
    ensure_node_packages()  # onnxruntime-web's files come from the same npm install as the Node runtimes
    backend = runtime.removeprefix("browser-")
    results: list[list[dict[str, np.ndarray]]] = []
    with tempfile.TemporaryDirectory(prefix="ortflash-browser-") as tmp:
        urls = _stage(tmp, web_dir(), jobs)
        with _served(tmp) as base:
            driver = _driver(chromium, chromedriver, backend == "webgpu")
            try:
                driver.set_script_timeout(_RUN_TIMEOUT_S)
                driver.get(f"{base}/index.html?backend={backend}")
                WebDriverWait(driver, 60).until(lambda d: d.execute_script("return window.ortflashReady === true"))
                for model_url, input_urls in urls:
                    status = driver.execute_async_script(
                        "const done = arguments[arguments.length - 1];"
                        "window.ortflashRun(arguments[0], arguments[1]).then(done);",
                        model_url,
                        input_urls,
                    )
                    results.append(_outputs(status, runtime, tmp))
            finally:
                driver.quit()
    return results


def _outputs(status: Any, runtime: str, tmp: str) -> list[dict[str, np.ndarray]]:
    if not isinstance(status, dict) or not status.get("ok"):
        stage = status.get("stage") if isinstance(status, dict) else None
        msg = str(status.get("message", status) if isinstance(status, dict) else status)
        if stage == "adapter":
            raise OrtflashError(f"{runtime}: {msg[:200]}; use --runtime browser-wasm here")
        what = {"load": "could not load the model", "run": "could not run the model"}.get(str(stage), "failed")
        raise OrtflashError(f"{runtime} {what}: {msg[:400]}")
    outs = []
    for k, encoded in enumerate(status["outputs"]):
        path = os.path.join(tmp, f"out{k}.safetensors")
        with open(path, "wb") as f:
            f.write(base64.b64decode(encoded))
        outs.append(read_tensors(path))
    return outs
