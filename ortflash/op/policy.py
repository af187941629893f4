"""The softmax policy: one object that says naive or online, read by every kernel.

The proposal ortflash grew from: with the online-softmax option off, attention
uses the naive softmax; with it on, it uses the online (single-pass, running
max and running sum) softmax for key lengths of at least ``min_seq_len`` and
the naive one below, where the extra rescaling costs more than it saves.

A policy that overrides fused nodes (``verify``, ``validate``, ``InferenceSession``)
may leave a field as ``None``: each node then keeps its own value for it, so
``--block-size 128`` alone retiles every node without changing its softmax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from . import spec

_DEFAULT_BLOCK_SIZE = cast(int, spec.ATTRIBUTES["block_size"].default)
_DEFAULT_MIN_SEQ_LEN = cast(int, spec.ATTRIBUTES["min_seq_len"].default)
# The mode a new FlashAttention node gets when nothing asks for one: the proposal's switch is off
# unless given (--online-softmax), so naive. The one default of every front door (optimize, the
# CLI, regress manifests, bench).
DEFAULT_MODE = "naive"


@dataclass(frozen=True)
class SoftmaxPolicy:
    mode: str | None = "naive"  # naive | online | auto; None: each node's own
    block_size: int | None = _DEFAULT_BLOCK_SIZE  # None: each node's own
    min_seq_len: int | None = _DEFAULT_MIN_SEQ_LEN  # None: each node's own

    def __post_init__(self) -> None:
        spec.validate(self.attributes())

    @classmethod
    def from_options(
        cls,
        softmax: str | None = None,
        online_softmax: bool | None = None,
        block_size: int | None = None,
        min_seq_len: int | None = None,
    ) -> SoftmaxPolicy | None:
        """The policy the CLI's and the API's options ask for; None when they ask for nothing.

        ``online_softmax`` is the proposal's switch (True: ``auto``, False: ``naive``) and
        ``softmax`` names the mode; they must agree when both are given. With a mode, a
        size not given takes the op's default; without one, the policy keeps each node's
        mode and overrides only the sizes given.
        """
        switched = None if online_softmax is None else ("auto" if online_softmax else "naive")
        if softmax is not None and switched is not None and softmax != switched:
            raise spec.SpecError(f"softmax={softmax!r} contradicts online_softmax={online_softmax!r}")
        mode = softmax if softmax is not None else switched
        if mode is None:
            if block_size is None and min_seq_len is None:
                return None
            return cls(None, block_size, min_seq_len)
        return cls(
            mode,
            _DEFAULT_BLOCK_SIZE if block_size is None else block_size,
            _DEFAULT_MIN_SEQ_LEN if min_seq_len is None else min_seq_len,
        )

    @classmethod
    def for_new_nodes(
        cls,
        softmax: str | None = None,
        online_softmax: bool | None = None,
        block_size: int | None = None,
        min_seq_len: int | None = None,
    ) -> SoftmaxPolicy:
        """The policy fusion writes on the nodes it creates: :meth:`from_options`, with
        DEFAULT_MODE and the op's default sizes for whatever is not asked for."""
        asked = softmax is not None or online_softmax is not None
        policy = cls.from_options(softmax if asked else DEFAULT_MODE, online_softmax, block_size, min_seq_len)
        assert policy is not None  # a mode is given, so a whole policy comes back
        return policy

    def forcing(self, mode: str) -> SoftmaxPolicy:
        """An override that runs every node in ``mode`` with this override's sizes (a size this
        one leaves to each node stays each node's own)."""
        return SoftmaxPolicy(mode, self.block_size, self.min_seq_len)

    @classmethod
    def from_attributes(cls, attrs: dict[str, Any]) -> SoftmaxPolicy:
        return cls(attrs["softmax"], attrs["block_size"], attrs["min_seq_len"])

    def attributes(self) -> dict[str, Any]:
        """The node attributes this policy sets (a field left to the node is absent)."""
        values = {"softmax": self.mode, "block_size": self.block_size, "min_seq_len": self.min_seq_len}
        return {name: value for name, value in values.items() if value is not None}

    @classmethod
    def for_node(cls, attrs: dict[str, Any], override: SoftmaxPolicy | None) -> SoftmaxPolicy:
        """The policy a node with these (validated) attributes runs under ``override``: the
        override's fields where it sets them, the node's own elsewhere (None: the node's own)."""
        own = cls.from_attributes(attrs)
        return own if override is None else override.applied_to(own)

    def applied_to(self, own: SoftmaxPolicy) -> SoftmaxPolicy:
        """The policy a node whose own policy is ``own`` runs under this override."""
        return SoftmaxPolicy.from_attributes({**own.attributes(), **self.attributes()})

    def choose(self, key_len: int) -> str:
        """The softmax a kernel runs for this key length: 'naive' or 'online'."""
        if self.mode == "auto" and self.min_seq_len is not None:
            return "online" if key_len >= self.min_seq_len else "naive"
        if self.mode is None or self.mode == "auto":
            raise ValueError("this policy leaves the choice to each node: apply it to the node's own first")
        return self.mode


# The override that changes nothing: every node keeps its own mode and sizes.
NODES_OWN = SoftmaxPolicy(None, None, None)
