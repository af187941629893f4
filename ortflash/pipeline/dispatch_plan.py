"""One block of an If on the length (pipeline/length_dispatch): where it takes its fused form
(``Threshold``), what each branch of its If holds (``BlockPlan``, from ``plan_block``: the then
branch the nodes fusion wrote for it, found by their name prefix; the else branch the original
nodes its outputs need) and the If node itself (``if_node``, with ``DISPATCH_KEY`` in its
metadata)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import onnx
from onnx import helper

from ..op.node import BLOCK_ID, DISPATCH_KEY
from .node_reads import subgraph_reads


@dataclass(frozen=True)
class Threshold:
    """Where a block takes its fused form: from ``key_len`` keys, and, at a one-query step (decode),
    from ``decode`` keys (None: a decode step keeps the original ops at every length)."""

    key_len: int
    decode: int | None = None


@dataclass
class BlockPlan:
    fused: list[onnx.NodeProto]  # the then branch (the block's new nodes)
    original: list[onnx.NodeProto]  # the else branch (the original nodes only this block needs)
    outputs: list[tuple[str, str]]  # (the original's output name, the fused model's name for it)
    flash: onnx.NodeProto  # the block's FlashAttention node


def new_nodes_by_row(graph: onnx.GraphProto, rows: set[int]) -> dict[int, list[onnx.NodeProto]]:
    """report row -> the nodes fusion wrote for it (named under its prefix, ``ortflash/<stem>_<row>/``)."""
    prefixes: dict[str, int] = {}
    for node in graph.node:
        for prop in node.metadata_props:
            if prop.key == BLOCK_ID and int(prop.value) in rows:
                prefixes[node.name.rsplit("/", 1)[0] + "/"] = int(prop.value)
    by_row: dict[int, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for prefix, row in prefixes.items():
            if node.name.startswith(prefix):
                by_row.setdefault(row, []).append(node)
    return by_row


def plan_block(
    row: int,
    nodes: list[onnx.NodeProto],
    graph_f: onnx.GraphProto,
    graph_o: onnx.GraphProto,
    producer_o: Mapping[str, onnx.NodeProto],
) -> BlockPlan | str:
    flash = [n for n in nodes if any(p.key == BLOCK_ID for p in n.metadata_props)]
    if len(flash) != 1:
        return "its fused node was not found in the main graph"
    made = {o for n in nodes for o in n.output}
    mine = {id(n) for n in nodes}
    by_name_o = {n.name: n for n in graph_o.node if n.name}
    outputs: list[tuple[str, str]] = []
    for node in graph_f.node:
        if id(node) in mine:
            continue
        for i, name in enumerate(node.input):
            if name not in made:
                continue
            twin = by_name_o.get(node.name) if node.name else None
            if twin is None or i >= len(twin.input):
                return f"{node.name or node.op_type} reads the fused output and has no twin in the original"
            pair = (twin.input[i], name)
            if pair not in outputs:
                outputs.append(pair)
    for output in graph_f.output:  # a graph output fusion's nodes write under the original's name
        if output.name in made and (output.name, output.name) not in outputs:
            outputs.append((output.name, output.name))
    if not outputs or len({f for _, f in outputs}) != len(outputs):
        return "its outputs could not be matched to the original's"
    original: list[onnx.NodeProto] = []
    seen: set[int] = set()
    todo = [x for x, _ in outputs]
    while todo:
        node = producer_o.get(todo.pop())
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        original.append(node)
        todo += [i for i in node.input if i]
        todo += sorted(subgraph_reads(node))
    order = {id(n): i for i, n in enumerate(graph_o.node)}
    original.sort(key=lambda n: order[id(n)])
    if any(name not in {o for n in original for o in n.output} for name, _ in outputs):
        return "its original output is computed outside the block"
    return BlockPlan(list(nodes), original, outputs, flash[0])


def if_node(
    plan: BlockPlan,
    condition: tuple[str, str],
    row: int,
    threshold: Threshold,
    shapes: Mapping[str, tuple[int, list[str | int | None]]],
    witness: bool,
    known: Mapping[str, onnx.ValueInfoProto],
) -> onnx.NodeProto:
    def value_info(name: str, like: str) -> onnx.ValueInfoProto:
        elem = shapes.get(like, (onnx.TensorProto.FLOAT, []))[0] or onnx.TensorProto.FLOAT
        return helper.make_tensor_value_info(name, elem, None)

    renamed = {x: f"{x}/original" for x, _ in plan.outputs}
    else_nodes = [renamed_copy(n, renamed, "") for n in plan.original]
    else_graph = helper.make_graph(
        else_nodes, f"ortflash/length_dispatch_{row}/original", [], [value_info(renamed[x], x) for x, _ in plan.outputs]
    )
    if witness:  # the original ops on both sides: what the If itself costs
        again = {o: f"{o}/witness" for n in plan.original for o in n.output}
        then_nodes = [renamed_copy(n, again, "/witness") for n in plan.original]
        then_outputs = [value_info(again[x], x) for x, _ in plan.outputs]
    else:  # a name the If itself outputs is renamed inside the branch (names are unique model-wide)
        inside = {f: f"{f}/fused" for x, f in plan.outputs if f == x}
        then_nodes = [renamed_copy(n, inside, "") for n in plan.fused] if inside else list(plan.fused)
        then_outputs = [value_info(inside.get(f, f), x) for x, f in plan.outputs]
    then_graph = helper.make_graph(then_nodes, f"ortflash/length_dispatch_{row}/fused", [], then_outputs)
    for graph in (then_graph, else_graph):  # the shapes of what each branch computes (branch_shapes)
        made = {o for n in graph.node for o in n.output} - {o.name for o in graph.output}
        graph.value_info.extend(known[o] for o in sorted(made) if o in known)
    cond, keys = condition
    node = helper.make_node(
        "If",
        [cond],
        [x for x, _ in plan.outputs],
        name=f"ortflash/length_dispatch_{row}/If",
        then_branch=then_graph,
        else_branch=else_graph,
    )
    meta = {
        "block": row,
        "key_len": threshold.key_len,
        "decode_key_len": threshold.decode,
        "condition": cond,
        "keys": keys,
    }
    node.metadata_props.add(key=DISPATCH_KEY, value=json.dumps(meta))
    return node


def renamed_copy(node: onnx.NodeProto, names: Mapping[str, str], suffix: str) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    copy.name = node.name + suffix if node.name else ""
    copy.input[:] = [names.get(i, i) for i in node.input]
    copy.output[:] = [names.get(o, o) for o in node.output]
    return copy
