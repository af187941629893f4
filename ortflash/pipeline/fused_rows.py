"""What each fused FlashAttention node proves for its report row, read from its operands after
fusion: heads, kv heads, head dim and key length as numbers where its shapes fix them (through
Reshapes, Transposes and computed shapes, which the rules' own reading leaves symbolic in
TorchScript exports), the cost table's mask kind, and the head count the user gave."""

from __future__ import annotations

from collections.abc import Collection

import onnx_ir as ir

from ..errors import OrtflashError
from ..graph import ir_utils as u
from ..graph import shapes
from ..lowering.head_count import GivenHeads
from ..op.node import BLOCK_ID, flash_nodes, is_placeholder
from ..report import Report
from . import forms


def prove_heads(
    graph: ir.Graph, report: Report, num_heads: int | None, per_batch_head: Collection[int] = ()
) -> dict[int, GivenHeads]:
    """Heads, kv heads and head dim of each block fused in ``graph``, as numbers where the fused
    node's operands prove them (resolved through Reshapes, Transposes and computed shapes, which
    the rules' own reading leaves symbolic in TorchScript exports), else None.

    ``num_heads`` fills the query head count where nothing proves it; where something does and
    it differs, OrtflashError. Returns the given counts by row, each for Q, and for K and V where
    their head dim is the same unknown as Q's (lowering/head_count.GivenHeads): a lowering, whose
    ops take the count as a number, writes it there; the graph is not marked. ``per_batch_head``:
    the rows whose scores are per batch·head (fusion/driver.Fused), whose heads stay None.
    """
    given: dict[int, GivenHeads] = {}
    for node in flash_nodes(graph, subgraphs=False):
        if BLOCK_ID not in node.metadata_props:
            continue
        row = int(node.metadata_props[BLOCK_ID])
        block = report.blocks[row]
        three_d = row in per_batch_head  # [B·H, S, D]: the node sees one head per batch-head pair
        q, k, v = node.inputs[0], node.inputs[1], node.inputs[2]
        if q is None or k is None or v is None:
            continue  # the op's contract requires all three; a node without them is not ours to read
        hq, hkv = shapes.resolved_dim(q, 1), shapes.resolved_dim(k, 1)
        block.head_dim = shapes.static(shapes.resolved_dim(q, 3))
        block.key_len = shapes.static(shapes.resolved_dim(k, 2))
        block.mask_kind = _mask_kind(node)
        block.heads = None if three_d else shapes.static(hq)
        block.kv_heads = None if three_d else shapes.static(hkv)
        if num_heads is None or three_d:
            continue
        if isinstance(hq, int):
            if hq != num_heads:
                raise OrtflashError(
                    f"--num-heads {num_heads}: block {block.name} has {hq} query heads, proved from its "
                    "shapes; the count is given only for blocks whose count nothing proves"
                )
            continue
        block.heads = num_heads
        same_kv = hq is not None and shapes.same_dim(hq, hkv)
        if same_kv:
            block.kv_heads = num_heads
        block.reason = "; ".join(filter(None, [block.reason, f"{num_heads} heads given (--num-heads), not proved"]))
        marked = [0] + [i for i, x in ((1, k), (2, v)) if same_kv and shapes.same_dim(hq, shapes.resolved_dim(x, 1))]
        given[row] = GivenHeads(num_heads, tuple(marked))
    return given


def queries_are_keys(graph: ir.Graph) -> set[int]:
    """The rows of the blocks fused in ``graph`` whose query length is proved their key length (Q's
    and K's sequence dims the same): no one-query step against a longer KV cache, which the GPU
    EPs' cost rows, all measured with Sq == Sk, do not time."""
    rows: set[int] = set()
    for node in flash_nodes(graph, subgraphs=False):
        q, k = node.inputs[0], node.inputs[1]
        if BLOCK_ID in node.metadata_props and q is not None and k is not None:
            if shapes.same_dim(shapes.resolved_dim(q, 2), shapes.resolved_dim(k, 2)):
                rows.add(int(node.metadata_props[BLOCK_ID]))
    return rows


def _mask_kind(node: ir.Node) -> str:
    """The cost table's row for a fused node (forms.MASK_KINDS): what it reads besides Q, K and V."""
    rows: list[int | None] = []
    for value in node.inputs[3:5]:
        if value is None or is_placeholder(value):
            continue  # absent, or the neutral scalar the bridge needs in its place (spec.INPUTS)
        rows.append(_query_rows(value))
    causal = node.attributes.get("is_causal")
    return forms.mask_kind(causal is not None and causal.as_int() != 0, tuple(rows))


# Ops whose output is the broadcast of their inputs: what fusion writes between a mask the graph
# computed and the fused node (Cast to bool, Where to a fill, Not), whose outputs it writes without
# inferred shapes.
_BROADCASTING = frozenset({"Cast", "Where", "Not", "Neg", "Add", "Sub", "Mul", "And", "Or", "Equal", "Less", "Greater"})


def _query_rows(value: ir.Value, depth: int = 8) -> int | None:
    """The size of a bias or mask operand's query axis (second from the right; 1 where it has
    fewer axes), None where not proved."""
    constant = u.const_array(value)
    if constant is not None:
        return 1 if constant.ndim < 2 else int(constant.shape[-2])
    rank = u.rank(value)
    node = value.producer()
    if rank is not None:
        axes = u.unsqueeze_axes(node) if node is not None and node.op_type == "Unsqueeze" else None
        if node is not None and axes is not None:  # fusion's own Unsqueeze to [B, 1, 1, Sk]: its new axes are 1
            axis = rank - 2
            if axis in [a % rank for a in axes]:
                return 1
            inner = axis - sum(1 for a in axes if a % rank < axis)
            return shapes.static(shapes.resolved_dim(node.inputs[0], inner))
        if rank < 2:
            return 1
        size = shapes.static(shapes.resolved_dim(value, rank - 2))
        if size is not None or node is None:
            return size
        # a rank but no inferred dims: what fusion wrote (a Not of the padding part) is read below
    if depth == 0 or node is None:
        return None
    if node.op_type == "Reshape" and _keeps_trailing_two(node):
        return _query_rows(node.inputs[0], depth - 1)  # type: ignore[arg-type]
    if node.op_type == "Slice" and node.inputs[0] is not None and _query_rows(node.inputs[0], depth - 1) == 1:
        return 1  # a slice of a one-row axis has one row (ALiBi slopes x positions sliced to the keys, MPT)
    if node.op_type not in _BROADCASTING:
        return None
    sizes = [_query_rows(x, depth - 1) for x in node.inputs if x is not None]
    if any(size is None for size in sizes):
        return None
    wider = [size for size in sizes if size != 1]
    return wider[0] if wider else 1


def _keeps_trailing_two(reshape: ir.Node) -> bool:
    """Whether a Reshape keeps its input's last two axes as its own last two: its shape is a Concat
    that ends with Slice(Shape(input), a, end) over at least those axes (fusion's [B·H, Sq, Sk] to
    [B, H, Sq, Sk] view of a per-batch·head bias, fusion/softmax_write._heads_view)."""
    data, shape = (*reshape.inputs, None, None)[:2]
    concat = shape.producer() if shape is not None else None
    if data is None or concat is None or concat.op_type != "Concat" or not concat.inputs:
        return False
    last = concat.inputs[-1]
    tail = last.producer() if last is not None else None
    if tail is None or tail.op_type != "Slice" or len(tail.inputs) < 3:
        return False
    of = tail.inputs[0].producer() if tail.inputs[0] is not None else None
    if of is None or of.op_type != "Shape" or of.inputs[0] is not data or of.attributes:
        return False  # a Shape with start or end attributes reads part of the shape: not matched here
    starts, ends = u.const_array(tail.inputs[1]), u.const_array(tail.inputs[2])
    axes = u.const_array(tail.inputs[3]) if len(tail.inputs) > 3 and tail.inputs[3] is not None else None
    steps = u.const_array(tail.inputs[4]) if len(tail.inputs) > 4 and tail.inputs[4] is not None else None
    rank = u.rank(data)
    if starts is None or ends is None or starts.size != 1 or ends.size != 1 or rank is None:
        return False
    if (axes is not None and axes.reshape(-1).tolist() not in ([0], [-1])) or (
        steps is not None and steps.reshape(-1).tolist() != [1]
    ):
        return False
    start, end = int(starts.reshape(-1)[0]), int(ends.reshape(-1)[0])
    start, end = start + rank if start < 0 else start, min(end + rank if end < 0 else end, rank)
    return end == rank and rank - start >= 2
