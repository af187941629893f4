"""One wgpu device running the WGSL attention kernels (naive.wgsl, flash.wgsl): ``Runner``.

``Runner`` owns one wgpu device. It creates the device with the adapter's own
limits and the features the kernels can use (``shader-f16``,
``timestamp-query``, ``subgroup``), probes the subgroup size once, compiles
each specialised shader once (without naga's run-time checks where wgpu-native
allows it: trusted.py), keeps device and staging buffers between calls whose
sizes repeat, and reads the device time of every call from timestamp queries
when the adapter has them. ``last_timing`` splits the host-to-host time of the
last call into its stages.

One call goes: host operands and Params (params.py), the dispatch plan
(plan.py), upload and bind, encode and submit, read back. ``attention_resident``
is the same call with DeviceTensors (resident.py) bound instead of uploaded and
O left on the device; ``to_device``, ``to_host`` and ``sync`` go with it.

The device's buffers are kept by buffers.py (BufferCache), its pipelines by
pipelines.py, a call is bound, encoded, submitted and read back by encode.py
(CallEncoder), the subgroup size and timestamp tick are probed by probes.py, and
tiles are timed on it by autotune.py; what stays here is the device's setup, the
tile choice, and the calls that share its lock and its pending timestamps.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np
from typing_extensions import Required, Unpack

from .adapter import find_adapter, no_adapter_message
from .autotune import tune_on_device
from .buffers import BUFFER_GRANULE, BufferCache
from .encode import CallEncoder
from .hostcopy import HostCopier
from .limits import WANTED_FEATURES, WANTED_LIMITS, DeviceLimits
from .params import HostOperands, Operand, Problem, prepare
from .pipelines import Pipelines
from .plan import Plan, check_kernel, plan
from .probes import probe_subgroup_size, timestamp_period
from .resident import DeviceTensor, padded_host_array
from .tiles import FlashTile, flash_tiles
from .tuner import TileCache, TuneKey

if TYPE_CHECKING:
    import wgpu


DEFAULT_KERNEL = "flash"  # what a call that names no kernel runs


class AttentionCall(TypedDict, total=False):
    """What one attention call takes besides Q, K and V, for ``Runner.attention`` and
    ``Runner.attention_resident`` alike (keywords)."""

    attrs: Required[Mapping[str, Any]]  # the node's attributes, as spec.validate gives them
    bias: np.ndarray | None  # the node's bias input (spec.py), None where absent
    mask: np.ndarray | None  # the node's mask input (spec.py), None where absent
    kernel: str  # 'flash' (DEFAULT_KERNEL) or 'naive'
    tile: FlashTile | None  # overrides the flash kernel's tile
    score_chunk_bytes: int | None  # caps the naive kernel's score buffer


class Runner:
    """One wgpu device running the attention kernels.

    Calls are serialised by a lock: they share device buffers, and wgpu's
    calls release the GIL (ONNX Runtime may run custom ops from several threads).
    """

    def __init__(
        self,
        adapter: wgpu.GPUAdapter | None = None,
        *,
        use_f16: bool = True,
        use_timestamps: bool = True,
        use_subgroups: bool = True,
        trusted_shaders: bool = True,
        tile_cache: TileCache | None = None,
        causal_heavy_first: bool = True,
    ) -> None:
        import wgpu

        self.wgpu = wgpu
        if adapter is None:
            search = find_adapter()
            if search.adapter is None:
                raise RuntimeError(no_adapter_message(search))
            adapter = search.adapter
        self.adapter = adapter
        features = [f for f in WANTED_FEATURES if f in adapter.features]
        if not use_f16 and "shader-f16" in features:
            features.remove("shader-f16")
        if not use_timestamps and "timestamp-query" in features:
            features.remove("timestamp-query")
        if not use_subgroups and "subgroup" in features:
            features.remove("subgroup")
        limits = {k: adapter.limits[k] for k in WANTED_LIMITS if k in adapter.limits}
        self.device = adapter.request_device_sync(required_features=features, required_limits=limits)
        self.limits: dict[str, int] = dict(self.device.limits)
        self.device_limits = DeviceLimits.from_device(self.limits)
        self.features: set[str] = set(self.device.features)
        self.has_f16 = "shader-f16" in self.features
        self.has_timestamps = "timestamp-query" in self.features
        self.queue = self.device.queue
        self.last_device_ms: float | None = None  # device time of the last call (timestamp queries)
        self.last_host_ms: float | None = None  # host-to-host time of the last call
        self.last_plan: dict[str, Any] = {}  # what the last call ran (kernel, tile, chunks)
        self.last_timing: dict[str, float] = {}  # host ms of each stage of the last call
        self.trusted_shaders = trusted_shaders  # compile without naga's bounds checks when possible (pipelines.py)
        # Where flash tiles tuned for this adapter are looked up (tune_flash writes them); None: not at all.
        self.tile_cache = tile_cache
        # Causal with skipped tiles: run the heaviest row tiles first (flash.wgsl); False for A/B timing.
        self.causal_heavy_first = causal_heavy_first
        self._cached_tiles: dict[TuneKey, FlashTile | None] = {}
        # The timestamp read-back of the last attention_resident call, until sync() reads it.
        self._pending_timestamps: wgpu.GPUBuffer | None = None
        self._copier = HostCopier()  # host <-> staging copies on several threads
        self.buffers = BufferCache(self.device, self.device_limits, self._copier)
        self._buffers = self.buffers.by_role  # the same dict (tests look at it)
        self.uploads = self.buffers.uploads  # host-to-device uploads so far, per role (q, k, v, bias, ...)
        self._lock = threading.RLock()
        self.pipelines = Pipelines(self.device, trusted_shaders=trusted_shaders)
        self._pipelines = self.pipelines.by_key  # the same dict (tests look at it)
        self._calls = CallEncoder(
            self.device,
            self.device_limits,
            self.buffers,
            self.pipelines,
            self._copier,
            timestamps=self.has_timestamps,
            timestamp_period=timestamp_period(self.queue) if self.has_timestamps else 1.0,
        )
        # Lanes per subgroup when flash.wgsl may reduce rows by shuffles; 0 when it may not.
        self.subgroup_size = probe_subgroup_size(self.device) if "subgroup" in self.features else 0

    @property
    def info(self) -> dict[str, Any]:
        """Which adapter and backend this runner uses."""
        i = self.adapter.info
        return {
            "device": i.get("device", ""),
            "vendor": i.get("vendor", ""),
            "backend": i.get("backend_type", ""),
            "adapter_type": i.get("adapter_type", ""),
            "driver": i.get("description", ""),
            "shader_f16": self.has_f16,
            "timestamp_query": self.has_timestamps,
            "subgroup_size": self.subgroup_size,
            "trusted_shaders": self.trusted_shaders,
            "max_workgroup_storage": self.limits.get("max-compute-workgroup-storage-size"),
            "max_invocations": self.limits.get("max-compute-invocations-per-workgroup"),
            "max_storage_binding": self.limits.get("max-storage-buffer-binding-size"),
        }

    def _fits(self, tile: FlashTile, d4: int) -> bool:
        return (
            tile.smem_bytes(d4, self.subgroup_size) <= self.device_limits.workgroup_storage_bytes
            and tile.workgroup_size <= self.device_limits.invocations_per_workgroup
        )

    def cached_flash_tile(self, d4: int, dv4: int, io: str) -> FlashTile | None:
        """The tile tile_cache holds for this adapter, head dims and io, when it fits the device."""
        if self.tile_cache is None:
            return None
        key = TuneKey.of(self.info, d4, dv4, io)
        if key not in self._cached_tiles:
            tile = self.tile_cache.get(key)
            self._cached_tiles[key] = tile if tile is not None and self._fits(tile, d4) else None
        return self._cached_tiles[key]

    def tune_flash(
        self, d: int, dv: int, io: str, cache: TileCache, *, seq: int = 4096, heads: int = 16, top: int = 8
    ) -> FlashTile:
        """The fastest flash tile for head dims d, dv and io on this adapter: from `cache` when it
        has one for this adapter and driver, else the `top` tiles of the cost model (each in both
        K/V layouts) timed on this device (autotune.py), the winner written to `cache`."""
        d4, dv4 = -(-d // 4), -(-dv // 4)
        ranked = flash_tiles(
            d4,
            dv4,
            seq,
            self.device_limits.workgroup_storage_bytes,
            self.device_limits.invocations_per_workgroup,
            subgroup_size=self.subgroup_size,
        )[:top]
        candidates = [t for tile in ranked for t in (tile, replace(tile, kv_split=1)) if self._fits(t, d4)]
        key = TuneKey.of(self.info, d4, dv4, io)
        tile = tune_on_device(self, key, candidates, cache, d=d, dv=dv, seq=seq, heads=heads)
        if cache is self.tile_cache:
            self._cached_tiles[key] = tile
        return tile

    def pipeline(self, kernel: str, entry: str, io: str, constants: Mapping[str, int]) -> wgpu.GPUComputePipeline:
        """A compiled pipeline, cached by (kernel, io, specialisation, entry point)."""
        return self.pipelines.get(kernel, entry, io, constants)

    # ---------------------------------------------------------------- attention

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, **call: Unpack[AttentionCall]) -> np.ndarray:
        """O = attention(Q, K, V) by ``call["kernel"]`` ('flash' or 'naive'): O [B, Hq, Sq, Dv] with Q's dtype."""
        with self._lock:
            t_start = time.perf_counter()
            problem, operands = self._laid_out(q, k, v, call)
            if problem.is_empty:
                return np.zeros((problem.batch, problem.heads_q, problem.seq_q, problem.value_dim), q.dtype)
            call_plan = self._plan_call(problem, operands, call)
            t_prepared = time.perf_counter()
            bound = self._calls.bind(problem, operands, call_plan, None)
            t_staged = time.perf_counter()
            staging, timestamps = self._calls.submit(call_plan, bound, read_back=True)
            assert staging is not None
            t_submitted = time.perf_counter()
            staging.map_sync(self.wgpu.MapMode.READ, 0, staging.size)  # waits for the device
            t_done = time.perf_counter()
            out = self._calls.read_output(staging, bound.output.size, problem, operands.host_dtype, q.dtype)
            self.last_device_ms = self._calls.read_device_ms(timestamps) if timestamps is not None else None
            self._pending_timestamps = None  # read just now, with the last call's
            t_end = time.perf_counter()
            self.last_host_ms = (t_end - t_start) * 1e3
            self.last_timing = {
                "prepare_ms": (t_prepared - t_start) * 1e3,  # checks, host layout, plan
                "stage_ms": (t_staged - t_prepared) * 1e3,  # memcpy into the mapped staging buffers, bind
                "submit_ms": (t_submitted - t_staged) * 1e3,  # encode and submit
                "wait_ms": (t_done - t_submitted) * 1e3,  # uploads, kernel and read-back copy on the device
                "read_ms": (t_end - t_done) * 1e3,  # copy out of the mapped buffer, timestamps
            }
            return out

    def _laid_out(self, q: Operand, k: Operand, v: Operand, call: AttentionCall) -> tuple[Problem, HostOperands]:
        """The call's problem and its host operands (checks and host layout; ``attention`` and
        ``attention_resident`` alike)."""
        problem = Problem.of(q, k, v)
        check_kernel(call.get("kernel", DEFAULT_KERNEL))
        operands = prepare(
            problem,
            q,
            k,
            v,
            call.get("bias"),
            call.get("mask"),
            call["attrs"],
            f16_on_device=self.has_f16,
            heavy_first=self.causal_heavy_first,
        )
        return problem, operands

    def _plan_call(self, problem: Problem, operands: HostOperands, call: AttentionCall) -> Plan:
        """The dispatch plan of one call whose operands are laid out (a non-empty problem)."""
        kernel, tile = call.get("kernel", DEFAULT_KERNEL), call.get("tile")
        if kernel == "flash" and tile is None:
            tile = self.cached_flash_tile(problem.d4, problem.dv4, operands.io)
        call_plan = plan(
            kernel,
            problem,
            operands.io,
            operands.params,
            tile=tile,
            score_chunk_bytes=call.get("score_chunk_bytes"),
            limits=self.device_limits,
            subgroup_size=self.subgroup_size,
        )
        self.last_plan = call_plan.summary
        return call_plan

    # ---------------------------------------------------------------- resident tensors

    def to_device(self, array: np.ndarray) -> DeviceTensor:
        """A new DeviceTensor holding `array` [B, H, S, D] (float16 stays float16 where the device
        has shader-f16; anything else becomes float32). One upload; the tensor is then reused by
        every call it is passed to."""
        array = np.asarray(array)
        if array.ndim != 4:
            raise ValueError(f"a DeviceTensor is [B, H, S, D]; got shape {array.shape}")
        dtype = np.dtype(np.float16 if array.dtype == np.float16 and self.has_f16 else np.float32)
        data = padded_host_array(array, dtype)
        self.device_limits.check_binding("tensor", data.nbytes)
        usage = self.wgpu.BufferUsage.STORAGE | self.wgpu.BufferUsage.COPY_SRC | self.wgpu.BufferUsage.COPY_DST
        with self._lock:
            buffer = self.device.create_buffer(size=max(BUFFER_GRANULE, -(-data.nbytes // 4) * 4), usage=usage)
            if data.nbytes:
                self.queue.write_buffer(buffer, 0, data.reshape(-1).view(np.uint8))
        return DeviceTensor(buffer, tuple(int(n) for n in array.shape), dtype, self.device)  # type: ignore[arg-type]

    def empty_tensor(self, shape: tuple[int, int, int, int], dtype: np.dtype[Any]) -> DeviceTensor:
        """An uninitialised DeviceTensor, say for ``attention_resident(out=...)`` to write into."""
        b, h, s, d = shape
        nbytes = b * h * s * (-(-d // 4) * 4) * np.dtype(dtype).itemsize
        self.device_limits.check_binding("tensor", nbytes)
        usage = self.wgpu.BufferUsage.STORAGE | self.wgpu.BufferUsage.COPY_SRC | self.wgpu.BufferUsage.COPY_DST
        buffer = self.device.create_buffer(size=max(BUFFER_GRANULE, -(-nbytes // 4) * 4), usage=usage)
        return DeviceTensor(buffer, (b, h, s, d), np.dtype(dtype), self.device)

    def to_host(self, tensor: DeviceTensor, dtype: Any = None) -> np.ndarray:
        """The tensor's values as a numpy array (its own dtype, or `dtype`); waits for the work that
        writes it. The read-back buffer is reused across calls."""
        self._check_own(tensor)
        b, h, s, d = tensor.shape
        out = np.empty(tensor.shape, dtype or tensor.dtype)
        if not tensor.nbytes:
            return out
        with self._lock:
            usage = self.wgpu.BufferUsage.MAP_READ | self.wgpu.BufferUsage.COPY_DST
            staging = self.buffers.get("staging", tensor.nbytes, usage)
            encoder = self.device.create_command_encoder()
            encoder.copy_buffer_to_buffer(tensor.buffer, 0, staging, 0, -(-tensor.nbytes // 4) * 4)
            self.queue.submit([encoder.finish()])
            staging.map_sync(self.wgpu.MapMode.READ, 0, staging.size)
            view = staging.read_mapped(0, tensor.nbytes, copy=False)
            rows = b * h * s
            mapped = np.frombuffer(view, dtype=tensor.dtype).reshape(rows, tensor.padded_dim)[:, :d]
            self._copier.copy(out.reshape(rows, d), mapped)
            del mapped, view
            staging.unmap()
        return out

    def sync(self) -> float | None:
        """Wait until the work submitted so far is done; returns (and sets) last_device_ms, the device
        time of the last attention call, when the device has timestamps."""
        with self._lock:
            if self._pending_timestamps is not None:
                self.last_device_ms = self._calls.read_device_ms(self._pending_timestamps)
                self._pending_timestamps = None
            else:
                self.queue.on_submitted_work_done_sync()
            return self.last_device_ms

    def _check_own(self, tensor: DeviceTensor) -> None:
        if tensor.device is not self.device:
            raise ValueError("this DeviceTensor belongs to another wgpu device than the runner's")

    def attention_resident(
        self, q: Operand, k: Operand, v: Operand, *, out: DeviceTensor | None = None, **call: Unpack[AttentionCall]
    ) -> DeviceTensor:
        """O = attention(Q, K, V) with O left on the device: a DeviceTensor [B, Hq, Sq, Dv].

        Q, K and V may be DeviceTensors (bound as they are: no upload) or numpy
        arrays (staged and uploaded as ``attention`` does); bias and mask are
        numpy. The work is submitted and not waited for: WebGPU orders it before
        anything submitted later (a next call, ``to_host``), and ``sync()`` waits
        for it. O is written into ``out`` when given (same shape and dtype; not an
        input of this call), else into a new buffer.
        """
        with self._lock:
            t_start = time.perf_counter()
            for t in (q, k, v, out):
                if isinstance(t, DeviceTensor):
                    self._check_own(t)
            problem, operands = self._laid_out(q, k, v, call)
            shape = (problem.batch, problem.heads_q, problem.seq_q, problem.value_dim)
            dtype = np.dtype(operands.host_dtype)
            if out is None:
                out = self.empty_tensor(shape, dtype)
            elif out.shape != shape or out.dtype != dtype:
                raise ValueError(f"out is {out.shape} {out.dtype}; this call writes {shape} {dtype}")
            elif any(t.buffer is out.buffer for t in (q, k, v) if isinstance(t, DeviceTensor)):
                raise ValueError("out may not be an input of the same call (WebGPU binds it read-only there)")
            if problem.is_empty:
                return out
            call_plan = self._plan_call(problem, operands, call)
            bound = self._calls.bind(problem, operands, call_plan, out)
            _, self._pending_timestamps = self._calls.submit(call_plan, bound, read_back=False)
            self.last_device_ms = None
            self.last_host_ms = (time.perf_counter() - t_start) * 1e3  # host time to submit, not to finish
            return out
