"""The zoo (models/manifest.json), original and lowered to each target, on ONNX Runtime's WebGPU EP.

Three steps, because the GPU machine has onnxruntime and the WebGPU plugin EP but not ortflash:

    python benchmarks/webgpu_zoo.py make build/webgpu_run/zoo      # here: lowered models + inputs
    python benchmarks/webgpu_zoo.py run build/webgpu_run/zoo --out OUT   # GPU machine
    python benchmarks/webgpu_zoo.py table OUT/webgpu_zoo.json      # here: benchmarks/results/webgpu_zoo.md

Per model and variant (original, contrib, onnx, webgpu): right or wrong against the original on
the CPU EP (batch 2, 37 positions, one item padded at the end and one at the start, as
``make_feeds`` writes them), how many nodes the WebGPU EP took and which attention ops fell back
to the CPU (ORT profile), and the latency at 128 positions (the zoo's models have 128 positions
at most). Longer sequences (1024, 4096, 8192) use the capability probe's single-block
MatMul/Softmax/MatMul models (benchmarks/webgpu_capabilities.py), fused and lowered here.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ep_probe  # noqa: E402 - the probe scripts' shared pieces
import webgpu_capabilities as caps  # noqa: E402 - the sibling script

TARGETS = ("contrib", "onnx", "webgpu")
VARIANTS = ("original",) + TARGETS
CHECK = {"seq": 37, "batch": 2}
LATENCY_SEQ = 128
ZOO_FAMILIES = ("bert", "gpt2", "vit", "t5", "bart", "whisper", "llama")
LONG = [(kind, s) for s in caps.LONG_LENGTHS for kind in ("nomask", "causal", "causal_in_graph")]


def causal_in_graph(model: Any) -> Any:
    """The probe's unmasked block with a causal mask built inside the graph, as exporters write it
    (Range over the sequence, j <= i, Where(keep, 0, -inf) added to the scores): a block ortflash
    proves causal, so `--target webgpu` can pick GroupQueryAttention, where a mask that arrives as a
    graph input (the probe's `causal` case) proves nothing."""
    import onnx
    from onnx import TensorProto, helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    scores = next(n for n in g.node if n.op_type == "Softmax").input[0]
    consts = {
        "ci_zero": helper.make_tensor("ci_zero", TensorProto.INT64, [], [0]),
        "ci_one": helper.make_tensor("ci_one", TensorProto.INT64, [], [1]),
        "ci_axis0": helper.make_tensor("ci_axis0", TensorProto.INT64, [1], [0]),
        "ci_axis1": helper.make_tensor("ci_axis1", TensorProto.INT64, [1], [1]),
        "ci_fzero": helper.make_tensor("ci_fzero", TensorProto.FLOAT, [], [0.0]),
        "ci_fill": helper.make_tensor("ci_fill", TensorProto.FLOAT, [], [float("-inf")]),
    }
    g.initializer.extend(consts.values())
    mask_nodes = [
        helper.make_node("Shape", ["q"], ["ci_shape"], start=2, end=3),
        helper.make_node("Squeeze", ["ci_shape", "ci_axis0"], ["ci_len"]),
        helper.make_node("Range", ["ci_zero", "ci_len", "ci_one"], ["ci_pos"]),
        helper.make_node("Unsqueeze", ["ci_pos", "ci_axis1"], ["ci_rows"]),  # i: [S, 1]
        helper.make_node("Unsqueeze", ["ci_pos", "ci_axis0"], ["ci_cols"]),  # j: [1, S]
        helper.make_node("LessOrEqual", ["ci_cols", "ci_rows"], ["ci_keep"]),
        helper.make_node("Where", ["ci_keep", "ci_fzero", "ci_fill"], ["ci_bias"]),
        helper.make_node("Add", [scores, "ci_bias"], ["ci_scores"]),
    ]
    softmax = next(n for n in g.node if n.op_type == "Softmax")
    softmax.input[0] = "ci_scores"
    position = list(g.node).index(softmax)
    nodes = list(g.node)
    g.ClearField("node")
    g.node.extend(nodes[:position] + mask_nodes + nodes[position:])
    onnx.checker.check_model(m)
    return m


def _save(model: Any, path: str) -> None:
    import onnx

    onnx.save_model(model, path)


_SHARED_MIN_BYTES = 1024
_MAX_TIMING_BYTES = 1 << 20


def _shared_weights(model: Any, data_path: str) -> dict[str, tuple[int, bytes]]:
    """Write model's big initializers into one file: {name: (offset, bytes)}. The four variants of a
    zoo model point at it, so the GPU machine gets each model's weights once (the carry is 64 MiB)."""
    from onnx import numpy_helper

    table: dict[str, tuple[int, bytes]] = {}
    with open(data_path, "wb") as f:
        for t in model.graph.initializer:
            raw = numpy_helper.to_array(t).astype(numpy_helper.to_array(t).dtype.newbyteorder("<")).tobytes()
            if len(raw) < _SHARED_MIN_BYTES:
                continue
            f.write(b"\0" * (-f.tell() % 64))
            table[t.name] = (f.tell(), raw)
            f.write(raw)
    return table


def _save_sharing(model: Any, path: str, data_name: str, table: dict[str, tuple[int, bytes]]) -> None:
    """Save model with every initializer found in table (same name, same bytes) read from data_name."""
    import onnx
    from onnx import numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    for t in model.graph.initializer:
        found = table.get(t.name)
        if found is None:
            continue
        offset, raw = found
        arr = numpy_helper.to_array(t)
        if arr.astype(arr.dtype.newbyteorder("<")).tobytes() != raw:
            continue
        dims, dtype, name = list(t.dims), t.data_type, t.name
        t.Clear()
        t.name, t.data_type = name, dtype
        t.dims.extend(dims)
        t.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(len(raw)))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
    onnx.save_model(model, path)


def _timing_feeds(model: Any, entry: dict[str, Any], make_feeds: Any) -> tuple[dict[str, np.ndarray], int]:
    """Batch 1 at LATENCY_SEQ positions, or the longest power of two below it that the model runs
    (Whisper's decoder takes 64 positions at most)."""
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    seq = LATENCY_SEQ
    while True:
        feeds = make_feeds(model, seq_len=seq, batch=1, dims=entry.get("feed_dims"), seed=1)
        try:
            sess.run(None, feeds)
            return feeds, seq
        except Exception:  # noqa: BLE001 - too long for this model: halve
            if seq <= 8:
                raise
            seq //= 2


def make(folder: str, manifest: str = "models/manifest.json", only: str | None = None, long: bool = True) -> None:
    import onnx

    import ortflash
    from ortflash.checks.feeds import make_feeds
    from ortflash.lowering import lower

    os.makedirs(folder, exist_ok=True)
    index: dict[str, Any] = {"zoo": [], "long": []}
    # issue 11's zoo: seven families x {eager, sdpa} x {dynamo, torchscript}; the KV-cache models
    # added later make the carry to the GPU machine too big (64 MiB with the wheels)
    # (--only GLOB picks other zoo files instead, e.g. the KV-cache decoders on their own)
    entries = [
        e
        for e in json.load(open(manifest))["models"]
        if e.get("file")
        and (
            fnmatch.fnmatch(e["file"], only)
            if only
            else e["file"].split("_")[0] in ZOO_FAMILIES and e["file"].count("_") == 2
        )
    ]
    for entry in entries:
        stem = entry["file"][: -len(".onnx")]
        path = os.path.join(os.path.dirname(manifest), entry["file"])
        model = onnx.load(path)
        fused, _ = ortflash.optimize(model, target="ortflash")
        row: dict[str, Any] = {"model": stem, "original": path, "blocks": {}}  # tracked: travels anyway
        table = _shared_weights(model, os.path.join(folder, f"{stem}.data"))
        for target in TARGETS:
            lowered, notes = lower(fused, target)
            _save_sharing(lowered, os.path.join(folder, f"{stem}.{target}.onnx"), f"{stem}.data", table)
            row["blocks"][target] = {
                "lowered": sum(n.lowered for n in notes),
                "kept": [n.reason for n in notes if not n.lowered],
                "ops": sorted({n.op for n in notes}),
            }
        seq_dynamic = entry.get("dynamic", {}).get("seq", True)
        check = make_feeds(model, seq_len=CHECK["seq"], batch=CHECK["batch"], dims=entry.get("feed_dims"), seed=0)
        timing, seq_run = _timing_feeds(model, entry, make_feeds)
        seq: int | str = seq_run
        np.savez(os.path.join(folder, f"{stem}.check.npz"), **check)
        if sum(x.nbytes for x in timing.values()) <= _MAX_TIMING_BYTES:
            np.savez(os.path.join(folder, f"{stem}.timing.npz"), **timing)
        else:  # a KV cache model's past at 128 positions: timed on the check inputs instead (carry limit)
            seq = "check"
        row["latency_seq"] = seq if seq_dynamic or seq == "check" else "fixed"
        index["zoo"].append(row)
        print(stem, {t: row["blocks"][t]["lowered"] for t in TARGETS}, flush=True)
    caps_dir = os.path.join(folder, "long")
    os.makedirs(caps_dir, exist_ok=True)
    for kind, s in LONG if long else []:
        in_graph = kind == "causal_in_graph"
        case = next(c for c in caps.cases() if c.name == f"{'nomask' if in_graph else kind}_s{s}")
        original = caps.build("unfused", case)
        if in_graph:
            original = causal_in_graph(original)
        stem = f"unfused__{kind}_s{s}"
        _save(original, os.path.join(caps_dir, f"{stem}.original.onnx"))
        fused, report = ortflash.optimize(original, target="ortflash")
        for target in ("contrib", "webgpu"):
            lowered, notes = lower(fused, target)
            _save(lowered, os.path.join(caps_dir, f"{stem}.{target}.onnx"))
        index["long"].append({"model": stem, "case": case.name, "seq": s, "fused": report.fused})
    with open(os.path.join(folder, "index.json"), "w") as f:
        json.dump(index, f, indent=1)


# ------------------------------------------------------------------------------------------------
# run (onnxruntime + the WebGPU plugin EP; numpy)


def _webgpu(
    ort: Any, path: str, feeds: dict[str, np.ndarray], ep_name: str, prefix: str, repeats: int
) -> dict[str, Any]:
    row: dict[str, Any] = {}
    try:
        sess = ort.InferenceSession(path, caps.webgpu_session_options(ort, prefix))
        outs, row["webgpu_ms"] = caps.timed(sess, feeds, repeats)
        placed = ep_probe.placements(sess.end_profiling())
    except Exception as exc:  # noqa: BLE001 - reported per row
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        return row
    finally:
        for left in glob.glob(prefix + "*"):
            os.remove(left)
    row["outputs"] = outs
    row["nodes"] = len(placed)
    row["nodes_on_webgpu"] = sum(p["provider"] == ep_name for p in placed.values())
    row["attention_on_cpu"] = sorted(
        {p["op"] for p in placed.values() if p["op"] in ep_probe.ATTENTION_OPS and p["provider"] != ep_name}
    )
    row["cpu_ops"] = sorted({p["op"] for p in placed.values() if p["provider"] != ep_name})
    return row


def run(folder: str, out_dir: str) -> None:
    import onnxruntime as ort

    ep_name = caps.register_webgpu(ort)
    os.makedirs(out_dir, exist_ok=True)
    index = json.load(open(os.path.join(folder, "index.json")))
    rows: list[dict[str, Any]] = []
    prefix = os.path.join(out_dir, "prof")
    for entry in index["zoo"]:
        stem = entry["model"]
        check = dict(np.load(os.path.join(folder, f"{stem}.check.npz")))
        timing_path = os.path.join(folder, f"{stem}.timing.npz")
        timing = dict(np.load(timing_path)) if os.path.exists(timing_path) else check
        try:
            cpu = ort.InferenceSession(entry["original"], providers=["CPUExecutionProvider"])
            want = cpu.run(None, check)
            _, cpu_ms = caps.timed(cpu, timing, 10)
        except Exception as exc:  # noqa: BLE001 - reported per row
            rows.append({"model": stem, "variant": "original", "error": f"cpu: {str(exc).splitlines()[0][:300]}"})
            continue
        for variant in VARIANTS:
            path = entry["original"] if variant == "original" else os.path.join(folder, f"{stem}.{variant}.onnx")
            row: dict[str, Any] = {"model": stem, "variant": variant, "cpu_original_ms": cpu_ms}
            row["latency_seq"] = entry["latency_seq"]
            got = _webgpu(ort, path, check, ep_name, prefix, 0)
            if "error" in got:
                row["error"] = got["error"]
            else:
                row.update(ep_probe.compare(want, got.pop("outputs")))
                row.update({k: v for k, v in got.items() if k != "webgpu_ms"})
                timed = _webgpu(ort, path, timing, ep_name, prefix, 10)
                row["webgpu_ms"] = timed.get("webgpu_ms")
                row["timing_error"] = timed.get("error")
            if variant != "original":
                row["blocks"] = entry["blocks"][variant]
            rows.append(row)
            print(json.dumps(row), flush=True)
    for entry in index["long"]:
        case = next(c for c in caps.cases() if c.name == entry["case"])
        feeds = caps.make_feeds("unfused", case)
        base = os.path.join(folder, "long", entry["model"])
        cpu = ort.InferenceSession(base + ".original.onnx", providers=["CPUExecutionProvider"])
        want, cpu_ms = caps.timed(cpu, feeds, 2)
        del cpu
        for variant in ("original", "contrib", "webgpu"):
            row = {"model": entry["model"], "variant": variant, "seq": entry["seq"], "cpu_original_ms": cpu_ms}
            got = _webgpu(ort, f"{base}.{variant}.onnx", feeds, ep_name, prefix, 5)
            if "error" in got:
                row["error"] = got["error"]
            else:
                row.update(ep_probe.compare(want, got.pop("outputs")))
                row.update(got)
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {"date": time.strftime("%Y-%m-%d"), "onnxruntime": ort.__version__, "ep": ep_name, "rows": rows}
    with open(os.path.join(out_dir, "webgpu_zoo.json"), "w") as f:
        json.dump(result, f, indent=1)


# ------------------------------------------------------------------------------------------------
# table


def _cell(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"**fails**: {r['error'][:80]}"
    right = (
        "right"
        if r["ok"]
        else f"**WRONG** ({r['max_abs']:.3g}" + (f", {r['nan_mismatch']} NaN" if r["nan_mismatch"] else "") + ")"
    )
    gpu = "all on GPU" if r["nodes_on_webgpu"] == r["nodes"] else f"{r['nodes_on_webgpu']}/{r['nodes']} on GPU"
    if r["attention_on_cpu"]:
        gpu += f", attention on CPU: {', '.join(r['attention_on_cpu'])}"
    return f"{right}; {gpu}"


def table(json_path: str, md_path: str, device: str) -> None:
    data = json.load(open(json_path))
    zoo = [r for r in data["rows"] if "seq" not in r]
    long = [r for r in data["rows"] if "seq" in r]
    models = list(dict.fromkeys(r["model"] for r in zoo))
    by = {(r["model"], r["variant"]): r for r in zoo}
    lines = [
        f"# The zoo on ONNX Runtime's WebGPU EP ({device})",
        "",
        f"- date: {data['date']}; onnxruntime {data['onnxruntime']} + onnxruntime-ep-webgpu (plugin EP "
        f"`{data['ep']}`, Dawn on Vulkan); the reference is the original model on the CPU EP of the same onnxruntime",
        "- command: `benchmarks/webgpu_gpu_run.sh zoo` after `python benchmarks/webgpu_zoo.py make build/webgpu_run/zoo`",
        f"- right: every output within rtol 1e-4 / atol 1e-5, NaN in the same places (batch {CHECK['batch']}, "
        f"{CHECK['seq']} positions, one item padded at the end, one at the start); GPU: nodes the EP ran (ORT profile)",
        f"- ms: median host-to-host run at batch 1 and S positions: {LATENCY_SEQ}, the most the zoo's models take "
        "(Whisper's decoder: 64; ViT: its fixed 32x32 image)",
        "",
        "| model | original | contrib | onnx | webgpu | S | ms original / contrib / onnx / webgpu |",
        "|---|---|---|---|---|---|---|",
    ]
    totals = {v: 0 for v in VARIANTS}
    gpu_totals = {v: 0 for v in VARIANTS}
    for m in models:
        cells, ms = [], []
        for v in VARIANTS:
            r = by.get((m, v))
            if r is None:
                cells.append("-")
                ms.append("-")
                continue
            cells.append(_cell(r))
            ms.append(f"{r['webgpu_ms']:.2f}" if r.get("webgpu_ms") else "-")
            if "error" not in r:
                totals[v] += bool(r["ok"])
                gpu_totals[v] += bool(r["ok"]) and not r["attention_on_cpu"]
        seq = by.get((m, "original"), {}).get("latency_seq", "?")
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {seq} | {' / '.join(ms)} |")
    lines += [
        "",
        "| | " + " | ".join(VARIANTS) + " |",
        "|---|" + "---|" * len(VARIANTS),
        "| models right | " + " | ".join(f"{totals[v]}/{len(models)}" for v in VARIANTS) + " |",
        "| right with every attention op on the GPU | "
        + " | ".join(f"{gpu_totals[v]}/{len(models)}" for v in VARIANTS)
        + " |",
        "",
        "## Long sequences: one attention block (B=1, H=16, D=64, float32)",
        "",
        "The capability probe's decomposed `MatMul -> Softmax -> MatMul` block (no mask; causal as an additive bias input; "
        "causal_in_graph: the causal mask built inside the graph from a Range, LessOrEqual and Where, as exporters "
        "write it, which ortflash proves causal), as the original, and `ortflash optimize` + lowering of it.",
        "",
        "| block | S | variant | result | WebGPU ms | speed-up vs original |",
        "|---|---|---|---|---|---|",
    ]
    orig_ms = {(r["model"]): r.get("webgpu_ms") for r in long if r["variant"] == "original"}
    for r in long:
        base = orig_ms.get(r["model"])
        ms = r.get("webgpu_ms")
        speed = f"{base / ms:.1f}x" if base and ms and r["variant"] != "original" else ""
        lines.append(
            f"| {r['model'].split('__')[1].rsplit('_s', 1)[0]} | {r['seq']} | {r['variant']} | {_cell(r)} | "
            f"{ms:.1f} | {speed} |"
            if ms
            else f"| {r['model']} | {r['seq']} | {r['variant']} | {_cell(r)} | - | |"
        )
    ep_probe.write_table(md_path, lines)


def main(argv: list[str] | None = None) -> int:
    steps = ep_probe.StepCommandLine(__doc__, md="benchmarks/results/webgpu_zoo.md")
    steps.make.add_argument("--only", help="zoo files matching this glob instead of the 28 original exports")
    steps.make.add_argument("--no-long", action="store_true", help="skip the long single-block models")
    return steps.call(
        argv,
        make=lambda args: make(args.folder, only=args.only, long=not args.no_long),
        run=lambda args: run(args.folder, args.out),
        table=lambda args: table(args.json, args.md, args.device),
    )


if __name__ == "__main__":
    sys.exit(main())
