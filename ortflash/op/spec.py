"""The FlashAttention op: its inputs, attributes and their defaults, defined once.

Everything that builds, reads or runs a FlashAttention node (the rewrite rules,
the kernels, the lowering passes, the shaders, the CLI) takes names and defaults
from here.

Semantics, per batch b and query head h (kv head = h // (Hq // Hkv)):

    s = scale * Q[b, h] @ K[b, kv]^T                 # [Sq, Sk]
    s = softcap * tanh(s / softcap)                  # only when softcap > 0
    s = s + bias                                     # bias broadcast to [B, Hq, Sq, Sk]
    s = where(mask, s, mask_fill)                    # mask false = masked out
    s = where(j <= i + offset, s, mask_fill)         # only when is_causal (offset below)
    p = softmax(s, axis=-1)                          # naive or online, same numbers
    p = where(isnan(p), 0, p)                        # only when masked_rows == "zero"
    O[b, h] = p @ V[b, kv]

``is_causal``: 0 none; 1 top-left aligned (offset 0: query i sees keys j <= i); 2 bottom-right
aligned (offset Sk - Sq: a query block appended after Sk - Sq cached keys, as HF's
cache_position masks and ORT's GroupQueryAttention with past compute it). With Sq > Sk under 2,
the first Sq - Sk rows see no key: fully masked rows, handled by ``masked_rows`` like any other.
When Sq == Sk, 1 and 2 are the same.

``window_left`` / ``window_right`` (-1: unbounded, the default) bound the keys a query sees to a
band around its position. Query i has position ``p = i + offset`` (the causal offset above: 0 for
is_causal 0 and 1, Sk - Sq for 2), and sees key j only where

    p - window_left <= j            (window_left >= 0)
    j <= p + window_right           (window_right >= 0)

a third fill, in the causal fill's place and with the same mask_fill:

    s = where(in_window(i, j), s, mask_fill)          # only when a window is set (window_keeps)

combined with is_causal (both must keep the key; with is_causal set, window_right adds nothing).
Mistral's sliding window of W keys (the query and the W - 1 keys before it) is is_causal with
window_left = W - 1, and so are GPT-Neo's local layers (window_size W) and Gemma2's sliding
layers. With the window, a row may see no key at all: a fully masked row like any other.

With no keys (Sk = 0) there is nothing to attend to: O is zeros, whatever ``masked_rows`` says,
as in the graph the op replaces (an empty softmax row times an empty V sums nothing).

``bias_after_mask`` 1 (GPT-Neo's eager export) moves the bias after both fills:

    s = where(mask, s, mask_fill); s = where(j <= i + offset, s, mask_fill); s = s + bias

so a masked score is mask_fill + bias, not mask_fill. Softcap stays first in either order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

# onnxruntime-extensions registers Python custom ops in this domain only.
DOMAIN = "ai.onnx.contrib"
DOMAIN_VERSION = 1
OP_TYPE = "FlashAttention"

# Positional inputs. bias and mask are optional in the contract; the ONNX Runtime
# bridge (onnxruntime-extensions' Python ops) cannot take missing inputs, so an
# absent one is written as a neutral scalar: bias 0.0 (float32), mask True.
INPUTS = ("Q", "K", "V", "bias", "mask")


def absent_as_none(bias: np.ndarray | None, mask: np.ndarray | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(bias, mask) with the neutral placeholder scalars turned back into None (numpy arrays)."""
    if bias is not None and bias.size == 1 and float(bias.reshape(())) == 0.0:
        bias = None
    if mask is not None and mask.size == 1 and bool(mask.reshape(())):
        mask = None
    return bias, mask


SOFTMAX_MODES = ("naive", "online", "auto")
MASKED_ROWS = ("nan", "zero")


@dataclass(frozen=True)
class Attribute:
    name: str
    kind: type  # float, int or str
    default: object
    doc: str
    # Declared to the ONNX Runtime bridge. onnxruntime-extensions requires every declared
    # attribute on every node, so an attribute added after models were fused is not declared:
    # it is written on the node only when it differs from its default, and travels to the
    # kernel through the exact_floats side channel (NAME=VALUE), see op/side_channel.py.
    declared: bool = True


ATTRIBUTES: dict[str, Attribute] = {
    a.name: a
    for a in (
        Attribute("scale", float, 1.0, "exact factor applied to Q @ K^T, however the graph split it"),
        Attribute("is_causal", int, 0, "1: query i sees keys j <= i (top-left); 2: j <= i + Sk - Sq (bottom-right)"),
        Attribute("softmax", str, "auto", "naive | online | auto (see ortflash.policy)"),
        # 128, not 64: faster in 4 of 5 cases of benchmarks/results/cpu_attention_*.md (2026-11-30)
        Attribute("block_size", int, 128, "keys per tile in the online softmax"),
        Attribute("min_seq_len", int, 1024, "auto picks online from this key length up"),
        Attribute("mask_fill", float, -math.inf, "score given to masked-out positions"),
        Attribute("masked_rows", str, "nan", "nan | zero: what a fully masked row yields"),
        Attribute("softcap", float, 0.0, "tanh soft cap on the scaled scores; 0 = none"),
        Attribute(
            "exact_floats",
            str,
            "",
            "bridge side channel: exact floats, and a session's kernel choice (op/side_channel.py)",
        ),
        Attribute("bias_after_mask", int, 0, "1: the bias is added after the mask and causal fills", declared=False),
        Attribute(
            "window_left", int, -1, "keys j >= p - window_left (p: i + causal offset); -1 = unbounded", declared=False
        ),
        Attribute("window_right", int, -1, "keys j <= p + window_right; -1 = unbounded", declared=False),
    )
}

# What the ONNX Runtime bridge declares, and what only the side channel carries to the kernel.
DECLARED = tuple(name for name, a in ATTRIBUTES.items() if a.declared)
SIDE_CHANNEL_INTS = tuple(name for name, a in ATTRIBUTES.items() if not a.declared)

# A float32 mask_fill at or below this absorbs every score s with |s| < 2**102: fill + s == fill,
# so adding such a fill is the same as replacing the score by it. Why 2**102 and not 2**103: the
# fills at or below -2**127 have an ulp of 2**104 (away from zero s rounds back below 2**103),
# but from -2**127 itself towards zero the next float32 is -2**127 + 2**103 (the binade below has
# an ulp of 2**103), so a positive s rounds back to -2**127 only below half of that, 2**102.
ABSORBING_FILL = -(2.0**127)

# The floats the bridge rounds to 6 significant digits, written once more exactly in the
# exact_floats side channel (op/side_channel.py, which says why and what else it carries).
EXACT_FLOATS = ("scale", "mask_fill", "softcap")


class SpecError(ValueError):
    """An attribute value outside the op's contract."""


def validate(attrs: dict[str, Any]) -> dict[str, Any]:
    """Return attrs completed with defaults, or raise SpecError naming the bad value."""
    unknown = set(attrs) - set(ATTRIBUTES)
    if unknown:
        raise SpecError(f"unknown FlashAttention attribute(s): {', '.join(sorted(unknown))}")
    out: dict[str, Any] = {name: a.default for name, a in ATTRIBUTES.items()}
    out.update(attrs)
    for name, a in ATTRIBUTES.items():
        value = out[name]
        if a.kind is float:
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise SpecError(f"{name} must be a number, got {value!r}") from None
        elif a.kind is int:
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise SpecError(f"{name} must be an integer, got {value!r}")
            value = int(value)
        elif a.kind is str and isinstance(value, bytes):
            value = value.decode()
        out[name] = value
    if not math.isfinite(out["scale"]) or out["scale"] == 0.0:
        raise SpecError(f"scale must be finite and non-zero, got {out['scale']}")
    if out["is_causal"] not in (0, 1, 2):
        raise SpecError(f"is_causal must be 0, 1 or 2, got {out['is_causal']}")
    if out["bias_after_mask"] not in (0, 1):
        raise SpecError(f"bias_after_mask must be 0 or 1, got {out['bias_after_mask']}")
    for name in ("window_left", "window_right"):
        if out[name] < -1:
            raise SpecError(f"{name} must be -1 (unbounded) or a key count >= 0, got {out[name]}")
    if out["softmax"] not in SOFTMAX_MODES:
        raise SpecError(f"softmax must be one of {', '.join(SOFTMAX_MODES)}, got {out['softmax']!r}")
    if out["block_size"] < 1:
        raise SpecError(f"block_size must be a positive integer, got {out['block_size']}")
    if out["min_seq_len"] < 0:
        raise SpecError(f"min_seq_len must be >= 0, got {out['min_seq_len']}")
    if out["masked_rows"] not in MASKED_ROWS:
        raise SpecError(f"masked_rows must be one of {', '.join(MASKED_ROWS)}, got {out['masked_rows']!r}")
    if out["softcap"] < 0 or not math.isfinite(out["softcap"]):
        raise SpecError(f"softcap must be >= 0 and finite, got {out['softcap']}")
    if math.isnan(out["mask_fill"]) or out["mask_fill"] > 0:
        raise SpecError(f"mask_fill must be -inf or a negative number, got {out['mask_fill']}")
    return out


def causal_offset(is_causal: int, sq: int, sk: int) -> int:
    """Query i sees key j when j <= i + causal_offset (only meaningful where is_causal is set)."""
    return sk - sq if is_causal == 2 else 0


def windowed(attrs: dict[str, Any]) -> bool:
    """Whether attrs (validated) bound the keys by a window."""
    return attrs["window_left"] >= 0 or attrs["window_right"] >= 0


def key_bounds(attrs: dict[str, Any], sq: int, sk: int) -> tuple[np.ndarray, np.ndarray]:
    """Per query row i of [Sq]: (first, last) key index it may see by is_causal and the window
    (last < first: none); a mask or bias may hide more. The one definition the kernels follow."""
    offset = causal_offset(attrs["is_causal"], sq, sk)
    p = np.arange(sq, dtype=np.int64) + offset
    first = np.zeros(sq, np.int64)
    last = np.full(sq, sk - 1, np.int64)
    if attrs["window_left"] >= 0:
        first = np.maximum(first, p - attrs["window_left"])
    if attrs["window_right"] >= 0:
        last = np.minimum(last, p + attrs["window_right"])
    if attrs["is_causal"]:
        last = np.minimum(last, p)
    return first, last
