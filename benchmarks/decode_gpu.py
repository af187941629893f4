"""Decode steps and prefills of KV-cache decoders on ONNX Runtime's CUDA and WebGPU EPs: the original
graph against the lowered forms and against what ``--ep cuda`` / ``--ep webgpu`` write (issue 31
item 4: prefill lowered through the length If, a one-query step kept, unless measured faster).

- ``make FOLDER`` (here: onnx, ortflash, onnxruntime's float16 converter): per decoder, the float32
  original, ``--target webgpu``, ``--ep webgpu``, ``--target cuda``, ``--ep cuda`` and the float16
  conversion (``keep_io_types``) with its ``--target cuda`` and ``--ep cuda``; plus a cached float16
  block and a cached float32 block (no mask, H16 D64) whose length If the EPs do write. Each
  dispatched model also as ``*.probe.onnx``, its If conditions added to the outputs (which side
  ran). The large float weights of the benchmark decoder travel as a seed (``seeded``): the run
  step writes the same random values into every variant, so the files stay small.
- ``run FOLDER --out OUT --ep cuda|webgpu`` (the GPU machine: onnxruntime(-gpu), numpy): per model,
  per case (decode at past 127 and 2048, a prefill past the crossover), every variant's outputs
  against the original on the CPU EP, the side each If took, and the time: CUDA with inputs and
  outputs bound on the GPU (IO binding), WebGPU host to host; median over alternating rounds.
- ``table JSON... --md MD``: the markdown, with device, driver, versions and date.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

ZOO = (
    "llama_cache_eager_torchscript",
    "mistral_cache_eager_torchscript",
    "qwen2_cache_eager_torchscript",
    "gpt2_cache_eager_torchscript",
)
PASTS = (127, 2048)
GPT2_LONGEST = 128  # its position table's rows
SEEDED_FROM = 4096  # float initializers of at least this many elements travel as a seed
F32 = ("original", "target_webgpu", "ep_webgpu", "target_cuda", "ep_cuda")
F16 = ("f16.original", "f16.target_cuda", "f16.ep_cuda")
ON_EP = {
    "webgpu": ("original", "target_webgpu", "ep_webgpu"),
    "cuda": ("original", "target_cuda", "ep_cuda") + F16,
    "cpu": ("original", "target_webgpu", "ep_webgpu", "target_cuda", "ep_cuda") + F16,
}


# ------------------------------------------------------------------------------------------------
# make (here)


def _cached_block(elem: int, heads: int = 16, head_dim: int = 64) -> Any:
    import onnx
    from onnx import helper

    dtype = np.float16 if elem == onnx.TensorProto.FLOAT16 else np.float32
    graph = helper.make_graph(
        [
            helper.make_node("Concat", ["past_key", "key"], ["present_key"], axis=2),
            helper.make_node("Concat", ["past_value", "value"], ["present_value"], axis=2),
            helper.make_node("Transpose", ["present_key"], ["kt"], perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", ["query", "kt"], ["s0"]),
            helper.make_node("Mul", ["s0", "scale"], ["s1"]),
            helper.make_node("Softmax", ["s1"], ["p"], axis=-1),
            helper.make_node("MatMul", ["p", "present_value"], ["out"]),
        ],
        "cached_block",
        [
            helper.make_tensor_value_info(n, elem, ["batch", heads, s, head_dim])
            for n, s in (
                ("query", "seq"),
                ("key", "seq"),
                ("value", "seq"),
                ("past_key", "past"),
                ("past_value", "past"),
            )
        ],
        [
            helper.make_tensor_value_info(n, elem, ["batch", heads, s, head_dim])
            for n, s in (("out", "seq"), ("present_key", "total"), ("present_value", "total"))
        ],
        [helper.make_tensor("scale", elem, [], np.array(head_dim**-0.5, dtype).tobytes(), raw=True)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _probe(model: Any) -> Any | None:
    """A copy with the length Ifs' conditions as outputs; None where the model has none."""
    import onnx

    conditions = sorted({n.input[0] for n in model.graph.node if n.op_type == "If"})
    if not conditions:
        return None
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.output.extend(onnx.ValueInfoProto(name=c) for c in conditions)
    return out


def _seeded(model: Any) -> dict[str, Any]:
    """Strip the large float initializers (in place); name -> (dtype, dims) to write them back."""
    from onnx import TensorProto, numpy_helper

    table = {}
    for t in model.graph.initializer:
        n = int(np.prod(t.dims)) if t.dims else 1
        if t.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16) and n >= SEEDED_FROM:
            table[t.name] = ("float16" if t.data_type == TensorProto.FLOAT16 else "float32", list(t.dims))
            small = numpy_helper.from_array(np.zeros([1] * len(t.dims), numpy_helper.to_array(t).dtype), t.name)
            t.CopyFrom(small)
    return table


def _ops(model: Any) -> dict[str, int]:
    from ortflash.model_io import graphs_of

    ops: dict[str, int] = {}
    for g in graphs_of(model.graph):
        for n in g.node:
            ops[n.op_type] = ops.get(n.op_type, 0) + 1
    keep = ("If", "MultiHeadAttention", "GroupQueryAttention", "Attention", "FlashAttention", "Softmax")
    return {k: v for k, v in ops.items() if k in keep}


def make(folder: str, bench: str | None) -> None:
    import onnx
    from onnxruntime.transformers import float16

    import ortflash

    os.makedirs(folder, exist_ok=True)
    sources = [(s, f"models/{s}.onnx", "decoder") for s in ZOO]
    if bench:
        sources.append(("llama_decode_bench", bench, "decoder"))
    index: dict[str, Any] = {"models": []}
    blocks = [
        ("block_f16", _cached_block(onnx.TensorProto.FLOAT16)),
        ("block_f32", _cached_block(onnx.TensorProto.FLOAT)),
    ]
    for stem, path, kind in sources + [(s, m, "block") for s, m in blocks]:
        model = onnx.load(path) if isinstance(path, str) else path
        variants: dict[str, Any] = {"original": model}
        half = stem == "block_f16"
        if not half:
            variants["target_webgpu"] = ortflash.optimize(model, target="webgpu")[0]
            variants["ep_webgpu"] = ortflash.optimize(model, ep="webgpu")[0]
        variants["target_cuda"] = ortflash.optimize(model, target="cuda")[0]
        variants["ep_cuda"] = ortflash.optimize(model, ep="cuda")[0]
        if kind == "decoder":
            m16 = float16.convert_float_to_float16(model, keep_io_types=True)
            variants["f16.original"] = m16
            variants["f16.target_cuda"] = ortflash.optimize(m16, target="cuda")[0]
            variants["f16.ep_cuda"] = ortflash.optimize(m16, ep="cuda")[0]
        row: dict[str, Any] = {"model": stem, "kind": kind, "variants": {}, "ops": {}, "probes": {}}
        for name, m in variants.items():
            m = onnx.ModelProto.FromString(m.SerializeToString())
            row["ops"][name] = _ops(m)
            probe = _probe(m)
            if stem == "llama_decode_bench":
                row.setdefault("seeded", {})[name] = _seeded(m)
                if probe is not None:
                    _seeded(probe)
            file = f"{stem}.{name}.onnx"
            onnx.save(m, os.path.join(folder, file))
            row["variants"][name] = file
            if probe is not None:
                onnx.save(probe, os.path.join(folder, f"{stem}.{name}.probe.onnx"))
                row["probes"][name] = f"{stem}.{name}.probe.onnx"
        g = model.graph
        row["inputs"] = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in g.input}
        row["elem"] = {i.name: i.type.tensor_type.elem_type for i in g.input}
        row["longest"] = GPT2_LONGEST if stem.startswith("gpt2") else 4096
        index["models"].append(row)
        print(stem, {k: v for k, v in row["ops"].items()}, flush=True)
    json.dump(index, open(os.path.join(folder, "index.json"), "w"), indent=1)


# ------------------------------------------------------------------------------------------------
# run (the GPU machine: numpy and onnxruntime only)


def _feeds(row: dict[str, Any], seq: int, past: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + 1000 * past + seq)
    feeds: dict[str, np.ndarray] = {}
    for name, dims in row["inputs"].items():
        elem = row["elem"][name]
        dtype = {1: np.float32, 10: np.float16, 7: np.int64}[elem]
        shape = []
        for d in dims:
            shape.append(
                {"batch": 1, "seq": seq, "past": past, "total": past + seq}.get(d, d) if isinstance(d, str) else d
            )
        if name == "input_ids":
            feeds[name] = rng.integers(3, 100, shape).astype(np.int64)
        elif name == "attention_mask":
            feeds[name] = np.ones(shape, np.int64)
        else:
            feeds[name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def _with_seeded(path: str, seeded: dict[str, Any]) -> bytes | str:
    """The model with its seeded weights written back (the same values in every variant)."""
    if not seeded:
        return path
    import onnx
    from onnx import numpy_helper

    m = onnx.load(path)
    for t in m.graph.initializer:
        if t.name in seeded:
            dtype, dims = seeded[t.name]
            rng = np.random.default_rng(sum(map(ord, t.name)))
            value = (rng.standard_normal(dims, dtype=np.float32) * 0.02).astype(dtype)
            t.CopyFrom(numpy_helper.from_array(value, t.name))
    return m.SerializeToString()


class _Runner:
    def __init__(self, ort: Any, ep: str) -> None:
        self.ort, self.ep = ort, ep
        if ep == "webgpu":
            import onnxruntime_ep_webgpu as wep

            ort.register_execution_provider_library("webgpu", wep.get_library_path())
            self.ep_name = wep.get_ep_name()
            self.device = next(d for d in ort.get_ep_devices() if d.ep_name == self.ep_name)
        else:  # cpu: a dry run of the script where no GPU is
            self.ep_name = "CUDAExecutionProvider" if ep == "cuda" else "CPUExecutionProvider"

    def session(self, model: bytes | str, cpu: bool = False) -> Any:
        so = self.ort.SessionOptions()
        so.log_severity_level = 3
        if cpu:
            return self.ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        if self.ep == "webgpu":
            so.add_provider_for_devices([self.device], {})
            sess = self.ort.InferenceSession(model, so)
        else:
            sess = self.ort.InferenceSession(model, so, providers=[self.ep_name, "CPUExecutionProvider"])
        if self.ep_name not in sess.get_providers():
            raise RuntimeError(f"{self.ep_name} not taken: {sess.get_providers()}")
        return sess

    def timer(self, sess: Any, feeds: dict[str, np.ndarray]) -> Any:
        if self.ep != "cuda":

            def once() -> float:
                t0 = time.perf_counter()
                sess.run(None, feeds)
                return (time.perf_counter() - t0) * 1e3

            return once
        binding = sess.io_binding()
        for name, value in feeds.items():
            binding.bind_ortvalue_input(name, self.ort.OrtValue.ortvalue_from_numpy(value, "cuda", 0))
        for out in sess.get_outputs():
            binding.bind_output(out.name, "cuda")

        def once_bound() -> float:
            t0 = time.perf_counter()
            sess.run_with_iobinding(binding)
            binding.synchronize_outputs()
            return (time.perf_counter() - t0) * 1e3

        return once_bound


def _err(want: list[np.ndarray], got: list[np.ndarray]) -> float:
    return max(float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()) for a, b in zip(want, got))


def run(folder: str, out_dir: str, ep: str, budget_s: float, rounds: int, repeats: int) -> None:
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls") and ep == "cuda":
        ort.preload_dlls()
    os.makedirs(out_dir, exist_ok=True)
    index = json.load(open(os.path.join(folder, "index.json")))
    runner = _Runner(ort, ep)
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "ep": ep,
        "onnxruntime": ort.__version__,
        "rows": [],
    }
    if ep == "webgpu":
        result["webgpu_plugin"] = dict(runner.device.ep_metadata).get("version", "?")
    out_json = os.path.join(out_dir, f"decode_gpu_{ep}.json")
    started = time.perf_counter()
    for row in index["models"]:
        seeded = row.get("seeded", {})  # variant -> its seeded weights
        names = [v for v in ON_EP[ep] if v in row["variants"]]
        longest = row["longest"]
        cases = [("decode", 1, p) for p in PASTS if p + 1 <= longest]
        cases.append(("prefill", min(2048, longest), 0))  # past every crossover the decoders' Ifs have
        sessions: dict[str, Any] = {}
        probes: dict[str, Any] = {}
        for v in names:
            try:
                sessions[v] = runner.session(_with_seeded(os.path.join(folder, row["variants"][v]), seeded.get(v, {})))
                if v in row["probes"]:
                    probes[v] = runner.session(_with_seeded(os.path.join(folder, row["probes"][v]), seeded.get(v, {})))
            except Exception as exc:  # noqa: BLE001 - reported per row
                result["rows"].append({"model": row["model"], "variant": v, "error": str(exc).splitlines()[0][:300]})
        cpu_ref = {
            p: runner.session(_with_seeded(os.path.join(folder, row["variants"][p]), seeded.get(p, {})), cpu=True)
            for p in ("original", "f16.original")
            if p in row["variants"] and p in names
        }
        for case, seq, past in cases:
            if time.perf_counter() - started > budget_s:
                result["rows"].append({"model": row["model"], "case": case, "skipped": "time budget"})
                continue
            feeds = _feeds(row, seq, past)
            want = {p: s.run(None, feeds) for p, s in cpu_ref.items()}
            timers = {}
            for v, sess in sessions.items():
                rec: dict[str, Any] = {"model": row["model"], "variant": v, "case": case, "seq": seq, "past": past}
                rec["ops"] = row["ops"].get(v, {})
                try:
                    got = sess.run(None, feeds)
                    ref = want["f16.original" if v.startswith("f16.") else "original"]
                    rec["err_vs_cpu"] = _err(ref, got)
                    if v.startswith("f16."):
                        rec["err_vs_cpu_f32"] = _err(want["original"], got)
                    if v in probes:
                        extra = probes[v].run(None, feeds)[len(got) :]
                        rec["if_fused"] = [bool(np.asarray(x).reshape(-1)[0]) for x in extra]
                    timers[v] = runner.timer(sess, feeds)
                    timers[v]()
                except Exception as exc:  # noqa: BLE001
                    rec["error"] = str(exc).splitlines()[0][:300]
                result["rows"].append(rec)
            times: dict[str, list[float]] = {v: [] for v in timers}
            order = list(timers)
            for r in range(rounds):
                for v in order if r % 2 == 0 else order[::-1]:
                    times[v] += [timers[v]() for _ in range(repeats)]
            for rec in result["rows"]:
                if rec.get("model") == row["model"] and rec.get("case") == case and rec.get("past") == past:
                    if rec.get("variant") in times:
                        rec["ms"] = statistics.median(times[rec["variant"]])
            print(row["model"], case, past, {v: round(statistics.median(t), 4) for v, t in times.items()}, flush=True)
            json.dump(result, open(out_json, "w"), indent=1)
    json.dump(result, open(out_json, "w"), indent=1)


# ------------------------------------------------------------------------------------------------
# table (here)


def table(paths: list[str], md: str, device: str) -> None:
    lines = [
        "# Decode steps and prefills on the GPU EPs (issue 31 item 4)",
        "",
        "`benchmarks/decode_gpu.py`: the zoo's KV-cache decoders (2 layers, hidden 64, head dim 16-32) and the",
        "benchmark Llama decoder of `decode_step.py` (hidden 512, 8/2 heads of 64, random weights), batch 1, one",
        "new token at past 127 and 2048, and a prefill past the crossover; plus a cached block (H16 D64, no mask).",
        "Variants: the original graph, `--target webgpu|cuda` (lowered at every length) and `--ep webgpu|cuda`",
        "(the length If where the table fuses). Time: median of alternating rounds; CUDA with inputs and",
        "outputs bound on the GPU, WebGPU host to host. `ratio` = original ms / variant ms (> 1: faster).",
        "`err`: max abs difference against the same-precision original on the CPU EP. `If`: the side each",
        "length If took (fused = the lowered branch).",
        "",
    ]
    for path in paths:
        res = json.load(open(path))
        lines += [
            f"## {res['ep']} EP: {device}, onnxruntime {res['onnxruntime']}"
            + (f", onnxruntime-ep-webgpu {res['webgpu_plugin']}" if "webgpu_plugin" in res else "")
            + f", {res['date']}",
            "",
            "| model | case | variant | ops | ms | ratio | err | If |",
            "|---|---|---|---|---|---|---|---|",
        ]
        base: dict[tuple[str, str, int, str], float] = {}
        for r in res["rows"]:
            if r.get("variant") in ("original", "f16.original") and "ms" in r:
                base[(r["model"], r["case"], r["past"], r["variant"])] = r["ms"]
        for r in res["rows"]:
            if "skipped" in r:
                lines.append(f"| {r['model']} | {r.get('case', '')} | skipped: {r['skipped']} | | | | | |")
                continue
            if "case" not in r:
                lines.append(f"| {r['model']} | | {r['variant']} | error: {r.get('error', '')[:120]} | | | | |")
                continue
            ref = base.get(
                (r["model"], r["case"], r["past"], "f16.original" if r["variant"].startswith("f16.") else "original")
            )
            ms = r.get("ms")
            ratio = f"{ref / ms:.2f}" if ms and ref else ""
            case = f"{r['case']} past {r['past']}" if r["case"] == "decode" else f"prefill {r['seq']}"
            ops = ", ".join(f"{k} {v}" for k, v in sorted(r.get("ops", {}).items()))
            err = f"{r['err_vs_cpu']:.1e}" if "err_vs_cpu" in r else r.get("error", "")[:80]
            side = ", ".join("fused" if x else "original" for x in r.get("if_fused", [])[:1]) + (
                f" (x{len(r['if_fused'])})" if len(r.get("if_fused", [])) > 1 else ""
            )
            lines.append(
                f"| {r['model']} | {case} | {r['variant']} | {ops} | {ms:.3f} | {ratio} | {err} | {side} |"
                if ms is not None
                else f"| {r['model']} | {case} | {r['variant']} | {ops} | | | {err} | {side} |"
            )
        lines.append("")
    open(md, "w").write("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    steps = parser.add_subparsers(dest="cmd", required=True)
    mk = steps.add_parser("make")
    mk.add_argument("folder")
    mk.add_argument("--bench", help="the benchmark Llama decoder's export (decode_step.py's EXPORT)")
    rn = steps.add_parser("run")
    rn.add_argument("folder")
    rn.add_argument("--out", required=True)
    rn.add_argument("--ep", choices=("cuda", "webgpu", "cpu"), required=True)
    rn.add_argument("--budget-s", type=float, default=200)
    rn.add_argument("--rounds", type=int, default=3)
    rn.add_argument("--repeats", type=int, default=15)
    tb = steps.add_parser("table")
    tb.add_argument("json", nargs="+")
    tb.add_argument("--md", default="benchmarks/results/decode_gpu.md")
    tb.add_argument("--device", default="NVIDIA H200")
    args = parser.parse_args(argv)
    if args.cmd == "make":
        make(args.folder, args.bench)
    elif args.cmd == "run":
        run(args.folder, args.out, args.ep, args.budget_s, args.rounds, args.repeats)
    else:
        table(args.json, args.md, args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
