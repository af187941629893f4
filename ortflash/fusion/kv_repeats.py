"""Grouped-query attention written as a repeat of the K/V heads, in the forms exporters use.

A repeat is read only where query head h provably reads kv head h // G (the op's grouping,
``spec.py``): Unsqueeze(kv, 2) repeated G times along the new axis (Expand, Tile, or Concat of
copies) and merged by Reshape; a Gather over the heads with indices h // G (repeat_interleave);
or any repeat of a single kv head. Tile or Concat of several heads along axis 1 gives h % Hkv:
that is not the op's grouping, so those repeats stay in the graph (the block still fuses, with
Hkv = Hq)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ..graph import ir_utils as u
from ..graph import shapes


def repeated_kv(value: ir.Value) -> tuple[ir.Value, int] | None:
    """(kv, G) when value [B, Hkv·G, S, D] is kv [B, Hkv, S, D] with each head repeated G times
    in place (head h of value is head h // G of kv), as the shapes prove; None otherwise."""
    return _merged_five_d(value) or _gathered_heads(value) or _single_head_repeated(value)


def _merged_five_d(value: ir.Value) -> tuple[ir.Value, int] | None:
    """Reshape(R, [B, Hkv·G, S, D]) where R [B, Hkv, G, S, D] repeats Unsqueeze(kv, 2).

    Proved: the reshape keeps B, S and D of kv and its dim 1 is Hkv·G, or S is proved and the
    element count forces dim 1 (the repeat grows only the new axis, so no other dim changed)."""
    reshape = u.producer(value, "Reshape")
    found = _five_d_repeat(u.operand(reshape, 0)) if reshape is not None else None
    if reshape is None or found is None:
        return None
    kv, base, expanded = found
    groups = shapes.static(expanded[2])
    if groups is None or groups < 2:
        return None
    target = shapes.shape_vector(reshape.inputs[1])
    allowzero = bool(u.attr_int(reshape, "allowzero", 0))
    out = shapes.apply_reshape(target, expanded, allowzero) if target is not None else shapes.dims_of(value)
    dims = shapes.Bindings()
    if not (shapes.check_shape(dims, base, "B Hkv S D") and shapes.check_shape(dims, out, "B _ _ D")):
        return None
    assert out is not None
    seq_forced = target is not None and len(target) == 4 and target[2] == -1 and not allowzero
    seq_proved = not seq_forced and shapes.same_dim(out[2], dims["S"])
    heads_proved = shapes.same_dim(out[1], shapes.times(dims["Hkv"], groups))
    if seq_proved or (heads_proved and seq_forced):
        return kv, groups
    return None


def _unsqueezed_kv(value: ir.Value | None) -> ir.Value | None:
    """kv when value = Unsqueeze(kv, 2)."""
    unsq = u.producer(value, "Unsqueeze")
    return u.operand(unsq, 0) if unsq is not None and u.unsqueeze_axes(unsq) in ([2], [-3]) else None


def _five_d_repeat(x5: ir.Value) -> tuple[ir.Value, list[shapes.Dim], list[shapes.Dim]] | None:
    """(kv, kv's dims, x5's dims) when x5 [B, Hkv, G, S, D] repeats Unsqueeze(kv, 2) along axis 2
    by Expand, Tile or Concat of copies."""
    node = u.producer(x5, ("Expand", "Tile", "Concat"))
    if node is None:
        return None
    sources = node.inputs if node.op_type == "Concat" else node.inputs[:1]
    kvs = [_unsqueezed_kv(x) for x in sources]
    kv = kvs[0]
    if kv is None or any(x is not kv for x in kvs):
        return None
    base = shapes.dims_of(kv)
    if base is None or len(base) != 4:
        return None
    unsqueezed: list[shapes.Dim] = [base[0], base[1], 1, base[2], base[3]]
    if node.op_type == "Concat":
        if u.attr_int(node, "axis", 0) not in (2, -3):
            return None
        return kv, base, unsqueezed[:2] + [len(sources)] + unsqueezed[3:]
    by = shapes.shape_vector(node.inputs[1])
    if node.op_type == "Tile":
        if by is None or len(by) != 5 or any(r != 1 for i, r in enumerate(by) if i != 2):
            return None
        return kv, base, unsqueezed[:2] + [by[2]] + unsqueezed[3:]
    expanded = by or shapes.dims_of(node.outputs[0])
    if expanded is None or len(expanded) != 5:
        return None
    # Expand broadcasts: a target dim of 1 keeps the unsqueezed input's dim, and every other
    # target dim equals the input's, except on the new axis (size 1), which it repeats.
    return kv, base, [unsqueezed[i] if d == 1 or i != 2 else d for i, d in enumerate(expanded)]


def _gathered_heads(value: ir.Value) -> tuple[ir.Value, int] | None:
    """Gather(kv, [0,..,0, 1,..,1, ...], axis=1): each of Hkv heads taken G times in a row
    (torch.repeat_interleave with constant indices)."""
    gather = u.producer(value, "Gather")
    if gather is None or u.attr_int(gather, "axis", 0) not in (1, -3):
        return None
    kv = u.operand(gather, 0)
    idx = u.const_array(gather.inputs[1])
    heads = shapes.static(shapes.resolved_dim(kv, 1))
    if idx is None or idx.ndim != 1 or heads is None or u.rank(kv) != 4 or heads < 1 or idx.size % heads:
        return None
    groups = idx.size // heads
    if groups < 2 or not np.array_equal(idx, np.arange(idx.size) // groups):
        return None
    return kv, groups


def _single_head_repeated(value: ir.Value) -> tuple[ir.Value, int] | None:
    """kv [B, 1, S, D] repeated G times along axis 1 (Expand, Tile, or Concat of copies): with one
    kv head every query head reads it, whatever the order."""
    node = u.producer(value, ("Expand", "Tile", "Concat"))
    if node is None:
        return None
    kv = u.operand(node, 0)
    if u.rank(kv) != 4 or shapes.resolved_dim(kv, 1) != 1:
        return None
    if node.op_type == "Concat":
        same = all(x is kv for x in node.inputs) and u.attr_int(node, "axis", 0) in (1, -3)
        groups: shapes.Dim = len(node.inputs) if same else None
    else:
        by = shapes.shape_vector(node.inputs[1])
        if by is None or len(by) != 4:
            return None
        others_kept = all(r == 1 for i, r in enumerate(by) if i != 1) if node.op_type == "Tile" else True
        groups = by[1] if others_kept else None
        if node.op_type == "Expand" and not _expand_keeps_other_dims(kv, by):
            groups = None
    g = shapes.static(groups)
    return (kv, g) if g is not None and g >= 2 else None


def _expand_keeps_other_dims(kv: ir.Value, target: list[shapes.Dim]) -> bool:
    """Expand(kv, target) changes no dim of kv but dim 1: each other target dim is 1 or kv's."""
    return all(d == 1 or shapes.same_dim(d, shapes.resolved_dim(kv, i)) for i, d in enumerate(target) if i != 1)
