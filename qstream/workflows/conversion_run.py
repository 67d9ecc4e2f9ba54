"""Carrying out a checkpoint conversion: its plan made (or taken), then the conversion into a
Zarr group, a GGUF file, a compressed-tensors folder (through a working group, exported and
removed) or a preset written straight from the source. The public function with its
documentation is :func:`qstream.convert_checkpoint`."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..engine.convert import convert as convert_group
from ..io.storage import store_errors
from ..spec import Recipe
from .conversion_plan import (
    ConversionPlan,
    export_job,
    make_parents,
    plan_convert,
    scaled_recipe,
    work_group,
)

if TYPE_CHECKING:
    from .types import ExecutorLike, OnTensor, PathLike, Progress, StorageOptions


def convert(
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
    plan: ConversionPlan | None = None,
    model_files: bool = True,
    scheme: str | None = None,
    tokenizer: bool = True,
    pure: bool = False,
    imatrix: PathLike | None = None,
    scale_dtype: str | None = None,
) -> dict[str, Any]:
    """:func:`qstream.convert_checkpoint` (documented there)."""
    with store_errors(dst):
        if not isinstance(recipe, Recipe):  # (read once: the plan and the run share it)
            recipe = Recipe.load(recipe) if recipe is not None else Recipe()
        recipe = scaled_recipe(recipe, dst, format, scale_dtype, scheme)  # (as the plan's)
        if plan is None:
            plan = plan_convert(
                checkpoint,
                dst,
                recipe,
                overwrite=overwrite,
                max_memory=max_memory,
                executor=executor,
                compression=compression,
                format=format,
                config=config,
                storage_options=storage_options,
                store=store,
                packs=packs,
                model_files=model_files,
                scheme=scheme,
                tokenizer=tokenizer,
                pure=pure,
                imatrix=imatrix,
                scale_dtype=scale_dtype,
            )
        return run_conversion(
            plan,
            checkpoint,
            dst,
            recipe,
            max_memory=max_memory,
            overwrite=overwrite,
            on_tensor=on_tensor,
            progress=progress,
            executor=executor,
            max_shard_size=max_shard_size,
            format=format,
            **({"storage_options": storage_options} if storage_options else {}),
            **({"store": store} if store else {}),
            **({"packs": packs} if packs is not None else {}),
        )


def run_conversion(
    plan: ConversionPlan,
    checkpoint: PathLike,
    dst: PathLike,
    recipe: Recipe,
    *,
    overwrite: bool,
    max_shard_size: int,
    format: str,
    **kw: Any,
) -> dict[str, Any]:
    """Carry out ``plan`` (made for these arguments by :func:`plan_convert`)."""
    make_parents(plan)
    if plan.prepared.__class__.__name__ == "SchemeJob":  # convert --scheme NAME
        from ..exports.scheme_export import run_scheme

        return run_scheme(plan.prepared, overwrite=overwrite, max_shard_size=max_shard_size,
                          max_memory=kw.get("max_memory"))  # fmt: skip
    if plan.kind == "gguf":
        from ..exports.gguf import write_plan

        return write_plan(plan.gguf, dst, overwrite=overwrite, max_memory=kw.get("max_memory"))
    if plan.kind == "safetensors":
        export = {"max_shard_size": max_shard_size, "format": format, "config": plan.config}
        export["files"] = plan.files
        return _to_safetensors(plan, checkpoint, os.fspath(dst), recipe, overwrite, export, kw)
    return convert_group(
        checkpoint,
        dst,
        recipe,
        overwrite=overwrite,
        compression=plan.prepared.compression,
        prepared=plan.prepared,
        **kw,
    )


def _to_safetensors(
    plan: ConversionPlan,
    checkpoint: PathLike,
    dst: str,
    recipe: Recipe,
    overwrite: bool,
    export: dict[str, Any],
    kw: dict[str, Any],
) -> dict[str, Any]:
    import contextlib

    from ..io.outputs import locked

    work = work_group(dst)
    if plan.action == "complete":  # a finished run of this conversion: nothing to do
        from ..exports import describe_export, finished_export

        files = finished_export(dst, export_job(checkpoint, recipe, export["format"])) or []
        index = dst.removesuffix(".safetensors") + ".safetensors.index.json"
        described = describe_export(index if index in files else dst)
        tensors = finished_rows(plan.tensors, described)
        return {
            "checkpoint": str(checkpoint),
            "destination": dst,
            "files": files,
            "tensors": tensors,
            "bytes_before": sum(r["bytes_before"] for r in tensors.values()),
            "bytes_after": sum(described["tensor_bytes"].values()),
            "already_complete": True,
            "seconds": 0.0,
        }
    # the working group is locked from the conversion to the end of the export, so that a
    # second run of it waits for this one instead of exporting what this one removes
    try:
        with locked(work):
            return _export_locked(plan, checkpoint, dst, recipe, work, overwrite, export, kw)
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(work)  # (only if nothing is left in it)


def _export_locked(
    plan: ConversionPlan,
    checkpoint: PathLike,
    dst: str,
    recipe: Recipe,
    work: str,
    overwrite: bool,
    export: dict[str, Any],
    kw: dict[str, Any],
) -> dict[str, Any]:
    from ..exports import export_safetensors
    from ..io.outputs import inspect_destination, remove_output

    job = export_job(checkpoint, recipe, export["format"])
    resuming = plan.action == "resume"
    prepared = plan.prepared
    result = convert_group(
        checkpoint,
        work,
        recipe,
        overwrite=overwrite,
        compression=prepared.compression,
        prepared=prepared,
        **kw,
    )
    exported = export_safetensors(
        work,
        dst,
        **export,
        overwrite=overwrite,
        replace_own=resuming,
        job=job,
        max_memory=kw.get("max_memory"),
    )
    existing = inspect_destination(work)
    if existing.kind == "checkpoint":  # only what the conversion wrote; anything else stays
        remove_output(work, existing)
    # (a resumed run whose conversion had finished still exported and cleaned up: not a no-op)
    on_disk = sum(os.path.getsize(f) for f in exported["files"] if os.path.isfile(f))
    return {
        **result,
        "tensors": exported_rows(result["tensors"], exported),
        "destination": dst,
        "files": exported["files"],
        # "after": every byte the file holds for its tensors, as the plan and inspect count
        "bytes_after": exported["bytes"],
        "file_bytes": on_disk,  # (and their headers)
        "already_complete": False,
    }


def finished_rows(rows: list[dict[str, Any]], described: dict[str, Any]) -> dict[str, Any]:
    """The rows of a finished export, as its conversion reported them: the plan's ``rows``
    with each tensor's "after" as the file holds it and its SQNR as the export recorded it
    (to 0.01 dB), and a row for a tensor the export added (an untied ``lm_head.weight``)."""
    from ..exports import recorded_db

    owned: dict[str, int] = described["tensor_bytes"]
    quantized: dict[str, Any] = described["quantized"]

    def error(name: str) -> dict[str, Any] | None:
        q = quantized.get(name)
        return {"sqnr_db": recorded_db(q.get("sqnr_db"))} if isinstance(q, dict) else None

    out = {}
    for r in rows:
        kept = r["target"] == "keep"
        out[r["name"]] = {**r, "kept": kept, "bytes_after": owned.get(r["name"], r["bytes_after"]),
                          **({} if kept else {"error": error(r["name"])})}  # fmt: skip
    for name in owned.keys() - out.keys():  # (written by the export: an untied lm_head)
        out[name] = {"name": name, "target": "untied", "kept": name not in quantized,
                     "bytes_before": 0, "bytes_after": owned[name],
                     "error": error(name)}  # fmt: skip
    return out


def exported_rows(rows: dict[str, Any], exported: dict[str, Any]) -> dict[str, Any]:
    """The conversion's rows with each tensor's "after" as the export's file holds it (its
    entries' bytes), and a row for a tensor the export added (an untied ``lm_head.weight``:
    the embedding's row, nothing before)."""
    owned: dict[str, int] = exported["tensor_bytes"]
    out = {n: {**r, "bytes_after": owned.get(n, r["bytes_after"])} for n, r in rows.items()}
    for name, source in exported.get("untied", {}).items():
        out[name] = {**rows[source], "name": name, "target": f"untied {source}",
                     "bytes_before": 0, "bytes_after": owned[name]}  # fmt: skip
    return out
