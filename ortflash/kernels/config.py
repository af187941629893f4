"""Which kernel runs a FlashAttention node, and with how many threads: per session, never global.

ONNX Runtime calls the bridge's Python op with nothing but the node's inputs and
attributes, so a session's choice travels on the nodes of the session's own copy of
the model: ``ortflash.InferenceSession`` writes the softmax policy into the nodes'
``softmax``/``block_size``/``min_seq_len`` attributes and the kernel choice into
the ``exact_floats`` side channel (items ``backend=cpu;threads=2``; see ortflash.spec). Two sessions in one
process, or in parallel threads, therefore never see each other's configuration.
A plain ``onnxruntime.InferenceSession`` built with ``ortflash.session_options()``
runs each node as written, on the default backend.
"""

from __future__ import annotations

from dataclasses import dataclass

# One set of backend names for the API, the CLI and the bridge.
#   cpu        the compiled CPU kernel (falls back to `reference`, with one warning, where it
#              is not built or the CPU is not supported)
#   reference  the numpy kernels: the executable spec the others are tested against
#   wgpu       the WGSL flash shader through wgpu (a GPU, or Mesa's lavapipe)
BACKENDS = ("cpu", "reference", "wgpu")
RUNTIME_KEYS = ("backend", "threads")
DEFAULT_BACKEND = "cpu"


class ConfigError(ValueError):
    """A kernel configuration outside what ortflash supports."""


@dataclass(frozen=True)
class KernelConfig:
    backend: str = DEFAULT_BACKEND
    threads: int | None = None  # None: the compiled kernel uses every core it may run on

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"unknown backend {self.backend!r}: use one of {', '.join(BACKENDS)}")
        if self.threads is not None and (isinstance(self.threads, bool) or int(self.threads) < 1):
            raise ConfigError(f"threads must be a positive integer, got {self.threads!r}")

    def encode(self) -> str:
        """The node attribute text; the inverse of :meth:`decode`."""
        parts = [f"backend={self.backend}"]
        if self.threads is not None:
            parts.append(f"threads={int(self.threads)}")
        return ";".join(parts)

    @classmethod
    def decode(cls, text: str | bytes | None) -> KernelConfig:
        """Parse ``backend=...;threads=...``; empty means the defaults."""
        if isinstance(text, bytes):
            text = text.decode()
        fields: dict[str, str] = {}
        for item in filter(None, (text or "").split(";")):
            key, _, value = item.partition("=")
            fields[key.strip()] = value.strip()
        unknown = set(fields) - set(RUNTIME_KEYS)
        if unknown:
            raise ConfigError(f"unknown runtime setting(s): {', '.join(sorted(unknown))}")
        threads = fields.get("threads")
        return cls(backend=fields.get("backend", DEFAULT_BACKEND), threads=int(threads) if threads else None)


def split_side_channel(text: str | bytes | None) -> tuple[KernelConfig, str]:
    """A node's ``exact_floats`` text split into the session's kernel choice and the exact floats."""
    if isinstance(text, bytes):
        text = text.decode()
    items = [item for item in (text or "").split(";") if item]
    runtime = [item for item in items if item.partition("=")[0].strip() in RUNTIME_KEYS]
    floats = [item for item in items if item not in runtime]
    return KernelConfig.decode(";".join(runtime)), ";".join(floats)


def join_side_channel(exact_floats: str | bytes, config: KernelConfig) -> str:
    """``exact_floats`` with any earlier kernel choice replaced by ``config``."""
    _, floats = split_side_channel(exact_floats)
    return ";".join(filter(None, (floats, config.encode())))
