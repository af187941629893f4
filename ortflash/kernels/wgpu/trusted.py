"""Compile ortflash's own WGSL without naga's run-time checks, where wgpu-native allows it.

By default naga clamps every dynamic array index (one integer min per workgroup-memory load in
the kernels' inner loops) and bounds every loop with a hidden counter. ortflash's kernels index
only inside their arrays (the tests run them with the checks on as well), so the runner compiles
them through wgpu-native's ``wgpuDeviceCreateShaderModuleTrusted`` with no checks. That entry
point is not part of wgpu-py's public API: when it or the private names used to reach it are
missing, ``create_trusted_module`` returns None and the caller compiles the usual, checked way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import wgpu

# WGPUShaderRuntimeChecks_None (wgpu-native's wgpu.h).
NO_RUNTIME_CHECKS = 0


def create_trusted_module(device: wgpu.GPUDevice, code: str, label: str = "") -> wgpu.GPUShaderModule | None:
    """A shader module of WGSL `code` compiled with no run-time checks, or None where unsupported."""
    try:
        from wgpu.backends.wgpu_native import _api
        from wgpu.backends.wgpu_native._ffi import ffi, lib

        trusted = lib.wgpuDeviceCreateShaderModuleTrusted
    except (ImportError, AttributeError):
        return None
    try:
        # Every cdata made here stays referenced by a local until wgpu-native has read it.
        code_chars = ffi.new("char[]", code.encode())
        label_chars = ffi.new("char[]", label.encode())
        source = ffi.new("WGPUShaderSourceWGSL *")
        source[0].code.data = code_chars
        source[0].code.length = lib.WGPU_STRLEN
        source[0].chain.next = ffi.NULL
        source[0].chain.sType = lib.WGPUSType_ShaderSourceWGSL
        descriptor = ffi.new("WGPUShaderModuleDescriptor *")
        descriptor[0].nextInChain = ffi.cast("WGPUChainedStruct *", source)
        descriptor[0].label.data = label_chars
        descriptor[0].label.length = lib.WGPU_STRLEN
        module_id = trusted(device._internal, descriptor, NO_RUNTIME_CHECKS)
        if module_id == ffi.NULL:
            return None
        return _api.GPUShaderModule(label, module_id, device)
    except (AttributeError, TypeError, ffi.error):
        return None
