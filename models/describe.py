#!/usr/bin/env python
"""Describe how the attention blocks of the zoo's models look in their graphs.

    python models/describe.py                 # all models in models/manifest.json -> models/PATTERNS.md
    python models/describe.py a.onnx b.onnx   # print the description of those files

For each Softmax that feeds a MatMul (an attention block) it walks backward to
the Q·Kᵀ MatMul and from there to the Q/K projections, forward to the P·V
MatMul and the output reshape, and records every op on the way with its
attributes, the side inputs (scale constants and where they come from, masks
and biases with their runtime shapes and dtypes) and the ranks of the tensors.
Runtime shapes and values come from running the model once with
onnx.reference (intermediate results) on small feeds (batch 2, seq 7, decoder
seq 5, last row right-padded where the model takes a mask).
Blocks with the same skeleton are grouped; one of each group is shown.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter, OrderedDict
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

HERE = Path(__file__).resolve().parent

# ops a Softmax output may pass through on its way to the P·V MatMul
PASS_AFTER_SOFTMAX = {"Cast", "Where", "Dropout", "Identity"}
# ops on the scores path between Q·Kᵀ and Softmax
SCORE_OPS = {"Add", "Sub", "Mul", "Div", "Where", "Cast", "Reshape", "Identity", "Tanh", "Min", "Max", "Clip", "Expand"}
# ops walked through on the Q / K / V side, back towards the projections
QKV_OPS = {"Transpose", "Reshape", "Mul", "Div", "Cast", "Unsqueeze", "Squeeze", "Expand", "Identity", "Sqrt"}

DTYPES = {1: "float32", 6: "int32", 7: "int64", 9: "bool", 10: "float16", 11: "float64", 16: "bfloat16"}


def attention_softmaxes(m: onnx.ModelProto):
    """Softmax nodes whose output reaches input 0 of a MatMul (through Cast/Where/Dropout/Identity)."""
    g = Graph(m)
    return [n for n in m.graph.node if n.op_type == "Softmax" and g.pv_matmul(n) is not None]


class Graph:
    def __init__(self, m: onnx.ModelProto):
        self.m = m
        self.prod = {}
        self.cons = {}
        for n in m.graph.node:
            for o in n.output:
                self.prod[o] = n
            for i in n.input:
                if i:
                    self.cons.setdefault(i, []).append(n)
        self.inits = {i.name: i for i in m.graph.initializer}
        self.inputs = {i.name for i in m.graph.input}
        self.values = {}  # runtime values (name -> np.ndarray), filled by run()
        self.vi = {}
        for v in list(m.graph.value_info) + list(m.graph.input) + list(m.graph.output):
            self.vi[v.name] = v

    # -- constants ---------------------------------------------------------
    def const(self, name):
        if name in self.inits:
            return numpy_helper.to_array(self.inits[name])
        p = self.prod.get(name)
        if p is not None and p.op_type == "Constant":
            for a in p.attribute:
                if a.name == "value":
                    return numpy_helper.to_array(a.t)
                if a.name == "value_float":
                    return np.array(a.f, dtype=np.float32)
                if a.name == "value_int":
                    return np.array(a.i, dtype=np.int64)
                if a.name == "value_floats":
                    return np.array(list(a.floats), dtype=np.float32)
                if a.name == "value_ints":
                    return np.array(list(a.ints), dtype=np.int64)
        return None

    def is_weight(self, name):
        c = self.inits.get(name)
        return c is not None and len(c.dims) >= 2

    # -- structure -----------------------------------------------------------
    def pv_matmul(self, sm):
        """The MatMul that consumes the (guarded / cast) Softmax output as input 0."""
        frontier, seen = [sm.output[0]], set()
        while frontier:
            t = frontier.pop(0)
            for c in self.cons.get(t, []):
                if c.op_type == "MatMul" and c.input[0] == t:
                    return c
                if c.op_type in PASS_AFTER_SOFTMAX and c.name not in seen:
                    if c.op_type == "Where" and c.input[0] == t:
                        continue
                    seen.add(c.name)
                    frontier.extend(c.output)
        return None

    def reaches_qk(self, name, depth=8):
        """Does `name` come from a MatMul of two activations within `depth` score-path ops?"""
        p = self.prod.get(name)
        if p is None or depth == 0:
            return False
        if p.op_type == "MatMul":
            return not any(i in self.inits for i in p.input)
        if p.op_type not in SCORE_OPS:
            return False
        return any(self.reaches_qk(i, depth - 1) for i in p.input if i)

    # -- runtime ----------------------------------------------------------------
    def run(self, feeds):
        """Run once in ONNX Runtime with every typed intermediate tensor as an extra output."""
        import onnxruntime as ort

        m2 = onnx.ModelProto()
        m2.CopyFrom(self.m)
        have = {o.name for o in m2.graph.output}
        for n in m2.graph.node:
            for o in n.output:
                vi = self.vi.get(o)
                if o and o not in have and vi is not None and vi.type.tensor_type.elem_type:
                    m2.graph.output.append(helper.make_tensor_value_info(o, vi.type.tensor_type.elem_type, None))
                    have.add(o)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.log_severity_level = 3
        try:
            sess = ort.InferenceSession(m2.SerializeToString(), so, providers=["CPUExecutionProvider"])
            names = [o.name for o in sess.get_outputs()]
            self.values = dict(zip(names, sess.run(names, feeds)))
        except Exception as e:  # noqa: BLE001
            self.values = {}
            return f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        return None

    def shape(self, name):
        v = self.values.get(name)
        if v is not None:
            return list(np.shape(v))
        vi = self.vi.get(name)
        if vi is not None and vi.type.tensor_type.HasField("shape"):
            return [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
        c = self.const(name)
        return list(c.shape) if c is not None else None

    def symshape(self, name):
        vi = self.vi.get(name)
        if vi is not None and vi.type.tensor_type.HasField("shape"):
            return [
                d.dim_param or (d.dim_value if d.HasField("dim_value") else "?") for d in vi.type.tensor_type.shape.dim
            ]
        return None

    def dtype(self, name):
        v = self.values.get(name)
        if v is not None:
            return str(np.asarray(v).dtype)
        vi = self.vi.get(name)
        if vi is not None:
            return DTYPES.get(vi.type.tensor_type.elem_type, "?")
        c = self.const(name)
        return str(c.dtype) if c is not None else "?"


# -- formatting ------------------------------------------------------------------


def fmt_num(x):
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    x = float(x)
    if np.isinf(x) or np.isnan(x):
        return str(x)
    if x != 0 and (abs(x) < 1e-3 or abs(x) > 1e6):
        return f"{x:.6g}"
    return f"{x:.6g}"


def fmt_value(a):
    a = np.asarray(a)
    if a.size == 1:
        return fmt_num(a.reshape(-1)[0]) + ("" if a.ndim == 0 else f" (shape {list(a.shape)})")
    if a.size <= 6:
        return "[" + ", ".join(fmt_num(v) for v in a.reshape(-1)) + "]"
    return f"<{a.dtype} {list(a.shape)}>"


def attrs(n):
    out = []
    for a in n.attribute:
        if a.name in ("perm", "axes"):
            out.append(f"{a.name}={list(a.ints)}")
        elif a.name == "axis":
            out.append(f"axis={a.i}")
        elif a.name == "to":
            out.append(f"to={DTYPES.get(a.i, a.i)}")
        elif a.name in ("keepdims", "upper", "allowzero", "transA", "transB"):
            out.append(f"{a.name}={a.i}")
        elif a.name in ("alpha", "beta"):
            out.append(f"{a.name}={fmt_num(a.f)}")
    return ",".join(out)


def op_label(n):
    a = attrs(n)
    return f"{n.op_type}({a})" if a else n.op_type


def expr(g: Graph, name, depth=4, budget=None, alias=None):
    """Compact expression for a (side) tensor: constants by value, inputs by name."""
    if budget is None:
        budget = [40]
    if alias and name in alias:
        return alias[name]
    c = g.const(name)
    if c is not None:
        src = "init" if name in g.inits else "Constant"
        return f"{src} {fmt_value(c)}" if c.size <= 6 else f"{src}<{c.dtype}{list(c.shape)}>"
    if name in g.inputs:
        return f"input '{name}'"
    p = g.prod.get(name)
    if p is None:
        return f"?{name}"
    budget[0] -= 1
    if depth == 0 or budget[0] <= 0:
        return f"{p.op_type}(…)"
    args = [expr(g, i, depth - 1, budget, alias) if i else "∅" for i in p.input]
    return f"{op_label(p)}({', '.join(args)})"


def ops_upstream(g: Graph, name, limit=400):
    """Multiset of op types and the graph inputs whose values `name` depends on (Shape ends a walk)."""
    seen, ops, ins, stack = set(), Counter(), set(), [name]
    while stack and len(seen) < limit:
        t = stack.pop()
        if t in seen or not t:
            continue
        seen.add(t)
        if t in g.inputs:
            ins.add(t)
            continue
        p = g.prod.get(t)
        if p is None or t in g.inits:
            continue
        ops[p.op_type] += 1
        if p.op_type != "Shape":  # only the shape of its input matters: not a data dependency
            stack.extend(p.input)
    return ops, sorted(ins)


def tensor_desc(g: Graph, name):
    s = g.shape(name)
    return f"{g.dtype(name)}{s if s is not None else ''}"


def side_desc(g: Graph, name, role):
    """Describe a side input (scale, mask, bias) of a chain op."""
    c = g.const(name)
    if c is not None:
        where = "initializer" if name in g.inits else "Constant node"
        return f"{role} = {fmt_value(c)} ({where}, {c.dtype}{list(c.shape)})"
    v = g.values.get(name)
    shp = tensor_desc(g, name)
    sym = g.symshape(name)
    ops, ins = ops_upstream(g, name)
    if v is not None and np.size(v) == 1:
        val = fmt_num(np.asarray(v).reshape(-1)[0])
        return f"{role} = {val} at run time, {shp}, computed: {expr(g, name, depth=6)}"
    s = f"{role}: {shp}"
    if sym:
        s += f" (graph shape {sym})"
    if ins:
        s += f"; from inputs {ins}"
    if ops:
        s += "; built with " + ", ".join(f"{k}×{v}" if v > 1 else k for k, v in sorted(ops.items()))
    if v is not None and np.asarray(v).dtype.kind == "f":
        a = np.asarray(v)
        fin = a[np.isfinite(a)]
        lo = fmt_num(a.min())
        s += f"; values: min {lo}, max {fmt_num(a.max())}"
        if fin.size != a.size:
            s += " (has inf)"
    elif v is not None and np.asarray(v).dtype == bool:
        a = np.asarray(v)
        s += f"; {int(a.sum())}/{a.size} true"
    s += f"\n      expr: {expr(g, name, depth=3)}"
    return s


def walk_side(g: Graph, start, stop_at=None):
    """Walk back from an input of the Q·Kᵀ / P·V MatMul through reshapes/transposes/scales."""
    steps = []
    t = start
    while True:
        p = g.prod.get(t)
        if p is None:
            steps.append(("input" if t in g.inputs else "init", t, None))
            break
        if p.op_type not in QKV_OPS:
            steps.append(("stop", t, p))
            break
        main = p.input[0]
        sides = []
        if p.op_type in ("Mul", "Div"):
            a, b = p.input[0], p.input[1]
            ra, rb = len(g.shape(a) or []), len(g.shape(b) or [])
            if g.const(a) is not None or (np.size(g.values.get(a, np.zeros(2))) == 1 and ra < rb):
                main, sides = b, [a]
            else:
                main, sides = a, [b]
        elif p.op_type in ("Reshape", "Expand", "Unsqueeze", "Squeeze"):
            sides = []
        steps.append(("op", t, p, sides))
        t = main
    return steps


def scalar_of(g: Graph, name):
    c = g.const(name)
    v = c if c is not None else g.values.get(name)
    if v is not None and np.size(v) == 1:
        return float(np.asarray(v).reshape(-1)[0])
    return None


def scale_source(g: Graph, name):
    if name in g.inits:
        return "initializer"
    p = g.prod.get(name)
    if p is not None and p.op_type == "Constant":
        return "Constant node"
    return "computed: " + expr(g, name, depth=6)


def describe_side(g: Graph, label, start, info):
    steps = walk_side(g, start)
    parts = []
    for st in steps:
        if st[0] == "op":
            _, t, p, sides = st
            lab = op_label(p)
            if p.op_type in ("Mul", "Div"):
                for sd in sides:
                    v = scalar_of(g, sd)
                    if v is not None:
                        lab += f"[{'×' if p.op_type == 'Mul' else '÷'}{fmt_num(v)}]"
                        info["scales"].append((label, p.op_type, v, scale_source(g, sd), len(g.shape(t) or [])))
                    else:
                        info["notes"].append(side_desc(g, sd, f"{p.op_type} operand on {label} (not a scalar)"))
            parts.append(f"{lab} {tensor_desc(g, t)}")
        elif st[0] == "stop":
            _, t, p = st
            extra = ""
            if p.op_type in ("MatMul", "Gemm") and any(g.is_weight(i) for i in p.input):
                extra = " (projection)"
            elif p.op_type == "Add" and any(g.const(i) is not None for i in p.input):
                extra = " (projection bias)"
            elif p.op_type == "Add":
                kinds = sorted({g.prod[i].op_type for i in p.input if i in g.prod})
                extra = " of Mul+Mul (rotary: x*cos + rotate_half(x)*sin)" if kinds == ["Mul"] else ""
            parts.append(f"[{p.op_type}{extra} {tensor_desc(g, t)}]")
        else:
            parts.append(f"[{st[0]} '{st[1]}' {tensor_desc(g, st[1])}]")
    skel = "←".join(op_label(st[2]) for st in steps if st[0] == "op")
    return " ← ".join(parts), skel


def describe_block(g: Graph, sm):
    info = {"scales": [], "notes": []}
    axis = next((a.i for a in sm.attribute if a.name == "axis"), None)
    # --- scores path (backward from Softmax) ---
    chain = []
    t = sm.input[0]
    qk = None
    while True:
        p = g.prod.get(t)
        if p is None:
            break
        if p.op_type == "MatMul" and not any(i in g.inits for i in p.input):
            qk = p
            break
        if p.op_type not in SCORE_OPS:
            chain.append((p, t, [], "stop"))
            break
        ins = [i for i in p.input if i]
        if p.op_type == "Where":
            cand = [i for i in p.input[1:] if g.reaches_qk(i)]
            main = cand[0] if cand else p.input[1]
            sides = [i for i in p.input if i != main]
        elif len(ins) == 1 or p.op_type in ("Reshape", "Expand", "Cast", "Identity", "Tanh"):
            main, sides = p.input[0], list(ins[1:])
        else:
            cand = [i for i in ins if g.reaches_qk(i)]
            main = cand[0] if cand else ins[0]
            sides = [i for i in ins if i != main]
        chain.append((p, t, sides, "op"))
        t = main
    chain.reverse()
    if qk is None:
        return None
    q_desc, q_sk = describe_side(g, "Q", qk.input[0], info)
    k_desc, k_sk = describe_side(g, "K", qk.input[1], info)
    sk = [f"Q:{q_sk}", f"K:{k_sk}"]
    key = []  # grouping key: skeleton + side-input shapes
    steps = [f"MatMul(Q,Kᵀ) → {tensor_desc(g, qk.output[0])}"]
    masks = []
    for p, out, sides, kind in chain:
        if kind == "stop":
            steps.insert(0, f"[unexpected {p.op_type}]")
            continue
        lab = op_label(p)
        if p.op_type == "Where":
            cond = p.input[0]
            lab += f"[cond {tensor_desc(g, cond)}]"
            info["notes"].append(side_desc(g, cond, "Where condition on scores"))
            masks.append(("Where-cond", cond))
            for sd in sides:
                if sd != cond:
                    info["notes"].append(side_desc(g, sd, "Where fill value on scores"))
        else:
            for sd in sides:
                v = scalar_of(g, sd)
                if v is not None and p.op_type in ("Mul", "Div"):
                    lab += f"[{'×' if p.op_type == 'Mul' else '÷'}{fmt_num(v)}]"
                    info["scales"].append(("scores", p.op_type, v, scale_source(g, sd), len(g.shape(out) or [])))
                elif v is not None:
                    lab += f"[{fmt_num(v)}]"
                    info["notes"].append(side_desc(g, sd, f"{p.op_type} operand on scores"))
                elif p.op_type not in ("Reshape", "Expand"):
                    lab += f"[{tensor_desc(g, sd)}]"
                    info["notes"].append(side_desc(g, sd, f"{p.op_type} operand on scores"))
                    masks.append((p.op_type, sd))
        steps.append(f"{lab} → {tensor_desc(g, out)}")
        sk.append(op_label(p))
        key.append(str([(r, g.dtype(x), g.shape(x)) for r, x in masks]))
    steps.append(f"Softmax(axis={axis}) → {tensor_desc(g, sm.output[0])}")
    sk.append(f"Softmax(axis={axis})")
    # --- after softmax ---
    pv = g.pv_matmul(sm)
    t = sm.output[0]
    guard = None
    while True:
        nxt = [c for c in g.cons.get(t, []) if c.op_type in PASS_AFTER_SOFTMAX or c is pv]
        if not nxt or nxt[0] is pv:
            break
        c = nxt[0]
        lab = op_label(c)
        if c.op_type == "Where":
            al = {t: "P"}
            other = [i for i in c.input[1:] if i != t][0]
            guard = f"Where(cond = {expr(g, c.input[0], depth=3, alias=al)}, {expr(g, other, depth=2, alias=al)}, P)"
            lab += f"[cond = {expr(g, c.input[0], depth=3, alias=al)}; other = {expr(g, other, depth=2, alias=al)}]"
        steps.append(f"{lab} → {tensor_desc(g, c.output[0])}")
        sk.append(c.op_type)
        t = c.output[0]
    v_desc, v_sk = describe_side(g, "V", pv.input[1], info)
    steps.append(f"MatMul(P,V) → {tensor_desc(g, pv.output[0])}")
    sk.append(f"MatMul(P,V) V:{v_sk}")
    t = pv.output[0]
    for _ in range(3):
        cs = [c for c in g.cons.get(t, []) if c.op_type != "Shape"]
        if len(cs) != 1 or cs[0].op_type not in ("Transpose", "Reshape"):
            break
        steps.append(f"{op_label(cs[0])} → {tensor_desc(g, cs[0].output[0])}")
        sk.append(op_label(cs[0]))
        t = cs[0].output[0]

    lines = [
        "- scores: " + " → ".join(steps),
        f"- Q side (input A of Q·Kᵀ, walked back): {q_desc}",
        f"- K side (input B of Q·Kᵀ, walked back): {k_desc}",
        f"- V side (input B of P·V, walked back): {v_desc}",
        f"- ranks: Q·Kᵀ inputs {len(g.shape(qk.input[0]) or [])}D × {len(g.shape(qk.input[1]) or [])}D, "
        f"softmax input {len(g.shape(sm.input[0]) or [])}D, P·V output {len(g.shape(pv.output[0]) or [])}D",
    ]
    if info["scales"]:
        eff = 1.0
        for _, op, v, _, _ in info["scales"]:
            eff = eff * v if op == "Mul" else eff / v
        head_dim = (g.shape(qk.input[0]) or [0])[-1]
        ref = f" = 1/sqrt({head_dim})" if head_dim and abs(eff - head_dim**-0.5) < 1e-6 else ""
        lines.append(
            f"- effective scale: {fmt_num(eff)}{ref}; factors: "
            + "; ".join(f"{op} {fmt_num(v)} on {where} ({rank}D, {src})" for where, op, v, src, rank in info["scales"])
        )
    else:
        lines.append("- effective scale: 1 (no scalar Mul/Div on Q, K or the scores)")
    if masks:
        descs = []
        for r, x in masks:
            v = g.values.get(x)
            d = f"{r} {tensor_desc(g, x)}"
            if v is not None and np.asarray(v).dtype.kind == "f":
                mn = float(np.min(v))
                d += f" (min {fmt_num(mn)})"
            descs.append(d)
        lines.append("- mask/bias: " + "; ".join(descs))
    else:
        lines.append("- mask/bias: none")
    lines.append(f"- after Softmax: {guard if guard else 'no guard (a fully masked row stays whatever Softmax gives)'}")
    if info["notes"]:
        lines.append("- side inputs:")
        seen = set()
        for n in info["notes"]:
            if n not in seen:
                seen.add(n)
                lines.append("    - " + n)
    skeleton = " | ".join(sk)
    return {
        "lines": lines,
        "skeleton": skeleton,
        "key": skeleton + "#" + str(g.shape(qk.output[0])) + "#".join(key),
        "qk": qk.name,
        "pv": pv.name,
    }


def block_name(n):
    for p in n.metadata_props:
        if p.key == "namespace":
            mods = re.findall(r"/([\w.]+): ", p.value)
            if len(mods) >= 2:
                return f"{mods[-2]}/{n.name}"
    return n.name


PAST = 4  # cached tokens in the runs of decoders with a KV cache


def feeds_from_manifest(entry, batch=2, seq=7, dec_seq=5):
    rng = np.random.default_rng(0)
    dims = {"batch": batch, "seq": seq, "dec_seq": dec_seq}
    cache = entry.get("cache")
    if cache:  # the exporter's names for the lengths (dynamo picks its own): total = past + new
        dims.update(
            {cache["batch_dim"]: batch, cache["new_dim"]: seq, cache["past_dim"]: PAST, cache["total_dim"]: PAST + seq}
        )
    feeds = {}
    for inp in entry["inputs"]:
        shape = [dims.get(d, 7) if isinstance(d, str) else d for d in inp["shape"]]
        if inp["role"] == "use_cache_branch":
            a = np.array([True])
        elif inp["role"] == "attention_mask":
            a = np.ones(shape, dtype=np.int64)
            a[-1, shape[1] - 2 :] = 0
        elif inp["elem_type"] == "int64":
            a = rng.integers(inp.get("low", 0), inp.get("vocab_size", 100), size=shape, dtype=np.int64)
        else:
            a = rng.standard_normal(shape).astype(np.float32)
        feeds[inp["name"]] = a
    return feeds


def then_branch_inlined(m: onnx.ModelProto) -> onnx.ModelProto:
    """A merged decoder (one If in the main graph) as the model its then branch (with a cache)
    computes: the branch's nodes with the main graph's inputs, weights and outputs."""
    node = m.graph.node[0]
    branch = next(a.g for a in node.attribute if a.name == "then_branch")
    out = onnx.ModelProto()
    out.CopyFrom(m)
    del out.graph.node[:]
    out.graph.node.extend(branch.node)
    out.graph.node.extend(helper.make_node("Identity", [b.name], [o]) for b, o in zip(branch.output, node.output))
    return out


def describe_model(path: Path, entry=None):
    m = onnx.load(str(path))
    if len(m.graph.node) == 1 and m.graph.node[0].op_type == "If":
        m = then_branch_inlined(m)
    try:
        m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:  # noqa: BLE001
        pass
    g = Graph(m)
    err = None
    if entry is not None:
        err = g.run(feeds_from_manifest(entry))
    sms = [n for n in m.graph.node if n.op_type == "Softmax" and g.pv_matmul(n) is not None]
    groups = OrderedDict()
    for sm in sms:
        d = describe_block(g, sm)
        if d is None:
            d = {"lines": ["- (no Q·Kᵀ MatMul found behind this Softmax)"], "skeleton": "?"}
        groups.setdefault(d.get("key", d["skeleton"]), []).append((sm, d))
    out = []
    title = path.name
    if entry is not None:
        title += (
            f" — {entry['arch']}, {entry['exporter']}, attn={entry['attn_impl']}, opset {entry['opset']}, "
            f"{len(sms)} blocks, heads {entry['num_heads']}/{entry['kv_heads']} kv, head_dim {entry['head_dim']}"
        )
    out.append(f"### {title}\n")
    if entry is not None:
        out.append(
            "Inputs: "
            + ", ".join(f"`{i['name']}` {i['elem_type']}{i['shape']}" for i in entry["inputs"])
            + (
                "  (runtime shapes below: batch 2, seq 7, dec_seq 5, last row's 2 last tokens padded"
                + (f"; {PAST} cached tokens, mask over {PAST} + 7" if entry.get("cache") else "")
                + ("; the If's then branch (with a cache) shown" if entry.get("arch") == "llama_merged" else "")
                + ")"
                if not err
                else f"  (could not run onnx.reference: {err})"
            )
            + "\n"
        )
    ops = Counter(n.op_type for n in m.graph.node)
    out.append("Graph op counts: " + ", ".join(f"{k} {v}" for k, v in sorted(ops.items())) + "\n")
    for i, blocks in enumerate(groups.values()):
        names = ", ".join(f"`{block_name(sm)}`" for sm, _ in blocks)
        out.append(f"**Pattern {chr(65 + i)}** — {len(blocks)} block(s): {names}\n")
        out.extend(blocks[0][1]["lines"])
        out.append("")
    return "\n".join(out), list(dict.fromkeys(b[0][1]["skeleton"] for b in groups.values()))


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    files = [Path(a) for a in argv if a.endswith(".onnx")]
    if files:
        for f in files:
            print(describe_model(f)[0])
        return
    zoo = Path(argv[0]) if argv else HERE
    man = json.loads((zoo / "manifest.json").read_text())
    parts = [
        "# Attention patterns in the zoo\n",
        "Generated by `python models/describe.py` from `models/manifest.json` (rerun after "
        "`python models/generate.py`). For each model, the blocks are grouped by skeleton and one block of "
        "each group is spelled out: the scores path from Q·Kᵀ to the P·V MatMul (`→` in data-flow order), "
        "the Q/K/V sides walked back from the MatMuls (`←`, back towards the projections), and the side inputs "
        "(scales, masks, biases) with their dtype, runtime shape [batch 2, seq 7, dec_seq 5] and where they come "
        "from. `[×c]`/`[÷c]` mark scalar scales; `expr:` shows a side input's producer expression (depth-limited).\n",
        SUMMARY_PLACEHOLDER,
    ]
    skel_index = OrderedDict()
    for e in man["models"]:
        text, skels = describe_model(zoo / e["file"], e)
        parts.append(text)
        for s in skels:
            skel_index.setdefault(s, []).append(e["file"])
    summary = [
        "## Distinct block skeletons\n",
        "One line per distinct skeleton (Q-side ops, K-side ops, score ops, softmax axis, ops between "
        "Softmax and P·V, V-side ops, output ops) and the files that have it.\n",
    ]
    for i, (s, files) in enumerate(skel_index.items()):
        summary.append(f"{i + 1}. `{s}`  \n   {', '.join(files)}")
    summary.append("")
    v = man.get("versions", {})
    if all(v.get(k) == val for k, val in NOTES_VERSIONS.items()):
        summary = [NOTES] + summary
    else:
        summary = [
            f"(The hand-written summary in describe.py was written for {NOTES_VERSIONS}; these models "
            f"were made with {v}: re-read the blocks below.)\n"
        ] + summary
    text = "\n".join(parts).replace(SUMMARY_PLACEHOLDER, "\n".join(summary))
    (zoo / "PATTERNS.md").write_text(text)
    print(f"wrote {zoo / 'PATTERNS.md'} ({len(man['models'])} models, {len(skel_index)} distinct skeletons)")


SUMMARY_PLACEHOLDER = "@@SUMMARY@@"

NOTES_VERSIONS = {"torch": "2.13.0+cpu", "transformers": "5.24.0"}
NOTES = """## Summary of the distinct patterns (hand-written; torch 2.13.0, transformers 5.24.0)

Common to all models (1-6: the 28 of the first zoo): every block is 4D: Q `[B,Hq,Sq,D]` · Kᵀ `[B,Hq,D,Sk]` → scores `[B,Hq,Sq,Sk]`,
`Softmax(axis=-1)`, P·V `[B,Hq,Sq,D]`, then `Transpose(0,2,1,3)` → `Reshape [B,Sq,Hq*D]` (GPT-2 dynamo:
Reshape straight to 2D `[B*S, 64]` for the Gemm). Q/K/V come from a projection (MatMul + bias Add, GPT-2: one
Gemm + Split, T5: MatMul without bias, Whisper: k_proj without bias) → `Reshape [B,S,H,D]` →
`Transpose(0,2,1,3)`. No Div-based scaling anywhere (transformers 5 multiplies by `scaling`), no Trilu, no
3D attention. Scale constants are always folded by the exporters: an initializer (dynamo) or a Constant node
(TorchScript), never a Shape→Sqrt computation at run time (head_dim is static). The mask subgraphs (built
from `attention_mask` by transformers' masking_utils with Range / GreaterOrEqual / LessOrEqual / And /
GatherND / Where…) are computed once and shared by all the blocks of a stack.

1. **eager, both exporters** (BERT, GPT-2, ViT, BART, Llama, T5, Whisper): K is transposed in one
   `Transpose(perm=[0,2,3,1])` straight from `[B,S,H,D]` (Llama: `[0,1,3,2]`, since rotary runs on
   `[B,H,S,D]`); `MatMul → Mul(scalar 1/sqrt(D) = 0.176777) → Add(mask) → Softmax → MatMul`. The mask is
   float `[B,1,Sq,Sk]`, `Where(bool, 0, -3.40282e38)` (finite fill: a fully masked row gives the uniform
   average of V, same as PyTorch). No guard after Softmax. TorchScript adds no-op `Cast(to=float32)` after
   Softmax (GPT-2 one, ViT and Llama two). ViT: TorchScript has no mask at all, dynamo adds an all-zeros
   float mask `[B,1,17,17]` built from a constant.
2. **sdpa + dynamo** (torch's SDPA decomposition): the scale is split, `Mul(sqrt(scale) = 0.420448)` on Q
   and on K, not on the scores. Kᵀ is built through 3D: `Reshape [B*H,S,D] → Transpose(perm=[0,2,1]) →
   Reshape [B,H,D,S]`, then the Mul. A bool mask becomes `Where(mask, 0, -3.40282e38)` → `Add`, and the
   Softmax is followed by `Where(IsNaN(P), 0, P)` — dead code with a finite fill: **a fully masked row
   yields the uniform average of V, while PyTorch's SDPA yields 0** (manifest `fully_masked_row`:
   differs for bert/gpt2/bart/llama sdpa dynamo). Float masks (T5) get no guard; no mask (Whisper
   encoder/cross) gets neither Add nor guard. Whisper dynamo has an extra no-op `Reshape` after P·V.
3. **sdpa + TorchScript** (the exporter's SDPA symbolic): `Mul(sqrt(scale))` on Q (after its Transpose) and
   on K (after `Transpose(0,2,3,1)`); bool mask → `Where(mask, 0, -inf)` (Constant of shape [1]) → `Add`;
   `Where(IsNaN(P), 0, P)` after Softmax, so a fully masked row yields 0 (= PyTorch). Extra no-op
   `Reshape` (4D → 4D) between P·V and the output Transpose. ViT: no mask, no guard.
4. **T5** (relative position bias, no 1/√d): eager dynamo has no scale op at all; eager TorchScript keeps a
   `Mul ×1` on the scores; sdpa TorchScript `Mul ×1` on Q and K. Eager: two Adds, first the position
   bias `[1,H,Sq,Sk]` (`Gather` from the `[32 buckets, H]` table → Transpose(2,0,1) → Unsqueeze; in
   cross-attention an all-zeros bias from Expand / ConstantOfShape), then the mask `[B,1,Sq,Sk]`. sdpa:
   one float mask `[B,H,Sq,Sk]` (`[1,H,..]` for the decoder self-attention, which gets no decoder mask) =
   `Where(bool_mask, bias, -3.40282e38)`, one Add, no
   guard. The bias is computed once per stack and shared by both encoder layers.
5. **Whisper**: Q is pre-scaled by 0.176777 on the 3D projection output `[B,S,64]`, *before* the head
   Reshape; the attention itself then has scale 1 (eager TorchScript: `Mul ×1` on scores; sdpa TorchScript:
   `Mul ×1` on Q and K; dynamo: nothing). Encoder self and cross attention have no mask. The decoder causal
   mask comes from transformers' packed-sequence path (no decoder mask given): CumSum / Equal / GatherND
   on position ids, combined with the causal LessOrEqual.
6. **Llama (GQA)**: Q/K come from the rotary `Add(Mul(x, cos), Mul(rotate_half(x), sin))` on
   `[B,H,S,D]`; K and V are repeated for GQA by `Unsqueeze(2) → Expand [B,Hkv,n_rep,S,D] → Reshape
   [B,Hq,S,D]` before the MatMuls (also under sdpa: transformers' repeat_kv, not SDPA's enable_gqa).
   Causal + padding mask `[B,1,S,S]`.

7. **GPT-Neo** (eager only): no scale; the causal `Where(tril, s, lowest)` comes *before* the
   `Add` of the padding bias (the other decoders add the combined bias first).
8. **Decoders with a KV cache** (`*_cache_*`, `llama_merged`): K and V are `Concat(past, new, axis=-2)`
   in `[B,Hkv,S,D]`, read by the attention (Llama/Qwen2/Mistral: through repeat_kv) and returned as
   `present.{i}.*`; the mask is `[B,1,S,past+S]`, built from `cache_position` (past length from the
   past inputs' shape). `llama_merged` is an `If` whose branches hold the with-cache and no-cache
   graphs (the no-cache branch's "append" is a one-input Concat).
9. **bert_shapeless**: the BERT TorchScript export at opset 12 without value_info; `Softmax(axis=3)`.

Effective scale = product of every scalar Mul (÷ Div) on the Q path (down to the projection, through the
head Reshape/Transpose), the K path and the scores; the per-block lines below list each factor.
"""


if __name__ == "__main__":
    main()
