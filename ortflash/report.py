"""One row per Softmax: what ortflash found there and what it did."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Block:
    name: str  # the Softmax node
    fused: bool
    reason: str = ""  # why not fused (the first failed precondition), or a note
    pattern: str = ""
    heads: object = None
    kv_heads: object = None
    head_dim: object = None
    scale: float | None = None
    mask: str = ""  # bias / mask / causal summary
    softmax: str = ""  # naive | online | auto, as written on the fused node
    target: str = "ortflash"


@dataclass
class Report:
    model: str
    blocks: list[Block] = field(default_factory=list)

    @property
    def fused(self) -> int:
        return sum(b.fused for b in self.blocks)

    def summary(self) -> str:
        if not self.blocks:
            return f"{self.model}: no Softmax or Attention node, nothing to fuse; the model is written unchanged"
        return f"{self.model}: {self.fused} of {len(self.blocks)} attention blocks (Softmax or Attention nodes) fused"

    def to_dict(self) -> dict:
        return {"model": self.model, "fused": self.fused, "blocks": [asdict(b) for b in self.blocks]}

    def print(self, console=None) -> None:
        from rich.console import Console
        from rich.table import Table

        console = console or Console()
        table = Table(title=self.summary(), title_justify="left")
        for col in ("softmax node", "pattern", "heads", "head dim", "scale", "mask / bias", "result"):
            table.add_column(col, overflow="fold")
        for b in self.blocks:
            heads = "" if b.heads is None else str(b.heads)
            if b.kv_heads not in (None, b.heads):
                heads += f" (kv {b.kv_heads})"
            result = f"[green]fused[/] ({b.softmax})" if b.fused else f"[yellow]kept:[/] {b.reason}"
            if b.fused and b.target != "ortflash":
                result = f"[green]fused[/] → {b.target}"
            if b.fused and b.reason:
                result += f"; {b.reason}"
            table.add_row(
                b.name,
                b.pattern,
                heads,
                "" if b.head_dim is None else str(b.head_dim),
                "" if b.scale is None else f"{b.scale:.6g}",
                b.mask,
                result,
            )
        console.print(table)
