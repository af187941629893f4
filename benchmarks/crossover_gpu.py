"""What the GPU EPs' cost-table scripts share (crossover_webgpu.py, crossover_cuda.py): the
attention stacks they measure (benchmarks/cpu_attention.py's, float32 or float16), their make step
(the original and the lowered model over one weights file, which the run step rebuilds from the
seed), their inputs, the alternating timing rounds, the ratio table's rows and the command line.

Numpy and the standard library at import (the run step imports this on the GPU machine); onnx and
ortflash inside the make step.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_attention  # noqa: E402 - the sibling script (numpy + onnx only)
import ep_probe  # noqa: E402
import webgpu_zoo as wz  # noqa: E402

HEADS = 12
LAYERS = 2


def stem(case: Mapping[str, Any]) -> str:
    """A case's file stem: ``padding_d64`` (``padding_d64_float16`` where the case names a dtype)."""
    return f"{case['stack']}_d{case['head_dim']}" + (f"_{case['dtype']}" if "dtype" in case else "")


def _as_float16(model: Any) -> Any:
    """The same stack with every float tensor float16: initializers (values past float16's range
    clipped to it: the padding fill float32-lowest becomes float16-lowest, not -inf, whose product
    with 0 would be NaN), Casts to float, the graph's float inputs and outputs."""
    from onnx import TensorProto, numpy_helper

    low = float(np.finfo(np.float16).min)
    for t in model.graph.initializer:
        if t.data_type == TensorProto.FLOAT:
            array = np.clip(numpy_helper.to_array(t), low, -low).astype(np.float16)
            t.CopyFrom(numpy_helper.from_array(array, t.name))
    for node in model.graph.node:
        for a in node.attribute:
            if node.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.FLOAT16
    for value in list(model.graph.input) + list(model.graph.output):
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            value.type.tensor_type.elem_type = TensorProto.FLOAT16
    return model


def weights(case: Mapping[str, Any], folder: str) -> tuple[Any, dict[str, tuple[int, bytes]]]:
    """The case's original model, and its big initializers written to ``{stem}.data`` in folder."""
    model = cpu_attention.build_model(layers=LAYERS, stack=case["stack"], heads=HEADS, head_dim=case["head_dim"])
    if case.get("dtype") == "float16":
        model = _as_float16(model)
    table = wz._shared_weights(model, os.path.join(folder, f"{stem(case)}.data"))
    return model, table


def make(folder: str, cases: Sequence[Mapping[str, Any]], form: str) -> None:
    """Each case's original and its ``optimize`` + ``lower(.., form)`` model, over one weights
    file that the run step rebuilds; index.json lists the cases with what was fused and lowered."""
    import ortflash
    from ortflash.lowering import lower

    os.makedirs(folder, exist_ok=True)
    index = []
    for case in cases:
        name = stem(case)
        model, table = weights(case, folder)
        fused, report = ortflash.optimize(model, target="ortflash")
        lowered, notes = lower(fused, form)
        data = f"{name}.data"
        wz._save_sharing(model, os.path.join(folder, f"{name}.original.onnx"), data, table)
        wz._save_sharing(lowered, os.path.join(folder, f"{name}.{form}.onnx"), data, table)
        os.remove(os.path.join(folder, data))  # rebuilt there from the seed
        index.append({**case, "fused": report.fused, "notes": [str(n) for n in notes]})
        print(name, report.fused, [n.op for n in notes], flush=True)
    json.dump(index, open(os.path.join(folder, "index.json"), "w"), indent=1)


def feeds(case: Mapping[str, Any], s: int) -> dict[str, np.ndarray]:
    """Batch 1 at length s; the padding stack's last third of the keys padded."""
    rng = np.random.default_rng(s)
    x = rng.standard_normal((1, s, HEADS * case["head_dim"])).astype(case.get("dtype", "float32"))
    found = {"hidden_states": x}
    if case["stack"] == "padding":
        mask = np.ones((1, s), np.int64)
        mask[0, s - s // 3 :] = 0
        found["attention_mask"] = mask
    return found


def timed_run(sess: Any, feeds: Mapping[str, np.ndarray]) -> Callable[[], float]:
    """One ``sess.run`` on host inputs, timed in ms host to host."""

    def once() -> float:
        t0 = time.perf_counter()
        sess.run(None, dict(feeds))
        return (time.perf_counter() - t0) * 1e3

    return once


def alternating(
    timers: Mapping[str, Callable[[], float]], rounds: int, repeats: int, warm_each_round: bool = False
) -> dict[str, float]:
    """Median ms per variant over ``rounds`` rounds of ``repeats`` timed calls (each timer runs
    one call and returns its ms), the variants' order reversed every other round; with
    ``warm_each_round``, one untimed call before each variant's calls of a round."""
    variants = list(timers)
    times: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(rounds):
        for v in variants if r % 2 == 0 else variants[::-1]:
            if warm_each_round:
                timers[v]()
            times[v] += [timers[v]() for _ in range(repeats)]
    return {v: statistics.median(t) for v, t in times.items()}


def measure_lengths(
    case: Mapping[str, Any],
    sessions: Mapping[str, Any],
    timers_for: Callable[
        [Mapping[str, Any], Mapping[str, Mapping[str, np.ndarray]]], Mapping[str, Callable[[], float]]
    ],
    seq_lens: Sequence[int],
    until: float,
    rounds: int,
    repeats: int,
    warm_each_round: bool = False,
    ms_digits: int | None = None,
) -> tuple[dict[int, float | None], list[dict[str, Any]]]:
    """One case's sessions ("original" and the form) at each length while ``time.perf_counter()``
    is before ``until``: the ratios original ms / form ms (None past the budget) and a row per
    length measured. ``timers_for(sessions, feeds)`` gives each variant's timer (alternating's)."""
    original, form = sessions
    ratios: dict[int, float | None] = {}
    rows = []
    for s in seq_lens:
        if time.perf_counter() > until:
            ratios[s] = None
            continue
        found = feeds(case, s)
        names = {v: [i.name for i in sess.get_inputs()] for v, sess in sessions.items()}
        own = {v: {k: x for k, x in found.items() if k in names[v]} for v in sessions}
        outs = {v: sess.run(None, own[v])[0] for v, sess in sessions.items()}
        ms = alternating(timers_for(sessions, own), rounds, repeats, warm_each_round)
        if ms_digits is not None:
            ms = {v: round(t, ms_digits) for v, t in ms.items()}
        ratios[s] = round(ms[original] / ms[form], 3)
        err = float(np.nanmax(np.abs(outs[original].astype(np.float64) - outs[form])))
        named = {k: case[k] for k in ("stack", "head_dim", "dtype") if k in case}
        rows.append({**named, "seq": s, "ms": ms, "ratio": ratios[s], "max_abs_diff": err})
        print(json.dumps(rows[-1]), flush=True)
    return ratios, rows


def ratio_cells(row: Mapping[str, Any], seq_lens: Sequence[int]) -> list[str]:
    """A crossover row's ratios as table cells ("-" where not measured)."""
    return [("-" if row["ratios"].get(str(s)) is None else f"{row['ratios'][str(s)]:.2f}") for s in seq_lens]


def main(
    doc: str | None,
    md: str,
    argv: list[str] | None,
    make: Callable[[str], object],
    run: Callable[[str, str, float], object],
    table: Callable[[str, str], object],
    budget_s: float,
) -> int:
    steps = ep_probe.StepCommandLine(doc, md=md, device=None)
    steps.run.add_argument("--budget-s", type=float, default=budget_s)
    return steps.call(
        argv,
        make=lambda args: make(args.folder),
        run=lambda args: run(args.folder, args.out, args.budget_s),
        table=lambda args: table(args.json, args.md),
    )
