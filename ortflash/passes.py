"""ortflash as ``onnx_ir.passes`` passes, to compose with onnxscript's optimizer in one PassManager::

    import onnx_ir as ir
    import onnxscript.optimizer
    from ortflash.passes import FuseAttention, Lower

    model = ir.load("model.onnx")
    onnxscript.optimizer.optimize_ir(model)             # constant folding, dead code (in place)
    result = ir.passes.PassManager([FuseAttention(target="ortflash"), Lower("contrib")])(model)
    ir.save(result.model, "model.fused.onnx")

Both passes are functional (the input model is left as it was; ``result.model`` is a new one), as
``ortflash.optimize`` and ``ortflash.lower`` are, whose pipelines they run unchanged. ``modified``
is true exactly when a block changed: fused (or lowered) by FuseAttention, lowered by Lower.

The report travels two ways: on the result (``FusionResult.report``, ``LoweringResult.notes``),
and, since a PassManager hands on only ``PassResult(model, modified)``, as JSON in the model's
``metadata_props`` (``REPORT_KEY``; Lower updates each lowered row's ``lowered_to`` there and adds
its notes under ``LOWERING_KEY``). A pass that changed nothing writes no metadata, so a second
run of a PassManager does not overwrite the first run's report with an empty one.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Sequence

import onnx
import onnx_ir as ir

from .lowering import LoweringNote, lower
from .op.policy import SoftmaxPolicy
from .pipeline.optimize import optimize
from .report import Report

__all__ = ["LOWERING_KEY", "REPORT_KEY", "FuseAttention", "FusionResult", "Lower", "LoweringResult"]

REPORT_KEY = "ortflash.report"  # Report.to_dict() as JSON, one row per Softmax or Attention node
LOWERING_KEY = "ortflash.lowering"  # Lower's notes as JSON, one per FlashAttention node


@dataclasses.dataclass
class FusionResult(ir.passes.PassResult):
    """FuseAttention's result: the model, whether any block changed, and the full report."""

    report: Report = dataclasses.field(default_factory=lambda: Report("model"))


@dataclasses.dataclass
class LoweringResult(ir.passes.PassResult):
    """Lower's result: the model, whether any node was lowered, and a note per FlashAttention node."""

    notes: list[LoweringNote] = dataclasses.field(default_factory=list)


class FuseAttention(ir.passes.FunctionalPass):
    """Every provable attention block fused into FlashAttention (``ortflash.optimize``), and with
    ``target`` written for it: ``ortflash``, ``contrib``, ``onnx``, ``webgpu``, or ``"auto"`` with
    ``ep``; None is optimize's default (ortflash, each block kept where the cost table says the
    fused form is slower). ``policy``: the softmax policy of the new nodes (None: optimize's default,
    naive). ``metadata_key``: where the report is written in the model's metadata (None: nowhere).
    """

    def __init__(
        self,
        policy: SoftmaxPolicy | None = None,
        target: str | None = None,
        *,
        ep: str | None = None,
        num_heads: int | None = None,
        prove_causal: bool = True,
        seq_lens: Sequence[int] | None = None,
        metadata_key: str | None = REPORT_KEY,
    ) -> None:
        self.policy = policy
        self.target = target
        self.ep = ep
        self.num_heads = num_heads
        self.prove_causal = prove_causal
        self.seq_lens = None if seq_lens is None else tuple(seq_lens)
        self.metadata_key = metadata_key

    def call(self, model: ir.Model) -> FusionResult:
        proto = ir.serde.serialize_model(model)
        out, report = optimize(
            proto,
            policy=self.policy,
            target=self.target,
            ep=self.ep,
            num_heads=self.num_heads,
            prove_causal=self.prove_causal,
            seq_lens=self.seq_lens,
        )
        # optimize hands back its input itself when no block is fused (or every fused one was kept)
        modified = out is not proto and report.fused > 0
        new = _to_ir(out, model)
        if modified and self.metadata_key is not None:
            new.metadata_props[self.metadata_key] = json.dumps(report.to_dict())
        return FusionResult(new, modified, report)


class Lower(ir.passes.FunctionalPass):
    """Every FlashAttention node that ``target``'s native op computes exactly, lowered to it
    (``ortflash.lower``: ``contrib``, ``onnx``, ``webgpu``; ``ortflash`` lowers nothing); the others
    stay, each note saying why. ``metadata_key``: where the notes are written (None: nowhere);
    ``report_key``: the report FuseAttention wrote, whose lowered rows get their ``lowered_to``."""

    def __init__(
        self, target: str, *, metadata_key: str | None = LOWERING_KEY, report_key: str | None = REPORT_KEY
    ) -> None:
        self.target = target
        self.metadata_key = metadata_key
        self.report_key = report_key

    def call(self, model: ir.Model) -> LoweringResult:
        proto = ir.serde.serialize_model(model)
        out, notes = lower(proto, self.target)
        modified = out is not proto and any(n.lowered for n in notes)
        new = _to_ir(out, model)
        if modified and self.metadata_key is not None:
            new.metadata_props[self.metadata_key] = json.dumps([dataclasses.asdict(n) for n in notes])
        if modified and self.report_key is not None and self.report_key in new.metadata_props:
            report = json.loads(new.metadata_props[self.report_key])
            for note in notes:
                if note.lowered and note.block is not None and note.block.isdigit():
                    report["blocks"][int(note.block)]["lowered_to"] = note.op
            new.metadata_props[self.report_key] = json.dumps(report)
        return LoweringResult(new, modified, notes)


def _to_ir(proto: onnx.ModelProto, source: ir.Model) -> ir.Model:
    """``proto`` as a new ir.Model whose external weights are read from where ``source``'s were: a
    model's weights never pass through the pipelines (they keep their external references), and the
    folder those are relative to is not part of a ModelProto."""
    new = ir.serde.deserialize_model(proto)
    base_dirs = {t.location: t.base_dir for t in _external_tensors(source.graph) if t.base_dir}
    for tensor in _external_tensors(new.graph):
        if not tensor.base_dir and tensor.location in base_dirs:
            tensor.base_dir = base_dirs[tensor.location]
    return new


def _external_tensors(graph: ir.Graph) -> Iterator[ir.ExternalTensor]:
    """The initializers of ``graph`` and of every graph nested in it whose data is in a file."""
    for each in (graph, *graph.subgraphs()):
        for value in each.initializers.values():
            if isinstance(value.const_value, ir.ExternalTensor):
                yield value.const_value
