"""The ``qstream`` command line. It parses, shows progress and maps errors to exit codes; all
numeric and storage work is the library's.

Exit codes: 0 success, 1 failure (bad data, missing/corrupt store, I/O), 2 bad usage (unknown
option value, bad axis, bad scale...). Errors are one line on stderr; ``--debug`` adds the
traceback. Heavy imports happen inside commands, so ``qstream --help`` stays fast.
"""

from __future__ import annotations

import json
import re
import sys
from contextlib import contextmanager
from pathlib import Path

import typer

import qstream

app = typer.Typer(
    name="qstream",
    help="Exact quantization and dequantization of arrays, out of core.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
_state = {"debug": False}

DTYPES = ", ".join(qstream.QTYPES)


@app.callback()
def _main(debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors.")):
    _state["debug"] = debug


# --------------------------------------------------------------------------- helpers


def _size(text: str | None) -> int | None:
    """'512MiB', '2GB', '1e9' -> bytes."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]i?B?|B)?\s*", text, re.IGNORECASE)
    if not m:
        raise typer.BadParameter(f"not a size: {text!r} (examples: 512MiB, 2GB)")
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
    return int(float(m.group(1)) * mult)


# library argument names in error messages -> the flags that set them
_FLAGS = (
    (re.compile(r"\boverwrite=True\b"), "--overwrite"),
    (re.compile(r"\bnan_policy='(\w+)'"), r"--nan-policy \1"),
    (re.compile(r"\bresume=False\b"), "--overwrite"),
)


def _fail(message: str, code: int):
    for pattern, flag in _FLAGS:
        message = pattern.sub(flag, message)
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


@contextmanager
def _errors():
    """Map library errors to one line and an exit code."""
    from qstream import InvalidDTypeError, InvalidParameterError, QStreamError

    try:
        yield
    except typer.Exit:
        raise
    except typer.BadParameter as e:
        _fail(str(e), 2)
    except KeyboardInterrupt:
        _fail("interrupted; run the same command again to resume", 130)
    except Exception as e:
        if _state["debug"]:
            raise
        if isinstance(e, (InvalidParameterError, InvalidDTypeError)):
            _fail(str(e), 2)
        if isinstance(e, QStreamError):
            _fail(str(e), 1)
        if isinstance(e, (OSError, PermissionError)):
            _fail(f"{e.__class__.__name__}: {e}", 1)
        _fail(f"internal error: {e.__class__.__name__}: {e} (re-run with --debug for details)", 1)


@contextmanager
def _progress(label: str, quiet: bool):
    """A Rich progress bar on a terminal, plain lines otherwise; yields a (done, total) callback."""
    from rich.console import Console

    console = Console(stderr=True)
    if quiet:
        yield None
        return
    if console.is_terminal:
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} blocks"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        ) as bar:
            task = bar.add_task(label, total=None)

            def update(done, total):
                bar.update(task, completed=done, total=total)

            yield update
        return
    last = [-1]

    def plain(done, total):
        pct = int(100 * done / max(total, 1))
        if pct // 10 != last[0] // 10 or done == total:
            last[0] = pct
            print(f"{label}: {done}/{total} blocks ({pct}%)", file=sys.stderr, flush=True)

    yield plain


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _fmt_db(v) -> str:
    return str(v) if isinstance(v, str) else f"{v:.2f}"


def _print_error_table(title: str, error: dict | None):
    from rich.console import Console
    from rich.table import Table

    if not error:
        return
    t = Table(title=title, show_header=False)
    for k in ("sqnr_db", "mse", "max_abs", "cosine", "clip_fraction", "nonfinite", "count"):
        if k in error:
            v = error[k]
            t.add_row(
                k, _fmt_db(v) if k == "sqnr_db" else f"{v:.6g}" if isinstance(v, float) else str(v)
            )
    Console().print(t)
    worst = error.get("worst_channels")
    if worst:
        w = Table(title="worst channels")
        for col in ("channel", "sqnr_db", "max_abs"):
            w.add_column(col)
        for row in worst:
            w.add_row(str(row["channel"]), _fmt_db(row["sqnr_db"]), f"{row['max_abs']:.4g}")
        Console().print(w)


# --------------------------------------------------------------------------- commands

_DTYPE = typer.Option("int8", "--dtype", help=f"Quantized type: {DTYPES}.")
_AXIS = typer.Option(None, "--axis", help="Per-axis (or blocked) along this axis.")
_BLOCK = typer.Option(None, "--block-size", help="Blocks of this many elements along --axis.")
_SYM = typer.Option(True, "--symmetric/--asymmetric", help="Symmetric range (zero point 0).")
_METHOD = typer.Option(
    "minmax", "--method", help="minmax, percentile, entropy, mse, l2 or dynamic."
)
_PCT = typer.Option(99.99, "--percentile", help="Percent of values kept (method percentile).")
_ROUND = typer.Option("half_to_even", "--round-mode", help="One of the nine round modes.")
_NAN = typer.Option("error", "--nan-policy", help="error, zero_point or min.")
_MEM = typer.Option(None, "--max-memory", help="Working-memory bound, e.g. 512MiB.")
_JSON = typer.Option(False, "--json", help="Print one machine-readable report on stdout.")
_QUIET = typer.Option(False, "--quiet", "-q", help="No progress, no tables.")
_SCHED = typer.Option(
    None,
    "--scheduler",
    help="Run the blocks on a Dask cluster: its scheduler address (tcp://host:8786), or"
    " local:N to start N local worker processes for this run. Paths must be shared by all"
    " workers (or object-store URLs).",
)
_STORE = typer.Option(
    "fsspec", "--store", help="How URLs (s3://, gs://, ...) are opened: fsspec or obstore."
)


@contextmanager
def _executor(scheduler: str | None):
    """The executor ``--scheduler`` names (None: this process's threads)."""
    if not scheduler:
        yield None
        return
    try:
        import distributed
    except ImportError:
        raise typer.BadParameter("--scheduler needs Dask: pip install 'qstream[dask]'") from None
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


@app.command()
def quantize(
    src: str = typer.Argument(..., help="Source Zarr array (path, .zip or URL)."),
    dst: str = typer.Argument(..., help="Destination (directory, .zip or URL)."),
    dtype: str = _DTYPE,
    axis: int | None = _AXIS,
    block_size: int | None = _BLOCK,
    symmetric: bool = _SYM,
    method: str = _METHOD,
    percentile: float = _PCT,
    round_mode: str = _ROUND,
    scale: float | None = typer.Option(None, "--scale", help="Explicit scale (skips calibration)."),
    zero_point: int | None = typer.Option(None, "--zero-point", help="Explicit zero point."),
    nan_policy: str = _NAN,
    max_memory: str | None = _MEM,
    overwrite: bool = typer.Option(
        False, "--overwrite/--resume", help="Replace DST, or resume an interrupted job (default)."
    ),
    as_json: bool = _JSON,
    quiet: bool = _QUIET,
    scheduler: str | None = _SCHED,
    store: str = _STORE,
):
    """Quantize a Zarr array into a quantized group."""
    with _errors():
        import qstream as qs

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
        )
        with _executor(scheduler) as ex, _progress("quantize", quiet or as_json) as cb:
            report = qs.quantize_store(
                src,
                dst,
                spec,
                max_memory=_size(max_memory),
                progress=cb,
                overwrite=overwrite,
                executor=ex,
                store=store,
            )
        if as_json:
            typer.echo(json.dumps(report.to_dict()))
        elif report.already_complete:
            if not quiet:
                typer.echo(f"{dst}: already complete (same job); nothing to do")
        elif not quiet:
            resumed = (
                f", resumed after {report.resumed_blocks} blocks" if report.resumed_blocks else ""
            )
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
            _print_error_table("quantization error", report.error)


@app.command()
def dequantize(
    src: str = typer.Argument(..., help="A quantized group written by qstream."),
    dst: str = typer.Argument(..., help="Destination Zarr array."),
    dtype: str = typer.Option("float32", "--dtype", help="float32, float16 or bfloat16."),
    max_memory: str | None = _MEM,
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace DST."),
    as_json: bool = _JSON,
    quiet: bool = _QUIET,
    scheduler: str | None = _SCHED,
    store: str = _STORE,
):
    """Dequantize a quantized group into a plain Zarr array."""
    with _errors():
        import qstream as qs

        if dtype not in ("float32", "float16", "bfloat16"):
            raise typer.BadParameter(f"--dtype must be float32, float16 or bfloat16, not {dtype}")
        with _executor(scheduler) as ex, _progress("dequantize", quiet or as_json) as cb:
            report = qs.dequantize_store(
                src,
                dst,
                dtype=dtype,
                max_memory=_size(max_memory),
                progress=cb,
                overwrite=overwrite,
                executor=ex,
                store=store,
            )
        if as_json:
            typer.echo(json.dumps(report))
        elif report["already_complete"]:
            if not quiet:
                typer.echo(f"{dst}: already complete (same job); nothing to do")
        elif not quiet:
            what = (
                f"{len(report['tensors'])} tensors"
                if "tensors" in report
                else str(tuple(report["shape"]))
            )
            typer.echo(f"{src} -> {dst}: {report['dtype']} {what}, {report['seconds']:.1f} s")


@app.command()
def calibrate(
    src: str = typer.Argument(..., help="Source Zarr array."),
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
):
    """Gather statistics and print the scale / zero point a spec gives (writes nothing)."""
    with _errors():
        import qstream as qs

        spec = qs.QuantSpec(
            dtype=dtype,
            axis=axis,
            block_size=block_size,
            symmetric=symmetric,
            method=method,
            percentile=percentile,
        )
        with _executor(scheduler) as ex, _progress("calibrate", quiet or as_json) as cb:
            cal = qs.calibrate(
                src, spec, max_memory=_size(max_memory), progress=cb, executor=ex, store=store
            )
        if as_json:
            typer.echo(json.dumps(cal.to_dict()))
            return
        if quiet:
            return
        from rich.console import Console
        from rich.table import Table

        t = Table(title=f"calibration of {src} ({spec.method}, {spec.granularity})")
        for col in ("", "min", "max", "mean"):
            t.add_column(col)
        if cal.params is None:
            typer.echo("per-block parameters: each block takes its own range when quantized")
            return
        for name, arr in (("scale", cal.scale), ("zero_point", cal.zero_point)):
            a = arr.reshape(-1)
            t.add_row(name, f"{a.min():.6g}", f"{a.max():.6g}", f"{a.mean():.6g}")
        if cal.stats is not None:
            t.add_row("data range", f"{cal.stats.min.min():.6g}", f"{cal.stats.max.max():.6g}", "")
        Console().print(t)


@app.command()
def inspect(
    store: str = typer.Argument(..., help="A quantized group or converted checkpoint."),
    as_json: bool = _JSON,
):
    """Show a quantized array's spec, parameters, calibration and error report."""
    with _errors():
        import qstream as qs

        arr = qs.open_quantized(store, allow_incomplete=True)
        summary = arr.summary()
        if as_json:
            typer.echo(json.dumps(summary))
            return
        from rich.console import Console
        from rich.table import Table

        console = Console()
        if isinstance(arr, qs.QuantizedCheckpoint):
            t = Table(title=f"{store}: {len(arr)} tensors, complete: {summary['complete']}")
            for col in ("tensor", "shape", "dtype", "stored as", "bytes", "SQNR dB"):
                t.add_column(col)
            for name, r in summary["tensors"].items():
                sq = "" if r.get("kept") else _fmt_db((r.get("error") or {}).get("sqnr_db"))
                t.add_row(
                    name,
                    str(r.get("shape")),
                    str(r.get("dtype")),
                    "kept" if r.get("kept") else str(r.get("target")),
                    f"{_fmt_bytes(r.get('bytes_before', 0))} -> "
                    f"{_fmt_bytes(r.get('bytes_after', 0))}",
                    sq,
                )
            console.print(t)
            return
        t = Table(title=f"{store}", show_header=False)
        for k in (
            "shape",
            "dtype",
            "granularity",
            "axis",
            "block_size",
            "method",
            "symmetric",
            "round_mode",
            "complete",
        ):
            t.add_row(k, str(summary[k]))
        for name in ("scale", "zero_point"):
            p = summary[name]
            t.add_row(name, f"{p['shape']} min {p['min']:.6g} max {p['max']:.6g}")
        console.print(t)
        _print_error_table("quantization error", summary.get("error"))


@app.command()
def convert(
    checkpoint: str = typer.Argument(
        ..., help="safetensors (file, dir or index), .npz, .npy, Zarr group, or torch .pt/.bin"
    ),
    dst: str = typer.Argument(
        ..., help="Destination: a directory (a Zarr group), or a .safetensors file."
    ),
    recipe: Path | None = typer.Option(None, "--recipe", help="TOML recipe (see README)."),
    max_memory: str | None = _MEM,
    overwrite: bool = typer.Option(
        False, "--overwrite/--resume", help="Replace DST, or resume an interrupted run (default)."
    ),
    as_json: bool = _JSON,
    quiet: bool = _QUIET,
    scheduler: str | None = _SCHED,
    max_shard_size: str = typer.Option(
        "5GB", "--max-shard-size", help="With a .safetensors DST: shard above this size."
    ),
):
    """Quantize a model checkpoint tensor by tensor, per a recipe."""
    with _errors():
        import qstream as qs

        rec = qs.Recipe.load(recipe) if recipe else qs.Recipe()
        show = not (quiet or as_json)

        def on_tensor(ev):
            if not show or ev.result is None:
                return
            r = ev.result
            tag = "kept" if r["kept"] else ev.target
            sq = "" if r["kept"] else f"  SQNR {_fmt_db(r['error']['sqnr_db'])} dB"
            typer.echo(
                f"[{ev.index + 1:>{len(str(ev.total))}}/{ev.total}] {ev.name}"
                f" {list(ev.shape)} {ev.dtype} -> {tag}: {_fmt_bytes(r['bytes_before'])}"
                f" -> {_fmt_bytes(r['bytes_after'])}{sq}"
            )

        with _executor(scheduler) as ex:
            report = qs.convert_checkpoint(
                checkpoint,
                dst,
                rec,
                max_memory=_size(max_memory),
                overwrite=overwrite,
                on_tensor=on_tensor,
                executor=ex,
                max_shard_size=_size(max_shard_size),
            )
        if as_json:
            typer.echo(json.dumps(report))
            return
        if quiet:
            return
        from rich.console import Console
        from rich.table import Table

        rows = [(n, r) for n, r in report["tensors"].items() if not r["kept"]]

        def key(item):
            v = item[1]["error"]["sqnr_db"]
            return float(v) if not isinstance(v, str) else float(v.replace("inf", "1e309"))

        t = Table(title="quantized tensors, worst SQNR first")
        t.add_column("tensor", overflow="fold", ratio=3)
        for col in ("shape", "type", "SQNR dB", "max err", "clip %"):
            t.add_column(col, no_wrap=True)
        for name, r in sorted(rows, key=key):
            e = r["error"]
            t.add_row(
                name,
                str(r["shape"]),
                r["target"],
                _fmt_db(e["sqnr_db"]),
                f"{e['max_abs']:.3g}",
                f"{100 * e['clip_fraction']:.3f}",
            )
        console = Console()
        console.print(t)
        kept = len(report["tensors"]) - len(rows)
        console.print(
            f"{len(rows)} quantized, {kept} kept; {_fmt_bytes(report['bytes_before'])}"
            f" -> {_fmt_bytes(report['bytes_after'])} in {report['seconds']:.1f} s"
        )
        if report.get("files"):
            console.print("written: " + ", ".join(report["files"]))


@app.command()
def export(
    src: str = typer.Argument(..., help="A converted checkpoint (or one quantized group)."),
    out: str = typer.Argument(..., help="The .safetensors file (shards go beside it)."),
    max_shard_size: str = typer.Option(
        "5GB", "--max-shard-size", help="Split into shards with an index above this size."
    ),
    name: str = typer.Option("weight", "--name", help="Tensor name for a single group."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace existing files."),
    as_json: bool = _JSON,
    quiet: bool = _QUIET,
):
    """Export quantized tensors as safetensors (N, N_scale, N_zero_point: the
    compressed-tensors naming), streaming, with bounded memory."""
    with _errors():
        import qstream as qs

        result = qs.export_safetensors(
            src, out, max_shard_size=_size(max_shard_size), overwrite=overwrite, name=name
        )
        if as_json:
            typer.echo(json.dumps(result))
        elif not quiet:
            typer.echo(
                f"{src} -> {', '.join(result['files'])}: {len(result['tensors'])} tensors,"
                f" {_fmt_bytes(result['bytes'])}"
            )


@app.command()
def info() -> None:
    """List the quantized types, round modes and compatibility profiles."""
    from rich.console import Console
    from rich.table import Table

    import qstream as qs

    table = Table(title="quantized types")
    for col in ("name", "kind", "bits", "min", "max"):
        table.add_column(col)
    for t in qs.QTYPES.values():
        table.add_row(t.name, t.kind, str(t.bits), f"{t.qmin:g}", f"{t.qmax:g}")
    console = Console()
    console.print(table)
    console.print("round modes: " + ", ".join(qs.ROUND_MODES))
    console.print("profiles: " + ", ".join(f"qstream.compat.{p}" for p in qs.compat.PROFILES))


@app.command()
def version() -> None:
    """Print the qstream version."""
    import qstream

    typer.echo(qstream.__version__)


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
