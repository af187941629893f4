"""Lower FlashAttention nodes to native ops: ONNX Runtime's contrib ops, standard ONNX, or the
forms its WebGPU and CUDA execution providers run on the GPU.

read.py reads a node back into its FlashAttentionCall (op/node.py's read_node) with what the native
ops refuse; contrib.py, standard.py, webgpu.py and cuda.py write the target ops (native.py the
nodes they share, layout.py what they need around them, cache.py a KV-cache append moved into
them); head_count.py writes a given head count where they need it; targets.py is the registry of
targets; this module runs the pass.

    model, notes = lower(model, "contrib")   # or any of TARGETS; "ortflash": no change

Targets (``--target``; docs/targets.md, "Targets"; the preconditions in words: docs/rules.md,
"The lowerings"):

- ``ortflash``: nothing changes; FlashAttention runs through ``ortflash.session_options()``.
- ``contrib``: ONNX Runtime's ``com.microsoft`` MultiHeadAttention; GroupQueryAttention for
  causal grouped-query blocks (and causal soft-capped ones) and for grouped-query blocks with a KV
  cache, where it provably computes the same.
- ``onnx``: the standard ``Attention`` op; the model's default opset is converted to 23.
- ``webgpu`` and ``cuda``: the forms the WebGPU (CUDA) EP runs on the GPU and right, chosen per
  block from its measured capability table (webgpu.py, cuda.py, which say what was measured).

A node is lowered only where the target op computes exactly what FlashAttention computes
(``ortflash/op/spec.py``), up to float32 rounding. Otherwise it stays a FlashAttention node, the
model still needs ortflash to run, and its LoweringNote says why. What the rules rest on was
measured on ONNX Runtime 1.31 (CPU EP) and is pinned by tests/test_lower.py:

- MultiHeadAttention: query 3D [B, S, N·H]; key/value 3D, or 4D BNSH when key and value have
  the same shape; ``attention_bias`` must be 4D [B|1, N|1, Sq, Sk] (Sq and Sk not broadcast);
  it is added to ``scale·QKᵀ``. A row whose scores are all -inf gives NaN; a row of
  float32-lowest scores gives the uniform average (no special case). ``unidirectional`` is
  top-left aligned when Sq >= Sk but not when Sq < Sk (the last query row then sees every key),
  so causality is always written into ``attention_bias`` instead. Float16 runs on the CPU EP.
- GroupQueryAttention (no past): needs Sq == Sk, equal key/value head sizes and (CPU EP) a
  head size that is a multiple of 8; causal with
  ``seqlens_k = Sk - 1`` for every row is then the top-left mask; softcap is applied before
  ``attention_bias``; all -inf rows give NaN, like MHA.
- ONNX Attention (opset 23): 4D Q/K/V, native GQA, V's head size free, softcap before the mask;
  ``is_causal`` is top-left aligned without past (Sq < Sk and Sq > Sk checked); ``attn_mask``
  must be 2D-4D with its last two dims exactly [Sq, Sk]. A row whose scores are all -inf gives
  zeros (the opset-23 errata; NaN before it), and so does a row whose maximum is float32-lowest
  (ONNX Runtime uses lowest as its own mask sentinel) where the ONNX reference gives the uniform
  average. So the lowering writes fully masked rows out itself (Where on ReduceMax(mask) ==
  -inf: NaN, or zeros after a NaN guard) and moves float32-lowest mask values one float up
  (the same for softmax, not the sentinel).

KV cache (cache.py): a node whose K and V are ``Concat(past, new)`` on the sequence axis, the
Concat outputs returned as present outputs, hands the append to the native op. The FlashAttention
op itself keeps its five inputs (Q, K, V, bias, mask): the onnxruntime-extensions bridge cannot
take optional inputs, and more inputs would break every model fused earlier; the lowering owns
the cache instead. Measured on ONNX Runtime 1.31 (CPU EP), pinned by tests/test_kv_cache.py:

- GroupQueryAttention with past (grouped-query blocks): present = Concat(past, new) exactly;
  ``seqlens_k`` = past + new - 1 for every row and ``total_sequence_length`` = past + new make
  every key visible; its causal mask (attribute absent) is bottom-right (is_causal 2); with
  ``causal=0`` and ``attention_bias`` it is the plain biased softmax. With a bias or mask and its
  own causal mask, a row whose visible keys are all masked is not NaN as in FlashAttention, so
  causality then goes into ``attention_bias`` with ``causal=0``. Its CPU kernel refuses a batch
  > 1 with several new tokens after a non-empty past (an error, never other numbers); prefill
  (past 0) and decode (1 new token) run, and the note says so.
- MultiHeadAttention with past_key/past_value (blocks with as many key/value heads as query
  heads): present = Concat(past, new), any batch, past and new lengths; causality in the bias.
- Attention-23 with past_key/past_value: present = Concat(past, new); ``is_causal=1`` is
  bottom-right with a past (top-left without one), so is_causal 2 is native with a past and
  where Sq == Sk without one, and otherwise folded into the mask with its alignment.

``bias_after_mask`` (the bias added after the mask and causal fills) lowers as the additive bias
``bias + where(keep, 0, fill)``: a masked score is then s + (fill + bias) where FlashAttention
gives fill + bias, the same wherever fill + bias absorbs s: fill -inf, or a bias bounded above
(graph/bounds) with fill + bound <= -2**127. Otherwise the node stays.

Exactness of the additive form: FlashAttention *replaces* masked scores with ``mask_fill``;
native ops *add* a bias. With ``mask_fill = -inf`` that is the same (s + -inf = -inf). A finite
fill at or below -2**127 (float32-lowest, as transformers writes) is absorbed too: s + fill rounds
to a number that softmax treats exactly as fill for |s| < 2**103. A smaller finite fill (-1e4,
-1e9) is not: rows whose keys are all masked give the mean of V in FlashAttention and something
else natively, so such blocks stay.

Also: a NaN guard (``masked_rows = "zero"``) on the contrib ops is Where(IsNaN(out), 0, out),
exact for finite V; float16 blocks keep the exact casts around the node and lower in float32;
grouped-query blocks that GroupQueryAttention does not provably compute go to
MultiHeadAttention with K/V heads repeated (Unsqueeze/Expand/Reshape, query head h reading kv
head h // (Hq/Hkv)); a negative scale stays (both native ops take positive scales only).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from ..errors import NotLowered, OrtflashError
from ..graph import ir_utils as u
from ..graph.emitter import Emitter
from ..model_io import graphs_of
from ..model_shapes import with_flash_shapes
from ..op import spec
from ..op.node import BLOCK_ID, flash_nodes
from ..pipeline.opset import raise_default_opset
from .contrib import CONTRIB_DOMAIN, OP_GQA, OP_MHA
from .head_count import GivenHeads, write_given_head_counts
from .read import read_call
from .standard import ONNX_ATTENTION_OPSET, ONNX_IR_VERSION, OP_ATTENTION
from .targets import REGISTRY, TARGETS, Target

__all__ = [
    "CONTRIB_DOMAIN",
    "OP_ATTENTION",
    "OP_GQA",
    "OP_MHA",
    "TARGETS",
    "LoweringNote",
    "Target",
    "lower",
    "lower_ir",
]

_NEEDS_ORTFLASH = "the model still needs ortflash (ortflash.session_options()) to run"
_MESSAGE_CHARS = 160  # of a converter error, in a note


@dataclass(frozen=True)
class LoweringNote:
    """One FlashAttention node: lowered to ``op``, or kept (op ``FlashAttention``) and why.

    ``block`` is the report row the node stands for, as ortflash.optimize recorded it in the
    node's metadata (None for nodes written by other tools)."""

    node_name: str
    lowered: bool
    reason: str
    op: str
    block: str | None = None

    def __str__(self) -> str:
        state = f"lowered to {self.op}" if self.lowered else "kept as FlashAttention"
        return f"{self.node_name}: {state}" + (f" ({self.reason})" if self.reason else "")


def lower(
    model: onnx.ModelProto,
    target: str,
    folder: str | os.PathLike[str] | None = None,
    given_heads: Mapping[int, GivenHeads] = MappingProxyType({}),
) -> tuple[onnx.ModelProto, list[LoweringNote]]:
    """Replace every FlashAttention node the target op computes exactly; notes for all of them.

    A model given as a proto (a file ortflash wrote, or another tool's) carries no type for the
    FlashAttention outputs, so its shapes are inferred first (model_shapes.with_flash_shapes); the
    pipeline hands its fused model, typed once for all candidates, to ``lower_ir`` instead.
    The input model is not modified. When nothing is lowered the input model itself comes back.
    ``folder``: where the model's external data is (its file's folder), for the small external
    constants (a Reshape's shape) the head counts are proved from; None reads none of them.
    ``given_heads``: the head counts the user gave (``--num-heads``), by report row, as fusion
    returned them (pipeline/fused_rows.prove_heads); written where the target's ops need them.
    """
    record = _record(target)
    kept = [_kept_note(n, i) for i, n in enumerate(flash_nodes(model))]
    if not kept:
        return model, []
    if record.write is None:
        return model, [_with_reason(n, _keeps(record)) for n in kept]
    work = ir.serde.deserialize_model(model)
    out, notes = _lowered(work, record, folder, given_heads, infer_shapes=True)
    if out is None:
        return model, notes
    proto = ir.serde.serialize_model(out)
    declared = {vi.name for g in graphs_of(model.graph) for vi in g.value_info}
    for out_graph in graphs_of(proto.graph):
        kept_info = [vi for vi in out_graph.value_info if vi.name in declared]
        del out_graph.value_info[:]
        out_graph.value_info.extend(kept_info)
    return proto, notes


def lower_ir(
    model: ir.Model,
    target: str,
    folder: str | os.PathLike[str] | None = None,
    given_heads: Mapping[int, GivenHeads] = MappingProxyType({}),
) -> tuple[ir.Model, list[LoweringNote]]:
    """``lower`` on a model in memory already typed, FlashAttention outputs included (the pipeline's
    ``FusedModel.typed``, inferred once for every candidate): no shape inference and no proto here,
    but where the default opset is raised (pipeline/opset.py takes protos). Works on a clone; the
    input itself comes back where nothing is lowered."""
    record = _record(target)
    kept = [_kept_note(n, i) for i, n in enumerate(flash_nodes(model.graph))]
    if not kept:
        return model, []
    if record.write is None:
        return model, [_with_reason(n, _keeps(record)) for n in kept]
    out, notes = _lowered(_clone(model), record, folder, given_heads, infer_shapes=False)
    return (model if out is None else out), notes


def _clone(model: ir.Model) -> ir.Model:
    """A copy to lower. onnx_ir's clone refuses a value no node of the graph produces that is not
    one of its inputs or initializers (an initializer a model reads but does not list, which ONNX
    Runtime accepts as the proto path always did): such a model is copied through its proto."""
    try:
        return model.clone()
    except (RuntimeError, ValueError):
        return ir.serde.deserialize_model(ir.serde.serialize_model(model))


def _record(target: str) -> Target:
    record = REGISTRY.get(target)
    if record is None:
        raise OrtflashError(f"unknown lowering target {target!r}: use one of {', '.join(TARGETS)}")
    return record


def _keeps(record: Target) -> str:
    return f"target {record.name} keeps FlashAttention; it runs with ortflash.session_options()"


def _lowered(
    work: ir.Model,
    record: Target,
    folder: str | os.PathLike[str] | None,
    given_heads: Mapping[int, GivenHeads],
    infer_shapes: bool,
) -> tuple[ir.Model | None, list[LoweringNote]]:
    """Lower ``work`` (the caller's own copy) in place; None where no node is lowered (or the opset
    could not be raised), with the notes. ``infer_shapes``: type the model first (a proto from
    outside, whose FlashAttention outputs have no type)."""
    write = record.write
    assert write is not None
    ir_version = work.ir_version
    if record.needs_head_count:
        write_given_head_counts(work, given_heads)
    # Converted after fusion: no Softmax is left for the 12 -> 13 adapter to wrap in reshapes
    # (it does where it cannot see the rank, as in models without shapes).
    least = record.min_opset
    source_opset = _default_opset(work)
    raise_to = least if least is not None and source_opset < least else None
    if raise_to is not None or infer_shapes:
        # the opset raiser and the shape inference take protos: inside the lowering, the one round trip
        proto = ir.serde.serialize_model(work)
        if raise_to is not None:
            raised, error = _raised(proto, raise_to)
            if raised is None:
                why = f"the model could not be converted to opset {raise_to} for {record.name} ({error}); {_NEEDS_ORTFLASH}"
                return None, [_with_reason(_kept_note(n, i), why) for i, n in enumerate(flash_nodes(work.graph))]
            proto = raised
        work = ir.serde.deserialize_model(with_flash_shapes(proto) if infer_shapes else proto)
    # a higher opset that only a faster form of some blocks needs (the cuda target's Attention-23):
    # raised where it can be, else those blocks are lowered at the model's own opset; their notes say which
    wanted, wanting = _opset_wanted(work, record, source_opset) if raise_to is None else (None, frozenset())
    wanted_note = ""
    if wanted is not None:
        raised, error = _raised(ir.serde.serialize_model(work), wanted)
        if raised is None:
            wanted_note = f"; the model's opset not raised to {wanted} for Attention-23 ({error})"
        else:
            work = ir.serde.deserialize_model(raised)
            wanted_note = f"; the model's default opset raised from {source_opset} to {wanted} for it"
    opset = _default_opset(work)
    graph = work.graph
    if folder is not None:
        u.root_external_data(graph, folder)

    notes: list[LoweringNote] = []
    stem = _fresh_stem(work)
    # every graph's nodes (If branches, Loop and Scan bodies too); each written into its own graph
    for index, node in enumerate(flash_nodes(graph)):
        name = node.name or f"{spec.OP_TYPE}_{index}"
        block = node.metadata_props.get(BLOCK_ID)
        owner = node.graph
        assert owner is not None
        try:
            call = read_call(node)
            op, how = write(Emitter(owner, node, f"{stem}_{index}", opset), call, node.outputs[0])
        except NotLowered as why:
            notes.append(LoweringNote(name, False, f"{why}; {_NEEDS_ORTFLASH}", spec.OP_TYPE, block))
            continue
        owner.remove(node, safe=True)
        notes.append(LoweringNote(name, True, how + (wanted_note if name in wanting else ""), op, block))

    if not any(n.lowered for n in notes):
        return None, notes
    common_passes.RemoveUnusedNodesPass()(work)
    if record.domain is not None:
        domain, version = record.domain
        work.opset_imports[domain] = version
    if not _uses_ortflash(work):
        work.opset_imports.pop(spec.DOMAIN, None)
    # Opset 23 belongs to IR 11, but IR 10 is what ONNX Runtime 1.31 and onnxruntime-web 1.30
    # load it with; a model already above 10 keeps its version.
    work.ir_version = ir_version if record.ir_version is None else max(ir_version, record.ir_version)
    if opset >= ONNX_ATTENTION_OPSET > source_opset:  # raised for Attention-23: the IR version it loads with
        work.ir_version = max(work.ir_version, ONNX_IR_VERSION)
    return work, notes


def _opset_wanted(work: ir.Model, record: Target, opset: int) -> tuple[int | None, frozenset[str]]:
    """The highest default opset a block's faster form needs (record.opset_wanted; None: none
    does), and the names of the FlashAttention nodes that want one, as the notes name them."""
    if record.opset_wanted is None:
        return None, frozenset()
    wanted: dict[str, int] = {}
    for index, node in enumerate(flash_nodes(work.graph)):
        try:
            call = read_call(node)
        except NotLowered:
            continue
        if (version := record.opset_wanted(call, opset)) is not None:
            wanted[node.name or f"{spec.OP_TYPE}_{index}"] = version
    return max(wanted.values(), default=None), frozenset(wanted)


def _raised(proto: onnx.ModelProto, version: int) -> tuple[onnx.ModelProto | None, str]:
    """(proto at default opset ``version``, its FlashAttention nodes' metadata kept, "") or (None,
    why the converter refused it)."""
    try:
        raised = raise_default_opset(proto, version)
    except Exception as exc:  # noqa: BLE001 - the converter raises several types
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:_MESSAGE_CHARS]}"
    _restore_metadata(proto, raised)
    return raised, ""


def _default_opset(model: ir.Model) -> int:
    return model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))


def _uses_ortflash(model: ir.Model) -> bool:
    """Whether a node of any graph or function is still of ortflash's domain."""
    if any(n.domain == spec.DOMAIN for n in model.graph.all_nodes()):
        return True
    return any(n.domain == spec.DOMAIN for f in model.functions.values() for n in f)


def _kept_note(node: onnx.NodeProto | ir.Node, index: int) -> LoweringNote:
    if isinstance(node, ir.Node):
        block = node.metadata_props.get(BLOCK_ID)
    else:
        block = next((p.value for p in node.metadata_props if p.key == BLOCK_ID), None)
    return LoweringNote(node.name or f"{spec.OP_TYPE}_{index}", False, "", spec.OP_TYPE, block)


def _restore_metadata(original: onnx.ModelProto, converted: onnx.ModelProto) -> None:
    """The version converter drops node metadata; copy it back onto the FlashAttention nodes,
    which it keeps with their (unique) names."""
    props = {n.name: n.metadata_props for n in flash_nodes(original) if n.name}
    for node in flash_nodes(converted):
        if node.name in props and not node.metadata_props:
            node.metadata_props.extend(props[node.name])


def _with_reason(note: LoweringNote, reason: str) -> LoweringNote:
    return LoweringNote(note.node_name, False, reason, note.op, note.block)


def _fresh_stem(model: ir.Model) -> str:
    """A name stem no node or value of the model uses yet (a model may be lowered twice)."""
    taken = set()
    for node in model.graph.all_nodes():
        taken.add(node.name or "")
        taken.update(v.name or "" for v in node.outputs)
    stem, n = "ortflash/lower", 1
    while any(t.startswith(stem + "_") for t in taken):
        n += 1
        stem = f"ortflash/lower{n}"
    return stem
