"""ortflash validate: each fused node's kernel against the naive ONNX Runtime subgraph it replaced.

The original model runs in ONNX Runtime with, as extra outputs, every fused node's inputs
(the few reshapes and casts the rewrite put in front of the node are added to the original
graph) and the value the replaced subgraph computed. The node's kernel then runs on those
exact inputs, on the CPU (numpy) or in WGSL (wgpu), and the two are compared.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort

from . import spec
from .policy import SoftmaxPolicy
from .rewrites.fuse import REPLACES
from .verify import default_tolerance


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


def _replaced_name(node: onnx.NodeProto) -> str | None:
    for prop in node.metadata_props:
        if prop.key == REPLACES:
            return prop.value
    return None


def capture_model(original: onnx.ModelProto, optimized: onnx.ModelProto) -> tuple[onnx.ModelProto, list]:
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
        if replaced is None or replaced not in known:
            raise ValueError(f"FlashAttention node {node.name} does not say which original value it replaces")
        missing = [i for i in node.input if i not in known]
        if missing:
            raise ValueError(f"the inputs {missing} of {node.name} cannot be computed from the original graph")
        wanted += list(node.input) + [replaced]
    present = {o.name for o in g.output}
    for name in dict.fromkeys(wanted):
        if name not in present:
            g.output.append(onnx.ValueInfoProto(name=name))
    del g.value_info[:]
    return model, fused


def validate(original: onnx.ModelProto, optimized: onnx.ModelProto, feeds: dict, *, backend: str = "cpu",
             softmax: str | None = None, block_size: int | None = None, rtol=None, atol=None) -> list[NodeCheck]:
    if backend == "wgsl":
        from .ops import wgpu_kernel

        if not wgpu_kernel.available():
            raise RuntimeError(f"no WebGPU adapter: {wgpu_kernel.unavailable_reason()}")
        kernel = wgpu_kernel.flash_attention
    else:
        from .kernels.reference import flash_attention as kernel
    model, fused = capture_model(original, optimized)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    values = dict(zip(names, sess.run(names, feeds)))
    d_rtol, d_atol = default_tolerance(original)
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    checks = []
    for node in fused:
        attrs = spec.node_attributes(node)
        attrs = spec.resolve_exact_floats(attrs)
        attrs.pop("exact_floats", None)
        policy = SoftmaxPolicy.from_attributes(attrs)
        if softmax or block_size:
            policy = SoftmaxPolicy(softmax or policy.mode, block_size or policy.block_size, policy.min_seq_len)
        q, k, v, bias, mask = (values[i] for i in node.input)
        bias, mask = spec.absent_as_none(bias, mask)
        got = kernel(q, k, v, bias, mask, policy=policy, **attrs)
        want = values[_replaced_name(node)]
        got = got.reshape(want.shape) if got.size == want.size else got
        e, a = want.astype(np.float64), got.astype(np.float64)
        if e.shape != a.shape:
            checks.append(NodeCheck(node.name, _replaced_name(node), policy.choose(k.shape[2]), f"{q.shape}",
                                    float("inf"), float("inf"), 0, False))
            continue
        nan_mismatch = int(np.sum(np.isnan(e) != np.isnan(a)))
        both = ~(np.isnan(e) | np.isnan(a))
        diff = np.abs(e - a)[both]
        max_abs = float(diff.max()) if diff.size else 0.0
        max_rel = float((diff / (np.abs(e[both]) + atol)).max()) if diff.size else 0.0
        ok = nan_mismatch == 0 and bool(np.all(diff <= atol + rtol * np.abs(e[both])))
        shapes = f"Q{list(q.shape)} K{list(k.shape)} V{list(v.shape)}"
        checks.append(NodeCheck(node.name, _replaced_name(node), policy.choose(k.shape[2]), shapes,
                                max_abs, max_rel, nan_mismatch, ok))
    return checks
