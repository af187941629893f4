"""--target webgpu: per block the form ONNX Runtime's WebGPU EP runs on the GPU and computes right.

Here (CPU EP) every chosen form must compute exactly what the FlashAttention node computes; where
a WebGPU adapter exists (onnxruntime-ep-webgpu), the same forms must also match on the WebGPU EP.
The choices rest on the capability table in ortflash/lowering/webgpu.py, which must agree with the
committed measurement (benchmarks/results/webgpu_capabilities.json). The defect reproductions
under tests/data/webgpu_defects/ must load, and run (printing SKIP where there is no adapter)."""

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from attention_graphs import F16, Variant, build, swap_for_zeros
from attention_graphs import feeds as graph_feeds
from onnx import TensorProto as TP
from onnx import helper as h

import ortflash
from ortflash.checks.compare import compare
from ortflash.checks.feeds import make_feeds
from ortflash.checks.sessions import run_model
from ortflash.lowering import OP_GQA, OP_MHA, TARGETS, lower
from ortflash.lowering.webgpu import CAPABILITIES
from ortflash.op import side_channel, spec

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
DEFECTS = os.path.join(HERE, "data", "webgpu_defects")
LOWEST = float(np.finfo(np.float32).min)


def fa_model(hq=4, hkv=4, d=8, k_len="S", bias=None, mask=None, dtype=TP.FLOAT, opset=17, **attrs):
    """One FlashAttention node over inputs q, k, v (+ bias, mask); B, S and k_len symbolic."""
    inputs = [
        h.make_tensor_value_info("q", dtype, ["B", hq, "S", d]),
        h.make_tensor_value_info("k", dtype, ["B", hkv, k_len, d]),
        h.make_tensor_value_info("v", dtype, ["B", hkv, k_len, d]),
    ]
    inits, names = [], ["q", "k", "v"]
    for name, shape, elem, neutral in (("bias", bias, TP.FLOAT, np.float32(0)), ("mask", mask, TP.BOOL, np.bool_(1))):
        if shape is None:
            inits.append(onnx.numpy_helper.from_array(np.array(neutral), f"no_{name}"))
            names.append(f"no_{name}")
        else:
            inputs.append(h.make_tensor_value_info(name, elem, [k_len if s == "T" else s for s in shape]))
            names.append(name)
    side = {k: attrs.pop(k) for k in list(attrs) if k in spec.SIDE_CHANNEL_INTS}
    node_attrs = spec.validate({**attrs, **side})
    node_attrs["exact_floats"] = side_channel.SideChannel.of_attributes(node_attrs).encode()
    for k in spec.SIDE_CHANNEL_INTS:
        if k not in side:
            node_attrs.pop(k, None)
    node = h.make_node(spec.OP_TYPE, names, ["o"], domain=spec.DOMAIN, name="fa", **node_attrs)
    out = h.make_tensor_value_info("o", dtype, ["B", hq, "S", d])
    graph = h.make_graph([node], "fa", inputs, [out], inits)
    opsets = [h.make_opsetid("", opset), h.make_opsetid(spec.DOMAIN, spec.DOMAIN_VERSION)]
    return h.make_model(graph, opset_imports=opsets, ir_version=8)


def fa_feeds(model, sizes, seed):
    """Random inputs. Item 1 is padded on the left (3 keys); item 0's first two query rows have every
    key masked (-inf in a bool mask, float32-lowest in a bias): fully masked rows in every case."""
    rng = np.random.default_rng(seed)
    out = {}
    for vi in model.graph.input:
        t = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else sizes[d.dim_param] for d in t.shape.dim]
        if t.elem_type == TP.BOOL:
            x = rng.random(shape) > 0.3
            x[1, ..., :3] = False
            if x.shape[-2] > 1:
                x[0, ..., :2, :] = False
            else:
                x[0] = False
        else:
            x = rng.standard_normal(shape).astype(np.float16 if t.elem_type == TP.FLOAT16 else np.float32)
            if vi.name == "bias":
                x[1, ..., :3] = LOWEST
                if x.shape[-2] > 1:
                    x[0, ..., :2, :] = LOWEST
        out[vi.name] = x
    return out


SQ_EQ_SK = [{"B": 2, "S": 6}, {"B": 2, "S": 17}]
CROSS = [{"B": 2, "S": 5, "T": 9}, {"B": 2, "S": 9, "T": 5}]

# name -> (fa_model arguments, op chosen, sizes)
CHOSEN = {
    "causal": (dict(is_causal=1), OP_GQA, SQ_EQ_SK),
    "causal_grouped_heads": (dict(hkv=2, is_causal=1), OP_GQA, SQ_EQ_SK),
    "causal_guarded": (dict(hkv=2, is_causal=1, masked_rows="zero"), OP_GQA, SQ_EQ_SK),
    "causal_head_size_12": (dict(is_causal=1, d=12), OP_MHA, SQ_EQ_SK),
    "causal_cross_lengths": (dict(is_causal=1, k_len="T"), OP_MHA, CROSS),
    "causal_left_padding_bias": (dict(is_causal=1, bias=("B", 1, 1, "S"), mask_fill=LOWEST), OP_MHA, SQ_EQ_SK),
    "padding_mask_neginf": (dict(mask=("B", 1, "S", "T"), k_len="T"), OP_MHA, CROSS),
    "padding_mask_neginf_zero_guard": (
        dict(mask=("B", 1, "S", "T"), k_len="T", masked_rows="zero"),
        OP_MHA,
        CROSS,
    ),
    "causal_mask_grouped": (dict(hkv=2, is_causal=1, mask=("B", 1, "S", "S")), OP_MHA, SQ_EQ_SK),
    "per_head_bias_and_mask": (dict(bias=("B", 4, "S", "S"), mask=("B", 1, 1, "S")), OP_MHA, SQ_EQ_SK),
    "opset_13": (dict(mask=("B", 1, 1, "S"), opset=13), OP_MHA, SQ_EQ_SK),
    # bottom-right causal (a decoder's block after cached keys): folded into attention_bias
    "bottom_right_causal_cache": (dict(is_causal=2, k_len="T"), OP_MHA, [{"B": 2, "S": 5, "T": 9}]),
    "bottom_right_causal_decode": (
        dict(hkv=2, is_causal=2, k_len="T", bias=("B", 1, 1, "T"), mask_fill=LOWEST),
        OP_MHA,
        [{"B": 2, "S": 1, "T": 9}],
    ),
}


def plain_run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def _tolerance(model):
    return (2e-2, 2e-3) if model.graph.input[0].type.tensor_type.elem_type == TP.FLOAT16 else (1e-4, 1e-5)


@pytest.mark.parametrize("name", sorted(CHOSEN))
def test_chosen_form_computes_what_flash_attention_computes(name):
    kwargs, op, sizes = CHOSEN[name]
    model = fa_model(**{"scale": 0.35, **kwargs})
    lowered, (note,) = lower(model, "webgpu")
    assert note.lowered and note.op == op, note
    onnx.checker.check_model(lowered)
    ops = [n.op_type for n in lowered.graph.node]
    assert spec.OP_TYPE not in ops and ops.count(op.rsplit(".", 1)[1]) == 1
    assert "Attention" not in ops and "Softmax" not in ops  # neither form the EP gets wrong or off the GPU
    assert ("GroupQueryAttention:" if op == OP_GQA else "MultiHeadAttention with attention_bias:") in note.reason
    rtol, atol = _tolerance(model)
    for i, size in enumerate(sizes):
        f = fa_feeds(model, {"T": size.get("T", size["S"]), **size}, i)
        want = run_model(model, f)["o"]  # FlashAttention through ortflash's kernel
        got = plain_run(lowered, f)["o"]
        d = compare(want, got, "o", rtol, atol)
        assert d.ok, (size, d)
        if "neginf" in name:
            assert np.isnan(want).any() == (name == "padding_mask_neginf"), "the feeds must have fully masked rows"


def test_fully_masked_rows_are_nan_even_where_the_native_op_gives_numbers():
    """The WebGPU EP's MultiHeadAttention gives finite values for rows whose bias is -inf everywhere
    (benchmarks/results/webgpu_capabilities.md, dead_rows_neginf). The lowering's guard must make
    them NaN whatever the op returns: here the op is swapped for one returning zeros everywhere."""
    model = fa_model(mask=("B", 1, "S", "S"), scale=0.35)
    lowered = swap_for_zeros(lower(model, "webgpu")[0])  # MHA -> zeros of its shape
    f = fa_feeds(model, {"B": 2, "S": 6}, 0)
    got = plain_run(lowered, f)["o"]
    dead = ~f["mask"].any(axis=-1)  # [B, 1, S]: rows with no visible key
    assert dead.sum() == 2, "item 0's first two rows"
    rows_nan = np.isnan(got).all(axis=-1)  # [B, H, S]
    assert np.array_equal(rows_nan, np.broadcast_to(dead, rows_nan.shape))
    assert np.all(got[~np.isnan(got)] == 0.0)


def test_rows_masked_with_lowest_are_the_mean_of_v_whatever_the_native_op_gives():
    """The zoo's GPT-2 and Llama blocks were wrong on the WebGPU EP where rows are masked with
    float32-lowest everywhere; the lowering selects the mean of V for those rows itself (what
    FlashAttention gives: every score equals the fill). The op is swapped for zeros, as above."""
    model = fa_model(bias=("B", 1, "S", "S"), hq=4, hkv=2, scale=0.35)
    lowered = swap_for_zeros(lower(model, "webgpu")[0])  # MHA -> zeros of its shape
    f = fa_feeds(model, {"B": 2, "S": 6}, 0)
    got = plain_run(lowered, f)["o"]  # [B, Hq, S, D]
    dead = (f["bias"] == LOWEST).all(axis=-1)[:, 0]  # [B, S]
    assert dead.sum() == 2
    mean_v = np.repeat(f["v"].mean(axis=2), 2, axis=1)  # [B, Hq, D], query head h reads kv head h // 2
    for b, i in zip(*np.nonzero(dead)):
        np.testing.assert_allclose(got[b, :, i], mean_v[b], rtol=1e-6, atol=1e-7)
    assert np.all(got[:, :, ~dead[0]][0] == 0.0) and np.all(got[1][:, ~dead[1]] == 0.0)
    # and with the real op, the same numbers as FlashAttention on those rows
    real, _ = lower(model, "webgpu")
    d = compare(run_model(model, f)["o"], plain_run(real, f)["o"], "o", 1e-4, 1e-5)
    assert d.ok, d


@pytest.mark.parametrize(
    "kwargs, why",
    [
        (dict(is_causal=1, softcap=2.0), "softcap"),
        (dict(mask=("B", 1, 1, "S"), mask_fill=-1e4), "mask_fill"),
    ],
)
def test_blocks_outside_the_table_stay_flash_attention(kwargs, why):
    model = fa_model(scale=0.35, **kwargs)
    lowered, (note,) = lower(model, "webgpu")
    assert lowered is model and not note.lowered and note.op == spec.OP_TYPE
    assert why in note.reason and "needs ortflash" in note.reason


def test_float16_block_lowers_between_casts_and_matches():
    model = build(Variant(dtype=F16, where_mask="keep", mask_shape=("B", 1, 1, "T"), softmax_cast=True))
    fused, report = ortflash.optimize(model, target="ortflash")
    lowered, (note,) = lower(fused, "webgpu")
    assert report.fused == 1 and note.lowered and note.op == OP_MHA
    f = graph_feeds(model, {"B": 2, "S": 5, "T": 7}, np.random.default_rng(0))
    f["mask"][0, ..., :] = False  # item 0: every key masked
    d = compare(run_model(fused, f)["out"], plain_run(lowered, f)["out"], "out", 2e-2, 2e-3)
    assert d.ok, d


def test_target_is_registered():
    assert "webgpu" in TARGETS


# ------------------------------------------------------------------------------------------------
# The capability table in code is the committed measurement


def test_capability_table_is_the_measured_one():
    with open(os.path.join(ROOT, "benchmarks", "results", "webgpu_capabilities.json")) as f:
        measured = json.load(f)
    rows = {(r["form"], r["case"]): r for r in measured["rows"]}
    assert len(rows) == len(measured["rows"]) >= 60
    for (form, case), cap in CAPABILITIES.items():
        r = rows[(form, case)]
        on_gpu = "error" not in r and r["nodes_on_webgpu"] == r["nodes"]
        right = "error" not in r and bool(r["ok"])
        assert (cap.on_gpu, cap.right) == (on_gpu, right), (form, case, r.get("error"))
    # the headline facts the choice rests on
    assert rows[("unfused", "nomask_s8192")]["max_abs"] > 1000
    assert "not implemented for webgpu" in rows[("mha_kpm", "padding")]["error"]
    assert rows[("attn23", "nomask_s4096")]["nodes_on_webgpu"] == 0


# ------------------------------------------------------------------------------------------------
# The zoo (CPU EP here; benchmarks/results/webgpu_zoo.md on the WebGPU EP)

# (the two cache decoders: bottom-right causal blocks, one decode step by make_feeds' default)
ZOO = (
    "gpt2_eager_dynamo",
    "llama_sdpa_dynamo",
    "t5_eager_dynamo",
    "llama_cache_sdpa_dynamo",
    "gpt2_cache_eager_torchscript",
)


@pytest.mark.parametrize("stem", ZOO)
def test_zoo_model_lowers_every_block_and_matches(stem):
    model = onnx.load(os.path.join(ROOT, "models", f"{stem}.onnx"))
    fused, report = ortflash.optimize(model, target="ortflash")
    lowered, notes = lower(fused, "webgpu")
    assert len(notes) == report.fused > 0 and all(n.lowered for n in notes), [n.reason for n in notes]
    assert {n.op for n in notes} <= {OP_MHA, OP_GQA}
    f = make_feeds(model, seq_len=21, batch=2, seed=0)  # item padded at the start: fully masked rows
    want, got = plain_run(model, f), plain_run(lowered, f)
    for name in want:
        d = compare(want[name], got[name], name, 1e-4, 1e-5)
        assert d.ok, d


# ------------------------------------------------------------------------------------------------
# Defect reproductions


def _scripts():
    return sorted(f for f in os.listdir(DEFECTS) if f.endswith(".py") and not f.startswith(("_", "make_")))


def test_every_reproduction_has_its_model_and_it_loads():
    scripts = _scripts()
    assert len(scripts) >= 6
    for script in scripts:
        path = os.path.join(DEFECTS, script[: -len(".py")] + ".onnx")
        model = onnx.load(path)
        onnx.checker.check_model(model)
        assert os.path.getsize(path) < 2048  # tiny: no weights, inputs made by the script
        ort.InferenceSession(path, providers=["CPUExecutionProvider"])


def _webgpu_adapter() -> bool:
    try:
        import onnxruntime_ep_webgpu as wep
    except ImportError:
        return False
    ort.register_execution_provider_library("webgpu", wep.get_library_path())
    return any(d.ep_name == wep.get_ep_name() for d in ort.get_ep_devices())


@pytest.mark.parametrize("script", ["softmax_neginf_row.py", "mha_key_padding_mask.py"])
def test_reproduction_runs_or_skips_cleanly(script):
    proc = subprocess.run(
        [sys.executable, os.path.join(DEFECTS, script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    if _webgpu_adapter():
        assert last == "REPRODUCED", proc.stdout
    else:
        assert last.startswith("SKIP: "), proc.stdout


@pytest.mark.skipif(not _webgpu_adapter(), reason="no WebGPU adapter (onnxruntime-ep-webgpu)")
@pytest.mark.parametrize("name", sorted(CHOSEN))
def test_chosen_form_matches_on_the_webgpu_ep(name):
    import onnxruntime_ep_webgpu as wep

    kwargs, _, sizes = CHOSEN[name]
    model = fa_model(**{"scale": 0.35, **kwargs})
    lowered, _ = lower(model, "webgpu")
    device = next(d for d in ort.get_ep_devices() if d.ep_name == wep.get_ep_name())
    so = ort.SessionOptions()
    so.add_provider_for_devices([device], {})
    sess = ort.InferenceSession(lowered.SerializeToString(), so)
    rtol, atol = _tolerance(model)
    for i, size in enumerate(sizes):
        f = fa_feeds(model, {"T": size.get("T", size["S"]), **size}, i)
        d = compare(run_model(model, f)["o"], sess.run(None, f)[0], "o", rtol, atol)
        assert d.ok, (size, d)
