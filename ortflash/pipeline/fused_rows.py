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
        return 1 if rank < 2 else shapes.static(shapes.resolved_dim(value, rank - 2))
    if depth == 0 or node is None or node.op_type not in _BROADCASTING:
        return None
    sizes = [_query_rows(x, depth - 1) for x in node.inputs if x is not None]
    if any(size is None for size in sizes):
        return None
    wider = [size for size in sizes if size != 1]
    return wider[0] if wider else 1
