"""An importance matrix from activation dumps, the way llama-imatrix would collect it.

Run: python samples/imatrix_example.py [WORKDIR]

1. builds a tiny random Llama with transformers and saves it as a Hugging Face folder;
2. runs it on a few sentences (random token ids) with a forward hook on every Linear, and
   stores each Linear's input in a Zarr group, one array per module (tokens x in_features);
3. computes the importance matrix out of core with ``compute_imatrix``: a GGUF imatrix file
   that ``llama-quantize --imatrix`` reads.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
import zarr

import qstream as qs


def main(work: Path) -> None:
    """Make the model, dump its activations, write ``work/model.imatrix``."""
    model_dir = work / "model"
    config = transformers.LlamaConfig(
        hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=400, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(str(model_dir))

    captured: dict[str, list[np.ndarray]] = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(
                lambda _m, inputs, _out, name=name: captured.setdefault(name, []).append(
                    inputs[0].reshape(-1, inputs[0].shape[-1]).float().numpy()
                )
            )
    with torch.no_grad():
        for length in (40, 64, 51):  # a few "sentences"
            model(torch.randint(3, 400, (1, length)))
    group = zarr.open_group(str(work / "acts.zarr"), mode="w")
    for name, parts in captured.items():
        x = np.concatenate(parts)
        group.create_array(name, data=x, chunks=(64, x.shape[1]))

    summary = qs.compute_imatrix(
        work / "acts.zarr", model_dir, work / "model.imatrix", chunk_size=64, max_memory=64 << 20
    )
    print(f"{summary.path}: {len(summary.entries)} weights, {summary.tokens} tokens,")
    print(f"  {summary.chunk_count} chunks of {summary.chunk_size}; left out: {summary.left_out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="imatrix-")))
