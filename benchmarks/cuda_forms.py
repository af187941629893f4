"""The `cuda` target's forms as users run them on ONNX Runtime's CUDA EP: one attention block of an
export (B=1, H=16), lowered, after ORT's own graph optimizer (its default, ORT_ENABLE_ALL), with the
sequence dim a number (``static``, one model per length) and a name (``symbolic``), against the
original block and PyTorch's scaled_dot_product_attention with its DEFAULT backend choice (the
backend that ran is recorded). Three steps, as the other CUDA scripts:

    python benchmarks/cuda_forms.py make build/cuda_run/forms      # here: the models (no weights)
    bash benchmarks/cuda_gpu_run.sh install forms                  # GPU machine (onnxruntime-gpu, torch)
    python benchmarks/cuda_forms.py table OUT/cuda_forms.json      # here: the .md

Blocks (no projections: the inputs are the projections' outputs q, k, v [B, S, H·D], reshaped and
transposed as exporters write them): ``causal`` (ONNX Attention-23 with is_causal, opset 23: the
fused block is causal with nothing else masking it), ``padding`` (a [B, 1, 1, S] bias from an
attention_mask, a quarter of the keys padded), ``causal_mask`` (an exported causal mask, [S, S],
lowest fill), ``nomask``, ``causal_padding`` (Hugging Face's decoder mask, And(j <= i, attention_mask[j]) as
0 / -inf [B, 1, S, S]: the fused block is causal with a padding part); head dims 64 and 128; float16, and float32 (item 3: TF32 on and off).

Variants: ``original``; ``cuda`` (the target's own choice); the forms the target can write for a
block, each forced (``cuda:<form>``); ``onnx`` (the onnx target: Attention-23). The static padding
block also runs at each ORT optimization level and is profiled per node (where the time goes).
Each length's variants run in one process, alternating rounds, inputs and outputs bound on the GPU;
the output is checked against the original's on the same EP (float16 2e-3 + 2e-2·|e|).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuda_capabilities as caps  # noqa: E402 - the bound timing, the SDPA peer and its backend
import ep_probe  # noqa: E402

HEADS = 16
LENGTHS = (1024, 2048, 4096, 16384)
F32_LENGTHS = (1024, 4096)
HEAD_DIMS = (64, 128)
STACKS = ("causal", "padding", "causal_mask", "nomask", "causal_padding")
CAUSAL_FORMS = ("gqa", "mha_causal", "attn23_causal_bsd", "mha_bias")
# causal_padding: the cuda target's form since issue 31 round 4 (the own causal mask, the padding part in
# attention_bias) and the one before it (the causal bias + the masked-rows guard), side by side
CAUSAL_PADDING_FORMS = ("mha_causal_padding", "mha_bias")
LEVELS = ("DISABLE_ALL", "BASIC", "EXTENDED", "ALL")
# the CUDA EP's sdpa_kernel option (a bit mask of its attention backends: 1 flash, 2 memory-efficient,
# 8 cuDNN flash, 16 math), tried on the static padding block to tell which kernel the time goes with
SDPA_KERNELS = ("1", "2", "8", "16")
ROUNDS = 3
REPEATS = 10
ORIGINAL_UP_TO = 4096  # the unfused float16 graph is refused at 16384 (cuda_capabilities.md)
DIAG_LENGTH = 4096  # the static padding block of the issue (44-58 ms instead of 0.53)


def stem(stack: str, d: int, dtype: str, s: int | None) -> str:
    return f"{stack}_d{d}_{dtype}_{'sym' if s is None else f's{s}'}"


def block(stack: str, d: int, dtype: str, s: int | None) -> Any:
    """One exported attention block over q, k, v [1, S, H·D] (S a number, or the name "seq")."""
    from onnx import TensorProto, helper, numpy_helper

    elem = TensorProto.FLOAT16 if dtype == "float16" else TensorProto.FLOAT
    np_dt = np.float16 if dtype == "float16" else np.float32
    hidden = HEADS * d
    seq: int | str = "seq" if s is None else s
    inits = [
        numpy_helper.from_array(np.array(x, t), n)
        for n, x, t in (
            ("one", 1.0, np_dt),
            ("lowest", np.finfo(np_dt).min, np_dt),
            ("neg_inf", -np.inf, np_dt),
            ("zero_f", 0.0, np_dt),
            ("sqrt_d", math.sqrt(d), np_dt),
            ("axes_12", [1, 2], np.int64),
            ("shape_bshd", [0, 0, HEADS, d], np.int64),
            ("shape_bsh", [0, 0, hidden], np.int64),
            ("zero_i", 0, np.int64),
            ("one_i", 1, np.int64),
            ("axis_0", [0], np.int64),
            ("axis_1", [1], np.int64),
            ("axes_012", [0, 1, 2], np.int64),
            ("axes_013", [0, 1, 3], np.int64),
        )
    ]
    nodes: list[Any] = []

    def node(op: str, ins: list[str], out: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    # causal_padding's batch is a name: the causal proof reads the mask's batch axis as an index (a static
    # batch of 1 is read at 0, not proved the mask's own index); it runs at batch 1
    batch: int | str = "batch" if stack == "causal_padding" else 1
    inputs = [helper.make_tensor_value_info(n, elem, [batch, seq, hidden]) for n in ("q3", "k3", "v3")]
    mask = None
    if stack == "causal_padding":
        inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [batch, seq]))
    if stack == "padding":
        inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, seq]))
        m = node("Cast", ["attention_mask"], "mask_float", to=elem)
        m = node("Mul", [node("Sub", ["one", m], "mask_inverted"), "lowest"], "mask_bias")
        mask = node("Unsqueeze", [m, "axes_12"], "mask_bias_4d")
    if stack == "causal_mask":
        length = node("Gather", [node("Shape", ["q3"], "q_shape"), "one_i"], "seq_len", axis=0)
        positions = node("Range", ["zero_i", length, "one_i"], "positions")
        future = node(
            "Greater",
            [
                node("Unsqueeze", [positions, "axis_0"], "key_pos"),
                node("Unsqueeze", [positions, "axis_1"], "query_pos"),
            ],
            "future",
        )
        mask = node("Where", [future, "lowest", "zero_f"], "causal_bias")
    if stack == "causal_padding":  # Hugging Face's masking_utils: And(j <= i, attention_mask[j]) -> 0 / -inf
        mask_len = node("Shape", ["attention_mask"], "mask_len", start=1, end=2)
        length = node("Squeeze", [mask_len, "axis_0"], "seq_len")
        positions = node("Range", ["zero_i", length, "one_i"], "positions")
        key_pos = node("Unsqueeze", [positions, "axes_012"], "key_pos")  # [1, 1, 1, S]: j
        query_pos = node("Unsqueeze", [positions, "axes_013"], "query_pos")  # [1, 1, S, 1]: i
        seen = node("LessOrEqual", [key_pos, query_pos], "seen")
        kept = node("Unsqueeze", [node("Cast", ["attention_mask"], "kept_b", to=TensorProto.BOOL), "axes_12"], "kept")
        # filled with -inf: a finite fill with a padding part is not proved causal (fusion/causal/finite_fill)
        mask = node("Where", [node("And", [seen, kept], "visible"), "zero_f", "neg_inf"], "causal_padding_bias")
    if stack == "causal":
        node("Attention", ["q3", "k3", "v3"], "o", q_num_heads=HEADS, kv_num_heads=HEADS, is_causal=1)
    else:
        q = node("Transpose", [node("Reshape", ["q3", "shape_bshd"], "q_bshd")], "q_bhsd", perm=[0, 2, 1, 3])
        kt = node("Transpose", [node("Reshape", ["k3", "shape_bshd"], "k_bshd")], "k_bhds", perm=[0, 2, 3, 1])
        v = node("Transpose", [node("Reshape", ["v3", "shape_bshd"], "v_bshd")], "v_bhsd", perm=[0, 2, 1, 3])
        scores = node("Div", [node("MatMul", [q, kt], "scores"), "sqrt_d"], "scores_scaled")
        if mask is not None:
            scores = node("Add", [scores, mask], "scores_masked")
        ctx = node("MatMul", [node("Softmax", [scores], "probs", axis=-1), v], "context")
        node("Reshape", [node("Transpose", [ctx], "context_bshd", perm=[0, 2, 1, 3]), "shape_bsh"], "o")
    graph = helper.make_graph(
        nodes,
        f"block_{stack}",
        inputs,
        [helper.make_tensor_value_info("o", elem, [batch, seq, hidden])],
        [t for t in inits if any(t.name in n.input for n in nodes)],
    )
    opset = 23 if stack == "causal" else 18
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def lowered_variants(model: Any, stack: str, symbolic: bool = False) -> dict[str, tuple[Any, str]]:
    """variant -> (model, note): the cuda target's choice, each form it may write forced, the onnx target;
    for a symbolic block also ``ep_cuda_if``, what --ep cuda writes with the length If allowed on the
    CUDA EP (forms.LOWERED_DISPATCH_EPS forced): the lowered form from the table's crossover, the
    original ops below it, decided per run."""
    import ortflash
    from ortflash.lowering import cuda, lower

    fused, report = ortflash.optimize(model, target="ortflash")
    if report.fused != 1:
        raise SystemExit(f"{stack}: {report.fused} blocks fused, not 1")
    out: dict[str, tuple[Any, str]] = {}
    low, notes = lower(fused, "cuda")
    out["cuda"] = (low, notes[0].reason)
    ep_model, _ = ortflash.optimize(model, ep="cuda")  # what --ep cuda writes: a lowered form or the ops kept
    attention_ops = {"MultiHeadAttention", "GroupQueryAttention", "Attention", "Softmax"}
    out["ep_cuda"] = (
        ep_model,
        "--ep cuda: " + ",".join(sorted(attention_ops & {n.op_type for n in ep_model.graph.node})),
    )
    if symbolic:
        if_model, if_report = ep_probe.optimized_with_gpu_if(model, "cuda")
        if any(n.op_type == "If" for n in if_model.graph.node):
            out["ep_cuda_if"] = (if_model, "--ep cuda with the length If: " + if_report.blocks[0].reason)
    forced = {
        "causal": CAUSAL_FORMS,
        "causal_mask": tuple(f for f in CAUSAL_FORMS if f != "attn23_causal_bsd"),  # opset 18: no Attention-23
        "causal_padding": CAUSAL_PADDING_FORMS,
    }.get(stack, ())
    if forced:
        choose = cuda.choose_form
        try:
            for form in forced:
                cuda.choose_form = lambda call, dims, half, opset, f=form: (f, f"{f}, forced")  # type: ignore[assignment]
                low, notes = lower(fused, "cuda")
                out[f"cuda:{form}"] = (low, notes[0].reason)
        finally:
            cuda.choose_form = choose  # type: ignore[assignment]
    for target in ("onnx", "contrib"):
        low, notes = lower(fused, target)
        out[target] = (low, notes[0].reason)
    return out


def make(
    folder: str,
    dtypes: tuple[str, ...] = ("float16", "float32"),
    lengths: tuple[int, ...] = LENGTHS,
    cliff: bool = True,
    stacks: tuple[str, ...] = STACKS,
    static: bool = True,
) -> None:
    """The blocks in ``dtypes``; float16 ones static at each of ``lengths`` (unless ``static`` is
    False) and symbolic (run at each of them); float32 symbolic only (at F32_LENGTHS); with
    ``cliff``, make_cliff's cases."""
    import onnx

    os.makedirs(folder, exist_ok=True)
    index = []
    for dtype in dtypes:
        for stack in stacks:
            for d in HEAD_DIMS if dtype == "float16" else (64,):
                for s in (None, *(lengths if dtype == "float16" and static else ())):
                    name = stem(stack, d, dtype, s)
                    original = block(stack, d, dtype, s)
                    onnx.save(original, os.path.join(folder, f"{name}.original.onnx"))
                    variants = lowered_variants(original, stack, symbolic=s is None)
                    for variant, (model, _note) in variants.items():
                        onnx.save(model, os.path.join(folder, f"{name}.{variant.replace(':', '-')}.onnx"))
                    index.append(
                        {
                            "stem": name,
                            "stack": stack,
                            "head_dim": d,
                            "dtype": dtype,
                            "static": s,
                            "lengths": [s] if s else list(lengths if dtype == "float16" else F32_LENGTHS),
                            "variants": ["original", *variants],
                            "notes": {v: n for v, (_, n) in variants.items()},
                        }
                    )
                    print(name, list(variants), flush=True)
    json.dump(index, open(os.path.join(folder, "index.json"), "w"), indent=1)
    if cliff:
        make_cliff(folder)


# The other shapes a static padding block comes in (the issue's 44-58 ms was not seen on the blocks
# above): the probe's unfused block with the bias fed whole [1, 1, S, S] (cuda_capabilities.py),
# the block at batch 2, and cpu_attention.py's one-layer stack with its projections (weights rounded
# to multiples of 1/64 so that they pack small); each static and symbolic, S=4096, float16, D=64.
CLIFF_SEQ = 4096
CLIFF_TARGETS = ("cuda", "onnx", "contrib")


def _symbolic(model: Any) -> Any:
    """model with its graph inputs' and outputs' batch dim named "batch" and sequence dims "seq"."""
    for value in list(model.graph.input) + list(model.graph.output):
        for i, dim in enumerate(value.type.tensor_type.shape.dim):
            if i == 0:
                dim.dim_param = "batch"
            elif dim.dim_value == CLIFF_SEQ:
                dim.dim_param = "seq"
    return model


def cliff_models() -> dict[str, Any]:
    """name -> original model of each cliff case (static; the symbolic one is _symbolic of it)."""
    import crossover_gpu as xg
    import onnx
    from onnx import numpy_helper

    case = caps.Case("padding", "float16", 64, CLIFF_SEQ, 1, HEADS)
    fed = caps.build("unfused", case)
    two = block("padding", 64, "float16", CLIFF_SEQ)
    for value in list(two.graph.input) + list(two.graph.output):
        value.type.tensor_type.shape.dim[0].dim_value = 2
    import cpu_attention

    stack = cpu_attention.build_model(layers=1, stack="padding", heads=HEADS, head_dim=64)
    for t in stack.graph.initializer:
        a = numpy_helper.to_array(t)
        if a.size > 1024:
            t.CopyFrom(numpy_helper.from_array((np.round(a * 64) / 64).astype(a.dtype), t.name))
    stack = xg._as_float16(stack)
    for value in list(stack.graph.input) + list(stack.graph.output):
        value.type.tensor_type.shape.dim[0].dim_value = 1
        value.type.tensor_type.shape.dim[1].dim_value = CLIFF_SEQ
    onnx.checker.check_model(stack)
    return {"cliff_fedbias": fed, "cliff_batch2": two, "cliff_stack": stack}


def make_cliff(folder: str) -> None:
    import onnx

    import ortflash
    from ortflash.lowering import lower

    index = []
    for name, static in cliff_models().items():
        for shape, model in (
            ("static", static),
            ("symbolic", _symbolic(onnx.ModelProto.FromString(static.SerializeToString()))),
        ):
            fused, report = ortflash.optimize(model, target="ortflash")
            onnx.save(model, os.path.join(folder, f"{name}_{shape}.original.onnx"))
            for target in CLIFF_TARGETS:
                low, notes = lower(fused, target)
                onnx.save(low, os.path.join(folder, f"{name}_{shape}.{target}.onnx"))
                if target == "cuda" and name == "cliff_fedbias":
                    for variant, patched in _bias_variants(low).items():
                        onnx.save(patched, os.path.join(folder, f"{name}_{shape}.{variant}.onnx"))
            index.append(
                {
                    "name": name,
                    "shape": shape,
                    "batch": batch_of(static),
                    "fused": report.fused,
                    "notes": [n.reason for n in notes],
                }
            )
            print(name, shape, report.fused, [n.op for n in notes], flush=True)
    json.dump(index, open(os.path.join(folder, "cliff.json"), "w"), indent=1)


def _bias_variants(low: Any) -> dict[str, Any]:
    """The lowered fed-bias block with MultiHeadAttention's attention_bias as ORT's optimizer leaves
    it on a static model (the graph input itself: ``cuda_direct``), and with the float32 bias
    passed through Where(bias == lowest, next float up, bias) before its Cast to float16, an op
    ORT does not remove (``cuda_where``; the same float16 values: both become -inf)."""
    import onnx
    from onnx import helper, numpy_helper

    out = {}
    for variant in ("cuda_direct", "cuda_where"):
        m = onnx.ModelProto.FromString(low.SerializeToString())
        prod = {o: n for n in m.graph.node for o in n.output}
        mha = next(n for n in m.graph.node if n.op_type == "MultiHeadAttention")
        expand = prod[mha.input[5]]
        to16 = prod[expand.input[0]]
        to32 = prod[to16.input[0]]
        if variant == "cuda_direct":
            mha.input[5] = to32.input[0]
        else:
            low32 = np.finfo(np.float32).min
            m.graph.initializer.extend(
                [
                    numpy_helper.from_array(np.array(low32, np.float32), "cliff_lowest"),
                    numpy_helper.from_array(np.nextafter(np.float32(low32), np.float32(0)), "cliff_above"),
                ]
            )
            src = to16.input[0]
            eq = helper.make_node("Equal", [src, "cliff_lowest"], ["cliff_is_lowest"])
            wh = helper.make_node("Where", ["cliff_is_lowest", "cliff_above", src], ["cliff_bias32"])
            to16.input[0] = "cliff_bias32"
            nodes = list(m.graph.node)
            at = nodes.index(to16)
            m.graph.ClearField("node")
            m.graph.node.extend(nodes[:at] + [eq, wh] + nodes[at:])
        out[variant] = m
    return out


def batch_of(model: Any) -> int:
    """The batch a cliff case runs at: its static model's first input dim (the symbolic twin names it)."""
    return int(model.graph.input[0].type.tensor_type.shape.dim[0].dim_value)


def cliff_feeds(sess: Any, batch: int) -> dict[str, np.ndarray]:
    """Inputs for a cliff model from its own input list, at the case's batch (a symbolic batch dim is
    fed as the static twin's, not as 1: that fed the symbolic batch-2 block at batch 1, a false
    "static batch-2 cliff"); a quarter of the keys padded."""
    rng = np.random.default_rng(7)
    out: dict[str, np.ndarray] = {}
    for i in sess.get_inputs():
        if isinstance(i.shape[0], int) and i.shape[0] != batch:
            raise ValueError(f"{i.name}: batch {i.shape[0]} in the model, {batch} asked for")
        if i.name in ("q", "k", "v"):
            out[i.name] = rng.standard_normal((batch, HEADS, CLIFF_SEQ, 64), dtype=np.float32).astype(np.float16)
        elif i.name == "bias":
            keep = np.ones((1, 1, CLIFF_SEQ, CLIFF_SEQ), bool)
            keep[..., CLIFF_SEQ - CLIFF_SEQ // 4 :] = False
            out["bias"] = np.where(keep, 0.0, np.finfo(np.float16).min).astype(np.float16)
        elif i.name == "attention_mask":
            mask = np.ones((batch, CLIFF_SEQ), np.int64)
            mask[:, CLIFF_SEQ - CLIFF_SEQ // 4 :] = 0
            out[i.name] = mask
        else:  # q3 / k3 / v3 / hidden_states [B, S, hidden]
            out[i.name] = rng.standard_normal((batch, CLIFF_SEQ, i.shape[-1]), dtype=np.float32).astype(np.float16)
    return out


def run_cliff(ort: Any, folder: str, out_dir: str | None = None) -> list[dict[str, Any]]:
    """Each cliff model, original and cuda, at ORT_ENABLE_ALL and ORT_DISABLE_ALL: first run (session
    start's kernels and plans included) and the median bound ms; the lowered one's slowest nodes."""
    rows = []
    if not os.path.exists(os.path.join(folder, "cliff.json")):
        return rows
    for entry in json.load(open(os.path.join(folder, "cliff.json"))):
        for level in LEVELS[::-1]:
            extra = ("cuda_direct", "cuda_where") if entry["name"] == "cliff_fedbias" else ()
            for variant in ("original", *CLIFF_TARGETS, *extra):
                path = os.path.join(folder, f"{entry['name']}_{entry['shape']}.{variant}.onnx")
                row: dict[str, Any] = {
                    "name": entry["name"],
                    "shape": entry["shape"],
                    "level": level,
                    "variant": variant,
                }
                try:
                    sess = session(ort, path, True, level)
                    own = cliff_feeds(sess, entry["batch"])
                    t0 = time.perf_counter()
                    with caps.captured_stdout() as lines:
                        sess.run(None, own)
                    row["first_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
                    row["kernels"] = caps.kernels_from(lines)
                    once = caps.timed_call(sess, caps.bind_on_gpu(ort, sess, own))
                    row["ms"] = round(statistics.median(once() for _ in range(REPEATS)), 4)
                    if variant == "cuda" and level == "ALL" and entry["name"] == "cliff_fedbias" and out_dir:
                        # the graph ORT runs after its optimizer, to read beside the symbolic one's
                        so = ep_probe.session_options(ort, None)
                        so.optimized_model_filepath = os.path.join(out_dir, f"optimized_{entry['shape']}.onnx")
                        ort.InferenceSession(path, so, providers=[("CUDAExecutionProvider", caps.cuda_options(True))])
                except Exception as exc:  # noqa: BLE001 - recorded
                    row["error"] = str(exc).splitlines()[0][:200]
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


# ------------------------------------------------------------------------------------------------
# run (onnxruntime-gpu, numpy, torch)


def feeds(stack: str, d: int, dtype: str, s: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(s + d)
    found = {n: rng.standard_normal((1, s, HEADS * d), dtype=np.float32).astype(dtype) for n in ("q3", "k3", "v3")}
    if stack in ("padding", "causal_padding"):
        mask = np.ones((1, s), np.int64)
        mask[0, s - s // 4 :] = 0
        found["attention_mask"] = mask
    return found


def session(ort: Any, path: str, tf32: bool, level: str = "ALL", profile: str | None = None) -> Any:
    """A CUDA EP session at ORT optimization level (LEVELS), failing where the EP did not take it."""
    so = ep_probe.session_options(ort, profile)
    so.graph_optimization_level = {
        "DISABLE_ALL": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "BASIC": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "EXTENDED": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "ALL": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]
    providers = [("CUDAExecutionProvider", caps.cuda_options(tf32)), "CPUExecutionProvider"]
    sess = ort.InferenceSession(path, so, providers=providers)
    if sess.get_providers()[0] != "CUDAExecutionProvider":
        raise SystemExit(f"the CUDA EP did not take {path}")
    return sess


def node_profile(ort: Any, path: str, own: dict[str, np.ndarray], tf32: bool) -> list[dict[str, Any]]:
    """The nodes ORT ran (after its optimizer), their EP and median kernel µs over 5 runs, slowest first."""
    sess = session(ort, path, tf32, profile=path[:-5] + ".prof")
    for _ in range(6):
        sess.run(None, own)
    prof = sess.end_profiling()
    events = json.load(open(prof))
    os.remove(prof)
    by: dict[str, dict[str, Any]] = {}
    for ev in events:
        a = ev.get("args", {})
        if ev.get("cat") == "Node" and ev.get("name", "").endswith("_kernel_time"):
            n = by.setdefault(
                ev["name"][: -len("_kernel_time")], {"op": a.get("op_name"), "ep": a.get("provider"), "us": []}
            )
            n["us"].append(ev.get("dur", 0))
    rows = [
        {"node": k, "op": v["op"], "ep": v["ep"], "us": statistics.median(v["us"][1:] or v["us"])}
        for k, v in by.items()
    ]
    return sorted(rows, key=lambda r: -r["us"])[:8]


def _err(want: np.ndarray, got: np.ndarray, dtype: str) -> dict[str, Any]:
    return ep_probe.error(want.astype(np.float32), got.astype(np.float32), dtype)


def run(folder: str, out_dir: str, budget_s: float) -> None:
    import onnxruntime as ort

    os.environ["ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO"] = "1"
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    os.makedirs(out_dir, exist_ok=True)
    started = time.perf_counter()
    index = json.load(open(os.path.join(folder, "index.json")))
    rows: list[dict[str, Any]] = []
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"gpu": ep_probe.gpu(), "ep": "CUDAExecutionProvider", "onnxruntime": ort.__version__},
        "rows": rows,
        "levels": [],
        "sdpa_kernel": [],
        "torch_sdpa": [],
    }
    out_json = os.path.join(out_dir, "cuda_forms.json")
    result["cliff"] = run_cliff(ort, folder, out_dir)
    json.dump(result, open(out_json, "w"), indent=1)
    if os.environ.get("CLIFF_ONLY"):
        return
    # static models first (one length each), then the symbolic ones at every length
    order = sorted(index, key=lambda e: (e["dtype"] != "float16", e["static"] is None, e["stem"]))
    for entry in order:
        stack, d, dtype = entry["stack"], entry["head_dim"], entry["dtype"]
        lengths = entry["lengths"]
        for tf32 in (True, False) if dtype == "float32" else (True,):
            for s in lengths:
                if time.perf_counter() - started > budget_s:
                    rows.append({"stem": entry["stem"], "seq": s, "skipped": "time budget"})
                    continue
                variants = [v for v in entry["variants"] if v != "original" or s <= ORIGINAL_UP_TO]
                found = feeds(stack, d, dtype, s)
                sessions, outs, kernels, errors = {}, {}, {}, {}
                for v in variants:
                    path = os.path.join(folder, f"{entry['stem']}.{v.replace(':', '-')}.onnx")
                    try:
                        sess = session(ort, path, tf32)
                        own = {k: x for k, x in found.items() if k in {i.name for i in sess.get_inputs()}}
                        with caps.captured_stdout() as lines:
                            outs[v] = sess.run(None, own)[0]
                        kernels[v] = caps.kernels_from(lines)
                        sessions[v] = (sess, own)
                    except Exception as exc:  # noqa: BLE001 - reported per variant
                        errors[v] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                timers = {
                    v: caps.timed_call(sess, caps.bind_on_gpu(ort, sess, own)) for v, (sess, own) in sessions.items()
                }
                ms = ep_probe_alternating(timers)
                want = outs.get("original")
                for v in variants:
                    row: dict[str, Any] = {
                        "stack": stack,
                        "head_dim": d,
                        "dtype": dtype,
                        "shape": "symbolic" if entry["static"] is None else "static",
                        "seq": s,
                        "tf32": tf32,
                        "variant": v,
                    }
                    if v in errors:
                        row["error"] = errors[v]
                    else:
                        row.update(ms=round(ms[v], 4), kernels=kernels[v])
                        if want is not None and v != "original":
                            row.update(_err(want, outs[v], dtype))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                if stack == "padding" and dtype == "float16" and s == DIAG_LENGTH and "cuda" in sessions:
                    path = os.path.join(folder, f"{entry['stem']}.cuda.onnx")
                    own = sessions["cuda"][1]
                    for level in LEVELS:
                        sess = session(ort, path, tf32, level)
                        once = caps.timed_call(sess, caps.bind_on_gpu(ort, sess, own))
                        t = statistics.median(once() for _ in range(REPEATS))
                        result["levels"].append(
                            {
                                "stem": entry["stem"],
                                "shape": row["shape"],
                                "head_dim": d,
                                "seq": s,
                                "level": level,
                                "ms": round(t, 4),
                                "nodes": node_profile(ort, path, own, tf32) if level in ("ALL", "DISABLE_ALL") else [],
                            }
                        )
                        print(json.dumps(result["levels"][-1]), flush=True)
                    for kernel in SDPA_KERNELS:  # which of the EP's attention kernels the time goes with
                        opts = {**caps.cuda_options(tf32), "sdpa_kernel": kernel}
                        try:
                            sess = ort.InferenceSession(
                                path, ep_probe.session_options(ort, None), providers=[("CUDAExecutionProvider", opts)]
                            )
                            with caps.captured_stdout() as lines:
                                sess.run(None, own)
                            once = caps.timed_call(sess, caps.bind_on_gpu(ort, sess, own))
                            t = statistics.median(once() for _ in range(REPEATS))
                            found_k = {"ms": round(t, 4), "kernels": caps.kernels_from(lines)}
                        except Exception as exc:  # noqa: BLE001 - recorded
                            found_k = {"error": str(exc).splitlines()[0][:200]}
                        result["sdpa_kernel"].append(
                            {"shape": row["shape"], "head_dim": d, "seq": s, "sdpa_kernel": kernel, **found_k}
                        )
                        print(json.dumps(result["sdpa_kernel"][-1]), flush=True)
                del sessions
        json.dump(result, open(out_json, "w"), indent=1)
    measured = sorted({(e["dtype"], e["head_dim"], s) for e in index for s in e["lengths"]})
    for dtype, d, s in measured:  # the peer at each (dtype, head dim, length) a block ran at
        for keep in ("causal", "padding", "none"):
            case = caps.Case(keep, dtype, d, s, 1, HEADS)
            try:
                result["torch_sdpa"].append(
                    {"keep": keep, "dtype": dtype, "head_dim": d, "seq": s, **caps.torch_peer(case)}
                )
            except Exception as exc:  # noqa: BLE001 - recorded
                result["torch_sdpa"].append(
                    {"keep": keep, "dtype": dtype, "head_dim": d, "seq": s, "error": str(exc)[:200]}
                )
            print(json.dumps(result["torch_sdpa"][-1]), flush=True)
    json.dump(result, open(out_json, "w"), indent=1)


def ep_probe_alternating(timers: dict[str, Any]) -> dict[str, float]:
    """Median ms per variant, ROUNDS rounds of REPEATS calls, order reversed every other round."""
    times: dict[str, list[float]] = {v: [] for v in timers}
    names = list(timers)
    for r in range(ROUNDS):
        for v in names if r % 2 == 0 else names[::-1]:
            timers[v]()
            times[v] += [timers[v]() for _ in range(REPEATS)]
    return {v: statistics.median(t) for v, t in times.items()}


# ------------------------------------------------------------------------------------------------
# table (here)


def table(json_path: str, md_path: str) -> None:
    data = json.load(open(json_path))
    peers = {(p["keep"], p["dtype"], p["head_dim"], p["seq"]): p for p in data["torch_sdpa"] if "torch_ms" in p}
    # causal_padding's peer: SDPA with a mask, as a PyTorch user passes causal + padding (attn_mask)
    peer_keep = {"causal": "causal", "causal_mask": "causal", "padding": "padding", "nomask": "none"}
    peer_keep["causal_padding"] = "padding"
    lines = [
        "# The `cuda` target's forms on ONNX Runtime's CUDA EP, as users run them",
        "",
        f"- date: {data['date']}; {data['machine']}",
        "- command: `bash benchmarks/cuda_gpu_run.sh install forms` after "
        "`python benchmarks/cuda_forms.py make build/cuda_run/forms`",
        f"- one exported attention block, B=1, H={HEADS}, no projections; ORT's default graph optimizer "
        "(ORT_ENABLE_ALL); static: the sequence dim a number (one model per length), symbolic: a name; "
        "ms: median wall, inputs and outputs bound on the GPU, variants alternating in one process; "
        "err: max |lowered - original| on the same EP; torch: scaled_dot_product_attention with "
        "PyTorch's default backend choice (the backend that ran beside it; causal_mask's peer is is_causal)",
        "",
        "| dtype | TF32 | block | D | shape | S | variant | kernel | ms | vs original | vs torch | err | ok |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = {
        (r["dtype"], r["tf32"], r["stack"], r["head_dim"], r["shape"], r["seq"]): r["ms"]
        for r in data["rows"]
        if r.get("variant") == "original" and "ms" in r
    }
    for r in data["rows"]:
        if "variant" not in r:
            continue
        key = (r["dtype"], r["tf32"], r["stack"], r["head_dim"], r["shape"], r["seq"])
        peer = peers.get((peer_keep[r["stack"]], r["dtype"], r["head_dim"], r["seq"]))
        if "error" in r:
            cells = ["-", "error: " + r["error"][:60], "", "", "", ""]
        else:
            orig = base.get(key)
            cells = [
                ",".join(r["kernels"]) or "-",
                f"{r['ms']:.3f}",
                f"{orig / r['ms']:.2f}x" if orig and r["variant"] != "original" else "",
                f"{r['ms'] / peer['torch_ms']:.2f}" if peer else "",
                f"{r['max_abs']:.2g}" if "max_abs" in r else "",
                ("yes" if r.get("ok") else "NO") if "ok" in r else "",
            ]
        lines.append(
            f"| {r['dtype']} | {'on' if r['tf32'] else 'off'} | {r['stack']} | {r['head_dim']} | {r['shape']} | "
            f"{r['seq']} | {r['variant']} | " + " | ".join(cells) + " |"
        )
    lines += [
        "",
        "## PyTorch SDPA, default backend",
        "",
        "| dtype | mask | D | S | backend | ms | torch |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in data["torch_sdpa"]:
        if "torch_ms" in p:
            lines.append(
                f"| {p['dtype']} | {p['keep']} | {p['head_dim']} | {p['seq']} | {p['torch_backend']} | {p['torch_ms']:.3f} | {p['torch']} |"
            )
    lines += ["", "## The static padding block (float16, S=4096) by ORT optimization level", ""]
    lines += ["| shape | D | level | ms | slowest nodes (op, EP, µs) |", "|---|---|---|---|---|"]
    for lv in data["levels"]:
        nodes = "; ".join(
            f"{n['op']} {n['ep'].replace('ExecutionProvider', '')} {n['us']:.0f}" for n in lv["nodes"][:4]
        )
        lines.append(f"| {lv['shape']} | {lv['head_dim']} | {lv['level']} | {lv['ms']:.3f} | {nodes} |")
    lines += ["", "| shape | D | sdpa_kernel option | kernel | ms |", "|---|---|---|---|---|"]
    for k in data["sdpa_kernel"]:
        got = f"{','.join(k['kernels'])} | {k['ms']:.3f}" if "ms" in k else f"error: {k['error'][:80]} |"
        lines.append(f"| {k['shape']} | {k['head_dim']} | {k['sdpa_kernel']} | {got} |")
    lines += ["", "## The static-shape cliff: other shapes of a static padding block (float16, S=4096, D=64)", ""]
    lines += [
        "cliff_fedbias: the probe's unfused block with its [1, 1, S, S] bias fed whole; cliff_batch2: the block "
        "above at batch 2; cuda_direct / cuda_where: the lowered fed-bias block with MultiHeadAttention reading "
        "the graph input itself / the bias held by Where (what the lowering writes now). first: the first run.",
        "",
        "| block | shape | level | variant | kernel | first ms | ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in data.get("cliff", []):
        got = f"{c['first_ms']:.1f} | {c['ms']:.3f}" if "ms" in c else f"error: {c.get('error', '')[:60]} |"
        lines.append(
            f"| {c['name']} | {c['shape']} | {c['level']} | {c['variant']} | {','.join(c.get('kernels', [])) or '-'} | {got} |"
        )
    lines += ["", *data.get("findings", [])]
    ep_probe.write_table(md_path, lines)


def main(argv: list[str] | None = None) -> int:
    steps = ep_probe.StepCommandLine(__doc__, md="benchmarks/results/cuda_forms.md", device=None)
    steps.run.add_argument("--budget-s", type=float, default=300.0)
    steps.make.add_argument("--dtypes", default="float16,float32")
    steps.make.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="float16's lengths")
    steps.make.add_argument("--no-cliff", action="store_true", help="leave out make_cliff's cases")
    steps.make.add_argument("--stacks", default=",".join(STACKS), help="the blocks to make (STACKS)")
    steps.make.add_argument("--symbolic-only", action="store_true", help="no static model per length")
    return steps.call(
        argv,
        make=lambda args: make(
            args.folder,
            tuple(args.dtypes.split(",")),
            tuple(int(s) for s in args.lengths.split(",")),
            not args.no_cliff,
            tuple(args.stacks.split(",")),
            not args.symbolic_only,
        ),
        run=lambda args: run(args.folder, args.out, args.budget_s),
        table=lambda args: table(args.json, args.md),
    )


if __name__ == "__main__":
    sys.exit(main())
