"""One place constructs SoftmaxPolicy (ortflash/op/policy.py) and one module writes FlashAttention
nodes and reads them back (ortflash/op/node.py): ARCHITECTURE.md's "one of each", checked on the
source (issue 21)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ortflash"


def _calls(name: str) -> dict[str, int]:
    """Modules (relative paths) with calls of ``name(...)``, and how many."""
    found: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        n = sum(
            1
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Name) and node.func.id == name)
                or (isinstance(node.func, ast.Attribute) and node.func.attr == name)
            )
        )
        if n:
            found[str(path.relative_to(PACKAGE))] = n
    return found


def test_only_the_policy_module_constructs_a_softmax_policy():
    assert set(_calls("SoftmaxPolicy")) == {"op/policy.py"}


def test_only_emit_writes_flash_attention_nodes():
    writers = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            # e.node(spec.OP_TYPE, ..., domain=spec.DOMAIN): an Emitter writing the op
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "node"
                and node.args
                and isinstance(node.args[0], ast.Attribute)
                and node.args[0].attr == "OP_TYPE"
            ):
                writers.add(str(path.relative_to(PACKAGE)))
    assert writers == {"op/node.py"}


def test_only_the_node_module_reads_flash_attention_nodes_back():
    """A node's attributes are read back in one place, op/node.py (node_attributes, read_node), the
    side channel resolved there by the op's codec; the ONNX Runtime bridge gets them from the
    runtime as a dict and decodes the channel itself, the session to replace its kernel choice."""
    assert "op/node.py" in _calls("resolve")  # side_channel.resolve
    assert set(_calls("decode")) >= {"op/side_channel.py", "kernels/ort_bridge.py", "session.py"}
    assert set(_calls("resolved")) == {"op/side_channel.py", "kernels/ort_bridge.py"}


def test_one_override_rule():
    """A policy that overrides a node's own is applied in one place, SoftmaxPolicy.for_node
    (the wgpu kernel had its own rule: a partial override then raised in choose)."""
    assert set(_calls("applied_to")) == {"op/policy.py"}
    assert set(_calls("for_node")) == {
        "checks/length_sides.py",  # verify's node_policy, since 8c53479's split
        "checks/validate.py",
        "kernels/cpu.py",
        "kernels/reference.py",
        "kernels/wgpu/kernel.py",
    }
