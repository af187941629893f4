"""verify's prover: the original and the optimized model, each compiled once, and one comparison
of them per call of ``Prover.run`` (the softmax each fused node ran, the key length it saw, the
side each If on the length took). checks/verify.py decides which runs to make, checks/verify_sides.py
makes those that reach each side of an If on the length."""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
import onnx

from ..model_io import load
from ..op.node import flash_nodes
from ..op.policy import SoftmaxPolicy
from ..session import InferenceSession
from .compare import compare_outputs
from .length_sides import dispatch_sides, exposing_dispatch, node_policy, with_fused_forced
from .noise import NoiseMeter
from .sessions import ModelSource, open_session, run_model, run_session
from .verify_result import VerifyRun

SOFTMAXES = ("naive", "online")


def _fused_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The FlashAttention nodes of the main graph, the ones whose key length can be read."""
    return flash_nodes(model, subgraphs=False)


def inner_fused_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
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


class Prover:
    """The models, compiled once, and one comparison per call of :meth:`run`; what verify and its
    runs across an If's sides (checks/verify_sides.py) read of them."""

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
        self.original_proto = load(original)
        # the one extra session of the original verify opens: in float64, for the model's own noise
        self.noise = NoiseMeter(original, self.original_proto, opt_level) if measure_noise else None
        self.policy = policy
        self.opt_level = opt_level
        self.rtol, self.atol = rtol, atol
        self.nodes = _fused_nodes(load(optimized))
        self.inner = inner_fused_nodes(load(optimized))
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
            n.name: node_policy(n, override).choose(key_lengths[n.name]) for n in self.nodes if n.name in key_lengths
        }
        for node in self.inner:
            fixed = _fixed_softmax(node_policy(node, override))
            if fixed is not None:
                modes[node.name] = fixed
        sides = dispatch_sides(self.dispatch, actual, override, modes, key_lengths)
        inputs = {name: list(value.shape) for name, value in feeds.items()}
        noise = self.noise.noise(feeds, expected, self.rtol, self.atol) if self.noise is not None else {}
        diffs = compare_outputs(expected, actual, self.rtol, self.atol, noise=noise)
        return VerifyRun(why, inputs, modes, key_lengths, diffs, noise, sides)
