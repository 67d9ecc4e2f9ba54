"""The files beside a model's weights that its loaders read (tokenizer, chat template,
generation and processor configs), copied beside a compressed-tensors export so that the
folder deploys as it is (``AutoTokenizer.from_pretrained(out)``, ``vllm serve out``).

A copy never replaces a file qstream did not write: a file already at the destination is
left alone when it holds the same bytes as the source's, replaced when its bytes are the ones
qstream recorded writing there (``qstream_export.files`` in the export's ``config.json``:
name -> SHA-256), and refused otherwise, naming it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Iterable
from typing import Any

from ..errors import StoreError
from ..input_files import kind_of
from ..io.checkpoints import CONFIG, read_json

#: the non-weight files a transformers / vLLM loader reads from a model folder
MODEL_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tiktoken.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
)


def source_folder(checkpoint: str | os.PathLike[str]) -> str | None:
    """The local folder a checkpoint's model files are in (a folder: itself; a file or an
    index: the folder beside it), or None for a URL."""
    path = os.fspath(checkpoint)
    if "://" in path and not path.startswith("file://"):
        return None
    path = os.path.expanduser(path.removeprefix("file://"))
    return path if os.path.isdir(path) else (os.path.dirname(path) or ".")


def find_model_files(checkpoint: str | os.PathLike[str]) -> list[str]:
    """The paths of the files of :data:`MODEL_FILES` beside the checkpoint (regular files)."""
    folder = source_folder(checkpoint)
    if folder is None:
        return []
    found = [os.path.join(folder, n) for n in MODEL_FILES]
    return [f for f in found if kind_of(f) == "file" and not os.path.islink(f)]


def digest(path: str) -> str:
    """The SHA-256 of the file ``path`` (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def plan_copies(
    files: Iterable[str], folder: str, recorded: dict[str, str] | None
) -> dict[str, str]:
    """Which of ``files`` to copy into ``folder`` (name -> source path): absent there, or
    there as qstream wrote it (its digest in ``recorded``); the same bytes already there are
    not copied again; anything else is refused with :class:`StoreError`, naming it."""
    todo: dict[str, str] = {}
    recorded = recorded or {}
    for src in files:
        name = os.path.basename(src)
        dst = os.path.join(folder, name)
        if os.path.abspath(dst) == os.path.abspath(src):
            continue  # (the export is written into its source's folder)
        kind = kind_of(dst) if not os.path.islink(dst) else "link"
        if kind is None:
            todo[name] = src
            continue
        mine = kind == "file" and digest(dst)
        if mine and mine == digest(src):
            continue
        if not mine or recorded.get(name) != mine:
            raise StoreError(
                f"{dst} exists and qstream did not write it; qstream never replaces what it did"
                f" not write, and the export copies the source's {name} there: remove it"
                " yourself, or export elsewhere"
            )
        todo[name] = src
    return todo


def files_to_copy(checkpoint: str | os.PathLike[str], out: str) -> list[str]:
    """The model files beside ``checkpoint`` an export to ``out`` copies; one in the way
    that qstream did not write is refused (:func:`plan_copies`, against the files the
    ``config.json`` beside ``out`` records, when qstream wrote it)."""
    found = find_model_files(checkpoint)
    folder = os.path.dirname(out) or "."
    doc = read_json(os.path.join(folder, CONFIG)) if found else None
    export = (doc or {}).get("qstream_export")
    recorded = export.get("files") if isinstance(export, dict) else None
    plan_copies(found, folder, recorded if isinstance(recorded, dict) else None)
    return found


def copy_files(todo: dict[str, str], folder: str) -> None:
    """Copy each ``name -> source`` of ``todo`` into ``folder`` (through a partial file,
    renamed into place)."""
    for name, src in todo.items():
        dst = os.path.join(folder, name)
        tmp = f"{dst}.{os.getpid()}.partial"
        try:
            shutil.copyfile(src, tmp)
            os.replace(tmp, dst)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise StoreError(f"cannot copy {src} to {dst}: {e.strerror or e}") from None


def manifest(files: Iterable[str]) -> dict[str, str]:
    """``name -> SHA-256`` of the source files an export copies (recorded in its config)."""
    return {os.path.basename(f): digest(f) for f in sorted(files)}


def same_config(path: str, doc: dict[str, Any], copied: dict[str, str]) -> bool:
    """Whether ``path`` is a config.json qstream wrote with the same content as ``doc`` and
    the same copied model files (two exports of one model into one folder share it)."""
    if kind_of(path) != "file":
        return False
    old = read_json(path)
    if old is None or not isinstance(old.get("qstream_export"), dict):
        return False
    files = old.pop("qstream_export").get("files") or {}
    return old == doc and files == copied


def recorded_files(path: str) -> dict[str, str]:
    """The model files (name -> SHA-256) a config.json qstream wrote says it copied."""
    if kind_of(path) != "file":
        return {}
    old = read_json(path) or {}
    export = old.get("qstream_export")
    files = export.get("files") if isinstance(export, dict) else None
    return {k: v for k, v in files.items() if isinstance(v, str)} if isinstance(files, dict) else {}
