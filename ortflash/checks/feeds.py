"""The inputs a check runs on: random ones built from the model's input types, or a .npz file."""

from __future__ import annotations

import os
import zipfile
from collections.abc import Collection, Mapping

import numpy as np
import onnx

from ..errors import OrtflashError
from ..graph.terms import Lin
from ..model_io import graphs_of
from .input_dims import evaluated, tied_dims

_BATCH_NAMES = ("batch", "batch_size", "b", "n", "s0")
# Token ids when no embedding table bounds them (an id input that feeds no Gather).
_FALLBACK_VOCABULARY = 100


def _gather_bound(model: onnx.ModelProto, name: str) -> int | None:
    """Rows of the embedding table an integer input indexes (token ids must stay below it); the
    Gather may sit in a subgraph (a merged decoder's If branches), the table in the main graph."""
    inits = {i.name: i for g in graphs_of(model.graph) for i in g.initializer}
    for node in (n for g in graphs_of(model.graph) for n in g.node):
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == name and node.input[0] in inits:
            return int(inits[node.input[0]].dims[0])
    return None


def _padding_mask(shape: list[int], dtype: type | np.dtype) -> np.ndarray:
    """1 for real tokens, 0 for padding: item 0 padded at the end, item 1 (if any) at the start."""
    mask = np.ones(shape, dtype)
    if len(shape) >= 2 and shape[-1] > 2:
        cut = max(1, shape[-1] // 3)
        mask[0, ..., -cut:] = 0
        if shape[0] > 1:
            mask[1, ..., :cut] = 0
    return mask


def _shape(shape_proto: onnx.TensorShapeProto, seq_len: int, batch: int, named: dict[str, int] | None) -> list[int]:
    shape = []
    for d in shape_proto.dim:
        if d.HasField("dim_value"):
            shape.append(d.dim_value)
        elif named and d.dim_param in named:
            shape.append(named[d.dim_param])
        elif d.dim_param.lower() in _BATCH_NAMES or "batch" in d.dim_param.lower():
            shape.append(batch)
        else:
            shape.append(seq_len)
    return shape


def _integer_input(
    model: onnx.ModelProto,
    name: str,
    shape: list[int],
    np_type: np.dtype,
    seq_len: int,
    rng: np.random.Generator,
    total_len: int | None = None,
) -> np.ndarray:
    """An integer input, read by its name: a mask, key counts, positions, token types, or token ids.

    ``total_len``: past + new tokens of a decoder with a cache (None without one): keys count up
    to it and the new tokens' positions are its last ones."""
    lname = name.lower()
    if "mask" in lname:
        return _padding_mask(shape, np_type)
    if "nonpad" in lname or "seqlen" in lname:
        # valid key counts, in [1, key length]
        return rng.integers(1, (total_len or seq_len) + 1, size=shape).astype(np_type)
    if "position" in lname:
        first = total_len - shape[-1] if total_len is not None and shape and shape[-1] <= total_len else 0
        return np.broadcast_to(np.arange(first, first + shape[-1], dtype=np_type), shape).copy()
    if "type" in lname:
        return np.zeros(shape, np_type)
    high = _gather_bound(model, name) or _FALLBACK_VOCABULARY
    return rng.integers(0, high, size=shape).astype(np_type)


def _symbolic_axes(model: onnx.ModelProto) -> list[tuple[str, int, int, str]]:
    """(input name, axis, rank, dim name) of every named dim of the model's inputs."""
    inits = {i.name for i in model.graph.initializer}
    found = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dims = vi.type.tensor_type.shape.dim
        found += [(vi.name, axis, len(dims), d.dim_param) for axis, d in enumerate(dims) if d.dim_param]
    return found


def _decoder_axes(model: onnx.ModelProto, tied: Collection[str] = ()) -> tuple[set[str], set[str], set[str], set[str]]:
    """The dim names of a decoder's cached, new and total lengths and of its batch (all empty
    without ``past_*`` inputs). ``tied``: names the graph ties to the others' (see checks/input_dims),
    left out: their values follow from the others'."""
    axes = [a for a in _symbolic_axes(model) if a[3] not in tied]
    # The cross-attention side (encoder_hidden_states, its mask, Optimum's past_key_values.N.encoder.*)
    # has the encoder's length: it neither grows with the cache nor counts the new tokens.
    encoder = {d for name, _, _, d in axes if "encoder" in name.lower()}
    encoder -= {d for name, _, _, d in axes if "encoder" not in name.lower()}
    past = {d for name, axis, rank, d in axes if "past" in name.lower() and rank == 4 and axis == 2} - encoder
    if not past:
        return set(), set(), set(), set()
    leading = {d for _, axis, _, d in axes if axis == 0}
    batch_names = (
        leading if len(leading) == 1 else {d for d in leading if d.lower() in _BATCH_NAMES or "batch" in d.lower()}
    )
    mask_lengths = {d for name, axis, rank, d in axes if "mask" in name.lower() and axis == rank - 1}
    other = {d for name, axis, _, d in axes if "mask" not in name.lower() and "past" not in name.lower()}
    totals = mask_lengths - past - other - batch_names - encoder
    new = other - past - batch_names - totals - encoder
    return past, new, totals, batch_names


def decoder_dims(
    model: onnx.ModelProto, *, seq_len: int = 16, batch: int = 2, dims: dict[str, int] | None = None
) -> dict[str, int]:
    """Values for the named dims of a decoder's inputs that keep their relations; {} otherwise.

    A decoder with a cache takes ``past_*`` inputs [B, H, past, D] and an attention mask over
    past + new tokens, each length a dim name of its own (``past_sequence_length``,
    ``total_sequence_length``; dynamo writes ``s10``-style names). The batch is the name at
    axis 0 of every input. By default the inputs are one decode step: ``seq_len`` cached tokens
    and one new token, the shape a decoder with a cache runs most, and one every native op with
    a past runs (ONNX Runtime 1.31's GroupQueryAttention refuses a batch of several new tokens
    after a non-empty past); ``dims`` sets either (past 0: a prefill, see :func:`decoder_cases`).
    The mask's length is their sum unless ``dims`` sets it too. ``dims`` comes back included."""
    return _decoder_dims(model, tied_dims(model), seq_len, batch, dims)


def _decoder_dims(
    model: onnx.ModelProto, tied: Collection[str], seq_len: int, batch: int, dims: dict[str, int] | None
) -> dict[str, int]:
    given = dict(dims or {})
    past, new, totals, batch_names = _decoder_axes(model, tied)
    if not past:
        return given
    out = {d: batch for d in batch_names}
    out.update({d: seq_len for d in past})
    out.update({d: 1 for d in new})
    out.update({d: v for d, v in given.items() if d not in totals})
    for total in totals - given.keys():
        terms = [t.strip() for t in total.split("+")]
        names = [t for t in terms if not t.isdigit()]
        if len(terms) < 2 or not set(names) <= out.keys():
            continue
        # a length written as a sum ("s7 + s3"; optimum's "past_sequence_length + 1") is that sum; a
        # number in it without the new tokens' name is their count (one token per decode step)
        added = sum(int(t) for t in terms if t.isdigit())
        if added and not new & set(names) and not new & given.keys():
            out.update({d: added for d in new})
        out[total] = sum(out[t] for t in names) + added
    past_len = max(out[d] for d in past)
    new_len = max((out[d] for d in new), default=1)
    out.update({d: past_len + new_len for d in totals if d not in out})
    out.update(given)
    return out


def decoder_cases(
    model: onnx.ModelProto, *, seq_len: int = 16, batch: int = 2, dims: dict[str, int] | None = None
) -> list[tuple[str, dict[str, int]]]:
    """The shapes a decoder with a cache is checked in, each as (words, dims for make_feeds): a
    prefill (no cached tokens, ``seq_len`` new ones) and a decode step (``seq_len`` cached, one
    new). [] for a model without a cache, or where ``dims`` already fixes a length."""
    tied = tied_dims(model)
    past, new, totals, _ = _decoder_axes(model, tied)
    if not past or set(dims or {}) & (past | new | totals):
        return []
    decode = _decoder_dims(model, tied, seq_len, batch, dims)
    prefill = {d: 0 for d in past} | {d: seq_len for d in new}
    prefill.update(dims or {})
    return [
        (f"prefill: 0 cached tokens, {seq_len} new", _decoder_dims(model, tied, seq_len, batch, prefill)),
        (f"decode: {seq_len} cached tokens, 1 new", decode),
    ]


def _total_length(model: onnx.ModelProto, tied: Collection[str], named: dict[str, int]) -> int | None:
    """past + new tokens of a decoder with a cache (None without one): the cached length plus the
    new tokens' where both are named, else the mask's length."""
    past, new, totals, _ = _decoder_axes(model, tied)
    if not past:
        return None
    if past <= named.keys() and new and new <= named.keys():
        return max(named[d] for d in past) + max(named[d] for d in new)
    axes = _symbolic_axes(model)
    lengths = [named[d] for name, axis, rank, d in axes if "mask" in name.lower() and axis == rank - 1 and d in named]
    return max(lengths, default=None)


def _named_dims(
    model: onnx.ModelProto, tied: Mapping[str, Lin], seq_len: int, batch: int, dims: dict[str, int]
) -> dict[str, int]:
    """A value for every named dim of the inputs: ``dims``' own, else the batch or ``seq_len`` by
    the name's place; then each dim the graph ties to others (checks/input_dims) follows them."""
    axes = _symbolic_axes(model)
    # A name seen only at axis 0 of inputs of rank >= 2 is their batch, whatever it is called
    # (Paddle2ONNX writes "DynamicDimension.0"): without this it took seq_len, a batch of 16
    # images where 2 were meant, and a --dim on another axis could run out of memory.
    leading = {d for _, axis, rank, d in axes if axis == 0 and rank >= 2} - {d for _, axis, _, d in axes if axis}
    named = {**{d: batch for d in leading - tied.keys()}, **dims}
    past, new, _, _ = _decoder_axes(model, tied.keys())
    if past and new <= named.keys():
        # the positions of a decoder's new tokens (cache_position [S], position_ids [B, S]) count
        # the new tokens wherever their length is a name of their own
        for name, axis, rank, d in axes:
            if "position" in name.lower() and axis == rank - 1 and d not in named and d not in tied:
                named[d] = max((named[n] for n in new), default=1)
    for _, _, _, d in axes:
        if d not in named and d not in tied:
            named[d] = batch if d.lower() in _BATCH_NAMES or "batch" in d.lower() else seq_len
    for d, lin in tied.items():
        value = evaluated(lin, named)
        if d not in dims and value is not None:
            named[d] = value
    return named


def make_feeds(
    model: onnx.ModelProto, *, seq_len: int = 16, batch: int = 2, seed: int = 0, dims: dict[str, int] | None = None
) -> dict[str, np.ndarray]:
    """Random inputs for every graph input, from its type and shape; attention masks pad.

    Named dims take their value from ``dims``, else (a decoder with a cache) from
    :func:`decoder_dims`, else the batch or ``seq_len`` by their name."""
    rng = np.random.default_rng(seed)
    inits = {i.name for i in model.graph.initializer}
    tied = tied_dims(model)
    dims = _named_dims(model, tied, seq_len, batch, _decoder_dims(model, tied, seq_len, batch, dims))
    total_len = _total_length(model, tied.keys(), dims)
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tensor_type = vi.type.tensor_type
        shape = _shape(tensor_type.shape, seq_len, batch, dims)
        np_type = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        if np_type == np.bool_:
            feeds[vi.name] = _padding_mask(shape, np.bool_)
        elif np.issubdtype(np_type, np.integer):
            feeds[vi.name] = _integer_input(model, vi.name, shape, np_type, seq_len, rng, total_len)
        else:
            values = rng.standard_normal(shape).astype(np_type)  # drawn even for a mask: keeps the stream
            feeds[vi.name] = _padding_mask(shape, np_type) if "mask" in vi.name.lower() else values
    return feeds


def read_feeds(path: str) -> dict[str, np.ndarray]:
    """The arrays of a .npz file, by name."""
    if not os.path.exists(path):
        raise OrtflashError(f"{path}: no such feeds file")
    try:
        with np.load(path) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:  # what numpy raises for a non-archive
        raise OrtflashError(f"{path}: not a readable .npz file ({type(exc).__name__})") from None


def check_dim_names(model: onnx.ModelProto, dims: dict[str, int], where: str = "--dim") -> None:
    """Refuse a dim name no input of ``model`` has (OrtflashError naming the ones it has): a
    misspelt name would otherwise be ignored, and the inputs made at another size than asked."""
    named = sorted({d for _, _, _, d in _symbolic_axes(model)})
    unknown = sorted(set(dims) - set(named))
    if unknown:
        has = f"its inputs' dim names are {', '.join(named)}" if named else "its inputs have no named dims"
        raise OrtflashError(f"{where} {', '.join(unknown)}: no input of the model has that dim; {has}")


def with_batch_hint(exc: OrtflashError, batch: int) -> OrtflashError:
    """``exc`` with a hint where random inputs at ``batch`` > 1 failed on a shape: many exports
    fix the batch at 1 inside the graph (a Reshape to a constant shape), whatever their inputs say."""
    if batch > 1 and "shape" in str(exc).lower():
        return OrtflashError(f"{exc}; the model may run at batch 1 only: try --batch 1")
    return exc
