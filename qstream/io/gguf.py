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

import json
import os
import warnings
from typing import Any

from ..compat import gguf as q
from ..errors import InvalidParameterError, QStreamWarning, StoreError
from ..recipe import Recipe
from ..spec import QuantSpec
from .checkpoints import open_checkpoint
from .export_files import SLAB
from .export_meta import read_json
from .fp8 import pair_scales
from .gguf_file import ALIGN, MARK, STR, U32, GGUFTensor, Value, identity, write_gguf
from .gguf_llama import llama as llama_of
from .gguf_tensors import float_tensor, plain_type, quantized_tensor
from .paths import kind_of
from .qarray import QuantizedArray, QuantizedCheckpoint, open_quantized

#: llama.cpp's ``LlamaFileType`` of a file mostly of each type
FILE_TYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "BF16": 32}
_SOURCE_SUFFIXES = (".safetensors", ".json", ".npz", ".npy", ".pt", ".pth", ".bin")


def _read_config(
    config: str | os.PathLike[str] | dict[str, Any] | None,
) -> dict[str, Any] | None:
    """The model configuration ``config`` (a dict, or the path of its JSON file)."""
    if config is None or isinstance(config, dict):
        return config
    doc = read_json(os.fspath(config))
    if doc is None:
        raise InvalidParameterError(f"{config}: not a readable JSON object (a model config.json)")
    return doc


def _source_config(src: str | os.PathLike[str]) -> str | None:
    """``config.json`` beside (or in) the local source ``src``, if there is one."""
    path = os.fspath(src)
    if "://" in path:
        return None
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    config = os.path.join(folder, "config.json")
    return config if os.path.isfile(config) else None


def _source_version(src: str | os.PathLike[str]) -> list[list[str | int]]:
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
    out: list[list[str | int]] = []
    for n in names:
        try:
            st = os.stat(os.path.join(folder, n))
        except OSError:
            continue
        out.append([n, st.st_size, st.st_mtime_ns])
    return out


def _is_output(src: str | os.PathLike[str]) -> bool:
    """Whether ``src`` is a qstream output (a converted checkpoint or one quantized group)."""
    path = os.path.join(os.fspath(src), "zarr.json")
    if not os.path.isfile(path):
        return False
    attrs = (read_json(path) or {}).get("attributes") or {}
    return "qstream_checkpoint" in attrs or "qstream" in attrs


def export_gguf(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    type: str | None = None,
    recipe: Recipe | str | os.PathLike[str] | None = None,
    config: str | os.PathLike[str] | dict[str, Any] | None = None,
    overwrite: bool = False,
    max_memory: int | None = None,
) -> dict[str, Any]:
    """Write ``src`` (a float checkpoint, or a qstream output) as the GGUF file ``out``; see
    the module docstring. ``recipe``: which tensors of a float checkpoint are quantized,
    and to what block type (:func:`block_type`: int8 -> Q8_0, symmetric int4 -> Q4_0,
    asymmetric 4-bit -> Q4_1; the values follow GGUF's own rules, not the spec's method);
    ``type`` (Q8_0, Q4_0, Q4_1, F16, BF16, F32) overrides it for every tensor it quantizes.
    ``config``: the model's config.json (path or dict); None: the one beside ``src``.
    Returns the file, the tensors and their types, and the bytes written."""
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
    cfg = _read_config(config if config is not None else _source_config(src))
    if not isinstance(recipe, Recipe):
        recipe = Recipe.load(recipe) if recipe else Recipe()
    ident = {"source": str(src), "type": gtype, "recipe": recipe.to_dict(), "config": cfg}
    job = json.dumps({**ident, "version": _source_version(src)}, sort_keys=True)
    kind = kind_of(out)
    if kind is not None:
        found = identity(out) if kind == "file" else None
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
    llama = llama_of(cfg)
    budget = max(1 << 20, min(SLAB, (max_memory or SLAB) // 8))
    tensors: list[GGUFTensor] = []
    types: dict[str, str] = {}
    if _is_output(src):
        opened = open_quantized(src)
        items: list[tuple[str, Any]] = (
            [(n, opened[n]) for n in opened]
            if isinstance(opened, QuantizedCheckpoint)
            else [("weight", opened)]
        )
        for hf, a in items:
            name = llama.name(hf) if llama else hf
            heads = llama.heads_of(hf) if llama else None
            if isinstance(a, QuantizedArray):
                t = quantized_tensor(name, hf, a, heads)
            else:
                t = float_tensor(name, a, plain_type(a, hf), heads, budget)
            tensors.append(t)
            types[hf] = t.type
    else:
        paired = pair_scales(open_checkpoint(src), recipe.scales)
        for warning in recipe.check(paired):
            warnings.warn(warning, QStreamWarning, stacklevel=3)
        for hf, v in paired.items():
            name = llama.name(hf) if llama else hf
            heads = llama.heads_of(hf) if llama else None
            spec = recipe.spec_for(hf, v.shape, v.dtype)
            kind_ = None if spec is None else (gtype or block_type(hf, spec))
            if kind_ in q.TYPE_SIZE and v.shape[-1] % q.BLOCK:
                kind_ = None  # whole blocks only, as llama.cpp's converter keeps such tensors
            tensors.append(float_tensor(name, v, kind_ or plain_type(v, hf), heads, budget))
            types[hf] = tensors[-1].type
    names = [g.name for g in tensors]
    if len(set(names)) != len(names):
        raise InvalidParameterError("two tensors map to one GGUF name")
    kv: dict[str, Value] = {
        MARK: (STR, job),
        "general.architecture": (
            STR,
            "llama" if llama else str((cfg or {}).get("model_type", "qstream")),
        ),
        "general.name": (STR, os.path.basename(out)[: -len(".gguf")]),
        "general.file_type": (U32, FILE_TYPE.get(_mostly(types), 0)),
        "general.quantization_version": (U32, 2),
        "general.alignment": (U32, ALIGN),
    }
    if llama:
        kv.update(llama.keys())
    write_gguf(out, kv, tensors)
    return {
        "file": out,
        "already_complete": False,
        "tensors": types,
        "bytes": os.path.getsize(out),
        "architecture": kv["general.architecture"][1],
    }


def block_type(name: str, spec: QuantSpec) -> str:
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


def _mostly(types: dict[str, str]) -> str:
    """The quantized type most tensors have (else the plain one), naming the file's type."""
    counts: dict[str, int] = {}
    for v in types.values():
        counts[v] = counts.get(v, 0) + 1
    quantized = {k: n for k, n in counts.items() if k in q.TYPE_SIZE}
    pool = quantized or counts
    return max(pool, key=lambda k: pool[k]) if pool else "F32"
