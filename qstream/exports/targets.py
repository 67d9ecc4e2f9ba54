"""The files a safetensors export writes over, and what it may replace.

qstream never replaces a file it did not write (whatever ``overwrite`` says); a finished
export of the same job is recognised by its last file (the index, or the only file), and the
shards of an interrupted one are written again. An earlier export's other form (one file
vs shards) is removed, never left beside the new one for a loader to read.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Iterator

from ..errors import DestinationBusyError, StoreError
from ..input_files import kind_of
from ..io.checkpoints import CONFIG, export_metadata, qstream_meta, read_json
from ..io.outputs import locked


@contextlib.contextmanager
def export_lock(out: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the lock of the folder the export ``out`` is written into (``.qstream-lock`` in
    it, as a conversion locks its destination: :func:`~qstream.io.outputs.destination.locked`) while
    the body writes. The folder is what exports share: a single-file and a sharded export of
    one ``out`` write ``out``, ``stem-0000K-of-0000N.safetensors`` and
    ``stem.safetensors.index.json`` and remove each other's form, and compressed-tensors
    exports share its ``config.json``; so one export at a time writes into a folder. A second
    one is refused with :class:`~qstream.errors.DestinationBusyError` naming ``out``; the
    thread holding the lock takes it again at once."""
    out = os.fspath(out)
    folder = os.path.dirname(out) or "."
    stack = contextlib.ExitStack()
    try:
        stack.enter_context(locked(folder))
    except DestinationBusyError:
        raise DestinationBusyError(
            f"{out} is being written by another qstream process (an export into {folder}: one"
            " at a time writes a folder, whose config.json, index and shards exports share);"
            " wait for it to finish, then run again"
        ) from None
    with stack:
        yield


def shard_pattern(out: str) -> re.Pattern[str]:
    """The names of the shard files an export to ``out`` may write (a compiled regex)."""
    stem = os.path.basename(out)[: -len(".safetensors")]
    return re.compile(re.escape(stem) + r"-\d{5}-of-\d{5}\.safetensors")


def written_by_qstream(path: str) -> bool:
    """Whether ``path`` (a safetensors file or an index) carries qstream's export metadata."""
    return export_metadata(path) is not None


def job_digest(job: str) -> str:
    """What an export records of its identity ``job``: its SHA-256, so that no local path
    the identity names (the source's, a config's) is written into the export."""
    return "sha256:" + hashlib.sha256(job.encode()).hexdigest()


def finished_export(out: str | os.PathLike[str], job: str) -> list[str] | None:
    """The files of a finished export to ``out`` that recorded the identity ``job`` (its
    last file, the index or the only file, exists and says so), else None."""
    out = os.fspath(out)
    job = job_digest(job)
    index = out[: -len(".safetensors")] + ".safetensors.index.json"
    if os.path.lexists(index):
        doc = read_json(index)
        meta = qstream_meta(doc.get("metadata") if doc else None)
        if doc is None or meta is None or meta.get("qstream_job") != job:
            return None
        wmap = doc.get("weight_map")
        names = sorted(set(wmap.values())) if isinstance(wmap, dict) else []
        if not all(isinstance(n, str) and shard_pattern(out).fullmatch(n) for n in names):
            return None  # not an index this export writes
        if meta.get("qstream_format") == "compressed-tensors":
            if not _config_describes(out):
                return None
            names.append(CONFIG)
        return [os.path.join(os.path.dirname(out), n) for n in names] + [index]
    found = export_metadata(out) if os.path.lexists(out) else None
    if found is None or found.get("qstream_job") != job:
        return None
    if found.get("qstream_format") != "compressed-tensors":
        return [out]
    return [out, os.path.join(os.path.dirname(out), CONFIG)] if _config_describes(out) else None


def _config_describes(out: str) -> bool:
    """Whether the ``config.json`` beside ``out`` is qstream's and does not record another
    export as the one it describes (one written before it recorded one describes ``out``)."""
    doc = read_json(os.path.join(os.path.dirname(out), CONFIG))
    export = (doc or {}).get("qstream_export")
    if not isinstance(export, dict):
        return False
    weights = export.get("weights")
    return not isinstance(weights, str) or weights == os.path.basename(out)


def check_targets(
    targets: list[str],
    replace: bool,
    marker: str | None = None,
    described: str | None = None,
    job: str | None = None,
) -> None:
    """Refuse an export over files qstream did not write (whatever ``overwrite`` says) and,
    unless ``replace``, over a finished export (its ``marker``, the last file it writes: the
    index or the only file; by default the last of ``targets``, exists). ``described``: the
    compressed-tensors export ``out`` whose ``config.json`` is written, which must not
    describe another export still in its folder (whatever ``replace`` says: a folder holds
    one model config, which loaders read for the weights beside it), unless one of the same
    ``job`` (its digest: the same config) wrote it."""
    if described is not None:
        _check_config_owner(described, job)
    marker = targets[-1] if marker is None else marker
    for f in targets:
        kind = kind_of(f)
        if kind is None:
            continue
        ours = kind == "file" and written_by_qstream(f)
        if not ours:  # never replaced, whatever ``overwrite`` says
            raise StoreError(
                f"{f} exists and is not a qstream export; qstream never replaces what it did"
                " not write (even with overwrite=True): remove it yourself or export elsewhere"
            )
        # the last file written (the index, or the only file) marks a finished export; shards
        # of an interrupted one (ours: they carry qstream's metadata) are written again
        if not (replace or f != marker):
            raise StoreError(f"{f} exists; pass overwrite=True to replace it")


_SHARD = re.compile(r".*-\d{5}-of-\d{5}\.safetensors")


def _exports_described(folder: str, export: dict[str, object]) -> list[str]:
    """The export file names (as given to the export) a ``config.json`` of ``folder`` that
    qstream wrote describes: the one it records, or (written before it recorded one) every
    compressed-tensors export of qstream's in the folder."""
    weights = export.get("weights")
    if isinstance(weights, str):
        return [os.path.basename(weights)]
    found = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    for n in names:
        if n.endswith(".safetensors.index.json"):
            doc = read_json(os.path.join(folder, n))
            meta = qstream_meta(doc.get("metadata") if doc else None)
            out = n[: -len(".index.json")]
        elif n.endswith(".safetensors") and not _SHARD.fullmatch(n):
            meta = export_metadata(os.path.join(folder, n))
            out = n
        else:
            continue
        if meta is not None and meta.get("qstream_format") == "compressed-tensors":
            found.append(out)
    return found


def _check_config_owner(out: str | os.PathLike[str], job: str | None) -> None:
    """Refuse a compressed-tensors export to ``out`` when the ``config.json`` beside it
    describes another export still in the folder (see :func:`check_targets`)."""
    out = os.fspath(out)
    folder = os.path.dirname(out) or "."
    config = os.path.join(folder, CONFIG)
    if kind_of(config) != "file":
        return
    export = (read_json(config) or {}).get("qstream_export")
    if not isinstance(export, dict) or (job is not None and export.get("job") == job):
        return  # (not qstream's: check_targets refuses it; or the same job's, the same config)
    for name in _exports_described(folder, export):
        if name == os.path.basename(out):
            continue
        other = os.path.join(folder, name)
        if os.path.lexists(other) or os.path.lexists(other + ".index.json"):
            raise StoreError(
                f"{config} describes the export {other}, still in that folder: a folder holds"
                f" one model config, so {out} would leave {name} described by another"
                f" quantization; export into a folder of its own (or remove {name}, its"
                " shards and index first)"
            )


def other_forms(out: str, index: str, targets: list[str], replace: bool) -> list[str]:
    """Files of an earlier export to ``out`` in the form this one does not write (its single
    file, its index, its shards): they must go, or a loader would read them (transformers
    prefers ``model.safetensors`` to an index). Only qstream's, only with ``replace`` (or
    shards no finished export lists); anything else is refused."""
    folder = os.path.dirname(out) or "."
    found = [f for f in (out, index) if f not in targets and kind_of(f) is not None]
    pattern = shard_pattern(out)
    try:
        names = [n for n in os.listdir(folder) if pattern.fullmatch(n)]
    except OSError:
        names = []
    found += [os.path.join(folder, n) for n in names if os.path.join(folder, n) not in targets]
    for f in found:
        if kind_of(f) != "file" or not written_by_qstream(f):
            raise StoreError(
                f"{f} exists and is not a qstream export; qstream never replaces what it did"
                " not write (even with overwrite=True): remove it yourself or export elsewhere"
            )
        finished = not re.search(r"-\d{5}-of-\d{5}\.safetensors$", f)  # a file or an index
        if finished and not replace:
            raise StoreError(f"{f} exists; pass overwrite=True to replace it")
    return found
