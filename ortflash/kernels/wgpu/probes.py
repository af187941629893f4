"""What a wgpu device does that its limits do not say: the subgroup size its compute workgroups
run with (probed once by a one-workgroup shader), and the length of a timestamp tick."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .assemble import read_shader

if TYPE_CHECKING:
    import wgpu

# Invocations of the subgroup probe's one workgroup: several subgroups of any size up to 64.
_PROBE_INVOCATIONS = 256


def timestamp_period(queue: wgpu.GPUQueue) -> float:
    """Nanoseconds per timestamp tick (wgpu-native; 1.0 where it is not exposed)."""
    try:
        from wgpu.backends.wgpu_native._ffi import lib

        period = float(lib.wgpuQueueGetTimestampPeriod(queue._internal))
        return period if period > 0 else 1.0
    except Exception:  # noqa: BLE001 -- a private wgpu-native API; without it, ticks are taken as ns
        return 1.0


def probe_subgroup_size(device: wgpu.GPUDevice) -> int:
    """The subgroup size of a compute workgroup, or 0 when subgroups are not runs of
    consecutive invocations or differ in size (then the kernels reduce through memory)."""
    import wgpu

    code = read_shader("probe_subgroup.wgsl").replace("${WG}", str(_PROBE_INVOCATIONS))
    module = device.create_shader_module(code=code)
    pipe = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
    nbytes = 8 * _PROBE_INVOCATIONS
    out = device.create_buffer(size=nbytes, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    group = device.create_bind_group(
        layout=pipe.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": out}}]
    )
    encoder = device.create_command_encoder()
    cpass = encoder.begin_compute_pass()
    cpass.set_pipeline(pipe)
    cpass.set_bind_group(0, group)
    cpass.dispatch_workgroups(1)
    cpass.end()
    device.queue.submit([encoder.finish()])
    probe = np.frombuffer(device.queue.read_buffer(out), np.uint32).reshape(_PROBE_INVOCATIONS, 2)
    out.destroy()
    sizes, lanes = probe[:, 0], probe[:, 1]
    size = int(sizes[0])
    if size <= 0 or (sizes != size).any():
        return 0
    if not np.array_equal(lanes, np.arange(_PROBE_INVOCATIONS, dtype=np.uint32) % size):
        return 0
    return size
