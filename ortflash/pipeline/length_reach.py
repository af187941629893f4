"""Whether a run of the original model can reach a key length: an If on the length that switches
past the longest run the model takes never takes its fused side, and costs its few microseconds a
block at every length the model does run (1-5 us an If on the CPU EP; 0.93-0.97x on the zoo's
0.1-0.7 ms models, benchmarks/results/dispatch_cost_forced_avx512_zen4.md).

Exports stop at a length of their own: a position table of N rows (GPT-2's ``wpe``, OPT's and
BART's learned positions, RoBERTa's), or a buffer of N positions sliced to the run's length and
then broadcast with it (BERT's ``token_type_ids`` and ``position_ids``). A BERT-base export stops
past 512 keys, where the AVX2 table's FlashAttention at head dim 64 starts at 1024.

The reading is a run, not a proof: the original runs on ``make_feeds``' inputs (token ids inside
the embedding table, a padded mask) at the switch length, batch 1; where it runs at 16 keys and
fails there, the model is taken to stop before it. A wrong reading here costs speed only, never
correctness: the block keeps its original ops, which compute what the model computed. A run that
would hold a tensor over the load check's budget (first_run.RUN_BUDGET_BYTES), or whose size
shape inference cannot tell, is not made, and the If is written as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from ..checks.feeds import decoder_cases, make_feeds
from ..checks.sessions import open_session, run_session
from ..errors import OrtflashError
from ..session import InferenceSession
from .first_run import _CHECK_CONFIG, RUN_BUDGET_BYTES, largest_tensor

# The length the original must run at for a failure at the switch length to say the model stops
# there (a model that fails at this one as well fails for another reason).
_SHORT = 16


@dataclass
class LengthReach:
    """The original model's runs at the key lengths asked about, each made once per optimize call."""

    original: onnx.ModelProto
    weights_dir: str | None = None
    _stops: dict[int, str | None] = field(default_factory=dict)
    _session: InferenceSession | None = None

    def stops_before(self, key_len: int) -> str | None:
        """Why no run of the original reaches ``key_len`` keys (ONNX Runtime's error at that length),
        or None where one does, or where it cannot be told without a run over the budget."""
        if key_len not in self._stops:
            self._stops[key_len] = self._read(key_len)
        return self._stops[key_len]

    def _read(self, key_len: int) -> str | None:
        if key_len <= _SHORT:
            return None
        if self._error_at([(_SHORT, None)]) is not None:
            return None
        stop = self._error_at(self._shapes(key_len))
        if stop is None:
            return None
        # A model of two lengths (a decoder's tokens and its encoder's frames) may stop on one of
        # them alone: any one length that runs this long keeps every block's If, since which length
        # a block's keys follow is not read here.
        for dim in _lengths(self.original):
            if self._error_at([(_SHORT, {dim: key_len})]) is None:
                return None
        return stop

    def _shapes(self, key_len: int) -> list[tuple[int, dict[str, int] | None]]:
        """Inputs that reach ``key_len`` keys: every length at it, and for a decoder with a cache a
        prefill of ``key_len`` tokens or a one-token step after ``key_len - 1`` cached ones."""
        prefill = decoder_cases(self.original, seq_len=key_len, batch=1)
        step = decoder_cases(self.original, seq_len=key_len - 1, batch=1) if prefill else []
        if prefill and step:
            return [(key_len, prefill[0][1]), (key_len, step[1][1])]
        return [(key_len, None)]

    def _error_at(self, shapes: list[tuple[int, dict[str, int] | None]]) -> str | None:
        """ONNX Runtime's error running the original on inputs of each of ``shapes`` (seq_len, dims
        for make_feeds), the last one's where none runs; None where one does, or where one is not run
        (no inputs for the model, or a tensor over the budget)."""
        error = None
        for seq_len, dims in shapes:
            try:
                feeds = make_feeds(self.original, seq_len=seq_len, batch=1, dims=dims)
            except OrtflashError:
                return None  # no inputs for this model: nothing to read
            if (seq_len > _SHORT or dims) and not _within_budget(self.original, feeds):
                return None
            try:
                run_session(self._opened(), feeds, what="the original model")
                return None
            except OrtflashError as exc:
                error = str(exc)
        return error

    def _opened(self) -> InferenceSession:
        if self._session is None:
            self._session = open_session(
                self.original, what="the original model", weights_dir=self.weights_dir, config=_CHECK_CONFIG
            )
        return self._session


def _lengths(model: onnx.ModelProto) -> list[str]:
    """The named dims of the graph's inputs other than the batch's, as make_feeds names them."""
    initializers = {i.name for i in model.graph.initializer}
    names: list[str] = []
    for vi in model.graph.input:
        if vi.name in initializers or not vi.type.HasField("tensor_type"):
            continue
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param and "batch" not in d.dim_param.lower() and d.dim_param not in names:
                names.append(d.dim_param)
    return names


def _within_budget(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> bool:
    largest = largest_tensor(model, feeds)
    return largest is not None and largest[0] <= RUN_BUDGET_BYTES
