"""The WGSL backend: the attention kernels in ``shaders/*.wgsl``, run through wgpu (wgpu-py, whose
name the package and ``--backend wgpu`` take). Not the ``webgpu`` target (lowering/webgpu.py: what
ONNX Runtime's WebGPU EP runs) nor the WebGPU plugin EP loader (checks/webgpu_plugin.py).

- ``kernel``: ``flash_attention`` (the numpy-in, numpy-out entry point), ``available()``, and for
  tensors that stay on the GPU ``to_device``, ``run_resident``, ``to_host``;
- ``resident``: ``DeviceTensor``, a [B, H, S, D] operand or result in a wgpu buffer, and its layout;
- ``device``: ``Runner``, one wgpu device: its setup, the tile choice, attention calls, resident calls;
- ``encode``: one call's upload and bind, encode and submit, read-back;
- ``pipelines``: the shared bind group layout and each specialised pipeline, compiled once;
- ``probes``: the device's subgroup size and timestamp tick;
- ``buffers``: the device buffers of a runner by role, staged uploads, placeholders;
- ``params``: the shapes of a call and the uniform ``Params`` record of common.wgsl;
- ``plan``: which dispatches a call runs (grids, naive score chunks);
- ``tiles``: flash.wgsl's tile model, cost model and measured tiles;
- ``assemble``: a specialised kernel's WGSL source, loops marked ``// @unroll`` written out;
- ``trusted``: compiling ortflash's own shaders without naga's run-time checks;
- ``hostcopy``: multi-threaded copies between numpy and mapped staging memory;
- ``tuner``: timing candidate tiles once per adapter, driver, head dims and dtype, and the cache file;
- ``autotune``: timing candidate tiles on a runner's device (resident tensors), for ``tuner``;
- ``adapter``: which adapter to use; ``limits``: what the device allows.

Importing this package does not import wgpu.
"""

from .kernel import available, flash_attention, run_resident, to_device, to_host
from .resident import DeviceTensor

__all__ = ["DeviceTensor", "available", "flash_attention", "run_resident", "to_device", "to_host"]
