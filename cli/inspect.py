"""``qstream inspect``: what a quantized output, a converted checkpoint or an export holds;
with ``--show`` its stored views in the terminal, with ``--plot`` a one-page figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

import qstream as qs

from .failures import fail, library_errors
from .helptext import examples
from .options import JSON, MAX_MEMORY, parse_size, require_input
from .output import emit_json, error_table, fmt_bytes, fmt_compression, fmt_db, table
from .show import show_checkpoint, show_report

EXPORTS = (".safetensors", ".safetensors.index.json", ".gguf")

#: the rows of an inspected quantized array's table, in order
FIELDS = (
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
    "size",
)


@examples(
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
    as_json: bool = JSON,
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
    max_memory: str | None = MAX_MEMORY,
) -> None:
    """Show a quantized array's spec, parameters, calibration and error report.

    Sizes: "after" is every byte the output holds for a tensor, uncompressed: its codes and
    its parameters (scales, zero points unless all 0), as convert reports it."""
    with library_errors():
        if plot is not None:
            check_plot(plot)  # (usage first)
        limit = parse_size(max_memory, "--max-memory")
        require_input(store, "STORE")
        if store.endswith(EXPORTS) or model_folder(store):
            print_export(store, as_json, plot)
            return
        arr = qs.open_quantized(store, allow_incomplete=True, max_memory=limit)
        assert not isinstance(arr, dict)  # (an export opens as a dict: described above)
        whole = isinstance(arr, qs.QuantizedCheckpoint)
        summary = arr.summary()
        if whole:  # (a listing per tensor folder and pack: what a finished one lacks)
            summary["damaged"] = arr.damaged()
        if plot is not None:
            save_plot(arr, store, plot)
        if as_json:
            emit_json(summary)
            figure_written(plot, as_json)
            refuse_damaged(store, summary.get("damaged"), as_json)
            return
        if show and whole:  # the whole checkpoint: SQNR and size per tensor, bounded
            show_checkpoint(arr.view)
            figure_written(plot, as_json)
            refuse_damaged(store, summary["damaged"], as_json)
            return
        if isinstance(arr, qs.QuantizedCheckpoint):
            checkpoint_table(store, len(arr), summary)
            figure_written(plot, as_json)
            refuse_damaged(store, summary["damaged"], as_json)
            return
        shown = {
            **summary,
            "compression": fmt_compression(summary["compression"]),
            "size": f"{fmt_bytes(summary['bytes_after'])} (codes and parameters)",
        }
        rows = [[k, str(shown[k])] for k in FIELDS]
        if summary["damaged"]:
            rows.append(["damaged", damaged_text(summary["damaged"])])
        for name in ("scale", "zero_point"):
            p = summary[name]
            rows.append([name, f"{p['shape']} min {p['min']:.6g} max {p['max']:.6g}"])
        table(str(store), ["", ""], rows, header=False)
        error_table("quantization error", summary.get("error"), worst=not show)
        if show:
            show_report(arr.view, store)
        figure_written(plot, as_json)
        refuse_damaged(store, summary["damaged"], as_json)


def damaged_text(damaged: list[str]) -> str:
    """The parts a finished output lacks, the first three named."""
    more = f" and {len(damaged) - 3} more" if len(damaged) > 3 else ""
    return f"{', '.join(damaged[:3])}{more} absent or of the wrong size"


def refuse_damaged(store: str, damaged: list[str] | None, as_json: bool) -> None:
    """Exit 1 naming what the finished output ``store`` lacks (after it was described: what
    is there is worth seeing), if anything; with ``--json`` the report on stdout is the
    one JSON document (``damaged`` lists them), the error on stderr."""
    if not damaged:
        return
    message = (
        f"{store} is damaged: {damaged_text(damaged)}; qstream writes every chunk of a"
        " finished output: make it again (the quantize or convert that wrote it, with"
        " --overwrite)"
    )
    if as_json:
        typer.echo(f"error: {message}", err=True)
        raise typer.Exit(1)
    fail(message, 1, "damaged", "StoreError")


#: summary keys not printed as a line (the table shows the tensors; types have their line)
_NOT_LINES = ("quantized", "tensor_list", "tensor_bytes", "types", "hf_names", "refused")


def model_folder(path: str) -> bool:
    """Whether ``path`` is a folder of safetensors files (a model as saved), not a Zarr group."""
    p = Path(path)
    if not p.is_dir() or any((p / n).exists() for n in ("zarr.json", ".zgroup", ".zarray")):
        return False
    return any(p.glob("*.safetensors"))


def print_export(path: str, as_json: bool, plot: Path | None = None) -> None:
    """An export (safetensors, GGUF) or a model checkpoint (a folder, a file or an index of
    safetensors: its quantized format named, and whether qstream decodes it): its format and
    loader, the summary of its header
    (GGUF: architecture, tokenizer, vocabulary, context length, blocks, experts), then a
    table of its tensors (name, type, shape, size; a safetensors export's quantized target
    and SQNR where recorded). With ``plot``: a bar chart of the bytes per stored type."""
    if path.endswith(".gguf"):  # (qstream's, or another tool's: its file type named)
        summary = qs.describe_export(path)
    else:  # a model checkpoint: its format named; qstream's own exports: their targets
        summary = qs.describe_checkpoint(path)
        if summary.get("written_by") == "qstream":
            summary = qs.describe_export(path)
    listed: list[dict[str, Any]] = summary.get("tensor_list") or []
    if plot is not None:
        plot_export_bytes(listed, path, plot)
    if as_json:
        emit_json(summary)
        figure_written(plot, as_json)
        return
    for k, v in summary.items():
        if v is not None and k not in _NOT_LINES:
            typer.echo(f"{k:<14} {v}")
    if summary.get("types"):
        typer.echo(f"{'types':<14} {', '.join(f'{t} {n}' for t, n in summary['types'].items())}")
    owned = summary.get("tensor_bytes")
    shown = listed
    if isinstance(owned, dict):  # a safetensors export: a row per tensor, its entries' bytes
        first: dict[str, dict[str, Any]] = {}
        for t in listed:  # (the tensor's own entry, else its first: a packed form's codes)
            name = t.get("tensor", t["name"])
            row = first.get(name)
            if row is None or t["name"] == name:
                said = {c: t.get(c) or (row or {}).get(c) for c in ("target", "sqnr_db")}
                first[name] = {**t, "name": name, "bytes": owned.get(name, t["bytes"]), **said}
            else:  # (a parameter: what its tensor's first entry did not say)
                row.update({c: row.get(c) or t.get(c) for c in ("target", "sqnr_db")})
        shown = list(first.values())
    extra = [c for c in ("target", "sqnr_db") if any(t.get(c) is not None for t in shown)]
    rows = [
        [t["name"], str(t.get("type") or t.get("dtype")), str(t["shape"]), fmt_bytes(t["bytes"])]
        + [str(t.get(c) or "") if c == "target" else fmt_db(t.get(c)) for c in extra]
        for t in shown
    ]
    heads = {"target": "target", "sqnr_db": "SQNR dB"}
    title = f"{len(shown)} tensors"
    if len(shown) != len(listed):
        title += f" ({len(listed)} entries in the file: a quantized tensor's size is its codes"
        title += " and parameters)"
    table(title, ["tensor", "type", "shape", "size"] + [heads[c] for c in extra], rows)
    figure_written(plot, as_json)


def figure_written(plot: Path | None, as_json: bool) -> None:
    """Say where the figure went (on stderr under ``--json``: stdout holds the JSON alone)."""
    if plot is not None:
        typer.echo(f"figure written to {plot}", err=as_json)


def figure_folder(plot: Path) -> None:
    """Make the folder ``plot`` goes in, as every command makes its output's (just before the
    figure is written: a failed job leaves no folder behind)."""
    plot.parent.mkdir(parents=True, exist_ok=True)


def plot_export_bytes(listed: list[dict[str, Any]], path: str, plot: Path) -> None:
    """Write a bar chart of an export's stored bytes per type (GGML type or safetensors
    dtype) to ``plot``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per: dict[str, int] = {}
    for t in listed:
        kind = str(t.get("type") or t.get("dtype"))
        per[kind] = per.get(kind, 0) + int(t["bytes"])
    kinds = sorted(per, key=lambda k: -per[k])
    fig, ax = plt.subplots(figsize=(6.4, 3.6), layout="constrained")
    bars = ax.bar(kinds, [per[k] / 2**20 for k in kinds], color="tab:blue")
    ax.bar_label(bars, labels=[fmt_bytes(per[k]) for k in kinds], padding=2)
    ax.set_ylabel("MiB stored")
    count = f"{len({t.get('tensor', t['name']) for t in listed})} tensors"
    if any(t.get("tensor", t["name"]) != t["name"] for t in listed):
        count += f", {len(listed)} entries"  # (a quantized tensor's codes and parameters)
    ax.set_title(f"{Path(path).name}: bytes per stored type ({count})")
    ax.margins(y=0.15)
    figure_folder(plot)
    fig.savefig(plot)
    plt.close(fig)


def checkpoint_table(store: str, tensors: int, summary: dict[str, Any]) -> None:
    """A converted checkpoint's tensors: shape, type, how each is stored, bytes, SQNR."""
    rows = []
    for name, r in summary["tensors"].items():
        sq = "" if r.get("kept") else fmt_db((r.get("error") or {}).get("sqnr_db"))
        rows.append(
            [
                name,
                str(r.get("shape")),
                str(r.get("dtype")),
                "kept" if r.get("kept") else str(r.get("target")),
                f"{fmt_bytes(r.get('bytes_before', 0))} -> {fmt_bytes(r.get('bytes_after', 0))}",
                sq,
            ]
        )
    source = summary.get("checkpoint")  # provenance, as recorded: shown, never opened
    if source is not None:  # (as written by whoever wrote the output: no control characters)
        source = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(source))
    compression = summary.get("compression")
    table(
        f"{store}: {tensors} tensors{f' from {source}' if source else ''},"
        f" complete: {summary['complete']}"
        f"{f', compression {fmt_compression(compression)}' if compression else ''}",
        ["tensor", "shape", "dtype", "stored as", "bytes", "SQNR dB"],
        rows,
    )
    unlisted = summary.get("unlisted") or []
    if unlisted:  # (an interrupted run: finished, not listed in the index yet)
        more = f", ... ({len(unlisted) - 5} more)" if len(unlisted) > 5 else ""
        shown = ", ".join(unlisted[:5]) + more
        typer.echo(
            f"{'and ' if summary['tensors'] else ''}{len(unlisted)}"
            f"{' more' if summary['tensors'] else ''} finished but not listed in the index yet"
            f" (the run was stopped between two of its batches; a re-run of the same convert"
            f" reuses them): {shown}"
        )


def check_plot(path: Path) -> None:
    """Refuse a --plot file qstream cannot write, before any work."""
    if path.suffix.lower() not in (".png", ".svg"):
        raise typer.BadParameter(f"--plot {path}: the figure is written as .png or .svg")
    existing = next((p for p in path.parents if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise typer.BadParameter(f"--plot {path}: {existing} is a file, not a folder")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise typer.BadParameter(
            "--plot needs matplotlib: pip install 'qstream-zarr[plot]'"
        ) from None


def save_plot(arr: qs.QuantizedArray | qs.QuantizedCheckpoint, store: str, plot: Path) -> None:
    """Write the one-page figure of ``arr`` to ``plot``."""
    figure_folder(plot)
    qs.save_plot(arr, plot, title=str(store))
