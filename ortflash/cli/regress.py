"""``ortflash regress MANIFEST``: the command is ``ortflash.regress`` (its options and run are in
regress/command.py)."""

from __future__ import annotations

from ..regress.command import add_arguments, run

HELP = "check a manifest of models: blocks fused, loadable, same outputs (and speed) per target"

__all__ = ["HELP", "add_arguments", "run"]
