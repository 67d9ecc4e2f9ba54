"""``qstream calibrate``: the scale and zero point a spec gives (writes nothing), with
``--show``/``--compare`` the histogram and the methods side by side."""

from __future__ import annotations

from typing import Any

import typer

import qstream as qs

from .failures import library_errors
from .helptext import examples
from .options import (
    AXIS,
    BLOCK_SIZE,
    DTYPE,
    JSON,
    MAX_MEMORY,
    METHOD,
    PERCENTILE,
    QUIET,
    SCHEDULER,
    SRC,
    STORE,
    SYMMETRIC,
    check_percentile,
    parse_size,
    require_input,
)
from .output import emit_json, table
from .progress import progress
from .scheduler import open_executor
from .show import show_calibration


@examples(
    """
    qstream calibrate acts.zarr --method entropy
    qstream calibrate weights.zarr --axis 0 --method mse --json
    qstream calibrate acts.zarr --method entropy --show
    qstream calibrate acts.zarr --compare
    qstream calibrate weights.zarr --axis 0 --compare --json
    qstream calibrate model.safetensors --tensor model.layers.0.mlp.up_proj.weight --axis 0
    qstream calibrate acts.zarr --imatrix model.imatrix --model model/
    """
)
def calibrate(
    src: str = SRC,
    dtype: str = DTYPE,
    axis: int | None = AXIS,
    block_size: int | None = BLOCK_SIZE,
    symmetric: bool = SYMMETRIC,
    method: str = METHOD,
    percentile: float = PERCENTILE,
    max_memory: str | None = MAX_MEMORY,
    as_json: bool = JSON,
    quiet: bool = QUIET,
    scheduler: str | None = SCHEDULER,
    store: str = STORE,
    show: bool = typer.Option(
        False,
        "--show",
        help="Draw the histogram (log counts) with the clip threshold and the SQNR predicted"
        " from it (per channel: its distribution and the worst channels). One histogram pass,"
        " also for minmax.",
    ),
    compare: bool = typer.Option(
        False,
        "--compare",
        help="Set minmax, percentile, entropy, mse and l2 side by side: thresholds, parameters"
        " and predicted SQNR, from one histogram pass; the calibration shown is --method's.",
    ),
    tensor: str | None = typer.Option(
        None,
        "--tensor",
        metavar="NAME",
        help="SRC is a checkpoint (safetensors, .npz, ...): calibrate its tensor NAME.",
    ),
    imatrix: str | None = typer.Option(
        None,
        "--imatrix",
        metavar="OUT",
        help="SRC is a Zarr group of Linear inputs (one array per module, tokens x features):"
        " write their importance matrix for --model to OUT, as llama-imatrix writes it.",
    ),
    model: str | None = typer.Option(
        None, "--model", metavar="MODEL", help="With --imatrix: the Hugging Face model folder."
    ),
    chunk_size: int = typer.Option(
        512, "--chunk-size", metavar="N", help="With --imatrix: tokens per chunk [512]."
    ),
) -> None:
    """Print the scale and zero point a spec gives, and the data's range (writes nothing)."""
    if imatrix is not None or model is not None:
        return importance_matrix(src, imatrix, model, chunk_size, max_memory, as_json, quiet)
    with library_errors():
        require_input(src, "SRC")
        source: Any = src if tensor is None else checkpoint_tensor(src, tensor)
        check_percentile(method, percentile)
        spec = qs.QuantSpec(
            dtype=dtype,
            axis=axis,
            block_size=block_size,
            symmetric=symmetric,
            method=method,
            percentile=percentile,
        )
        with open_executor(scheduler) as ex, progress("calibrate", quiet or as_json) as cb:
            limit = parse_size(max_memory, "--max-memory")
            if show or compare:  # the same calibration, with its view and predictions
                cal = qs.compare_methods(
                    source,
                    spec,
                    None if compare else [method],
                    executor=ex,
                    store=store,
                    max_memory=limit,
                    progress=cb,
                )
            else:
                cal = qs.calibrate(
                    source, spec, executor=ex, store=store, max_memory=limit, progress=cb
                )
        if as_json:
            emit_json(cal.to_dict())
            return
        if quiet:
            return
        if cal.params is None:
            typer.echo("per-block parameters: each block takes its own range when quantized")
            return
        what = str(src) if tensor is None else f"{tensor} of {src}"
        rows = []
        for name, arr in (("scale", cal.scale), ("zero_point", cal.zero_point)):
            a = arr.reshape(-1)
            rows.append([name, f"{a.min():.6g}", f"{a.max():.6g}", f"{a.mean():.6g}"])
        if cal.stats is not None:
            rows.append(
                ["data range", f"{cal.stats.min.min():.6g}", f"{cal.stats.max.max():.6g}", ""]
            )
        table(
            f"calibration of {what} ({spec.method}, {spec.granularity})",
            ["", "min", "max", "mean"],
            rows,
        )
        if show or compare:
            show_calibration(cal, what)


def importance_matrix(
    src: str, out: str | None, model: str | None, chunk_size: int, max_memory: str | None,
    as_json: bool, quiet: bool,
) -> None:  # fmt: skip
    """``--imatrix OUT --model MODEL``: :func:`qstream.compute_imatrix` of SRC into OUT."""
    with library_errors(refusals=True):
        require_input(src, "SRC")
        if out is None or model is None:
            raise typer.BadParameter("--imatrix OUT and --model MODEL go together")
        limit = parse_size(max_memory, "--max-memory")
        done = qs.compute_imatrix(src, model, out, chunk_size, max_memory=limit)
    if as_json:
        emit_json({"file": done.path, "entries": list(done.entries), "tokens": done.tokens,
                   "chunk_count": done.chunk_count, "chunk_size": done.chunk_size,
                   "left_out": list(done.left_out)})  # fmt: skip
    elif not quiet:
        typer.echo(
            f"{done.path}: {len(done.entries)} weights from {done.arrays} arrays,"
            f" {done.tokens} tokens ({done.chunk_count} chunks of {done.chunk_size})"
        )


def checkpoint_tensor(path: str, name: str) -> Any:
    """The tensor ``name`` of the checkpoint ``path`` (FP8 weights paired with their scales),
    read lazily by slices."""
    import difflib

    tensors = qs.open_checkpoint(path)
    if name not in tensors:
        near = difflib.get_close_matches(name, list(tensors), n=3)
        hint = f"; did you mean {', '.join(near)}?" if near else f" ({len(tensors)} tensors)"
        raise typer.BadParameter(f"--tensor {name}: no such tensor in {path}{hint}")
    return tensors[name]
