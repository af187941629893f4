"""Read a FlashAttention node back into its FlashAttentionCall (op/node.read_node) with what the
native ops refuse and the dims they need proved, and give the model the types ONNX shape
inference cannot find."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir

from ..errors import NotLowered
from ..graph import bounds, shapes
from ..graph import ir_utils as u
from ..graph.emitter import Emitter
from ..model_io import graphs_of
from ..model_shapes import unknown_ranks
from ..op.call import FlashAttentionCall
from ..op.node import NodeOutsideContract, is_flash_attention, read_node
from ..op.spec import ABSORBING_FILL


def read_call(node: ir.Node) -> FlashAttentionCall:
    """The call a FlashAttention node makes (op/node.read_node); raises NotLowered where it is
    outside the op's contract or no native op can take it."""
    try:
        call = read_node(node)
    except NodeOutsideContract as exc:
        raise NotLowered(str(exc)) from None
    dtype = call.dtype
    if dtype is not None and dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
        raise NotLowered(f"Q's element type is {dtype}, not float32 or float16")
    for label, x in (("Q", call.q), ("K", call.k), ("V", call.v)):
        r = u.rank(x)
        if r is not None and r != 4:
            raise NotLowered(f"{label} has rank {r}, not 4")
    if call.bias is not None and (bias_rank := u.rank(call.bias)) is not None and bias_rank > 4:
        raise NotLowered(f"bias has rank {bias_rank}, more than 4")
    if call.mask is not None and call.mask.dtype is not None and call.mask.dtype != ir.DataType.BOOL:
        raise NotLowered(f"mask's element type is {call.mask.dtype}, not bool")
    if call.scale < 0:
        raise NotLowered(f"scale {call.scale:g} is negative: native attention ops take a positive scale")
    fill = call.mask_fill
    if call.masked and math.isfinite(fill) and fill > ABSORBING_FILL:
        raise NotLowered(
            f"mask_fill {fill:g} is finite: native ops add the fill to the score (s + fill) where "
            f"FlashAttention replaces the score by it, so rows with every key masked differ "
            f"(exact only for -inf or fills <= -2**127 such as float32-lowest)"
        )
    if call.bias_after_mask and (call.masked or call.is_causal):
        _prove_fill_absorbs_bias(call)
    return call


def _prove_fill_absorbs_bias(call: FlashAttentionCall) -> None:
    """bias_after_mask: FlashAttention gives a masked score fill + bias, a native op s + (fill + bias).
    The two agree where fill + bias absorbs s: fill -inf (the sum is -inf, or NaN in both where the
    bias is +inf or NaN), or fill + bias <= -2**127 for every bias value, which needs the bias
    bounded above (graph/bounds)."""
    fill = call.mask_fill
    if fill == -math.inf:
        return
    found = bounds.value_bounds(call.bias)
    if found is None or not fill + found[1] <= ABSORBING_FILL:
        bound = "no bound" if found is None else f"an upper bound of {found[1]:g}"
        raise NotLowered(
            f"bias_after_mask with mask_fill {fill:g}: native ops add the score to fill + bias, exact only "
            f"where fill + bias <= -2**127 absorbs it, and the graph gives the bias {bound}"
        )


@dataclass(frozen=True)
class CallDims:
    """The dims of a call's Q [B, Hq, Sq, D], K [B, Hkv, Sk, Dk] and V [B, _, Sv, Dv], as far as the
    graph proves them (shapes.Dim terms; heads only when static)."""

    hq: int | None
    hkv: int | None
    sq: shapes.Dim
    sk: shapes.Dim
    sv: shapes.Dim
    d: shapes.Dim
    dk: shapes.Dim
    dv: shapes.Dim


def call_dims(call: FlashAttentionCall) -> CallDims:
    dims = shapes.Bindings()
    for x, pattern in ((call.q, "_ Hq Sq D"), (call.k, "_ Hkv Sk Dk"), (call.v, "_ _ Sv Dv")):
        # Resolved per axis: the graph may fix a dim of an operand whose rank inference left open.
        shapes.check_shape(dims, [shapes.resolved_dim(x, i) for i in range(4)], pattern)
    return CallDims(
        hq=shapes.static(dims["Hq"]),
        hkv=shapes.static(dims["Hkv"]),
        sq=dims["Sq"],
        sk=dims["Sk"],
        sv=dims["Sv"],
        d=dims["D"],
        dk=dims["Dk"],
        dv=dims["Dv"],
    )


def with_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """model with inferred value_info, FlashAttention outputs included.

    ONNX shape inference knows nothing of FlashAttention, so everything after the first block
    would lose its types. It runs on a copy where each block is a stand-in of the same output
    type and shape (ReduceSum(Q over D) * ReduceSum(V over heads and keys): [B, Hq, Sq, Dv] in
    Q's dtype); the types found are copied onto the real graph."""
    opset = u.default_opset(model)
    proxy = onnx.ModelProto()
    proxy.CopyFrom(model)
    for index, graph in enumerate(graphs_of(proxy.graph)):
        _stand_in_for_blocks(graph, opset, f"ortflash_shape_proxy_{index}_")
    try:
        inferred: onnx.ModelProto | None = onnx.shape_inference.infer_shapes(proxy, data_prop=True)
    except Exception:  # noqa: BLE001
        inferred = None
    # ONNX's inference leaves ranks unknown in models shipped without shapes, and loses the new
    # tokens' length in TorchScript decoders: ONNX Runtime's symbolic inference then, where it completes
    ranks_unknown = inferred is None or bool(unknown_ranks(inferred))
    if ranks_unknown or _reads_a_cache_append(model):
        # merging dims that broadcast together only where ranks are unknown, as the fusion did
        # (model_shapes); the cache's proofs take only dims the shape arithmetic makes equal
        symbolic = _symbolic_inference(proxy, merge=False)
        if symbolic is None and ranks_unknown:
            symbolic = _symbolic_inference(proxy, merge=True)
        if symbolic is not None:
            return _with_symbolic_shapes(model, symbolic)
    if inferred is None:
        return model  # shapes only prove head counts and equal dims; without them fewer blocks lower
    known = {vi.name for vi in model.graph.value_info}
    known |= {vi.name for vi in model.graph.input} | {vi.name for vi in model.graph.output}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.value_info.extend(
        vi
        for vi in inferred.graph.value_info
        if vi.name not in known and not vi.name.startswith("ortflash_shape_proxy_")
    )
    return out


def _with_symbolic_shapes(model: onnx.ModelProto, symbolic: onnx.ModelProto) -> onnx.ModelProto:
    """model with the value_info of the symbolic inference of its stand-in copy, in every graph."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    # graphs_of walks both models' graphs in the same order: the stand-ins add no subgraph
    for graph, inferred_graph in zip(graphs_of(out.graph), graphs_of(symbolic.graph)):
        found = {vi.name: vi for vi in list(inferred_graph.value_info) + list(inferred_graph.output)}
        del graph.value_info[:]
        graph.value_info.extend(
            vi for vi in inferred_graph.value_info if not vi.name.startswith("ortflash_shape_proxy_")
        )
        # outputs declared without a shape, or with dims another inference named (unk__N),
        # take the inferred one: names from two inferences must not meet
        for output in graph.output:
            if output.name in found and not _named_by_exporter(output):
                output.CopyFrom(found[output.name])
    return out


def _named_by_exporter(value: onnx.ValueInfoProto) -> bool:
    """Whether value has a shape whose every dim is a number or a name no inference made up."""
    tensor = value.type.tensor_type
    if not tensor.HasField("shape"):
        return False
    return all(
        d.HasField("dim_value") or (d.dim_param and not d.dim_param.startswith("unk__")) for d in tensor.shape.dim
    )


def _stand_in_for_blocks(graph: onnx.GraphProto, opset: int, stem: str) -> None:
    """Replace each FlashAttention node of graph (in place) by ops of the same output type and shape."""
    nodes = []
    for i, n in enumerate(graph.node):
        if not is_flash_attention(n) or len(n.input) < 3:
            nodes.append(n)
            continue
        tag = f"{stem}{i}"
        rq, rv = f"{tag}_q", f"{tag}_v"
        if opset >= 13:
            nodes.append(
                onnx.helper.make_node(
                    "Constant", [], [f"{tag}_aq"], value=onnx.numpy_helper.from_array(np.array([3], np.int64))
                )
            )
            nodes.append(
                onnx.helper.make_node(
                    "Constant", [], [f"{tag}_av"], value=onnx.numpy_helper.from_array(np.array([1, 2], np.int64))
                )
            )
            nodes.append(onnx.helper.make_node("ReduceSum", [n.input[0], f"{tag}_aq"], [rq], keepdims=1))
            nodes.append(onnx.helper.make_node("ReduceSum", [n.input[2], f"{tag}_av"], [rv], keepdims=1))
        else:
            nodes.append(onnx.helper.make_node("ReduceSum", [n.input[0]], [rq], axes=[3], keepdims=1))
            nodes.append(onnx.helper.make_node("ReduceSum", [n.input[2]], [rv], axes=[1, 2], keepdims=1))
        nodes.append(onnx.helper.make_node("Mul", [rq, rv], [n.output[0]]))
    del graph.node[:]
    graph.node.extend(nodes)


def _reads_a_cache_append(model: onnx.ModelProto) -> bool:
    """Whether a FlashAttention node of any graph reads K from a Concat (a KV-cache append)."""
    for graph in graphs_of(model.graph):
        concat_outputs = {o for n in graph.node if n.op_type == "Concat" for o in n.output}
        if any(is_flash_attention(n) and len(n.input) > 1 and n.input[1] in concat_outputs for n in graph.node):
            return True
    return False


def _symbolic_inference(model: onnx.ModelProto, merge: bool) -> onnx.ModelProto | None:
    """ONNX Runtime's symbolic shape inference, or None where it does not complete. merge: its
    auto_merge, which takes dims that broadcast together as equal; off, only what the shape
    arithmetic proves.

    ONNX's own inference loses the new tokens' length in TorchScript decoders (each Reshape of a
    computed shape gets a fresh unk__ dim), so the cache append's new keys and Q are not proved
    the same length; the symbolic inference follows the Shape arithmetic and names both ``seq``.
    Its value_info replaces ONNX's as a whole: names from two inferences are never mixed, since
    each names unknown dims unk__N on its own. Run in memory: ``infer_shapes`` writes a file
    into the current folder when it fails."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        inference = SymbolicShapeInference(2**31 - 1, merge, False, 0)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # its complaints
            inference._preprocess(model)
            complete = False
            while inference.run_:
                complete = inference._infer_impl()
            inference._update_output_from_vi()
    except Exception:  # noqa: BLE001 - it raises on ops it does not know and shapes it cannot follow
        return None
    if not complete:
        return None
    inferred: onnx.ModelProto = inference.out_mp_
    return inferred


def aligned_batch(e: Emitter, call: FlashAttentionCall, dims: CallDims) -> tuple[FlashAttentionCall, str | None]:
    """call with Q, K, V (and a 4D bias or mask) given one batch size, as the native ops require.

    MatMul broadcasts: V [1, H, S, D] against Q and K [2, H, S, D] is a valid graph, and so is
    FlashAttention (its kernels broadcast), but MultiHeadAttention, GroupQueryAttention and
    Attention reject operands whose dim 0 differ. Where the graph does not prove one batch
    size (``shapes.may_broadcast``), each operand is Expanded to the largest dim 0 (Max over them,
    the broadcast size of a valid graph). Also proved here: K and V have one head count, and the bias and mask
    broadcast over heads as [1 | Hq]. Raises NotLowered where that cannot be proved."""
    kv_heads = [shapes.batch_and_heads(call.k), shapes.batch_and_heads(call.v)]
    assert kv_heads[0] is not None and kv_heads[1] is not None  # read_call proved rank 4
    hk, hv = kv_heads[0][1], kv_heads[1][1]
    # Unproved but symbolic counts pass: FlashAttention reads one count for both as well.
    if not shapes.same_dim(hk, hv) and (isinstance(hk, int) and isinstance(hv, int) or 1 in (hk, hv)):
        raise NotLowered(f"K has {_words(hk)} heads and V {_words(hv)}: the native ops read one key/value head count")
    for label, x in (("bias", call.bias), ("mask", call.mask)):
        found = shapes.batch_and_heads(x)
        if found is None:
            raise NotLowered(f"the rank of the {label} is unknown, so its batch and head dims cannot be proved")
        # In a valid graph the bias's head dim is 1 or the scores' (Hq), unless it broadcasts
        # a single query head up: that, or a static mismatch, the native ops cannot take.
        heads, q_heads = found[1], shapes.resolved_dim(call.q, 1)
        mismatch = isinstance(heads, int) and heads != 1 and isinstance(q_heads, int) and heads != q_heads
        if mismatch or (q_heads == 1 and heads != 1):
            raise NotLowered(
                f"the {label}'s head dim ({_words(found[1])}) is neither 1 nor Q's head count ({_words(dims.hq)})"
            )
    qkv = [call.q, call.k, call.v]
    extra = [x for x in (call.bias, call.mask) if x is not None]
    b = [shapes.batch_and_heads(x) for x in qkv + extra]
    dims0 = [bh[0] if bh is not None else None for bh in b]
    # A bias or mask may keep dim 0 of 1 (the native ops broadcast it); Q, K and V may not.
    wide_extra = [x for x, d in zip(extra, dims0[3:]) if d != 1]
    pairs = [(a, c) for i, a in enumerate(dims0[:3]) for c in dims0[i + 1 : 3]]
    pairs += [(a, d) for a in dims0[:3] for d in dims0[3:] if d != 1]
    if not any(shapes.may_broadcast(a, c) for a, c in pairs):
        return call, None
    operands = qkv + wide_extra
    batch = e.largest_batch(operands)

    def expanded(x: ir.Value) -> ir.Value:
        return e.expand_batch(x, batch, u.rank(x) or 4) if any(x is o for o in operands) else x

    aligned = dataclasses.replace(
        call,
        q=expanded(call.q),
        k=expanded(call.k),
        v=expanded(call.v),
        bias=None if call.bias is None else expanded(call.bias),
        mask=None if call.mask is None else expanded(call.mask),
    )
    return aligned, "batch sizes " + "/".join(_words(d) for d in dims0) + " broadcast by Expand"


def _words(d: shapes.Dim) -> str:
    return "?" if d is None else str(d) if isinstance(d, (int, str)) else "an unnamed number of"
