"""The conditions of the Ifs on the length (pipeline/length_dispatch): for each block, whether the
run's key length (and, where a one-query step is possible, the query length) is past its
threshold, read with Shape from the outer value the block's K (Q) comes from, and computed once
per distinct length dim and threshold, shared by every block that has it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import onnx
from onnx import helper

from .dispatch_plan import BlockPlan, Threshold


class Conditions:
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

    def condition(self, plan: BlockPlan, threshold: Threshold, row: int) -> tuple[list[onnx.NodeProto], str, str]:
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

    def _length(
        self, plan: BlockPlan, operand: int, row: int, hoisted: list[onnx.NodeProto]
    ) -> tuple[object | None, str]:
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
