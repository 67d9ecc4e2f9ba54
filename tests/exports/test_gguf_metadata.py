"""qstream's GGUF metadata (tokenizer, general and architecture keys, tensor names and plain
types) equals what llama.cpp's own converter writes, for a tiny model of each architecture."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qstream.compat.gguf_names import expert_of, gguf_name, plain_type, size_label, skipped
from qstream.errors import InvalidParameterError
from qstream.exports.gguf.arch import arch_items, architecture_of, general_items
from qstream.exports.gguf.items import ARRAY, FLOAT32, MetaItem
from qstream.exports.gguf.vocab import tokenizer_items
from tests.support.gguf_models import (
    TENSORS,
    build_model,
    llama_cpp_converter,
    read_gguf_keys,
    run_converter,
)

#: (architecture, tokenizer) of each tiny model compared
CASES = [
    ("llama", "sentencepiece"),
    ("llama", "llama3"),
    ("mistral", "sentencepiece"),
    ("qwen2", "qwen2"),
    ("qwen3", "gpt2"),
    ("gemma2", "sentencepiece"),
    ("gemma3", "sentencepiece"),
    ("phi3", "sentencepiece"),
    ("mixtral", "sentencepiece"),
    ("qwen2moe", "gpt2"),
    ("qwen3moe", "gpt2"),
]
QUICK = {"gemma2", "phi3"}
GGML = {0: "F32", 1: "F16", 30: "BF16"}
#: keys qstream leaves to the writer: the file's name and the quantization version
WRITER_KEYS = {"general.name", "general.quantization_version"}


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Build a case's model and convert it with llama.cpp's converter (f16), once each."""
    llama_cpp_converter()
    done: dict[tuple[str, str], tuple[Path, dict[str, Any]]] = {}
    root = tmp_path_factory.mktemp("gguf46")

    def get(arch: str, tok: str) -> tuple[Path, dict[str, Any]]:
        if (arch, tok) not in done:
            folder = build_model(root / f"{arch}-{tok}", arch, tok)
            t0 = time.perf_counter()
            out = run_converter(folder, root / f"{arch}-{tok}.gguf", "f16")
            print(f"converter {arch}/{tok}: {time.perf_counter() - t0:.1f} s")
            done[arch, tok] = folder, read_gguf_keys(out)
        return done[arch, tok]

    return get


def _f32(v: Any) -> Any:
    return struct.unpack("<f", struct.pack("<f", v))[0]


def _as_written(item: MetaItem) -> Any:
    """``item``'s value as a GGUF file holds it (float32 rounding)."""
    if item.type == FLOAT32:
        return _f32(item.value)
    if item.type == ARRAY and item.element == FLOAT32:
        return np.asarray(item.value, np.float32).tolist()
    return item.value


def _config(folder: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((folder / "config.json").read_text())
    return config


def _source_tensors(folder: Path) -> dict[str, list[int]]:
    with open(folder / "model.safetensors", "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {k: v["shape"] for k, v in header.items() if k != "__metadata__"}


def _mapped(arch: str, folder: Path, n_vocab: int) -> dict[str, tuple[int, ...]]:
    """The GGUF names and shapes qstream's maps give the source tensors (experts merged)."""
    out: dict[str, tuple[int, ...]] = {}
    counts: dict[str, int] = {}
    for hf, shape in _source_tensors(folder).items():
        if skipped(arch, hf):
            continue
        name = gguf_name(arch, hf)
        if expert_of(hf) is not None:
            counts[name] = counts.get(name, 0) + 1
            out[name] = (counts[name], *shape)
        elif arch == "gemma3" and hf == "model.embed_tokens.weight":
            out[name] = (min(n_vocab, shape[0]), *shape[1:])
        else:
            out[name] = tuple(shape)
    return out


@pytest.mark.parametrize(
    ("arch", "tok"),
    [
        # the default run keeps two the llama.cpp runs (test_gguf_llamacpp) do not
        pytest.param(a, t, id=f"{a}-{t}", marks=() if a in QUICK else pytest.mark.slow)
        for a, t in CASES
    ],
)
def test_metadata_equals_llama_cpp_converter(arch: str, tok: str, converted: Any) -> None:
    folder, ref = converted(arch, tok)
    gguf_arch = architecture_of(_config(folder))
    t0 = time.perf_counter()
    vocab = tokenizer_items(folder, gguf_arch)
    print(f"tokenizer items {arch}/{tok}: {time.perf_counter() - t0:.2f} s")
    n_vocab = len(next(i.value for i in vocab if i.key == "tokenizer.ggml.tokens"))
    tensors = _mapped(gguf_arch, folder, n_vocab)
    mine = general_items(gguf_arch, ref["general.name"], size_label(tensors.items()))
    mine += arch_items(_config(folder), "F16") + vocab
    got = {i.key: _as_written(i) for i in mine}
    expected = {k: v for k, v in ref.items() if k != TENSORS and k not in WRITER_KEYS}
    assert set(got) - WRITER_KEYS == set(expected)
    for key, value in expected.items():
        assert got[key] == value, key
    assert set(tensors) == set(ref[TENSORS])
    for name, (shape, gtype) in ref[TENSORS].items():
        assert tensors[name] == shape, name
        assert plain_type(name, shape, "F16") == GGML[gtype], name


def test_unsupported_architecture_is_refused_naming_the_supported_ones() -> None:
    with pytest.raises(InvalidParameterError, match=r"GPTNeoXForCausalLM.*LlamaForCausalLM"):
        architecture_of({"architectures": ["GPTNeoXForCausalLM"]})


@pytest.mark.parametrize(
    ("field", "value"),
    [("num_hidden_layers", 0), ("hidden_size", "64"), ("rms_norm_eps", float("nan")),
     ("num_attention_heads", None), ("rope_theta", -1.0)],
)  # fmt: skip
def test_a_bad_config_field_is_refused_naming_field_and_file(field: str, value: Any) -> None:
    config = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
              "intermediate_size": 96, "num_attention_heads": 4, "vocab_size": 400,
              "rms_norm_eps": 1e-6, "rope_theta": 1e4}  # fmt: skip
    config[field] = value
    with pytest.raises(InvalidParameterError, match=f"model/config.json: {field}"):
        arch_items(config, "F16", "model/config.json")


def test_an_unknown_bpe_pre_tokenizer_is_refused(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2}, merges=[("a", "b")]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 3}))
    with pytest.raises(InvalidParameterError, match=r"pre-tokenizer llama\.cpp does not know"):
        tokenizer_items(tmp_path, "qwen2")
