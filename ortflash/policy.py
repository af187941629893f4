"""The softmax policy: one object that says naive or online, read by every kernel.

The proposal ortflash grew from: with the online-softmax option off, attention
uses the naive softmax; with it on, it uses the online (single-pass, running
max and running sum) softmax for key lengths of at least ``min_seq_len`` and
the naive one below, where the extra rescaling costs more than it saves.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import spec


@dataclass(frozen=True)
class SoftmaxPolicy:
    mode: str = "naive"  # naive | online | auto
    block_size: int = spec.ATTRIBUTES["block_size"].default
    min_seq_len: int = spec.ATTRIBUTES["min_seq_len"].default

    def __post_init__(self):
        spec.validate({"softmax": self.mode, "block_size": self.block_size, "min_seq_len": self.min_seq_len})

    @classmethod
    def from_option(cls, online_softmax: bool, **kw) -> "SoftmaxPolicy":
        """The proposal's switch: off -> naive everywhere; on -> auto."""
        return cls(mode="auto" if online_softmax else "naive", **kw)

    @classmethod
    def from_attributes(cls, attrs: dict) -> "SoftmaxPolicy":
        return cls(attrs["softmax"], attrs["block_size"], attrs["min_seq_len"])

    def attributes(self) -> dict:
        return {"softmax": self.mode, "block_size": self.block_size, "min_seq_len": self.min_seq_len}

    def with_mode(self, mode: str) -> "SoftmaxPolicy":
        return replace(self, mode=mode)

    def choose(self, key_len: int) -> str:
        """The softmax a kernel runs for this key length: 'naive' or 'online'."""
        if self.mode == "auto":
            return "online" if key_len >= self.min_seq_len else "naive"
        return self.mode
