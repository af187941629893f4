"""A measured capability table (does an EP run a form on the GPU, and right; which kernel ORT took
and how fast) and the lookups that the GPU targets' choices read, and the shape of a measured cost
table (Crossovers); each target keeps its own rows as data, a JSON file beside its module
(lowering/webgpu_capabilities.json, lowering/cuda_capabilities.json), read by CapabilityTable.load."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

# A cost table (pipeline/forms.py chooses by it): mask kind -> form -> head dim -> the least key
# length from which the form ran faster than the original ops (None: at no measured length).
Crossovers = Mapping[str, Mapping[str, Mapping[int, int | None]]]
# A crossover of one key: the form beat the original ops at every length measured, from one key up.
# A block whose length is known only at run time then takes it with no If on the length, where its
# query length is proved its key length (the rows were measured with Sq == Sk: a one-query step
# against a longer cache is another case, pipeline/forms.choose).
EVERY_LENGTH = 1


@dataclass(frozen=True)
class Capability:
    """One measured row: does the EP run the form on the GPU, does it match the CPU EP, and (where
    the row was timed) the kernel ORT printed and the median ms with inputs and outputs on the GPU."""

    on_gpu: bool
    right: bool
    kernel: str = ""
    ms: float | None = None


# A row of a table's JSON file: every field of Capability, its (form, case) key, and optionally why
# the row is kept (for the reader; not loaded).
_ROW_FIELDS = frozenset({"form", "case", "on_gpu", "right", "kernel", "ms"})
_ROW_OPTIONAL = frozenset({"why"})


class CapabilityTable(dict[tuple[str, str], Capability]):
    """(form, case) -> what one EP did with the form on the case, as its benchmark measured it."""

    @classmethod
    def load(cls, path: Path) -> CapabilityTable:
        """The table a JSON file holds: {"rows": [{form, case, on_gpu, right, kernel, ms[, why]}, ...]}
        in its order (ms null where the row was not timed). A row with a missing or unknown field,
        a value of the wrong type, or a (form, case) seen before is an error."""
        table = cls()
        for row in json.loads(path.read_text(encoding="utf-8"))["rows"]:
            fields = set(row)
            if not _ROW_FIELDS <= fields <= _ROW_FIELDS | _ROW_OPTIONAL:
                raise ValueError(f"{path.name}: row {row} must have the fields {sorted(_ROW_FIELDS)} (and why)")
            key = (row["form"], row["case"])
            on_gpu, right, kernel, ms = row["on_gpu"], row["right"], row["kernel"], row["ms"]
            typed = isinstance(on_gpu, bool) and isinstance(right, bool) and isinstance(kernel, str)
            if not (typed and (ms is None or isinstance(ms, float)) and all(isinstance(k, str) for k in key)):
                raise ValueError(f"{path.name}: row {key} has a value of the wrong type")
            if key in table:
                raise ValueError(f"{path.name}: row {key} is there twice")
            table[key] = Capability(on_gpu=on_gpu, right=right, kernel=kernel, ms=ms)
        return table

    def usable(self, form: str, case: str) -> bool:
        """Whether the table measured form on case both on the GPU and right (a missing row: no)."""
        cap = self.get((form, case))
        return cap is not None and cap.on_gpu and cap.right

    def fastest(self, forms: Iterable[str], case: str) -> str | None:
        """Of forms, the usable one with the least measured ms on case (ties: the earlier form;
        None where none is usable and timed)."""
        timed = [(cap.ms, i, f) for i, f in enumerate(forms) if self.usable(f, case) and (cap := self[(f, case)]).ms]
        return min(timed)[2] if timed else None
