"""FlashAttention on the GPU through wgpu: the WGSL kernels behind a numpy interface.

``flash_attention`` has the signature and semantics of
``ortflash.kernels.reference.flash_attention``: Q [B, Hq, Sq, D], K [B, Hkv, Sk, D],
V [B, Hkv, Sk, Dv], optional additive ``bias`` and boolean ``mask``
broadcastable to [B, Hq, Sq, Sk], the spec's attributes as keywords, and a
``policy`` whose choice for the key length picks the shader: ``naive`` runs
naive.wgsl (three passes, the score rows in device memory), ``online`` runs
flash.wgsl (key tiles, running max and running sum). The result is a numpy
array of Q's dtype, accumulated in float32.

The WGSL kernels choose their own key tile from the adapter's limits, so the
``block_size`` attribute does not change which keys share a tile there (the
results agree with the reference to float32 rounding either way).

One ``Runner`` (one wgpu device) serves the whole process; ``runner()`` makes
it on first use. ``available()`` says whether wgpu finds an adapter at all.
"""

from __future__ import annotations

import threading

import numpy as np

from .. import spec
from ..policy import SoftmaxPolicy

_lock = threading.Lock()
_runner = None
_available: bool | None = None


def available() -> bool:
    """True when wgpu is importable and finds an adapter (a GPU, or lavapipe)."""
    global _available
    if _available is None:
        try:
            from ..shaders.runner import pick_adapter

            _available = pick_adapter() is not None
        except Exception:
            _available = False
    return _available


def unavailable_reason() -> str:
    """Why available() is False, in words (empty when it is True)."""
    try:
        import wgpu  # noqa: F401
    except Exception as e:  # pragma: no cover
        return f"wgpu cannot be imported: {e}"
    if available():
        return ""
    from ..shaders import runner as _r

    return (
        "wgpu found no adapter: no GPU driver and no software Vulkan driver "
        f"(install Mesa's lavapipe, Debian package mesa-vulkan-drivers) [{_r.last_adapter_error}]"
    )


def runner():
    """The process-wide Runner (created on first use)."""
    global _runner
    with _lock:
        if _runner is None:
            from ..shaders.runner import Runner

            _runner = Runner()
        return _runner


def adapter_info() -> dict:
    """Which adapter/backend the kernels run on (device, backend, driver, features)."""
    return runner().info


def last_device_ms() -> float | None:
    """Device time of the last call in milliseconds (timestamp queries), or None."""
    return runner().last_device_ms


def flash_attention(q, k, v, bias=None, mask=None, *, policy: SoftmaxPolicy | None = None, **attrs) -> np.ndarray:
    """Run FlashAttention in WGSL. Same arguments and results as the numpy reference."""
    attrs = spec.validate(attrs)
    policy = policy or SoftmaxPolicy.from_attributes(attrs)
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"FlashAttention wants 4D Q, K, V; got {q.shape}, {k.shape}, {v.shape}")
    kernel = "flash" if policy.choose(k.shape[2]) == "online" else "naive"
    return runner().attention(q, k, v, bias, mask, attrs=attrs, kernel=kernel)
