"""FlashAttention as an ONNX Runtime custom op, through onnxruntime-extensions' Python ops.

Registering is process-wide (the extensions library keeps one table of Python ops):
importing this module registers FlashAttention once. What runs a node is not: the
kernel, its thread count and the softmax policy come from the node's own attributes,
which ``ortflash.InferenceSession`` writes on its private copy of the model (see
``ortflash.kernels.config``). Nothing here holds configuration between calls; what is
cached (a node's attributes, cast and read once) is keyed by every attribute, the side
channel with the session's kernel choice included.

Where the compiled CPU kernel runs a node, it runs as a native ONNX Runtime op (``kernels/native_op``,
no Python per call), in ``ortflash.InferenceSession`` and in plain sessions built with
``ortflash.session_options()`` alike. This op is registered in a domain of its own, ``ortflash.python``
(:data:`PYTHON_DOMAIN`), not in ``ai.onnx.contrib``, where the native op stands: sessions move the
nodes it runs there (the reference and wgpu backends, a replaced kernel, ``native=False``, nodes outside
the op's contract). :func:`register_in_contrib` adds it to ``ai.onnx.contrib`` as well, for a process
with no compiled kernel (native_op.provide_contrib_op decides, once).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnxruntime_extensions import PyCustomOpDef, _ocos, get_library_path, onnx_op

from ..op import spec
from ..op.side_channel import SideChannel
from . import cpu
from .config import KernelConfig

# The domain of this op: sessions move the nodes it runs here (ortflash.session.to_python_bridge).
PYTHON_DOMAIN = "ortflash.python"

_ATTR_TYPES = {float: PyCustomOpDef.dt_float, int: PyCustomOpDef.dt_int64, str: PyCustomOpDef.dt_string}

Kernel = Callable[..., np.ndarray]


def kernel_for(config: KernelConfig) -> Kernel:
    """The function that runs FlashAttention for this configuration (numpy arrays in and out)."""
    if config.backend == "wgpu":
        from .wgpu import kernel as wgpu_kernel

        return wgpu_kernel.flash_attention
    if config.backend == "reference":
        from . import reference

        return reference.flash_attention
    return functools.partial(cpu.flash_attention, threads=config.threads)


@dataclass(frozen=True)
class NodeCall:
    """One node's attributes as the bridge delivers them, read once: the session's kernel
    configuration (the side channel's runtime items) and the op's attributes, exact floats resolved;
    for the compiled CPU kernel, its call prepared as well (``cpu.prepare``)."""

    config: KernelConfig
    attrs: dict[str, Any]
    prepared: Kernel | None = None

    def run(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray | None, mask: np.ndarray | None
    ) -> np.ndarray:
        # The kernel is looked up on every call, not kept: a kernel replaced at run time (a
        # test's deliberately wrong one) must be the one that runs. The prepared call is used
        # only while cpu.flash_attention is the function it stands for.
        if self.prepared is not None and cpu.flash_attention is cpu.PREPARED_FOR:
            return self.prepared(q, k, v, bias, mask)
        return kernel_for(self.config)(q, k, v, bias, mask, **self.attrs)


def node_call_of(attrs: dict[str, Any]) -> NodeCall:
    """A node's attributes as the bridge delivers them, split into its session's kernel
    configuration and the op's own (SpecError where the compiled kernel's call cannot be
    resolved from them)."""
    channel = SideChannel.decode(attrs.get("exact_floats"))
    config = KernelConfig.of_side_channel(channel)
    resolved = channel.resolved({**attrs, "exact_floats": channel.op_text})
    if config.backend != "cpu":
        return NodeCall(config, resolved)
    return NodeCall(config, resolved, cpu.prepare(resolved, threads=config.threads))


@functools.lru_cache(maxsize=1024)
def _node_call_cached(key: tuple[tuple[str, Any], ...]) -> NodeCall:
    return node_call_of(dict(key))


def node_call(attrs: dict[str, Any]) -> NodeCall:
    """:func:`node_call_of`, once per distinct attribute set.

    The key is every attribute, the side channel included, so two sessions of one process
    with different kernel configurations (backend, threads) or policies read different
    entries. The bridge delivers the same attribute values on every call of a node.
    """
    try:
        return _node_call_cached(tuple(attrs.items()))
    except TypeError as error:  # an unhashable value: not from the bridge
        if "unhashable" not in str(error):
            raise
        return node_call_of(attrs)


def run_node(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray, mask: np.ndarray, attrs: dict[str, Any]
) -> np.ndarray:
    """Run one FlashAttention node as the bridge received it (placeholder inputs, side channel)."""
    bias_or_none, mask_or_none = spec.absent_as_none(bias, mask)
    return node_call(attrs).run(q, k, v, bias_or_none, mask_or_none)


_OP_SIGNATURE: dict[str, Any] = {
    "inputs": [PyCustomOpDef.dt_float] * 4 + [PyCustomOpDef.dt_bool],
    "outputs": [PyCustomOpDef.dt_float],
    # Undeclared attributes (spec.Attribute.declared) reach the kernel through the side channel.
    "attrs": {name: _ATTR_TYPES[spec.ATTRIBUTES[name].kind] for name in spec.DECLARED},
}


# Its own domain: onnxruntime-extensions registers an external op (the native one, in ai.onnx.contrib)
# whose name a Python op of ai.onnx.contrib also has in an endless loop (ops_registry.cc, 0.15.2).
@onnx_op(op_type=f"{PYTHON_DOMAIN}::{spec.OP_TYPE}", **_OP_SIGNATURE)
def _flash_attention_op(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray, mask: np.ndarray, **attrs: Any
) -> np.ndarray:
    return _run_or_nans(q, k, v, bias, mask, attrs)


def _run_or_nans(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray, mask: np.ndarray, attrs: dict[str, Any]
) -> np.ndarray:
    try:
        out = run_node(q, k, v, bias, mask, attrs)
    except Exception as exc:
        # An exception escaping into the extensions bridge aborts the whole process.
        # Say what failed and return NaNs of the output's shape, so a comparison fails loudly.
        warnings.warn(f"ortflash: FlashAttention failed: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=1)
        shape = (q.shape[0], q.shape[1], q.shape[2], v.shape[-1]) if q.ndim == 4 and v.ndim == 4 else (1,)
        return np.full(shape, np.nan, np.float32)
    if out.dtype == np.float32 and out.flags.c_contiguous:
        return out
    return np.ascontiguousarray(out, dtype=np.float32)


_FLASH_ATTENTION_IDS = {_flash_attention_op._id}


def register_in_contrib() -> None:
    """This op in ``ai.onnx.contrib`` too, for plain sessions of a process without the native op
    (native_op.provide_contrib_op calls it at most once, and then never adds the native op)."""

    @onnx_op(op_type=spec.OP_TYPE, **_OP_SIGNATURE)
    def _contrib_flash_attention_op(
        q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray, mask: np.ndarray, **attrs: Any
    ) -> np.ndarray:
        return _run_or_nans(q, k, v, bias, mask, attrs)

    _FLASH_ATTENTION_IDS.add(_contrib_flash_attention_op._id)


@functools.lru_cache(maxsize=1024)
def _cast_attributes(op_id: int, attributes: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """The bridge's attribute strings cast to the op's declared types, once per op and set.

    ``Opdef.cast_attributes`` reads the op's declared types through the native definition,
    which builds a new dict of them for every attribute: about 40 us per call uncached.
    """
    return dict(_ocos.Opdef._odlist[op_id].cast_attributes(dict(attributes)))


def _invoke(op_id: int, feed: tuple[np.ndarray, ...], attributes: dict[str, Any]) -> tuple[Any, ...]:
    """The extensions bridge's Python entry point, returning numpy buffers.

    The stock hook hands outputs back as Python lists (``tolist``), which costs about
    0.3 s per 1.5 M floats; the native side accepts a flat contiguous array as well,
    about 100x faster (measured with a [1, 12, 2048, 64] float32 output). This uses
    private names of onnxruntime-extensions (``Opdef._odlist``, ``cast_attributes``),
    pinned in pyproject.toml and guarded by tests/test_session.py.
    """
    if op_id in _FLASH_ATTENTION_IDS:  # ours, without the op body's keyword arguments (about 2 us)
        q, k, v, bias, mask = feed
        out = _run_or_nans(q, k, v, bias, mask, _cast_attributes(op_id, tuple(attributes.items())))
        return (op_id, out.shape, out.reshape(-1))
    opdef = _ocos.Opdef._odlist[op_id]
    result = opdef.body(*feed, **_cast_attributes(op_id, tuple(attributes.items())))
    flat: list[Any] = []
    for r in result if isinstance(result, tuple) else (result,):
        flat += [r.shape, r.reshape(-1) if r.flags.c_contiguous else np.ascontiguousarray(r).reshape(-1)]
    return (op_id, *flat)


PyCustomOpDef.install_hooker(_invoke)
INVOKE_HOOK = _invoke  # what bench and the tests check is installed


def library_path() -> str:
    return get_library_path()
