"""``convert --scheme NAME``: a source checkpoint written straight into a compressed-tensors
folder for one of compressed-tensors' presets (``W4A16``, ``W8A16``, ``W4A16_ASYM``,
``FP8_DYNAMIC``, ``FP8_BLOCK``, ``NVFP4A16``, ``MXFP4A16``, ``MXFP8A16``), with the codes and
scales compressed-tensors' own quantization functions give for the same weights (see
:mod:`qstream.exports.scheme_quant`), scales in the source's dtype.

Every 2-D ``*.weight`` of a Linear layer is quantized; embeddings, ``lm_head`` and router
gates are kept (as llm-compressor's recipes ignore them), so a tied embedding stays tied.
Refused in the plan, before any tensor byte is read: presets needing calibrated activation
scales (``preset.refusal``), weights the preset cannot write (float16 sources, groups that do
not divide), MoE experts under a preset transformers does not load them with
(:func:`~.compressed_tensors.refuse_experts`), a source that is quantized already. Each weight
is read through :func:`qstream.io.checkpoints.open_checkpoint` one at a time, in row slabs within
``max_memory``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.presets import Preset, preset
from ..errors import InvalidParameterError
from ..io.checkpoints import CONFIG, open_checkpoint, read_json, source_config
from . import compressed_tensors as ct
from .files import Entry, remove_stale_partials, split_shards, write_json, write_safetensors
from .model_files import copy_files, files_to_copy, manifest, plan_copies
from .scheme_quant import Param, check_weight, params, quantize_rows, row_align
from .targets import check_targets, export_lock, finished_export, job_digest, other_forms

_KEPT = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "lm_head.weight")
_GATES = (".mlp.gate.weight", ".router.weight", ".gate.weight")
_PLAIN = {
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "float64": "F64",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
}
_DEFAULT_MEMORY = 1 << 30


@dataclass
class SchemeJob:
    """What ``convert --scheme`` writes, decided before any tensor byte is read."""

    checkpoint: str
    out: str
    preset: Preset
    quantized: list[str]
    kept: list[str]
    config: dict[str, Any]
    job: str
    action: str
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    opts: dict[str, Any] = field(default_factory=dict)


def is_quantized(name: str, shape: tuple[int, ...]) -> bool:
    """Whether a preset quantizes the tensor ``name``: a 2-D Linear weight, not an embedding,
    ``lm_head`` or a router gate."""
    return len(shape) == 2 and name.endswith("weight") and not name.endswith(_KEPT + _GATES)


def plan_scheme(
    checkpoint: str | os.PathLike[str],
    out: str | os.PathLike[str],
    scheme: str,
    *,
    overwrite: bool = False,
    config: str | os.PathLike[str] | dict[str, Any] | None = None,
    model_files: bool = True,
    storage_options: dict[str, Any] | None = None,
    store: str | None = None,
) -> SchemeJob:
    """The export of ``checkpoint`` to the compressed-tensors folder of ``out`` (a
    ``.safetensors`` file) under the compressed-tensors preset ``scheme``; refuses (one line,
    :class:`InvalidParameterError` / :class:`StoreError`) what it cannot write or load."""
    out = os.fspath(out)
    if not out.endswith(".safetensors"):
        raise InvalidParameterError(f"{out}: --scheme writes a .safetensors DST (and its folder)")
    p = preset(scheme)
    if p.refusal is not None:
        raise InvalidParameterError(p.refusal)
    if p.format not in ("float-quantized", "pack-quantized") and p.float_format is None:
        raise InvalidParameterError(f"the {p.name} preset ({p.format}) is not written by qstream")
    if p.weights is not None and p.weights.type == "int" and not p.weights.symmetric:
        raise InvalidParameterError(
            f"the {p.name} preset: transformers 5 does not load a folder with packed 4-bit zero"
            " points (a shape mismatch on weight_zero_point); use W4A16 (symmetric)"
        )
    if p.format == "pack-quantized":
        check_weight(p, p.name, (1, 1 << 20), np.dtype(np.float32))  # (bits qstream packs)
    opts: dict[str, Any] = {"storage_options": storage_options or None, "store": store or None}
    tensors = open_checkpoint(checkpoint, **opts)
    model = _model_config(checkpoint, config)
    quantized, kept, rows = [], [], []
    for name, t in tensors.items():
        shape = tuple(int(d) for d in t.shape)
        dtype = np.dtype(t.dtype)
        before = math.prod(shape) * dtype.itemsize
        if is_quantized(name, shape):
            check_weight(p, name, shape, dtype)
            quantized.append(name)
            ps = params(p, (shape[0], shape[1]), dtype)
            after = sum(math.prod(x.shape) * _itemsize(x.tag) for x in ps)
            target = p.name
        else:
            if dtype.name not in _PLAIN:
                raise InvalidParameterError(f"{name}: no safetensors type for {dtype.name}")
            if len(shape) == 2 and name.endswith("weight"):
                kept.append(name[: -len("weight")])
            after, target = before, "keep"
        rows.append(
            {
                "name": name,
                "shape": list(shape),
                "dtype": dtype.name,
                "target": target,
                "bytes_before": before,
                "bytes_after": after,
            }
        )
    if not quantized:
        raise InvalidParameterError(f"{checkpoint}: no Linear weight for {p.name} to quantize")
    ct.refuse_experts(quantized, model, p.name, list(tensors))
    model["quantization_config"] = quantization_config(p, quantized, kept)
    job = _job(checkpoint, p)
    done = None if overwrite else finished_export(out, job)
    plan = SchemeJob(
        os.fspath(checkpoint),
        out,
        p,
        quantized,
        kept,
        model,
        job,
        "complete" if done else ("replace" if overwrite else "create"),
        rows=rows,
        opts=opts,
    )
    if model_files:
        plan.files = files_to_copy(checkpoint, out)
    if done is None:
        _targets(plan, 1, overwrite)  # (the shard count is known when written)
    plan.notes.append(
        f"compressed-tensors preset {p.name} ({p.format}): {len(quantized)} Linear weights,"
        " scales in the source's dtype; embeddings, lm_head and router gates kept"
    )
    if plan.files:
        names = ", ".join(os.path.basename(f) for f in plan.files)
        plan.notes.append(f"copies the model's files beside the export: {names}")
    return plan


def quantization_config(p: Preset, quantized: list[str], kept: list[str]) -> dict[str, Any]:
    """The ``quantization_config`` compressed-tensors reads for ``p`` over these modules."""
    w = p.weights
    assert w is not None
    weights: dict[str, Any] = {
        "num_bits": w.num_bits,
        "type": w.type,
        "symmetric": w.symmetric,
        "strategy": w.strategy,
        "dynamic": False,
    }
    if w.group_size:
        weights["group_size"] = w.group_size
    if w.block_structure:
        weights["block_structure"] = list(w.block_structure)
    if w.scale_dtype != "weight":
        weights["scale_dtype"] = {"e8m0": "torch.uint8"}.get(
            w.scale_dtype, "torch." + w.scale_dtype
        )
    act = None
    if p.activations is not None:
        a = p.activations
        act = {
            "num_bits": a.num_bits,
            "type": a.type,
            "symmetric": True,
            "strategy": a.strategy,
            "dynamic": a.dynamic,
        }
        if a.group_size:
            act["group_size"] = a.group_size
    modules = [n[: -len(".weight")] for n in quantized]
    others = [m.rstrip(".") for m in kept]
    return {
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "format": p.format,
        "config_groups": {
            "group_0": {
                "targets": ct._targets(modules, others),
                "format": p.format,
                "weights": weights,
                "input_activations": act,
                "output_activations": None,
            }
        },
        "ignore": sorted(others),
    }


def run_scheme(
    job: SchemeJob,
    *,
    overwrite: bool = False,
    max_memory: int | None = None,
    max_shard_size: int = 5 * 10**9,
) -> dict[str, Any]:
    """Write the folder :func:`plan_scheme` decided; returns the files and tensors written."""
    out = job.out
    if job.action == "complete":
        return {
            "checkpoint": job.checkpoint,
            "destination": out,
            "already_complete": True,
            "files": finished_export(out, job.job) or [],
            "tensors": {},
            "seconds": 0.0,
        }
    import time

    start = time.perf_counter()
    tensors = open_checkpoint(job.checkpoint, **job.opts)
    budget = int(max_memory or _DEFAULT_MEMORY)
    found: list[Entry] = []
    for name, t in tensors.items():
        if name in job.quantized:
            found += _quantized_entries(job.preset, name, t, budget)
        else:
            found.append(_kept_entry(name, t, budget))
    shards = split_shards(found, int(max_shard_size))
    paths, index, config_path, stale = _targets(job, len(shards), overwrite)
    folder = os.path.dirname(out) or "."
    os.makedirs(folder, exist_ok=True)
    digest = job_digest(job.job)
    meta = {
        "format": "pt",
        "qstream": "{}",
        "qstream_format": "compressed-tensors",
        "qstream_job": digest,
    }
    with export_lock(out):
        paths, index, config_path, stale = _targets(job, len(shards), overwrite)
        todo = plan_copies(job.files, folder, _recorded(config_path)) if job.files else {}
        for f in [*paths, index, config_path]:
            remove_stale_partials(f)
        marker = paths[0] if len(shards) == 1 else index
        if os.path.isfile(marker):
            os.unlink(marker)
        for f in stale:
            os.unlink(f)
        for path, shard in list(zip(paths, shards, strict=True))[1 if len(shards) == 1 else 0 :]:
            write_safetensors(path, shard, meta)
        copy_files(todo, folder)
        doc = dict(job.config)
        doc["qstream_export"] = {
            "format": "compressed-tensors",
            "weights": os.path.basename(out),  # (the export this config describes)
            "job": digest,
            **({"files": manifest(job.files)} if job.files else {}),
        }
        write_json(config_path, doc)
        if len(shards) == 1:
            write_safetensors(paths[0], shards[0], meta)
        else:
            wmap = {
                e.name: os.path.basename(f) for f, s in zip(paths, shards, strict=True) for e in s
            }
            write_json(
                index,
                {
                    "metadata": {
                        "total_size": sum(e.nbytes for e in found),
                        "qstream": "export",
                        "qstream_job": digest,
                        "qstream_format": "compressed-tensors",
                    },
                    "weight_map": wmap,
                },
            )
    written = paths + [config_path] + ([index] if len(shards) > 1 else [])
    written += [os.path.join(folder, n) for n in todo]
    return {
        "checkpoint": job.checkpoint,
        "destination": out,
        "already_complete": False,
        "files": written,
        "scheme": job.preset.name,
        "tensors": {
            r["name"]: {
                "kept": r["target"] == "keep",
                "target": r["target"],
                "shape": r["shape"],
                "bytes_before": r["bytes_before"],
                "bytes_after": r["bytes_after"],
            }
            for r in job.rows
        },
        "bytes_before": sum(r["bytes_before"] for r in job.rows),
        "bytes_after": sum(os.path.getsize(f) for f in paths),
        "seconds": time.perf_counter() - start,
    }


def _targets(job: SchemeJob, n: int, replace: bool) -> tuple[list[str], str, str, list[str]]:
    """The files an export of ``n`` shards writes; refuses what is in the way."""
    out = job.out
    stem = out[: -len(".safetensors")]
    paths = [out] if n == 1 else [f"{stem}-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    index = f"{stem}.safetensors.index.json"
    config_path = os.path.join(os.path.dirname(out), CONFIG)
    written = paths + [config_path] + ([index] if n > 1 else [])
    marker = paths[0] if n == 1 else index
    check_targets(written, replace, marker=marker, described=out, job=job_digest(job.job))
    return paths, index, config_path, other_forms(out, index, written, replace)


def _recorded(path: str) -> dict[str, str]:
    doc = read_json(path) if os.path.isfile(path) else None
    files = ((doc or {}).get("qstream_export") or {}).get("files")
    return dict(files) if isinstance(files, dict) else {}


def _model_config(
    checkpoint: str | os.PathLike[str], config: str | os.PathLike[str] | dict[str, Any] | None
) -> dict[str, Any]:
    if isinstance(config, dict):
        doc: dict[str, Any] | None = json.loads(json.dumps(config))
    else:
        path = os.fspath(config) if config is not None else source_config(os.fspath(checkpoint))
        doc = read_json(path) if path else {}
        if doc is None:
            raise InvalidParameterError(f"{path}: not a readable JSON object (a model config)")
    doc = dict(doc or {})
    doc.pop("qstream_export", None)
    if "quantization_config" in doc:
        raise InvalidParameterError(
            f"{checkpoint}: the source is quantized already (its config has a"
            " quantization_config); --scheme quantizes float weights"
        )
    return doc


def _job(checkpoint: str | os.PathLike[str], p: Preset) -> str:
    """The identity of a scheme export: the source (its path and files' sizes and times) and
    the preset; only its digest is written."""
    path = os.path.abspath(os.fspath(checkpoint))
    stamp: list[Any] = []
    names = sorted(os.listdir(path)) if os.path.isdir(path) else [""]
    for n in names:
        try:
            st = os.stat(os.path.join(path, n) if n else path)
            stamp.append([n, st.st_size, st.st_mtime_ns])
        except OSError:
            continue
    h = hashlib.sha256(json.dumps(stamp).encode()).hexdigest()
    return f"scheme {p.to_json()} {path} {h}"


def _itemsize(tag: str) -> int:
    return {"F8_E4M3": 1, "U8": 1, "I8": 1, "BF16": 2, "F16": 2, "F32": 4, "I32": 4}.get(tag, 8)


def _slab_rows(cols: int, align: int, budget: int) -> int:
    """Weight rows a slab holds within ``budget`` (~12 float32 copies of a row), aligned."""
    rows = max(1, budget // max(1, cols * 4 * 12))
    return max(align, rows // align * align)


def _quantized_entries(p: Preset, name: str, t: Any, budget: int) -> list[Entry]:
    shape = (int(t.shape[0]), int(t.shape[1]))
    dtype = np.dtype(t.dtype)
    align = row_align(p)
    step = _slab_rows(shape[1], align, budget)
    module = name[: -len("weight")]
    amax: list[float] = []

    def peak() -> float:
        """The weight's largest magnitude, as a value of its dtype (NVFP4's global scale)."""
        if not amax:
            best, value = -1.0, 0.0
            for r0 in range(0, shape[0], step):
                rows = np.asarray(t[r0 : r0 + step])
                x = np.abs(rows.astype(np.float32))
                i = int(np.argmax(x))
                if x.reshape(-1)[i] > best:
                    best, value = float(x.reshape(-1)[i]), float(np.abs(rows.reshape(-1)[i]))
            amax.append(value)
        return amax[0]

    def reader(prm: Param) -> Any:
        def read(r0: int, r1: int) -> np.ndarray:
            if prm.rows_per == 0:  # a whole-tensor parameter: from the first slab
                rows = np.asarray(t[0 : min(shape[0], step)])
                whole = quantize_rows(p, rows, shape, peak() if p.float_format == "nvfp4" else None)
                return np.ascontiguousarray(whole[prm.suffix])
            k = prm.rows_per
            a, b = r0 * k, min(shape[0], r1 * k)
            a0, b = a // align * align, min(shape[0], -(-b // align) * align)
            parts = []
            for s0 in range(a0, b, step):
                rows = np.asarray(t[s0 : min(b, s0 + step)])
                gs = peak() if p.float_format == "nvfp4" else None
                parts.append(quantize_rows(p, rows, shape, gs)[prm.suffix])
            got = np.concatenate(parts) if len(parts) > 1 else parts[0]
            skip = (a - a0) // k
            return np.ascontiguousarray(got[skip : skip + (r1 - r0)])

        return read

    found = []
    for prm in params(p, shape, dtype):
        size = _itemsize(prm.tag)
        found.append(Entry(module + prm.suffix, prm.tag, prm.shape, size, reader(prm)))
    return found


def _kept_entry(name: str, t: Any, budget: int) -> Entry:
    dtype = np.dtype(t.dtype)
    shape = tuple(int(d) for d in t.shape)

    def read(r0: int, r1: int) -> np.ndarray:
        if not shape:
            return np.asarray(t[...])
        return np.ascontiguousarray(np.asarray(t[r0:r1]))

    return Entry(name, _PLAIN[dtype.name], shape, dtype.itemsize, read)
