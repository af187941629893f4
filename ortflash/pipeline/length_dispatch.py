"""A model that picks each block's form by the length it is run at: the fused block where the
run's key length is at or past the cost table's crossover, the block's original ops below it, both
inside the model (an ONNX ``If`` per block), so plain ONNX Runtime plus ortflash's op decides.

Built from the original model and the model with the blocks fused (FlashAttention nodes, every
block's new nodes named under ``ortflash/<front end>_<row>/``). Per dispatched block:

- the ``then`` branch holds the block's new nodes (the FlashAttention node and what fusion wrote
  around it), the ``else`` branch the original nodes fusion removed that only this block's output
  needs; both read everything else (Q/K/V projections, the weights, a mask) from the outer graph,
  so no weight is copied. Original nodes that several dispatched blocks need (a mask expanded once
  for every layer) stay in the outer graph.
- the condition is computed once per distinct key-length dim (its name in the inferred shapes; from
  a graph input that carries it where one does) and threshold, and shared by every block that has
  it: two small nodes (Shape, GreaterOrEqual) per distinct length, not per block.
- where the query length can differ from the key length (a KV cache: a prefill and one-token decode
  steps; cross-attention), the condition reads it too: a one-query step takes the fused form only
  from the decode crossover (``Threshold.decode``; None: never).
- a block inside an If's branch (a merged decoder's use_cache_branch, at any depth of Ifs) gets
  its If in that branch, the condition computed there from the branch's values and the enclosing
  graphs' inputs (outer scope); only the branch that runs computes it. A Loop or Scan body is not
  written into (a run cannot show which side its If took).

Each If carries ``DISPATCH_KEY`` in its metadata (the thresholds), which checks/verify.py reads to
run the model on each side. ``witness=True`` writes the original ops in both branches: the If's
own cost, measured by benchmarks/length_dispatch.py. On a GPU EP the If is written first and the
lowering then writes the EP's op inside the fused branch (``branch_shapes``: the shapes it proves from).

Over 400 lines because the branches' split, the shared conditions and the If are one construction
over the same node tables.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import onnx
from onnx import helper

from ..model_io import graphs_of
from ..op.node import BLOCK_ID, DISPATCH_KEY

_NEW_NODES = "ortflash/"


@dataclass(frozen=True)
class Threshold:
    """Where a block takes its fused form: from ``key_len`` keys, and, at a one-query step (decode),
    from ``decode`` keys (None: a decode step keeps the original ops at every length)."""

    key_len: int
    decode: int | None = None


@dataclass(frozen=True)
class Dispatched:
    model: onnx.ModelProto
    rows: frozenset[int]  # the blocks written as an If on the length
    # blocks that cannot be, with why; where any, ``model`` is ``fused`` unchanged and ``rows``
    # empty: the caller keeps them as they were and asks again
    left: Mapping[int, str]


def dispatch(
    original: onnx.ModelProto,
    fused: onnx.ModelProto,
    thresholds: Mapping[int, Threshold],
    inferred: onnx.ModelProto | None = None,
    *,
    witness: bool = False,
    share_conditions: bool = True,
    branch_shapes: bool = False,
) -> Dispatched:
    """``fused`` with each block of ``thresholds`` (report row -> where it takes the fused form)
    written as an If on its run's length, in the graph that holds it: the main graph, or an If's
    branch at any depth (a merged decoder's), where the If is nested in the branch and its
    condition is computed there (reading the enclosing graphs' values by outer scope).
    ``inferred``: the original with inferred shapes (value_info), whose dim names say which
    blocks share a length. ``share_conditions=False`` computes each block's condition from its own
    K (and Q): the alternative the benchmark measures. ``branch_shapes``: the fused model's
    value_info of the values a branch computes moves into that branch, for a lowering that runs
    after the dispatch (a GPU EP's) to prove from."""
    shaped = inferred if inferred is not None else original
    where = _rows_by_graph(fused.graph, set(thresholds))
    left: dict[int, str] = {
        row: "its fused node was not found in the main graph" for row in thresholds if row not in where
    }
    # each graph that holds dispatched blocks, the main graph first, then the branches in walk order
    paths = sorted({path for path in where.values()}, key=lambda path: (len(path) > 0, _walk_order(fused.graph, path)))
    planned: list[tuple[_Path, onnx.GraphProto, onnx.GraphProto, _Planned]] = []
    for path in paths:
        rows = {row: t for row, t in thresholds.items() if where.get(row) == path}
        graph_o = _graph_at(original.graph, path)
        if graph_o is None or not _in_if_branches(fused.graph, path):
            why = (
                "its graph has no twin in the original"
                if graph_o is None
                else "it is inside a Loop or Scan body, whose sides a run cannot show"
            )
            left.update({row: why for row in rows})
            continue
        graph_f = _graph_at(fused.graph, path)
        assert graph_f is not None
        plans = _planned(graph_o, graph_f, rows)
        if isinstance(plans, dict):
            left.update(plans)
        else:
            planned.append((path, graph_o, graph_f, plans))
    if left:  # the caller fuses again with these blocks kept as they were, and asks again
        return Dispatched(fused, frozenset(), left)

    out = onnx.ModelProto()
    out.CopyFrom(fused)
    main_shapes = _shape_table_of(shaped.graph)
    for index, (path, graph_o, graph_f, plans) in enumerate(planned):
        graph_out = _graph_at(out.graph, path)  # written into; graph_f (the fused model's) is read
        assert graph_out is not None
        if path:  # a branch: its own values' shapes over the main graph's, and what it reads from outside
            inferred_graph = _graph_at(shaped.graph, path)
            shapes = {**main_shapes, **(_shape_table_of(inferred_graph) if inferred_graph is not None else {})}
            visible = [*_graph_at_chain(out.graph, path)]
            prefix = f"ortflash/length_dispatch@{index}"
        else:
            shapes, visible, prefix = main_shapes, [], "ortflash/length_dispatch"
        conditions = _Conditions(
            graph_f, shapes if share_conditions else {}, fused.opset_import, prefix=prefix, outer=visible
        )
        _write_ifs(graph_out, graph_o, graph_f, plans, thresholds, shapes, conditions, witness, branch_shapes)
    return Dispatched(out, frozenset(row for *_, plans in planned for row in plans.plans), left)


@dataclass
class _Planned:
    plans: dict[int, _Plan]
    shared: list[onnx.NodeProto]  # original nodes more than one dispatched block's else branch needs


def _planned(
    graph_o: onnx.GraphProto, graph_f: onnx.GraphProto, thresholds: Mapping[int, Threshold]
) -> _Planned | dict[int, str]:
    """Each block's branches in one graph, or the rows that cannot be written so (row -> why)."""
    # what the fused model's own nodes compute (fusion's new nodes may reuse a graph output's name)
    fused_outputs = {o for n in graph_f.node if not n.name.startswith(_NEW_NODES) for o in n.output if o}
    removed = [n for n in graph_o.node if not any(o in fused_outputs for o in n.output if o)]
    producer_o = {o: n for n in removed for o in n.output if o}
    new_nodes = _new_nodes_by_row(graph_f, set(thresholds))
    left: dict[int, str] = {}
    plans: dict[int, _Plan] = {}
    for row in thresholds:
        plan = _plan(row, new_nodes.get(row, []), graph_f, graph_o, producer_o)
        if isinstance(plan, str):
            left[row] = plan
        else:
            plans[row] = plan
    # original nodes more than one dispatched block's else branch needs: computed once, outside
    uses: dict[int, int] = {}
    for plan in plans.values():
        for node in plan.original:
            uses[id(node)] = uses.get(id(node), 0) + 1
    shared = [n for n in removed if uses.get(id(n), 0) > 1]
    for plan in plans.values():
        plan.original = [n for n in plan.original if uses.get(id(n), 0) == 1]
    return left if left else _Planned(plans, shared)


def _write_ifs(
    graph_out: onnx.GraphProto,
    graph_o: onnx.GraphProto,
    graph_f: onnx.GraphProto,
    planned: _Planned,
    thresholds: Mapping[int, Threshold],
    shapes: Mapping[str, tuple[int, list[str | int | None]]],
    conditions: _Conditions,
    witness: bool,
    branch_shapes: bool,
) -> None:
    """graph_out (a copy of graph_f) rewritten with each planned block as an If on its length."""
    plans = planned.plans
    moved = {id(n) for plan in plans.values() for n in plan.fused}
    outer: list[onnx.NodeProto] = [n for n in graph_f.node if id(n) not in moved]
    outer += planned.shared
    for row, plan in sorted(plans.items()):
        threshold = thresholds[row]
        hoisted, cond, key_len = conditions.condition(plan, threshold, row)
        plan.fused = [n for n in plan.fused if id(n) not in {id(h) for h in hoisted}]
        outer += hoisted
        known = {vi.name: vi for vi in graph_f.value_info} if branch_shapes else {}
        outer.append(_if_node(plan, (cond, key_len), row, threshold, shapes, witness, known))
    outer += conditions.nodes
    # the outer consumers read each block's output by the original's name, the If's
    to_original = {f: x for plan in plans.values() for x, f in plan.outputs}
    outer = [_renamed(n, to_original, "") if set(n.input) & to_original.keys() else n for n in outer]

    names_f = {t.name for t in graph_f.initializer}
    read = _names_read(outer)
    graph_out.initializer.extend(t for t in graph_o.initializer if t.name not in names_f and t.name in read)
    graph_out.initializer.extend(conditions.initializers)
    inner = {o for plan in plans.values() for n in (*plan.fused, *plan.original) for o in n.output}
    kept_vi = [vi for vi in graph_out.value_info if vi.name not in inner]
    del graph_out.value_info[:]
    graph_out.value_info.extend(kept_vi)
    del graph_out.node[:]
    graph_out.node.extend(_topological(outer, graph_f))


# where a graph is in the model: (node name, attribute name) from the main graph down; () the main graph
_Path = tuple[tuple[str, str], ...]


def _rows_by_graph(graph: onnx.GraphProto, rows: set[int], path: _Path = ()) -> dict[int, _Path]:
    """report row -> the graph that holds its fused node (the first found, at any depth)."""
    found: dict[int, _Path] = {}
    for node in graph.node:
        for prop in node.metadata_props:
            if prop.key == BLOCK_ID and int(prop.value) in rows:
                found.setdefault(int(prop.value), path)
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                for row, at in _rows_by_graph(attr.g, rows, (*path, (node.name, attr.name))).items():
                    found.setdefault(row, at)
    return found


def _graph_at(graph: onnx.GraphProto, path: _Path) -> onnx.GraphProto | None:
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


def _graph_at_chain(graph: onnx.GraphProto, path: _Path) -> list[onnx.GraphProto]:
    """The graphs enclosing the one at ``path``, the main graph first (the values it reads by outer scope)."""
    chain = [graph]
    for depth in range(1, len(path)):
        sub = _graph_at(graph, path[:depth])
        if sub is not None:
            chain.append(sub)
    return chain


def _in_if_branches(graph: onnx.GraphProto, path: _Path) -> bool:
    """Whether every step of ``path`` is an If's branch (not a Loop or Scan body)."""
    for depth, (node_name, _) in enumerate(path):
        holder = _graph_at(graph, path[:depth])
        node = next((n for n in holder.node if n.name == node_name), None) if holder is not None else None
        if node is None or node.op_type != "If":
            return False
    return True


def _walk_order(graph: onnx.GraphProto, path: _Path) -> list[int]:
    """The place of ``path`` in a walk of the model (node index, then then_branch before else_branch)."""
    order: list[int] = []
    for node_name, attr_name in path:
        index = next((k for k, n in enumerate(graph.node) if n.name == node_name), len(graph.node))
        node = graph.node[index] if index < len(graph.node) else None
        attrs = [a.name for a in node.attribute] if node is not None else []
        order += [index, attrs.index(attr_name) if attr_name in attrs else len(attrs)]
        sub = _graph_at(graph, ((node_name, attr_name),))
        if sub is None:
            break
        graph = sub
    return order


@dataclass
class _Plan:
    fused: list[onnx.NodeProto]  # the then branch (the block's new nodes)
    original: list[onnx.NodeProto]  # the else branch (the original nodes only this block needs)
    outputs: list[tuple[str, str]]  # (the original's output name, the fused model's name for it)
    flash: onnx.NodeProto  # the block's FlashAttention node


def _new_nodes_by_row(graph: onnx.GraphProto, rows: set[int]) -> dict[int, list[onnx.NodeProto]]:
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


def _plan(
    row: int,
    nodes: list[onnx.NodeProto],
    graph_f: onnx.GraphProto,
    graph_o: onnx.GraphProto,
    producer_o: Mapping[str, onnx.NodeProto],
) -> _Plan | str:
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
        todo += sorted(_subgraph_reads(node))
    order = {id(n): i for i, n in enumerate(graph_o.node)}
    original.sort(key=lambda n: order[id(n)])
    if any(name not in {o for n in original for o in n.output} for name, _ in outputs):
        return "its original output is computed outside the block"
    return _Plan(list(nodes), original, outputs, flash[0])


class _Conditions:
    """The If conditions, one per distinct length dim and threshold, shared by the blocks that have it."""

    def __init__(
        self,
        graph: onnx.GraphProto,
        shapes: Mapping[str, tuple[int, list[str | int | None]]],
        opsets: Iterable[onnx.OperatorSetIdProto],
        *,
        prefix: str = "ortflash/length_dispatch",
        outer: Iterable[onnx.GraphProto] = (),
    ) -> None:
        # prefix: the nodes' and constants' names, unique model-wide (a branch's differs from the main
        # graph's); outer: the graphs enclosing a branch, whose inputs it reads by outer scope
        self.graph, self.shapes, self.prefix = graph, shapes, prefix
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.lengths: dict[object, str] = {}
        self.conds: dict[tuple[object, ...], str] = {}
        self.inputs = {i.name: i for g in (*outer, graph) for i in g.input}
        self.opset = next((o.version for o in opsets if o.domain in ("", "ai.onnx")), 1)

    def condition(self, plan: _Plan, threshold: Threshold, row: int) -> tuple[list[onnx.NodeProto], str, str]:
        """The nodes moved out of the then branch to read the lengths, the condition's name and the key length's."""
        hoisted: list[onnx.NodeProto] = []
        keys = self._length(plan, 1, row, hoisted)
        queries = self._length(plan, 0, row, hoisted)
        one_query_possible = keys[0] != queries[0] or keys[0] is None
        decode = threshold.decode if one_query_possible else threshold.key_len
        key = (keys[0] or keys[1], threshold.key_len, decode, queries[0] or queries[1] if one_query_possible else None)
        if key in self.conds:
            return hoisted, self.conds[key], keys[1]
        tag = f"{self.prefix}_{len(self.conds)}"
        long = self._node("GreaterOrEqual", [keys[1], self._const(tag + "/from", threshold.key_len)], tag + "/long")
        if one_query_possible and decode != threshold.key_len:
            step = self._node("Equal", [queries[1], self._const(tag + "/one", 1)], tag + "/one_query")
            if decode is None:
                not_step = self._node("Not", [step], tag + "/prefill")
                cond = self._node("And", [long, not_step], tag + "/cond")
            else:
                from_ = self._const(tag + "/decode_from", decode)
                step_long = self._node("GreaterOrEqual", [keys[1], from_], tag + "/decode_long")
                not_step = self._node("Not", [step], tag + "/prefill")
                if decode >= threshold.key_len:  # long, and at a one-query step past the decode crossover too
                    either = self._node("Or", [not_step, step_long], tag + "/step_ok")
                    cond = self._node("And", [long, either], tag + "/cond")
                else:  # a decode crossover below the prefill one (a GPU EP's): each step by its own
                    step_fused = self._node("And", [step, step_long], tag + "/step_fused")
                    prefill_fused = self._node("And", [not_step, long], tag + "/prefill_fused")
                    cond = self._node("Or", [step_fused, prefill_fused], tag + "/cond")
        else:
            cond = long
        self.conds[key] = cond
        return hoisted, cond, keys[1]

    def _length(self, plan: _Plan, operand: int, row: int, hoisted: list[onnx.NodeProto]) -> tuple[object | None, str]:
        """(the dim's name where shapes give one, the value [1] int64 holding the run's length) of the
        fused node's Q (operand 0) or K (1), BNSH axis 2; read from the outer value it comes from."""
        value, axis = plan.flash.input[operand], 2
        made = {o: n for n in plan.fused for o in n.output}
        while value in made and made[value].op_type == "Transpose":  # fusion's own head split
            node = made[value]
            perm = [a.ints for a in node.attribute if a.name == "perm"]
            if not perm:
                break
            value, axis = node.input[0], list(perm[0])[axis]
        if value in made:  # read from inside the block: its producers leave the branch
            stack = [made[value]]
            while stack:
                node = stack.pop()
                if node not in hoisted:
                    hoisted.append(node)
                    stack += [made[i] for i in node.input if i in made]
        rank, dims = self.shapes.get(value, (0, []))
        dim = dims[axis] if 0 <= axis < len(dims) else None
        symbol: object | None = dim if isinstance(dim, (str, int)) and dim != "" else None
        if symbol is not None and symbol in self.lengths:
            return symbol, self.lengths[symbol]
        source, at = value, axis
        if isinstance(symbol, str):  # a graph input with the same dim: the length is known at the top
            for name, (_, in_dims) in self.shapes.items():
                if name in self.inputs and symbol in in_dims:
                    source, at = name, in_dims.index(symbol)
                    break
        tag = f"{self.prefix}/len_{len(self.lengths)}_{row}_{operand}"
        if self.opset >= 15:  # Shape's start and end
            out = self._node("Shape", [source], tag)
            self.nodes[-1].attribute.extend([helper.make_attribute("start", at), helper.make_attribute("end", at + 1)])
        else:
            out = self._node(
                "Gather", [self._node("Shape", [source], tag + "/shape"), self._const(tag + "/axis", at)], tag
            )
        if symbol is not None:
            self.lengths[symbol] = out
        return symbol, out

    def _node(self, op: str, inputs: list[str], output: str) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], name=output))
        return output

    def _const(self, name: str, value: int) -> str:
        self.initializers.append(helper.make_tensor(name, onnx.TensorProto.INT64, [1], [value]))
        return name


def _if_node(
    plan: _Plan,
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
    else_nodes = [_renamed(n, renamed, "") for n in plan.original]
    else_graph = helper.make_graph(
        else_nodes, f"ortflash/length_dispatch_{row}/original", [], [value_info(renamed[x], x) for x, _ in plan.outputs]
    )
    if witness:  # the original ops on both sides: what the If itself costs
        again = {o: f"{o}/witness" for n in plan.original for o in n.output}
        then_nodes = [_renamed(n, again, "/witness") for n in plan.original]
        then_outputs = [value_info(again[x], x) for x, _ in plan.outputs]
    else:  # a name the If itself outputs is renamed inside the branch (names are unique model-wide)
        inside = {f: f"{f}/fused" for x, f in plan.outputs if f == x}
        then_nodes = [_renamed(n, inside, "") for n in plan.fused] if inside else list(plan.fused)
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


def _renamed(node: onnx.NodeProto, names: Mapping[str, str], suffix: str) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    copy.name = node.name + suffix if node.name else ""
    copy.input[:] = [names.get(i, i) for i in node.input]
    copy.output[:] = [names.get(o, o) for o in node.output]
    return copy


def _subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs read from outside themselves."""
    reads: set[str] = set()
    for attr in node.attribute:
        for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
            made = {o for g in graphs_of(sub) for n in g.node for o in n.output}
            made |= {t.name for g in graphs_of(sub) for t in g.initializer} | {i.name for i in sub.input}
            reads |= {i for g in graphs_of(sub) for n in g.node for i in n.input if i and i not in made}
            reads |= {o.name for o in sub.output if o.name not in made}
    return reads


def _names_read(nodes: Iterable[onnx.NodeProto]) -> set[str]:
    return {i for n in nodes for i in (*n.input, *_subgraph_reads(n)) if i}


def _topological(nodes: list[onnx.NodeProto], graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """nodes in an order where each comes after what it reads (subgraphs' outer reads too), in any process."""
    ready = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    producer = {o: k for k, n in enumerate(nodes) for o in n.output}
    reads = [[i for i in (*n.input, *sorted(_subgraph_reads(n))) if i in producer] for n in nodes]  # sorted: stable
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


def _shape_table_of(graph: onnx.GraphProto) -> dict[str, tuple[int, list[str | int | None]]]:
    """value name -> (element type, dims: a number, a dim's name, or None) from one graph's
    inputs, outputs and value_info."""
    table: dict[str, tuple[int, list[str | int | None]]] = {}
    for vi in (*graph.input, *graph.value_info, *graph.output):
        t = vi.type.tensor_type
        dims: list[str | int | None] = []
        if t.HasField("shape"):
            for d in t.shape.dim:
                dims.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or None))
        table[vi.name] = (t.elem_type, dims)
    return table
