"""Coverage: how many attention blocks of each zoo model ortflash, ONNX Runtime and onnxscript fuse.

For every model in models/manifest.json, in one run:

  blocks           the manifest's ``attention_blocks`` (one per attention Softmax)
  ortflash         ``report.fused`` of ``ortflash.optimize`` (each block proved and verified
                   against the original in ONNX Runtime), then, when
                   ``ortflash.lowering`` exists, how many of them ``lower(model, "contrib")``
                   and ``lower(model, "onnx")`` turn into native attention ops
  ORT session      ONNX Runtime's own C++ graph fusions: the attention ops in the graph an
                   ``InferenceSession`` (CPU, ORT_ENABLE_ALL) optimizes to
  ORT optimizer    ``onnxruntime.transformers.optimizer.optimize_model(path, model_type=T,
                   num_heads=<true heads>, hidden_size=<true heads * head dim>, opt_level=L,
                   use_gpu=False)`` (and with num_heads=0, hidden_size=0: its own detection), for the model type ORT's own export scripts use for the arch
                   (bert, gpt2, vit, t5, bart; whisper -> bart as in ORT's whisper helper; llama ->
                   gpt2 as in ORT's llama exporter, and qwen3, the decoder type with RoPE/GQA), at
                   opt_level 0, 1 and 2; the best try counts, every try is in the JSON
  onnxscript       ``onnxscript.rewriter.ort_fusions.optimize_for_ort`` (optional column)

Counting, the same for every tool: the attention ops in the tool's output graph (any domain:
FlashAttention, Attention, MultiHeadAttention, GroupQueryAttention, PackedAttention,
PackedMultiHeadAttention, DecoderMaskedMultiHeadAttention, DecoderAttention, SparseAttention,
...), each of which replaces one block, cross-checked with the number of attention Softmax nodes
that disappeared; a count is capped at the model's blocks. Every tool's output is then run in
ONNX Runtime against the original on the same inputs (batch 1 with a right-padded mask, and
batch 2 where item 1 is left-padded): a count whose model does not run or computes something
else is marked. Each (model, tool) runs in its own process with a timeout, so a crash or a hang
of one tool on one export is recorded and the run goes on.

    python benchmarks/coverage.py                      # -> benchmarks/results/coverage.{md,json}
    python benchmarks/coverage.py --only bert gpt2 --out /tmp/cov
    python benchmarks/coverage.py --render benchmarks/results/coverage.json   # markdown again
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import io
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ortflash.bench.variants import ATTENTION_OP_TYPES  # noqa: E402 - after the checkout is on the path

TOOLS = ("ortflash", "ort_session", "ort_optimizer", "onnxscript")
# model_type for onnxruntime.transformers.optimizer, per zoo arch: the first is what ORT's own
# export scripts use for that architecture.
ORT_MODEL_TYPES = {
    "bert": ["bert"],
    "gpt2": ["gpt2"],
    "vit": ["vit"],
    "t5": ["t5"],
    "bart": ["bart"],
    "whisper": ["bart"],  # onnxruntime/transformers/models/whisper/whisper_helper.py
    "llama": ["gpt2", "qwen3"],  # models/llama/convert_to_onnx.py uses gpt2; qwen3 is the RoPE/GQA decoder
}
ORT_OPT_LEVELS = (0, 1, 2)
RTOL, ATOL = 1e-3, 1e-4  # "computes the same": looser than ortflash's own 1e-4/1e-5 checks


# ----------------------------------------------------------------------------- helpers (worker side)


def count_attention(model) -> dict:
    ops, softmax = {}, 0
    for n in model.graph.node:
        if n.op_type in ATTENTION_OP_TYPES:
            key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
            ops[key] = ops.get(key, 0) + 1
        if n.op_type == "Softmax" and n.domain in ("", "ai.onnx"):
            softmax += 1
    return {"attention_ops": ops, "attention_op_count": sum(ops.values()), "softmax": softmax}


def _feeds_for(model, feeds):
    """The feeds, cast to the input types of a rewritten model (a tool may retype its inputs)."""
    import onnx

    out = {}
    for vi in model.graph.input:
        if vi.name not in feeds:
            if any(i.name == vi.name for i in model.graph.initializer):
                continue
            raise KeyError(f"the rewritten model has an input the original lacks: {vi.name}")
        np_type = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        out[vi.name] = feeds[vi.name].astype(np_type, copy=False)
    return out


def check_outputs(original, rewritten, entry) -> dict:
    """Run both in ONNX Runtime (CPU) on the same inputs; worst difference per case."""
    import numpy as np
    import onnxruntime as ort

    from ortflash.checks.feeds import make_feeds

    def session(m):
        so = ort.SessionOptions()
        so.log_severity_level = 3
        if any(n.domain == "ai.onnx.contrib" for n in m.graph.node):
            from ortflash.kernels import ort_bridge as ort_op

            so.register_custom_ops_library(ort_op.library_path())
        return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])

    try:
        ref, got = session(original), session(rewritten)
    except Exception as exc:
        return {"runs": False, "ok": False, "error": _one_line(exc)}
    out = {"runs": True, "cases": {}}
    dynamic_seq = entry.get("dynamic", {}).get("seq", True)
    for label, batch in (("b1_right_pad", 1), ("b2_left_pad", 2)):
        feeds = make_feeds(
            original, seq_len=16 if dynamic_seq else 16, batch=batch, seed=0, dims=entry.get("feed_dims")
        )
        try:
            exp = ref.run(None, feeds)
            act = got.run(None, _feeds_for(rewritten, feeds))
        except Exception as exc:
            out["cases"][label] = {"ok": False, "error": _one_line(exc)}
            continue
        worst, nan_mismatch, ok = 0.0, 0, True
        for e, a in zip(exp, act):
            if e.shape != a.shape:
                ok, worst = False, float("inf")
                continue
            if not np.issubdtype(e.dtype, np.floating):
                ok = ok and bool(np.array_equal(e, a))
                continue
            e64, a64 = e.astype(np.float64), a.astype(np.float64)
            nm = int(np.sum(np.isnan(e64) != np.isnan(a64)))
            both = ~(np.isnan(e64) | np.isnan(a64))
            d = np.abs(e64 - a64)[both]
            if d.size:
                worst = max(worst, float(d.max()))
                ok = ok and bool(np.all(d <= ATOL + RTOL * np.abs(e64[both])))
            nan_mismatch += nm
            ok = ok and nm == 0
        out["cases"][label] = {"ok": ok, "max_abs": worst, "nan_mismatch": nan_mismatch}
    out["ok"] = all(c["ok"] for c in out["cases"].values())
    return out


def _one_line(exc: BaseException) -> str:
    lines = [x for x in f"{type(exc).__name__}: {exc}".splitlines() if x.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]


@contextlib.contextmanager
def _quiet():
    sink = io.StringIO()
    logging.disable(logging.WARNING)
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        warnings.simplefilter("ignore")
        try:
            yield sink
        finally:
            logging.disable(logging.NOTSET)


def _result(model, original, entry, **extra) -> dict:
    c = count_attention(model)
    blocks = entry["attention_blocks"]
    removed = max(0, count_attention(original)["softmax"] - c["softmax"])
    fused = min(c["attention_op_count"], blocks)
    res = {**extra, **c, "softmax_removed": removed, "fused": fused}
    if c["attention_op_count"] != removed:
        res["count_note"] = f"{c['attention_op_count']} attention ops but {removed} Softmax removed"
    if fused:
        res["check"] = check_outputs(original, model, entry)
    return res


# ----------------------------------------------------------------------------- the tools


def tool_ortflash(path, entry) -> dict:
    import onnx

    import ortflash

    original = onnx.load(path)
    fused, report = ortflash.optimize(original, softmax="naive", target="ortflash")
    res = _result(fused, original, entry, reasons=[b.reason for b in report.blocks if not b.fused])
    res["report_fused"] = report.fused
    res["fused"] = min(report.fused, entry["attention_blocks"])
    from ortflash.lowering import lower

    res["lower"] = {}
    for target in ("contrib", "onnx"):
        try:
            with _quiet():
                lowered, notes = lower(fused, target)
            if not isinstance(lowered, onnx.ModelProto):  # an onnx_ir model
                import onnx_ir as ir

                lowered = ir.serde.serialize_model(lowered)
            c = count_attention(lowered)
            native = sum(n for k, n in c["attention_ops"].items() if not k.endswith("FlashAttention"))
            res["lower"][target] = {
                **c,
                "native": min(native, entry["attention_blocks"]),
                "notes": [str(n) for n in (notes or [])][:12],
                "check": check_outputs(original, lowered, entry) if native else None,
            }
        except Exception as exc:
            res["lower"][target] = {"error": _one_line(exc)}
    return res


def tool_ort_session(path, entry) -> dict:
    import onnx
    import onnxruntime as ort

    original = onnx.load(path)
    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.optimized_model_filepath = os.path.join(tmp, "opt.onnx")
        ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        optimized = onnx.load(so.optimized_model_filepath)
    return _result(optimized, original, entry)


def tool_ort_optimizer(path, entry) -> dict:
    import onnx
    from onnxruntime.transformers.optimizer import MODEL_TYPES, optimize_model

    original = onnx.load(path)
    heads, head_dim = entry["num_heads"], entry["head_dim"]
    tries, models = [], []
    for model_type in ORT_MODEL_TYPES.get(entry["arch"], ["bert"]):
        if model_type not in MODEL_TYPES:
            tries.append({"model_type": model_type, "error": "not in this onnxruntime's MODEL_TYPES"})
            continue
        # the true head count and hidden size first, then 0/0 (the optimizer detects them itself)
        for level, (nh, hs) in [(lv, dims) for dims in ((heads, heads * head_dim), (0, 0)) for lv in ORT_OPT_LEVELS]:
            t = {"model_type": model_type, "opt_level": level, "num_heads": nh, "hidden_size": hs}
            try:
                with _quiet():
                    m = optimize_model(
                        path, model_type=model_type, num_heads=nh, hidden_size=hs, opt_level=level, use_gpu=False
                    )
                t.update(count_attention(m.model))
                try:
                    t["fused_operator_statistics"] = {k: v for k, v in m.get_fused_operator_statistics().items() if v}
                except Exception:
                    pass
                models.append((t, m.model))
            except Exception as exc:
                t["error"] = _one_line(exc)
            tries.append(t)
    if not models:
        raise RuntimeError(
            "every try failed: "
            + "; ".join(f"{t['model_type']} L{t.get('opt_level')}: {t['error']}" for t in tries if "error" in t)[:400]
        )
    # the most attention ops; among those, the first whose outputs match (both cases, else right padding)
    top = max(t["attention_op_count"] for t, _ in models)
    results = []
    for t, model in [(t, m) for t, m in models if t["attention_op_count"] == top]:
        r = _result(
            model, original, entry, best={k: t[k] for k in ("model_type", "opt_level", "num_heads", "hidden_size")}
        )
        t["verdict"] = verdict(r.get("check"))
        results.append(r)
        if t["verdict"] == "ok":
            break
    res = min(results, key=lambda r: ("ok", "right_pad_only", "wrong").index(verdict(r.get("check"))))
    res["tries"] = tries
    return res


def tool_onnxscript(path, entry) -> dict:
    import onnx
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    original = onnx.load(path)
    model = ir.load(path)
    with _quiet():
        model, stats = optimize_for_ort(model)
    proto = ir.serde.serialize_model(model)
    return _result(proto, original, entry, fusion_stats={k: v for k, v in stats.items() if v})


def _worker(tool, path, entry_json, result_path) -> int:
    entry = json.loads(entry_json)
    t0 = time.perf_counter()
    try:
        res = {"status": "ok", **globals()[f"tool_{tool}"](path, entry)}
    except Exception as exc:
        res = {"status": "error", "error": _one_line(exc)}
    res["seconds"] = round(time.perf_counter() - t0, 1)
    with open(result_path, "w") as f:
        json.dump(res, f, default=str)
    return 0


# ----------------------------------------------------------------------------- parent


def run_tool(tool, path, entry, timeout) -> dict:
    with tempfile.TemporaryDirectory(prefix="ortflash-coverage-") as tmp:
        out = os.path.join(tmp, "result.json")
        env = dict(
            os.environ,
            PYTHONPATH=str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""),
        )
        try:
            proc = subprocess.run(
                [sys.executable, __file__, "--worker", tool, path, json.dumps(entry), out],
                capture_output=True,
                text=True,
                timeout=timeout,
                env=env,
            )
        except subprocess.TimeoutExpired:
            return {"status": "error", "error": f"timeout after {timeout:g} s"}
        if os.path.exists(out):
            with open(out) as f:
                return json.load(f)
        tail = [x for x in (proc.stderr or proc.stdout or "").splitlines() if x.strip()][-2:]
        return {"status": "error", "error": f"process died (exit {proc.returncode}): {' | '.join(tail)[-300:]}"}


def versions() -> dict:
    from ortflash.bench import versions as installed

    return installed(("ortflash", "onnxruntime", "onnxscript", "onnx", "onnx-ir", "torch", "transformers"))


def verdict(check) -> str:
    """ok | right_pad_only (differs only where item 1 is left-padded) | wrong (or does not run)."""
    if not check or check.get("ok"):
        return "ok"
    cases = check.get("cases", {})
    if check.get("runs") and cases.get("b1_right_pad", {}).get("ok"):
        return "right_pad_only"
    return "wrong"


MARK = {"ok": "", "right_pad_only": " †", "wrong": " ✗"}


def _cell(r, key="fused") -> str:
    if r is None:
        return ""
    if r.get("status") != "ok":
        return "error"
    n = r[key]
    return f"{n}{MARK[verdict(r.get('check'))] if n else ''}"


def _lower_cell(r, target) -> str:
    if not r or r.get("status") != "ok":
        return ""
    lw = r.get("lower")
    if not isinstance(lw, dict):
        return "n/a"
    t = lw.get(target, {})
    if "error" in t:
        return "error"
    n = t.get("native", 0)
    return f"{n}{MARK[verdict(t.get('check'))] if n else ''}"


def summarize(rows, tools) -> dict:
    tot = {"models": len(rows), "blocks": sum(r["blocks"] for r in rows)}
    for tool in tools:
        ok = [r for r in rows if r["tools"].get(tool, {}).get("status") == "ok"]
        fused = sum(r["tools"][tool]["fused"] for r in ok)
        verified = sum(r["tools"][tool]["fused"] for r in ok if verdict(r["tools"][tool].get("check")) == "ok")
        right = sum(r["tools"][tool]["fused"] for r in ok if verdict(r["tools"][tool].get("check")) == "right_pad_only")
        tot[tool] = {
            "fused": fused,
            "fused_and_verified": verified,
            "fused_right_padding_only": right,
            "models_all_fused": sum(1 for r in ok if r["tools"][tool]["fused"] == r["blocks"]),
            "models_failed": sum(1 for r in rows if r["tools"].get(tool, {}).get("status") not in (None, "ok")),
        }
    if "ortflash" in tools:
        for target in ("contrib", "onnx"):
            n = 0
            for r in rows:
                lw = r["tools"].get("ortflash", {}).get("lower")
                if isinstance(lw, dict) and "native" in lw.get(target, {}):
                    n += lw[target]["native"]
            tot[f"ortflash_to_{target}"] = n
    return tot


def markdown(data) -> str:
    tools = data["tools"]
    rows = data["rows"]
    tot = data["totals"]
    names = {
        "ortflash": "ortflash",
        "ort_session": "ORT session (C++ fusions)",
        "ort_optimizer": "ORT transformers optimizer",
        "onnxscript": "onnxscript ort_fusions",
    }
    lower = "ortflash" in tools and any(isinstance(r["tools"].get("ortflash", {}).get("lower"), dict) for r in rows)
    head = ["model", "exporter", "attention", "blocks"] + [names[t] for t in tools]
    if lower:
        head[5:5] = ["ortflash → contrib", "ortflash → onnx"]
    lines = [
        "# Attention coverage on the model zoo",
        "",
        f"- date: {data['date']}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in data["versions"].items()),
        f"- models: `models/manifest.json` ({len(rows)} models; random weights, small configs); generated by "
        "`python benchmarks/coverage.py`",
        "",
        "Each cell: attention blocks fused into one attention op. **Counting** (the same for every tool): "
        "the attention ops in the tool's output graph (FlashAttention, Attention, MultiHeadAttention, "
        "GroupQueryAttention, Packed*/DecoderMasked*/Sparse attention, in any domain), one per replaced block, "
        "capped at the model's blocks and cross-checked against the attention Softmax nodes that disappeared "
        "(disagreements are listed below). Every tool's output then ran in ONNX Runtime against the original on "
        f"the same inputs (batch 1 right-padded, batch 2 with item 1 left-padded; rtol {RTOL:g}, atol {ATOL:g}): "
        "`✗` marks a count whose model fails to run or computes something else on the right-padded batch; `†` one "
        "that matches with right padding but not when item 1 is left-padded (ONNX Runtime's fused BERT attention "
        "turns the mask into per-row lengths, assuming right padding). `error`: the tool raised, crashed or timed "
        "out on that export (below).",
        "",
        "- **ortflash**: `ortflash.optimize` (`report.fused`); **→ contrib / → onnx**: of those, how many "
        "`ortflash.lowering` turns into com.microsoft MultiHeadAttention/GroupQueryAttention or ONNX "
        "Attention-23 (the rest stay FlashAttention).",
        "- **ORT session**: what ONNX Runtime fuses by itself when it loads the model (CPU, ORT_ENABLE_ALL).",
        "- **ORT transformers optimizer**: `optimize_model(path, model_type=T, num_heads=<true heads>, "
        "hidden_size=<heads × head dim>, opt_level=L, use_gpu=False)`, T = the type ORT's export scripts use for the "
        "arch (whisper → bart, llama → gpt2, and qwen3 also tried), L in 0, 1, 2, each also with num_heads=0, "
        "hidden_size=0 (the optimizer's own detection); the try with the most attention ops is shown (type, level; "
        "among equals the first whose outputs match), every try is in coverage.json.",
        "- **onnxscript**: `onnxscript.rewriter.ort_fusions.optimize_for_ort(ir_model)`.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * 3 + "---:|" * (len(head) - 3),
    ]
    for r in rows:
        cells = [r["file"], r["exporter"], r["attn_impl"], str(r["blocks"])]
        for t in tools:
            c = _cell(r["tools"].get(t))
            if t == "ort_optimizer" and r["tools"].get(t, {}).get("status") == "ok" and r["tools"][t]["fused"]:
                b = r["tools"][t]["best"]
                c += (
                    f" ({b['model_type']}, L{b['opt_level']}" + (", auto heads" if not b.get("num_heads") else "") + ")"
                )
            cells.append(c)
        if lower:
            o = r["tools"].get("ortflash")
            cells[5:5] = [_lower_cell(o, "contrib"), _lower_cell(o, "onnx")]
        lines.append("| " + " | ".join(cells) + " |")
    total = ["**total**", "", "", f"**{tot['blocks']}**"] + [f"**{tot[t]['fused']}**" for t in tools]
    if lower:
        total[5:5] = [f"**{tot['ortflash_to_contrib']}**", f"**{tot['ortflash_to_onnx']}**"]
    lines.append("| " + " | ".join(total) + " |")
    lines += [
        "",
        "## Totals",
        "",
        "| tool | blocks fused | fused and verified (both cases) | fused, right padding only (†) "
        "| models fully fused | models where the tool failed |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for t in tools:
        x = tot[t]
        lines.append(
            f"| {names[t]} | {x['fused']} / {tot['blocks']} | {x['fused_and_verified']} | "
            f"{x['fused_right_padding_only']} | {x['models_all_fused']} / {tot['models']} | {x['models_failed']} |"
        )
    if lower:
        lines.append(f"| ortflash → contrib (native ops) | {tot['ortflash_to_contrib']} / {tot['blocks']} | | | | |")
        lines.append(f"| ortflash → onnx (native ops) | {tot['ortflash_to_onnx']} / {tot['blocks']} | | | | |")
    ran = [r for r in rows if r["tools"].get("ort_optimizer", {}).get("status") == "ok"]
    other = sum(
        1
        for r in ran
        if any(
            {k for k in t.get("fused_operator_statistics", {}) if k not in ATTENTION_OP_TYPES}
            for t in r["tools"]["ort_optimizer"].get("tries", [])
        )
    )
    if ran:
        lines += [
            "",
            f"The ORT transformers optimizer ran on all {len(ran)} models and fused its other patterns on {other} "
            "of them (SkipLayerNormalization, BiasGelu/FastGelu, SimplifiedLayerNormalization, ...: "
            "`fused_operator_statistics` of each try in coverage.json), so its zero attention counts are pattern "
            "misses on these exports, not failures to run.",
        ]
    notes = []
    for r in rows:
        for t in tools:
            x = r["tools"].get(t, {})
            if x.get("status") not in (None, "ok"):
                notes.append(f"- `{r['file']}` {names[t]}: {x.get('error')}")
                continue
            if x.get("count_note"):
                notes.append(f"- `{r['file']}` {names[t]}: {x['count_note']}")
            chk = x.get("check")
            if chk and not chk.get("ok"):
                bad = chk.get("error") or "; ".join(
                    f"{k}: "
                    + (v.get("error") or f"max abs diff {v['max_abs']:.3g}, NaN mismatches {v['nan_mismatch']}")
                    for k, v in chk.get("cases", {}).items()
                    if not v.get("ok")
                )
                notes.append(f"- `{r['file']}` {names[t]}: output differs: {bad}")
            if t == "ort_optimizer":
                errs = [
                    f"{y['model_type']} L{y.get('opt_level', '?')}: {y['error']}"
                    for y in x.get("tries", [])
                    if "error" in y
                ]
                if errs:
                    notes.append(f"- `{r['file']}` {names[t]} (other tries): " + "; ".join(errs)[:400])
            if t == "ortflash" and isinstance(x.get("lower"), dict):
                for target, y in x["lower"].items():
                    if "error" in y:
                        notes.append(f"- `{r['file']}` lower → {target}: {y['error']}")
                    elif y.get("check") and not y["check"].get("ok"):
                        notes.append(
                            f"- `{r['file']}` lower → {target}: output differs: {json.dumps(y['check'])[:200]}"
                        )
    if notes:
        lines += ["", "## Failures, mismatches and count notes", ""] + notes
    skipped = data.get("skipped") or []
    if skipped:
        lines += ["", "## Zoo combinations that did not export (from the manifest)", ""]
        lines += [f"- {s.get('file')}: {s.get('reason')}" for s in skipped]
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    if argv is None and sys.argv[1:2] == ["--worker"]:
        return _worker(*sys.argv[2:6])
    if argv is None and sys.argv[1:2] == ["--render"]:  # coverage.json -> coverage.md again, no runs
        src = Path(sys.argv[2])
        data = json.loads(src.read_text())
        data["totals"] = summarize(data["rows"], data["tools"])
        src.with_suffix(".md").write_text(markdown(data))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zoo", default=str(ROOT / "models"), help="folder with manifest.json")
    ap.add_argument("--only", nargs="*", help="architectures (bert gpt2 ...) or file names")
    ap.add_argument("--tools", default=",".join(TOOLS), help="comma-separated subset of " + ",".join(TOOLS))
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per (model, tool)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--name", default="coverage")
    args = ap.parse_args(argv)

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console()
    zoo = Path(args.zoo)
    man_path = zoo / "manifest.json"
    if not man_path.exists():
        console.print(f"[red]{man_path} does not exist[/] (python models/generate.py writes it)")
        return 2
    manifest = json.loads(man_path.read_text())
    entries = [e for e in manifest["models"] if e.get("file")]
    if args.only:
        entries = [e for e in entries if e["arch"] in args.only or e["file"] in args.only]
    tools = [t for t in args.tools.split(",") if t]
    for t in tools:
        if t not in TOOLS:
            ap.error(f"unknown tool {t}")
    # every tool reads the same bytes even if the zoo is regenerated meanwhile
    snapshot = tempfile.TemporaryDirectory(prefix="ortflash-coverage-zoo-")
    rows = []
    with (
        snapshot,
        Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
        ) as bar,
    ):
        task = bar.add_task("coverage", total=len(entries) * len(tools))
        for e in entries:
            src = zoo / e["file"]
            path = os.path.join(snapshot.name, e["file"])
            with open(src, "rb") as f, open(path, "wb") as g:
                g.write(f.read())
            row = {
                "file": e["file"],
                "arch": e["arch"],
                "exporter": e["exporter"],
                "attn_impl": e["attn_impl"],
                "blocks": e["attention_blocks"],
                "num_heads": e.get("num_heads"),
                "head_dim": e.get("head_dim"),
                "tools": {},
            }
            entry = {
                k: e.get(k)
                for k in ("arch", "attention_blocks", "num_heads", "kv_heads", "head_dim", "dynamic", "feed_dims")
            }
            for t in tools:
                bar.update(task, description=f"{e['file']:32s} {t:13s}")
                row["tools"][t] = run_tool(t, path, entry, args.timeout)
                bar.advance(task)
            line = "  ".join(f"{t}={_cell(row['tools'][t])}" for t in tools)
            bar.console.print(f"{e['file']:32s} blocks={row['blocks']}  {line}")
            rows.append(row)
    data = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "versions": versions(),
        "manifest_versions": manifest.get("versions"),
        "tools": tools,
        "ort_model_types": ORT_MODEL_TYPES,
        "ort_opt_levels": list(ORT_OPT_LEVELS),
        "tolerance": {"rtol": RTOL, "atol": ATOL},
        "rows": rows,
        "skipped": manifest.get("skipped", []),
    }
    data["totals"] = summarize(rows, tools)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    (out / f"{args.name}.md").write_text(markdown(data))
    tot = data["totals"]
    console.print(f"blocks {tot['blocks']}: " + ", ".join(f"{t} {tot[t]['fused']}" for t in tools))
    console.print(f"wrote {out / (args.name + '.md')}, {out / (args.name + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
