"""The exceptions ortflash raises on purpose, each with a message a user can act on."""

from __future__ import annotations


class OrtflashError(Exception):
    """A problem with the user's input; the CLI prints it as one line and exits 2."""


class NotFused(Exception):
    """A precondition of fusing a block failed; the message says which, in words a user can act on."""


class NotLowered(Exception):
    """A precondition of the lowering target's op that a FlashAttention node does not meet."""
