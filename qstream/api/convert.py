"""Convert a whole checkpoint (the job is in :mod:`qstream.engine.checkpoint`)."""

from __future__ import annotations

from collections.abc import Callable

from ..engine.checkpoint import TensorEvent, convert
from ..recipe import Recipe

__all__ = ["TensorEvent", "convert_checkpoint"]


def convert_checkpoint(
    checkpoint,
    dst,
    recipe: Recipe | None = None,
    *,
    max_memory: int | None = None,
    overwrite: bool = False,
    on_tensor: Callable[[TensorEvent], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
    executor=None,
) -> dict:
    """Quantize every tensor of ``checkpoint`` the recipe selects into the group ``dst``.

    ``checkpoint``: safetensors (file, directory or sharded index), ``.npz``, ``.npy``, a
    Zarr group, or a torch ``.pt``/``.bin`` state dict. ``dst`` (a local directory) becomes a
    Zarr group with one quantized group (or kept array) per tensor; the destination rules of
    :func:`qstream.quantize_store` apply to it. A re-run of the same conversion resumes.
    ``on_tensor`` is called before and after each tensor; ``progress(done, total)`` per block.
    ``executor``: see :func:`qstream.quantize_store` (with a cluster, the checkpoint and
    ``dst`` must be on a filesystem every worker shares).
    """
    return convert(
        checkpoint,
        dst,
        recipe or Recipe(),
        max_memory=max_memory,
        overwrite=overwrite,
        on_tensor=on_tensor,
        progress=progress,
        executor=executor,
    )
