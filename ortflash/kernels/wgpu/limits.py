"""What a wgpu device allows the attention kernels: the limits and features asked for, and the
numbers read back, with WebGPU's defaults where an adapter does not report one."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# Limits a compute-only workload cares about; the device asks for the
# adapter's own value of each (WebGPU's defaults are far lower, e.g. 16 KiB of
# workgroup storage where lavapipe offers 32 KiB and an H200 48 KiB).
WANTED_LIMITS = (
    "max-compute-workgroup-storage-size",
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroup-size-x",
    "max-compute-workgroup-size-y",
    "max-compute-workgroup-size-z",
    "max-compute-workgroups-per-dimension",
    "max-storage-buffer-binding-size",
    "max-buffer-size",
    "max-storage-buffers-per-shader-stage",
    "max-uniform-buffer-binding-size",
    "max-bind-groups",
    "max-bindings-per-bind-group",
)
WANTED_FEATURES = ("shader-f16", "timestamp-query", "subgroup")


class BindingTooLarge(MemoryError):
    """A buffer the kernels would bind is over the adapter's storage binding limit.

    A MemoryError for callers that already catch that; the host may have memory
    to spare, it is the adapter's per-binding limit that is exceeded.
    """


@dataclass(frozen=True)
class DeviceLimits:
    """The limits the host code plans with. Defaults are the WebGPU specification's, used only
    when a device does not report a value."""

    workgroup_storage_bytes: int = 16384
    invocations_per_workgroup: int = 256
    workgroups_per_dimension: int = 65535
    storage_binding_bytes: int = 1 << 27  # 128 MiB
    buffer_bytes: int = 1 << 28  # 256 MiB
    uniform_offset_alignment: int = 256

    @classmethod
    def from_device(cls, limits: Mapping[str, int]) -> DeviceLimits:
        """The limits of a device, from its ``limits`` mapping (wgpu's hyphenated names)."""
        default = cls()
        return cls(
            workgroup_storage_bytes=limits.get("max-compute-workgroup-storage-size", default.workgroup_storage_bytes),
            invocations_per_workgroup=limits.get(
                "max-compute-invocations-per-workgroup", default.invocations_per_workgroup
            ),
            workgroups_per_dimension=limits.get(
                "max-compute-workgroups-per-dimension", default.workgroups_per_dimension
            ),
            storage_binding_bytes=limits.get("max-storage-buffer-binding-size", default.storage_binding_bytes),
            buffer_bytes=limits.get("max-buffer-size", default.buffer_bytes),
            # The alignment is a lower bound on offsets; never plan with less than the default.
            uniform_offset_alignment=max(
                default.uniform_offset_alignment,
                limits.get("min-uniform-buffer-offset-alignment", default.uniform_offset_alignment),
            ),
        )

    def check_binding(self, role: str, nbytes: int) -> None:
        """Raise BindingTooLarge when a buffer of nbytes cannot be bound as `role`."""
        if nbytes > self.storage_binding_bytes:
            raise BindingTooLarge(
                f"{role} needs {nbytes} bytes, over the adapter's storage binding limit of "
                f"{self.storage_binding_bytes} bytes"
            )
