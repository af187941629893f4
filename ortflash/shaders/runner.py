"""Run the WGSL attention kernels (naive.wgsl, flash.wgsl) through wgpu.

``Runner`` owns one wgpu device. It picks the adapter (a GPU when there is one,
else Mesa's software Vulkan driver, lavapipe), creates the device with the
adapter's own limits and the features the kernels can use (``shader-f16``,
``timestamp-query``), specialises and compiles each shader once per shape
class, keeps device buffers between calls whose shapes repeat, and reads the
device time of every call from timestamp queries when the adapter has them.

The shaders are plain ``.wgsl`` files beside this module. A kernel is
assembled from three of them: one ``io_*.wgsl`` (how Q/K/V/O are stored:
float32, or float16 with ``shader-f16``), ``common.wgsl`` (parameters and the
score of one query/key pair, as ortflash.spec defines it) and the kernel; the
``${NAME}`` fields in them are specialisation constants (tile sizes, head
dims) filled in here.
"""

from __future__ import annotations

import math
import os
import re
import string
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

SHADER_DIR = Path(__file__).resolve().parent

# Uniform block layout; must match `struct Params` in common.wgsl.
PARAMS_DTYPE = np.dtype(
    [
        ("heads_q", "<u4"),
        ("group", "<u4"),
        ("seq_q", "<u4"),
        ("seq_k", "<u4"),
        ("flags", "<u4"),
        ("bh0", "<u4"),
        ("row0", "<u4"),
        ("rows", "<u4"),
        ("scale", "<f4"),
        ("softcap", "<f4"),
        ("mask_fill", "<f4"),
        ("neg_inf", "<f4"),
        ("empty_row", "<f4"),
        ("_pad", "<f4", (3,)),
        ("bias_stride", "<u4", (4,)),
        ("mask_stride", "<u4", (4,)),
    ]
)
assert PARAMS_DTYPE.itemsize == 96

FLAG_BIAS, FLAG_MASK, FLAG_CAUSAL, FLAG_SOFTCAP, FLAG_SKIP_CAUSAL_TILES = 1, 2, 4, 8, 16

# Limits a compute-only workload cares about; the device asks for the
# adapter's own value of each (WebGPU's defaults are far lower, e.g. 16 KiB of
# workgroup storage where lavapipe offers 32 KiB and an H200 48 KiB).
WANTED_LIMITS = (
    "max-compute-workgroup-storage-size",
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroup-size-x",
    "max-compute-workgroup-size-y",
    "max-compute-workgroup-size-z",
    "max-compute-workgroups-per-dimension",
    "max-storage-buffer-binding-size",
    "max-buffer-size",
    "max-storage-buffers-per-shader-stage",
    "max-uniform-buffer-binding-size",
    "max-bind-groups",
    "max-bindings-per-bind-group",
)
WANTED_FEATURES = ("shader-f16", "timestamp-query")

# Order of preference among adapters.
_TYPE_RANK = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "CPU": 3}


def read_shader(name: str) -> str:
    return (SHADER_DIR / name).read_text()


@lru_cache(maxsize=None)
def _template(name: str) -> string.Template:
    return string.Template(read_shader(name))


def assemble(kernel: str, io: str, **constants) -> str:
    """The WGSL source of one specialised kernel: io file + common.wgsl + kernel file."""
    body = unroll(_template(f"{kernel}.wgsl").substitute(constants), constants)
    return "\n".join([read_shader(f"io_{io}.wgsl"), read_shader("common.wgsl"), body])


# `// @unroll` on the line before `for (var x = <n>u; x < <NAME or n>; x++) {`.
_UNROLL = re.compile(
    r"^(?P<indent>[ \t]*)// @unroll[ \t]*\n[ \t]*for \(var (?P<var>\w+) = (?P<start>\d+)u; "
    r"(?P=var) < (?P<stop>\w+); (?P=var)\+\+\) \{",
    re.M,
)


def unroll(src: str, values: dict) -> str:
    """Write out every loop marked `// @unroll`: one block per counter value, the counter a `const`.

    WGSL has no unroll attribute, and a private array indexed by a loop
    counter may be kept in local memory (NVIDIA) or miscompiled (lavapipe);
    with the counter a constant, every such index is a constant. The bound is
    a literal or a name in `values` (a specialisation constant). Nested
    marked loops are written out too.
    """
    while True:
        m = _UNROLL.search(src)
        if m is None:
            return src
        stop = m["stop"]
        count = int(values[stop]) if stop in values else int(stop.rstrip("u"))
        open_brace = m.end() - 1
        depth, i = 0, open_brace
        while True:  # the matching closing brace
            ch = src[i]
            depth += ch == "{"
            depth -= ch == "}"
            if depth == 0:
                break
            i += 1
        body = src[open_brace + 1 : i].rstrip()
        indent = m["indent"]
        copies = "".join(
            f"{indent}{{ const {m['var']}: u32 = {n}u;{body}\n{indent}}}\n" for n in range(int(m["start"]), count)
        )
        end = i + 1
        if src[end : end + 1] == "\n":
            end += 1
        src = src[: m.start()] + copies + src[end:]


# --------------------------------------------------------------------------- tiles


@dataclass(frozen=True)
class FlashTile:
    """Work split of flash.wgsl (see the comment at its top)."""

    br: int  # query rows per workgroup
    bc: int  # keys per tile
    c: int  # invocations per row group
    rv: int  # vec4 row blocks per invocation (4*rv rows)
    vpt: int  # vec4 output columns per invocation

    @property
    def workgroup_size(self) -> int:
        return self.br // (4 * self.rv) * self.c

    def smem_bytes(self, d4: int) -> int:
        kv = max(self.bc * (d4 + 1), self.bc * self.vpt * self.c)
        return 16 * (d4 * self.br + kv + self.bc * (self.br // 4 + 1) + self.c * self.br // 4)

    def registers(self) -> int:
        """float32 values an invocation keeps live in the inner loops (estimate)."""
        return 4 * (self.bc // self.c * self.rv + 4 * self.rv * self.vpt + 4 * self.rv + 2 * self.rv)


def flash_tiles(
    d4: int, dv4: int, sq: int, smem_limit: int, max_invocations: int, max_registers: int = 168
) -> list[FlashTile]:
    """Every tile that fits the adapter, best first by a simple cost model."""
    out = []
    rows_needed = max(4, 1 << max(0, math.ceil(math.log2(max(sq, 1)))))
    for rv in (1, 2):
        for c in (2, 4, 8, 16, 32):
            vpt = math.ceil(dv4 / c)
            if vpt > 8:
                continue
            for kpt in (1, 2, 4, 8):
                bc = c * kpt
                for br in (4, 8, 16, 32, 64, 128):
                    if br % (4 * rv) or br > max(4 * rv, rows_needed):
                        continue
                    t = FlashTile(br, bc, c, rv, vpt)
                    if t.workgroup_size > min(256, max_invocations) or t.registers() > max_registers:
                        continue
                    if t.smem_bytes(d4) > smem_limit:
                        continue
                    out.append(t)
    return sorted(out, key=lambda t: -_tile_score(t, d4, dv4, sq))


def _tile_score(t: FlashTile, d4: int, dv4: int, sq: int) -> float:
    """Rank of a tile; the shape of the rule comes from the H200 sweep
    (benchmarks/results/gpu_sweep_nvidia-h200.json): one row block per
    invocation (rv=1), 2-4 keys and at most 4 output vec4s per invocation, 64
    rows and 16-32 keys per tile ran fastest; rv=2 and vpt=8 (more live
    registers per invocation) ran 1.5-4x slower, and fewer than 4 invocations
    per row group starved the score phase."""
    kpt = t.bc // t.c
    score = float(min(t.br, 128) * min(t.bc, 32))  # reuse of each staged K/V row and Q row
    score *= 0.6 if t.rv > 1 else 1.0
    score *= 0.4 if t.vpt >= 8 else (0.8 if t.vpt > 4 else 1.0)
    score *= 0.5 if t.c < 4 else 1.0
    score *= 1.0 if kpt in (2, 4) else 0.7
    score *= 1.0 if t.workgroup_size >= 64 else 0.7
    score *= 1.0 if t.br == 64 else 0.95
    score *= min(t.br, max(sq, 1)) / t.br  # rows past Sq are wasted
    score *= dv4 / (t.vpt * t.c)  # output columns past Dv are wasted
    return score


# Tiles measured best on an adapter with 48 KiB of workgroup storage (H200,
# benchmarks/results/gpu_attention_nvidia-h200.md), by (D4, DV4, io). Used
# when they fit the adapter and Sq fills them; else the ranking above.
TUNED_TILES = {
    (16, 16, "f32"): FlashTile(br=64, bc=32, c=8, rv=1, vpt=2),
    (16, 16, "f16"): FlashTile(br=128, bc=16, c=4, rv=1, vpt=4),
    (32, 32, "f32"): FlashTile(br=64, bc=16, c=8, rv=1, vpt=4),
    (32, 32, "f16"): FlashTile(br=64, bc=16, c=8, rv=1, vpt=4),
}


# --------------------------------------------------------------------------- adapter


def _adapter_key(adapter):
    info = adapter.info
    return (_TYPE_RANK.get(info.get("adapter_type", ""), 9), 0 if info.get("backend_type") == "Vulkan" else 1)


# Why the last pick_adapter() found nothing (for error messages and test skips).
last_adapter_error: str = ""


def pick_adapter(prefer: str | None = None):
    """The adapter to use: a GPU when there is one, else lavapipe (or any other).

    ``prefer`` (or the environment variable ORTFLASH_WGPU_ADAPTER) picks the
    first adapter whose device name contains it. Returns None when wgpu finds
    no adapter at all; ``last_adapter_error`` then says what wgpu reported.
    """
    global last_adapter_error
    import wgpu

    prefer = prefer or os.environ.get("ORTFLASH_WGPU_ADAPTER")
    errors = []
    try:
        adapters = list(wgpu.gpu.enumerate_adapters_sync())
    except Exception as e:  # no Vulkan/Metal/DX12/GL loader at all
        adapters = []
        errors.append(f"enumerate_adapters: {type(e).__name__}: {e}")
    if prefer:
        chosen = [a for a in adapters if prefer.lower() in a.info.get("device", "").lower()]
        if chosen:
            return chosen[0]
    if adapters:
        return sorted(adapters, key=_adapter_key)[0]
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        if adapter is not None:
            return adapter
        errors.append("request_adapter returned None")
    except Exception as e:
        errors.append(f"request_adapter: {type(e).__name__}: {e}")
    last_adapter_error = "; ".join(errors) or "no adapter"
    return None


def _timestamp_period(queue) -> float:
    """Nanoseconds per timestamp tick (wgpu-native; 1.0 where it is not exposed)."""
    try:
        from wgpu.backends.wgpu_native._ffi import lib

        period = float(lib.wgpuQueueGetTimestampPeriod(queue._internal))
        return period if period > 0 else 1.0
    except Exception:  # pragma: no cover
        return 1.0


# --------------------------------------------------------------------------- runner


class Runner:
    """One wgpu device running the attention kernels.

    Calls are serialised by a lock: they share device buffers, and wgpu's
    calls release the GIL (ONNX Runtime may run custom ops from several threads).
    """

    def __init__(self, adapter=None, *, use_f16: bool = True, use_timestamps: bool = True):
        import wgpu

        self.wgpu = wgpu
        self.adapter = adapter or pick_adapter()
        if self.adapter is None:
            raise RuntimeError(
                "wgpu found no adapter (no GPU and no software Vulkan driver such as lavapipe): " + last_adapter_error
            )
        features = [f for f in WANTED_FEATURES if f in self.adapter.features]
        if not use_f16 and "shader-f16" in features:
            features.remove("shader-f16")
        if not use_timestamps and "timestamp-query" in features:
            features.remove("timestamp-query")
        limits = {k: self.adapter.limits[k] for k in WANTED_LIMITS if k in self.adapter.limits}
        self.device = self.adapter.request_device_sync(required_features=features, required_limits=limits)
        self.limits = dict(self.device.limits)
        self.features = set(self.device.features)
        self.has_f16 = "shader-f16" in self.features
        self.has_timestamps = "timestamp-query" in self.features
        self.queue = self.device.queue
        self._ts_period = _timestamp_period(self.queue) if self.has_timestamps else 1.0
        self.last_device_ms: float | None = None  # device time of the last call (timestamp queries)
        self.last_host_ms: float | None = None  # host-to-host time of the last call
        self.last_plan: dict = {}  # what the last call ran (kernel, tile, chunks)
        self._modules: dict = {}
        self._pipelines: dict = {}
        self._buffers: dict = {}
        self._pending_uploads: list = []
        self._lock = threading.RLock()
        self._layout = self._make_layout()
        if self.has_timestamps:
            self._query_set = self.device.create_query_set(type="timestamp", count=2)

    # ---------------------------------------------------------------- describe

    @property
    def info(self) -> dict:
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
            "max_workgroup_storage": self.limits.get("max-compute-workgroup-storage-size"),
            "max_invocations": self.limits.get("max-compute-invocations-per-workgroup"),
            "max_storage_binding": self.limits.get("max-storage-buffer-binding-size"),
        }

    @property
    def is_software(self) -> bool:
        return self.adapter.info.get("adapter_type") == "CPU"

    # ---------------------------------------------------------------- device objects

    def _make_layout(self):
        wgpu = self.wgpu
        ro = {"type": wgpu.BufferBindingType.read_only_storage}
        rw = {"type": wgpu.BufferBindingType.storage}
        kinds = [{"type": wgpu.BufferBindingType.uniform}, ro, ro, ro, ro, ro, rw, rw]
        entries = [
            {"binding": i, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": kind} for i, kind in enumerate(kinds)
        ]
        bgl = self.device.create_bind_group_layout(entries=entries)
        self._bind_group_layout = bgl
        return self.device.create_pipeline_layout(bind_group_layouts=[bgl])

    def pipeline(self, kernel: str, entry: str, io: str, constants: dict):
        """A compiled pipeline, cached by (kernel, io, specialisation, entry point)."""
        key = (kernel, entry, io, tuple(sorted(constants.items())))
        pipe = self._pipelines.get(key)
        if pipe is None:
            mkey = (kernel, io, key[3])
            module = self._modules.get(mkey)
            if module is None:
                module = self.device.create_shader_module(code=assemble(kernel, io, **constants))
                self._modules[mkey] = module
            pipe = self.device.create_compute_pipeline(
                layout=self._layout, compute={"module": module, "entry_point": entry}
            )
            self._pipelines[key] = pipe
        return pipe

    def _buffer(self, role: str, nbytes: int, usage):
        """A device buffer for `role` of at least nbytes, reused while big enough."""
        nbytes = max(16, -(-nbytes // 16) * 16)
        buf = self._buffers.get(role)
        if buf is None or buf.size < nbytes or buf.size > 4 * nbytes + (1 << 20):
            if buf is not None:
                buf.destroy()
            buf = self.device.create_buffer(size=nbytes, usage=usage)
            self._buffers[role] = buf
        return buf

    def _upload(self, role: str, array: np.ndarray):
        """Stage `array` for the storage buffer of `role`; the copy is recorded by _flush_uploads.

        Uploads go through a persistent mapped staging buffer per role: one
        memcpy on the host and one copy on the device, with no fresh
        allocation per call (queue.write_buffer allocates a new staging area
        every time, several times slower for tens of MiB).
        """
        wgpu = self.wgpu
        data = np.ascontiguousarray(array)
        if data.nbytes % 4:
            data = np.concatenate([data.reshape(-1).view(np.uint8), np.zeros(4 - data.nbytes % 4, np.uint8)])
        self._check_binding(role, data.nbytes)
        buf = self._buffer(role, data.nbytes, wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST)
        staging = self._buffer(role + "_upload", data.nbytes, wgpu.BufferUsage.MAP_WRITE | wgpu.BufferUsage.COPY_SRC)
        staging.map_sync(wgpu.MapMode.WRITE, 0, staging.size)
        staging.write_mapped(data.reshape(-1).view(np.uint8), 0)
        staging.unmap()
        self._pending_uploads.append((staging, buf, -(-data.nbytes // 4) * 4))
        return buf, data.nbytes

    def _flush_uploads(self, encoder):
        for staging, buf, nbytes in self._pending_uploads:
            encoder.copy_buffer_to_buffer(staging, 0, buf, 0, nbytes)
        self._pending_uploads = []

    def _check_binding(self, role: str, nbytes: int):
        cap = self.limits.get("max-storage-buffer-binding-size", 1 << 27)
        if nbytes > cap:
            raise MemoryError(
                f"{role} needs {nbytes} bytes, over the adapter's storage binding limit of {cap} bytes"
            )

    # ---------------------------------------------------------------- attention

    def attention(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        bias: np.ndarray | None = None,
        mask: np.ndarray | None = None,
        *,
        attrs: dict,
        kernel: str = "flash",
        tile: FlashTile | None = None,
        score_chunk_bytes: int | None = None,
    ) -> np.ndarray:
        """O = attention(Q, K, V) by `kernel` ('flash' or 'naive'); attrs as spec.validate gives them.

        Returns O [B, Hq, Sq, Dv] with Q's dtype. ``tile`` overrides the flash
        tile; ``score_chunk_bytes`` caps the naive kernel's score buffer.
        """
        with self._lock:
            return self._attention(q, k, v, bias, mask, attrs, kernel, tile, score_chunk_bytes)

    def _attention(self, q, k, v, bias, mask, attrs, kernel, tile, score_chunk_bytes):
        t_start = time.perf_counter()
        if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
            raise ValueError(f"FlashAttention wants 4D Q, K, V; got {q.shape}, {k.shape}, {v.shape}")
        b, hq, sq, d = q.shape
        hkv, sk = k.shape[1], k.shape[2]
        dv = v.shape[3]
        if k.shape[0] != b or v.shape[0] != b or v.shape[1] != hkv or v.shape[2] != sk or k.shape[3] != d:
            raise ValueError(f"Q, K, V shapes do not agree: {q.shape}, {k.shape}, {v.shape}")
        if hq % hkv:
            raise ValueError(f"query heads ({hq}) must be a multiple of kv heads ({hkv})")
        if kernel not in ("flash", "naive"):
            raise ValueError(f"kernel must be 'flash' or 'naive', got {kernel!r}")
        out_dtype = q.dtype
        if sq == 0 or b == 0 or hq == 0:
            return np.zeros((b, hq, sq, dv), out_dtype)

        # float16 stays float16 on the way in when the shader can read it;
        # otherwise the host widens it to float32 (and narrows O afterwards).
        f16 = self.has_f16 and all(t.dtype == np.float16 for t in (q, k, v))
        io = "f16" if f16 else "f32"
        host_dtype = np.float16 if f16 else np.float32
        d4, dv4 = -(-d // 4), -(-dv // 4)
        qh, kh, vh = (_pad_last(np.asarray(t, host_dtype), 4 * n) for t, n in ((q, d4), (k, d4), (v, dv4)))

        flags = 0
        params = np.zeros(1, PARAMS_DTYPE)
        if bias is not None:
            bias_arr, bias_stride = _broadcast_operand(bias, (b, hq, sq, sk), "bias")
            bias_arr = bias_arr.astype(np.float32, copy=False)
            flags |= FLAG_BIAS
            params["bias_stride"] = bias_stride
        else:
            bias_arr = None
        if mask is not None:
            mask_arr, mask_stride = _broadcast_operand(mask, (b, hq, sq, sk), "mask")
            mask_arr = mask_arr.astype(bool, copy=False).astype(np.uint8)
            flags |= FLAG_MASK
            params["mask_stride"] = mask_stride
        else:
            mask_arr = None
        if attrs["is_causal"]:
            flags |= FLAG_CAUSAL
            if attrs["mask_fill"] == -math.inf:
                flags |= FLAG_SKIP_CAUSAL_TILES
        if attrs["softcap"] > 0:
            flags |= FLAG_SOFTCAP
        params["heads_q"] = hq
        params["group"] = hq // hkv
        params["seq_q"] = sq
        params["seq_k"] = sk
        params["flags"] = flags
        params["scale"] = attrs["scale"]
        params["softcap"] = attrs["softcap"] or 1.0
        params["mask_fill"] = attrs["mask_fill"]
        params["neg_inf"] = -np.inf
        params["empty_row"] = 0.0 if attrs["masked_rows"] == "zero" else np.nan

        wgpu = self.wgpu
        bufs = {
            "q": self._upload("q", qh),
            "k": self._upload("k", kh),
            "v": self._upload("v", vh),
            # Unused bindings still need a buffer: small placeholders under their own roles.
            "bias": self._upload("bias", bias_arr) if bias_arr is not None else self._upload("no_bias", np.zeros(4, np.float32)),
            "mask": self._upload("mask", mask_arr) if mask_arr is not None else self._upload("no_mask", np.ones(4, np.uint8)),
        }
        out_nbytes = b * hq * sq * dv4 * 4 * np.dtype(host_dtype).itemsize
        self._check_binding("output", out_nbytes)
        out_usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
        bufs["o"] = (self._buffer("o", out_nbytes, out_usage), out_nbytes)

        if kernel == "flash":
            dispatches = self._plan_flash(d4, dv4, b, hq, sq, io, params, tile)
        else:
            dispatches = self._plan_naive(d4, dv4, b, hq, sq, sk, io, params, score_chunk_bytes)
        if kernel == "naive":
            bufs["scores"] = self._naive_scores
        else:
            bufs["scores"] = (self._buffer("no_scores", 16, wgpu.BufferUsage.STORAGE), 16)

        # One uniform slot per distinct params record.
        align = max(256, self.limits.get("min-uniform-buffer-offset-alignment", 256))
        slots = [p for _, _, p in dispatches]
        uni = self._buffer("params", align * len(slots), wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
        blob = np.zeros(align * len(slots), np.uint8)
        for i, p in enumerate(slots):
            blob[i * align : i * align + PARAMS_DTYPE.itemsize] = p.view(np.uint8)
        self.queue.write_buffer(uni, 0, blob)

        def entry(binding, role):
            buf, size = bufs[role]
            return {"binding": binding, "resource": {"buffer": buf, "offset": 0, "size": size}}

        data_entries = [
            entry(1, "q"), entry(2, "k"), entry(3, "v"), entry(4, "bias"), entry(5, "mask"), entry(6, "o"), entry(7, "scores"),
        ]
        groups = [
            self.device.create_bind_group(
                layout=self._bind_group_layout,
                entries=[{"binding": 0, "resource": {"buffer": uni, "offset": i * align, "size": PARAMS_DTYPE.itemsize}}]
                + data_entries,
            )
            for i in range(len(slots))
        ]

        encoder = self.device.create_command_encoder()
        self._flush_uploads(encoder)
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
        for i, (pipe, grid, _) in enumerate(dispatches):
            cpass.set_pipeline(pipe)
            cpass.set_bind_group(0, groups[i])
            cpass.dispatch_workgroups(*grid)
        cpass.end()

        usage_read = wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
        staging = self._buffer("staging", out_nbytes, usage_read)
        encoder.copy_buffer_to_buffer(bufs["o"][0], 0, staging, 0, out_nbytes)
        if self.has_timestamps:
            resolve = self._buffer("ts_resolve", 16, wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
            ts_read = self._buffer("ts_read", 16, usage_read)
            encoder.resolve_query_set(self._query_set, 0, 2, resolve, 0)
            encoder.copy_buffer_to_buffer(resolve, 0, ts_read, 0, 16)
        self.queue.submit([encoder.finish()])

        staging.map_sync(wgpu.MapMode.READ, 0, staging.size)
        view = staging.read_mapped(0, out_nbytes, copy=False)
        # The one host copy (astype always copies), made before unmap invalidates the view.
        out = np.frombuffer(view, dtype=host_dtype).reshape(b, hq, sq, 4 * dv4)[..., :dv].astype(out_dtype)
        staging.unmap()
        if self.has_timestamps:
            ts_read.map_sync(wgpu.MapMode.READ, 0, 16)
            t0, t1 = np.frombuffer(ts_read.read_mapped(0, 16), dtype=np.uint64)
            ts_read.unmap()
            self.last_device_ms = float(t1 - t0) * self._ts_period / 1e6 if t1 >= t0 else None
        else:
            self.last_device_ms = None

        self.last_host_ms = (time.perf_counter() - t_start) * 1e3
        return out

    # ---------------------------------------------------------------- planning

    def flash_tile(self, d: int, dv: int, sq: int = 4096, io: str = "f32") -> FlashTile:
        """The flash tile this adapter runs for head dims d, dv, Sq query rows and io (f32/f16)."""
        d4, dv4 = -(-d // 4), -(-dv // 4)
        smem = self.limits["max-compute-workgroup-storage-size"]
        invocations = self.limits["max-compute-invocations-per-workgroup"]
        tuned = TUNED_TILES.get((d4, dv4, io))
        if (
            tuned is not None
            and sq >= tuned.br
            and tuned.smem_bytes(d4) <= smem
            and tuned.workgroup_size <= invocations
        ):
            return tuned
        tiles = flash_tiles(d4, dv4, sq, smem, invocations)
        if not tiles:
            raise RuntimeError(f"no flash tile fits this adapter for head dims {d}/{dv}")
        return tiles[0]

    def _grid_heads(self, total: int):
        """(bh0, count) chunks of the batch*heads axis that fit one grid dimension."""
        cap = self.limits.get("max-compute-workgroups-per-dimension", 65535)
        return [(s, min(cap, total - s)) for s in range(0, total, cap)]

    def _plan_flash(self, d4, dv4, b, hq, sq, io, params, tile):
        tile = tile or self.flash_tile(4 * d4, 4 * dv4, sq, io)
        if tile.smem_bytes(d4) > self.limits["max-compute-workgroup-storage-size"]:
            raise ValueError(f"{tile} needs {tile.smem_bytes(d4)} bytes of workgroup storage")
        constants = {
            "D4": d4, "DV4": dv4, "BR": tile.br, "BC": tile.bc, "C": tile.c, "RV": tile.rv, "VPT": tile.vpt,
            "KPT": tile.bc // tile.c,
        }
        pipe = self.pipeline("flash", "main", io, constants)
        out = []
        for bh0, count in self._grid_heads(b * hq):
            p = params.copy()
            p["bh0"] = bh0
            out.append((pipe, (-(-sq // tile.br), count, 1), p))
        self.last_plan = {"kernel": "flash", "tile": tile, "io": io, "dispatches": len(out)}
        return out

    def _plan_naive(self, d4, dv4, b, hq, sq, sk, io, params, score_chunk_bytes):
        cap = min(
            self.limits.get("max-storage-buffer-binding-size", 1 << 27),
            self.limits.get("max-buffer-size", 1 << 28),
            score_chunk_bytes or (1 << 31),
        )
        row_bytes = 4 * sk
        if row_bytes > cap:
            raise MemoryError(f"one score row of {sk} keys ({row_bytes} bytes) exceeds the score buffer cap {cap}")
        max_dim = self.limits.get("max-compute-workgroups-per-dimension", 65535)
        head_bytes = row_bytes * sq
        chunks = []  # (bh0, heads, row0, rows)
        if head_bytes <= cap and sq <= max_dim:
            heads_per = max(1, min(cap // head_bytes, max_dim))
            for bh0 in range(0, b * hq, heads_per):
                chunks.append((bh0, min(heads_per, b * hq - bh0), 0, sq))
        else:
            rows_per = min(cap // row_bytes, max_dim)
            if rows_per >= 16:
                rows_per -= rows_per % 16
            for bh in range(b * hq):
                for r0 in range(0, sq, rows_per):
                    chunks.append((bh, 1, r0, min(rows_per, sq - r0)))
        score_bytes = max(h * r for _, h, _, r in chunks) * row_bytes
        constants = {"D4": d4, "DV4": dv4}
        p_scores = self.pipeline("naive", "scores_pass", io, constants)
        p_softmax = self.pipeline("naive", "softmax_pass", io, constants)
        p_sum = self.pipeline("naive", "weighted_sum_pass", io, constants)
        out = []
        for bh0, heads, row0, rows in chunks:
            p = params.copy()
            p["bh0"], p["row0"], p["rows"] = bh0, row0, rows
            out.append((p_scores, (-(-sk // 16), -(-rows // 16), heads), p))
            out.append((p_softmax, (rows, 1, heads), p))
            out.append((p_sum, (-(-dv4 // 16), -(-rows // 16), heads), p))
        scores = self._buffer("scores", score_bytes, self.wgpu.BufferUsage.STORAGE)
        self._naive_scores = (scores, score_bytes)
        self.last_plan = {"kernel": "naive", "io": io, "chunks": len(chunks), "score_bytes": score_bytes}
        return out


def _pad_last(a: np.ndarray, n: int) -> np.ndarray:
    """a with its last axis zero-padded to n (dot products and outputs unchanged)."""
    if a.shape[-1] == n:
        return np.ascontiguousarray(a)
    pad = [(0, 0)] * (a.ndim - 1) + [(0, n - a.shape[-1])]
    return np.pad(a, pad)


def _broadcast_operand(t, full_shape, name):
    """(contiguous array, per-dim element strides with 0 on broadcast dims) of a bias or mask."""
    t = np.asarray(t)
    if t.ndim > 4:
        raise ValueError(f"{name} has {t.ndim} dims; at most 4 (broadcastable to [B, Hq, Sq, Sk])")
    t = t.reshape((1,) * (4 - t.ndim) + t.shape)
    for size, full, axis in zip(t.shape, full_shape, "B Hq Sq Sk".split()):
        if size not in (1, full):
            raise ValueError(f"{name} shape {t.shape} does not broadcast to {full_shape} (axis {axis})")
    t = np.ascontiguousarray(t)
    contiguous = [int(np.prod(t.shape[i + 1 :])) for i in range(4)]
    strides = [0 if size == 1 else s for size, s in zip(t.shape, contiguous)]
    return t, strides
