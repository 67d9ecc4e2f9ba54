"""Importance matrices (``llama-imatrix``'s statistics) from activation dumps in Zarr, out of
core: :func:`compute_imatrix`.

The dump is a Zarr group holding one array per Linear input, named by the Hugging Face module
whose input it holds (``model.layers.0.self_attn.q_proj``), shaped tokens x in_features; an
MoE expert's array (``model.layers.0.mlp.experts.3.gate_proj``) holds the tokens routed to
that expert. For each array: per column the sum of the squared inputs, and the token count.

Arithmetic: each value is squared in float64 (exact for float32 and narrower inputs) and the
squares are added in token order in float64 by NumPy (:func:`add_squares`), block by block,
the running sum carried into the next block. The result is one sequential sum whatever the
blocks are (``max_memory`` only changes their size), so every chunking writes the same file;
it is rounded to float32 once, on writing. llama.cpp adds the same squares in float32 in
token order, whose error is below ``n * 2**-24`` of the sum for ``n`` tokens; this sum's is
below ``n * 2**-53``.

Names become GGUF names as the GGUF export names the weights (:func:`gguf_name` of
``<module>.weight`` in the model's architecture); expert arrays of a layer and projection
fill the rows of one merged ``ffn_{gate,up,down}_exps`` entry, one count per expert (an
expert without an array, or without tokens, has count 0). ``lm_head`` (GGUF ``output``) is
left out unless ``include_output`` (as llama-imatrix without ``--process-output``). Every
array is checked before any is read: its name must map to a weight llama.cpp collects, its
width must equal the in_features of that weight in the model's safetensors headers.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...compat.gguf_names import expert_of, gguf_name, skipped
from ...errors import InvalidDTypeError, InvalidParameterError, NonFiniteInputError, StoreError
from ...io.checkpoints import open_checkpoint
from ...io.storage import chunk_files
from .arch import architecture_of
from .imatrix import write_imatrix

DEFAULT_MEMORY = 1 << 30
_FLOATS = ("float16", "float32", "float64", "bfloat16")
_F32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class ImatrixSummary:
    """What :func:`compute_imatrix` wrote: the file, its GGUF entry names, the arrays read,
    the most tokens any entry saw, the chunk figures written, and the arrays left out."""

    path: str
    entries: tuple[str, ...]
    arrays: int
    tokens: int
    chunk_count: int
    chunk_size: int
    left_out: tuple[str, ...]


@dataclass(frozen=True)
class _Source:
    """One activation array and where its sums go: GGUF entry, matrix row (expert), width."""

    key: str  # the array's path in the group
    module: str
    entry: str
    row: int
    matrices: int
    width: int


def square_sums(array: Any, max_memory: int = DEFAULT_MEMORY) -> tuple[np.ndarray, int]:
    """Per column of the 2-D array ``array`` (Zarr or NumPy), the float64 sum of squares in
    token order, and the token count; rows are read in blocks of at most a quarter of
    ``max_memory`` bytes (whole storage chunks where they fit), the next block read (in a
    thread) while this one is squared when two fit in that quarter. A local Zarr array's
    chunk files are read straight into two reused buffers (:func:`~qstream.io.storage.
    chunk_files`: no event loop, no fresh pages per read), other arrays through zarr."""
    rows, width = (int(n) for n in array.shape)
    block = _block_rows(array, max_memory, str(getattr(array, "path", "array")))
    acc = np.zeros(width, dtype=np.float64)
    per_row = width * max(4, np.dtype(array.dtype).itemsize)
    ahead = 2 * block * per_row <= max_memory // 4
    files = chunk_files(array)  # (None for NumPy, remote or sharded arrays: zarr reads)
    buffers = [] if files is None else [np.empty((block, width), files.dtype) for _ in range(2)]

    def read(start: int) -> np.ndarray:
        stop = min(start + block, rows)
        if files is not None:  # (the buffer the block before last was read into: free now)
            x = buffers[(start // block) % 2][: stop - start]
            files.read((slice(start, stop), slice(0, width)), x)
        else:
            x = np.asarray(array[start:stop])
        if x.dtype not in (np.float32, np.float64):  # (float16, bfloat16: exact in float32)
            x = x.astype(np.float32)
        return x

    starts = range(0, rows, block)
    for x in _read_ahead(read, starts) if ahead else map(read, starts):
        add_squares(x, acc)
        del x  # (at most two blocks held: this one's successor is being read)
    return acc, rows


def _read_ahead(read: Any, starts: Iterable[int]) -> Iterator[np.ndarray]:
    """``read(start)`` of each start in order, the next read running in a thread while the
    caller works on the values given (reading a Zarr array or a file leaves the GIL to
    NumPy's arithmetic); the caller drops each block before asking for the next, so two
    blocks are held at most."""
    it = iter(starts)
    first = next(it, None)
    if first is None:
        return
    with ThreadPoolExecutor(1, thread_name_prefix="qstream-imatrix-read") as pool:
        pending = pool.submit(read, first)
        for start in it:
            x = pending.result()
            pending = pool.submit(read, start)
            yield x
            del x
        yield pending.result()


#: values squared in float64 at once at most (two temporaries of 4 MiB)
SQUARE_VALUES = 1 << 19


def add_squares(x: np.ndarray, acc: np.ndarray) -> None:
    """``acc[j] += float64(x[i, j]) ** 2`` for each row ``i`` in order (the token order), in
    NumPy: its reduction of a C-ordered array along its first axis adds the rows one by one,
    so prepending ``acc`` as the first row gives exactly the running sum."""
    if x.shape[1] == 1:  # (a reduction along one contiguous run is pairwise: accumulate)
        run = np.empty(x.shape[0] + 1)
        run[0], run[1:] = acc[0], x[:, 0]
        np.multiply(run[1:], run[1:], out=run[1:])
        acc[0] = np.add.accumulate(run)[-1]
        return
    # (the float64 temporaries, two of them, take at most half of the block's own bytes)
    cols = max(1, x.shape[1])
    step = max(1, min(SQUARE_VALUES, x.size * x.itemsize // 32) // cols)
    rows = np.empty((min(step, x.shape[0]) + 1, x.shape[1]), np.float64)
    for r in range(0, x.shape[0], step):
        part = x[r : r + step]
        n = part.shape[0]
        rows[0] = acc
        squares = rows[1 : n + 1]
        squares[...] = part  # (a plain cast, then an in-place square: twice as fast as
        np.multiply(squares, squares, out=squares)  # a casting multiply; exact in float64)
        np.add.reduce(rows[: n + 1], axis=0, out=acc)


#: the bytes of a read at most (whole storage chunks when one is larger)
READ_BYTES = 16 << 20


def _block_rows(array: Any, max_memory: int, name: str) -> int:
    """Rows per read of ``array`` under ``max_memory``: the read values (and a float32 copy
    of narrower ones) fit in a quarter of it (Zarr holds the compressed and the decoded
    chunks of a read besides); a multiple of the storage chunk's rows when one fits. A
    storage chunk or a row over a quarter of the bound is refused."""
    width = int(array.shape[1])
    item = np.dtype(array.dtype).itemsize
    chunks = getattr(array, "chunks", None)
    if chunks is not None and math.prod(int(c) for c in chunks) * item > max_memory // 4:
        raise InvalidParameterError(
            f"{name}: a storage chunk {tuple(chunks)} of {math.prod(chunks) * item:,} bytes is"
            f" over a quarter of the memory bound {max_memory:,}; rechunk it along the tokens"
        )
    per_row = width * (item + (0 if item >= 4 else 4))
    rows = (max_memory // 4) // max(per_row, 1)
    # (reads of a few MiB reuse the memory they free: a read of hundreds of MiB at once
    # takes fresh pages, ~1.5x the time of a plain read in 8,192-row pieces)
    rows = min(rows, max(1, READ_BYTES // max(per_row, 1)))
    if rows < 1:
        raise InvalidParameterError(
            f"{name}: one row of {width} values needs {per_row:,} bytes, over a quarter of"
            f" the memory bound {max_memory:,}"
        )
    if chunks is not None:  # (whole storage chunks: each decoded once)
        c = int(chunks[0])
        rows = rows - rows % c if c <= rows else min(c, (max_memory // 4) // max(per_row, 1))
    return max(int(rows), 1)


def _weights(model: str) -> tuple[str, dict[str, tuple[int, ...]]]:
    """The GGUF architecture of the model folder ``model`` and its weights' shapes (headers
    only)."""
    cfg_path = os.path.join(model, "config.json")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            config = json.load(f)
    except FileNotFoundError:
        raise StoreError(f"{model}: no config.json (a Hugging Face model folder)") from None
    except (OSError, ValueError) as e:
        raise StoreError(f"{cfg_path}: not a readable JSON file ({e})") from None
    arch = architecture_of(config, cfg_path)
    shapes = {name: tuple(int(n) for n in t.shape) for name, t in open_checkpoint(model).items()}
    return arch, shapes


def _arrays(acts: str) -> dict[str, Any]:
    """The arrays of the Zarr group ``acts``, by member path with ``/`` read as ``.``."""
    import zarr

    try:
        group = zarr.open_group(acts, mode="r")
    except (FileNotFoundError, ValueError, TypeError, KeyError) as e:
        raise StoreError(f"{acts}: not a readable Zarr group ({e})") from None
    return {
        name.replace("/", "."): obj
        for name, obj in group.members(max_depth=None)
        if isinstance(obj, zarr.Array)
    }


def _plan(
    arrays: dict[str, Any], arch: str, shapes: dict[str, tuple[int, ...]], include_output: bool
) -> tuple[list[_Source], list[str]]:
    """Check every array (name, dtype, rank, width) before any is read: the sources to sum,
    and the arrays left out (``lm_head`` unless ``include_output``)."""
    sources: list[_Source] = []
    left_out: list[str] = []
    experts: dict[tuple[int, str], int] = {}
    for w in shapes:
        e = expert_of(w)
        if e is not None:
            experts[(e[0], e[2])] = max(experts.get((e[0], e[2]), 0), e[1] + 1)
    seen: dict[tuple[str, int], str] = {}
    for key in sorted(arrays):
        arr = arrays[key]
        hf = key + ".weight"
        try:
            entry = gguf_name(arch, hf)
        except InvalidParameterError:
            entry = ""
        if entry == "output.weight" and not include_output:
            left_out.append(key)
            continue
        if not (entry.startswith("blk.") or entry == "output.weight") or skipped(arch, hf):
            raise InvalidParameterError(
                f"{key}: not the input of a weight llama.cpp's {arch} model has"
                " (name it by its Hugging Face Linear module, e.g. model.layers.0.mlp.up_proj)"
            )
        dtype = np.dtype(arr.dtype)
        if dtype.name not in _FLOATS:
            raise InvalidDTypeError(f"{key}: activations must be floating, got {dtype}")
        if len(arr.shape) != 2:
            raise InvalidParameterError(
                f"{key}: activations must be tokens x in_features, got shape {tuple(arr.shape)}"
            )
        shape = shapes.get(hf)
        if shape is None or len(shape) != 2:
            what = "no such weight" if shape is None else f"a weight of shape {shape}"
            raise InvalidParameterError(f"{key}: {what} in the model, not a Linear's input")
        if int(arr.shape[1]) != shape[1]:
            raise InvalidParameterError(
                f"{key}: {arr.shape[1]} columns, but its weight {hf} has {shape[1]} in_features"
            )
        ex = expert_of(hf)
        if ex is None and int(arr.shape[0]) == 0:
            raise InvalidParameterError(f"{key}: no tokens (an empty activation array)")
        row, mats = (0, 1) if ex is None else (ex[1], experts[(ex[0], ex[2])])
        if (entry, row) in seen:
            raise InvalidParameterError(f"{key}: its weight {entry} is also {seen[entry, row]}'s")
        seen[(entry, row)] = key
        sources.append(_Source(key, key, entry, row, mats, shape[1]))
    return sources, left_out


def compute_imatrix(
    acts: str | os.PathLike[str],
    model: str | os.PathLike[str],
    out: str | os.PathLike[str],
    chunk_size: int = 512,
    *,
    include_output: bool = False,
    max_memory: int | None = None,
) -> ImatrixSummary:
    """Write the importance matrix of the activation dumps in the Zarr group ``acts`` for the
    Hugging Face model folder ``model`` (config.json and safetensors) to ``out``, in the
    GGUF-based format ``llama-quantize --imatrix`` reads: per weight, the sums of squared
    inputs per column and the token counts; ``imatrix.chunk_size`` = ``chunk_size`` tokens,
    ``imatrix.chunk_count`` = the most tokens any entry saw // ``chunk_size``,
    ``imatrix.datasets`` = [``acts``]. Memory is bounded by ``max_memory`` bytes (default
    1 GiB). Every array's name and width is checked before any is read; NaN or inf
    activations are refused, and nothing is written."""
    if not isinstance(chunk_size, int) or not 1 <= chunk_size < 1 << 32:
        raise InvalidParameterError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    bound = DEFAULT_MEMORY if max_memory is None else int(max_memory)
    if bound < 1:
        raise InvalidParameterError(f"max_memory must be a positive byte count, got {bound}")
    acts_s, model_s, out_s = os.fspath(acts), os.fspath(model), os.fspath(out)
    arch, shapes = _weights(model_s)
    arrays = _arrays(acts_s)
    sources, left_out = _plan(arrays, arch, shapes, include_output)
    if not sources:
        raise InvalidParameterError(f"{acts_s}: no activation array of a Linear input to sum")
    for s in sources:  # (each storage chunk and row checked against the bound before reading)
        _block_rows(arrays[s.key], bound, s.key)
    entries: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for s in sources:
        if s.entry not in entries:
            entries[s.entry] = (
                np.zeros((s.matrices, s.width), dtype=np.float64),
                np.zeros(s.matrices, dtype=np.int64),
            )
        sums, count = square_sums(arrays[s.key], bound)
        with np.errstate(over="ignore"):
            finite = np.isfinite(sums).all() and (sums <= _F32_MAX).all()
        if not finite:
            raise NonFiniteInputError(
                f"{s.key}: NaN or inf activations (or squares whose sum overflows float32)"
            )
        entries[s.entry][0][s.row] = sums
        entries[s.entry][1][s.row] = count
    tokens = max(int(c.max()) for _, c in entries.values())
    chunks = tokens // chunk_size
    write_imatrix(
        out_s,
        {k: (v[0].astype(np.float32), v[1]) for k, v in entries.items()},
        [acts_s],
        chunks,
        chunk_size,
    )
    return ImatrixSummary(
        out_s, tuple(sorted(entries)), len(sources), tokens, chunks, chunk_size, tuple(left_out)
    )
