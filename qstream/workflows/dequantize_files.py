"""Decoding to files: a quantized output, a model folder (a quantized checkpoint decoded as
its format's decompressor decodes it) or a GGUF file written as plain values, into a Zarr
group or a ``.safetensors`` folder transformers loads. The public function is
:func:`qstream.dequantize_store`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..io.storage import store_errors

if TYPE_CHECKING:
    from .types import PathLike, Progress, StorageOptions


def decoded(
    src: PathLike,
    dst: PathLike,
    dtype: str,
    overwrite: bool,
    max_memory: int | None,
    progress: Progress | None,
    plain_model: bool = False,
    *,
    storage_options: StorageOptions | None = None,
    store: str | None = None,
) -> dict[str, Any]:
    """A qstream ``.safetensors`` export dequantized: its tensors read as values
    (:mod:`qstream.io.checkpoints.exported`) and kept in ``dtype``, into a Zarr group or a file.
    ``plain_model``: a quantized model decoded into a ``.safetensors`` plain model, which
    leaves out the activation parameters (``input_scale``, ``k_scale``, ...) that only the
    quantized model uses. ``storage_options``, ``store``: how a URL ``src`` is read (as
    :func:`qstream.open_checkpoint` reads it)."""
    from .conversion_run import convert

    urls: dict[str, Any] = {"storage_options": storage_options, "store": store}
    plan = decoded_plan(src, dst, dtype, overwrite, max_memory, plain_model, **urls)
    recipe, fmt = _decoding(dst, dtype)
    report = convert(
        src,
        dst,
        recipe,
        overwrite=overwrite,
        max_memory=max_memory,
        progress=progress,
        format=fmt,
        plan=plan,
        **{k: v for k, v in urls.items() if v},
    )
    return {**report, "dtype": dtype}


def _decoding(dst: PathLike, dtype: str) -> tuple[Any, str]:
    """The recipe (every tensor kept, in ``dtype``) and the layout of a decoding."""
    from ..spec import Recipe

    recipe = Recipe.from_dict(
        {"min_rank": 0, "rules": [{"pattern": "*", "action": "keep", "dtype": dtype}]}
    )
    return recipe, "qstream" if str(dst).endswith(".safetensors") else "compressed-tensors"


def decoded_plan(
    src: PathLike,
    dst: PathLike,
    dtype: str,
    overwrite: bool,
    max_memory: int | None,
    plain_model: bool = False,
    *,
    storage_options: StorageOptions | None = None,
    store: str | None = None,
) -> Any:
    """The plan (:class:`~qstream.workflows.conversion_plan.ConversionPlan`) of
    :func:`decoded` with these arguments, refusing what it refuses, nothing written."""
    from .conversion_plan import plan_convert

    recipe, fmt = _decoding(dst, dtype)
    plan = plan_convert(src, dst, recipe, overwrite=overwrite, max_memory=max_memory, format=fmt,
                        storage_options=storage_options, store=store)  # fmt: skip
    if plain_model and fmt == "qstream":
        _leave_out_activation_params(plan)
    decoded = _decoded_rows(plan.prepared.tensors, plan.tensors, dtype)
    plan.rows = decoded
    return plan


def _decoded_rows(
    tensors: dict[str, Any], rows: list[dict[str, Any]], dtype: str
) -> list[dict[str, Any]]:
    """The plan's rows as a decoding makes them: a tensor stored quantized (a GGUF block
    type; an exported tensor's codes, scales and zero points) is ``decode/<dtype>`` from its
    stored type and bytes, the others ``keep`` as the plan says (the conversion that decodes
    reads every tensor as its float values, so its own rows call them all kept)."""
    out = []
    for r in rows:
        t = tensors.get(r["name"])
        stored = _stored_form(t)
        if stored is not None:
            kind, nbytes = stored
            r = {**r, "dtype": kind, "bytes_before": nbytes}
            if kind not in _GGUF_FLOATS:  # (a float type is read as it is: kept, cast)
                r["target"] = f"decode/{dtype}"
        out.append(r)
    return out


_GGUF_FLOATS = ("F32", "F16", "BF16", "F64")


def _stored_form(t: Any) -> tuple[str, int] | None:
    """(stored type, stored bytes) of a GGUF tensor, or of an exported one a decoding reads
    quantized; None for another."""
    gtype = getattr(t, "type", None)
    if isinstance(gtype, str) and hasattr(t, "row_bytes"):  # (a GGUF tensor)
        return gtype, int(t.nbytes)
    qt = getattr(t, "qtype", None)
    codes = getattr(t, "codes", None)
    if qt is not None and codes is not None:  # (an exported tensor: codes and parameters)
        parts = (codes, getattr(t, "scale_t", None), getattr(t, "zp_t", None))
        return str(qt.name), int(sum(int(getattr(p, "nbytes", 0) or 0) for p in parts))
    return None


def _leave_out_activation_params(plan: Any) -> None:
    """The plan's tensors without the source's activation parameters (a plain model has
    none: transformers would find them unexpected)."""
    from ..io.checkpoints import is_activation_param

    prepared = plan.prepared
    for name in [n for n in prepared.tensors if is_activation_param(n)]:
        del prepared.tensors[name]
        prepared.keys.pop(name, None)
    plan.rows = [r for r in plan.tensors if not is_activation_param(r["name"])]


def model_folder(src: object) -> bool:
    """Whether ``src`` is a local folder of safetensors files (a model as transformers saves
    it), not a Zarr group."""
    import os

    if not isinstance(src, str | os.PathLike) or not os.path.isdir(src):
        return False
    names = os.listdir(src)
    return "zarr.json" not in names and any(n.endswith(".safetensors") for n in names)


def config_for(
    src: PathLike,
    dst: PathLike,
    dtype: str,
    *,
    storage_options: StorageOptions | None = None,
    store: str | None = None,
) -> tuple[dict[str, Any] | None, bool]:
    """The ``config.json`` a decoding of a GGUF file or a model folder writes beside a
    ``.safetensors`` ``dst`` (None: none), and whether the source was quantized (its
    ``quantization_config`` removed): a GGUF file's rebuilt from its metadata, a folder's
    its own (``torch_dtype``: ``dtype``); a GGUF URL's header is read through ``store`` with
    ``storage_options``."""
    import json
    import os

    if not str(dst).endswith(".safetensors"):
        return None, False
    if str(src).lower().endswith(".gguf"):
        from ..io.checkpoints.gguf_metadata import gguf_config

        opts = dict(storage_options) if storage_options else None
        return gguf_config(os.fspath(src), dtype=dtype, storage_options=opts, store=store), False
    where = os.path.join(os.fspath(src), "config.json")
    if not os.path.isfile(where):
        return None, False
    from ..input_files import open_regular

    with open_regular(where, "model config") as f:
        config = json.loads(f.read())
    if not isinstance(config, dict):
        return None, False
    quantized = config.pop("quantization_config", None) is not None
    config["torch_dtype"] = dtype
    return config, quantized


def check_config(src: PathLike, dst: PathLike, config: dict[str, Any] | None) -> str:
    """Where the ``config`` of a decoding goes (beside ``dst``); a ``config.json`` already
    there that says something else is refused (qstream never replaces a file it did not
    write)."""
    import json
    import os

    from ..errors import InvalidParameterError

    where = os.path.join(os.path.dirname(os.path.abspath(os.fspath(dst))), "config.json")
    if config is not None and os.path.lexists(where):
        try:
            with open(where, encoding="utf-8") as f:
                same = json.load(f) == config
        except (OSError, ValueError):
            same = False
        if not same:
            raise InvalidParameterError(
                f"{where} exists and is not the config of {os.fspath(src)}; qstream does"
                " not replace a file it did not write: remove it or choose another folder"
            )
    return where


def decoded_source(
    src: PathLike,
    dst: PathLike,
    dtype: str,
    overwrite: bool,
    max_memory: int | None,
    progress: Progress | None,
    *,
    storage_options: StorageOptions | None = None,
    store: str | None = None,
) -> dict[str, Any]:
    """A model folder's tensors as read (a quantized checkpoint's decoded as its own format
    decodes them) or a GGUF file's (under their Hugging Face names where the architecture is
    known) into a Zarr group, or into ``dst.safetensors`` with the model's ``config.json``
    beside it (:func:`config_for`: the folder's minus its ``quantization_config``, or one
    rebuilt from the GGUF file's metadata), so that transformers loads it as a plain model.
    ``storage_options``, ``store``: how a GGUF URL ``src`` is read."""
    urls: dict[str, Any] = {"storage_options": storage_options, "store": store}
    config, quantized = config_for(src, dst, dtype, **urls)
    return _decoded_with_config(
        src, dst, dtype, overwrite, max_memory, progress, config, quantized, **urls
    )


def _decoded_with_config(
    src: PathLike,
    dst: PathLike,
    dtype: str,
    overwrite: bool,
    max_memory: int | None,
    progress: Progress | None,
    config: dict[str, Any] | None,
    quantized: bool = False,
    **urls: Any,
) -> dict[str, Any]:
    """The keep-everything conversion of ``src`` in ``dtype`` (``quantized``: a quantized
    model's, its activation parameters left out), then ``config`` written as the
    ``config.json`` beside a ``.safetensors`` ``dst``; a ``config.json`` already there that
    says something else is refused before any work (qstream never replaces a file it did
    not write)."""
    import json
    import os

    where = check_config(src, dst, config)
    plain_model = config is not None and quantized
    report = decoded(src, dst, dtype, overwrite, max_memory, progress, plain_model, **urls)
    if config is not None:
        from ..paths import rename_in, write_new

        folder = os.path.dirname(where)
        tmp = f"config.json.{os.getpid()}.partial"
        write_new(os.path.join(folder, tmp), (json.dumps(config, indent=2) + "\n").encode())
        rename_in(folder, tmp, "config.json")
        report["config"] = where
    return report


def to_safetensors(
    src: PathLike,
    dst: PathLike,
    dtype: str,
    overwrite: bool,
    storage_options: StorageOptions | None,
    max_memory: int | None,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """A qstream output's values exported as ``dst`` (a ``.safetensors``); ``dry_run``:
    decided and refused as the export is, nothing written (``entries``: what it writes);
    ``progress``: told the bytes written (a ``write`` pass)."""
    import json
    import os
    import time

    from ..exports import export_safetensors, finished_export
    from ..io.storage import location

    path = os.fspath(dst)
    job = json.dumps({"dequantize": location(src) or str(src), "dtype": dtype}, sort_keys=True)
    done = None if overwrite else finished_export(path, job)
    if done is not None:
        return {"destination": path, "files": done, "already_complete": True, "dtype": dtype}
    t0 = time.perf_counter()
    with store_errors(src):
        out = export_safetensors(
            src,
            path,
            format="dequantized",
            dtype=dtype,
            overwrite=overwrite,
            storage_options=storage_options,
            job=job,
            max_memory=max_memory,
            dry_run=dry_run,
            progress=progress,
        )
    if dry_run:
        return {**out, "destination": path, "dtype": dtype}
    return {
        "destination": path,
        "files": out["files"],
        "tensors": out["tensors"],
        "bytes": out["bytes"],
        "dtype": dtype,
        "already_complete": False,
        "seconds": time.perf_counter() - t0,
    }
