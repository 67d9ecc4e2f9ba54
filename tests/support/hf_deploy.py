"""Run in a fresh process (no qstream import): build a tiny Llama folder as the Hub ships one
(weights, config, a real byte-level BPE tokenizer with a chat template, a generation
config), or load an export folder as a user deploys it (``AutoModelForCausalLM`` and
``AutoTokenizer`` on the folder alone) and compare its effective weights and logits with
qstream's dequantized values (an .npz), printing one JSON line."""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
TEXT = [
    "the quick brown fox jumps over the lazy dog",
    "a tiny model with a real tokenizer, saved as the hub ships one",
    "hello world, hello tokenizer; quantized weights load in transformers",
]


def tokenizer(folder: str):
    """A byte-level BPE tokenizer trained on ``TEXT``, with a chat template, saved in ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<s>", "</s>", "<|user|>", "<|assistant|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(TEXT, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.chat_template = TEMPLATE
    fast.save_pretrained(folder)
    return fast


#: MoE model types: (config class, model class, config fields beside the common ones)
MOE = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4}),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", {
        "num_experts": 4, "moe_intermediate_size": 128, "shared_expert_intermediate_size": 128,
        "decoder_sparse_step": 1, "mlp_only_layers": []}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {
        "num_experts": 4, "moe_intermediate_size": 128, "head_dim": 32,
        "decoder_sparse_step": 1, "mlp_only_layers": []}),
}  # fmt: skip


def build(folder: str, hidden: int, tied: bool, dtype: str, arch: str = "llama") -> None:
    import transformers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    fast = tokenizer(folder)
    torch.manual_seed(0)
    fields = {
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": len(fast),
        "tie_word_embeddings": tied,
        "bos_token_id": fast.bos_token_id,
        "eos_token_id": fast.eos_token_id,
    }
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**fields))
    else:  # a MoE: two experts of four routed a token
        conf, cls, extra = MOE[arch]
        config = getattr(transformers, conf)(**fields, **extra, num_experts_per_tok=2)
        model = getattr(transformers, cls)(config)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(folder)
    GenerationConfig(
        max_new_tokens=4, do_sample=False, eos_token_id=fast.eos_token_id
    ).save_pretrained(folder)


def run(folder: str, dump: str, dtype: str) -> dict:
    """Load ``folder`` as a user deploys it, run a forward and ``generate``; save the effective
    state dict (after the first forward decompresses) and the logits to ``dump`` (a torch
    file); report the error instead when it does not load or run."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype))
        ids = tok(TEXT[0], return_tensors="pt")["input_ids"]
        with torch.no_grad():
            logits = model(ids).logits
            generated = model.generate(ids, max_new_tokens=4, do_sample=False)
    except Exception as e:  # the measurement: what a user sees
        return {"loads": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save({"state": state, "logits": logits}, dump)
    return {
        "loads": True,
        "generated": int(generated.shape[1] - ids.shape[1]),
        "dtype": str(next(model.parameters()).dtype),
        "finite": bool(torch.isfinite(logits).all()),
    }


def _bits(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy()
    return t.numpy().view(np.uint32 if t.dtype == torch.float32 else np.uint16)


def load(folder: str, expected: str, dtype: str) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    torch_dtype = getattr(torch, dtype)
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "hello world"}],
        add_generation_prompt=True,
        return_tensors="pt",
    )
    ids = ids["input_ids"] if not isinstance(ids, torch.Tensor) else ids
    with torch.no_grad():
        logits = model(ids).logits  # the first forward decompresses
        generated = model.generate(ids, max_new_tokens=4, do_sample=False)
    want = {n: torch.from_numpy(w).to(torch_dtype) for n, w in np.load(expected).items()}
    state = model.state_dict()
    exact = [n for n, w in want.items() if np.array_equal(_bits(state[n]), _bits(w))]
    config = {k: v for k, v in model.config.to_dict().items() if k != "quantization_config"}
    plain = LlamaForCausalLM(model.config.__class__.from_dict(config)).to(torch_dtype)
    sd = {k: v.clone() for k, v in state.items()}
    sd.update(want)
    plain.load_state_dict(sd, strict=False)
    with torch.no_grad():
        ref = plain(ids).logits
    return {
        "quantized": len(want),
        "bit_exact": len(exact),
        "differ": sorted(set(want) - set(exact))[:5],
        "logits_equal": bool(torch.equal(logits, ref)),
        "generated": int(generated.shape[1] - ids.shape[1]),
        "tied": bool(model.config.tie_word_embeddings),
        "dtype": str(next(model.parameters()).dtype),
        "text": tok.decode(generated[0]),
    }


if __name__ == "__main__":
    if sys.argv[1] == "build":
        arch = sys.argv[6] if len(sys.argv) > 6 else "llama"
        build(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "tied", sys.argv[5], arch)
        print(json.dumps({"built": sys.argv[2]}))
    elif sys.argv[1] == "run":
        print(json.dumps(run(sys.argv[2], sys.argv[3], sys.argv[4])))
    else:
        print(json.dumps(load(sys.argv[2], sys.argv[3], sys.argv[4])))
