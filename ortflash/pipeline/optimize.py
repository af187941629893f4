"""ortflash.optimize: the whole pass from a model to a model with FlashAttention nodes (or, with a
target, with the native ops they lower to), and the choice of target where the user leaves it open.

Over 400 lines because the pipeline is one sequence whose later steps (the blocks kept where the
cost table says the original ops are faster, the Ifs on the length) fuse and lower again through
the same ``fuse_model`` and ``_lower_for`` as the first pass, which they share here."""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import onnx
import onnx_ir as ir

from ..errors import OrtflashError
from ..lowering import lower
from ..lowering.targets import DEFAULT_TARGET, EXECUTION_PROVIDERS, PROVIDERS, REGISTRY, TARGETS
from ..model_io import ModelLike, check_opsets, load, save
from ..model_shapes import with_shapes
from ..op import spec
from ..op.node import flash_nodes
from ..op.policy import SoftmaxPolicy
from ..report import Report, TargetChoice
from . import forms
from .fused_model import BlockFacts, FusedModel, fuse_model, lowered_for, rewritten, written
from .ir_versions import loadable_ir_version
from .length_dispatch import Threshold, dispatch
from .length_reach import LengthReach
from .native_attention import native_attention_note
from .target_choice import AUTO, LoadCheck, choose_default, choose_for_ep

__all__ = ["AUTO", "EXECUTION_PROVIDERS", "LoadCheck", "OrtflashError", "load", "optimize", "save"]


def optimize(
    model_or_path: ModelLike,
    *,
    softmax: str | None = None,
    online_softmax: bool | None = None,
    block_size: int = spec.ATTRIBUTES["block_size"].default,  # type: ignore[assignment]
    min_seq_len: int = spec.ATTRIBUTES["min_seq_len"].default,  # type: ignore[assignment]
    policy: SoftmaxPolicy | None = None,
    target: str | None = None,
    ep: str | None = None,
    num_heads: int | None = None,
    load_check: LoadCheck | None = None,
    prove_causal: bool = True,
    seq_lens: Sequence[int] | None = None,
    cpu_class: str | None = None,
) -> tuple[onnx.ModelProto, Report]:
    """Fuse every provable attention block into FlashAttention, in every graph of the model
    (If branches, Loop and Scan bodies included: their rows are named ``If_0.then_branch/...``).

    Returns the new model and a Report with one Block per Softmax; when nothing is fused, the
    input model itself, but for an IR version newer than ONNX Runtime loads (stamped, as a fused
    model is) and FlashAttention nodes it already had, which a portable target lowers
    (``Report.rewritten``; where they cannot be lowered, OrtflashError says so). Shapes come from ONNX shape inference, or
    ONNX Runtime's symbolic one where ONNX's leaves ranks unknown (``Report.shape_inference``).
    The softmax policy comes from ``policy``, else ``softmax`` (naive|online|auto), else the
    proposal's switch ``online_softmax`` (True -> auto, False/None -> naive).

    ``target``: ``ortflash``, ``contrib``, ``onnx`` (any of ``lowering.TARGETS``); ``"auto"``
    with ``ep`` (``cpu | cuda | webgpu``): the first target of ``PROVIDERS[ep].targets`` that lowers every
    fused block and that ONNX Runtime loads (an ``ep`` without a target means auto); None (the
    default): ``ortflash``, unless fused blocks feed a quantizer, where ``contrib``, else ``onnx``,
    is taken when it lowers every such block and loads. ``Report.target`` says which was chosen and why. ``load_check`` is how a
    candidate is proved loadable (default: opened in ONNX Runtime, and run once on random inputs
    when blocks were lowered). ``num_heads``: the query head count of blocks whose count no shape
    or initializer proves; a count that is proved and differs raises OrtflashError.
    Opsets newer than the installed onnx knows are refused; opset conversions are in ``Report.notes``.
    ``prove_causal``: read each block's mask subgraph for a causal frontier (fusion/causal) and,
    where proved, set is_causal with a [B, 1, 1, Sk] padding part; False keeps every block's mask
    tensor as the graph computes it (for comparisons, and as an escape hatch).

    Where ``target`` is left open (None, or auto), each fused block takes the form that runs
    fastest where it runs (ortflash/pipeline/forms.py): the chosen target's op where the measured cost
    table says it beats the original ops at the block's key length (its static length, else
    every one of ``seq_lens``), else the original ops, with the reason on its row. A target
    asked for by name is written as asked (a block a portable target cannot lower keeps its original ops). ``ortflash.pipeline.tune.optimize_tuned`` (``--tune``) times
    the candidates on this machine instead, and keeps the fastest. ``cpu_class``: which CPU class's
    table decides on the CPU EP (``forms.CPU_CLASSES``: avx512, avx2, generic; None: the class of
    the kernel build this process runs); each row's detail names the table it read.
    """
    if policy is None:
        try:
            policy = SoftmaxPolicy.for_new_nodes(softmax, online_softmax, block_size, min_seq_len)
        except spec.SpecError as exc:
            raise OrtflashError(str(exc)) from None
    if target is None and ep is not None:
        target = AUTO  # naming the execution provider is asking for the target that fits it
    _check_target(target, ep)
    if cpu_class is not None and cpu_class not in forms.CPU_CLASSES:
        raise OrtflashError(f"cpu_class must be one of {', '.join(forms.CPU_CLASSES)}, got {cpu_class!r}")
    if num_heads is not None and num_heads < 1:
        raise OrtflashError(f"num_heads must be a positive integer, got {num_heads}")
    proto = load(model_or_path)
    check_opsets(proto)

    # shapes inferred once: the second fusion, with blocks kept, reads the same shapes
    inputs = _FusionInputs(proto, with_shapes(proto), policy, num_heads, prove_causal, _model_folder(model_or_path))
    fused = inputs.fuse()
    if isinstance(model_or_path, (str, os.PathLike)):
        fused.report.model = os.fspath(model_or_path)  # the report is titled with the file the user named
    already_fused = native_attention_note(proto)
    if already_fused is not None:
        fused.report.notes.append(already_fused)

    def run(candidate: str) -> tuple[onnx.ModelProto, Report]:
        return _lower_for(fused, candidate)

    check = load_check or _default_load_check(model_or_path, proto)
    if target is None:
        model, report = choose_default(run, check)
    else:
        if target == AUTO:
            assert ep is not None
            written = choose_for_ep(ep, run, check)
        else:
            written = run(target)
            written[1].target = TargetChoice(requested=target, ep=ep, chosen=target, why="asked for")
        model, report = _unlowered_kept(inputs, written)
        if target != AUTO:
            _refuse_flash_left(model, report, target)
            return model, report
    if seq_lens is not None and (not seq_lens or min(seq_lens) < 1):
        raise OrtflashError(f"seq_lens must be positive key lengths, got {list(seq_lens)}")
    table_class = cpu_class or forms.running_cpu_class()  # the CPU table is chosen once per call
    chosen = (model, report)
    return _fastest_forms(inputs, chosen, seq_lens, check, ep, table_class, fused.facts)


@dataclasses.dataclass(frozen=True)
class _FusionInputs:
    """What fusing the model reads, the first time and again with blocks kept: the model as loaded,
    its shapes (``model_shapes.with_shapes``, inferred once per call), the softmax policy, the head
    count given, whether causal masks are proved, and the model file's folder."""

    proto: onnx.ModelProto
    shaped: tuple[onnx.ModelProto, str]
    policy: SoftmaxPolicy
    num_heads: int | None
    prove_causal: bool
    folder: str | None

    def fuse(self, keep: Mapping[str, str] = MappingProxyType({})) -> FusedModel:
        """The model fused with the blocks of ``keep`` left as they were, each row with its reason."""
        return fuse_model(
            self.proto, self.shaped, self.policy, self.num_heads, self.prove_causal, keep=keep, folder=self.folder
        )


def _fastest_forms(
    inputs: _FusionInputs,
    chosen: tuple[onnx.ModelProto, Report],
    seq_lens: Sequence[int] | None,
    check: LoadCheck,
    ep: str | None,
    cpu_class: str,
    facts: Mapping[int, BlockFacts] = MappingProxyType({}),
) -> tuple[onnx.ModelProto, Report]:
    """The chosen target's model with every block the cost table says is slower fused than as it
    was left as it was (fused again without them), and every block whose length is known only at
    run time and whose fused form wins from some length written as an If on the length
    (pipeline/length_dispatch.py); each row says why it took its form."""
    model, report = chosen
    assert report.target is not None
    target = report.target.chosen
    keep: dict[str, str] = {}
    details: dict[str, str] = {}
    thresholds: dict[int, Threshold] = {}
    reach = LengthReach(inputs.proto, inputs.folder)
    for row, block in enumerate(report.blocks):
        if not block.fused:
            continue
        # a block the chosen target did not lower is a FlashAttention node: its form is ortflash's
        form = target if block.lowered_to else DEFAULT_TARGET
        lengths = list(seq_lens) if seq_lens else ([block.key_len] if block.key_len else None)
        # an If on the length is written around a FlashAttention node, in the graph that holds it: the
        # main graph, or an If's branch (a merged decoder's: the If nested there). On a GPU EP it is
        # written before the lowering, which then lowers the node inside the If's fused branch: the
        # main graph's only
        lowered_later = forms.dispatches_lowered(ep, block.lowered_to)
        scope = _scope_of(block.name)
        can_dispatch = (block.lowered_to is None and _in_if_branches(block.name)) or (lowered_later and not scope)
        choice = forms.choose(
            form,
            inputs.policy,
            block.head_dim,
            lengths,
            block.mask_kind or "padding",
            ep,
            block.dtype or None,
            can_dispatch,
            cpu_class,
            queries_are_keys=facts.get(row, BlockFacts()).queries_are_keys,
            one_op=facts.get(row, BlockFacts()).one_op,
        )
        if choice.dispatch_from is not None:
            choice = _reached(choice, reach, choice.dispatch_from, block.detail)
        details[block.name] = choice.detail
        if choice.dispatch_from is not None:
            thresholds[row] = Threshold(choice.dispatch_from, choice.decode_from)
        if choice.fused:
            block.reason = "; ".join(filter(None, [block.reason, choice.why]))
            block.detail = "; ".join(filter(None, [block.detail, choice.detail]))  # the proof's, then the table's
            block.fused_from = choice.dispatch_from
        else:
            keep[block.name] = choice.why
    while True:
        if thresholds and not REGISTRY[target].needs_ortflash:  # a GPU EP: the If first, then the lowering
            found = _dispatched_then_lowered(inputs, report, keep, details, target, thresholds)
            left = found if isinstance(found, dict) else {}
            if not isinstance(found, dict):
                faster, faster_report = found
        else:
            if keep:
                faster, faster_report = _kept_where_faster(inputs, report, keep, details, target)
            else:
                faster, faster_report = model, copy.deepcopy(report)
            if not thresholds:
                break
            dispatched = dispatch(inputs.proto, faster, thresholds, inputs.shaped[0])
            left = dict(dispatched.left)
            if not left:
                faster = dispatched.model
        if not left:
            faster_report.notes.append(
                f"{len(thresholds)} block(s) choose their form by the run's key length: an If on the length "
                "around each, one condition per distinct length (pipeline/length_dispatch.py)"
            )
            break
        for row, why in left.items():  # these keep the original ops, and the rest are asked again
            name = report.blocks[row].name
            keep[name] = "the original ops are faster below its crossover, and no If on the length could be written"
            details[name] = f"{report.blocks[row].detail}; no If could be written: {why}"
            thresholds.pop(row)
    if faster is model:
        return model, report
    if faster_report.fused and faster is not inputs.proto:
        problem = check(faster, faster_report)
        if problem is not None:  # the subset fails where the whole loaded: say so, keep the whole
            report.notes.append(f"the original ops were not kept where faster: {problem}")
            return model, report
    if keep:
        kept_all = "every fused block" if len(keep) == report.fused else f"{len(keep)} of {report.fused} fused blocks"
        faster_report.target = dataclasses.replace(
            report.target,
            why=f"{report.target.why}; {kept_all} then kept the original ops, faster there (ortflash/pipeline/forms.py)",
        )
    else:
        faster_report.target = report.target
    return faster, faster_report


def _reached(choice: forms.FormChoice, reach: LengthReach, key_len: int, proved: str) -> forms.FormChoice:
    """``choice``, or the original ops where no run of the model reaches ``key_len``, the length its
    If would switch at: that If would never take the fused side, and would cost at every length.
    ``proved``: the row's detail from the proof, kept in front of the table's."""
    stop = reach.stops_before(key_len)
    if stop is None:
        return choice
    return forms.FormChoice(
        False,
        f"the original ops: the model does not run at {key_len} keys, where the fused form would start",
        f"{'; '.join(filter(None, [proved, choice.detail]))}; but the original model does not run at {key_len} keys, batch 1 ({stop}), so an If "
        "there would never take the fused side and would cost its few microseconds at every length the model "
        "runs (pipeline/length_reach.py); --seq-lens or --target fuses anyway",
    )


def _unlowered_kept(inputs: _FusionInputs, written: tuple[onnx.ModelProto, Report]) -> tuple[onnx.ModelProto, Report]:
    """A portable target, asked for by name or chosen for an EP (``written``'s ``report.target``),
    never leaves a FlashAttention node: a block its op cannot compute keeps its original ops, with
    the lowering's reason on its row (issue 33 item 1: a model whose opset could not be raised came
    out all FlashAttention, exit 0, unloadable without ortflash; under an EP, which cannot run it
    either, gemma2's softcap blocks under --ep webgpu came out FlashAttention, exit 0)."""
    model, report = written
    choice = report.target
    target = choice.chosen if choice is not None else ""
    if target not in REGISTRY or REGISTRY[target].needs_ortflash:
        return model, report
    keep = {b.name: b.reason for b in report.blocks if b.fused and b.lowered_to is None}
    if not keep:
        return model, report
    kept, kept_report = _kept_where_faster(inputs, report, keep, {}, target)
    kept_report.notes.append(
        f"{len(keep)} block(s) kept their original ops: --target {target} cannot lower them (the reason is on each row)"
    )
    kept_report.target = choice
    return kept, kept_report


def _dispatched_then_lowered(
    inputs: _FusionInputs,
    report: Report,
    keep: Mapping[str, str],
    details: Mapping[str, str],
    target: str,
    thresholds: Mapping[int, Threshold],
) -> tuple[onnx.ModelProto, Report] | dict[int, str]:
    """On a GPU EP (forms.LOWERED_DISPATCH_EPS): the model fused with ``keep`` left as it was, each
    block of ``thresholds`` written as an If on the length around its FlashAttention node, then
    lowered for ``target`` (the node inside the If's fused branch too), so no FlashAttention is
    left; or the rows that could not be written so (row -> why), for the caller to keep."""
    fused = inputs.fuse(keep)
    # the If is written on the serialized fused model (length_dispatch reads protos), and the
    # lowering then reads that model back: the one path with a round trip before the lowering
    proto = inputs.proto
    fused_proto = proto if fused.model is None else ir.serde.serialize_model(fused.model)
    dispatched = dispatch(proto, fused_proto, thresholds, inputs.shaped[0], branch_shapes=True)
    if dispatched.left:
        return dict(dispatched.left)
    fused.report.model = report.model
    if fused.model is not None:
        fused = rewritten(fused, dispatched.model)
    faster, faster_report = _lower_for(fused, target)
    left = {
        row: f"its node was not lowered for {target} inside the If's branch ({faster_report.blocks[row].reason})"
        for row in thresholds
        if faster_report.blocks[row].lowered_to is None
    }
    if left:
        return left
    _rows_as_chosen(faster_report, report, keep, details)
    return faster, faster_report


def _kept_where_faster(
    inputs: _FusionInputs, report: Report, keep: Mapping[str, str], details: Mapping[str, str], target: str
) -> tuple[onnx.ModelProto, Report]:
    """The model fused again with the blocks of ``keep`` left as they were, each row with its reason;
    a kept row keeps what the fused one proved (mask kind, head dim, key length)."""
    fused = inputs.fuse(keep)
    fused.report.model = report.model
    faster, faster_report = _lower_for(fused, target)
    _rows_as_chosen(faster_report, report, keep, details)
    return faster, faster_report


def _rows_as_chosen(faster_report: Report, report: Report, keep: Mapping[str, str], details: Mapping[str, str]) -> None:
    """The rows of a model fused again keep what the first pass proved and chose (mask kind, head
    dim, key length, the form's reason); a kept row says why from ``details``."""
    for block, before in zip(faster_report.blocks, report.blocks):
        block.key_len = before.key_len
        if block.fused:
            block.reason, block.detail, block.fused_from = before.reason, before.detail, before.fused_from
        elif block.name in keep:
            block.mask_kind, block.dtype = before.mask_kind, before.dtype
            block.heads, block.kv_heads, block.head_dim = before.heads, before.kv_heads, before.head_dim
            block.detail = details.get(block.name, "")
    faster_report.notes += [n for n in report.notes if n not in faster_report.notes]


def _scope_of(name: str) -> str:
    """The subgraph prefix of a report row's name ("If_0.then_branch/"), "" in the main graph."""
    for marker in ("_branch/", ".body/", ".branches["):
        if marker in name:
            return name[: name.index(marker) + len(marker)]
    return ""


def _in_if_branches(name: str) -> bool:
    """Whether a report row's block is in the main graph or in If branches only, at any depth (not
    in a Loop or Scan body, whose If's sides verify cannot read)."""
    return ".body/" not in name and ".branches[" not in name


def _check_target(target: str | None, ep: str | None) -> None:
    if target is not None and target != AUTO and target not in TARGETS:
        raise OrtflashError(f"target must be one of {', '.join((*TARGETS, AUTO))}, got {target!r}")
    if ep is not None and ep not in PROVIDERS:
        raise OrtflashError(f"ep must be one of {', '.join(EXECUTION_PROVIDERS)}, got {ep!r}")
    if target == AUTO and ep is None:
        raise OrtflashError(f"target auto picks per execution provider: name one ({', '.join(EXECUTION_PROVIDERS)})")
    if ep is not None and target not in (None, AUTO):
        raise OrtflashError(
            f"ep={ep!r} picks the target, so it goes with target='auto' or no target, not with target={target!r}"
        )


def _model_folder(model_or_path: ModelLike) -> str | None:
    """The folder of a model given as a path (where its external data is), else None."""
    if isinstance(model_or_path, (str, os.PathLike)):
        return os.path.dirname(os.path.abspath(os.fspath(model_or_path)))
    return None


def _default_load_check(model_or_path: ModelLike, original: onnx.ModelProto) -> LoadCheck:
    """Opened in ONNX Runtime at its default optimization level; lowered models run once on random inputs."""
    weights_dir = _model_folder(model_or_path)

    def check(model: onnx.ModelProto, report: Report) -> str | None:
        from ..checks.feeds import make_feeds
        from .first_run import load_check

        return load_check(original, lambda: make_feeds(original), weights_dir=weights_dir)(model, report)

    return check


def _lower_for(fused: FusedModel, target: str) -> tuple[onnx.ModelProto, Report]:
    """The fused model written for one target (lowered on a clone of it), serialized once, with its
    own copy of the report."""
    if fused.model is None:
        report = copy.deepcopy(fused.report)
        out = loadable_ir_version(_lower_already_fused(fused.original, report, target, fused.folder), report.notes)
        report.rewritten = out is not fused.original
        return out, report
    model, report, notes = lowered_for(fused, target)
    report.notes += notes
    # onnx's make_model stamps IR versions newer than ONNX Runtime reads (ir_versions.py)
    return loadable_ir_version(written(fused, model), report.notes), report


def _lower_already_fused(model: onnx.ModelProto, report: Report, target: str, folder: str | None) -> onnx.ModelProto:
    """The FlashAttention nodes a model with nothing left to fuse already has (an ortflash output
    optimized again) lowered for a target that runs without ortflash, as ortflash.lower does
    (issue 33 item 13: they were written back unchanged); a node the target cannot lower stays,
    and optimize refuses the model for a target asked for by name (_refuse_flash_left)."""
    if REGISTRY[target].needs_ortflash or not flash_nodes(model):
        return model
    out, notes = lower(model, target, folder)
    lowered = [n.op for n in notes if n.lowered]
    if lowered:
        ops = ", ".join(f"{lowered.count(op)} {op}" for op in sorted(set(lowered)))
        report.notes.append(f"the model's {len(lowered)} FlashAttention node(s) lowered for --target {target} ({ops})")
    report.notes += [f"{_NOT_LOWERED}{n.node_name}: {n.reason}" for n in notes if not n.lowered]
    return out


_NOT_LOWERED = "a FlashAttention node the model already had was not lowered: "


def _refuse_flash_left(model: onnx.ModelProto, report: Report, target: str) -> None:
    """A portable target asked for by name never writes a FlashAttention node: those the input
    already had and the target cannot lower make the model one to optimize from its original."""
    left = flash_nodes(model)
    if not left or REGISTRY[target].needs_ortflash:
        return
    why = next((n[len(_NOT_LOWERED) :] for n in report.notes if n.startswith(_NOT_LOWERED)), left[0].name)
    raise OrtflashError(
        f"the model already has {len(left)} FlashAttention node(s) (an ortflash output) that --target {target} "
        f"cannot lower ({why.split('; ')[0]}): optimize the model from before ortflash with --target {target}, "
        "or run this one with ortflash.session_options()"
    )
