"""A FlashAttention node, written and read back: a FlashAttentionCall written as one node with what
the ONNX Runtime bridge needs around it and marked with the block it stands for; a node read back
into its attributes (the side channel resolved) and its call. The one module that reads nodes back:
the lowering adds what its native ops refuse (lowering/read.py), the checks take the attributes."""

from __future__ import annotations

from typing import Any, overload

import numpy as np
import onnx
import onnx_ir as ir

from ..graph import ir_utils as u
from ..graph.emitter import Emitter
from ..model_io import graphs_of
from . import side_channel, spec
from .call import FlashAttentionCall
from .policy import SoftmaxPolicy

# Node metadata written on every FlashAttention node ortflash.optimize emits.
REPLACES = "ortflash.replaces"  # the original value the node computes (ortflash validate reads it)
BLOCK_ID = "ortflash.block"  # the report row (index in Report.blocks) the node stands for
# On an If that picks a block's form by the run's length (pipeline/length_dispatch.py), JSON:
# {"block": row, "key_len": T, "decode_key_len": Td, "condition": the If's input, "keys": the
# main-graph value holding the run's key length ([1] int64)}; checks/verify.py runs both sides by it.
DISPATCH_KEY = "ortflash.length_dispatch"

_ACCUMULATOR = ir.DataType.FLOAT

# A constant bias (mask) of at most this many elements that is all zeros (all true) counts as
# absent: the bridge's placeholders are scalars; a larger constant is not worth reading.
_MAX_CONSTANT_PLACEHOLDER = 2**20


def write_call(e: Emitter, call: FlashAttentionCall, policy: SoftmaxPolicy, block_id: str, replaces: str) -> ir.Value:
    """Insert the FlashAttention node computing call; its output in Q's dtype, [B, Hq, Sq, Dv]."""
    # The bridge cannot take missing inputs: an absent bias or mask is a neutral scalar (spec.INPUTS).
    bias = e.f32(0.0) if call.bias is None else call.bias
    mask = e.const(np.array(True)) if call.mask is None else call.mask
    q, k, v = call.q, call.k, call.v
    # onnxruntime-extensions' Python ops take float32 only: float16 blocks run with exact
    # upcasts around the node, which accumulates in float32 either way.
    exact_casts = (call.dtype or _ACCUMULATOR) != _ACCUMULATOR
    if exact_casts:
        q, k, v = (e.node("Cast", [x], to=_ACCUMULATOR) for x in (q, k, v))
    out = e.node(spec.OP_TYPE, [q, k, v, bias, mask], domain=spec.DOMAIN, **call.attributes(policy))
    fused = out.producer()
    assert fused is not None
    fused.metadata_props[REPLACES] = replaces
    fused.metadata_props[BLOCK_ID] = block_id
    if exact_casts and call.dtype is not None:
        out = e.node("Cast", [out], to=call.dtype)
    return out


class NodeOutsideContract(spec.SpecError):
    """A FlashAttention node that no FlashAttentionCall reads back from: inputs or attributes
    outside the op's contract (spec.py); the message says which."""


def is_flash_attention(node: ir.Node | onnx.NodeProto) -> bool:
    return node.domain == spec.DOMAIN and node.op_type == spec.OP_TYPE


@overload
def flash_nodes(
    model_or_graph: onnx.ModelProto | onnx.GraphProto, *, subgraphs: bool = True
) -> list[onnx.NodeProto]: ...
@overload
def flash_nodes(model_or_graph: ir.Model | ir.Graph, *, subgraphs: bool = True) -> list[ir.Node]: ...
def flash_nodes(
    model_or_graph: onnx.ModelProto | onnx.GraphProto | ir.Model | ir.Graph, *, subgraphs: bool = True
) -> list[onnx.NodeProto] | list[ir.Node]:
    """The FlashAttention nodes of a model or graph: with ``subgraphs``, those of every graph below
    it too (If branches, Loop and Scan bodies); a proto's main graph first, then each body in turn
    (model_io.graphs_of), an ir graph's in ``all_nodes`` order."""
    graph = model_or_graph.graph if isinstance(model_or_graph, (onnx.ModelProto, ir.Model)) else model_or_graph
    if isinstance(graph, onnx.GraphProto):
        graphs = graphs_of(graph) if subgraphs else (graph,)
        return [n for g in graphs for n in g.node if is_flash_attention(n)]
    return [n for n in (graph.all_nodes() if subgraphs else graph) if is_flash_attention(n)]


def is_placeholder(value: ir.Value) -> bool:
    """Whether a FlashAttention node's bias or mask input stands for an absent one: a constant
    (at most 2**20 elements) of the neutral value, 0 for a bias, true for a (bool) mask. The
    bridge cannot take a missing input and writes a neutral scalar in its place (spec.INPUTS);
    the kernels, which see only arrays, read the scalar alone (spec.absent_as_none)."""
    arr = u.const_array(value)
    if arr is None or arr.size > _MAX_CONSTANT_PLACEHOLDER:
        return False
    return bool(np.all(arr)) if arr.dtype == np.bool_ else not np.any(arr)


def node_attributes(node: ir.Node | onnx.NodeProto) -> dict[str, Any]:
    """A FlashAttention node's attributes as the kernels take them: the side channel resolved
    (exact floats, the undeclared attributes), defaults filled in; SpecError for a bad value."""
    if isinstance(node, onnx.NodeProto):
        raw = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    else:
        raw = {name: a.value for name, a in node.attributes.items()}
    # a NodeProto's strings come as bytes; the side channel is read as text
    raw = {name: value.decode() if isinstance(value, bytes) else value for name, value in raw.items()}
    return spec.validate(side_channel.resolve(raw))


def read_node(node: ir.Node) -> FlashAttentionCall:
    """The call a FlashAttention node makes, the bridge's neutral placeholders read as an absent
    bias or mask; NodeOutsideContract where the node is outside the op's contract."""
    if len(node.inputs) != len(spec.INPUTS) or any(x is None for x in node.inputs):
        raise NodeOutsideContract(
            f"{len(node.inputs)} inputs, the contract has {len(spec.INPUTS)} (Q, K, V, bias, mask)"
        )
    try:
        attrs = node_attributes(node)
    except spec.SpecError as exc:
        raise NodeOutsideContract(f"attributes outside the FlashAttention contract: {exc}") from None
    q, k, v, bias, mask = node.inputs
    assert q is not None and k is not None and v is not None and bias is not None and mask is not None
    kept_bias = None if is_placeholder(bias) else bias
    kept_mask = None if is_placeholder(mask) else mask
    return FlashAttentionCall(
        q,
        k,
        v,
        dtype=q.dtype,
        scale=float(attrs["scale"]),
        bias=kept_bias,
        mask=kept_mask,
        is_causal=int(attrs["is_causal"]),
        mask_fill=float(attrs["mask_fill"]),
        masked_rows=str(attrs["masked_rows"]),
        softcap=float(attrs["softcap"]),
        bias_after_mask=bool(attrs["bias_after_mask"]) and kept_bias is not None,
        window_left=int(attrs["window_left"]),
        window_right=int(attrs["window_right"]),
    )
