"""Tiny random-weight models (hidden 64, 2 layers) with real tokenizers, saved as Hugging Face
folders, for comparing qstream's GGUF metadata with llama.cpp's own converter.

Tokenizers are built locally, never downloaded: a SentencePiece BPE model trained here
(Llama-2 style, ``tokenizer.model`` beside a ``tokenizer.json``), and byte-level BPE
tokenizers rebuilt with ``tokenizers`` from the vocabularies llama.cpp vendors for its own
tokenizer tests (``models/ggml-vocab-{gpt-2,llama-bpe,qwen2}.gguf``: tokens and merges),
so that their pre-tokenizer is one the converter recognises by its hash.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

CONVERTER = "convert_hf_to_gguf.py"
DEFAULT_SRC = "/tmp/llsrc/llama_cpp_python-0.3.36/vendor/llama.cpp"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Hello world, this is a tiny tokenizer for tests 12345 and 678.",
    "Ünïcödé text, with punctuation! And numbers 3.14; quotes 'like' \"this\".",
] * 40
#: the pre-tokenizer regular expressions of the byte-level BPE tokenizers rebuilt here
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


LLAMA_CPP_PYTHON = "0.3.36"  # the llama-cpp-python whose sdist vendors the converter used
#: the parts of the sdist's vendor/llama.cpp the tests use (the converter and its vocabularies,
#: the imatrix loader with ggml's headers: tests/support/llama_imatrix.py)
_NEEDED = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "models/ggml-vocab-",
           "common/imatrix-loader.", "ggml/include/")  # fmt: skip
#: a file of each kind the tree must hold (an extraction of fewer parts is made again)
_MARKERS = (CONVERTER, "common/imatrix-loader.cpp", "ggml/include/ggml.h")


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "qstream-tests" / f"llama-cpp-python-{LLAMA_CPP_PYTHON}"


def fetch_llama_cpp_source() -> Path | None:
    """llama.cpp's converter from the llama-cpp-python sdist (``pip download --no-binary``),
    its ``vendor/llama.cpp`` parts extracted once into the user's cache; None when pip
    cannot fetch it (offline)."""
    import fcntl
    import subprocess
    import sys
    import tarfile

    root = _cache_root()
    tree = root / "llama.cpp"
    if all((tree / m).is_file() for m in _MARKERS):
        return tree
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:  # (xdist workers: one fetches, the others wait)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all((tree / m).is_file() for m in _MARKERS):
            return tree
        cmd = [sys.executable, "-m", "pip", "download", f"llama-cpp-python=={LLAMA_CPP_PYTHON}",
               "--no-binary", ":all:", "--no-deps", "-d", str(root)]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        sdists = sorted(root.glob("llama_cpp_python-*.tar.gz"))
        if done.returncode != 0 or not sdists:
            return None
        partial = root / f"llama.cpp.{os.getpid()}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
        with tarfile.open(sdists[0]) as tar:
            for m in tar.getmembers():
                rel = m.name[len(prefix) :] if m.name.startswith(prefix) else ""
                if rel.startswith(_NEEDED) and (m.isfile() or m.isdir()):
                    m.name = rel
                    tar.extract(m, partial, filter="data")
        shutil.rmtree(tree, ignore_errors=True)  # (an extraction cut short earlier)
        os.replace(partial, tree)
    return tree


def llama_cpp_root() -> Path | None:
    """The llama.cpp source tree holding the converter: under the installed ``llama_cpp``
    package's ``vendor`` folder, else ``$QSTREAM_LLAMA_CPP_SRC``, else :data:`DEFAULT_SRC`,
    else the sdist fetched into the user's cache (:func:`fetch_llama_cpp_source`)."""
    candidates: list[str] = []
    try:
        import importlib.util

        spec = importlib.util.find_spec("llama_cpp")
        if spec is not None and spec.origin:
            pkg = os.path.dirname(spec.origin)
            candidates += [os.path.join(pkg, "vendor", "llama.cpp"), os.path.join(pkg, "vendor")]
    except (ImportError, ValueError):
        pass
    if os.environ.get("QSTREAM_LLAMA_CPP_SRC"):
        candidates.append(os.environ["QSTREAM_LLAMA_CPP_SRC"])
    candidates.append(DEFAULT_SRC)
    for c in candidates:
        if all(os.path.isfile(os.path.join(c, m)) for m in _MARKERS):
            return Path(c)
    if os.environ.get("QSTREAM_LLAMA_CPP_SRC"):
        return None  # (the folder named is used, or nothing)
    return fetch_llama_cpp_source()


def llama_cpp_converter() -> Path:
    """The path of llama.cpp's ``convert_hf_to_gguf.py`` (see :func:`llama_cpp_root`); when
    absent, the calling test fails under ``CI=true`` and is skipped otherwise. The converter
    (and the tiny models it converts) need torch, which the Python 3.12 extras leave out:
    there the calling test is skipped."""
    pytest.importorskip("torch", reason="llama.cpp's converter needs torch (not on 3.12)")
    root = llama_cpp_root()
    if root is None:
        why = (
            f"llama.cpp's {CONVERTER} not found (installed llama_cpp vendor dir,"
            f" $QSTREAM_LLAMA_CPP_SRC, {DEFAULT_SRC}, the llama-cpp-python=={LLAMA_CPP_PYTHON}"
            f" sdist fetched into {_cache_root()})"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(why)
        pytest.skip(why)
    return root / CONVERTER


def load_llama(lib: Any, path: str | os.PathLike[str], **kw: Any) -> Any:
    """``lib.Llama`` (``lib``: the ``llama_cpp`` module) of the GGUF file ``path``, with
    llama.cpp's extra buffer types off (``use_extra_bufts``: its AMX and repacked weight
    layouts). llama-cpp-python built where the CPU has AMX (``pip`` builds it for the machine)
    crashes in ``ggml_backend_amx_mul_mat`` on the first batch of any Q8_0 model, the
    converter's own files as much as qstream's (seen on a 2-core Xeon VM with ``amx_int8``,
    2026-11-30). Every file a test compares is loaded this way, so their logits are compared
    under one computation as before."""
    raw = lib.llama_cpp
    default = raw.llama_model_default_params

    def params() -> Any:
        p = default()
        p.use_extra_bufts = False
        return p

    raw.llama_model_default_params = params  # (what Llama() asks for its model's parameters)
    try:
        return lib.Llama(model_path=str(path), **kw)
    finally:
        raw.llama_model_default_params = default


# --- a minimal GGUF key reader (the vocabularies; gguf-py's reader takes seconds) ---------

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}  # fmt: skip


TENSORS = "<tensors>"  # the entry of read_gguf_keys' answer holding the tensors


def read_gguf_keys(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The key-value pairs of the GGUF file ``path`` (strings decoded, arrays as lists) and,
    under :data:`TENSORS`, each tensor's (shape in numpy order, GGML type id)."""
    out, infos, _ = _parse_gguf(Path(path).read_bytes())
    out[TENSORS] = {name: (tuple(reversed(dims)), gtype) for name, dims, gtype, _ in infos}
    return out


def read_gguf_tensors(
    path: str | os.PathLike[str],
) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """Each tensor of the GGUF file ``path`` as gguf-py's reader gives it, ``(type name, shape
    in GGUF order, its bytes)``, in a fraction of the time (no field objects for the keys: a
    Llama-3 vocabulary is ~400k strings, ~8 s for gguf-py's reader)."""
    import gguf

    data = Path(path).read_bytes()
    keys, infos, end = _parse_gguf(data)
    align = int(keys.get("general.alignment", 32))
    start = -(-end // align) * align
    out = {}
    for name, dims, gtype, offset in infos:
        qtype = gguf.GGMLQuantizationType(gtype)
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        n = math.prod(dims)
        nbytes = n // block * size
        raw = data[start + offset : start + offset + nbytes]
        assert len(raw) == nbytes, f"{name}: the file ends inside the tensor"
        out[name] = (qtype.name, tuple(int(d) for d in dims), raw)
    return out


def _parse_gguf(
    data: bytes,
) -> tuple[dict[str, Any], list[tuple[str, tuple[int, ...], int, int]], int]:
    """The keys, the tensor infos ``(name, dims in GGUF order, type id, data offset)`` and the
    position where the tensor infos end."""
    assert data[:4] == b"GGUF", "not a GGUF file"
    pos = 24
    (n_kv,) = struct.unpack_from("<Q", data, 16)

    def string() -> str:
        nonlocal pos
        (n,) = struct.unpack_from("<Q", data, pos)
        s = data[pos + 8 : pos + 8 + n].decode("utf-8", "surrogateescape")
        pos += 8 + n
        return s

    def value(kind: int) -> Any:
        nonlocal pos
        if kind == 8:
            return string()
        if kind == 9:
            inner, count = struct.unpack_from("<IQ", data, pos)
            pos += 12
            if inner in _SCALARS:
                fmt = _SCALARS[inner]
                out = list(struct.unpack_from(f"<{count}{fmt[1]}", data, pos))
                pos += struct.calcsize(fmt) * count
                return out
            return [value(inner) for _ in range(count)]
        fmt = _SCALARS[kind]
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    keys: dict[str, Any] = {}
    for _ in range(n_kv):
        key = string()
        (kind,) = struct.unpack_from("<I", data, pos)
        pos += 4
        keys[key] = value(kind)
    infos = []
    for _ in range(struct.unpack_from("<Q", data, 8)[0]):
        name = string()
        (n_dims,) = struct.unpack_from("<I", data, pos)
        dims = struct.unpack_from(f"<{n_dims}Q", data, pos + 4)
        gtype, offset = struct.unpack_from("<IQ", data, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 12
        infos.append((name, tuple(dims), gtype, offset))
    return keys, infos, pos


# --- tokenizers ---------------------------------------------------------------------------


def sentencepiece_tokenizer(
    folder: Path, vocab_size: int = 400, *, gemma: bool = False, added: tuple[str, ...] = ()
) -> int:
    """Train a Llama-2 style SentencePiece BPE (byte fallback; <unk>, <s>, </s>) into
    ``folder``: ``tokenizer.model``, and transformers' ``tokenizer.json`` and config.
    ``gemma``: no space prefix, as Gemma's tokenizers (and llama.cpp's Gemma vocabulary);
    ``added``: special tokens added after the pieces (Phi-3's ``<|endoftext|>``, ...). Returns
    the vocabulary's size."""
    import sentencepiece as spm
    from transformers import AutoTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / "_sp"
    tmp.mkdir(exist_ok=True)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_CORPUS), model_prefix=str(tmp / "sp"), vocab_size=vocab_size,
        model_type="bpe", byte_fallback=True, character_coverage=1.0, unk_id=0, bos_id=1,
        eos_id=2, pad_id=-1, minloglevel=2, add_dummy_prefix=not gemma,
    )  # fmt: skip
    shutil.copy(tmp / "sp.model", folder / "tokenizer.model")
    kind = "GemmaTokenizer" if gemma else "LlamaTokenizer"
    config = {"tokenizer_class": kind, "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = AutoTokenizer.from_pretrained(str(folder))
    if added:
        tok.add_special_tokens({"additional_special_tokens": list(added)})
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(folder))
    shutil.rmtree(tmp)
    return len(tok)


def _vocab_file(name: str) -> Path:
    root = llama_cpp_root()
    if root is None:
        llama_cpp_converter()  # (fails or skips, naming what is missing)
    assert root is not None
    return root / "models" / f"ggml-vocab-{name}.gguf"


def bpe_tokenizer(folder: Path, kind: str) -> int:
    """Write the byte-level BPE tokenizer ``kind`` (``gpt2``, ``llama3``, ``qwen2``), rebuilt
    from llama.cpp's vocabulary file, into ``folder``; return its vocabulary size."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )
    from transformers import PreTrainedTokenizerFast

    name = {"gpt2": "gpt-2", "llama3": "llama-bpe", "qwen2": "qwen2"}[kind]
    keys = read_gguf_keys(_vocab_file(name))
    tokens, types = keys["tokenizer.ggml.tokens"], keys["tokenizer.ggml.token_type"]
    merges = [tuple(m.split(" ", 1)) for m in keys["tokenizer.ggml.merges"]]
    normal = {t: i for i, (t, ty) in enumerate(zip(tokens, types, strict=True)) if ty == 1}
    special = [(i, t) for i, (t, ty) in enumerate(zip(tokens, types, strict=True)) if ty == 3]
    bpe = models.BPE(vocab=normal, merges=merges, ignore_merges=kind == "llama3")
    tok = Tokenizer(bpe)
    if kind == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        split = _LLAMA3_SPLIT if kind == "llama3" else _QWEN2_SPLIT
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])  # fmt: skip
    if kind == "qwen2":
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for _, t in special])
    bos = eos = tokens[special[0][0]]
    if kind == "llama3":
        bos, eos = "<|begin_of_text|>", "<|end_of_text|>"
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1",
                special_tokens=[(bos, tokens.index(bos))],
            ),
        ])  # fmt: skip
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos)
    fast.chat_template = CHAT_TEMPLATE
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(folder))
    return len(tokens)


# --- models -------------------------------------------------------------------------------

#: the special tokens Phi-3's vocabulary adds (llama.cpp looks ``<|endoftext|>`` up by name)
PHI3_ADDED = ("<|endoftext|>", "<|assistant|>", "<|end|>", "<|user|>")
#: architecture -> (transformers config class, its model class, extra config fields)
_MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
ARCHS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 16, "sliding_window": 32}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"head_dim": 16, "sliding_window": 32}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"original_max_position_embeddings": 128,
                                               "pad_token_id": None}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4,
                                                         "num_experts_per_tok": 2}),
    "qwen2moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", {**_MOE,
                                                           "shared_expert_intermediate_size": 48,
                                                           "tie_word_embeddings": False}),
    "qwen3moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {**_MOE, "head_dim": 16}),
}  # fmt: skip


def build_model(
    folder: Path, arch: str, tokenizer: str, *, dtype: str = "float32", seed: int = 0
) -> Path:
    """Save a tiny random ``arch`` model (hidden 64, 2 layers, 4 heads, 2 kv heads) with the
    ``tokenizer`` (``sentencepiece``, ``gpt2``, ``llama3``, ``qwen2``) into ``folder``."""
    import torch
    import transformers

    if tokenizer == "sentencepiece":
        added = PHI3_ADDED if arch == "phi3" else ()
        vocab = sentencepiece_tokenizer(folder, gemma=arch.startswith("gemma"), added=added)
    else:
        vocab = bpe_tokenizer(folder, tokenizer)
    conf_name, model_name, extra = ARCHS[arch]
    fields: dict[str, Any] = {
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": vocab,
        "max_position_embeddings": 256, "tie_word_embeddings": vocab > 1000,
        **extra,
    }  # fmt: skip
    tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
    ids = {"bos_token_id": 1, "eos_token_id": 2} if tokenizer == "sentencepiece" else {}
    if not ids:
        spec = json.loads((folder / "tokenizer.json").read_text())
        by_text = {t["content"]: t["id"] for t in spec["added_tokens"]}
        ids = {"bos_token_id": by_text[tok_cfg["bos_token"]],
               "eos_token_id": by_text[tok_cfg["eos_token"]]}  # fmt: skip
    config = getattr(transformers, conf_name)(**fields, **ids)
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config)
    with torch.no_grad():
        for p in model.parameters():  # (norms too: a norm offset must show in the file)
            p.normal_(0.0, 0.05)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(str(folder))
    return folder


def run_converter(folder: Path, out: Path, outtype: str = "f32") -> Path:
    """Run llama.cpp's converter (its own gguf-py) on ``folder``, writing ``out``."""

    from . import fresh

    converter = llama_cpp_converter()
    env = {**os.environ, "PYTHONPATH": str(converter.parent / "gguf-py")}
    cmd = [converter, folder, "--outfile", out, "--outtype", outtype]
    done = fresh.run(cmd, env=env, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"converter failed on {folder}:\n{done.stderr[-3000:]}")
    return out
