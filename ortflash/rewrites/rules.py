"""The attention rules: each one piece of  softmax(scale · q @ kᵀ + bias, masked) @ v.

A block is read starting at its Softmax, outwards: up the score expression
(casts, masks, biases, scale) to the q @ kᵀ MatMul, and down the probabilities
(casts, a NaN guard) to the MatMul with v. Each rule names the ops it matches
(`pattern`), proves what must hold for the fused op to compute the same numbers
(`check`, which raises NotFused naming the failed precondition) and records
its part of the replacement in the match (`apply`). The emission of the fused
node from a complete match is in fuse.py.
"""

from __future__ import annotations

import math

import onnx_ir as ir

from . import ir_utils as u
from .match import AttentionMatch, NotFused


def _float_type(value: ir.Value) -> bool:
    return value.dtype is None or value.dtype in u.FLOAT_TYPES


class Rule:
    pattern: str = ""  # the math this rule reads, for docs and the report
    op_types: tuple[str, ...] = ()

    def matches(self, node: ir.Node, value: ir.Value) -> bool:
        return node.op_type in self.op_types

    def check(self, node: ir.Node, value: ir.Value, m: AttentionMatch) -> None:
        """Raise NotFused if this node cannot be folded into the match."""

    def apply(self, node: ir.Node, value: ir.Value, m: AttentionMatch) -> ir.Value | None:
        """Fold the node into the match; return the next value to read (None: done)."""
        raise NotImplementedError


# ---------------------------------------------------------------- score side


class FloatCast(Rule):
    pattern = "Cast(x, to=float|float16)"
    op_types = ("Cast",)

    def check(self, node, value, m):
        if ir.DataType(u.attr_int(node, "to")) not in u.FLOAT_TYPES or not _float_type(node.inputs[0]):
            raise NotFused(f"Cast {node.name} is not between float32 and float16")

    def apply(self, node, value, m):
        m.add(node)
        return node.inputs[0]


class BooleanMask(Rule):
    """where(mask, scores, fill) or where(masked_out, fill, scores), fill a constant."""

    pattern = "Where(mask, scores, fill)"
    op_types = ("Where",)

    def _split(self, node):
        cond, a, b = node.inputs
        fill_b, fill_a = u.scalar(b), u.scalar(a)
        if fill_b is not None and fill_a is None:
            return cond, a, fill_b, False
        if fill_a is not None and fill_b is None:
            return cond, b, fill_a, True
        return None

    def check(self, node, value, m):
        split = self._split(node)
        if split is None:
            raise NotFused(f"Where {node.name} does not choose between the scores and one constant fill value")
        cond, _, fill, _ = split
        if cond.dtype is not None and cond.dtype != ir.DataType.BOOL:
            raise NotFused(f"Where {node.name}: its condition is not boolean")
        if math.isnan(fill) or fill > 0:
            raise NotFused(f"Where {node.name} fills masked scores with {fill}, not a large negative number")
        if m.mask_fill is not None and fill != m.mask_fill:
            raise NotFused(f"two masks fill with different values ({m.mask_fill} and {fill})")
        if m.seen_bias_above and not math.isinf(fill):
            # where(mask, s, fill) + b puts fill + b on masked positions: only -inf absorbs b.
            raise NotFused(f"a bias is added after Where {node.name}, whose fill {fill} is finite")
        if m.seen_scale_above:
            raise NotFused(f"the scores are scaled after the mask {node.name} (the fill would be scaled too)")

    def apply(self, node, value, m):
        cond, scores, fill, inverted = self._split(node)
        m.masks.append((cond, inverted))
        m.mask_fill = fill
        m.add(node)
        return scores


class AdditiveBias(Rule):
    """scores + bias (padding masks, position bias, ALiBi), bias of any broadcastable shape."""

    pattern = "Add(scores, bias)"
    op_types = ("Add",)

    def _split(self, node):
        a, b = node.inputs
        a_leads, b_leads = _reaches_qk(a), _reaches_qk(b)
        if a_leads and not b_leads:
            return a, b
        if b_leads and not a_leads:
            return b, a
        return None

    def check(self, node, value, m):
        split = self._split(node)
        if split is None:
            raise NotFused(f"Add {node.name}: cannot tell which operand is the attention scores")
        _, bias = split
        if not _float_type(bias):
            raise NotFused(f"Add {node.name}: the bias is not a float tensor")
        if m.seen_scale_above:
            raise NotFused(f"the scores are scaled after the bias {node.name} was added (the bias would be scaled too)")

    def apply(self, node, value, m):
        scores, bias = self._split(node)
        m.biases.append(bias)
        m.seen_bias_above = True
        m.add(node)
        return scores


class Softcap(Rule):
    """c · tanh(s / c): the soft cap, applied to the scaled scores under every bias and mask."""

    pattern = "Mul(Tanh(Div(scores, c)), c)"
    op_types = ("Mul",)

    @staticmethod
    def _split(node):
        for tanh_out, c in (node.inputs, reversed(node.inputs)):
            tanh = u.producer(tanh_out, "Tanh")
            div = u.producer(tanh.inputs[0], "Div") if tanh is not None else None
            cap = u.scalar(c)
            if div is not None and cap is not None and cap > 0 and u.scalar(div.inputs[1]) == cap:
                return tanh, div, cap
        return None

    def matches(self, node, value):
        return node.op_type == "Mul" and self._split(node) is not None

    def check(self, node, value, m):
        if m.seen_scale_above:
            raise NotFused(f"the scores are scaled after the softcap {node.name}")
        if m.softcap:
            raise NotFused("two softcaps on one block")

    def apply(self, node, value, m):
        tanh, div, cap = self._split(node)
        m.softcap = cap
        m.add(node, "Softcap")
        m.nodes += [tanh, div]
        return div.inputs[0]


class ScalarScale(Rule):
    """scores * c or scores / c with c one constant number."""

    pattern = "Mul(scores, c) | Div(scores, c)"
    op_types = ("Mul", "Div")

    def check(self, node, value, m):
        _scale_factor(node, value)

    def apply(self, node, value, m):
        factor, operand = _scale_factor(node, value)
        m.scale *= factor
        m.seen_scale_above = True
        m.add(node)
        return operand


class QKMatMul(Rule):
    """q @ kᵀ: q possibly scaled, kᵀ a Transpose of k (possibly scaled), or given transposed."""

    pattern = "MatMul(q [* c], Transpose(k [* c]) [* c])"
    op_types = ("MatMul",)

    def check(self, node, value, m):
        self._operands(node, m, dry_run=True)

    def apply(self, node, value, m):
        labels = self._operands(node, m, dry_run=False)
        m.add(node, f"MatMul({labels[0]},{labels[1]})")
        return None

    def _operands(self, node, m: AttentionMatch, dry_run: bool):
        q, kt = node.inputs
        scale = 1.0
        q_label, k_label = "q", "k"
        while (p := u.producer(q, ("Mul", "Div"))) is not None and _try_scale(p, q) is not None:
            factor, q = _try_scale(p, q)
            scale *= factor
            q_label = f"{p.op_type}({q_label})"
        rank = u.rank(q) or u.rank(node.inputs[0]) or u.rank(kt) or u.rank(node.outputs[0])
        if rank not in (3, 4):
            raise NotFused("the rank of Q is unknown or not 3 or 4 (shape inference found no [B, H, S, D] or [B·H, S, D])")
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
                    k, transposed = p.inputs[0], True
                    k_label = f"Transpose({k_label})"
                    continue
                if rank == 4 and perm_in == [0, 2, 3, 1]:
                    # k in [B, S, H, D] transposed straight to [B, H, D, S]
                    k, perm, transposed = p.inputs[0], [0, 2, 1, 3], True
                    k_label = f"Transpose({k_label},0231)"
                    continue
                break
            found = _try_scale(p, k)
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
        for v in (q, k, m.v):
            r = u.rank(v)
            if r is not None and r != rank:
                raise NotFused(f"Q, K and V do not share one rank (Q has {rank}, {v.name} has {r})")
        if u.rank(m.v) is None and rank is None:
            raise NotFused("the rank of V is unknown")
        for v in (q, k, m.v):
            if not _float_type(v):
                raise NotFused(f"{v.name} is not float32 or float16")
        if not (q.dtype == k.dtype == m.v.dtype):
            raise NotFused("Q, K and V have different dtypes")
        if rank == 3:
            for x in m.biases + [c for c, _ in m.masks]:
                if u.rank(x) is None:
                    raise NotFused(f"the rank of {x.name} is unknown, so its [B·H, S, T] layout cannot be proved")
        if dry_run:
            return None
        if perm is None and rank == 4:
            repeat = RepeatedKV.find(k)
            repeat_v = RepeatedKV.find(m.v)
            if repeat and repeat_v and repeat[1] == repeat_v[1]:
                k, m.v = repeat[0], repeat_v[0]
                k_label = k_label.replace("k", f"repeat(k,{repeat[1]})", 1)
        m.q, m.k, m.k_perm, m.rank = q, k, perm, rank
        m.scale *= scale
        return q_label, k_label


SCORE_RULES: tuple[Rule, ...] = (FloatCast(), BooleanMask(), AdditiveBias(), Softcap(), ScalarScale(), QKMatMul())


def _try_scale(node: ir.Node, operand: ir.Value):
    """(factor, the other operand) when node multiplies or divides operand by one constant number."""
    a, b = node.inputs
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


def _scale_factor(node: ir.Node, value: ir.Value):
    found = _try_scale(node, value)
    if found is None:
        if node.op_type == "Div" and u.scalar(node.inputs[1]) is not None:
            raise NotFused(f"{node.name} divides the scores by zero or raises their rank")
        raise NotFused(f"{node.op_type} {node.name} multiplies the scores by a tensor, not by one constant number")
    if not math.isfinite(found[0]) or found[0] == 0:
        raise NotFused(f"{node.name} scales the scores by {found[0]}")
    return found


def _reaches_qk(value: ir.Value, depth: int = 16) -> bool:
    """Whether value is (a cast, mask, bias or scale of) a MatMul: tells scores from bias in an Add."""
    for _ in range(depth):
        node = u.producer(value)
        if node is None:
            return False
        if node.op_type == "MatMul":
            return u.const_array(node.inputs[0]) is None and u.const_array(node.inputs[1]) is None
        if node.op_type in ("Cast", "Mul", "Div", "Tanh"):
            value = node.inputs[0] if u.const_array(node.inputs[0]) is None else node.inputs[1]
        elif node.op_type == "Where":
            value = node.inputs[1] if u.scalar(node.inputs[1]) is None else node.inputs[2]
        elif node.op_type == "Add":
            return _reaches_qk(node.inputs[0], depth - 1) or _reaches_qk(node.inputs[1], depth - 1)
        else:
            return False
    return False


class RepeatedKV(Rule):
    """Reshape(Expand(Unsqueeze(kv, 2), [B, Hkv, G, S, D]), [B, Hkv·G, S, D]): grouped-query
    attention written as a repeat of the K/V heads. The fused op reads kv itself (Hkv heads);
    query head h then uses kv head h // G, which is the order this reshape produces."""

    pattern = "Reshape(Expand(Unsqueeze(kv, axes=[2]), [B, Hkv, G, S, D]), [B, Hkv*G, S, D])"

    @staticmethod
    def find(value: ir.Value):
        """(kv, G) when value is such a repeat that the shapes prove; None otherwise."""
        reshape = u.producer(value, "Reshape")
        expand = u.producer(reshape.inputs[0], "Expand") if reshape else None
        unsq = u.producer(expand.inputs[0], "Unsqueeze") if expand else None
        if unsq is None or u.unsqueeze_axes(unsq) != [2]:
            return None
        kv = unsq.inputs[0]
        symbolic = RepeatedKV._find_symbolic(reshape, expand, kv)
        if symbolic is not None:
            return symbolic
        base = u.value_shape(kv)
        target = u.const_array(expand.inputs[1])
        expanded = [int(d) for d in target] if target is not None else u.value_shape(expand.outputs[0])
        if base is None or expanded is None or len(base) != 4 or len(expanded) != 5:
            return None
        # Expand broadcasts: a target dim of 1 keeps the unsqueezed input's dim.
        unsqueezed = [base[0], base[1], 1, base[2], base[3]]
        expanded = [unsqueezed[i] if d == 1 else d for i, d in enumerate(expanded)]
        groups = expanded[2]
        if not (isinstance(groups, int) and groups > 1):
            return None
        out = _reshape_dims(reshape, expanded) or u.value_shape(value)
        if out is None or len(out) != 4:
            return None
        # Batch, sequence and head dims survive the reshape unchanged (a -1 in the
        # sequence place is forced to S by the element count); dim 1 is Hkv·G, merged kv-major.
        seq_ok = u.same_dim(out[2], base[2]) or out[2] == -1
        if not (u.same_dim(out[0], base[0]) and seq_ok and u.same_dim(out[3], base[3])):
            return None
        if not (isinstance(out[1], int) and isinstance(base[1], int) and out[1] == base[1] * groups):
            if not (out[2] != -1 and u.same_dim(out[2], base[2])):
                return None
        return kv, groups

    @staticmethod
    def _find_symbolic(reshape: ir.Node, expand: ir.Node, kv: ir.Value):
        """The same proof on the shape subgraphs themselves (TorchScript computes them)."""
        base = u.dim_terms(kv)
        expanded = u.sym_vec(expand.inputs[1])
        target = u.sym_vec(reshape.inputs[1])
        if base is None or expanded is None or target is None or len(base) != 4:
            return None
        if len(expanded) != 5 or len(target) != 4 or u.attr_int(reshape, "allowzero", 0):
            return None
        unsqueezed = [base[0], base[1], 1, base[2], base[3]]
        expanded = [unsqueezed[i] if d == 1 else d for i, d in enumerate(expanded)]
        groups = expanded[2]
        if expanded[:2] != base[:2] or expanded[3:] != base[2:] or not (isinstance(groups, int) and groups > 1):
            return None
        out = [expanded[i] if d == 0 else d for i, d in enumerate(target)]
        heads = base[1] * groups if isinstance(base[1], int) else ("mul", base[1], groups)
        if [out[0], out[2], out[3]] != [base[0], base[2], base[3]] or out[1] != heads:
            return None
        return kv, groups


def _transpose_via_3d(outer: ir.Node) -> ir.Value | None:
    """x when outer = Reshape(Transpose(Reshape(x, [B·H, S, D]), [0, 2, 1]), [B, H, D, S]):
    the last two axes of a 4D x swapped through a 3D view (dynamo's SDPA exports)."""
    t = u.producer(outer.inputs[0], "Transpose")
    inner = u.producer(t.inputs[0], "Reshape") if t is not None else None
    if inner is None or u.attr_ints(t, "perm") != [0, 2, 1]:
        return None
    x = inner.inputs[0]
    xs, mid, out = u.value_shape(x), u.value_shape(inner.outputs[0]), u.value_shape(outer.outputs[0])
    if xs is None or mid is None or out is None or (len(xs), len(mid), len(out)) != (4, 3, 4):
        return None
    # The 3D view keeps (S, D) and merges the leading dims; the 4D view splits them back.
    if not (u.same_dim(mid[1], xs[2]) and u.same_dim(mid[2], xs[3])):
        return None
    if not all(u.same_dim(a, b) for a, b in zip(out, [xs[0], xs[1], xs[3], xs[2]])):
        return None
    return x


def _reshape_dims(reshape: ir.Node, in_dims: list) -> list | None:
    """Output dims of a Reshape with a constant target: 0 copies the input dim, -1 stays -1."""
    target = u.const_array(reshape.inputs[1])
    if target is None or u.attr_int(reshape, "allowzero", 0):
        return None
    dims = [int(d) for d in target.reshape(-1)]
    if dims.count(-1) > 1:
        return None
    return [in_dims[i] if d == 0 and i < len(in_dims) else d for i, d in enumerate(dims)]


# ------------------------------------------------------------ probability side


class ProbsCast(FloatCast):
    def apply(self, node, value, m):
        m.add(node)
        return node.outputs[0]


class NanGuard(Rule):
    """where(isnan(p), 0, p): fully masked rows give zeros instead of NaN."""

    pattern = "Where(IsNaN(p), 0, p)"
    op_types = ("IsNaN",)

    def _where(self, node, value):
        for where in node.outputs[0].consumers():
            if (
                where.op_type == "Where"
                and where.inputs[0] is node.outputs[0]
                and where.inputs[2] is value
                and u.scalar(where.inputs[1]) == 0.0
            ):
                return where
        return None

    def check(self, node, value, m):
        if self._where(node, value) is None:
            raise NotFused(f"IsNaN {node.name} is not a Where(IsNaN(p), 0, p) guard")

    def apply(self, node, value, m):
        where = self._where(node, value)
        m.nan_guard = True
        m.add(node)
        m.add(where, "Where(isnan)")
        return where.outputs[0]


class ProbsMatMulV(Rule):
    pattern = "MatMul(p, v)"
    op_types = ("MatMul",)

    def matches(self, node, value):
        return node.op_type == "MatMul" and node.inputs[0] is value

    def apply(self, node, value, m):
        m.v = node.inputs[1]
        m.output = node.outputs[0]
        m.add(node)
        return None


class RowMaxGuard(Rule):
    """where(reducemax(bias) == -inf, 0, p): ONNX Attention's function body zeroes the rows its
    bias masks out entirely. Equal to masked_rows='zero' when that bias is the block's only
    source of -inf, which read_block checks once the score side is read."""

    pattern = "Where(Equal(ReduceMax(bias, axes=[-1]), -inf), 0, p)"

    def _guarded_bias(self, node, value):
        if node.op_type != "Where" or node.inputs[2] is not value or u.scalar(node.inputs[1]) != 0.0:
            return None
        eq = u.producer(node.inputs[0], "Equal")
        if eq is None:
            return None
        for row_max, neg_inf in (eq.inputs, reversed(eq.inputs)):
            reduce = u.producer(row_max, "ReduceMax")
            if reduce is None or u.scalar(neg_inf) != -math.inf:
                continue
            axes = u.attr_ints(reduce, "axes")
            if axes is None and len(reduce.inputs) > 1:
                arr = u.const_array(reduce.inputs[1])
                axes = None if arr is None else [int(a) for a in arr.reshape(-1)]
            r = u.rank(reduce.inputs[0])
            if axes is not None and len(axes) == 1 and (axes[0] == -1 or (r is not None and axes[0] == r - 1)):
                return reduce.inputs[0]
        return None

    def matches(self, node, value):
        return self._guarded_bias(node, value) is not None

    def apply(self, node, value, m):
        m.nan_guard = True
        m.guard_bias = self._guarded_bias(node, value)
        m.add(node, "Where(rowmax=-inf)")
        return node.outputs[0]


PROBS_RULES: tuple[Rule, ...] = (ProbsCast(), NanGuard(), RowMaxGuard(), ProbsMatMulV())


def softmax_axis_is_last(node: ir.Node, opset: int) -> None:
    x = node.inputs[0]
    r = u.rank(x)
    axis = u.attr_int(node, "axis", -1 if opset >= 13 else 1)
    if axis == -1 or (r is not None and axis == r - 1):
        return
    if r is None:
        raise NotFused(f"Softmax axis is {axis} and the rank of its input is unknown")
    raise NotFused(f"Softmax is over axis {axis}, not the last axis (keys) of a rank-{r} tensor")
