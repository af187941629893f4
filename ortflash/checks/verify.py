"""Run an original and an optimized model in ONNX Runtime on the same inputs and compare.

``verify`` is one comparison on one set of inputs. ``prove`` is what the CLI runs: it makes sure
every fused node ran in each softmax it will run at deployment (``auto`` nodes: naive below
``min_seq_len`` keys, online from it), reading the key length each node actually saw. Where the
inputs given are too short for the online path, it runs again at ``min_seq_len`` when the model
accepts that length, and otherwise forces the missing mode on the short inputs, saying so.

Both models run at one ONNX Runtime graph optimization level, ``disable`` by default (see
VERIFY_OPT_LEVEL). Random inputs the original does not take at the batch asked for are retried at
batch 1, and the original runs once more in float64 for the model's own noise (checks/noise).

Over 400 lines because ``prove`` is one sequence over one prover (first runs, the batch-1 retry,
the rerun at min_seq_len, the forced softmaxes) and the result types it fills are what the CLI,
the API and the JSON read.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from ..errors import OrtflashError
from ..model_io import load
from ..op.node import flash_nodes, node_attributes
from ..op.policy import NODES_OWN, SoftmaxPolicy
from ..session import InferenceSession
from .compare import OutputDiff, compare_outputs, noise_text, shape_text, tolerance
from .feeds import decoder_cases, make_feeds, with_batch_hint
from .length_sides import dispatch_sides, exposing_dispatch, steering, with_fused_forced
from .noise import NoiseMeter
from .sessions import ModelSource, open_session, run_model, run_session

SOFTMAXES = ("naive", "online")
# The graph optimization level verify runs both models at unless told otherwise. Disabled, because
# verify compares what the two graphs compute: ONNX Runtime's own fusions rewrite the original's
# attention (and other subgraphs) but not the FlashAttention nodes that replaced it, so at any
# other level a difference can come from ONNX Runtime's rewrites rather than ortflash's (one
# BERT's output moved by 6.6e-05 at the default level; with optimizations off it is identical).
VERIFY_OPT_LEVEL = "disable"


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


@dataclass
class VerifyRun:
    """One comparison: on which inputs, which softmax each fused node ran, and the result."""

    why: str  # e.g. "as configured", "at 1024 keys, where auto runs online", "online forced"
    inputs: dict[str, list[int]]  # input name -> shape
    modes: dict[str, str]  # fused node -> the softmax it ran
    key_lengths: dict[str, int]  # fused node -> keys it saw
    diffs: list[OutputDiff]
    # output -> the model's own noise on these inputs, where beyond the tolerance (checks/noise)
    noise: dict[str, float] = field(default_factory=dict)
    # If on the length -> the side it ran ("fused" or "original ops"), read from its condition
    dispatch: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(d.ok for d in self.diffs)


@dataclass
class Verification:
    """Every run ``prove`` made, the tolerance in force, and what it had to force."""

    rtol: float
    atol: float
    ort_opt_level: str = VERIFY_OPT_LEVEL  # the graph optimization level both models ran at
    runs: list[VerifyRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # forced modes and why, in words
    deployed: dict[str, list[str]] = field(default_factory=dict)  # fused node -> softmaxes it runs deployed

    @property
    def ok(self) -> bool:
        return all(run.ok for run in self.runs)

    @property
    def noise(self) -> dict[str, float]:
        """Output -> the model's own noise, the largest over the runs (outputs within the tolerance left out)."""
        worst: dict[str, float] = {}
        for run in self.runs:
            for name, value in run.noise.items():
                worst[name] = max(value, worst.get(name, 0.0))
        return worst

    def to_dict(self) -> dict[str, Any]:
        return {
            "rtol": self.rtol,
            "atol": self.atol,
            "noise": self.noise,
            "ort_opt_level": self.ort_opt_level,
            "ok": self.ok,
            "notes": list(self.notes),
            "deployed_softmax": {k: list(v) for k, v in self.deployed.items()},
            "runs": [
                {
                    "why": r.why,
                    "inputs": r.inputs,
                    "softmax": r.modes,
                    "key_lengths": r.key_lengths,
                    "noise": r.noise,
                    "length_dispatch": r.dispatch,
                    "ok": r.ok,
                    "outputs": [diff_dict(d) for d in r.diffs],
                }
                for r in self.runs
            ],
        }


def diff_dict(diff: OutputDiff) -> dict[str, Any]:
    """An OutputDiff for JSON: infinite errors (incomparable outputs) as null, the problem in words."""

    def finite(x: float) -> float | None:
        return x if np.isfinite(x) else None

    return {
        "name": diff.name,
        "max_abs": finite(diff.max_abs),
        "max_rel": finite(diff.max_rel),
        "of_tolerance": finite(diff.of_tolerance),
        "nan_mismatch": diff.nan_mismatch,
        "problem": diff.problem or None,
        "ok": diff.ok,
    }


def _fused_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The FlashAttention nodes of the main graph, the ones whose key length can be read."""
    return flash_nodes(model, subgraphs=False)


def _inner_fused_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The FlashAttention nodes inside If/Loop/Scan bodies (a merged decoder's branches): ONNX Runtime
    cannot expose a subgraph's values, so their key length is not read, and the softmax they run is
    known only where their policy fixes it.

    The bodies are every graph below the main one (graphs_of yields the main graph first); the
    main graph's nodes are never told apart by id(): protobuf's node wrappers are made on each
    access and freed, so their ids repeat (a BERT of 259 nodes showed one FlashAttention node
    inside a body it does not have)."""
    return flash_nodes(model)[len(flash_nodes(model, subgraphs=False)) :]


def _fixed_softmax(policy: SoftmaxPolicy) -> str | None:
    """The one softmax a node with this (complete) policy runs at every key length; None for auto."""
    modes = deployed_softmaxes(policy)
    return modes[0] if len(modes) == 1 else None


def _node_policy(node: onnx.NodeProto, override: SoftmaxPolicy | None) -> SoftmaxPolicy:
    return SoftmaxPolicy.for_node(node_attributes(node), override)


def deployed_softmaxes(policy: SoftmaxPolicy) -> list[str]:
    """The softmaxes a node with this (complete) policy runs over all key lengths."""
    if policy.mode == "auto":
        return ["online"] if policy.min_seq_len == 0 else list(SOFTMAXES)
    return [str(policy.mode)]


def _exposing_keys(model: onnx.ModelProto, nodes: list[onnx.NodeProto]) -> tuple[onnx.ModelProto, dict[str, str]]:
    """A copy of ``model`` that also outputs each fused node's K, so the run shows its key length."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    present = {o.name for o in exposed.graph.output}
    keys = {}
    for node in nodes:
        keys[node.name] = node.input[1]
        if node.input[1] not in present:
            exposed.graph.output.append(onnx.ValueInfoProto(name=node.input[1]))
            present.add(node.input[1])
    return exposed, keys


class _Prover:
    """The models, compiled once, and one comparison per call of :meth:`run`."""

    def __init__(
        self,
        original: ModelSource,
        optimized: ModelSource,
        policy: SoftmaxPolicy | None,
        rtol: float,
        atol: float,
        weights_dir: str | None,
        opt_level: str,
        measure_noise: bool = True,
    ) -> None:
        self.original = original
        # the one extra session of the original verify opens: in float64, for the model's own noise
        self.noise = NoiseMeter(original, load(original), opt_level) if measure_noise else None
        self.policy = policy
        self.opt_level = opt_level
        self.rtol, self.atol = rtol, atol
        self.nodes = _fused_nodes(load(optimized))
        self.inner = _inner_fused_nodes(load(optimized))
        # the optimized model as a proto with K exposed; its external weights stay where they are
        if weights_dir is None and not isinstance(optimized, onnx.ModelProto):
            weights_dir = os.path.dirname(os.path.abspath(optimized))
        self.weights_dir = weights_dir
        self.optimized, self.keys = _exposing_keys(load(optimized), self.nodes)
        self.dispatch = exposing_dispatch(self.optimized)
        self.sessions: dict[tuple[SoftmaxPolicy | None, frozenset[str]], InferenceSession] = {}
        # the Ifs on the length whose fused side ran only forced, and the inputs it ran on
        self.forced: frozenset[str] = frozenset()
        self.forced_feeds: list[tuple[str, dict[str, np.ndarray]]] = []

    def run(
        self,
        why: str,
        feeds: Mapping[str, np.ndarray],
        override: SoftmaxPolicy | None,
        expected: dict[str, np.ndarray] | None = None,
        forced: frozenset[str] = frozenset(),
    ) -> VerifyRun:
        """Compare on ``feeds``; ``expected``: the original's outputs on them, where already run;
        ``forced``: Ifs on the length made to take their fused side at every length."""
        feeds = dict(feeds)
        if expected is None:
            expected = run_model(self.original, feeds, what="the original model", opt_level=self.opt_level)
        key = (override, forced)
        if key not in self.sessions:  # one session per softmax override: compiled once, run at every length
            self.sessions[key] = open_session(
                with_fused_forced(self.optimized, forced) if forced else self.optimized,
                override,
                what="the optimized model",
                weights_dir=self.weights_dir,
                opt_level=self.opt_level,
            )
        actual = run_session(self.sessions[key], feeds, what="the optimized model")
        key_lengths = {name: int(actual[k].shape[2]) for name, k in self.keys.items() if actual[k].ndim == 4}
        modes = {
            n.name: _node_policy(n, override).choose(key_lengths[n.name]) for n in self.nodes if n.name in key_lengths
        }
        for node in self.inner:
            fixed = _fixed_softmax(_node_policy(node, override))
            if fixed is not None:
                modes[node.name] = fixed
        sides = dispatch_sides(self.dispatch, actual, override, modes, key_lengths)
        inputs = {name: list(value.shape) for name, value in feeds.items()}
        noise = self.noise.noise(feeds, expected, self.rtol, self.atol) if self.noise is not None else {}
        diffs = compare_outputs(expected, actual, self.rtol, self.atol, noise=noise)
        return VerifyRun(why, inputs, modes, key_lengths, diffs, noise, sides)


def _run_both_sides(
    prover: _Prover,
    original: ModelSource,
    original_proto: onnx.ModelProto,
    batch: int,
    dims: dict[str, int],
    result: Verification,
    given: bool,
    firsts: list[tuple[str, dict[str, np.ndarray]]],
) -> None:
    """Each If on the length run on both sides: where the first inputs took only one, again at a
    length on the other side of its crossover (random inputs only; given ones are never resized);
    an If whose fused side no length tried reaches (the model does not run at its crossover) runs
    it forced on the first inputs (``firsts``). A dispatched node's deployed softmaxes are those it
    runs from the crossover on."""
    if not prover.dispatch:
        return
    for d in prover.dispatch.values():
        for node in d.nodes:
            policy = _node_policy(node, prover.policy)
            result.deployed[node.name] = sorted({policy.choose(d.key_len), policy.choose(max(d.key_len, 1 << 20))})
    for side in ("original ops", "fused"):
        ran = {name for run in result.runs for name, s in run.dispatch.items() if s == side}
        waiting = [name for name in prover.dispatch if name not in ran]
        if not waiting:
            continue
        if given:
            if side == "fused":
                waiting = _fused_forced(prover, waiting, firsts, result, given, "on the inputs given (--feeds)")
            if waiting:
                result.notes.append(
                    f"{len(waiting)} If(s) on the length did not run their {side} side on the inputs given (--feeds)"
                )
            continue
        crossovers = [prover.dispatch[name].key_len for name in waiting]
        length = max(crossovers) if side == "fused" else max(1, min(crossovers) // 2)
        routes = {name: prover.dispatch[name].route for name in waiting}
        found = _runs_reaching(
            prover,
            original,
            original_proto,
            length,
            batch,
            dims,
            result,
            routes,
            _taking(side),
        )
        for run, words, took, of in found.runs:
            run.why += f"{words}, where {len(took)} of {of} If(s) on the length run the {side}"
            result.runs.append(run)
        if side == "fused" and found.left:
            where = f"at length {length}" + (f" ({found.why})" if found.why else "")
            left = _fused_forced(prover, found.left, firsts, result, given, where)
            found = _Reached(found.runs, left, found.why)
        if not found.runs and found.left:
            result.notes.append(f"{len(waiting)} If(s) on the length did not run their {side} side: {found.why}")
        elif found.left:
            result.notes.append(
                f"{len(found.left)} If(s) on the length did not run their {side} side at length {length} "
                "in any input shape tried"
            )
    # auto nodes of the fused side run online only from their min_seq_len, past the crossover
    dispatched = {n.name: n for d in prover.dispatch.values() for n in d.nodes}
    route_of = {n.name: d.route for d in prover.dispatch.values() for n in d.nodes}
    short = [dispatched[n] for n, modes in _missing(result.deployed, result.runs).items() if n in dispatched]
    lengths = [int(_node_policy(n, prover.policy).min_seq_len or 0) for n in short]
    if short and not given and max(lengths) > 0:
        found = _runs_reaching(
            prover,
            original,
            original_proto,
            max(lengths),
            batch,
            dims,
            result,
            {n.name: route_of[n.name] for n in short},
            lambda run, names: [name for name in names if run.modes.get(name) == "online"],
        )
        if not found.runs:
            result.notes.append(
                f"{_nodes_text([n.name for n in short])} of If(s) on the length not run online: {found.why}"
            )
        for run, words, _, _ in found.runs:
            run.why += f"{words}, where auto runs online in the If(s) on the length"
            result.runs.append(run)


def _fused_forced(
    prover: _Prover,
    names: list[str],
    firsts: list[tuple[str, dict[str, np.ndarray]]],
    result: Verification,
    given: bool,
    where: str,
) -> list[str]:
    """The Ifs ``names``, whose fused side no input tried reached, run with it forced (their
    thresholds 0 in verify's copy) on the first inputs, steered into the branches that hold them
    (random inputs only); returns those still not run."""
    left = list(names)
    routes = {name: prover.dispatch[name].route for name in names}
    for words, feeds in firsts:
        for steer in [{}] if given else steering([routes[name] for name in left], load(prover.original)):
            if not left:
                return left
            steered = dict(feeds)
            steered.update({k: np.asarray(v, feeds[k].dtype).reshape(feeds[k].shape) for k, v in steer.items()})
            said = "".join(f", {k}={bool(v.reshape(-1)[0])}" for k, v in steer.items())
            try:
                run = prover.run(f"fused side forced{words}{said}", steered, prover.policy, forced=frozenset(names))
            except OrtflashError:
                continue
            took = _taking("fused")(run, left)
            if not took:
                continue
            run.why += f", for {len(took)} If(s) on the length whose fused side did not run {where}"
            result.runs.append(run)
            prover.forced |= frozenset(took)
            prover.forced_feeds.append((f"{words}{said}", steered))
            left = [name for name in left if name not in took]
    return left


def _taking(side: str) -> Callable[[VerifyRun, list[str]], list[str]]:
    """Of the Ifs named, those a run took ``side`` in."""
    return lambda run, names: [name for name in names if run.dispatch.get(name) == side]


@dataclass
class _Reached:
    runs: list[tuple[VerifyRun, str, list[str], int]]  # (run, the words for its shape, what it reached, of how many)
    left: list[str]  # what no run reached
    why: str  # why the first run could not be made, where it could not


def _runs_reaching(
    prover: _Prover,
    original: ModelSource,
    original_proto: onnx.ModelProto,
    length: int,
    batch: int,
    dims: dict[str, int],
    result: Verification,
    routes: Mapping[str, tuple[tuple[str, bool], ...]],
    reached: Callable[[VerifyRun, list[str]], list[str]],
) -> _Reached:
    """Runs at ``length`` until each of ``routes`` (Ifs on the length or their nodes, each with the
    route into the branches that hold it) is reached (``reached``: those of the names a run
    reached): the inputs as made first, kept whatever it reached; then each shape a decoder with a
    cache runs in (a one-query step takes the fused side only from the decode crossover, a prefill
    from the prefill one), each steered into the branches that hold what is left (a merged
    decoder's use_cache_branch), kept where it reaches something."""
    cases = [
        ("", dims),
        *((f", {w}", d) for w, d in decoder_cases(original_proto, seq_len=length, batch=batch, dims=dims)),
    ]
    out = _Reached([], list(routes), "")
    for words, case_dims in cases:
        for steer in steering([routes[name] for name in out.left], original_proto):
            if not out.left:
                return out
            run, why = _run_at_length(prover, original, original_proto, length, batch, case_dims, result, steer)
            if run is None:
                out.why = out.why or why
                continue
            took = reached(run, out.left)
            if out.runs and not took:
                continue
            steered = "".join(f", {name}={bool(value.reshape(-1)[0])}" for name, value in steer.items())
            out.runs.append((run, words + steered, took, len(out.left)))
            out.left = [name for name in out.left if name not in took]
    return out


def _missing(deployed: Mapping[str, list[str]], runs: list[VerifyRun]) -> dict[str, list[str]]:
    """Fused node -> the deployed softmaxes no run has exercised yet."""
    ran: dict[str, set[str]] = {}
    for run in runs:
        for node, mode in run.modes.items():
            ran.setdefault(node, set()).add(mode)
    return {
        node: [m for m in modes if m not in ran.get(node, set())]
        for node, modes in deployed.items()
        if any(m not in ran.get(node, set()) for m in modes)
    }


def _run_at_length(
    prover: _Prover,
    original: ModelSource,
    original_proto: onnx.ModelProto,
    length: int,
    batch: int,
    dims: dict[str, int],
    result: Verification,
    steer: Mapping[str, np.ndarray] | None = None,
) -> tuple[VerifyRun | None, str]:
    """The comparison on random inputs of ``length`` (``steer``: inputs set to these values), or None
    and why it was not made: the original does not run there, or the inputs keep their shapes (static
    dims) and values, so it would repeat a run made."""
    try:
        feeds = make_feeds(original_proto, seq_len=length, batch=batch, dims=dims)
        steered = {
            name: np.asarray(v, feeds[name].dtype).reshape(feeds[name].shape) for name, v in (steer or {}).items()
        }
        changed = {name: value for name, value in steered.items() if not np.array_equal(feeds[name], value)}
        feeds.update(changed)
        if not changed and any(_same_shapes(feeds, run.inputs) for run in result.runs):
            shapes = ", ".join(f"{name} {shape_text(list(v.shape))}" for name, v in feeds.items())
            return None, f"the inputs keep their shapes at length {length} ({shapes})"
        expected = run_model(original, feeds, what="the original model", opt_level=prover.opt_level)
    except OrtflashError as exc:
        return None, f"the original model does not run at length {length} ({exc})"
    return prover.run(f"at length {length}", feeds, prover.policy, expected), ""


def _same_shapes(feeds: Mapping[str, np.ndarray], shapes: Mapping[str, list[int]]) -> bool:
    return feeds.keys() == shapes.keys() and all(list(v.shape) == shapes[name] for name, v in feeds.items())


def _nodes_text(nodes: list[str]) -> str:
    return f"{len(nodes)} fused node{'s' if len(nodes) != 1 else ''}"


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
    prover = _Prover(original, optimized, policy, rtol, atol, weights_dir, opt_level, measure_noise)
    result = Verification(rtol, atol, opt_level)
    result.deployed = {n.name: deployed_softmaxes(_node_policy(n, policy)) for n in (*prover.nodes, *prover.inner)}
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
    _run_both_sides(prover, original, original_proto, batch, dict(dims or {}), result, given, firsts)
    missing = _missing(result.deployed, result.runs)
    if not missing:
        return _noted_noise(result)

    # auto nodes that have not run online: run at their min_seq_len when the model takes that length
    short = [n for n in prover.nodes if "online" in missing.get(n.name, []) and _node_policy(n, policy).mode == "auto"]
    why_forced = ""
    if short and given:
        why_forced = "the inputs given (--feeds) are shorter than min_seq_len"
    elif short:
        length = max(int(_node_policy(n, policy).min_seq_len or 0) for n in short)
        run, why_forced = _run_at_length(prover, original, original_proto, length, batch, dict(dims or {}), result)
        if run is not None:
            online = [n.name for n in short if run.modes.get(n.name) == "online"]
            run.why += ", where auto runs online" if online else ", where the keys stay under min_seq_len"
            if 0 < len(online) < len(short):
                run.why += f" in {_nodes_text(online)} of {len(short)}"
            result.runs.append(run)
            missing = _missing(result.deployed, result.runs)
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
            body = f"{_nodes_text(sorted(inner))} inside If/Loop/Scan bodies, whose key length cannot be read, run auto"
            reason = body if len(inner) == len(nodes) else f"{reason}; {body}"
        result.notes.append(
            f"{mode} softmax forced on every fused node at the first inputs' length, for "
            f"{_nodes_text(nodes)} that run{'s' if len(nodes) == 1 else ''} it deployed: {reason}"
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
    modes = ", ".join(f"{mode} in {_nodes_text(nodes)}" for mode, nodes in sorted(by_mode.items())) or "no fused node"
    keys = f" (key lengths {', '.join(map(str, lengths))})" if lengths else ""
    sides: dict[str, int] = {}
    for side in run.dispatch.values():
        sides[side] = sides.get(side, 0) + 1
    dispatch = (
        "; If on the length: " + ", ".join(f"{side} in {n}" for side, n in sorted(sides.items())) if sides else ""
    )
    return f"inputs {inputs}; softmax: {modes}{keys}{dispatch}"
