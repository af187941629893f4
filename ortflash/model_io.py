"""Reading and writing ONNX models whose weights may stay on disk as external data."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Union

import onnx
import onnx_ir as ir

from .errors import OrtflashError

# Leave headroom under protobuf's 2 GiB message limit for the graph itself.
_MAX_INLINE_BYTES = 2**31 - 2**20


def _external_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of the model stored as external data: the initializers of the main graph and of
    every If/Loop/Scan body, and Constant nodes' values (onnx saves those externally too)."""
    for graph in graphs_of(model.graph):
        tensors = list(getattr(graph, "initializer", ()))
        tensors += [a.t for n in graph.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR]
        for tensor in tensors:
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                yield tensor


def _location(tensor: onnx.TensorProto) -> str | None:
    return next((e.value for e in tensor.external_data if e.key == "location"), None)


def external_locations(model: onnx.ModelProto) -> list[str]:
    """The files a model's external tensors live in, as the model names them (relative to its
    folder: ``model.onnx.data``, Hugging Face's ``model.onnx_data``, ``weights/w.bin``), at any depth."""
    found: list[str] = []
    for tensor in _external_tensors(model):
        loc = _location(tensor)
        if loc and loc not in found:
            found.append(loc)
    return found


def copy_external_data(model: onnx.ModelProto, source_dir: str, target_dir: str) -> list[str]:
    """Copy the files ``model``'s external tensors name, from ``source_dir``, to the same relative
    paths under ``target_dir``, so a copy of the model file there loads (a copy, not a link: onnx
    refuses a data file with several hard links, or a symbolic link). Returns the locations. A
    location outside the model's folder (absolute, or up through ``..``) is refused: ONNX Runtime
    does not read it either."""
    done = []
    for loc in external_locations(model):
        rel = os.path.normpath(loc)
        if os.path.isabs(rel) or rel.split(os.sep)[0] == os.pardir:
            raise OrtflashError(f"the external data location {loc!r} is outside the model's folder")
        src, dst = os.path.join(source_dir, rel), os.path.join(target_dir, rel)
        if not os.path.isfile(src):
            raise OrtflashError(f"its external data file {loc} is missing from {source_dir}")
        if not os.path.exists(dst):  # the models of one folder share their files
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(src, dst)
        done.append(loc)
    return done


ModelLike = Union[onnx.ModelProto, ir.Model, str, "os.PathLike[str]"]


# The domains whose operator sets the installed onnx defines: a model importing a newer version
# of one uses operators (or meanings) that neither the rules nor the version converter know.
_KNOWN_OPSETS: Mapping[str, Callable[[], int]] = MappingProxyType(
    {
        "": onnx.defs.onnx_opset_version,
        "ai.onnx": onnx.defs.onnx_opset_version,
        "ai.onnx.ml": onnx.defs.onnx_ml_opset_version,
    }
)


def check_opsets(model: onnx.ModelProto, where: str = "the model") -> None:
    """Refuse a model importing an opset of the default domain or ai.onnx.ml newer than the
    installed onnx knows (OrtflashError, one line)."""
    for opset in model.opset_import:
        newest = _KNOWN_OPSETS.get(opset.domain)
        if newest is not None and opset.version > newest():
            name = opset.domain or "ai.onnx"
            raise OrtflashError(
                f"{where} imports {name} opset {opset.version}, newer than the installed onnx "
                f"{onnx.__version__} knows (up to {newest()}): upgrade onnx, or export at opset {newest()} or lower"
            )


def load(model_or_path: ModelLike) -> onnx.ModelProto:
    """Read a model (a path, an ``onnx.ModelProto`` or an ``onnx_ir.Model``) without loading its
    external data: weights stay on disk, referenced.

    The rewrites never read weights (scales are small inline constants), so a model of
    any size is optimized in the memory its graph takes.
    """
    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path
    if isinstance(model_or_path, ir.Model):
        return ir.serde.serialize_model(model_or_path)
    if not isinstance(model_or_path, (str, os.PathLike)):
        raise OrtflashError(
            f"expected a model path, an onnx.ModelProto or an onnx_ir.Model, got {type(model_or_path).__name__}"
        )
    path = os.fspath(model_or_path)
    if not os.path.exists(path):
        raise OrtflashError(f"{path}: no such file")
    if os.path.isdir(path):
        raise OrtflashError(f"{path}: is a folder, not an ONNX model file")
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf raises several types for a file that is not ONNX
        raise OrtflashError(f"{path}: not a readable ONNX model ({type(exc).__name__}: {str(exc)[:120]})") from None
    if not model.graph.node and not model.graph.output:
        raise OrtflashError(f"{path}: not an ONNX model (no graph in it)")
    folder = os.path.dirname(os.path.abspath(path))
    for loc in external_locations(model):
        if not os.path.isfile(os.path.join(folder, loc)):
            raise OrtflashError(f"{path}: its external data file {loc} is missing from {folder}")
    return model


def save(model: onnx.ModelProto, path: str | os.PathLike[str], source_dir: str | None = None) -> None:
    """Write atomically (a temporary file beside the target, then a rename).

    A model whose weights are external references (as ``load`` leaves them) keeps them:
    in the source folder they are shared; elsewhere the data files are copied next to
    the output, streamed, never held in memory. A model too large for one protobuf
    (2 GiB) is written with its weights in ``OUT.data``.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise OrtflashError(f"{path}: the output folder {folder} does not exist")
    tmp = f"{path}.tmp-{os.getpid()}"
    copied: list[str] = []
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
                renamed: dict[str, str] = {}
                for loc in locations:
                    # one file per location, named after the output; the relative path keeps names apart
                    new_loc = f"{os.path.basename(path)}.{loc.replace('/', '_').replace(os.sep, '_')}"
                    dst = os.path.join(folder, new_loc)
                    shutil.copyfile(os.path.join(source_dir, loc), dst + ".tmp")
                    copied.append(dst)
                    renamed[loc] = new_loc
                for tensor in _external_tensors(model):
                    for entry in tensor.external_data:
                        if entry.key == "location" and entry.value in renamed:
                            entry.value = renamed[entry.value]
            onnx.save(model, tmp)
            for dst in copied:
                os.replace(dst + ".tmp", dst)
        elif model.ByteSize() > _MAX_INLINE_BYTES:
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


def graphs_of(graph: onnx.GraphProto | onnx.FunctionProto) -> Iterator[onnx.GraphProto | onnx.FunctionProto]:
    """graph (or a function body) and every subgraph nested in its nodes (If branches, Loop and Scan
    bodies), at any depth."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from graphs_of(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from graphs_of(sub)
