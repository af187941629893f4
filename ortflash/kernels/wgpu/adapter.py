"""Which wgpu adapter the kernels run on: a GPU when there is one, else Mesa's software Vulkan
driver (lavapipe), and why there is none when wgpu finds nothing."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import wgpu

# Order of preference among adapter types (lower first); unknown types last.
_TYPE_RANK = MappingProxyType({"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "CPU": 3})
_UNKNOWN_TYPE_RANK = 9
# Environment variable naming part of the device name of the adapter to use.
ADAPTER_ENV = "ORTFLASH_WGPU_ADAPTER"
# The per-user runtime folder of the XDG Base Directory spec, where Wayland looks for its socket.
RUNTIME_DIR_ENV = "XDG_RUNTIME_DIR"


@dataclass(frozen=True)
class AdapterSearch:
    """The outcome of looking for an adapter: the adapter, or None and what wgpu reported."""

    adapter: wgpu.GPUAdapter | None
    error: str = ""  # why no adapter was found; empty when one was


def _preference(adapter: wgpu.GPUAdapter) -> tuple[int, int]:
    info = adapter.info
    type_rank = _TYPE_RANK.get(info.get("adapter_type", ""), _UNKNOWN_TYPE_RANK)
    return type_rank, 0 if info.get("backend_type") == "Vulkan" else 1


def ensure_runtime_dir() -> None:
    """Give the process a private XDG_RUNTIME_DIR where it has none (or one that is no folder).

    Mesa's software Vulkan driver (lavapipe) probes for a Wayland display when wgpu creates its
    instance, and libwayland prints "error: XDG_RUNTIME_DIR is invalid or not set in the
    environment." on stderr each time (3 times per ``validate --backend wgpu``, 8 in the README's
    resident-tensor snippet) on a server or container with no login session. Nothing here draws
    on a display, so a fresh empty folder of our own (mode 0700, as the spec asks, removed at exit)
    silences it; a runtime dir the user has is left as it is.
    """
    current = os.environ.get(RUNTIME_DIR_ENV, "")
    if current and os.path.isdir(current):
        return
    private = tempfile.mkdtemp(prefix="ortflash-runtime-")  # created 0700
    atexit.register(shutil.rmtree, private, ignore_errors=True)
    os.environ[RUNTIME_DIR_ENV] = private


def find_adapter(prefer: str | None = None) -> AdapterSearch:
    """The adapter to use: a GPU when there is one, else lavapipe (or any other).

    ``prefer`` (or the environment variable ORTFLASH_WGPU_ADAPTER) picks the
    first adapter whose device name contains it. When wgpu finds no adapter at
    all, the result holds None and what wgpu reported.
    """
    import wgpu

    ensure_runtime_dir()  # before wgpu's instance exists: the driver reads it then
    prefer = prefer or os.environ.get(ADAPTER_ENV)
    errors = []
    try:
        adapters = list(wgpu.gpu.enumerate_adapters_sync())
    except Exception as e:  # noqa: BLE001 -- no Vulkan/Metal/DX12/GL loader at all; reported, not raised
        adapters = []
        errors.append(f"enumerate_adapters: {type(e).__name__}: {e}")
    if prefer:
        chosen = [a for a in adapters if prefer.lower() in a.info.get("device", "").lower()]
        if chosen:
            return AdapterSearch(chosen[0])
    if adapters:
        return AdapterSearch(min(adapters, key=_preference))
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        if adapter is not None:
            return AdapterSearch(adapter)
        errors.append("request_adapter returned None")
    except Exception as e:  # noqa: BLE001 -- reported in AdapterSearch.error
        errors.append(f"request_adapter: {type(e).__name__}: {e}")
    return AdapterSearch(None, "; ".join(errors) or "no adapter")


def no_adapter_message(search: AdapterSearch) -> str:
    """Why the kernels cannot run, in words, for a search that found nothing."""
    return (
        "wgpu found no adapter: no GPU driver and no software Vulkan driver "
        f"(install Mesa's lavapipe, Debian package mesa-vulkan-drivers) [{search.error}]"
    )
