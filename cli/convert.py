"""``qstream convert``: a model checkpoint quantized tensor by tensor, as a recipe (or the spec
flags) says, into a Zarr group, a safetensors file or a GGUF file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

import qstream as qs

from .export import gguf_summary, tokenizer_note
from .failures import library_errors, quiet_pipe
from .helptext import examples
from .options import (
    JSON,
    MAX_MEMORY,
    METHODS,
    QUIET,
    SCHEDULER,
    STORE,
    compression_option,
    parse_size,
    require_input,
)
from .output import (
    done_already,
    emit_json,
    fit_line,
    fmt_bytes,
    fmt_db,
    fmt_g,
    table,
    terminal_width,
)
from .progress import progress, resumed
from .scheduler import open_executor


@examples(
    """
    qstream convert model.safetensors model-int8.zarr
    qstream convert model.safetensors model-int8.zarr --recipe samples/recipe-int8.toml
    qstream convert model.safetensors model-int8.safetensors --max-shard-size 2GB
    qstream convert shards/model.safetensors.index.json out.zarr --json
    qstream convert model/ out/model.safetensors --dtype int4 --block-size 128 --exclude '*embed*'
    qstream convert model/ model.gguf --dtype int4 --block-size 32 --dry-run
    """
)
def convert(
    checkpoint: str = typer.Argument(
        ...,
        metavar="CHECKPOINT",
        help="safetensors (file, folder or .index.json; also at an s3:// or other store URL,"
        " read by byte ranges), .npz, .npy, a .gguf file, a Zarr group, or a torch .pt/.bin"
        " state dict.",
    ),
    dst: str = typer.Argument(
        ...,
        metavar="DST",
        help="A directory (becomes a Zarr group), a .safetensors file (compressed-tensors, or"
        " --format qstream) or a .gguf file (llama.cpp).",
    ),
    recipe: Path | None = typer.Option(
        None,
        "--recipe",
        metavar="FILE",
        help="TOML recipe: which tensors to quantize and how [default: int8 per channel,"
        " axis 0, for float tensors of rank >= 2].",
    ),
    max_memory: str | None = MAX_MEMORY,
    overwrite: bool = typer.Option(
        False,
        "--overwrite/--resume",
        help="Replace DST (a qstream output), or resume an interrupted run.",
    ),
    as_json: bool = JSON,
    quiet: bool = QUIET,
    scheduler: str | None = SCHEDULER,
    store: str = STORE,
    max_shard_size: str = typer.Option(
        "5GB",
        "--max-shard-size",
        metavar="SIZE",
        help="With a .safetensors DST: shard above this size.",
    ),
    compression: str = compression_option("zstd", " A .safetensors DST is never compressed."),
    packs: bool | None = typer.Option(
        None,
        "--packs/--no-packs",
        help="Store runs of small tensors alike in shape and spec (a layer's experts) stacked,"
        " one group each under DST/_packs [default: when the checkpoint holds 64 tensors or"
        " more and DST is a local directory, or as an earlier run into DST did].",
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
        help="With a .gguf DST: llama-quantize's mix (Q4_K_M, Q4_K_S, Q5_K_M, Q5_K_S, Q6_K,"
        " Q3_K_M, Q2_K, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) or one type (Q2_K..Q6_K, Q8_0, Q4_0,"
        " Q4_1, Q5_0, Q5_1, F16, BF16, F32) for the tensors the recipe quantizes [default: the"
        " spec's, in blocks of 32 along the last axis: int8 -> Q8_0, int4 -> Q4_0, asymmetric"
        " 4-bit -> Q4_1; another spec is refused].",
    ),
    pure: bool = typer.Option(
        False,
        "--pure",
        help="With --gguf-type: that one type for every tensor the recipe quantizes, as"
        " llama-quantize --pure [default: llama-quantize's mix of that name, e.g. Q4_K_M, or"
        " Q4_0 with output.weight in Q6_K].",
    ),
    imatrix: str | None = typer.Option(
        None,
        "--imatrix",
        metavar="FILE",
        help="With --gguf-type: an importance matrix (llama-imatrix's or qstream calibrate"
        " --imatrix's) used as llama-quantize --imatrix uses it.",
    ),
    no_tokenizer: bool = typer.Option(
        False,
        "--no-tokenizer",
        help="With a .gguf DST: write tensors and hyperparameters only, no tokenizer (llama.cpp"
        " will not load the file) [default: the model's tokenizer, as llama.cpp's converter].",
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
    scheme: str | None = typer.Option(
        None,
        "--scheme",
        metavar="NAME",
        help="With a .safetensors DST: a compressed-tensors preset (W4A16, W8A16, FP8_DYNAMIC,"
        " FP8_BLOCK, NVFP4A16, MXFP4A16, ...) written straight from the source, codes and"
        " scales as compressed-tensors computes them; not with --recipe or the spec flags.",
    ),
    scale_dtype: str | None = typer.Option(
        None,
        "--scale-dtype",
        metavar="TYPE",
        help="How the scales of quantized tensors are stored, for every spec (over the"
        " recipe's scale_dtype): source (each tensor's own dtype: bfloat16, float16 or"
        " float32), float32, float16 or bfloat16; each scale is rounded to it before"
        " quantizing [default: the recipe's; with a compressed-tensors .safetensors DST,"
        " source where the recipe leaves float32, so that a bf16/f16 model loaded in its"
        " own dtype gets the quantized values bit for bit; --scale-dtype float32 keeps F32].",
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print which tensor gets what, and the sizes; write nothing."
    ),
) -> None:
    """Quantize a model checkpoint tensor by tensor, as a recipe (or the spec flags) says.

    Sizes: "after" is every byte the output holds for a tensor, uncompressed: its codes and
    its parameters (scales, zero points unless all 0; in a .safetensors or .gguf file, its
    entries as the file stores them, an lm_head the export unties included); the same in
    --dry-run, the table, --json and inspect."""
    with library_errors():
        require_input(checkpoint, "CHECKPOINT")
        if gguf_type is not None and not dst.endswith(".gguf"):
            raise typer.BadParameter("--gguf-type applies to a .gguf DST only")
        if (fmt != "compressed-tensors" or config) and not dst.endswith((".safetensors", ".gguf")):
            raise typer.BadParameter("--format and --config apply to a .safetensors DST only")
        if fmt != "compressed-tensors" and dst.endswith(".gguf"):
            raise typer.BadParameter("--format applies to a .safetensors DST (a .gguf is GGUF)")
        if no_tokenizer and not dst.endswith(".gguf"):
            raise typer.BadParameter("--no-tokenizer applies to a .gguf DST")
        if (pure or imatrix) and gguf_type is None:
            raise typer.BadParameter("--pure and --imatrix apply to --gguf-type")
        flags = {"dtype": dtype, "axis": axis, "block_size": block_size, "method": method}
        flags = {k: v for k, v in {**flags, "symmetric": symmetric}.items() if v is not None}
        if scheme is not None and (recipe or flags or include or exclude or scale_dtype):
            raise typer.BadParameter(
                "--scheme does not mix with --recipe, the spec flags, --include, --exclude or"
                " --scale-dtype (a preset's scales are in the source's dtype)"
            )
        rec = recipe_of(recipe, flags, include, exclude)
        extra: dict[str, Any] = {}  # what only some destinations or flags pass on
        if scale_dtype is not None:  # (else the library's: the source's for compressed-tensors)
            extra["scale_dtype"] = scale_dtype
        if dst.endswith(".safetensors"):
            extra.update(format=fmt, config=config)
        if dst.endswith(".gguf"):
            extra.update(format=gguf_type or "compressed-tensors", config=config)
            extra.update(tokenizer=not no_tokenizer, pure=pure, imatrix=imatrix)
        if store != "fsspec":
            extra["store"] = store
        if packs is not None:
            extra["packs"] = packs
        if scheme is not None:
            extra["scheme"] = scheme
    with library_errors(refusals=True):  # (every refusal: here, before any tensor is read)
        limit = parse_size(max_memory, "--max-memory")
        plan = qs.plan_convert(
            checkpoint,
            dst,
            rec,
            overwrite=overwrite,
            max_memory=limit,
            compression=compression,
            **extra,
        )
    with library_errors():
        if dry_run:
            if as_json or not quiet:  # (quiet: the exit code says whether it would run)
                print_plan(plan, as_json)
            return
        show = not (quiet or as_json)
        complete = plan.action == "complete"
        if plan.loads_kernels:  # (not a finished output, nor a small job's NumPy twins)
            qs.warm_up(rec.specs(), background=True)  # first run: see quantize
        again = resumed(plan)  # (a re-run after an interruption: what is done already)
        if again is not None and show:
            typer.echo(again.line(), err=True)

        finished = [again.done if again is not None else 0]
        width = terminal_width() if show else None  # (quiet: no line, no Rich loaded)

        def on_tensor(ev: qs.TensorEvent) -> None:
            if ev.result is None or (again is not None and ev.name in again.names):
                return
            finished[0] += 1
            if reporter is not None:
                reporter.tensors(finished[0], ev.total)
            r = ev.result
            tag = "kept" if r["kept"] else ev.target
            sq = "" if r["kept"] else f"  SQNR {fmt_db(r['error']['sqnr_db'])} dB"
            after = f"{fmt_bytes(r['bytes_after'])}{sq}"
            sizes = f": {fmt_bytes(r['bytes_before'])} -> {after}"
            forms = [
                f" {list(ev.shape)} {ev.dtype} -> {tag}{sizes}",
                f" -> {tag}{sizes}",
                f" {tag} {after}",
            ]  # fmt: skip (on a narrow terminal: fewer words)
            head = f"[{ev.index + 1:>{len(str(ev.total))}}/{ev.total}] "
            try:
                typer.echo(fit_line(head, ev.name, forms, width))
            except BrokenPipeError:  # (stdout's reader is gone, ``| head``: ended as a pipe is)
                quiet_pipe()
                raise typer.Exit(141) from None

        with open_executor(scheduler) as ex, progress("convert", not show or complete) as reporter:
            report = qs.convert_checkpoint(
                checkpoint,
                dst,
                rec,
                max_memory=limit,
                overwrite=overwrite,
                on_tensor=on_tensor if show else None,  # (quiet: no event per tensor)
                executor=ex,
                max_shard_size=parse_size(max_shard_size, "--max-shard-size"),
                compression=compression,
                plan=plan,
                **extra,
            )
        if done_already(dst, report, as_json, quiet):
            return
        if as_json:
            emit_json({**report, "resumed": again.to_dict() if again is not None else None})
            return
        if quiet:
            return
        if dst.endswith(".gguf"):
            typer.echo(gguf_summary(checkpoint, report))
            note = tokenizer_note(report, no_tokenizer)
            if note is not None:
                typer.echo(note)
            return
        if scheme is not None:  # (no per-tensor error is measured: compressed-tensors' values)
            typer.echo(f"{scheme}: written " + ", ".join(report["files"]))
            return
        print_quantized(report)


def recipe_of(
    path: Path | None,
    flags: dict[str, Any],
    include: list[str],
    exclude: list[str],
) -> qs.Recipe:
    """The recipe of a ``convert``: the file, or the spec flags as its defaults; ``--exclude``
    patterns become keep rules before its own, ``--include`` limits what is quantized."""
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
        if not path:  # (a bad flag named as the flag, not as a recipe's [defaults])
            qs.QuantSpec.from_dict(d["defaults"])
    d["rules"] = [{"pattern": p, "action": "keep"} for p in exclude] + d.get("rules", [])
    if include:
        d["include"] = list(include)
    return qs.Recipe.from_dict(d)


def print_plan(
    plan: qs.ConversionPlan,
    as_json: bool,
    title: str = "conversion plan (nothing written)",
    counted: tuple[str, str] = ("quantized", "kept"),
) -> None:
    """``--dry-run``: what the run would do with DST, which tensor gets what (GGUF: its type
    and rule), and the sizes (``counted``: what the tensors that are not kept, and the kept
    ones, are called)."""
    again = resumed(plan)  # (a re-run after an interruption: what it would reuse)
    if as_json:
        emit_json({**plan.to_dict(), "resumed": None if again is None else again.to_dict()})
        return
    rows = plan.tensors
    rules = any("rule" in r for r in rows)
    table(
        title,
        ["tensor", "shape", "dtype", "target", "before", "after", *(["rule"] if rules else [])],
        [
            [r["name"], str(r["shape"]), r["dtype"], r["target"], fmt_bytes(r["bytes_before"]),
             fmt_bytes(r["bytes_after"]), *([brief_rule(r.get("rule", ""))] if rules else [])]
            for r in rows
        ],
    )  # fmt: skip
    made = f"; creates {', '.join(plan.creates)}" if plan.creates else ""
    done = "" if again is None else f" ({again.done} of {again.total} tensors already done)"
    typer.echo(f"{plan.destination} ({plan.kind}): {plan.action}{done}{made}")
    for note in plan.notes:
        typer.echo(f"note: {note}")
    quantized = sum(1 for r in rows if not r.get("kept", r["target"].startswith("keep")))
    before = sum(r["bytes_before"] for r in rows)
    after = sum(r["bytes_after"] for r in rows)
    typer.echo(
        f"{quantized} {counted[0]}, {len(rows) - quantized} {counted[1]};"
        f" {fmt_bytes(before)} -> {fmt_bytes(after)}"
    )


def brief_rule(rule: str) -> str:
    """A GGUF plan's rule as a table shows it: what chose the type (``--gguf-type Q4_K_M
    (llama-quantize's Q4_K_M: Q5_0)``), without the type's description (``--json`` has the
    whole rule)."""
    head, sep, _ = rule.partition("): ")
    return f"{head})" if sep else rule


def print_quantized(report: dict[str, Any]) -> None:
    """The quantized tensors of a finished conversion, worst SQNR first, and the totals."""
    rows = [(n, r) for n, r in report["tensors"].items() if not r["kept"]]

    def worst_first(item: tuple[str, dict[str, Any]]) -> float:
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
                fmt_g(r["error"]["max_abs"]),
                f"{100 * float(r['error']['clip_fraction']):.3f}",
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
