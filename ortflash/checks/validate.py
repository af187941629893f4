"""ortflash validate: each fused node's kernel against the naive ONNX Runtime subgraph it replaced.

The original model runs in ONNX Runtime with, as extra outputs, every fused node's inputs
(the few reshapes and casts the rewrite put in front of the node are added to the original
graph) and the value the replaced subgraph computed. The node's kernel then runs on those
exact inputs (the backend's: ``cpu`` compiled, ``reference`` numpy, ``wgpu`` WGSL), and the
two are compared with the one comparison every check uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnx

from .. import spec
from ..errors import OrtflashError
from ..fusion.emit import REPLACES
from ..kernels.config import DEFAULT_BACKEND, KernelConfig
from ..policy import SoftmaxPolicy
from .compare import compare, tolerance
from .run import run_model

if TYPE_CHECKING:
    from ..kernels.ort_bridge import Kernel


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


def capture_model(
    original: onnx.ModelProto, optimized: onnx.ModelProto
) -> tuple[onnx.ModelProto, list[onnx.NodeProto]]:
    """The original graph plus the rewrite's input preparation, exposing what validate needs."""
    fused = [n for n in optimized.graph.node if n.op_type == spec.OP_TYPE and n.domain == spec.DOMAIN]
    model = onnx.ModelProto()
    model.CopyFrom(original)
    g = model.graph
    known = {i.name for i in g.input} | {i.name for i in g.initializer}
    known |= {o for n in g.node for o in n.output}
    have_init = {i.name for i in g.initializer}
    for init in optimized.graph.initializer:
        if init.name not in have_init and init.name.startswith("ortflash"):
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
    from ..model_io import graphs_of

    every = sum(
        n.op_type == spec.OP_TYPE and n.domain == spec.DOMAIN for g in graphs_of(optimized.graph) for n in g.node
    )
    return every - sum(n.op_type == spec.OP_TYPE and n.domain == spec.DOMAIN for n in optimized.graph.node)


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
    kernel = _kernel(backend)
    model, fused = capture_model(original, optimized)
    values = run_model(model, feeds, what="the original model")
    rtol, atol = tolerance(original, rtol, atol)
    checks = []
    for node in fused:
        attrs = spec.resolve_exact_floats(spec.node_attributes(node))
        attrs.pop("exact_floats", None)
        own = SoftmaxPolicy.from_attributes(attrs)
        node_policy = policy.applied_to(own) if policy else own
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
