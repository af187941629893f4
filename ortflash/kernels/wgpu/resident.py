"""Tensors that stay on the GPU: ``DeviceTensor``, an attention operand or result in a wgpu buffer.

A pipeline that keeps its tensors resident uploads Q, K and V once
(``Runner.to_device``), runs any number of attention calls on them
(``Runner.attention_resident``: no upload, no read-back, the result another
DeviceTensor) and reads back only what it needs (``Runner.to_host``). K and V
uploaded once serve every call that reads them, however many fused nodes
those are.

Layout (what the WGSL kernels read and write): a [B, H, S, D] tensor is stored
row-major with its last axis zero-padded to a multiple of 4 (``padded_dim``),
in float32, or in float16 on a device with ``shader-f16``. ``buffer`` may be
bound by the caller's own wgpu work on the same device (``device``); its usage
includes STORAGE, COPY_SRC and COPY_DST.

Nothing here imports wgpu.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import wgpu

DEVICE_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))


@dataclass(frozen=True, eq=False)
class DeviceTensor:
    """A [B, H, S, D] float32/float16 tensor in a wgpu storage buffer (layout: the module's docstring)."""

    buffer: wgpu.GPUBuffer
    shape: tuple[int, int, int, int]
    dtype: np.dtype[Any]  # float32 or float16: the dtype of the elements in the buffer
    device: wgpu.GPUDevice  # the device that owns the buffer

    def __post_init__(self) -> None:
        if len(self.shape) != 4 or any(int(n) < 0 for n in self.shape):
            raise ValueError(f"a DeviceTensor is [B, H, S, D]; got shape {self.shape}")
        if np.dtype(self.dtype) not in DEVICE_DTYPES:
            raise ValueError(f"a DeviceTensor holds float32 or float16, not {self.dtype}")
        if self.buffer.size < self.nbytes:
            raise ValueError(f"buffer of {self.buffer.size} bytes is smaller than {self.shape} needs ({self.nbytes})")

    @property
    def ndim(self) -> int:
        return 4

    @property
    def padded_dim(self) -> int:
        """The last axis as stored: D rounded up to a multiple of 4 (the kernels read vec4s)."""
        return -(-self.shape[3] // 4) * 4

    @property
    def nbytes(self) -> int:
        """Bytes of the buffer the tensor occupies (padded layout)."""
        b, h, s, _ = self.shape
        return b * h * s * self.padded_dim * np.dtype(self.dtype).itemsize

    def destroy(self) -> None:
        """Free the device memory now instead of when the buffer is garbage-collected."""
        self.buffer.destroy()


def padded_host_array(array: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """array as `dtype`, C-contiguous, its last axis zero-padded to a multiple of 4 (the device layout)."""
    data = np.asarray(array, dtype)
    pad = -data.shape[-1] % 4
    if pad:
        data = np.pad(data, [(0, 0)] * (data.ndim - 1) + [(0, pad)])
    return np.ascontiguousarray(data)
