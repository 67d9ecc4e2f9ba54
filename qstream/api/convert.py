"""Convert a whole checkpoint (the job is in :mod:`qstream.engine.checkpoint`)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..engine.checkpoint import TensorEvent, convert
from ..errors import InvalidParameterError
from ..io import compression as compressions
from ..io.stores import store_errors
from ..recipe import Recipe

if TYPE_CHECKING:
    from ..io.checkpoint_tensor import TensorLike
    from .types import ExecutorLike, OnTensor, PathLike, Progress, StorageOptions

__all__ = ["TensorEvent", "convert_checkpoint", "open_checkpoint", "plan_conversion"]


def convert_checkpoint(
    checkpoint: PathLike,
    dst: PathLike,
    recipe: Recipe | PathLike | None = None,
    *,
    max_memory: int | None = None,
    overwrite: bool = False,
    on_tensor: OnTensor | None = None,
    progress: Progress | None = None,
    executor: ExecutorLike = None,
    max_shard_size: int = 5 * 10**9,
    compression: str | None = "auto",
    format: str = "compressed-tensors",
    config: PathLike | dict[str, Any] | None = None,
    storage_options: StorageOptions | None = None,
    store: str | None = None,
    packs: bool | None = None,
) -> dict[str, Any]:
    """Quantize every tensor of ``checkpoint`` the recipe selects into the group ``dst``.

    ``checkpoint`` may be an object-store URL (``s3://bucket/model/``: a safetensors file, a
    folder or a ``*.safetensors.index.json``): tensors are read by byte ranges through
    ``store`` (``"fsspec"``, default, or ``"obstore"``) with ``storage_options`` (as for
    :func:`qstream.quantize_store`); ``dst`` may be a URL too (written through fsspec, with
    ``storage_options`` when ``store`` is fsspec). FP8 tensors read as float32, FP8 weights
    with block scales (``W_scale_inv``, see the recipe's ``[scales]``) as their dequantized
    float32 values; the scale tensors are consumed.

    ``checkpoint``: safetensors (file, directory or sharded index), ``.npz``, ``.npy``, a
    Zarr group, or a torch ``.pt``/``.bin`` state dict. ``dst`` (a local directory) becomes a
    Zarr group with one quantized group (or kept array) per tensor; the destination rules of
    :func:`qstream.quantize_store` apply to it. A re-run of the same conversion resumes.
    ``on_tensor`` is called before and after each tensor; ``progress(done, total)`` per block.
    ``executor``: see :func:`qstream.quantize_store` (with a cluster, the checkpoint and
    ``dst`` must be on a filesystem every worker shares).

    ``dst`` ending in ``.safetensors``: the tensors are converted into a working Zarr group
    beside it (``DST.qstream-work``, the quantized size), exported as safetensors (see
    :func:`qstream.export_safetensors`; sharded above ``max_shard_size``) and the working group
    is removed; an interrupted run keeps it, so the same call resumes.

    ``recipe``: a :class:`~qstream.Recipe` or the path of a recipe TOML file.

    ``compression``: how the tensors' chunks are compressed (see
    :func:`qstream.quantize_store`; ``"auto"`` is zstd, since no tensor comes from a Zarr v3
    array). A ``.safetensors`` export is never compressed: its working group is written raw,
    and ``compression`` may only be ``"auto"`` or ``"none"``. ``format`` and ``config``: the
    export's layout and the model config it carries (see :func:`qstream.export_safetensors`);
    every tensor the recipe quantizes is checked against the layout before any work.

    ``dst`` ending in ``.gguf``: a GGUF file for llama.cpp, written in one streaming pass (see
    :func:`qstream.export_gguf`): the recipe's int8 tensors as Q8_0, symmetric int4 as Q4_0,
    asymmetric 4-bit as Q4_1, bit for bit as gguf-py quantizes; ``format`` may name one GGUF
    type for all of them.

    ``packs``: small tensors alike in shape, dtype and spec (runs of them: a
    mixture-of-experts layer's experts; and alike ones alone between others, gathered: a
    router gate a layer) are stored stacked, a group a pack (``DST/_packs/``, see
    :mod:`qstream.io.packs`): a conversion then costs per byte, not per tensor. None (the
    default): when the checkpoint holds at least 64 tensors and ``dst`` is a local
    directory, or as an earlier run of this conversion at ``dst`` did (it is resumed or found
    complete as it was made; ``overwrite`` makes it again by the default);
    ``open_quantized`` reads packed tensors as any other.
    """
    with store_errors(dst):
        return _convert_checkpoint(
            checkpoint,
            dst,
            recipe,
            max_memory=max_memory,
            overwrite=overwrite,
            on_tensor=on_tensor,
            progress=progress,
            executor=executor,
            max_shard_size=max_shard_size,
            compression=compression,
            format=format,
            config=config,
            **({"storage_options": storage_options} if storage_options else {}),
            **({"store": store} if store else {}),
            **({"packs": packs} if packs is not None else {}),
        )


def _convert_checkpoint(
    checkpoint: PathLike,
    dst: PathLike,
    recipe: Recipe | PathLike | None,
    *,
    overwrite: bool,
    max_shard_size: int,
    compression: str | None,
    format: str,
    config: PathLike | dict[str, Any] | None,
    **kw: Any,
) -> dict[str, Any]:
    from ..io.suffixes import check_destination_suffix

    check_destination_suffix(dst, (".safetensors", ".gguf"), "a conversion")
    compression = compressions.canonical(compression)
    if recipe is not None and not isinstance(recipe, Recipe):
        recipe = Recipe.load(recipe)
    if str(dst).endswith(".gguf"):
        from ..io.gguf import export_gguf

        return export_gguf(
            checkpoint,
            dst,
            recipe=recipe,
            config=config,
            overwrite=overwrite,
            type=None if format == "compressed-tensors" else format,
            max_memory=kw.get("max_memory"),
        )
    if str(dst).endswith(".safetensors"):
        if compression not in (compressions.AUTO, compressions.NONE):
            raise InvalidParameterError(
                f"compression {compression!r} does not apply to a .safetensors destination"
                " (safetensors files are never compressed): leave it 'auto', or convert into a"
                " directory"
            )
        return _to_safetensors(
            checkpoint,
            dst,
            recipe,
            overwrite=overwrite,
            export={"max_shard_size": max_shard_size, "format": format, "config": config},
            **kw,
        )
    return convert(
        checkpoint, dst, recipe or Recipe(), overwrite=overwrite, compression=compression, **kw
    )


def _to_safetensors(
    checkpoint: PathLike,
    dst: PathLike,
    recipe: Recipe | None,
    *,
    overwrite: bool,
    export: dict[str, Any],
    **kw: Any,
) -> dict[str, Any]:
    import contextlib
    import json
    import os

    from ..errors import StoreError
    from ..io.checkpoints import open_checkpoint, source_locations
    from ..io.destination import check_separate, inspect_destination, locked
    from ..io.export import shard_pattern
    from ..io.stores import location

    dst = os.fspath(dst)
    source = location(checkpoint) or str(checkpoint)
    recipe = recipe or Recipe()
    ident = {"source": source, "recipe": recipe.to_dict(), "format": export["format"]}
    job = json.dumps(ident, sort_keys=True)
    index = dst.removesuffix(".safetensors") + ".safetensors.index.json"
    work = f"{dst}.qstream-work"
    # nothing this run writes may be (or hold) a file the checkpoint is read from
    opts = {k: kw[k] for k in ("storage_options", "store") if kw.get(k)}
    tensors = open_checkpoint(checkpoint, **opts)
    _check_layout(tensors, recipe, export["format"], dst)
    sources = source_locations(checkpoint, tensors)
    for target in (dst, index, work):
        check_separate(sources, target)
    shards = shard_pattern(dst)
    for src in sources:
        if os.path.dirname(src) == os.path.dirname(location(dst) or dst) and shards.fullmatch(
            os.path.basename(src)
        ):
            raise StoreError(
                f"the destination {dst} would be written in shards named like the checkpoint's"
                f" file {src}; write the output somewhere else"
            )
    if inspect_destination(work).kind not in ("absent", "empty", "checkpoint"):
        raise StoreError(
            f"{work}, where this conversion keeps its working group, holds something else;"
            " qstream will not write there: move it away"
        )
    # the working group is locked from the conversion to the end of the export, so that a
    # second run of it waits for this one instead of exporting what this one removes
    try:
        with locked(work):
            return _export_locked(checkpoint, dst, recipe, job, work, index, overwrite, export, kw)
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(work)  # (only if nothing is left in it)


def _check_layout(tensors: dict[str, Any], recipe: Recipe, format: str, dst: str) -> None:
    """Refuse, before any work, a tensor the recipe quantizes that the export layout cannot
    express (see :mod:`qstream.io.compressed_tensors`; FP8 block scales are consumed by
    their weights, as the conversion pairs them), and a ``config.json`` beside ``dst`` that
    qstream did not write."""
    from ..io import compressed_tensors, export
    from ..io.fp8 import pair_scales

    if format not in export.FORMATS:
        raise InvalidParameterError(
            f"unknown export format {format!r}; expected one of: {', '.join(export.FORMATS)}"
        )
    if format != "compressed-tensors":
        recipe.check(pair_scales(tensors, recipe.scales))
        return
    export.check_targets([os.path.join(os.path.dirname(dst), export.CONFIG)], replace=True)
    paired = pair_scales(tensors, recipe.scales)
    recipe.check(paired)  # (its warnings: the conversion gives them)
    for name, t in paired.items():
        spec = recipe.spec_for(name, t.shape, t.dtype)
        if spec is not None:
            compressed_tensors.layout(name, t.shape, spec)


def _export_locked(
    checkpoint: PathLike,
    dst: str,
    recipe: Recipe,
    job: str,
    work: str,
    index: str,
    overwrite: bool,
    export: dict[str, Any],
    kw: dict[str, Any],
) -> dict[str, Any]:
    import os

    from ..errors import StoreError
    from ..io.destination import inspect_destination, remove_output
    from ..io.export import export_safetensors, finished_export

    # the working group of an interrupted run (its identity is checked by ``convert``): this
    # run resumes it and may replace the export files that run wrote
    work_root = inspect_destination(work)
    resuming = work_root.kind == "checkpoint"
    done_files = None if overwrite or resuming else finished_export(dst, job)
    if done_files is not None:  # a finished run of this conversion: nothing to do
        return {
            "checkpoint": str(checkpoint),
            "destination": dst,
            "files": done_files,
            "tensors": {},
            "already_complete": True,
            "seconds": 0.0,
        }
    for done in (dst, index):  # a finished export
        if os.path.exists(done) and not (overwrite or resuming):
            raise StoreError(f"{done} exists; pass overwrite=True to replace it")
    # the working group is read once and removed: raw chunks are written and read fastest
    # (one an earlier version began compressed is resumed as it was begun)
    compression = compressions.NONE
    if resuming and not overwrite:
        compression = (work_root.meta or {}).get("compression", compressions.AUTO)
    result = convert(
        checkpoint, work, recipe or Recipe(), overwrite=overwrite, compression=compression, **kw
    )
    exported = export_safetensors(
        work, dst, **export, overwrite=overwrite, replace_own=resuming, job=job
    )
    existing = inspect_destination(work)
    if existing.kind == "checkpoint":  # only what the conversion wrote; anything else stays
        remove_output(work, existing)
    # (a resumed run whose conversion had finished still exported and cleaned up: not a no-op)
    on_disk = sum(os.path.getsize(f) for f in exported["files"] if os.path.isfile(f))
    return {
        **result,
        "destination": dst,
        "files": exported["files"],
        "bytes_after": on_disk,  # the files' sizes, not the working group's
        "already_complete": False,
    }


def plan_conversion(
    checkpoint: PathLike,
    recipe: Recipe | PathLike | None = None,
    *,
    storage_options: StorageOptions | None = None,
    store: str | None = None,
) -> list[dict[str, Any]]:
    """What :func:`convert_checkpoint` would do, without doing it (nothing is written): for
    each tensor its name, shape, stored dtype, target (the spec, or ``keep``) and bytes
    before and after (codes and parameters). The recipe is checked as the conversion checks
    it (an axis a tensor lacks is an error; rules that match nothing are warned about)."""
    import math
    import warnings

    import numpy as np

    from ..engine.checkpoint import describe_target
    from ..errors import QStreamWarning
    from ..io.checkpoints import open_checkpoint
    from ..io.fp8 import pair_scales

    if not isinstance(recipe, Recipe):
        recipe = Recipe.load(recipe) if recipe is not None else Recipe()
    tensors = open_checkpoint(
        checkpoint, storage_options=storage_options or None, store=store or None
    )
    tensors = pair_scales(tensors, recipe.scales)
    for warning in recipe.check(tensors):
        warnings.warn(warning, QStreamWarning, stacklevel=2)
    rows = []
    for name, t in tensors.items():
        shape = tuple(int(d) for d in t.shape)
        n = math.prod(shape)
        stored = np.dtype(getattr(t, "source_dtype", t.dtype))
        spec = recipe.spec_for(name, shape, t.dtype)
        if spec is None:
            keep = recipe.keep_dtype(name, shape, t.dtype)
            after = n * (np.dtype(keep).itemsize if keep else np.dtype(t.dtype).itemsize)
            target = f"keep/{keep}" if keep else "keep"
        else:
            qt = spec.qtype
            params = 1
            if spec.axis is not None:
                axis = spec.axis % len(shape)
                params = (
                    shape[axis]
                    if not spec.block_size
                    else n // shape[axis] * math.ceil(shape[axis] / spec.block_size)
                )
            per_param = (2 if spec.half_scales else 4) + (0 if spec.symmetric else qt.bits / 8)
            after = int(math.ceil(n * qt.bits / 8) + params * per_param)
            target = describe_target(spec)
        rows.append(
            {
                "name": name,
                "shape": list(shape),
                "dtype": stored.name,
                "target": target,
                "bytes_before": int(n * stored.itemsize),
                "bytes_after": int(after),
            }
        )
    return rows


def open_checkpoint(
    checkpoint: PathLike,
    *,
    storage_options: StorageOptions | None = None,
    store: str | None = None,
) -> dict[str, TensorLike]:
    """The tensors of ``checkpoint`` (a safetensors file, folder or index, .npy/.npz, .pt/.bin,
    a Zarr group; local or a URL) by name, in the files' order, each read lazily by slices
    (``t[...]``, ``t.shape``, ``t.dtype``). FP8 weights come paired with their scale tensors
    (read as ``float32(W) * s``), as a conversion reads them; nothing is written."""
    from ..io.checkpoints import open_checkpoint as open_tensors
    from ..io.fp8 import pair_scales

    tensors = open_tensors(checkpoint, storage_options=storage_options or None, store=store)
    return pair_scales(tensors)
