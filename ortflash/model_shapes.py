"""Types and shapes for the rules to prove from: ONNX shape inference, and ONNX Runtime's symbolic
shape inference where ONNX's leaves the rank of a tensor attention reads unknown.

Shipped exports (Paddle2ONNX, older converters) often carry no value_info and build reshapes from
``Shape`` arithmetic ONNX's inference does not follow; ONNX Runtime's symbolic inference does, with
named dims. Whichever is used is named in the report (``Report.shape_inference``)."""

from __future__ import annotations

import onnx

from .model_io import graphs_of

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


def _symbolic_inferred(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """ONNX Runtime's symbolic inference, or None where it cannot infer every shape.

    Its ``SymbolicShapeInference.infer_shapes`` saves an incomplete result as
    ``sym_shape_infer_temp.onnx`` in the process's current folder before raising: a library must
    not write into its user's folder, so its own steps are run here, in memory, and an incomplete
    result is dropped exactly where ``infer_shapes`` would have raised."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference, get_opset

        opset = get_opset(model)
        if not opset or opset < _SYMBOLIC_MIN_OPSET:
            return None
        inference = SymbolicShapeInference(_SYMBOLIC_INT_MAX, True, False, 0)
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
