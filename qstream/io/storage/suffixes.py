"""What a destination's name says it is: a Zarr directory, or one of the files qstream writes.

A destination named like a file qstream does not write (``out.bin``, ``weights.npz``,
``model.gguf`` for a store job) is refused before anything is read or written, instead of
becoming a directory of that name."""

from __future__ import annotations

import os

from ...errors import InvalidParameterError

#: suffixes of files (never Zarr directories) that some tool might expect at a path
FILE_SUFFIXES = (
    ".safetensors", ".gguf", ".bin", ".pt", ".pth", ".ckpt", ".npy", ".npz", ".h5", ".hdf5",
    ".nc", ".onnx", ".json", ".toml", ".txt", ".csv", ".tar", ".gz", ".pkl", ".msgpack",
)  # fmt: skip


def check_destination_suffix(dst, writes: tuple[str, ...], what: str) -> None:
    """Refuse ``dst`` when its name ends in a file suffix other than those in ``writes`` (the
    files this operation writes); a directory name (``out``, ``q.zarr``, ``run.v2``) passes."""
    if not isinstance(dst, str | os.PathLike):
        return
    name = os.path.basename(os.fspath(dst).rstrip("/")).lower()
    for suffix in FILE_SUFFIXES:
        if name.endswith(suffix) and not name.endswith(writes or ("\0",)):
            can = " or ".join([*writes, "a directory (a Zarr store)"])
            raise InvalidParameterError(
                f"{what} cannot write {os.fspath(dst)}: it writes no {suffix} file; its"
                f" destination is {can}"
            )
