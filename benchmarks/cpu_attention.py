"""CPU attention benchmark: BERT-base-sized attention stacks (B=1, H=12, D=64) through `ortflash bench`.

Three stacks, the cases of project issue 9's targets, written with onnx.helper (random weights,
never committed), hidden 768 = 12 heads of 64, per layer Q/K/V projections, attention, the
output projection, the residual and LayerNormalization (no feed-forward block, so attention
dominates the run):

  ``padding``  what an exporter writes for BERT: ``MatMul -> Div(8) -> Add(mask) -> Softmax ->
               MatMul`` with the padding mask ``(1 - mask) * finfo(float32).min`` as ``[B, 1, 1, S]``
               (inputs hidden_states and attention_mask, the last third of item 0 padded);
  ``nomask``   the same without the mask (input hidden_states only);
  ``causal``   ONNX ``Attention`` (opset 23) with ``is_causal=1``, which ortflash fuses with
               is_causal proved (input hidden_states only);
  ``causal_mask`` the ``nomask`` stack with a causal mask as decoder exports write it, computed in
               the graph from the length: ``Where(key > query, finfo(float32).min, 0)`` of two
               ``Range``s, ``[S, S]``, added to every layer's scores (ortflash proves it causal);
  ``bias``     the ``nomask`` stack with a T5-like position bias: a learned ``[255, H]`` table
               gathered at the clipped relative position key - query, as ``[1, H, S, S]``, added
               to every layer's scores (a full per-head bias: no tile is skipped).

Each stack runs through ``ortflash.bench.bench`` (one process per variant and S) and writes
NAME_STACK.{json,md,png}, the markdown ending with the issue's targets, met or not.

    python benchmarks/cpu_attention.py                                   # every stack, S = 512..8192
    python benchmarks/cpu_attention.py --stacks padding --seq-lens 256,512 --repeats 2 --out /tmp/r
    python benchmarks/cpu_attention.py --stacks padding --isa avx2 --seq-lens 4096 --name cpu_attention_avx2
    python benchmarks/cpu_attention.py --stacks padding --model-dir /tmp/m --no-run   # only write the model
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
HIDDEN, HEADS, HEAD_DIM = 768, 12, 64
OPSET = 17
STACKS = ("padding", "nomask", "causal", "causal_mask", "bias")
DEFAULT_VARIANTS = "original,naive,online,online@512,reference,contrib,onnx,torch-sdpa"


@dataclass(frozen=True)
class Target:
    """One row of issue 9's targets: ratios of the online variant within one run."""

    stack: str
    seq_len: int
    vs_original: float | None = None  # minimum speedup against the original graph
    vs_contrib: float | None = None  # minimum speedup against ORT's MultiHeadAttention (--target contrib)
    memory_ratio: float | None = None  # maximum inference peak memory against the original
    peak_mib: float | None = None  # maximum inference peak memory, absolute
    isa: str | None = None  # only checked in a run with this --isa
    variant: str = "online"


TARGETS = (
    Target("padding", 2048, 1.5, 1.5, 0.1),
    Target("padding", 4096, 2.0, 1.8, 0.05),
    Target("causal", 4096, 4.0, 4.0, 0.05),
    Target("nomask", 4096, 1.1, 0.95, 0.1),
    Target("padding", 16384, peak_mib=1024.0),
    Target("padding", 4096, 1.3, isa="avx2"),
)


def build_model(
    layers: int = 2, seed: int = 0, stack: str = "padding", heads: int = HEADS, head_dim: int = HEAD_DIM
) -> onnx.ModelProto:
    """The attention stack of one kind (see the module docstring), the same weights for all kinds;
    ``heads`` x ``head_dim`` other than BERT-base's 12 x 64 for other model sizes."""
    hidden = heads * head_dim
    if stack not in STACKS:
        raise ValueError(f"unknown stack {stack!r}: use one of {', '.join(STACKS)}")
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def const(name: str, array: Any) -> str:
        inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(name: str, *shape: int, std: float = 0.02) -> str:
        return const(name, (rng.standard_normal(shape) * std).astype(np.float32))

    def node(op: str, inputs: list[str], name: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    const("one", np.array(1.0, np.float32))
    const("neg_big", np.array(np.finfo(np.float32).min, np.float32))
    const("axes_12", np.array([1, 2], np.int64))
    const("shape_bshd", np.array([0, 0, heads, head_dim], np.int64))
    const("shape_bsh", np.array([0, 0, hidden], np.int64))
    const("sqrt_d", np.array(math.sqrt(head_dim), np.float32))
    mask = None
    if stack == "padding":  # extended attention mask [B, 1, 1, S]: 0 where attended, float32 min where padded
        m = node("Cast", ["attention_mask"], "mask_float", to=TensorProto.FLOAT)
        m = node("Sub", ["one", m], "mask_inverted")
        m = node("Mul", [m, "neg_big"], "mask_bias")
        mask = node("Unsqueeze", [m, "axes_12"], "mask_bias_4d")

    if stack in ("causal_mask", "bias"):  # both read the query and key positions 0 .. S-1
        const("zero_i", np.array(0, np.int64))
        const("one_i", np.array(1, np.int64))
        const("axis_0", np.array([0], np.int64))
        const("axis_1", np.array([1], np.int64))
        length = node("Gather", [node("Shape", ["hidden_states"], "x_shape"), "one_i"], "seq_len", axis=0)
        positions = node("Range", ["zero_i", length, "one_i"], "positions")
        query_pos = node("Unsqueeze", [positions, "axis_1"], "query_pos")  # [S, 1]
        key_pos = node("Unsqueeze", [positions, "axis_0"], "key_pos")  # [1, S]
        if stack == "causal_mask":
            const("zero_f", np.array(0.0, np.float32))
            future = node("Greater", [key_pos, query_pos], "future")
            mask = node("Where", [future, "neg_big", "zero_f"], "causal_bias")  # [S, S]
        else:
            const("rel_min", np.array(-127, np.int64))
            const("rel_max", np.array(127, np.int64))
            relative = node("Sub", [key_pos, query_pos], "relative")
            relative = node("Clip", [relative, "rel_min", "rel_max"], "relative_clipped")
            bucket = node("Add", [relative, "rel_max"], "bucket")
            table = weight("relative_attention_bias", 255, heads, std=0.5)  # T5's name; not a position table
            gathered = node("Gather", [table, bucket], "position_bias_ssh", axis=0)  # [S, S, H]
            per_head = node("Transpose", [gathered], "position_bias_hss", perm=[2, 0, 1])
            mask = node("Unsqueeze", [per_head, "axis_0"], "position_bias")  # [1, H, S, S]

    x = "hidden_states"
    for i in range(layers):
        p = f"l{i}_"

        def proj(name: str, src: str) -> str:
            y = node("MatMul", [src, weight(f"{name}_w", hidden, hidden)], f"{name}_mm")
            return node("Add", [y, weight(f"{name}_b", hidden)], f"{name}_add")

        q3, k3, v3 = proj(p + "q", x), proj(p + "k", x), proj(p + "v", x)
        if stack == "causal":
            ctx = node("Attention", [q3, k3, v3], p + "context_bsh", q_num_heads=heads, kv_num_heads=heads, is_causal=1)
        else:
            q = node("Transpose", [node("Reshape", [q3, "shape_bshd"], p + "q_bshd")], p + "q_bhsd", perm=[0, 2, 1, 3])
            kt = node("Transpose", [node("Reshape", [k3, "shape_bshd"], p + "k_bshd")], p + "k_bhds", perm=[0, 2, 3, 1])
            v = node("Transpose", [node("Reshape", [v3, "shape_bshd"], p + "v_bshd")], p + "v_bhsd", perm=[0, 2, 1, 3])
            s = node("Div", [node("MatMul", [q, kt], p + "scores"), "sqrt_d"], p + "scores_scaled")
            if mask is not None:
                s = node("Add", [s, mask], p + "scores_masked")
            probs = node("Softmax", [s], p + "probs", axis=-1)
            ctx = node("Transpose", [node("MatMul", [probs, v], p + "context")], p + "context_bshd", perm=[0, 2, 1, 3])
            ctx = node("Reshape", [ctx, "shape_bsh"], p + "context_bsh")
        o = node(
            "Add",
            [node("MatMul", [ctx, weight(p + "wo", hidden, hidden)], p + "o_mm"), weight(p + "bo", hidden)],
            p + "o_add",
        )
        r = node("Add", [o, x], p + "residual")
        gamma = const(p + "ln_gamma", np.ones(hidden, np.float32))
        beta = const(p + "ln_beta", np.zeros(hidden, np.float32))
        x = node("LayerNormalization", [r, gamma, beta], p + "ln", axis=-1, epsilon=1e-12)

    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="output"))
    used = {i for n in nodes for i in n.input}
    graph_inputs = [helper.make_tensor_value_info("hidden_states", TensorProto.FLOAT, ["batch", "seq", hidden])]
    if stack == "padding":
        graph_inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]))
    graph = helper.make_graph(
        nodes,
        f"bert_base_attention_stack_{stack}",
        graph_inputs,
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", hidden])],
        [t for t in inits if t.name in used],
    )
    opset = 23 if stack == "causal" else OPSET
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="ortflash-benchmarks"
    )
    model.ir_version = 11 if stack == "causal" else 8
    onnx.checker.check_model(model)
    return model


def model_path(folder: Path, stack: str, layers: int) -> Path:
    return folder / f"attention_{stack}_{layers}l.onnx"


def _ratio(results: dict[str, Any], variant: str, s: int, other: str) -> float | None:
    """How many times faster variant is than other at S, in this run."""
    from ortflash.bench.report import ok_run

    run, base = ok_run(results, variant, s), ok_run(results, other, s)
    return base["latency_ms"]["median"] / run["latency_ms"]["median"] if run and base else None


def check_targets(results: dict[str, Any], stack: str, isa: str | None) -> list[dict[str, Any]]:
    """Each target of this stack (and ISA) with what was measured and whether it was met."""
    from ortflash.bench.report import ok_run

    out = []
    for t in TARGETS:
        if t.stack != stack or t.isa != isa:
            continue
        row: dict[str, Any] = {"target": t.__dict__, "checks": {}}
        run, base = ok_run(results, t.variant, t.seq_len), ok_run(results, "original", t.seq_len)
        if run is None:
            row["met"], row["note"] = None, f"{t.variant} not measured at S={t.seq_len}"
            out.append(row)
            continue
        checks = row["checks"]
        if t.vs_original is not None:
            got = _ratio(results, t.variant, t.seq_len, "original")
            checks["vs original"] = (got, t.vs_original, None if got is None else got >= t.vs_original)
        if t.vs_contrib is not None:
            got = _ratio(results, t.variant, t.seq_len, "contrib")
            checks["vs contrib"] = (got, t.vs_contrib, None if got is None else got >= t.vs_contrib)
        if t.memory_ratio is not None and base and base["memory_mb"]["inference_peak"] > 0:
            got = run["memory_mb"]["inference_peak"] / base["memory_mb"]["inference_peak"]
            checks["memory vs original"] = (got, t.memory_ratio, got <= t.memory_ratio)
        if t.peak_mib is not None:
            got = run["memory_mb"]["inference_peak"]
            checks["inference peak MiB"] = (got, t.peak_mib, got <= t.peak_mib)
        verdicts = [ok for _, _, ok in checks.values()]
        row["met"] = None if None in verdicts else all(verdicts)
        out.append(row)
    return out


def targets_markdown(targets: list[dict[str, Any]]) -> str:
    lines = [
        "",
        "## Targets (project issue 9, ratios within this run)",
        "",
        "| case | check | wanted | measured | met |",
        "|---|---|---:|---:|---|",
    ]
    for row in targets:
        t = row["target"]
        case = f"{t['stack']}, S={t['seq_len']}, {t['variant']}" + (f", {t['isa']}" if t["isa"] else "")
        if not row["checks"]:
            lines.append(f"| {case} | | | {row.get('note', '')} | n/a |")
        for name, (got, want, ok) in row["checks"].items():
            sense = "<=" if "memory" in name or "MiB" in name else ">="
            shown = "n/a" if got is None else f"{got:.3g}"
            lines.append(
                f"| {case} | {name} | {sense} {want:g} | {shown} | {'n/a' if ok is None else 'yes' if ok else 'no'} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from ortflash.bench import bench, write_results

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stacks", default=",".join(STACKS), help="comma-separated: " + ", ".join(STACKS))
    ap.add_argument("--seq-lens", default="512,1024,2048,4096,8192")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="ORT intra-op, kernel and BLAS threads per worker")
    ap.add_argument(
        "--isa",
        choices=("avx512", "avx2", "generic"),
        default=None,
        help="force this build of the compiled CPU kernel (ORTFLASH_CPU_ISA in the workers)",
    )
    ap.add_argument("--rounds", type=int, default=2, help="measurements per (variant, S), alternating the order")
    ap.add_argument("--rounds-max-seq", type=int, default=2048, help="only one round above this length")
    ap.add_argument(
        "--time-budget",
        type=float,
        default=60.0,
        help="fewer timed runs (at least 3) when repeats x cold run exceeds this many seconds",
    )
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per worker")
    ap.add_argument(
        "--max-seq",
        action="append",
        default=[],
        metavar="VARIANT=S",
        help="do not run VARIANT above sequence length S (repeatable)",
    )
    ap.add_argument(
        "--profile-max-seq", type=int, default=4096, help="ORT-profiled runs (per-op times) up to this length"
    )
    ap.add_argument("--model-dir", default=None, help="where to write the generated models (default: a temp folder)")
    ap.add_argument("--no-run", action="store_true", help="only write the models (to --model-dir)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--name", default="cpu_attention", help="results stem; each stack adds _STACK")
    ap.add_argument("--note", action="append", default=[], help="a line to add to the results")
    args = ap.parse_args(argv)
    stacks = [s for s in args.stacks.split(",") if s]
    unknown = set(stacks) - set(STACKS)
    if unknown:
        ap.error(f"unknown stack(s) {', '.join(sorted(unknown))}: use {', '.join(STACKS)}")

    folder = Path(args.model_dir) if args.model_dir else Path(tempfile.mkdtemp(prefix="ortflash-cpu-attention-"))
    folder.mkdir(parents=True, exist_ok=True)
    for stack in stacks:
        onnx.save(build_model(args.layers, stack=stack), str(model_path(folder, stack, args.layers)))
        print("wrote", model_path(folder, stack, args.layers))
    if args.no_run:
        return 0
    max_seq = {k: int(v) for k, v in (x.split("=", 1) for x in args.max_seq)}
    for stack in stacks:
        notes = [
            (
                f"model: BERT-base-sized attention stack `{stack}` built by benchmarks/cpu_attention.py (hidden "
                f"{HIDDEN}, {HEADS} heads x {HEAD_DIM}, {args.layers} attention layers, no FFN, random weights)"
            )
        ] + args.note
        res = bench(
            model_path(folder, stack, args.layers),
            seq_lens=[int(s) for s in args.seq_lens.split(",")],
            variants=args.variants.split(","),
            batch=args.batch,
            repeats=args.repeats,
            time_budget_s=args.time_budget,
            timeout_s=args.timeout,
            rounds=args.rounds,
            threads=args.threads,
            isa=args.isa,
            rounds_max_seq=args.rounds_max_seq,
            max_seq_len=max_seq,
            profile=args.profile_max_seq,
            name=f"{args.name}_{stack}",
            title=f"CPU attention, BERT-base sized, {stack} ({args.layers} layers)",
            notes=notes,
        )
        res["targets"] = check_targets(res, stack, args.isa)
        paths = write_results(res, args.out, f"{args.name}_{stack}")
        md = Path(paths["md"])
        md.write_text(md.read_text() + targets_markdown(res["targets"]))
        for row in res["targets"]:
            t = row["target"]
            print(
                f"target {t['stack']} S={t['seq_len']} {t['variant']}: "
                + (
                    "not measured"
                    if row["met"] is None and not row["checks"]
                    else "met"
                    if row["met"]
                    else "NOT met"
                    if row["met"] is False
                    else "incomplete"
                )
            )
        print("wrote", ", ".join(paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
