"""The model's own numerical noise: how far the original's float32 (or float16) outputs are from its
outputs in float64, on the same inputs.

A graph can be ill-conditioned in float32: a LayerNormalization over a sum with a large common
part (weights of one sign, a bias far from zero) cancels most of its digits, so any two float32
evaluations that sum in another order, the original's own included, differ in the last digits of
that sum, and the normalization scales that up. A correct rewrite then differs from the original
by about as much as the original differs from the exact result. Verify measures that distance
once, in one extra session of the original in float64, and allows it on top of its tolerance
where it exceeds the tolerance (checks/compare); a model whose float32 outputs are within the
tolerance of its float64 ones keeps the tolerance as it is.

A model that computes in float16 (a float16 conversion, its inputs and outputs kept float32 or
not) is widened from float16 too: its noise is then its float16 rounding, which a rewrite that
computes the same in another order differs by (a converted decoder's prefill: about 5e-3).

Where ONNX Runtime has no float64 kernel for an op of the model (contrib ops, say), the model
does not load in float64 and no noise is measured: the tolerance stays as given.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx

from ..errors import OrtflashError
from ..model_io import graphs_of
from .compare import compare
from .sessions import ModelSource, open_session, run_session

_F32, _F16, _F64 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE
_NARROW = (_F32, _F16)  # the element types widened to float64
_NARROW_ARRAYS = (np.float32, np.float16)  # the same, as the arrays of feeds and outputs
# Attributes that name an element type to produce (Cast's to, ConstantOfShape's value is a tensor).
_TYPE_ATTRIBUTES = ("to", "dtype")


def _widened_tensor(tensor: onnx.TensorProto) -> None:
    if tensor.data_type in _NARROW:
        wide = onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(tensor).astype(np.float64), tensor.name)
        tensor.CopyFrom(wide)


def _widened_type(tp: onnx.TypeProto) -> None:
    if tp.HasField("tensor_type") and tp.tensor_type.elem_type in _NARROW:
        tp.tensor_type.elem_type = _F64
    elif tp.HasField("sequence_type"):
        _widened_type(tp.sequence_type.elem_type)
    elif tp.HasField("optional_type"):
        _widened_type(tp.optional_type.elem_type)


def _float32_names(model: onnx.ModelProto) -> set[str]:
    """Names of the main graph's values typed float32 (by declaration or inference); a value
    inference does not type (an output of a contrib op ONNX does not know) takes the type of its
    node's first typed input."""
    from ..model_shapes import with_shapes

    inferred, _ = with_shapes(model)
    graph = inferred.graph
    types = {vi.name: vi.type.tensor_type.elem_type for vi in (*graph.input, *graph.output, *graph.value_info)}
    types.update({i.name: i.data_type for i in graph.initializer})
    for node in graph.node:
        first = next((types[x] for x in node.input if x in types), None)
        for out in node.output:
            if out and out not in types and first is not None:
                types[out] = first
    return {name for name, t in types.items() if t == _F32}


def _kept_in_float32(graph: onnx.GraphProto, float32: set[str]) -> None:
    """Run each node of another domain than ONNX's in float32 inside a float64 graph: its float32
    inputs cast down, its float32 outputs cast back up (ONNX Runtime's contrib ops, such as
    SkipLayerNormalization, have no float64 kernels). What the node rounds it rounds as before."""
    nodes: list[onnx.NodeProto] = []
    for index, node in enumerate(graph.node):
        if node.domain in ("", "ai.onnx"):
            nodes.append(node)
            continue
        for k, name in enumerate(node.input):
            if name in float32:
                narrow = f"{name}__ortflash_f32_{index}_{k}"
                nodes.append(onnx.helper.make_node("Cast", [name], [narrow], to=_F32))
                node.input[k] = narrow
        nodes.append(node)
        for k, name in enumerate(node.output):
            if name in float32:
                narrow = f"{name}__ortflash_f32"
                node.output[k] = narrow
                nodes.append(onnx.helper.make_node("Cast", [narrow], [name], to=_F64))
    del graph.node[:]
    graph.node.extend(nodes)


def in_float64(model: onnx.ModelProto, keep_other_domains: bool = False) -> onnx.ModelProto | None:
    """A copy of ``model`` computing in float64 where it computed in float32 or float16 (inputs,
    outputs, weights, constants, casts); None where such a tensor is stored outside the proto.
    ``keep_other_domains``: nodes of other domains than ONNX's run in float32 between casts."""
    float32 = _float32_names(model) if keep_other_domains else set()
    wide = onnx.ModelProto()
    wide.CopyFrom(model)
    for graph in graphs_of(wide.graph):
        if not isinstance(graph, onnx.GraphProto):
            continue
        for init in graph.initializer:
            if init.data_location == onnx.TensorProto.EXTERNAL and init.data_type in _NARROW:
                return None
            _widened_tensor(init)
        for vi in (*graph.input, *graph.output, *graph.value_info):
            _widened_type(vi.type)
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    _widened_tensor(attr.t)
                elif attr.type == onnx.AttributeProto.INT and attr.name in _TYPE_ATTRIBUTES and attr.i in _NARROW:
                    attr.i = _F64
    if keep_other_domains:
        del wide.graph.value_info[:]  # the narrowed values are typed by inference again
        _kept_in_float32(wide.graph, float32)
    return wide


class NoiseMeter:
    """The original in float64, opened once (the one extra session verify opens), and the
    distance of the float32 (or float16) outputs from its outputs on each set of inputs."""

    def __init__(self, original: ModelSource, proto: onnx.ModelProto, opt_level: str) -> None:
        self.why_not = ""
        self.session = None
        if not any(vi.type.tensor_type.elem_type in _NARROW for vi in proto.graph.output):
            self.why_not = "no float32 or float16 output"
            return
        other_domains = any(n.domain not in ("", "ai.onnx") for n in proto.graph.node)
        # first all in float64; where that does not load, ops of other domains stay float32
        for keep in (False, True) if other_domains else (False,):
            wide = in_float64(proto, keep_other_domains=keep)
            if wide is None:
                self.why_not = "its float32 or float16 weights are stored outside the model"
                return
            try:
                self.session = open_session(wide, what="the original model in float64", opt_level=opt_level)
                self.why_not = ""
                return
            except OrtflashError as exc:
                self.why_not = str(exc)

    def noise(
        self, feeds: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray], rtol: float, atol: float
    ) -> dict[str, float]:
        """Output name -> max |output - float64| where that is beyond the tolerance (rtol, atol);
        outputs within it are left out (their tolerance stays as given)."""
        if self.session is None:
            return {}
        wide_feeds = {k: v.astype(np.float64) if v.dtype in _NARROW_ARRAYS else v for k, v in feeds.items()}
        try:
            exact = run_session(self.session, wide_feeds, what="the original model in float64")
        except OrtflashError as exc:
            self.why_not = str(exc)
            return {}
        found = {}
        for name, value in outputs.items():
            if value.dtype not in _NARROW_ARRAYS or name not in exact or exact[name].shape != value.shape:
                continue
            diff = compare(exact[name], value.astype(np.float64), name, rtol, atol)
            if not diff.ok and not diff.nan_mismatch and np.isfinite(diff.max_abs):
                found[name] = diff.max_abs
        return found
