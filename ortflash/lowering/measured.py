"""A measured capability table (does an EP run a form on the GPU, and right; which kernel ORT took
and how fast) and the lookups that the GPU targets' choices read, and the shape of a measured cost
table (Crossovers); each target keeps its own rows (lowering/webgpu.py, lowering/cuda.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# A cost table (pipeline/forms.py chooses by it): mask kind -> form -> head dim -> the least key
# length from which the form ran faster than the original ops (None: at no measured length).
Crossovers = Mapping[str, Mapping[str, Mapping[int, int | None]]]


@dataclass(frozen=True)
class Capability:
    """One measured row: does the EP run the form on the GPU, does it match the CPU EP, and (where
    the row was timed) the kernel ORT printed and the median ms with inputs and outputs on the GPU."""

    on_gpu: bool
    right: bool
    kernel: str = ""
    ms: float | None = None


class CapabilityTable(dict[tuple[str, str], Capability]):
    """(form, case) -> what one EP did with the form on the case, as its benchmark measured it."""

    def usable(self, form: str, case: str) -> bool:
        """Whether the table measured form on case both on the GPU and right (a missing row: no)."""
        cap = self.get((form, case))
        return cap is not None and cap.on_gpu and cap.right

    def fastest(self, forms: Iterable[str], case: str) -> str | None:
        """Of forms, the usable one with the least measured ms on case (ties: the earlier form;
        None where none is usable and timed)."""
        timed = [(cap.ms, i, f) for i, f in enumerate(forms) if self.usable(f, case) and (cap := self[(f, case)]).ms]
        return min(timed)[2] if timed else None
