"""How an output's chunks are compressed: the ``compression`` option of the store jobs.

- ``"auto"`` (the default): a Zarr v3 source's own compressors for the codes (a dequantized
  array: its quantized codes' compressors), zarr's default (zstd) otherwise and for the
  parameters.
- ``"none"`` (or None): every member stored raw. The fastest to write and to read; chunk files
  hold the codes themselves (mappable, readable without a codec).
- ``"zstd[:LEVEL]"`` (LEVEL -131072 to 22, default 0), ``"gzip[:LEVEL]"`` (0 to 9, default
  5), ``"blosc[:CNAME[:LEVEL]]"`` (CNAME lz4, lz4hc, blosclz, zstd or zlib, default zstd;
  LEVEL 0 to 9, default 5): that codec for the codes and the parameters.

Group-wise scales and zero points are always stored raw (they hardly compress and are many),
and so is the progress log. Compression never changes a value, only the size of the files
and the time to write and read them; an output is one job with one compression, so re-running
with another one is another job (``overwrite=True`` replaces the output).
"""

from __future__ import annotations

from typing import Any

from ...errors import InvalidParameterError

AUTO = "auto"
NONE = "none"
BLOSC_CNAMES = ("lz4", "lz4hc", "blosclz", "zstd", "zlib")
CHOICES = "auto, none, zstd[:LEVEL], gzip[:LEVEL], blosc[:CNAME[:LEVEL]]"

_LEVELS = {"zstd": (-131072, 22, 0), "gzip": (0, 9, 5), "blosc": (0, 9, 5)}


def canonical(compression: object) -> str:
    """``compression`` spelled one way (``"auto"``, ``"none"``, ``"zstd:0"``, ``"gzip:5"``,
    ``"blosc:zstd:5"``); :class:`InvalidParameterError` naming it for anything else."""
    if compression is None:
        return NONE
    if not isinstance(compression, str):
        raise InvalidParameterError(
            f"compression must be a string ({CHOICES}) or None, not {type(compression).__name__}"
        )
    name, *args = compression.strip().lower().split(":")
    if name in (AUTO, NONE) and not args:
        return name
    if name == "blosc" and len(args) <= 2:
        cname = args[0] if args else "zstd"
        if cname not in BLOSC_CNAMES:
            raise InvalidParameterError(
                f"compression {compression!r}: blosc's compressor must be one of"
                f" {', '.join(BLOSC_CNAMES)}"
            )
        return f"blosc:{cname}:{_level(compression, name, args[1:])}"
    if name in ("zstd", "gzip") and len(args) <= 1:
        return f"{name}:{_level(compression, name, args)}"
    raise InvalidParameterError(f"compression {compression!r} is not one of: {CHOICES}")


def _level(compression: str, name: str, args: list[str]) -> int:
    lo, hi, default = _LEVELS[name]
    if not args:
        return default
    try:
        level = int(args[0])
    except ValueError:
        level = None
    if level is None or not lo <= level <= hi:
        raise InvalidParameterError(
            f"compression {compression!r}: the {name} level must be an integer from {lo} to {hi}"
        )
    return level


def compressors(compression: str, inherited: Any = AUTO) -> Any:
    """The ``compressors`` argument of ``zarr.create_array`` for the canonical
    ``compression``: ``inherited`` for ``"auto"``, None for ``"none"``, else a list of the one
    codec."""
    if compression == AUTO:
        return inherited
    if compression == NONE:
        return None
    from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

    name, *args = compression.split(":")
    if name == "zstd":
        return [ZstdCodec(level=int(args[0]))]
    if name == "gzip":
        return [GzipCodec(level=int(args[0]))]
    # the name as given (validated above): zarr 3.1 parses it into its BloscCname enum; zarr 3.4's
    # BloscCname is a deprecated name that cannot be called (TypeError), its cname a literal
    cname: Any = args[0]
    return [BloscCodec(cname=cname, clevel=int(args[1]))]


def codec_config(codec: Any) -> dict[str, Any]:
    """A zarr v3 codec's JSON configuration (plain strings and numbers)."""
    return dict(codec.to_dict().get("configuration") or {})


def describe(codecs: Any) -> str:
    """How an array's chunks are compressed, in the option's spelling (``"none"``,
    ``"zstd:3"``, ``"blosc:lz4:5"``); other codecs by their names."""
    docs = [
        c.to_dict() if hasattr(c, "to_dict") else {"name": type(c).__name__.lower()}
        for c in codecs or ()
    ]  # (a numcodecs codec, Zarr v2: its name)
    return describe_docs(docs)


def describe_docs(docs: list[dict[str, Any]]) -> str:
    """:func:`describe` of compressors as an array's ``zarr.json`` lists them (``{"name":
    ..., "configuration": ...}``)."""
    out = []
    for d in docs:
        name, cfg = d.get("name"), d.get("configuration") or {}
        if name in ("zstd", "gzip") and "level" in cfg:
            out.append(f"{name}:{cfg['level']}")
        elif name == "blosc" and "cname" in cfg:
            out.append(f"blosc:{cfg['cname']}:{cfg.get('clevel')}")
        else:
            out.append(str(name))
    return "+".join(out) or NONE
