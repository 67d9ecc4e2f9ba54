"""``qstream export``: quantized tensors for an inference stack (safetensors for
transformers/vLLM, or GGUF for llama.cpp)."""

from __future__ import annotations

import json
from typing import Any

import typer

import qstream as qs

from .failures import library_errors
from .helptext import examples
from .options import JSON, MAX_MEMORY, QUIET, parse_size, require_input
from .output import done_already, emit_json, fmt_bytes, fmt_g
from .progress import progress


@examples(
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
    no_tokenizer: bool = typer.Option(
        False,
        "--no-tokenizer",
        help="With a .gguf OUT: tensors and hyperparameters only, no tokenizer (llama.cpp will"
        " not load the file).",
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
        help="The model's config.json to merge the quantization_config into (default: one"
        " kept inside SRC, or beside a float checkpoint file for .gguf; never one where SRC's"
        " metadata says its source was).",
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace existing files."),
    max_memory: str | None = MAX_MEMORY,
    as_json: bool = JSON,
    quiet: bool = QUIET,
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Print what would be written (each tensor's type and bytes, OUT's fate) and"
        " refuse as the export would; read no value, write nothing.",
    ),
) -> None:
    """Export quantized tensors for an inference stack, streaming, with bounded memory:
    safetensors in the compressed-tensors layout with its config.json (transformers, vLLM),
    or qstream's own layout (N, N_scale, N_zero_point).

    Sizes: a tensor's "after" is every byte the file holds for it, its entries (codes and
    parameters as the format stores them), as convert --dry-run, convert and inspect of the
    file count it; the file's header is not counted (--json: file_bytes)."""
    with library_errors():
        limit = parse_size(max_memory, "--max-memory")
        require_input(src, "SRC")
        if no_tokenizer and not out.endswith(".gguf"):
            raise typer.BadParameter("--no-tokenizer applies to a .gguf OUT only")
        gguf = {"type": gguf_type, "config": config, "overwrite": overwrite,
                "max_memory": limit, "tokenizer": not no_tokenizer}  # fmt: skip
        safetensors = {
            "format": fmt,
            "config": config,
            "max_shard_size": parse_size(max_shard_size, "--max-shard-size"),
            "overwrite": overwrite,
            "name": name,
            "max_memory": limit,
        }
    if dry_run:
        with library_errors(refusals=True):  # (refused as the export refuses)
            if out.endswith(".gguf"):
                planned = qs.export_gguf(src, out, dry_run=True, **gguf)
            else:
                planned = qs.export_safetensors(src, out, dry_run=True, **safetensors)
        if as_json or not quiet:  # (quiet: the exit code says whether it would run)
            print_export_plan(out, planned, as_json)
        return
    # (an error before the export writes a byte is its plan's refusal: exit 2, see failures)
    with library_errors():
        if out.endswith(".gguf"):
            with progress("export", quiet or as_json) as cb:
                result = qs.export_gguf(src, out, progress=cb, **gguf)
            if as_json:
                emit_json(result)
            elif not quiet:
                typer.echo(gguf_summary(src, result))
                note = tokenizer_note(result, no_tokenizer)
                if note is not None:
                    typer.echo(note)
            return
        with progress("export", quiet or as_json) as cb:
            result = qs.export_safetensors(src, out, progress=cb, **safetensors)
        if done_already(out, result, as_json, quiet):
            return
        if as_json:
            emit_json(result)
        elif not quiet:
            added = "".join(f"; {n} added, untied from {t}" for n, t in result["untied"].items())
            typer.echo(
                f"{src} -> {', '.join(result['files'])}: {len(result['tensor_bytes'])} tensors"
                f" ({len(result['tensors'])} entries{added}), {fmt_bytes(result['bytes'])},"
                f" for {result['loader']}"
            )
            if result.get("config") and not has_model_type(result["config"]):
                typer.echo(
                    f"note: {result['config']} holds the quantization_config only ({src}"
                    " keeps no model config.json): pass --config MODEL/config.json (the"
                    " converted model's) to merge it, or merge it in yourself"
                )


def print_export_plan(out: str, planned: dict[str, Any], as_json: bool) -> None:
    """An export's dry run: each tensor's type and bytes (as the export writes them), what
    happens to ``out``, the total."""
    from .output import table

    if as_json:
        emit_json({**planned, "dry_run": True})
        return
    if planned.get("already_complete") or planned.get("action") == "complete":
        typer.echo(f"{out}: already complete (same job); nothing to do")
        return
    if "plan" in planned:  # GGUF: a row per tensor, its GGML type
        rows = [[r["name"], str(r["shape"]), r["target"], fmt_bytes(r["bytes_after"])]
                for r in planned["plan"]]  # fmt: skip
        table("export plan (nothing written)", ["tensor", "shape", "type", "bytes"], rows)
        typer.echo(f"{out}: {planned['action']}; {fmt_bytes(planned['bytes'])} of tensors")
        return
    quantized = set(planned["quantized"])
    rows = [
        [n, "quantized" if n in quantized else "kept", fmt_bytes(b)]
        for n, b in planned["tensor_bytes"].items()
    ]
    table("export plan (nothing written)", ["tensor", "written", "bytes"], rows)
    added = "".join(f"; {n} added, untied from {t}" for n, t in planned["untied"].items())
    typer.echo(
        f"{', '.join(planned['files'])}: {len(rows)} tensors ({len(planned['entries'])}"
        f" entries{added}), {fmt_bytes(planned['bytes'])}"
    )


NO_TOKENIZER_NOTE = (
    "note: --no-tokenizer: the file holds tensors and hyperparameters only; llama.cpp will not"
    " load it (key not found: tokenizer.ggml.model)"
)


def tokenizer_note(result: dict[str, Any], no_tokenizer: bool) -> str | None:
    """What a written GGUF file lacks for llama.cpp, if anything (None: nothing)."""
    if no_tokenizer:
        return NO_TOKENIZER_NOTE
    if result.get("already_complete") or result.get("tokenizer"):
        return None
    if result.get("architecture") == "qstream":  # (no model config.json was found)
        return (
            "note: no model config.json was found, so the file holds tensors only (architecture"
            " qstream): gguf-py reads it, llama.cpp does not load it; pass --config"
            " MODEL/config.json, with the model's tokenizer files beside it"
        )
    return (
        "note: no tokenizer was found beside the model's config.json (tokenizer.json or"
        " tokenizer.model): llama.cpp will not load the file (key not found:"
        " tokenizer.ggml.model)"
    )


def gguf_summary(src: str, result: dict[str, Any]) -> str:
    """A written GGUF file: its quantized tensors, worst SQNR first (printed as a table, as
    for other outputs: each tensor's GGUF values against its source values), then one line
    (returned) on its tensor types, size and architecture."""
    from .output import fmt_db, table

    if result.get("already_complete"):
        return f"{result['file']}: already complete (same job); nothing to do"
    errors = result.get("error") or {}
    plan = {r["name"]: r for r in result.get("plan") or []}

    def worst_first(name: str) -> float:
        v = errors[name].get("sqnr_db")
        return float(v) if v is not None else float("inf")

    if errors:
        # (with an imatrix: the importance-weighted SQNR, what llama.cpp's search raises, and
        # both figures for the tensor quantized without it: what the imatrix bought)
        imx = any("without_imatrix" in e for e in errors.values())
        extra = ["SQNR w/o imx", "wSQNR dB", "wSQNR w/o imx"] if imx else []

        def compared(e: dict[str, Any]) -> list[str]:
            plain = e.get("without_imatrix") or {}
            return [fmt_db(plain.get("sqnr_db")), fmt_db(e.get("weighted_sqnr_db")),
                    fmt_db(plain.get("weighted_sqnr_db"))]  # fmt: skip

        table(
            "quantized tensors, worst SQNR first",
            ["tensor", "shape", "type", "SQNR dB", *extra, "max err"],
            [
                [
                    name,
                    str(plan.get(name, {}).get("shape", "")),
                    str(result["tensors"].get(name, "")),
                    fmt_db(errors[name].get("sqnr_db")),
                    *(compared(errors[name]) if imx else []),
                    fmt_g(errors[name].get("max_abs")),
                ]
                for name in sorted(errors, key=worst_first)
            ],
        )
        sampled = [e["without_imatrix"] for e in errors.values() if "without_imatrix" in e]
        sampled = [b for b in sampled if b.get("rows", 0) < b.get("of_rows", 0)]
        if sampled:
            typer.echo(
                "note: w/o imx: each tensor quantized again without the imatrix (measured"
                " only, never written) on 256-511 evenly spaced rows (every row below 512);"
                " --json's without_imatrix gives the rows and gain_db, the weighted SQNR the"
                " imatrix bought on them"
            )
    kinds: dict[str, int] = {}
    for t in result["tensors"].values():
        kinds[t] = kinds.get(t, 0) + 1
    mix = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    return (
        f"{src} -> {result['file']}: {mix}; {fmt_bytes(result['bytes'])} of tensors"
        f" ({fmt_bytes(result['file_bytes'])} file), architecture {result['architecture']},"
        f" for {'llama.cpp / gguf-py' if result.get('tokenizer') else 'gguf-py'}"
    )


def has_model_type(path: str) -> bool:
    """Whether the config.json at ``path`` is a model's (it names its ``model_type``)."""
    with open(path) as f:
        return "model_type" in json.load(f)
