"""Which attention forms ONNX Runtime's WebGPU EP runs on the GPU and computes right: the probe.

Two steps, because the GPU machine has onnxruntime but not onnx or ortflash:

    python benchmarks/webgpu_capabilities.py make build/webgpu_run/caps      # here: models + inputs
    python benchmarks/webgpu_capabilities.py run build/webgpu_run/caps --out OUT   # GPU machine
    python benchmarks/webgpu_capabilities.py table OUT/webgpu_capabilities.json   # here: the .md

Every model is one attention block, one form x one case:

- forms: com.microsoft MultiHeadAttention with the mask as ``attention_bias`` (``mha_bias``) or as
  ``key_padding_mask`` plus ``unidirectional`` (``mha_kpm``); GroupQueryAttention (``gqa``, always
  causal; padding as ``attention_bias``); ONNX Attention opset 23 (``attn23``, bool ``attn_mask``);
  the decomposed ``MatMul -> Add -> Softmax -> MatMul`` graph exporters write (``unfused``);
- cases: no mask, right padding, causal, causal + left padding (rows with every key masked), the
  same with those rows given one visible key (to isolate fully masked rows), fully masked rows
  alone, with the fill float32-lowest (transformers) or -inf; float16; S up to 8192 (the unfused
  graph's score tensor is then 4 GiB in float32).

The run step compares each model's outputs on the WebGPU EP with the same model on the CPU EP
(max abs error, NaN mismatches), counts the nodes each EP ran (from ORT's profile) and times both.
"""

from __future__ import annotations

import glob
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ep_probe  # noqa: E402 - the probe scripts' shared pieces

F32_LOWEST = float(np.finfo(np.float32).min)
SMALL = {"B": 2, "H": 4, "S": 96, "D": 64}
PAD = 30  # padded keys of batch item 1
LONG_LENGTHS = (1024, 4096, 8192)


@dataclass(frozen=True)
class Case:
    name: str
    keep: str  # how the [B, Sq, Sk] keep mask is made (see keep_mask)
    fill: float = F32_LOWEST
    dtype: str = "float32"
    seq: int = SMALL["S"]
    batch: int = SMALL["B"]
    heads: int = SMALL["H"]


def keep_mask(case: Case) -> np.ndarray | None:
    """bool [B, S, S], True = visible; None for no mask."""
    b, s = case.batch, case.seq
    if case.keep == "none":
        return None
    keep = np.ones((b, s, s), bool)
    causal = np.tril(np.ones((s, s), bool))
    if case.keep == "padding":
        keep[1, :, s - PAD :] = False
    elif case.keep == "causal":
        keep &= causal
    elif case.keep in ("causal_leftpad", "causal_leftpad_alive"):
        keep &= causal
        keep[1, :, :PAD] = False
        if case.keep == "causal_leftpad_alive":
            keep[1, :PAD, 0] = True  # the rows that would be fully masked see key 0
    elif case.keep == "dead_rows":
        keep[1, :10, :] = False
    else:
        raise ValueError(case.keep)
    return keep


def cases() -> list[Case]:
    out = [
        Case("nomask", "none"),
        Case("padding", "padding"),
        Case("causal", "causal"),
        Case("causal_leftpad", "causal_leftpad"),
        Case("causal_leftpad_neginf", "causal_leftpad", fill=-math.inf),
        Case("causal_leftpad_alive", "causal_leftpad_alive"),
        Case("dead_rows", "dead_rows"),
        Case("dead_rows_neginf", "dead_rows", fill=-math.inf),
        Case("padding_f16", "padding", dtype="float16"),
        Case("causal_f16", "causal", dtype="float16"),
    ]
    for s in LONG_LENGTHS:
        out.append(Case(f"nomask_s{s}", "none", seq=s, batch=1, heads=16))
        out.append(Case(f"causal_s{s}", "causal", seq=s, batch=1, heads=16))
    out.append(Case("nomask_s8192_f16", "none", dtype="float16", seq=8192, batch=1, heads=16))
    return out


FORMS = ("mha_bias", "mha_kpm", "gqa", "attn23", "unfused")


def applies(form: str, case: Case) -> bool:
    """Whether the form can express the case at all."""
    if form == "gqa":  # causal only (no past: top-left)
        return case.keep.startswith("causal")
    if form == "mha_kpm":  # a key padding mask and unidirectional: no per-row masks
        return case.keep in ("padding", "causal", "causal_leftpad") and case.seq <= 8192 and case.fill != -math.inf
    return True


# ------------------------------------------------------------------------------------------------
# make (needs onnx)


def make_feeds(form: str, case: Case) -> dict[str, np.ndarray]:
    """The model's inputs (numpy only: the GPU machine makes its own, big ones do not travel)."""
    b, h, s, d = case.batch, case.heads, case.seq, SMALL["D"]
    np_dtype = np.float32 if case.dtype == "float32" else np.float16
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((b, h, s, d)).astype(np_dtype) for _ in range(3))
    keep = keep_mask(case)
    feeds: dict[str, np.ndarray] = {}
    if form in ("mha_bias", "mha_kpm", "gqa"):
        feeds.update(
            {n: np.ascontiguousarray(x.transpose(0, 2, 1, 3).reshape(b, s, h * d)) for n, x in zip("qkv", (q, k, v))}
        )
    else:
        feeds.update(q=q, k=k, v=v)
    if form == "mha_kpm":
        kpm = np.ones((b, s), np.int32)
        if case.keep == "causal_leftpad":
            kpm[1, :PAD] = 0
        if case.keep == "padding":
            kpm[1, s - PAD :] = 0
        feeds["kpm"] = kpm
        return feeds
    if form == "gqa":
        feeds["seqlens_k"] = np.full((b,), s - 1, np.int32)
        feeds["total"] = np.array(s, np.int32)
        if case.keep == "causal":
            return feeds
    if keep is not None:
        # transformers fills with the dtype's lowest: float16's for a float16 model
        fill = float(np.finfo(np_dtype).min) if case.fill == F32_LOWEST else case.fill
        feeds["bias"] = np.where(keep[:, None], 0.0, fill).astype(np_dtype)
    return feeds


def build(form: str, case: Case) -> Any:
    from onnx import TensorProto, helper

    b, h, s, d = case.batch, case.heads, case.seq, SMALL["D"]
    elem = TensorProto.FLOAT if case.dtype == "float32" else TensorProto.FLOAT16
    keep = keep_mask(case)
    bias = None if keep is None else (b, 1, s, s)  # the bias input's shape
    scale = 1.0 / math.sqrt(d)
    vi = helper.make_tensor_value_info
    nodes: list[Any] = []
    inputs: list[Any] = []

    if form in ("mha_bias", "mha_kpm", "gqa"):
        inputs += [vi(n, elem, [b, s, h * d]) for n in "qkv"]
        if form == "mha_bias":
            ins = ["q", "k", "v"]
            if bias is not None:
                inputs.append(vi("bias", elem, list(bias)))
                ins += ["", "", "bias"]
            nodes.append(
                helper.make_node("MultiHeadAttention", ins, ["o"], domain="com.microsoft", num_heads=h, scale=scale)
            )
        elif form == "mha_kpm":
            assert keep is not None
            inputs.append(vi("kpm", TensorProto.INT32, [b, s]))
            nodes.append(
                helper.make_node(
                    "MultiHeadAttention",
                    ["q", "k", "v", "", "kpm"],
                    ["o"],
                    domain="com.microsoft",
                    num_heads=h,
                    scale=scale,
                    unidirectional=int(case.keep.startswith("causal")),
                )
            )
        else:  # gqa, causal; left padding as attention_bias
            inputs += [vi("seqlens_k", TensorProto.INT32, [b]), vi("total", TensorProto.INT32, [])]
            ins = ["q", "k", "v", "", "", "seqlens_k", "total"]
            if case.keep != "causal":
                assert bias is not None
                inputs.append(vi("bias", elem, list(bias)))
                ins += ["", "", "", "bias"]
            nodes.append(ep_probe.group_query_attention(ins, h, h, scale))
    else:
        inputs += [vi(n, elem, [b, h, s, d]) for n in "qkv"]
        if form == "attn23":
            ins = ["q", "k", "v"]
            if bias is not None:
                inputs.append(vi("bias", elem, list(bias)))
                ins.append("bias")
            nodes.append(helper.make_node("Attention", ins, ["o"], scale=scale))
        else:  # unfused
            if bias is not None:
                inputs.append(vi("bias", elem, list(bias)))
            nodes += ep_probe.unfused_nodes(bias is not None)
    out_shape = [b, s, h * d] if form in ("mha_bias", "mha_kpm", "gqa") else [b, h, s, d]
    inits = []
    if form == "unfused":
        inits.append(helper.make_tensor("scale", elem, [], [scale]))
    graph = helper.make_graph(nodes, f"{form}_{case.name}", inputs, [vi("o", elem, out_shape)], initializer=inits)
    return ep_probe.checked_model(graph, 23 if form == "attn23" else 21, form in ("mha_bias", "mha_kpm", "gqa"))


def make(folder: str) -> None:
    ep_probe.save_models(
        folder,
        ((f"{form}__{case.name}", build(form, case)) for case in cases() for form in FORMS if applies(form, case)),
    )


# ------------------------------------------------------------------------------------------------
# run (needs onnxruntime with the WebGPU plugin EP; numpy)


def webgpu_session_options(ort: Any, profile_prefix: str | None) -> Any:
    """Session options that put the WebGPU plugin EP first (it must be registered already)."""
    import onnxruntime_ep_webgpu as wep

    device = next(d for d in ort.get_ep_devices() if d.ep_name == wep.get_ep_name())
    so = ep_probe.session_options(ort, profile_prefix)
    so.add_provider_for_devices([device], {})
    return so


def register_webgpu(ort: Any) -> str:
    import onnxruntime_ep_webgpu as wep

    ort.register_execution_provider_library("webgpu", wep.get_library_path())
    return str(wep.get_ep_name())


def timed(sess: Any, feeds: dict[str, np.ndarray], repeats: int) -> tuple[list[np.ndarray], float]:
    outs = sess.run(None, feeds)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    return outs, statistics.median(times) if times else float("nan")


def run(folder: str, out_dir: str, only: str | None) -> None:
    import onnxruntime as ort

    ep_name = register_webgpu(ort)
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    models = sorted(glob.glob(os.path.join(folder, "*.onnx")))
    for path in models:
        stem = path[: -len(".onnx")]
        if only and only not in os.path.basename(stem):
            continue
        form, _, case_name = os.path.basename(stem).partition("__")
        case = next(c for c in cases() if c.name == case_name)
        meta = {
            "form": form,
            "case": case.name,
            "dtype": case.dtype,
            "seq": case.seq,
            "batch": case.batch,
            "heads": case.heads,
            "keep": case.keep,
            "fill": repr(case.fill),
        }
        feeds = make_feeds(form, case)
        repeats = 5 if meta["seq"] >= 1024 else 20
        row: dict[str, Any] = dict(meta)
        t0 = time.perf_counter()
        try:
            cpu = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            want, row["cpu_ms"] = timed(cpu, feeds, 3 if meta["seq"] >= 1024 else 10)
            del cpu
        except Exception as exc:  # noqa: BLE001 - reported per row
            row.update(ok=False, error=f"cpu: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
            rows.append(row)
            continue
        prefix = os.path.join(out_dir, "prof_" + os.path.basename(stem))
        try:
            sess = ort.InferenceSession(path, webgpu_session_options(ort, prefix))
            row["providers"] = sess.get_providers()
            got, row["webgpu_ms"] = timed(sess, feeds, repeats)
            placed = ep_probe.placements(sess.end_profiling())
        except Exception as exc:  # noqa: BLE001 - reported per row
            row.update(ok=False, error=f"webgpu: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
            rows.append(row)
            print(json.dumps(row), flush=True)
            continue
        finally:
            for left in glob.glob(prefix + "*"):  # a failed run leaves its profile behind
                os.remove(left)
        row.update(ep_probe.error(want[0], got[0], meta["dtype"]))
        row["nodes"] = len(placed)
        row["nodes_on_webgpu"] = sum(p["provider"] == ep_name or "WebGpu" in p["provider"] for p in placed.values())
        row["cpu_fallback_ops"] = sorted({p["op"] for p in placed.values() if "CPU" in p["provider"]})
        row["attention_on_webgpu"] = all(
            "WebGpu" in p["provider"] or p["provider"] == ep_name
            for p in placed.values()
            if p["op"] in ep_probe.ATTENTION_OPS
        )
        row["seconds"] = round(time.perf_counter() - t0, 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "onnxruntime": ort.__version__,
        "ep": ep_name,
        "rows": rows,
    }
    try:
        import onnxruntime_ep_webgpu as wep

        result["onnxruntime_ep_webgpu"] = getattr(wep, "__version__", "?")
    except ImportError:
        pass
    with open(os.path.join(out_dir, "webgpu_capabilities.json"), "w") as f:
        json.dump(result, f, indent=1)


# ------------------------------------------------------------------------------------------------
# table


def table(json_path: str, md_path: str, device: str) -> None:
    data = json.load(open(json_path))
    lines = [
        f"# Attention forms on ONNX Runtime's WebGPU EP ({device})",
        "",
        f"- date: {data['date']}; onnxruntime {data['onnxruntime']} + onnxruntime-ep-webgpu "
        f"{data.get('onnxruntime_ep_webgpu', '?')} (plugin EP `{data['ep']}`, Dawn on Vulkan)",
        "- command: `benchmarks/webgpu_gpu_run.sh` (`benchmarks/webgpu_capabilities.py make`, then `run` there)",
        f"- small cases: B={SMALL['B']}, H={SMALL['H']}, S={SMALL['S']}, D={SMALL['D']}; item 1 padded over {PAD} keys; "
        "long cases: B=1, H=16, D=64; every model one attention block",
        "- right: the WebGPU EP's output against the same model on the CPU EP, |a - e| <= atol + rtol |e| "
        "(float32 1e-5 + 1e-4, float16 2e-3 + 2e-2), NaN in the same places; "
        "on GPU: every node of the model ran on the WebGPU EP (ORT profile); ms: median host-to-host run",
        "",
        "| form | case | dtype | S | right | max abs err | NaN mismatches | on GPU | CPU ops | WebGPU ms | CPU ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        if "error" in r:
            lines.append(
                f"| {r['form']} | {r['case']} | {r['dtype']} | {r['seq']} | **fails** | {r['error'][:120]} | | | | | |"
            )
            continue
        placed = "yes" if r["nodes_on_webgpu"] == r["nodes"] else f"{r['nodes_on_webgpu']}/{r['nodes']}"
        lines.append(
            f"| {r['form']} | {r['case']} | {r['dtype']} | {r['seq']} | {'yes' if r['ok'] else '**NO**'} | "
            f"{r['max_abs']:.3g} | {r['nan_mismatch']} | {placed} | "
            f"{', '.join(r['cpu_fallback_ops']) or '-'} | {r['webgpu_ms']:.2f} | {r['cpu_ms']:.2f} |"
        )
    ep_probe.write_table(md_path, lines)


def main(argv: list[str] | None = None) -> int:
    steps = ep_probe.StepCommandLine(__doc__, md="benchmarks/results/webgpu_capabilities.md")
    steps.run.add_argument("--only")
    return steps.call(
        argv,
        make=lambda args: make(args.folder),
        run=lambda args: run(args.folder, args.out, args.only),
        table=lambda args: table(args.json, args.md, args.device),
    )


if __name__ == "__main__":
    sys.exit(main())
