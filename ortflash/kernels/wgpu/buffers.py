"""The device buffers of one Runner: one buffer per role (q, k, v, o, staging, params, ...) kept
between calls while its size fits, uploads through persistent mapped staging buffers, and the
small constant buffers bound where an operand is absent."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from .hostcopy import HostCopier
from .limits import DeviceLimits

if TYPE_CHECKING:
    import wgpu

# Device buffers are sized in multiples of 16 bytes (one vec4<f32>).
BUFFER_GRANULE = 16
# A cached buffer is reused while it is big enough and at most this many times
# the request plus the slack; a larger one is replaced, so one large call does
# not pin device memory for good while small changes in size keep reusing it.
_OVERSIZE_FACTOR = 4
_OVERSIZE_SLACK_BYTES = 1 << 20


class BoundBuffer(NamedTuple):
    """A device buffer and the bytes of it one call binds."""

    buffer: wgpu.GPUBuffer
    size: int


@dataclass(frozen=True)
class Upload:
    """A copy from a mapped staging buffer into a storage buffer, recorded first in the call's encoder."""

    staging: wgpu.GPUBuffer
    target: wgpu.GPUBuffer
    nbytes: int


class BufferCache:
    """The buffers of one device, by role. Not thread-safe: the Runner calls it under its lock."""

    def __init__(self, device: wgpu.GPUDevice, limits: DeviceLimits, copier: HostCopier) -> None:
        import wgpu

        self.wgpu: Any = wgpu
        self.device = device
        self.limits = limits
        self.copier = copier  # host -> staging copies on several threads
        self.by_role: dict[str, wgpu.GPUBuffer] = {}
        self.placeholders: dict[str, wgpu.GPUBuffer] = {}  # bound for an absent bias or mask
        self.uploads: Counter[str] = Counter()  # host-to-device uploads so far, per role (q, k, v, bias, ...)

    def get(self, role: str, nbytes: int, usage: int) -> wgpu.GPUBuffer:
        """A device buffer for `role` of at least nbytes, reused while big enough."""
        nbytes = max(BUFFER_GRANULE, -(-nbytes // BUFFER_GRANULE) * BUFFER_GRANULE)
        buf = self.by_role.get(role)
        if buf is None or buf.size < nbytes or buf.size > _OVERSIZE_FACTOR * nbytes + _OVERSIZE_SLACK_BYTES:
            if buf is not None:
                buf.destroy()
            buf = self.device.create_buffer(size=nbytes, usage=usage)
            self.by_role[role] = buf
        return buf

    def upload(self, role: str, array: np.ndarray, uploads: list[Upload]) -> BoundBuffer:
        """Stage `array` for the storage buffer of `role` and add its copy to `uploads`.

        Uploads go through a persistent mapped staging buffer per role: one
        memcpy on the host and one copy on the device, with no fresh
        allocation per call (queue.write_buffer allocates a new staging area
        every time, several times slower for tens of MiB).
        """
        wgpu = self.wgpu
        data = np.ascontiguousarray(array)
        if data.nbytes % 4:
            data = np.concatenate([data.reshape(-1).view(np.uint8), np.zeros(4 - data.nbytes % 4, np.uint8)])
        self.limits.check_binding(role, data.nbytes)
        buf = self.get(role, data.nbytes, wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST)
        staging = self.get(role + "_upload", data.nbytes, wgpu.BufferUsage.MAP_WRITE | wgpu.BufferUsage.COPY_SRC)
        staging.map_sync(wgpu.MapMode.WRITE, 0, staging.size)
        source = data.reshape(-1).view(np.uint8)
        mapped = _mapped_bytes(staging, source.nbytes)
        if mapped is None:
            staging.write_mapped(source, 0)
        else:
            self.copier.copy(mapped, source)
            del mapped  # no view of the mapped range may outlive unmap
        staging.unmap()
        uploads.append(Upload(staging, buf, -(-data.nbytes // 4) * 4))
        self.uploads[role] += 1
        return BoundBuffer(buf, data.nbytes)

    def placeholder(self, role: str, data: np.ndarray) -> BoundBuffer:
        """A small constant buffer bound where an operand is absent: written once, never uploaded again
        (staging it every call cost a map, a memcpy and a copy per call for 16 bytes)."""
        buf = self.placeholders.get(role)
        if buf is None:
            buf = self.device.create_buffer_with_data(data=data.tobytes(), usage=self.wgpu.BufferUsage.STORAGE)
            self.placeholders[role] = buf
        return BoundBuffer(buf, data.nbytes)


def _mapped_bytes(staging: wgpu.GPUBuffer, nbytes: int) -> np.ndarray | None:
    """A writable uint8 view of the first nbytes of a buffer mapped for writing, or None where
    wgpu-py does not offer one (then write_mapped copies, on one thread)."""
    get_range = getattr(staging, "_experimental_get_mapped_range", None)
    if get_range is None:
        return None
    try:
        return np.frombuffer(get_range(0, -(-nbytes // 4) * 4), np.uint8)[:nbytes]
    except (TypeError, ValueError, RuntimeError):
        return None
