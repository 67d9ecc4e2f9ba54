"""A conversion decided before its first tensor byte: :func:`plan_convert` (issue 44).

Everything ``convert_checkpoint`` can refuse is decided here, from the checkpoint's headers,
its ``config.json``, the recipe and what is at the destination: destination rules (files
qstream did not write, ``overwrite``, object stores), the source's ``quantization_config``,
the export layout's limits (groups that do not divide, 4-bit embeddings, GGUF block types) and
the parent folders to create. ``convert_checkpoint`` runs the plan it makes (or is handed);
``qstream convert --dry-run`` prints it and exits as the run would.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..budget import check_max_memory
from ..errors import InvalidParameterError, StoreError
from ..io.storage import compression as compressions
from ..qtypes import did_you_mean
from ..spec import Recipe
from . import plan_rows
from .gguf_job import gguf_plan
from .plan_rows import tensor_rows
from .scheme_plan import scheme_plan

if TYPE_CHECKING:
    from .types import ExecutorLike, PathLike, StorageOptions

__all__ = ["ConversionPlan", "plan_convert", "tensor_rows"]

# a source's quantization_config qstream decodes (DeepSeek's FP8 scales): replaced in exports
DECODED_METHODS = ("fp8", "compressed-tensors", "mxfp4")


@dataclass
class ConversionPlan:
    """What a conversion will do, decided before any tensor is read.

    ``kind``: ``zarr`` (a Zarr group), ``safetensors`` or ``gguf``; ``action``: ``create``
    (a new output), ``resume`` (an interrupted run of this job), ``complete`` (finished
    already: nothing to do) or ``replace`` (``overwrite``); ``tensors``: a row per tensor
    (name, shape, dtype, target, bytes before and after; GGUF: its type and rule);
    ``creates``: the missing parent folders the run makes; ``config``: the model config an
    export carries (a path, a dict with the source's decoded quantization_config removed, or
    None); ``notes``: what the plan decided that a user should know."""

    checkpoint: str
    destination: str
    kind: str
    action: str
    creates: list[str] = field(default_factory=list)
    config: str | dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    # the model's non-weight files (tokenizer, chat template, ...) copied beside an export
    files: list[str] = field(default_factory=list)
    # what the run takes from the plan (not part of its JSON)
    prepared: Any = field(default=None, repr=False, compare=False)
    gguf: Any = field(default=None, repr=False, compare=False)
    # the rows, or what makes them when first asked (a run does not make rows it never shows)
    rows: list[dict[str, Any]] | Callable[[], list[dict[str, Any]]] = field(
        default_factory=list, repr=False, compare=False
    )

    @property
    def group(self) -> str | None:
        """The Zarr group the conversion writes its tensors into (and a resumed run reads what
        it finished from): the destination, or for a safetensors export its working group
        beside it (:func:`work_group`); None for a GGUF file."""
        if self.kind == "zarr":
            return self.destination
        return work_group(self.destination) if self.kind == "safetensors" else None

    @property
    def loads_kernels(self) -> bool:
        """Whether the run loads Numba: not into a complete output, nor for a small job."""
        twins = self.kind != "gguf" and getattr(self.prepared, "numpy_kernels", False)
        return self.action != "complete" and not twins

    @property
    def tensors(self) -> list[dict[str, Any]]:
        """A row per tensor (see the class docstring)."""
        if callable(self.rows):
            self.rows = self.rows()
        return self.rows

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-able data (``--dry-run --json``)."""
        config = self.config if not isinstance(self.config, dict) else "(source's, adjusted)"
        return {
            "checkpoint": self.checkpoint,
            "destination": self.destination,
            "kind": self.kind,
            "action": self.action,
            "creates": list(self.creates),
            "config": config,
            "notes": list(self.notes),
            "copies": [os.path.basename(f) for f in self.files],
            "plan": [dict(r) for r in self.tensors],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ConversionPlan:
        """The plan of :meth:`to_dict` (without what only the run holds)."""
        return cls(
            checkpoint=d["checkpoint"],
            destination=d["destination"],
            kind=d["kind"],
            action=d["action"],
            rows=[dict(r) for r in d["plan"]],
            creates=list(d.get("creates", [])),
            config=d.get("config"),
            notes=list(d.get("notes", [])),
        )


def work_group(dst: str) -> str:
    """Where a conversion into the safetensors file ``dst`` keeps its working Zarr group (read
    once by the export, then removed; a re-run after an interruption resumes it)."""
    return f"{dst}.qstream-work"


def kind_of_destination(dst: PathLike) -> str:
    """``gguf``, ``safetensors`` or ``zarr``: what a conversion into ``dst`` writes."""
    name = str(dst).lower()
    if name.endswith(".gguf"):
        return "gguf"
    if name.endswith(".safetensors"):
        return "safetensors"
    return "zarr"


def missing_parents(dst: PathLike) -> list[str]:
    """The folders above the local ``dst`` that do not exist yet, outermost first (every
    command that writes a destination makes them: the README's rule)."""
    from ..paths import local_path

    local = local_path(dst)
    if local is None:
        return []
    out: list[str] = []
    parent = os.path.dirname(os.path.abspath(local))
    while not os.path.lexists(parent):
        out.append(parent)
        up = os.path.dirname(parent)
        if up == parent:
            break
        parent = up
    return out[::-1]


def make_parents(plan: ConversionPlan) -> None:
    """Make the folders the plan creates (a run's first write)."""
    for folder in plan.creates:
        os.makedirs(folder, exist_ok=True)


def plan_convert(
    checkpoint: PathLike,
    dst: PathLike,
    recipe: Recipe | PathLike | None = None,
    *,
    overwrite: bool = False,
    max_memory: int | None = None,
    executor: ExecutorLike = None,
    compression: str | None = "auto",
    format: str = "compressed-tensors",
    config: PathLike | dict[str, Any] | None = None,
    storage_options: StorageOptions | None = None,
    store: str | None = None,
    packs: bool | None = None,
    model_files: bool = True,
    scheme: str | None = None,
    tokenizer: bool = True,
    pure: bool = False,
    imatrix: PathLike | None = None,
    scale_dtype: str | None = None,
) -> ConversionPlan:
    """What :func:`qstream.convert_checkpoint` with these arguments would do, decided as it
    decides it and refusing what it refuses (the same exceptions, the same messages), before
    any tensor byte is read; nothing is written. ``format`` names the GGUF type for a
    ``.gguf`` destination (``compressed-tensors``: from the recipe), as for the conversion.
    ``model_files``: a compressed-tensors export copies the source folder's tokenizer, chat
    template, generation and processor configs beside it (:data:`qstream.exports.MODEL_FILES`;
    one there that qstream did not write is refused here); False: none. ``scheme``: a preset.
    ``tokenizer``, ``pure``, ``imatrix``: a ``.gguf`` destination's (see
    :func:`qstream.export_gguf`; ``format`` names its type or mix). ``scale_dtype``: see
    :func:`scaled_recipe`."""
    check_max_memory(max_memory)
    from ..io.outputs import check_writable
    from ..io.storage import check_destination_suffix

    check_destination_suffix(dst, (".safetensors", ".gguf"), "a conversion")
    if str(dst).startswith("memory://"):  # (its tensors' groups would be written elsewhere)
        raise InvalidParameterError(
            f"{dst}: a checkpoint is converted into a local folder or an object store, not a"
            " memory:// store (qstream.quantize_store writes one array there)"
        )
    compression = compressions.canonical(compression)
    if recipe is not None and not isinstance(recipe, Recipe):
        recipe = Recipe.load(recipe)
    recipe = recipe or Recipe()
    kind = kind_of_destination(dst)
    recipe = scaled_recipe(recipe, dst, format, scale_dtype, scheme)
    check_writable(dst)
    if scheme is not None:  # a compressed-tensors preset (qstream.exports.scheme_export)
        return ConversionPlan(**scheme_plan(locals()))
    if kind == "gguf":
        quantized_source_config(checkpoint, None)  # (refused when qstream cannot decode it)
        return ConversionPlan(**gguf_plan(locals()), creates=missing_parents(dst))
    if not tokenizer or pure or imatrix is not None:
        raise InvalidParameterError("tokenizer, pure and imatrix apply to a .gguf destination")
    opts: dict[str, Any] = {"storage_options": storage_options or None, "store": store or None}
    if kind == "safetensors":
        plan = _plan_safetensors(
            checkpoint, dst, recipe, overwrite, executor, compression, format, config, packs, opts
        )
        recipe.check_blocks(plan.prepared.tensors, max_memory)
        if model_files and format == "compressed-tensors":
            from ..exports import files_to_copy

            plan.files = files_to_copy(checkpoint, os.fspath(dst))
            if plan.files:
                names = ", ".join(os.path.basename(f) for f in plan.files)
                plan.notes.append(f"copies the model's files beside the export: {names}")
        return plan
    from ..engine.convert import prepare

    quantized_source_config(checkpoint, None)  # (refused when qstream cannot decode it)
    prepared = prepare(
        checkpoint,
        dst,
        recipe,
        overwrite=overwrite,
        executor=executor,
        compression=compression,
        packs=packs,
        **opts,
    )
    recipe.check_blocks(prepared.tensors, max_memory)  # (blocks the bound cannot hold)
    return ConversionPlan(
        checkpoint=str(checkpoint),
        destination=os.fspath(dst),
        kind=kind,
        action=prepared.action.value,
        rows=lambda: tensor_rows(prepared.tensors, recipe),
        creates=missing_parents(dst),
        prepared=prepared,
    )


def scaled_recipe(
    recipe: Recipe, dst: PathLike, format: str, scale_dtype: str | None, scheme: str | None
) -> Recipe:
    """The recipe a conversion to ``dst`` runs: ``scale_dtype`` (float32, float16, bfloat16
    or source) set on every spec; None: a compressed-tensors ``.safetensors`` export stores
    the scales of specs left at float32 in each tensor's own dtype (``source``: a bf16 or f16
    model loaded in its dtype gets the quantized values bit for bit), others as the recipe
    says. Not with ``scheme`` (a preset's scales are the source's already)."""
    if scale_dtype is not None and scheme is not None:
        raise InvalidParameterError(
            "scale_dtype does not apply to a scheme (a preset's scales are in the source's dtype)"
        )
    if scale_dtype is not None:
        return recipe.with_scale_dtype(scale_dtype)
    if kind_of_destination(dst) == "safetensors" and format == "compressed-tensors":
        return recipe.with_scale_dtype("source", where_default=True)
    return recipe


def _plan_safetensors(
    checkpoint: PathLike,
    dst: PathLike,
    recipe: Recipe,
    overwrite: bool,
    executor: ExecutorLike,
    compression: str,
    format: str,
    config: PathLike | dict[str, Any] | None,
    packs: bool | None,
    opts: dict[str, Any],
) -> ConversionPlan:
    from ..engine.convert import prepare
    from ..exports import FORMATS, check_targets, finished_export, job_digest, shard_pattern
    from ..io.checkpoints import CONFIG
    from ..io.outputs import check_separate, inspect_destination
    from ..io.storage import location
    from ..paths import local_path

    dst = os.fspath(dst)
    if local_path(dst) is None:
        raise InvalidParameterError(
            f"cannot write {dst}: a .safetensors file is written to a local path; convert"
            " into a local .safetensors, or into a directory on the store (a Zarr group)"
        )
    if compression not in (compressions.AUTO, compressions.NONE):
        raise InvalidParameterError(
            f"compression {compression!r} does not apply to a .safetensors destination"
            " (safetensors files are never compressed): leave it 'auto', or convert into a"
            " directory"
        )
    if format not in FORMATS:
        raise InvalidParameterError(
            f"unknown export format {format!r}{did_you_mean(format, FORMATS)};"
            f" expected one of: {', '.join(FORMATS)}"
        )
    index = dst.removesuffix(".safetensors") + ".safetensors.index.json"
    work = work_group(dst)
    work_root = inspect_destination(work)
    if work_root.kind not in ("absent", "empty", "checkpoint"):
        raise StoreError(
            f"{work}, where this conversion keeps its working group, holds something else;"
            " qstream will not write there: move it away"
        )
    resuming = work_root.kind == "checkpoint"
    # the working group is read once and removed: raw chunks (a compressed one resumes so)
    work_compression = compressions.NONE
    if resuming and not overwrite:
        work_compression = (work_root.meta or {}).get("compression", compressions.AUTO)
    model_config: str | dict[str, Any] | None
    if isinstance(config, dict) or config is None:
        model_config = config if config is not None else quantized_source_config(checkpoint, format)
    else:
        model_config = _plain_config(os.fspath(config))
    prepared = prepare(
        checkpoint,
        work,
        recipe,
        overwrite=overwrite,
        executor=executor,
        compression=work_compression,
        packs=packs,
        **opts,
    )
    _check_layout(prepared.tensors, recipe, format, dst)
    tied = None
    if format == "compressed-tensors":
        tied = plan_rows.tied(prepared.tensors, recipe, model_config)
    sources = prepared.sources
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
    # files qstream did not write are never replaced: refused here, not after the work
    check_targets([dst, index], replace=True)
    job = export_job(checkpoint, recipe, format)
    if format == "compressed-tensors":  # (its config.json: not another export's, refused now)
        config = os.path.join(os.path.dirname(dst), CONFIG)
        check_targets([config], replace=True, described=dst, job=job_digest(job))
    action = "resume" if resuming else "create"
    if not overwrite and not resuming:
        if finished_export(dst, job) is not None:
            action = "complete"
        else:
            for done in (dst, index):
                if os.path.lexists(done):
                    raise StoreError(
                        f"{done} holds another export (of another source, spec or format);"
                        " pass overwrite=True to replace it"
                    )
    elif overwrite and any(os.path.lexists(f) for f in (dst, index)):
        action = "replace"
    notes = [plan_rows.tied_note(tied, model_config is None)] if tied else []
    if isinstance(model_config, dict):
        notes.append("the source's quantization_config is replaced by the export's")
    return ConversionPlan(
        checkpoint=str(checkpoint),
        destination=dst,
        kind="safetensors",
        action=action,
        rows=lambda: tensor_rows(prepared.tensors, recipe, export=format, untied=tied),
        creates=missing_parents(dst),
        config=model_config,
        notes=notes,
        prepared=prepared,
    )


def export_job(checkpoint: PathLike, recipe: Recipe, format: str) -> str:
    """The identity a conversion's export records (a re-run finds its finished files)."""
    from ..io.storage import location

    source = location(checkpoint) or str(checkpoint)
    return json.dumps(
        {"source": source, "recipe": recipe.to_dict(), "format": format}, sort_keys=True
    )


def quantized_source_config(
    checkpoint: PathLike, format: str | None
) -> str | dict[str, Any] | None:
    """The checkpoint's own ``config.json`` for an export to carry: its path; a copy without
    the ``quantization_config`` of a checkpoint quantized in a way qstream decodes as it
    reads (:data:`DECODED_METHODS`), which the export's replaces; None without one (or
    without ``format``). A quantization qstream does not decode is refused, naming it: its
    tensors would be read as something they are not."""
    from ..exports import source_config
    from ..io.checkpoints import read_json

    path = source_config(os.fspath(checkpoint))
    if path is None:
        return None
    doc = read_json(path)
    if doc is None:
        if format is None:
            return None  # (not needed without an export)
        raise InvalidParameterError(
            f"{path}: not a readable JSON object (a model config.json); pass config= a plain"
            " model config"
        )
    qc = doc.get("quantization_config")
    if qc is None or "qstream_export" in doc:
        return path if format is not None else None
    method = qc.get("quant_method") if isinstance(qc, dict) else None
    if method == "compressed-tensors":
        from ..io.checkpoints import check_quant_config

        check_quant_config(qc, path)  # (its formats: refused unless decoded)
    if method not in DECODED_METHODS:
        raise InvalidParameterError(
            f"{path}: the checkpoint is quantized already (quantization_config with quant_method"
            f" {method!r}), a layout qstream does not decode; its tensors would be read as"
            " something they are not. Convert the model's float checkpoint instead"
        )
    if format is None:
        return None
    doc.pop("quantization_config")
    return doc


def _plain_config(path: str) -> str:
    """The model config the user named, checked as the export will read it: a JSON object
    without a quantization_config of its own (one qstream exported is replaced)."""
    from ..io.checkpoints import read_json

    doc = read_json(path)
    if doc is None:
        raise InvalidParameterError(f"{path}: not a readable JSON object (a model config.json)")
    if "quantization_config" in doc and "qstream_export" not in doc:
        raise InvalidParameterError(
            f"{path} already has a quantization_config: its checkpoint is quantized already;"
            " pass config= a plain model config"
        )
    return path


def _check_layout(tensors: dict[str, Any], recipe: Recipe, format: str, dst: str) -> None:
    """Refuse, before any work, a tensor the recipe quantizes that the export layout cannot
    express (see :mod:`qstream.exports.compressed_tensors`), and a ``config.json`` beside ``dst``
    that qstream did not write (the recipe was checked against the tensors by ``prepare``)."""
    from ..exports import compressed_tensors
    from ..exports import safetensors as export

    if format != "compressed-tensors":
        return
    export.check_targets([os.path.join(os.path.dirname(dst), export.CONFIG)], replace=True)
    for name, t in tensors.items():
        spec = recipe.spec_for(name, t.shape, t.dtype)
        if spec is not None:
            compressed_tensors.layout(name, t.shape, spec)
