"""Convert a whole checkpoint (the job is in :mod:`qstream.engine.convert.convert_checkpoint`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..budget import check_max_memory
from ..engine.convert import TensorEvent
from ..spec import Recipe
from ..viz import reporting
from ..workflows import ConversionPlan, conversion_run, plan_convert, tensor_rows

if TYPE_CHECKING:
    from ..io.checkpoints import TensorLike
    from ..workflows import ExecutorLike, OnTensor, PathLike, Progress, StorageOptions

__all__ = [
    "ConversionPlan",
    "ConversionResult",
    "TensorEvent",
    "convert_checkpoint",
    "open_checkpoint",
    "plan_conversion",
    "plan_convert",
]


class ConversionResult(dict[str, Any]):
    """What :func:`convert_checkpoint` returns: the conversion's report, a dict as ``convert
    --json`` writes it (``destination``, ``tensors``, sizes, ...), with the views of the
    output it made: :meth:`output` (:func:`qstream.open_quantized` of the destination),
    :meth:`plot` and the notebook table."""

    def __init__(self, report: dict[str, Any], storage_options: StorageOptions | None = None):
        super().__init__(report)
        self.storage_options = storage_options

    def output(self) -> Any:
        """The converted output, opened as :func:`qstream.open_quantized` opens it (a
        :class:`~qstream.QuantizedCheckpoint`: a Zarr group, a safetensors export, a GGUF)."""
        from .readers import open_quantized

        return open_quantized(self["destination"], storage_options=self.storage_options)

    def plot(self, ax: Any = None) -> Any:
        """The output's figure (sizes before and after, the worst tensors' SQNR) on ``ax``
        (a new figure when None), with matplotlib (``pip install 'qstream-zarr[plot]'``);
        returns the figure."""
        return self.output().plot(ax)

    def _repr_html_(self) -> str | None:
        """The output's notebook table; None (the dict's own text) where qstream does not
        read the output back (a ``scheme`` export: compressed-tensors' own layout)."""
        from ..errors import QStreamError

        try:
            return str(self.output()._repr_html_())
        except QStreamError:
            return None


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
    plan: ConversionPlan | None = None,
    model_files: bool = True,
    scheme: str | None = None,
    tokenizer: bool = True,
    pure: bool = False,
    imatrix: PathLike | None = None,
    scale_dtype: str | None = None,
) -> ConversionResult:
    """Quantize every tensor of ``checkpoint`` the recipe selects into the group ``dst``.

    Everything the conversion can refuse is decided first, before a tensor byte is read or
    anything written, by :func:`qstream.plan_convert` with the same arguments (``plan``: one
    it made already for them); missing parent folders of ``dst`` are made.

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
    type for all of them, or one of llama-quantize's mixes (``Q4_K_M``, ...), one type
    everywhere with ``pure``, with the importance matrix file ``imatrix``; ``tokenizer``
    False: tensors and hyperparameters only (llama.cpp will not load the file).

    ``scale_dtype``: how every spec stores its scales (``float32``, ``float16``,
    ``bfloat16``, or ``source``: each tensor's own dtype), each scale rounded to it before
    quantizing; None: the recipe's, except that a compressed-tensors ``.safetensors`` export
    stores the scales of specs left at float32 in each tensor's dtype (a bf16/f16 model
    loaded in its own dtype then gets the quantized values bit for bit); ``"float32"`` keeps
    F32 scales.

    ``model_files``: a compressed-tensors export copies the source folder's tokenizer, chat
    template, generation and processor configs beside it (see :func:`qstream.plan_convert`).

    ``scheme``: a compressed-tensors preset (``W4A16``, ``W8A16``, ``FP8_DYNAMIC``,
    ``FP8_BLOCK``, ``NVFP4A16``, ``MXFP4A16``, ...) written straight from the source into the
    folder of the ``.safetensors`` ``dst``, with the codes and scales compressed-tensors'
    own quantization functions give (scales in the source's dtype); no recipe. Presets that
    need calibrated activation scales are refused (see :mod:`qstream.exports.scheme_export`).

    ``packs``: small tensors alike in shape, dtype and spec (runs of them: a
    mixture-of-experts layer's experts; and alike ones alone between others, gathered: a
    router gate a layer) are stored stacked, a group a pack (``DST/_packs/``, see
    :mod:`qstream.io.outputs.pack_layout`): a conversion then costs per byte, not per tensor. None
    (the
    default): when the checkpoint holds at least 64 tensors and ``dst`` is a local
    directory, or as an earlier run of this conversion at ``dst`` did (it is resumed or found
    complete as it was made; ``overwrite`` makes it again by the default);
    ``open_quantized`` reads packed tensors as any other.
    """
    check_max_memory(max_memory)  # (a refused bound writes nothing)
    with reporting(progress, "convert") as shown:
        report = conversion_run.convert(
            checkpoint,
            dst,
            recipe,
            max_memory=max_memory,
            overwrite=overwrite,
            on_tensor=on_tensor,
            progress=shown,
            executor=executor,
            max_shard_size=max_shard_size,
            compression=compression,
            format=format,
            config=config,
            storage_options=storage_options,
            store=store,
            packs=packs,
            plan=plan,
            model_files=model_files,
            scheme=scheme,
            tokenizer=tokenizer,
            pure=pure,
            imatrix=imatrix,
            scale_dtype=scale_dtype,
        )
    return ConversionResult(report, storage_options)


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
    import warnings

    from ..errors import QStreamWarning
    from ..io.checkpoints import open_checkpoint, pair_scales

    if not isinstance(recipe, Recipe):
        recipe = Recipe.load(recipe) if recipe is not None else Recipe()
    tensors = open_checkpoint(
        checkpoint, storage_options=storage_options or None, store=store or None
    )
    tensors = pair_scales(tensors, recipe.scales)
    for warning in recipe.check(tensors):
        warnings.warn(warning, QStreamWarning, stacklevel=2)
    return tensor_rows(tensors, recipe)


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
    from ..io.checkpoints import pair_scales

    tensors = open_tensors(checkpoint, storage_options=storage_options or None, store=store)
    return pair_scales(tensors)
