"""Writing a Softmax block read by softmax_read as one FlashAttention node: the rewrites its
reading planned (einsum_rules), the causal reading of its mask (fusion/causal), the operands put
in the op's layout (rank 4, one head count, a split batch-head dim), the node, and the outputs
rerouted to it; with the notes and columns of its report row."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import onnx_ir as ir

from ..graph import ir_utils as u
from ..graph import shapes
from ..graph.emitter import Emitter, replace_output
from ..graph.interpret import proved_dims
from ..op.call import FlashAttentionCall
from ..op.node import write_call
from ..op.policy import SoftmaxPolicy
from .causal.proof import CausalProof, NotProved, absorbs_scores, prove
from .causal.write import neutral_padding, write_padding
from .driver import Written
from .softmax_block import SoftmaxBlock, through
from .softmax_read import describe, scores_kept


def write_block(
    e: Emitter, block: SoftmaxBlock, policy: SoftmaxPolicy, block_id: str, prove_causal: bool = True
) -> Written:
    """Write block as a FlashAttention node before e's anchor and reroute its output to it.
    prove_causal: read its [B, 1, Sq, Sk] bias or mask as causal x key padding where that is
    proved (fusion/causal); False keeps the tensor as the block's bias or mask."""
    for rewrite in block.rewrites:
        rewrite.perform(e.graph)
    assert block.output is not None and block.q is not None  # read_block returns complete blocks
    causal = proved_causal(block) if prove_causal else None
    proof = causal if isinstance(causal, _Causal) else None
    out = write_call(e, _call(e, block, proof), policy, block_id=block_id, replaces=block.output.name or "")
    if block.heads_split is not None:  # [B, H, Sq, Dv] back to the [B·H, Sq, Dv] P·V wrote
        out = e.node(
            "Reshape",
            [out, e.node("Concat", [e.i64([-1]), e.node("Slice", [e.shape(out), e.i64([2]), e.i64([4])])], axis=0)],
        )
    elif block.rank == 3:
        out = e.squeeze(out, [1])
    replace_output(e.graph, block.output, out)
    kept = scores_kept(block)
    notes = [f"scores also read by {', '.join(kept)}, kept" if kept else ""]
    if proof is not None:
        notes.append(_proof_note(proof))
    elif isinstance(causal, str):
        notes.append(causal)
    columns = describe(block)
    if proof is not None:
        others = [
            ("bias" if any(x is b for b in block.biases) else "mask") + f" {u.value_shape(x) or '?'}"
            for x in list(block.biases) + [c for c, _ in block.masks]
            if all(x is not r for r in proof.replaced)
        ]
        columns["mask"] = ", ".join(filter(None, [_proof_column(proof), *others])) or "none"
        if proof.proof.score_bound is not None:
            columns["detail"] = _bound_detail(proof.proof.score_bound)
    return Written("; ".join(filter(None, notes)), columns)


def _to_rank4(e: Emitter, x: ir.Value, rank: int, x_rank: int | None) -> ir.Value:
    """3D [B·H, S, D] operands become [B·H, 1, S, D]; biases/masks of rank < 3 broadcast as they are."""
    if rank == 4 or (x_rank is not None and x_rank < 3):
        return x
    return e.unsqueeze(x, [1])


def _q_of_full_batch(e: Emitter, block: SoftmaxBlock) -> ir.Value:
    """Q, Expanded over the batch where another operand may have more items than Q.

    MatMul broadcasts dim 0 both ways; the op's output takes its batch from Q (K, V, bias and
    mask broadcast to it). Where another operand's dim 0 may be larger than Q's
    (shapes.may_broadcast), Q is expanded to the largest dim 0, the batch size of the original
    output."""
    assert block.q is not None and block.k is not None and block.v is not None and block.rank is not None
    q_batch = shapes.resolved_dim(block.q, 0)
    others = [
        shapes.resolved_dim(x, through(perm, 0)) for x, perm in [(block.k, block.k_perm), (block.v, block.v_perm)]
    ]
    for x in list(block.biases) + [c for c, _ in block.masks]:
        r = u.rank(x)
        others.append(1 if r is None or r < block.rank else shapes.resolved_dim(x, r - block.rank))
    operands = [block.k, block.v] + list(block.biases) + [c for c, _ in block.masks]
    unproved = [x for x, d in zip(operands, others) if d != 1 and shapes.may_broadcast(q_batch, d)]
    if not unproved:
        return block.q
    return e.expand_batch(block.q, e.largest_batch([block.q] + unproved), block.rank)


def kv_heads(block: SoftmaxBlock) -> tuple[shapes.Dim, shapes.Dim]:
    """(K's head count, V's) of a 4D block, each read through its Transpose."""
    return (
        shapes.resolved_dim(block.k, through(block.k_perm, 1)),
        shapes.resolved_dim(block.v, through(block.v_perm, 1)),
    )


def _kv_of_one_head_count(e: Emitter, block: SoftmaxBlock, k: ir.Value, v: ir.Value) -> tuple[ir.Value, ir.Value]:
    """K and V with one head count: MatMul broadcasts a single K (or V) head over the other's
    heads, the op reads one count for both (QKMatMul proved one of them is 1 where they differ)."""
    hk, hv = kv_heads(block)
    if shapes.same_dim(hk, hv) or 1 not in (hk, hv):
        return k, v
    one, other = (k, v) if hk == 1 else (v, k)
    heads = e.node("Slice", [e.shape(other), e.i64([1]), e.i64([2])])
    wide = e.node("Expand", [one, e.node("Concat", [e.i64([1]), heads, e.i64([1, 1])], axis=0)])
    return (wide, v) if hk == 1 else (k, wide)


@dataclass(frozen=True)
class _Causal:
    """A block's one bias or mask proved causal x key padding (fusion/causal)."""

    proof: CausalProof
    as_mask: bool
    marks_masked: bool
    # the bias or mask condition that is_causal and the padding part replace (two: a causal mask
    # and a causal bias added after it, _with_bias_after)
    replaced: tuple[ir.Value, ...]


def _has_query_dim(x: ir.Value) -> bool:
    dims = u.value_shape(x)
    return dims is not None and len(dims) >= 2 and dims[-2] != 1


def proved_causal(block: SoftmaxBlock) -> _Causal | str | None:
    """The causal proof of block's [B, 1, Sq, Sk] bias or mask; the step that failed where it does
    not hold; None where the block has no single query-dependent bias or mask to read. With
    several biases and masks, the one query-dependent tensor that compares positions is read and
    the others stay (MPT: an ALiBi bias [1, H, 1, Sk] and a causal + padding mask)."""
    assert block.q is not None and block.k is not None and block.v is not None and block.rank is not None
    q, k, k_perm = block.q, block.k, block.k_perm
    if block.heads_split is not None:
        # the one bias or mask of the [B, H, Sq, Sk] view; its rows and keys are the view's
        biases, masks = block.biases[: block.split_biases], block.masks[: block.split_masks]
        q = k = u.operand(next(n for n in block.nodes if n.op_type == "Softmax"), 0)
        k_perm = [0, 1, 3, 2]
    elif block.rank == 4:
        biases, masks = block.biases, block.masks
    else:
        return None
    read: list[tuple[ir.Value, bool, bool]] = [(b, False, False) for b in biases]
    read += [(c, True, marks) for c, marks in masks]
    if block.bias_after_mask:  # the bias added after the fills stays; a mask (filled before it) is read
        read = [r for r in read if r[1]]
    if len(read) > 1:
        read = [r for r in read if _compares_queries(r[0])]
        # a bias proved causal sets the fill of the op's masks: only alone, or beside masks of that fill
        if len(read) == 1 and not read[0][1] and masks:
            return None
    if len(read) != 1:
        return None
    candidate, as_mask, marks_masked = read[0]
    if not _has_query_dim(candidate):
        return None  # no query dim: a key padding mask already
    try:
        proof = prove(
            candidate,
            as_mask=as_mask,
            marks_masked=marks_masked,
            block_fill=block.mask_fill,
            q=q,
            k=k,
            k_perm=k_perm,
            alone=len(block.biases) + len(block.masks) == 1,
        )
    except NotProved as why:
        if not _compares_positions(candidate):
            return f"kept as a full {'mask' if as_mask else 'bias'}: {why}"
        return f"not proved causal: {why}"
    first = _Causal(proof, as_mask, marks_masked, (candidate,))
    return _with_bias_after(block, biases, masks, first, q, k, k_perm) if block.bias_after_mask else first


def _compares_queries(x: ir.Value) -> bool:
    """A bias or mask with a query axis whose subgraph compares positions: one a causal proof reads."""
    return _has_query_dim(x) and _compares_positions(x)


def _with_bias_after(
    block: SoftmaxBlock,
    biases: Sequence[ir.Value],
    masks: Sequence[tuple[ir.Value, bool]],
    first: _Causal,
    q: ir.Value,
    k: ir.Value,
    k_perm: list[int] | None,
) -> _Causal:
    """first (a causal mask, filled before the bias) and the block's one query-dependent bias added
    after it, where that bias is proved causal with the same frontier and window: one causal
    proof that replaces both (GPT-Neo: where(its own causal buffer, s, lowest) + Hugging Face's
    [B, 1, S, S] causal + padding mask).

    Exact where both fills absorb the scores and the scores are float32: right of the frontier
    the graph computes fill_mask + fill_bias, at most -2**128, which float32 rounds to -inf; on
    a visible key, s + padding(b, j), as the op computes with the padding part as its bias (after
    the fill, as before). So the op's fill is -inf, and a row whose every visible key is padded
    (left padding) keeps the graph's weights: equal over its visible keys, none right of the
    frontier. Two different frontiers would leave keys seen by one tensor and hidden by the
    other, whose scores differ between a padded and a visible key (two fills), so first stays
    alone then, the bias a full one. first alone where it cannot be proved. biases and masks: the
    block's of the [B, H, Sq, Sk] view, as proved_causal read them."""
    query_biases = [b for b in biases if _compares_queries(b)]
    if len(query_biases) != 1 or len(masks) != 1 or len(block.masks) != 1 or not first.as_mask:
        return first
    if not neutral_padding(first.proof.padding) or not absorbs_scores(first.proof.mask_fill):
        return first
    (bias,) = query_biases
    if u.dtype(bias) != ir.DataType.FLOAT or u.dtype(block.q) != ir.DataType.FLOAT:
        return first
    try:
        second = prove(bias, as_mask=False, marks_masked=False, block_fill=None, q=q, k=k, k_perm=k_perm, alone=False)
    except NotProved:
        return first
    same_frontier = (second.is_causal, second.window_left) == (first.proof.is_causal, first.proof.window_left)
    if not same_frontier or second.score_bound is not None or not absorbs_scores(second.mask_fill):
        return first
    proof = CausalProof(second.is_causal, -math.inf, second.padding, second.window_left)
    return _Causal(proof, False, False, (*first.replaced, bias))


_COMPARISONS = ("Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Trilu")


def _compares_positions(value: ir.Value, depth: int = 24) -> bool:
    """Whether the subgraph computing value has a comparison (or Trilu) that is not only a bound
    check of one Range: whether a failed causal proof is worth a note in the report (a read-only
    look; the proof itself is fusion/causal's)."""
    seen: set[int] = set()
    stack = [(value, depth)]
    while stack:
        v, d = stack.pop()
        node = u.producer(v)
        if node is None or d <= 0 or id(node) in seen:
            continue
        seen.add(id(node))
        if node.op_type in _COMPARISONS and all(u.const_array(x) is None for x in node.inputs):
            return True
        stack += [(x, d - 1) for x in node.inputs if x is not None]
    return False


def _call(e: Emitter, block: SoftmaxBlock, causal: _Causal | None = None) -> FlashAttentionCall:
    """The block as a FlashAttentionCall, writing the reshapes and combinations it needs; with a
    causal proof, is_causal and the padding part instead of the block's [B, 1, Sq, Sk] tensor."""
    assert block.q is not None and block.k is not None and block.v is not None and block.rank is not None
    if block.heads_split is not None:
        return _split_call(e, block, causal)
    k = block.k if block.k_perm is None else e.transpose(block.k, block.k_perm)
    q = _q_of_full_batch(e, block)
    v = block.v if block.v_perm is None else e.transpose(block.v, block.v_perm)
    if block.rank == 4:
        k, v = _kv_of_one_head_count(e, block, k, v)
    if block.rank == 3:
        q, k, v = (e.unsqueeze(x, [1]) for x in (q, k, v))
    ranks = {id(x): u.rank(x) for x in list(block.biases) + [c for c, _ in block.masks]}
    kept = _kept_by(causal)
    biases = (_to_rank4(e, e.cast(b, ir.DataType.FLOAT), block.rank, ranks[id(b)]) for b in filter(kept, block.biases))
    masks = ((_to_rank4(e, c, block.rank, ranks[id(c)]), inverted) for c, inverted in block.masks if kept(c))
    return _assemble(e, block, q, k, v, biases, masks, causal)


def _kept_by(causal: _Causal | None) -> Callable[[ir.Value], bool]:
    """Whether a bias or mask of the block stays: all but the one a causal proof replaces."""
    return (lambda x: all(x is not r for r in causal.replaced)) if causal is not None else (lambda x: True)


def _assemble(
    e: Emitter,
    block: SoftmaxBlock,
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    biases: Iterable[ir.Value],
    masks: Iterable[tuple[ir.Value, bool]],
    causal: _Causal | None,
) -> FlashAttentionCall:
    """The call of 4D operands: the biases summed, the masks (cond, inverted) and-ed as keep
    masks, and with a causal proof is_causal and its padding part added last."""
    bias = None
    for b in biases:
        bias = b if bias is None else e.node("Add", [bias, b])
    mask = None
    for cond, inverted in masks:
        keep = e.node("Not", [cond]) if inverted else cond
        mask = keep if mask is None else e.node("And", [mask, keep])

    is_causal, window_left = 0, -1
    mask_fill = -math.inf if block.mask_fill is None else block.mask_fill
    if causal is not None:  # the replaced tensor becomes is_causal (a window) and its padding part
        is_causal, mask_fill = causal.proof.is_causal, causal.proof.mask_fill
        window_left = causal.proof.window_left
        padding = write_padding(e, causal.proof.padding)
        if padding is not None and causal.as_mask:
            keep = e.node("Not", [padding]) if causal.marks_masked else padding
            mask = keep if mask is None else e.node("And", [mask, keep])
        elif padding is not None:
            padding = e.cast(padding, ir.DataType.FLOAT)
            bias = padding if bias is None else e.node("Add", [bias, padding])

    return FlashAttentionCall(
        q,
        k,
        v,
        dtype=u.dtype(block.q),
        scale=block.scale,
        bias=bias,
        mask=mask,
        is_causal=is_causal,
        mask_fill=mask_fill,
        masked_rows="zero" if block.nan_guard else "nan",
        softcap=block.softcap,
        bias_after_mask=block.bias_after_mask,
        window_left=window_left,
    )


def _heads_view(e: Emitter, x: ir.Value, heads: int) -> ir.Value:
    """[B·H, S, D] viewed as [B, H, S, D]."""
    tail = e.node("Slice", [e.shape(x), e.i64([1]), e.i64([3])])
    return e.node("Reshape", [x, e.node("Concat", [e.i64([-1, heads]), tail], axis=0)])


def _split_call(e: Emitter, block: SoftmaxBlock, causal: _Causal | None) -> FlashAttentionCall:
    """A per-batch·head block with a [B, H, Sq, Sk] view around its Softmax, as a 4D call:
    Q, K, V and the per-batch·head biases and masks viewed as [B, H, ...] (read_block proved
    their rows are B·H, or one), those of the 4D view as they are; with a causal proof of the
    4D view's one bias or mask, is_causal and its padding part instead of it."""
    assert block.q is not None and block.k is not None and block.v is not None and block.rank is not None
    heads = block.heads_split
    assert heads is not None

    def per_head(x: ir.Value) -> ir.Value:
        if u.rank(x) != 3:
            return x  # rank 2 or less: broadcasts over [B, H] as over [B·H]
        rows = proved_dims(x)  # as _check_head_split read them: B·H or 1
        return e.unsqueeze(x, [0]) if rows is not None and rows[0] == 1 else _heads_view(e, x, heads)

    k = block.k if block.k_perm is None else e.transpose(block.k, block.k_perm)
    v = block.v if block.v_perm is None else e.transpose(block.v, block.v_perm)
    kept = _kept_by(causal)
    biases = [per_head(e.cast(b, ir.DataType.FLOAT)) for b in block.biases[block.split_biases :]]
    masks = [(per_head(c), inverted) for c, inverted in block.masks[block.split_masks :]]
    biases += [e.cast(b, ir.DataType.FLOAT) for b in block.biases[: block.split_biases] if kept(b)]
    masks += [(c, inverted) for c, inverted in block.masks[: block.split_masks] if kept(c)]
    # the 4D view's replaced bias or mask becomes is_causal and its padding part (_assemble)
    q, k, v = (_heads_view(e, x, heads) for x in (block.q, k, v))
    return _assemble(e, block, q, k, v, biases, masks, causal)


def _proof_note(causal: _Causal) -> str:
    """The report's note on a proved mask: causal (with its flag), or padding expanded over the queries."""
    proof = causal.proof
    if proof.is_causal:
        window = f", window_left={proof.window_left}" if proof.window_left >= 0 else ""
        return f"causal (is_causal={proof.is_causal}{window}, proved from the mask subgraph)"
    what = "mask" if causal.as_mask else "bias"
    if neutral_padding(proof.padding):
        return f"the {what} is one neutral constant: dropped"
    return f"the {what} is constant over the queries: fed as {list(proof.padding.dims)}"


def _bound_detail(bound: float) -> str:
    """The row's detail for a causal bias whose finite fill (float16's lowest) the op takes as -inf."""
    return (
        "the causal bias's finite fill right of the frontier (float16's lowest, -65504, in Hugging Face's "
        "float16 masks) is taken as -inf: the graph adds it to the scores, and the two agree only while every "
        "score is below the bound "
        f"|s| < {math.floor(bound):,} (there the masked keys' weights underflow to 0, fusion/causal/finite_fill); "
        "the bound is not checked at run time: `ortflash optimize --verify --feeds` on real inputs is the check"
    )


def _proof_column(causal: _Causal) -> str:
    """The report's mask column for the tensor a proof replaced."""
    dims = list(causal.proof.padding.dims)
    if causal.proof.is_causal:
        return f"causal + padding {dims}"
    return "" if neutral_padding(causal.proof.padding) else f"padding {dims}"
