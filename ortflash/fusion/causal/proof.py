"""Causality proved from the mask subgraph: is a block's [B, 1, Sq, Sk] bias (or bool mask)
exactly a causal frontier combined with a key padding part that depends only on (b, j)?

Exporters build the causal and padding mask upstream, once per stack, from ``attention_mask``
and ``Range``s of the sequence lengths (HF transformers' masking_utils, both exporters), and
every block adds it as one [B, 1, S, S] tensor. The mask subgraph is read into one term by the
deep reading of graph/interpret (terms: graph/terms; the reading of each op: graph/op_readers).

The proof then splits the term on its comparisons of the key index j (axis 3) with the query
index i (axis 2): all must be one predicate ``j <= i + c``; with it false the term must fold to
one constant (the fill); with it true the term must not mention i (the padding part P(b, j)).
The block then becomes ``is_causal`` (1 for c = 0; 2 for c = Sk - Sq) with P, rewritten from the
same upstream tensors by the same ops (so exactly the same values; fusion/causal/write), as a
[B, 1, 1, Sk] bias or mask. Every step that cannot be proved raises ``NotProved`` naming it,
and the block keeps its [B, 1, Sq, Sk] tensor.

KV-cache decoders. Their masks compare j over ``Range(past + new)`` with ``i = Range(new) + past``:
c is then a linear form over symbolic dims (``past``), and dims are sums of symbols (``past +
seq``, written as ONNX Runtime's symbolic shape inference names them: graph/dim_terms). c is
proved Sk - Sq by sums of the dims' terms: Sk from the K cache's Concat (the sum of its pieces),
Sq from Q, and the mask's rows and keys proved the scores'. The padding part reads
``attention_mask`` [B, T], whose own length symbol T is never assumed to be Sk: the graph reads
it at j < past + new through a GatherND (or a Gather from its Flatten at b * T + j, b over the
whole batch), which ONNX Runtime refuses past the end, so wherever the graph runs it reads the
prefix ``attention_mask[:, :Sk]``, and the rewrite writes that Slice with the graph's own value
of the Range's length.

Padding expanded over the queries. BERT-, BART- and T5-style exports expand ``attention_mask``
[B, Sk] to [B, 1, Sq, Sk] before the Add (masking_utils' only mention of the query index is
``q_idx >= 0``, decided by the index's range). Where the read term, so decided, has no comparison
of positions and does not mention i at all, the split has no frontier (offset None): the tensor
is its [B, 1, 1, Sk] part broadcast over the queries, written from the same upstream tensors by
the same ops, and the block keeps is_causal 0 and its own fill (the values added are the same,
only broadcast later). A constant part that is neutral (0.0, True) is no mask at all.

Exactness. For a bool mask ``where(T, s, fill)``: exact (the masked scores are ``fill`` either
way). For an additive bias ``s + T`` with T = fill off the frontier: the op writes ``fill`` where
the graph has ``s + fill``; equal for fill -inf and finite s, and for fill <= -2**127
(float32-lowest, ``spec.ABSORBING_FILL``) and |s| < 2**102. A finite fill that does not absorb
(float16's lowest, -65504, HF's float16 masks) is proved where every row keeps a visible key and the
scores are bounded: there the masked keys' weights underflow to 0 in the graph, as under fill -inf
(fusion/causal/finite_fill says when, and why causal + padding stays refused). A NaN or infinite score right of the
frontier (NaN in Q or K) no longer reaches its row, as with every causal fill of the op (the
kernels skip those keys).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import onnx_ir as ir

from ...graph import shapes
from ...graph.dim_terms import dim_lin, dims_equal
from ...graph.interpret import Reader
from ...graph.terms import Abstract, Cmp, Lin, Look, NotProved, Num, Op, Term, atoms, axes_of, fold, remap, replace_atom
from ...op.spec import ABSORBING_FILL
from .finite_fill import prove_masked_weights_vanish
from .write import write_term


@dataclass(frozen=True)
class CausalSplit:
    """T(b, h, i, j) == where(i + low < j <= i + offset, padding(b, h, j), fill), read from the graph
    (low None: no lower frontier, a plain causal mask); offset None: no frontier at all, T(b, h, i, j)
    == padding(b, h, j) (a padding mask expanded over the queries)."""

    offset: Lin | None  # over symbolic dims (a cache's past length) and a constant
    fill: Term | None  # a Num: the value outside the visible keys (False for a bool mask)
    padding: Abstract  # dims [.., .., 1, Sk]: no dependence on i
    dims: tuple[shapes.Dim, ...]  # of the original [B, H|1, Sq, Sk] tensor
    window_left: int = -1  # keys j >= i + offset - window_left; -1: no lower frontier


def split_causal(value: ir.Value, reader: Reader | None = None) -> CausalSplit:
    """Read value (a [B, 1|H, Sq, Sk] bias or bool mask) as causal x padding, or as a sliding
    window (causal x a lower frontier) x padding, or as padding alone (constant over the query
    axis: offset None), or raise NotProved."""
    x = (reader or Reader()).read(value)
    x = Abstract(x.dims, _decide_bounds(x.term), x.dtype)
    if len(x.dims) != 4:
        dims = (1,) * (4 - len(x.dims)) + x.dims
        x = Abstract(dims, remap(x.term, {a: a + 4 - len(x.dims) for a in range(len(x.dims))}), x.dtype)
    i_axis, j_axis = 2, 3
    frontier: list[tuple[Term, Lin, bool]] = []  # (atom, offset o, True when the atom means j <= i + o)
    for atom in atoms(x.term):
        axes = axes_of(atom)
        if i_axis not in axes:
            continue
        if not isinstance(atom, Cmp) or atom.op != "le":
            raise NotProved(f"the mask depends on the query position other than by j <= i + c ({_name(atom)})")
        d = atom.lin.as_dict()
        if any(a[0] != "d" for a in set(d) - {("x", i_axis), ("x", j_axis)}):
            raise NotProved("a comparison of the query position with more than the key position and a constant")
        ci, cj = d.pop(("x", i_axis), 0), d.pop(("x", j_axis), 0)
        k = Lin.of(d, atom.lin.const)  # the rest: a constant and symbolic dims (a cache's past length)
        if (ci, cj) == (-1, 1):  # j - i + k <= 0  <=>  j <= i - k
            frontier.append((atom, k.scaled(-1), True))
        elif (ci, cj) == (1, -1):  # i - j + k <= 0  <=>  j >= i + k  <=>  not (j <= i + k - 1)
            frontier.append((atom, k.plus(Lin((), 1), -1), False))
        else:
            raise NotProved("a comparison of the query and key positions that is not j <= i + c")
    dims = x.dims[:i_axis] + (1,) + x.dims[i_axis + 1 :]
    if not frontier:  # no atom mentions i (each one that does is a frontier or refused above)
        if i_axis in axes_of(x.term):
            raise NotProved("the mask depends on the query position")
        return CausalSplit(None, None, Abstract(dims, x.term, x.dtype), x.dims)
    offsets = _ordered({o for _, o, _ in frontier})

    def region(left_of: int) -> Term:
        """The term where j lies right of the first left_of frontiers and left of (or on) the
        rest: the frontiers j <= i + o sorted by o, so region k is o_k < j - i <= o_{k+1}."""
        term = x.term
        for atom, o, means_left in frontier:
            left = offsets.index(o) >= left_of  # j <= i + o holds in this region
            term = replace_atom(term, atom, Num(left == means_left, ir.DataType.BOOL))
        return _fold_all(term)

    if len(offsets) == 1:  # causal: visible left of the one frontier, the fill right of it
        (offset,) = offsets
        seen, hidden = region(0), region(1)
        window_left = -1
    else:  # a band: the fill left of the lower frontier and right of the upper one
        low, offset = offsets
        outside_left, seen, hidden = region(0), region(1), region(2)
        if outside_left != hidden:
            raise NotProved(
                f"left of the lower frontier (j <= i + {_show(low)}) the mask is not the value right of the upper one"
            )
        width = offset.plus(low, -1)
        if width.coeffs:
            raise NotProved(f"the window's width {_show(width)} is not a constant")
        window_left = width.const - 1  # keys i + offset - window_left .. i + offset
    if not isinstance(hidden, Num):
        raise NotProved("right of the causal frontier the mask is not one constant")
    if i_axis in axes_of(seen):
        raise NotProved("the padding part of the mask still depends on the query position")
    return CausalSplit(offset, hidden, Abstract(dims, seen, x.dtype), x.dims, window_left)


def _ordered(offsets: set[Lin]) -> list[Lin]:
    """The frontiers' offsets, lowest first: one, or two whose difference is a constant (a band)."""
    if len(offsets) == 1:
        return list(offsets)
    shown = sorted(_show(o) for o in offsets)
    if len(offsets) > 2:
        raise NotProved(f"{len(offsets)} causal frontiers in one mask (offsets {shown})")
    a, b = offsets
    gap = b.plus(a, -1)
    if gap.coeffs:
        raise NotProved(f"two causal frontiers in one mask whose distance is not a constant (offsets {shown})")
    return [a, b] if gap.const > 0 else [b, a]


def _decide_bounds(term: Term) -> Term:
    """term with comparisons of one index variable with a constant decided where the index's
    range [0, n) decides them without n (masking_utils writes q_idx >= 0 into encoder masks)."""
    for atom in atoms(term):
        if not isinstance(atom, Cmp) or atom.op != "le" or len(atom.lin.coeffs) != 1:
            continue
        (var, coef) = atom.lin.coeffs[0]
        if var[0] != "x":
            continue
        c = atom.lin.const  # coef * x + c <= 0 with x >= 0
        if coef < 0 and c <= 0:
            term = replace_atom(term, atom, Num(True, ir.DataType.BOOL))
        elif coef > 0 and c > 0:
            term = replace_atom(term, atom, Num(False, ir.DataType.BOOL))
    return _fold_all(term)


def _fold_all(term: Term) -> Term:
    if isinstance(term, Op):
        return fold(Op(term.op, tuple(_fold_all(a) for a in term.args), term.attr))
    return term


def _name(term: Term) -> str:
    return term.source.name or "a tensor" if isinstance(term, Look) else type(term).__name__


def _show(lin: Lin) -> str:
    """A linear form over dims as text: past + 2, -1."""
    terms = [f"{'' if c == 1 else '-' if c == -1 else c}{a[1]}" for a, c in lin.coeffs]
    if lin.const or not terms:
        terms.append(str(lin.const))
    return " + ".join(terms).replace("+ -", "- ")


def _causal_flag(offset: Lin, sq: shapes.Dim, sk: shapes.Dim) -> int:
    """The op's is_causal for the frontier j <= i + offset over scores [.., Sq, Sk]: 2 where the
    offset is proved Sk - Sq, as sums of the dims' terms (Sk = past + new from the K cache's
    Concat, and a mask built from past + Range(new))."""
    if offset == Lin():
        return 1
    lq, lk = dim_lin(sq), dim_lin(sk)
    if lq is not None and lk is not None and offset == lk.plus(lq, -1):
        return 2
    raise NotProved(
        f"the causal frontier j <= i + {_show(offset)} is neither top-left (0) nor bottom-right (Sk - Sq = {sk} - {sq})"
    )


def absorbs_scores(fill: float) -> bool:
    """fill + s == fill for the scores (see the module docstring)."""
    return fill == -math.inf or fill <= ABSORBING_FILL


@dataclass(frozen=True)
class CausalProof:
    """What a block becomes: is_causal (0: the tensor was constant over the queries, only its
    padding part is fed), the op's window_left (-1: none), mask_fill and the [B, 1, 1, Sk]
    padding part."""

    is_causal: int
    mask_fill: float
    padding: Abstract
    window_left: int = -1
    # a finite fill taken as -inf (finite_fill): exact only while every score is below this in
    # magnitude, which nothing checks at run time; None: exact for every score
    score_bound: float | None = None


def prove(
    candidate: ir.Value,
    *,
    as_mask: bool,
    marks_masked: bool,
    block_fill: float | None,
    q: ir.Value,
    k: ir.Value,
    k_perm: list[int] | None,
    alone: bool,
) -> CausalProof:
    """The proof for one block whose one query-dependent bias (as_mask False) or mask (True;
    marks_masked: True where the condition marks masked-out keys) is ``candidate``; alone: it is the
    block's only bias or mask (a finite fill is proved only then); raises NotProved."""
    reader = Reader(computed_starts=True)
    split = split_causal(candidate, reader)
    q_dims, k_dims = reader.dims_of(q), reader.dims_of(k)
    if q_dims is None or k_dims is None or len(q_dims) != 4 or len(k_dims) != 4:
        raise NotProved("the ranks of Q and K are not proved 4")
    sq, sk = q_dims[2], k_dims[2 if k_perm is None else k_perm[2]]
    _, _, mq, mk = split.dims
    for end, size in reader.ends_assumed:  # a buffer's rows sliced from a computed start
        # discharged by a Slice from 0 to the same end, the mask's key count, of at most as many
        # keys: past it that Slice would be cut and fail to broadcast with the scores
        if not dims_equal(end, mk) or not any(dims_equal(end, e) and n <= size for e, n in reader.ends_inside):
            raise NotProved(f"a Slice from a computed start whose end {end} is not proved inside its {size} rows")
    write_term(None, split.padding.term, split.padding.dtype, split.padding.dims)  # dry run: raises where it cannot
    if split.offset is None:  # constant over the queries: the same values, broadcast by the op
        # the key axis is the tensor's own, broadcast as before; its rows must be the scores' (a
        # tensor of more rows than Q would have widened the block's output)
        if not dims_equal(mq, sq):
            raise NotProved(f"the mask's rows {mq} are not proved to be the scores' {sq}")
        fill = -math.inf if block_fill is None else block_fill  # the block's own fill, as without the proof
        return CausalProof(0, fill, split.padding)
    if not dims_equal(mq, sq) or not dims_equal(mk, sk):
        raise NotProved(f"the mask's rows and keys [{mq}, {mk}] are not proved to be the scores' [{sq}, {sk}]")
    is_causal = _causal_flag(split.offset, sq, sk)
    hidden = split.fill
    assert isinstance(hidden, Num)
    if as_mask:
        if bool(hidden.value) != marks_masked:
            raise NotProved("outside the causal frontier (and window) the mask keeps keys")
        assert block_fill is not None
        fill = block_fill
    else:
        fill = float(hidden.value)
        if not absorbs_scores(fill):  # float16's lowest (HF's float16 masks): fusion/causal/finite_fill
            assert split.offset is not None
            fill, padding, bound = prove_masked_weights_vanish(
                candidate, fill, split.padding, split.offset, split.window_left, is_causal, sq, sk, alone
            )
            return CausalProof(is_causal, fill, padding, split.window_left, bound)
    return CausalProof(is_causal, fill, split.padding, split.window_left)


__all__ = [
    "CausalProof",
    "CausalSplit",
    "NotProved",
    "absorbs_scores",
    "prove",
    "split_causal",
]
