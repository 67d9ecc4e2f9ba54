"""GGUF files for llama.cpp, written streaming: quantized blocks (Q8_0, Q4_0, Q4_1) and plain
tensors (F32, F16, BF16), with bounded memory.

Two sources:

- a float checkpoint (anything :func:`qstream.convert_checkpoint` reads): each tensor the
  recipe quantizes is quantized to ``type`` by :mod:`qstream.compat.gguf`, bit for bit as
  gguf-py's ``quants.quantize`` does; kept tensors (rank < 2, ``keep`` rules, a last axis
  that is not a multiple of 32) are written in their own float type (float64 as F32);
- a qstream output: codes and scales that a GGUF block type holds exactly are copied
  (symmetric int8 -> Q8_0, symmetric int4 -> Q4_0, groups along the last axis of a multiple of
  32 or per channel on axis 0, float16-exact scales: ``scale_dtype="float16"``); anything
  else is refused, naming the tensor and why.

With a ``config.json`` of a Llama-style model (``model_type`` llama / mistral), tensor names
are mapped as llama.cpp's converter maps them (``model.layers.0.self_attn.q_proj.weight`` ->
``blk.0.attn_q.weight``), the rows of q/k projections permuted as it does, and the
hyper-parameters written as ``llama.*`` keys; a name llama.cpp would not know is refused.
The tokenizer is not written: llama.cpp's ``gguf-new-metadata`` / its converter add it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import struct

import numpy as np

from ..compat import gguf as q
from ..errors import InvalidParameterError, NonFiniteInputError, StoreError
from .checkpoints import read_rows

ALIGN = 32
VERSION = 3
SLAB = 16 << 20
MARK = "qstream.export"  # a key every GGUF qstream writes carries
_U32, _I32, _F32, _BOOL, _STR, _ARR, _U64 = 4, 5, 6, 7, 8, 9, 10
#: llama.cpp's ``LlamaFileType`` of a file mostly of each type
FILE_TYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "BF16": 32}
_PLAIN = {"float32": "F32", "float64": "F32", "float16": "F16", "bfloat16": "BF16"}
_LLAMA = {
    "model.embed_tokens": "token_embd",
    "model.norm": "output_norm",
    "lm_head": "output",
}
_LLAMA_LAYER = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


class _Tensor:
    """One tensor of the file: its GGUF name, shape, type and a reader of byte rows."""

    def __init__(self, name: str, shape, gtype: str, rows, read) -> None:
        self.name, self.shape, self.type = name, tuple(int(d) for d in shape), gtype
        self.rows = rows  # how many rows (the leading axes flattened)
        self.read = read  # read(r0, r1) -> uint8 bytes of rows r0..r1 (any shape)
        inner = q.byte_shape(self.shape, gtype) if self.shape else ()
        itemsize = 4 if gtype == "F32" else 2 if gtype == "F16" else 1
        self.nbytes = math.prod(inner) * itemsize if self.shape else 4


# --- naming ------------------------------------------------------------------------------


class _Llama:
    """Names and q/k row order of a Llama-style model, as llama.cpp's converter writes them."""

    def __init__(self, config: dict) -> None:
        self.config = config
        self.heads = int(config["num_attention_heads"])
        self.kv_heads = int(config.get("num_key_value_heads") or self.heads)

    def name(self, hf: str) -> str:
        base, dot, suffix = hf.rpartition(".")
        if suffix not in ("weight", "bias"):
            base, suffix = hf, ""
        if base in _LLAMA:
            return _LLAMA[base] + dot + suffix
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", base)
        if m and m.group(2) in _LLAMA_LAYER:
            return f"blk.{m.group(1)}.{_LLAMA_LAYER[m.group(2)]}{dot}{suffix}"
        raise InvalidParameterError(
            f"{hf}: a tensor llama.cpp's Llama loader does not know; keep it out of the"
            " checkpoint, or export without --config to keep the checkpoint's own names"
        )

    def heads_of(self, hf: str) -> int | None:
        """How many heads the rows of ``hf`` are permuted over (q and k projections)."""
        if re.search(r"self_attn\.q_proj\.(weight|bias)$", hf):
            return self.heads
        if re.search(r"self_attn\.k_proj\.(weight|bias)$", hf):
            return self.kv_heads
        return None

    def keys(self) -> dict:
        c = self.config
        hidden = int(c["hidden_size"])
        rope = c.get("rope_theta") or (c.get("rope_parameters") or {}).get("rope_theta", 1e4)
        return {
            "llama.block_count": (_U32, int(c["num_hidden_layers"])),
            "llama.context_length": (_U32, int(c.get("max_position_embeddings", 2048))),
            "llama.embedding_length": (_U32, hidden),
            "llama.feed_forward_length": (_U32, int(c["intermediate_size"])),
            "llama.attention.head_count": (_U32, self.heads),
            "llama.attention.head_count_kv": (_U32, self.kv_heads),
            "llama.rope.freq_base": (_F32, float(rope)),
            "llama.attention.layer_norm_rms_epsilon": (_F32, float(c.get("rms_norm_eps", 1e-5))),
            "llama.vocab_size": (_U32, int(c["vocab_size"])),
            "llama.rope.dimension_count": (
                _U32,
                int(c.get("head_dim") or hidden // self.heads),
            ),
        }


def _row_order(rows: int, heads: int) -> np.ndarray:
    """llama.cpp's q/k permutation of rows: within each head, the two rotary halves
    interleaved (``reshape(heads, 2, d/2).swapaxes(1, 2)``)."""
    return np.arange(rows).reshape(heads, 2, rows // heads // 2).swapaxes(1, 2).reshape(-1)


def _llama(config: dict | None) -> _Llama | None:
    if not config:
        return None
    kind = str(config.get("model_type", "")).lower()
    return _Llama(config) if kind in ("llama", "mistral") else None


# --- tensors -----------------------------------------------------------------------------


def _float_tensor(name, t, gtype, heads, max_rows_bytes) -> _Tensor:
    """A tensor quantized (or converted) from float values read in row slabs (the leading
    axes flattened into rows; a permuted q/k weight one head at a time, the permutation
    staying within a head)."""
    shape = tuple(t.shape)
    cols = shape[-1] if shape else 1
    rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
    inner = math.prod(shape[1:-1]) if len(shape) > 2 else 1  # rows per index of axis 0
    order = _row_order(shape[0], heads) if heads else None
    if order is not None and len(shape) == 2:
        step = shape[0] // heads  # one head's rows
    else:
        per_slab = max(1, inner * cols * 4)  # one index of axis 0
        step = inner * max(1, min(shape[0] if shape else 1, max_rows_bytes // per_slab))

    def values(r0, r1):
        if not shape:
            return np.asarray(t[...], np.float32).reshape(1)
        if len(shape) == 1:  # a vector: one piece (a q/k bias permuted as its weight's rows)
            x = np.asarray(t[...])
            return x[order] if order is not None else x
        if order is not None:  # rows r0:r1 are one head's: read them, then reorder
            x = read_rows(t, (slice(r0, r1),), np.dtype(t.dtype))
            return x[order[r0:r1] - r0]
        x = read_rows(t, (slice(r0 // inner, r1 // inner),), np.dtype(t.dtype))
        return x.reshape(r1 - r0, cols)

    def read(r0, r1):
        x = values(r0, r1)
        if gtype in q.TYPE_SIZE:
            x = np.asarray(x, np.float32)
            if not np.isfinite(x).all():
                raise NonFiniteInputError(
                    f"{name}: holds NaN or infinite values, which GGUF blocks cannot hold"
                )
        return np.ascontiguousarray(q.quantize(x, gtype)).view(np.uint8)

    tensor = _Tensor(name, shape, gtype, rows if len(shape) > 1 else 1, read)
    tensor.step = step if len(shape) > 1 else 1
    return tensor


def _quantized_tensor(name, hf, arr, heads) -> _Tensor:
    """A qstream output's quantized tensor copied into GGUF blocks, if they hold it exactly."""

    def refuse(why: str):
        return InvalidParameterError(
            f"{hf}: {why}; GGUF holds symmetric int8 (Q8_0) or int4 (Q4_0) codes with float16"
            " scales per 32 values along the last axis (scale_dtype='float16', groups of a"
            " multiple of 32 along the last axis, or per channel on axis 0); or convert the"
            " float checkpoint to .gguf directly"
        )

    qt = arr.qtype
    if arr.spec.float_offset:
        raise refuse("a float offset")
    kind = {"int8": "Q8_0", "int4": "Q4_0"}.get(qt.name)
    if kind is None:
        raise refuse(f"{qt.name} codes")
    if arr.ndim != 2 or arr.shape[1] % q.BLOCK:
        raise refuse(f"shape {list(arr.shape)}")
    spec = arr.spec
    if np.any(arr.zero_point != 0):
        raise refuse("an asymmetric range (nonzero zero points)")
    if spec.block_size:
        if arr.axis != 1 or spec.block_size % q.BLOCK:
            raise refuse(f"groups of {spec.block_size} along axis {arr.axis}")
    elif arr.axis not in (None, 0):
        raise refuse(f"one scale per position on axis {arr.axis}")
    scale = np.asarray(arr.scale, np.float32)
    if not np.array_equal(scale.astype(np.float16).astype(np.float32), scale):
        raise refuse("float32 scales that float16 does not hold")
    out, cols = arr.shape
    per_block = spec.block_size // q.BLOCK if spec.block_size else 0
    order = _row_order(out, heads) if heads else None

    def read(r0, r1):
        a = arr
        rows = np.arange(r0, r1) if order is None else order[r0:r1]
        lo, hi = int(rows.min()), int(rows.max()) + 1
        codes = a.quantized((slice(lo, hi),))[rows - lo].astype(np.int8)
        s = np.asarray(a.scale, np.float32)
        if spec.block_size:
            d = np.repeat(s.reshape(out, -1)[rows], per_block, axis=1)
        elif a.axis == 0:
            d = np.repeat(s.reshape(out, 1)[rows], cols // q.BLOCK, axis=1)
        else:
            d = np.full((len(rows), cols // q.BLOCK), s.reshape(-1)[0], np.float32)
        d = d.reshape(-1, 1).astype(np.float16).view(np.uint8)
        b = codes.reshape(-1, q.BLOCK)
        if kind == "Q8_0":
            body = b.view(np.uint8)
        else:
            n = (b.astype(np.int16) + 8).astype(np.uint8)
            body = n[:, :16] | (n[:, 16:] << np.uint8(4))
        return np.concatenate([d, body], axis=1)

    tensor = _Tensor(hf, arr.shape, kind, out, read)
    tensor.step = max(1, SLAB // max(1, cols))
    return tensor


# --- writing -----------------------------------------------------------------------------


def _string(s: str) -> bytes:
    raw = s.encode()
    return struct.pack("<Q", len(raw)) + raw


def _value(kind: int, v) -> bytes:
    if kind == _STR:
        return _string(v)
    return struct.pack({_U32: "<I", _I32: "<i", _F32: "<f", _BOOL: "<?", _U64: "<Q"}[kind], v)


def _write(path: str, kv: dict, tensors: list[_Tensor]) -> None:
    head = struct.pack("<4sIQQ", b"GGUF", VERSION, len(tensors), len(kv))
    for k, (kind, v) in kv.items():
        head += _string(k) + struct.pack("<I", kind) + _value(kind, v)
    offset = 0
    for t in tensors:
        dims = t.shape[::-1] or (1,)
        head += _string(t.name) + struct.pack(f"<I{len(dims)}Q", len(dims), *dims)
        head += struct.pack("<IQ", q.TYPE_ID[t.type], offset)
        offset += t.nbytes + (-t.nbytes % ALIGN)
    head += b"\0" * (-len(head) % ALIGN)
    from .export import remove_stale_partials

    remove_stale_partials(path)  # what a killed export of this file left
    tmp = f"{path}.{os.getpid()}.partial"
    try:
        with open(tmp, "wb") as f:
            f.write(head)
            for t in tensors:
                written = 0
                step = getattr(t, "step", t.rows)
                for r0 in range(0, t.rows, step):
                    chunk = t.read(r0, min(t.rows, r0 + step))
                    f.write(np.ascontiguousarray(chunk).reshape(-1).view(np.uint8))
                    written += chunk.nbytes
                if written != t.nbytes:
                    raise StoreError(f"{t.name}: wrote {written} bytes, expected {t.nbytes}")
                f.write(b"\0" * (-t.nbytes % ALIGN))
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise StoreError(f"cannot write {path}: {e}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def written_by_qstream(path: str) -> bool:
    """Whether the GGUF file ``path`` carries qstream's export key."""
    return _identity(path) is not None


def _identity(path: str) -> str | None:
    """The job identity recorded under qstream's key (written first) in the GGUF file
    ``path``, or None when it is not a GGUF qstream wrote."""
    from .paths import open_regular

    try:
        with open_regular(path) as f:
            magic, _, _, n_kv = struct.unpack("<4sIQQ", f.read(24))
            if magic != b"GGUF" or n_kv < 1:
                return None
            (n,) = struct.unpack("<Q", f.read(8))
            if f.read(min(n, 256)) != MARK.encode():
                return None
            kind, size = struct.unpack("<IQ", f.read(12))
            if kind != _STR or size > 1 << 20:
                return None
            return f.read(size).decode()
    except (OSError, struct.error, UnicodeDecodeError):
        return None


def _read_config(config) -> dict | None:
    if config is None or isinstance(config, dict):
        return config
    from .export import read_json

    doc = read_json(os.fspath(config))
    if doc is None:
        raise InvalidParameterError(f"{config}: not a readable JSON object (a model config.json)")
    return doc


def _source_config(src) -> str | None:
    path = os.fspath(src)
    if "://" in path:
        return None
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    config = os.path.join(folder, "config.json")
    return config if os.path.isfile(config) else None


def _source_version(src) -> list:
    """Sizes and times of the files ``src`` is read from (a qstream output: its root
    document, rewritten when it is written again): a changed source is another export."""
    path = os.fspath(src)
    if "://" in path:
        return []
    if _is_output(path):
        path = os.path.join(path, "zarr.json")
    folder = path if os.path.isdir(path) else os.path.dirname(path) or "."
    names = (
        sorted(n for n in os.listdir(folder) if n.endswith(_SOURCE_SUFFIXES))
        if os.path.isdir(path) or (path.endswith(".json") and not path.endswith("zarr.json"))
        else [os.path.basename(path)]
    )
    out = []
    for n in names:
        try:
            st = os.stat(os.path.join(folder, n))
        except OSError:
            continue
        out.append([n, st.st_size, st.st_mtime_ns])
    return out


_SOURCE_SUFFIXES = (".safetensors", ".json", ".npz", ".npy", ".pt", ".pth", ".bin")


def _is_output(src) -> bool:
    """Whether ``src`` is a qstream output (a converted checkpoint or one quantized group)."""
    path = os.path.join(os.fspath(src), "zarr.json")
    if not os.path.isfile(path):
        return False
    from .export import read_json

    attrs = (read_json(path) or {}).get("attributes") or {}
    return "qstream_checkpoint" in attrs or "qstream" in attrs


def export_gguf(
    src,
    out,
    *,
    type: str | None = None,
    recipe=None,
    config=None,
    overwrite: bool = False,
    max_memory: int | None = None,
) -> dict:
    """Write ``src`` (a float checkpoint, or a qstream output) as the GGUF file ``out``; see
    the module docstring. ``recipe``: which tensors of a float checkpoint are quantized,
    and to what block type (:func:`block_type`: int8 -> Q8_0, symmetric int4 -> Q4_0,
    asymmetric 4-bit -> Q4_1; the values follow GGUF's own rules, not the spec's method);
    ``type`` (Q8_0, Q4_0, Q4_1, F16, BF16, F32) overrides it for every tensor it quantizes.
    ``config``: the model's config.json (path or dict); None: the one beside ``src``.
    Returns the file, the tensors and their types, and the bytes written."""
    from ..recipe import Recipe

    gtype = None if type is None else str(type).upper()
    if gtype is not None and gtype not in q.TYPE_ID:
        raise InvalidParameterError(
            f"unknown GGUF type {type!r}; expected one of: {', '.join(q.TYPES)}"
        )
    out = os.fspath(out)
    if not out.endswith(".gguf"):
        raise InvalidParameterError(f"{out}: a GGUF export's name must end in .gguf")
    if not os.path.isdir(os.path.dirname(out) or "."):
        raise StoreError(
            f"cannot export to {out}: the folder {os.path.dirname(out)} does not exist"
        )
    from .paths import kind_of

    cfg = _read_config(config if config is not None else _source_config(src))
    if not isinstance(recipe, Recipe):
        recipe = Recipe.load(recipe) if recipe else Recipe()
    ident = {"source": str(src), "type": gtype, "recipe": recipe.to_dict(), "config": cfg}
    job = json.dumps({**ident, "version": _source_version(src)}, sort_keys=True)
    kind = kind_of(out)
    if kind is not None:
        found = _identity(out) if kind == "file" else None
        if found is None:
            raise StoreError(
                f"{out} exists and is not a qstream export; qstream never replaces what it did"
                " not write (even with overwrite=True): remove it yourself or export elsewhere"
            )
        if found == job and not overwrite:  # the same export, finished: nothing to do
            return {"file": out, "already_complete": True, "tensors": {}, "bytes": 0}
        if not overwrite:
            raise StoreError(
                f"{out} holds another export (other source, recipe or type); pass"
                " overwrite=True to replace it"
            )
    llama = _llama(cfg)
    budget = max(1 << 20, min(SLAB, (max_memory or SLAB) // 8))
    tensors: list[_Tensor] = []
    types: dict[str, str] = {}
    if _is_output(src):
        from .qarray import QuantizedArray, QuantizedCheckpoint, open_quantized

        opened = open_quantized(src)
        items = (
            [(n, opened[n]) for n in opened]
            if isinstance(opened, QuantizedCheckpoint)
            else [("weight", opened)]
        )
        for hf, a in items:
            name = llama.name(hf) if llama else hf
            heads = llama.heads_of(hf) if llama else None
            if isinstance(a, QuantizedArray):
                t = _quantized_tensor(name, hf, a, heads)
                t.name = name
            else:
                t = _float_tensor(name, a, _plain(a, hf), heads, budget)
            tensors.append(t)
            types[hf] = t.type
    else:
        import warnings

        from ..errors import QStreamWarning
        from .checkpoints import open_checkpoint
        from .fp8 import pair_scales

        paired = pair_scales(open_checkpoint(src), recipe.scales)
        for warning in recipe.check(paired):
            warnings.warn(warning, QStreamWarning, stacklevel=3)
        for hf, t in paired.items():
            name = llama.name(hf) if llama else hf
            heads = llama.heads_of(hf) if llama else None
            spec = recipe.spec_for(hf, t.shape, t.dtype)
            kind_ = None if spec is None else (gtype or block_type(hf, spec))
            if kind_ in q.TYPE_SIZE and t.shape[-1] % q.BLOCK:
                kind_ = None  # whole blocks only, as llama.cpp's converter keeps such tensors
            tensors.append(_float_tensor(name, t, kind_ or _plain(t, hf), heads, budget))
            types[hf] = tensors[-1].type
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise InvalidParameterError("two tensors map to one GGUF name")
    kv = {
        MARK: (_STR, job),
        "general.architecture": (
            _STR,
            "llama" if llama else str((cfg or {}).get("model_type", "qstream")),
        ),
        "general.name": (_STR, os.path.basename(out)[: -len(".gguf")]),
        "general.file_type": (_U32, FILE_TYPE.get(_mostly(types), 0)),
        "general.quantization_version": (_U32, 2),
        "general.alignment": (_U32, ALIGN),
    }
    if llama:
        kv.update(llama.keys())
    _write(out, kv, tensors)
    return {
        "file": out,
        "already_complete": False,
        "tensors": types,
        "bytes": os.path.getsize(out),
        "architecture": kv["general.architecture"][1],
    }


def block_type(name: str, spec) -> str:
    """The GGUF block type a recipe's spec stands for: 8-bit integer types -> Q8_0,
    symmetric int4 -> Q4_0, asymmetric int4/uint4 -> Q4_1."""
    qt = spec.qtype
    if qt.name in ("int8", "uint8"):
        return "Q8_0"
    if qt.name in ("int4", "uint4"):
        return "Q4_0" if spec.symmetric else "Q4_1"
    raise InvalidParameterError(
        f"{name}: no GGUF block type for {qt.name} (int8/uint8 -> Q8_0, symmetric int4 ->"
        " Q4_0, asymmetric 4-bit -> Q4_1); change the recipe or pass type="
    )


def _plain(t, name: str) -> str:
    """The GGUF type of a kept tensor: its own float type (float64 as F32)."""
    dtype = np.dtype(t.dtype).name
    meta = getattr(t, "attrs", None)
    if meta is not None:
        dtype = dict(meta.get("qstream", {})).get("dtype", dtype)
    if dtype not in _PLAIN:
        raise InvalidParameterError(f"{name}: GGUF has no type for {dtype} values")
    return _PLAIN[dtype]


def _mostly(types: dict[str, str]) -> str:
    counts: dict[str, int] = {}
    for v in types.values():
        counts[v] = counts.get(v, 0) + 1
    quantized = {k: n for k, n in counts.items() if k in q.TYPE_SIZE}
    pool = quantized or counts
    return max(pool, key=pool.get) if pool else "F32"


def describe(path: str) -> dict:
    """What a GGUF file qstream wrote holds (read with its own header, no gguf-py)."""
    job = _identity(path)
    if job is None:
        raise StoreError(f"{path} is not a qstream export (no {MARK} key)")
    ident = json.loads(job)
    return {
        "file": path,
        "format": "gguf",
        "loader": "llama.cpp / gguf-py",
        "source": ident.get("source"),
        "type": ident.get("type") or "from the recipe",
        "architecture": str((ident.get("config") or {}).get("model_type") or "qstream"),
        "bytes": os.path.getsize(path),
    }
