"""Lower FlashAttention nodes to native ops: ONNX Runtime's contrib ops or standard ONNX.

    model, notes = lower(model, "contrib")   # or "onnx", or "ortflash" (no change)

Targets (DESIGN.md, "Targets"):

- ``ortflash``: nothing changes; FlashAttention runs through ``ortflash.session_options()``.
- ``contrib``: ONNX Runtime's ``com.microsoft`` MultiHeadAttention; GroupQueryAttention for
  causal grouped-query blocks (and causal soft-capped ones) where it provably computes the same.
- ``onnx``: the standard ``Attention`` op; the model's default opset is converted to 23.

A node is lowered only where the target op computes exactly what FlashAttention computes
(``ortflash/spec.py``), up to float32 rounding. Otherwise it stays a FlashAttention node, the
model still needs ortflash to run, and its LoweringNote says why. What the rules rest on was
measured on ONNX Runtime 1.31 (CPU EP) and is pinned by tests/test_lower.py:

- MultiHeadAttention: query 3D [B, S, N·H]; key/value 3D, or 4D BNSH when key and value have
  the same shape; ``attention_bias`` must be 4D [B|1, N|1, Sq, Sk] (Sq and Sk not broadcast);
  it is added to ``scale·QKᵀ``. A row whose scores are all -inf gives NaN; a row of
  float32-lowest scores gives the uniform average (no special case). ``unidirectional`` is
  top-left aligned when Sq >= Sk but not when Sq < Sk (the last query row then sees every key),
  so causality is always written into ``attention_bias`` instead. Float16 runs on the CPU EP.
- GroupQueryAttention (no past): needs Sq == Sk, equal key/value head sizes and (CPU EP) a
  head size that is a multiple of 8; causal with
  ``seqlens_k = Sk - 1`` for every row is then the top-left mask; softcap is applied before
  ``attention_bias``; all -inf rows give NaN, like MHA.
- ONNX Attention (opset 23): 4D Q/K/V, native GQA, V's head size free, softcap before the mask;
  ``is_causal`` is top-left aligned without past (Sq < Sk and Sq > Sk checked); ``attn_mask``
  must be 2D-4D with its last two dims exactly [Sq, Sk]. A row whose scores are all -inf gives
  zeros (the opset-23 errata; NaN before it), and so does a row whose maximum is float32-lowest
  (ONNX Runtime uses lowest as its own mask sentinel) where the ONNX reference gives the uniform
  average. So the lowering writes fully masked rows out itself (Where on ReduceMax(mask) ==
  -inf: NaN, or zeros after a NaN guard) and moves float32-lowest mask values one float up
  (the same for softmax, not the sentinel).

Exactness of the additive form: FlashAttention *replaces* masked scores with ``mask_fill``;
native ops *add* a bias. With ``mask_fill = -inf`` that is the same (s + -inf = -inf). A finite
fill at or below -2**127 (float32-lowest, as transformers writes) is absorbed too: s + fill rounds
to a number that softmax treats exactly as fill for |s| < 2**103. A smaller finite fill (-1e4,
-1e9) is not: rows whose keys are all masked give the mean of V in FlashAttention and something
else natively, so such blocks stay.

Also: a NaN guard (``masked_rows = "zero"``) on the contrib ops is Where(IsNaN(out), 0, out),
exact for finite V; float16 blocks keep the exact casts around the node and lower in float32;
grouped-query blocks that GroupQueryAttention does not provably compute go to
MultiHeadAttention with K/V heads repeated (Unsqueeze/Expand/Reshape, query head h reading kv
head h // (Hq/Hkv)); a negative scale stays (both native ops take positive scales only).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from .. import spec
from . import fuse
from . import ir_utils as u

TARGETS = ("ortflash", "contrib", "onnx")
CONTRIB_DOMAIN = "com.microsoft"
CONTRIB_VERSION = 1
ONNX_ATTENTION_OPSET = 23
ONNX_IR_VERSION = 10  # ONNX Runtime 1.31 and onnxruntime-web 1.30 load it with opset 23
MIN_CONTRIB_OPSET = 13  # the helper ops are written in their opset-13 forms (axes as inputs)

OP_MHA = f"{CONTRIB_DOMAIN}.MultiHeadAttention"
OP_GQA = f"{CONTRIB_DOMAIN}.GroupQueryAttention"
OP_ATTENTION = "Attention"
OP_KEPT = spec.OP_TYPE

_F32_LOWEST = float(np.finfo(np.float32).min)
# One step above lowest: the same mask value for softmax, but not ONNX Runtime's sentinel.
_F32_ABOVE_LOWEST = float(np.nextafter(np.float32(_F32_LOWEST), np.float32(0)))
_ABSORBING_FILL = -(2.0**127)  # fills at or below this have a float32 ulp of 2**104
_NEEDS_ORTFLASH = "the model still needs ortflash (ortflash.session_options()) to run"
_SWAP_SH = [0, 2, 1, 3]  # [B, H, S, D] <-> [B, S, H, D]


@dataclass(frozen=True)
class LoweringNote:
    """One FlashAttention node: lowered to ``op``, or kept (op ``FlashAttention``) and why."""

    node_name: str
    lowered: bool
    reason: str
    op: str

    def __str__(self) -> str:
        state = f"lowered to {self.op}" if self.lowered else "kept as FlashAttention"
        return f"{self.node_name}: {state}" + (f" ({self.reason})" if self.reason else "")


def block_index(node_name: str) -> int | None:
    """The report row (index in Report.blocks) a FlashAttention node written by ortflash.optimize
    stands for: fuse.py names them ``ortflash/attention_<index>/...``. None for other names."""
    m = re.match(r"ortflash/attention_(\d+)/", node_name)
    return int(m.group(1)) if m else None


class _Kept(Exception):
    """A precondition of the target op that this block does not meet."""


def lower(model: onnx.ModelProto, target: str) -> tuple[onnx.ModelProto, list[LoweringNote]]:
    """Replace every FlashAttention node the target op computes exactly; notes for all of them.

    The input model is not modified. When nothing is lowered the input model itself comes back.
    """
    if target not in TARGETS:
        raise ValueError(f"unknown lowering target {target!r}: use one of {', '.join(TARGETS)}")
    names = [_name(n, i) for i, n in enumerate(_fa_protos(model))]
    if not names:
        return model, []
    if target == "ortflash":
        why = "target ortflash keeps FlashAttention; it runs with ortflash.session_options()"
        return model, [LoweringNote(n, False, why, OP_KEPT) for n in names]

    work = model
    if target == "onnx" and u.default_opset(model) < ONNX_ATTENTION_OPSET:
        try:
            work = onnx.version_converter.convert_version(model, ONNX_ATTENTION_OPSET)
        except Exception as exc:  # the converter raises several types
            why = (f"the model could not be converted to opset {ONNX_ATTENTION_OPSET} for Attention "
                   f"({type(exc).__name__}: {str(exc).splitlines()[0][:160]}); {_NEEDS_ORTFLASH}")
            return model, [LoweringNote(n, False, why, OP_KEPT) for n in names]
    opset = u.default_opset(work)
    irm = ir.serde.deserialize_model(_with_shapes(work))
    graph = irm.graph

    notes: list[LoweringNote] = []
    stem = _fresh_stem(irm)
    for index, node in enumerate([n for n in graph if _is_fa(n)]):
        name = _name(node, index)
        try:
            block = _Block.read(node)
            e = _Emitter(graph, node, f"{stem}_{index}")
            if target == "contrib":
                op, how = _lower_contrib(e, block, opset)
            else:
                op, how = _lower_onnx(e, block)
        except _Kept as why:
            notes.append(LoweringNote(name, False, f"{why}; {_NEEDS_ORTFLASH}", OP_KEPT))
            continue
        graph.remove(node, safe=True)
        notes.append(LoweringNote(name, True, how, op))

    if not any(n.lowered for n in notes):
        return model, notes
    common_passes.RemoveUnusedNodesPass()(irm)
    if target == "contrib":
        irm.opset_imports[CONTRIB_DOMAIN] = CONTRIB_VERSION
    out = ir.serde.serialize_model(irm)
    _drop_unused_contrib_import(out)
    # Opset 23 belongs to IR 11, but IR 10 is what ONNX Runtime 1.31 and onnxruntime-web 1.30
    # load it with; a model already above 10 keeps its version.
    out.ir_version = max(model.ir_version, ONNX_IR_VERSION) if target == "onnx" else model.ir_version
    declared = {vi.name for vi in model.graph.value_info}
    kept_info = [vi for vi in out.graph.value_info if vi.name in declared]
    del out.graph.value_info[:]
    out.graph.value_info.extend(kept_info)
    return out, notes


# ---------------------------------------------------------------------------------------------
# reading a FlashAttention node


def replace_output(graph: ir.Graph, old: ir.Value, new: ir.Value) -> None:
    """Point every reader of old at new; a graph output keeps its name (and old's type, if known)."""
    if old.is_graph_output():
        name = old.name
        for i, out in enumerate(graph.outputs):
            if out is old:
                graph.outputs[i] = new
        old.name = f"{name}_lowered_away"
        new.name = name
    old.replace_all_uses_with(new)
    if old.dtype is not None:
        new.dtype = old.dtype
    if old.shape is not None:
        new.shape = old.shape


def _fresh_stem(model: ir.Model) -> str:
    """A name stem no node or value of the model uses yet (a model may be lowered twice)."""
    taken = set()
    for node in model.graph.all_nodes():
        taken.add(node.name or "")
        taken.update(v.name or "" for v in node.outputs)
    stems = ("ortflash/lower",) + tuple(f"ortflash/lower{i}" for i in range(2, 1000))
    for stem in stems:
        if not any(t.startswith(stem + "_") for t in taken):
            return stem
    raise RuntimeError("no free node-name stem")  # pragma: no cover


def _fa_protos(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.domain == spec.DOMAIN and n.op_type == spec.OP_TYPE]


def _is_fa(node: ir.Node) -> bool:
    return node.domain == spec.DOMAIN and node.op_type == spec.OP_TYPE


def _name(node, index: int) -> str:
    return node.name or f"{spec.OP_TYPE}_{index}"


def _with_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """model with inferred value_info, FlashAttention outputs included.

    ONNX shape inference knows nothing of FlashAttention, so everything after the first block
    would lose its types. It runs on a copy where each block is a stand-in of the same output
    type and shape (ReduceSum(Q over D) * ReduceSum(V over heads and keys): [B, Hq, Sq, Dv] in
    Q's dtype); the types found are copied onto the real graph."""
    opset = u.default_opset(model)
    proxy = onnx.ModelProto()
    proxy.CopyFrom(model)
    nodes = []
    for i, n in enumerate(proxy.graph.node):
        if n.domain != spec.DOMAIN or n.op_type != spec.OP_TYPE or len(n.input) < 3:
            nodes.append(n)
            continue
        tag = f"ortflash_shape_proxy_{i}"
        rq, rv = f"{tag}_q", f"{tag}_v"
        if opset >= 13:
            nodes.append(onnx.helper.make_node(
                "Constant", [], [f"{tag}_aq"], value=onnx.numpy_helper.from_array(np.array([3], np.int64))))
            nodes.append(onnx.helper.make_node(
                "Constant", [], [f"{tag}_av"], value=onnx.numpy_helper.from_array(np.array([1, 2], np.int64))))
            nodes.append(onnx.helper.make_node("ReduceSum", [n.input[0], f"{tag}_aq"], [rq], keepdims=1))
            nodes.append(onnx.helper.make_node("ReduceSum", [n.input[2], f"{tag}_av"], [rv], keepdims=1))
        else:
            nodes.append(onnx.helper.make_node("ReduceSum", [n.input[0]], [rq], axes=[3], keepdims=1))
            nodes.append(onnx.helper.make_node("ReduceSum", [n.input[2]], [rv], axes=[1, 2], keepdims=1))
        nodes.append(onnx.helper.make_node("Mul", [rq, rv], [n.output[0]]))
    del proxy.graph.node[:]
    proxy.graph.node.extend(nodes)
    try:
        inferred = onnx.shape_inference.infer_shapes(proxy, data_prop=True)
    except Exception:
        return model  # shapes only prove head counts and equal dims; without them fewer blocks lower
    known = {vi.name for vi in model.graph.value_info}
    known |= {vi.name for vi in model.graph.input} | {vi.name for vi in model.graph.output}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.value_info.extend(
        vi for vi in inferred.graph.value_info if vi.name not in known and not vi.name.startswith("ortflash_shape_proxy_"))
    return out


# A few static facts the shape inference leaves open (TorchScript exports reshape heads as
# [B, S, -1, D] from runtime shapes): sizes of shape tensors, element by element.


_DEPTH = 32  # hops the dim resolver may follow through the graph


def _shape_elems(value: ir.Value | None, depth: int = _DEPTH) -> list | None:
    """A 1-D int64 (shape) tensor as a list of ints, symbol names, or None for unknown elements;
    None when even its length is unknown."""
    if value is None or depth <= 0:
        return None
    arr = u.const_array(value)
    if arr is not None:
        return [int(x) for x in np.asarray(arr).reshape(-1)] if arr.ndim <= 1 else None
    node = u.producer(value)
    if node is None:
        return None
    op = node.op_type
    if op == "Concat":
        out = []
        for x in node.inputs:
            part = _shape_elems(x, depth - 1)
            if part is None:
                return None
            out += part
        return out
    if op == "Shape":
        rank = u.rank(node.inputs[0])
        if rank is None:
            return None
        dims = [_resolved_dim(node.inputs[0], i, depth - 1) for i in range(rank)]
        start, end = u.attr_int(node, "start", 0), u.attr_int(node, "end", None)
        return dims[start:end]
    if op in ("Cast", "Identity"):
        return _shape_elems(node.inputs[0], depth - 1)
    if op == "Unsqueeze" and _axes(node) == [0]:
        return [_scalar_elem(node.inputs[0], depth - 1)]
    if op == "Gather" and u.attr_int(node, "axis", 0) == 0:
        idx = u.const_array(node.inputs[1])
        data = _shape_elems(node.inputs[0], depth - 1)
        if idx is None or data is None or idx.ndim != 1:
            return None
        try:
            return [data[int(i)] for i in idx]
        except IndexError:
            return None
    return None


_SCALAR_OPS = {"Mul": lambda a, b: a * b, "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b,
               "Div": lambda a, b: a // b if b and a % b == 0 else None}


def _scalar_elem(value: ir.Value | None, depth: int = _DEPTH):
    """A scalar int64 as an int or a symbol name (None when unknown)."""
    if value is None or depth <= 0:
        return None
    arr = u.const_array(value)
    if arr is not None:
        arr = np.asarray(arr)
        return int(arr.reshape(())) if arr.size == 1 and np.issubdtype(arr.dtype, np.integer) else None
    node = u.producer(value)
    if node is None:
        return None
    op = node.op_type
    if op in ("Cast", "Identity"):
        return _scalar_elem(node.inputs[0], depth - 1)
    if op == "Gather" and u.attr_int(node, "axis", 0) == 0:
        idx = u.const_array(node.inputs[1])
        data = _shape_elems(node.inputs[0], depth - 1)
        if idx is None or data is None or idx.ndim != 0:
            return None
        try:
            return data[int(idx)]
        except IndexError:
            return None
    if op in _SCALAR_OPS and len(node.inputs) == 2:
        a, b = (_scalar_elem(x, depth - 1) for x in node.inputs)
        if isinstance(a, int) and isinstance(b, int):
            return _SCALAR_OPS[op](a, b)
    return None


def _reshape_dims(node: ir.Node, depth: int = _DEPTH) -> list | None:
    """The output dims of a Reshape, -1 and 0 resolved where the input's dims allow it."""
    target = _shape_elems(node.inputs[1], depth - 1)
    x = node.inputs[0]
    rank = u.rank(x)
    if target is None:
        return None
    x_dims = None if rank is None else [_resolved_dim(x, i, depth - 1) for i in range(rank)]
    allowzero = u.attr_int(node, "allowzero", 0)
    dims = list(target)
    for i, d in enumerate(dims):
        if d == 0 and not allowzero:
            dims[i] = x_dims[i] if x_dims is not None and i < len(x_dims) else None
    if dims.count(-1) == 1 and x_dims is not None and None not in x_dims:
        others = [d for d in dims if d != -1]
        if None not in others:
            total_int = math.prod(d for d in x_dims if isinstance(d, int))
            other_int = math.prod(d for d in others if isinstance(d, int))
            total_sym = sorted(d for d in x_dims if isinstance(d, str))
            other_sym = sorted(d for d in others if isinstance(d, str))
            if total_sym == other_sym and other_int > 0 and total_int % other_int == 0:
                dims[dims.index(-1)] = total_int // other_int
    return [d if isinstance(d, (int, str)) and d != -1 else None for d in dims]


_ELEMENTWISE = ("Mul", "Div", "Add", "Sub", "Where", "Pow")


def _resolved_dim(value: ir.Value, axis: int, depth: int = _DEPTH):
    """value's size along axis: an int, a symbol name, or None. Beyond shape inference it
    follows Transposes, Reshapes with computed shapes and broadcasting elementwise ops back to
    a static size (used for head counts and head sizes, which MultiHeadAttention needs)."""
    d = _dim(value, axis)
    if isinstance(d, int) or depth <= 0:
        return d
    node = u.producer(value)
    if node is None:
        return d
    op = node.op_type
    found = None
    if op == "Transpose":
        perm = _perm(node)
        if perm is not None and axis < len(perm):
            found = _resolved_dim(node.inputs[0], perm[axis], depth - 1)
    elif op == "Reshape":
        dims = _reshape_dims(node, depth - 1)
        if dims is not None and axis < len(dims):
            found = dims[axis]
    elif op in ("Cast", "Identity", "Neg", "Sqrt", "Exp", "Tanh", "Erf", "Sigmoid", "Relu"):
        found = _resolved_dim(node.inputs[0], axis, depth - 1)
    elif op in _ELEMENTWISE:
        # Broadcasting: the output's size is an operand's size other than 1 (operands aligned right).
        out_rank = u.rank(value)
        ranks = [u.rank(x) for x in node.inputs]
        if out_rank is not None and None not in ranks:
            sizes = []
            for x, r in zip(node.inputs, ranks):
                a = axis - (out_rank - r)
                sizes.append(1 if a < 0 else _resolved_dim(x, a, depth - 1))
            static = {s for s in sizes if isinstance(s, int) and s != 1}
            if len(static) == 1:
                found = static.pop()
            elif sizes and all(s == 1 for s in sizes):
                found = 1
    if isinstance(found, int):
        return found
    return d if d is not None else found


def _drop_unused_contrib_import(model: onnx.ModelProto) -> None:
    def uses(graph) -> bool:
        for n in graph.node:
            if n.domain == spec.DOMAIN:
                return True
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH and uses(a.g):
                    return True
                if a.type == onnx.AttributeProto.GRAPHS and any(uses(g) for g in a.graphs):
                    return True
        return False

    used = uses(model.graph) or any(n.domain == spec.DOMAIN for f in model.functions for n in f.node)
    if not used:
        keep = [imp for imp in model.opset_import if imp.domain != spec.DOMAIN]
        del model.opset_import[:]
        model.opset_import.extend(keep)


def _dim(value: ir.Value, i: int):
    shape = u.value_shape(value)
    return shape[i] if shape is not None and len(shape) > i else None


def _static(d) -> int | None:
    return d if isinstance(d, int) else None


@dataclass
class _Block:
    node: ir.Node
    attrs: dict
    q: ir.Value
    k: ir.Value
    v: ir.Value
    bias: ir.Value | None  # None: absent (a constant all zeros)
    mask: ir.Value | None  # None: absent (a constant all true)
    dtype: ir.DataType

    @property
    def hq(self):
        return _static(_resolved_dim(self.q, 1))

    @property
    def hkv(self):
        return _static(_resolved_dim(self.k, 1))

    @property
    def causal(self) -> bool:
        return bool(self.attrs["is_causal"])

    @property
    def fill(self) -> float:
        return self.attrs["mask_fill"]

    @property
    def masked(self) -> bool:
        """Some keys can be masked out (mask_fill matters)."""
        return self.mask is not None or self.causal

    @classmethod
    def read(cls, node: ir.Node) -> "_Block":
        if len(node.inputs) != len(spec.INPUTS) or any(x is None for x in node.inputs):
            raise _Kept(f"{len(node.inputs)} inputs, the contract has {len(spec.INPUTS)} (Q, K, V, bias, mask)")
        raw = {name: a.value for name, a in node.attributes.items()}
        try:
            attrs = spec.validate(spec.resolve_exact_floats(raw))
        except spec.SpecError as exc:
            raise _Kept(f"attributes outside the FlashAttention contract: {exc}") from None
        q, k, v, bias, mask = node.inputs
        dtype = q.dtype
        if dtype is not None and dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
            raise _Kept(f"Q's element type is {dtype}, not float32 or float16")
        for label, x in (("Q", q), ("K", k), ("V", v)):
            r = u.rank(x)
            if r is not None and r != 4:
                raise _Kept(f"{label} has rank {r}, not 4")
        arr = u.const_array(bias)
        if arr is not None and arr.size <= 2**20 and not np.any(arr):
            bias = None
        elif u.rank(bias) is not None and u.rank(bias) > 4:
            raise _Kept(f"bias has rank {u.rank(bias)}, more than 4")
        arr = u.const_array(mask)
        if arr is not None and arr.size <= 2**20 and np.all(arr):
            mask = None
        elif mask.dtype is not None and mask.dtype != ir.DataType.BOOL:
            raise _Kept(f"mask's element type is {mask.dtype}, not bool")
        block = cls(node, attrs, q, k, v, bias, mask, dtype)
        if attrs["scale"] < 0:
            raise _Kept(f"scale {attrs['scale']:g} is negative: native attention ops take a positive scale")
        fill = attrs["mask_fill"]
        if block.masked and math.isfinite(fill) and fill > _ABSORBING_FILL:
            raise _Kept(
                f"mask_fill {fill:g} is finite: native ops add the fill to the score (s + fill) where "
                f"FlashAttention replaces the score by it, so rows with every key masked differ "
                f"(exact only for -inf or fills <= -2**127 such as float32-lowest)")
        return block


# ---------------------------------------------------------------------------------------------
# emitting


class _Emitter(fuse._Emitter):
    """fuse's emitter, before the FlashAttention node being lowered, with shared constants."""

    def __init__(self, graph: ir.Graph, anchor: ir.Node, prefix: str):
        super().__init__(graph, anchor, prefix, opset=0)  # opset only matters to fuse's reshapes
        self._shapes: dict[int, ir.Value] = {}
        self._consts: dict[tuple, ir.Value] = {}
        self.lengths: dict[str, tuple[ir.Value, int]] = {}  # "q"/"k" -> (tensor, its sequence axis)

    def op(self, op_type: str, inputs, domain: str = "", **attrs) -> ir.Value:
        return self.node(op_type, inputs, domain, **attrs)

    def const(self, array) -> ir.Value:
        array = np.asarray(array)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._consts:
            self._consts[key] = super().const(array)
        return self._consts[key]

    def i64(self, values) -> ir.Value:
        return self.const(np.asarray(values, np.int64))

    def f32(self, value: float) -> ir.Value:
        return self.const(np.array(value, np.float32))

    def shape(self, x: ir.Value) -> ir.Value:
        key = id(x)
        if key not in self._shapes:
            self._shapes[key] = self.op("Shape", [x])
        return self._shapes[key]

    def dim(self, x: ir.Value, axis: int, scalar: bool = False) -> ir.Value:
        """x's size along axis: int64, 1-D of one element (or a scalar)."""
        index = self.i64(axis) if scalar else self.i64([axis])
        return self.op("Gather", [self.shape(x), index], axis=0)

    def seq_len(self, which: str, scalar: bool = False) -> ir.Value:
        """Sq ("q") or Sk ("k"), read from a tensor the lowered graph keeps."""
        x, axis = self.lengths[which]
        return self.dim(x, axis, scalar)

    def cast(self, x: ir.Value, to: ir.DataType) -> ir.Value:
        return x if x.dtype == to else self.op("Cast", [x], to=to)


def _axes(node: ir.Node) -> list[int] | None:
    return u.unsqueeze_axes(node)  # Squeeze and Unsqueeze keep axes alike (attribute or input 1)


def _perm(node: ir.Node | None) -> list[int] | None:
    return None if node is None else u.attr_ints(node, "perm")


def _bsd_source(x: ir.Value, heads: int | None) -> ir.Value | None:
    """x [B, H, S, D] as a 3D [B, S, H·D] tensor the graph already has, without a Transpose."""
    t = u.producer(x, "Transpose")
    if t is not None and _perm(t) == _SWAP_SH:
        return t.inputs[0]  # [B, S, H, D]: reshaped by the caller
    s = u.producer(x, "Unsqueeze")
    if s is not None and heads == 1 and _axes(s) == [1]:
        return s.inputs[0]  # [B·H, S, D]: already 3D with one head
    return None


def _to_bsd(e: _Emitter, x: ir.Value, heads: int | None, bypass: bool = True) -> ir.Value:
    """[B, H, S, D] -> [B, S, H·D]."""
    src = _bsd_source(x, heads) if bypass else None
    if src is not None and u.producer(x, "Unsqueeze") is not None:
        return src
    bshd = src if src is not None else e.op("Transpose", [x], perm=_SWAP_SH)
    return e.op("Reshape", [bshd, e.i64([0, 0, _width(x, heads)])])


def _width(x: ir.Value, heads: int | None) -> int:
    """H·D for a reshape to [B, S, H·D]: static where D is, so that a wrong head count fails
    loudly at run time instead of splitting heads differently; -1 otherwise."""
    d = _static(_resolved_dim(x, 3))
    return heads * d if heads is not None and d is not None else -1


def _repeat_bsd(e: _Emitter, x: ir.Value, heads: int, repeats: int, bypass: bool) -> ir.Value:
    """[B, Hkv, S, D] -> [B, S, Hkv·repeats·D], query head h reading kv head h // repeats."""
    t = u.producer(x, "Transpose") if bypass else None
    bshd = t.inputs[0] if t is not None and _perm(t) == _SWAP_SH else e.op("Transpose", [x], perm=_SWAP_SH)
    wide = e.op("Expand", [e.op("Unsqueeze", [bshd, e.i64([3])]), e.i64([1, 1, 1, repeats, 1])])
    return e.op("Reshape", [wide, e.i64([0, 0, _width(x, heads * repeats)])])


def _replace_bsd_output(e: _Emitter, out3: ir.Value, heads: int, old: ir.Value, bypass: bool) -> None:
    """Make out3 [B, S, H·Dv] stand for old [B, H, S, Dv], taking the place of the Transpose or
    Squeeze that reads old when it is old's only reader."""
    uses = list(old.uses())
    reader = uses[0].node if bypass and len(uses) == 1 and not old.is_graph_output() else None
    if reader is not None and reader.domain in ("", "ai.onnx"):
        new = None
        if reader.op_type == "Transpose" and _perm(reader) == _SWAP_SH:
            new = e.op("Reshape", [out3, e.i64([0, 0, heads, -1])])
        elif reader.op_type == "Squeeze" and heads == 1 and _axes(reader) == [1]:
            new = out3
        if new is not None:
            replace_output(e.graph, reader.outputs[0], new)
            e.graph.remove(reader, safe=True)
            return
    bshd = e.op("Reshape", [out3, e.i64([0, 0, heads, -1])])
    replace_output(e.graph, old, e.op("Transpose", [bshd], perm=_SWAP_SH))


def _causal_keep(e: _Emitter, b: _Block) -> ir.Value:
    """bool [Sq, Sk]: key j visible from query i iff j <= i (top-left aligned)."""
    zero, one = e.i64(0), e.i64(1)
    rows = e.op("Range", [zero, e.seq_len("q", scalar=True), one])
    cols = e.op("Range", [zero, e.seq_len("k", scalar=True), one])
    return e.op("LessOrEqual", [e.op("Unsqueeze", [cols, e.i64([0])]), e.op("Unsqueeze", [rows, e.i64([1])])])


def _additive_bias(e: _Emitter, b: _Block, fill: float, fold_causal: bool, avoid_lowest: bool) -> ir.Value | None:
    """float32 [B|1, H|1, Sq, Sk] to add to scale·QKᵀ: bias where kept, fill where masked out.

    avoid_lowest: no element may be float32-lowest (ONNX Runtime's Attention takes a row whose
    maximum is lowest for fully masked); lowest becomes the next float up, the same for softmax."""
    keep = b.mask
    if fold_causal and b.causal:
        c = _causal_keep(e, b)
        keep = c if keep is None else e.op("And", [keep, c])
    bias = None if b.bias is None else e.cast(b.bias, ir.DataType.FLOAT)
    if avoid_lowest and bias is not None:
        lowest = e.f32(_F32_LOWEST)
        bias = e.op("Where", [e.op("Equal", [bias, lowest]), e.f32(_F32_ABOVE_LOWEST), bias])
    if avoid_lowest and fill == _F32_LOWEST:
        fill = _F32_ABOVE_LOWEST
    if keep is not None:
        bias = e.op("Where", [keep, bias if bias is not None else e.f32(0.0), e.f32(fill)])
    if bias is None:
        return None
    sizes = e.op("Concat", [e.i64([1, 1]), e.seq_len("q"), e.seq_len("k")], axis=0)
    return e.op("Expand", [bias, sizes])


def _fill_text(b: _Block) -> str:
    return "-inf" if b.fill == -math.inf else f"{b.fill:g}"


def _lower_contrib(e: _Emitter, b: _Block, opset: int) -> tuple[str, str]:
    if opset < MIN_CONTRIB_OPSET:
        raise _Kept(f"the model's opset {opset} is below {MIN_CONTRIB_OPSET}, which the reshaping ops are written for")
    hq, hkv = b.hq, b.hkv
    if hq is None or hkv is None:
        raise _Kept("the head counts (dim 1 of Q and K) are not static; MultiHeadAttention needs num_heads")
    if hkv < 1 or hq % hkv:
        raise _Kept(f"{hq} query heads are not a multiple of {hkv} key/value heads")
    sq, sk = _resolved_dim(b.q, 2), _resolved_dim(b.k, 2)
    d, dk, dv = _resolved_dim(b.q, 3), _resolved_dim(b.k, 3), _resolved_dim(b.v, 3)
    # GroupQueryAttention without past: Sq == Sk, one head size (a multiple of 8 on the CPU EP), and
    # causal blocks only: its causal=0 attribute is recent (ONNX Runtime 1.31 has it, older ones
    # reject it), and MultiHeadAttention covers non-causal blocks everywhere.
    gqa_fits = (b.causal and b.fill == -math.inf and u.same_dim(sq, sk) and u.same_dim(dk, dv)
                and u.same_dim(d, dv) and isinstance(d, int) and d % 8 == 0)
    softcap = b.attrs["softcap"]
    if softcap > 0 and not gqa_fits:
        raise _Kept(
            "softcap: MultiHeadAttention has none, and GroupQueryAttention is used only for causal blocks "
            "with mask_fill -inf, Sq == Sk and one static head size that is a multiple of 8, not proved here")
    use_gqa = gqa_fits and (hkv < hq or softcap > 0)

    if b.dtype is None and opset < 15:
        raise _Kept("Q's element type is not known and the model's opset has no CastLike (15) to restore it")
    f16 = b.dtype != ir.DataType.FLOAT  # float16, or not known: computed in float32 between casts
    q, k, v = (e.cast(x, ir.DataType.FLOAT) for x in (b.q, b.k, b.v))
    bypass = not f16  # with casts around, the surrounding Transposes are not the inputs
    parts = [f"{hq} query / {hkv} key-value heads"]
    if use_gqa:
        q3, k3, v3 = (_to_bsd(e, x, h, bypass) for x, h in ((q, hq), (k, hkv), (v, hkv)))
        e.lengths = {"q": (q3, 1), "k": (k3, 1)}
        sk_scalar = e.seq_len("k", scalar=True)
        seqlens = e.op("Cast", [e.op("Sub", [sk_scalar, e.i64(1)])], to=ir.DataType.INT32)
        seqlens = e.op("Expand", [seqlens, e.dim(q3, 0)])
        total = e.op("Cast", [sk_scalar], to=ir.DataType.INT32)
        bias = _additive_bias(e, b, b.fill, fold_causal=False, avoid_lowest=False)
        attrs = {"num_heads": hq, "kv_num_heads": hkv, "scale": b.attrs["scale"]}
        if softcap > 0:
            attrs["softcap"] = softcap
            parts.append(f"softcap {softcap:g}")
        out = e.op("GroupQueryAttention", [q3, k3, v3, None, None, seqlens, total, None, None, None, bias],
                   domain=CONTRIB_DOMAIN, **attrs)
        op = OP_GQA
        parts.append("Sq == Sk proved")
    else:
        q3 = _to_bsd(e, q, hq, bypass)
        if hkv != hq:
            r = hq // hkv
            k_in, v_in = _repeat_bsd(e, k, hkv, r, bypass), _repeat_bsd(e, v, hkv, r, bypass)
            parts.append(f"key/value heads repeated {r}x")
        elif bypass and _bsd_source(k, hkv) is not None and _bsd_source(v, hkv) is not None:
            k_in, v_in = _to_bsd(e, k, hkv), _to_bsd(e, v, hkv)
        elif u.same_dim(dk, dv) and u.same_dim(sk, _resolved_dim(b.v, 2)):
            k_in, v_in = k, v  # 4D BNSH, as MultiHeadAttention takes when key and value shapes agree
        else:
            k_in, v_in = _to_bsd(e, k, hkv, bypass), _to_bsd(e, v, hkv, bypass)
        e.lengths = {"q": (q3, 1), "k": (k_in, 2 if k_in is k else 1)}
        bias = _additive_bias(e, b, b.fill, fold_causal=True, avoid_lowest=False)
        inputs = [q3, k_in, v_in] + ([None, None, bias] if bias is not None else [])
        out = e.op("MultiHeadAttention", inputs, domain=CONTRIB_DOMAIN, num_heads=hq, scale=b.attrs["scale"])
        op = OP_MHA
    parts += _mask_parts(b, causal_folded=not use_gqa)
    if b.attrs["masked_rows"] == "zero":
        # Both ops give NaN for a row with every key masked; FlashAttention's guard gives zeros.
        out = e.op("Where", [e.op("IsNaN", [out]), e.f32(0.0), out])
        parts.append("NaN guard -> Where(IsNaN(out), 0, out) (exact for finite V)")
    if f16:
        out, note = _cast_back(e, out, b)
        parts.append(note)
    _replace_bsd_output(e, out, hq, b.node.outputs[0], bypass)
    return op, "; ".join(parts)


def _cast_back(e: _Emitter, out: ir.Value, b: _Block) -> tuple[ir.Value, str]:
    """out (float32) back to Q's element type: Cast where it is known, CastLike(Q) where not."""
    if b.dtype is None:
        return e.op("CastLike", [out, b.q]), "computed in float32 between Cast and CastLike (Q's type not inferred)"
    return e.cast(out, b.dtype), f"computed in float32 between casts (Q is {b.dtype.name.lower()})"


def _mask_parts(b: _Block, causal_folded: bool) -> list[str]:
    parts = []
    if b.bias is not None:
        parts.append("bias")
    if b.mask is not None:
        parts.append(f"bool mask as Where(mask, ., {_fill_text(b)})")
    if b.causal:
        parts.append(f"causal in the bias (fill {_fill_text(b)})" if causal_folded else "causal")
    return parts


def _lower_onnx(e: _Emitter, b: _Block) -> tuple[str, str]:
    graph = e.graph
    f16 = b.dtype != ir.DataType.FLOAT  # float16, or not known: computed in float32 between casts
    three_d = None if f16 else _three_d_sources(b)
    if three_d is not None:
        q, k, v, squeeze = three_d  # [B·H, S, D]: one head each
        e.lengths = {"q": (q, 1), "k": (k, 1)}
    else:
        q, k, v = (e.cast(x, ir.DataType.FLOAT) for x in (b.q, b.k, b.v))
        e.lengths = {"q": (q, 2), "k": (k, 2)}
    native_causal = b.causal and b.fill == -math.inf and b.bias is None and b.mask is None
    bias = _additive_bias(e, b, b.fill, fold_causal=not native_causal, avoid_lowest=True)
    attrs = {"scale": b.attrs["scale"]}
    if native_causal:
        attrs["is_causal"] = 1
    if b.attrs["softcap"] > 0:
        attrs["softcap"] = b.attrs["softcap"]
    if three_d is not None:
        attrs.update(q_num_heads=1, kv_num_heads=1)
    out = e.op("Attention", [q, k, v] + ([bias] if bias is not None else []), **attrs)

    parts = [f"{b.hq or '?'} query / {b.hkv or '?'} key-value heads"]
    if three_d is not None:
        parts.append("3D [B·H, S, D] taken as one head, Unsqueeze/Squeeze dropped")
    if b.attrs["softcap"] > 0:
        parts.append(f"softcap {b.attrs['softcap']:g}")
    parts += _mask_parts(b, causal_folded=not native_causal)
    if bias is not None:
        # Rows with every key masked: FlashAttention gives NaN (or zeros after its guard);
        # Attention gives zeros since the opset-23 errata, NaN before it. Written out, both hold.
        dead = e.op("Equal", [e.op("ReduceMax", [bias, e.i64([-1])], keepdims=1), e.f32(-math.inf)])
        if three_d is not None:
            dead = e.op("Squeeze", [dead, e.i64([1])])
        rows = b.attrs["masked_rows"]
        out = e.op("Where", [dead, e.f32(math.nan if rows == "nan" else 0.0), out])
        parts.append(f"fully masked rows -> {'NaN' if rows == 'nan' else 'zeros'} by Where")
    if f16:
        out, note = _cast_back(e, out, b)
        parts.append(note)
    if three_d is not None:
        replace_output(graph, squeeze.outputs[0], out)
        graph.remove(squeeze, safe=True)
    else:
        replace_output(graph, b.node.outputs[0], out)
    return OP_ATTENTION, "; ".join(parts)


def _three_d_sources(b: _Block):
    """(q3, k3, v3, squeeze) when the block is a 3D [B·H, S, D] one wrapped in Unsqueeze/Squeeze(1)."""
    if b.hq != 1 or b.hkv != 1:
        return None
    srcs = []
    for x in (b.q, b.k, b.v):
        s = u.producer(x, "Unsqueeze")
        if s is None or _axes(s) != [1]:
            return None
        srcs.append(s.inputs[0])
    out = b.node.outputs[0]
    uses = list(out.uses())
    if len(uses) != 1 or out.is_graph_output():
        return None
    reader = uses[0].node
    if reader.op_type != "Squeeze" or reader.domain not in ("", "ai.onnx") or _axes(reader) != [1]:
        return None
    return srcs[0], srcs[1], srcs[2], reader
