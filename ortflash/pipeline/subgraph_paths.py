"""Where a graph is in a model (pipeline/length_dispatch writes an If into the graph that holds a
block): a ``GraphPath``, (node name, attribute name) from the main graph down; which graph holds
each report row's fused node; the graph at a path and the graphs enclosing it; whether a path runs
through If branches only; and a path's place in a walk of the model."""

from __future__ import annotations

import onnx

from ..op.node import BLOCK_ID

# where a graph is in the model: (node name, attribute name) from the main graph down; () the main graph
GraphPath = tuple[tuple[str, str], ...]


def rows_by_graph(graph: onnx.GraphProto, rows: set[int], path: GraphPath = ()) -> dict[int, GraphPath]:
    """report row -> the graph that holds its fused node (the first found, at any depth)."""
    found: dict[int, GraphPath] = {}
    for node in graph.node:
        for prop in node.metadata_props:
            if prop.key == BLOCK_ID and int(prop.value) in rows:
                found.setdefault(int(prop.value), path)
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                for row, at in rows_by_graph(attr.g, rows, (*path, (node.name, attr.name))).items():
                    found.setdefault(row, at)
    return found


def graph_at(graph: onnx.GraphProto, path: GraphPath) -> onnx.GraphProto | None:
    """The subgraph at ``path`` (the node named so, its attribute), None where a name is missing or repeated."""
    for node_name, attr_name in path:
        nodes = [n for n in graph.node if n.name == node_name]
        if len(nodes) != 1 or not node_name:
            return None
        attrs = [a for a in nodes[0].attribute if a.name == attr_name and a.type == onnx.AttributeProto.GRAPH]
        if len(attrs) != 1:
            return None
        graph = attrs[0].g
    return graph


def graph_at_chain(graph: onnx.GraphProto, path: GraphPath) -> list[onnx.GraphProto]:
    """The graphs enclosing the one at ``path``, the main graph first (the values it reads by outer scope)."""
    chain = [graph]
    for depth in range(1, len(path)):
        sub = graph_at(graph, path[:depth])
        if sub is not None:
            chain.append(sub)
    return chain


def in_if_branches(graph: onnx.GraphProto, path: GraphPath) -> bool:
    """Whether every step of ``path`` is an If's branch (not a Loop or Scan body)."""
    for depth, (node_name, _) in enumerate(path):
        holder = graph_at(graph, path[:depth])
        node = next((n for n in holder.node if n.name == node_name), None) if holder is not None else None
        if node is None or node.op_type != "If":
            return False
    return True


def walk_order(graph: onnx.GraphProto, path: GraphPath) -> list[int]:
    """The place of ``path`` in a walk of the model (node index, then then_branch before else_branch)."""
    order: list[int] = []
    for node_name, attr_name in path:
        index = next((k for k, n in enumerate(graph.node) if n.name == node_name), len(graph.node))
        node = graph.node[index] if index < len(graph.node) else None
        attrs = [a.name for a in node.attribute] if node is not None else []
        order += [index, attrs.index(attr_name) if attr_name in attrs else len(attrs)]
        sub = graph_at(graph, ((node_name, attr_name),))
        if sub is None:
            break
        graph = sub
    return order
