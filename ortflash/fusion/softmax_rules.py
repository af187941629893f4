"""The score-side rules: each one piece of  softmax(scale · q @ kᵀ + bias, masked) @ v, from the
Softmax's input up to Q·Kᵀ (probs_rules.py reads from its output down to P·V).

A block is read from its Softmax outwards: up the scores (casts, masks, biases, scale) to the
q @ kᵀ MatMul, and down the probabilities (casts, a NaN guard) to the MatMul with v. Each rule's
docstring draws the nodes it matches (``s``: the value read so far). Its `read` proves what must
hold for the fused op to compute the same numbers, raising NotFused naming the failed
precondition, and returns the block (softmax_block.SoftmaxBlock, frozen) with its piece read in
and the next value to read; it never changes the graph. The walk is softmax_read.py. Beside the
rules: qk_operands.py (what Q, K and V must be once Q·Kᵀ is read), kv_repeats.py (grouped-query
repeats), einsum_rules.py (the Einsum forms of the two products)."""

from __future__ import annotations

import math

import onnx_ir as ir

from ..errors import NotFused
from ..graph import bounds, shapes
from ..graph import ir_utils as u
from ..graph.dim_terms import dims_equal
from ..graph.interpret import proved_dims
from ..op.spec import ABSORBING_FILL
from .qk_operands import QKOperands, fold_scale, scaled_q, take_qk, try_scale
from .softmax_block import Rule, SoftmaxBlock

Read = tuple[SoftmaxBlock, ir.Value | None]  # what Rule.read returns: the block, the next value


def _float_type(value: ir.Value) -> bool:
    t = u.dtype(value)
    return t is None or t in u.FLOAT_TYPES


# ---------------------------------------------------------------- score side


def float_cast(node: ir.Node) -> None:
    if ir.DataType(u.attr_int(node, "to", 0)) not in u.FLOAT_TYPES or not _float_type(u.operand(node, 0)):
        raise NotFused(f"{u.label(node)} is not between float32 and float16")


class FloatCast(Rule):
    """A cast of the scores between float types::

    s = Cast(x, to=float32 | float16)      x float32 or float16; next: x
    """

    op_types = ("Cast",)

    def read(self, node: ir.Node, value: ir.Value, block: SoftmaxBlock) -> Read:
        float_cast(node)
        return block.read(node), u.operand(node, 0)


def inference_identity(node: ir.Node) -> bool:
    """node passes its input through unchanged at inference: Identity, or Dropout not in training
    mode (no training_mode input, or a constant false one) whose mask output nothing reads.
    Paddle2ONNX writes a model's dropouts as Identity, other exporters as Dropout."""
    if node.op_type == "Identity":
        return True
    if node.op_type != "Dropout":
        return False
    training = node.inputs[2] if len(node.inputs) > 2 else None
    if training is not None and u.scalar(training) != 0.0:
        return False
    mask = node.outputs[1] if len(node.outputs) > 1 else None
    return mask is None or (not mask.consumers() and not mask.is_graph_output())


def read_inference_identity(node: ir.Node) -> None:
    if not inference_identity(node):
        raise NotFused(f"{u.label(node)} may be in training mode, or its mask is read")


class InferenceIdentity(Rule):
    """Identity, or Dropout at inference, on the scores::

    s = Identity(x)    s = Dropout(x[, ratio[, training_mode=false]])   (mask unread); next: x
    """

    op_types = ("Identity", "Dropout")

    def read(self, node: ir.Node, value: ir.Value, block: SoftmaxBlock) -> Read:
        read_inference_identity(node)
        return block.read(node), u.operand(node, 0)


class BooleanMask(Rule):
    """A boolean mask with one constant fill (at most 0, and the same for every mask)::

    s = Where(keep, x, fill)      s = Where(masked_out, fill, x)      next: x
    """

    op_types = ("Where",)

    def _split(self, node: ir.Node) -> tuple[ir.Value, ir.Value, float, bool]:
        """(condition, scores, fill, True if the condition marks masked-out positions)."""
        cond, a, b = (u.operand(node, i) for i in range(3))
        fill_b, fill_a = u.scalar(b), u.scalar(a)
        if fill_b is not None and fill_a is None:
            return cond, a, fill_b, False
        if fill_a is not None and fill_b is None:
            return cond, b, fill_a, True
        raise NotFused(f"{u.label(node)} does not choose between the scores and one constant fill value")

    def read(self, node: ir.Node, value: ir.Value, block: SoftmaxBlock) -> Read:
        cond, scores, fill, inverted = self._split(node)
        if cond.dtype is not None and cond.dtype != ir.DataType.BOOL:
            raise NotFused(f"{u.label(node)}: its condition is not boolean")
        if math.isnan(fill) or fill > 0:
            raise NotFused(f"{u.label(node)} fills masked scores with {fill}, not a large negative number")
        if block.mask_fill is not None and fill != block.mask_fill:
            raise NotFused(f"two masks fill with different values ({block.mask_fill} and {fill})")
        if block.scale_nearer_softmax:
            raise NotFused(f"the scores are scaled after the mask {u.label(node)} (the fill would be scaled too)")
        bias_after_mask = block.bias_after_mask
        if block.bias_nearer_softmax and not block.bias_after_mask:
            # where(mask, s, fill) + b: the op's own order when the fill absorbs b (fill + b ==
            # fill), else its bias_after_mask order, which computes exactly this graph.
            bias_after_mask = not _fill_absorbs_later_biases(fill, block.biases)
        masks = block.masks + ((cond, inverted),)
        return block.read(node, masks=masks, mask_fill=fill, bias_after_mask=bias_after_mask), scores


# What a fill at or below spec.ABSORBING_FILL absorbs (fill + b == fill; spec.py says why 2**102).
_ABSORBED_BIAS = 2.0**102


def _fill_absorbs_later_biases(fill: float, biases: tuple[ir.Value, ...]) -> bool:
    """where(mask, s, fill) + b (GPT-2's order) equals the op's where(mask, s + b, fill) when
    fill + b == fill for every value b can hold: fill -inf and b never +inf or NaN, or fill at or
    below -2**127 and |b| < 2**102. The bounds on b come from the ops that compute it."""
    for bias in biases:
        found = bounds.value_bounds(bias)
        if fill == -math.inf and found is not None and found[1] < math.inf:
            continue
        if fill <= ABSORBING_FILL and found is not None and max(-found[0], found[1]) < _ABSORBED_BIAS:
            continue
        return False
    return True


class AdditiveBias(Rule):
    """A float bias of any broadcastable shape (padding masks, position bias, ALiBi)::

    s = Add(x, bias)   (or Add(bias, x); x the operand that leads to Q·Kᵀ)      next: x
    """

    op_types = ("Add",)

    def _split(self, node: ir.Node) -> tuple[ir.Value, ir.Value]:
        """(scores, bias)."""
        a, b = u.operand(node, 0), u.operand(node, 1)
        a_leads, b_leads = _reaches_qk(a), _reaches_qk(b)
        if a_leads and not b_leads:
            return a, b
        if b_leads and not a_leads:
            return b, a
        raise NotFused(f"{u.label(node)}: cannot tell which operand is the attention scores")

    def read(self, node: ir.Node, value: ir.Value, block: SoftmaxBlock) -> Read:
        scores, bias = self._split(node)
        if not _float_type(bias):
            raise NotFused(f"{u.label(node)}: the bias is not a float tensor")
        if block.bias_after_mask:
            raise NotFused(
                f"biases on both sides of a mask: {u.label(bias)} is added before it, another after it "
                "(the op adds all of its biases on one side)"
            )
        if block.scale_nearer_softmax:
            raise NotFused(
                f"the scores are scaled after the bias {u.label(node)} was added (the bias would be scaled too)"
            )
        return block.read(node, biases=block.biases + (bias,), bias_nearer_softmax=True), scores


class Softcap(Rule):
    """The soft cap c > 0, on the scaled scores under every bias and mask::

    s = Mul(Tanh(Div(x, c)), c)   (either operand order of the Mul)      next: x
    """

    op_types = ("Mul",)

    @staticmethod
    def _split(node: ir.Node) -> tuple[ir.Node, ir.Node, float] | None:
        """(the Tanh, the Div inside it, the cap)."""
        for tanh_out, c in (node.inputs, reversed(node.inputs)):
            tanh = u.producer(tanh_out, "Tanh")
            div = u.producer(tanh.inputs[0], "Div") if tanh is not None else None
            cap = u.scalar(c)
            if tanh is not None and div is not None and cap is not None and cap > 0 and u.scalar(div.inputs[1]) == cap:
                return tanh, div, cap
        return None

    def matches(self, node: ir.Node, value: ir.Value) -> bool:
        return node.op_type == "Mul" and self._split(node) is not None

    def read(self, node: ir.Node, value: ir.Value, block: SoftmaxBlock) -> Read:
        if block.scale_nearer_softmax:
            raise NotFused(f"the scores are scaled after the softcap {u.label(node)}")
        if block.softcap:
            raise NotFused("two softcaps on one block")
        split = self._split(node)
        assert split is not None  # matches() proved it
        tanh, div, cap = split
        return block.read(node, "Softcap", also=(tanh, div), softcap=cap), div.inputs[0]


class ScalarScale(Rule):
    """A scale by one constant, finite, non-zero number c (it multiplies the op's scale)::

    s = Mul(x, c)    s = Mul(c, x)    s = Div(x, c)      next: x
    """

    op_types = ("Mul", "Div")

    def read(self, node: ir.Node, value: ir.Value, block: SoftmaxBlock) -> Read:
        factor, operand = _scale_factor(node, value)
        return block.read(node, scale=block.scale * factor, scale_nearer_softmax=True), operand


class QKMatMul(Rule):
    """The scores' product, the last node of the score side; Q and K scaled by constants (folded
    into the scale), Kᵀ a Transpose of K or given transposed::

        s = MatMul(q', kt)       q' = q | Mul(q, c) | Div(q, c) | Add(Mul(q, c), 0) ...
                                 kt = Transpose(k, perm=[.., -1, -2]) | Transpose(k, [0,2,3,1])
                                    | Reshape(Transpose(Reshape(k, [B·H,S,D]), [0,2,1]), [B,H,D,S])
                                    | k' scaled by constants | a tensor kᵀ         next: none
    """

    op_types = ("MatMul",)

    def read(self, node: ir.Node, value: ir.Value, block: SoftmaxBlock) -> Read:
        if block.heads_merged and block.heads_split is None:
            raise NotFused(NOT_SPLIT)
        kt = u.operand(node, 1)
        q, scale, q_label = scaled_q(u.operand(node, 0))
        k_label = "k"
        rank = u.rank(q) or u.rank(node.inputs[0]) or u.rank(kt) or u.rank(node.outputs[0])
        if rank not in (3, 4):
            raise NotFused(
                "the rank of Q is unknown or not 3 or 4 (shape inference found no [B, H, S, D] or [B·H, S, D])"
            )
        swap = list(range(rank - 2)) + [rank - 1, rank - 2]
        k, perm = kt, None
        transposed = False
        while True:
            p = u.producer(k, ("Mul", "Div", "Transpose", "Reshape"))
            if p is None:
                break
            if p.op_type == "Reshape":
                inner = None if transposed or rank != 4 else _transpose_via_3d(p)
                if inner is None:
                    break
                k, transposed = inner, True
                k_label = f"Transpose3D({k_label})"
                continue
            if p.op_type == "Transpose":
                if transposed:
                    break
                perm_in = u.attr_ints(p, "perm")
                if perm_in == swap:
                    k, transposed = u.operand(p, 0), True
                    k_label = f"Transpose({k_label})"
                    continue
                if rank == 4 and perm_in == [0, 2, 3, 1]:
                    # k in [B, S, H, D] transposed straight to [B, H, D, S]
                    k, perm, transposed = u.operand(p, 0), [0, 2, 1, 3], True
                    k_label = f"Transpose({k_label},0231)"
                    continue
                break
            folded = fold_scale(p, k, scale, k_label)
            if folded is None:
                break
            k, scale, k_label = folded
        if u.const_array(k) is not None:
            raise NotFused("Kᵀ is a constant (a weight): this Softmax is not attention")
        if not transposed:
            perm = swap  # kᵀ is given as a tensor: transpose it back
            k_label = "kᵀ"
        block = take_qk(node, block, QKOperands(q, k, perm, rank, scale))
        if block.repeat > 1:
            k_label = k_label.replace("k", f"repeat(k,{block.repeat})", 1)
        return block.read(node, f"MatMul({q_label},{k_label})"), None


NOT_SPLIT = "the probabilities are reshaped to [B·H, Sq, Sk], but the scores were not split from it"


def same_trailing_dims(wide: ir.Value, narrow: ir.Value) -> bool:
    """wide [B, H, Sq, Sk] and narrow [X, Sq, Sk] with (Sq, Sk) proved the same: a Reshape between
    them keeps the element count, so X = B·H and each (b, h) row block is row b·H + h."""
    w, n = proved_dims(wide), proved_dims(narrow)
    if w is None or n is None or len(w) != 4 or len(n) != 3:
        return False
    return dims_equal(w[2], n[1]) and dims_equal(w[3], n[2])


class ScoresHeadSplit(Rule):
    """The per batch·head scores viewed per (batch, head), where the probabilities are merged back
    before P·V (ProbsHeadMerge): the block is per batch·head below it, per (batch, head) above::

        s [B, H, Sq, Sk] = Reshape(x [B·H, Sq, Sk], ...)   (Sq, Sk proved the same; H static)   next: x
    """

    op_types = ("Reshape",)

    def read(self, node: ir.Node, value: ir.Value, block: SoftmaxBlock) -> Read:
        if not block.heads_merged:
            raise NotFused(f"the scores are reshaped by {u.label(node)}, and the probabilities are not reshaped back")
        if block.heads_split is not None:
            raise NotFused(f"the scores are reshaped twice ({u.label(node)})")
        if not same_trailing_dims(value, u.operand(node, 0)):
            raise NotFused(f"{u.label(node)} is not proved to split [B·H, Sq, Sk] into [B, H, Sq, Sk]")
        heads = shapes.resolved_dim(value, 1)
        if not isinstance(heads, int):
            raise NotFused(f"{u.label(node)} splits the batch·head axis into a head count that is not static")
        split = block.read(
            node, "Reshape(B,H)", heads_split=heads, split_biases=len(block.biases), split_masks=len(block.masks)
        )
        return split, u.operand(node, 0)


SCORE_RULES: tuple[Rule, ...] = (
    FloatCast(),
    InferenceIdentity(),
    BooleanMask(),
    AdditiveBias(),
    Softcap(),
    ScalarScale(),
    ScoresHeadSplit(),
    QKMatMul(),
)


def _scale_factor(node: ir.Node, value: ir.Value) -> tuple[float, ir.Value]:
    found = try_scale(node, value)
    if found is None:
        if node.op_type == "Div" and u.scalar(node.inputs[1]) is not None:
            raise NotFused(f"{u.label(node)} divides the scores by zero or raises their rank")
        raise NotFused(f"{u.label(node)} multiplies the scores by a tensor, not by one constant number")
    if not math.isfinite(found[0]) or found[0] == 0:
        raise NotFused(f"{u.label(node)} scales the scores by {found[0]}")
    return found


def _reaches_qk(value: ir.Value | None, depth: int = u.MAX_DEPTH) -> bool:
    """Whether value is (a cast, mask, bias or scale of) a MatMul: tells scores from bias in an Add."""
    for _ in range(depth):
        node = u.producer(value)
        if node is None:
            return False
        if node.op_type in ("MatMul", "Einsum"):
            return u.const_array(node.inputs[0]) is None and u.const_array(node.inputs[1]) is None
        if node.op_type in ("Cast", "Mul", "Div", "Tanh", "Reshape"):
            value = node.inputs[0] if u.const_array(node.inputs[0]) is None else node.inputs[1]
        elif node.op_type == "Where":
            value = node.inputs[1] if u.scalar(node.inputs[1]) is None else node.inputs[2]
        elif node.op_type == "Add":
            return _reaches_qk(node.inputs[0], depth - 1) or _reaches_qk(node.inputs[1], depth - 1)
        else:
            return False
    return False


def _transpose_via_3d(outer: ir.Node) -> ir.Value | None:
    """x when outer = Reshape(Transpose(Reshape(x, [B·H, S, D]), [0, 2, 1]), [B, H, D, S]):
    the last two axes of a 4D x swapped through a 3D view (dynamo's SDPA exports)."""
    t = u.producer(outer.inputs[0], "Transpose")
    inner = u.producer(t.inputs[0], "Reshape") if t is not None else None
    if t is None or inner is None or u.attr_ints(t, "perm") != [0, 2, 1]:
        return None
    x = inner.inputs[0]
    # The 3D view keeps (S, D) and merges the leading dims; the 4D view splits them back.
    dims = shapes.Bindings()
    if (
        shapes.check_shape(dims, shapes.dims_of(x), "B H S D")
        and shapes.check_shape(dims, shapes.dims_of(inner.outputs[0]), "_ S D")
        and shapes.check_shape(dims, shapes.dims_of(outer.outputs[0]), "B H D S")
    ):
        return x
    return None


def softmax_axis_is_last(node: ir.Node, opset: int) -> None:
    x = node.inputs[0]
    r = u.rank(x)
    axis = u.attr_int(node, "axis", -1 if opset >= 13 else 1)
    if axis == -1 or (r is not None and axis == r - 1):
        return
    if r is None:
        raise NotFused(f"Softmax axis is {axis} and the rank of its input is unknown")
    raise NotFused(f"Softmax is over axis {axis}, not the last axis (keys) of a rank-{r} tensor")
