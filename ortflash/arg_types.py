"""argparse types and output settings every sub-command shares: a leaf module, so the bench and
regress sub-commands take them without importing the CLI that builds their parsers."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

# Console width when the output is a pipe or a file: wide enough that no table folds or splits a
# number; rich pads only to the width a table needs.
PIPE_WIDTH = 100_000
# `--json -`: the JSON goes to stdout, and the tables to stderr
STDOUT = "-"


def int_at_least(text: str, minimum: int, requirement: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{requirement}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return int_at_least(text, 1, "must be a positive integer")


def positive_ints(text: str) -> list[int]:
    """argparse type: comma-separated integers >= 1 ("128,512")."""
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated positive integers, e.g. 128,512")
    return [positive_int(item) for item in items]


def console_for(args: argparse.Namespace) -> Console:
    """Where a command's tables go: stdout (stderr when --json - takes stdout), full width when not
    a terminal, nothing with --quiet."""
    from rich.console import Console

    stream = sys.stderr if getattr(args, "json", None) == STDOUT else sys.stdout
    terminal = stream.isatty()
    return Console(
        file=stream, width=None if terminal else PIPE_WIDTH, quiet=getattr(args, "quiet", False), highlight=terminal
    )
