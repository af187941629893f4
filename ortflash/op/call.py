"""One application of the FlashAttention op: what both front ends build, ``node.write_call``
writes as a node and the lowering reads back from one. Its meaning is spec.py's."""

from __future__ import annotations

import math
from dataclasses import dataclass

import onnx_ir as ir

from . import spec
from .policy import SoftmaxPolicy
from .side_channel import SideChannel


@dataclass(frozen=True)
class FlashAttentionCall:
    """Operands in the op's 4D layout and the attributes that fix what it computes."""

    q: ir.Value  # [B, Hq, Sq, D]
    k: ir.Value  # [B, Hkv, Sk, D]
    v: ir.Value  # [B, Hkv, Sk, Dv]
    dtype: ir.DataType | None  # of Q, K, V and the output; None when not inferred
    scale: float
    bias: ir.Value | None = None  # float32, broadcastable to [B, Hq, Sq, Sk]; None: absent
    mask: ir.Value | None = None  # bool, false = masked out; None: absent
    is_causal: int = 0  # 0 none, 1 top-left, 2 bottom-right aligned (spec.py); a bool reads as 0/1
    mask_fill: float = -math.inf
    masked_rows: str = "nan"  # nan | zero
    softcap: float = 0.0
    bias_after_mask: bool = False  # the bias is added after the mask and causal fills (GPT-Neo)
    window_left: int = -1  # keys j >= p - window_left (spec.py); -1: unbounded
    window_right: int = -1  # keys j <= p + window_right; -1: unbounded

    @property
    def masked(self) -> bool:
        """Some keys can be masked out (mask_fill matters)."""
        return self.mask is not None or bool(self.is_causal) or self.window_left >= 0 or self.window_right >= 0

    def attributes(self, policy: SoftmaxPolicy) -> dict[str, object]:
        """The node's attributes under policy, completed and checked by the spec."""
        attrs = spec.validate(
            {
                "scale": self.scale,
                "is_causal": int(self.is_causal),
                **policy.attributes(),
                "mask_fill": self.mask_fill,
                "masked_rows": self.masked_rows,
                "softcap": self.softcap,
                "bias_after_mask": int(self.bias_after_mask),
                "window_left": int(self.window_left),
                "window_right": int(self.window_right),
            }
        )
        # The bridge hands float attributes to Python with 6 significant digits, and cannot pass
        # undeclared attributes: the side channel carries both.
        attrs["exact_floats"] = SideChannel.of_attributes(attrs).encode()
        # An undeclared attribute is written only away from its default, so that nodes that do not
        # use it stay as earlier versions wrote them.
        for name in spec.SIDE_CHANNEL_INTS:
            if attrs[name] == spec.ATTRIBUTES[name].default:
                del attrs[name]
        return attrs
