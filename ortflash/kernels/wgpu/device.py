"""Run the WGSL attention kernels (naive.wgsl, flash.wgsl) through wgpu.

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

The device's buffers are kept by buffers.py (BufferCache) and tiles are timed
on it by autotune.py; what stays here shares one device's state (the lock, the
pipelines, the pending timestamps).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .adapter import find_adapter, no_adapter_message
from .assemble import assemble, read_shader
from .buffers import BUFFER_GRANULE, BoundBuffer, BufferCache, Upload
from .hostcopy import HostCopier
from .limits import WANTED_FEATURES, WANTED_LIMITS, DeviceLimits
from .params import PARAMS_DTYPE, HostOperands, Operand, Problem, prepare
from .plan import Plan, check_kernel, plan
from .resident import DeviceTensor, padded_host_array
from .tiles import FlashTile, choose_flash_tile, flash_tiles
from .trusted import create_trusted_module
from .tuner import TileCache, TuneKey

if TYPE_CHECKING:
    import wgpu

# Two u64 timestamps: the start and the end of the compute pass.
_TIMESTAMP_BYTES = 16
# Invocations of the subgroup probe's one workgroup: several subgroups of any size up to 64.
_PROBE_INVOCATIONS = 256


@dataclass(frozen=True)
class _Bound:
    """What one call's encoder needs: a bind group per dispatch, the uploads, the output buffer."""

    groups: list[wgpu.GPUBindGroup]
    uploads: list[Upload]
    output: BoundBuffer


def _timestamp_period(queue: wgpu.GPUQueue) -> float:
    """Nanoseconds per timestamp tick (wgpu-native; 1.0 where it is not exposed)."""
    try:
        from wgpu.backends.wgpu_native._ffi import lib

        period = float(lib.wgpuQueueGetTimestampPeriod(queue._internal))
        return period if period > 0 else 1.0
    except Exception:  # noqa: BLE001 -- a private wgpu-native API; without it, ticks are taken as ns
        return 1.0


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
        self._ts_period = _timestamp_period(self.queue) if self.has_timestamps else 1.0
        self.last_device_ms: float | None = None  # device time of the last call (timestamp queries)
        self.last_host_ms: float | None = None  # host-to-host time of the last call
        self.last_plan: dict[str, Any] = {}  # what the last call ran (kernel, tile, chunks)
        self.last_timing: dict[str, float] = {}  # host ms of each stage of the last call
        self.trusted_shaders = trusted_shaders  # compile without naga's bounds checks when possible
        # Where flash tiles tuned for this adapter are looked up (tune_flash writes them); None: not at all.
        self.tile_cache = tile_cache
        # Causal with skipped tiles: run the heaviest row tiles first (flash.wgsl); False for A/B timing.
        self.causal_heavy_first = causal_heavy_first
        self._cached_tiles: dict[TuneKey, FlashTile | None] = {}
        self._modules: dict[tuple[Any, ...], wgpu.GPUShaderModule] = {}
        self._pipelines: dict[tuple[Any, ...], wgpu.GPUComputePipeline] = {}
        # The timestamp read-back of the last attention_resident call, until sync() reads it.
        self._pending_timestamps: wgpu.GPUBuffer | None = None
        self._copier = HostCopier()  # host <-> staging copies on several threads
        self.buffers = BufferCache(self.device, self.device_limits, self._copier)
        self._buffers = self.buffers.by_role  # the same dict (tests look at it)
        self.uploads = self.buffers.uploads  # host-to-device uploads so far, per role (q, k, v, bias, ...)
        self._lock = threading.RLock()
        self._bind_group_layout, self._layout = self._make_layouts()
        if self.has_timestamps:
            self._query_set = self.device.create_query_set(type="timestamp", count=2)
        # Lanes per subgroup when flash.wgsl may reduce rows by shuffles; 0 when it may not.
        self.subgroup_size = self._probe_subgroup_size() if "subgroup" in self.features else 0

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

    def flash_tile(self, d: int, dv: int, sq: int = 4096, io: str = "f32") -> FlashTile:
        """The flash tile this adapter runs for head dims d, dv, Sq query rows and io (f32/f16)."""
        return choose_flash_tile(-(-d // 4), -(-dv // 4), sq, io, self.device_limits, self.subgroup_size)

    def _probe_subgroup_size(self) -> int:
        """The subgroup size of a compute workgroup, or 0 when subgroups are not runs of
        consecutive invocations or differ in size (then the kernels reduce through memory)."""
        wgpu = self.wgpu
        code = read_shader("probe_subgroup.wgsl").replace("${WG}", str(_PROBE_INVOCATIONS))
        module = self.device.create_shader_module(code=code)
        pipe = self.device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
        nbytes = 8 * _PROBE_INVOCATIONS
        out = self.device.create_buffer(size=nbytes, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
        group = self.device.create_bind_group(
            layout=pipe.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": out}}]
        )
        encoder = self.device.create_command_encoder()
        cpass = encoder.begin_compute_pass()
        cpass.set_pipeline(pipe)
        cpass.set_bind_group(0, group)
        cpass.dispatch_workgroups(1)
        cpass.end()
        self.queue.submit([encoder.finish()])
        probe = np.frombuffer(self.queue.read_buffer(out), np.uint32).reshape(_PROBE_INVOCATIONS, 2)
        out.destroy()
        sizes, lanes = probe[:, 0], probe[:, 1]
        size = int(sizes[0])
        if size <= 0 or (sizes != size).any():
            return 0
        if not np.array_equal(lanes, np.arange(_PROBE_INVOCATIONS, dtype=np.uint32) % size):
            return 0
        return size

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
        from .autotune import tune_on_device

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

    # ---------------------------------------------------------------- device objects

    def _make_layouts(self) -> tuple[wgpu.GPUBindGroupLayout, wgpu.GPUPipelineLayout]:
        """The one bind group layout all kernels share (bindings 0-7 of common/io/naive.wgsl)."""
        wgpu = self.wgpu
        ro = {"type": wgpu.BufferBindingType.read_only_storage}
        rw = {"type": wgpu.BufferBindingType.storage}
        kinds = [{"type": wgpu.BufferBindingType.uniform}, ro, ro, ro, ro, ro, rw, rw]
        entries = [
            {"binding": i, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": kind} for i, kind in enumerate(kinds)
        ]
        bind_group_layout = self.device.create_bind_group_layout(entries=entries)
        return bind_group_layout, self.device.create_pipeline_layout(bind_group_layouts=[bind_group_layout])

    def pipeline(self, kernel: str, entry: str, io: str, constants: Mapping[str, int]) -> wgpu.GPUComputePipeline:
        """A compiled pipeline, cached by (kernel, io, specialisation, entry point)."""
        key = (kernel, entry, io, tuple(sorted(constants.items())))
        pipe = self._pipelines.get(key)
        if pipe is None:
            module_key = (kernel, io, key[3])
            module = self._modules.get(module_key)
            if module is None:
                code = assemble(kernel, io, constants)
                module = create_trusted_module(self.device, code, kernel) if self.trusted_shaders else None
                if module is None:
                    module = self.device.create_shader_module(code=code)
                self._modules[module_key] = module
            pipe = self.device.create_compute_pipeline(
                layout=self._layout, compute={"module": module, "entry_point": entry}
            )
            self._pipelines[key] = pipe
        return pipe

    # ---------------------------------------------------------------- attention

    def attention(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        bias: np.ndarray | None = None,
        mask: np.ndarray | None = None,
        *,
        attrs: Mapping[str, Any],
        kernel: str = "flash",
        tile: FlashTile | None = None,
        score_chunk_bytes: int | None = None,
    ) -> np.ndarray:
        """O = attention(Q, K, V) by `kernel` ('flash' or 'naive'); attrs as spec.validate gives them.

        Returns O [B, Hq, Sq, Dv] with Q's dtype. ``tile`` overrides the flash
        tile; ``score_chunk_bytes`` caps the naive kernel's score buffer.
        """
        with self._lock:
            t_start = time.perf_counter()
            problem = Problem.of(q, k, v)
            check_kernel(kernel)
            if problem.is_empty:
                return np.zeros((problem.batch, problem.heads_q, problem.seq_q, problem.value_dim), q.dtype)
            operands, call_plan = self._prepare_call(
                problem, q, k, v, bias, mask, attrs, kernel, tile, score_chunk_bytes
            )
            t_prepared = time.perf_counter()
            bound = self._upload_and_bind(problem, operands, call_plan, None)
            t_staged = time.perf_counter()
            staging, timestamps = self._encode_and_submit(call_plan, bound, read_back=True)
            assert staging is not None
            t_submitted = time.perf_counter()
            staging.map_sync(self.wgpu.MapMode.READ, 0, staging.size)  # waits for the device
            t_done = time.perf_counter()
            out = self._read_output(staging, bound.output.size, problem, operands.host_dtype, q.dtype)
            self.last_device_ms = self._read_device_ms(timestamps) if timestamps is not None else None
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

    def _prepare_call(
        self,
        problem: Problem,
        q: Operand,
        k: Operand,
        v: Operand,
        bias: np.ndarray | None,
        mask: np.ndarray | None,
        attrs: Mapping[str, Any],
        kernel: str,
        tile: FlashTile | None,
        score_chunk_bytes: int | None,
    ) -> tuple[HostOperands, Plan]:
        """The host operands and the dispatch plan of one call (nothing touches the device)."""
        operands = prepare(
            problem, q, k, v, bias, mask, attrs, f16_on_device=self.has_f16, heavy_first=self.causal_heavy_first
        )
        return operands, self._plan_call(problem, operands, kernel, tile, score_chunk_bytes)

    def _plan_call(
        self,
        problem: Problem,
        operands: HostOperands,
        kernel: str,
        tile: FlashTile | None,
        score_chunk_bytes: int | None,
    ) -> Plan:
        """The dispatch plan of one call whose operands are laid out (a non-empty problem)."""
        if kernel == "flash" and tile is None:
            tile = self.cached_flash_tile(problem.d4, problem.dv4, operands.io)
        call_plan = plan(
            kernel,
            problem,
            operands.io,
            operands.params,
            tile=tile,
            score_chunk_bytes=score_chunk_bytes,
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
                self.last_device_ms = self._read_device_ms(self._pending_timestamps)
                self._pending_timestamps = None
            else:
                self.queue.on_submitted_work_done_sync()
            return self.last_device_ms

    def _check_own(self, tensor: DeviceTensor) -> None:
        if tensor.device is not self.device:
            raise ValueError("this DeviceTensor belongs to another wgpu device than the runner's")

    def attention_resident(
        self,
        q: Operand,
        k: Operand,
        v: Operand,
        bias: np.ndarray | None = None,
        mask: np.ndarray | None = None,
        *,
        attrs: Mapping[str, Any],
        kernel: str = "flash",
        tile: FlashTile | None = None,
        score_chunk_bytes: int | None = None,
        out: DeviceTensor | None = None,
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
            problem = Problem.of(q, k, v)
            check_kernel(kernel)
            operands = prepare(
                problem, q, k, v, bias, mask, attrs, f16_on_device=self.has_f16, heavy_first=self.causal_heavy_first
            )
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
            call_plan = self._plan_call(problem, operands, kernel, tile, score_chunk_bytes)
            bound = self._upload_and_bind(problem, operands, call_plan, out)
            _, self._pending_timestamps = self._encode_and_submit(call_plan, bound, read_back=False)
            self.last_device_ms = None
            self.last_host_ms = (time.perf_counter() - t_start) * 1e3  # host time to submit, not to finish
            return out

    def _upload_and_bind(
        self, problem: Problem, operands: HostOperands, call_plan: Plan, out: DeviceTensor | None
    ) -> _Bound:
        """Upload the operands and Params, size the output (or bind `out`) and score buffers, make
        one bind group per dispatch."""
        uploads: list[Upload] = []
        bufs = self._upload_operands(operands, uploads)
        bufs["o"] = BoundBuffer(out.buffer, out.nbytes) if out is not None else self._output_buffer(problem, operands)
        bufs["scores"] = self._scores_buffer(call_plan)
        uniform, align = self._write_params(call_plan)

        roles = ("q", "k", "v", "bias", "mask", "o", "scores")  # bindings 1..7
        data_entries = [
            {"binding": binding, "resource": {"buffer": bufs[role].buffer, "offset": 0, "size": bufs[role].size}}
            for binding, role in enumerate(roles, start=1)
        ]

        def params_entry(slot: int) -> dict[str, Any]:
            window = {"buffer": uniform, "offset": slot * align, "size": PARAMS_DTYPE.itemsize}
            return {"binding": 0, "resource": window}

        groups = [
            self.device.create_bind_group(layout=self._bind_group_layout, entries=[params_entry(i), *data_entries])
            for i in range(len(call_plan.dispatches))
        ]
        return _Bound(groups, uploads, bufs["o"])

    def _upload_operands(self, operands: HostOperands, uploads: list[Upload]) -> dict[str, BoundBuffer]:
        """Q, K, V, bias and mask staged for upload; an absent bias or mask binds a small placeholder
        under its own role (every binding needs a buffer)."""
        qkv = (("q", operands.q), ("k", operands.k), ("v", operands.v))
        bufs = {
            role: BoundBuffer(t.buffer, t.nbytes)
            if isinstance(t, DeviceTensor)
            else self.buffers.upload(role, t, uploads)
            for role, t in qkv
        }
        if operands.bias is not None:
            bufs["bias"] = self.buffers.upload("bias", operands.bias, uploads)
        else:
            bufs["bias"] = self.buffers.placeholder("no_bias", np.zeros(4, np.float32))
        if operands.mask is not None:
            bufs["mask"] = self.buffers.upload("mask", operands.mask, uploads)
        else:
            bufs["mask"] = self.buffers.placeholder("no_mask", np.ones(4, np.uint8))
        return bufs

    def _output_buffer(self, problem: Problem, operands: HostOperands) -> BoundBuffer:
        """The device buffer O is written to (head dims padded to vec4s, the device dtype)."""
        nbytes = problem.heads * problem.seq_q * problem.dv4 * 4 * np.dtype(operands.host_dtype).itemsize
        self.device_limits.check_binding("output", nbytes)
        usage = self.wgpu.BufferUsage.STORAGE | self.wgpu.BufferUsage.COPY_SRC
        return BoundBuffer(self.buffers.get("o", nbytes, usage), nbytes)

    def _scores_buffer(self, call_plan: Plan) -> BoundBuffer:
        """The naive kernel's score buffer, or a placeholder for the flash kernel."""
        role, nbytes = ("scores", call_plan.score_bytes) if call_plan.score_bytes else ("no_scores", BUFFER_GRANULE)
        return BoundBuffer(self.buffers.get(role, nbytes, self.wgpu.BufferUsage.STORAGE), nbytes)

    def _write_params(self, call_plan: Plan) -> tuple[wgpu.GPUBuffer, int]:
        """The uniform buffer holding each dispatch's Params at its own slot, and the slot size
        (the adapter's uniform offset alignment)."""
        wgpu = self.wgpu
        align = self.device_limits.uniform_offset_alignment
        slots = len(call_plan.dispatches)
        uniform = self.buffers.get("params", align * slots, wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
        blob = np.zeros(align * slots, np.uint8)
        for i, dispatch in enumerate(call_plan.dispatches):
            blob[i * align : i * align + PARAMS_DTYPE.itemsize] = dispatch.params.view(np.uint8)
        self.queue.write_buffer(uniform, 0, blob)
        return uniform, align

    def _encode_and_submit(
        self, call_plan: Plan, bound: _Bound, *, read_back: bool
    ) -> tuple[wgpu.GPUBuffer | None, wgpu.GPUBuffer | None]:
        """Record the uploads, the dispatches and the read-back copies; submit. Returns the
        mapped-read buffers of the output (None unless read_back) and of the timestamps (None
        without timestamps)."""
        wgpu = self.wgpu
        pipelines = [
            self.pipeline(call_plan.kernel, dispatch.entry, call_plan.io, call_plan.constants)
            for dispatch in call_plan.dispatches
        ]
        encoder = self.device.create_command_encoder()
        for upload in bound.uploads:
            encoder.copy_buffer_to_buffer(upload.staging, 0, upload.target, 0, upload.nbytes)
        pass_args = {}
        if self.has_timestamps:
            pass_args["timestamp_writes"] = {
                "query_set": self._query_set,
                "beginning_of_pass_write_index": 0,
                "end_of_pass_write_index": 1,
            }
        # One compute pass: WebGPU orders the dispatches and makes each see the
        # previous ones' writes, and the two timestamps bracket all of them.
        cpass = encoder.begin_compute_pass(**pass_args)
        for dispatch, pipe, group in zip(call_plan.dispatches, pipelines, bound.groups):
            cpass.set_pipeline(pipe)
            cpass.set_bind_group(0, group)
            cpass.dispatch_workgroups(*dispatch.grid)
        cpass.end()

        usage_read = wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
        staging = None
        if read_back:
            out_nbytes = bound.output.size
            staging = self.buffers.get("staging", out_nbytes, usage_read)
            encoder.copy_buffer_to_buffer(bound.output.buffer, 0, staging, 0, out_nbytes)
        ts_read = None
        if self.has_timestamps:
            resolve = self.buffers.get(
                "ts_resolve", _TIMESTAMP_BYTES, wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC
            )
            ts_read = self.buffers.get("ts_read", _TIMESTAMP_BYTES, usage_read)
            encoder.resolve_query_set(self._query_set, 0, 2, resolve, 0)
            encoder.copy_buffer_to_buffer(resolve, 0, ts_read, 0, _TIMESTAMP_BYTES)
        self.queue.submit([encoder.finish()])
        return staging, ts_read

    def _read_output(
        self,
        staging: wgpu.GPUBuffer,
        nbytes: int,
        problem: Problem,
        host_dtype: type[np.floating[Any]],
        out_dtype: np.dtype[Any],
    ) -> np.ndarray:
        """O [B, Hq, Sq, Dv] in out_dtype, from the staging buffer, mapped for reading."""
        view = staging.read_mapped(0, nbytes, copy=False)
        rows = problem.heads * problem.seq_q
        mapped = np.frombuffer(view, dtype=host_dtype).reshape(rows, 4 * problem.dv4)[:, : problem.value_dim]
        out = np.empty((problem.batch, problem.heads_q, problem.seq_q, problem.value_dim), out_dtype)
        # The one host copy, made before unmap invalidates the view.
        self._copier.copy(out.reshape(rows, problem.value_dim), mapped)
        del mapped, view
        staging.unmap()
        return out

    def _read_device_ms(self, ts_read: wgpu.GPUBuffer) -> float | None:
        """Milliseconds between the compute pass's two timestamps (None if they went backwards)."""
        ts_read.map_sync(self.wgpu.MapMode.READ, 0, _TIMESTAMP_BYTES)
        t0, t1 = np.frombuffer(ts_read.read_mapped(0, _TIMESTAMP_BYTES), dtype=np.uint64)
        ts_read.unmap()
        return float(t1 - t0) * self._ts_period / 1e6 if t1 >= t0 else None
