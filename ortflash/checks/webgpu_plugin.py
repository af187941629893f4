"""The onnxruntime-ep-webgpu plugin: ONNX Runtime's WebGPU EP in Python, the stock onnxruntime
wheel with the plugin registered (``web-check --runtime python-webgpu``). Not the ``webgpu``
target (lowering/webgpu.py: the forms that EP runs), nor ortflash's own WGSL kernels (kernels/wgpu/).

Where the plugin is not installed, or Dawn finds no adapter (a CPU-only machine: Dawn skips
software adapters), the error is one line and nothing falls back silently: a session the plugin
did not take would run on the CPU EP and prove nothing about WebGPU.
"""

from __future__ import annotations

from typing import Any

import onnx
import onnxruntime as ort

from ..errors import OrtflashError

PLUGIN = "onnxruntime-ep-webgpu"
REGISTRATION_NAME = "webgpu"


def _plugin() -> Any:
    try:
        import onnxruntime_ep_webgpu as wep
    except ImportError:
        raise OrtflashError(
            f"python-webgpu needs the {PLUGIN} package beside onnxruntime >= 1.24.4 "
            f"(pip install {PLUGIN}); use --runtime web-wasm or node-cpu without it"
        ) from None
    return wep


def webgpu_device() -> Any:
    """The WebGPU plugin EP's device, registering the plugin library once per process."""
    wep = _plugin()
    register = getattr(ort, "register_execution_provider_library", None)
    if register is None:
        raise OrtflashError(
            f"onnxruntime {ort.__version__} cannot load plugin EPs: python-webgpu needs 1.24.4 or newer"
        )
    name = wep.get_ep_name()
    devices = [d for d in ort.get_ep_devices() if d.ep_name == name]
    if not devices:
        try:
            register(REGISTRATION_NAME, wep.get_library_path())
        except Exception as exc:  # noqa: BLE001 - ORT raises its own types; "already registered" is fine
            if "already" not in str(exc).lower():
                raise OrtflashError(
                    f"python-webgpu: {PLUGIN} could not be loaded: {str(exc).splitlines()[0][:200]}"
                ) from None
        devices = [d for d in ort.get_ep_devices() if d.ep_name == name]
    if not devices:
        raise OrtflashError(
            "python-webgpu: no usable WebGPU adapter on this machine (the WebGPU EP lists no device; "
            "Dawn skips software adapters); use --runtime web-wasm or node-cpu here"
        )
    return devices[0]


def webgpu_session(model: onnx.ModelProto | str) -> ort.InferenceSession:
    """An InferenceSession on the WebGPU EP (nodes it lacks fall back to the CPU EP, as in ORT)."""
    device = webgpu_device()
    options = ort.SessionOptions()
    options.add_provider_for_devices([device], {})
    options.log_severity_level = 3
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    try:
        session = ort.InferenceSession(source, options)
    except Exception as exc:  # noqa: BLE001 - ORT's load errors, one line
        raise OrtflashError(f"python-webgpu could not load the model: {str(exc).splitlines()[0][:400]}") from None
    if not any("WebGpu" in p for p in session.get_providers()):
        raise OrtflashError(
            f"python-webgpu: the session did not take the WebGPU EP (providers {session.get_providers()})"
        )
    return session
