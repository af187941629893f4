#!/usr/bin/env python
"""Export tiny sliding-window decoders (Mistral, Mistral with a KV cache, Gemma2, Phi-3, Qwen2,
GPT-Neo) with both exporters and both attention implementations, through generate.py's export
and checks, into a folder outside the zoo (issue 22 item 1: every sliding-window export must be
proved is_causal + window). Needs torch and transformers (not the project's venv).

    python models/sliding_window_exports.py /tmp/sw_exports
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generate as g  # noqa: E402

WINDOW = 4  # keys a query sees, itself included: smaller than every checked sequence length
# what the Mistral, Qwen2, Gemma2 and Phi-3 configs share: 2 layers of 4 query heads over 64 hidden
# units, a window of WINDOW keys, token 0 for bos, eos and padding
DECODER = {
    "vocab_size": g.VOCAB,
    "hidden_size": 64,
    "intermediate_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 128,
    "sliding_window": WINDOW,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "pad_token_id": 0,
    "initializer_range": g.INIT_STD,
}


def _wrapped(model_class, cfg, attn_impl, cache=False):
    """The model of cfg with attn_impl, its constant parameters perturbed, wrapped for export."""
    g._set_impl(cfg, attn_impl)
    model = g._perturb_constant_params(model_class(cfg))
    return g.CacheDecoderWrapper(model) if cache else g.EncoderWrapper(model)


def _mistral(attn_impl, cache=False):
    from transformers import MistralConfig, MistralModel

    cfg = MistralConfig(**DECODER, num_key_value_heads=2, use_cache=cache)
    return _wrapped(MistralModel, cfg, attn_impl, cache)


def _qwen2(attn_impl):
    from transformers import Qwen2Config, Qwen2Model

    cfg = Qwen2Config(
        **DECODER,
        num_key_value_heads=1,
        use_sliding_window=True,
        max_window_layers=0,
        layer_types=["sliding_attention", "sliding_attention"],
        use_cache=False,
    )
    return _wrapped(Qwen2Model, cfg, attn_impl)


def _gemma2(attn_impl):
    from transformers import Gemma2Config, Gemma2Model

    # layer 0 sliding, layer 1 global (Gemma2's alternation); soft caps on the scores
    cfg = Gemma2Config(**DECODER, num_key_value_heads=2, head_dim=16, use_cache=False)
    return _wrapped(Gemma2Model, cfg, attn_impl)


def _phi3(attn_impl):
    from transformers import Phi3Config, Phi3Model

    cfg = Phi3Config(**DECODER, num_key_value_heads=2, use_cache=False)
    return _wrapped(Phi3Model, cfg, attn_impl)


def _gpt_neo(attn_impl):
    from transformers import GPTNeoConfig, GPTNeoModel

    cfg = GPTNeoConfig(
        vocab_size=g.VOCAB,
        max_position_embeddings=128,
        hidden_size=64,
        num_layers=2,
        attention_types=[[["local"], 2]],
        num_heads=2,
        intermediate_size=16,
        window_size=WINDOW,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
        initializer_range=g.INIT_STD,
    )
    return _wrapped(GPTNeoModel, cfg, attn_impl)


def _prefill(name, build, heads, kv_heads, head_dim, notes):
    return g.Arch(
        name,
        build,
        [g._tok("input_ids", "input_ids"), g._mask()],
        ["last_hidden_state"],
        heads,
        kv_heads,
        head_dim,
        True,
        notes,
        block_kinds={"causal_self": 2},
    )


ARCHS = [
    _prefill("mistral_window", _mistral, 4, 2, 16, f"Mistral, sliding_window {WINDOW}"),
    g._cache_arch(
        "mistral_window_cache",
        lambda impl: _mistral(impl, cache=True),
        4,
        2,
        16,
        f"Mistral decoder, sliding_window {WINDOW}",
    ),
    _prefill("qwen2_window", _qwen2, 4, 1, 16, f"Qwen2, use_sliding_window, window {WINDOW} on both layers"),
    _prefill("gemma2_window", _gemma2, 4, 2, 16, f"Gemma2, layer 0 sliding (window {WINDOW}), layer 1 global"),
    _prefill("phi3_window", _phi3, 4, 2, 16, f"Phi-3, sliding_window {WINDOW}"),
    _prefill("gpt_neo_window", _gpt_neo, 2, 2, 32, f"GPT-Neo, both layers local (window_size {WINDOW})"),
]


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else "/tmp/sw_exports")
    out.mkdir(parents=True, exist_ok=True)
    only = set(argv[1:])
    entries, skipped = [], []
    for arch in ARCHS:
        if only and arch.name not in only:
            continue
        for impl in ("eager",) if arch.name.startswith("gpt_neo") else ("eager", "sdpa"):
            for exporter in ("torchscript", "dynamo"):
                entry, skip = g.export_one(arch, impl, exporter, out, print)
                if entry:
                    entries.append(entry)
                    print(entry["file"], "ok" if entry["check"]["ok"] else entry["check"].get("reason"))
                else:
                    skipped.append(skip)
                    print("SKIPPED", skip)
    (out / "manifest.json").write_text(json.dumps({"models": entries, "skipped": skipped}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
