"""A tiny float32 Llama and the activation dumps an importance matrix is computed from: every
Linear's input on a few random sequences (transformers forward hooks), one Zarr array per
module, named by the module (what ``qstream calibrate --imatrix`` reads)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def tiny_llama(folder: Path, *, hidden: int = 256, inter: int = 512, layers: int = 2) -> Path:
    """A float32 Llama (random weights, N(0, 0.05)) with a SentencePiece tokenizer, so that
    llama.cpp's converter takes it, saved into ``folder``."""
    import torch
    import transformers

    from .gguf_models import sentencepiece_tokenizer

    sentencepiece_tokenizer(folder)
    config = transformers.LlamaConfig(
        hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=400,
        max_position_embeddings=256, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.05)
    model.save_pretrained(str(folder))
    return folder


def dump_activations(
    model_dir: Path, out: Path, *, lengths: Sequence[int], chunk_rows: int
) -> dict[str, np.ndarray]:
    """Run the model on random sequences of ``lengths`` tokens, capture every Linear's input
    and store them in the Zarr group ``out`` (chunks of ``chunk_rows`` rows); return them."""
    import torch
    import transformers
    import zarr

    model = transformers.LlamaForCausalLM.from_pretrained(str(model_dir)).eval()
    captured: dict[str, list[np.ndarray]] = {}

    def hook(name: str) -> Any:
        def grab(_m: Any, inputs: tuple[Any, ...], _out: Any) -> None:
            x = inputs[0].detach().to(torch.float32)
            captured.setdefault(name, []).append(x.reshape(-1, x.shape[-1]).numpy())

        return grab

    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            m.register_forward_hook(hook(name))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for length in lengths:
            model(torch.randint(3, 400, (1, length), generator=gen))
    acts = {k: np.concatenate(v) for k, v in captured.items()}
    group = zarr.open_group(str(out), mode="w")
    for name, a in acts.items():
        group.create_array(name, data=a, chunks=(chunk_rows, a.shape[1]))
    return acts
