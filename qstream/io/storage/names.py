"""Tensor names are data, never paths: the key a tensor is stored under inside a destination.

A checkpoint's tensor names come from files qstream does not trust (a safetensors header, a
zip's member list, a shard index, a converted output's metadata). Each name maps to a *key*:
one path component, made only of ``A-Z a-z 0-9 . _ -`` and ``%XX`` escapes of the name's
UTF-8 bytes (``%`` itself included), so the map is one to one and :func:`name_of` reverses
it. A key never starts with ``.`` (no ``.``, ``..``, hidden files or ``.zarray``) or ``_``
(room for qstream's own members), never ends in ``.partial`` (qstream's temporary files), is
never a Zarr document name or a Windows device name, and holds no ``/``: every tensor of a
converted checkpoint is a direct child of its root, whatever its name. Names of Hugging Face
checkpoints (``model.layers.0.mlp.up_proj.weight``) are their own keys.

A name longer than :data:`MAX_KEY` bytes once escaped is cut, with a digest of the whole name
appended after a ``~`` (which no escaped name contains); the name itself is kept in the
metadata. Names that hold control characters (NUL included) or lone surrogates, and empty
names, are refused: no checkpoint writer makes them.

:func:`check_key` is the other half: a key read back from an output's metadata must be one
:func:`tensor_key` could have made (outputs of earlier versions, whose keys were the names:
every ``/``-separated component a plain file name), or the output is refused as crafted.
"""

from __future__ import annotations

import hashlib
import re
import string
import unicodedata

from ...errors import StoreError

_SAFE = frozenset(string.ascii_letters + string.digits + "._-")
MAX_KEY = 160  # bytes of a key (file systems allow 255 per component)
# Zarr's document names and Windows' device names (with any extension)
_RESERVED = {"zarr.json", "con", "prn", "aux", "nul"} | {
    f"{dev}{i}" for dev in ("com", "lpt") for i in range(10)
}
_KEY = re.compile(r"(?:[A-Za-z0-9._-]|%[0-9A-F]{2})+(?:~[0-9a-f]{32})?")
_LEGACY_PART = re.compile(r"[^/\\\x00-\x1f\x7f]+")


def _escape(ch: str) -> str:
    return "".join(f"%{b:02X}" for b in ch.encode("utf-8"))


def check_name(name, where: str = "tensor name") -> str:
    """``name`` if it can be a tensor's name, else a :class:`StoreError` saying why."""
    if not isinstance(name, str):
        raise StoreError(f"{where} {name!r} is not a string")
    if not name:
        raise StoreError(f"{where} is empty")
    bad = next((c for c in name if unicodedata.category(c) in ("Cc", "Cs")), None)
    if bad is not None:
        what = "a lone surrogate" if unicodedata.category(bad) == "Cs" else "a control character"
        raise StoreError(
            f"{where} {_shown(name)} holds {what} (U+{ord(bad):04X}); no checkpoint writer makes"
            " such names: the file is damaged or crafted"
        )
    return name


_PLAIN = re.compile(r"[A-Za-z0-9-][A-Za-z0-9._-]{0,159}")  # its own key, unless reserved


def tensor_key(name: str) -> str:
    """The key (one path component) the tensor ``name`` is stored under (module docstring)."""
    if (
        type(name) is str
        and _PLAIN.fullmatch(name)
        and name.lower() not in _RESERVED
        and name.split(".", 1)[0].lower() not in _RESERVED
        and not name.lower().endswith(".partial")
    ):
        return name  # (the common case, e.g. model.layers.0.mlp.up_proj.weight)
    return escaped_key(name)


def escaped_key(name: str) -> str:
    """:func:`tensor_key` without its fast path (each rule applied in turn)."""
    check_name(name)
    key = "".join(c if c in _SAFE else _escape(c) for c in name)
    if key[0] in "._":
        key = _escape(key[0]) + key[1:]
    stem = key.split(".", 1)[0].lower()
    if key.lower() in _RESERVED or stem in _RESERVED:
        key = _escape(key[0]) + key[1:]
    if key.lower().endswith(".partial"):
        key = key[: -len(".partial")] + "%2Epartial"
    if len(key) > MAX_KEY:
        digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:32]
        cut = key[: MAX_KEY - 33]
        cut = cut[: len(cut) - 2] if "%" in cut[-2:] else cut  # never half an escape
        key = f"{cut}~{digest}"
    return key


def name_of(key: str) -> str:
    """The name a key of :func:`tensor_key` was made from (not for cut, ``~`` keys: their
    names are in the metadata)."""
    raw = bytearray()
    i = 0
    while i < len(key):
        if key[i] == "%":
            raw.append(int(key[i + 1 : i + 3], 16))
            i += 3
        else:
            raw += key[i].encode()
            i += 1
    return raw.decode("utf-8")


def check_key(key, where) -> str:
    """``key``, read from the metadata of the output ``where``, if it names a child of the
    output (a key :func:`tensor_key` makes, or an earlier version's name-as-path whose
    components are plain file names); else a :class:`StoreError`: the output is crafted."""
    if isinstance(key, str) and _KEY.fullmatch(key) and key[0] not in "._":
        return key
    parts = key.split("/") if isinstance(key, str) else [None]
    if all(
        isinstance(p, str) and _LEGACY_PART.fullmatch(p) and p not in (".", "..") for p in parts
    ) and not key.startswith("/"):
        return key
    raise StoreError(
        f"{where}: its metadata names a tensor at {_shown(key)}, which is not a path inside it;"
        " the output is damaged or crafted, and qstream will not read or write there"
    )


def _shown(text) -> str:
    """``text`` for a message: its repr, cut to 80 characters."""
    r = repr(text)
    return r if len(r) <= 80 else r[:77] + "..."
