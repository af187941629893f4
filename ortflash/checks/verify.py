"""Run an original and an optimized model in ONNX Runtime on the same inputs and compare.

``verify`` is one comparison on one set of inputs. ``verify_every_softmax`` is what the CLI runs: it makes sure
every fused node ran in each softmax it will run at deployment (``auto`` nodes: naive below
``min_seq_len`` keys, online from it), reading the key length each node actually saw. Where the
inputs given are too short for the online path, it runs again at ``min_seq_len`` when the model
accepts that length, and otherwise forces the missing mode on the short inputs, saying so.

Both models run at one ONNX Runtime graph optimization level, ``disable`` by default (see
VERIFY_OPT_LEVEL). Random inputs the original does not take at the batch asked for are retried at
batch 1, and the original runs once more in float64 for the model's own noise (checks/noise).
The comparisons are checks/prover.py's (the models compiled once, one run a call); the runs that
reach each side of an If on the length are checks/verify_sides.py's; the result types the CLI,
the API and the JSON read, checks/verify_result.py's.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx

from ..errors import OrtflashError
from ..model_io import load
from ..op.policy import NODES_OWN, SoftmaxPolicy
from .compare import OutputDiff, compare_outputs, noise_text, shape_text, tolerance
from .feeds import decoder_cases, make_feeds, with_batch_hint
from .length_sides import node_policy
from .prover import SOFTMAXES, Prover, deployed_softmaxes
from .sessions import ModelSource, run_model
from .verify_result import VERIFY_OPT_LEVEL, Verification, VerifyRun
from .verify_sides import missing_softmaxes, nodes_text, run_at_length, run_both_sides


def verify(
    original: ModelSource,
    optimized: ModelSource,
    feeds: dict[str, np.ndarray],
    *,
    policy: SoftmaxPolicy | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    opt_level: str = VERIFY_OPT_LEVEL,
) -> list[OutputDiff]:
    """Worst error per output of optimized against original on the same feeds (protos or paths).

    ``policy`` overrides the fused nodes' own softmax for this run (a field it leaves as
    None stays each node's own); tolerances default to :func:`compare.default_tolerance`;
    both models run at the graph optimization level ``opt_level``.
    """
    rtol, atol = tolerance(load(original), rtol, atol)
    expected = run_model(original, feeds, what="the original model", opt_level=opt_level)
    actual = run_model(optimized, feeds, policy, what="the optimized model", opt_level=opt_level)
    return compare_outputs(expected, actual, rtol, atol)


def verify_every_softmax(
    original: ModelSource,
    optimized: ModelSource,
    *,
    feeds: Mapping[str, np.ndarray] | None = None,
    seq_len: int = 16,
    batch: int = 2,
    policy: SoftmaxPolicy | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    weights_dir: str | None = None,
    dims: Mapping[str, int] | None = None,
    opt_level: str = VERIFY_OPT_LEVEL,
    measure_noise: bool | None = None,
) -> Verification:
    """Compare optimized with original until every fused node has run in each softmax it runs deployed.

    ``feeds``: the user's inputs (never resized); None: random ones of ``seq_len`` and
    ``batch`` (named dims from ``dims``), which may be rerun at a longer length. ``policy`` overrides each node's own as in
    :func:`verify`. ``weights_dir``: where a proto ``optimized`` reads its external weights.
    ``opt_level``: the ONNX Runtime graph optimization level both models run at. ``measure_noise``:
    run the original in float64 too (one more session), and allow an output that is beyond the
    tolerance in the original itself twice that noise on top (checks/noise, compare.NOISE_FACTOR);
    None: where neither tolerance is given (a tolerance given is the one asked for).
    """
    if measure_noise is None:
        measure_noise = rtol is None and atol is None
    original_proto = load(original)
    rtol, atol = tolerance(original_proto, rtol, atol)
    prover = Prover(original, optimized, policy, rtol, atol, weights_dir, opt_level, measure_noise)
    result = Verification(rtol, atol, opt_level)
    result.deployed = {n.name: deployed_softmaxes(node_policy(n, policy)) for n in (*prover.nodes, *prover.inner)}
    given = feeds is not None
    if given:
        first = dict(feeds or {})
        result.runs.append(prover.run("as configured", first, policy))
    else:
        first_inputs = _first_inputs(original_proto, seq_len, batch, dict(dims or {}))
        try:
            expected = [run_model(original, f, what="the original model", opt_level=opt_level) for _, f in first_inputs]
        except OrtflashError as exc:
            if batch == 1:
                raise
            # many exports fix the batch at 1 inside the graph (a Reshape to a constant shape)
            at_one = _first_inputs(original_proto, seq_len, 1, dict(dims or {}))
            try:
                expected = [run_model(original, f, what="the original model", opt_level=opt_level) for _, f in at_one]
            except OrtflashError:
                raise with_batch_hint(exc, batch) from None
            result.notes.append(_batch_one_note(first_inputs[0][1], at_one[0][1], batch, exc))
            first_inputs, batch = at_one, 1
        for (words, case_feeds), outputs in zip(first_inputs, expected):
            result.runs.append(prover.run(f"as configured{words}", case_feeds, policy, outputs))
        first = first_inputs[0][1]
    firsts = [("", first)] if given else [(words, dict(f)) for words, f in first_inputs]
    run_both_sides(prover, batch, dict(dims or {}), result, given, firsts)
    missing = missing_softmaxes(result.deployed, result.runs)
    if not missing:
        return _noted_noise(result)

    # auto nodes that have not run online: run at their min_seq_len when the model takes that length
    short = [n for n in prover.nodes if "online" in missing.get(n.name, []) and node_policy(n, policy).mode == "auto"]
    why_forced = ""
    if short and given:
        why_forced = "the inputs given (--feeds) are shorter than min_seq_len"
    elif short:
        length = max(int(node_policy(n, policy).min_seq_len or 0) for n in short)
        run, why_forced = run_at_length(prover, length, batch, dict(dims or {}), result)
        if run is not None:
            online = [n.name for n in short if run.modes.get(n.name) == "online"]
            run.why += ", where auto runs online" if online else ", where the keys stay under min_seq_len"
            if 0 < len(online) < len(short):
                run.why += f" in {nodes_text(online)} of {len(short)}"
            result.runs.append(run)
            missing = missing_softmaxes(result.deployed, result.runs)
            if any("online" in m for m in missing.values()):
                why_forced = f"some key lengths stay under min_seq_len at length {length}"

    # what still has not run: force that softmax on every node, on the first inputs
    for mode in SOFTMAXES:
        nodes = [node for node, modes in missing.items() if mode in modes]
        if not nodes:
            continue
        forced = (policy or NODES_OWN).forcing(mode)
        inner = {n.name for n in prover.inner} & set(nodes)
        reason = (
            (why_forced or "the inputs are shorter than min_seq_len")
            if mode == "online"
            else "the inputs are at least min_seq_len long"
        )
        if inner:
            body = f"{nodes_text(sorted(inner))} inside If/Loop/Scan bodies, whose key length cannot be read, run auto"
            reason = body if len(inner) == len(nodes) else f"{reason}; {body}"
        result.notes.append(
            f"{mode} softmax forced on every fused node at the first inputs' length, for "
            f"{nodes_text(nodes)} that run{'s' if len(nodes) == 1 else ''} it deployed: {reason}"
        )
        run = prover.run(f"{mode} forced", first, forced, forced=prover.forced)
        result.runs.append(run)
        # nodes behind an If forced to its fused side, in branches the first inputs do not reach
        behind = {n.name for d in prover.dispatch.values() for n in d.nodes} & set(nodes)
        ran = {n for n, m in run.modes.items() if m == mode}
        for words, feeds_forced in prover.forced_feeds:
            if behind <= ran:
                break
            if feeds_forced.keys() == first.keys() and all(np.array_equal(feeds_forced[k], first[k]) for k in first):
                continue  # the run just made
            run = prover.run(f"{mode} forced{words}", feeds_forced, forced, forced=prover.forced)
            result.runs.append(run)
            ran |= {n for n, m in run.modes.items() if m == mode}
    return _noted_noise(result)


def _noted_noise(result: Verification) -> Verification:
    """result with the model's own noise said in a note, where it raised a tolerance."""
    text = noise_text(result.noise)
    if text:
        result.notes.append(text)
    return result


def _first_inputs(
    model: onnx.ModelProto, seq_len: int, batch: int, dims: dict[str, int]
) -> list[tuple[str, dict[str, np.ndarray]]]:
    """The random inputs verify runs first, each with the words that name them: a decoder with a
    cache runs in two shapes deployed, a prefill and then decode steps, and each is run."""
    cases = decoder_cases(model, seq_len=seq_len, batch=batch, dims=dims)
    if cases:
        return [(f", {words}", make_feeds(model, seq_len=seq_len, batch=batch, dims=d)) for words, d in cases]
    return [("", make_feeds(model, seq_len=seq_len, batch=batch, dims=dims))]


def _batch_one_note(at_batch: dict[str, np.ndarray], at_one: dict[str, np.ndarray], batch: int, exc: Exception) -> str:
    """One line: the model ran at batch 1 only, the input axes that carry the batch, and ONNX
    Runtime's reason at the batch asked for."""
    axes = [
        f"axis {axis} of {name}"
        for name, value in at_batch.items()
        for axis, (n, one) in enumerate(zip(value.shape, at_one[name].shape))
        if n != one
    ]
    where = f"the batch dim ({', '.join(axes[:3])}{', ...' if len(axes) > 3 else ''})" if axes else "the batch dim"
    reason = str(exc).removeprefix("ONNX Runtime could not run the original model: ")
    return f"ran at batch 1: the original model does not run at batch {batch} on {where}: {reason}"


def run_summary(run: VerifyRun) -> str:
    """One line: the inputs and the softmax each fused node ran."""
    inputs = ", ".join(f"{name} {shape_text(shape)}" for name, shape in run.inputs.items())
    by_mode: dict[str, list[str]] = {}
    for node, mode in run.modes.items():
        by_mode.setdefault(mode, []).append(node)
    lengths = sorted(set(run.key_lengths.values()))
    modes = ", ".join(f"{mode} in {nodes_text(nodes)}" for mode, nodes in sorted(by_mode.items())) or "no fused node"
    keys = f" (key lengths {', '.join(map(str, lengths))})" if lengths else ""
    sides: dict[str, int] = {}
    for side in run.dispatch.values():
        sides[side] = sides.get(side, 0) + 1
    dispatch = (
        "; If on the length: " + ", ".join(f"{side} in {n}" for side, n in sorted(sides.items())) if sides else ""
    )
    return f"inputs {inputs}; softmax: {modes}{keys}{dispatch}"
