"""A model's config.json for a GGUF export, read (:func:`read_config`) and, for Llama-style
models (``model_type`` llama / mistral), checked field by field before any work
(:func:`check_config`); names, transforms and keys are in :mod:`.model_map` and :mod:`.arch`."""

from __future__ import annotations

import json
import math
import os
import unicodedata
from typing import Any

import numpy as np

from ...errors import InvalidParameterError
from ...input_files import open_regular

_U32 = (1 << 32) - 1
_F32_MAX = float(np.finfo(np.float32).max)
MAX_TEXT = 256  # characters of a config string written into the file (model_type)


def is_llama(config: dict[str, Any] | None) -> bool:
    """Whether ``config`` is a Llama-style model's (``model_type`` llama or mistral)."""
    return bool(config) and str((config or {}).get("model_type", "")).lower() in (
        "llama",
        "mistral",
    )


# --- the model's config.json, checked before any work -----------------------------------

MAX_CONFIG = 100 << 20  # bytes of a config.json


def read_config(config: str | os.PathLike[str] | dict[str, Any] | None) -> dict[str, Any] | None:
    """The model configuration ``config`` (a dict, or the path of its JSON file), or
    :class:`InvalidParameterError` naming the file and what is wrong with it."""
    if config is None:
        return None
    if isinstance(config, dict):
        return config
    path = os.fspath(config)
    try:
        with open_regular(path, "config") as f:
            raw = f.read(MAX_CONFIG + 1)
    except OSError as e:
        raise InvalidParameterError(f"{path}: cannot read the model config ({e})") from None
    if len(raw) > MAX_CONFIG:
        raise InvalidParameterError(f"{path}: a model config larger than {MAX_CONFIG} bytes")
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise InvalidParameterError(f"{path}: the model config is nested too deeply") from None
    except ValueError as e:  # (UnicodeDecodeError included)
        raise InvalidParameterError(f"{path}: the model config is not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise InvalidParameterError(
            f"{path}: the model config holds a JSON {_json_kind(doc)}, not an object"
        )
    return doc


def _json_kind(v: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), "number"
    )


def check_config(cfg: Any, where: str = "config") -> None:
    """Check every field of the model config ``cfg`` (read from ``where``) that a GGUF
    export reads: its presence, type and range, before any work; an
    :class:`InvalidParameterError` names the field and the file."""
    if cfg is None:
        return
    if not isinstance(cfg, dict):
        raise InvalidParameterError(f"{where}: a model config is a JSON object, got {cfg!r:.80}")

    def bad(key: str, want: str, value: Any, missing: bool = False) -> InvalidParameterError:
        shown = "nothing (it is missing)" if missing else json.dumps(value, default=repr)[:80]
        return InvalidParameterError(
            f"{where}: {key} must be {want}, got {shown}; fix the model's config.json (or pass"
            " --config another one)"
        )

    kind = cfg.get("model_type")
    if kind is not None:
        if not isinstance(kind, str) or not kind or len(kind) > MAX_TEXT:
            raise bad("model_type", f"a non-empty string of at most {MAX_TEXT} characters", kind)
        if any(unicodedata.category(c) in ("Cc", "Cs") for c in kind):
            raise bad("model_type", "text without control characters or lone surrogates", kind)
    if not is_llama(cfg):
        return

    def integer(key: str, required: bool = True, hi: int = _U32) -> int | None:
        """The integer field ``key`` in 1..hi (None: absent or null and not required)."""
        v = cfg.get(key)
        if v is None and not required:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
            raise bad(key, f"an integer in 1..{hi}", v, missing=key not in cfg)
        return v

    def number(key: str, v: Any) -> None:
        """A float32 field: finite and > 0."""
        if (
            isinstance(v, bool)
            or not isinstance(v, int | float)
            or not math.isfinite(v)
            or not 0 < v <= _F32_MAX
        ):
            raise bad(key, "a finite number > 0 (a float32)", v)

    heads = integer("num_attention_heads") or 1
    kv = integer("num_key_value_heads", required=False, hi=heads)
    if kv is not None and heads % kv:
        raise bad("num_key_value_heads", f"a divisor of num_attention_heads ({heads})", kv)
    hidden = integer("hidden_size") or 1
    for key in ("num_hidden_layers", "intermediate_size", "vocab_size"):
        integer(key)
    integer("max_position_embeddings", required=False)
    if integer("head_dim", required=False) is None and hidden < heads:
        raise bad("hidden_size", f"at least num_attention_heads ({heads})", hidden)
    if cfg.get("rope_theta") is not None:
        number("rope_theta", cfg["rope_theta"])
    else:
        rope = cfg.get("rope_parameters")
        if rope is not None and not isinstance(rope, dict):
            raise bad("rope_parameters", "an object (or absent)", rope)
        if rope and rope.get("rope_theta") is not None:
            number("rope_parameters.rope_theta", rope["rope_theta"])
    if cfg.get("rms_norm_eps") is not None:
        number("rms_norm_eps", cfg["rms_norm_eps"])
