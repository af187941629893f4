"""The ``exact_floats`` side channel of a FlashAttention node: one frozen value, one encode, one
decode. The only module that reads or writes the attribute's text (tests/test_layers.py).

Why the channel exists: the ONNX Runtime bridge (onnxruntime-extensions) hands float attributes
to Python with 6 significant digits (0.17677669 arrives as 0.176777, float32's lowest as
-3.40282e+38, which then no longer equals a mask filled with the real lowest), and it requires
every declared attribute on every node, so no attribute can be added without breaking models
fused earlier. The one string attribute therefore carries, as ``NAME=VALUE`` items joined by
``;``:

- the exact floats (spec.EXACT_FLOATS: scale, mask_fill, softcap), which a kernel takes only
  where they round to the float it got, so that an edited float attribute still wins;
- the attributes the bridge cannot declare (spec.SIDE_CHANNEL_INTS: bias_after_mask,
  window_left, window_right), each only away from its default;
- on a session's in-memory copy only, which kernel runs the node (RUNTIME_KEYS:
  ``backend=cpu;threads=2``, written by ortflash.InferenceSession). They are not part of the
  op's meaning, and saved models never carry them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from . import spec

# The items that say which kernel runs a node (ortflash.kernels.config.KernelConfig), not what it computes.
RUNTIME_KEYS = ("backend", "threads")


@dataclass(frozen=True)
class SideChannel:
    """One node's side channel. ``op_items``: the op's items as written (``NAME=VALUE``; an item
    of another writer is kept as it reads, and ignored); ``runtime``: a session's kernel choice,
    (key, value) pairs."""

    op_items: tuple[str, ...] = ()
    runtime: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of_attributes(cls, attrs: dict[str, Any]) -> SideChannel:
        """What a node with these (validated) attributes carries: the exact floats, then each
        undeclared attribute away from its default."""
        items = [f"{name}={float(attrs[name])!r}" for name in spec.EXACT_FLOATS]
        items += [
            f"{name}={int(attrs[name])}"
            for name in spec.SIDE_CHANNEL_INTS
            if attrs.get(name, spec.ATTRIBUTES[name].default) != spec.ATTRIBUTES[name].default
        ]
        return cls(tuple(items))

    @classmethod
    def decode(cls, text: str | bytes | None) -> SideChannel:
        """The side channel an attribute's text holds; empty text: none."""
        if isinstance(text, bytes):
            text = text.decode()
        items = [item for item in (text or "").split(";") if item]
        runtime = [item for item in items if item.partition("=")[0].strip() in RUNTIME_KEYS]
        op_items = tuple(item for item in items if item not in runtime)
        pairs = tuple((key.strip(), value.strip()) for key, _, value in (item.partition("=") for item in runtime))
        return cls(op_items, pairs)

    def encode(self) -> str:
        """The attribute's text; the inverse of :meth:`decode`."""
        return ";".join([*self.op_items, *(f"{key}={value}" for key, value in self.runtime)])

    def with_runtime(self, runtime: Sequence[tuple[str, str]]) -> SideChannel:
        """This channel with a session's kernel choice in place of any earlier one."""
        return replace(self, runtime=tuple(runtime))

    @property
    def op_text(self) -> str:
        """The text of the op's items alone (what a kernel is given, the kernel choice left out)."""
        return ";".join(self.op_items)

    @property
    def runtime_fields(self) -> dict[str, str]:
        """The kernel choice by key (a key given twice: the later)."""
        return dict(self.runtime)

    def resolved(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """attrs with float values replaced by their exact strings where those agree, and the
        undeclared attributes this channel carries added (``exact_floats`` itself as given)."""
        out = dict(attrs)
        for item in self.op_items:
            name, _, value = item.partition("=")
            if name in spec.SIDE_CHANNEL_INTS:
                try:
                    out[name] = int(value)
                except ValueError:
                    pass  # left to validate's default; a garbled side channel is not the op's meaning
                continue
            if name not in spec.EXACT_FLOATS or name not in attrs:
                continue
            try:
                exact = float(value)
            except ValueError:
                continue
            got = float(attrs[name])
            if exact == got or float(f"{exact:.6g}") == float(f"{got:.6g}"):
                out[name] = exact
        return out


def resolve(attrs: dict[str, Any]) -> dict[str, Any]:
    """A node's attributes with its side channel read into them."""
    return SideChannel.decode(attrs.get("exact_floats")).resolved(attrs)
