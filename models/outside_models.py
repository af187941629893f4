#!/usr/bin/env python
"""Export tiny random-weight transformers of architectures that are NOT in the zoo, to check
ortflash on models it was not built around (issue 12's general case).

Run with the torch venv (never in CI; the exports stay out of git):

    /work/zooenv/bin/python models/outside_models.py --out /tmp/outside
    /work/zooenv/bin/python models/outside_models.py --only phi3 bloom --exporter torchscript
    /work/zooenv/bin/python models/outside_models.py --out /tmp/outside --check after.jsonl \
        --ortflash .venv/bin/ortflash          # optimize --verify x 3 targets, one JSON row each
    /work/zooenv/bin/python models/outside_models.py --table before.jsonl after.jsonl
    HF_HUB_OFFLINE=1 PATH=/work/optenv/bin:$PATH /work/optenv/bin/python models/outside_models.py \
        --optimum --out /tmp/optmodels       # optimum-cli exports (optimum-onnx 0.1.0, transformers 4.57)

Each model is built from a `transformers` config (random weights, never downloaded), exported
with the same helpers as the zoo (`models/generate.py`: TorchScript opset 17 and dynamo; eager
and sdpa), checked against PyTorch in ONNX Runtime, and listed in OUT/manifest.json with the
reason for every combination that did not export.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import generate as zoo  # noqa: E402
from generate import (  # noqa: E402
    INIT_STD,
    VOCAB,
    Arch,
    EncoderWrapper,
    InputSpec,
    PixelWrapper,
    _cache_arch,
    _mask,
    _perturb_constant_params,
    _set_impl,
    _tok,
)

SMALL = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 16, "num_hidden_layers": 2}


class TextOnlyWrapper(torch.nn.Module):
    """input_ids + attention_mask -> last_hidden_state, for models whose forward has no use_cache."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def build_phi3(attn_impl: str) -> torch.nn.Module:
    from transformers import Phi3Config, Phi3Model

    cfg = Phi3Config(
        **SMALL,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
        initializer_range=INIT_STD,
    )
    return EncoderWrapper(_perturb_constant_params(Phi3Model(_set_impl(cfg, attn_impl))))


def build_gemma2(attn_impl: str) -> torch.nn.Module:
    from transformers import Gemma2Config, Gemma2Model

    # layer 0 sliding (window 4), layer 1 full; tanh softcap on the scores; query_pre_attn_scalar != head_dim
    cfg = Gemma2Config(
        **SMALL,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        sliding_window=4,
        attn_logit_softcapping=50.0,
        query_pre_attn_scalar=24,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
        initializer_range=INIT_STD,
    )
    return EncoderWrapper(_perturb_constant_params(Gemma2Model(_set_impl(cfg, attn_impl))))


def build_falcon(attn_impl: str) -> torch.nn.Module:
    from transformers import FalconConfig, FalconModel

    cfg = FalconConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        multi_query=True,
        new_decoder_architecture=False,
        alibi=False,
        bias=False,
        max_position_embeddings=128,
        use_cache=False,
        initializer_range=INIT_STD,
    )
    return EncoderWrapper(_perturb_constant_params(FalconModel(_set_impl(cfg, attn_impl))))


def build_gptj(attn_impl: str) -> torch.nn.Module:
    from transformers import GPTJConfig, GPTJModel

    cfg = GPTJConfig(
        vocab_size=VOCAB,
        n_positions=128,
        n_embd=64,
        n_layer=2,
        n_head=4,
        rotary_dim=8,
        n_inner=16,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
        initializer_range=INIT_STD,
    )
    return EncoderWrapper(_perturb_constant_params(GPTJModel(_set_impl(cfg, attn_impl))))


def build_bloom(attn_impl: str) -> torch.nn.Module:
    from transformers import BloomConfig, BloomModel

    cfg = BloomConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        n_layer=2,
        n_head=4,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        initializer_range=INIT_STD,
    )
    return EncoderWrapper(_perturb_constant_params(BloomModel(_set_impl(cfg, attn_impl))))


def build_opt(attn_impl: str) -> torch.nn.Module:
    from transformers import OPTConfig, OPTModel

    cfg = OPTConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        ffn_dim=16,
        num_attention_heads=2,
        max_position_embeddings=128,
        word_embed_proj_dim=64,
        use_cache=False,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        init_std=INIT_STD,
    )
    return EncoderWrapper(_perturb_constant_params(OPTModel(_set_impl(cfg, attn_impl))))


def build_roberta(attn_impl: str) -> torch.nn.Module:
    from transformers import RobertaConfig, RobertaModel

    cfg = RobertaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=130,
        type_vocab_size=1,
        pad_token_id=1,
        initializer_range=INIT_STD,
    )
    return TextOnlyWrapper(_perturb_constant_params(RobertaModel(_set_impl(cfg, attn_impl), add_pooling_layer=False)))


def build_distilbert(attn_impl: str) -> torch.nn.Module:
    from transformers import DistilBertConfig, DistilBertModel

    cfg = DistilBertConfig(
        vocab_size=VOCAB,
        dim=64,
        n_layers=2,
        n_heads=2,
        hidden_dim=16,
        max_position_embeddings=128,
        initializer_range=INIT_STD,
    )
    return TextOnlyWrapper(_perturb_constant_params(DistilBertModel(_set_impl(cfg, attn_impl))))


def build_clip_text(attn_impl: str) -> torch.nn.Module:
    from transformers import CLIPTextConfig, CLIPTextModel

    cfg = CLIPTextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=128,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        initializer_range=INIT_STD,
    )
    return TextOnlyWrapper(_perturb_constant_params(CLIPTextModel(_set_impl(cfg, attn_impl))))


SIGLIP_IMAGE, SIGLIP_PATCH = 32, 8


def build_siglip_vision(attn_impl: str) -> torch.nn.Module:
    from transformers import SiglipVisionConfig, SiglipVisionModel

    cfg = SiglipVisionConfig(
        hidden_size=64,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=SIGLIP_IMAGE,
        patch_size=SIGLIP_PATCH,
        num_channels=3,
        vision_use_head=False,
    )
    return PixelWrapper(_perturb_constant_params(SiglipVisionModel(_set_impl(cfg, attn_impl))))


def _cache_model(config_name: str, model_name: str, attn_impl: str, **kw: object) -> torch.nn.Module:
    import transformers

    cfg = getattr(transformers, config_name)(
        **SMALL,
        max_position_embeddings=128,
        use_cache=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        initializer_range=INIT_STD,
        **kw,
    )
    model = getattr(transformers, model_name)(_set_impl(cfg, attn_impl))
    return zoo.CacheDecoderWrapper(_perturb_constant_params(model))


def build_gpt_neo_cache(attn_impl: str) -> torch.nn.Module:
    """The zoo's GPT-Neo (models/generate.py: its own causal buffer, a Where, before Hugging Face's
    causal + padding mask added after it; one global and one local layer, window 8) with a KV cache:
    the forward asks for the cache (use_cache=True) whatever the config says."""
    return zoo.CacheDecoderWrapper(zoo.build_gpt_neo(attn_impl).m)


def build_qwen3_cache(attn_impl: str) -> torch.nn.Module:
    # q_norm / k_norm (RMSNorm per head) between the projections and the scores
    return _cache_model(
        "Qwen3Config",
        "Qwen3Model",
        attn_impl,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        use_sliding_window=False,
    )


def build_smollm3_cache(attn_impl: str) -> torch.nn.Module:
    # layer 1 has no rotary embedding (NoPE)
    return _cache_model(
        "SmolLM3Config",
        "SmolLM3Model",
        attn_impl,
        num_attention_heads=4,
        num_key_value_heads=1,
        no_rope_layers=[1, 0],
        use_sliding_window=False,
    )


def build_phi3_cache(attn_impl: str) -> torch.nn.Module:
    return _cache_model("Phi3Config", "Phi3Model", attn_impl, num_attention_heads=4, num_key_value_heads=2)


def build_gemma2_cache(attn_impl: str) -> torch.nn.Module:
    return _cache_model(
        "Gemma2Config",
        "Gemma2Model",
        attn_impl,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=4096,
        attn_logit_softcapping=50.0,
        query_pre_attn_scalar=24,
    )


class BartDecoderCacheWrapper(torch.nn.Module):
    """A BART decoder step against a self-attention cache: decoder_input_ids [batch, seq], encoder
    hidden states [batch, enc, 64] and their mask, past self K/V [batch, 2, past, 32] ->
    hidden state and present self K/V (cross K/V are recomputed from the encoder states)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(
        self,
        decoder_input_ids: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor,
        past_key_0: torch.Tensor,
        past_value_0: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        from transformers import DynamicCache, EncoderDecoderCache

        cache = EncoderDecoderCache(DynamicCache(ddp_cache_data=[(past_key_0, past_value_0)]), DynamicCache())
        out = self.m(
            input_ids=decoder_input_ids,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            past_key_values=cache,
            use_cache=True,
        )
        layer = out.past_key_values.self_attention_cache.layers[0]
        return out.last_hidden_state, layer.keys, layer.values


def build_bart_decoder_cache(attn_impl: str) -> torch.nn.Module:
    from transformers import BartConfig
    from transformers.models.bart.modeling_bart import BartDecoder

    cfg = BartConfig(
        vocab_size=VOCAB,
        d_model=64,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=16,
        decoder_ffn_dim=16,
        max_position_embeddings=128,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        use_cache=True,
        init_std=INIT_STD,
    )
    return BartDecoderCacheWrapper(_perturb_constant_params(BartDecoder(_set_impl(cfg, attn_impl))))


def build_t5_decoder_cache(attn_impl: str) -> torch.nn.Module:
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Stack

    cfg = T5Config(
        vocab_size=VOCAB,
        d_model=64,
        d_kv=32,
        d_ff=16,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=2,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
        use_cache=True,
        is_decoder=True,
        is_encoder_decoder=False,
    )
    return BartDecoderCacheWrapper(_perturb_constant_params(T5Stack(_set_impl(cfg, attn_impl))))


def _causal_lm(config_name: str, model_name: str, attn_impl: str, **kw: object) -> torch.nn.Module:
    """A decoder-only model without a cache: input_ids + attention_mask -> last_hidden_state."""
    import transformers

    cfg = getattr(transformers, config_name)(
        vocab_size=VOCAB, use_cache=False, bos_token_id=0, eos_token_id=0, pad_token_id=0, **kw
    )
    return EncoderWrapper(_perturb_constant_params(getattr(transformers, model_name)(_set_impl(cfg, attn_impl))))


def build_gpt_neox(attn_impl: str) -> torch.nn.Module:
    # partial rotary (rotary_pct 0.25), fused qkv projection viewed per head
    return _causal_lm(
        "GPTNeoXConfig",
        "GPTNeoXModel",
        attn_impl,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=16,
        rotary_pct=0.25,
        max_position_embeddings=128,
        initializer_range=INIT_STD,
    )


def build_gpt_bigcode(attn_impl: str) -> torch.nn.Module:
    # multi-query attention: K and V of one head, Q's heads folded into its rows
    return _causal_lm(
        "GPTBigCodeConfig",
        "GPTBigCodeModel",
        attn_impl,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_inner=16,
        n_positions=128,
        multi_query=True,
        initializer_range=INIT_STD,
    )


def build_codegen(attn_impl: str) -> torch.nn.Module:
    return _causal_lm(
        "CodeGenConfig",
        "CodeGenModel",
        attn_impl,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_inner=16,
        rotary_dim=8,
        n_positions=128,
        n_ctx=128,
        initializer_range=INIT_STD,
    )


def build_stablelm(attn_impl: str) -> torch.nn.Module:
    return _causal_lm(
        "StableLmConfig",
        "StableLmModel",
        attn_impl,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=16,
        partial_rotary_factor=0.25,
        max_position_embeddings=128,
        initializer_range=INIT_STD,
    )


def build_mixtral(attn_impl: str) -> torch.nn.Module:
    return _causal_lm(
        "MixtralConfig",
        "MixtralModel",
        attn_impl,
        **{k: v for k, v in SMALL.items() if k != "vocab_size"},
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=2,
        num_experts_per_tok=1,
        max_position_embeddings=128,
        sliding_window=None,
        initializer_range=INIT_STD,
    )


def build_mpt(attn_impl: str) -> torch.nn.Module:
    # ALiBi bias; no sdpa in transformers
    return _causal_lm(
        "MptConfig",
        "MptModel",
        attn_impl,
        d_model=64,
        n_heads=4,
        n_layers=2,
        expansion_ratio=1,
        max_seq_len=128,
        initializer_range=INIT_STD,
    )


def build_deit(attn_impl: str) -> torch.nn.Module:
    from transformers import DeiTConfig, DeiTModel

    cfg = DeiTConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=16,
        image_size=SIGLIP_IMAGE,
        patch_size=SIGLIP_PATCH,
        num_channels=3,
        initializer_range=INIT_STD,
    )
    return PixelWrapper(_perturb_constant_params(DeiTModel(_set_impl(cfg, attn_impl), add_pooling_layer=False)))


def build_swin(attn_impl: str) -> torch.nn.Module:
    from transformers import SwinConfig, SwinModel

    # 32x32 image, patch 4 -> 8x8 tokens, window 4: shifted windows and a relative position bias
    cfg = SwinConfig(
        image_size=SIGLIP_IMAGE,
        patch_size=4,
        num_channels=3,
        embed_dim=16,
        depths=[2],
        num_heads=[2],
        window_size=4,
        mlp_ratio=1.0,
        initializer_range=INIT_STD,
    )
    return PixelWrapper(_perturb_constant_params(SwinModel(_set_impl(cfg, attn_impl), add_pooling_layer=False)))


class AudioWrapper(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        return self.m(input_values=input_values).last_hidden_state


AUDIO_SAMPLES = 800


def build_wav2vec2(attn_impl: str) -> torch.nn.Module:
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    cfg = Wav2Vec2Config(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=16,
        conv_dim=(16, 16),
        conv_stride=(5, 4),
        conv_kernel=(10, 4),
        num_conv_pos_embeddings=4,
        num_conv_pos_embedding_groups=2,
        do_stable_layer_norm=True,
        initializer_range=INIT_STD,
    )
    return AudioWrapper(_perturb_constant_params(Wav2Vec2Model(_set_impl(cfg, attn_impl))))


def _pixel_input() -> InputSpec:
    return InputSpec(
        "pixel_values",
        "pixel_values",
        "float32",
        ["batch", 3, SIGLIP_IMAGE, SIGLIP_IMAGE],
        {"distribution": "standard normal"},
    )


def _text(
    name: str, build: object, heads: int, kv: int, dim: int, causal: bool, notes: str, kinds: dict[str, int]
) -> Arch:
    return Arch(
        name,
        build,
        [_tok("input_ids", "input_ids"), _mask()],
        ["last_hidden_state"],
        heads,
        kv,
        dim,
        causal,
        notes,
        block_kinds=kinds,
    )


_bart_inputs = [
    _tok("decoder_input_ids", "input_ids"),
    InputSpec(
        "encoder_hidden_states",
        "encoder_hidden_states",
        "float32",
        ["batch", "dec_seq", 64],
        {"distribution": "standard normal"},
    ),
    _mask("encoder_attention_mask", seq="dec_seq"),
    InputSpec(
        "past_key_values.0.key", "past_key", "float32", ["batch", 2, "past", 32], {"distribution": "standard normal"}
    ),
    InputSpec(
        "past_key_values.0.value",
        "past_value",
        "float32",
        ["batch", 2, "past", 32],
        {"distribution": "standard normal"},
    ),
]

ARCHS: list[Arch] = [
    _text("phi3", build_phi3, 4, 2, 16, True, "fused qkv projection, GQA 4/2", {"causal_self": 2}),
    _text(
        "gemma2",
        build_gemma2,
        4,
        2,
        16,
        True,
        "tanh softcap, sliding window 4 on layer 0, scale 24^-0.5",
        {"causal_self": 2},
    ),
    _text("falcon", build_falcon, 4, 1, 16, True, "multi-query (1 KV head)", {"causal_self": 2}),
    _text("gptj", build_gptj, 4, 4, 16, True, "partial rotary, fp32 upcast of the scores", {"causal_self": 2}),
    _text("bloom", build_bloom, 4, 4, 16, True, "ALiBi bias through baddbmm", {"causal_self": 2}),
    _text("opt", build_opt, 2, 2, 32, True, "scale on the query projection", {"causal_self": 2}),
    _text("roberta", build_roberta, 2, 2, 32, False, "encoder, padding mask", {"self": 2}),
    _text("distilbert", build_distilbert, 2, 2, 32, False, "encoder, masked_fill with float min", {"self": 2}),
    _text("clip_text", build_clip_text, 2, 2, 32, True, "text encoder, causal + padding mask", {"causal_self": 2}),
    Arch(
        "siglip_vision",
        build_siglip_vision,
        [_pixel_input()],
        ["last_hidden_state"],
        2,
        2,
        32,
        False,
        "vision encoder, no mask",
        {"fixed_seq": (SIGLIP_IMAGE // SIGLIP_PATCH) ** 2},
        {"self": 2},
    ),
    _text("gpt_neox", build_gpt_neox, 4, 4, 16, True, "partial rotary, fused qkv", {"causal_self": 2}),
    _text("gpt_bigcode", build_gpt_bigcode, 4, 1, 16, True, "multi-query (1 KV head)", {"causal_self": 2}),
    _text("codegen", build_codegen, 4, 4, 16, True, "partial rotary, mp_num qkv split", {"causal_self": 2}),
    _text("stablelm", build_stablelm, 4, 2, 16, True, "partial rotary, GQA 4/2", {"causal_self": 2}),
    _text("mixtral", build_mixtral, 4, 2, 16, True, "MoE MLP, GQA 4/2", {"causal_self": 2}),
    _text("mpt", build_mpt, 4, 4, 16, True, "ALiBi bias", {"causal_self": 2}),
    *(
        Arch(
            name,
            build,
            [_pixel_input()],
            ["last_hidden_state"],
            2,
            2,
            dim,
            False,
            notes,
            {"fixed_seq": seq},
            {"self": blocks},
        )
        for name, build, dim, seq, blocks, notes in (
            ("deit", build_deit, 32, (SIGLIP_IMAGE // SIGLIP_PATCH) ** 2 + 2, 2, "vision encoder, cls + distillation"),
            ("swin", build_swin, 8, 16, 2, "window attention, relative position bias, shifted-window mask"),
        )
    ),
    Arch(
        "wav2vec2",
        build_wav2vec2,
        [InputSpec("input_values", "input_values", "float32", ["batch", AUDIO_SAMPLES], {"distribution": "normal"})],
        ["last_hidden_state"],
        2,
        2,
        32,
        False,
        "audio encoder, conv features, no mask",
        {"fixed_seq": 39},
        {"self": 2},
    ),
    _cache_arch("qwen3_cache", build_qwen3_cache, 4, 2, 16, "Qwen3 decoder, q/k RMSNorm"),
    _cache_arch(
        "gpt_neo_cache",
        build_gpt_neo_cache,
        2,
        2,
        32,
        "GPT-Neo decoder: the causal Where of its own buffer before the causal + padding bias; a local layer",
    ),
    _cache_arch("smollm3_cache", build_smollm3_cache, 4, 1, 16, "SmolLM3 decoder, NoPE layer"),
    _cache_arch("phi3_cache", build_phi3_cache, 4, 2, 16, "Phi-3 decoder"),
    _cache_arch("gemma2_cache", build_gemma2_cache, 4, 2, 16, "Gemma2 decoder, softcap"),
    Arch(
        "bart_decoder_cache",
        build_bart_decoder_cache,
        _bart_inputs,
        ["last_hidden_state", "present.0.key", "present.0.value"],
        2,
        2,
        32,
        True,
        "BART decoder step: self-attention cache, cross-attention to encoder states",
        {
            "cache": True,
            "output_dims": {
                "last_hidden_state": {0: "batch", 1: "seq"},
                "present.0.key": {0: "batch", 2: "total"},
                "present.0.value": {0: "batch", 2: "total"},
            },
        },
        {"causal_self": 1, "cross": 1},
    ),
    *(
        Arch(
            name,
            build,
            _bart_inputs,
            ["last_hidden_state", "present.0.key", "present.0.value"],
            2,
            2,
            32,
            True,
            notes,
            {
                "cache": True,
                "output_dims": {
                    "last_hidden_state": {0: "batch", 1: "seq"},
                    "present.0.key": {0: "batch", 2: "total"},
                    "present.0.value": {0: "batch", 2: "total"},
                },
            },
            {"causal_self": 1, "cross": 1},
        )
        for name, build, notes in (
            ("t5_decoder_cache", build_t5_decoder_cache, "T5 decoder step: relative position bias, self cache"),
        )
    ),
]


def _bart_feeds(arch: Arch, batch: int, seq: int, dec_seq: int, pad: int, rng: object, past: int = 0) -> dict:
    """The BART decoder's feeds: `enc` encoder positions (padded in the last row), `past` cached ones."""
    import numpy as np

    assert isinstance(rng, np.random.Generator)
    enc = 6
    feeds = {
        "decoder_input_ids": rng.integers(3, VOCAB, size=(batch, seq), dtype=np.int64),
        "encoder_hidden_states": rng.standard_normal((batch, enc, 64)).astype(np.float32),
        "encoder_attention_mask": np.ones((batch, enc), dtype=np.int64),
        "past_key_values.0.key": rng.standard_normal((batch, 2, past, 32)).astype(np.float32),
        "past_key_values.0.value": rng.standard_normal((batch, 2, past, 32)).astype(np.float32),
    }
    if pad and batch > 1:
        feeds["encoder_attention_mask"][-1, enc - min(pad, enc - 1) :] = 0
    return feeds


# Exports made as people ship them: tiny random models saved with save_pretrained, exported by
# `optimum-cli export onnx` (optimum-onnx 0.1.0 needs transformers < 4.58: run in its own venv,
# e.g. /work/optenv, with HF_HUB_OFFLINE=1). (task, config class, model class, config)
OPTIMUM_MODELS: dict[str, tuple[str, str, str, dict[str, object]]] = {
    "gpt2": (
        "text-generation-with-past",
        "GPT2Config",
        "GPT2LMHeadModel",
        {
            "n_positions": 128,
            "n_embd": 64,
            "n_layer": 2,
            "n_head": 2,
            "n_inner": 16,
            "bos_token_id": 0,
            "eos_token_id": 0,
        },
    ),
    "llama": (
        "text-generation-with-past",
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            **{k: v for k, v in SMALL.items() if k != "vocab_size"},
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 128,
            "pad_token_id": 0,
        },
    ),
    "whisper": (
        "automatic-speech-recognition-with-past",
        "WhisperConfig",
        "WhisperForConditionalGeneration",
        {
            "d_model": 64,
            "encoder_layers": 1,
            "decoder_layers": 1,
            "encoder_attention_heads": 2,
            "decoder_attention_heads": 2,
            "encoder_ffn_dim": 16,
            "decoder_ffn_dim": 16,
            "num_mel_bins": 16,
            "max_source_positions": 1500,  # optimum's dummy input is 3000 mel frames
            "max_target_positions": 64,
            "pad_token_id": 1,
            "bos_token_id": 0,
            "eos_token_id": 2,
            "decoder_start_token_id": 0,
            "begin_suppress_tokens": None,
            "suppress_tokens": None,
        },
    ),
    "t5": (
        "text2text-generation-with-past",
        "T5Config",
        "T5ForConditionalGeneration",
        {"d_model": 64, "d_kv": 32, "d_ff": 16, "num_layers": 1, "num_decoder_layers": 1, "num_heads": 2},
    ),
    "marian": (
        "text2text-generation-with-past",
        "MarianConfig",
        "MarianMTModel",
        {
            "d_model": 64,
            "encoder_layers": 1,
            "decoder_layers": 1,
            "encoder_attention_heads": 2,
            "decoder_attention_heads": 2,
            "encoder_ffn_dim": 16,
            "decoder_ffn_dim": 16,
            "max_position_embeddings": 128,
            "pad_token_id": VOCAB - 1,
            "decoder_start_token_id": VOCAB - 1,
            "eos_token_id": 0,
        },
    ),
    "bert": (
        "feature-extraction",
        "BertConfig",
        "BertModel",
        {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 16},
    ),
}


def optimum_exports(outdir: Path) -> None:
    """Every OPTIMUM_MODELS entry saved under OUT/src/NAME and exported with optimum-cli into
    OUT/optimum_NAME_FILE.onnx (decoder_model, decoder_with_past_model, decoder_model_merged with
    an If, encoder_model; or one model.onnx with past inputs)."""
    import shutil
    import subprocess

    import transformers

    torch.manual_seed(0)
    for name, (task, config_name, model_name, kw) in OPTIMUM_MODELS.items():
        src, out = outdir / "src" / name, outdir / "export" / name
        config = getattr(transformers, config_name)(vocab_size=VOCAB, **kw)
        getattr(transformers, model_name)(config).save_pretrained(src)
        done = subprocess.run(
            ["optimum-cli", "export", "onnx", "--model", str(src), "--task", task, str(out)],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            print(f"{name}: optimum-cli failed: {(done.stderr.strip().splitlines() or [''])[-1]}")
            continue
        for f in sorted(out.glob("*.onnx")):
            shutil.copy(f, outdir / f"optimum_{name}_{f.name}")
            print(f"optimum_{name}_{f.name}")


TARGETS = ("ortflash", "contrib", "onnx")


def check(outdir: Path, ortflash: list[str], rows_path: Path) -> None:
    """`ortflash optimize M --verify [--target T]` for every OUT/*.onnx and target; one JSON row
    per run (blocks, fused, lowered, causal, verify, max error, the reasons left) in rows_path."""
    import subprocess
    import tempfile

    with rows_path.open("w") as rows, tempfile.TemporaryDirectory() as tmp:
        for model in sorted(outdir.glob("*.onnx")):
            for target in TARGETS:
                result = Path(tmp) / "result.json"
                cmd = [*ortflash, "optimize", str(model), "-o", str(Path(tmp) / "out.onnx"), "--verify"]
                cmd += ["--json", str(result), "--quiet"] + (["--target", target] if target != "ortflash" else [])
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                row: dict = {
                    "model": model.stem,
                    "target": target,
                    "rc": done.returncode,
                    "err": (done.stderr.strip().splitlines() or [""])[-1][:300],
                }
                if result.exists():
                    d = json.loads(result.read_text())
                    blocks = d["blocks"]
                    runs = (d.get("verification") or {}).get("runs", [])
                    errs = [o["max_abs"] for r in runs for o in r.get("outputs", []) if o.get("max_abs") is not None]
                    row.update(
                        blocks=len(blocks),
                        fused=d["fused"],
                        lowered=sum(1 for b in blocks if b["fused"] and b["target"] != "ortflash")
                        if target != "ortflash"
                        else None,
                        causal=sum(1 for b in blocks if b["fused"] and b["reason"].startswith("causal (is_causal=")),
                        verify_ok=(d.get("verification") or {}).get("ok"),
                        max_err=max(errs) if errs else None,
                        reasons=sorted({b["reason"] for b in blocks if not b["fused"] or "not " in b["reason"]}),
                    )
                rows.write(json.dumps(row) + "\n")
                rows.flush()
                print(f"{model.stem:44s} {target:8s} rc={done.returncode} {row.get('fused')}/{row.get('blocks')}")
                for leftover in Path(tmp).glob("*"):
                    leftover.unlink()


def table(before_path: Path, after_path: Path) -> str:
    """The markdown rows of two check runs (before and after a change)."""

    def load(path: Path) -> dict:
        return {(r["model"], r["target"]): r for r in map(json.loads, path.read_text().splitlines())}

    def verified(r: dict | None) -> str:
        if r is None:
            return "–"
        if r.get("verify_ok") is None:
            return f"rc {r['rc']}: {r['err'][:80]}"
        e = r.get("max_err")
        return ("ok" if r["verify_ok"] else "FAIL") + (f" {e:.1e}" if e is not None else "")

    before, after = load(before_path), load(after_path)
    lines = [
        "| model | target | Softmax blocks | fused (before → after) | lowered | causal proved | verify after "
        "(max abs err) | verify before | left alone / not lowered / not proved causal (after) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(set(before) | set(after)):
        b, a = before.get(key, {}), after.get(key, {})
        lowered = f"{b.get('lowered', '–')} → {a.get('lowered', '–')}" if key[1] != "ortflash" else "–"
        reasons = "; ".join(x.replace("|", "/")[:140] for x in a.get("reasons", []))
        lines.append(
            f"| {key[0]} | {key[1]} | {a.get('blocks', b.get('blocks'))} | {b.get('fused')} → {a.get('fused')} | "
            f"{lowered} | {b.get('causal')} → {a.get('causal')} | {verified(a or None)} | {verified(b or None)} | "
            f"{reasons} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--exporter", choices=["torchscript", "dynamo"], nargs="*")
    ap.add_argument("--attn", choices=["eager", "sdpa"], nargs="*")
    ap.add_argument("--out", default="/tmp/outside")
    ap.add_argument("--check", metavar="ROWS.jsonl", help="do not export: run ortflash on every OUT/*.onnx")
    ap.add_argument("--ortflash", default="ortflash", help="the ortflash command, e.g. .venv/bin/ortflash")
    ap.add_argument("--table", nargs=2, metavar=("BEFORE.jsonl", "AFTER.jsonl"), help="print two checks' rows")
    ap.add_argument("--optimum", action="store_true", help="export OPTIMUM_MODELS with optimum-cli into --out")
    args = ap.parse_args(argv)
    if args.optimum:
        optimum_exports(Path(args.out))
        return
    if args.table:
        print(table(Path(args.table[0]), Path(args.table[1])))
        return
    if args.check:
        check(Path(args.out), args.ortflash.split(), Path(args.check))
        return
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    man_path = outdir / "manifest.json"
    manifest = json.loads(man_path.read_text()) if man_path.exists() else {"models": [], "skipped": []}
    base_feeds = zoo.make_feeds

    def feeds(arch: Arch, *a: object, **kw: object) -> dict:
        if arch.name.endswith("_decoder_cache"):
            return _bart_feeds(arch, *a, **kw)  # type: ignore[arg-type]
        return base_feeds(arch, *a, **kw)  # type: ignore[arg-type]

    base_cache_dims = zoo.cache_dims

    def cache_dims(m: object) -> dict:
        try:
            return base_cache_dims(m)
        except StopIteration:  # a decoder whose inputs are not named as the zoo's are
            return {}

    zoo.make_feeds = feeds  # the zoo's export and check helpers look these up at call time
    zoo.cache_dims = cache_dims
    archs = [a for a in ARCHS if not args.only or a.name in args.only]
    for arch in archs:
        for impl in args.attn or ["eager", "sdpa"]:
            for exporter in args.exporter or ["torchscript", "dynamo"]:
                t0 = time.time()
                fname = f"{arch.name}_{impl}_{exporter}.onnx"
                manifest["models"] = [d for d in manifest["models"] if d["file"] != fname]
                manifest["skipped"] = [d for d in manifest["skipped"] if d["file"] != fname]
                entry, skip = zoo.export_one(arch, impl, exporter, outdir, lambda s: None)
                if entry:
                    manifest["models"].append(entry)
                    st = "ok" if entry["check"]["ok"] else "CHECK FAILED: " + entry["check"]["reason"]
                    print(
                        f"{fname:44s} blocks={entry['attention_blocks']:2d} "
                        f"{entry['size_bytes'] / 1024:6.0f} KiB {time.time() - t0:5.1f}s {st}",
                        flush=True,
                    )
                else:
                    manifest["skipped"].append(skip)
                    print(f"{fname:44s} SKIPPED ({skip['stage']}): {skip['reason']}", flush=True)
                man_path.write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
