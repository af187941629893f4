"""ortflash.optimize: the whole pass from a model to a model with FlashAttention nodes (or, with a
target, with the native ops they lower to)."""

from __future__ import annotations

from collections.abc import Iterator

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from . import spec
from .errors import OrtflashError
from .fusion.emit import BLOCK_ID
from .fusion.onnx_attention import fuse_attention_ops
from .fusion.walker import fuse_softmax_blocks
from .graph import ir_utils as u
from .lowering import TARGETS, LoweringNote, lower
from .lowering.contrib import MIN_CONTRIB_OPSET
from .model_io import ModelLike, load, save
from .model_shapes import graphs_of, with_shapes
from .policy import SoftmaxPolicy
from .report import Report

__all__ = ["OrtflashError", "load", "optimize", "save"]


def optimize(
    model_or_path: ModelLike,
    *,
    softmax: str | None = None,
    online_softmax: bool | None = None,
    block_size: int = spec.ATTRIBUTES["block_size"].default,  # type: ignore[assignment]
    min_seq_len: int = spec.ATTRIBUTES["min_seq_len"].default,  # type: ignore[assignment]
    policy: SoftmaxPolicy | None = None,
    target: str = "ortflash",
) -> tuple[onnx.ModelProto, Report]:
    """Fuse every provable attention block into FlashAttention, in every graph of the model
    (If branches, Loop and Scan bodies included: their rows are named ``If_0.then_branch/...``).

    Returns the new model and a Report with one Block per Softmax; when nothing is fused, the
    input model itself (never a rewritten copy). Shapes come from ONNX shape inference, or
    ONNX Runtime's symbolic one where ONNX's leaves ranks unknown (``Report.shape_inference``);
    for ``target="contrib"`` a model below opset 13 is converted to 13 (``Report.notes``). The softmax
    policy comes from ``policy``, else ``softmax`` (naive|online|auto), else the
    proposal's switch ``online_softmax`` (True -> auto, False/None -> naive).
    """
    if policy is None:
        mode = softmax or ("auto" if online_softmax else "naive")
        try:
            policy = SoftmaxPolicy(mode, block_size, min_seq_len)
        except spec.SpecError as exc:
            raise OrtflashError(str(exc)) from None
    if target not in TARGETS:
        raise OrtflashError(f"target must be one of {', '.join(TARGETS)}, got {target!r}")
    proto = load(model_or_path)
    work, conversion = _for_target(proto, target)
    opset = u.default_opset(work)
    shaped, inference = with_shapes(work)
    model = ir.serde.deserialize_model(shaped)
    report = Report(proto.graph.name or "model", shape_inference=inference)
    if conversion:
        report.notes.append(conversion)
    for graph, scope in _scopes(model.graph, ""):
        _forget_earlier_blocks(graph)
        # ONNX Attention ops (opset 23+) first: their Softmax is inside the op, not in the graph.
        rows = fuse_attention_ops(graph, opset, policy, first_row=len(report.blocks))
        rows += fuse_softmax_blocks(graph, opset, policy, first_row=len(report.blocks) + len(rows))
        for row in rows:
            row.name = scope + row.name
        report.blocks += rows

    if not report.fused:
        # Nothing to write differently: the input itself, not a round trip of it through the IR
        # (which would carry inferred shapes that change what ONNX Runtime's optimizer does).
        return proto, report
    common_passes.RemoveUnusedNodesPass()(model)  # subgraphs included
    model.opset_imports.setdefault(spec.DOMAIN, spec.DOMAIN_VERSION)
    out = ir.serde.serialize_model(model)
    out.ir_version = work.ir_version
    if target != "ortflash":
        # the lowering proves from the shapes the rules proved from (subgraphs' included)
        out, notes = lower(out, target)
        _note_lowering(report, notes, target)
    _keep_declared_value_info(work, out)
    return out, report


def _for_target(proto: onnx.ModelProto, target: str) -> tuple[onnx.ModelProto, str]:
    """The model the pass works on, and a note when it is not the input: the contrib target writes
    opset-13 forms, so an older model is converted to opset 13 first, where the converter can."""
    opset = u.default_opset(proto)
    if target != "contrib" or opset >= MIN_CONTRIB_OPSET:
        return proto, ""
    # The adapters from 12 to 13 move attributes to inputs (Unsqueeze, Squeeze, ReduceSum, Split)
    # or keep Softmax's meaning (a last-axis Softmax stays one; another axis gets reshapes): each
    # computes the same, so a conversion that succeeds is exact; one that cannot raises.
    try:
        converted = onnx.version_converter.convert_version(proto, MIN_CONTRIB_OPSET)
    except Exception as exc:  # noqa: BLE001 - the converter raises several types
        first_line = (str(exc).splitlines() or [""])[0][:160]
        return proto, (
            f"opset {opset} could not be converted to {MIN_CONTRIB_OPSET} for --target contrib "
            f"({type(exc).__name__}: {first_line}); blocks stay FlashAttention"
        )
    return (
        converted,
        f"converted from opset {opset} to {MIN_CONTRIB_OPSET} for --target contrib (onnx.version_converter)",
    )


def _scopes(graph: ir.Graph, scope: str) -> Iterator[tuple[ir.Graph, str]]:
    """graph and every subgraph nested in it, each with the report's prefix naming where it is:
    ``If_0.then_branch/`` for the then branch of node If_0 (nested scopes join)."""
    yield graph, scope
    for node in graph:
        owner = node.name or node.op_type
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                yield from _scopes(attr.as_graph(), f"{scope}{owner}.{attr.name}/")
            elif attr.type == ir.AttributeType.GRAPHS:
                for i, sub in enumerate(attr.as_graphs()):
                    yield from _scopes(sub, f"{scope}{owner}.{attr.name}[{i}]/")


def _keep_declared_value_info(original: onnx.ModelProto, out: onnx.ModelProto) -> None:
    """Shape inference annotated intermediates in every graph; keep only what the input declared."""
    declared = {vi.name for g in graphs_of(original.graph) for vi in g.value_info}
    for graph in graphs_of(out.graph):
        kept = [vi for vi in graph.value_info if vi.name in declared]
        del graph.value_info[:]
        graph.value_info.extend(kept)


def _forget_earlier_blocks(graph: ir.Graph) -> None:
    """FlashAttention nodes of an earlier run keep their ops but not their report rows: the row
    ids this run writes would otherwise collide with theirs."""
    for node in graph:
        if node.domain == spec.DOMAIN and node.op_type == spec.OP_TYPE:
            node.metadata_props.pop(BLOCK_ID, None)


def _note_lowering(report: Report, notes: list[LoweringNote], target: str) -> None:
    """Record on each report row what its FlashAttention node became (rows by the node's block id)."""
    rows = {str(i): block for i, block in enumerate(report.blocks)}
    for note in notes:
        block = rows.get(note.block or "")
        if block is None:
            continue  # a FlashAttention node the input model already had
        block.target = note.op if note.lowered else "ortflash"
        if not note.lowered:
            block.reason = "; ".join(filter(None, [block.reason, f"not lowered to {target}: {note.reason}"]))
