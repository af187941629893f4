"""A measured capability table (does an EP run a form on the GPU, and right) and the lookup that
the GPU targets' choices read; each target keeps its own rows (lowering/webgpu.py, lowering/cuda.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Capability:
    """One measured row: does the EP run the form on the GPU, and does it match the CPU EP."""

    on_gpu: bool
    right: bool


class CapabilityTable(dict[tuple[str, str], Capability]):
    """(form, case) -> what one EP did with the form on the case, as its benchmark measured it."""

    def usable(self, form: str, case: str) -> bool:
        """Whether the table measured form on case both on the GPU and right (a missing row: no)."""
        cap = self.get((form, case))
        return cap is not None and cap.on_gpu and cap.right
