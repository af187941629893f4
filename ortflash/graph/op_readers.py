"""The reading of each op of a mask subgraph into terms (graph/terms), one rule per op in ``OPS``:
``Unsqueeze``/``Squeeze``/``Reshape``/``Expand``/broadcasting move index variables between axes;
``Gather`` on a flattened tensor and ``GatherND`` with built index tuples become look-ups (a
``GatherND`` of index arithmetic alone, such as position ids ``Expand(Range(S))``, that arithmetic at
the index); comparisons, bool ops, ``Where`` and integer arithmetic build terms; a ``Concat`` of
other than size-1 pieces is read where it continues its last piece's term, a ``CumSum`` where its
input is 0 (transformers' packed-sequence test on position ids that are one range per row). graph/interpret's ``Reader``
runs them; a rule that cannot read its op raises ``NotProved`` naming the step.

The rules are in term_readers (the ops that build terms), axis_readers (those that move index
variables between axes) and lookup_readers (the look-ups); what each asks of the reader, and
broadcasting, in tensor_reader.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from .axis_readers import read_concat, read_expand, read_reshape, read_slice, read_squeeze, read_unsqueeze
from .lookup_readers import read_gather, read_gather_nd
from .tensor_reader import TensorReader
from .term_readers import (
    elementwise,
    read_cast,
    read_constant_of_shape,
    read_cumsum,
    read_identity,
    read_not,
    read_range,
)
from .terms import Abstract

OPS: dict[str, Callable[[TensorReader, ir.Node, int], Abstract]] = {
    **{
        op: elementwise(op)
        for op in (
            "Less",
            "LessOrEqual",
            "Greater",
            "GreaterOrEqual",
            "Equal",
            "And",
            "Or",
            "Where",
            "Add",
            "Sub",
            "Mul",
        )
    },
    "Not": read_not,
    "Cast": read_cast,
    "Identity": read_identity,
    "Range": read_range,
    "Unsqueeze": read_unsqueeze,
    "Squeeze": read_squeeze,
    "Reshape": read_reshape,
    "Expand": read_expand,
    "ConstantOfShape": read_constant_of_shape,
    "Gather": read_gather,
    "GatherND": read_gather_nd,
    "Concat": read_concat,
    "Slice": read_slice,
    "CumSum": read_cumsum,
}
