"""Importance-matrix files as llama.cpp writes and reads them: :func:`write_imatrix` (the
GGUF-based file of current ``llama-imatrix``), :func:`read_imatrix` (that file, or the legacy
``.dat`` one) and :func:`importance_weights` / :func:`weights_for` (the per-column weights
``llama-quantize --imatrix`` hands to its quantizer).

The GGUF file (``tools/imatrix/imatrix.cpp``, ``save_imatrix``): GGUF version 3, alignment 32,
keys ``general.type = "imatrix"``, ``imatrix.datasets`` (array of strings),
``imatrix.chunk_count`` and ``imatrix.chunk_size`` (uint32); then, per weight in sorted name
order, two F32 tensors ``<name>.in_sum2`` (ggml ``ne = [columns, matrices]``: the sums of
squared inputs per column, one row per expert) and ``<name>.counts`` (``ne = [1, matrices]``:
the tokens seen per matrix, as floats). ggml writes a dimension of 1 at the end as absent,
so a dense weight's tensors are 1-D.

The legacy ``.dat`` (``save_imatrix_legacy``): int32 entry count; per entry an int32 name
length, the name, int32 ``ncall``, int32 value count and the float32 values
``sum / count * ncall``; optionally an int32 chunk count and an int32-length dataset name.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from ...errors import InvalidParameterError, StoreError

ALIGNMENT = 32
_GGUF_U32, _GGUF_STRING, _GGUF_ARRAY, _F32 = 4, 8, 9, 0
SUMS, COUNTS = ".in_sum2", ".counts"


@dataclass
class Imatrix:
    """An importance matrix: per GGUF weight name, ``sums`` (float32, ``(matrices, columns)``;
    a legacy file: ``(1, values)`` holding ``sum / count * ncall``) and ``counts`` (int64,
    ``(matrices,)``; legacy: ``[ncall]``), with the file's datasets and chunk figures."""

    sums: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, np.ndarray] = field(default_factory=dict)
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    chunk_size: int = 0
    legacy: bool = False


def _string(s: str) -> bytes:
    raw = s.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _pad(n: int) -> int:
    return (-n) % ALIGNMENT


def imatrix_bytes(
    entries: Mapping[str, tuple[np.ndarray, np.ndarray]],
    datasets: Iterable[str],
    chunk_count: int,
    chunk_size: int,
) -> bytes:
    """The GGUF imatrix file of ``entries`` (name -> (sums ``(matrices, columns)``, counts
    ``(matrices,)``)), byte for byte as ``llama-imatrix`` writes it."""
    for key, v in (("imatrix.chunk_count", chunk_count), ("imatrix.chunk_size", chunk_size)):
        if not 0 <= v < 1 << 32:
            raise InvalidParameterError(f"{key} must be in 0..2**32-1, got {v}")
    sets = list(datasets)
    kv = [
        _string("general.type") + struct.pack("<I", _GGUF_STRING) + _string("imatrix"),
        _string("imatrix.datasets")
        + struct.pack("<IIQ", _GGUF_ARRAY, _GGUF_STRING, len(sets))
        + b"".join(_string(s) for s in sets),
        _string("imatrix.chunk_count") + struct.pack("<II", _GGUF_U32, chunk_count),
        _string("imatrix.chunk_size") + struct.pack("<II", _GGUF_U32, chunk_size),
    ]
    infos: list[bytes] = []
    data: list[bytes] = []
    offset = 0
    for name in sorted(entries):
        sums, counts = entries[name]
        sums = np.ascontiguousarray(sums, dtype="<f4")
        counts = np.asarray(counts, dtype=np.float64).astype("<f4")
        if sums.ndim != 2 or counts.shape != (sums.shape[0],) or sums.size == 0:
            raise InvalidParameterError(
                f"imatrix entry {name}: sums must be (matrices, columns) and counts (matrices,),"
                f" got {sums.shape} and {counts.shape}"
            )
        for suffix, arr, ne in (
            (SUMS, sums, (sums.shape[1], sums.shape[0])),
            (COUNTS, counts, (1, counts.shape[0])),
        ):
            dims = ne if ne[1] > 1 else ne[:1]  # (ggml_n_dims: trailing 1s are dropped)
            infos.append(
                _string(name + suffix)
                + struct.pack(f"<I{len(dims)}Q", len(dims), *dims)
                + struct.pack("<IQ", _F32, offset)
            )
            raw = arr.tobytes()
            data.append(raw + b"\0" * _pad(len(raw)))
            offset += len(raw) + _pad(len(raw))
    head = b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(kv)) + b"".join(kv) + b"".join(infos)
    return head + b"\0" * _pad(len(head)) + b"".join(data)


def write_imatrix(
    path: str | os.PathLike[str],
    entries: Mapping[str, tuple[np.ndarray, np.ndarray]],
    datasets: Iterable[str],
    chunk_count: int,
    chunk_size: int,
) -> None:
    """Write :func:`imatrix_bytes` to ``path`` (through a temporary file, renamed when whole)."""
    raw = imatrix_bytes(entries, datasets, chunk_count, chunk_size)
    p = os.fspath(path)
    tmp = f"{p}.partial-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(raw)
        os.replace(tmp, p)
    except OSError as e:
        raise StoreError(f"cannot write the imatrix file {p}: {e.strerror or e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_imatrix(path: str | os.PathLike[str]) -> Imatrix:
    """An imatrix file made by llama.cpp (or qstream): the GGUF-based one, else the legacy
    ``.dat``, as ``common_imatrix_load`` tells them apart; a malformed file is refused."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise StoreError(f"cannot read the imatrix file {p}: {e.strerror or e}") from None
    if raw[:4] == b"GGUF":
        return _read_gguf(p)
    return _read_legacy(p, raw)


def _read_gguf(p: str) -> Imatrix:
    from gguf import GGUFReader

    try:
        reader = GGUFReader(p)
    except (ValueError, struct.error, IndexError) as e:
        raise StoreError(f"imatrix file {p}: not a readable GGUF file ({e})") from None
    out = Imatrix()
    fields = reader.fields
    if "imatrix.datasets" in fields:
        f = fields["imatrix.datasets"]
        out.datasets = [bytes(f.parts[i]).decode("utf-8", "replace") for i in f.data]
    missing = [
        k for k in ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size")
        if k not in fields
    ]  # fmt: skip
    if missing:  # (llama-quantize: "missing imatrix metadata")
        raise StoreError(f"imatrix file {p}: missing imatrix metadata ({', '.join(missing)})")
    out.chunk_count = int(fields["imatrix.chunk_count"].parts[-1][0])
    out.chunk_size = int(fields["imatrix.chunk_size"].parts[-1][0])
    tensors: dict[str, dict[str, np.ndarray]] = {}
    for t in reader.tensors:
        for suffix in (SUMS, COUNTS):
            if t.name.endswith(suffix) and len(t.name) > len(suffix):
                if int(t.tensor_type) != _F32:
                    raise StoreError(f"imatrix file {p}: {t.name} must be F32")
                ne = [int(n) for n in t.shape]  # ggml order
                arr = np.asarray(t.data, dtype=np.float32).reshape(-1)
                rows = math.prod(ne[1:]) if len(ne) > 1 else 1
                tensors.setdefault(t.name[: -len(suffix)], {})[suffix] = arr.reshape(rows, -1)
    if not tensors:
        raise StoreError(f"imatrix file {p}: no data")
    for name, pair in sorted(tensors.items()):
        if len(pair) != 2:
            raise StoreError(f"imatrix file {p}: mismatched sums and counts for {name}")
        sums, counts = pair[SUMS], pair[COUNTS].reshape(-1)
        if sums.size % max(counts.size, 1):
            raise StoreError(
                f"imatrix file {p}: {name} has {sums.size} sums for {counts.size} counts"
            )
        out.sums[name] = sums.reshape(counts.size, -1)
        out.counts[name] = np.array([_lround(c) for c in counts], dtype=np.int64)
    return out


def _lround(x: float) -> int:
    """C's ``lround``: halves away from zero."""
    return int(math.copysign(math.floor(abs(float(x)) + 0.5), x))


def _read_legacy(p: str, raw: bytes) -> Imatrix:
    bad = StoreError(f"imatrix file {p}: neither GGUF nor a legacy imatrix (.dat) file")
    pos = 0

    def take(fmt: str) -> tuple[int, ...]:
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(raw):
            raise bad
        vals = struct.unpack_from(fmt, raw, pos)
        pos += size
        return vals

    (n,) = take("<i")
    if n < 1:
        raise bad
    out = Imatrix(legacy=True)
    for _ in range(n):
        (length,) = take("<i")
        if length < 0 or pos + length > len(raw):
            raise bad
        name = raw[pos : pos + length].split(b"\0", 1)[0].decode("utf-8", "replace")
        pos += length
        ncall, nval = take("<ii")
        if nval < 1 or pos + 4 * nval > len(raw):
            raise bad
        out.sums[name] = np.frombuffer(raw, "<f4", nval, pos).astype(np.float32).reshape(1, -1)
        out.counts[name] = np.array([ncall], dtype=np.int64)
        pos += 4 * nval
    if pos + 4 <= len(raw):
        (out.chunk_count,) = take("<i")
        if pos + 4 <= len(raw):
            (length,) = take("<i")
            if length > 0 and pos + length <= len(raw):
                out.datasets.append(raw[pos : pos + length].decode("utf-8", "replace"))
    return out


def importance_weights(imx: Imatrix) -> dict[str, np.ndarray]:
    """The weights ``llama-quantize`` derives from ``imx`` (``load_imatrix`` in
    ``tools/quantize``), per GGUF name, float32, flat: GGUF files ``sums / count`` per matrix
    (1 where a matrix saw no token), legacy files ``sums / ncall`` (the sums where ncall is
    0); a non-finite weight is refused, as llama-quantize does."""
    out: dict[str, np.ndarray] = {}
    for name, sums in imx.sums.items():
        counts = imx.counts[name]
        if imx.legacy:
            ncall = int(counts[0]) if counts.size else 0
            w = sums / np.float32(ncall) if ncall > 0 else sums.copy()
        else:
            c = counts.astype(np.float32)[:, None]
            with np.errstate(divide="ignore", invalid="ignore"):
                w = np.where(c > 0, sums / np.where(c > 0, c, np.float32(1)), np.float32(1))
        w = np.ascontiguousarray(w, dtype=np.float32).reshape(-1)
        if not np.isfinite(w).all():
            raise InvalidParameterError(f"imatrix entry {name} holds a non-finite value")
        out[name] = w
    return out


def weights_for(
    weights: Mapping[str, np.ndarray], name: str, shape: tuple[int, ...]
) -> np.ndarray | None:
    """The ``imatrix=`` argument of ``qstream.compat.gguf.quantize`` for the GGUF tensor
    ``name`` of ``shape`` (numpy order): ``(columns,)`` for a matrix, ``(experts, columns)``
    for a 3-D expert tensor; None when ``weights`` has no entry (llama-quantize then quantizes
    without one); an entry of another size is refused, as llama-quantize refuses it."""
    w = weights.get(name)
    if w is None:
        return None
    cols = shape[-1]
    mats = shape[0] if len(shape) == 3 else 1
    if w.size != cols * mats:
        raise InvalidParameterError(
            f"imatrix size {w.size} is different from tensor size {cols * mats} for {name}"
        )
    return w.reshape(mats, cols) if len(shape) == 3 else w.reshape(cols)
