"""The standard ONNX Attention op (opsets 23, 24) rewritten into FlashAttention.

Each case is a model with one Attention node. It runs in plain ONNX Runtime; ortflash
must fuse it (or keep it, with the asserted reason), and the fused model must give the same
outputs (Y and present_key/present_value) in both softmax modes.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, replace

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ortflash
from ortflash.fusion.driver import fuse as fuse_graph
from ortflash.fusion.onnx_attention import AttentionOpFrontEnd
from ortflash.op import spec
from ortflash.op.policy import SoftmaxPolicy

F32, F16, BOOL, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BOOL, TensorProto.INT64
LOWEST = float(np.finfo(np.float32).min)


@dataclass(frozen=True)
class Case:
    rank: int = 4
    q_heads: int = 4
    kv_heads: int = 4
    head_dim: int = 8
    v_head_dim: int = 8
    batch: int = 2
    sq: int = 5
    sk: int = 5  # new keys (K's sequence length)
    past: int | None = None  # past length; None = no past_key/past_value inputs
    scale: float | None = None
    causal: int = 0
    mask: str | None = None  # None | "bool" | "float"
    mask_dims: tuple = ("B", 1, "Sq", "T")  # of "B", "H", "Sq", "T" or ints
    softcap: float = 0.0
    nonpad: tuple | None = None  # per batch; needs opset 24
    present: bool = False  # ask for present_key/present_value without a past
    opset: int = 23
    dtype: int = F32
    dynamic: tuple = ()  # dims given as symbols in the graph inputs: of "Sq", "Sk", "P", "B"
    softmax_precision: int | None = None
    qk_output: bool = False

    @property
    def total(self) -> int:
        return (self.past or 0) + self.sk


def _dims(c: Case, names):
    size = {"B": c.batch, "H": c.q_heads, "Sq": c.sq, "T": c.total}
    return [size.get(d, d) if isinstance(d, str) else d for d in names]


def build(c: Case):
    """(model, feeds) for one Attention node with the case's inputs and attributes."""
    np_dt = np.float16 if c.dtype == F16 else np.float32
    rng = np.random.default_rng(zlib.crc32(repr(c).encode()))

    def sym(name, value):
        return name if name in c.dynamic else value

    b, sq, sk, p = sym("B", c.batch), sym("Sq", c.sq), sym("Sk", c.sk), sym("P", c.past)
    if c.rank == 4:
        shapes = {
            "Q": [b, c.q_heads, sq, c.head_dim],
            "K": [b, c.kv_heads, sk, c.head_dim],
            "V": [b, c.kv_heads, sk, c.v_head_dim],
        }
    else:
        shapes = {
            "Q": [b, sq, c.q_heads * c.head_dim],
            "K": [b, sk, c.kv_heads * c.head_dim],
            "V": [b, sk, c.kv_heads * c.v_head_dim],
        }
    real = {
        "Q": _real(shapes["Q"], c),
        "K": _real(shapes["K"], c),
        "V": _real(shapes["V"], c),
    }
    feeds = {n: rng.standard_normal(real[n]).astype(np_dt) for n in ("Q", "K", "V")}
    inputs = ["Q", "K", "V", "", "", "", ""]
    infos = [helper.make_tensor_value_info(n, c.dtype, shapes[n]) for n in ("Q", "K", "V")]

    if c.mask is not None:
        mshape = _dims(c, c.mask_dims)
        if c.mask == "bool":
            m = rng.random(mshape) > 0.25
            m[..., 0, :] = False  # a fully masked query row
        else:
            m = rng.standard_normal(mshape).astype(np_dt)
            m[rng.random(mshape) < 0.2] = -np.inf
            lowest = np.finfo(np_dt).min
            m[..., 0, :] = -np.inf  # fully masked rows, as ORT sees them: -inf, lowest, both
            if c.sq > 1:
                m[..., 1, :] = lowest
            if c.sq > 2 and np_dt == np.float32:
                m[..., 2, :] = -1e30  # not masked: a uniform row (float16 keeps its scores, rounded)
            if c.sq > 3:
                m[..., 3, ::2] = -np.inf
                m[..., 3, 1::2] = lowest
        feeds["attn_mask"] = m
        inputs[3] = "attn_mask"
        sym_dims = [
            {"B": b, "Sq": sq, "T": "T" if ("Sk" in c.dynamic or "P" in c.dynamic) else c.total}.get(d, x)
            if isinstance(d, str)
            else d
            for d, x in zip(c.mask_dims, mshape)
        ]
        infos.append(helper.make_tensor_value_info("attn_mask", BOOL if c.mask == "bool" else c.dtype, sym_dims))
    outputs = ["Y"]
    if c.past is not None:
        for n, d in (("past_key", c.head_dim), ("past_value", c.v_head_dim)):
            feeds[n] = rng.standard_normal((c.batch, c.kv_heads, c.past, d)).astype(np_dt)
            infos.append(helper.make_tensor_value_info(n, c.dtype, [b, c.kv_heads, p, d]))
        inputs[4], inputs[5] = "past_key", "past_value"
    if c.past is not None or c.present:
        outputs += ["present_key", "present_value"]
    if c.nonpad is not None:
        feeds["nonpad_kv_seqlen"] = np.array(c.nonpad, np.int64)
        inputs[6] = "nonpad_kv_seqlen"
        infos.append(helper.make_tensor_value_info("nonpad_kv_seqlen", I64, [b]))
    if c.qk_output:
        outputs += [""] * (3 - len(outputs)) + ["qk"]
    while inputs[-1] == "":
        inputs.pop()

    attrs = {"is_causal": c.causal}
    if c.rank == 3:
        attrs.update(q_num_heads=c.q_heads, kv_num_heads=c.kv_heads)
    if c.scale is not None:
        attrs["scale"] = c.scale
    if c.softcap:
        attrs["softcap"] = c.softcap
    if c.softmax_precision is not None:
        attrs["softmax_precision"] = c.softmax_precision
    if c.qk_output:
        attrs["qk_matmul_output_mode"] = 3
    node = helper.make_node("Attention", inputs, outputs, name="attention", **attrs)
    outs = [helper.make_tensor_value_info(o, c.dtype, None) for o in outputs if o]
    graph = helper.make_graph([node], "one_attention", infos, outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", c.opset)])
    model.ir_version = 10
    return model, feeds


def _real(dims, c: Case):
    size = {"B": c.batch, "Sq": c.sq, "Sk": c.sk, "P": c.past}
    return [size[d] if isinstance(d, str) else d for d in dims]


def fuse(model: onnx.ModelProto, policy: SoftmaxPolicy | None = None):
    """What optimize() does around the Attention op's front end."""
    policy = policy or SoftmaxPolicy("naive")
    opset = next(i.version for i in model.opset_import if i.domain in ("", "ai.onnx"))
    ir_model = ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(model, data_prop=True))
    blocks = fuse_graph(ir_model.graph, opset, policy, (AttentionOpFrontEnd(),)).blocks
    if any(b.fused for b in blocks):
        common_passes.RemoveUnusedNodesPass()(ir_model)
        ir_model.opset_imports.setdefault(spec.DOMAIN, spec.DOMAIN_VERSION)
    out = ir.serde.serialize_model(ir_model)
    out.ir_version = model.ir_version
    del out.graph.value_info[:]
    return out, blocks


def run_ort(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def run_fused(model, feeds, mode):
    session = ortflash.InferenceSession(model, softmax=mode, block_size=4)
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def assert_same(got: dict, want: dict, f16: bool):
    assert sorted(got) == sorted(want)
    atol, rtol = (2e-3, 2e-2) if f16 else (1e-5, 1e-4)
    for name in want:
        a, b = got[name].astype(np.float64), want[name].astype(np.float64)
        assert a.shape == b.shape, name
        assert np.array_equal(np.isnan(a), np.isnan(b)), name
        np.testing.assert_allclose(np.nan_to_num(a), np.nan_to_num(b), rtol=rtol, atol=atol, err_msg=name)


def check_fused(c: Case, model=None, feeds=None, want=None):
    if model is None:
        model, feeds = build(c)
        want = run_ort(model, feeds)
    fused, blocks = fuse(model)
    assert len(blocks) == 1 and blocks[0].fused, blocks[0].reason
    types = [n.op_type for n in fused.graph.node]
    assert types.count("FlashAttention") == 1 and "Attention" not in types, types
    assert [o.name for o in fused.graph.output] == [o.name for o in model.graph.output]
    assert [i.name for i in fused.graph.input] == [i.name for i in model.graph.input]
    for mode in ("naive", "online"):
        assert_same(run_fused(fused, feeds, mode), want, c.dtype == F16)
    return blocks[0]


# ------------------------------------------------------------------ the grid

GRID: dict[str, Case] = {}


def _add(name, **kw):
    assert name not in GRID
    GRID[name] = Case(**kw)


# layouts x heads x scale x causal x Sq/Sk, no mask
for rank in (3, 4):
    for heads in ((4, 4), (4, 2), (6, 1)):
        for scale in (None, 0.3):
            for causal in (0, 1):
                for sq, sk in ((5, 5), (3, 7), (7, 3), (1, 6)):
                    _add(
                        f"r{rank}_h{heads[0]}x{heads[1]}_s{scale}_c{causal}_{sq}x{sk}",
                        rank=rank,
                        q_heads=heads[0],
                        kv_heads=heads[1],
                        scale=scale,
                        causal=causal,
                        sq=sq,
                        sk=sk,
                    )

# masks: kind x shape x causal x layout (fully masked rows in every mask)
MASK_DIMS = {
    "SqT": ("Sq", "T"),
    "B1SqT": ("B", 1, "Sq", "T"),
    "HSqT": ("H", "Sq", "T"),
    "1HSqT": (1, "H", "Sq", "T"),
    "BHSqT": ("B", "H", "Sq", "T"),
}
for kind in ("bool", "float"):
    for dims_name, dims in MASK_DIMS.items():
        for causal in (0, 1):
            for rank in (3, 4):
                _add(
                    f"mask_{kind}_{dims_name}_c{causal}_r{rank}",
                    rank=rank,
                    mask=kind,
                    mask_dims=dims,
                    causal=causal,
                    sq=6,
                    sk=9,
                    kv_heads=2,
                )

# softcap, alone and with masks / causal / scale
for softcap in (2.0, 30.0):
    for mask in (None, "bool", "float"):
        for causal in (0, 1):
            _add(
                f"softcap{softcap:g}_{mask}_c{causal}",
                softcap=softcap,
                mask=mask,
                causal=causal,
                scale=0.7,
                sq=5,
                sk=8,
            )

# past key/value: causal alignment with the past, Sq == 1 decoding, empty past, masks, 3D, GQA
for rank in (3, 4):
    for causal in (0, 1):
        for sq, sk, past in ((3, 3, 4), (1, 1, 6), (1, 3, 4), (4, 2, 3), (2, 5, 0), (6, 2, 1)):
            _add(
                f"past_r{rank}_c{causal}_{sq}x{sk}_p{past}",
                rank=rank,
                causal=causal,
                sq=sq,
                sk=sk,
                past=past,
                kv_heads=2,
            )
        for mask in ("bool", "float"):
            _add(f"past_{mask}_r{rank}_c{causal}", rank=rank, causal=causal, sq=4, sk=2, past=5, mask=mask)
_add("present_no_past_r4", present=True, causal=1, kv_heads=2)
_add("present_no_past_r3", rank=3, present=True, causal=1, kv_heads=2)
_add("past_softcap_gqa", past=3, sq=2, sk=2, softcap=5.0, causal=1, q_heads=6, kv_heads=3, mask="float")
_add("v_head_dim_differs", v_head_dim=6, past=2, sq=3, sk=3, causal=1)
_add("v_head_dim_differs_r3", rank=3, v_head_dim=6, past=2, sq=3, sk=3, causal=1, kv_heads=2)

# nonpad_kv_seqlen (opset 24): padding, empty rows, with causal (bottom-right per batch) and masks
for causal in (0, 1):
    for nonpad in ((7, 7), (4, 0), (2, 6), (1, 3)):
        for rank in (3, 4):
            _add(
                f"nonpad_{nonpad[0]}_{nonpad[1]}_c{causal}_r{rank}",
                opset=24,
                rank=rank,
                causal=causal,
                nonpad=nonpad,
                sq=3,
                sk=7,
                kv_heads=2,
            )
    for mask in ("bool", "float"):
        _add(f"nonpad_{mask}_c{causal}", opset=24, causal=causal, nonpad=(5, 2), sq=4, sk=7, mask=mask)
_add("nonpad_softcap_sq_eq_sk", opset=24, causal=1, nonpad=(6, 3), sq=6, sk=6, softcap=3.0)

# symbolic dims: the explicit masks are built from shapes at run time
_add("dynamic_past_decode", dynamic=("Sq", "Sk", "P", "B"), past=4, sq=1, sk=2, causal=1)
_add("dynamic_past_prefill", dynamic=("Sq", "Sk", "P", "B"), past=4, sq=3, sk=3, causal=1, mask="float")
_add("dynamic_past_empty", dynamic=("Sq", "Sk", "P"), past=0, sq=1, sk=3, causal=1)
_add("dynamic_past_r3", rank=3, dynamic=("Sq", "Sk", "P"), past=2, sq=3, sk=2, causal=1, kv_heads=2)
_add("dynamic_nonpad", opset=24, dynamic=("Sq", "Sk", "B"), nonpad=(3, 5), sq=2, sk=5, causal=1, mask="bool")
_add("dynamic_no_past_causal", dynamic=("Sq", "Sk"), sq=2, sk=6, causal=1)

# opset 24 without its new input, float16, softmax_precision
_add("opset24_plain", opset=24, causal=1, mask="bool", sq=4, sk=6)
_add("float16", dtype=F16, causal=1, sq=4, sk=6)
_add("float16_r3_gqa_past", dtype=F16, rank=3, kv_heads=2, past=3, sq=2, sk=2, causal=1, softcap=4.0)
_add("float16_masks", dtype=F16, mask="float", sq=5, sk=6)
_add("float16_bool_nonpad", dtype=F16, opset=24, mask="bool", nonpad=(4, 0), sq=3, sk=6, causal=1)
_add("softmax_precision_float", softmax_precision=1, causal=1, mask="float")
_add("opset25_like_24", opset=25, causal=1, mask="bool", past=2, sq=3, sk=3)

# longer sequences (many online-softmax tiles; whichever kernel ORT picks for the size)
_add("long_past_gqa_float_mask", past=40, sq=33, sk=33, causal=1, q_heads=8, kv_heads=2, mask="float", head_dim=32)
_add("long_nonpad_bool_softcap", opset=24, nonpad=(150, 97), sq=150, sk=150, causal=1, mask="bool", softcap=20.0)


def _ort_runs(c: Case) -> bool:
    model, feeds = build(c)
    try:
        run_ort(model, feeds)
    except Exception:
        return False
    return True


@pytest.mark.parametrize("name", sorted(GRID))
def test_attention_fuses_and_matches_ort(name):
    c = GRID[name]
    model, feeds = build(c)
    try:
        want = run_ort(model, feeds)
    except Exception as exc:  # noqa: BLE001 - what ORT refuses need not be rewritten
        pytest.skip(f"ONNX Runtime does not run this combination: {str(exc)[:200]}")
    block = check_fused(c, model, feeds, want)
    if c.scale is None:
        assert block.scale == pytest.approx(1 / math.sqrt(c.head_dim), rel=1e-7)
    else:
        assert block.scale == pytest.approx(c.scale, rel=1e-7)
    assert (block.heads, block.kv_heads, block.head_dim) == (c.q_heads, c.kv_heads, c.head_dim)


# ------------------------------------------------------------------ ORT behaviours the rewrite relies on


def _keys_seen(c: Case):
    """Which keys each query of batch 0, head 0 attends in ORT, probed with one-hot values."""
    c = replace(c, v_head_dim=c.total, batch=1, nonpad=c.nonpad[:1] if c.nonpad else None)
    model, feeds = build(c)
    eye = np.eye(c.total, dtype=np.float32)[None, None].repeat(c.kv_heads, 1)
    if c.past is not None:
        feeds["past_value"] = np.ascontiguousarray(eye[:, :, : c.past])
    feeds["V"] = np.ascontiguousarray(eye[:, :, c.past or 0 :])
    return (run_ort(model, feeds)["Y"][0, 0] > 1e-7).astype(int)


def test_ort_causal_is_top_left_without_past():
    seen = _keys_seen(Case(causal=1, sq=2, sk=4))
    assert seen.tolist() == [[1, 0, 0, 0], [1, 1, 0, 0]]


def test_ort_causal_is_offset_by_the_past():
    seen = _keys_seen(Case(causal=1, sq=2, sk=2, past=3))
    assert seen.tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]


def test_ort_causal_is_dropped_for_one_query_after_a_past():
    seen = _keys_seen(Case(causal=1, sq=1, sk=3, past=2))
    assert seen.tolist() == [[1, 1, 1, 1, 1]]  # j <= i + P would hide the last two
    assert _keys_seen(Case(causal=1, sq=1, sk=3)).tolist() == [[1, 0, 0]]


def test_ort_causal_with_nonpad_is_bottom_right_per_batch():
    seen = _keys_seen(Case(opset=24, causal=1, sq=2, sk=6, nonpad=(4,)))
    assert seen.tolist() == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0]]


def test_ort_fully_masked_rows_are_zero_and_lowest_counts_as_masked():
    c = Case(mask="float", sq=4, sk=5, batch=1, q_heads=1, kv_heads=1)
    model, feeds = build(c)
    y = run_ort(model, feeds)["Y"][0, 0]
    v = feeds["V"][0, 0]
    assert not y[0].any() and not y[1].any()  # all -inf; all finfo.min
    np.testing.assert_allclose(y[2], v.mean(0), atol=1e-6)  # all -1e30: uniform, not masked
    assert not y[3].any()  # -inf and finfo.min mixed


def test_ort_softcap_comes_before_the_mask():
    c = Case(mask="bool", softcap=2.0, sq=3, sk=4, batch=1, q_heads=1, kv_heads=1, scale=1.0)
    model, feeds = build(c)
    y = run_ort(model, feeds)["Y"][0, 0]
    q, k, v, m = feeds["Q"][0, 0], feeds["K"][0, 0], feeds["V"][0, 0], feeds["attn_mask"][0, 0]
    s = 2.0 * np.tanh(q @ k.T / 2.0)
    s = np.where(m, s, -np.inf)
    with np.errstate(invalid="ignore"):
        p = np.exp(s - s.max(-1, keepdims=True))
        p = np.nan_to_num(p / p.sum(-1, keepdims=True))
    np.testing.assert_allclose(y, p @ v, atol=1e-5)


# ------------------------------------------------------------------ kept, with the reason


def _kept(c: Case, reason: str, model=None):
    if model is None:
        model, _ = build(c)
    fused, blocks = fuse(model)
    assert len(blocks) == 1 and not blocks[0].fused
    assert reason in blocks[0].reason, blocks[0].reason
    assert [n.op_type for n in fused.graph.node] == ["Attention"]


def test_qk_matmul_output_keeps_the_node():
    c = Case(qk_output=True, causal=1)
    assert _ort_runs(c)
    _kept(c, "qk_matmul_output")


def test_unread_qk_matmul_output_does_not_block():
    c = Case(qk_output=True, causal=1)
    model, feeds = build(c)
    del model.graph.output[1]  # declared on the node, read by nothing
    want = run_ort(model, feeds)
    fused, blocks = fuse(model)
    assert blocks[0].fused and "qk_matmul_output" in blocks[0].reason
    assert_same(run_fused(fused, feeds, "online"), want, False)


def test_default_scale_needs_a_static_head_size():
    model, feeds = build(Case())
    for vi in model.graph.input[:3]:
        vi.type.tensor_type.shape.dim[3].dim_param = "D"
    assert run_ort(model, feeds)
    _kept(Case(), "head size is not static", model)
    model.graph.node[0].attribute.append(helper.make_attribute("scale", 0.25))
    fused, blocks = fuse(model)
    assert blocks[0].fused
    assert_same(run_fused(fused, feeds, "naive"), run_ort(model, feeds), False)


def test_3d_without_head_counts_is_kept():
    model, _ = build(Case(rank=3))
    del model.graph.node[0].attribute[1:]  # q_num_heads, kv_num_heads
    _kept(Case(rank=3), "q_num_heads", model)


def test_opset_below_23_is_not_read():
    model, _ = build(Case())
    ir_model = ir.serde.deserialize_model(model)
    blocks = fuse_graph(ir_model.graph, 22, SoftmaxPolicy("naive"), (AttentionOpFrontEnd(),)).blocks
    assert not blocks[0].fused and "opset 22" in blocks[0].reason


def test_report_describes_the_block():
    block = check_fused(Case(rank=3, q_heads=4, kv_heads=2, past=2, sq=2, sk=2, causal=1, mask="bool", softcap=3.0))
    assert block.pattern == "Attention(3D, GQA 4/2)"
    assert "bool attn_mask" in block.mask and "causal (offset by the past length)" in block.mask
    assert "past_key/value" in block.mask and "softcap 3" in block.mask
    assert block.softmax == "naive"


def test_two_attention_nodes_in_one_graph():
    model, feeds = build(Case(causal=1, sq=4, sk=4, kv_heads=2))
    first = model.graph.node[0]
    second = helper.make_node("Attention", ["Y", "K", "V"], ["Y2"], name="second", scale=0.5)
    model.graph.node.append(second)
    model.graph.output.append(helper.make_tensor_value_info("Y2", F32, None))
    assert first.name == "attention"
    want = run_ort(model, feeds)
    fused, blocks = fuse(model)
    assert [b.fused for b in blocks] == [True, True]
    assert [n.op_type for n in fused.graph.node].count("FlashAttention") == 2
    assert_same(run_fused(fused, feeds, "online"), want, False)


# ------------------------------------------------------------------ the same math, op by op

EXPANDED = {
    "plain": Case(),
    "gqa": Case(kv_heads=2),
    "causal": Case(causal=1, sq=3, sk=6),
    "bool_mask": Case(mask="bool"),
    "float_mask": Case(mask="float"),
    "softcap": Case(softcap=3.0, mask="bool"),
    "rank3": Case(rank=3, kv_heads=2),
    "past": Case(past=2, sq=2, sk=2, causal=1),
}


def expanded(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its Attention node replaced by the op's ONNX function body."""
    case_node = pytest.importorskip("onnx.backend.test.case.node")
    node = onnx.NodeProto()
    node.CopyFrom(model.graph.node[0])  # the helper adds the schema's defaults to the node it is given
    types = {vi.name: vi.type for vi in model.graph.input}
    opset = model.opset_import[0].version
    (nodes, opsets), *_ = case_node.function_testcase_helper(
        node, [types[n] if n else onnx.TypeProto() for n in node.input], "x", [helper.make_opsetid("", opset)]
    )[0]
    graph = helper.make_graph(nodes, "expanded", list(model.graph.input), list(model.graph.output))
    out = helper.make_model(graph, opset_imports=list(opsets) or [helper.make_opsetid("", opset)])
    out.ir_version = model.ir_version
    return out


@pytest.mark.parametrize("name", sorted(EXPANDED))
def test_expanded_function_body_fuses(name):
    model, feeds = build(EXPANDED[name])
    body = expanded(model)
    want = run_ort(body, feeds)
    fused, report = ortflash.optimize(body, target="ortflash")
    assert report.fused == 1, report.blocks[0].reason if report.blocks else "no Softmax"
    for mode in ("naive", "online"):
        assert_same(run_fused(fused, feeds, mode), want, False)


# ---------------------------------------------------------------------------------------------
# lowering after fusion: the report follows each block to its native op (review defect B2)


@pytest.mark.parametrize("target, op", [("contrib", "com.microsoft.MultiHeadAttention"), ("onnx", "Attention")])
def test_optimize_with_a_target_reports_attention_op_blocks_as_lowered(target, op):
    model, feeds = build(Case(mask="float"))
    lowered, report = ortflash.optimize(model, target=target)
    (block,) = report.blocks
    assert block.fused and block.lowered_to == op, (block.lowered_to, block.reason)
    assert not any(n.op_type == spec.OP_TYPE for n in lowered.graph.node)
    assert_same(run_ort(lowered, feeds), run_ort(model, feeds), f16=False)


def test_cli_does_not_warn_that_a_lowered_attention_op_block_stays(tmp_path, capsys):
    from ortflash.cli import main

    path = tmp_path / "attn23.onnx"
    onnx.save(build(Case(mask="bool"))[0], str(path))
    assert main(["optimize", str(path), "-o", str(tmp_path / "out.onnx"), "--target", "contrib"]) == 0
    out = capsys.readouterr().out
    assert "stay FlashAttention" not in out and "fused →" in out  # the table folds the op's name
