"""``qstream quantize`` and ``qstream dequantize``: a Zarr array to a quantized group and
back."""

from __future__ import annotations

from typing import Any

import typer

import qstream as qs

from .convert import print_plan
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
    compression_option,
    parse_chunks,
    parse_offset,
    parse_size,
    require_input,
)
from .output import done_already, emit_json, error_table, fmt_bytes
from .progress import progress
from .scheduler import open_executor


@examples(
    """
    qstream quantize weights.zarr q.zarr --axis 0
    qstream quantize acts.zarr q.zarr --asymmetric --dtype uint8 --method entropy
    qstream quantize w.zarr q.zarr --dtype int4 --axis 1 --block-size 128 --method dynamic
    qstream quantize x.zarr q.zarr --scale 0.002 --zero-point 0 --nan-policy zero_point
    """
)
def quantize(
    src: str = SRC,
    dst: str = typer.Argument(..., metavar="DST", help="Destination: a directory, .zip or URL."),
    dtype: str = DTYPE,
    axis: int | None = AXIS,
    block_size: int | None = BLOCK_SIZE,
    symmetric: bool = SYMMETRIC,
    method: str = METHOD,
    percentile: float = PERCENTILE,
    round_mode: str = typer.Option(
        "half_to_even",
        "--round-mode",
        metavar="MODE",
        help=f"Rounding: {', '.join(qs.ROUND_MODES)}.",
    ),
    scale: float | None = typer.Option(
        None, "--scale", metavar="S", help="Explicit scale (no calibration pass)."
    ),
    zero_point: int | None = typer.Option(
        None, "--zero-point", metavar="Z", help="Explicit zero point (with --scale)."
    ),
    scale_dtype: str = typer.Option(
        "float32",
        "--scale-dtype",
        metavar="TYPE",
        help="How scales are stored: float32, or float16 (half the size; each scale rounded"
        " to float16 before quantizing).",
    ),
    nan_policy: str = typer.Option(
        "error",
        "--nan-policy",
        metavar="POLICY",
        help="NaN/inf in the data: error, zero_point (quantize to the zero point), min, or"
        " fill (NaN -> a reserved code, the type's minimum, written as _FillValue).",
    ),
    offset: str | None = typer.Option(
        None,
        "--offset",
        metavar="OFFSET",
        help="A float offset instead of a zero point (x = q * scale + offset; the range need"
        " not contain 0): 'range' (calibrated) or a number.",
    ),
    layout: str = typer.Option(
        "group",
        "--layout",
        metavar="LAYOUT",
        help="group, or codec (per tensor: data decodes itself to floats in any zarr >= 3.2"
        " reader, with its scale_offset + cast_value codecs).",
    ),
    chunks: str | None = typer.Option(
        None,
        "--chunks",
        metavar="C0,C1,..",
        help="The output's chunks (-1: a whole axis); default: multiples of the source's.",
    ),
    max_memory: str | None = MAX_MEMORY,
    overwrite: bool = typer.Option(
        False,
        "--overwrite/--resume",
        help="Replace DST (only a qstream output), or resume an interrupted job.",
    ),
    as_json: bool = JSON,
    quiet: bool = QUIET,
    scheduler: str | None = SCHEDULER,
    store: str = STORE,
    histogram: bool = typer.Option(
        False,
        "--histogram",
        help="Per tensor with --method minmax: one more pass, a histogram kept in the output"
        " for 'qstream inspect --show/--plot' (histogram methods keep theirs anyway).",
    ),
    compression: str = compression_option(
        "the source's codecs if it is a Zarr v3 array, else zstd"
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Print what would be written (DST's fate, the type, bytes before and after:"
        " codes and parameters, the output's chunks); read no value, write nothing.",
    ),
) -> None:
    """Quantize a Zarr array into a quantized group (data, scale, zero point)."""
    with library_errors():
        require_input(src, "SRC")
        check_percentile(method, percentile)
        spec = qs.QuantSpec(
            dtype=dtype,
            axis=axis,
            block_size=block_size,
            symmetric=symmetric,
            method=method,
            percentile=percentile,
            round_mode=round_mode,
            nan_policy=nan_policy,
            scale=scale,
            zero_point=zero_point,
            scale_dtype=scale_dtype,
            offset=parse_offset(offset),
        )
        job: dict[str, Any] = {
            "max_memory": parse_size(max_memory, "--max-memory"), "overwrite": overwrite,
            "store": store, "histogram": histogram, "compression": compression,
            "layout": layout, "chunks": parse_chunks(chunks),
        }  # fmt: skip
    with library_errors(refusals=True):  # (every refusal: here, before any value is read)
        plan = qs.plan_quantize(src, dst, spec, **job)
    if dry_run:
        if as_json or not quiet:  # (quiet: the exit code says whether it would run)
            print_plan(plan, as_json, "quantization plan (nothing written)")
        return
    with library_errors():
        if plan.loads_kernels:  # (not a finished output, nor a small array's NumPy twins)
            qs.warm_up([spec], background=True)  # first run: compile the quantize pass meanwhile
        with open_executor(scheduler) as ex, progress("quantize", quiet or as_json) as cb:
            report = qs.quantize_store(src, dst, spec, progress=cb, executor=ex, **job)
        if done_already(dst, report.to_dict(), as_json, quiet):
            return
        if as_json:
            emit_json(report.to_dict())
            return
        if quiet:
            return
        done = report.resumed_blocks
        resumed = f", resumed ({done} block{'s' * (done != 1)} already done)" if done else ""
        passes = f"{report.passes} pass{'es' * (report.passes != 1)}"
        typer.echo(
            f"{src} -> {dst}: {spec.dtype} {spec.granularity}, {fmt_bytes(report.bytes_before)}"
            f" -> {fmt_bytes(report.bytes_after)}, {passes}, {report.seconds:.1f} s{resumed}"
        )
        if report.missing_chunks:
            typer.echo(
                f"warning: {report.missing_chunks} source chunks are missing (read as the"
                " fill value)",
                err=True,
            )
        error_table("quantization error", report.error)


@examples(
    """
    qstream dequantize q.zarr restored.zarr
    qstream dequantize q.zarr restored.zarr --dtype bfloat16
    qstream dequantize model-int8.zarr model-restored.zarr
    qstream dequantize model-int8.zarr out/model.safetensors --dtype bfloat16
    qstream dequantize model.Q4_K_M.gguf out/model.safetensors
    """
)
def dequantize(
    src: str = typer.Argument(
        ...,
        metavar="SRC",
        help="A quantized group or converted checkpoint from qstream, a .safetensors export,"
        " a .gguf file, or a quantized model folder (compressed-tensors, FP8, MXFP4).",
    ),
    dst: str = typer.Argument(
        ...,
        metavar="DST",
        help="Destination: a Zarr array (a group for a checkpoint), or a .safetensors file"
        " (a model folder beside it where SRC is a model).",
    ),
    dtype: str = typer.Option(
        "float32", "--dtype", metavar="TYPE", help="float32, float16 or bfloat16."
    ),
    max_memory: str | None = MAX_MEMORY,
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace DST."),
    as_json: bool = JSON,
    quiet: bool = QUIET,
    scheduler: str | None = SCHEDULER,
    store: str = STORE,
    compression: str = compression_option("those of SRC's codes"),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print what would be decoded and written; write nothing."
    ),
) -> None:
    """Dequantize a quantized array or model into plain floats (a Zarr array or group, or a
    .safetensors file)."""
    with library_errors():
        require_input(src, "SRC")
        if dtype not in ("float32", "float16", "bfloat16"):
            import difflib

            near = difflib.get_close_matches(dtype, ["float32", "float16", "bfloat16"], n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise typer.BadParameter(
                f"--dtype must be float32, float16 or bfloat16, not {dtype}{hint}"
            )
    with library_errors(refusals=True):  # (every refusal: here, before any tensor is read)
        plan = qs.plan_dequantize(
            src, dst, dtype=dtype, max_memory=parse_size(max_memory, "--max-memory"),
            overwrite=overwrite, store=store, compression=compression,
        )  # fmt: skip
    if dry_run:
        if as_json or not quiet:  # (quiet: the exit code says whether it would run)
            print_plan(plan, as_json, "dequantization plan (nothing written)", ("decoded", "kept"))
        return
    with library_errors():
        show = not (quiet or as_json)
        with open_executor(scheduler) as ex, progress("dequantize", not show) as cb:
            finished = [0]

            def on_tensor(ev: qs.TensorEvent) -> None:
                """A converted checkpoint's tensor: a line each, as convert prints."""
                which = f"[{ev.index + 1:>{len(str(ev.total))}}/{ev.total}] {ev.name}"
                assert cb is not None  # (on_tensor is passed only when progress shows)
                if ev.result is None:
                    cb.tensor(which)  # (its progress lines name it)
                    return
                finished[0] += 1
                cb.tensors(finished[0], ev.total)
                r = ev.result
                typer.echo(
                    f"{which} {list(ev.shape)} {ev.dtype} -> "
                    f"{'kept' if r['kept'] else ev.target}: {fmt_bytes(r['bytes_written'])}"
                )

            report = qs.dequantize_store(
                src,
                dst,
                dtype=dtype,
                max_memory=parse_size(max_memory, "--max-memory"),
                progress=cb,
                overwrite=overwrite,
                executor=ex,
                store=store,
                compression=compression,
                on_tensor=on_tensor if show else None,
            )
        if done_already(dst, report, as_json, quiet):
            return
        if as_json:
            emit_json(report)
        elif not quiet:
            what = (
                f"{len(report['tensors'])} tensors"
                if "tensors" in report
                else str(tuple(report["shape"]))
            )
            typer.echo(f"{src} -> {dst}: {report['dtype']} {what}, {report['seconds']:.1f} s")
            if dtype == "bfloat16" and not str(dst).lower().endswith(".safetensors"):
                typer.echo(
                    "note: bfloat16 is not a Zarr v3 core type: zarr-python opens this output"
                    " after `import qstream; qstream.register_zarr_types()`; --dtype float32"
                    " or float16 is read by any Zarr reader",
                    err=True,
                )
