"""The ``qstream`` command line. It parses, shows progress and maps errors to exit codes; all
numeric and storage work is the library's (:mod:`qstream.cli.errors` for how it fails,
:mod:`qstream.cli.output` for what it prints).

Heavy imports happen inside commands, so ``qstream --help`` stays fast.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import Path

import typer
import typer.core

import qstream

from .errors import Group, library_errors
from .output import emit_json, error_table, fmt_bytes, fmt_db, progress, table
from .show import show_calibration, show_checkpoint, show_report

app = typer.Typer(
    name="qstream",
    cls=Group,
    help="Exact quantization and dequantization of arrays that do not fit in memory.",
    epilog="Run 'qstream COMMAND --help' for a command's options and examples.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)

DTYPES = ", ".join(qstream.QTYPES)
METHODS = "minmax, percentile, entropy, mse, l2, dynamic"


class Command(typer.core.TyperCommand):
    """Help that reads like a well-kept CLI: ``SRC DST`` in the usage line, arguments with
    their descriptions, options with their value names and defaults, examples last."""

    def collect_usage_pieces(self, ctx):
        pieces = [self.options_metavar] if self.options_metavar else []
        for p in self.get_params(ctx):
            if p.param_type_name == "argument":
                name = p.metavar or p.name.upper()
                pieces.append(name if p.required else f"[{name}]")
        return pieces

    def format_options(self, ctx, formatter):
        args = [
            (p.metavar or p.name.upper(), p.help or "")
            for p in self.get_params(ctx)
            if p.param_type_name == "argument"
        ]
        opts = [
            rec
            for p in self.get_params(ctx)
            if p.param_type_name == "option" and (rec := p.get_help_record(ctx)) is not None
        ]
        if args:
            with formatter.section("Arguments"):
                formatter.write_dl(args)
        with formatter.section("Options"):
            formatter.write_dl(opts)

    def format_epilog(self, ctx, formatter):
        if self.epilog:
            with formatter.section("Examples"):
                for line in self.epilog.strip().splitlines():
                    formatter.write(" " * formatter.current_indent + line.strip() + "\n")


def command(examples: str):
    """``@app.command`` with this module's help layout and ``examples`` (one per line)."""
    return app.command(cls=Command, epilog=examples)


@app.callback()
def _main(
    debug: bool = typer.Option(False, "--debug", help="Show the traceback of an error."),
    version: bool = typer.Option(False, "--version", help="Print the version and exit."),
):
    """Exact quantization and dequantization of arrays that do not fit in memory."""


# --------------------------------------------------------------------------- helpers


def _checkpoint_tensor(path: str, name: str):
    """The tensor ``name`` of the checkpoint ``path`` (FP8 weights paired with their scales),
    read lazily by slices."""
    import difflib

    from qstream.io.checkpoints import open_checkpoint
    from qstream.io.fp8 import pair_scales

    tensors = pair_scales(open_checkpoint(path))
    if name not in tensors:
        near = difflib.get_close_matches(name, list(tensors), n=3)
        hint = f"; did you mean {', '.join(near)}?" if near else f" ({len(tensors)} tensors)"
        raise typer.BadParameter(f"--tensor {name}: no such tensor in {path}{hint}")
    return tensors[name]


def _check_percentile(method: str, percentile: float) -> None:
    if percentile != 99.99 and method != "percentile":
        raise typer.BadParameter(
            f"--percentile {percentile:g} applies to --method percentile only, not {method};"
            " drop one of them"
        )


def _offset(text: str | None):
    """``--offset``: 'range' or a number."""
    if text is None or text == "range":
        return text
    try:
        return float(text)
    except ValueError:
        raise typer.BadParameter(f"--offset takes 'range' or a number, got {text!r}") from None


def _chunks(text: str | None):
    """``--chunks 90,180``: one integer per axis."""
    if text is None:
        return None
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise typer.BadParameter(
            f"--chunks takes integers separated by commas, got {text!r}"
        ) from None


def _size(text: str | None, flag: str) -> int | None:
    """'512MiB', '2GB', '1e9' -> bytes."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]i?B?|B)?\s*", text, re.IGNORECASE)
    if not m:
        raise typer.BadParameter(f"{flag}: not a size: {text!r} (examples: 512MiB, 2GB)")
    unit = (m.group(2) or "B").upper().rstrip("B")
    mult = {
        "": 1,
        "K": 1e3,
        "M": 1e6,
        "G": 1e9,
        "T": 1e12,
        "KI": 2**10,
        "MI": 2**20,
        "GI": 2**30,
        "TI": 2**40,
    }[unit]
    size = int(float(m.group(1)) * mult)
    if flag == "--max-memory":
        physical = _physical_memory()
        if physical and size > physical:
            typer.echo(
                f"warning: --max-memory {text} is more than this machine's memory"
                f" ({fmt_bytes(physical)}); using {fmt_bytes(physical // 2)}",
                err=True,
            )
            size = physical // 2
    return size


def _physical_memory() -> int | None:
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _done_already(dst: str, report: dict, as_json: bool, quiet: bool) -> bool:
    """Say "already complete" for a re-run of a finished job (True if it was one)."""
    if not report.get("already_complete"):
        return False
    if as_json:
        emit_json({**report, "already_complete": True})
    elif not quiet:
        typer.echo(f"{dst}: already complete (same job); nothing to do")
    return True


@contextmanager
def _executor(scheduler: str | None):
    """The executor ``--scheduler`` names (None: this process's threads)."""
    if not scheduler:
        yield None
        return
    try:
        import distributed
    except ImportError:
        raise typer.BadParameter(
            "--scheduler needs Dask: pip install 'qstream-zarr[dask]'"
        ) from None
    import qstream as qs

    if scheduler.startswith("local:"):
        try:
            n = int(scheduler.removeprefix("local:"))
            if n < 1:
                raise ValueError
        except ValueError:
            raise typer.BadParameter(
                f"--scheduler local:N needs a number of workers >= 1, not {scheduler!r}"
            ) from None
        with qs.DaskExecutor.local(n) as ex:
            yield ex
        return
    try:
        client = distributed.Client(scheduler, timeout="10s")
    except OSError as e:
        raise qs.StoreError(f"cannot reach the Dask scheduler at {scheduler}: {e}") from None
    with client:
        yield qs.DaskExecutor(client)


# --------------------------------------------------------------------------- options

_SRC = typer.Argument(..., metavar="SRC", help="Source Zarr array: a path, a .zip or a URL.")
_DTYPE = typer.Option("int8", "--dtype", metavar="TYPE", help=f"Quantized type: {DTYPES}.")
_AXIS = typer.Option(
    None, "--axis", metavar="N", help="One scale per index along this axis (or per block)."
)
_BLOCK = typer.Option(
    None, "--block-size", metavar="N", help="Blocks of N elements along --axis (group-wise)."
)
_SYM = typer.Option(
    True, "--symmetric/--asymmetric", help="Symmetric range with zero point 0, or min/max."
)
_METHOD = typer.Option(
    "minmax",
    "--method",
    metavar="NAME",
    help=f"Calibration: {METHODS} (dynamic: one range per block, needs --block-size).",
)
_PCT = typer.Option(
    99.99, "--percentile", metavar="P", help="Percent of values kept by --method percentile."
)
_MEM = typer.Option(
    None, "--max-memory", metavar="SIZE", help="Working-memory bound, e.g. 512MiB [default: 1GiB]."
)
_JSON = typer.Option(False, "--json", help="Print one strict JSON report on stdout.")
_QUIET = typer.Option(False, "--quiet", "-q", help="No progress, no tables.")
_SCHED = typer.Option(
    None,
    "--scheduler",
    metavar="ADDRESS",
    help="Run the blocks on a Dask cluster: tcp://host:8786, or local:N for N local worker"
    " processes. Paths must be shared by all workers (or object-store URLs).",
)
_STORE = typer.Option(
    "fsspec", "--store", metavar="KIND", help="How URLs are opened: fsspec or obstore."
)


def _compression(auto: str, note: str = ""):
    """The ``--compression`` option; ``auto``: what ``auto`` means for the command."""
    return typer.Option(
        "auto",
        "--compression",
        metavar="CODEC",
        help=f"How DST's chunks are compressed: auto ({auto}), none (raw: fastest),"
        f" zstd[:LEVEL], gzip[:LEVEL] or blosc[:CNAME[:LEVEL]]. Values are the same whatever"
        f" it is.{note}",
    )


# --------------------------------------------------------------------------- commands


@command(
    """
    qstream quantize weights.zarr q.zarr --axis 0
    qstream quantize acts.zarr q.zarr --asymmetric --dtype uint8 --method entropy
    qstream quantize w.zarr q.zarr --dtype int4 --axis 1 --block-size 128 --method dynamic
    qstream quantize x.zarr q.zarr --scale 0.002 --zero-point 0 --nan-policy zero_point
    """
)
def quantize(
    src: str = _SRC,
    dst: str = typer.Argument(..., metavar="DST", help="Destination: a directory, .zip or URL."),
    dtype: str = _DTYPE,
    axis: int | None = _AXIS,
    block_size: int | None = _BLOCK,
    symmetric: bool = _SYM,
    method: str = _METHOD,
    percentile: float = _PCT,
    round_mode: str = typer.Option(
        "half_to_even",
        "--round-mode",
        metavar="MODE",
        help=f"Rounding: {', '.join(qstream.ROUND_MODES)}.",
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
    max_memory: str | None = _MEM,
    overwrite: bool = typer.Option(
        False,
        "--overwrite/--resume",
        help="Replace DST (only a qstream output), or resume an interrupted job.",
    ),
    as_json: bool = _JSON,
    quiet: bool = _QUIET,
    scheduler: str | None = _SCHED,
    store: str = _STORE,
    histogram: bool = typer.Option(
        False,
        "--histogram",
        help="Per tensor with --method minmax: one more pass, a histogram kept in the output"
        " for 'qstream inspect --show/--plot' (histogram methods keep theirs anyway).",
    ),
    compression: str = _compression("the source's codecs if it is a Zarr v3 array, else zstd"),
):
    """Quantize a Zarr array into a quantized group (data, scale, zero point)."""
    with library_errors():
        import qstream as qs

        _check_percentile(method, percentile)
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
            offset=_offset(offset),
        )
        qs.warm_up([spec], background=True)  # first run: compile the quantize pass meanwhile
        with _executor(scheduler) as ex, progress("quantize", quiet or as_json) as cb:
            report = qs.quantize_store(
                src,
                dst,
                spec,
                max_memory=_size(max_memory, "--max-memory"),
                progress=cb,
                overwrite=overwrite,
                executor=ex,
                store=store,
                histogram=histogram,
                compression=compression,
                layout=layout,
                chunks=_chunks(chunks),
            )
        if _done_already(dst, report.to_dict(), as_json, quiet):
            return
        if as_json:
            emit_json(report.to_dict())
            return
        if quiet:
            return
        resumed = f", resumed after {report.resumed_blocks} blocks" if report.resumed_blocks else ""
        typer.echo(
            f"{src} -> {dst}: {spec.dtype} {spec.granularity}, {report.passes} passes,"
            f" {report.seconds:.1f} s{resumed}"
        )
        if report.missing_chunks:
            typer.echo(
                f"warning: {report.missing_chunks} source chunks are missing (read as the"
                " fill value)",
                err=True,
            )
        error_table("quantization error", report.error)


@command(
    """
    qstream dequantize q.zarr restored.zarr
    qstream dequantize q.zarr restored.zarr --dtype bfloat16
    qstream dequantize model-int8.zarr model-restored.zarr
    """
)
def dequantize(
    src: str = typer.Argument(
        ..., metavar="SRC", help="A quantized group, or a converted checkpoint, from qstream."
    ),
    dst: str = typer.Argument(..., metavar="DST", help="Destination Zarr array (or group)."),
    dtype: str = typer.Option(
        "float32", "--dtype", metavar="TYPE", help="float32, float16 or bfloat16."
    ),
    max_memory: str | None = _MEM,
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace DST."),
    as_json: bool = _JSON,
    quiet: bool = _QUIET,
    scheduler: str | None = _SCHED,
    store: str = _STORE,
    compression: str = _compression("those of SRC's codes"),
):
    """Dequantize a quantized group into a plain Zarr array."""
    with library_errors():
        import qstream as qs

        if dtype not in ("float32", "float16", "bfloat16"):
            raise typer.BadParameter(f"--dtype must be float32, float16 or bfloat16, not {dtype}")
        show = not (quiet or as_json)
        with _executor(scheduler) as ex, progress("dequantize", not show) as cb:

            def on_tensor(ev):  # a converted checkpoint's: a line each, as convert prints
                which = f"[{ev.index + 1:>{len(str(ev.total))}}/{ev.total}] {ev.name}"
                if ev.result is None:
                    cb.tensor(which)  # (its progress lines name it)
                    return
                r = ev.result
                typer.echo(
                    f"{which} {list(ev.shape)} {ev.dtype} -> "
                    f"{'kept' if r['kept'] else ev.target}: {fmt_bytes(r['bytes_written'])}"
                )

            report = qs.dequantize_store(
                src,
                dst,
                dtype=dtype,
                max_memory=_size(max_memory, "--max-memory"),
                progress=cb,
                overwrite=overwrite,
                executor=ex,
                store=store,
                compression=compression,
                on_tensor=on_tensor if show else None,
            )
        if _done_already(dst, report, as_json, quiet):
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


@command(
    """
    qstream calibrate acts.zarr --method entropy
    qstream calibrate weights.zarr --axis 0 --method mse --json
    qstream calibrate acts.zarr --method entropy --show
    qstream calibrate acts.zarr --compare
    qstream calibrate weights.zarr --axis 0 --compare --json
    qstream calibrate model.safetensors --tensor model.layers.0.mlp.up_proj.weight --axis 0
    """
)
def calibrate(
    src: str = _SRC,
    dtype: str = _DTYPE,
    axis: int | None = _AXIS,
    block_size: int | None = _BLOCK,
    symmetric: bool = _SYM,
    method: str = _METHOD,
    percentile: float = _PCT,
    max_memory: str | None = _MEM,
    as_json: bool = _JSON,
    quiet: bool = _QUIET,
    scheduler: str | None = _SCHED,
    store: str = _STORE,
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
):
    """Print the scale and zero point a spec gives, and the data's range (writes nothing)."""
    with library_errors():
        import qstream as qs

        if tensor is not None:
            src = _checkpoint_tensor(src, tensor)
        _check_percentile(method, percentile)
        spec = qs.QuantSpec(
            dtype=dtype,
            axis=axis,
            block_size=block_size,
            symmetric=symmetric,
            method=method,
            percentile=percentile,
        )
        with _executor(scheduler) as ex, progress("calibrate", quiet or as_json) as cb:
            kw = {"max_memory": _size(max_memory, "--max-memory"), "progress": cb}
            if show or compare:  # the same calibration, with its view and predictions
                cal = qs.compare_methods(
                    src, spec, None if compare else [method], executor=ex, store=store, **kw
                )
            else:
                cal = qs.calibrate(src, spec, executor=ex, store=store, **kw)
        if as_json:
            emit_json(cal.to_dict())
            return
        if quiet:
            return
        if cal.params is None:
            typer.echo("per-block parameters: each block takes its own range when quantized")
            return
        rows = []
        for name, arr in (("scale", cal.scale), ("zero_point", cal.zero_point)):
            a = arr.reshape(-1)
            rows.append([name, f"{a.min():.6g}", f"{a.max():.6g}", f"{a.mean():.6g}"])
        if cal.stats is not None:
            rows.append(
                ["data range", f"{cal.stats.min.min():.6g}", f"{cal.stats.max.max():.6g}", ""]
            )
        table(
            f"calibration of {src} ({spec.method}, {spec.granularity})",
            ["", "min", "max", "mean"],
            rows,
        )
        if show or compare:
            show_calibration(cal, src)


@command(
    """
    qstream inspect q.zarr
    qstream inspect model-int8.zarr --json
    qstream inspect q.zarr --show
    qstream inspect q.zarr --plot report.png
    qstream inspect model-int8.zarr/layers.0.mlp.up_proj.weight --show
    """
)
def inspect(
    store: str = typer.Argument(
        ...,
        metavar="STORE",
        help="A quantized group, a converted checkpoint, or an export (.safetensors, .gguf).",
    ),
    as_json: bool = _JSON,
    show: bool = typer.Option(
        False,
        "--show",
        help="Draw the stored calibration histogram with its clip threshold (per tensor), the"
        " per-channel SQNR distribution and the worst channels (per channel), every group's"
        " SQNR and the worst groups (group-wise); of a checkpoint: the SQNR over its tensors,"
        " the worst and largest tensors, the bytes per target.",
    ),
    plot: Path | None = typer.Option(
        None,
        "--plot",
        metavar="FILE",
        help="Write a one-page figure (.png or .svg): histogram with thresholds, per-channel"
        " SQNR, error summary. Needs matplotlib: pip install 'qstream-zarr[plot]'.",
    ),
):
    """Show a quantized array's spec, parameters, calibration and error report."""
    with library_errors():
        import qstream as qs

        if store.endswith((".safetensors", ".safetensors.index.json", ".gguf")):
            from qstream.io.export import describe_export

            summary = describe_export(store)  # an export: its format and loader
            if as_json:
                emit_json(summary)
            else:
                for k, v in summary.items():
                    if v is not None and k != "quantized":
                        typer.echo(f"{k:<12} {v}")
            return
        if plot is not None:
            _check_plot(plot)
        arr = qs.open_quantized(store, allow_incomplete=True)
        whole = isinstance(arr, qs.QuantizedCheckpoint)
        summary = arr.summary()
        if plot is not None:
            from qstream.viz import mpl

            if whole:  # SQNR and size per tensor, from the root's index
                fig = mpl.checkpoint_figure(list(arr.tensors.values()), str(store))
            elif arr.spec.block_size and not arr.qtype.is_float:  # group-wise
                fig = mpl.group_figure(arr.view, arr.scale)
            else:
                fig = None
            mpl.save_figure(arr.view if not whole else None, plot, fig)
        if as_json:
            emit_json(summary)
            return
        if show and whole:  # the whole checkpoint: SQNR and size per tensor, bounded
            show_checkpoint(arr.view)
            if plot is not None:
                typer.echo(f"figure written to {plot}")
            return
        if isinstance(arr, qs.QuantizedCheckpoint):
            rows = []
            for name, r in summary["tensors"].items():
                sq = "" if r.get("kept") else fmt_db((r.get("error") or {}).get("sqnr_db"))
                rows.append(
                    [
                        name,
                        str(r.get("shape")),
                        str(r.get("dtype")),
                        "kept" if r.get("kept") else str(r.get("target")),
                        f"{fmt_bytes(r.get('bytes_before', 0))} ->"
                        f" {fmt_bytes(r.get('bytes_after', 0))}",
                        sq,
                    ]
                )
            table(
                f"{store}: {len(arr)} tensors, complete: {summary['complete']}",
                ["tensor", "shape", "dtype", "stored as", "bytes", "SQNR dB"],
                rows,
            )
            return
        rows = [
            [k, str(summary[k])]
            for k in (
                "shape",
                "dtype",
                "granularity",
                "axis",
                "block_size",
                "method",
                "symmetric",
                "round_mode",
                "compression",
                "complete",
            )
        ]
        for name in ("scale", "zero_point"):
            p = summary[name]
            rows.append([name, f"{p['shape']} min {p['min']:.6g} max {p['max']:.6g}"])
        table(str(store), ["", ""], rows, header=False)
        error_table("quantization error", summary.get("error"), worst=not show)
        if show:
            show_report(arr.view, store)
        if plot is not None:
            typer.echo(f"figure written to {plot}")


def _check_plot(path: Path) -> None:
    """Refuse a --plot file qstream cannot write, before any work."""
    if path.suffix.lower() not in (".png", ".svg"):
        raise typer.BadParameter(f"--plot {path}: the figure is written as .png or .svg")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise typer.BadParameter(
            "--plot needs matplotlib: pip install 'qstream-zarr[plot]'"
        ) from None


@command(
    """
    qstream convert model.safetensors model-int8.zarr
    qstream convert model.safetensors model-int8.zarr --recipe samples/recipe-int8.toml
    qstream convert model.safetensors model-int8.safetensors --max-shard-size 2GB
    qstream convert shards/model.safetensors.index.json out.zarr --json
    qstream convert model/ out/model.safetensors --dtype int4 --block-size 128 --exclude 'lm_head*'
    qstream convert model/ model.gguf --dtype int4 --block-size 32 --dry-run
    """
)
def convert(
    checkpoint: str = typer.Argument(
        ...,
        metavar="CHECKPOINT",
        help="safetensors (file, folder or .index.json; also at an s3:// or other store URL,"
        " read by byte ranges), .npz, .npy, a Zarr group, or a torch .pt/.bin state dict.",
    ),
    dst: str = typer.Argument(
        ..., metavar="DST", help="A directory (becomes a Zarr group) or a .safetensors file."
    ),
    recipe: Path | None = typer.Option(
        None,
        "--recipe",
        metavar="FILE",
        help="TOML recipe: which tensors to quantize and how [default: int8 per channel,"
        " axis 0, for float tensors of rank >= 2].",
    ),
    max_memory: str | None = _MEM,
    overwrite: bool = typer.Option(
        False,
        "--overwrite/--resume",
        help="Replace DST (a qstream output), or resume an interrupted run.",
    ),
    as_json: bool = _JSON,
    quiet: bool = _QUIET,
    scheduler: str | None = _SCHED,
    store: str = _STORE,
    max_shard_size: str = typer.Option(
        "5GB",
        "--max-shard-size",
        metavar="SIZE",
        help="With a .safetensors DST: shard above this size.",
    ),
    compression: str = _compression("zstd", " A .safetensors DST is never compressed."),
    packs: bool | None = typer.Option(
        None,
        "--packs/--no-packs",
        help="Store runs of small tensors alike in shape and spec (a layer's experts) stacked,"
        " one group each under DST/_packs [default: when the checkpoint holds 512 tensors or"
        " more and DST is a local directory].",
        show_default=False,
    ),
    fmt: str = typer.Option(
        "compressed-tensors",
        "--format",
        metavar="FORMAT",
        help="With a .safetensors DST: compressed-tensors (transformers, vLLM; writes"
        " config.json) or qstream.",
    ),
    config: str | None = typer.Option(
        None,
        "--config",
        metavar="CONFIG",
        help="With a .safetensors DST: the model config.json to merge the"
        " quantization_config into; with a .gguf DST: the config whose architecture is"
        " written [default: the checkpoint's own].",
    ),
    gguf_type: str | None = typer.Option(
        None,
        "--gguf-type",
        metavar="TYPE",
        help="With a .gguf DST: one block type (Q8_0, Q4_0, Q4_1) for every tensor the"
        " recipe quantizes [default: from the recipe: int8 -> Q8_0, int4 -> Q4_0, asymmetric"
        " 4-bit -> Q4_1].",
    ),
    dtype: str | None = typer.Option(
        None, "--dtype", metavar="TYPE", help="Without --recipe: the quantized type [int8]."
    ),
    axis: int | None = typer.Option(
        None,
        "--axis",
        metavar="N",
        help="Without --recipe: per channel on this axis [0; with --block-size: -1].",
    ),
    block_size: int | None = typer.Option(
        None, "--block-size", metavar="N", help="Without --recipe: groups of N along --axis."
    ),
    method: str | None = typer.Option(
        None,
        "--method",
        metavar="NAME",
        help=f"Without --recipe: {METHODS} [minmax; with --block-size: dynamic].",
    ),
    symmetric: bool | None = typer.Option(
        None, "--symmetric/--asymmetric", help="Without --recipe: the range [symmetric]."
    ),
    include: list[str] = typer.Option(
        [],
        "--include",
        metavar="PATTERN",
        help="Quantize only tensors whose names match (a glob; repeatable).",
    ),
    exclude: list[str] = typer.Option(
        [],
        "--exclude",
        metavar="PATTERN",
        help="Keep tensors whose names match, unquantized (a glob; repeatable).",
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print which tensor gets what, and the sizes; write nothing."
    ),
):
    """Quantize a model checkpoint tensor by tensor, as a recipe (or the spec flags) says."""
    with library_errors():
        import qstream as qs

        if gguf_type is not None and not dst.endswith(".gguf"):
            raise typer.BadParameter("--gguf-type applies to a .gguf DST only")
        if (fmt != "compressed-tensors" or config) and not dst.endswith((".safetensors", ".gguf")):
            raise typer.BadParameter("--format and --config apply to a .safetensors DST only")
        if fmt != "compressed-tensors" and dst.endswith(".gguf"):
            raise typer.BadParameter("--format applies to a .safetensors DST (a .gguf is GGUF)")
        flags = {"dtype": dtype, "axis": axis, "block_size": block_size, "method": method}
        flags = {k: v for k, v in {**flags, "symmetric": symmetric}.items() if v is not None}
        rec = _convert_recipe(recipe, flags, include, exclude)
        if dry_run:
            _print_plan(qs.plan_conversion(checkpoint, rec), as_json)
            return
        show = not (quiet or as_json)
        qs.warm_up(rec.specs(), background=True)  # first run: see quantize

        def on_tensor(ev):
            if not show or ev.result is None:
                return
            r = ev.result
            tag = "kept" if r["kept"] else ev.target
            sq = "" if r["kept"] else f"  SQNR {fmt_db(r['error']['sqnr_db'])} dB"
            typer.echo(
                f"[{ev.index + 1:>{len(str(ev.total))}}/{ev.total}] {ev.name}"
                f" {list(ev.shape)} {ev.dtype} -> {tag}: {fmt_bytes(r['bytes_before'])}"
                f" -> {fmt_bytes(r['bytes_after'])}{sq}"
            )

        with _executor(scheduler) as ex, progress("convert", not show):
            report = qs.convert_checkpoint(
                checkpoint,
                dst,
                rec,
                max_memory=_size(max_memory, "--max-memory"),
                overwrite=overwrite,
                on_tensor=on_tensor,
                executor=ex,
                max_shard_size=_size(max_shard_size, "--max-shard-size"),
                compression=compression,
                **({"format": fmt, "config": config} if dst.endswith(".safetensors") else {}),
                **({"format": gguf_type, "config": config} if dst.endswith(".gguf") else {}),
                **({"store": store} if store != "fsspec" else {}),
                **({"packs": packs} if packs is not None else {}),
            )
        if _done_already(dst, report, as_json, quiet):
            return
        if as_json:
            emit_json(report)
            return
        if quiet:
            return
        if dst.endswith(".gguf"):
            typer.echo(_gguf_summary(checkpoint, report))
            return
        rows = [(n, r) for n, r in report["tensors"].items() if not r["kept"]]

        def worst_first(item):
            v = item[1]["error"]["sqnr_db"]
            return float(v) if v is not None else float("inf")

        table(
            "quantized tensors, worst SQNR first",
            ["tensor", "shape", "type", "SQNR dB", "max err", "clip %"],
            [
                [
                    name,
                    str(r["shape"]),
                    r["target"],
                    fmt_db(r["error"]["sqnr_db"]),
                    f"{r['error']['max_abs']:.3g}",
                    f"{100 * r['error']['clip_fraction']:.3f}",
                ]
                for name, r in sorted(rows, key=worst_first)
            ],
        )
        kept = len(report["tensors"]) - len(rows)
        typer.echo(
            f"{len(rows)} quantized, {kept} kept; {fmt_bytes(report['bytes_before'])}"
            f" -> {fmt_bytes(report['bytes_after'])} in {report['seconds']:.1f} s"
        )
        if report.get("files"):
            typer.echo("written: " + ", ".join(report["files"]))


@command(
    """
    qstream export model-int8.zarr model-int8.safetensors
    qstream export model-int8.zarr out/model.safetensors --max-shard-size 2GB
    qstream export q.zarr weight.safetensors --name layer0.weight
    qstream export model.safetensors model-q4_0.gguf --gguf-type Q4_0
    """
)
def export(
    src: str = typer.Argument(
        ...,
        metavar="SRC",
        help="A converted checkpoint (or one quantized group); for a .gguf OUT also a float"
        " checkpoint.",
    ),
    out: str = typer.Argument(
        ...,
        metavar="OUT",
        help="The .safetensors file (shards go beside it) or a .gguf file (llama.cpp).",
    ),
    gguf_type: str | None = typer.Option(
        None,
        "--gguf-type",
        metavar="TYPE",
        help="GGUF block type for a float checkpoint: Q8_0, Q4_0, Q4_1 (or F16, BF16, F32)"
        " [default: Q8_0].",
    ),
    max_shard_size: str = typer.Option(
        "5GB",
        "--max-shard-size",
        metavar="SIZE",
        help="Split into shards with an index above this size.",
    ),
    name: str = typer.Option(
        "weight", "--name", metavar="NAME", help="Tensor name for a single group."
    ),
    fmt: str = typer.Option(
        "compressed-tensors",
        "--format",
        metavar="FORMAT",
        help="compressed-tensors (transformers, vLLM: writes config.json) or qstream.",
    ),
    config: str | None = typer.Option(
        None,
        "--config",
        metavar="CONFIG",
        help="The model's config.json to merge the quantization_config into (default: the"
        " one beside the converted checkpoint's source).",
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace existing files."),
    as_json: bool = _JSON,
    quiet: bool = _QUIET,
):
    """Export quantized tensors for an inference stack, streaming, with bounded memory:
    safetensors in the compressed-tensors layout with its config.json (transformers, vLLM),
    or qstream's own layout (N, N_scale, N_zero_point)."""
    with library_errors():
        import qstream as qs

        if out.endswith(".gguf"):
            result = qs.export_gguf(
                src, out, type=gguf_type or "Q8_0", config=config, overwrite=overwrite
            )
            if as_json:
                emit_json(result)
            elif not quiet:
                typer.echo(_gguf_summary(src, result))
            return
        result = qs.export_safetensors(
            src,
            out,
            format=fmt,
            config=config,
            max_shard_size=_size(max_shard_size, "--max-shard-size"),
            overwrite=overwrite,
            name=name,
        )
        if _done_already(out, result, as_json, quiet):
            return
        if as_json:
            emit_json(result)
        elif not quiet:
            typer.echo(
                f"{src} -> {', '.join(result['files'])}: {len(result['tensors'])} tensors,"
                f" {fmt_bytes(result['bytes'])}, for {result['loader']}"
            )
            if result.get("config") and not _has_model_type(result["config"]):
                typer.echo(
                    f"note: {result['config']} holds the quantization_config only (no model"
                    " config.json was found): merge your model's config into it, or pass"
                    " --config"
                )


def _convert_recipe(path, flags: dict, include: list[str], exclude: list[str]):
    """The recipe of a ``convert``: the file, or the spec flags as its defaults; ``--exclude``
    patterns become keep rules before its own, ``--include`` limits what is quantized."""
    import qstream as qs

    if path and flags:
        raise typer.BadParameter(
            "--recipe and the spec flags ("
            + ", ".join("--" + k.replace("_", "-") for k in flags)
            + ") do not mix: put the spec in the recipe's [defaults]"
        )
    d = qs.Recipe.load(path).to_dict() if path else {"defaults": {}, "rules": []}
    if flags:
        if "block_size" in flags:
            flags.setdefault("axis", -1)
            flags.setdefault("method", "dynamic")
        d["defaults"] = {**d["defaults"], **flags}
    d["rules"] = [{"pattern": p, "action": "keep"} for p in exclude] + d.get("rules", [])
    if include:
        d["include"] = list(include)
    return qs.Recipe.from_dict(d)


def _print_plan(rows: list[dict], as_json: bool) -> None:
    if as_json:
        emit_json({"plan": rows})
        return
    table(
        "conversion plan (nothing written)",
        ["tensor", "shape", "dtype", "target", "before", "after"],
        [
            [r["name"], str(r["shape"]), r["dtype"], r["target"], fmt_bytes(r["bytes_before"]),
             fmt_bytes(r["bytes_after"])]
            for r in rows
        ],
    )  # fmt: skip
    quantized = sum(1 for r in rows if not r["target"].startswith("keep"))
    before = sum(r["bytes_before"] for r in rows)
    after = sum(r["bytes_after"] for r in rows)
    typer.echo(
        f"{quantized} quantized, {len(rows) - quantized} kept;"
        f" {fmt_bytes(before)} -> {fmt_bytes(after)}"
    )


def _gguf_summary(src: str, result: dict) -> str:
    kinds: dict[str, int] = {}
    for t in result["tensors"].values():
        kinds[t] = kinds.get(t, 0) + 1
    mix = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    return (
        f"{src} -> {result['file']}: {mix}; {fmt_bytes(result['bytes'])}, architecture"
        f" {result['architecture']}, for llama.cpp / gguf-py"
    )


def _has_model_type(path: str) -> bool:
    import json

    with open(path) as f:
        return "model_type" in json.load(f)


@command(
    """
    qstream warm-up
    RUN qstream warm-up        (a Dockerfile line: the image starts with compiled kernels)
    """
)
def warm_up(
    processes: int | None = typer.Option(
        None, "--processes", metavar="N", help="Compile in N processes [default: the cores]."
    ),
    as_json: bool = _JSON,
    quiet: bool = _QUIET,
):
    """Compile the kernels of the common jobs (int8 per tensor / per channel / percentile,
    int4 and int8 groups, asymmetric uint8 and uint4, float8; their dequantize) into Numba's
    cache once, so that no later run on this machine or image waits for a compiler."""
    with library_errors():
        from qstream.engine.warmup import warm_common

        if not (quiet or as_json):
            typer.echo("compiling the kernels of the common jobs (once per machine) ...", err=True)
        result = warm_common(processes)
        if as_json:
            emit_json(result)
        elif not quiet:
            typer.echo(
                f"kernels of {len(result['specs'])} job kinds ready in {result['seconds']:.1f} s"
            )


@command("qstream info")
def info() -> None:
    """List the quantized types, round modes and compatibility profiles."""
    import qstream as qs

    table(
        "quantized types",
        ["name", "kind", "bits", "min", "max"],
        [[t.name, t.kind, str(t.bits), f"{t.qmin:g}", f"{t.qmax:g}"] for t in qs.QTYPES.values()],
    )
    typer.echo("round modes: " + ", ".join(qs.ROUND_MODES))
    typer.echo("profiles: " + ", ".join(f"qstream.compat.{p}" for p in qs.compat.PROFILES))


@command("qstream version")
def version() -> None:
    """Print the qstream version (also: qstream --version)."""
    typer.echo(f"qstream {qstream.__version__}")


def main() -> None:  # pragma: no cover - console entry point
    import signal

    from .errors import on_sigterm, quiet_pipe, show_warnings

    signal.signal(signal.SIGTERM, on_sigterm)  # as Ctrl-C: one line, resumable, exit 143
    show_warnings()
    try:
        app()
    except BrokenPipeError:  # output cut short outside a command (help text | head)
        quiet_pipe()
        raise SystemExit(141) from None


if __name__ == "__main__":  # pragma: no cover
    main()
