#!/usr/bin/env python
"""Build the ortflash model zoo.

Small RANDOM-WEIGHT transformers are built from `transformers` config objects
(never downloaded), exported to ONNX with both torch exporters (TorchScript,
``dynamo=False``, and torch.export, ``dynamo=True``) and both attention
implementations (``eager`` and ``sdpa``), checked against PyTorch in ONNX
Runtime, and listed in ``models/manifest.json``.

    python models/generate.py                 # everything
    python models/generate.py --only bert gpt2 --exporter dynamo

A combination that does not export (or that exports but is wrong in ONNX
Runtime) is written to the manifest's ``skipped`` list with a one-line reason.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import re
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from describe import attention_softmaxes  # noqa: E402

SEED = 0
TS_OPSET = 17
DYNAMO_OPSET = None  # None: the dynamo exporter's default (20 with torch 2.13)
MAX_IR_VERSION = 10  # ONNX Runtime 1.31 loads IR <= 13; 10 is the safe choice
TOL = 1e-4
VOCAB = 100
EXPORT_SEQ = 16  # example sequence length used while exporting
EXPORT_BATCH = 2

ELEM = {1: "float32", 7: "int64", 9: "bool", 10: "float16", 6: "int32"}


# --------------------------------------------------------------------------
# architectures
# --------------------------------------------------------------------------

@dataclass
class InputSpec:
    name: str
    role: str  # input_ids | attention_mask | pixel_values | decoder_input_ids | input_features
    dtype: str  # "int64" | "float32"
    dims: list  # ints (fixed) or names of symbolic dims ("batch", "seq", "dec_seq")
    extra: dict = field(default_factory=dict)


@dataclass
class Arch:
    name: str
    build: callable  # attn_impl -> torch.nn.Module (the wrapper)
    inputs: list  # [InputSpec]
    outputs: list  # output names
    num_heads: int
    kv_heads: int
    head_dim: int
    causal: bool  # whether (decoder) self-attention is causal
    notes: str = ""
    meta: dict = field(default_factory=dict)
    block_kinds: dict = field(default_factory=dict)  # expected blocks: self / causal_self / cross


INIT_STD = 0.15  # larger than the usual 0.02, so that the attention scores are O(1), not a near-uniform softmax


def _set_impl(cfg, attn_impl):
    cfg._attn_implementation = attn_impl
    return cfg


def _perturb_constant_params(model):
    """Biases start at 0 and norm weights at 1: give them random values so that every
    parameter takes part in the numeric checks (and the exporters do not dedupe them)."""
    with torch.no_grad():
        for _, p in model.named_parameters():
            flat = p.reshape(-1)
            if flat.numel() > 1 and bool(torch.all(flat == flat[0])):
                p.add_(torch.randn_like(p) * 0.1)
    return model


class EncoderWrapper(torch.nn.Module):
    """input_ids + attention_mask -> last_hidden_state."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, input_ids, attention_mask):
        return self.m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state


class NoCacheEncoderWrapper(EncoderWrapper):
    def forward(self, input_ids, attention_mask):
        return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class PixelWrapper(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, pixel_values):
        return self.m(pixel_values=pixel_values).last_hidden_state


class Seq2SeqWrapper(torch.nn.Module):
    """input_ids + attention_mask + decoder_input_ids -> (decoder, encoder) hidden states."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, input_ids, attention_mask, decoder_input_ids):
        out = self.m(input_ids=input_ids, attention_mask=attention_mask,
                     decoder_input_ids=decoder_input_ids, use_cache=False)
        return out.last_hidden_state, out.encoder_last_hidden_state


class WhisperWrapper(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, input_features, decoder_input_ids):
        out = self.m(input_features=input_features, decoder_input_ids=decoder_input_ids, use_cache=False)
        return out.last_hidden_state, out.encoder_last_hidden_state


class CacheDecoderWrapper(torch.nn.Module):
    """input_ids [batch, seq] + attention_mask [batch, past + seq] + past_key_values.{i}.key/value
    [batch, kv_heads, past, head_dim] -> last_hidden_state and present.{i}.key/value
    [batch, kv_heads, past + seq, head_dim]: one prefill (past 0) or decode step against a KV cache."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    # two layers, spelled out: torch.export matches dynamic_shapes to the signature, not to *args
    def forward(self, input_ids, attention_mask, past_key_0, past_value_0, past_key_1, past_value_1):
        from transformers import DynamicCache
        cache = DynamicCache(ddp_cache_data=[(past_key_0, past_value_0), (past_key_1, past_value_1)])
        out = self.m(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
        presents = []
        for layer in out.past_key_values.layers:
            presents += [layer.keys, layer.values]
        return (out.last_hidden_state, *presents)


class NoPastDecoderWrapper(torch.nn.Module):
    """input_ids + attention_mask [batch, seq] -> last_hidden_state and present.{i}.key/value: the
    first step of generation, before there is a cache."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, input_ids, attention_mask):
        from transformers import DynamicCache
        out = self.m(input_ids=input_ids, attention_mask=attention_mask, past_key_values=DynamicCache(),
                     use_cache=True)
        presents = []
        for layer in out.past_key_values.layers:
            presents += [layer.keys, layer.values]
        return (out.last_hidden_state, *presents)


class MergedDecoderWrapper(torch.nn.Module):
    """The merged form (one file for both steps, as optimum writes it): use_cache_branch [1] picks
    the decoder with a cache or the one without, which ignores the past inputs."""

    def __init__(self, model):
        super().__init__()
        self.m = model
        self.with_past = CacheDecoderWrapper(model)
        self.no_past = NoPastDecoderWrapper(model)

    def forward(self, input_ids, attention_mask, past_key_0, past_value_0, past_key_1, past_value_1,
                use_cache_branch):
        if bool(use_cache_branch[0]):
            return self.with_past(input_ids, attention_mask, past_key_0, past_value_0, past_key_1, past_value_1)
        return self.no_past(input_ids, attention_mask)


def _tok(name, role, seq="seq"):
    return InputSpec(name, role, "int64", ["batch", seq], {"low": 3, "high": VOCAB})


def _mask(name="attention_mask", seq="seq"):
    return InputSpec(name, "attention_mask", "int64", ["batch", seq],
                     {"values": "1 = attend, 0 = padding (right-padded in the checks)"})


def build_bert(attn_impl):
    from transformers import BertConfig, BertModel
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=16, max_position_embeddings=128, type_vocab_size=1,
                     initializer_range=INIT_STD)
    _set_impl(cfg, attn_impl)
    return EncoderWrapper(_perturb_constant_params(BertModel(cfg, add_pooling_layer=False)))


def build_gpt2(attn_impl):
    from transformers import GPT2Config, GPT2Model
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=64, n_layer=2, n_head=2, n_inner=16,
                     use_cache=False, bos_token_id=0, eos_token_id=0, initializer_range=INIT_STD)
    _set_impl(cfg, attn_impl)
    return EncoderWrapper(_perturb_constant_params(GPT2Model(cfg)))


VIT_IMAGE, VIT_PATCH = 32, 8


def build_vit(attn_impl):
    from transformers import ViTConfig, ViTModel
    cfg = ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16,
                    image_size=VIT_IMAGE, patch_size=VIT_PATCH, num_channels=3,
                    initializer_range=INIT_STD)
    _set_impl(cfg, attn_impl)
    return PixelWrapper(_perturb_constant_params(ViTModel(cfg, add_pooling_layer=False)))


def build_t5(attn_impl):
    from transformers import T5Config, T5Model
    # 2 encoder layers (layer 1 reuses the relative position bias of layer 0), 1 decoder layer (size budget)
    cfg = T5Config(vocab_size=VOCAB, d_model=64, d_kv=32, d_ff=16, num_layers=2, num_decoder_layers=1,
                   num_heads=2, relative_attention_num_buckets=32, relative_attention_max_distance=128,
                   pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, use_cache=False)
    _set_impl(cfg, attn_impl)
    return Seq2SeqWrapper(_perturb_constant_params(T5Model(cfg)))


def build_bart(attn_impl):
    from transformers import BartConfig, BartModel
    # one encoder and one decoder layer keep the zoo under 10 MB (T5 shows multi-layer sharing)
    cfg = BartConfig(vocab_size=VOCAB, d_model=64, encoder_layers=1, decoder_layers=1,
                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=16,
                     decoder_ffn_dim=16, max_position_embeddings=128, pad_token_id=1, bos_token_id=0,
                     eos_token_id=2, decoder_start_token_id=2, use_cache=False, init_std=INIT_STD)
    _set_impl(cfg, attn_impl)
    return Seq2SeqWrapper(_perturb_constant_params(BartModel(cfg)))


WHISPER_MELS, WHISPER_SRC_POS = 16, 32  # input_features: [batch, 16, 2 * 32]


def build_whisper(attn_impl):
    from transformers import WhisperConfig, WhisperModel
    cfg = WhisperConfig(vocab_size=VOCAB, num_mel_bins=WHISPER_MELS, d_model=64, encoder_layers=1,
                        decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                        encoder_ffn_dim=16, decoder_ffn_dim=16, max_source_positions=WHISPER_SRC_POS,
                        max_target_positions=64, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                        decoder_start_token_id=0, suppress_tokens=None, begin_suppress_tokens=None,
                        use_cache=False, init_std=INIT_STD)
    _set_impl(cfg, attn_impl)
    return WhisperWrapper(_perturb_constant_params(WhisperModel(cfg)))


def build_llama(attn_impl):
    from transformers import LlamaConfig, LlamaModel
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=16, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                      max_position_embeddings=128, use_cache=False, bos_token_id=0, eos_token_id=0,
                      pad_token_id=0, initializer_range=INIT_STD)
    _set_impl(cfg, attn_impl)
    return EncoderWrapper(_perturb_constant_params(LlamaModel(cfg)))


def build_gpt_neo(attn_impl):
    from transformers import GPTNeoConfig, GPTNeoModel
    # one global and one local layer: the causal Where (fill float32-lowest) comes before the padding bias
    cfg = GPTNeoConfig(vocab_size=VOCAB, max_position_embeddings=128, hidden_size=64, num_layers=2,
                       attention_types=[[["global", "local"], 1]], num_heads=2, intermediate_size=16,
                       window_size=8, use_cache=False, bos_token_id=0, eos_token_id=0,
                       initializer_range=INIT_STD)
    _set_impl(cfg, attn_impl)
    return EncoderWrapper(_perturb_constant_params(GPTNeoModel(cfg)))


CACHE_LAYERS = 2


def build_gpt2_cache(attn_impl):
    from transformers import GPT2Config, GPT2Model
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=64, n_layer=CACHE_LAYERS, n_head=2, n_inner=16,
                     use_cache=True, bos_token_id=0, eos_token_id=0, initializer_range=INIT_STD)
    _set_impl(cfg, attn_impl)
    return CacheDecoderWrapper(_perturb_constant_params(GPT2Model(cfg)))


def build_llama_cache(attn_impl):
    from transformers import LlamaConfig, LlamaModel
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=16, num_hidden_layers=CACHE_LAYERS,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      max_position_embeddings=128, use_cache=True, bos_token_id=0, eos_token_id=0,
                      pad_token_id=0, initializer_range=INIT_STD)
    _set_impl(cfg, attn_impl)
    return CacheDecoderWrapper(_perturb_constant_params(LlamaModel(cfg)))


def build_qwen2_cache(attn_impl):
    from transformers import Qwen2Config, Qwen2Model
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=16, num_hidden_layers=CACHE_LAYERS,
                      num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=128,
                      use_cache=True, use_sliding_window=False, bos_token_id=0, eos_token_id=0,
                      pad_token_id=0, initializer_range=INIT_STD)
    _set_impl(cfg, attn_impl)
    return CacheDecoderWrapper(_perturb_constant_params(Qwen2Model(cfg)))


def build_mistral_cache(attn_impl):
    from transformers import MistralConfig, MistralModel
    # sliding_window None: the cache is a plain DynamicCache (a window wider than 128 positions is the same)
    cfg = MistralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=16, num_hidden_layers=CACHE_LAYERS,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                        sliding_window=None, use_cache=True, bos_token_id=0, eos_token_id=0, pad_token_id=0,
                        initializer_range=INIT_STD)
    _set_impl(cfg, attn_impl)
    return CacheDecoderWrapper(_perturb_constant_params(MistralModel(cfg)))


def build_llama_merged(attn_impl):
    return MergedDecoderWrapper(build_llama_cache(attn_impl).m)


def _cache_io(kv_heads, head_dim, layers=CACHE_LAYERS):
    """Inputs and outputs of a CacheDecoderWrapper export, and the outputs' symbolic dims."""
    inputs = [_tok("input_ids", "input_ids"), _mask(seq="total")]
    outputs = ["last_hidden_state"]
    output_dims = {"last_hidden_state": {0: "batch", 1: "seq"}}
    for i in range(layers):
        for kv in ("key", "value"):
            inputs.append(InputSpec(f"past_key_values.{i}.{kv}", f"past_{kv}", "float32",
                                    ["batch", kv_heads, "past", head_dim], {"distribution": "standard normal"}))
            outputs.append(f"present.{i}.{kv}")
            output_dims[f"present.{i}.{kv}"] = {0: "batch", 2: "total"}
    return inputs, outputs, output_dims


def _cache_arch(name, build, heads, kv_heads, head_dim, notes):
    inputs, outputs, output_dims = _cache_io(kv_heads, head_dim)
    return Arch(name, build, inputs, outputs, heads, kv_heads, head_dim, True,
                notes + "; KV cache: past_key_values.{i}.key/value in, present.{i}.key/value out "
                "(Concat(past, new) on the sequence axis), attention_mask over past + new tokens",
                {"cache": True, "output_dims": output_dims}, {"causal_self": CACHE_LAYERS})


ARCHS = [
    Arch("bert", build_bert, [_tok("input_ids", "input_ids"), _mask()], ["last_hidden_state"],
         2, 2, 32, False, "encoder, padding mask", block_kinds={"self": 2}),
    Arch("gpt2", build_gpt2, [_tok("input_ids", "input_ids"), _mask()], ["last_hidden_state"],
         2, 2, 32, True, "decoder, causal + padding mask, use_cache=False", block_kinds={"causal_self": 2}),
    Arch("vit", build_vit,
         [InputSpec("pixel_values", "pixel_values", "float32", ["batch", 3, VIT_IMAGE, VIT_IMAGE],
                    {"distribution": "standard normal"})],
         ["last_hidden_state"], 2, 2, 32, False,
         f"encoder, no mask; sequence fixed at {(VIT_IMAGE // VIT_PATCH) ** 2 + 1} tokens (image {VIT_IMAGE}x{VIT_IMAGE}, patch {VIT_PATCH})",
         {"fixed_seq": (VIT_IMAGE // VIT_PATCH) ** 2 + 1}, {"self": 2}),
    Arch("t5", build_t5,
         [_tok("input_ids", "input_ids"), _mask(), _tok("decoder_input_ids", "decoder_input_ids", "dec_seq")],
         ["last_hidden_state", "encoder_last_hidden_state"], 2, 2, 32, True,
         "encoder-decoder; relative position bias added to the scores; no 1/sqrt(d) scale; "
         "encoder self, decoder causal self, decoder cross attention; 2 encoder layers, 1 decoder layer",
         block_kinds={"self": 2, "causal_self": 1, "cross": 1}),
    Arch("bart", build_bart,
         [_tok("input_ids", "input_ids"), _mask(), _tok("decoder_input_ids", "decoder_input_ids", "dec_seq")],
         ["last_hidden_state", "encoder_last_hidden_state"], 2, 2, 32, True,
         "encoder-decoder; encoder self, decoder causal self, decoder cross attention; 1 encoder + 1 decoder layer",
         block_kinds={"self": 1, "causal_self": 1, "cross": 1}),
    Arch("whisper", build_whisper,
         [InputSpec("input_features", "input_features", "float32", ["batch", WHISPER_MELS, 2 * WHISPER_SRC_POS],
                    {"distribution": "standard normal", "num_mel_bins": WHISPER_MELS,
                     "frames": 2 * WHISPER_SRC_POS}),
          _tok("decoder_input_ids", "decoder_input_ids", "dec_seq")],
         ["last_hidden_state", "encoder_last_hidden_state"], 2, 2, 32, True,
         f"encoder-decoder on mel features; encoder sequence fixed at {WHISPER_SRC_POS} "
         "(Whisper requires exactly 2*max_source_positions frames); decoder sequence dynamic; 1 encoder + 1 decoder layer",
         block_kinds={"self": 1, "causal_self": 1, "cross": 1}),
    Arch("llama", build_llama, [_tok("input_ids", "input_ids"), _mask()], ["last_hidden_state"],
         4, 2, 32, True, "decoder, grouped-query attention (4 query heads, 2 KV heads), rotary embeddings",
         block_kinds={"causal_self": 2}),
    Arch("gpt_neo", build_gpt_neo, [_tok("input_ids", "input_ids"), _mask()], ["last_hidden_state"],
         2, 2, 32, True, "decoder, no 1/sqrt(d) scale; causal Where (fill float32-lowest) applied before the "
         "padding bias is added; layer 1 local attention (window 8)", block_kinds={"causal_self": 2}),
    _cache_arch("gpt2_cache", build_gpt2_cache, 2, 2, 32, "GPT-2 decoder"),
    _cache_arch("llama_cache", build_llama_cache, 4, 2, 16, "Llama decoder, 4 query / 2 KV heads"),
    _cache_arch("qwen2_cache", build_qwen2_cache, 4, 1, 16, "Qwen2 decoder, 4 query heads / 1 KV head"),
    _cache_arch("mistral_cache", build_mistral_cache, 4, 2, 16, "Mistral decoder, 4 query / 2 KV heads"),
]
_merged_inputs, _merged_outputs, _merged_dims = _cache_io(2, 16)
ARCHS += [
    Arch("llama_merged", build_llama_merged,
         _merged_inputs + [InputSpec("use_cache_branch", "use_cache_branch", "bool", [1],
                                     {"values": "true: the cached branch; false: no past (past length 0)"})],
         _merged_outputs, 4, 2, 16, True,
         "the llama_cache decoder in the merged form: If(use_cache_branch) over the TorchScript export with "
         "a cache and the one without (2 blocks in each branch); the branches read the main graph's inputs "
         "and weights from the outer scope",
         {"cache": True, "merged": True, "output_dims": _merged_dims, "exporters": ["torchscript"]},
         {"causal_self": 2 * CACHE_LAYERS}),
    Arch("bert_shapeless", build_bert, [_tok("input_ids", "input_ids"), _mask()], ["last_hidden_state"],
         2, 2, 32, False,
         "the BERT encoder exported at opset 12 with every value_info removed, as shipped models without "
         "shapes come (only the graph inputs and outputs keep theirs)",
         {"opset": 12, "strip_shapes": True, "exporters": ["torchscript"]}, {"self": 2}),
]
# architectures whose attention the sdpa implementation does not cover (transformers 5.24)
EAGER_ONLY = {"gpt_neo", "bert_shapeless", "llama_merged"}


# --------------------------------------------------------------------------
# feeds
# --------------------------------------------------------------------------

def make_feeds(arch: Arch, batch: int, seq: int, dec_seq: int, pad: int, rng, past: int = 0):
    """Inputs for one check. `pad` tokens of the last batch row are masked out (right padding);
    a cached decoder gets `past` cached tokens and a mask over past + seq."""
    dimval = {"batch": batch, "seq": seq, "dec_seq": dec_seq, "past": past, "total": past + seq}
    feeds = {}
    for spec in arch.inputs:
        shape = [dimval[d] if isinstance(d, str) else d for d in spec.dims]
        if spec.role == "use_cache_branch":
            a = np.array([past > 0])
        elif spec.role == "attention_mask":
            a = np.ones(shape, dtype=np.int64)
            if pad and batch > 1:
                a[-1, shape[1] - pad:] = 0
        elif spec.dtype == "int64":
            a = rng.integers(spec.extra["low"], spec.extra["high"], size=shape, dtype=np.int64)
        else:
            a = rng.standard_normal(shape).astype(np.float32)
        feeds[spec.name] = a
    return feeds


def export_example(arch: Arch):
    rng = np.random.default_rng(1234)
    past = EXPORT_SEQ // 2 + 1 if arch.meta.get("cache") else 0
    feeds = make_feeds(arch, EXPORT_BATCH, EXPORT_SEQ, EXPORT_SEQ // 2 + 1, 3, rng, past)
    return tuple(torch.from_numpy(feeds[s.name]) for s in arch.inputs)


def check_cases(arch: Arch):
    """(label, batch, seq, dec_seq, pad[, past]) cases: two sequence lengths, and batch 2 with padding;
    a cached decoder: prefill (past 0), a decode step (1 new token) and a padded batch with past."""
    if arch.meta.get("cache"):
        return [("prefill_b1_s7", 1, 7, 0, 0, 0), ("decode_b2_s1_past9_pad", 2, 1, 0, 3, 9),
                ("prefill_b2_s6_pad", 2, 6, 0, 2, 0),
                ("b2_s5_past6_pad", 2, 5, 0, 4, 6)]
    if arch.meta.get("fixed_seq"):
        return [("batch1", 1, 0, 5, 0), ("batch3", 3, 0, 11, 0)]
    has_mask = any(s.role == "attention_mask" for s in arch.inputs)
    return [("b1_s7", 1, 7, 5, 0),
            ("b2_s23_pad" if has_mask else "b2_s23", 2, 23, 11, 9 if has_mask else 0)]


# --------------------------------------------------------------------------
# export
# --------------------------------------------------------------------------

_DIFF_REGISTERED = False


def _register_diff_symbolic():
    """aten::diff has no TorchScript-exporter symbolic; transformers' masking_utils uses it
    (packed-sequence detection when a decoder gets position ids but no attention mask)."""
    global _DIFF_REGISTERED
    if _DIFF_REGISTERED:
        return
    from torch.onnx import symbolic_helper as sh

    @sh.parse_args("v", "i", "i", "v", "v")
    def diff(g, self, n, dim, prepend, append):
        parts = [t for t in (prepend, self, append) if not sh._is_none(t)]
        x = g.op("Concat", *parts, axis_i=dim) if len(parts) > 1 else self
        for _ in range(n):
            c = lambda v: g.op("Constant", value_t=torch.tensor([v], dtype=torch.int64))  # noqa: E731
            hi = g.op("Slice", x, c(1), c(2**62), c(dim))
            lo = g.op("Slice", x, c(0), c(-1), c(dim))
            x = g.op("Sub", hi, lo)
        return x

    torch.onnx.register_custom_op_symbolic("aten::diff", diff, TS_OPSET)

    from torch.onnx._internal.torchscript_exporter import symbolic_opset11

    def cumsum(g, self, dim, dtype=None):
        # torch sums a bool tensor as int64; ONNX CumSum takes no bool (the stock symbolic forgets the Cast)
        if sh._try_get_scalar_type(self) == sh._type_utils.JitScalarType.BOOL:
            self = g.op("Cast", self, to_i=onnx.TensorProto.INT64)
        return symbolic_opset11.cumsum(g, self, dim, dtype)

    torch.onnx.register_custom_op_symbolic("aten::cumsum", cumsum, TS_OPSET)
    _DIFF_REGISTERED = True


def export_torchscript(wrapper, arch, example, path):
    _register_diff_symbolic()
    dyn = {}
    for spec in arch.inputs:
        d = {i: n for i, n in enumerate(spec.dims) if isinstance(n, str)}
        dyn[spec.name] = d
    for o in arch.outputs:
        dyn[o] = arch.meta.get("output_dims", {}).get(o, {0: "batch"})
    torch.onnx.export(wrapper, example, str(path), input_names=[s.name for s in arch.inputs],
                      output_names=arch.outputs, dynamic_axes=dyn, opset_version=arch.meta.get("opset", TS_OPSET),
                      do_constant_folding=True, dynamo=False)


def export_dynamo(wrapper, arch, example, path):
    dims = {"batch": torch.export.Dim("batch", min=1, max=64),
            "seq": torch.export.Dim("seq", min=1, max=128),
            "dec_seq": torch.export.Dim("dec_seq", min=1, max=64)}
    if arch.meta.get("cache"):
        # total = past + seq is not a derived dim torch.export can be told; it finds the relation itself
        # and names the mask's length on its own (s53), as it does in exports made outside this script
        dims.update(past=torch.export.Dim("past", min=0, max=4096), total=torch.export.Dim.AUTO)
    dyn = tuple({i: dims[n] for i, n in enumerate(spec.dims) if isinstance(n, str)} for spec in arch.inputs)
    kw = {}
    if DYNAMO_OPSET is not None:
        kw["opset_version"] = DYNAMO_OPSET
    prog = torch.onnx.export(wrapper, example, dynamo=True, input_names=[s.name for s in arch.inputs],
                             output_names=arch.outputs, dynamic_shapes=dyn, optimize=True,
                             verbose=False, **kw)
    prog.save(str(path))


def export_merged(wrapper, arch, path):
    """The merged decoder: the with-cache and the no-cache TorchScript exports as the two branches
    of one If(use_cache_branch), their weights in the main graph."""
    import dataclasses
    with_past = dataclasses.replace(arch, inputs=arch.inputs[:-1])
    no_past_inputs = [_tok("input_ids", "input_ids"), _mask()]
    no_past = dataclasses.replace(arch, inputs=no_past_inputs, meta={
        "output_dims": {o: ({0: "batch", 2: "seq"} if o.startswith("present") else {0: "batch", 1: "seq"})
                        for o in arch.outputs}})
    rng = np.random.default_rng(1234)
    ex_past = make_feeds(with_past, EXPORT_BATCH, EXPORT_SEQ, 0, 3, rng, EXPORT_SEQ // 2 + 1)
    ex_new = make_feeds(no_past, EXPORT_BATCH, EXPORT_SEQ, 0, 3, rng)
    parts = {}
    for label, sub, module, feeds in (("with_past", with_past, wrapper.with_past, ex_past),
                                      ("no_past", no_past, wrapper.no_past, ex_new)):
        part = path.with_name(f"{path.stem}.{label}.onnx")
        export_torchscript(module, sub, tuple(torch.from_numpy(feeds[s.name]) for s in sub.inputs), part)
        parts[label] = postprocess(part)
        part.unlink()
    main_graph = parts["with_past"].graph
    branches, weights = {}, []
    for label, m in parts.items():
        g = m.graph
        outer = {i.name for i in g.input}
        rename = {x: f"{label}/{x}" for x in [i.name for i in g.initializer] + [o for n in g.node for o in n.output if o]}
        nodes = []
        for n in g.node:
            c = onnx.NodeProto()
            c.CopyFrom(n)
            c.name = f"{label}/{n.name}"
            c.input[:] = [rename.get(x, x) for x in n.input]
            c.output[:] = [rename.get(x, x) for x in n.output]
            nodes.append(c)
        assert not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in nodes for a in n.attribute)
        for init in g.initializer:
            w = onnx.TensorProto()
            w.CopyFrom(init)
            w.name = rename[init.name]
            weights.append(w)
        outs = [onnx.helper.make_tensor_value_info(rename.get(o.name, o.name), o.type.tensor_type.elem_type, None)
                for o in g.output]
        assert not outer & {o.name for o in g.output}
        branches[label] = onnx.helper.make_graph(nodes, label, [], outs)
    choose = onnx.helper.make_node("If", ["use_cache_branch"], [o.name for o in main_graph.output], name="merged/if",
                                   then_branch=branches["with_past"], else_branch=branches["no_past"])
    inputs = list(main_graph.input) + [onnx.helper.make_tensor_value_info("use_cache_branch", onnx.TensorProto.BOOL, [1])]
    graph = onnx.helper.make_graph([choose], "merged_decoder", inputs, list(main_graph.output), weights)
    merged = onnx.helper.make_model(graph, opset_imports=list(parts["with_past"].opset_import))
    merged.ir_version = parts["with_past"].ir_version
    onnx.save(merged, str(path))


def branch_models(m: onnx.ModelProto):
    """m itself, and each If branch of its main graph as a model of its own (to count its blocks)."""
    out = [m]
    for n in m.graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                sub = onnx.ModelProto()
                sub.CopyFrom(m)
                sub.graph.CopyFrom(a.g)
                out.append(sub)
    return out


KEEP_NODE_META = {"namespace"}


def _compact_namespace(v: str) -> str:
    """': __main__.W/m: transformers.models.bert.modeling_bert.BertModel/...' ->
    ': W/m: BertModel/...' (module paths kept, class names without their Python module)."""
    return re.sub(r"([:/] ?)(?:[A-Za-z_][\w]*\.)+([A-Za-z_]\w*)(?=/)", r"\1\2", v)


def postprocess(path, strip_shapes=False):
    """Drop bulky export metadata (stack traces, fx nodes), cap the IR version, single file;
    strip_shapes: drop every value_info too (a model shipped without shapes)."""
    m = onnx.load(str(path))
    if strip_shapes:
        del m.graph.value_info[:]
    for n in m.graph.node:
        keep = [p for p in n.metadata_props if p.key in KEEP_NODE_META]
        for p in keep:
            p.value = _compact_namespace(p.value)
        del n.metadata_props[:]
        n.metadata_props.extend(keep)
        n.doc_string = ""
    for vi in list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info):
        del vi.metadata_props[:]
    for init in m.graph.initializer:
        del init.metadata_props[:]
    m.doc_string = ""
    if m.ir_version > MAX_IR_VERSION:
        m.ir_version = MAX_IR_VERSION
    onnx.checker.check_model(m)
    onnx.save(m, str(path), save_as_external_data=False)
    for extra in path.parent.glob(path.name + ".data"):
        extra.unlink()
    return m


def describe_inputs(m: onnx.ModelProto, arch: Arch):
    specs = {s.name: s for s in arch.inputs}
    out = []
    for vi in m.graph.input:
        tt = vi.type.tensor_type
        shape = [d.dim_param if d.dim_param else d.dim_value for d in tt.shape.dim]
        spec = specs.get(vi.name)
        e = {"name": vi.name, "elem_type": ELEM.get(tt.elem_type, str(tt.elem_type)), "shape": shape,
             "role": spec.role if spec else "unknown"}
        if spec:
            e.update(spec.extra)
            if spec.role in ("input_ids", "decoder_input_ids"):
                e["vocab_size"] = VOCAB
        out.append(e)
    return out


def cache_dims(m: onnx.ModelProto):
    """The symbolic dims of a cached decoder's lengths as the exporter named them (dynamo picks its
    own names), so that feeds keep total = past + new."""
    def dim(name, axis):
        vi = next(v for v in m.graph.input if v.name == name)
        d = vi.type.tensor_type.shape.dim[axis]
        return d.dim_param or d.dim_value

    layers = sum(1 for v in m.graph.input if v.name.startswith("past_key_values.") and v.name.endswith(".key"))
    return {"layers": layers, "batch_dim": dim("input_ids", 0), "new_dim": dim("input_ids", 1),
            "past_dim": dim("past_key_values.0.key", 2), "total_dim": dim("attention_mask", 1),
            "past_inputs": "past_key_values.{i}.key / .value [batch, kv_heads, past, head_dim]",
            "present_outputs": "present.{i}.key / .value [batch, kv_heads, past + new, head_dim]"}


def _compare(wrapper, arch, sess, onames, label, feeds):
    with torch.no_grad():
        ref = wrapper(*[torch.from_numpy(feeds[sp.name]) for sp in arch.inputs])
    if isinstance(ref, torch.Tensor):
        ref = (ref,)
    try:
        got = sess.run(onames, feeds)
    except Exception as e:  # noqa: BLE001
        return {"case": label, "ok": False, "error": _one_line(e)}
    diffs = []
    shapes_ok = True
    for r, g in zip(ref, got):
        r = r.numpy()
        if r.shape != g.shape:
            shapes_ok = False
            diffs.append(float("inf"))
            continue
        both_nan = np.isnan(r) & np.isnan(g)
        d = np.where(both_nan, 0.0, np.abs(r - g))
        diffs.append(float(np.nan_to_num(d, nan=np.inf).max()))
    md = max(diffs)
    return {"case": label, "feeds": {k: list(v.shape) for k, v in feeds.items()},
            "max_abs_diff": md, "ok": bool(shapes_ok and md < TOL)}


def run_checks(wrapper, arch, path):
    """The required checks (two sequence lengths, batch 2 padded) and, where the model takes an
    attention_mask, an informative one with a fully masked batch row (mask all zeros)."""
    try:
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001
        return [{"case": "load", "ok": False, "error": _one_line(e)}], None
    onames = [o.name for o in sess.get_outputs()]
    rng = np.random.default_rng(SEED)
    results = [_compare(wrapper, arch, sess, onames, case[0], make_feeds(arch, *case[1:5], rng, *case[5:]))
               for case in check_cases(arch)]
    masked = None
    if any(sp.role == "attention_mask" for sp in arch.inputs):
        past = 4 if arch.meta.get("cache") else 0
        masked = _compare(wrapper, arch, sess, onames, "b2_s9_row1_fully_masked",
                          make_feeds(arch, 2, 9, 6, 9 + past, rng, past))
    return results, masked


def _one_line(e: BaseException) -> str:
    msg = f"{type(e).__name__}: {e}".strip().splitlines()
    msg = [l for l in msg if l.strip()]
    s = msg[0] if msg else type(e).__name__
    return s[:300]


def export_one(arch: Arch, attn_impl: str, exporter: str, outdir: Path, log):
    fname = f"{arch.name}_{attn_impl}_{exporter}.onnx"
    path = outdir / fname
    base = {"file": fname, "arch": arch.name, "exporter": exporter, "attn_impl": attn_impl}
    torch.manual_seed(SEED)
    try:
        wrapper = arch.build(attn_impl).eval()
    except Exception as e:  # noqa: BLE001
        return None, {**base, "stage": "build", "reason": _one_line(e)}
    impl = getattr(wrapper.m.config, "_attn_implementation", None)
    if impl != attn_impl:
        return None, {**base, "stage": "build", "reason": f"model uses attn_implementation={impl!r}"}
    example = export_example(arch)
    t0 = time.time()
    sink = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            warnings.simplefilter("ignore")
            with torch.no_grad():
                if arch.meta.get("merged"):
                    export_merged(wrapper, arch, path)
                elif exporter == "torchscript":
                    export_torchscript(wrapper, arch, example, path)
                else:
                    export_dynamo(wrapper, arch, example, path)
        m = postprocess(path, arch.meta.get("strip_shapes", False))
    except Exception as e:  # noqa: BLE001
        log(traceback.format_exc(limit=3))
        for p in (path, Path(str(path) + ".data")):
            if p.exists():
                p.unlink()
        return None, {**base, "stage": "export", "reason": _one_line(e)}
    checks, masked = run_checks(wrapper, arch, path)
    ok = all(c["ok"] for c in checks)
    softmaxes = [s for part in branch_models(m) for s in attention_softmaxes(part)]
    if len(softmaxes) != sum(arch.block_kinds.values()):
        print(f"WARNING {fname}: {len(softmaxes)} attention softmaxes, expected {sum(arch.block_kinds.values())}")
    opset = next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
    dynamic_seq = (not arch.meta.get("fixed_seq")) and any(
        isinstance(d, str) and d != "batch" for s in describe_inputs(m, arch) for d in s["shape"])
    entry = {
        **base,
        "opset": opset,
        "ir_version": m.ir_version,
        "size_bytes": path.stat().st_size,
        "attention_blocks": len(softmaxes),
        "block_kinds": arch.block_kinds,
        "num_heads": arch.num_heads,
        "kv_heads": arch.kv_heads,
        "head_dim": arch.head_dim,
        "causal": arch.causal,
        "vocab_size": VOCAB if any(s.role.endswith("input_ids") for s in arch.inputs) else None,
        "dynamic": {"batch": True, "seq": dynamic_seq},
        "inputs": describe_inputs(m, arch),
        "outputs": [o.name for o in m.graph.output],
        "notes": arch.notes,
        "check": {"ok": ok, "tolerance": TOL, "cases": checks},
        "fully_masked_row": masked and {
            "matches_pytorch": masked["ok"], "max_abs_diff": masked.get("max_abs_diff"),
            "note": "informative, not part of check.ok: batch row 1 has attention_mask all zeros"},
    }
    if arch.meta.get("cache"):
        entry["cache"] = cache_dims(m)
    if not ok:
        entry["check"]["reason"] = "; ".join(
            f"{c['case']}: {c.get('error') or 'max_abs_diff=%.3g' % c['max_abs_diff']}" for c in checks if not c["ok"])
    return entry, None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", help="architectures to (re)build; others keep their manifest entries")
    ap.add_argument("--exporter", choices=["torchscript", "dynamo"], nargs="*")
    ap.add_argument("--attn", choices=["eager", "sdpa"], nargs="*")
    ap.add_argument("--out", default=str(HERE))
    ap.add_argument("--no-patterns", action="store_true", help="do not regenerate PATTERNS.md")
    args = ap.parse_args(argv)

    import transformers

    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    man_path = outdir / "manifest.json"
    old = {"models": [], "skipped": []}
    if man_path.exists() and (args.only or args.exporter or args.attn):
        old = json.loads(man_path.read_text())

    exporters = args.exporter or ["torchscript", "dynamo"]
    impls = args.attn or ["eager", "sdpa"]
    archs = [a for a in ARCHS if not args.only or a.name in args.only]
    todo = {(a.name, i, e) for a in archs for i in impls for e in exporters}
    key = lambda d: (d["arch"], d["attn_impl"], d["exporter"])  # noqa: E731
    models = [d for d in old["models"] if key(d) not in todo]
    skipped = [d for d in old["skipped"] if key(d) not in todo]
    logf = open(outdir / "generate.log", "w") if os.environ.get("ORTFLASH_ZOO_LOG") else None

    def log(s):
        if logf:
            logf.write(s + "\n")

    for arch in archs:
        for attn_impl in impls:
            for exporter in exporters:
                reason = None
                if attn_impl != "eager" and arch.name in EAGER_ONLY:
                    reason = (f"transformers {transformers.__version__} has only eager attention for {arch.name}"
                              if arch.name == "gpt_neo" else "one attention implementation shows the form")
                elif exporter not in arch.meta.get("exporters", [exporter]):
                    reason = ("built from TorchScript exports only" if arch.meta.get("merged")
                              else "the dynamo exporter writes opset 18 or later")
                if reason:
                    skipped.append({"file": f"{arch.name}_{attn_impl}_{exporter}.onnx", "arch": arch.name,
                                    "exporter": exporter, "attn_impl": attn_impl, "stage": "build",
                                    "reason": reason})
                    continue
                t0 = time.time()
                entry, skip = export_one(arch, attn_impl, exporter, outdir, log)
                if entry:
                    models.append(entry)
                    st = "ok" if entry["check"]["ok"] else "CHECK FAILED: " + entry["check"]["reason"]
                    fm = entry.get("fully_masked_row")
                    if fm:
                        st += f"  (fully masked row vs torch: {'same' if fm['matches_pytorch'] else 'differs %.2g' % fm['max_abs_diff']})"
                    print(f"{entry['file']:36s} blocks={entry['attention_blocks']:2d} "
                          f"{entry['size_bytes'] / 1024:6.0f} KiB  {time.time() - t0:5.1f}s  {st}", flush=True)
                else:
                    skipped.append(skip)
                    print(f"{skip['file']:36s} SKIPPED ({skip['stage']}): {skip['reason']}", flush=True)

    order = {a.name: i for i, a in enumerate(ARCHS)}
    sk = lambda d: (order.get(d["arch"], 99), d["attn_impl"], d["exporter"])  # noqa: E731
    models.sort(key=sk)
    skipped.sort(key=sk)
    manifest = {
        "generator": "models/generate.py",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "onnx": onnx.__version__, "onnxruntime": ort.__version__},
        "seed": SEED,
        "tolerance": TOL,
        "total_bytes": sum(d["size_bytes"] for d in models),
        "models": models,
        "skipped": skipped,
    }
    man_path.write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"{len(models)} models, {len(skipped)} skipped, {manifest['total_bytes'] / 1024:.0f} KiB total")
    if not args.no_patterns:
        import describe
        describe.main([str(outdir)])


if __name__ == "__main__":
    main()
