"""The compiled kernels of one wgpu device: the bind group layout all kernels share, and each
specialised shader module and compute pipeline, compiled once (trusted.py where allowed)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .assemble import assemble
from .trusted import create_trusted_module

if TYPE_CHECKING:
    import wgpu


class Pipelines:
    """Pipelines cached by (kernel, entry point, io, specialisation). Not thread-safe: the Runner
    calls it under its lock."""

    def __init__(self, device: wgpu.GPUDevice, *, trusted_shaders: bool) -> None:
        self.device = device
        self.trusted_shaders = trusted_shaders  # compile without naga's bounds checks when possible
        self.bind_group_layout, self.layout = self._make_layouts()
        self.modules: dict[tuple[Any, ...], wgpu.GPUShaderModule] = {}
        self.by_key: dict[tuple[Any, ...], wgpu.GPUComputePipeline] = {}

    def _make_layouts(self) -> tuple[wgpu.GPUBindGroupLayout, wgpu.GPUPipelineLayout]:
        """The one bind group layout all kernels share (bindings 0-7 of common/io/naive.wgsl)."""
        import wgpu

        ro = {"type": wgpu.BufferBindingType.read_only_storage}
        rw = {"type": wgpu.BufferBindingType.storage}
        kinds = [{"type": wgpu.BufferBindingType.uniform}, ro, ro, ro, ro, ro, rw, rw]
        entries = [
            {"binding": i, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": kind} for i, kind in enumerate(kinds)
        ]
        bind_group_layout = self.device.create_bind_group_layout(entries=entries)
        return bind_group_layout, self.device.create_pipeline_layout(bind_group_layouts=[bind_group_layout])

    def get(self, kernel: str, entry: str, io: str, constants: Mapping[str, int]) -> wgpu.GPUComputePipeline:
        """A compiled pipeline, cached by (kernel, io, specialisation, entry point)."""
        key = (kernel, entry, io, tuple(sorted(constants.items())))
        pipe = self.by_key.get(key)
        if pipe is None:
            module_key = (kernel, io, key[3])
            module = self.modules.get(module_key)
            if module is None:
                code = assemble(kernel, io, constants)
                module = create_trusted_module(self.device, code, kernel) if self.trusted_shaders else None
                if module is None:
                    module = self.device.create_shader_module(code=code)
                self.modules[module_key] = module
            pipe = self.device.create_compute_pipeline(
                layout=self.layout, compute={"module": module, "entry_point": entry}
            )
            self.by_key[key] = pipe
        return pipe
