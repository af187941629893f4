"""Which attention forms ONNX Runtime's CUDA EP runs on the GPU, computes right, and how fast: the probe.

Three steps, because the models are written here (onnx) and run there (onnxruntime-gpu, torch):

    python benchmarks/cuda_capabilities.py make build/cuda_run/caps                 # here: the models
    python benchmarks/cuda_capabilities.py run build/cuda_run/caps --out OUT        # GPU machine
    python benchmarks/cuda_capabilities.py table OUT/cuda_capabilities.json         # here: the .md

Every model is one attention block, one form x one case:

- forms: com.microsoft MultiHeadAttention with the mask and causality as ``attention_bias``
  (``mha_bias``) or as ``key_padding_mask`` [B, Sk] plus ``unidirectional`` (``mha_kpm``);
  GroupQueryAttention without past (``gqa``: its own causal mask, left padding as
  ``attention_bias``; ``gqa_grouped``: half as many key/value heads) and with a past, one decode
  step (``gqa_past``); ONNX Attention opset 23 with the mask as a float ``attn_mask``
  (``attn23``), with ``is_causal=1`` and the padding alone in ``attn_mask`` (``attn23_causal``),
  with half as many key/value heads (``attn23_grouped``) and with fewer queries than keys
  (``attn23_sq_lt_sk``, the mask bottom-right aligned); the decomposed
  ``MatMul -> Add -> Softmax -> MatMul`` graph exporters write (``unfused``);
- cases: no mask, right padding, causal, causal + left padding (rows with every key masked),
  fully masked rows alone, the fill float32-lowest (transformers' fill) or -inf; float32 and
  float16; head dims 64 and 128; short cases at B=2, H=4 and 37 positions (odd, as the zoo is
  checked) and long ones at B=1, H=16 and S = 128, 1024, 4096, 16384.

The run step, per model: the output on the CUDA EP with ``use_tf32=0`` (exact float32 products)
against the same model on the CPU EP (short cases) or against a float64 computation of the same
attention with PyTorch on the GPU (long cases, where the CPU EP would take minutes); the same with
the EP's default TF32; which EP ran each node (ORT profile); the attention kernel ORT chose
(``ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO=1``, read from the process's stdout); and the latency
with inputs and outputs bound on the GPU (I/O binding: device time plus launch, no copies), median
of repeats. PyTorch's ``scaled_dot_product_attention`` on the same shapes is the peer row.
"""

from __future__ import annotations

import contextlib
import glob
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ep_probe  # noqa: E402 - the probe scripts' shared pieces

F32_LOWEST = float(np.finfo(np.float32).min)
PAD = 12  # padded keys of batch item 1 (short cases); long cases pad a quarter of the keys
DEAD = 5  # the fully masked query rows of batch item 1
SHORT = {"B": 2, "H": 4, "S": 37}
LONG = {"B": 1, "H": 16}
LONG_LENGTHS = (128, 1024, 4096, 16384)
HEAD_DIMS = (64, 128)
KERNEL_LINE = re.compile(r"SdpaKernel=(\w+)")
FLAG_LINE = re.compile(r"(\w+ATTENTION\w*)=1")


@dataclass(frozen=True)
class Case:
    keep: str  # none | padding | causal | causal_leftpad | dead_rows (see keep_mask)
    dtype: str
    head_dim: int
    seq: int
    batch: int
    heads: int
    fill: str = "lowest"  # lowest | -inf

    @property
    def name(self) -> str:
        fill = "_neginf" if self.fill == "-inf" else ""
        return f"{self.keep}{fill}_{'f16' if self.dtype == 'float16' else 'f32'}_d{self.head_dim}_s{self.seq}"

    @property
    def long(self) -> bool:
        return self.batch == LONG["B"] and self.heads == LONG["H"]

    @property
    def pad(self) -> int:
        return self.seq // 4 if self.long else PAD


def cases() -> list[Case]:
    out = []
    for dtype in ("float32", "float16"):
        for d in HEAD_DIMS:
            # head dim 128: the cases that differ in kind (rows with no visible key among them)
            keeps = (
                ("none", "padding", "causal", "causal_leftpad", "dead_rows")
                if d == 64
                else ("padding", "causal_leftpad")
            )
            for keep in keeps:
                for fill in ("lowest", "-inf") if keep in ("causal_leftpad", "dead_rows") else ("lowest",):
                    out.append(Case(keep, dtype, d, SHORT["S"], SHORT["B"], SHORT["H"], fill))
            for s in LONG_LENGTHS:
                if dtype == "float32" and (d == 128 or s == 16384):  # float32: the trend at D=64 up to 4096
                    continue
                for keep in ("none", "padding", "causal"):
                    out.append(Case(keep, dtype, d, s, LONG["B"], LONG["H"]))
    return out


FORMS = (
    "mha_bias",
    "mha_kpm",
    "gqa",
    "gqa_grouped",
    "gqa_past",
    "attn23",
    "attn23_causal",
    "attn23_causal_bsd",
    "mha_causal",
    "attn23_grouped",
    "attn23_sq_lt_sk",
    "unfused",
)


# the forms whose query, key, value and output are [B, S, H·D]
BSD_FORMS = ("mha_bias", "mha_kpm", "mha_causal", "attn23_causal_bsd", "gqa", "gqa_grouped")


def applies(form: str, case: Case) -> bool:
    """Whether the form can express the case (and is worth its time at long lengths)."""
    causal = case.keep.startswith("causal")
    if form in ("gqa", "gqa_grouped"):  # always causal; left padding as attention_bias
        return causal and (form == "gqa" or not case.long)
    if form == "gqa_past":  # one decode step over a past of S - 1: nothing to mask
        return case.keep == "none" and (case.long or case.head_dim == 64)
    if form == "mha_kpm":  # one 0/1 per key: no per-row masks
        return case.keep in ("padding", "causal", "causal_leftpad") and case.fill == "lowest"
    if form == "attn23_causal":  # is_causal with the padding alone in attn_mask
        return causal
    if form in ("attn23_causal_bsd", "mha_causal"):  # their own causal mask and nothing else
        return case.keep == "causal"
    if form in ("attn23_grouped", "attn23_sq_lt_sk"):
        return not case.long
    return True


def query_len(form: str, case: Case) -> int:
    if form == "gqa_past":
        return 1
    if form == "attn23_sq_lt_sk":
        return case.seq // 2
    return case.seq


def kv_heads(form: str, case: Case) -> int:
    return case.heads // 2 if form in ("gqa_grouped", "attn23_grouped") else case.heads


def keep_mask(case: Case, sq: int) -> np.ndarray | None:
    """bool [B, Sq, Sk], True = visible, the queries the last sq positions (bottom-right); None: no mask."""
    b, s, pad = case.batch, case.seq, case.pad
    if case.keep == "none":
        return None
    keep = np.ones((b, s, s), bool)
    causal = np.tril(np.ones((s, s), bool))
    if case.keep == "padding":
        keep[b - 1, :, s - pad :] = False
    elif case.keep == "causal":
        keep &= causal
    elif case.keep == "causal_leftpad":
        keep &= causal
        keep[b - 1, :, :pad] = False  # rows 0..pad-1 of the last item see no key
    elif case.keep == "dead_rows":
        keep[b - 1, :DEAD, :] = False
    else:
        raise ValueError(case.keep)
    return keep[:, s - sq :, :]


def fill_value(case: Case) -> float:
    np_dtype = np.float32 if case.dtype == "float32" else np.float16
    return float(np.finfo(np_dtype).min) if case.fill == "lowest" else -math.inf


def _np_dtype(case: Case) -> Any:
    return np.float32 if case.dtype == "float32" else np.float16


def qkv(case: Case, hkv: int, sq: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q [B, Hq, Sq, D] (the last sq queries), K and V [B, Hkv, Sk, D], seeded by the case's shape."""
    b, h, s, d = case.batch, case.heads, case.seq, case.head_dim
    rng = np.random.default_rng(s * 1000 + d)
    q = rng.standard_normal((b, h, s, d), dtype=np.float32)
    k = rng.standard_normal((b, h, s, d), dtype=np.float32)
    v = rng.standard_normal((b, h, s, d), dtype=np.float32)
    dt = _np_dtype(case)
    return q[:, :, s - sq :].astype(dt), k[:, :hkv].astype(dt), v[:, :hkv].astype(dt)


def _bsd(x: np.ndarray) -> np.ndarray:
    b, h, s, d = x.shape
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3).reshape(b, s, h * d))


def make_feeds(form: str, case: Case) -> dict[str, np.ndarray]:
    """The model's inputs (numpy only: the GPU machine makes its own, big ones do not travel)."""
    b, s = case.batch, case.seq
    sq, hkv = query_len(form, case), kv_heads(form, case)
    q, k, v = qkv(case, hkv, sq)
    dt = _np_dtype(case)
    keep = keep_mask(case, sq)
    bias = None if keep is None else np.where(keep[:, None], 0.0, fill_value(case)).astype(dt)
    if form == "gqa_past":
        return {
            "q": _bsd(q),
            "k": _bsd(k[:, :, s - 1 :]),
            "v": _bsd(v[:, :, s - 1 :]),
            "past_k": np.ascontiguousarray(k[:, :, : s - 1]),
            "past_v": np.ascontiguousarray(v[:, :, : s - 1]),
            "seqlens_k": np.full((b,), s - 1, np.int32),
            "total": np.array(s, np.int32),
        }
    if form in BSD_FORMS:
        feeds = {"q": _bsd(q), "k": _bsd(k), "v": _bsd(v)}
    else:
        feeds = {"q": q, "k": k, "v": v}
    if form == "mha_kpm":
        kpm = np.ones((b, s), np.int32)
        if case.keep == "padding":
            kpm[b - 1, s - case.pad :] = 0
        elif case.keep == "causal_leftpad":
            kpm[b - 1, : case.pad] = 0
        feeds["kpm"] = kpm
        return feeds
    if form in ("gqa", "gqa_grouped"):
        feeds["seqlens_k"] = np.full((b,), s - 1, np.int32)
        feeds["total"] = np.array(s, np.int32)
        if case.keep == "causal":
            return feeds
        assert keep is not None
        causal = np.tril(np.ones((s, s), bool))
        feeds["bias"] = np.where((keep | ~causal)[:, None], 0.0, fill_value(case)).astype(dt)  # padding part
        return feeds
    if form in ("attn23_causal_bsd", "mha_causal"):
        return feeds
    if form == "attn23_causal":
        if case.keep == "causal":
            return feeds
        causal = np.tril(np.ones((s, s), bool))
        assert keep is not None
        feeds["bias"] = np.where((keep | ~causal)[:, None], 0.0, fill_value(case)).astype(dt)
        return feeds
    if bias is not None:
        feeds["bias"] = bias
    return feeds


def reference_inputs(form: str, case: Case, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
    """What the float64 reference needs: Q [B, Hq, Sq, D], K/V [B, Hkv, Sk, D], the additive
    bias [B, 1, Sq, Sk] or None (every mask and causality in it), and whether the output is BSD."""
    sq, hkv = query_len(form, case), kv_heads(form, case)
    q, k, v = qkv(case, hkv, sq)
    keep = keep_mask(case, sq)
    bias = None if keep is None else np.where(keep[:, None], 0.0, fill_value(case)).astype(_np_dtype(case))
    return {
        "q": q,
        "k": k,
        "v": v,
        "bias": bias,
        "bsd": form in BSD_FORMS or form == "gqa_past",
    }


def build(form: str, case: Case) -> Any:
    from onnx import TensorProto, helper

    b, h, s, d = case.batch, case.heads, case.seq, case.head_dim
    sq, hkv = query_len(form, case), kv_heads(form, case)
    elem = TensorProto.FLOAT if case.dtype == "float32" else TensorProto.FLOAT16
    feeds_shape = feed_shapes(form, case)
    scale = 1.0 / math.sqrt(d)
    vi = helper.make_tensor_value_info

    def inp(name: str) -> Any:
        int_inputs = ("kpm", "seqlens_k", "total")
        return vi(name, TensorProto.INT32 if name in int_inputs else elem, feeds_shape[name])

    nodes: list[Any] = []
    has_bias = "bias" in feeds_shape
    if form in ("mha_bias", "mha_kpm"):
        ins = ["q", "k", "v"]
        if form == "mha_kpm":
            ins += ["", "kpm"]
        elif has_bias:
            ins += ["", "", "bias"]
        attrs: dict[str, Any] = {"num_heads": h, "scale": scale}
        if form == "mha_kpm":
            attrs["unidirectional"] = int(case.keep.startswith("causal"))
        nodes.append(helper.make_node("MultiHeadAttention", ins, ["o"], domain="com.microsoft", **attrs))
        out_shape = [b, s, h * d]
    elif form in ("gqa", "gqa_grouped", "gqa_past"):
        past = ["past_k", "past_v"] if form == "gqa_past" else ["", ""]
        ins = ["q", "k", "v", *past, "seqlens_k", "total"]
        if has_bias:
            ins += ["", "", "", "bias"]
        nodes.append(ep_probe.group_query_attention(ins, h, hkv, scale))
        out_shape = [b, sq, h * d]
    elif form == "mha_causal":  # unidirectional=1: its own causal mask, no bias
        nodes.append(
            helper.make_node(
                "MultiHeadAttention",
                ["q", "k", "v"],
                ["o"],
                domain="com.microsoft",
                num_heads=h,
                scale=scale,
                unidirectional=1,
            )
        )
        out_shape = [b, s, h * d]
    elif form == "attn23_causal_bsd":  # [B, S, H·D] inputs and output, is_causal=1
        attrs = {"scale": scale, "is_causal": 1, "q_num_heads": h, "kv_num_heads": hkv}
        nodes.append(helper.make_node("Attention", ["q", "k", "v"], ["o"], **attrs))
        out_shape = [b, sq, h * d]
    elif form.startswith("attn23"):
        ins = ["q", "k", "v"] + (["bias"] if has_bias else [])
        attrs = {"scale": scale}
        if form == "attn23_causal":
            attrs["is_causal"] = 1
        nodes.append(helper.make_node("Attention", ins, ["o"], **attrs))
        out_shape = [b, h, sq, d]
    else:  # unfused
        nodes += ep_probe.unfused_nodes(has_bias)
        out_shape = [b, h, s, d]
    graph_outputs = [vi("o", elem, out_shape)]
    inits = [helper.make_tensor("scale", elem, [], [scale])] if form == "unfused" else []
    graph = helper.make_graph(
        nodes, f"{form}__{case.name}", [inp(n) for n in feeds_shape], graph_outputs, initializer=inits
    )
    return ep_probe.checked_model(graph, 23 if form.startswith("attn23") else 21, form.startswith(("mha", "gqa")))


def feed_shapes(form: str, case: Case) -> dict[str, list[int]]:
    """The model's inputs and their shapes, as make_feeds writes them (without making them)."""
    b, h, s, d = case.batch, case.heads, case.seq, case.head_dim
    sq, hkv = query_len(form, case), kv_heads(form, case)
    if form == "gqa_past":
        return {
            "q": [b, 1, h * d],
            "k": [b, 1, hkv * d],
            "v": [b, 1, hkv * d],
            "past_k": [b, hkv, s - 1, d],
            "past_v": [b, hkv, s - 1, d],
            "seqlens_k": [b],
            "total": [],
        }
    bsd = form in BSD_FORMS
    shapes = (
        {"q": [b, sq, h * d], "k": [b, s, hkv * d], "v": [b, s, hkv * d]}
        if bsd
        else {"q": [b, h, sq, d], "k": [b, hkv, s, d], "v": [b, hkv, s, d]}
    )
    if form == "mha_kpm":
        shapes["kpm"] = [b, s]
        return shapes
    if form in ("gqa", "gqa_grouped"):
        shapes.update(seqlens_k=[b], total=[])
        if case.keep != "causal":
            shapes["bias"] = [b, 1, s, s]
        return shapes
    if form in ("attn23_causal_bsd", "mha_causal") or (form == "attn23_causal" and case.keep == "causal"):
        return shapes
    if case.keep != "none":
        shapes["bias"] = [b, 1, sq, s]
    return shapes


def make(folder: str) -> None:
    ep_probe.save_models(
        folder,
        ((f"{form}__{case.name}", build(form, case)) for case in cases() for form in FORMS if applies(form, case)),
    )


# ------------------------------------------------------------------------------------------------
# run (onnxruntime-gpu, numpy; torch for the long cases' reference and the peer rows)


def cuda_options(tf32: bool) -> dict[str, str]:
    """CUDA EP options: use_tf32=0 for exact float32 products (the EP's default is TF32)."""
    return {"device_id": "0", "use_tf32": "1" if tf32 else "0"}


def cuda_session(ort: Any, path: str, tf32: bool, profile_prefix: str | None = None) -> Any:
    return ort.InferenceSession(
        path,
        ep_probe.session_options(ort, profile_prefix),
        providers=[("CUDAExecutionProvider", cuda_options(tf32)), "CPUExecutionProvider"],
    )


@contextlib.contextmanager
def captured_stdout() -> Iterator[list[str]]:
    """What the process (C++ included) writes to fd 1 inside the block, as lines appended to the list."""
    lines: list[str] = []
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 1)
        try:
            yield lines
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
            tmp.seek(0)
            lines.extend(tmp.read().decode(errors="replace").splitlines())


def kernels_from(lines: list[str]) -> list[str]:
    """The attention kernels ORT printed (ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO=1)."""
    found = []
    for line in lines:
        m = KERNEL_LINE.search(line)
        if m:
            found.append(m.group(1))
        elif "Operator=" in line:
            found += FLAG_LINE.findall(line)
    return sorted(set(found))


def run_cuda(
    ort: Any, path: str, feeds: dict[str, np.ndarray], tf32: bool, repeats: int, profile_prefix: str | None
) -> dict[str, Any]:
    """One CUDA session: outputs (first run), kernels, placement, latency with I/O bound on the GPU."""
    row: dict[str, Any] = {}
    sess = cuda_session(ort, path, tf32, profile_prefix)
    row["providers"] = sess.get_providers()
    with captured_stdout() as lines:
        outs = sess.run(None, feeds)
    row["kernels"] = kernels_from(lines)
    row["debug_lines"] = [ln[:300] for ln in lines if "Operator=" in ln or "SdpaKernel" in ln][:4]
    if profile_prefix:
        placed = ep_probe.placements(sess.end_profiling())
        row["nodes"] = len(placed)
        row["nodes_on_cuda"] = sum(p["provider"] == "CUDAExecutionProvider" for p in placed.values())
        row["cpu_ops"] = sorted({p["op"] for p in placed.values() if p["provider"] != "CUDAExecutionProvider"})
    if repeats:
        row["ms"] = bound_latency(ort, sess, feeds, repeats)
    row["outputs"] = outs
    return row


def bind_on_gpu(ort: Any, sess: Any, feeds: dict[str, np.ndarray]) -> Any:
    """An I/O binding of feeds (copied to the GPU once) and the outputs (left on the GPU), run once."""
    binding = sess.io_binding()
    for name, x in feeds.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0))
    for out in sess.get_outputs():
        binding.bind_output(out.name, "cuda", 0)
    sess.run_with_iobinding(binding)
    return binding


def timed_call(sess: Any, binding: Any) -> Callable[[], float]:
    """One bound run, timed in ms from the inputs' to the outputs' synchronisation."""

    def once() -> float:
        binding.synchronize_inputs()
        t0 = time.perf_counter()
        sess.run_with_iobinding(binding)
        binding.synchronize_outputs()
        return (time.perf_counter() - t0) * 1e3

    return once


def bound_latency(ort: Any, sess: Any, feeds: dict[str, np.ndarray], repeats: int) -> float:
    """Median ms of run_with_iobinding, inputs and outputs on the GPU (no host copies timed)."""
    once = timed_call(sess, bind_on_gpu(ort, sess, feeds))
    return statistics.median(once() for _ in range(repeats))


def torch_reference(ref: dict[str, Any], scale: float) -> np.ndarray:
    """softmax(scale·QKᵀ + bias)·V in float64 on the GPU, one head at a time; BSD or BNSH like the model."""
    import torch

    q = torch.from_numpy(ref["q"].astype(np.float32)).cuda().double()
    k = torch.from_numpy(ref["k"].astype(np.float32)).cuda().double()
    v = torch.from_numpy(ref["v"].astype(np.float32)).cuda().double()
    bias = None if ref["bias"] is None else torch.from_numpy(ref["bias"].astype(np.float32)).cuda().double()
    b, hq, sq, d = q.shape
    group = hq // k.shape[1]
    out = torch.empty((b, hq, sq, v.shape[-1]), dtype=torch.float64, device="cuda")
    for h in range(hq):
        s = q[:, h] @ k[:, h // group].transpose(-1, -2) * scale
        if bias is not None:
            s = s + bias[:, 0]
        out[:, h] = torch.softmax(s, dim=-1) @ v[:, h // group]
    res = out.cpu().numpy()
    if ref["bsd"]:
        res = res.transpose(0, 2, 1, 3).reshape(b, sq, hq * v.shape[-1])
    return res


def sdpa_backend(call: Callable[[], Any]) -> str:
    """Which of PyTorch's SDPA backends ran call, from the CUDA kernels' names (torch.profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    names = " ".join(e.key for e in prof.key_averages()).lower()
    for backend, marks in (
        ("CUDNN_ATTENTION", ("cudnn", "sm90_flash", "cudnn_generated")),
        ("FLASH_ATTENTION", ("flash_fwd", "flash::")),
        ("EFFICIENT_ATTENTION", ("fmha_cutlass", "efficient", "mem_eff")),
    ):
        if any(m in names for m in marks):
            return backend
    return "MATH (" + names[:120] + ")"


def torch_peer(case: Case) -> dict[str, Any]:
    """PyTorch scaled_dot_product_attention on the case's shapes with PyTorch's DEFAULT backend choice
    (what a PyTorch user gets: no backend forced), which backend ran, CUDA events, median of 20."""
    import torch
    import torch.nn.functional as F

    dt = torch.float16 if case.dtype == "float16" else torch.float32
    b, h, s, d = case.batch, case.heads, case.seq, case.head_dim
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dt) for _ in range(3))
    mask = None
    causal = case.keep == "causal"
    if case.keep == "padding":
        keep = torch.ones(b, 1, 1, s, dtype=torch.bool, device="cuda")
        keep[..., s - case.pad :] = False
        mask = keep

    def call() -> Any:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return {"torch_ms": statistics.median(times), "torch": torch.__version__, "torch_backend": sdpa_backend(call)}


def run(folder: str, out_dir: str, only: str | None, budget_s: float) -> None:
    import onnxruntime as ort

    os.environ["ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO"] = "1"
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()  # the CUDA 13 / cuDNN 9 libraries of the machine's nvidia-* packages
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise SystemExit(f"no CUDAExecutionProvider in {ort.get_available_providers()}")
    os.makedirs(out_dir, exist_ok=True)
    rows: list[dict[str, Any]] = []
    all_cases = {c.name: c for c in cases()}
    started = time.perf_counter()
    models = sorted(glob.glob(os.path.join(folder, "*.onnx")), key=lambda p: (_seq_of(p), p))
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "onnxruntime": ort.__version__,
        "gpu": ep_probe.gpu(),
        "rows": rows,
    }
    out_json = os.path.join(out_dir, "cuda_capabilities.json")
    for path in models:
        stem = os.path.basename(path)[: -len(".onnx")]
        if only and not re.search(only, stem):
            continue
        if time.perf_counter() - started > budget_s:
            rows.append({"form": stem, "skipped": "time budget"})
            continue
        form, _, case_name = stem.partition("__")
        case = all_cases[case_name]
        row: dict[str, Any] = {"form": form, **asdict(case), "case": case.name, "sq": query_len(form, case)}
        t0 = time.perf_counter()
        feeds = make_feeds(form, case)
        scale = 1.0 / math.sqrt(case.head_dim)
        try:
            if case.long:
                want = torch_reference(reference_inputs(form, case, feeds), scale)
                row["reference"] = "torch float64 (GPU)"
            else:
                cpu = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
                want = cpu.run(None, feeds)[0]
                row["reference"] = "CPU EP"
                row["vs_float64"] = ep_probe.error(
                    torch_reference(reference_inputs(form, case, feeds), scale), want, case.dtype
                )
        except Exception as exc:  # noqa: BLE001 - reported per row
            row.update(ok=False, error=f"reference: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
            rows.append(row)
            print(json.dumps(row), flush=True)
            continue
        repeats = 10 if case.seq >= 4096 else 30
        prefix = os.path.join(out_dir, "prof_" + stem)
        try:
            exact = run_cuda(ort, path, feeds, tf32=False, repeats=repeats, profile_prefix=prefix)
            row.update(ep_probe.error(want, exact.pop("outputs")[0], case.dtype))
            row.update(exact)
            if case.dtype == "float32":
                tf32 = run_cuda(ort, path, feeds, tf32=True, repeats=repeats, profile_prefix=None)
                row["tf32"] = ep_probe.error(want, tf32.pop("outputs")[0], case.dtype)
                row["tf32_ms"] = tf32["ms"]
                row["tf32_kernels"] = tf32["kernels"]
        except Exception as exc:  # noqa: BLE001 - reported per row
            row.update(ok=False, error=f"cuda: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
        finally:
            for left in glob.glob(prefix + "*"):
                os.remove(left)
        row["seconds"] = round(time.perf_counter() - t0, 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if len(rows) % 20 == 0:
            json.dump(result, open(out_json, "w"), indent=1)
    peers = []
    for case in cases():
        if case.long and case.seq >= 1024 and case.keep in ("none", "padding", "causal"):
            try:
                peers.append({"case": case.name, **asdict(case), **torch_peer(case)})
            except Exception as exc:  # noqa: BLE001 - recorded
                peers.append({"case": case.name, "error": str(exc).splitlines()[0][:200]})
    result["torch_sdpa"] = peers
    json.dump(result, open(out_json, "w"), indent=1)


def _seq_of(path: str) -> int:
    m = re.search(r"_s(\d+)\.onnx$", path)
    return int(m.group(1)) if m else 0


# ------------------------------------------------------------------------------------------------
# table


def table(json_path: str, md_path: str, device: str) -> None:
    data = json.load(open(json_path))
    peers = {p["case"]: p for p in data.get("torch_sdpa", []) if "torch_ms" in p}
    lines = [
        f"# Attention forms on ONNX Runtime's CUDA EP ({device})",
        "",
        f"- date: {data['date']}; onnxruntime-gpu {data['onnxruntime']}; {data.get('gpu', '')}",
        "- command: `benchmarks/cuda_gpu_run.sh caps` (`benchmarks/cuda_capabilities.py make`, then `run` there)",
        f"- short cases: B={SHORT['B']}, H={SHORT['H']}, S={SHORT['S']}; item 1 padded over {PAD} keys, "
        f"{DEAD} fully masked rows in dead_rows; long cases: B=1, H=16, a quarter of the keys padded",
        "- right: the CUDA EP's output with `use_tf32=0` against the same model on the CPU EP (short cases) or a "
        "float64 PyTorch computation (long), |a - e| <= atol + rtol |e| (float32 1e-5 + 1e-4, float16 2e-3 + 2e-2), "
        "NaN in the same places; TF32: the same with the EP's default TF32 products",
        "- on GPU: nodes the CUDA EP ran (ORT profile); kernel: what ORT printed with "
        "ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO=1; ms: median, I/O bound on the GPU (use_tf32=0; TF32 ms beside it)",
        "",
        "| form | case | right | max abs err | TF32 right (err) | on GPU | CPU ops | kernel | ms | TF32 ms | torch SDPA ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        if "skipped" in r:
            lines.append(f"| {r['form']} | | skipped ({r['skipped']}) | | | | | | | | |")
            continue
        if "error" in r:
            lines.append(f"| {r['form']} | {r['case']} | **fails** | {r['error'][:120]} | | | | | | | |")
            continue
        placed = "yes" if r["nodes_on_cuda"] == r["nodes"] else f"{r['nodes_on_cuda']}/{r['nodes']}"
        tf32 = r.get("tf32")
        tf32_cell = "" if tf32 is None else f"{'yes' if tf32['ok'] else 'no'} ({tf32['max_abs']:.2g})"
        peer = peers.get(r["case"]) if r["form"] in ("mha_bias", "gqa", "attn23", "attn23_causal") else None
        lines.append(
            f"| {r['form']} | {r['case']} | {'yes' if r['ok'] else '**NO**'} | {r['max_abs']:.3g}"
            f"{' (' + str(r['nan_mismatch']) + ' NaN)' if r['nan_mismatch'] else ''} | {tf32_cell} | {placed} | "
            f"{', '.join(r['cpu_ops']) or '-'} | {', '.join(r['kernels']) or '-'} | {r['ms']:.3f} | "
            f"{'' if 'tf32_ms' not in r else format(r['tf32_ms'], '.3f')} | "
            f"{'' if peer is None else format(peer['torch_ms'], '.3f')} |"
        )
    ep_probe.write_table(md_path, lines)


def main(argv: list[str] | None = None) -> int:
    steps = ep_probe.StepCommandLine(__doc__, md="benchmarks/results/cuda_capabilities.md")
    steps.run.add_argument("--only", help="a regular expression on the model names")
    steps.run.add_argument("--budget-s", type=float, default=400.0, help="skip the rest after this many seconds")
    return steps.call(
        argv,
        make=lambda args: make(args.folder),
        run=lambda args: run(args.folder, args.out, args.only, args.budget_s),
        table=lambda args: table(args.json, args.md, args.device),
    )


if __name__ == "__main__":
    sys.exit(main())
