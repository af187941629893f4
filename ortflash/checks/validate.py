"""ortflash validate: each fused node's kernel against the naive ONNX Runtime subgraph it replaced.

The original model runs in ONNX Runtime with, as extra outputs, every fused node's inputs
(the few reshapes and casts the rewrite put in front of the node are added to the original
graph) and the value the replaced subgraph computed. The node's kernel then runs on those
exact inputs (the backend's: ``cpu`` compiled, ``reference`` numpy, ``wgpu`` WGSL), and the
two are compared with the one comparison every check uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from ..errors import OrtflashError
from ..kernels.config import DEFAULT_BACKEND, KernelConfig
from ..model_io import graphs_of
from ..op import spec
from ..op.node import REPLACES, flash_nodes, node_attributes
from ..op.policy import SoftmaxPolicy
from .compare import compare, tolerance
from .sessions import run_model

if TYPE_CHECKING:
    from ..kernels.ort_bridge import Kernel


# What the rewrites add (nodes, values, initializers) is named under this prefix (the emitters'
# "ortflash/attention_N", "ortflash/lower_N" scopes); everything else of a fused model is the original's.
ADDED_PREFIX = "ortflash"


@dataclass
class NodeCheck:
    node: str
    replaces: str
    mode: str
    shapes: str
    max_abs: float
    max_rel: float
    nan_mismatch: int
    ok: bool
    problem: str = ""  # a changed shape or dtype, in words (the errors are then infinite)
    of_tolerance: float = 0.0  # worst error / what the tolerance allows there (ok where <= 1)


def _replaced_name(node: onnx.NodeProto) -> str:
    """The original value a fused node computes, as the rewrite recorded it."""
    for prop in node.metadata_props:
        if prop.key == REPLACES:
            return str(prop.value)
    raise OrtflashError(f"FlashAttention node {node.name} does not say which original value it replaces")


def _interface(model: onnx.ModelProto) -> tuple[dict[str, int], list[str]]:
    """A model's graph inputs (name -> element type; initializers listed as inputs left out) and outputs."""
    inits = {i.name for i in model.graph.initializer}
    inputs = {i.name: i.type.tensor_type.elem_type for i in model.graph.input if i.name not in inits}
    return inputs, [o.name for o in model.graph.output]


def _weights(model: onnx.ModelProto, ours: bool) -> dict[str, tuple[tuple[int, ...], int]]:
    """Initializers of every graph (name -> dims, type); ``ours``: with the ones ortflash adds."""
    return {
        i.name: (tuple(i.dims), i.data_type)
        for g in graphs_of(model.graph)
        for i in g.initializer
        if ours or not i.name.startswith(ADDED_PREFIX)
    }


def _foreign_parts(original: onnx.ModelProto, optimized: onnx.ModelProto) -> str:
    """What in ``optimized`` does not come from ``original``, in words ("" when all of it may).

    A rewrite keeps every weight it does not replace (same name, shape and type; what ortflash
    adds is named ortflash*), and each fused node says which original value it computes. Lowered
    nodes carry no such mark, so weights are what tell a lowered model of another model apart
    (a lowered GPT-2 and a BERT both take input_ids and attention_mask and give last_hidden_state)."""
    have, theirs = _weights(original, ours=True), _weights(optimized, ours=False)
    foreign = [name for name, meta in theirs.items() if have.get(name) != meta]
    if foreign:
        return f"{len(foreign)} of its weights are not the original's (same name, shape and type): {', '.join(foreign[:3])}"
    values = {o for g in graphs_of(original.graph) for n in g.node for o in n.output}
    fused = flash_nodes(optimized, subgraphs=False)
    unknown = [n.name for n in fused if _replaced_name(n) not in values]
    if unknown:
        return f"its FlashAttention node(s) {', '.join(unknown[:3])} replace no value of the original graph"
    return ""


def check_derived(
    original: onnx.ModelProto,
    optimized: onnx.ModelProto,
    original_name: str = "the original model",
    optimized_name: str = "the optimized model",
) -> None:
    """Refuse an ``optimized`` that is not a rewrite of ``original`` (OrtflashError, one line): its
    outputs are the original's, its inputs among the original's with the same types, and every fused
    node replaces a value of the original graph. Unrelated models otherwise gave "no FlashAttention
    node to validate" and success, or nodes compared with whatever values shared their names."""
    (have_in, have_out), (got_in, got_out) = _interface(original), _interface(optimized)
    why = ""
    if sorted(got_out) != sorted(have_out):
        why = f"its outputs are {', '.join(got_out) or 'none'}, the original's {', '.join(have_out) or 'none'}"
    elif set(got_in) - set(have_in):
        extra = ", ".join(sorted(set(got_in) - set(have_in)))
        why = f"it has inputs the original does not ({extra}; the original's: {', '.join(have_in) or 'none'})"
    elif any(have_in[name] != elem for name, elem in got_in.items()):
        changed = ", ".join(sorted(n for n, elem in got_in.items() if have_in[n] != elem))
        why = f"its inputs {changed} have other element types than the original's"
    else:
        why = _foreign_parts(original, optimized)
    if why:
        raise OrtflashError(f"{optimized_name} is not an optimized model of {original_name}: {why}")


def capture_model(
    original: onnx.ModelProto, optimized: onnx.ModelProto
) -> tuple[onnx.ModelProto, list[onnx.NodeProto]]:
    """The original graph plus the rewrite's input preparation, exposing what validate needs."""
    fused = flash_nodes(optimized, subgraphs=False)
    model = onnx.ModelProto()
    model.CopyFrom(original)
    g = model.graph
    known = {i.name for i in g.input} | {i.name for i in g.initializer}
    known |= {o for n in g.node for o in n.output}
    have_init = {i.name for i in g.initializer}
    for init in optimized.graph.initializer:
        if init.name not in have_init and init.name.startswith(ADDED_PREFIX):
            g.initializer.append(init)
            known.add(init.name)
    fused_outputs = {o for n in fused for o in n.output}
    for node in optimized.graph.node:
        if node.op_type == spec.OP_TYPE or any(o in known for o in node.output):
            continue
        if all((not i) or i in known for i in node.input) and not fused_outputs & set(node.input):
            g.node.append(node)
            known.update(node.output)
    wanted = []
    for node in fused:
        replaced = _replaced_name(node)
        if replaced not in known:
            raise OrtflashError(f"FlashAttention node {node.name} does not say which original value it replaces")
        missing = [i for i in node.input if i not in known]
        if missing:
            raise OrtflashError(f"the inputs {missing} of {node.name} cannot be computed from the original graph")
        wanted += list(node.input) + [replaced]
    present = {o.name for o in g.output}
    for name in dict.fromkeys(wanted):
        if name not in present:
            g.output.append(onnx.ValueInfoProto(name=name))
    del g.value_info[:]
    return model, fused


def in_subgraphs(optimized: onnx.ModelProto) -> int:
    """FlashAttention nodes inside If/Loop/Scan bodies: validate cannot check them node by node,
    because ONNX Runtime gives no way to read a subgraph's intermediate values (verify checks them
    end to end)."""

    return len(flash_nodes(optimized)) - len(flash_nodes(optimized, subgraphs=False))


def _kernel(backend: str) -> Kernel:
    """The kernel a backend runs, after checking that it can run here."""
    if backend == "wgpu":
        from ..kernels.wgpu import kernel as wgpu_kernel

        if not wgpu_kernel.available():
            raise OrtflashError(f"no WebGPU adapter: {wgpu_kernel.unavailable_reason()}")
    # imported here: onnxruntime-extensions is slow to import (it pulls in torch where installed)
    from ..kernels.ort_bridge import kernel_for

    return kernel_for(KernelConfig(backend=backend))


def validate(
    original: onnx.ModelProto,
    optimized: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    *,
    backend: str = DEFAULT_BACKEND,
    policy: SoftmaxPolicy | None = None,
    rtol: float | None = None,
    atol: float | None = None,
) -> list[NodeCheck]:
    """Each fused node of ``optimized``, run by ``backend``'s kernel, against what it replaced.

    ``policy`` overrides each node's own softmax (a field it leaves as None stays the node's).
    """
    check_derived(original, optimized)
    kernel = _kernel(backend)
    model, fused = capture_model(original, optimized)
    values = run_model(model, feeds, what="the original model")
    rtol, atol = tolerance(original, rtol, atol)
    checks = []
    for node in fused:
        attrs = node_attributes(node)
        attrs.pop("exact_floats", None)
        node_policy = SoftmaxPolicy.for_node(attrs, policy)
        attrs.update(node_policy.attributes())
        q, k, v, bias_in, mask_in = (values[i] for i in node.input)
        bias, mask = spec.absent_as_none(bias_in, mask_in)
        got = kernel(q, k, v, bias, mask, **attrs)
        replaced = _replaced_name(node)
        want = values[replaced]
        got = got.reshape(want.shape) if got.size == want.size else got
        # the kernel computes in float32; the fused graph casts its output back to the original's dtype
        got = got.astype(want.dtype, copy=False) if np.issubdtype(want.dtype, np.floating) else got
        diff = compare(want, got, node.name, rtol, atol)
        shapes = f"Q{list(q.shape)} K{list(k.shape)} V{list(v.shape)}"
        checks.append(
            NodeCheck(
                node.name,
                replaced,
                node_policy.choose(k.shape[2]),
                shapes,
                diff.max_abs,
                diff.max_rel,
                diff.nan_mismatch,
                diff.ok,
                diff.problem,
                diff.of_tolerance,
            )
        )
    return checks


def validate_random(
    original: onnx.ModelProto,
    optimized: onnx.ModelProto,
    inputs_at: Callable[[int], dict[str, np.ndarray]],
    batch: int,
    **options: Any,
) -> tuple[list[NodeCheck], str | None]:
    """:func:`validate` on random inputs at ``batch`` (``inputs_at(batch)``), and where those fail
    at batch > 1, at batch 1, as verify does (many exports fix the batch at 1 inside the graph, a
    Reshape to a constant shape): (the checks, the note that says so, or None). Where batch 1 fails
    too, the first error is raised, with the hint."""
    from .feeds import with_batch_hint
    from .verify import _batch_one_note  # verify's words for it, so both checks say the same

    at_batch = inputs_at(batch)
    try:
        return validate(original, optimized, at_batch, **options), None
    except OrtflashError as exc:
        if batch == 1:
            raise
        at_one = inputs_at(1)
        try:
            checks = validate(original, optimized, at_one, **options)
        except OrtflashError:
            raise with_batch_hint(exc, batch) from None
        return checks, _batch_one_note(at_batch, at_one, batch, exc)
