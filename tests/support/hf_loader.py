"""Run in a fresh process (no qstream import): build a tiny Llama, or load an export with
transformers (through compressed-tensors) and compare its weights and logits with the
dequantized weights qstream gave (an .npz), printing one JSON line."""

from __future__ import annotations

import json
import sys

import numpy as np
import torch


def build(folder: str, hidden: int) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        tie_word_embeddings=False,
        dtype="float32",
    )
    LlamaForCausalLM(config).save_pretrained(folder)


def load(folder: str, expected: str, dequantize: bool) -> dict:
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    kw = {}
    if dequantize:
        from transformers import CompressedTensorsConfig

        kw["quantization_config"] = CompressedTensorsConfig(dequantize=True)
    model = AutoModelForCausalLM.from_pretrained(folder, **kw)
    ids = torch.arange(32)[None] % model.config.vocab_size
    with torch.no_grad():
        logits = model(ids).logits  # the first forward decompresses
    want = dict(np.load(expected))
    state = model.state_dict()
    exact = [
        n
        for n, w in want.items()
        if np.array_equal(state[n].numpy().view(np.uint32), w.view(np.uint32))
    ]
    # the same model with qstream's dequantized weights, plain float32
    plain = LlamaForCausalLM(
        model.config.__class__.from_dict(
            {k: v for k, v in model.config.to_dict().items() if k != "quantization_config"}
        )
    )
    sd = {k: v.clone() for k, v in state.items()}
    sd.update({n: torch.from_numpy(w) for n, w in want.items()})
    plain.load_state_dict(sd, strict=False)
    with torch.no_grad():
        ref = plain(ids).logits
    return {
        "quantized": len(want),
        "bit_exact": len(exact),
        "logits_equal": bool(torch.equal(logits, ref)),
        "max_weight": float(max(state[n].abs().max() for n in want)),
    }


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(sys.argv[2], int(sys.argv[3]))
        print(json.dumps({"built": sys.argv[2]}))
    else:
        print(json.dumps(load(sys.argv[2], sys.argv[3], sys.argv[4:] == ["--dequantize"])))
