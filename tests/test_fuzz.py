"""Property-based tests: attention subgraphs drawn from the grammar of the patterns, and near
misses. The optimized model either matches the original in ONNX Runtime in both softmax modes,
or leaves the block exactly as it was.

CI runs a bounded, seeded example count; for a longer local run:
    ORTFLASH_FUZZ_EXAMPLES=2000 pytest tests/test_fuzz.py
"""

import os

import numpy as np
import onnx
from attention_graphs import F16, F32, Variant, build, feeds
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import ortflash
from ortflash.op import spec

EXAMPLES = int(os.environ.get("ORTFLASH_FUZZ_EXAMPLES", "40"))


@st.composite
def bias_shapes(draw, rank, most=2):
    n = draw(st.integers(0, most))
    out = []
    for _ in range(n):
        if rank == 4:
            full = ["B", "H", "S", "T"]
        else:
            full = ["BH", "S", "T"]
        dims = [d if draw(st.booleans()) else 1 for d in full]
        dims = dims[draw(st.integers(0, len(dims) - 1)) :]  # lower ranks broadcast too
        out.append(tuple(dims))
    return tuple(out)


@st.composite
def variants(draw):
    rank = draw(st.sampled_from([3, 4]))
    heads = draw(st.sampled_from([1, 2, 3]))
    dtype = draw(st.sampled_from([F32, F32, F16]))
    mask_kind = draw(st.sampled_from([None, "keep", "drop"]))
    v = Variant(
        scale=draw(st.sampled_from([1.0, 0.125, 0.3, 1 / np.sqrt(48), 2.0])),
        scale_site=draw(st.sampled_from(["div_scores", "mul_scores", "split_qk", "q_only", "none"])),
        k_form=draw(st.sampled_from(["transpose", "pretransposed"] + (["bshd"] if rank == 4 else []))),
        # float16: one bias at most; two padding biases of float16's lowest overflow to -inf
        # in the original graph, which the float32-accumulating kernel does not reproduce.
        bias_shapes=tuple(
            tuple(heads if d == "H" else d for d in s) for s in draw(bias_shapes(rank, 1 if dtype == F16 else 2))
        ),
        where_mask=mask_kind,
        mask_shape=("B", 1, "S", "T") if rank == 4 else ("BH", "S", "T"),
        fill=draw(st.sampled_from([-np.inf, float(np.finfo(np.float32).min), -1e4])),
        softmax_cast=dtype == F16 and draw(st.booleans()),
        nan_guard=draw(st.booleans()),
        rank=rank,
        # near misses: another softmax axis
        softmax_axis=draw(st.sampled_from([-1, -1, -1, rank - 1, rank - 2])),
        dtype=dtype,
        heads=heads,
        head_dim=draw(st.sampled_from([8, 16, 48])),
    )
    if v.scale_site == "none":
        v.scale = 1.0
    return v


def _near_miss(model: onnx.ModelProto, draw_kind: int) -> onnx.ModelProto:
    """Make the block not attention in one way the rules must notice."""
    g = model.graph
    if draw_kind == 1:  # scores also a graph output: block fuses, scores stay computed
        g.output.append(onnx.helper.make_tensor_value_info("s0", g.output[0].type.tensor_type.elem_type, None))
    elif draw_kind == 2:  # probabilities read by a second consumer
        g.output.append(onnx.helper.make_tensor_value_info("p", onnx.TensorProto.UNDEFINED, None))
    return model


def _run(model, f, **policy):
    return ortflash.InferenceSession(model, **policy).run(None, f)


@seed(20261129)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    v=variants(),
    extra=st.sampled_from([0, 0, 0, 1, 2]),
    sizes=st.tuples(st.integers(1, 2), st.integers(1, 9), st.integers(1, 40)),
)
def test_fused_or_untouched(v, extra, sizes):
    model = _near_miss(build(v), extra)
    if extra == 2:
        model.graph.output[-1].CopyFrom(
            onnx.helper.make_tensor_value_info("p", F32 if v.softmax_cast or v.dtype == F32 else F16, None)
        )
    b, s, t = sizes
    dims = {"B": b, "S": s, "T": t, "BH": b * v.heads}
    f = feeds(model, dims, np.random.default_rng(s * 100 + t))
    fused, report = ortflash.optimize(model, target="ortflash")
    want = _run(model, f)
    if report.fused == 0:
        assert [n.op_type for n in fused.graph.node] == [n.op_type for n in model.graph.node], report.blocks
        return
    assert v.softmax_axis in (-1, v.rank - 1)
    assert sum(n.op_type == spec.OP_TYPE for n in fused.graph.node) == 1
    tol = 3e-3 if v.dtype == F16 else 3e-5
    for mode in ("naive", "online"):
        got = _run(fused, f, softmax=mode, block_size=7)
        for w, g in zip(want, got):
            w, g = w.astype(np.float64), g.astype(np.float64)
            assert np.array_equal(np.isnan(w), np.isnan(g)), (report.blocks, mode)
            np.testing.assert_allclose(np.nan_to_num(g), np.nan_to_num(w), rtol=tol * 10, atol=tol)
