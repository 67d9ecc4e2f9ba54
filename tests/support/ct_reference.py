"""compressed-tensors' own export of a checkpoint folder, run in a fresh process (no qstream
import): every quantized 2-D weight of the checkpoint (the tensors qstream's ``--scheme``
quantizes: Linear weights but embeddings, ``lm_head`` and router gates) becomes an
``nn.Linear`` at its checkpoint name, compressed-tensors 0.20's ``apply_quantization_config``
attaches the preset's scheme (``targets: ["Linear"]``, the kept modules ignored, as
llm-compressor's recipes write them), its ``calculate_qparams`` is fed the min and max
llm-compressor's min-max observer takes, and its ``ModelCompressor`` compresses the modules
and writes the config. Per-expert MoE weights are compressed at their checkpoint names
(``...experts.N.w1``), the layout an llm-compressor export ships.

    python ct_reference.py export SRC OUT SCHEME [keep-experts]
    -> prints {"tensors": n, "quantized": m}
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import torch

KEPT = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "lm_head.weight")
GATES = (".mlp.gate.weight", ".router.weight", ".gate.weight")


def quantized(name: str, t: torch.Tensor, keep_experts: bool = False) -> bool:
    """The tensors qstream's ``--scheme`` quantizes (its ``is_quantized``); with
    ``keep_experts``, MoE experts' weights are kept too (ignored, as a recipe ignoring
    ``re:.*experts.*`` keeps them)."""
    if keep_experts and ".experts." in name:
        return False
    return t.dim() == 2 and name.endswith("weight") and not name.endswith(KEPT + GATES)


def _observed(w: torch.Tensor, strategy: str, group: int, block: tuple[int, int]):
    """The min and max llm-compressor's min-max observer hands ``calculate_qparams``."""
    from compressed_tensors.quantization.utils import maybe_pad_tensor_for_block_quant

    if strategy == "tensor":
        return torch.aminmax(w)
    if strategy == "channel":
        return w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    if strategy == "block":
        p = maybe_pad_tensor_for_block_quant(w, tuple(block))
        b = p.reshape(p.shape[0] // block[0], block[0], p.shape[1] // block[1], block[1])
        return b.amin(dim=(1, 3)), b.amax(dim=(1, 3))
    g = w.reshape(w.shape[0], -1, group)
    return g.amin(dim=-1), g.amax(dim=-1)


def export(src: str, out: str, scheme_name: str, keep_experts: bool = False) -> dict:
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationStatus,
        apply_quantization_config,
        preset_name_to_scheme,
    )
    from compressed_tensors.quantization.utils import calculate_qparams
    from safetensors.torch import load_file, save_file

    state = load_file(os.path.join(src, "model.safetensors"))
    container = torch.nn.Module()
    names = [n for n, t in state.items() if quantized(n, t, keep_experts)]
    for name in names:
        parent = container
        *path, leaf = name[: -len(".weight")].split(".")
        for part in path:
            if not hasattr(parent, part):
                parent.add_module(part, torch.nn.Module())
            parent = getattr(parent, part)
        w = state[name]
        linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=w.dtype)
        linear.weight.data.copy_(w)
        parent.add_module(leaf, linear)
    scheme = preset_name_to_scheme(scheme_name, ["Linear"])
    kept = sorted(
        n[: -len(".weight")]
        for n, t in state.items()
        if t.dim() == 2
        and n.endswith("weight")
        and "embed" not in n
        and not quantized(n, t, keep_experts)
    )
    config = QuantizationConfig(
        config_groups={"group_0": scheme},
        ignore=kept,
        quantization_status=QuantizationStatus.INITIALIZED,
    )
    apply_quantization_config(container, config)
    args = scheme.weights
    for name in names:
        module = container.get_submodule(name[: -len(".weight")])
        w = module.weight.data
        strategy = {"tensor_group": "group"}.get(args.strategy, args.strategy)
        mn, mx = _observed(w, strategy, args.group_size or 0, args.block_structure or (128, 128))
        scale, zp = calculate_qparams(mn, mx, args)
        module.weight_scale.data = scale.to(module.weight_scale.dtype).reshape(
            module.weight_scale.shape
        )
        if hasattr(module, "weight_zero_point"):
            module.weight_zero_point.data = zp.to(module.weight_zero_point.dtype).reshape(
                module.weight_zero_point.shape
            )
    compressor = ModelCompressor.from_pretrained_model(container)
    compressor.compress_model(container)
    written = {n: t for n, t in state.items() if n not in names}
    written.update({n: t.contiguous() for n, t in container.state_dict().items()})
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(src):
        if f != "model.safetensors" and os.path.isfile(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), os.path.join(out, f))
    save_file(written, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    compressor.quantization_config.ignore = kept
    compressor.update_config(out)
    return {"tensors": len(written), "quantized": len(names)}


if __name__ == "__main__":
    keep = len(sys.argv) > 5 and sys.argv[5] == "keep-experts"
    print(json.dumps(export(sys.argv[2], sys.argv[3], sys.argv[4], keep)))
