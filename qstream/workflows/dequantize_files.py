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
) -> dict[str, Any]:
    """A qstream ``.safetensors`` export dequantized: its tensors read as values
    (:mod:`qstream.io.checkpoints.exported`) and kept in ``dtype``, into a Zarr group or a file.
    ``plain_model``: a quantized model decoded into a ``.safetensors`` plain model, which
    leaves out the activation parameters (``input_scale``, ``k_scale``, ...) that only the
    quantized model uses."""
    from ..spec import Recipe
    from .conversion_plan import plan_convert
    from .conversion_run import convert

    recipe = Recipe.from_dict(
        {"min_rank": 0, "rules": [{"pattern": "*", "action": "keep", "dtype": dtype}]}
    )
    fmt = "qstream" if str(dst).endswith(".safetensors") else "compressed-tensors"
    plan = None
    if plain_model and fmt == "qstream":
        plan = plan_convert(
            src, dst, recipe, overwrite=overwrite, max_memory=max_memory, format=fmt
        )
        _leave_out_activation_params(plan)
    report = convert(
        src,
        dst,
        recipe,
        overwrite=overwrite,
        max_memory=max_memory,
        progress=progress,
        format=fmt,
        plan=plan,
    )
    return {**report, "dtype": dtype}


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


def decoded_gguf(
    src: PathLike,
    dst: PathLike,
    dtype: str,
    overwrite: bool,
    max_memory: int | None,
    progress: Progress | None,
) -> dict[str, Any]:
    """A GGUF file's tensors decoded (under their Hugging Face names where the architecture
    is known) into a Zarr group, or into ``dst.safetensors`` with a transformers
    ``config.json`` rebuilt from the file's metadata beside it: a folder transformers loads."""
    import os

    from ..io.checkpoints import gguf_config

    config = None
    if str(dst).endswith(".safetensors"):
        config = gguf_config(os.fspath(src), dtype=dtype)
    return _decoded_with_config(src, dst, dtype, overwrite, max_memory, progress, config)


def decoded_model(
    src: PathLike,
    dst: PathLike,
    dtype: str,
    overwrite: bool,
    max_memory: int | None,
    progress: Progress | None,
) -> dict[str, Any]:
    """A model folder's tensors as read (a quantized checkpoint's decoded as its own format
    decodes them) into a Zarr group, or into ``dst.safetensors`` with the source's
    ``config.json`` minus its ``quantization_config`` (``torch_dtype``: ``dtype``) beside it,
    so that transformers loads it as a plain model."""
    import json
    import os

    config, quantized = None, False
    where = os.path.join(os.fspath(src), "config.json")
    if str(dst).endswith(".safetensors") and os.path.isfile(where):
        from ..paths import open_regular

        with open_regular(where, "model config") as f:
            config = json.loads(f.read())
        if not isinstance(config, dict):
            config = None
        else:
            quantized = config.pop("quantization_config", None) is not None
            config["torch_dtype"] = dtype
    return _decoded_with_config(src, dst, dtype, overwrite, max_memory, progress, config, quantized)


def _decoded_with_config(
    src: PathLike,
    dst: PathLike,
    dtype: str,
    overwrite: bool,
    max_memory: int | None,
    progress: Progress | None,
    config: dict[str, Any] | None,
    quantized: bool = False,
) -> dict[str, Any]:
    """The keep-everything conversion of ``src`` in ``dtype`` (``quantized``: a quantized
    model's, its activation parameters left out), then ``config`` written as the
    ``config.json`` beside a ``.safetensors`` ``dst``; a ``config.json`` already there that
    says something else is refused before any work (qstream never replaces a file it did
    not write)."""
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
    plain_model = config is not None and quantized
    report = decoded(src, dst, dtype, overwrite, max_memory, progress, plain_model)
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
) -> dict[str, Any]:
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
        )
    return {
        "destination": path,
        "files": out["files"],
        "tensors": out["tensors"],
        "bytes": out["bytes"],
        "dtype": dtype,
        "already_complete": False,
        "seconds": time.perf_counter() - t0,
    }
