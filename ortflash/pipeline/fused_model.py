"""The pipeline's currency between fusion and lowering: the fused model in memory, with its report
and what fusion proved of each fused block, lowered per candidate target on a clone of it.

Fusion runs once (again where the cost table keeps blocks: pipeline/optimize.py) and hands on a
``FusedModel``. Its ``ir.Model`` is what ortflash's own target writes; the lowerings prove from
the same model with the values fusion wrote typed (``FusedModel.typed``: node by node where the
rules' shapes came from ONNX's inference, else by a second inference), made when the first
candidate lowers and shared by all of them: each lowers a clone (lowering.lower_ir) and is
serialized once, when it is written (``written``)."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from ..fusion.driver import fuse
from ..fusion.onnx_attention import AttentionOpFrontEnd
from ..fusion.softmax import SoftmaxFrontEnd
from ..graph import ir_utils as u
from ..lowering import LoweringNote, lower_ir
from ..lowering.head_count import GivenHeads
from ..lowering.targets import REGISTRY
from ..model_io import graphs_of
from ..model_shapes import ONNX_INFERENCE, with_flash_shapes, with_written_types
from ..op import spec
from ..op.node import BLOCK_ID, flash_nodes
from ..op.policy import SoftmaxPolicy
from ..report import Report
from .fused_rows import prove_heads, queries_are_keys
from .rounding import mark_rounding_sensitive


@dataclass(frozen=True)
class BlockFacts:
    """What fusion proved of one fused block that no report column carries: the head count the
    user gave where nothing proves it (``--num-heads``, for the lowerings that take it as a
    number), whether its scores are per batch·head ([B·H, Sq, Sk], whose node sees one head
    per batch-head pair, so its shapes show no head count), whether its query length is its key
    length (fused_rows.queries_are_keys: no one-query step against a cache) and whether it was
    one ONNX Attention op (fusion/driver.FrontEnd.one_op) rather than a graph of plain ops."""

    given_heads: GivenHeads | None = None
    per_batch_head: bool = False
    queries_are_keys: bool = False
    one_op: bool = False


@dataclass
class FusedModel:
    """Every block fused, once, whatever the target.

    ``model``: the fused graph in memory (None where nothing was fused: the input itself stands);
    never modified after fusion, so every candidate lowers a clone. ``report``: one row per
    candidate block (fused_rows' proved dims filled in); each candidate writes on its own copy.
    ``facts``: by report row, what the lowerings read besides the graph. ``original``: the input
    as loaded, whose declared value_info the written model keeps; ``folder``: its file's folder,
    where its external data is (None for a model given in memory)."""

    original: onnx.ModelProto
    model: ir.Model | None
    report: Report
    facts: Mapping[int, BlockFacts] = field(default_factory=dict)
    folder: str | None = None
    _typed: ir.Model | None = field(default=None, repr=False)

    @property
    def given_heads(self) -> dict[int, GivenHeads]:
        return {row: f.given_heads for row, f in self.facts.items() if f.given_heads is not None}

    def typed(self) -> ir.Model:
        """The fused model with the types of every value, the values fusion wrote included, for the
        lowerings to prove from, made when the first candidate lowers and shared by every
        candidate, each of which lowers a clone. Not what is written for ortflash's own target,
        which is ``model`` as fusion wrote it (the written bytes are those of the fused graph).

        Where the rules' shapes came from ONNX's inference, the values fusion wrote are typed node
        by node (model_shapes.with_written_types): no shape inference after fusion, and byte for
        byte the model a second one would give. Elsewhere (a KV-cache append, which ONNX Runtime's
        symbolic inference types; a written dim nothing names; shapes from the symbolic inference)
        it is that second inference (model_shapes.with_flash_shapes, FlashAttention's outputs by
        stand-ins). A graph typed only as fusion writes it is not enough: the lowerings read the
        shapes of the Transposes, Unsqueezes and Casts fusion writes before the node; without them
        46 of the first 376 outputs of the byte check (models/, tests/data) change."""
        assert self.model is not None
        if self._typed is None:
            fused = ir.serde.serialize_model(self.model)
            # where the rules' shapes came from ONNX's inference, the values fusion wrote typed node
            # by node give what its second run would (model_shapes.with_written_types says where not)
            typed = with_written_types(fused) if self.report.shape_inference == ONNX_INFERENCE else None
            self._typed = ir.serde.deserialize_model(typed if typed is not None else with_flash_shapes(fused))
            if self.folder is not None:
                u.root_external_data(self._typed.graph, self.folder)
        return self._typed


def fuse_model(
    proto: onnx.ModelProto,
    shaped: tuple[onnx.ModelProto, str],
    policy: SoftmaxPolicy,
    num_heads: int | None,
    prove_causal: bool = True,
    keep: Mapping[str, str] = MappingProxyType({}),
    folder: str | None = None,
) -> FusedModel:
    """Every block of ``proto`` fused (subgraphs included), rows numbered across graphs.
    ``shaped``: ``model_shapes.with_shapes(proto)``, the model with inferred shapes and how they
    were inferred. ``keep``: report names of blocks left as they are, each with the reason for its
    row. ``folder``: the model file's folder, where its external data is (small external constants,
    a scale or a shape, are read from there)."""
    # Opset conversions a target needs (to 13 for contrib/webgpu, 23 for onnx) happen in the
    # lowering, after fusion: converting first lets the 12 -> 13 adapter wrap Softmax in Reshapes
    # where shapes are unknown, and then no block fuses.
    opset = u.default_opset(proto)
    with_inferred, inference = shaped
    model = ir.serde.deserialize_model(with_inferred)
    if folder is not None:
        u.root_external_data(model.graph, folder)
    report = Report(proto.graph.name or "model", shape_inference=inference)
    facts: dict[int, BlockFacts] = {}
    # ONNX Attention ops (opset 23+) first: their Softmax is inside the op, not in the graph.
    front_ends = (AttentionOpFrontEnd(), SoftmaxFrontEnd(prove_causal=prove_causal))
    for graph, scope in _scopes(model.graph, ""):
        _forget_earlier_blocks(graph)
        here = {name[len(scope) :]: why for name, why in keep.items() if name.startswith(scope)}
        rows = fuse(graph, opset, policy, front_ends, first_row=len(report.blocks), keep=here)
        for block in rows.blocks:
            block.name = scope + block.name
        report.blocks += rows.blocks
        given = prove_heads(graph, report, num_heads, rows.per_batch_head)
        square = queries_are_keys(graph)
        for row in {*given, *rows.per_batch_head, *square, *rows.one_op}:
            facts[row] = BlockFacts(given.get(row), row in rows.per_batch_head, row in square, row in rows.one_op)
    if not report.fused:
        # Nothing to write differently: the input itself, not a round trip of it through the IR
        # (which would carry inferred shapes that change what ONNX Runtime's optimizer does).
        return FusedModel(proto, None, report, facts, folder)
    common_passes.RemoveUnusedNodesPass()(model)  # subgraphs included
    model.opset_imports.setdefault(spec.DOMAIN, spec.DOMAIN_VERSION)
    model.ir_version = proto.ir_version
    mark_rounding_sensitive(model, report)
    return FusedModel(proto, model, report, facts, folder)


def rewritten(fused: FusedModel, proto: onnx.ModelProto) -> FusedModel:
    """``fused`` with its model replaced by ``proto``, a rewrite of it on the serialized form (an
    If on the length around blocks: pipeline/length_dispatch.py reads protos), typed from it."""
    model = ir.serde.deserialize_model(proto)
    typed = ir.serde.deserialize_model(with_flash_shapes(proto))
    if fused.folder is not None:
        u.root_external_data(model.graph, fused.folder)
        u.root_external_data(typed.graph, fused.folder)
    return FusedModel(fused.original, model, fused.report, fused.facts, fused.folder, typed)


def lowered_for(fused: FusedModel, target: str) -> tuple[ir.Model, Report, list[str]]:
    """The fused model written for ``target`` (a clone, lowered where the target has ops; the fused
    model itself for ortflash's own target, which the caller serializes without modifying), with
    the candidate's own copy of the report; and the lowering's notes for the caller to record."""
    assert fused.model is not None
    report = copy.deepcopy(fused.report)
    if REGISTRY[target].needs_ortflash or not flash_nodes(fused.model.graph):
        return fused.model, report, []
    typed = fused.typed()
    out, notes = lower_ir(typed, target, fused.folder, fused.given_heads)
    _note_lowering(report, notes, target)
    if out is typed:  # nothing lowered: the fused model as fusion wrote it
        return fused.model, report, []
    before, after = _default_opset(fused.model), _default_opset(out)
    added: list[str] = []
    if after != before:
        added.append(
            f"raised the default opset from {before} to {after} for --target {target}, op by op (pipeline/opset.py)"
        )
    return out, report, added


def written(fused: FusedModel, model: ir.Model) -> onnx.ModelProto:
    """A candidate serialized, once: the value_info the input declared and nothing inferred."""
    out = ir.serde.serialize_model(model)
    keep_declared_value_info(fused.original, out)
    return out


def keep_declared_value_info(original: onnx.ModelProto, out: onnx.ModelProto) -> None:
    """Shape inference annotated intermediates in every graph; keep only what the input declared."""
    declared = {vi.name for g in graphs_of(original.graph) for vi in g.value_info}
    for graph in graphs_of(out.graph):
        kept = [vi for vi in graph.value_info if vi.name in declared]
        del graph.value_info[:]
        graph.value_info.extend(kept)


def _default_opset(model: ir.Model) -> int:
    return model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))


def _note_lowering(report: Report, notes: Sequence[LoweringNote], target: str) -> None:
    """Record on each report row what its FlashAttention node became (rows by the node's block id)."""
    rows = {str(i): block for i, block in enumerate(report.blocks)}
    for note in notes:
        block = rows.get(note.block or "")
        if block is None:
            continue  # a FlashAttention node the input model already had
        block.lowered_to = note.op if note.lowered else None
        if not note.lowered:
            block.reason = "; ".join(filter(None, [block.reason, f"not lowered to {target}: {note.reason}"]))


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


def _forget_earlier_blocks(graph: ir.Graph) -> None:
    """FlashAttention nodes of an earlier run keep their ops but not their report rows: the row
    ids this run writes would otherwise collide with theirs."""
    for node in flash_nodes(graph, subgraphs=False):
        node.metadata_props.pop(BLOCK_ID, None)
