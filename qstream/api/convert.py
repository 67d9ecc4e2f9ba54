"""Convert a whole checkpoint (the job is in :mod:`qstream.engine.checkpoint`)."""

from __future__ import annotations

import os
from collections.abc import Callable

from ..engine.checkpoint import TensorEvent, convert
from ..errors import InvalidParameterError
from ..io import compression as compressions
from ..io.stores import store_errors
from ..recipe import Recipe

__all__ = ["TensorEvent", "convert_checkpoint"]


def convert_checkpoint(
    checkpoint,
    dst,
    recipe: Recipe | str | os.PathLike | None = None,
    *,
    max_memory: int | None = None,
    overwrite: bool = False,
    on_tensor: Callable[[TensorEvent], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
    executor=None,
    max_shard_size: int = 5 * 10**9,
    compression: str | None = "auto",
) -> dict:
    """Quantize every tensor of ``checkpoint`` the recipe selects into the group ``dst``.

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
    and ``compression`` may only be ``"auto"`` or ``"none"``.
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
        )


def _convert_checkpoint(
    checkpoint, dst, recipe, *, overwrite, max_shard_size, compression, **kw
) -> dict:
    compression = compressions.canonical(compression)
    if recipe is not None and not isinstance(recipe, Recipe):
        recipe = Recipe.load(recipe)
    if str(dst).endswith(".safetensors"):
        if compression not in (compressions.AUTO, compressions.NONE):
            raise InvalidParameterError(
                f"compression {compression!r} does not apply to a .safetensors destination"
                " (safetensors files are never compressed): leave it 'auto', or convert into a"
                " directory"
            )
        return _to_safetensors(
            checkpoint, dst, recipe, overwrite=overwrite, max_shard_size=max_shard_size, **kw
        )
    return convert(
        checkpoint, dst, recipe or Recipe(), overwrite=overwrite, compression=compression, **kw
    )


def _to_safetensors(checkpoint, dst, recipe, *, overwrite, max_shard_size, **kw) -> dict:
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
    job = json.dumps({"source": source, "recipe": (recipe or Recipe()).to_dict()}, sort_keys=True)
    index = dst.removesuffix(".safetensors") + ".safetensors.index.json"
    work = f"{dst}.qstream-work"
    # nothing this run writes may be (or hold) a file the checkpoint is read from
    sources = source_locations(checkpoint, open_checkpoint(checkpoint))
    for target in (dst, index, work):
        check_separate(sources, target)
    shards = shard_pattern(dst)
    for src in sources:
        if os.path.dirname(src) == os.path.dirname(location(dst)) and shards.fullmatch(
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
            return _export_locked(
                checkpoint, dst, recipe, job, work, index, overwrite, max_shard_size, kw
            )
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(work)  # (only if nothing is left in it)


def _export_locked(checkpoint, dst, recipe, job, work, index, overwrite, max_shard_size, kw):
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
        compression = work_root.meta.get("compression", compressions.AUTO)
    result = convert(
        checkpoint, work, recipe or Recipe(), overwrite=overwrite, compression=compression, **kw
    )
    exported = export_safetensors(
        work,
        dst,
        max_shard_size=max_shard_size,
        overwrite=overwrite,
        replace_own=resuming,
        job=job,
    )
    existing = inspect_destination(work)
    if existing.kind == "checkpoint":  # only what the conversion wrote; anything else stays
        remove_output(work, existing)
    # (a resumed run whose conversion had finished still exported and cleaned up: not a no-op)
    return {**result, "destination": dst, "files": exported["files"], "already_complete": False}
