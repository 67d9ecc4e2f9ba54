"""qstream's GGUF files run in llama.cpp (llama-cpp-python) as llama.cpp's own converter's do:
for tiny models (random weights, real tokenizers) saved in float32 and bfloat16, qstream's
``--gguf-type Q8_0`` file and the converter's ``--outtype q8_0`` file hold the same tensors
(names, types, shapes, bytes) and metadata; llama.cpp loads qstream's file, tokenizes as
transformers does, gives the same logits, and chats with the model's template."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.support.gguf_models import (
    TENSORS,
    build_model,
    load_llama,
    read_gguf_keys,
    read_gguf_tensors,
    run_converter,
)

#: (architecture, tokenizer, source dtype) of each tiny model run
CASES = [
    ("llama", "sentencepiece", "float32"),
    ("llama", "llama3", "bfloat16"),
    ("qwen2", "qwen2", "bfloat16"),
    ("mixtral", "sentencepiece", "float32"),
    ("mistral", "sentencepiece", "bfloat16"),
    ("qwen3", "gpt2", "float32"),
    ("gemma2", "sentencepiece", "float32"),
    ("gemma3", "sentencepiece", "bfloat16"),
    ("phi3", "sentencepiece", "float32"),
    ("qwen2moe", "gpt2", "float32"),
    ("qwen3moe", "gpt2", "bfloat16"),
]
#: the cases the default run keeps (SentencePiece and BPE, f32 and bf16, dense and MoE); the
#: others run with ``pytest -m slow``
QUICK = {CASES[0], CASES[1], CASES[10]}
PARAMS = [
    pytest.param(*c, id="-".join(c), marks=() if c in QUICK else pytest.mark.slow) for c in CASES
]
TEXT = "Hello world, the quick brown fox 12345!"
#: keys only one of the two files has by design: the file's name, qstream's provenance
OWN_KEYS = {"general.name", "qstream.export", "qstream.sqnr_db"}


def llama_cpp() -> Any:
    """The llama_cpp module; missing: the test fails under CI=true, is skipped otherwise (and
    on Python >= 3.12, whose test extras leave it out, as torch)."""
    if sys.version_info >= (3, 12):
        pytest.importorskip("llama_cpp", reason="not in the Python >= 3.12 test extras")
    try:
        import llama_cpp as module
    except ImportError as e:
        why = f"llama-cpp-python is not installed ({e}); the test extras install it"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(why)
        pytest.skip(why)
    return module


def cli(*args: Any) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A case's model folder, qstream's Q8_0 file and the converter's, made once each."""
    llama_cpp()
    pytest.importorskip("torch")  # (the tiny models and the converter need it)
    root = tmp_path_factory.mktemp("gguf_run")
    done: dict[tuple[str, str, str], tuple[Path, Path, Path]] = {}

    def get(arch: str, tok: str, dtype: str) -> tuple[Path, Path, Path]:
        key = (arch, tok, dtype)
        if key not in done:
            folder = build_model(root / "-".join(key), arch, tok, dtype=dtype)
            t0 = time.perf_counter()
            ref = run_converter(folder, root / f"{'-'.join(key)}-ref.gguf", "q8_0")
            t1 = time.perf_counter()
            mine = root / f"{'-'.join(key)}-qstream.gguf"
            r = cli("convert", folder, mine, "--gguf-type", "Q8_0", "-q")
            assert r.exit_code == 0, r.output
            print(f"{key}: converter {t1 - t0:.1f} s, qstream {time.perf_counter() - t1:.1f} s")
            done[key] = folder, mine, ref
        return done[key]

    return get


@pytest.mark.parametrize(("arch", "tok", "dtype"), PARAMS)
def test_tensors_and_metadata_equal_the_converters_q8_0_file(
    arch: str, tok: str, dtype: str, files: Any
) -> None:
    _, mine, ref = files(arch, tok, dtype)
    got, want = read_gguf_tensors(mine), read_gguf_tensors(ref)
    assert sorted(got) == sorted(want)
    for name, (kind, shape, raw) in want.items():
        assert got[name][:2] == (kind, shape), name
        assert got[name][2] == raw, f"{name}: bytes differ"
    assert any(k == "F32" for k, _, _ in got.values())  # (norms F32 for bf16 sources too)
    keys, ref_keys = read_gguf_keys(mine), read_gguf_keys(ref)
    for k in (keys, ref_keys):
        k.pop(TENSORS)
    assert set(keys) - OWN_KEYS == set(ref_keys) - OWN_KEYS
    for key, value in ref_keys.items():
        if key not in OWN_KEYS:
            assert keys[key] == value, key


def _tokens_and_logits(llama_cpp: Any, path: Path) -> tuple[list[int], np.ndarray, Any]:
    llm = load_llama(llama_cpp, path, n_ctx=64, logits_all=True, verbose=False)
    tokens = llm.tokenize(TEXT.encode(), add_bos=True, special=False)
    llm.eval(tokens)
    return tokens, np.array(llm.scores[: len(tokens)]), llm


@pytest.mark.parametrize(("arch", "tok", "dtype"), PARAMS)
def test_llama_cpp_runs_qstreams_file_as_the_converters(
    arch: str, tok: str, dtype: str, files: Any
) -> None:
    from transformers import AutoTokenizer

    lib = llama_cpp()
    folder, mine, ref = files(arch, tok, dtype)
    tokens, logits, llm = _tokens_and_logits(lib, mine)
    assert tokens == AutoTokenizer.from_pretrained(str(folder))(TEXT)["input_ids"]
    ref_tokens, ref_logits, _ = _tokens_and_logits(lib, ref)
    assert tokens == ref_tokens
    assert np.isfinite(logits).all()
    np.testing.assert_array_equal(logits, ref_logits)
    template = json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template")
    template = template or (folder / "chat_template.jinja").read_text()
    assert llm.metadata["tokenizer.chat_template"] == template
    llm.reset()
    out = llm.create_chat_completion(
        messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0.0
    )
    assert out["choices"][0]["message"]["role"] == "assistant"
    assert out["usage"]["prompt_tokens"] > len(lib.Llama.tokenize(llm, b"Hi", add_bos=False))


def test_no_tokenizer_writes_tensors_only_and_says_llama_cpp_will_not_load_it(
    files: Any, tmp_path: Path
) -> None:
    lib = llama_cpp()
    folder, mine, _ = files(*CASES[0])
    out = tmp_path / "bare.gguf"
    r = cli("convert", folder, out, "--gguf-type", "Q8_0", "--no-tokenizer")
    assert r.exit_code == 0, r.output
    assert "llama.cpp will not load it" in r.output
    keys = read_gguf_keys(out)
    assert not [k for k in keys if k.startswith("tokenizer.")]
    assert keys[TENSORS] == read_gguf_keys(mine)[TENSORS]
    with pytest.raises(ValueError):
        load_llama(lib, out, n_ctx=64, verbose=False)
