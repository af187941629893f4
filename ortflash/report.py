"""One row per Softmax: what ortflash found there and what it did; and the one JSON document
every command's ``--json`` writes (schema ``ortflash.result``, versioned by ``schema_version``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:
    from rich.console import Console

JSON_SCHEMA = "ortflash.result"
# Raise on any change to the keys or meaning of the document below; additions included.
# 4: a block's `target` became `lowered_to` (null: FlashAttention); 5: a block's `mask_kind`; 6: its `dtype`;
# 7: its `detail` (the whole explanation of a one-sentence `reason`) and `fused_from` (a length dispatch)
JSON_SCHEMA_VERSION = 7


@dataclass
class Block:
    name: str  # the Softmax node
    fused: bool
    reason: str = ""  # why not fused (the first failed precondition), or a note: one short sentence where ours
    pattern: str = ""
    # numbers where shapes or initializers prove them (or --num-heads gives them, said in reason), else None
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    key_len: int | None = None  # the key length, where the shapes fix it
    scale: float | None = None
    mask: str = ""  # bias / mask / causal summary
    softmax: str = ""  # naive | online | auto, as written on the fused node
    # the cost table's row for a block read (forms.MASK_KINDS: none | padding | causal | bias,
    # or forms.REFINED_KINDS: causal_padding), fused or
    # kept for speed; "" where the rules did not read a block
    mask_kind: str = ""
    # the element type of Q, K, V and the output ("float32", "float16"), "" where not known
    dtype: str = ""
    # the native op a fused block was lowered to ("com.microsoft.MultiHeadAttention"); None where the
    # block is a FlashAttention node (or was not fused)
    lowered_to: str | None = None
    # the quantizer the block's output reaches a few nodes on ("DynamicQuantizeLinear 4 nodes on"), where
    # float32 rounding can flip an integer: check such blocks with real inputs (see pipeline/rounding.py)
    rounding: str = ""
    # the whole explanation behind the reason's sentence (the measurement, what changes it), said once under the table
    detail: str = ""
    # a length known only at run time: the key length from which the model runs the fused form, the
    # original ops below (an If on the length, pipeline/length_dispatch.py); None: at every length it runs
    fused_from: int | None = None

    @property
    def needs_ortflash(self) -> bool:
        """A fused block that stays FlashAttention: the model needs ortflash wherever it runs."""
        return self.fused and self.lowered_to is None


@dataclass
class TargetChoice:
    """Which target the model was written for, and why: asked for, or chosen (``--target auto``
    per execution provider, or the default's preference for native ops where blocks feed a quantizer)."""

    requested: str | None  # the --target given: a target, "auto", or None (the default)
    ep: str | None  # the execution provider named (--ep), or None
    chosen: str
    why: str
    tried: list[str] = field(default_factory=list)  # candidates passed over, each with its reason


@dataclass
class Report:
    model: str
    blocks: list[Block] = field(default_factory=list)
    # which shape inference the rules proved from (model_shapes: onnx | onnxruntime-symbolic | none)
    shape_inference: str = ""
    # what the pipeline did to the model as a whole (an opset conversion), one sentence each
    notes: list[str] = field(default_factory=list)
    target: TargetChoice | None = None
    # with nothing fused: the written model is not the input as it was (its IR version stamped, the
    # FlashAttention nodes it already had lowered); the notes say how
    rewritten: bool = False

    @property
    def fused(self) -> int:
        return sum(b.fused for b in self.blocks)

    def summary(self) -> str:
        if not self.blocks:
            written = "as the notes below say" if self.rewritten else "unchanged"
            return f"{self.model}: no Softmax or Attention node, nothing to fuse; the model is written {written}"
        return f"{self.model}: {self.fused} of {len(self.blocks)} attention blocks (Softmax or Attention nodes) fused"

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "fused": self.fused,
            "blocks": [asdict(b) for b in self.blocks],
            "shape_inference": self.shape_inference,
            "notes": list(self.notes),
            "target": asdict(self.target) if self.target is not None else None,
        }

    def print(self, console: Console | None = None) -> None:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        console = console or Console()
        console.print(self.summary(), markup=False)  # a line of its own: a table title is padded to the table's width
        table = Table()
        for col in ("softmax node", "pattern", "heads", "head dim", "scale", "mask / bias", "result"):
            table.add_column(col, overflow="fold")
        details: dict[str, int] = {}  # each explanation once, numbered in the order rows cite it
        for b in self.blocks:
            cite = ""
            if b.detail:
                cite = f" [{details.setdefault(b.detail, len(details) + 1)}]"
            heads = "?" if b.heads is None else str(b.heads)
            if b.kv_heads not in (None, b.heads):
                heads += f" (kv {b.kv_heads})"
            # names and reasons come from the model: brackets in them are text, not rich markup
            result = f"[green]fused[/] ({escape(b.softmax)})" if b.fused else f"[yellow]kept:[/] {escape(b.reason)}"
            if b.fused and b.lowered_to:
                result = f"[green]fused[/] → {escape(b.lowered_to)}"
            if b.fused and b.reason:
                result += f"; {escape(b.reason)}"
            if b.fused and b.rounding:
                result += f"; [yellow]feeds a quantizer[/] ({escape(b.rounding)})"
            result += escape(cite)
            table.add_row(
                escape(b.name),
                escape(b.pattern),
                escape(heads),
                "?" if b.head_dim is None else str(b.head_dim),
                "" if b.scale is None else f"{b.scale:.6g}",
                escape(b.mask),
                result,
            )
        console.print(table)
        for text, number in details.items():
            console.print(f"[{number}] {text}", markup=False, soft_wrap=True)
        if self.shape_inference not in ("", "onnx"):
            console.print(f"shapes: {self.shape_inference} shape inference (ONNX's left ranks unknown)", markup=False)
        for note in self.notes:
            console.print(f"note: {note}", markup=False)
        choice = self.target
        if (
            choice is not None
            and (choice.requested is None or choice.requested == "auto")
            and choice.why != "the default"
        ):
            console.print(f"target: {choice.chosen}: {choice.why}", markup=False)
            for passed_over in choice.tried:
                console.print(f"  passed over {passed_over}", markup=False)


def result_document(
    command: str,
    exit_code: int,
    *,
    model: str,
    output: str | None = None,
    report: Report | None = None,
    verification: dict[str, Any] | None = None,
    validation: dict[str, Any] | None = None,
    web_check: dict[str, Any] | None = None,
    regress: dict[str, Any] | None = None,
    notes: list[str] | None = None,
) -> dict[str, Any]:
    """The JSON every command's ``--json`` writes: every key always present, null where it does not apply.

    ``fused``/``blocks``/``target``: optimize and inspect (the report rows; the target chosen and why); ``verification``: verify and
    ``optimize --verify``; ``validation``: validate; ``web_check``: web-check; ``regress``: regress
    (``ortflash.regress.reports.regress_dict``). The README's
    *JSON output* section documents each key.
    """
    return {
        "schema": JSON_SCHEMA,
        "schema_version": JSON_SCHEMA_VERSION,
        "ortflash_version": __version__,
        "command": command,
        "exit_code": exit_code,
        "ok": exit_code == 0,
        "model": model,
        "output": output,
        "fused": report.fused if report is not None else None,
        "blocks": [asdict(b) for b in report.blocks] if report is not None else None,
        "target": asdict(report.target) if report is not None and report.target is not None else None,
        "verification": verification,
        "validation": validation,
        "web_check": web_check,
        "regress": regress,
        # the pipeline's own (opset conversions) first, then the command's
        "notes": [*(report.notes if report is not None else []), *(notes or [])],
    }
