"""The fixed cost of one FlashAttention node in ONNX Runtime (CPU EP), against the subgraph it replaces.

Project issue 20, item 1. One attention block at a small shape (B=1, Sq=Sk=16, D=32, H=1 and 12 by
default), as three one-block models written with onnx.helper:

- ``original``: ``Transpose(K) -> MatMul -> Mul(scale) -> Add(bias [1,1,1,S]) -> Softmax -> MatMul``,
  what an exporter writes, in a plain ``onnxruntime.InferenceSession`` (ORT's default options:
  intra-op spinning on);
- ``fused``: ``ortflash.optimize`` of it (one FlashAttention node), in ``ortflash.InferenceSession``,
  the path users run (``ortflash.session_options()``: the ORT bridge of onnxruntime-extensions, our
  hook, the compiled kernel);
- ``empty``: ``Identity(q)`` with the same four inputs: what any ``session.run`` with these feeds
  costs, so ``variant - empty`` is what the block's nodes cost.

Variants: ``empty``, ``original``, ``original-nospin`` (allow_spinning=0), ``fused``,
``fused-spin`` / ``fused-nospin`` (the caller's options set spinning on / off), and
``fused@LABEL`` for every ``--tree LABEL=DIR`` (the fused model run with the ortflash package of
another checkout, for a before/after; its compiled kernel must be built there). Each (variant,
shape) runs in its own process: ``--warmup`` untimed runs, then ``--repeats`` timed loops of
``--calls`` runs each; a loop's time per run is one sample, the median over samples is reported
(with its CPU time per run, which preemption on a loaded machine does not inflate). ``--rounds``
repeats everything in alternating order, so a load that drifts weighs on every variant alike;
per-round ratios are taken against ``original`` in the same round.

A last worker (``breakdown``) times the pieces of one fused call inside one process: the bridge
alone (the hook swapped for one that returns a ready output), our hook ``_invoke``, the prepared
kernel call, and the compiled module by itself. Results: ``results/fixed_cost.{json,md}``.

    python benchmarks/fixed_cost.py --rounds 3
    python benchmarks/fixed_cost.py --tree before=/tmp/before --rounds 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
VARIANTS = ("empty", "original", "original-nospin", "fused", "fused-spin", "fused-nospin")
SPINNING_KEY = "session.intra_op.allow_spinning"


def block_models(heads: int, seq: int, dim: int) -> dict[str, Any]:
    """The original block, its fused form (checked: one FlashAttention node) and the empty model."""
    import onnx
    from onnx import TensorProto, helper

    import ortflash

    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, heads, seq, dim]) for n in "qkv"]
    inputs.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, [1, 1, 1, seq]))
    output = [helper.make_tensor_value_info("o", TensorProto.FLOAT, [1, heads, seq, dim])]
    scale = onnx.numpy_helper.from_array(np.array(dim**-0.5, np.float32), "scale")
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "bias"], ["biased"]),
        helper.make_node("Softmax", ["biased"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["o"]),
    ]
    opsets = [helper.make_opsetid("", 17)]
    original = helper.make_model(helper.make_graph(nodes, "block", inputs, output, [scale]), opset_imports=opsets)
    original.ir_version = 8
    try:  # short blocks keep their original ops by default (the speed-aware choice): fuse anyway
        fused, report = ortflash.optimize(original, target="ortflash")
    except ValueError:  # a tree from before that choice: fusing is its default
        fused, report = ortflash.optimize(original)
    kinds = [n.op_type for n in fused.graph.node if n.op_type != "Constant"]
    if report.fused != 1 or kinds != ["FlashAttention"]:
        raise SystemExit(f"fixed_cost: the block did not fuse into one node ({kinds})")
    identity = [helper.make_node("Identity", ["q"], ["o"])]
    empty = helper.make_model(helper.make_graph(identity, "empty", inputs, output), opset_imports=opsets)
    empty.ir_version = 8
    return {"original": original, "fused": fused, "empty": empty}


def feeds(heads: int, seq: int, dim: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {n: rng.standard_normal((1, heads, seq, dim), dtype=np.float32) for n in "qkv"}
    bias = np.zeros((1, 1, 1, seq), np.float32)
    bias[..., seq - seq // 4 :] = np.finfo(np.float32).min  # the last quarter padded
    out["bias"] = bias
    return out


def open_session(variant: str, models: dict[str, Path]) -> Any:
    import onnxruntime as ort

    kind, _, _ = variant.partition("@")
    if kind.startswith("original") or kind == "empty":
        so = ort.SessionOptions()
        if kind == "original-nospin":
            so.add_session_config_entry(SPINNING_KEY, "0")
        path = models["empty" if kind == "empty" else "original"]
        return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    import ortflash

    base = None
    if kind in ("fused-spin", "fused-nospin"):
        base = ort.SessionOptions()
        base.add_session_config_entry(SPINNING_KEY, "1" if kind == "fused-spin" else "0")
    return ortflash.InferenceSession(str(models["fused"]), sess_options=base)


def time_runs(run: Any, warmup: int, repeats: int, calls: int) -> dict[str, Any]:
    """Per-run wall and CPU microseconds: one sample per loop of `calls` runs."""
    for _ in range(warmup):
        run()
    wall, cpu = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(calls):
            run()
        wall.append((time.perf_counter() - t0) / calls * 1e6)
        cpu.append((time.process_time() - c0) / calls * 1e6)
    return {
        "median_us": round(statistics.median(wall), 2),
        "min_us": round(min(wall), 2),
        "cpu_median_us": round(statistics.median(cpu), 2),
        "samples_us": [round(x, 2) for x in wall],
    }


def worker(variant: str, shape: tuple[int, int, int], models: dict[str, Path], cfg: dict[str, Any]) -> dict[str, Any]:
    f = feeds(*shape)
    session = open_session(variant, models)
    out = session.run(None, f)[0]
    result = time_runs(lambda: session.run(None, f), cfg["warmup"], cfg["repeats"], cfg["calls"])
    result["output_checksum"] = round(float(np.abs(out).sum()), 3)
    if variant.startswith("fused"):
        from ortflash.kernels import cpu

        result["isa"] = cpu.isa()
    return result


def breakdown(shape: tuple[int, int, int], models: dict[str, Path], cfg: dict[str, Any]) -> dict[str, Any]:
    """The pieces of one fused call, each timed in this process (private names: a diagnostic)."""
    from onnxruntime_extensions import PyCustomOpDef

    from ortflash.kernels import ort_bridge

    f = feeds(*shape)
    session = open_session("fused", models)
    seen: dict[str, Any] = {}

    def recording(op_id: int, feed: Any, attributes: Any) -> Any:
        seen.update(op_id=op_id, feed=feed, attributes=attributes)
        return ort_bridge.INVOKE_HOOK(op_id, feed, attributes)

    PyCustomOpDef.install_hooker(recording)
    ready = session.run(None, f)[0]
    ready_flat = ready.reshape(-1)

    def ready_output(op_id: int, feed: Any, attributes: Any) -> Any:
        return (op_id, ready.shape, ready_flat)

    def timed(fn: Any) -> float:
        return time_runs(fn, cfg["warmup"], cfg["repeats"], cfg["calls"])["median_us"]

    out: dict[str, float] = {}
    PyCustomOpDef.install_hooker(ready_output)
    out["session.run, the hook returning a ready output (ORT + extensions bridge)"] = timed(
        lambda: session.run(None, f)
    )
    PyCustomOpDef.install_hooker(ort_bridge.INVOKE_HOOK)
    out["session.run (the whole fused call)"] = timed(lambda: session.run(None, f))
    op_id, feed, attributes = seen["op_id"], seen["feed"], seen["attributes"]
    out["our hook _invoke, called directly"] = timed(lambda: ort_bridge.INVOKE_HOOK(op_id, feed, attributes))
    cast = ort_bridge._cast_attributes(op_id, tuple(attributes.items()))
    node = ort_bridge.node_call(cast)
    q, k, v, bias, _ = feed
    if node.prepared is not None:
        prepared = node.prepared
        out["the prepared kernel call (cpu.PreparedCall)"] = timed(lambda: prepared(q, k, v, bias, None))
        c, result = prepared.call, np.empty_like(ready)  # type: ignore[attr-defined]
        module = prepared.module  # type: ignore[attr-defined]
        out["the compiled module alone"] = timed(
            lambda: module.flash_attention(
                q,
                k,
                v,
                result,
                bias,
                None,
                c.scale,
                c.is_causal,
                c.mask_fill,
                c.zero_rows,
                c.softcap,
                False,
                c.block_size,
                64,
                1,
                c.bias_after_mask,
            )  # fmt: skip
        )
    return out


def machine() -> dict[str, Any]:
    cpu, flags = "unknown", set()
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name") and cpu == "unknown":
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    isa = [x for x in ("avx512f", "avx2", "fma") if x in flags]
    return {"cpu": cpu, "isa_flags": isa, "cores": len(os.sched_getaffinity(0)), "loadavg": list(os.getloadavg())}


def run_worker(args: argparse.Namespace, variant: str, shape: tuple[int, int, int], workdir: Path) -> dict[str, Any]:
    label, _, tree = variant.partition("@")
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = args.trees[tree] + os.pathsep + env.get("PYTHONPATH", "")
    result = workdir / "result.json"
    cmd = [sys.executable, __file__, "--worker", variant, ",".join(map(str, shape)), "--workdir", str(workdir)]
    cmd += ["--warmup", str(args.warmup), "--repeats", str(args.repeats), "--calls", str(args.calls)]
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=600, check=False, cwd=tempfile.gettempdir()
    )
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][-300:]}
    return json.loads(result.read_text())


def summarise(rounds: list[dict[str, Any]], key: str, variant: str) -> dict[str, Any]:
    """Median over rounds of a variant's median, its cost above `empty`, and its ratio to original."""
    vals = [r[key][variant] for r in rounds if "median_us" in r[key].get(variant, {})]
    if not vals:
        return {"error": next((r[key][variant].get("error") for r in rounds if variant in r[key]), "not run")}
    empty = [r[key]["empty"]["median_us"] for r in rounds]
    orig = [r[key]["original"]["median_us"] for r in rounds]
    med = statistics.median(v["median_us"] for v in vals)
    return {
        "median_us": round(med, 1),
        "cpu_median_us": round(statistics.median(v["cpu_median_us"] for v in vals), 1),
        "above_empty_us": round(statistics.median(v["median_us"] - e for v, e in zip(vals, empty)), 1),
        "original_over_variant": round(statistics.median(o / v["median_us"] for v, o in zip(vals, orig)), 3),
        "round_medians_us": [v["median_us"] for v in vals],
    }


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = (
        [
            "# One FlashAttention node's fixed cost (issue 20, item 1)",
            "",
            f"- date: {results['date']}; command: `{results['command']}`",
            f"- machine: {m['cpu']}, ISA flags {', '.join(m['isa_flags'])}, {m['cores']} usable cores; "
            f"kernel build: {results.get('isa')}",
            f"- load average at start / end: {results['loadavg_start']} / {results['loadavg_end']} (a shared machine: "
            "other engineers' jobs ran beside this; read the ratios and the CPU times, measured side by side)",
            f"- each (variant, shape) in its own process; {results['config']['warmup']} warm-up runs, then "
            f"{results['config']['repeats']} loops of {results['config']['calls']} `session.run` calls, the median "
            f"loop's time per run; {results['config']['rounds']} round(s) in alternating order, medians over rounds",
            "- `above empty`: the variant's time minus the `empty` model's (Identity over the same feeds) in the same "
            "round: what the block's nodes cost. `original / variant`: higher is better",
        ]
        + [f"- {note}" for note in results.get("notes", [])]
        + [""]
    )
    for key, per in results["shapes"].items():
        lines += [f"## {key}", "", "| variant | median µs / run | CPU µs / run | above empty µs | original / variant |"]
        lines += ["|---|---:|---:|---:|---:|"]
        for variant, s in per.items():
            if "error" in s:
                lines.append(f"| {variant} | {s['error']} | | | |")
                continue
            lines.append(
                f"| {variant} | {s['median_us']} | {s['cpu_median_us']} | {s['above_empty_us']} | "
                f"{s['original_over_variant']} |"
            )
        pieces = results["breakdown"].get(key, {})
        if pieces:
            lines += ["", "Inside one fused call (one process, medians in µs):", ""]
            lines += [f"- {name}: {us}" for name, us in pieces.items()]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", default="1,12", help="comma-separated head counts (default %(default)s)")
    ap.add_argument("--seq", type=int, default=16, help="Sq = Sk (default %(default)s)")
    ap.add_argument("--dim", type=int, default=32, help="head dim D (default %(default)s)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--tree", action="append", default=[], metavar="LABEL=DIR", help="add fused@LABEL run from DIR")
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--name", default="fixed_cost")
    ap.add_argument("--note", action="append", default=[], help="a line for the results' header (repeatable)")
    ap.add_argument("--worker", nargs=2, metavar=("VARIANT", "SHAPE"), help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for n in ("warmup", "repeats", "calls", "rounds", "seq", "dim"):
        if getattr(args, n) < 1:
            print(f"fixed_cost: error: --{n} must be positive", file=sys.stderr)
            return 2
    if args.worker:
        workdir = Path(args.workdir)
        shape = tuple(int(x) for x in args.worker[1].split(","))
        models = {k: workdir / f"{k}_{args.worker[1].replace(',', 'x')}.onnx" for k in ("original", "fused", "empty")}
        cfg = {"warmup": args.warmup, "repeats": args.repeats, "calls": args.calls}
        variant = args.worker[0]
        res = breakdown(shape, models, cfg) if variant == "breakdown" else worker(variant, shape, models, cfg)  # type: ignore[arg-type]
        (workdir / "result.json").write_text(json.dumps(res))
        return 0
    args.trees = dict(t.split("=", 1) for t in args.tree)
    variants = [v for v in args.variants.split(",") if v] + [f"fused@{label}" for label in args.trees]
    for required in ("empty", "original"):
        if required not in variants:
            print(f"fixed_cost: error: --variants must include {required} (the ratios need it)", file=sys.stderr)
            return 2
    import onnx

    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python benchmarks/fixed_cost.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "config": {k: getattr(args, k) for k in ("warmup", "repeats", "calls", "rounds", "seq", "dim", "heads")},
        "trees": args.trees,
        "notes": args.note,
        "shapes": {},
        "breakdown": {},
        "rounds": {},
    }
    with tempfile.TemporaryDirectory(prefix="ortflash-fixed-cost-") as tmp:
        workdir = Path(tmp)
        shapes = [(int(h), args.seq, args.dim) for h in args.heads.split(",")]
        keys = {shape: f"B=1, H={shape[0]}, Sq=Sk={shape[1]}, D={shape[2]}" for shape in shapes}
        for shape in shapes:
            for kind, model in block_models(*shape).items():
                onnx.save(model, str(workdir / f"{kind}_{'x'.join(map(str, shape))}.onnx"))
        rounds: list[dict[str, Any]] = []
        for r in range(args.rounds):
            order = variants if r % 2 == 0 else variants[::-1]
            one: dict[str, Any] = {keys[s]: {} for s in shapes}
            for shape in shapes:
                for v in order:
                    one[keys[shape]][v] = run_worker(args, v, shape, workdir)
                    print(
                        f"round {r + 1} {keys[shape]} {v}: {one[keys[shape]][v].get('median_us', one[keys[shape]][v])}"
                    )
            rounds.append(one)
        for shape in shapes:
            key = keys[shape]
            results["shapes"][key] = {v: summarise(rounds, key, v) for v in variants}
            results["breakdown"][key] = run_worker(args, "breakdown", shape, workdir)
            results["rounds"][key] = [r[key] for r in rounds]
            results["isa"] = next((r[key][v].get("isa") for r in rounds for v in variants if "isa" in r[key][v]), None)
    results["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / f"{args.name}.md").write_text(markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
