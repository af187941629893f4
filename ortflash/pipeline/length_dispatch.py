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

The construction is here (dispatch); each block's threshold, branches and If are in
dispatch_plan, the shared conditions in dispatch_conditions, where a graph is in the model in
subgraph_paths, and what nodes read (outer scope included) and their order in node_reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import onnx

from .dispatch_conditions import Conditions
from .dispatch_plan import BlockPlan, Threshold, if_node, new_nodes_by_row, plan_block, renamed_copy
from .node_reads import names_read, topological
from .subgraph_paths import GraphPath, graph_at, graph_at_chain, in_if_branches, rows_by_graph, walk_order

_NEW_NODES = "ortflash/"


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
    where = rows_by_graph(fused.graph, set(thresholds))
    left: dict[int, str] = {
        row: "its fused node was not found in the main graph" for row in thresholds if row not in where
    }
    # each graph that holds dispatched blocks, the main graph first, then the branches in walk order
    paths = sorted({path for path in where.values()}, key=lambda path: (len(path) > 0, walk_order(fused.graph, path)))
    planned: list[tuple[GraphPath, onnx.GraphProto, onnx.GraphProto, _Planned]] = []
    for path in paths:
        rows = {row: t for row, t in thresholds.items() if where.get(row) == path}
        graph_o = graph_at(original.graph, path)
        if graph_o is None or not in_if_branches(fused.graph, path):
            why = (
                "its graph has no twin in the original"
                if graph_o is None
                else "it is inside a Loop or Scan body, whose sides a run cannot show"
            )
            left.update({row: why for row in rows})
            continue
        graph_f = graph_at(fused.graph, path)
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
        graph_out = graph_at(out.graph, path)  # written into; graph_f (the fused model's) is read
        assert graph_out is not None
        if path:  # a branch: its own values' shapes over the main graph's, and what it reads from outside
            inferred_graph = graph_at(shaped.graph, path)
            shapes = {**main_shapes, **(_shape_table_of(inferred_graph) if inferred_graph is not None else {})}
            visible = [*graph_at_chain(out.graph, path)]
            prefix = f"ortflash/length_dispatch@{index}"
        else:
            shapes, visible, prefix = main_shapes, [], "ortflash/length_dispatch"
        conditions = Conditions(
            graph_f, shapes if share_conditions else {}, fused.opset_import, prefix=prefix, outer=visible
        )
        _write_ifs(graph_out, graph_o, graph_f, plans, thresholds, shapes, conditions, witness, branch_shapes)
    return Dispatched(out, frozenset(row for *_, plans in planned for row in plans.plans), left)


@dataclass
class _Planned:
    plans: dict[int, BlockPlan]
    shared: list[onnx.NodeProto]  # original nodes more than one dispatched block's else branch needs


def _planned(
    graph_o: onnx.GraphProto, graph_f: onnx.GraphProto, thresholds: Mapping[int, Threshold]
) -> _Planned | dict[int, str]:
    """Each block's branches in one graph, or the rows that cannot be written so (row -> why)."""
    # what the fused model's own nodes compute (fusion's new nodes may reuse a graph output's name)
    fused_outputs = {o for n in graph_f.node if not n.name.startswith(_NEW_NODES) for o in n.output if o}
    removed = [n for n in graph_o.node if not any(o in fused_outputs for o in n.output if o)]
    producer_o = {o: n for n in removed for o in n.output if o}
    new_nodes = new_nodes_by_row(graph_f, set(thresholds))
    left: dict[int, str] = {}
    plans: dict[int, BlockPlan] = {}
    for row in thresholds:
        plan = plan_block(row, new_nodes.get(row, []), graph_f, graph_o, producer_o)
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
    conditions: Conditions,
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
        outer.append(if_node(plan, (cond, key_len), row, threshold, shapes, witness, known))
    outer += conditions.nodes
    # the outer consumers read each block's output by the original's name, the If's
    to_original = {f: x for plan in plans.values() for x, f in plan.outputs}
    outer = [renamed_copy(n, to_original, "") if set(n.input) & to_original.keys() else n for n in outer]

    names_f = {t.name for t in graph_f.initializer}
    read = names_read(outer)
    graph_out.initializer.extend(t for t in graph_o.initializer if t.name not in names_f and t.name in read)
    graph_out.initializer.extend(conditions.initializers)
    inner = {o for plan in plans.values() for n in (*plan.fused, *plan.original) for o in n.output}
    kept_vi = [vi for vi in graph_out.value_info if vi.name not in inner]
    del graph_out.value_info[:]
    graph_out.value_info.extend(kept_vi)
    del graph_out.node[:]
    graph_out.node.extend(topological(outer, graph_f))


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
