"""Run in a fresh process (no qstream import): load compressed-tensors export folders as a user
does (``AutoModelForCausalLM.from_pretrained(folder, dtype=...)``) and compare each quantized
module's effective weight, bit for bit, with qstream's dequantized values (an .npz of float32
values, rounded to the load dtype by torch), and the logits with those of the float source
loaded the same way holding those values (``from_pretrained`` on both sides: the same
buffers, e.g. a float32 rotary table in a bfloat16 model). Prints one JSON list, a row per job.

    python scale_dtype_load.py SRC '[{"folder": ..., "npz": ..., "dtype": "bfloat16"}, ...]'
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch


def _bits(t: torch.Tensor) -> np.ndarray:
    t = t.detach().contiguous()
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32}[t.element_size()]).numpy()


def check(src: str, folder: str, npz: str, dtype: str) -> dict:
    """One export folder loaded in ``dtype`` against qstream's values in ``npz``."""
    from transformers import AutoModelForCausalLM

    torch_dtype = getattr(torch, dtype)
    ids = torch.tensor([[1, 5, 9, 20, 33, 64, 100, 7]])
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype)
    with torch.no_grad():
        logits = model(ids).logits  # (the first forward decompresses)
    want = {n: torch.from_numpy(w).to(torch_dtype) for n, w in np.load(npz).items()}
    state = model.state_dict()
    exact = [n for n, w in want.items() if np.array_equal(_bits(state[n]), _bits(w))]
    plain = AutoModelForCausalLM.from_pretrained(src, dtype=torch_dtype)
    plain.load_state_dict(want, strict=False)
    with torch.no_grad():
        ref = plain(ids).logits
    return {
        "quantized": len(want),
        "bit_exact": len(exact),
        "differ": sorted(set(want) - set(exact))[:5],
        "logits_equal": bool(torch.equal(logits, ref)),
        "dtype": str(next(model.parameters()).dtype),
    }


if __name__ == "__main__":
    jobs = json.loads(sys.argv[2])
    print(json.dumps([check(sys.argv[1], j["folder"], j["npz"], j["dtype"]) for j in jobs]))
