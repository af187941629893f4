"""Which side each If on the length (pipeline/length_dispatch.py) took in a verify run: the
prover's copy of the optimized model outputs each If's condition and key length, those of an If
nested in branches (a merged decoder's) brought up through the enclosing Ifs' outputs as int64
(-1 where its branch did not run); the inputs that steer a run into the branch that holds an If;
and a copy whose Ifs take their fused side at every length, for a model that does not run at the
crossover."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import onnx
from onnx import helper

from ..model_io import graphs_of
from ..op.node import DISPATCH_KEY, flash_nodes, node_attributes
from ..op.policy import SoftmaxPolicy


@dataclass(frozen=True)
class Dispatch:
    """One If on the length (pipeline/length_dispatch.py), as verify runs it."""

    condition: str  # the main-graph value that picks the side, exposed as an output
    keys: str  # the main-graph value holding the run's key length, exposed as an output
    key_len: int  # the key length from which it runs the fused form
    nodes: tuple[onnx.NodeProto, ...]  # the FlashAttention nodes of its fused branch
    # an If nested in branches (a merged decoder's): its condition and keys come up through the
    # enclosing Ifs as int64, -1 where its branch did not run; route: each enclosing If's condition
    # (a name in the graph that holds it) and the side that reaches this one (True: then_branch)
    route: tuple[tuple[str, bool], ...] = ()

    @property
    def nested(self) -> bool:
        return bool(self.route)


def exposing_dispatch(model: onnx.ModelProto) -> dict[str, Dispatch]:
    """The Ifs on the length of ``model`` by name, their condition and key length added to its outputs
    (in place: the prover's own copy), so each run says which side it took. An If nested in an If's
    branches is exposed through the enclosing Ifs' outputs (a branch value cannot be a model output)."""
    found: dict[str, Dispatch] = {}
    present = {o.name for o in model.graph.output}
    for node in model.graph.node:
        meta = {p.key: p.value for p in node.metadata_props}
        if node.op_type != "If" or DISPATCH_KEY not in meta:
            continue
        found[node.name] = _dispatch_of(node, ())
        for name in (found[node.name].condition, found[node.name].keys):
            if name not in present:
                model.graph.output.append(onnx.ValueInfoProto(name=name))
                present.add(name)
    names = _FreshNames()
    for node in model.graph.node:
        for dispatch_name, kind, value in _exposed_from_branches(node, (), found, names):
            model.graph.output.append(onnx.ValueInfoProto(name=value))
            d = found[dispatch_name]
            exposed = replace(d, condition=value) if kind == "condition" else replace(d, keys=value)
            found[dispatch_name] = exposed
    return found


def with_fused_forced(model: onnx.ModelProto, names: frozenset[str]) -> onnx.ModelProto:
    """A copy of ``model`` whose Ifs on the length ``names`` take their fused side at every length:
    each threshold their condition compares the length with (GreaterOrEqual) set to 0. For a model
    that does not run at a crossover (a position table shorter than it), so the fused side is still
    run against the original."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for graph in graphs_of(out.graph):
        ifs = [n for n in graph.node if n.op_type == "If" and n.name in names]
        if not ifs:
            continue
        producer = {o: k for k, n in enumerate(graph.node) for o in n.output}
        todo, seen, compares = [n.input[0] for n in ifs], set(), []
        while todo:
            k = producer.get(todo.pop())
            if k is None or k in seen:
                continue
            seen.add(k)
            if graph.node[k].op_type == "GreaterOrEqual":
                compares.append(k)
            else:
                todo += list(graph.node[k].input)
        zeros = []
        for k in sorted(compares):
            node = graph.node[k]
            zero = f"{node.name or node.output[0]}/verify_forced_zero"
            zeros.append(helper.make_node("Constant", [], [zero], name=zero, value=_int64(zero, 0)))
            node.input[1] = zero
        for constant in reversed(zeros):  # before every node that reads them
            graph.node.insert(0, constant)
    return out


def _int64(name: str, value: int) -> onnx.TensorProto:
    return helper.make_tensor(name, onnx.TensorProto.INT64, [1], [value])


def _dispatch_of(node: onnx.NodeProto, route: tuple[tuple[str, bool], ...]) -> Dispatch:
    info = json.loads(next(p.value for p in node.metadata_props if p.key == DISPATCH_KEY))
    branch = next(a.g for a in node.attribute if a.name == "then_branch")
    return Dispatch(info["condition"], info["keys"], int(info["key_len"]), tuple(flash_nodes(branch)), route)


class _FreshNames:
    """Names for the exposed values, unique model-wide."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, stem: str) -> str:
        self.count += 1
        return f"ortflash/verify/{stem}/{self.count}"


def _exposed_from_branches(
    node: onnx.NodeProto, route: tuple[tuple[str, bool], ...], found: dict[str, Dispatch], names: _FreshNames
) -> list[tuple[str, str, str]]:
    """(If on the length, "condition" or "keys", the value of ``node``'s graph holding it) for each
    If on the length inside ``node``'s branches, added to both branches' outputs (-1 from the branch
    that does not hold it) and to ``node``'s; [] for a node with none (it is left as it was)."""
    if node.op_type != "If":
        return []
    branches = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
    if set(branches) != {"then_branch", "else_branch"}:
        return []
    inner: dict[str, list[tuple[str, str, str]]] = {}
    for attr_name, graph in branches.items():
        inner[attr_name] = _exposed_in(graph, (*route, (node.input[0], attr_name == "then_branch")), found, names)
    slots = [(d, kind) for attr_name in ("then_branch", "else_branch") for d, kind, _ in inner[attr_name]]
    if not slots:
        return []
    out: list[tuple[str, str, str]] = []
    for d, kind in slots:
        value = names(f"{d}/{kind}")
        for attr_name, graph in branches.items():
            own = {(x, k): v for x, k, v in inner[attr_name]}
            if (d, kind) in own:
                inside = own[(d, kind)]
            else:  # this branch does not hold it: -1, "did not run"
                inside = names(f"{d}/{kind}/not_run")
                graph.node.append(
                    helper.make_node(
                        "Constant",
                        [],
                        [inside],
                        name=inside,
                        value=_int64(inside, -1),
                    )
                )
            graph.output.append(helper.make_tensor_value_info(inside, onnx.TensorProto.INT64, None))
        node.output.append(value)
        out.append((d, kind, value))
    return out


def _exposed_in(
    graph: onnx.GraphProto, route: tuple[tuple[str, bool], ...], found: dict[str, Dispatch], names: _FreshNames
) -> list[tuple[str, str, str]]:
    """The Ifs on the length in a branch (at any depth below it), each one's condition and key
    length as int64 values of this graph."""
    out: list[tuple[str, str, str]] = []
    for node in list(graph.node):
        if node.op_type == "If" and any(p.key == DISPATCH_KEY for p in node.metadata_props):
            d = _dispatch_of(node, route)
            found[node.name] = d
            side = names(f"{node.name}/condition")
            keys = names(f"{node.name}/keys")  # its own name: blocks that share a length share its value
            graph.node.append(helper.make_node("Cast", [d.condition], [side], name=side, to=onnx.TensorProto.INT64))
            graph.node.append(helper.make_node("Identity", [d.keys], [keys], name=keys))
            out += [(node.name, "condition", side), (node.name, "keys", keys)]
        else:
            out += _exposed_from_branches(node, route, found, names)
    return out


def dispatch_sides(
    dispatch: Mapping[str, Dispatch],
    actual: dict[str, np.ndarray],
    override: SoftmaxPolicy | None,
    modes: dict[str, str],
    key_lengths: dict[str, int],
) -> dict[str, str]:
    """If on the length -> the side this run took; the fused side's nodes get the softmax they ran
    (``modes``) and the keys they saw (``key_lengths``), read from the If's own exposed values. An
    If whose branch did not run (nested: -1) has no side, and its nodes did not run."""
    sides: dict[str, str] = {}
    for name, d in dispatch.items():
        if d.condition not in actual:
            continue
        if d.nested and int(np.asarray(actual[d.condition]).reshape(-1)[0]) < 0:
            for node in d.nodes:
                modes.pop(node.name, None)
            continue
        fused = bool(np.asarray(actual[d.condition]).reshape(-1)[0])
        sides[name] = "fused" if fused else "original ops"
        keys = int(np.asarray(actual[d.keys]).reshape(-1)[0]) if d.keys in actual else None
        for node in d.nodes:
            if fused and keys is not None:
                modes[node.name] = node_policy(node, override).choose(keys)
                key_lengths[node.name] = keys
            elif not fused:
                modes.pop(node.name, None)  # it did not run
    return sides


def steering(routes: list[tuple[tuple[str, bool], ...]], original: onnx.ModelProto) -> list[dict[str, np.ndarray]]:
    """The inputs to set so that a run follows each route into the branches it names, one set per
    distinct route ({} first: the inputs as made): an enclosing If's condition that is a boolean
    model input of one element is set to the side the route takes; any other is left as it is."""
    inputs = {
        i.name
        for i in original.graph.input
        if i.type.tensor_type.elem_type == onnx.TensorProto.BOOL
        and [d.dim_value for d in i.type.tensor_type.shape.dim] in ([1], [])
    }
    found: list[dict[str, np.ndarray]] = [{}]
    for route in routes:
        steer = {cond: np.array([want], dtype=bool) for cond, want in route if cond in inputs}
        if not any(steer.keys() == f.keys() and all(np.array_equal(steer[k], f[k]) for k in steer) for f in found):
            found.append(steer)
    return found


def node_policy(node: onnx.NodeProto, override: SoftmaxPolicy | None) -> SoftmaxPolicy:
    """The policy a fused node runs: its own, with ``override``'s fields where they are set."""
    return SoftmaxPolicy.for_node(node_attributes(node), override)
