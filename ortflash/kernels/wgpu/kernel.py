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

``to_device``, ``run_resident`` and ``to_host`` are the same kernels for a pipeline
whose tensors stay on the GPU (DeviceTensor, resident.py): Q, K, V in wgpu buffers,
O left in one.

One ``Runner`` (one wgpu device) serves the whole process; ``runner()`` makes
it on first use. ``available()`` says whether wgpu finds an adapter at all.

Both are cached with ``functools.lru_cache``, which keeps only results, never
exceptions: a probe or a Runner that fails (no driver yet, a device lost while
starting) raises, is not cached, and the next call tries again, while a
success is found once per process.
"""

from __future__ import annotations

import threading
from functools import lru_cache
from typing import Any

import numpy as np

from ...op import spec
from ...op.policy import SoftmaxPolicy
from .. import reference
from .device import Runner
from .params import Problem
from .resident import DeviceTensor


class AdapterUnavailable(RuntimeError):
    """wgpu cannot be imported, or finds no adapter; the message says which and why."""


@lru_cache(maxsize=1)
def _probe_adapter() -> bool:
    """True once wgpu has found an adapter; raises AdapterUnavailable (not cached) otherwise."""
    try:
        import wgpu  # noqa: F401
    except Exception as e:  # ImportError, or OSError from a missing native library
        raise AdapterUnavailable(f"wgpu cannot be imported: {e}") from e
    from .adapter import find_adapter, no_adapter_message

    search = find_adapter()
    if search.adapter is None:
        raise AdapterUnavailable(no_adapter_message(search))
    return True


def available() -> bool:
    """True when wgpu is importable and finds an adapter (a GPU, or lavapipe)."""
    try:
        return _probe_adapter()
    except Exception:  # noqa: BLE001 -- any failure to probe means "not now"; the next call probes again
        return False


def unavailable_reason() -> str:
    """Why available() is False, in words (empty when it is True)."""
    try:
        _probe_adapter()
    except Exception as e:  # noqa: BLE001 -- the reason is the result
        return str(e)
    return ""


# lru_cache may run a function twice when two threads miss at once; the lock
# makes sure the process gets one device.
_runner_lock = threading.Lock()


@lru_cache(maxsize=1)
def _make_runner() -> Runner:
    return Runner()


def runner() -> Runner:
    """The process-wide Runner (created on first use)."""
    with _runner_lock:
        return _make_runner()


def adapter_info() -> dict[str, Any]:
    """Which adapter/backend the kernels run on (device, backend, driver, features)."""
    return runner().info


def last_device_ms() -> float | None:
    """Device time of the last call in milliseconds (timestamp queries), or None."""
    return runner().last_device_ms


def flash_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    bias: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    *,
    policy: SoftmaxPolicy | None = None,
    bias_after_mask: int = 0,
    **attrs: Any,
) -> np.ndarray:
    """Run FlashAttention in WGSL. Same arguments and results as the numpy reference.

    bias_after_mask=1 adds the bias after the mask and the causal fill (the
    contract's attribute that the bridge passes as a keyword).
    """
    attrs = _validated(attrs, bias_after_mask)
    policy = SoftmaxPolicy.for_node(attrs, policy)
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    empty = reference.no_keys_output(q, k, v)
    if empty is not None:  # no keys: zeros (spec.py), and no zero-size buffers for wgpu
        return empty
    kernel = "flash" if policy.choose(Problem.of(q, k, v).seq_k) == "online" else "naive"
    return runner().attention(q, k, v, bias=bias, mask=mask, attrs=attrs, kernel=kernel)


def _validated(attrs: dict[str, Any], bias_after_mask: int) -> dict[str, Any]:
    """spec.validate(attrs) with the bias_after_mask keyword (how the bridge passes it) added."""
    return spec.validate({**attrs, "bias_after_mask": bias_after_mask})


# ------------------------------------------------------------------------- resident tensors


def to_device(array: np.ndarray) -> DeviceTensor:
    """Upload a [B, H, S, D] array once to the process's GPU device (see resident.py for the layout)."""
    return runner().to_device(array)


def to_host(tensor: DeviceTensor, dtype: Any = None) -> np.ndarray:
    """Read a DeviceTensor back into numpy (its dtype, or `dtype`), waiting for the work that writes it."""
    return runner().to_host(tensor, dtype)


def run_resident(
    q: np.ndarray | DeviceTensor,
    k: np.ndarray | DeviceTensor,
    v: np.ndarray | DeviceTensor,
    bias: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    *,
    policy: SoftmaxPolicy | None = None,
    bias_after_mask: int = 0,
    out: DeviceTensor | None = None,
    **attrs: Any,
) -> DeviceTensor:
    """FlashAttention whose result stays on the GPU: the arguments of ``flash_attention``, with Q, K
    and V numpy arrays or DeviceTensors (``to_device``), and O returned as a DeviceTensor (written
    into ``out`` when given). Nothing is read back and nothing waited for; ``to_host(O)`` reads it.

    A pipeline that keeps its tensors resident uploads K and V once and passes the same
    DeviceTensors to every call that reads them::

        k_dev, v_dev = to_device(k), to_device(v)
        o1 = run_resident(q1, k_dev, v_dev, scale=0.125)
        o2 = run_resident(q2, k_dev, v_dev, scale=0.125, is_causal=1)
        result = to_host(o2)
    """
    attrs = _validated(attrs, bias_after_mask)
    policy = SoftmaxPolicy.for_node(attrs, policy)
    kernel = "flash" if policy.choose(Problem.of(q, k, v).seq_k) == "online" else "naive"
    return runner().attention_resident(q, k, v, bias=bias, mask=mask, attrs=attrs, kernel=kernel, out=out)
