"""GGUF files as a checkpoint source: every tensor a lazy float32 tensor that reads and
decodes only the rows asked for, named back to Hugging Face names for known architectures.

:func:`open_gguf` parses and checks the header (:mod:`qstream.io.checkpoints.gguf_header`; a
crafted or
unsupported file is refused there, before any tensor is read) and returns one
:class:`GGUFTensor` per tensor: ``t[r0:r1]`` reads the bytes of rows ``r0:r1`` alone, by
positioned reads of the file (a map's pages would count as the process's memory), and decodes
them to float32 exactly as gguf-py's ``gguf.quants.dequantize`` (:mod:`qstream.compat.gguf`,
:mod:`qstream.compat.gguf_legacy`). A file at a URL (``s3://``, ``https://``, ...) is read the
same way, each region's bytes by one ranged request (its header: by ranges too).

With ``hf_names`` (the default), the tensors of a known architecture (llama, and Mistral or
Mixtral written as llama; qwen2, qwen3, qwen2moe, qwen3moe, gemma2, gemma3, phi3) take their
Hugging Face names, with llama.cpp's converter undone: the q/k row permutation of llama
(:func:`qstream.compat.gguf_names.row_order`) inverted head by head, Gemma's ``+1`` on norms
subtracted, and each ``ffn_*_exps`` 3-D tensor split into one 2-D tensor per expert (each
reads its own expert's rows only). Tensors of another architecture keep their GGUF names (a
:class:`~qstream.errors.QStreamWarning` says so). :func:`gguf_config` (in
:mod:`qstream.io.gguf_config`) rebuilds the model's config.json.
"""

from __future__ import annotations

import math
import re
import warnings
from typing import Any

import numpy as np

from ...compat import gguf as gguf_blocks
from ...compat import gguf_legacy
from ...compat.gguf_names import EXPERTS, LAYER_NAMES, row_order
from ...core import expand_key
from ...errors import QStreamWarning, StoreError
from .gguf_header import GGUFHeader, TensorInfo, read_header
from .remote import RangedTensor
from .tensor import Shaped, TensorLike, forward_key, read_file_run

F32 = np.dtype(np.float32)
#: GGUF architectures whose tensors are named back to Hugging Face names
KNOWN = tuple(LAYER_NAMES)
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def decode_rows(raw: np.ndarray, qtype: str, width: int) -> np.ndarray:
    """The float32 values of ``raw`` (uint8, ``[rows, row bytes]``) of GGUF type ``qtype``,
    ``[rows, width]``, as gguf-py's ``dequantize`` gives them."""
    # (scales of any bits decode as gguf-py's do, NaN and infinities included: no warnings)
    with np.errstate(invalid="ignore", over="ignore"):
        if qtype in gguf_legacy.TYPES:
            out = gguf_legacy.dequantize(raw, qtype)
        else:
            out = gguf_blocks.dequantize(raw, qtype)
    return np.asarray(out, dtype=F32).reshape(raw.shape[0], width)


def _axis0(
    key: Any, shape: tuple[int, ...]
) -> tuple[int, int, tuple[int | slice, ...], tuple[int, ...]]:
    """``(a, b, local key, axes to flip)``: the range ``a:b`` of the first axis that ``key``
    touches, and ``key`` on the block of those indices (read as a new first axis)."""
    fwd, flip = forward_key(expand_key(key, shape), shape)
    first = fwd[0]
    if isinstance(first, int):
        return first, first + 1, (0, *fwd[1:]), flip
    start, stop, step = first.indices(shape[0])
    stop = max(start, stop)
    if step > 1 and stop > start:
        stop = start + (stop - start - 1) // step * step + 1  # (the last index read, + 1)
    return start, stop, (slice(0, stop - start, step), *fwd[1:]), flip


def _finish(block: np.ndarray, local: tuple[int | slice, ...], flip: tuple[int, ...]) -> np.ndarray:
    part = block[local]
    if flip:
        part = np.flip(part, axis=flip)
    return np.array(part, dtype=F32, order="C", copy=True)


class GGUFTensor(Shaped):
    """One tensor of a GGUF file, read as float32: ``t[key]`` reads the blocks of the first
    axis' range ``key`` touches (for a 1-D tensor, the blocks holding its values) and decodes
    them; nothing is read before it is indexed. Picklable (a path and numbers)."""

    __slots__ = (
        "gguf_name", "name", "nbytes", "offset", "path", "remote", "row_bytes", "shape", "type"
    )  # fmt: skip

    def __init__(
        self,
        name: str,
        path: str,
        info: TensorInfo,
        *,
        shape: tuple[int, ...] | None = None,
        offset: int | None = None,
        remote: RangedTensor | None = None,
    ) -> None:
        self.name, self.path, self.gguf_name = name, path, info.name
        self.remote = remote  # (a file in an object store: its bytes, read by ranges)
        self.type, self.row_bytes = info.type, info.row_bytes
        self.shape = info.shape if shape is None else shape
        self.offset = info.offset if offset is None else offset
        self.nbytes = math.prod(self.shape[:-1]) * self.row_bytes

    @property
    def dtype(self) -> np.dtype[Any]:
        """float32: the decoded values."""
        return F32

    def __repr__(self) -> str:
        return f"GGUFTensor({self.name!r}, {self.type}, shape={self.shape})"

    def _bytes(self, first: int, n: int) -> np.ndarray:
        out = np.empty(n, np.uint8)
        if n and self.remote is not None:  # one ranged request
            self.remote.read_run(first, out)
        elif n:
            read_file_run(self.path, first, out, f"tensor {self.gguf_name!r}")
        return out

    def read(self, a: int, b: int) -> np.ndarray:
        """Indices ``a:b`` of the first axis, decoded (``[b - a, *shape[1:]]``, float32)."""
        width = self.shape[-1]
        if b <= a:
            return np.empty((0, *self.shape[1:]), F32)
        if len(self.shape) == 1:  # the blocks holding values a:b
            block = _block_values(self.type)
            size = self.row_bytes // (width // block)
            k0, k1 = a // block, -(-b // block)
            raw = self._bytes(self.offset + k0 * size, (k1 - k0) * size)
            vals = decode_rows(raw.reshape(1, -1), self.type, (k1 - k0) * block)[0]
            return vals[a - k0 * block : b - k0 * block]
        unit = math.prod(self.shape[1:-1]) * self.row_bytes
        raw = self._bytes(self.offset + a * unit, (b - a) * unit)
        rows = raw.reshape(-1, self.row_bytes)
        return decode_rows(rows, self.type, width).reshape(b - a, *self.shape[1:])

    def __getitem__(self, key: Any) -> np.ndarray:
        """The region ``key`` (basic indexing) as a new float32 array."""
        a, b, local, flip = _axis0(key, self.shape)
        return _finish(self.read(a, b), local, flip)


def _block_values(qtype: str) -> int:
    if qtype in ("F32", "F16", "BF16"):
        return 1
    return 256 if qtype.endswith("_K") else 32


class Unpermuted(Shaped):
    """A llama q/k projection read back in Hugging Face's row order: llama.cpp's converter
    permuted its rows within each of ``heads`` heads (:func:`row_order`); a read of rows
    ``r0:r1`` reads the heads holding them and inverts the permutation there."""

    __slots__ = ("base", "heads", "name", "shape")

    def __init__(self, name: str, base: GGUFTensor, heads: int) -> None:
        self.name, self.base, self.heads, self.shape = name, base, heads, base.shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """float32."""
        return F32

    @property
    def nbytes(self) -> int:
        """The stored bytes."""
        return self.base.nbytes

    def __getitem__(self, key: Any) -> np.ndarray:
        """The region ``key`` in Hugging Face's row order, as a new float32 array."""
        a, b, local, flip = _axis0(key, self.shape)
        per = self.shape[0] // self.heads
        h0, h1 = a // per, -(-b // per)
        if h1 <= h0:
            return _finish(np.empty((0, *self.shape[1:]), F32), local, flip)
        block = self.base.read(h0 * per, h1 * per)
        inverse = np.argsort(row_order((h1 - h0) * per, h1 - h0))
        first = local[0]
        shift = a - h0 * per
        if isinstance(first, int):
            first = first + shift
        else:
            first = slice(first.start + shift, first.stop + shift, first.step)
        return _finish(block[inverse], (first, *local[1:]), flip)


class Shifted(Shaped):
    """A Gemma norm read back as Hugging Face stores it: the converter added 1 (transformers'
    Gemma norms scale by ``1 + weight``), subtracted here in float32."""

    __slots__ = ("add", "base", "name", "shape")

    def __init__(self, name: str, base: GGUFTensor, add: float) -> None:
        self.name, self.base, self.add, self.shape = name, base, add, base.shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """float32."""
        return F32

    @property
    def nbytes(self) -> int:
        """The stored bytes."""
        return self.base.nbytes

    def __getitem__(self, key: Any) -> np.ndarray:
        """The region ``key`` minus the converter's offset, as a new float32 array."""
        return self.base[key] - np.float32(self.add)


# -- names ---------------------------------------------------------------------------------------


def _inverse_layer(arch: str) -> dict[str, str]:
    """GGUF layer part -> Hugging Face layer part (llama's router: Mixtral's name)."""
    out: dict[str, str] = {}
    for hf, gg in LAYER_NAMES[arch].items():
        if gg not in out or hf.startswith("block_sparse_moe"):
            out[gg] = hf
    return out


def _expert_names(arch: str) -> dict[str, str]:
    """GGUF merged-expert part -> per-expert Hugging Face projection of ``arch``."""
    mixtral = arch == "llama"
    wanted = ("w1", "w2", "w3") if mixtral else ("gate_proj", "up_proj", "down_proj")
    return {EXPERTS[w]: w for w in wanted}


def hf_name(arch: str, name: str) -> str | None:
    """The Hugging Face name of the GGUF tensor ``name`` of architecture ``arch`` (a merged
    expert tensor excluded: see :func:`open_gguf`), or None when it has none."""
    base, dot, suffix = name.rpartition(".")
    if suffix not in ("weight", "bias"):
        base, dot, suffix = name, "", ""
    if base in _TOP:
        return _TOP[base] + dot + suffix
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
    if m:
        part = _inverse_layer(arch).get(m.group(2))
        if part is not None:
            return f"model.layers.{m.group(1)}.{part}{dot}{suffix}"
    return None


def _heads(header: GGUFHeader, arch: str) -> tuple[int, int]:
    kv = header.kv
    heads = kv.get(f"{arch}.attention.head_count")
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
        raise StoreError(
            f"GGUF file {header.path}: {arch}.attention.head_count must be a positive integer"
            f" (the q/k permutation needs it), got {heads!r:.60}"
        )
    kv_heads = kv.get(f"{arch}.attention.head_count_kv", heads)
    if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads < 1:
        raise StoreError(
            f"GGUF file {header.path}: {arch}.attention.head_count_kv must be a positive"
            f" integer, got {kv_heads!r:.60}"
        )
    return heads, kv_heads


def architecture(header: GGUFHeader) -> str | None:
    """``general.architecture`` of the file (None if absent or not a string)."""
    arch = header.kv.get("general.architecture")
    return arch if isinstance(arch, str) else None


def _named(header: GGUFHeader) -> dict[str, TensorLike]:
    """The tensors of a known architecture under Hugging Face names, converter undone."""
    arch = architecture(header)
    assert arch in KNOWN
    path, remote = header.path, header.remote
    experts = _expert_names(arch)
    heads = _heads(header, arch) if arch == "llama" else (0, 0)
    out: dict[str, TensorLike] = {}
    kept: list[str] = []

    def put(name: str, t: TensorLike) -> None:
        if name in out:
            raise StoreError(f"GGUF file {path}: two tensors are named {name!r} once renamed")
        out[name] = t

    for info in header.tensors:
        m = re.fullmatch(r"blk\.(\d+)\.(ffn_(?:gate|up|down)_exps)\.weight", info.name)
        if m and m.group(2) in experts and len(info.shape) == 3:
            layer, proj = m.group(1), experts[m.group(2)]
            where = "block_sparse_moe" if arch == "llama" else "mlp"
            unit = info.shape[1] * info.row_bytes
            for e in range(info.shape[0]):
                name = f"model.layers.{layer}.{where}.experts.{e}.{proj}.weight"
                put(name, GGUFTensor(name, path, info, shape=info.shape[1:],
                                     offset=info.offset + e * unit, remote=remote))  # fmt: skip
            continue
        hf = hf_name(arch, info.name)
        if hf is None:
            kept.append(info.name)
            put(info.name, GGUFTensor(info.name, path, info, remote=remote))
            continue
        t = GGUFTensor(hf, path, info, remote=remote)
        if arch == "llama" and re.search(r"self_attn\.[qk]_proj\.(weight|bias)$", hf):
            n = heads[0] if ".q_proj." in hf else heads[1]
            if info.shape[0] % (2 * n):
                raise StoreError(
                    f"GGUF file {path}: tensor {info.name!r} has {info.shape[0]} rows, not a"
                    f" multiple of 2 x {n} heads (the q/k permutation)"
                )
            put(hf, Unpermuted(hf, t, n))
        elif arch in ("gemma2", "gemma3") and hf.endswith("norm.weight"):
            put(hf, Shifted(hf, t, 1.0))
        else:
            put(hf, t)
    if kept:
        shown = ", ".join(kept[:5]) + (f" and {len(kept) - 5} more" if len(kept) > 5 else "")
        warnings.warn(
            f"GGUF file {path}: {len(kept)} tensor(s) have no Hugging Face name in a {arch}"
            f" model and keep their GGUF names: {shown}",
            QStreamWarning,
            stacklevel=3,
        )
    return out


#: GGML types that store float values as they are (a tensor of one was kept, not quantized)
GGUF_FLOATS = ("F32", "F16", "BF16", "F64")


def gguf_type(t: Any) -> str | None:
    """The GGML type a tensor of :func:`open_gguf` is stored as (None for another tensor)."""
    base = t.base if isinstance(t, Unpermuted | Shifted) else t
    return base.type if isinstance(base, GGUFTensor) else None


def open_gguf(
    path: str,
    *,
    hf_names: bool = True,
    warn_unnamed: bool = True,
    storage_options: dict[str, Any] | None = None,
    store: str | None = None,
) -> dict[str, TensorLike]:
    """The tensors of the GGUF file ``path`` by name, in file order, each read lazily as
    float32 (see the module's text); only the header is read here. ``hf_names``: Hugging
    Face names (and layouts) for known architectures; otherwise, or for another
    architecture (a warning says so, unless not ``warn_unnamed``), the GGUF names and
    layouts. ``path`` may be the URL of
    a GGUF object (read through ``store`` with ``storage_options``): its header is read by
    ranged requests, each tensor region by one ranged request for its rows."""
    header = read_header(path, storage_options=storage_options, store=store)
    if any(t.type in gguf_legacy.TYPES for t in header.tensors):
        # (the legacy types' kernels, loaded here: never first by a conversion's worker
        # thread, where an import can deadlock on another's module lock)
        from ...kernels import legacy_quants, runtime  # noqa: F401
    arch = architecture(header)
    if hf_names and arch in KNOWN:
        return _named(header)
    # (architecture "qstream": qstream's export of a model without a config, its tensors
    # under the source's own names already)
    if hf_names and warn_unnamed and arch != "qstream":
        warnings.warn(
            f"GGUF file {path}: architecture {arch!r} has no Hugging Face naming in qstream"
            f" (known: {', '.join(KNOWN)}); its tensors keep their GGUF names",
            QStreamWarning,
            stacklevel=2,
        )
    return {i.name: GGUFTensor(i.name, path, i, remote=header.remote) for i in header.tensors}
