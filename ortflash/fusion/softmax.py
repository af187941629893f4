"""The Softmax front end (driver.FrontEnd): the blocks around each Softmax of the plain ops, read
by softmax_read (the walk over the rules, or why it is not one) and written by softmax_write as
FlashAttention nodes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import onnx_ir as ir

from ..graph.emitter import Emitter
from ..op.policy import SoftmaxPolicy
from .driver import Written
from .softmax_block import SoftmaxBlock
from .softmax_read import describe, read_block
from .softmax_write import write_block


@dataclass(frozen=True)
class SoftmaxFrontEnd:
    """The blocks around each Softmax (fusion/driver.FrontEnd). prove_causal: read each block's
    [B, 1, Sq, Sk] bias or mask as causal x key padding where that is proved (fusion/causal);
    False keeps the tensor as the block's bias or mask (the baseline of
    benchmarks/results/causal_proof.md)."""

    prove_causal: bool = True
    label: str = "Softmax"
    prefix: str = "attention"
    one_op: bool = False

    def candidates(self, graph: ir.Graph) -> list[ir.Node]:
        return [n for n in graph if n.op_type == "Softmax" and n.domain in ("", "ai.onnx")]

    def read(self, node: ir.Node, opset: int) -> SoftmaxBlock:
        return read_block(node, opset)

    def unread_columns(self) -> Mapping[str, object]:
        return {}

    def columns(self, reading: SoftmaxBlock) -> Mapping[str, object]:
        return describe(reading)

    def anchor(self, reading: SoftmaxBlock, node: ir.Node) -> ir.Node:
        matmul_pv = reading.output.producer() if reading.output is not None else None
        assert matmul_pv is not None
        return matmul_pv

    def heads_per_batch_head(self, reading: SoftmaxBlock) -> bool:
        return reading.rank == 3 and reading.heads_split is None

    def write(self, e: Emitter, reading: SoftmaxBlock, policy: SoftmaxPolicy, block_id: str) -> Written:
        return write_block(e, reading, policy, block_id, prove_causal=self.prove_causal)
