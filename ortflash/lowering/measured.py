"""A measured capability table (does an EP run a form on the GPU, and right; which kernel ORT took
and how fast) and the lookups that the GPU targets' choices read, and the shape of a measured cost
table (Crossovers); each target keeps its own rows as data, a JSON file beside its module
(lowering/webgpu_capabilities.json, lowering/cuda_capabilities.json), read by CapabilityTable.load."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

# A cost table (pipeline/forms.py chooses by it): mask kind -> form -> head dim -> the least key
# length from which the form ran faster than the original ops (None: at no measured length).
Crossovers = Mapping[str, Mapping[str, Mapping[int, int | None]]]
# A crossover of one key: the form beat the original ops at every length measured, from one key up.
# A block whose length is known only at run time then takes it with no If on the length, where its
# query length is proved its key length (the rows were measured with Sq == Sk: a one-query step
# against a longer cache is another case, pipeline/forms.choose).
EVERY_LENGTH = 1
ANY_DTYPE = "*"  # a cost table's element type that stands for every type


@dataclass(frozen=True)
class CostRecord:
    """What was measured on one EP: its cost tables, how far they reach, and the results files a
    choice's detail names. Each GPU EP's is built beside its rows (cuda_measured.MEASURED,
    webgpu.MEASURED); the CPU EP's tables are per CPU class (pipeline/forms.py: CPU_CROSSOVERS)."""

    measured_up_to: int  # the cost table's longest measured key length
    # element type ("float32", "float16"; ANY_DTYPE: every type) -> the cost table; None: the CPU
    # EP's, one per CPU class, chosen per optimize call
    costs: Mapping[str, Crossovers] | None = None
    unknown_dtype: str = ""  # the type whose table a block of no known type (or one without a table) takes
    results: str = ""  # the cost table's results file (the CPU EP's: per class and mask kind, in forms.py)
    # (element type, mask kind) -> the results file(s) of the rows measured apart from ``results``
    kind_results: Mapping[tuple[str, str], str] = field(default_factory=lambda: MappingProxyType({}))
    # where set, a block that was one ONNX Attention op keeps it on this EP, which runs that op
    # natively: the results file that timed the lowered forms against the op itself (the cost
    # table's rows time them against graphs of plain ops)
    one_op_results: str = ""

    def results_for(self, kind: str, dtype: str | None) -> str:
        """The results file(s) a (GPU EP's) row of ``kind`` for blocks of ``dtype`` was read from."""
        return self.kind_results.get((dtype or "", kind), self.results)

    def cost_table(self, dtype: str | None) -> Crossovers:
        """The cost table for blocks of element type ``dtype`` ("float32", "float16"; None or "": not
        known); a GPU EP's only (the CPU EP's is chosen by CPU class)."""
        assert self.costs is not None, "the CPU EP's cost table is per CPU class (pipeline/forms.py)"
        if ANY_DTYPE in self.costs:
            return self.costs[ANY_DTYPE]
        return self.costs.get(dtype or "", self.costs[self.unknown_dtype])

    def dtype_said(self, dtype: str | None) -> str:
        """The element type as a choice's detail names it ("" where one table serves every type)."""
        if self.costs is None or ANY_DTYPE in self.costs:
            return ""
        if dtype in self.costs:
            return f", {dtype}"
        return f", an element type without a table of its own (as {self.unknown_dtype})"


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
