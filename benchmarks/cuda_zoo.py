"""The zoo, in float32 and float16, original and lowered, on ONNX Runtime's CUDA EP; the S=4096 speed
blocks; a decode step at past = 2048; and a bisection of every Attention-23 node the EP gets wrong.

Three steps, because the GPU machine has onnxruntime-gpu but not ortflash:

    python benchmarks/cuda_zoo.py make build/cuda_run/zoo       # here: lowered models + inputs
    python benchmarks/cuda_zoo.py run build/cuda_run/zoo --out OUT   # GPU machine
    python benchmarks/cuda_zoo.py table OUT/cuda_zoo.json       # here: benchmarks/results/cuda_zoo.md

- zoo: the 28 exports of issue 11 (webgpu_zoo.py's list), four KV-cache decoders and the exports of
  tests/data/outside; variants ``original``, ``contrib``, ``onnx``, ``cuda`` (float32), and the same
  models converted with ``onnxruntime.transformers.float16.convert_float_to_float16(keep_io_types=True)``
  as ``f16.original``, ``f16.contrib``, ``f16.cuda``. Right: every output on the CUDA EP
  (``use_tf32=0``) against the original on the CPU EP (float32: rtol 1e-4 / atol 1e-5; float16
  variants against the float16 original on the CPU EP within atol 2e-2, see _judge_f16), batch 2 and 37
  positions with one item padded (webgpu_zoo.CHECK). GPU: the nodes the CUDA EP ran (ORT profile).
  ms: I/O bound on the GPU, the EP's defaults (TF32), batch 1 at 128 positions; a decode step at
  past 2048 for the KV-cache decoders.
- long: one attention block, B=1, H=16, D=64, float16, S = 4096 and 16384: the decomposed graph with
  a padding bias [1, 1, 1, S], and with a causal mask built in the graph (webgpu_zoo.causal_in_graph);
  original against ``optimize --target cuda`` / ``contrib`` output, in the same run.
- defects: for every ``onnx`` variant the EP gets wrong, each Attention node is run alone on the
  inputs it saw in the model (read back on the CPU EP), and again with one thing changed at a time
  (the mask's float32-lowest-ish values as -inf, no mask, one batch item, the mask per head), to
  find what the EP gets wrong; the inputs of the first wrong node are written to OUT.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuda_capabilities as caps  # noqa: E402 - the sibling script
import ep_probe  # noqa: E402
import webgpu_zoo as wz  # noqa: E402

TARGETS = ("contrib", "onnx", "cuda")
F16_TARGETS = ("contrib", "cuda")
CACHE_DECODERS = (
    "gpt2_cache_eager_torchscript",
    "llama_cache_sdpa_dynamo",
    "mistral_cache_eager_torchscript",
    "qwen2_cache_sdpa_dynamo",
)
DECODE_PAST = 2048
LONG_LENGTHS = (4096, 16384)


def _entries(manifest: str) -> list[dict[str, Any]]:
    models = json.load(open(manifest))["models"]
    zoo = [
        e for e in models if e.get("file") and e["file"].split("_")[0] in wz.ZOO_FAMILIES and e["file"].count("_") == 2
    ]
    cache = [e for e in models if e.get("file", "")[: -len(".onnx")] in CACHE_DECODERS]
    for e in zoo + cache:
        e["path"] = os.path.join(os.path.dirname(manifest), e["file"])
    outside = [
        {"file": os.path.basename(p), "path": p, "outside": True}
        for p in sorted(glob.glob("tests/data/outside/*.onnx"))
    ]
    return zoo + cache + outside


def _attention_probe(lowered: Any, stem: str, folder: str, save: Any) -> list[dict[str, Any]]:
    """For each Attention node: a copy of the model returning the node's inputs, and the node alone."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [n for n in lowered.graph.node if n.op_type == "Attention" and n.domain in ("", "ai.onnx")]
    if not nodes:
        return []
    probe = onnx.ModelProto()
    probe.CopyFrom(lowered)
    names: list[str] = []
    for n in nodes:
        names += [i for i in n.input if i]
    existing = {o.name for o in probe.graph.output}
    for name in dict.fromkeys(names):
        if name not in existing:
            probe.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    probe_path = os.path.join(folder, f"{stem}.onnx.probe.onnx")
    save(probe, probe_path)
    # every float value the graph computes, as an output: where the CPU and CUDA EPs first part
    every = onnx.shape_inference.infer_shapes(lowered)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in every.graph.value_info}
    every.graph.ClearField("value_info")
    existing |= {o.name for o in every.graph.output}
    order = []
    for n in every.graph.node:
        for o in n.output:
            if o and o not in existing and types.get(o) in (TensorProto.FLOAT, TensorProto.FLOAT16):
                every.graph.output.append(helper.make_tensor_value_info(o, types[o], None))
                order.append(o)
    every_path = os.path.join(folder, f"{stem}.onnx.every.onnx")
    save(every, every_path)
    out = []
    for index, n in enumerate(nodes[:2]):
        ins = [i for i in n.input]
        roles = ["q", "k", "v", "mask", "past_key", "past_value"][: len(ins)]
        graph_inputs = [
            helper.make_tensor_value_info(role, TensorProto.FLOAT, None) for role, name in zip(roles, ins) if name
        ]
        node = helper.make_node(
            "Attention",
            [role if name else "" for role, name in zip(roles, ins)],
            ["o"],
            **{a.name: helper.get_attribute_value(a) for a in n.attribute},
        )
        graph = helper.make_graph(
            [node], "attention_alone", graph_inputs, [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)]
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
        model.ir_version = 10
        alone = os.path.join(folder, f"{stem}.onnx.attention{index}.onnx")
        onnx.save_model(model, alone)
        out.append(
            {
                "alone": alone,
                "inputs": dict(zip(roles, ins)),
                "attrs": {a.name: str(helper.get_attribute_value(a)) for a in n.attribute},
            }
        )
    return [{"probe": probe_path, "every": every_path, "nodes": out}]


def _long_blocks(folder: str) -> list[dict[str, Any]]:
    """float16 single blocks: the decomposed original, padding [1, 1, 1, S] or causal built in the graph."""
    import onnx
    from onnx import TensorProto, helper
    from onnxruntime.transformers import float16

    import ortflash
    from ortflash.lowering import lower

    rows = []
    for s in LONG_LENGTHS:
        for kind in ("padding", "causal"):
            case = caps.Case("none", "float32", 64, s, 1, 16)
            model = caps.build("unfused", case)
            if kind == "causal":
                model = wz.causal_in_graph(model)
            else:
                g = model.graph
                g.input.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, [1, 1, 1, s]))
                add = helper.make_node("Add", ["s0", "bias"], ["s1"])
                softmax = next(n for n in g.node if n.op_type == "Softmax")
                softmax.input[0] = "s1"
                nodes = list(g.node)
                g.ClearField("node")
                g.node.extend(nodes[:3] + [add] + nodes[3:])
            onnx.checker.check_model(model)
            model16 = float16.convert_float_to_float16(model, keep_io_types=False)
            stem = f"block_{kind}_f16_s{s}"
            onnx.save_model(model16, os.path.join(folder, f"{stem}.original.onnx"))
            fused, report = ortflash.optimize(model16, target="ortflash")
            notes_by: dict[str, list[str]] = {}
            for target in F16_TARGETS:
                lowered, notes = lower(fused, target)
                onnx.save_model(lowered, os.path.join(folder, f"{stem}.{target}.onnx"))
                notes_by[target] = [str(n) for n in notes]
            rows.append({"model": stem, "kind": kind, "seq": s, "fused": report.fused, "notes": notes_by})
    return rows


def long_feeds(kind: str, s: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(s)
    feeds = {n: rng.standard_normal((1, 16, s, 64), dtype=np.float32).astype(np.float16) for n in "qkv"}
    if kind == "padding":
        bias = np.zeros((1, 1, 1, s), np.float16)
        bias[..., s - s // 4 :] = np.float16(-np.inf)
        feeds["bias"] = bias
    return feeds


def make(folder: str, manifest: str = "models/manifest.json", only: str | None = None) -> None:
    import fnmatch

    import onnx
    from onnxruntime.transformers import float16

    import ortflash
    from ortflash.checks.feeds import make_feeds
    from ortflash.lowering import lower

    os.makedirs(folder, exist_ok=True)
    index: dict[str, Any] = {"zoo": [], "long": []}
    for entry in _entries(manifest):
        stem = entry["file"][: -len(".onnx")]
        if only and not fnmatch.fnmatch(stem, only):
            continue
        model = onnx.load(entry["path"])
        row: dict[str, Any] = {"model": stem, "original": entry["path"], "blocks": {}, "probes": {}}
        row["cache"] = stem in CACHE_DECODERS
        table = wz._shared_weights(model, os.path.join(folder, f"{stem}.data"))
        fused, report = ortflash.optimize(model, target="ortflash")
        row["fused"] = report.fused
        for target in TARGETS:
            lowered, notes = lower(fused, target)
            wz._save_sharing(lowered, os.path.join(folder, f"{stem}.{target}.onnx"), f"{stem}.data", table)
            row["blocks"][target] = _blocks(notes)
            if target == "onnx":
                row["probes"] = _attention_probe(
                    lowered,
                    f"{stem}.{target}",
                    folder,
                    lambda m, p, s=stem, t=table: wz._save_sharing(m, p, f"{s}.data", t),
                )
        try:
            m16 = float16.convert_float_to_float16(model, keep_io_types=True)
            table16 = wz._shared_weights(m16, os.path.join(folder, f"{stem}.f16.data"))
            wz._save_sharing(m16, os.path.join(folder, f"{stem}.f16.original.onnx"), f"{stem}.f16.data", table16)
            fused16, report16 = ortflash.optimize(m16, target="ortflash")
            row["f16_fused"] = report16.fused
            row["f16_kept"] = [
                f"{b.name}: {b.why}" for b in getattr(report16, "blocks", []) if not getattr(b, "fused", True)
            ][:3]
            for target in F16_TARGETS:
                lowered, notes = lower(fused16, target)
                wz._save_sharing(
                    lowered, os.path.join(folder, f"{stem}.f16.{target}.onnx"), f"{stem}.f16.data", table16
                )
                row["blocks"][f"f16.{target}"] = _blocks(notes)
        except Exception as exc:  # noqa: BLE001 - recorded: the float16 side of this model
            row["f16_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        dims = entry.get("feed_dims")
        check = make_feeds(model, seq_len=wz.CHECK["seq"], batch=wz.CHECK["batch"], dims=dims, seed=0)
        np.savez(os.path.join(folder, f"{stem}.check.npz"), **check)
        if row["cache"]:
            timing, past = _decode_feeds(model, dims, make_feeds)
            row["latency_seq"] = f"decode, past {past}"
        else:
            timing, seq = wz._timing_feeds(model, entry, make_feeds)
            row["latency_seq"] = seq
        np.savez(os.path.join(folder, f"{stem}.timing.npz"), **timing)
        index["zoo"].append(row)
        print(stem, report.fused, row.get("f16_fused"), {t: b["lowered"] for t, b in row["blocks"].items()}, flush=True)
    if not only:
        index["long"] = _long_blocks(folder)
    with open(os.path.join(folder, "index.json"), "w") as f:
        json.dump(index, f, indent=1)


def _decode_feeds(model: Any, dims: Any, make_feeds: Any) -> tuple[dict[str, np.ndarray], int]:
    """One decode step at past DECODE_PAST, or the longest power of two below it minus one that the
    model runs on the CPU EP (GPT-2's position table has 128 rows; the CUDA EP's Gather does not
    check its indices, so an out-of-range past would run there on garbage)."""
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    past = DECODE_PAST
    while True:
        feeds = make_feeds(model, seq_len=past, batch=1, dims=dims, seed=1)
        try:
            sess.run(None, feeds)
            return feeds, past
        except Exception:  # noqa: BLE001 - too long for this model
            if past < 16:
                raise
            past = (past + 1) // 2 - 1


def _blocks(notes: list[Any]) -> dict[str, Any]:
    return {
        "lowered": sum(n.lowered for n in notes),
        "total": len(notes),
        "kept": [n.reason[:300] for n in notes if not n.lowered][:3],
        "ops": sorted({n.op for n in notes}),
        "why": sorted({n.reason.split(";")[0][:200] for n in notes if n.lowered}),
    }


# ------------------------------------------------------------------------------------------------
# run (onnxruntime-gpu; numpy)


F16_MODEL_ATOL = 2e-2  # a whole float16 model's outputs against the same model on the CPU EP


def _judge_f16(refs: dict[str, list[np.ndarray]], outs: list[np.ndarray]) -> dict[str, Any]:
    """A float16 variant on the CUDA EP against the float16 original on the CPU EP: right within
    F16_MODEL_ATOL, NaN in the same places (a per-element rtol 2e-2 / atol 2e-3 fails every whole
    float16 model there, the original too: errors add up over the layers). Its distance to the
    float32 original and the converted original's own are recorded beside it."""
    vs16 = ep_probe.compare(refs["f16"], outs, "float16")
    row: dict[str, Any] = {"vs_f16_cpu": vs16, "max_abs": vs16["max_abs"], "nan_mismatch": vs16["nan_mismatch"]}
    row["ok"] = vs16["nan_mismatch"] == 0 and vs16["max_abs"] <= F16_MODEL_ATOL
    if "f32" in refs:
        row["conversion_error"] = ep_probe.compare(refs["f32"], refs["f16"], "float16")["max_abs"]
        row["vs_f32_cpu"] = ep_probe.compare(refs["f32"], outs, "float16")["max_abs"]
    return row


def _on_cuda(
    ort: Any, path: str, check: dict[str, np.ndarray], timing: dict[str, np.ndarray] | None, prefix: str
) -> dict[str, Any]:
    row: dict[str, Any] = {}
    try:
        exact = caps.run_cuda(ort, path, check, tf32=False, repeats=0, profile_prefix=prefix)
        row["outputs"] = exact.pop("outputs")
        row.update(exact)
        row["attention_on_cpu"] = [op for op in exact.get("cpu_ops", []) if op in ep_probe.ATTENTION_OPS]
        if timing is not None:
            sess = caps.cuda_session(ort, path, tf32=True)
            row["ms"] = caps.bound_latency(ort, sess, timing, 20)
    except Exception as exc:  # noqa: BLE001 - reported per row
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    finally:
        for left in glob.glob(prefix + "*"):
            os.remove(left)
    return row


def _bisect(ort: Any, entry: dict[str, Any], check: dict[str, np.ndarray], out_dir: str) -> list[dict[str, Any]]:
    """Each Attention node alone on the inputs it saw, and with one thing changed at a time."""
    results = []
    for probe in entry["probes"]:
        results.append(_first_divergence(ort, entry["model"], probe["every"], check))
        print(json.dumps(results[-1]), flush=True)
        cpu = ort.InferenceSession(probe["probe"], providers=["CPUExecutionProvider"])
        names = [o.name for o in cpu.get_outputs()]
        seen = dict(zip(names, cpu.run(None, check)))
        for index, node in enumerate(probe["nodes"]):
            feeds = {role: seen[name] for role, name in node["inputs"].items() if name}
            row: dict[str, Any] = {"model": entry["model"], "node": index, "attrs": node["attrs"]}
            row["shapes"] = {r: list(x.shape) for r, x in feeds.items()}
            if "mask" in feeds:
                m = feeds["mask"]
                row["mask_values"] = sorted({float(x) for x in np.unique(m)[:6]})
            variants = {"as seen": feeds}
            if "mask" in feeds:
                m = feeds["mask"]
                variants["mask <= -1e30 as -inf"] = {
                    **feeds,
                    "mask": np.where(m <= -1e30, -np.inf, m).astype(np.float32),
                }
                variants["mask <= -1e30 as -1e4"] = {**feeds, "mask": np.where(m <= -1e30, -1e4, m).astype(np.float32)}
                variants["mask zero"] = {**feeds, "mask": np.zeros_like(m)}
                if m.shape[1] == 1 and feeds["q"].ndim == 4:
                    per_head = np.ascontiguousarray(np.broadcast_to(m, (m.shape[0], feeds["q"].shape[1], *m.shape[2:])))
                    variants["mask per head"] = {**feeds, "mask": per_head}
            batch = feeds["q"].shape[0]
            for b in range(batch):
                variants[f"batch item {b} alone"] = {
                    r: (x[b : b + 1] if x.ndim >= 3 and x.shape[0] == batch else x) for r, x in feeds.items()
                }
            for name, f in variants.items():
                try:
                    want = ort.InferenceSession(node["alone"], providers=["CPUExecutionProvider"]).run(None, f)[0]
                    got = caps.cuda_session(ort, node["alone"], tf32=False).run(None, f)[0]
                    r = ep_probe.error(want, got, "float32")
                    rows_bad = np.argwhere(np.abs(want - got) > 1e-3)
                    r["wrong_at"] = rows_bad[:3].tolist()
                    row[name] = r
                except Exception as exc:  # noqa: BLE001
                    row[name] = {"error": str(exc).splitlines()[0][:200]}
            if not row["as seen"].get("ok", True) and not any(x.startswith("defect_") for x in os.listdir(out_dir)):
                np.savez(os.path.join(out_dir, f"defect_{entry['model']}_node{index}.npz"), **feeds)
            results.append(row)
            print(json.dumps(row), flush=True)
    return results


def _first_divergence(ort: Any, model: str, every: str, check: dict[str, np.ndarray]) -> dict[str, Any]:
    """The first node, in graph order, whose float output differs between the CPU and CUDA EPs."""
    import onnx

    graph = onnx.load(every, load_external_data=False).graph
    producer = {o: (n.op_type, n.name) for n in graph.node for o in n.output}
    cpu = ort.InferenceSession(every, providers=["CPUExecutionProvider"])
    names = [o.name for o in cpu.get_outputs()]
    want = dict(zip(names, cpu.run(None, check)))
    got = dict(zip(names, caps.cuda_session(ort, every, tf32=False).run(None, check)))
    row: dict[str, Any] = {"model": model, "first_divergence": None}
    for name in names:
        if name not in producer:
            continue
        w, g = want[name], got[name]
        if w.shape != g.shape:
            row["first_divergence"] = {"value": name, "node": producer[name], "shapes": [list(w.shape), list(g.shape)]}
            break
        r = ep_probe.error(w, g, "float32" if w.dtype == np.float32 else "float16")
        if not r["ok"] and r["max_abs"] > 1e-3:
            row["first_divergence"] = {"value": name, "node": producer[name], **r, "shape": list(w.shape)}
            break
    return row


def run(folder: str, out_dir: str, budget_s: float) -> None:
    import onnxruntime as ort

    os.environ["ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO"] = "1"
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()  # the CUDA 13 / cuDNN 9 libraries of the machine's nvidia-* packages
    os.makedirs(out_dir, exist_ok=True)
    index = json.load(open(os.path.join(folder, "index.json")))
    rows: list[dict[str, Any]] = []
    defects: list[dict[str, Any]] = []
    prefix = os.path.join(out_dir, "prof")
    started = time.perf_counter()
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "onnxruntime": ort.__version__,
        "gpu": ep_probe.gpu(),
        "rows": rows,
        "defects": defects,
    }
    out_json = os.path.join(out_dir, "cuda_zoo.json")
    for entry in index["long"]:
        feeds = long_feeds(entry["kind"], entry["seq"])
        base = os.path.join(folder, entry["model"])
        want = None
        for variant in ("original",) + F16_TARGETS:
            row = {"model": entry["model"], "variant": variant, "seq": entry["seq"], "kind": entry["kind"]}
            got = _on_cuda(ort, f"{base}.{variant}.onnx", feeds, feeds, prefix)
            if "error" not in got:
                outs = got.pop("outputs")
                if want is None:
                    want = outs  # the original on the CUDA EP: float16 throughout
                row.update(ep_probe.compare(want, outs, "float16"))
            row.update(got)
            rows.append(row)
            print(json.dumps(row), flush=True)
    for entry in index["zoo"]:
        stem = entry["model"]
        if time.perf_counter() - started > budget_s:
            rows.append({"model": stem, "skipped": "time budget"})
            continue
        check = dict(np.load(os.path.join(folder, f"{stem}.check.npz")))
        timing = dict(np.load(os.path.join(folder, f"{stem}.timing.npz")))
        refs: dict[str, list[np.ndarray]] = {}
        for precision, original in (
            ("f32", entry["original"]),
            ("f16", os.path.join(folder, f"{stem}.f16.original.onnx")),
        ):
            if not os.path.exists(original):
                continue
            try:
                refs[precision] = ort.InferenceSession(original, providers=["CPUExecutionProvider"]).run(None, check)
            except Exception as exc:  # noqa: BLE001
                rows.append({"model": stem, "variant": f"{precision}.original", "error": f"cpu: {str(exc)[:200]}"})
        variants = [("original", entry["original"], "f32")] + [
            (t, os.path.join(folder, f"{stem}.{t}.onnx"), "f32") for t in TARGETS
        ]
        variants += [("f16.original", os.path.join(folder, f"{stem}.f16.original.onnx"), "f16")]
        variants += [(f"f16.{t}", os.path.join(folder, f"{stem}.f16.{t}.onnx"), "f16") for t in F16_TARGETS]
        for variant, path, precision in variants:
            if precision not in refs or not os.path.exists(path):
                continue
            row = {"model": stem, "variant": variant, "latency_seq": entry["latency_seq"]}
            got = _on_cuda(ort, path, check, timing, prefix)
            if "error" not in got:
                outs = got.pop("outputs")
                if precision == "f32":
                    row.update(ep_probe.compare(refs["f32"], outs, "float32"))
                else:
                    row.update(_judge_f16(refs, outs))
            row.update(got)
            if variant in entry["blocks"]:
                row["blocks"] = entry["blocks"][variant]
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "debug_lines"}), flush=True)
            if variant == "onnx" and not row.get("ok", True) and entry["probes"]:
                try:
                    defects += _bisect(ort, entry, check, out_dir)
                except Exception as exc:  # noqa: BLE001
                    defects.append({"model": stem, "error": str(exc).splitlines()[0][:300]})
        json.dump(result, open(out_json, "w"), indent=1)
    json.dump(result, open(out_json, "w"), indent=1)


# ------------------------------------------------------------------------------------------------
# table


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    if "error" in r:
        return f"**fails**: {r['error'][:60]}"
    right = "right" if r["ok"] else f"**WRONG** ({r['max_abs']:.2g})"
    gpu = "" if not r.get("attention_on_cpu") else f", attention on CPU: {', '.join(r['attention_on_cpu'])}"
    return right + gpu


def table(json_path: str, index_path: str | None, md_path: str, device: str) -> None:
    data = json.load(open(json_path))
    zoo = [r for r in data["rows"] if "seq" not in r and "skipped" not in r]
    long = [r for r in data["rows"] if "seq" in r]
    models = list(dict.fromkeys(r["model"] for r in zoo))
    by = {(r["model"], r["variant"]): r for r in zoo}
    variants = ("original", "contrib", "onnx", "cuda", "f16.original", "f16.contrib", "f16.cuda")
    lines = [
        f"# The zoo on ONNX Runtime's CUDA EP ({device})",
        "",
        f"- date: {data['date']}; onnxruntime-gpu {data['onnxruntime']}; {data.get('gpu', '')}",
        "- command: `benchmarks/cuda_gpu_run.sh zoo` after `python benchmarks/cuda_zoo.py make build/cuda_run/zoo`",
        "- right: every output on the CUDA EP with use_tf32=0 against the original on the CPU EP (float32: rtol 1e-4 / "
        "atol 1e-5); f16.*: the zoo model converted by onnxruntime.transformers.float16 (keep_io_types), against that "
        "converted original on the CPU EP within atol 2e-2 (the whole model's outputs); batch 2, 37 positions, one "
        "item padded",
        "- ms: I/O bound on the GPU, EP defaults (TF32), batch 1 at 128 positions (KV-cache decoders: one decode step "
        f"at past {DECODE_PAST})",
        "",
        "| model | " + " | ".join(variants) + " | ms " + " / ".join(variants) + " |",
        "|---|" + "---|" * (len(variants) + 1),
    ]
    totals = {v: [0, 0, 0] for v in variants}  # right, right with attention on GPU, present
    for m in models:
        cells, ms = [], []
        for v in variants:
            r = by.get((m, v))
            cells.append(_cell(r))
            ms.append(f"{r['ms']:.2f}" if r and r.get("ms") else "-")
            if r is not None:
                totals[v][2] += 1
                if "error" not in r and r["ok"]:
                    totals[v][0] += 1
                    totals[v][1] += not r.get("attention_on_cpu")
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {' / '.join(ms)} |")
    lines += [
        "",
        "| | " + " | ".join(variants) + " |",
        "|---|" + "---|" * len(variants),
        "| right | " + " | ".join(f"{totals[v][0]}/{totals[v][2]}" for v in variants) + " |",
        "| right, attention on the GPU | " + " | ".join(f"{totals[v][1]}/{totals[v][2]}" for v in variants) + " |",
        "",
        "## One attention block, float16, B=1, H=16, D=64 (original: the decomposed graph on the CUDA EP)",
        "",
        "| block | S | variant | result | kernels | ms | speed-up vs original |",
        "|---|---|---|---|---|---|---|",
    ]
    base = {r["model"]: r.get("ms") for r in long if r["variant"] == "original"}
    for r in long:
        ms, b = r.get("ms"), base.get(r["model"])
        speed = f"{b / ms:.1f}x" if ms and b and r["variant"] != "original" else ""
        lines.append(
            f"| {r['kind']} | {r['seq']} | {r['variant']} | {_cell(r)} | {', '.join(r.get('kernels', [])) or '-'} | "
            f"{'-' if not ms else format(ms, '.3f')} | {speed} |"
        )
    ep_probe.write_table(md_path, lines)


def main(argv: list[str] | None = None) -> int:
    steps = ep_probe.StepCommandLine(__doc__, md="benchmarks/results/cuda_zoo.md")
    steps.make.add_argument("--only", help="zoo stems matching this glob (no long blocks)")
    steps.run.add_argument("--budget-s", type=float, default=400.0)
    steps.table.add_argument("--index")
    return steps.call(
        argv,
        make=lambda args: make(args.folder, only=args.only),
        run=lambda args: run(args.folder, args.out, args.budget_s),
        table=lambda args: table(args.json, args.index, args.md, args.device),
    )


if __name__ == "__main__":
    sys.exit(main())
