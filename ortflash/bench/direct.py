"""The attention kernels called directly, outside ONNX Runtime, on the inputs the fused nodes receive.

Beside the session's time this shows what the ONNX Runtime bridge costs (kernel vs session),
and gives the peer row (PyTorch's CPU scaled_dot_product_attention) the very same Q, K, V,
bias and mask. The inputs come from one run of the fused model in the variant's own session
with every FlashAttention node's inputs exposed as extra graph outputs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from ..op import spec
from ..op.node import flash_nodes, node_attributes
from ..op.policy import SoftmaxPolicy

# attributes that say how a node runs, not what it computes: the kernels take them as policy
_RUN_ATTRIBUTES = ("exact_floats", spec.RUNTIME.name) if hasattr(spec, "RUNTIME") else ("exact_floats",)


@dataclass
class NodeCall:
    """One FlashAttention node's inputs (bias/mask None when absent) and attributes."""

    node: str
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    bias: np.ndarray | None
    mask: np.ndarray | None
    attrs: dict[str, Any]


def _flash_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return flash_nodes(model, subgraphs=False)


def exposing_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of a fused model whose graph outputs include every FlashAttention node's inputs."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    present = {o.name for o in out.graph.output}
    for node in _flash_nodes(out):
        for name in node.input:
            if name and name not in present:
                out.graph.output.append(onnx.ValueInfoProto(name=name))
                present.add(name)
    return out


def capture_calls(model: onnx.ModelProto, run: Callable[[list[str]], list[np.ndarray]]) -> list[NodeCall]:
    """The calls the fused nodes of ``model`` receive; ``run(names)`` runs the exposing model."""
    nodes = _flash_nodes(model)
    names = list(dict.fromkeys(i for n in nodes for i in n.input if i))
    values = dict(zip(names, run(names)))
    calls = []
    for node in nodes:
        attrs = node_attributes(node)
        for name in _RUN_ATTRIBUTES:
            attrs.pop(name, None)
        q, k, v, bias, mask = (values[i] for i in node.input)
        bias, mask = spec.absent_as_none(bias, mask)
        calls.append(NodeCall(node.name, q, k, v, bias, mask, attrs))
    return calls


def kernel(backend: str) -> tuple[Callable[..., np.ndarray], dict[str, Any]]:
    """(flash_attention, what it is) for a backend name; the compiled CPU kernel falls back to
    the numpy one where it is not built, as the bridge does."""
    if backend == "cpu":
        try:
            from ..kernels import cpu
        except ImportError as exc:
            return _reference(f"compiled CPU kernel not importable ({exc})")
        if cpu.available():
            return cpu.flash_attention, {"kernel": "cpu", "isa": cpu.isa()}
        return _reference("compiled CPU kernel not available on this machine")
    return _reference(None)


def _reference(why: str | None) -> tuple[Callable[..., np.ndarray], dict[str, Any]]:
    from ..kernels import reference

    info: dict[str, Any] = {"kernel": "reference"}
    if why:
        info["fallback"] = why
    return reference.flash_attention, info


def time_calls(fn: Callable[[NodeCall], object], calls: list[NodeCall], repeats: int) -> dict[str, Any]:
    """Median milliseconds of one pass over all calls (one model run's worth), after one warm-up."""
    for c in calls:
        fn(c)
    runs = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        for c in calls:
            fn(c)
        runs.append(time.perf_counter() - t0)
    return {
        "median": round(statistics.median(runs) * 1000, 3),
        "runs": [round(t * 1000, 3) for t in runs],
        "nodes": len(calls),
    }


def time_kernel(
    calls: list[NodeCall], backend: str, policy: SoftmaxPolicy, threads: int | None, repeats: int
) -> dict[str, Any]:
    """The kernel the session's nodes run, called directly with the session's policy."""
    fn, info = kernel(backend)
    extra = {"threads": threads} if threads and info["kernel"] == "cpu" else {}
    timing = time_calls(lambda c: fn(c.q, c.k, c.v, c.bias, c.mask, policy=policy, **extra, **c.attrs), calls, repeats)
    return {**timing, **info}


def torch_sdpa_runner(threads: int | None) -> Callable[[NodeCall], object]:
    """PyTorch's CPU scaled_dot_product_attention on one node's inputs (bias and mask as one additive mask)."""
    import torch
    import torch.nn.functional as F

    if threads:
        torch.set_num_threads(threads)

    def run(c: NodeCall) -> object:
        if c.attrs["softcap"] > 0:
            raise ValueError("torch's scaled_dot_product_attention has no softcap")
        q, k, v = (torch.from_numpy(np.ascontiguousarray(x)) for x in (c.q, c.k, c.v))
        additive = None if c.bias is None else np.asarray(c.bias, np.float32)
        if c.mask is not None:
            fill = np.where(c.mask, np.float32(0), np.float32(c.attrs["mask_fill"]))
            additive = fill if additive is None else additive + fill
        causal = bool(c.attrs["is_causal"])
        if causal and additive is not None:  # torch takes is_causal or a mask, not both
            upper = ~np.tri(q.shape[2], k.shape[2], dtype=bool)
            additive = additive + np.where(upper, np.float32(c.attrs["mask_fill"]), np.float32(0))
            causal = False
        mask = None if additive is None else torch.from_numpy(np.ascontiguousarray(additive))
        groups = q.shape[1] // k.shape[1]
        if groups > 1:  # grouped KV heads
            k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=c.attrs["scale"])

    return run
