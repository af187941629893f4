"""Emit one FlashAttention node for a matched block, beside the ops it replaces."""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from .. import spec
from ..policy import SoftmaxPolicy
from . import ir_utils as u
from .match import AttentionMatch


class _Emitter:
    """Appends nodes before an anchor node of a graph."""

    def __init__(self, graph: ir.Graph, anchor: ir.Node, prefix: str, opset: int):
        self.graph, self.anchor, self.prefix, self.opset = graph, anchor, prefix, opset
        self.count = 0

    def node(self, op_type, inputs, domain="", **attrs) -> ir.Value:
        self.count += 1
        name = f"{self.prefix}/{op_type}_{self.count}"
        node = ir.node(op_type, inputs, attributes=attrs, domain=domain, name=name)
        node.outputs[0].name = name + "_out"
        self.graph.insert_before(self.anchor, node)
        return node.outputs[0]

    def const(self, array: np.ndarray) -> ir.Value:
        return self.node("Constant", [], value=ir.tensor(array))

    def unsqueeze1(self, x: ir.Value) -> ir.Value:
        if self.opset >= 13:
            return self.node("Unsqueeze", [x, self.const(np.array([1], np.int64))])
        return self.node("Unsqueeze", [x], axes=[1])

    def squeeze1(self, x: ir.Value) -> ir.Value:
        if self.opset >= 13:
            return self.node("Squeeze", [x, self.const(np.array([1], np.int64))])
        return self.node("Squeeze", [x], axes=[1])

    def cast(self, x: ir.Value, to: ir.DataType) -> ir.Value:
        return self.node("Cast", [x], to=to)


def _to_rank4(e: _Emitter, x: ir.Value, rank: int, x_rank: int | None) -> ir.Value:
    """3D [B·H, S, D] operands become [B·H, 1, S, D]; biases/masks of rank < 3 broadcast as they are."""
    if rank == 4 or (x_rank is not None and x_rank < 3):
        return x
    return e.unsqueeze1(x)


def emit(graph: ir.Graph, m: AttentionMatch, policy: SoftmaxPolicy, opset: int, index: int) -> ir.Value:
    """Insert the FlashAttention node (and the casts/reshapes it needs) computing m.output."""
    matmul_pv = m.output.producer()
    e = _Emitter(graph, matmul_pv, f"ortflash/attention_{index}", opset)
    dtype = m.q.dtype or ir.DataType.FLOAT
    acc = ir.DataType.FLOAT

    k = m.k if m.k_perm is None else e.node("Transpose", [m.k], perm=m.k_perm)
    q, v = m.q, m.v
    if m.rank == 3:
        q, k, v = (e.unsqueeze1(x) for x in (q, k, v))
    ranks = {id(x): u.rank(x) for x in m.biases + [c for c, _ in m.masks]}

    bias = None
    for b in m.biases:
        b_rank = ranks[id(b)]
        b = b if b.dtype == acc else e.cast(b, acc)
        b = _to_rank4(e, b, m.rank, b_rank)
        bias = b if bias is None else e.node("Add", [bias, b])
    if bias is None:
        bias = e.const(np.array(0.0, np.float32))  # the bridge's "no bias" (spec.INPUTS)

    mask = None
    for cond, inverted in m.masks:
        keep = _to_rank4(e, cond, m.rank, ranks[id(cond)])
        keep = e.node("Not", [keep]) if inverted else keep
        mask = keep if mask is None else e.node("And", [mask, keep])
    if mask is None:
        mask = e.const(np.array(True))  # the bridge's "no mask"

    # onnxruntime-extensions' Python ops take float32 only: float16 blocks run with
    # exact upcasts around the node, which accumulates in float32 either way.
    if dtype != acc:
        q, k, v = (e.cast(x, acc) for x in (q, k, v))

    attrs = spec.validate(
        {
            "scale": m.scale,
            "is_causal": int(m.is_causal),
            **policy.attributes(),
            "mask_fill": -math.inf if m.mask_fill is None else m.mask_fill,
            "masked_rows": "zero" if m.nan_guard else "nan",
            "softcap": m.softcap,
        }
    )
    attrs["exact_floats"] = spec.exact_floats(attrs)
    out = e.node(spec.OP_TYPE, [q, k, v, bias, mask], domain=spec.DOMAIN, **attrs)
    if dtype != acc:
        out = e.cast(out, dtype)
    if m.rank == 3:
        out = e.squeeze1(out)
    return out


REPLACES = "ortflash.replaces"  # node metadata: the original value a FlashAttention node computes


def replace_output(graph: ir.Graph, old: ir.Value, new: ir.Value) -> None:
    """Point every reader of old (graph outputs included, under old's name) at new, and note
    on the FlashAttention node which original value it stands for (ortflash validate reads it)."""
    node = new.producer()
    while node is not None and node.op_type != spec.OP_TYPE and node.inputs and node.op_type in (
        "Cast", "Squeeze", "Reshape", "Transpose", "Identity"
    ):
        node = node.inputs[0].producer()
    if node is not None and node.op_type == spec.OP_TYPE:
        node.metadata_props[REPLACES] = old.name
    if old.is_graph_output():
        name = old.name
        for i, out in enumerate(graph.outputs):
            if out is old:
                graph.outputs[i] = new
        old.name = name + "_replaced"
        new.name = name
    old.replace_all_uses_with(new)
    new.dtype = old.dtype
    if old.shape is not None:
        new.shape = old.shape
