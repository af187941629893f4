"""Float16 exports as Hugging Face transformers writes them (issue 33 item 18): tiny random-weight
models cast with ``.half()``, eager attention, TorchScript exporter, opset 17. Their causal masks
are ``where(causal, 0, finfo(float16).min)``: -65504 right of the frontier.

    /work/zooenv/bin/python tests/data/float16/make_models.py   # torch 2.13, transformers 5.24

- bart_f16_eager_torchscript.onnx: BART without a decoder mask: the decoder's self-attention mask is
  causal with a padding part of ones (a ConstantOfShape), so every row keeps its diagonal key.
- llama_f16_eager_torchscript.onnx: Llama with ``attention_mask``: causal + padding, where a row
  whose visible keys are all padded is where the graph and the op differ.
- llama_f16_no_mask_dynamo.onnx: Llama without ``attention_mask``, dynamo exporter (opset 18, one
  layer): transformers builds the causal mask from the position ids (j's position <= i's, and a
  packed-sequence test, equal CumSums of the position breaks), which graph/'s reader does not read
  yet. ``python make_models.py llama_f16_no_mask_dynamo.onnx`` writes only that one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import BartConfig, BartForConditionalGeneration, LlamaConfig, LlamaForCausalLM

HERE = Path(__file__).resolve().parent


class Logits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        names = ("input_ids", "attention_mask", "decoder_input_ids")
        given = dict(zip(names, inputs)) if len(inputs) == 3 else dict(zip(names[:2], inputs))
        return self.model(**given, use_cache=False).logits


def export(model: torch.nn.Module, inputs: dict[str, torch.Tensor], axes: dict[str, dict[int, str]], name: str) -> None:
    model.config._attn_implementation = "eager"
    torch.onnx.export(
        Logits(model.half().eval()),
        tuple(inputs.values()),
        HERE / name,
        input_names=list(inputs),
        output_names=["logits"],
        dynamic_axes=axes,
        opset_version=17,
        dynamo=False,
    )
    print(f"{name}: written")


class NoMaskLogits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def export_llama_no_mask_dynamo(name: str) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(config).half().eval()
    model.config._attn_implementation = "eager"
    batch, seq = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("seq", min=2, max=64)
    torch.onnx.export(
        NoMaskLogits(model),
        (torch.randint(3, 100, (2, 16)),),
        HERE / name,
        input_names=["input_ids"],
        output_names=["logits"],
        dynamic_shapes={"input_ids": {0: batch, 1: seq}},
        opset_version=18,
        dynamo=True,
        external_data=False,
    )
    print(f"{name}: written")


def main() -> None:
    torch.manual_seed(0)
    ids, mask = torch.randint(3, 100, (2, 16)), torch.ones(2, 16, dtype=torch.int64)
    encoder = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    bart = BartConfig(
        vocab_size=100,
        d_model=32,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
    )
    dec = torch.randint(3, 100, (2, 12))
    export(
        BartForConditionalGeneration(bart),
        {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec},
        encoder | {"decoder_input_ids": {0: "batch", 1: "tgt"}},
        "bart_f16_eager_torchscript.onnx",
    )
    llama = LlamaConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    export(
        LlamaForCausalLM(llama), {"input_ids": ids, "attention_mask": mask}, encoder, "llama_f16_eager_torchscript.onnx"
    )


if __name__ == "__main__":
    if sys.argv[1:] == ["llama_f16_no_mask_dynamo.onnx"]:
        export_llama_no_mask_dynamo(sys.argv[1])
    else:
        main()
        export_llama_no_mask_dynamo("llama_f16_no_mask_dynamo.onnx")
