"""One attention call on a wgpu device, after its plan: upload the operands and Params, bind,
encode the uploads, dispatches and read-back copies into one command buffer, submit, and read
O and the device time back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .buffers import BUFFER_GRANULE, BoundBuffer, BufferCache, Upload
from .hostcopy import HostCopier
from .limits import DeviceLimits
from .params import PARAMS_DTYPE, HostOperands, Problem
from .pipelines import Pipelines
from .plan import Plan
from .resident import DeviceTensor

if TYPE_CHECKING:
    import wgpu

# Two u64 timestamps: the start and the end of the compute pass.
_TIMESTAMP_BYTES = 16


@dataclass(frozen=True)
class Bound:
    """What one call's encoder needs: a bind group per dispatch, the uploads, the output buffer."""

    groups: list[wgpu.GPUBindGroup]
    uploads: list[Upload]
    output: BoundBuffer


class CallEncoder:
    """Binds, encodes, submits and reads back the calls of one device. Not thread-safe: the Runner
    calls it under its lock."""

    def __init__(
        self,
        device: wgpu.GPUDevice,
        limits: DeviceLimits,
        buffers: BufferCache,
        pipelines: Pipelines,
        copier: HostCopier,
        *,
        timestamps: bool,
        timestamp_period: float,
    ) -> None:
        import wgpu

        self.wgpu: Any = wgpu
        self.device = device
        self.queue = device.queue
        self.limits = limits
        self.buffers = buffers
        self.pipelines = pipelines
        self.copier = copier
        self.timestamp_period = timestamp_period  # ns per tick
        self.query_set = device.create_query_set(type="timestamp", count=2) if timestamps else None

    def bind(self, problem: Problem, operands: HostOperands, call_plan: Plan, out: DeviceTensor | None) -> Bound:
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

        layout = self.pipelines.bind_group_layout
        groups = [
            self.device.create_bind_group(layout=layout, entries=[params_entry(i), *data_entries])
            for i in range(len(call_plan.dispatches))
        ]
        return Bound(groups, uploads, bufs["o"])

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
        self.limits.check_binding("output", nbytes)
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
        align = self.limits.uniform_offset_alignment
        slots = len(call_plan.dispatches)
        uniform = self.buffers.get("params", align * slots, wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
        blob = np.zeros(align * slots, np.uint8)
        for i, dispatch in enumerate(call_plan.dispatches):
            blob[i * align : i * align + PARAMS_DTYPE.itemsize] = dispatch.params.view(np.uint8)
        self.queue.write_buffer(uniform, 0, blob)
        return uniform, align

    def submit(
        self, call_plan: Plan, bound: Bound, *, read_back: bool
    ) -> tuple[wgpu.GPUBuffer | None, wgpu.GPUBuffer | None]:
        """Record the uploads, the dispatches and the read-back copies; submit. Returns the
        mapped-read buffers of the output (None unless read_back) and of the timestamps (None
        without timestamps)."""
        wgpu = self.wgpu
        pipelines = [
            self.pipelines.get(call_plan.kernel, dispatch.entry, call_plan.io, call_plan.constants)
            for dispatch in call_plan.dispatches
        ]
        encoder = self.device.create_command_encoder()
        for upload in bound.uploads:
            encoder.copy_buffer_to_buffer(upload.staging, 0, upload.target, 0, upload.nbytes)
        pass_args = {}
        if self.query_set is not None:
            pass_args["timestamp_writes"] = {
                "query_set": self.query_set,
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
        if self.query_set is not None:
            resolve = self.buffers.get(
                "ts_resolve", _TIMESTAMP_BYTES, wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC
            )
            ts_read = self.buffers.get("ts_read", _TIMESTAMP_BYTES, usage_read)
            encoder.resolve_query_set(self.query_set, 0, 2, resolve, 0)
            encoder.copy_buffer_to_buffer(resolve, 0, ts_read, 0, _TIMESTAMP_BYTES)
        self.queue.submit([encoder.finish()])
        return staging, ts_read

    def read_output(
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
        self.copier.copy(out.reshape(rows, problem.value_dim), mapped)
        del mapped, view
        staging.unmap()
        return out

    def read_device_ms(self, ts_read: wgpu.GPUBuffer) -> float | None:
        """Milliseconds between the compute pass's two timestamps (None if they went backwards)."""
        ts_read.map_sync(self.wgpu.MapMode.READ, 0, _TIMESTAMP_BYTES)
        t0, t1 = np.frombuffer(ts_read.read_mapped(0, _TIMESTAMP_BYTES), dtype=np.uint64)
        ts_read.unmap()
        return float(t1 - t0) * self.timestamp_period / 1e6 if t1 >= t0 else None
