"""A causal bias whose fill is finite and does not absorb the scores: float16's lowest, -65504, as
Hugging Face writes float16 masks (``where(causal, 0, finfo(float16).min)``).

The graph computes ``s + fill`` right of the frontier, not ``fill``: in float16 the sum is ``fill``
only for |s| < 16, so the op (which replaces a masked score by its fill) cannot copy it. What the
two share is the softmax's weight of a masked key, ``exp(round(s_m + fill) - m)`` with m the row's
maximum. Where the row keeps a visible key v (a score added to 0, exact) and every score is below
the bound of ``score_bound`` in magnitude, ``round(s_m + fill) - s_v <= 2 * bound + fill + err < -104``
(err: the rounding of the sum, ``2 * |fill| * u`` with u the element type's unit roundoff), so m is
a visible score and each masked weight is below ``exp(-104) < 2**-150``: 0 in float32 and float16.
The op with fill -inf gives those keys weight exactly 0, so on such a row the two agree; and with
fill -inf the native lowerings take the block too (they refuse a finite fill: lowering/read).
For -65504 in float16 the bound is 32,668: a score beyond it would let the graph's own softmax weigh
a key its mask hides (the float32 form of the same model would not), so the rewrite keeps what the
mask means; it is not checked at run time (``--verify`` with the user's ``--feeds`` compares the two).

Every row keeps a visible key where
  - the padding part is neutral: with padding, a row whose visible keys are all padded (left
    padding, an empty sequence) weighs all its keys by round(s + fill) in the graph, which the op
    cannot reproduce, so causal + padding stays refused;
  - no other bias or mask of the block can hide the row's visible keys: the tensor is the block's
    only bias and the block has no mask (``alone``, told by the caller, which read the block);
  - key 0 is visible to row 0: the frontier j <= i + offset has offset >= 0 (0 for is_causal 1; a
    cache's past length, a sum of dims, for 2); with a sliding window (keys i + offset - w .. i +
    offset) the diagonal i + offset must lie below Sk for every row: Sq + offset <= Sk, which
    is_causal 2 has by its offset and is_causal 1 where Sq is proved to be Sk.
With no keys (Sk = 0) both give zeros. A NaN or infinite score right of the frontier no longer
reaches its row, as with every causal fill of the op.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from ...graph import shapes
from ...graph.dim_terms import dims_equal
from ...graph.terms import Abstract, Lin, Look, NotProved, Num, Op, Term, atoms, fold, replace_atom
from .write import neutral_padding

FLOAT16_LOWEST = float(np.finfo(np.float16).min)
# exp(x) rounds to 0 in float32 below ln(2**-150) = -103.97
_UNDERFLOW = 104.0
_UNIT_ROUNDOFF = {
    ir.DataType.FLOAT16: 2.0**-11,
    ir.DataType.BFLOAT16: 2.0**-8,
    ir.DataType.FLOAT: 2.0**-24,
    ir.DataType.DOUBLE: 2.0**-53,
}


def score_bound(fill: float, dtype: ir.DataType) -> float:
    """The magnitude below which every score must lie for the masked weights to underflow to 0:
    ``(|fill| - 2 |fill| u - 104) / 2`` (32,668 for -65504 in float16)."""
    return (-fill * (1 - 2 * _UNIT_ROUNDOFF[dtype]) - _UNDERFLOW) / 2


def prove_masked_weights_vanish(
    candidate: ir.Value,
    fill: float,
    padding: Abstract,
    offset: Lin,
    window_left: int,
    is_causal: int,
    sq: shapes.Dim,
    sk: shapes.Dim,
    alone: bool,
) -> tuple[float, Abstract, float]:
    """The op's mask_fill (-inf), the padding part (constant-filled look-ups resolved) and the score
    bound the rewrite assumes (``score_bound``) for a causal bias of finite fill (see the module
    docstring), or raise NotProved naming the step that fails. alone: candidate is the block's only
    bias and the block has no mask."""
    said = f"right of the causal frontier the bias is {fill:g}" + (
        " (float16's lowest)" if fill == FLOAT16_LOWEST else ""
    )
    summed = f"s + {fill:g} is not {fill:g}"
    dtype = candidate.dtype or padding.dtype
    if fill > FLOAT16_LOWEST or dtype not in _UNIT_ROUNDOFF:
        raise NotProved(
            f"{said}: {summed}, so a row with no unpadded key would differ (exact only for -inf or fills "
            "<= -2**127, or for fills <= -65504 (float16's lowest) on rows proved to keep a visible key)"
        )
    padding = resolve_filled(padding)
    if not neutral_padding(padding):
        raise NotProved(
            f"{said}: {summed}, so a row with no unpadded key (its visible keys all padded) would differ: "
            f"the graph weighs every key of it by s + {fill:g}, the op cannot (proved only without padding)"
        )
    if not alone:
        raise NotProved(
            f"{said}: {summed}, and the block adds another bias or mask beside it, which could leave a "
            "row no visible key (proved only where the tensor is the block's only bias)"
        )
    if any(c < 0 for _, c in offset.coeffs) or offset.const < 0:
        raise NotProved(f"{said}: {summed}, and the first rows may see no key (the causal offset is not proved >= 0)")
    if window_left >= 0 and is_causal == 1 and not dims_equal(sq, sk):
        raise NotProved(
            f"{said}: {summed}, and with the window a row past Sk may see no key (Sq {sq} not proved Sk {sk})"
        )
    return -math.inf, padding, score_bound(fill, dtype)


def resolve_filled(padding: Abstract) -> Abstract:
    """padding with each look-up of a tensor filled with one constant (Casts of a ConstantOfShape:
    HF's decoder mask of ones where no decoder mask is given) replaced by that constant."""
    term = padding.term
    for atom in atoms(term):
        if isinstance(atom, Look) and (value := _filled(atom.source)) is not None:
            term = replace_atom(term, atom, value)
    return Abstract(padding.dims, term, padding.dtype)


def _filled(source: ir.Value) -> Num | None:
    casts = []
    while (node := source.producer()) is not None and node.op_type == "Cast" and node.inputs[0] is not None:
        casts.append(node.attributes["to"].as_int())
        source = node.inputs[0]
    if node is None or node.op_type != "ConstantOfShape":
        return None
    attr = node.attributes.get("value")
    if attr is None:  # ONNX's default: float32 0
        term: Term = Num(0.0, ir.DataType.FLOAT)
    else:
        tensor = attr.as_tensor()
        term = Num(tensor.numpy().reshape(-1)[0].item(), ir.DataType(tensor.dtype))
    for to in reversed(casts):
        term = fold(Op("Cast", (term,), to))
    return term if isinstance(term, Num) else None
