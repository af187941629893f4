"""verify's runs that reach what the first inputs did not: each side of every If on the length
(pipeline/length_dispatch.py), at a length across its crossover, in each shape a cached decoder
runs in, steered into the branches that hold it, or with the fused side forced; and the runs at
a given length verify_every_softmax makes for the softmaxes not yet exercised."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import OrtflashError
from .compare import shape_text
from .feeds import decoder_cases, make_feeds
from .length_sides import node_policy, steering
from .prover import Prover
from .sessions import run_model
from .verify_result import Verification, VerifyRun


def run_both_sides(
    prover: Prover,
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
            policy = node_policy(node, prover.policy)
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
    short = [dispatched[n] for n, modes in missing_softmaxes(result.deployed, result.runs).items() if n in dispatched]
    lengths = [int(node_policy(n, prover.policy).min_seq_len or 0) for n in short]
    if short and not given and max(lengths) > 0:
        found = _runs_reaching(
            prover,
            max(lengths),
            batch,
            dims,
            result,
            {n.name: route_of[n.name] for n in short},
            lambda run, names: [name for name in names if run.modes.get(name) == "online"],
        )
        if not found.runs:
            result.notes.append(
                f"{nodes_text([n.name for n in short])} of If(s) on the length not run online: {found.why}"
            )
        for run, words, _, _ in found.runs:
            run.why += f"{words}, where auto runs online in the If(s) on the length"
            result.runs.append(run)


def _fused_forced(
    prover: Prover,
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
        for steer in [{}] if given else steering([routes[name] for name in left], prover.original_proto):
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
    prover: Prover,
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
        *((f", {w}", d) for w, d in decoder_cases(prover.original_proto, seq_len=length, batch=batch, dims=dims)),
    ]
    out = _Reached([], list(routes), "")
    for words, case_dims in cases:
        for steer in steering([routes[name] for name in out.left], prover.original_proto):
            if not out.left:
                return out
            run, why = run_at_length(prover, length, batch, case_dims, result, steer)
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


def missing_softmaxes(deployed: Mapping[str, list[str]], runs: list[VerifyRun]) -> dict[str, list[str]]:
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


def run_at_length(
    prover: Prover,
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
        feeds = make_feeds(prover.original_proto, seq_len=length, batch=batch, dims=dims)
        steered = {
            name: np.asarray(v, feeds[name].dtype).reshape(feeds[name].shape) for name, v in (steer or {}).items()
        }
        changed = {name: value for name, value in steered.items() if not np.array_equal(feeds[name], value)}
        feeds.update(changed)
        if not changed and any(_same_shapes(feeds, run.inputs) for run in result.runs):
            shapes = ", ".join(f"{name} {shape_text(list(v.shape))}" for name, v in feeds.items())
            return None, f"the inputs keep their shapes at length {length} ({shapes})"
        expected = run_model(prover.original, feeds, what="the original model", opt_level=prover.opt_level)
    except OrtflashError as exc:
        return None, f"the original model does not run at length {length} ({exc})"
    return prover.run(f"at length {length}", feeds, prover.policy, expected), ""


def _same_shapes(feeds: Mapping[str, np.ndarray], shapes: Mapping[str, list[int]]) -> bool:
    return feeds.keys() == shapes.keys() and all(list(v.shape) == shapes[name] for name, v in feeds.items())


def nodes_text(nodes: list[str]) -> str:
    return f"{len(nodes)} fused node{'s' if len(nodes) != 1 else ''}"
