"""The Softmax front end (driver.FrontEnd): read the attention block around each Softmax with
the rules, or say why it is not one, and write each block read as a FlashAttention node.

Over 400 lines: the front end is one path from a Softmax to its node (the block read, its report
row, the causal reading of its mask, the operands put in the op's layout: rank 4, one head
count, a split batch-head dim), each step reading the SoftmaxBlock the one before it made."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import onnx_ir as ir

from ..errors import NotFused
from ..graph import ir_utils as u
from ..graph import shapes
from ..graph.dim_terms import dims_equal
from ..graph.emitter import Emitter, replace_output
from ..graph.interpret import proved_dims
from ..op.call import FlashAttentionCall
from ..op.node import write_call
from ..op.policy import SoftmaxPolicy
from .causal.proof import CausalProof, NotProved, prove
from .causal.write import neutral_padding, write_padding
from .driver import Written, dtype_name
from .einsum_rules import ProbsEinsumV, QKEinsum
from .softmax_rules import (
    NOT_SPLIT,
    PROBS_RULES,
    SCORE_RULES,
    Rule,
    softmax_axis_is_last,
)
from .walk_state import WalkState

# The rules in the order the walk tries them: the Einsum forms of the two products last.
_SCORE_SIDE: tuple[Rule, ...] = SCORE_RULES + (QKEinsum(),)
_PROBS_SIDE: tuple[Rule, ...] = PROBS_RULES + (ProbsEinsumV(),)


@dataclass(frozen=True)
class SoftmaxBlock:
    """softmax(scale · q @ kᵀ [+ biases] [masked]) @ v, as read around one Softmax node."""

    output: ir.Value  # the value the fused node replaces (probs @ v)
    q: ir.Value
    k: ir.Value  # [B, H, Sk, D] after k_perm
    k_perm: list[int] | None  # Transpose to apply to k to get [B, H, Sk, D]; None = as is
    v: ir.Value
    v_perm: list[int] | None  # Transpose to apply to v to get [B, H, Sk, Dv]; None = as is
    rank: int  # 4: [B, H, S, D]; 3: [B·H, S, D]
    scale: float
    biases: tuple[ir.Value, ...]
    masks: tuple[tuple[ir.Value, bool], ...]  # (condition, True if it marks masked-out)
    mask_fill: float | None
    nan_guard: bool
    softcap: float
    bias_after_mask: bool  # the biases are added after the masks (spec: bias_after_mask)
    nodes: tuple[ir.Node, ...]  # matched nodes, top (output) first
    pattern: str  # the block as read, inputs first: MatMul(q,Transpose(k))→Div→Add→Softmax→MatMul
    # rank 3 blocks whose scores are viewed as [B, H, Sq, Sk] around the Softmax: H, and how many
    # of biases / masks (the first ones) were read in that view
    heads_split: int | None = None
    split_biases: int = 0
    split_masks: int = 0


# SoftmaxBlock's fields that are WalkState's as they are (the rest are frozen or derived in _finished)
_FROM_STATE = tuple(
    f.name for f in dataclasses.fields(SoftmaxBlock) if f.name not in ("biases", "masks", "nodes", "pattern")
)


def _next_probs_node(value: ir.Value) -> ir.Node:
    # The reasons say "Softmax output", not "attention probabilities": until a MatMul with V is
    # found, nothing says this Softmax is attention (a classifier's or a CTC head's is not).
    # CastLike(x, p) reads only p's type, not its values.
    consumers = [c for c in value.consumers() if not (c.op_type == "CastLike" and c.inputs[0] is not value)]
    if value.is_graph_output():
        raise NotFused(f"the Softmax output {u.label(value)} is a graph output, not only read by a MatMul with V")
    isnan = [c for c in consumers if c.op_type == "IsNaN"]
    if isnan and len(consumers) == 2:
        return isnan[0]  # the guard reads p twice: IsNaN(p) and Where(.., .., p)
    if len(consumers) != 1:
        names = ", ".join(c.name or c.op_type for c in consumers) or "nothing"
        raise NotFused(f"the Softmax output {u.label(value)} is read by {names}, not by one MatMul with V")
    return consumers[0]


def read_block(softmax: ir.Node, opset: int) -> SoftmaxBlock:
    """The attention block around softmax; raises NotFused naming the failed precondition."""
    state = WalkState(softmax)
    softmax_axis_is_last(softmax, opset)
    state.add(softmax)

    value: ir.Value | None = softmax.outputs[0]
    while value is not None:
        node = _next_probs_node(value)
        rule = next((r for r in _PROBS_SIDE if r.matches(node, value)), None)
        if rule is None:
            raise NotFused(f"the Softmax output feeds {u.label(node)}, not a MatMul with V")
        rule.check(node, value, state)
        value = rule.apply(node, value, state)

    state.probs_ops = len(state.ops) - 1
    value = softmax.inputs[0]
    while value is not None:
        producer = u.producer(value)
        if producer is None:
            raise NotFused(f"the scores {u.label(value)} are not computed from Q and K in this graph")
        rule = next((r for r in _SCORE_SIDE if r.matches(producer, value)), None)
        if rule is None:
            raise NotFused(f"the scores come from {u.label(producer)}, which no rule reads")
        rule.check(producer, value, state)
        value = rule.apply(producer, value, state)
    if state.guard_bias is not None and (
        state.masks or [_strip(b) for b in state.biases] != [_strip(state.guard_bias)]
    ):
        raise NotFused("the fully-masked-row guard tests a tensor other than the block's only bias")
    if state.heads_merged and state.heads_split is None:
        raise NotFused(NOT_SPLIT)
    if state.heads_split is not None:
        if opset < _SLICE_INPUTS_OPSET:
            raise NotFused(
                f"the [B·H] <-> [B, H] views are written with Slice-{_SLICE_INPUTS_OPSET}; the model is opset {opset}"
            )
        _check_head_split(state)
    return _finished(state)


_SLICE_INPUTS_OPSET = 10  # Slice takes its bounds as inputs (the head views read a shape's tail)


def _check_head_split(state: WalkState) -> None:
    """What the [B, H, Sq, Sk] view of a per-batch·head block needs: K and V of Q's B·H rows (no
    broadcast over the merged axis), the per-batch·head biases and masks of B·H rows or one, and
    those of the 4D view not of more batch items than the scores."""
    assert state.q is not None and state.k is not None and state.v is not None

    def dim(x: ir.Value, axis: int) -> shapes.Dim:
        found = proved_dims(x)
        return found[axis] if found is not None and axis < len(found) else None

    rows = dim(state.q, 0)
    for name, x, axis in (("K", state.k, _axis(state.k_perm, 0)), ("V", state.v, _axis(state.v_perm, 0))):
        if not dims_equal(rows, dim(x, axis)):
            raise NotFused(f"{name}'s batch·head rows are not proved to be Q's ({rows} and {dim(x, axis)})")
    for x in list(state.biases[state.split_biases :]) + [c for c, _ in state.masks[state.split_masks :]]:
        r = u.rank(x)
        if r is None or r > 3:
            raise NotFused(f"{u.label(x)} is added to [B·H, Sq, Sk] scores with rank {r}")
        if r == 3 and dim(x, 0) != 1 and not dims_equal(rows, dim(x, 0)):
            raise NotFused(f"{u.label(x)} is not proved to have Q's batch·head rows or one")
    batch = dim(u.operand(state.softmax, 0), 0)
    for x in list(state.biases[: state.split_biases]) + [c for c, _ in state.masks[: state.split_masks]]:
        r = u.rank(x)
        if r is None:
            raise NotFused(f"the rank of {u.label(x)} is unknown")
        if r == 4 and dim(x, 0) != 1 and not dims_equal(batch, dim(x, 0)):
            raise NotFused(f"{u.label(x)} is not proved to have the scores' batch items or one")


def _finished(state: WalkState) -> SoftmaxBlock:
    """The frozen block of a complete walk: the state's fields of the same names (lists frozen as
    tuples), and the pattern as read (the rules set every field a block needs)."""
    assert state.output is not None and state.q is not None and state.k is not None and state.v is not None
    assert state.rank is not None
    probs = state.ops[1 : 1 + state.probs_ops]
    scores = state.ops[1 + state.probs_ops :]
    read = {name: getattr(state, name) for name in _FROM_STATE}
    return SoftmaxBlock(
        **read,
        biases=tuple(state.biases),
        masks=tuple(state.masks),
        nodes=tuple(state.nodes),
        pattern="→".join(list(reversed(scores)) + [state.ops[0]] + probs),
    )


def _strip(value: ir.Value) -> ir.Value:
    """value without Identity/Cast wrappers, to compare two reads of one tensor."""
    while (node := u.producer(value, ("Identity", "Cast"))) is not None:
        value = u.operand(node, 0)
    return value


def scores_kept(block: SoftmaxBlock) -> list[str]:
    """Readers outside the block of the score tensors it computes (they stay computed)."""
    inside = set(block.nodes)
    readers: list[str] = []
    for node in block.nodes:
        if node.op_type in ("MatMul", "Einsum") and node.outputs[0] is block.output:
            continue
        for out in node.outputs:
            readers += u.consumers_besides(out, inside)
    return sorted(set(readers))


def describe(block: SoftmaxBlock) -> dict[str, object]:
    """The report's columns for a block read (Block fields)."""
    q_shape = u.value_shape(block.q) or []
    k_shape = u.value_shape(block.k) or []
    if block.k_perm is not None and len(k_shape) == len(block.k_perm):
        k_shape = [k_shape[i] for i in block.k_perm]
    four_d = block.rank == 4 and len(q_shape) == 4
    parts = [f"bias {u.value_shape(b) or '?'}" for b in block.biases]
    parts += [("not-" if inv else "") + f"mask {u.value_shape(c) or '?'}" for c, inv in block.masks]
    if block.bias_after_mask:
        parts.append("bias after mask")
    if block.nan_guard:
        parts.append("NaN guard")
    if block.heads_split is not None:
        return {
            "pattern": block.pattern,
            "heads": block.heads_split,
            "kv_heads": block.heads_split,
            "head_dim": q_shape[-1] if q_shape else None,
            "scale": block.scale,
            "mask": ", ".join(parts) or "none",
            "dtype": dtype_name(u.dtype(block.q)),
        }
    return {
        "pattern": block.pattern,
        # a [B·H, S, D] block shows no head count: its node sees one head per batch·head pair
        "heads": q_shape[1] if four_d else None,
        "kv_heads": k_shape[1] if four_d and len(k_shape) == 4 else None,
        "head_dim": q_shape[-1] if q_shape else None,
        "scale": block.scale,
        "mask": ", ".join(parts) or "none",
        "dtype": dtype_name(u.dtype(block.q)),
    }


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
    q_batch = shapes.resolved_dim(block.q, 0)
    others = [shapes.resolved_dim(x, _axis(perm, 0)) for x, perm in [(block.k, block.k_perm), (block.v, block.v_perm)]]
    for x in list(block.biases) + [c for c, _ in block.masks]:
        r = u.rank(x)
        others.append(1 if r is None or r < block.rank else shapes.resolved_dim(x, r - block.rank))
    operands = [block.k, block.v] + list(block.biases) + [c for c, _ in block.masks]
    unproved = [x for x, d in zip(operands, others) if d != 1 and shapes.may_broadcast(q_batch, d)]
    if not unproved:
        return block.q
    return e.expand_batch(block.q, e.largest_batch([block.q] + unproved), block.rank)


def _axis(perm: list[int] | None, axis: int) -> int:
    """The axis of a tensor read through perm that becomes axis."""
    return axis if perm is None else perm[axis]


def kv_heads(block: SoftmaxBlock) -> tuple[shapes.Dim, shapes.Dim]:
    """(K's head count, V's) of a 4D block, each read through its Transpose."""
    return (shapes.resolved_dim(block.k, _axis(block.k_perm, 1)), shapes.resolved_dim(block.v, _axis(block.v_perm, 1)))


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
    replaced: ir.Value  # the bias or mask condition that is_causal and the padding part replace


def _has_query_dim(x: ir.Value) -> bool:
    dims = u.value_shape(x)
    return dims is not None and len(dims) >= 2 and dims[-2] != 1


def proved_causal(block: SoftmaxBlock) -> _Causal | str | None:
    """The causal proof of block's [B, 1, Sq, Sk] bias or mask; the step that failed where it does
    not hold; None where the block has no single query-dependent bias or mask to read. With
    several biases and masks, the one query-dependent tensor that compares positions is read and
    the others stay (MPT: an ALiBi bias [1, H, 1, Sk] and a causal + padding mask)."""
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
        read = [r for r in read if _has_query_dim(r[0]) and _compares_positions(r[0])]
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
        )
    except NotProved as why:
        if not _compares_positions(candidate):
            return f"kept as a full {'mask' if as_mask else 'bias'}: {why}"
        return f"not proved causal: {why}"
    return _Causal(proof, as_mask, marks_masked, candidate)


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
    return (lambda x: x is not causal.replaced) if causal is not None else (lambda x: True)


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
        q=q,
        k=k,
        v=v,
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


@dataclass(frozen=True)
class SoftmaxFrontEnd:
    """The blocks around each Softmax (fusion/driver.FrontEnd). prove_causal: read each block's
    [B, 1, Sq, Sk] bias or mask as causal x key padding where that is proved (fusion/causal);
    False keeps the tensor as the block's bias or mask (the baseline of
    benchmarks/results/causal_proof.md)."""

    prove_causal: bool = True
    label: str = "Softmax"
    prefix: str = "attention"

    def candidates(self, graph: ir.Graph) -> list[ir.Node]:
        return [n for n in graph if n.op_type == "Softmax" and n.domain in ("", "ai.onnx")]

    def read(self, node: ir.Node, opset: int) -> SoftmaxBlock:
        return read_block(node, opset)

    def unread_columns(self) -> Mapping[str, object]:
        return {}

    def columns(self, reading: SoftmaxBlock) -> Mapping[str, object]:
        return describe(reading)

    def anchor(self, reading: SoftmaxBlock, node: ir.Node) -> ir.Node:
        matmul_pv = reading.output.producer()
        assert matmul_pv is not None
        return matmul_pv

    def heads_per_batch_head(self, reading: SoftmaxBlock) -> bool:
        return reading.rank == 3 and reading.heads_split is None

    def write(self, e: Emitter, reading: SoftmaxBlock, policy: SoftmaxPolicy, block_id: str) -> Written:
        block = reading
        causal = proved_causal(block) if self.prove_causal else None
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
                if x is not proof.replaced
            ]
            columns["mask"] = ", ".join(filter(None, [_proof_column(proof), *others])) or "none"
        return Written("; ".join(filter(None, notes)), columns)


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


def _proof_column(causal: _Causal) -> str:
    """The report's mask column for the tensor a proof replaced."""
    dims = list(causal.proof.padding.dims)
    if causal.proof.is_causal:
        return f"causal + padding {dims}"
    return "" if neutral_padding(causal.proof.padding) else f"padding {dims}"
