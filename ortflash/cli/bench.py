"""``ortflash bench MODEL``: the command is ``ortflash.bench`` (its options and run are in
bench/cli.py, shared with ``python -m ortflash.bench``)."""

from __future__ import annotations

from ..bench.cli import add_arguments, run

HELP = "latency and peak memory of each variant against sequence length, one process each"

__all__ = ["HELP", "add_arguments", "run"]
