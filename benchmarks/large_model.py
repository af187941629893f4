"""Large models with external weights: ortflash optimize against a plain onnx load + save.

Project issue 6 item 2. Two BERT-style encoders are generated (onnx.helper, numpy random weights,
never committed; written to ``--workdir``, default /tmp/ortflash-large):

- ``bert24``: BERT-large sized, 24 layers, hidden 1024, 16 heads of 64, FFN 4096, word and
  position embeddings; about 1.25 GiB of float32 weights in one external data file.
- ``bert48``: the same with 48 layers, about 2.4 GiB (over protobuf's 2 GiB limit).

Attention is written out as plain ops, as exporters do: ``MatMul + Add`` projections,
``Reshape -> Transpose`` to ``[B, 16, S, 64]``, ``MatMul(q, Transpose(k)) -> Div(8) -> Add(mask
bias [B, 1, 1, S]) -> Softmax(-1) -> MatMul(v) -> Transpose -> Reshape``, the output projection,
residual + LayerNormalization, FFN with Gelu (opset 20), residual + LayerNormalization. Batch and
sequence are dynamic. The generator writes the data file tensor by tensor, so it never holds
more than the largest tensor (the 125 MB word embedding) in memory.

For each model, each of these runs in its own process (peak RSS from ``os.wait4``, i.e. the
child's own ``ru_maxrss``; wall time from the parent, Python start-up and imports included):

- ``load+save``: ``onnx.load(IN)`` (weights read in) + ``onnx.save(..., save_as_external_data=True)``
  into another folder: the baseline any tool that loads the weights pays.
- ``ortflash other folder``: ``ortflash optimize IN -o OTHER/OUT.onnx --json R`` (the CLI; the data
  file is copied next to OUT, streamed).
- ``ortflash same folder``: ``ortflash optimize IN -o IN_FOLDER/OUT.onnx --json R`` (data shared).

Then: every attention block fused (the CLI's JSON report), the input files unchanged (sha256),
and ONNX Runtime runs the original and both optimized models once (B=2, S=16, item 1 padded;
one process per model, so at most one copy of the weights is resident) and the outputs agree.

    python benchmarks/large_model.py                    # both models, results in benchmarks/results/
    python benchmarks/large_model.py --models bert24 --repeat 1
    python benchmarks/large_model.py --no-ort-xl        # skip the ORT check of the >2 GiB model
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

VOCAB, MAX_POS = 30522, 512
OPSET = 20  # Gelu is an ONNX op from opset 20; LayerNormalization from 17
ALIGN = 4096  # tensor offsets in the data file are page aligned (lets ORT map them)
EXTERNAL_MIN_ELEMENTS = 1024  # smaller tensors (shapes, the scale 8) stay inline in the graph

MODELS = {
    "bert24": dict(layers=24, hidden=1024, heads=16, ffn=4096),
    "bert48": dict(layers=48, hidden=1024, heads=16, ffn=4096),
}
TIME_RATIO_TARGET = 2.0
ATOL = 1e-4


# ---------------------------------------------------------------------------------------------
# generation


def weight_bytes(layers: int, hidden: int, ffn: int, vocab: int = VOCAB, max_pos: int = MAX_POS, **_) -> int:
    per_layer = 4 * (hidden * hidden + hidden) + 2 * hidden * ffn + ffn + hidden + 4 * hidden
    return 4 * ((vocab + max_pos) * hidden + 2 * hidden + layers * per_layer)


class _DataWriter:
    """Appends tensors to one external data file and returns TensorProtos that reference them."""

    def __init__(self, folder: str, location: str, rng: np.random.Generator):
        self.location = location
        self.f = open(os.path.join(folder, location), "wb")
        self.rng = rng
        self.offset = 0
        self.initializers: list[TensorProto] = []

    def add(self, name: str, shape, kind: str = "normal") -> str:
        n = int(np.prod(shape))
        if kind == "normal":
            a = self.rng.standard_normal(n, dtype=np.float32)
            a *= np.float32(0.02)
        elif kind == "ones":
            a = np.ones(n, np.float32)
        else:
            a = np.zeros(n, np.float32)
        if n < EXTERNAL_MIN_ELEMENTS:
            self.initializers.append(numpy_helper.from_array(a.reshape(shape), name))
            return name
        pad = (-self.offset) % ALIGN
        if pad:
            self.f.write(b"\0" * pad)
            self.offset += pad
        a.tofile(self.f)
        t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(shape))
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", str(self.offset)), ("length", str(a.nbytes))):
            e = t.external_data.add()
            e.key, e.value = key, value
        self.offset += a.nbytes
        self.initializers.append(t)
        return name

    def close(self):
        self.f.close()


def build_encoder(
    path: str,
    *,
    layers: int,
    hidden: int,
    heads: int,
    ffn: int,
    vocab: int = VOCAB,
    max_pos: int = MAX_POS,
    seed: int = 0,
    data_name: str | None = None,
    activation: str = "Gelu",
) -> dict:
    """Write a BERT-style encoder to ``path`` with all weights in one external data file.

    Returns a summary: the data file's name and size, the number of attention blocks.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    base = os.path.basename(path)
    data_name = data_name or (base[:-5] if base.endswith(".onnx") else base) + ".data"
    head_dim = hidden // heads
    w = _DataWriter(folder, data_name, np.random.default_rng(seed))
    nodes: list = []
    inits = w.initializers

    def const(name, value, dtype=np.int64):
        inits.append(numpy_helper.from_array(np.array(value, dtype=dtype), name))
        return name

    def node(op, inputs, name, **attrs):
        nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def linear(x, prefix, n_in, n_out):
        wt = w.add(f"{prefix}.weight", (n_in, n_out))
        b = w.add(f"{prefix}.bias", (n_out,), "zeros")
        return node("Add", [node("MatMul", [x, wt], f"{prefix}/MatMul"), b], f"{prefix}/Add")

    def layer_norm(x, prefix):
        g = w.add(f"{prefix}.weight", (hidden,), "ones")
        b = w.add(f"{prefix}.bias", (hidden,), "zeros")
        return node("LayerNormalization", [x, g, b], f"{prefix}/LayerNorm", axis=-1, epsilon=1e-12)

    heads_shape = const("shape_heads", [0, 0, heads, head_dim])
    hidden_shape = const("shape_hidden", [0, 0, hidden])
    scale = const("attn_scale", float(np.sqrt(head_dim)), np.float32)
    one = const("one_f", 1.0, np.float32)
    neg = const("mask_neg", -10000.0, np.float32)
    axes12 = const("axes_1_2", [1, 2])

    # embeddings: word + position, LayerNorm
    word = w.add("embeddings.word_embeddings.weight", (vocab, hidden))
    pos = w.add("embeddings.position_embeddings.weight", (max_pos, hidden))
    seq = node("Shape", ["input_ids"], "embeddings/Shape", start=1, end=2)
    seq0 = node("Squeeze", [seq], "embeddings/seq_len")
    positions = node("Range", [const("zero_i", 0), seq0, const("one_i", 1)], "embeddings/positions")
    x = node(
        "Add",
        [
            node("Gather", [word, "input_ids"], "embeddings/word"),
            node("Gather", [pos, positions], "embeddings/position"),
        ],
        "embeddings/sum",
    )
    x = layer_norm(x, "embeddings.LayerNorm")

    # the additive padding bias, [B, 1, 1, S]
    m = node("Cast", ["attention_mask"], "mask/Cast", to=TensorProto.FLOAT)
    m = node("Mul", [node("Sub", [one, m], "mask/Sub"), neg], "mask/Mul")
    bias = node("Unsqueeze", [m, axes12], "mask/bias")

    for i in range(layers):
        p = f"encoder.layer.{i}"

        def split(t, name, p=p):
            r = node("Reshape", [t, heads_shape], f"{p}/attention/{name}/Reshape")
            return node("Transpose", [r], f"{p}/attention/{name}/Transpose", perm=[0, 2, 1, 3])

        q = split(linear(x, f"{p}.attention.query", hidden, hidden), "q")
        k = split(linear(x, f"{p}.attention.key", hidden, hidden), "k")
        v = split(linear(x, f"{p}.attention.value", hidden, hidden), "v")
        kt = node("Transpose", [k], f"{p}/attention/k/TransposeT", perm=[0, 1, 3, 2])
        s = node("MatMul", [q, kt], f"{p}/attention/scores")
        s = node("Div", [s, scale], f"{p}/attention/Div")
        s = node("Add", [s, bias], f"{p}/attention/AddMask")
        s = node("Softmax", [s], f"{p}/attention/Softmax", axis=-1)
        ctx = node("MatMul", [s, v], f"{p}/attention/context")
        ctx = node("Transpose", [ctx], f"{p}/attention/context/Transpose", perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, hidden_shape], f"{p}/attention/context/Reshape")
        a = linear(ctx, f"{p}.attention.output.dense", hidden, hidden)
        x = layer_norm(node("Add", [a, x], f"{p}/attention/residual"), f"{p}.attention.output.LayerNorm")
        h = node(activation, [linear(x, f"{p}.intermediate.dense", hidden, ffn)], f"{p}/intermediate/act")
        h = linear(h, f"{p}.output.dense", ffn, hidden)
        x = layer_norm(node("Add", [h, x], f"{p}/output/residual"), f"{p}.output.LayerNorm")
    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="output"))
    w.close()

    graph = helper.make_graph(
        nodes,
        f"bert_{layers}x{hidden}",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
        ],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", hidden])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="ortflash-bench")
    model.ir_version = 10
    tmp = path + ".tmp"
    onnx.save(model, tmp)
    os.replace(tmp, path)
    return {
        "path": path,
        "data": data_name,
        "data_bytes": os.path.getsize(os.path.join(folder, data_name)),
        "model_bytes": os.path.getsize(path),
        "attention_blocks": layers,
    }


# ---------------------------------------------------------------------------------------------
# child processes (each is measured on its own)


def _child_generate(args):
    summary = build_encoder(args[0], **json.loads(args[1]))
    summary["ru_maxrss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(summary))


def _child_loadsave(args):
    src, dst = args
    model = onnx.load(src)
    onnx.save(
        model, dst, save_as_external_data=True, all_tensors_to_one_file=True, location=os.path.basename(dst) + ".data"
    )


def _child_ort(args):
    model_path, feeds_path, out_path = args
    import onnxruntime as ort

    import ortflash

    with np.load(feeds_path) as f:
        feeds = {k: f[k] for k in f.files}
    sess = ort.InferenceSession(model_path, ortflash.session_options(), providers=["CPUExecutionProvider"])
    (out,) = sess.run(["last_hidden_state"], feeds)
    np.save(out_path, out)
    print(json.dumps({"ru_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))


CHILDREN = {"generate": _child_generate, "loadsave": _child_loadsave, "ort": _child_ort}


def measure(cmd: list[str], env=None) -> dict:
    """Run cmd; wall time, the child's own peak RSS (os.wait4), exit code, output."""
    subprocess.run(["sync"], check=False)  # earlier runs' dirty pages are not this run's cost
    import tempfile

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, text=True)
        # os.wait4, not Popen.wait: it reaps the child and hands back that child's own rusage
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = rc = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {
            "wall_s": wall,
            "peak_rss_mib": usage.ru_maxrss / 1024,
            "rc": rc,
            "stdout": out.read(),
            "stderr": err.read(),
        }


def _self(*args) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--child", *args]


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def _rm(*paths):
    for p in paths:
        if os.path.isdir(p):
            shutil.rmtree(p)
        elif os.path.exists(p):
            os.remove(p)


# ---------------------------------------------------------------------------------------------
# the benchmark


def machine() -> dict:
    cpu = platform.processor()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    import onnx_ir
    import onnxruntime

    import ortflash

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(ram / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "onnx": onnx.__version__,
        "onnx_ir": onnx_ir.__version__,
        "onnxruntime": onnxruntime.__version__,
        "numpy": np.__version__,
        "ortflash": ortflash.__version__,
    }


def bench_model(name: str, cfg: dict, work: Path, repeat: int, run_ort: bool, log) -> dict:
    src_dir = work / name
    other = work / f"{name}-out"
    _rm(src_dir, other)
    src_dir.mkdir(parents=True)
    other.mkdir(parents=True)
    src = str(src_dir / f"{name}.onnx")
    res: dict = {"model": name, "config": cfg}

    log(f"[{name}] generating ({weight_bytes(**cfg) / 2**30:.2f} GiB of weights) ...")
    g = measure(_self("generate", src, json.dumps(cfg)))
    if g["rc"]:
        raise SystemExit(f"generation failed: {g['stderr'][-2000:]}")
    gen = json.loads(g["stdout"].strip().splitlines()[-1])
    weights = gen["data_bytes"]
    res["generate"] = {"wall_s": g["wall_s"], "peak_rss_mib": g["peak_rss_mib"]}
    res["weights_gib"] = weights / 2**30
    res["graph_mib"] = gen["model_bytes"] / 2**20
    res["blocks"] = gen["attention_blocks"]
    data_src = str(src_dir / gen["data"])
    log(
        f"[{name}] {res['weights_gib']:.2f} GiB data + {res['graph_mib']:.2f} MiB graph in {g['wall_s']:.1f} s, "
        f"generator peak RSS {g['peak_rss_mib']:.0f} MiB"
    )
    digests_before = {p: sha256(p) for p in (src, data_src)}

    outs = {
        "load+save": str(other / "loadsave.onnx"),
        "ortflash other folder": str(other / f"{name}.flash.onnx"),
        "ortflash same folder": str(src_dir / f"{name}.flash.onnx"),
    }

    def cmd(kind):
        if kind == "load+save":
            return _self("loadsave", src, outs[kind])
        return [
            sys.executable,
            "-m",
            "ortflash",
            "optimize",
            src,
            "-o",
            outs[kind],
            "--json",
            str(work / f"{name}-{kind.split()[-2]}.json"),
        ]

    # The same imports as the ortflash CLI with no work done: what start-up costs.
    startup = measure([sys.executable, "-c", "import ortflash.cli, rich.console, onnx_ir"])
    res["startup"] = {"wall_s": startup["wall_s"], "peak_rss_mib": startup["peak_rss_mib"]}
    runs: dict[str, list[dict]] = {k: [] for k in outs}
    for r in range(repeat):
        for kind, out in outs.items():
            # a fresh output each time (the data file of the last repeat is kept for the ORT check)
            _rm(out, *[str(p) for p in Path(out).parent.glob(Path(out).name + ".*")])
            m = measure(cmd(kind))
            if m["rc"]:
                raise SystemExit(f"{kind} failed (exit {m['rc']}): {m['stderr'][-2000:]}")
            runs[kind].append({"wall_s": m["wall_s"], "peak_rss_mib": m["peak_rss_mib"]})
            log(f"[{name}] run {r + 1}/{repeat} {kind}: {m['wall_s']:.2f} s, peak RSS {m['peak_rss_mib']:.0f} MiB")
    res["runs"] = runs
    best = {
        k: {"wall_s": min(x["wall_s"] for x in v), "peak_rss_mib": max(x["peak_rss_mib"] for x in v)}
        for k, v in runs.items()
    }
    res["best"] = best
    base = best["load+save"]
    for k in ("ortflash other folder", "ortflash same folder"):
        best[k]["time_ratio"] = best[k]["wall_s"] / base["wall_s"]
        best[k]["rss_ratio"] = best[k]["peak_rss_mib"] / base["peak_rss_mib"]

    # fusion, from the CLI's JSON reports
    fused = {}
    for kind in ("other", "same"):
        rep = json.load(open(work / f"{name}-{kind}.json"))
        fused[kind] = {"fused": rep["fused"], "softmax_blocks": len(rep["blocks"])}
    res["fusion"] = fused
    res["all_fused"] = all(f["fused"] == res["blocks"] == f["softmax_blocks"] for f in fused.values())

    # files: input unchanged; the copy is next to the output; the same-folder output shares the data
    res["input_unchanged"] = {p: sha256(p) for p in digests_before} == digests_before
    copied = str(other / f"{name}.flash.onnx.{gen['data']}")
    res["data_copied"] = os.path.isfile(copied) and os.path.getsize(copied) == weights
    same_locs = {
        e.value
        for t in onnx.load(outs["ortflash same folder"], load_external_data=False).graph.initializer
        for e in t.external_data
        if e.key == "location"
    }
    res["same_folder_shares_data"] = same_locs == {gen["data"]}
    log(
        f"[{name}] fused {fused}, input unchanged {res['input_unchanged']}, data copied {res['data_copied']}, "
        f"same folder shares data {res['same_folder_shares_data']}"
    )

    if run_ort:
        rng = np.random.default_rng(1)
        b, s = 2, 16
        feeds = {
            "input_ids": rng.integers(0, cfg.get("vocab", VOCAB), (b, s), dtype=np.int64),
            "attention_mask": np.ones((b, s), np.int64),
        }
        feeds["attention_mask"][1, -5:] = 0
        feeds_path = str(work / f"{name}-feeds.npz")
        np.savez(feeds_path, **feeds)
        check = {}
        results = {}
        for kind, path in (
            ("original", src),
            ("ortflash other folder", outs["ortflash other folder"]),
            ("ortflash same folder", outs["ortflash same folder"]),
        ):
            out_npy = str(work / f"{name}-{kind.replace(' ', '_')}.npy")
            m = measure(_self("ort", path, feeds_path, out_npy))
            if m["rc"]:
                raise SystemExit(f"ORT run of {kind} failed: {m['stderr'][-2000:]}")
            results[kind] = np.load(out_npy)
            check[kind] = {"wall_s": m["wall_s"], "peak_rss_mib": m["peak_rss_mib"]}
            _rm(out_npy)
        for kind in ("ortflash other folder", "ortflash same folder"):
            d = np.abs(results[kind] - results["original"])
            check[kind]["max_abs_diff"] = float(d.max())
            check[kind]["finite"] = bool(np.isfinite(results[kind]).all())
        check["atol"] = ATOL
        check["feeds"] = f"B={b}, S={s}, item 1 padded (last 5 tokens)"
        res["ort"] = check
        res["ort_ok"] = all(
            check[k]["max_abs_diff"] < ATOL and check[k]["finite"]
            for k in ("ortflash other folder", "ortflash same folder")
        )
        log(
            f"[{name}] ORT check: max abs diff "
            + ", ".join(
                f"{k}: {check[k]['max_abs_diff']:.2e}" for k in ("ortflash other folder", "ortflash same folder")
            )
            + f" (ORT peak RSS, original: {check['original']['peak_rss_mib']:.0f} MiB)"
        )
    else:
        res["ort"] = None
        res["ort_ok"] = None

    weights_mib = weights / 2**20
    res["targets"] = {
        "time_other_folder": best["ortflash other folder"]["time_ratio"] <= TIME_RATIO_TARGET,
        "time_same_folder": best["ortflash same folder"]["time_ratio"] <= TIME_RATIO_TARGET,
        "rss_other_folder_below_weights": best["ortflash other folder"]["peak_rss_mib"] < weights_mib,
        "rss_same_folder_below_weights": best["ortflash same folder"]["peak_rss_mib"] < weights_mib,
        "rss_below_load_save": max(
            best["ortflash other folder"]["peak_rss_mib"], best["ortflash same folder"]["peak_rss_mib"]
        )
        < base["peak_rss_mib"],
    }
    return res


def write_results(doc: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "large_model.json").write_text(json.dumps(doc, indent=2) + "\n")
    m = doc["machine"]
    lines = [
        "# Large models with external weights: ortflash optimize vs onnx load + save",
        "",
        f"- date: {doc['date']}",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM; {m['os']}",
        f"- versions: Python {m['python']}, onnx {m['onnx']}, onnx-ir {m['onnx_ir']}, onnxruntime {m['onnxruntime']}, "
        f"numpy {m['numpy']}, ortflash {m['ortflash']}",
        f"- command: `{doc['command']}`; total {doc['total_s']:.0f} s",
        "- models: BERT-style encoders written by `benchmarks/large_model.py` (hidden 1024, 16 heads of 64, "
        "FFN 4096, Gelu, LayerNormalization, opset 20, dynamic batch and sequence), float32 random weights in one "
        "external data file",
        "- each row is its own process; wall time measured by the parent (Python start-up and imports "
        f"included: the CLI's imports alone take {doc['models'][0]['startup']['wall_s']:.2f} s and "
        f"{doc['models'][0]['startup']['peak_rss_mib']:.0f} MiB); peak RSS is the child's ru_maxrss (os.wait4); "
        f"best wall time of {doc['repeat']} run(s), largest peak RSS; `sync` before each run, page cache warm, no fsync in any "
        "of them (both load+save and the ortflash copy write the full data file)",
        "- load+save: `onnx.load(IN)` + `onnx.save(model, OTHER/out.onnx, save_as_external_data=True, "
        "all_tensors_to_one_file=True)`; ortflash: `python -m ortflash optimize IN -o OUT --json R` into another "
        "folder (the data file is copied next to OUT) or into IN's folder (data shared, nothing copied); before "
        "writing, optimize opens the new model in ONNX Runtime at its default optimization level (the load check: "
        "nothing ONNX Runtime cannot load is written), which reads the weights: its time and memory are included",
        *(
            [f"- load average at start / end: {doc['load_average'][0]} / {doc['load_average'][1]}"]
            if "load_average" in doc
            else []
        ),
        "",
        "| model | weights | run | wall s | peak RSS MiB | time / load+save | RSS / load+save | RSS / weights |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["models"]:
        wmib = r["weights_gib"] * 1024
        for kind, b in r["best"].items():
            tr = f"{b['time_ratio']:.2f}" if "time_ratio" in b else "1"
            rr = f"{b['rss_ratio']:.2f}" if "rss_ratio" in b else "1"
            lines.append(
                f"| {r['model']} ({r['config']['layers']} layers) | "
                f"{r['weights_gib']:.2f} GiB | {kind} | {b['wall_s']:.2f} | {b['peak_rss_mib']:.0f} | "
                f"{tr} | {rr} | {b['peak_rss_mib'] / wmib:.2f} |"
            )
    lines += [
        "",
        "Generation (not timed against anything): "
        + "; ".join(
            f"{r['model']} {r['generate']['wall_s']:.1f} s, peak RSS {r['generate']['peak_rss_mib']:.0f} MiB"
            for r in doc["models"]
        )
        + ".",
        "",
        "## Correctness",
        "",
        "| model | attention blocks | fused (other / same folder) | input files unchanged (sha256) | data copied | "
        "same folder shares data | ORT max abs diff (other / same) | ORT check | ORT peak RSS MiB (original / other / same) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["models"]:
        f = r["fusion"]
        if r["ort"]:
            diff = f"{r['ort']['ortflash other folder']['max_abs_diff']:.2e} / {r['ort']['ortflash same folder']['max_abs_diff']:.2e}"
            ok = f"{'pass' if r['ort_ok'] else 'FAIL'} (< {ATOL:g}; {r['ort']['feeds']})"
            rss = " / ".join(
                f"{r['ort'][k]['peak_rss_mib']:.0f}"
                for k in ("original", "ortflash other folder", "ortflash same folder")
            )
        else:
            diff, ok, rss = "not run", "skipped (--no-ort-xl)", ""
        lines.append(
            f"| {r['model']} | {r['blocks']} | {f['other']['fused']} / {f['same']['fused']} | "
            f"{r['input_unchanged']} | {r['data_copied']} | {r['same_folder_shares_data']} | {diff} | {ok} | {rss} |"
        )
    lines += ["", "## Targets", ""]
    for r in doc["models"]:
        t = r["targets"]
        b = r["best"]
        yes = lambda v: "met" if v else "NOT met"  # noqa: E731
        lines += [
            f"- {r['model']}: time ortflash ≤ {TIME_RATIO_TARGET:g}× load+save: other folder "
            f"{b['ortflash other folder']['time_ratio']:.2f}× ({yes(t['time_other_folder'])}), same folder "
            f"{b['ortflash same folder']['time_ratio']:.2f}× ({yes(t['time_same_folder'])}); peak RSS below the "
            f"weights ({r['weights_gib'] * 1024:.0f} MiB): other folder {yes(t['rss_other_folder_below_weights'])}, "
            f"same folder {yes(t['rss_same_folder_below_weights'])}; below load+save's: {yes(t['rss_below_load_save'])}; "
            f"all {r['blocks']} blocks fused: {yes(r['all_fused'])}; ORT outputs agree: "
            + ("not run" if r["ort_ok"] is None else yes(r["ort_ok"])),
        ]
    if doc.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in doc["notes"]]
    (out_dir / "large_model.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--workdir",
        default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "ortflash-large"),
        help="where the models are generated (outside the repository; default %(default)s)",
    )
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated, from: " + ", ".join(MODELS))
    p.add_argument("--repeat", type=int, default=2, help="timed runs of each command (best time is reported)")
    p.add_argument("--no-ort-xl", action="store_true", help="skip the ONNX Runtime check of models over 2 GiB")
    p.add_argument("--out", default=str(RESULTS), help="results folder (default %(default)s)")
    p.add_argument("--keep", action="store_true", help="keep the generated models (default: delete each when done)")
    args = p.parse_args(argv)
    work = Path(args.workdir).resolve()
    if ROOT in work.parents or work == ROOT:
        raise SystemExit(f"--workdir {work} is inside the repository; pick a temp folder")
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    load_at_start = [round(x, 2) for x in os.getloadavg()]  # other jobs on the machine change the times

    def log(msg):
        print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", flush=True)

    doc = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "repeat": args.repeat,
        "command": " ".join(["python benchmarks/large_model.py", *(argv if argv is not None else sys.argv[1:])]),
        "targets": {
            "time_ratio_max": TIME_RATIO_TARGET,
            "rss": "below the weights' size, or below load+save's",
            "ort_max_abs_diff": ATOL,
        },
        "models": [],
        "notes": [],
    }
    for name in args.models.split(","):
        cfg = MODELS[name]
        big = weight_bytes(**cfg) > 2**31
        run_ort = not (big and args.no_ort_xl)
        if not run_ort:
            doc["notes"].append(f"{name}: ONNX Runtime check skipped (--no-ort-xl)")
        doc["models"].append(bench_model(name, cfg, work, args.repeat, run_ort, log))
        if not args.keep:
            _rm(
                work / name,
                work / f"{name}-out",
                *[str(p) for p in work.glob(f"{name}-*.json")],
                str(work / f"{name}-feeds.npz"),
            )
    doc["total_s"] = time.perf_counter() - t0
    doc["load_average"] = [load_at_start, [round(x, 2) for x in os.getloadavg()]]
    write_results(doc, Path(args.out))
    log(f"wrote {Path(args.out) / 'large_model.md'} and .json")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        CHILDREN[sys.argv[2]](sys.argv[3:])
    else:
        sys.exit(main())
