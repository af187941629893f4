"""Raise a model's default-domain opset op by op, instead of with onnx.version_converter.

The whole-model converter stops at the first op it has no adapter for (ONNX Runtime's
LayerNormalization-1 in the ONNX domain below opset 17), at a node of a domain the model does not
import, and at an op without an ONNX schema (SimplifiedLayerNormalization). Here every node of
every graph (If branches, Loop and Scan bodies, model functions) is carried over on its own:

- other domains (com.microsoft, ai.onnx.ml, custom) are left alone;
- an op whose schema is the same at both opsets carries over as it is;
- an op whose schema changed carries over through each version step between the two: a step
  that only changes the types, where the node's own types fit the new ones (bound to one type
  where the new schema binds them), a step of the named table ``SAME_MEANING`` (opset_table.py,
  each with why: new attributes whose defaults keep the old meaning, new optional inputs), for a
  node that leaves the new attributes at those defaults and whose types fit, or a step written
  out (opset_rewrites.py's ``REWRITES``: axes and split attributes become inputs, Softmax-13's
  axis, Clip-11, Pad-11, Resize-13, inference Dropout-12, BatchNormalization-14,
  LayerNormalization-17);
- anything else raises OpsetNotRaised naming the op, its node and the step.

Ops ONNX has no schema for are read from ONNX Runtime's registry, where the model will run
(opset_table.chain). This module is the pass and the proof of a step (``_Raiser.node``,
``_step_misfit``, ``_types_misfit``).
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

from .opset_rewrites import REWRITES, ModelFacts
from .opset_table import (
    OPTIONAL,
    SAME_MEANING,
    VARIADIC,
    OpsetNotRaised,
    Same,
    attributes,
    bound_types,
    chain,
    is_default,
    params,
    slots,
)

__all__ = ["OpsetNotRaised", "raise_default_opset"]

_DEFAULT_DOMAINS = ("", "ai.onnx")


def raise_default_opset(model: onnx.ModelProto, version: int) -> onnx.ModelProto:
    """A copy of ``model`` whose default-domain opset is ``version``, every node carried over exactly.

    A model already at ``version`` or above comes back as it is. Raises OpsetNotRaised for the
    first node that cannot be carried over."""
    source = _default_version(model.opset_import)
    if source >= version:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    raiser = _Raiser(out, version)
    raiser.graph(out.graph, source)
    for function in out.functions:
        function_source = _default_version(function.opset_import)
        if function_source < version and any(n.domain in _DEFAULT_DOMAINS for n in function.node):
            raiser.nodes(function.node, function_source)
            _set_default_version(function.opset_import, version)
    _set_default_version(out.opset_import, version)
    return out


def _default_version(imports: Any) -> int:
    return next((i.version for i in imports if i.domain in _DEFAULT_DOMAINS), 1)


def _set_default_version(imports: Any, version: int) -> None:
    for imp in imports:
        if imp.domain in _DEFAULT_DOMAINS:
            imp.version = version
            return
    imports.append(helper.make_opsetid("", version))


# ---------------------------------------------------------------- the pass


class _Raiser(ModelFacts):
    """Carries the nodes of one model to ``target``, knowing its values' types and ranks."""

    def __init__(self, model: onnx.ModelProto, target: int) -> None:
        super().__init__(model)
        self.target = target

    def graph(self, graph: onnx.GraphProto, source: int) -> None:
        self.nodes(graph.node, source)

    def nodes(self, nodes: Any, source: int) -> None:
        carried: list[onnx.NodeProto] = []
        for node in nodes:
            for attr in node.attribute:
                for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                    self.graph(sub, source)
            carried += self.node(node, source) if node.domain in _DEFAULT_DOMAINS else [node]
        del nodes[:]
        nodes.extend(carried)

    def node(self, node: onnx.NodeProto, source: int) -> list[onnx.NodeProto]:
        """node at ``self.target``: itself, or the nodes that compute the same."""
        where = f"{node.op_type} (node {node.name!r})" if node.name else node.op_type
        found = chain(node.op_type, source, self.target)
        if found is None:
            raise OpsetNotRaised(
                f"{where} has no schema at opset {source} in ONNX {onnx.__version__} or in ONNX Runtime, "
                f"so nothing shows it means the same at opset {self.target}"
            )
        schemas, registry = found
        before: list[onnx.NodeProto] = []
        after: list[onnx.NodeProto] = []
        for old, new in zip(schemas, schemas[1:]):
            step = (node.op_type, new.since_version)
            if step in REWRITES:
                pre, node, post = REWRITES[step](self, node)
                before, after = before + pre, post + after
            elif misfit := self._step_misfit(node, old, new, SAME_MEANING.get(step)):
                raise OpsetNotRaised(
                    f"{where} changed at opset {new.since_version} ({registry} schema "
                    f"{old.since_version} -> {new.since_version}) in a way ortflash does not convert: {misfit}"
                )
        return before + [node] + after

    def _step_misfit(self, node: onnx.NodeProto, old: Any, new: Any, same: Same | None) -> str:
        """Why ``node`` may not mean the same after the step old -> new; '' where it does. The schemas
        may differ only in new attributes ``same`` names (the node leaving each at its default), new
        optional inputs and outputs the node does not give, and types; the node's own types must
        fit the new ones."""
        if new.deprecated:
            return "the op is deprecated there"
        before, after = attributes(old), attributes(new)
        given = {a.name: a for a in node.attribute}
        for name, had in before.items():
            has = after.get(name)
            made_optional = bool(same and has and had[1] and not has[1] and name in given and has[0] == had[0])
            if has != had and not made_optional:  # an attribute the node must give becomes optional: same
                return f"its attribute {name} {'is removed' if has is None else 'changes'}"
        for name in sorted(set(after) - set(before)):
            if same is None or name not in same.defaults:
                return f"it gains the attribute {name}, which no entry of ortflash's table says keeps the meaning"
            if name in given and not is_default(given[name], same.defaults[name]):
                value = helper.get_attribute_value(given[name])
                return f"the node sets the new attribute {name} ({value!r}), where only its default keeps the meaning"
        for what, was_params, now_params, count in (
            ("input", old.inputs, new.inputs, len(node.input)),
            ("output", old.outputs, new.outputs, len(node.output)),
        ):
            was, now = params(was_params), params(now_params)
            added = now[len(was) :]
            # Single -> Optional, and new optional inputs, only where the table names the step
            kept = all(w == n or (same and n[0] == OPTIONAL and w[0] != VARIADIC) for w, n in zip(was, now))
            if len(now) < len(was) or not kept or (added and (same is None or any(a[0] != OPTIONAL for a in added))):
                return f"its {what}s change"
            if count > len(was) and (not was or was[-1][0] != VARIADIC):
                return f"the node gives {what}s the old schema does not have"
        if same is None and (old.min_input, old.max_input) != (new.min_input, new.max_input):
            return "its number of inputs changes"
        if new.min_input > len([n for n in node.input if n]) or new.max_input < len(node.input):
            return "its number of inputs changes"
        return self._types_misfit(node, old, new)

    def _types_misfit(self, node: onnx.NodeProto, old: Any, new: Any) -> str:
        """Why the node's types may not fit the new schema; '' where they do. A value whose type is
        unknown fits where the step only widens what it may be and ties it to no value it was not
        tied to before (two values of one fixed type, tensor(float), count as tied)."""
        old_bound, new_bound = bound_types(old), bound_types(new)
        was_slots, now_slots = slots(old, node), slots(new, node)
        groups: dict[str, list[tuple[str, str]]] = {}
        for (name, was), (_, now) in zip(was_slots, now_slots):
            kind = _type_string(self.elem.get(name))
            allowed = new_bound.get(now, {now})
            if kind is not None and kind not in allowed:
                return f"{name} is {kind}, which the new schema does not allow"
            if kind is None and not old_bound.get(was, {was}) <= allowed:
                return f"the type of {name} is unknown and the new schema narrows what it may be"
            if now in new_bound:
                groups.setdefault(now, []).append((was, kind or ""))
        for now, members in groups.items():
            kinds = {kind for _, kind in members}
            if len(kinds - {""}) > 1:
                return f"values the new schema binds to one type ({now}) have types {sorted(kinds - {''})}"
            if "" in kinds and len({was for was, _ in members}) > 1:
                return f"the new schema binds values of unknown types to one type ({now}), which the old did not"
        return ""


def _type_string(elem: int | None) -> str | None:
    return None if elem is None else f"tensor({onnx.TensorProto.DataType.Name(elem).lower()})"
