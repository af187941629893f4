"""What ONNX nodes read, their subgraphs' reads from outer scope included, and an order of nodes
where each comes after what it reads (pipeline/length_dispatch's graphs, rewritten around Ifs)."""

from __future__ import annotations

from collections.abc import Iterable

import onnx

from ..model_io import graphs_of


def subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs read from outside themselves."""
    reads: set[str] = set()
    for attr in node.attribute:
        for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
            made = {o for g in graphs_of(sub) for n in g.node for o in n.output}
            made |= {t.name for g in graphs_of(sub) for t in g.initializer} | {i.name for i in sub.input}
            reads |= {i for g in graphs_of(sub) for n in g.node for i in n.input if i and i not in made}
            reads |= {o.name for o in sub.output if o.name not in made}
    return reads


def names_read(nodes: Iterable[onnx.NodeProto]) -> set[str]:
    return {i for n in nodes for i in (*n.input, *subgraph_reads(n)) if i}


def topological(nodes: list[onnx.NodeProto], graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """nodes in an order where each comes after what it reads (subgraphs' outer reads too), in any process."""
    ready = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    producer = {o: k for k, n in enumerate(nodes) for o in n.output}
    reads = [[i for i in (*n.input, *sorted(subgraph_reads(n))) if i in producer] for n in nodes]  # sorted: stable
    done: list[bool] = [False] * len(nodes)
    order: list[onnx.NodeProto] = []
    for start in range(len(nodes)):
        stack = [(start, False)]
        while stack:
            k, expanded = stack.pop()
            if done[k]:
                continue
            if expanded:
                done[k] = True
                order.append(nodes[k])
                continue
            stack.append((k, True))
            stack += [(producer[i], False) for i in reads[k] if not done[producer[i]] and i not in ready]
    return order
