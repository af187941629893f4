"""FlashAttention as a native ONNX Runtime custom op: the compiled kernel on ORT's buffers, no Python per call.

Each compiled build (``ortflash.kernels._flash_{avx512,avx2,generic}``) is also an ONNX Runtime custom-op
library: it exports ``RegisterCustomOps`` (csrc/flash/ort_op.hpp), which adds the op ``FlashAttention`` in
the build's own domain (``ortflash.native``), apart from the onnxruntime-extensions bridge's
``ai.onnx.contrib``. ``ortflash.InferenceSession`` rewrites the nodes of its private copy of the model that
the compiled CPU kernel runs into that domain, with plain attributes resolved here from the node's own
(the side channel read by ``op/side_channel``, the softmax policy, the thread count), and registers the
library of the build ``cpu.selection()`` picked. Onnxruntime-extensions' per-call Python bridge (37-73 us
a call, benchmarks/results/short_seq_breakdown.md) is then out of the path.

What stays on the bridge (:func:`native_build` says why for a configuration, :func:`native_attributes`
for a node): the ``reference`` and ``wgpu`` backends (Python kernels), a replaced ``cpu.flash_attention``
(a test's deliberately wrong kernel must be the one that runs), no compiled build, and a node whose
attributes are outside the op's contract (the bridge then says what failed at run time, as before).
Sessions move those nodes to the bridge's own domain (``ort_bridge.PYTHON_DOMAIN``, session.py).

Plain sessions (``onnxruntime.InferenceSession(path, ortflash.session_options())``) run the user's file
as it is, nodes of ``ai.onnx.contrib`` with the side channel. For them each build also has a second op,
``FlashAttention`` reading such a node itself (csrc/flash/side_channel.hpp, the C++ twin of
``op/side_channel`` and :func:`native_attributes`), which :func:`provide_contrib_op` adds, once per
process, to onnxruntime-extensions' own ``ai.onnx.contrib`` domain (its exported ``AddExternalCustomOp``):
ONNX Runtime takes one domain of a name per session ("Domain already set in registry" for a second), so
the op joins the extensions' tokenizer and other ops there instead of bringing a domain of its own.
"""

from __future__ import annotations

import ctypes
import threading
from types import ModuleType
from typing import Any

import onnx
import onnxruntime as ort

from ..op import spec
from ..op.node import flash_nodes, node_attributes
from . import cpu
from .config import KernelConfig

# Our mark on options that already hold the native library (ORT refuses a session whose options
# registered one library twice: "Conflicting with a registered kernel").
REGISTERED_KEY = "ortflash.native_ops_library"
NATIVE_OPSET_VERSION = 1

# Who runs ai.onnx.contrib's FlashAttention in plain sessions of this process: "native" or "python"
# (provide_contrib_op, decided once: both are for good in onnxruntime-extensions' tables).
_contrib_provider: str | None = None
_contrib_lock = threading.Lock()


def native_build(config: KernelConfig) -> tuple[ModuleType | None, str]:
    """(the compiled build that runs nodes of this configuration natively, '') or (None, why not)."""
    if not config.native:
        return None, "the session asked for the Python bridge (native=False)"
    if config.backend != "cpu":
        return None, f"backend {config.backend} runs in Python"
    if cpu.flash_attention is not cpu.PREPARED_FOR:
        return None, "cpu.flash_attention is replaced: the replacement must run"
    module = cpu.selection().module
    if module is None:
        return None, "no compiled kernel"
    if not hasattr(module, "NATIVE_DOMAIN"):
        return None, f"the {cpu.isa()} build has no native op (rebuild ortflash)"
    return module, ""


def native_attributes(attrs: dict[str, Any], threads: int) -> dict[str, Any]:
    """The native node's attributes for a FlashAttention node's own (side channel resolved, policy
    written on the node): the spec's names with the values the compiled kernel takes on the Python
    path (cpu.PreparedCall: floats exact as the kernel's float32, the node's resolved policy), and the
    kernel's own arguments (threads, query tiles); SpecError where the attributes are outside the
    op's contract."""
    call = cpu.kernel_call(attrs)
    return {
        "scale": call.scale,
        "mask_fill": call.mask_fill,
        "softcap": call.softcap,
        "is_causal": call.is_causal,
        "masked_rows": "zero" if call.zero_rows else "nan",
        "softmax": str(call.policy.mode),
        "min_seq_len": int(call.policy.min_seq_len or 0),
        "block_size": call.block_size,
        "bias_after_mask": int(call.bias_after_mask),
        "window_left": call.window_left,
        "window_right": call.window_right,
        "query_tile": cpu.QUERY_TILE,
        "min_query_tile": cpu.MIN_QUERY_TILE,
        "threads": int(threads),
    }


def run_natively(model: onnx.ModelProto, config: KernelConfig) -> int:
    """Rewrite, in place, the FlashAttention nodes of ``model`` (a session's private copy, the policy
    already written on them) that this configuration runs on the compiled kernel into the native op;
    the count rewritten (0: every node stays on the bridge)."""
    module, _ = native_build(config)
    if module is None:
        return 0
    threads = int(config.threads) if config.threads is not None else cpu.default_threads()
    rewritten = 0
    for node in flash_nodes(model):
        if len(node.input) != len(spec.INPUTS) or len(node.output) != 1:
            continue
        try:
            native = native_attributes(node_attributes(node), threads)
        except spec.SpecError:
            continue  # the bridge reports it when the node runs
        del node.attribute[:]
        node.attribute.extend(onnx.helper.make_attribute(name, value) for name, value in native.items())
        node.domain = module.NATIVE_DOMAIN
        rewritten += 1
    if rewritten and not any(o.domain == module.NATIVE_DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(module.NATIVE_DOMAIN, NATIVE_OPSET_VERSION))
    return rewritten


def register(options: ort.SessionOptions, config: KernelConfig) -> None:
    """Register the native op's library (the build in use) on ``options``, once per options."""
    module, why = native_build(config)
    if module is None:
        raise RuntimeError(f"ortflash: no native FlashAttention op: {why}")
    path = str(module.__file__)
    try:
        if options.get_session_config_entry(REGISTERED_KEY) == path:
            return
    except RuntimeError:  # not set
        pass
    options.register_custom_ops_library(path)
    options.add_session_config_entry(REGISTERED_KEY, path)


def calls() -> int:
    """How many native FlashAttention calls the build in use has run in this process."""
    module = cpu.selection().module
    return int(module.native_calls()) if module is not None and hasattr(module, "native_calls") else 0


def provide_contrib_op() -> str:
    """Give onnxruntime-extensions' ``ai.onnx.contrib`` domain a FlashAttention op for plain sessions,
    once per process, before its library is first registered by ortflash: the native op of the build in
    use where it has one ("native"), else the Python bridge's op ("python"). Which one it was."""
    global _contrib_provider
    with _contrib_lock:
        if _contrib_provider is None:
            from . import ort_bridge

            module = cpu.selection().module
            if module is not None and hasattr(module, "bridge_op_address"):
                add = ctypes.CDLL(ort_bridge.library_path()).AddExternalCustomOp
                add.argtypes, add.restype = [ctypes.c_void_p], ctypes.c_bool
                if not add(module.bridge_op_address()):
                    raise RuntimeError("ortflash: onnxruntime-extensions refused the native FlashAttention op")
                _contrib_provider = "native"
            else:
                ort_bridge.register_in_contrib()
                _contrib_provider = "python"
        return _contrib_provider
