"""ortflash.optimize: the whole pass from a model to a model with FlashAttention nodes (or, with a
target, with the native ops they lower to), and the choice of target where the user leaves it open."""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import MappingProxyType

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from . import forms, spec
from .errors import OrtflashError
from .fusion.emit import BLOCK_ID, GIVEN_HEADS
from .fusion.onnx_attention import fuse_attention_ops
from .fusion.walker import fuse_softmax_blocks
from .graph import ir_utils as u
from .graph import shapes
from .ir_versions import stamp_loadable_ir_version
from .lowering import LoweringNote, lower
from .lowering import head_count as given_heads
from .lowering.targets import DEFAULT_TARGET, EP_ORDER, EXECUTION_PROVIDERS, ORT_KERNEL_TARGETS, REGISTRY, TARGETS
from .model_io import ModelLike, check_opsets, load, save
from .model_shapes import graphs_of, with_shapes
from .policy import SoftmaxPolicy
from .report import Report, TargetChoice
from .tune import TuneSettings

__all__ = ["AUTO", "EP_TARGETS", "EXECUTION_PROVIDERS", "LoadCheck", "OrtflashError", "load", "optimize", "save"]

AUTO = "auto"  # target: the first of EP_ORDER[ep] that loads and lowers every fused block
EP_TARGETS = EP_ORDER  # the name the CLI and earlier releases use

# Why ONNX Runtime cannot load (or, lowered, run once) a candidate model; None when it can.
LoadCheck = Callable[[onnx.ModelProto, Report], "str | None"]


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
    tune: TuneSettings | None = None,
) -> tuple[onnx.ModelProto, Report]:
    """Fuse every provable attention block into FlashAttention, in every graph of the model
    (If branches, Loop and Scan bodies included: their rows are named ``If_0.then_branch/...``).

    Returns the new model and a Report with one Block per Softmax; when nothing is fused, the
    input model itself (never a rewritten copy). Shapes come from ONNX shape inference, or
    ONNX Runtime's symbolic one where ONNX's leaves ranks unknown (``Report.shape_inference``).
    The softmax policy comes from ``policy``, else ``softmax`` (naive|online|auto), else the
    proposal's switch ``online_softmax`` (True -> auto, False/None -> naive).

    ``target``: ``ortflash``, ``contrib``, ``onnx`` (any of ``lowering.TARGETS``); ``"auto"``
    with ``ep`` (``cpu | cuda | webgpu``): the first target of ``EP_ORDER[ep]`` that lowers every
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
    fastest where it runs (ortflash/forms.py): the chosen target's op where the measured cost
    table says it beats the original ops at the block's key length (its static length, else
    every one of ``seq_lens``), else the original ops, with the reason on its row. A target
    asked for by name is written as asked. ``tune`` (ortflash/tune.py) times the candidates on
    this machine at ``seq_lens`` (or the model's fixed size) instead, and keeps the fastest.
    """
    if policy is None:
        try:
            policy = SoftmaxPolicy.for_new_nodes(softmax, online_softmax, block_size, min_seq_len)
        except spec.SpecError as exc:
            raise OrtflashError(str(exc)) from None
    if target is None and ep is not None:
        target = AUTO  # naming the execution provider is asking for the target that fits it
    _check_target(target, ep)
    if tune is not None and target not in (None, AUTO):
        raise OrtflashError(
            f"--tune chooses a block's form where the target is left open; --target {target} is written as asked"
        )
    if tune is not None and ep not in (None, "cpu"):
        raise OrtflashError(f"--tune measures on ONNX Runtime's CPU EP, here; --ep {ep} runs elsewhere")
    if num_heads is not None and num_heads < 1:
        raise OrtflashError(f"num_heads must be a positive integer, got {num_heads}")
    proto = load(model_or_path)
    check_opsets(proto)

    shaped = with_shapes(proto)  # once: the second fusion, with blocks kept, reads the same shapes
    fused, fusion_report = _fuse(proto, shaped, policy, num_heads, prove_causal)
    if isinstance(model_or_path, (str, os.PathLike)):
        fusion_report.model = os.fspath(model_or_path)  # the report is titled with the file the user named

    def run(candidate: str) -> tuple[onnx.ModelProto, Report]:
        return _lower_for(proto, fused, fusion_report, candidate)

    if target is not None and target != AUTO:
        model, report = run(target)
        report.target = TargetChoice(requested=target, ep=ep, chosen=target, why="asked for")
        return model, report
    check = load_check or _default_load_check(model_or_path, proto)
    if target == AUTO:
        assert ep is not None
        model, report = _choose_for_ep(ep, run, check)
    else:
        model, report = _choose_default(run, check)
    if seq_lens is not None and (not seq_lens or min(seq_lens) < 1):
        raise OrtflashError(f"seq_lens must be positive key lengths, got {list(seq_lens)}")
    faster = _fastest_forms(proto, shaped, policy, num_heads, prove_causal, (model, report), seq_lens, check, ep)
    if tune is None:
        return faster
    return _tuned(
        model_or_path, proto, shaped, policy, num_heads, prove_causal, (model, report), faster, tune, ep, target
    )


def _tuned(
    model_or_path: ModelLike,
    proto: onnx.ModelProto,
    shaped: tuple[onnx.ModelProto, str],
    policy: SoftmaxPolicy,
    num_heads: int | None,
    prove_causal: bool,
    every_block: tuple[onnx.ModelProto, Report],
    by_table: tuple[onnx.ModelProto, Report],
    settings: TuneSettings,
    ep: str | None,
    target: str | None,
) -> tuple[onnx.ModelProto, Report]:
    """Of the original, every block fused and the cost table's choice, the one measured fastest
    here (ortflash/tune.py); each fused row and the target's why say what was measured."""
    from . import tune

    (fused_model, fused_report), (table_model, table_report) = every_block, by_table
    candidates: dict[str, tuple[onnx.ModelProto, Report]] = {}
    if fused_report.fused:
        candidates["fused"] = every_block
    if table_report.fused and table_model is not fused_model:
        candidates["table"] = by_table
    if not candidates:
        return by_table  # nothing fused, nothing to time
    dynamic = [b.name for b in fused_report.blocks if b.fused and b.key_len is None]
    if not settings.seq_lens and dynamic:
        raise OrtflashError(
            f"--tune times the model at the lengths it runs at: give --seq-lens (block {dynamic[0]}'s key length "
            "is known only at run time)"
        )
    key = tune.cache_key(proto, ep=ep or "cpu", seq_lens=settings.seq_lens, policy=policy.mode or "", target=target)
    weights_dir = (
        os.path.dirname(os.path.abspath(os.fspath(model_or_path)))
        if isinstance(model_or_path, (str, os.PathLike))
        else None
    )
    measured = tune.measure(
        proto, {label: m for label, (m, _) in candidates.items()}, settings, key=key, weights_dir=weights_dir
    )
    why = measured.why()
    if measured.chosen == tune.ORIGINAL:
        keep = {b.name: f"kept the original ops: {why}" for b in fused_report.blocks if b.fused}
        _, report = _fuse(proto, shaped, policy, num_heads, prove_causal, keep=keep)
        report.model, report.notes = fused_report.model, list(fused_report.notes)
        assert fused_report.target is not None
        report.target = dataclasses.replace(fused_report.target, why=f"{fused_report.target.why}; {why}")
        return proto, report
    model, report = candidates[measured.chosen]
    for block in report.blocks:
        if block.fused:
            block.reason = "; ".join(filter(None, [block.reason, why]))
    assert report.target is not None
    report.target = dataclasses.replace(report.target, why=f"{report.target.why}; {why}")
    return model, report


def _fastest_forms(
    proto: onnx.ModelProto,
    shaped: tuple[onnx.ModelProto, str],
    policy: SoftmaxPolicy,
    num_heads: int | None,
    prove_causal: bool,
    chosen: tuple[onnx.ModelProto, Report],
    seq_lens: Sequence[int] | None,
    check: LoadCheck,
    ep: str | None,
) -> tuple[onnx.ModelProto, Report]:
    """The chosen target's model with every block the cost table says is slower fused than as it
    was left as it was (fused again without them); each row says why it took its form."""
    model, report = chosen
    assert report.target is not None
    target = report.target.chosen
    keep: dict[str, str] = {}
    for block in report.blocks:
        if not block.fused:
            continue
        # a block the chosen target did not lower is a FlashAttention node: its form is ortflash's
        form = target if block.lowered_to else DEFAULT_TARGET
        lengths = list(seq_lens) if seq_lens else ([block.key_len] if block.key_len else None)
        choice = forms.choose(form, policy, block.head_dim, lengths, block.mask_kind or "padding", ep)
        if choice.fused:
            block.reason = "; ".join(filter(None, [block.reason, choice.why]))
        else:
            keep[block.name] = choice.why
    if not keep:
        return model, report
    fused, fusion_report = _fuse(proto, shaped, policy, num_heads, prove_causal, keep=keep)
    fusion_report.model = report.model
    faster, faster_report = _lower_for(proto, fused, fusion_report, target)
    for block, before in zip(faster_report.blocks, report.blocks):
        block.key_len = before.key_len
        if block.fused:
            block.reason = before.reason
    faster_report.notes += [n for n in report.notes if n not in faster_report.notes]
    if faster_report.fused and faster is not proto:
        problem = check(faster, faster_report)
        if problem is not None:  # the subset fails where the whole loaded: say so, keep the whole
            report.notes.append(f"the original ops were not kept where faster: {problem}")
            return model, report
    kept_all = "every fused block" if len(keep) == report.fused else f"{len(keep)} of {report.fused} fused blocks"
    faster_report.target = dataclasses.replace(
        report.target,
        why=f"{report.target.why}; {kept_all} then kept the original ops, faster there (ortflash/forms.py)",
    )
    return faster, faster_report


def _check_target(target: str | None, ep: str | None) -> None:
    if target is not None and target != AUTO and target not in TARGETS:
        raise OrtflashError(f"target must be one of {', '.join((*TARGETS, AUTO))}, got {target!r}")
    if ep is not None and ep not in EP_ORDER:
        raise OrtflashError(f"ep must be one of {', '.join(EXECUTION_PROVIDERS)}, got {ep!r}")
    if target == AUTO and ep is None:
        raise OrtflashError(f"target auto picks per execution provider: name one ({', '.join(EXECUTION_PROVIDERS)})")
    if ep is not None and target not in (None, AUTO):
        raise OrtflashError(
            f"ep={ep!r} picks the target, so it goes with target='auto' or no target, not with target={target!r}"
        )


def _default_load_check(model_or_path: ModelLike, original: onnx.ModelProto) -> LoadCheck:
    """Opened in ONNX Runtime at its default optimization level; lowered models run once on random inputs."""
    weights_dir = (
        os.path.dirname(os.path.abspath(os.fspath(model_or_path)))
        if isinstance(model_or_path, (str, os.PathLike))
        else None
    )

    def check(model: onnx.ModelProto, report: Report) -> str | None:
        from .checks.feeds import make_feeds
        from .pipeline.first_run import load_check

        return load_check(original, lambda: make_feeds(original), weights_dir=weights_dir)(model, report)

    return check


def _unlowered(report: Report, rows: list[int] | None = None) -> list[str]:
    """Names of the fused blocks (of ``rows``, default all) that stay FlashAttention."""
    chosen = range(len(report.blocks)) if rows is None else rows
    return [report.blocks[i].name for i in chosen if report.blocks[i].needs_ortflash]


def _choose_for_ep(
    ep: str, run: Callable[[str], tuple[onnx.ModelProto, Report]], check: LoadCheck
) -> tuple[onnx.ModelProto, Report]:
    """The first target of EP_ORDER[ep] (those this ortflash has) that lowers every fused block
    and loads; else the loadable candidate keeping the fewest blocks FlashAttention."""
    candidates = [t for t in EP_ORDER[ep] if t in TARGETS]
    tried: list[str] = []
    fallback: tuple[onnx.ModelProto, Report, str] | None = None
    first: tuple[onnx.ModelProto, Report] | None = None
    for candidate in candidates:
        model, report = run(candidate)
        first = first or (model, report)
        if not report.fused:
            report.target = TargetChoice(AUTO, ep, candidate, "no block fused: the model is unchanged", tried)
            return model, report
        kept = [] if REGISTRY[candidate].needs_ortflash else _unlowered(report)
        problem = check(model, report)
        if problem is None and not kept:
            why = f"the first of {', '.join(candidates)} (the order for {ep}) that lowers every block and loads"
            report.target = TargetChoice(AUTO, ep, candidate, why, tried)
            return model, report
        if problem is not None:
            tried.append(f"{candidate}: ONNX Runtime cannot take it ({problem})")
            continue
        tried.append(f"{candidate}: {len(kept)} of {report.fused} fused blocks not lowered ({', '.join(kept[:3])})")
        if fallback is None or len(kept) < len(_unlowered(fallback[1])):
            fallback = model, report, candidate
    if fallback is None:  # the caller's own load check says why, with nothing written (exit 1 in the CLI)
        assert first is not None
        model, report = first
        why = f"ONNX Runtime cannot load the model for any of {', '.join(candidates)}"
        report.target = TargetChoice(AUTO, ep, candidates[0], why, tried)
        return model, report
    model, report, candidate = fallback
    staying = len(_unlowered(report))
    if staying == report.fused:
        why = (
            f"no target of {', '.join(candidates)} lowers any block: written for {candidate}, the first that loads, "
            f"with all {staying} fused block(s) FlashAttention (they need ortflash, on the CPU)"
        )
    else:
        why = (
            f"no target of {', '.join(candidates)} lowers every block; {candidate} lowers the most, "
            f"and {staying} block(s) stay FlashAttention (they need ortflash, on the CPU)"
        )
    # the chosen one is said in `why`; `tried` lists the others passed over
    others = [t for t in tried if not t.startswith(f"{candidate}:")]
    report.target = TargetChoice(AUTO, ep, candidate, why, others)
    return model, report


def _choose_default(
    run: Callable[[str], tuple[onnx.ModelProto, Report]], check: LoadCheck
) -> tuple[onnx.ModelProto, Report]:
    """ortflash; where fused blocks feed a quantizer, contrib or else onnx when it lowers every such block
    and loads: there a float32 rounding difference can become a different integer downstream."""
    model, report = run(DEFAULT_TARGET)
    sensitive = [i for i, b in enumerate(report.blocks) if b.fused and b.rounding]
    if not sensitive:
        report.target = TargetChoice(None, None, DEFAULT_TARGET, "the default")
        return model, report
    names = ", ".join(report.blocks[i].name for i in sensitive[:3]) + (" ..." if len(sensitive) > 3 else "")
    tried: list[str] = []
    for candidate in ORT_KERNEL_TARGETS:
        lowered_model, lowered_report = run(candidate)
        kept = _unlowered(lowered_report, sensitive)
        problem = None if kept else check(lowered_model, lowered_report)
        if not kept and problem is None:
            why = (
                f"{len(sensitive)} fused block(s) feed a quantizer ({names}), where a float32 rounding "
                f"difference can flip an integer downstream: {candidate} lowers them all to ONNX Runtime's "
                "own ops, which matched the original graph bit for bit on the CPU EP where measured; "
                "ortflash's kernel rounds differently (--target ortflash keeps it)"
            )
            lowered_report.target = TargetChoice(None, None, candidate, why, tried)
            return lowered_model, lowered_report
        tried.append(
            f"{candidate}: "
            + (f"does not lower {', '.join(kept[:3])}" if kept else f"ONNX Runtime cannot take it ({problem})")
        )
    why = (
        f"{len(sensitive)} fused block(s) feed a quantizer ({names}), but neither contrib nor onnx lowers "
        "them all and loads: they stay FlashAttention; check with real inputs (--verify --feeds)"
    )
    report.target = TargetChoice(None, None, DEFAULT_TARGET, why, tried)
    return model, report


def _fuse(
    proto: onnx.ModelProto,
    shaped: tuple[onnx.ModelProto, str],
    policy: SoftmaxPolicy,
    num_heads: int | None,
    prove_causal: bool = True,
    keep: Mapping[str, str] = MappingProxyType({}),
) -> tuple[onnx.ModelProto, Report]:
    """Every block fused, once, whatever the target: the fused model (its inferred value_info kept,
    for the lowerings to prove from) and the report; the input itself when nothing is fused.
    ``shaped``: ``with_shapes(proto)``, the model with inferred shapes and how they were inferred.
    ``keep``: report names of blocks left as they are, each with the reason for its row."""
    from .pipeline.rounding import mark_rounding_sensitive

    # Opset conversions a target needs (to 13 for contrib/webgpu, 23 for onnx) happen in lower(),
    # after fusion: converting first lets the 12 -> 13 adapter wrap Softmax in Reshapes where
    # shapes are unknown, and then no block fuses.
    opset = u.default_opset(proto)
    with_inferred, inference = shaped
    model = ir.serde.deserialize_model(with_inferred)
    report = Report(proto.graph.name or "model", shape_inference=inference)
    for graph, scope in _scopes(model.graph, ""):
        _forget_earlier_blocks(graph)
        # ONNX Attention ops (opset 23+) first: their Softmax is inside the op, not in the graph.
        here = {name[len(scope) :]: why for name, why in keep.items() if name.startswith(scope)}
        rows = fuse_attention_ops(graph, opset, policy, first_row=len(report.blocks), keep=here)
        rows += fuse_softmax_blocks(
            graph, opset, policy, first_row=len(report.blocks) + len(rows), prove_causal=prove_causal, keep=here
        )
        for row in rows:
            row.name = scope + row.name
        report.blocks += rows
        _prove_heads(graph, report, num_heads)

    for block in report.blocks:  # rows not fused: what the rules read, where it is a number
        block.heads, block.kv_heads, block.head_dim = (
            d if isinstance(d, int) else None for d in (block.heads, block.kv_heads, block.head_dim)
        )
    if not report.fused:
        # Nothing to write differently: the input itself, not a round trip of it through the IR
        # (which would carry inferred shapes that change what ONNX Runtime's optimizer does).
        return proto, report
    common_passes.RemoveUnusedNodesPass()(model)  # subgraphs included
    model.opset_imports.setdefault(spec.DOMAIN, spec.DOMAIN_VERSION)
    out = ir.serde.serialize_model(model)
    out.ir_version = proto.ir_version
    mark_rounding_sensitive(out, report)
    return out, report


def _lower_for(
    original: onnx.ModelProto, fused: onnx.ModelProto, fusion_report: Report, target: str
) -> tuple[onnx.ModelProto, Report]:
    """The fused model written for one target, with its own copy of the report."""
    report = copy.deepcopy(fusion_report)
    if not report.fused:
        return original, report
    out = fused
    if not REGISTRY[target].needs_ortflash:
        # the lowering proves from the shapes the rules proved from (subgraphs' included)
        before = u.default_opset(fused)
        out, notes = lower(fused, target)
        _note_lowering(report, notes, target)
        after = u.default_opset(out)
        if after != before:
            report.notes.append(
                f"raised the default opset from {before} to {after} for --target {target}, op by op (lowering/opset.py)"
            )
    if out is fused:  # the fused model is shared by every candidate: write on a copy
        out = onnx.ModelProto()
        out.CopyFrom(fused)
    _strip_given_head_counts(out)
    _keep_declared_value_info(original, out)
    try:  # onnx's make_model stamps IR versions newer than ONNX Runtime reads (ir_versions.py)
        out, stamped = stamp_loadable_ir_version(out)
    except OrtflashError:
        stamped = None  # the model needs the newer IR version: the load check says ONNX Runtime cannot take it
    if stamped is not None:
        report.notes.append(stamped)
    return out, report


def _prove_heads(graph: ir.Graph, report: Report, num_heads: int | None) -> None:
    """Heads, kv heads and head dim of each block fused in ``graph``, as numbers where the fused
    node's operands prove them (resolved through Reshapes, Transposes and computed shapes, which
    the rules' own reading leaves symbolic in TorchScript exports), else None.

    ``num_heads`` fills the query head count where nothing proves it; where something does and
    it differs, OrtflashError. The given count is recorded on the node, for Q, and for K and V
    where their head dim is the same unknown as Q's (``GIVEN_HEADS``): a lowering, whose ops
    take the count as a number, writes it there (lowering/head_count.py).
    """
    for node in list(graph):
        if node.domain != spec.DOMAIN or node.op_type != spec.OP_TYPE or BLOCK_ID not in node.metadata_props:
            continue
        row = int(node.metadata_props[BLOCK_ID])
        block = report.blocks[row]
        three_d = block.heads == "B·H"  # [B·H, S, D]: the node sees one head per batch-head pair
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
        node.metadata_props[GIVEN_HEADS] = given_heads.encode(num_heads, marked)


def _mask_kind(node: ir.Node) -> str:
    """The cost table's row for a fused node (forms.MASK_KINDS): what it reads besides Q, K and V."""
    rows: list[int | None] = []
    for value in node.inputs[3:5]:
        constant = u.const_array(value)
        if value is None or (constant is not None and constant.size == 1):
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


def _strip_given_head_counts(model: onnx.ModelProto) -> None:
    """The head-count marks are for the lowerings of this run only; what is written keeps none."""
    for graph in graphs_of(model.graph):
        for node in graph.node:
            kept = [p for p in node.metadata_props if p.key != GIVEN_HEADS]
            if len(kept) != len(node.metadata_props):
                del node.metadata_props[:]
                node.metadata_props.extend(kept)


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
        block.lowered_to = note.op if note.lowered else None
        if not note.lowered:
            block.reason = "; ".join(filter(None, [block.reason, f"not lowered to {target}: {note.reason}"]))
