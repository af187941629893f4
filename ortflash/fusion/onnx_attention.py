"""The standard ONNX ``Attention`` op (opsets 23, 24) → FlashAttention, as ONNX Runtime runs it.

What ONNX Runtime 1.31 (CPU) computes for one Attention node, measured on it and
reproduced here exactly (see tests/test_onnx_attention.py):

* 3D inputs ``[B, S, H·D]`` are split into heads with ``q_num_heads`` / ``kv_num_heads``;
  4D inputs are ``[B, H, S, D]``. Query head ``h`` reads kv head ``h // (Hq / Hkv)``.
* ``scale`` defaults to ``float(1 / sqrt(head_size))``; it multiplies ``Q @ Kᵀ``.
* ``softcap`` (when > 0) caps the scaled scores *before* the mask is added, which is
  FlashAttention's own order.
* ``past_key`` / ``past_value`` are concatenated before K / V on the sequence axis;
  ``present_key`` / ``present_value`` are those concatenations (K / V themselves, in the
  4D layout, without a past).
* ``is_causal``: query ``i`` sees key ``j <= i + P`` with ``P`` the past length (top-left
  aligned without a past, whatever Sq and Sk are), except that ORT drops the causal mask
  altogether for a single query with a non-empty past (``Sq == 1 and P > 0``). With
  ``nonpad_kv_seqlen`` (no past allowed with it) the frontier is per batch and
  bottom-right: ``j <= i + nonpad[b] - Sq``.
* ``nonpad_kv_seqlen`` masks keys ``j >= nonpad[b]``.
* ``attn_mask``: bool (False = masked) or float (added to the scores).
* Fully masked rows give zeros. ORT masks with ``lowest(T)`` and zeroes a query row when
  every key of it is masked, which counts a float mask value ``<= lowest(T)``
  (``-inf`` or ``finfo(T).min``) as masked; a row of larger values, however negative
  (say ``-1e30``), is an ordinary softmax (uniform, as the scores vanish in it).

In FlashAttention terms: the float mask is the bias, with its ``<= lowest`` entries made
``-inf``; bool mask, causal frontier (unless it is top-left: then ``is_causal``) and
``nonpad_kv_seqlen`` are one boolean mask; ``mask_fill = -inf`` and ``masked_rows = zero``
turn exactly the rows ORT zeroes into zeros. The one divergence: ORT adds ``lowest`` to a
masked score where this writes ``-inf``, which differs only for scores of magnitude
≥ 1e31 (float32) or for float16 mask values within a score of -65504.

Three of ONNX's rules ONNX Runtime 1.31 refuses to run, so no model it runs has them, are
written as ONNX's reference computes them: Attention-25's ``left_window_size`` /
``right_window_size`` (query i at position t = i + offset, the offset as for the causal frontier,
sees keys t - left <= j <= t + right) as one more bool mask, with ONNX's causal rule (no
exception for a single query); a rank-1 ``attn_mask`` (one row for every query); and a mask over
fewer keys than past + new, padded with False / -inf where both lengths are static.

The front end (AttentionOpFrontEnd) reads each node with onnx_attention_read (every attribute and
input ORT reads, each with its refusal) and writes it with onnx_attention_write (heads, past,
causal frontier, window, masks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import onnx_ir as ir

from ..graph.emitter import Emitter
from ..op.policy import SoftmaxPolicy
from .driver import Written, dtype_name
from .onnx_attention_read import AttentionOpReading, read_attention
from .onnx_attention_write import write_attention


@dataclass(frozen=True)
class AttentionOpFrontEnd:
    """The standard ONNX Attention nodes (fusion/driver.FrontEnd). New nodes go before each
    Attention node and its outputs are rerouted to them."""

    label: str = "Attention"
    prefix: str = "onnx_attention"
    one_op: bool = True

    def candidates(self, graph: ir.Graph) -> list[ir.Node]:
        return [n for n in graph if n.op_type == "Attention" and n.domain in ("", "ai.onnx")]

    def read(self, node: ir.Node, opset: int) -> AttentionOpReading:
        return read_attention(node, opset)

    def unread_columns(self) -> Mapping[str, object]:
        return {"pattern": "Attention"}

    def columns(self, reading: AttentionOpReading) -> Mapping[str, object]:
        return {"pattern": "Attention", "head_dim": reading.head_dim, "dtype": dtype_name(reading.dtype)}

    def anchor(self, reading: AttentionOpReading, node: ir.Node) -> ir.Node:
        return node

    def heads_per_batch_head(self, reading: AttentionOpReading) -> bool:
        return False

    def write(self, e: Emitter, reading: AttentionOpReading, policy: SoftmaxPolicy, block_id: str) -> Written:
        causal = write_attention(e, reading, policy, block_id=block_id, replaces=e.anchor.outputs[0].name or "")
        columns = {
            "pattern": reading.pattern(),
            "heads": reading.q_heads,
            "kv_heads": reading.kv_heads,
            "head_dim": reading.head_dim,
            "scale": reading.scale,
            "mask": reading.summary(causal),
            "dtype": dtype_name(reading.dtype),
        }
        return Written(reading.notes, columns)
