"""Running fused models in ONNX Runtime."""

from __future__ import annotations

import onnx
import onnxruntime as ort

from .optimize import load
from .policy import SoftmaxPolicy


def _policy(softmax=None, block_size=None, min_seq_len=None, online_softmax=None) -> SoftmaxPolicy | None:
    if softmax is None and online_softmax is None and block_size is None and min_seq_len is None:
        return None
    kw = {k: v for k, v in (("block_size", block_size), ("min_seq_len", min_seq_len)) if v is not None}
    if softmax is None:
        return SoftmaxPolicy.from_option(bool(online_softmax), **kw)
    return SoftmaxPolicy(softmax, **kw)


def session_options(*, softmax=None, online_softmax=None, block_size=None, min_seq_len=None, backend=None,
                    base: ort.SessionOptions | None = None) -> ort.SessionOptions:
    """SessionOptions that can run FlashAttention nodes.

    With no policy arguments, each node runs the softmax written on it. Policy
    arguments (or backend='wgpu') apply to every FlashAttention run in this process.
    """
    from .kernels import ort_bridge as ort_op  # registers the op; onnxruntime-extensions is slow to import

    ort_op.configure(backend, _policy(softmax, block_size, min_seq_len, online_softmax))
    so = base or ort.SessionOptions()
    so.register_custom_ops_library(ort_op.library_path())
    return so


class InferenceSession:
    """onnxruntime.InferenceSession for models with FlashAttention nodes.

    ``InferenceSession(model, softmax="online")`` runs every fused node with that
    policy; ``backend="wgpu"`` runs them through the WGSL flash kernel.
    """

    def __init__(self, model_or_path, *, backend: str = "numpy", providers=None, sess_options=None, **policy):
        self._backend = backend
        self._policy = _policy(**policy)
        model = load(model_or_path)
        so = session_options(backend=backend, base=sess_options, **policy)
        self._session = ort.InferenceSession(
            model.SerializeToString(), so, providers=providers or ["CPUExecutionProvider"]
        )

    def run(self, output_names, input_feed, run_options=None):
        from .kernels import ort_bridge as ort_op

        # Kernel choice is process-wide in the bridge: set ours for this call.
        ort_op.configure(self._backend, self._policy)
        return self._session.run(output_names, input_feed, run_options)

    def get_inputs(self):
        return self._session.get_inputs()

    def get_outputs(self):
        return self._session.get_outputs()
