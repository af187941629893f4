"""ortflash.optimize: the whole pass from a model to a model with FlashAttention nodes."""

from __future__ import annotations

import os

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from . import spec
from .policy import SoftmaxPolicy
from .report import Block, Report
from .rewrites import ir_utils as u
from .rewrites.attention import read_block, scores_kept
from .rewrites.fuse import emit, replace_output
from .rewrites.match import AttentionMatch, NotFused
from .rewrites.lower import TARGETS, block_index, lower
from .rewrites.onnx_attention import fuse_attention_ops


class OrtflashError(Exception):
    """A problem with the user's input; the CLI prints it as one line and exits 2."""


def external_locations(model: onnx.ModelProto) -> list[str]:
    """The files a model's external initializers live in (relative to the model's folder)."""
    found = []
    for init in model.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            loc = next((e.value for e in init.external_data if e.key == "location"), None)
            if loc and loc not in found:
                found.append(loc)
    return found


def load(model_or_path) -> onnx.ModelProto:
    """Read a model without loading its external data: weights stay on disk, referenced.

    The rewrites never read weights (scales are small inline constants), so a model of
    any size is optimized in the memory its graph takes.
    """
    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path
    path = os.fspath(model_or_path)
    if not os.path.exists(path):
        raise OrtflashError(f"{path}: no such file")
    if os.path.isdir(path):
        raise OrtflashError(f"{path}: is a folder, not an ONNX model file")
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as exc:  # protobuf raises several types for a file that is not ONNX
        raise OrtflashError(f"{path}: not a readable ONNX model ({type(exc).__name__}: {str(exc)[:120]})") from None
    if not model.graph.node and not model.graph.output:
        raise OrtflashError(f"{path}: not an ONNX model (no graph in it)")
    folder = os.path.dirname(os.path.abspath(path))
    for loc in external_locations(model):
        if not os.path.isfile(os.path.join(folder, loc)):
            raise OrtflashError(f"{path}: its external data file {loc} is missing from {folder}")
    return model


def _with_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:
        return model  # shapes only help proofs; without them ranks come from the ops


def _describe(m: AttentionMatch) -> dict:
    q_shape = u.value_shape(m.q) or []
    k_shape = u.value_shape(m.k) or []
    if m.k_perm is not None and len(k_shape) == len(m.k_perm):
        k_shape = [k_shape[i] for i in m.k_perm]
    four_d = m.rank == 4 and len(q_shape) == 4
    parts = [f"bias {u.value_shape(b) or '?'}" for b in m.biases]
    parts += [("not-" if inv else "") + f"mask {u.value_shape(c) or '?'}" for c, inv in m.masks]
    if m.is_causal:
        parts.append("causal")
    if m.nan_guard:
        parts.append("NaN guard")
    return {
        "pattern": m.pattern(),
        "heads": q_shape[1] if four_d else ("B·H" if m.rank == 3 else None),
        "kv_heads": k_shape[1] if four_d and len(k_shape) == 4 else None,
        "head_dim": q_shape[-1] if q_shape else None,
        "scale": m.scale,
        "mask": ", ".join(parts) or "none",
    }


def optimize(
    model_or_path,
    *,
    softmax: str | None = None,
    online_softmax: bool | None = None,
    block_size: int = spec.ATTRIBUTES["block_size"].default,
    min_seq_len: int = spec.ATTRIBUTES["min_seq_len"].default,
    policy: SoftmaxPolicy | None = None,
    target: str = "ortflash",
) -> tuple[onnx.ModelProto, Report]:
    """Fuse every provable attention block into FlashAttention.

    Returns the new model and a Report with one Block per Softmax. The softmax
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
    name = proto.graph.name or "model"
    opset = u.default_opset(proto)
    model = ir.serde.deserialize_model(_with_shapes(proto))
    graph = model.graph
    report = Report(name)
    # ONNX Attention ops (opset 23+) first: their Softmax is inside the op, not in the graph.
    report.blocks += fuse_attention_ops(graph, opset, policy)

    for softmax in [n for n in graph if n.op_type == "Softmax" and n.domain in ("", "ai.onnx")]:
        label = softmax.name or f"Softmax_{len(report.blocks)}"
        try:
            m = read_block(softmax, opset)
        except NotFused as why:
            report.blocks.append(Block(label, False, str(why)))
            continue
        new = emit(graph, m, policy, opset, len(report.blocks))
        replace_output(graph, m.output, new)
        kept = scores_kept(m)
        note = f"scores also read by {', '.join(kept)}, kept" if kept else ""
        report.blocks.append(Block(label, True, note, softmax=policy.mode, **_describe(m)))

    if report.fused:
        common_passes.RemoveUnusedNodesPass()(model)
        model.opset_imports.setdefault(spec.DOMAIN, spec.DOMAIN_VERSION)
    out = ir.serde.serialize_model(model)
    out.ir_version = proto.ir_version
    # Shape inference annotated intermediates; keep only what the input model declared.
    declared = {vi.name for vi in proto.graph.value_info}
    kept_info = [vi for vi in out.graph.value_info if vi.name in declared]
    del out.graph.value_info[:]
    out.graph.value_info.extend(kept_info)
    if target != "ortflash" and report.fused:
        out, notes = lower(out, target)
        for note in notes:
            i = block_index(note.node_name)
            if i is None:
                continue
            block = report.blocks[i]
            block.target = note.op if note.lowered else "ortflash"
            if not note.lowered:
                block.reason = "; ".join(filter(None, [block.reason, f"not lowered to {target}: {note.reason}"]))
    return out, report


def save(model: onnx.ModelProto, path: str, source_dir: str | None = None) -> None:
    """Write atomically (a temporary file beside the target, then a rename).

    A model whose weights are external references (as ``load`` leaves them) keeps them:
    in the source folder they are shared; elsewhere the data files are copied next to
    the output, streamed, never held in memory. A model too large for one protobuf
    (2 GiB) is written with its weights in ``OUT.data``.
    """
    import shutil

    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise OrtflashError(f"{path}: the output folder {folder} does not exist")
    tmp = f"{path}.tmp-{os.getpid()}"
    copied = []
    done = False
    try:
        locations = external_locations(model)
        if locations:
            if source_dir is None:
                raise OrtflashError("this model's weights are external: save(model, path, source_dir=<its folder>)")
            if os.path.abspath(source_dir) != folder:
                copy = onnx.ModelProto()
                copy.CopyFrom(model)  # cheap: the weights are references; the caller's model stays as it was
                model = copy
                renamed = {}
                for loc in locations:
                    # one file per location, named after the output; the relative path keeps names apart
                    new_loc = f"{os.path.basename(path)}.{loc.replace('/', '_').replace(os.sep, '_')}"
                    dst = os.path.join(folder, new_loc)
                    shutil.copyfile(os.path.join(source_dir, loc), dst + ".tmp")
                    copied.append(dst)
                    renamed[loc] = new_loc
                for init in model.graph.initializer:
                    for entry in init.external_data:
                        if entry.key == "location" and entry.value in renamed:
                            entry.value = renamed[entry.value]
            onnx.save(model, tmp)
            for dst in copied:
                os.replace(dst + ".tmp", dst)
        elif model.ByteSize() > 2**31 - 2**20:
            data = f"{os.path.basename(path)}.data"
            onnx.save(model, tmp, save_as_external_data=True, all_tensors_to_one_file=True, location=data)
        else:
            onnx.save(model, tmp)
        os.replace(tmp, path)
        done = True
    except OSError as exc:
        raise OrtflashError(f"{path}: could not write the model ({exc.strerror or exc})") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
        for dst in copied:
            if os.path.exists(dst + ".tmp"):
                os.remove(dst + ".tmp")
            if not done and os.path.exists(dst):
                os.remove(dst)
