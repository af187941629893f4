"""Types and shapes for the rules to prove from: ONNX shape inference, and ONNX Runtime's symbolic
shape inference where ONNX's leaves the rank of a tensor attention reads unknown.

Shipped exports (Paddle2ONNX, older converters) often carry no value_info and build reshapes from
``Shape`` arithmetic ONNX's inference does not follow; ONNX Runtime's symbolic inference does, with
named dims. Whichever is used is named in the report (``Report.shape_inference``)."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence

import numpy as np
import onnx

from .graph import ir_utils as u
from .model_io import graphs_of
from .op.node import is_flash_attention

ONNX_INFERENCE = "onnx"
SYMBOLIC_INFERENCE = "onnxruntime-symbolic"
NO_INFERENCE = "none"

# The ops whose operands the rules need ranks of (the attention block's own ops).
_RANK_READERS = frozenset({"Softmax", "MatMul", "Attention"})
# ONNX Runtime's symbolic inference: the lowest opset it takes, and its default bound for unknown ints
_SYMBOLIC_MIN_OPSET = 7
_SYMBOLIC_INT_MAX = 2**31 - 1


def unknown_ranks(model: onnx.ModelProto) -> list[str]:
    """Operands of Softmax / MatMul / Attention nodes (any graph) whose rank no declaration gives."""
    ranked: set[str] = set()
    for graph in graphs_of(model.graph):
        ranked.update(i.name for i in graph.initializer)
        for vi in [*graph.input, *graph.output, *graph.value_info]:
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
                ranked.add(vi.name)
        for node in graph.node:
            if node.op_type == "Constant":
                ranked.update(node.output)
    missing: list[str] = []
    for graph in graphs_of(model.graph):
        softmax_inputs = {n.input[0] for n in graph.node if n.op_type == "Softmax" and n.input}
        for node in graph.node:
            # the block's own ops, and the node computing the scores (bias and mask operands)
            if (node.op_type in _RANK_READERS and node.domain in ("", "ai.onnx")) or softmax_inputs & set(node.output):
                missing += [name for name in node.input if name and name not in ranked and name not in missing]
    return missing


def _reused_names(model: onnx.ModelProto) -> list[dict[str, str]]:
    """Per graph (graphs_of order), its values whose names an earlier graph computes too (an If's
    branches: Optimum's merged decoders), each with a name no graph uses; empty where none is."""
    taken = {name for graph in graphs_of(model.graph) for node in graph.node for name in node.output}
    seen: set[str] = set()
    renames: list[dict[str, str]] = []
    for k, graph in enumerate(graphs_of(model.graph)):
        names = [name for node in graph.node for name in node.output if name]
        renamed: dict[str, str] = {}
        for name in names:
            if name in seen:
                fresh, n = f"{name}__graph{k}", 0
                while fresh in taken:
                    n += 1
                    fresh = f"{name}__graph{k}_{n}"
                taken.add(fresh)
                renamed[name] = fresh
        seen.update(names)
        renames.append(renamed)
    return renames if any(renames) else []


def _rename(graph: onnx.GraphProto, names: dict[str, str]) -> None:
    """Rename values of graph, and the reads of them in the subgraphs nested in it."""
    for node in graph.node:
        node.input[:] = [names.get(x, x) for x in node.input]
        node.output[:] = [names.get(x, x) for x in node.output]
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                _rename(sub, names)
    for vi in [*graph.output, *graph.value_info]:
        vi.name = names.get(vi.name, vi.name)


def _onnx_inferred(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """ONNX shape inference with data propagation. That propagation keeps the shape data it
    computes by value name across graphs, so where two graphs compute values of one name (an If's
    branches) a branch's Reshape reads its sibling's target (onnx 1.23: a [B, -1, H, D] view given
    the rank 3 of the other branch's [B, S, E]): those values are renamed apart for the inference
    and their names restored in its result."""
    renames = _reused_names(model)
    if renames:
        apart = onnx.ModelProto()
        apart.CopyFrom(model)
        for graph, names in zip(list(graphs_of(apart.graph)), renames):
            _rename(graph, names)
        model = apart
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - the inference raises several types on models it cannot follow
        return None
    for graph, names in zip(list(graphs_of(inferred.graph)), renames):
        _rename(graph, {fresh: name for name, fresh in names.items()})
    return inferred


def _symbolic_inferred(model: onnx.ModelProto, merge: bool = True, quiet: bool = False) -> onnx.ModelProto | None:
    """ONNX Runtime's symbolic inference, or None where it cannot infer every shape. ``merge``: its
    auto_merge, which takes dims that broadcast together as equal; off, only what the shape
    arithmetic proves. ``quiet``: its complaints (on stdout and stderr) dropped.

    Its ``SymbolicShapeInference.infer_shapes`` saves an incomplete result as
    ``sym_shape_infer_temp.onnx`` in the process's current folder before raising: a library must
    not write into its user's folder, so its own steps are run here, in memory, and an incomplete
    result is dropped exactly where ``infer_shapes`` would have raised."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference, get_opset

        if not quiet:
            opset = get_opset(model)
            if not opset or opset < _SYMBOLIC_MIN_OPSET:
                return None
        inference = SymbolicShapeInference(_SYMBOLIC_INT_MAX, merge, False, 0)
        with contextlib.ExitStack() as stack:
            if quiet:
                stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
                stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
            inference._preprocess(model)
            complete = False
            while inference.run_:
                complete = inference._infer_impl()
            inference._update_output_from_vi()
    except Exception:  # noqa: BLE001 - it raises on ops and external weights it cannot read
        return None
    inferred: onnx.ModelProto = inference.out_mp_
    return inferred if complete else None


def with_shapes(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """model with inferred value_info, and which inference gave it (ONNX_INFERENCE, SYMBOLIC_INFERENCE
    or NO_INFERENCE). Shapes only help proofs: without them fewer blocks fuse, none wrongly."""
    inferred = _onnx_inferred(model)
    if inferred is not None and not unknown_ranks(inferred):
        return inferred, ONNX_INFERENCE
    symbolic = _symbolic_inferred(model)
    if symbolic is not None and (inferred is None or len(unknown_ranks(symbolic)) < len(unknown_ranks(inferred))):
        return symbolic, SYMBOLIC_INFERENCE
    if inferred is not None:
        return inferred, ONNX_INFERENCE
    return model, NO_INFERENCE


# ---------------------------------------------------------------- a model that already has FlashAttention nodes

_STAND_IN = "ortflash_shape_proxy_"


def with_flash_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """model with inferred value_info, FlashAttention outputs included: for ``ortflash.lower`` of a
    model given as a proto (a file ortflash wrote), whose FlashAttention outputs carry no type.
    The pipeline never needs this: fusion types each node's output as it writes it.

    ONNX shape inference knows nothing of FlashAttention, so everything after the first block
    would lose its types. It runs on a copy where each block is a stand-in of the same output
    type and shape (ReduceSum(Q over D) * ReduceSum(V over heads and keys): [B, Hq, Sq, Dv] in
    Q's dtype); the types found are copied onto the real graph."""
    opset = u.default_opset(model)
    proxy = onnx.ModelProto()
    proxy.CopyFrom(model)
    for index, graph in enumerate(graphs_of(proxy.graph)):
        _stand_in_for_blocks(graph, opset, f"{_STAND_IN}{index}_")
    try:
        inferred: onnx.ModelProto | None = onnx.shape_inference.infer_shapes(proxy, data_prop=True)
    except Exception:  # noqa: BLE001
        inferred = None
    # ONNX's inference leaves ranks unknown in models shipped without shapes, and loses the new
    # tokens' length in TorchScript decoders: ONNX Runtime's symbolic inference then, where it completes
    ranks_unknown = inferred is None or bool(unknown_ranks(inferred))
    if ranks_unknown or _reads_a_cache_append(model):
        # merging dims that broadcast together only where ranks are unknown, as the fusion did;
        # the cache's proofs take only dims the shape arithmetic makes equal
        symbolic = _symbolic_inferred(proxy, merge=False, quiet=True)
        if symbolic is None and ranks_unknown:
            symbolic = _symbolic_inferred(proxy, merge=True, quiet=True)
        if symbolic is not None:
            return _with_symbolic_shapes(model, symbolic)
    if inferred is None:
        return model  # shapes only prove head counts and equal dims; without them fewer blocks lower
    known = {vi.name for vi in model.graph.value_info}
    known |= {vi.name for vi in model.graph.input} | {vi.name for vi in model.graph.output}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.value_info.extend(
        vi for vi in inferred.graph.value_info if vi.name not in known and not vi.name.startswith(_STAND_IN)
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
        graph.value_info.extend(vi for vi in inferred_graph.value_info if not vi.name.startswith(_STAND_IN))
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
    make, tensor = onnx.helper.make_node, onnx.numpy_helper.from_array
    nodes = []
    for i, n in enumerate(graph.node):
        if not is_flash_attention(n) or len(n.input) < 3:
            nodes.append(n)
            continue
        tag = f"{stem}{i}"
        rq, rv = f"{tag}_q", f"{tag}_v"
        if opset >= 13:
            nodes.append(make("Constant", [], [f"{tag}_aq"], value=tensor(np.array([3], np.int64))))
            nodes.append(make("Constant", [], [f"{tag}_av"], value=tensor(np.array([1, 2], np.int64))))
            nodes.append(make("ReduceSum", [n.input[0], f"{tag}_aq"], [rq], keepdims=1))
            nodes.append(make("ReduceSum", [n.input[2], f"{tag}_av"], [rv], keepdims=1))
        else:
            nodes.append(make("ReduceSum", [n.input[0]], [rq], axes=[3], keepdims=1))
            nodes.append(make("ReduceSum", [n.input[2]], [rv], axes=[1, 2], keepdims=1))
        nodes.append(make("Mul", [rq, rv], [n.output[0]]))
    del graph.node[:]
    graph.node.extend(nodes)


def _reads_a_cache_append(model: onnx.ModelProto) -> bool:
    """Whether a FlashAttention node of any graph reads K from a Concat (a KV-cache append)."""
    for graph in graphs_of(model.graph):
        concat_outputs = {o for n in graph.node if n.op_type == "Concat" for o in n.output}
        if any(is_flash_attention(n) and len(n.input) > 1 and n.input[1] in concat_outputs for n in graph.node):
            return True
    return False


# ---------------------------------------------------------------- the values fusion wrote, node by node


def with_written_types(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """A fused model whose rules' shapes came from ONNX's inference (its value_info: every value
    the input had is typed), with the main graph's values fusion wrote typed node by node (ONNX's
    per-node inference; a FlashAttention node by the stand-in with_flash_shapes writes for it), in
    node order: what ``with_flash_shapes`` adds on its ONNX path, without a whole-model inference.

    None where that cannot be proved the same, for the caller to run ``with_flash_shapes``: a
    KV-cache append (there ONNX Runtime's symbolic inference types the graph), a standard node
    with an input nothing types, a node ONNX cannot infer, an operand of the block's ops left
    without a rank, or a written value with a dim no number or name gives (the whole-model
    inference names such dims ``unk__N`` from a counter over the whole graph, or refines them
    from the types it merges: models/t5_eager_torchscript, bert_*_torchscript, bart_f16)."""
    if _reads_a_cache_append(model):
        return None
    graph = model.graph
    opset = u.default_opset(model)
    types: dict[str, onnx.TypeProto] = {}
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        types.setdefault(vi.name, vi.type)
    data: dict[str, onnx.TensorProto] = {}
    for init in graph.initializer:
        types.setdefault(init.name, onnx.helper.make_tensor_type_proto(init.data_type, list(init.dims)))
        data[init.name] = init
    added: list[onnx.ValueInfoProto] = []
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            data.update((node.output[0], a.t) for a in node.attribute if a.name == "value")
        if all(o in types for o in node.output if o):
            continue
        if is_flash_attention(node) and len(node.input) >= 3:
            found = _stand_in_types(node, opset, types, model.opset_import)
        elif node.domain in ("", "ai.onnx"):
            if any(i and i not in types for i in node.input):
                return None
            ins = {i: types[i] for i in node.input if i}
            found = _node_types(node, opset, ins, {i: data[i] for i in node.input if i in data}, model.opset_import)
        else:
            continue  # an op ONNX does not know: the whole-model inference leaves its outputs untyped too
        if found is None:
            return None
        for name, found_type in found.items():
            if name in types:
                continue
            if not _every_dim_given(found_type):
                return None
            types[name] = found_type
            added.append(onnx.helper.make_value_info(name, found_type))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.value_info.extend(added)
    return None if unknown_ranks(out) else out


def _stand_in_types(
    node: onnx.NodeProto, opset: int, types: dict[str, onnx.TypeProto], imports: Sequence[onnx.OperatorSetIdProto]
) -> dict[str, onnx.TypeProto] | None:
    """FlashAttention's output as with_flash_shapes' stand-in types it: ReduceSum(Q over D) *
    ReduceSum(V over heads and keys)."""
    q, v = node.input[0], node.input[2]
    if q not in types or v not in types:
        return None
    make = onnx.helper.make_node
    # opset 12's ReduceSum (axes an attribute) infers as the stand-in's opset-13 form does
    rq = _node_types(make("ReduceSum", [q], ["q"], axes=[3], keepdims=1), 12, {q: types[q]}, {}, imports)
    rv = _node_types(make("ReduceSum", [v], ["v"], axes=[1, 2], keepdims=1), 12, {v: types[v]}, {}, imports)
    if rq is None or rv is None:
        return None
    return _node_types(make("Mul", ["q", "v"], [node.output[0]]), opset, {"q": rq["q"], "v": rv["v"]}, {}, imports)


def _node_types(
    node: onnx.NodeProto,
    opset: int,
    inputs: dict[str, onnx.TypeProto],
    data: dict[str, onnx.TensorProto],
    imports: Sequence[onnx.OperatorSetIdProto],
) -> dict[str, onnx.TypeProto] | None:
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain or "")
        return onnx.shape_inference.infer_node_outputs(schema, node, inputs, data, opset_imports=list(imports))
    except Exception:  # noqa: BLE001 - an op or version ONNX has no schema or inference for
        return None


def _every_dim_given(value_type: onnx.TypeProto) -> bool:
    tensor = value_type.tensor_type
    if not value_type.HasField("tensor_type") or not tensor.HasField("shape"):
        return False
    return all(d.HasField("dim_value") or d.dim_param for d in tensor.shape.dim)
