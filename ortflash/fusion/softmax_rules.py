"""The attention rules: each one piece of  softmax(scale · q @ kᵀ + bias, masked) @ v.

Over 400 lines on purpose: the rules are one grammar, read in the order the walk applies them,
and they share the walk's state and the scale and K-side proofs.

A block is read starting at its Softmax, outwards: up the score expression
(casts, masks, biases, scale) to the q @ kᵀ MatMul, and down the probabilities
(casts, a NaN guard) to the MatMul with v. Each rule proves what must hold for the
fused op to compute the same numbers (`check`, which raises NotFused naming the failed
precondition) and folds its piece into the walk's state (`apply`). The walk itself is
in walker.py; what the block becomes is op/call.py's FlashAttentionCall. Beside them:
qk_operands.py (what Q, K and V must be once Q·Kᵀ is read), kv_repeats.py (grouped-query
repeats), einsum_rules.py (the Einsum forms of the two products).
"""

from __future__ import annotations

import math

import onnx_ir as ir

from ..errors import NotFused
from ..graph import bounds, shapes
from ..graph import ir_utils as u
from ..graph.dim_terms import dims_equal
from ..graph.interpret import proved_dims
from ..op.spec import ABSORBING_FILL
from .qk_operands import QKOperands, scaled_q, take_qk, try_scale
from .walk_state import WalkState


def _float_type(value: ir.Value) -> bool:
    t = u.dtype(value)
    return t is None or t in u.FLOAT_TYPES


class Rule:
    op_types: tuple[str, ...] = ()

    def matches(self, node: ir.Node, value: ir.Value) -> bool:
        return node.op_type in self.op_types

    def check(self, node: ir.Node, value: ir.Value, m: WalkState) -> None:
        """Raise NotFused if this node cannot be folded into the match."""

    def apply(self, node: ir.Node, value: ir.Value, m: WalkState) -> ir.Value | None:
        """Fold the node into the match; return the next value to read (None: done)."""
        raise NotImplementedError


# ---------------------------------------------------------------- score side


class FloatCast(Rule):
    op_types = ("Cast",)

    def check(self, node: ir.Node, value: ir.Value, m: WalkState) -> None:
        if ir.DataType(u.attr_int(node, "to", 0)) not in u.FLOAT_TYPES or not _float_type(u.operand(node, 0)):
            raise NotFused(f"{u.label(node)} is not between float32 and float16")

    def apply(self, node: ir.Node, value: ir.Value, m: WalkState) -> ir.Value | None:
        m.add(node)
        return u.operand(node, 0)


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


class InferenceIdentity(Rule):
    """Identity, or Dropout at inference, on the scores."""

    op_types = ("Identity", "Dropout")

    def check(self, node: ir.Node, value: ir.Value, m: WalkState) -> None:
        if not inference_identity(node):
            raise NotFused(f"{u.label(node)} may be in training mode, or its mask is read")

    def apply(self, node: ir.Node, value: ir.Value, m: WalkState) -> ir.Value | None:
        m.add(node)
        return u.operand(node, 0)


class BooleanMask(Rule):
    """where(mask, scores, fill) or where(masked_out, fill, scores), fill a constant."""

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

    def check(self, node: ir.Node, value: ir.Value, m: WalkState) -> None:
        cond, _, fill, _ = self._split(node)
        if cond.dtype is not None and cond.dtype != ir.DataType.BOOL:
            raise NotFused(f"{u.label(node)}: its condition is not boolean")
        if math.isnan(fill) or fill > 0:
            raise NotFused(f"{u.label(node)} fills masked scores with {fill}, not a large negative number")
        if m.mask_fill is not None and fill != m.mask_fill:
            raise NotFused(f"two masks fill with different values ({m.mask_fill} and {fill})")
        if m.scale_nearer_softmax:
            raise NotFused(f"the scores are scaled after the mask {u.label(node)} (the fill would be scaled too)")

    def apply(self, node: ir.Node, value: ir.Value, m: WalkState) -> ir.Value | None:
        cond, scores, fill, inverted = self._split(node)
        if m.bias_nearer_softmax and not m.bias_after_mask:
            # where(mask, s, fill) + b: the op's own order when the fill absorbs b (fill + b ==
            # fill), else its bias_after_mask order, which computes exactly this graph.
            m.bias_after_mask = not _fill_absorbs_later_biases(fill, m.biases)
        m.masks.append((cond, inverted))
        m.mask_fill = fill
        m.add(node)
        return scores


# What a fill at or below spec.ABSORBING_FILL absorbs (fill + b == fill; spec.py says why 2**102).
_ABSORBED_BIAS = 2.0**102


def _fill_absorbs_later_biases(fill: float, biases: list[ir.Value]) -> bool:
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
    """scores + bias (padding masks, position bias, ALiBi), bias of any broadcastable shape."""

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

    def check(self, node: ir.Node, value: ir.Value, m: WalkState) -> None:
        _, bias = self._split(node)
        if not _float_type(bias):
            raise NotFused(f"{u.label(node)}: the bias is not a float tensor")
        if m.bias_after_mask:
            raise NotFused(
                f"biases on both sides of a mask: {u.label(bias)} is added before it, another after it "
                "(the op adds all of its biases on one side)"
            )
        if m.scale_nearer_softmax:
            raise NotFused(
                f"the scores are scaled after the bias {u.label(node)} was added (the bias would be scaled too)"
            )

    def apply(self, node: ir.Node, value: ir.Value, m: WalkState) -> ir.Value | None:
        scores, bias = self._split(node)
        m.biases.append(bias)
        m.bias_nearer_softmax = True
        m.add(node)
        return scores


class Softcap(Rule):
    """c · tanh(s / c): the soft cap, applied to the scaled scores under every bias and mask."""

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

    def check(self, node: ir.Node, value: ir.Value, m: WalkState) -> None:
        if m.scale_nearer_softmax:
            raise NotFused(f"the scores are scaled after the softcap {u.label(node)}")
        if m.softcap:
            raise NotFused("two softcaps on one block")

    def apply(self, node: ir.Node, value: ir.Value, m: WalkState) -> ir.Value | None:
        split = self._split(node)
        assert split is not None  # matches() proved it
        tanh, div, cap = split
        m.softcap = cap
        m.add(node, "Softcap")
        m.nodes += [tanh, div]
        return div.inputs[0]


class ScalarScale(Rule):
    """scores * c or scores / c with c one constant number."""

    op_types = ("Mul", "Div")

    def check(self, node: ir.Node, value: ir.Value, m: WalkState) -> None:
        _scale_factor(node, value)

    def apply(self, node: ir.Node, value: ir.Value, m: WalkState) -> ir.Value | None:
        factor, operand = _scale_factor(node, value)
        m.scale *= factor
        m.scale_nearer_softmax = True
        m.add(node)
        return operand


class QKMatMul(Rule):
    """q @ kᵀ: q possibly scaled, kᵀ a Transpose of k (possibly scaled), or given transposed."""

    op_types = ("MatMul",)

    def check(self, node: ir.Node, value: ir.Value, m: WalkState) -> None:
        self._operands(node, m, dry_run=True)

    def apply(self, node: ir.Node, value: ir.Value, m: WalkState) -> ir.Value | None:
        labels = self._operands(node, m, dry_run=False)
        assert labels is not None
        m.add(node, f"MatMul({labels[0]},{labels[1]})")
        return None

    def _operands(self, node: ir.Node, m: WalkState, dry_run: bool) -> tuple[str, str] | None:
        if m.heads_merged and m.heads_split is None:
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
            found = try_scale(p, k)
            if found is None:
                break
            factor, k = found
            scale *= factor
            k_label = f"{p.op_type}({k_label})"
        if u.const_array(k) is not None:
            raise NotFused("Kᵀ is a constant (a weight): this Softmax is not attention")
        if not transposed:
            perm = swap  # kᵀ is given as a tensor: transpose it back
            k_label = "kᵀ"
        take_qk(node, m, QKOperands(q, k, perm, rank, scale), dry_run)
        if m.repeat > 1:
            k_label = k_label.replace("k", f"repeat(k,{m.repeat})", 1)
        return q_label, k_label


NOT_SPLIT = "the probabilities are reshaped to [B·H, Sq, Sk], but the scores were not split from it"


def _same_trailing_dims(wide: ir.Value, narrow: ir.Value) -> bool:
    """wide [B, H, Sq, Sk] and narrow [X, Sq, Sk] with (Sq, Sk) proved the same: a Reshape between
    them keeps the element count, so X = B·H and each (b, h) row block is row b·H + h."""
    w, n = proved_dims(wide), proved_dims(narrow)
    if w is None or n is None or len(w) != 4 or len(n) != 3:
        return False
    return dims_equal(w[2], n[1]) and dims_equal(w[3], n[2])


class ScoresHeadSplit(Rule):
    """Reshape [B·H, Sq, Sk] -> [B, H, Sq, Sk] of the scores, when the probabilities are merged
    back to [B·H, Sq, Sk] before P·V: the block is per batch·head below it, per (batch, head) above."""

    op_types = ("Reshape",)

    def check(self, node: ir.Node, value: ir.Value, m: WalkState) -> None:
        if not m.heads_merged:
            raise NotFused(f"the scores are reshaped by {u.label(node)}, and the probabilities are not reshaped back")
        if m.heads_split is not None:
            raise NotFused(f"the scores are reshaped twice ({u.label(node)})")
        if not _same_trailing_dims(value, u.operand(node, 0)):
            raise NotFused(f"{u.label(node)} is not proved to split [B·H, Sq, Sk] into [B, H, Sq, Sk]")
        if not isinstance(shapes.resolved_dim(value, 1), int):
            raise NotFused(f"{u.label(node)} splits the batch·head axis into a head count that is not static")

    def apply(self, node: ir.Node, value: ir.Value, m: WalkState) -> ir.Value | None:
        heads = shapes.resolved_dim(value, 1)
        assert isinstance(heads, int)  # check() proved it
        m.heads_split = heads
        m.split_biases, m.split_masks = len(m.biases), len(m.masks)
        m.add(node, "Reshape(B,H)")
        return u.operand(node, 0)


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


# ------------------------------------------------------------ probability side


class ProbsCast(FloatCast):
    def apply(self, node: ir.Node, value: ir.Value, m: WalkState) -> ir.Value | None:
        m.add(node)
        return node.outputs[0]


class ProbsInferenceIdentity(InferenceIdentity):
    """Identity, or attention dropout at inference, between the Softmax and P·V."""

    def apply(self, node: ir.Node, value: ir.Value, m: WalkState) -> ir.Value | None:
        m.add(node)
        return node.outputs[0]


class NanGuard(Rule):
    """where(isnan(p), 0, p): fully masked rows give zeros instead of NaN."""

    op_types = ("IsNaN",)

    def _where(self, node: ir.Node, value: ir.Value) -> ir.Node | None:
        for where in node.outputs[0].consumers():
            if (
                where.op_type == "Where"
                and where.inputs[0] is node.outputs[0]
                and where.inputs[2] is value
                and u.scalar(where.inputs[1]) == 0.0
            ):
                return where
        return None

    def check(self, node: ir.Node, value: ir.Value, m: WalkState) -> None:
        if self._where(node, value) is None:
            raise NotFused(f"{u.label(node)} is not a Where(IsNaN(p), 0, p) guard")

    def apply(self, node: ir.Node, value: ir.Value, m: WalkState) -> ir.Value | None:
        where = self._where(node, value)
        assert where is not None  # check() proved it
        m.nan_guard = True
        m.add(node)
        m.add(where, "Where(isnan)")
        return where.outputs[0]


class ProbsHeadMerge(Rule):
    """Reshape [B, H, Sq, Sk] -> [B·H, Sq, Sk] of the probabilities before a batched P·V."""

    op_types = ("Reshape",)

    def matches(self, node: ir.Node, value: ir.Value) -> bool:
        return node.op_type == "Reshape" and node.inputs[0] is value

    def check(self, node: ir.Node, value: ir.Value, m: WalkState) -> None:
        if m.heads_merged:
            raise NotFused(f"the probabilities are reshaped twice ({u.label(node)})")
        if not _same_trailing_dims(value, node.outputs[0]):
            raise NotFused(f"the probabilities feed {u.label(node)}, not proved to merge [B, H] into B·H")

    def apply(self, node: ir.Node, value: ir.Value, m: WalkState) -> ir.Value | None:
        m.heads_merged = True
        m.add(node, "Reshape(B·H)")
        return node.outputs[0]


class ProbsMatMulV(Rule):
    op_types = ("MatMul",)

    def matches(self, node: ir.Node, value: ir.Value) -> bool:
        return node.op_type == "MatMul" and node.inputs[0] is value

    def apply(self, node: ir.Node, value: ir.Value, m: WalkState) -> ir.Value | None:
        m.v = node.inputs[1]
        m.output = node.outputs[0]
        m.add(node)
        return None


class RowMaxGuard(Rule):
    """where(reducemax(bias) == -inf, 0, p): ONNX Attention's function body zeroes the rows its
    bias masks out entirely. Equal to masked_rows='zero' when that bias is the block's only
    source of -inf, which read_block checks once the score side is read."""

    def _guarded_bias(self, node: ir.Node, value: ir.Value) -> ir.Value | None:
        if node.op_type != "Where" or node.inputs[2] is not value or u.scalar(node.inputs[1]) != 0.0:
            return None
        eq = u.producer(node.inputs[0], "Equal")
        if eq is None:
            return None
        for row_max, neg_inf in (eq.inputs, reversed(eq.inputs)):
            reduce = u.producer(row_max, "ReduceMax")
            if reduce is None or u.scalar(neg_inf) != -math.inf:
                continue
            axes = u.unsqueeze_axes(reduce)
            r = u.rank(reduce.inputs[0])
            if axes is not None and len(axes) == 1 and (axes[0] == -1 or (r is not None and axes[0] == r - 1)):
                return reduce.inputs[0]
        return None

    def matches(self, node: ir.Node, value: ir.Value) -> bool:
        return self._guarded_bias(node, value) is not None

    def apply(self, node: ir.Node, value: ir.Value, m: WalkState) -> ir.Value | None:
        m.nan_guard = True
        m.guard_bias = self._guarded_bias(node, value)
        m.add(node, "Where(rowmax=-inf)")
        return node.outputs[0]


PROBS_RULES: tuple[Rule, ...] = (
    ProbsCast(),
    ProbsInferenceIdentity(),
    NanGuard(),
    RowMaxGuard(),
    ProbsHeadMerge(),
    ProbsMatMulV(),
)


def softmax_axis_is_last(node: ir.Node, opset: int) -> None:
    x = node.inputs[0]
    r = u.rank(x)
    axis = u.attr_int(node, "axis", -1 if opset >= 13 else 1)
    if axis == -1 or (r is not None and axis == r - 1):
        return
    if r is None:
        raise NotFused(f"Softmax axis is {axis} and the rank of its input is unknown")
    raise NotFused(f"Softmax is over axis {axis}, not the last axis (keys) of a rank-{r} tensor")
