"""Which kernel runs a FlashAttention node, and with how many threads: per session, never global.

ONNX Runtime calls the bridge's Python op with nothing but the node's inputs and
attributes, so a session's choice travels on the nodes of the session's own copy of
the model: ``ortflash.InferenceSession`` writes the softmax policy into the nodes'
``softmax``/``block_size``/``min_seq_len`` attributes and the kernel choice into
the ``exact_floats`` side channel (items ``backend=cpu;threads=2``; see ortflash/op/side_channel.py). Two sessions in one
process, or in parallel threads, therefore never see each other's configuration.
A plain ``onnxruntime.InferenceSession`` built with ``ortflash.session_options()``
runs each node as written, on the default backend.

``native`` says how ONNX Runtime reaches the compiled CPU kernel: as a native custom op
(``kernels/native_op``: the session's copy of each node rewritten to it, no Python per call), or
through onnxruntime-extensions' Python bridge (``native=False``, and always for the other backends).
It is decided when a session opens, so it is not a side-channel item.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..op.side_channel import RUNTIME_KEYS, SideChannel

# One set of backend names for the API, the CLI and the bridge.
#   cpu        the compiled CPU kernel (falls back to `reference`, with one warning, where it
#              is not built or the CPU is not supported)
#   reference  the numpy kernels: the executable spec the others are tested against
#   wgpu       the WGSL flash shader through wgpu (a GPU, or Mesa's lavapipe)
BACKENDS = ("cpu", "reference", "wgpu")
DEFAULT_BACKEND = "cpu"


class ConfigError(ValueError):
    """A kernel configuration outside what ortflash supports."""


@dataclass(frozen=True)
class KernelConfig:
    backend: str = DEFAULT_BACKEND
    threads: int | None = None  # None: the compiled kernel uses every core it may run on
    native: bool = True  # the compiled kernel as a native ONNX Runtime op (kernels/native_op); False: the bridge

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"unknown backend {self.backend!r}: use one of {', '.join(BACKENDS)}")
        if self.threads is not None and (isinstance(self.threads, bool) or int(self.threads) < 1):
            raise ConfigError(f"threads must be a positive integer, got {self.threads!r}")
        if not isinstance(self.native, bool):
            raise ConfigError(f"native must be True or False, got {self.native!r}")

    def runtime_items(self) -> tuple[tuple[str, str], ...]:
        """This choice as the side channel's runtime items (op/side_channel.py)."""
        items = [("backend", self.backend)]
        if self.threads is not None:
            items.append(("threads", str(int(self.threads))))
        return tuple(items)

    @classmethod
    def of_side_channel(cls, channel: SideChannel) -> KernelConfig:
        """The kernel choice a node's side channel carries; none there means the defaults."""
        fields = channel.runtime_fields
        unknown = set(fields) - set(RUNTIME_KEYS)
        if unknown:
            raise ConfigError(f"unknown runtime setting(s): {', '.join(sorted(unknown))}")
        threads = fields.get("threads")
        return cls(backend=fields.get("backend", DEFAULT_BACKEND), threads=int(threads) if threads else None)
