"""Lowering FlashAttention to native ops (ortflash.lowering): every zoo model lowers every
block to ONNX Runtime's contrib ops and to ONNX Attention, runs in a plain onnxruntime session (no
custom-op library) and computes what the original computed; hand-built blocks either lower and
match FlashAttention exactly, or stay with the reason; and the ONNX Runtime behaviours the rules
rest on are pinned, so that an upgrade that changes one fails here first."""

import json
import math
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from attention_graphs import F16, Variant, build, feeds
from onnx import TensorProto as TP
from onnx import helper as h

import ortflash
from ortflash.checks.compare import compare, default_tolerance
from ortflash.checks.feeds import make_feeds
from ortflash.checks.sessions import run_model
from ortflash.checks.verify import verify
from ortflash.lowering import (
    CONTRIB_DOMAIN,
    OP_ATTENTION,
    OP_GQA,
    OP_MHA,
    TARGETS,
    LoweringNote,
    lower,
)
from ortflash.model_shapes import graphs_of
from ortflash.op import spec

ZOO = os.path.join(os.path.dirname(__file__), "..", "models")
_MANIFEST_PATH = os.path.join(ZOO, "manifest.json")
MANIFEST = json.load(open(_MANIFEST_PATH)) if os.path.exists(_MANIFEST_PATH) else {"models": []}
ENTRIES = [e for e in MANIFEST["models"] if e.get("file") and e.get("check", {}).get("ok", True)]

NATIVE = ("contrib", "onnx")
TARGET_OPS = {"contrib": {"MultiHeadAttention", "GroupQueryAttention"}, "onnx": {"Attention"}}
LOWEST = float(np.finfo(np.float32).min)

# Zoo models whose blocks cannot all be lowered exactly: (file, target) -> what the notes say.
# (None since the opset is raised op by op, pipeline/opset.py: the model without shapes kept its
# blocks while onnx.version_converter's conversion to opset 23 lost the bias's rank.)
ZOO_KEPT: dict[tuple[str, str], str] = {}


def plain_session(model: onnx.ModelProto) -> ort.InferenceSession:
    """ONNX Runtime as users without ortflash have it: no custom-op library."""
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def plain_run(model: onnx.ModelProto, feeds_: dict) -> dict:
    sess = plain_session(model)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds_)))


def op_types(model: onnx.ModelProto) -> list[str]:
    """Every graph's ops: a merged decoder's blocks sit in its If branches."""
    return [n.op_type for g in graphs_of(model.graph) for n in g.node]


def check_lowered_model(model: onnx.ModelProto, target: str) -> None:
    """Fully lowered: valid, no FlashAttention, no ai.onnx.contrib import, no dead nodes."""
    onnx.checker.check_model(model)
    assert spec.OP_TYPE not in op_types(model)
    domains = {imp.domain: imp.version for imp in model.opset_import}
    assert spec.DOMAIN not in domains
    if target == "contrib":
        assert domains[CONTRIB_DOMAIN] == 1
    else:
        assert domains.get("", domains.get("ai.onnx")) >= 23
        assert CONTRIB_DOMAIN not in domains
        assert 10 <= model.ir_version
    used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    dead = [n.name or n.op_type for n in model.graph.node if not any(o in used for o in n.output)]
    assert not dead, dead


# ---------------------------------------------------------------------------------------------
# the zoo


@pytest.fixture(scope="module", params=ENTRIES, ids=[e["file"] for e in ENTRIES])
def zoo_fused(request):
    entry = request.param
    model = onnx.load(os.path.join(ZOO, entry["file"]))
    fused, report = ortflash.optimize(model, target="ortflash")
    assert report.fused == entry["attention_blocks"], [b.reason for b in report.blocks if not b.fused]
    return entry, model, fused


@pytest.mark.parametrize("target", NATIVE)
def test_zoo_model_lowers_every_block_and_verifies(zoo_fused, target):
    entry, model, fused = zoo_fused
    lowered, notes = lower(fused, target)
    assert len(notes) == entry["attention_blocks"]
    assert len({n.block for n in notes} - {None}) == len(notes)  # one report row each
    kept = [str(n) for n in notes if not n.lowered]
    expected = ZOO_KEPT.get((entry["file"], target))
    if expected is not None:
        assert kept and all(expected in k for k in kept), kept
        return
    assert not kept, kept
    count = sum(t in TARGET_OPS[target] for t in op_types(lowered))
    assert count == entry["attention_blocks"]
    check_lowered_model(lowered, target)

    dynamic = entry.get("dynamic", {})
    cases = [(2, 7), (2, 21)] if dynamic.get("seq", True) else [(2, 16), (3, 16)]
    sess = plain_session(lowered)
    names = [o.name for o in sess.get_outputs()]
    rtol, atol = default_tolerance(model)
    for batch, seq_len in cases:
        if not dynamic.get("batch", True):
            batch = 1
        f = make_feeds(model, seq_len=seq_len, batch=batch, dims=entry.get("feed_dims"))
        diffs = verify(model, lowered, f)
        assert all(d.ok for d in diffs), [(d.name, d.max_abs, d.nan_mismatch) for d in diffs]
        want = run_model(model, f)
        got = dict(zip(names, sess.run(names, f)))  # and without the custom-op library
        plain = [compare(want[k], got[k], k, rtol, atol) for k in want]
        assert all(d.ok for d in plain), [(d.name, d.max_abs, d.nan_mismatch) for d in plain]


def test_zoo_has_models_to_lower():
    if not ENTRIES:
        pytest.skip("models/manifest.json not generated")
    assert {"bert", "gpt2"} <= {e["arch"] for e in ENTRIES}


# ---------------------------------------------------------------------------------------------
# hand-built graphs from the pattern builder: optimize, lower, run without ortflash


SHAPES = [{"B": 2, "S": 5, "T": 9, "BH": 4}, {"B": 2, "S": 8, "T": 3, "BH": 4}]

LOWERED = {"contrib": OP_MHA, "onnx": OP_ATTENTION}


def _kept(reason_fragment):
    return {t: f"kept: {reason_fragment}" for t in NATIVE}


# name -> (variant, {target: op, or "kept: <reason fragment>"})
BUILT = {
    "bool_mask_inf_fill": (Variant(where_mask="keep", mask_shape=("B", 1, "S", "T")), LOWERED),
    "bool_mask_nan_guard": (Variant(where_mask="drop", nan_guard=True, mask_shape=("B", 1, "S", "T")), LOWERED),
    "bool_mask_lowest_fill": (Variant(where_mask="keep", mask_shape=("B", 1, "S", "T"), fill=LOWEST), LOWERED),
    "bool_mask_finite_fill": (Variant(where_mask="keep", mask_shape=("B", 1, "S", "T"), fill=-1e4), _kept("mask_fill")),
    "padding_bias": (Variant(bias_shapes=(("B", 1, 1, "T"),)), LOWERED),
    "bias_and_mask_guard": (Variant(bias_shapes=(("B", 1, "S", "T"),), where_mask="keep", nan_guard=True), LOWERED),
    "rank3": (Variant(rank=3, bias_shapes=(("BH", "S", "T"),)), LOWERED),
    "rank3_plain": (Variant(rank=3, scale_site="mul_scores", scale=0.3), LOWERED),
    "bshd_k": (Variant(k_form="bshd"), LOWERED),
    "float16": (Variant(dtype=F16, softmax_cast=True, bias_shapes=(("B", 1, 1, "T"),)), LOWERED),
    "float16_mask_guard": (
        Variant(dtype=F16, softmax_cast=True, where_mask="keep", nan_guard=True, mask_shape=("B", 1, "S", "T")),
        LOWERED,
    ),
    # lower() converts the fused model to opset 13 for contrib (no Softmax left to reshape)
    "opset12": (Variant(opset=12, softmax_axis=3, where_mask="keep"), LOWERED),
}


def _with_masked_rows(model: onnx.ModelProto, f: dict) -> dict:
    """Make some query rows fully masked: bool masks all false, additive biases all -inf/lowest."""
    f = dict(f)
    if "mask" in f:
        m = f["mask"].copy()
        if m.shape[-2] > 1:
            m[0, ..., 1, :] = False  # one query row of item 0
        else:
            m[0] = False  # every row of item 0
        f["mask"] = m
    for name in [k for k in f if k.startswith("bias")]:
        b = f[name].copy()
        b[-1, ..., 0, :] = -np.inf if name == "bias0" else np.finfo(b.dtype).min
        f[name] = b
    return f


@pytest.mark.parametrize("target", NATIVE)
@pytest.mark.parametrize("name", sorted(BUILT))
def test_built_block_lowers_exactly_or_stays(name, target):
    variant, expect = BUILT[name]
    model = build(variant)
    fused, report = ortflash.optimize(model, target="ortflash")
    assert report.fused == 1, report.blocks[0].reason
    lowered, (note,) = lower(fused, target)
    if expect[target].startswith("kept: "):
        assert not note.lowered and note.op == spec.OP_TYPE
        assert expect[target][len("kept: ") :] in note.reason and "needs ortflash" in note.reason
        assert lowered is fused
        return
    assert note.lowered and note.op == expect[target], note
    check_lowered_model(lowered, target)
    if variant.rank == 3:  # [B·H, S, D] blocks need no Unsqueeze/Squeeze around the native op
        producers = {o: n.op_type for n in lowered.graph.node for o in n.output}
        (native,) = [
            n for n in lowered.graph.node if n.domain in ("", CONTRIB_DOMAIN) and n.op_type in TARGET_OPS[target]
        ]
        assert [producers.get(x) for x in native.input[:3]] == [None, None, None]  # the graph inputs
        assert not [n for n in lowered.graph.node if native.output[0] in n.input and n.op_type == "Squeeze"]
    tol = (2e-2, 2e-3) if variant.dtype == F16 else (1e-4, 1e-5)
    for i, dims in enumerate(SHAPES):
        f = feeds(model, dims, np.random.default_rng(i))
        for case in (f, _with_masked_rows(model, f)):
            want = plain_run(model, case)["out"]
            got = plain_run(lowered, case)["out"]
            d = compare(want, got, "out", *tol)
            assert d.ok, (dims, d)
    if "guard" in name:
        assert not np.isnan(got).any()


# ---------------------------------------------------------------------------------------------
# FlashAttention nodes written directly: grouped-query, causal, softcap, lengths, head sizes


def fa_model(hq=4, hkv=2, d=8, dv=None, k_len="S", bias=None, mask=None, opset=17, **attrs):
    """One FlashAttention node over inputs q, k, v (+ bias, mask); dims B, S and k_len symbolic."""
    dv = d if dv is None else dv
    inputs = [
        h.make_tensor_value_info("q", TP.FLOAT, ["B", hq, "S", d]),
        h.make_tensor_value_info("k", TP.FLOAT, ["B", hkv, k_len, d]),
        h.make_tensor_value_info("v", TP.FLOAT, ["B", hkv, k_len, dv]),
    ]
    inits = []
    names = ["q", "k", "v"]
    for name, shape, elem, neutral in (
        ("bias", bias, TP.FLOAT, np.float32(0)),
        ("mask", mask, TP.BOOL, np.bool_(True)),
    ):
        if shape is None:
            inits.append(onnx.numpy_helper.from_array(np.array(neutral), f"no_{name}"))
            names.append(f"no_{name}")
        else:
            inputs.append(h.make_tensor_value_info(name, elem, [k_len if s == "T" else s for s in shape]))
            names.append(name)
    node = h.make_node(spec.OP_TYPE, names, ["o"], domain=spec.DOMAIN, name="fa", **spec.validate(attrs))
    graph = h.make_graph([node], "fa", inputs, [h.make_tensor_value_info("o", TP.FLOAT, ["B", hq, "S", dv])], inits)
    opsets = [h.make_opsetid("", opset), h.make_opsetid(spec.DOMAIN, spec.DOMAIN_VERSION)]
    return h.make_model(graph, opset_imports=opsets, ir_version=8)


def fa_feeds(model, sizes, rng, masked_rows: bool):
    """Random inputs; biases pad item 1 on the left (with causality: fully masked first rows)."""
    out = {}
    for vi in model.graph.input:
        shape = [d.dim_value if d.HasField("dim_value") else sizes[d.dim_param] for d in vi.type.tensor_type.shape.dim]
        if vi.type.tensor_type.elem_type == TP.BOOL:
            x = rng.random(shape) > 0.3
            x[1, ..., :2] = False
            if masked_rows:
                x[0] = False
        else:
            x = rng.standard_normal(shape).astype(np.float32)
            if vi.name == "bias":
                x[1, ..., :3] = -np.inf
                if masked_rows:
                    x[0] = LOWEST
        out[vi.name] = x
    return out


SQ_EQ_SK = [{"B": 2, "S": 6}]
CROSS = [{"B": 2, "S": 5, "T": 9}, {"B": 3, "S": 9, "T": 5}]

# name -> (fa_model arguments, {target: op, or "kept: <reason fragment>"}, sizes)
DIRECT = {
    "gqa_causal": (dict(is_causal=1), {"contrib": OP_GQA, "onnx": OP_ATTENTION}, SQ_EQ_SK),
    "gqa_causal_padding_bias": (
        dict(is_causal=1, bias=("B", 1, 1, "T")),
        {"contrib": OP_GQA, "onnx": OP_ATTENTION},
        SQ_EQ_SK,
    ),
    "gqa_causal_bias_guard": (
        dict(is_causal=1, bias=("B", 1, 1, "T"), masked_rows="zero"),
        {"contrib": OP_GQA, "onnx": OP_ATTENTION},
        SQ_EQ_SK,
    ),
    "gqa_bidirectional_mask": (dict(mask=("B", 1, "S", "T")), {"contrib": OP_MHA, "onnx": OP_ATTENTION}, SQ_EQ_SK),
    "gqa_causal_cross_lengths": (dict(is_causal=1, k_len="T"), {"contrib": OP_MHA, "onnx": OP_ATTENTION}, CROSS),
    "gqa_causal_head_size_12": (dict(is_causal=1, d=12), {"contrib": OP_MHA, "onnx": OP_ATTENTION}, SQ_EQ_SK),
    "mqa_mask_guard": (
        dict(hkv=1, mask=("B", 1, 1, "T"), masked_rows="zero"),
        {"contrib": OP_MHA, "onnx": OP_ATTENTION},
        SQ_EQ_SK,
    ),
    "causal_cross_lengths": (dict(hkv=4, is_causal=1, k_len="T"), {"contrib": OP_MHA, "onnx": OP_ATTENTION}, CROSS),
    "causal_mask_cross_lengths": (
        dict(hkv=4, is_causal=1, k_len="T", mask=("B", 1, "S", "T")),
        {"contrib": OP_MHA, "onnx": OP_ATTENTION},
        CROSS,
    ),
    "causal_mask_lowest_fill": (
        dict(hkv=4, is_causal=1, k_len="T", mask=("B", 1, 1, "T"), mask_fill=LOWEST),
        {"contrib": OP_MHA, "onnx": OP_ATTENTION},
        CROSS,
    ),
    "causal_finite_fill": (
        dict(hkv=4, is_causal=1, mask_fill=-1e9),
        {"contrib": "kept: mask_fill", "onnx": "kept: mask_fill"},
        SQ_EQ_SK,
    ),
    "softcap_causal": (dict(hkv=4, is_causal=1, softcap=2.0), {"contrib": OP_GQA, "onnx": OP_ATTENTION}, SQ_EQ_SK),
    "softcap_causal_gqa_bias": (
        dict(is_causal=1, softcap=2.0, bias=("B", 1, 1, "T")),
        {"contrib": OP_GQA, "onnx": OP_ATTENTION},
        SQ_EQ_SK,
    ),
    "softcap_bidirectional": (
        dict(hkv=4, softcap=2.0, mask=("B", 1, 1, "T")),
        {"contrib": "kept: softcap", "onnx": OP_ATTENTION},
        SQ_EQ_SK,
    ),
    "value_head_size_differs": (
        dict(hkv=4, dv=6, k_len="T", bias=("B", 1, "S", "T")),
        {"contrib": OP_MHA, "onnx": OP_ATTENTION},
        CROSS,
    ),
    "negative_scale": (dict(hkv=4, scale=-0.5), {"contrib": "kept: scale", "onnx": "kept: scale"}, SQ_EQ_SK),
}


@pytest.mark.parametrize("target", NATIVE)
@pytest.mark.parametrize("name", sorted(DIRECT))
def test_direct_block_lowers_exactly_or_stays(name, target):
    kwargs, expect, sizes = DIRECT[name]
    kwargs = dict(kwargs)
    kwargs.setdefault("scale", 0.35)
    model = fa_model(**kwargs)
    lowered, (note,) = lower(model, target)
    if expect[target].startswith("kept: "):
        assert not note.lowered and note.op == spec.OP_TYPE
        assert expect[target][len("kept: ") :] in note.reason and "needs ortflash" in note.reason
        assert lowered is model
        return
    assert note.lowered and note.op == expect[target], note
    check_lowered_model(lowered, target)
    if name == "causal_cross_lengths" and target == "onnx":  # causal alone: the op's own is_causal
        (att,) = [n for n in lowered.graph.node if n.op_type == "Attention"]
        assert {a.name: a.i for a in att.attribute}.get("is_causal") == 1
    for i, size in enumerate(sizes):
        size = {"T": size.get("T", size["S"]), **size}
        for masked_rows in (False, True):
            f = fa_feeds(model, size, np.random.default_rng(i), masked_rows)
            want = run_model(model, f)["o"]  # FlashAttention through ortflash's kernel
            got = plain_run(lowered, f)["o"]
            d = compare(want, got, "o", 1e-4, 1e-5)
            assert d.ok, (size, masked_rows, d)


def test_partly_lowered_model_keeps_ortflash_and_still_computes_the_same():
    """Two blocks, one with a fill no native op reproduces: that one stays, the model says so."""
    a = fa_model(hkv=4, mask=("B", 1, "S", "T"))
    b = fa_model(hkv=4, mask=("B", 1, "S", "T"), mask_fill=-1e4)
    node_b = onnx.NodeProto()
    node_b.CopyFrom(b.graph.node[0])
    node_b.name, node_b.input[0], node_b.output[0] = "fa_b", "o", "o2"
    a.graph.node.append(node_b)
    a.graph.output[0].name = "o2"
    for target in NATIVE:
        lowered, notes = lower(a, target)
        assert [n.lowered for n in notes] == [True, False]
        assert "needs ortflash" in notes[1].reason
        assert op_types(lowered).count(spec.OP_TYPE) == 1
        assert spec.DOMAIN in {imp.domain for imp in lowered.opset_import}
        onnx.checker.check_model(lowered)
        f = fa_feeds(a, {"B": 2, "S": 6, "T": 6}, np.random.default_rng(0), masked_rows=True)
        d = compare(run_model(a, f)["o2"], run_model(lowered, f)["o2"], "o2", 1e-4, 1e-5)
        assert d.ok, (target, d)


def test_lowering_twice_mixes_targets_without_name_clashes():
    """contrib keeps a bidirectional soft-capped block; onnx then lowers it beside the first."""
    a = fa_model(hkv=4, mask=("B", 1, "S", "T"))
    b = fa_model(hkv=4, mask=("B", 1, "S", "T"), softcap=2.0)
    node_b = onnx.NodeProto()
    node_b.CopyFrom(b.graph.node[0])
    node_b.name, node_b.input[0], node_b.output[0] = "fa_b", "o", "o2"
    a.graph.node.append(node_b)
    a.graph.output[0].name = "o2"
    once, notes = lower(a, "contrib")
    assert [n.lowered for n in notes] == [True, False] and "softcap" in notes[1].reason
    twice, notes = lower(once, "onnx")
    assert [(n.node_name, n.lowered) for n in notes] == [("fa_b", True)]
    onnx.checker.check_model(twice)  # SSA: no value name of the first run reused
    assert {"MultiHeadAttention", "Attention"} <= set(op_types(twice)) and spec.OP_TYPE not in op_types(twice)
    assert {imp.domain: imp.version for imp in twice.opset_import} == {"": 23, CONTRIB_DOMAIN: 1}
    f = fa_feeds(a, {"B": 2, "S": 6, "T": 6}, np.random.default_rng(3), masked_rows=True)
    d = compare(run_model(a, f)["o2"], plain_run(twice, f)["o2"], "o2", 1e-4, 1e-5)
    assert d.ok, d


def test_api_edges():
    model = fa_model(hkv=4)
    same, notes = lower(model, "ortflash")
    assert same is model and [(n.lowered, n.op) for n in notes] == [(False, spec.OP_TYPE)]
    assert isinstance(notes[0], LoweringNote) and notes[0].node_name == "fa"
    with pytest.raises(ortflash.OrtflashError, match="unknown lowering target"):
        lower(model, "tensorrt")
    plain = build(Variant())
    assert lower(plain, "onnx") == (plain, [])
    assert set(TARGETS) == {"ortflash", "contrib", "onnx", "cuda", "webgpu"}
    lowered, _ = lower(model, "onnx")
    assert model.opset_import[0].version == 17 and spec.OP_TYPE in op_types(model)  # input untouched
    assert lowered.ir_version == 10


def test_contrib_needs_static_head_counts():
    model = fa_model(hkv=4)
    for vi in model.graph.input[:3]:
        vi.type.tensor_type.shape.dim[1].dim_param = "H"
    _, (note,) = lower(model, "contrib")
    assert not note.lowered and "head counts" in note.reason
    _, (note,) = lower(model, "onnx")
    assert note.lowered  # Attention reads the heads from the 4D inputs


# ---------------------------------------------------------------------------------------------
# the ONNX Runtime behaviours the lowering rules rest on (onnxruntime 1.31, CPU EP)


def _single(op, inputs, attrs, domain="", opset=23):
    """A one-node model over float inputs (int32 for names starting with 'i_'); returns a runner."""
    vis = [h.make_tensor_value_info(n, TP.INT32 if n.startswith("i_") else TP.FLOAT, None) for n in inputs if n]
    node = h.make_node(op, list(inputs), ["y"], domain=domain, **attrs)
    opsets = [h.make_opsetid("", opset)] + ([h.make_opsetid(domain, 1)] if domain else [])
    graph = h.make_graph([node], op, vis, [h.make_tensor_value_info("y", TP.FLOAT, None)])
    sess = plain_session(h.make_model(graph, opset_imports=opsets, ir_version=10))
    return lambda **f: sess.run(None, f)[0]


def _bhsd_to_bsd(x):
    b, n, s, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, s, n * d)


def _rows(n_q, n_k, bias_row_value, rng):
    q = rng.standard_normal((1, 1, n_q, 8)).astype(np.float32)
    k = rng.standard_normal((1, 1, n_k, 8)).astype(np.float32)
    v = rng.standard_normal((1, 1, n_k, 8)).astype(np.float32)
    bias = np.zeros((1, 1, n_q, n_k), np.float32)
    bias[0, 0, 1, :] = bias_row_value
    return q, k, v, bias


def test_ort_multihead_attention_masked_rows_and_causal_alignment():
    rng = np.random.default_rng(0)
    mha = _single("MultiHeadAttention", ["q", "k", "v", "", "", "b"], {"num_heads": 1, "scale": 0.5}, CONTRIB_DOMAIN)
    q, k, v, bias = _rows(3, 4, -np.inf, rng)
    y = mha(q=_bhsd_to_bsd(q), k=k, v=v, b=bias)
    assert np.isnan(y[0, 1]).all() and not np.isnan(y[0, 0]).any()  # -inf row: NaN (FlashAttention "nan")
    bias[0, 0, 1, :] = LOWEST
    y = mha(q=_bhsd_to_bsd(q), k=k, v=v, b=bias)
    np.testing.assert_allclose(y[0, 1], v[0, 0].mean(0), rtol=1e-5, atol=1e-6)  # lowest row: uniform
    # unidirectional with fewer queries than keys: the last query row sees every key, so causality
    # is written into attention_bias rather than left to the attribute.
    uni = _single("MultiHeadAttention", ["q", "k", "v"], {"num_heads": 1, "unidirectional": 1}, CONTRIB_DOMAIN)
    eye = np.eye(8, dtype=np.float32)[None, None, :5]  # V row j = e_j: the output is the probabilities
    q = rng.standard_normal((1, 1, 3, 8)).astype(np.float32)
    k = rng.standard_normal((1, 1, 5, 8)).astype(np.float32)
    p = uni(q=_bhsd_to_bsd(q), k=k, v=eye)[0, :, :5]
    assert (p[0, 1:] == 0).all() and (p[1, 2:] == 0).all()  # rows 0, 1: top-left
    assert (p[2, 3:] > 0).all()  # row 2 also sees keys 3 and 4


def test_ort_attention_masked_rows_sentinel_and_causal_alignment():
    rng = np.random.default_rng(1)
    att = _single("Attention", ["q", "k", "v", "m"], {"scale": 0.5})
    q, k, v, bias = _rows(3, 4, -np.inf, rng)
    assert (att(q=q, k=k, v=v, m=bias)[0, 0, 1] == 0).all()  # -inf row: zeros (opset-23 errata)
    bias[0, 0, 1, :] = LOWEST
    assert (att(q=q, k=k, v=v, m=bias)[0, 0, 1] == 0).all()  # lowest row: zeros too (ORT's sentinel)
    bias[0, 0, 1, :] = np.nextafter(np.float32(LOWEST), np.float32(0))
    np.testing.assert_allclose(att(q=q, k=k, v=v, m=bias)[0, 0, 1], v[0, 0].mean(0), rtol=1e-5, atol=1e-6)
    causal = _single("Attention", ["q", "k", "v"], {"is_causal": 1})
    eye = np.eye(8, dtype=np.float32)[None, None]
    for n_q, n_k in ((3, 5), (5, 3)):
        q = rng.standard_normal((1, 1, n_q, 8)).astype(np.float32)
        k = rng.standard_normal((1, 1, n_k, 8)).astype(np.float32)
        p = causal(q=q, k=k, v=eye[:, :, :n_k])[0, 0, :, :n_k]
        assert ((p > 0) == np.tril(np.ones((n_q, n_k), bool))).all()  # top-left aligned


def test_ort_group_query_attention_limits():
    rng = np.random.default_rng(2)
    gqa = _single(
        "GroupQueryAttention",
        ["q", "k", "v", "", "", "i_seqlens", "i_total"],
        {"num_heads": 2, "kv_num_heads": 1},
        CONTRIB_DOMAIN,
    )

    def run(n_q, n_k, d):
        q = rng.standard_normal((1, n_q, 2 * d)).astype(np.float32)
        k = rng.standard_normal((1, n_k, d)).astype(np.float32)
        return gqa(q=q, k=k, v=k, i_seqlens=np.array([n_k - 1], np.int32), i_total=np.array(n_k, np.int32))

    assert run(4, 4, 8).shape == (1, 4, 16)
    with pytest.raises(Exception, match="same sequence length"):
        run(3, 4, 8)
    with pytest.raises(Exception, match="multiple of 8"):
        run(4, 4, 12)
    assert math.isfinite(float(run(4, 4, 16).sum()))
