"""Running fused models in ONNX Runtime, with the kernel configuration of each session its own."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from .kernels import native_op
from .kernels.config import DEFAULT_BACKEND, KernelConfig
from .model_io import ModelLike, external_locations, graphs_of, load
from .op import spec
from .op.node import flash_nodes
from .op.policy import SoftmaxPolicy
from .op.side_channel import SideChannel

# ONNX Runtime's session option for its intra-op threads' busy-waiting (see session_options).
SPINNING_KEY = "session.intra_op.allow_spinning"
# Our own mark on options that already have the custom-op library: ORT fails at session creation
# ("Conflicting with a registered kernel") when the same library is registered twice.
REGISTERED_KEY = "ortflash.custom_ops_library"


def session_options(*, base: ort.SessionOptions | None = None) -> ort.SessionOptions:
    """SessionOptions that can run FlashAttention nodes, each with the softmax written on it.

    The nodes run on the native op of the compiled CPU kernel (no Python per call), which reads
    each node's attributes and side channel itself (kernels/native_op.provide_contrib_op); where
    no kernel is compiled, on the numpy reference through onnxruntime-extensions' Python bridge.
    The options hold onnxruntime-extensions' library, its own ``ai.onnx.contrib`` ops included
    (tokenizers and the rest): do not register it on them again. Intra-op spinning is off
    unless ``base`` sets it (``session.intra_op.allow_spinning``). For another policy, backend
    or thread count, use :class:`InferenceSession`, or :func:`configure_model` on the model
    before opening a plain session.
    """
    from .kernels import ort_bridge  # the Python op; onnxruntime-extensions is slow to import

    so = base or ort.SessionOptions()
    if not _config_entry(so, REGISTERED_KEY):
        native_op.provide_contrib_op()  # before the library's domain is made from its op tables
        so.register_custom_ops_library(ort_bridge.library_path())
        so.add_session_config_entry(REGISTERED_KEY, ort_bridge.library_path())
    # The compiled kernel runs its own threads, one per core, outside ONNX Runtime's pool;
    # ORT's idle pool threads spin through the whole node by default and take those cores
    # (S=4096 causal prefill, 2 cores: about 0.13 s of spinning per 0.4 s run, 1.3-1.6x the
    # wall time; benchmarks/results/causal_proof.md). The kernel's threads no longer start per
    # call (a parked pool), but spinning stays off: on the 2-core AVX-512 Xeon shared with other
    # jobs, spinning on cost a 6-layer MiniLM export 1.7-2x the CPU time per run, fused or not
    # (original S=32: 17.5 vs 9.9 ms, S=256: 99 vs 62 ms; fused 20.4 vs 11.0 and 113 vs 66 ms;
    # 2026-12-01, benchmarks/results/short_seq_breakdown.md). A choice already made in `base` stands.
    if _config_entry(so, SPINNING_KEY) is None:
        so.add_session_config_entry(SPINNING_KEY, "0")
    return so


def _config_entry(so: ort.SessionOptions, key: str) -> str | None:
    try:
        return str(so.get_session_config_entry(key))
    except RuntimeError:  # not set
        return None


def _set_attribute(node: onnx.NodeProto, name: str, value: Any) -> None:
    for i, attr in enumerate(node.attribute):
        if attr.name == name:
            del node.attribute[i]
            break
    node.attribute.append(onnx.helper.make_attribute(name, value))


def to_python_bridge(model: onnx.ModelProto) -> int:
    """Move, in place, the FlashAttention nodes of ``model`` (a session's private copy) still in
    ``ai.onnx.contrib`` to the Python bridge's domain (kernels/ort_bridge.py): there
    ``ai.onnx.contrib``'s FlashAttention is the native op. The count moved."""
    from .kernels.ort_bridge import PYTHON_DOMAIN

    moved = 0
    for node in flash_nodes(model):
        node.domain = PYTHON_DOMAIN
        moved += 1
    if moved and not any(o.domain == PYTHON_DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(PYTHON_DOMAIN, spec.DOMAIN_VERSION))
    return moved


def from_python_bridge(model: onnx.ModelProto) -> None:
    """Undo :func:`to_python_bridge` in place (a configured copy configured again)."""
    from .kernels.ort_bridge import PYTHON_DOMAIN

    for graph in graphs_of(model.graph):
        for node in graph.node:
            if node.domain == PYTHON_DOMAIN and node.op_type == spec.OP_TYPE:
                node.domain = spec.DOMAIN


def configure_model(
    model: onnx.ModelProto, *, policy: SoftmaxPolicy | None = None, config: KernelConfig | None = None
) -> onnx.ModelProto:
    """A copy of ``model`` whose FlashAttention nodes run with this policy and kernel configuration.

    The policy replaces each node's ``softmax``/``block_size``/``min_seq_len``; the kernel
    configuration goes into the side channel (see ortflash.kernels.config), which the native op
    of a plain session reads (threads). A configuration the native op does not run (another
    backend, ``native=False``, a replaced kernel) moves the nodes to the Python bridge's domain
    (:func:`to_python_bridge`). The model given is not changed.
    """
    configured = onnx.ModelProto()
    configured.CopyFrom(model)
    from_python_bridge(configured)
    for node in flash_nodes(configured):
        if policy is not None:
            for name, value in policy.attributes().items():
                _set_attribute(node, name, value)
        if config is not None:
            text = next((a.s for a in node.attribute if a.name == "exact_floats"), b"")
            channel = SideChannel.decode(text).with_runtime(config.runtime_items())
            _set_attribute(node, "exact_floats", channel.encode())
    if config is not None and native_op.native_build(config)[0] is None:
        to_python_bridge(configured)
    return configured


class InferenceSession:
    """onnxruntime.InferenceSession for models with FlashAttention nodes.

    ``InferenceSession(model, softmax="online")`` (or ``policy=SoftmaxPolicy(...)``, the same
    object the pipeline passes) runs every fused node of this session with that policy; ``backend`` picks the kernel (``cpu``: compiled, the default;
    ``reference``: numpy; ``wgpu``: the WGSL flash shader) and ``threads`` the compiled
    kernel's thread count (None: ``sess_options.intra_op_num_threads`` where it is set, else every
    core this process may run on). Each session carries its own choice: sessions in one process,
    or running in parallel threads, do not affect each other.

    The compiled kernel runs as a native ONNX Runtime op (``ortflash.kernels.native_op``: no
    Python per call), as in a plain session made with :func:`session_options`; ``native=False``
    keeps it on onnxruntime-extensions' Python bridge, which the other backends, a replaced
    ``cpu.flash_attention`` and nodes outside the op's contract always take. ``native_nodes``
    says how many nodes of this session run natively.
    """

    def __init__(
        self,
        model_or_path: ModelLike,
        *,
        backend: str = DEFAULT_BACKEND,
        threads: int | None = None,
        providers: Sequence[str] | None = None,
        sess_options: ort.SessionOptions | None = None,
        policy: SoftmaxPolicy | None = None,
        softmax: str | None = None,
        online_softmax: bool | None = None,
        block_size: int | None = None,
        min_seq_len: int | None = None,
        native: bool = True,
    ) -> None:
        if threads is None and sess_options is not None and sess_options.intra_op_num_threads > 0:
            # the session's own thread count, which the kernel's pool does not read from ONNX Runtime
            threads = sess_options.intra_op_num_threads
        self.config = KernelConfig(backend=backend, threads=threads, native=native)
        options = SoftmaxPolicy.from_options(
            softmax=softmax, online_softmax=online_softmax, block_size=block_size, min_seq_len=min_seq_len
        )
        if policy is not None and options is not None:
            raise spec.SpecError("give either policy or the softmax options (softmax, block_size, ...), not both")
        self.policy = policy if policy is not None else options
        model = configure_model(load(model_or_path), policy=self.policy, config=self.config)
        self.native_nodes = native_op.run_natively(model, self.config)
        # the rest to the Python bridge: ai.onnx.contrib's FlashAttention is the plain sessions' native op
        to_python_bridge(model)
        so = session_options(base=sess_options)
        if self.native_nodes:
            native_op.register(so, self.config)
        if isinstance(model_or_path, (str, os.PathLike)) and external_locations(model):
            # ORT resolves the external data of a model given as bytes against the cwd unless told its folder
            folder = os.path.dirname(os.path.abspath(os.fspath(model_or_path)))
            if _config_entry(so, "session.model_external_initializers_file_folder_path") != folder:
                so.add_session_config_entry("session.model_external_initializers_file_folder_path", folder)
        self._session = ort.InferenceSession(
            model.SerializeToString(), so, providers=list(providers or ["CPUExecutionProvider"])
        )

    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: dict[str, np.ndarray],
        run_options: ort.RunOptions | None = None,
    ) -> list[np.ndarray]:
        return self._session.run(output_names, input_feed, run_options)

    def get_inputs(self) -> list[ort.NodeArg]:
        return self._session.get_inputs()

    def get_outputs(self) -> list[ort.NodeArg]:
        return self._session.get_outputs()
