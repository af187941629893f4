"""The Q·Kᵀ operands of a block, once its Q·Kᵀ node (MatMul or Einsum) is read: the constant
scale factors on Q, and what the op needs proved of Q, K and V (one rank, one float type, head
counts it can group), with a grouped-query repeat of K and V read away."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import onnx_ir as ir

from ..errors import NotFused
from ..graph import ir_utils as u
from ..graph import shapes
from .kv_repeats import repeated_kv
from .softmax_block import SoftmaxBlock


@dataclass(frozen=True)
class QKOperands:
    """What a Q·Kᵀ node (MatMul or Einsum) was read as."""

    q: ir.Value
    k: ir.Value
    k_perm: list[int] | None  # Transpose to apply to k to get [B, H, Sk, D]; None = as is
    rank: int
    scale: float  # constant factors folded from Q's and K's sides


def scaled_q(q: ir.Value) -> tuple[ir.Value, float, str]:
    """(q, factor, label) with constant Mul/Div factors on q folded into factor."""
    scale, label = 1.0, "q"
    while (p := u.producer(q, ("Mul", "Div", "Add", "Identity"))) is not None:
        if p.op_type in ("Add", "Identity"):
            # Paddle's scale op is x·s + b, written Add(Mul(x, s), 0) and followed by an Identity
            passed = _added_zero(p) if p.op_type == "Add" else u.operand(p, 0)
            if passed is None:
                break
            q = passed
            continue
        folded = fold_scale(p, q, scale, label)
        if folded is None:
            break
        q, scale, label = folded
    return q, scale, label


def _added_zero(node: ir.Node) -> ir.Value | None:
    """x when node is Add(x, 0) with a constant zero that does not broadcast x to more dims."""
    a, b = u.operand(node, 0), u.operand(node, 1)
    for x, c in ((a, b), (b, a)):
        if x is not None and u.scalar(c) == 0.0 and (u.const_rank(c) or 0) <= (u.rank(x) or 0):
            return x
    return None


def take_qk(node: ir.Node, block: SoftmaxBlock, read: QKOperands) -> SoftmaxBlock:
    """block with Q, K and V read, once the Q·Kᵀ node is read as ``read`` and what the op needs of
    them is proved (raises NotFused where it is not), a grouped-query repeat of K and V read away."""
    q, k, perm, rank, scale = read.q, read.k, read.k_perm, read.rank, read.scale
    v = block.v
    assert v is not None  # the probability side is read first
    for x in (q, k, v):
        r = u.rank(x)
        if r is not None and r != rank:
            raise NotFused(f"Q, K and V do not share one rank (Q has {rank}, {u.label(x)} has {r})")
    _check_dtypes(node, q, k, v, block.output)
    if rank == 4:
        _check_head_counts(q, k, perm, v, block.v_perm)
    if rank == 3:
        for x in list(block.biases) + [c for c, _ in block.masks]:
            if u.rank(x) is None:
                raise NotFused(f"the rank of {u.label(x)} is unknown, so its [B·H, S, T] layout cannot be proved")
    repeat = block.repeat
    if perm is None and block.v_perm is None and rank == 4:
        repeat_k = repeated_kv(k)
        repeat_v = repeated_kv(v)
        if repeat_k and repeat_v and repeat_k[1] == repeat_v[1]:
            k, v, repeat = repeat_k[0], repeat_v[0], repeat_k[1]
    return dataclasses.replace(block, q=q, k=k, v=v, k_perm=perm, rank=rank, scale=block.scale * scale, repeat=repeat)


def _check_dtypes(qk: ir.Node, q: ir.Value, k: ir.Value, v: ir.Value, output: ir.Value | None) -> None:
    """Q, K and V proved float32 or float16 of one type. MatMul takes operands of one type, so a
    type known anywhere on the Q·Kᵀ side (or the P·V side) is the type of Q and K (of V)."""
    pv = output.producer() if output is not None else None
    v_side = (v, output) + ((pv.inputs[0],) if pv is not None else ())
    sides: dict[str, tuple[ir.Value | None, ...]] = {
        "Q and K": (q, k, qk.inputs[0], qk.inputs[1], qk.outputs[0]),
        "V": v_side,
    }
    found: dict[str, ir.DataType] = {}
    for side, values in sides.items():
        types = {t for x in values if (t := u.dtype(x)) is not None}
        if len(types) > 1:
            raise NotFused(f"{side} have different element types ({', '.join(sorted(t.name for t in types))})")
        if not types:
            raise NotFused(
                f"the element type of {side} is not known (shape inference did not reach "
                f"{(u.label(values[0]) if values[0] is not None else '?')} and no op on the path fixes it), "
                "so it cannot be proved float32 or float16"
            )
        found[side] = types.pop()
    for side, t in found.items():
        if t not in u.FLOAT_TYPES:
            raise NotFused(f"{side} are {t.name.lower()}, not float32 or float16")
    if found["Q and K"] != found["V"]:
        raise NotFused(f"Q and K are {found['Q and K'].name.lower()} and V is {found['V'].name.lower()}")


def _check_head_counts(
    q: ir.Value, k: ir.Value, k_perm: list[int] | None, v: ir.Value, v_perm: list[int] | None
) -> None:
    """Q's heads a multiple of K's, and K and V of one head count or one of them 1 (the fusion
    then broadcasts it): what the op's grouped heads can express."""
    hq = shapes.resolved_dim(q, 1)
    hk = shapes.resolved_dim(k, 1 if k_perm is None else k_perm[1])
    hv = shapes.resolved_dim(v, 1 if v_perm is None else v_perm[1])
    if isinstance(hk, int) and isinstance(hv, int) and hk != hv and 1 not in (hk, hv):
        raise NotFused(f"K has {hk} heads and V {hv}: the op reads one key/value head count")
    kv = hv if hk == 1 else hk
    if isinstance(hq, int) and isinstance(kv, int) and hq % kv:
        raise NotFused(f"Q has {hq} heads and K/V {kv}: the query heads are broadcast over the key heads")


def fold_scale(node: ir.Node, operand: ir.Value, scale: float, label: str) -> tuple[ir.Value, float, str] | None:
    """One step up the constant factors above a Q or K operand: (what node scales, scale times its
    factor, label wrapped in node's op) where node, operand's producer, multiplies or divides by one
    constant number; None where it does not, and the walk stops there."""
    found = try_scale(node, operand)
    if found is None:
        return None
    factor, inner = found
    return inner, scale * factor, f"{node.op_type}({label})"


def try_scale(node: ir.Node, operand: ir.Value) -> tuple[float, ir.Value] | None:
    """(factor, the other operand) when node multiplies or divides operand by one constant number."""
    a, b = u.operand(node, 0), u.operand(node, 1)
    if node.op_type == "Mul":
        for x, c in ((a, b), (b, a)):
            f = u.scalar(c)
            if f is not None and x is not operand and (u.const_rank(c) or 0) <= (u.rank(x) or 0):
                return f, x
        return None
    f = u.scalar(b)
    if f is not None and f != 0 and (u.const_rank(b) or 0) <= (u.rank(a) or 0):
        return 1.0 / f, a
    return None
