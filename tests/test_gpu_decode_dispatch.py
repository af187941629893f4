"""--ep cuda / --ep webgpu on a KV-cache decoder whose length is known only at run time (issue 31
item 4): an If on the run's key length whose fused branch holds the EP's lowered form (no
FlashAttention anywhere), taken for a prefill from the table's crossover, and the original ops for
a one-query decode step (forms.GPU_DECODE_CROSSOVERS: none measured to win). Run on the CPU EP,
which runs both branches' ops, with the If's condition exposed to say which side ran.

The If is written on a GPU EP only where forms.LOWERED_DISPATCH_EPS lists it, and none is listed:
on the H200 the If itself measured slower than the original ops (benchmarks/results/decode_gpu.md).
The tests of the If list the EP themselves; the default is held by its own test."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ortflash
from ortflash.model_io import graphs_of
from ortflash.op.node import DISPATCH_KEY
from ortflash.pipeline import forms

ROOT = Path(__file__).resolve().parent.parent
LLAMA = ROOT / "models" / "llama_cache_eager_torchscript.onnx"  # 4 query / 2 kv heads of 16, 2 layers


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for g in graphs_of(model.graph) for n in g.node]


def _with_conditions(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A copy with each length If's condition added to the outputs."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    conditions = sorted({n.input[0] for n in out.graph.node if n.op_type == "If"})
    out.graph.output.extend(onnx.ValueInfoProto(name=c) for c in conditions)
    return out, conditions


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def _decoder_feeds(seq: int, past: int, batch: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seq * 7919 + past)
    feeds = {
        "input_ids": rng.integers(0, 100, (batch, seq)).astype(np.int64),
        "attention_mask": np.ones((batch, past + seq), np.int64),
    }
    for layer in range(2):
        for kv in ("key", "value"):
            feeds[f"past_key_values.{layer}.{kv}"] = rng.standard_normal((batch, 2, past, 16)).astype(np.float32)
    return feeds


def _check_sides(
    original: onnx.ModelProto,
    dispatched: onnx.ModelProto,
    cases: list[tuple[dict[str, np.ndarray], bool]],
    atol: float,
) -> None:
    exposed, conditions = _with_conditions(dispatched)
    for feeds, fused in cases:
        got = _run(exposed, feeds)
        want = _run(original, feeds)
        outputs, taken = got[: len(want)], got[len(want) :]
        assert [bool(np.asarray(t).reshape(-1)[0]) for t in taken] == [fused] * len(conditions), {
            k: v.shape for k, v in feeds.items()
        }
        for a, b in zip(outputs, want):
            assert np.abs(a.astype(np.float32) - b.astype(np.float32)).max() <= atol


@pytest.fixture
def gpu_if(monkeypatch: pytest.MonkeyPatch) -> None:
    """The If on the length allowed on both GPU EPs, as a measurement that found it faster would."""
    monkeypatch.setattr(forms, "LOWERED_DISPATCH_EPS", ("cuda", "webgpu"))


@pytest.mark.parametrize("ep", ["cuda", "webgpu"])
def test_by_default_no_gpu_ep_writes_the_if_and_the_row_says_why(ep: str) -> None:
    """As measured, the If costs more than it saves on both GPU EPs: the blocks keep their ops."""
    assert forms.LOWERED_DISPATCH_EPS == ()
    model, report = ortflash.optimize(cached_float16_block() if ep == "cuda" else onnx.load(str(LLAMA)), ep=ep)
    assert "If" not in _ops(model) and "FlashAttention" not in _ops(model)
    assert all(not b.fused for b in report.blocks if b.mask_kind)
    assert all(forms.GPU_DECODE_RESULTS in b.detail for b in report.blocks if b.mask_kind)


def test_ep_webgpu_lowers_a_decoders_prefill_and_keeps_its_decode_steps(gpu_if: None) -> None:
    original = onnx.load(str(LLAMA))
    model, report = ortflash.optimize(original, ep="webgpu")
    ops = _ops(model)
    assert "FlashAttention" not in ops
    assert ops.count("If") == 2 and ops.count("MultiHeadAttention") == 2 and ops.count("Softmax") == 2
    start = forms.crossover("webgpu", 16, "causal", "webgpu")
    assert start == 1024
    for block in report.blocks:
        assert block.fused and block.lowered_to == "com.microsoft.MultiHeadAttention"
        assert block.fused_from == start
    for node in (n for n in model.graph.node if n.op_type == "If"):
        meta = next(p.value for p in node.metadata_props if p.key == DISPATCH_KEY)
        assert '"decode_key_len": null' in meta
        then = next(a.g for a in node.attribute if a.name == "then_branch")
        assert [n.op_type for n in then.node].count("MultiHeadAttention") == 1
    _check_sides(
        original,
        model,
        [
            (_decoder_feeds(start, 0), True),  # a prefill at the crossover: lowered
            (_decoder_feeds(8, start), True),  # a chunk of 8 queries past the crossover: lowered
            (_decoder_feeds(1, start + 100), False),  # a decode step past the crossover: the original ops
            (_decoder_feeds(1, 127), False),
            (_decoder_feeds(16, 0), False),  # a short prefill: the original ops
        ],
        atol=1e-4,
    )


def cached_float16_block(heads: int = 4, head_dim: int = 32) -> onnx.ModelProto:
    """softmax(q · Concat(past_key, key)ᵀ · s) · Concat(past_value, value), float16, BNSH, no mask."""
    elem = TensorProto.FLOAT16
    scale = np.array(head_dim**-0.5, np.float16)
    graph = helper.make_graph(
        [
            helper.make_node("Concat", ["past_key", "key"], ["present_key"], axis=2),
            helper.make_node("Concat", ["past_value", "value"], ["present_value"], axis=2),
            helper.make_node("Transpose", ["present_key"], ["kt"], perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", ["query", "kt"], ["s0"]),
            helper.make_node("Mul", ["s0", "scale"], ["s1"]),
            helper.make_node("Softmax", ["s1"], ["p"], axis=-1),
            helper.make_node("MatMul", ["p", "present_value"], ["out"]),
        ],
        "cached_float16_block",
        [
            helper.make_tensor_value_info(name, elem, ["batch", heads, length, head_dim])
            for name, length in (
                ("query", "seq"),
                ("key", "seq"),
                ("value", "seq"),
                ("past_key", "past"),
                ("past_value", "past"),
            )
        ],
        [
            helper.make_tensor_value_info(name, elem, ["batch", heads, length, head_dim])
            for name, length in (("out", "seq"), ("present_key", "total"), ("present_value", "total"))
        ],
        [helper.make_tensor("scale", elem, [], scale.tobytes(), raw=True)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _block_feeds(seq: int, past: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seq * 31 + past)
    feeds = {n: rng.standard_normal((1, 4, seq, 32)).astype(np.float16) for n in ("query", "key", "value")}
    feeds.update({n: rng.standard_normal((1, 4, past, 32)).astype(np.float16) for n in ("past_key", "past_value")})
    return feeds


def test_ep_cuda_lowers_a_float16_cached_blocks_prefill_and_keeps_its_decode_steps(gpu_if: None) -> None:
    original = cached_float16_block()
    model, report = ortflash.optimize(original, ep="cuda")
    ops = _ops(model)
    assert "FlashAttention" not in ops and ops.count("If") == 1 and ops.count("MultiHeadAttention") == 1
    start = forms.crossover("cuda", 32, "none", "cuda", "float16")
    assert start is not None and report.blocks[0].fused_from == start
    assert forms.GPU_DECODE_CROSSOVERS["cuda"] is None
    _check_sides(
        original,
        model,
        [
            (_block_feeds(start, 0), True),
            (_block_feeds(1, 4 * start), False),  # a decode step far past the crossover: the original ops
            (_block_feeds(4, 2 * start), True),
            (_block_feeds(start // 2, 0), False),
        ],
        atol=2e-3,
    )


@pytest.mark.parametrize("ep", ["cuda", "webgpu"])
def test_a_gpu_decode_crossover_lets_a_long_decode_step_take_the_lowered_form(
    ep: str, monkeypatch: pytest.MonkeyPatch, gpu_if: None
) -> None:
    """Where a GPU decode crossover is measured, a one-query step takes the lowered form from it."""
    monkeypatch.setattr(forms, "GPU_DECODE_CROSSOVERS", {**forms.GPU_DECODE_CROSSOVERS, ep: 256})
    original = cached_float16_block()
    model, report = ortflash.optimize(original, ep=ep)
    assert report.blocks[0].fused and "FlashAttention" not in _ops(model)
    start = report.blocks[0].fused_from
    assert start is not None
    cases = [(_block_feeds(1, 300), True), (_block_feeds(1, 100), False), (_block_feeds(start, 0), True)]
    if start > 300:  # webgpu's no-mask row: a prefill of 300 keys keeps the original ops, a step does not
        cases.append((_block_feeds(300, 0), False))
    _check_sides(original, model, cases, atol=2e-3)


def test_an_op_listed_for_the_if_gets_it_and_no_other_form_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """forms.LOWERED_DISPATCH_OPS lets one lowered op take the If on an EP the If is otherwise off
    on: a float16 causal block whose length is known only at run time, lowered to Attention-23 on
    CUDA, is written inside an If on the length, the original ops below the crossover, both sides
    right against the original (CPU EP, float16's tolerance); the no-mask cached block, lowered to
    MultiHeadAttention, keeps its ops. By default none is listed (measured: a loss below the crossover on a lone block, forms.IF_RESULTS).
    The D64 row is held at 1024, as it was before it was measured from one key (a row that wins from
    one key needs no If: cuda_forms_short_causal.md), so that the mechanism is tested on a row that starts later."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import cuda_forms  # the benchmark's exported blocks (onnx only)

    table = forms.table

    def from_1024(ep: str | None, dtype: str | None, cpu_class: str | None = None) -> object:
        rows = table(ep, dtype, cpu_class)
        if ep != "cuda":
            return rows
        causal = {**rows["causal"], "cuda": {**rows["causal"]["cuda"], 64: 1024}}
        return {**rows, "causal": causal}

    monkeypatch.setattr(forms, "table", from_1024)

    assert dict(forms.LOWERED_DISPATCH_OPS) == {}
    original = cuda_forms.block("causal_mask", 64, "float16", None)
    assert "If" not in _ops(ortflash.optimize(original, ep="cuda")[0])
    monkeypatch.setattr(forms, "LOWERED_DISPATCH_OPS", {"cuda": frozenset({"Attention"})})
    model, report = ortflash.optimize(original, ep="cuda")
    ops = _ops(model)
    assert "FlashAttention" not in ops and ops.count("If") == 1 and ops.count("Attention") == 1
    assert "Softmax" in ops  # the original ops, in the If's else branch
    start = forms.crossover("cuda", 64, "causal", "cuda", "float16")
    assert start is not None and report.blocks[0].fused_from == start
    assert report.blocks[0].lowered_to == "Attention"
    assert [o.version for o in model.opset_import if o.domain == ""] == [23]
    assert "If" not in _ops(ortflash.optimize(cached_float16_block(), ep="cuda")[0])

    def feeds(seq: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seq)
        return {name: rng.standard_normal((1, seq, 16 * 64)).astype(np.float16) for name in ("q3", "k3", "v3")}

    _check_sides(original, model, [(feeds(start), True), (feeds(start // 16), False)], atol=2e-2)
