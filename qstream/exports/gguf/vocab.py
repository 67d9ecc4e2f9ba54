"""A model's tokenizer as GGUF metadata, the keys and values llama.cpp's converter
(``convert_hf_to_gguf.py``) writes for it: :func:`tokenizer_items`.

Two kinds, chosen per architecture as the converter chooses them (:func:`tokenizer_kind`):

- **SentencePiece** (``tokenizer.ggml.model`` ``llama``, Llama-2 style, from
  ``tokenizer.model``): pieces, scores and types from the SentencePiece model, the added
  tokens of ``added_tokens.json`` and ``tokenizer_config.json`` over them, padded to the
  config's ``vocab_size`` with ``[PAD{i}]``;
- **byte-level BPE** (``gpt2``: GPT-2, Llama-3, Qwen2 ... from ``tokenizer.json``): the
  vocabulary by id (added tokens typed CONTROL or USER_DEFINED), the merges, and the
  pre-tokenizer's name (``tokenizer.ggml.pre``), known by the hash of the token ids of a
  fixed text (:mod:`qstream.exports.gguf.pretokenizers`); a hash the converter does not know
  is refused, as it refuses it.

Then the special tokens (bos/eos/unk/sep/pad/mask ids, ``add_bos_token`` ...) and the chat
template, read from ``tokenizer.json``, ``tokenizer_config.json``, ``config.json`` and
``chat_template.jinja`` as gguf-py's ``SpecialVocab`` reads them (:mod:`.gguf_special`).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from ...errors import InvalidParameterError
from .items import (
    ARRAY,
    BOOL,
    BYTE,
    CONTROL,
    FLOAT32,
    INT32,
    NORMAL,
    STRING,
    UNKNOWN,
    UNUSED,
    USER_DEFINED,
    MetaItem,
    read_json,
)
from .pretokenizers import CHECK_TEXT, PRE_TOKENIZERS

_SPACE_MARK = "\u2581"  # SentencePiece's word boundary


def _optional_json(path: Path) -> Any:
    return read_json(path) if path.is_file() else None


def tokenizer_kind(folder: str | os.PathLike[str], arch: str) -> str:
    """``sentencepiece`` or ``bpe``: the tokenizer llama.cpp's converter writes for the model
    in ``folder`` of GGUF architecture ``arch``; refused when it would not convert it."""
    root = Path(folder)
    has_sp = (root / "tokenizer.model").is_file()
    has_json = (root / "tokenizer.json").is_file()
    config = _optional_json(root / "tokenizer_config.json") or {}
    if arch == "phi3" and config.get("tokenizer_class") == "GPT2Tokenizer":
        return "bpe"
    if arch in ("phi3", "gemma2"):
        if not has_sp:
            raise InvalidParameterError(
                f"{root}: a {arch} model needs its SentencePiece tokenizer.model to be converted"
                " to GGUF (export with --no-tokenizer for tensors only)"
            )
        return "sentencepiece"
    if has_sp and arch in ("llama", "qwen2", "qwen3", "gemma3"):
        return "sentencepiece"
    if not has_json:
        raise InvalidParameterError(
            f"{root}: no tokenizer.json or tokenizer.model, so no tokenizer to write; export"
            " with --no-tokenizer for tensors only (llama.cpp will not load that file)"
        )
    if arch == "llama":
        model = read_json(root / "tokenizer.json").get("model") or {}
        llama3 = model.get("type") == "BPE" and model.get("ignore_merges", False)
        if model.get("type") == "BPE" and model.get("byte_fallback") and not llama3:
            raise InvalidParameterError(
                f"{root}: a Llama tokenizer.json of SentencePiece-style BPE (byte fallback)"
                " without its tokenizer.model is not supported yet; add tokenizer.model"
            )
    return "bpe"


# --- SentencePiece -------------------------------------------------------------------------


def looks_special(text: str) -> bool:
    """Whether an added token that is not marked special is one by its look (<|...|>, <pad>,
    <unused...>, as the converter decides)."""
    return (
        text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (text.startswith("<|") and text.endswith("|>"))
        or (text.startswith("<\uff5c") and text.endswith("\uff5c>"))
        or (text.startswith("<unused") and text.endswith(">"))
    )


def _vocab_size(hparams: dict[str, Any], fallback: int) -> int:
    for key in ("vocab_size_per_layer_input", "vocab_size"):
        if key in hparams and hparams[key] is not None:
            return int(hparams[key])
    return fallback


def sentencepiece_vocab(
    folder: Path, hparams: dict[str, Any], phi3: bool = False
) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and types of the SentencePiece model in ``folder`` (``phi3``: that
    converter's own variant: added tokens of tokenizer.json too, typed by ``special`` only)."""
    try:
        from sentencepiece import SentencePieceProcessor
    except ImportError:
        raise InvalidParameterError(
            "a SentencePiece tokenizer needs the sentencepiece package: pip install sentencepiece"
        ) from None
    sp = SentencePieceProcessor()
    sp.LoadFromFile(str(folder / "tokenizer.model"))
    n_sp = sp.vocab_size()
    size = int(hparams.get("vocab_size") or n_sp) if phi3 else _vocab_size(hparams, n_sp)
    tokens = [f"[PAD{i}]" for i in range(size)]
    scores = [-10000.0] * size
    types = [UNUSED] * size
    for i in range(min(n_sp, size)):
        tokens[i] = sp.IdToPiece(i)
        scores[i] = sp.GetScore(i)
        types[i] = (
            UNKNOWN if sp.IsUnknown(i) else CONTROL if sp.IsControl(i)
            else UNUSED if sp.IsUnused(i) else BYTE if sp.IsByte(i) else NORMAL
        )  # fmt: skip

    def put(i: int, text: str, kind: int) -> None:
        tokens[i], scores[i], types[i] = text, -1000.0, kind

    added = _optional_json(folder / "added_tokens.json") or {}
    for text, i in added.items():
        if i < size:
            put(i, text, USER_DEFINED)
    decoder = (_optional_json(folder / "tokenizer_config.json") or {}).get(
        "added_tokens_decoder", {}
    )
    for key, data in decoder.items():
        i, text = int(key), data["content"]
        if i >= size:
            continue
        if phi3:
            put(i, text, CONTROL if data.get("special") else USER_DEFINED)
        elif data.get("special") or looks_special(text):
            put(i, text, CONTROL)
        else:
            put(i, text.replace(_SPACE_MARK, " "), USER_DEFINED)
    if phi3:
        for data in (_optional_json(folder / "tokenizer.json") or {}).get("added_tokens", []):
            put(int(data["id"]), data["content"], CONTROL if data.get("special") else USER_DEFINED)
    return tokens, scores, types


# --- byte-level BPE ------------------------------------------------------------------------


def _load_tokenizer(folder: Path) -> Any:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise InvalidParameterError(
            "a tokenizer.json needs the tokenizers package: pip install tokenizers"
        ) from None
    try:
        return Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as e:  # (the library raises its own exception types)
        raise InvalidParameterError(f"{folder / 'tokenizer.json'}: cannot load it ({e})") from None


def pre_tokenizer(folder: Path, tokenizer: Any = None) -> str:
    """The name llama.cpp gives the pre-tokenizer of ``folder``'s tokenizer.json (the hash of
    the ids of :data:`CHECK_TEXT`); refused when the converter would not know it."""
    tok = tokenizer if tokenizer is not None else _load_tokenizer(folder)
    ids = tok.encode(CHECK_TEXT, add_special_tokens=True).ids
    digest = hashlib.sha256(str(ids).encode()).hexdigest()
    name = PRE_TOKENIZERS.get(digest)
    if name is None:
        raise InvalidParameterError(
            f"{folder / 'tokenizer.json'}: a BPE pre-tokenizer llama.cpp does not know (hash"
            f" {digest}); llama.cpp's converter refuses it too (its get_vocab_base_pre)"
        )
    return name


def bpe_vocab(folder: Path, hparams: dict[str, Any]) -> tuple[list[str], list[int], str]:
    """Tokens and types of ``folder``'s byte-level BPE tokenizer.json, and its pre-tokenizer
    name (see :func:`pre_tokenizer`)."""
    tok = _load_tokenizer(folder)
    vocab: dict[str, int] = tok.get_vocab(with_added_tokens=True)
    size = int(hparams.get("vocab_size") or len(vocab))
    if vocab and max(vocab.values()) >= size:
        raise InvalidParameterError(
            f"{folder / 'tokenizer.json'}: token id {max(vocab.values())} is not below"
            f" config.json's vocab_size {size}"
        )
    pre = pre_tokenizer(folder, tok)
    added: dict[int, Any] = {i: t for i, t in tok.get_added_tokens_decoder().items()}
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [UNUSED] * size
    for text, i in vocab.items():
        tokens[i], types[i] = text, NORMAL
    for i, at in added.items():
        text = at.content
        if not at.normalized:  # (llama.cpp takes added tokens as normalized: round-trip them)
            text = tok.decode(tok.encode(text, add_special_tokens=False).ids,
                              skip_special_tokens=False)  # fmt: skip
        if at.special or looks_special(text):
            tokens[i], types[i] = text, CONTROL
        else:
            tokens[i], types[i] = text.replace(_SPACE_MARK, " "), USER_DEFINED
    return tokens, types, pre


# --- the items ----------------------------------------------------------------------------


def tokenizer_items(
    folder: str | os.PathLike[str], arch: str, hparams: dict[str, Any] | None = None
) -> list[MetaItem]:
    """The ``tokenizer.*`` keys llama.cpp's converter writes for the model in ``folder`` of
    GGUF architecture ``arch`` (config ``hparams``: its config.json when None), in its order;
    refused (:class:`InvalidParameterError`) before any tensor work when it would not convert
    the tokenizer."""
    from .special import special_items

    root = Path(folder)
    if hparams is None:
        hparams = _optional_json(root / "config.json") or {}
    kind = tokenizer_kind(root, arch)
    items: list[MetaItem] = []
    config = _optional_json(root / "tokenizer_config.json") or {}
    if arch == "llama" and isinstance(config.get("add_prefix_space"), bool):
        items.append(MetaItem("tokenizer.ggml.add_space_prefix", BOOL, config["add_prefix_space"]))
    if kind == "sentencepiece":
        tokens, scores, types = sentencepiece_vocab(root, hparams, phi3=arch == "phi3")
        items += [
            MetaItem("tokenizer.ggml.model", STRING, "llama"),
            MetaItem("tokenizer.ggml.pre", STRING, "default"),
            MetaItem("tokenizer.ggml.tokens", ARRAY, tokens, STRING),
            MetaItem("tokenizer.ggml.scores", ARRAY, scores, FLOAT32),
            MetaItem("tokenizer.ggml.token_type", ARRAY, types, INT32),
        ]
        items += special_items(root, n_vocab=len(tokens), load_merges=False)
    else:
        tokens, types, pre = bpe_vocab(root, hparams)
        items += [
            MetaItem("tokenizer.ggml.model", STRING, "gpt2"),
            MetaItem("tokenizer.ggml.pre", STRING, pre),
            MetaItem("tokenizer.ggml.tokens", ARRAY, tokens, STRING),
            MetaItem("tokenizer.ggml.token_type", ARRAY, types, INT32),
        ]
        items += special_items(root, n_vocab=None, load_merges=True)
    if arch in ("gemma2", "gemma3") and kind == "sentencepiece":
        items.append(MetaItem("tokenizer.ggml.add_space_prefix", BOOL, False))
    return items
