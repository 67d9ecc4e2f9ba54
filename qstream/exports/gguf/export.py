"""GGUF files for llama.cpp, written streaming: quantized blocks (Q8_0, Q4_0, Q4_1) and plain
tensors (F32, F16, BF16), with bounded memory.

Two sources:

- a float checkpoint (anything :func:`qstream.convert_checkpoint` reads): each tensor the
  recipe quantizes is quantized to its GGUF type (the type its spec stands for exactly, or
  the explicit ``type``; a spec no GGUF type holds is refused: GGUF never changes a spec
  silently, see :mod:`qstream.exports.gguf.plan`) by :mod:`qstream.compat.gguf`, bit for bit as
  gguf-py's ``quants.quantize`` does; kept tensors (rank < 2, ``keep`` rules, a last axis
  that is not a multiple of 32) are written in their own float type (float64 as F32) or a
  keep rule's ``dtype``;
- a qstream output: codes and scales that a GGUF block type holds exactly are copied
  (symmetric int8 -> Q8_0, symmetric int4 -> Q4_0, groups along the last axis of a multiple of
  32 or per channel on axis 0, float16-exact scales: ``scale_dtype="float16"``); anything
  else is refused, naming the tensor and why.

With the model's ``config.json`` (llama, Mistral, Mixtral, Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE,
Gemma 2, Gemma 3, Phi-3; any other architecture refused, listing these), the file is the one
llama.cpp's converter writes, so that llama.cpp loads and runs it: tensor names mapped
(``model.layers.0.self_attn.q_proj.weight`` -> ``blk.0.attn_q.weight``), values transformed
as it transforms them (q/k rows permuted, Gemma norms + 1), 1-D tensors and norms F32,
per-expert tensors merged into 3-D ``ffn_{gate,up,down}_exps``, and its ``general.*``,
architecture and ``tokenizer.*`` keys (the tokenizer beside the model: SentencePiece or
byte-level BPE, with the chat template); ``tokenizer=False`` writes tensors and
hyperparameters only (llama.cpp will not load that file). See
:mod:`qstream.exports.gguf.plan`.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

from ...compat import gguf as q
from ...errors import InvalidParameterError, QStreamWarning, StoreError
from ...input_files import kind_of
from ...spec import QuantSpec, Recipe
from ..entries import sqnr_value
from ..files import SLAB, byte_ticks
from ..targets import export_lock
from .file import MARK, SQNR, STR, GGUFTensor, Later, Value, identity, write_gguf
from .plan import GGUFPlan, is_output, plan_gguf, spec_type
from .tensors import ErrorSums, experts_tensor, float_tensor, quantized_tensor

_ERROR_KEYS = ("sqnr_db", "mse", "cosine", "count", "max_abs")  # a tensor's in the report
_SOURCE_SUFFIXES = (".safetensors", ".json", ".npz", ".npy", ".pt", ".pth", ".bin")


def _source_version(src: str | os.PathLike[str]) -> list[list[str | int]]:
    """Sizes and times of the files ``src`` is read from (a qstream output: its root
    document, rewritten when it is written again): a changed source is another export."""
    path = os.fspath(src)
    if "://" in path:
        return []
    if is_output(path):
        path = os.path.join(path, "zarr.json")
    folder = path if os.path.isdir(path) else os.path.dirname(path) or "."
    names = (
        sorted(n for n in os.listdir(folder) if n.endswith(_SOURCE_SUFFIXES))
        if os.path.isdir(path) or (path.endswith(".json") and not path.endswith("zarr.json"))
        else [os.path.basename(path)]
    )
    out: list[list[str | int]] = []
    for n in names:
        try:
            st = os.stat(os.path.join(folder, n))
        except OSError:
            continue
        out.append([n, st.st_size, st.st_mtime_ns])
    return out


def export_gguf(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    type: str | None = None,
    recipe: Recipe | str | os.PathLike[str] | None = None,
    config: str | os.PathLike[str] | dict[str, Any] | None = None,
    overwrite: bool = False,
    max_memory: int | None = None,
    tokenizer: bool = True,
    pure: bool = False,
    imatrix: str | os.PathLike[str] | None = None,
    progress: Any = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Write ``src`` (a float checkpoint, or a qstream output) as the GGUF file ``out``; see
    the module docstring. Everything is decided first by :func:`plan_gguf`, before any tensor
    is read: what GGUF cannot write as asked is refused (:class:`InvalidParameterError`).

    ``recipe``: which tensors of a float checkpoint are quantized, and to what block type: a
    spec a GGUF type holds (int8 symmetric -> Q8_0, int4 symmetric -> Q4_0, 4-bit asymmetric
    -> Q4_1, in blocks of 32 along the last axis, each block's own range; the default spec:
    Q8_0); any other spec is refused, naming the tensor, the nearest type and ``type``.
    ``type`` (Q8_0, Q4_0, Q4_1, F16, BF16, F32) alone picks the type of every tensor the
    recipe quantizes, with its own rule. ``config``: the model's config.json (path or dict);
    None: the one beside ``src``; its fields are checked before any work. ``tokenizer``:
    write the model's tokenizer (False: tensors and hyperparameters only, which llama.cpp
    does not load; a plan warning says so). ``type`` may also be a K type (Q2_K..Q6_K) or
    one of llama-quantize's mixes (Q4_K_M, Q4_K_S, Q5_K_M, Q5_K_S, Q6_K, Q3_K_M, Q2_K,
    Q4_0, Q4_1, Q8_0): each tensor's type chosen as llama-quantize chooses it (its Q4_0 file
    has ``output.weight`` in Q6_K), unless ``pure`` (``type`` everywhere); ``imatrix``: an
    importance-matrix file (llama-imatrix's or :func:`qstream.compute_imatrix`'s) used as
    ``llama-quantize --imatrix`` uses it. ``progress``: called ``(done, total)`` with the
    bytes of tensors written (after ``progress.stage("write", total, 0)`` where it has a
    ``stage``); in a notebook without one, ``qstream.export_gguf`` shows a line of the cell.
    ``dry_run``: everything decided and refused as for the export, nothing written; returns
    ``action`` (what happens to ``out``), ``plan``, ``tensors`` and ``bytes``.

    Returns ``file``, ``already_complete``, ``tensors`` (source name -> GGUF type; a merged
    expert tensor's name reads ``experts.*``), ``bytes`` (its tensors' bytes, as the plan and
    ``inspect`` count them), ``file_bytes`` (the file's size), ``architecture``,
    ``tokenizer`` (whether written), ``plan`` (a row per tensor:
    :meth:`GGUFPlan.rows`) and ``error`` (source name -> ``sqnr_db``, ``mse``, ``cosine``,
    ``count``, ``max_abs``: each quantized tensor's GGUF values against its source values,
    summed as it is written; a qstream output's copied tensors: the error its conversion
    recorded)."""
    out = os.fspath(out)
    if not out.endswith(".gguf"):
        raise InvalidParameterError(f"{out}: a GGUF export's name must end in .gguf")
    plan = plan_gguf(src, recipe, type, config, max_memory=max_memory, tokenizer=tokenizer,
                     pure=pure, imatrix=imatrix)  # fmt: skip
    for warning in plan.warnings:
        warnings.warn(warning, QStreamWarning, stacklevel=2)
    if dry_run:  # (decided and refused as the export is; nothing written)
        action = destination_action(plan, out, overwrite=overwrite)
        rows = plan.rows()
        return {"file": out, "dry_run": True, "action": action, "plan": rows,
                "tensors": {r["name"]: r["target"] for r in rows},
                "bytes": sum(r["bytes_after"] for r in rows)}  # fmt: skip
    return write_plan(plan, out, overwrite=overwrite, max_memory=max_memory, progress=progress)


def _job(plan: GGUFPlan) -> str:
    """The identity a GGUF file of ``plan`` records (a re-run finds it finished)."""
    src, cfg = plan.source, plan.config
    ident: dict[str, Any] = {"source": src, "type": plan.type, "recipe": plan.recipe.to_dict(),
                             "config": cfg, "tokenizer": plan.tokenizer}  # fmt: skip
    if plan.mix or plan.imatrix:  # (absent before mixes: earlier files stay complete)
        ident.update(mix=plan.mix, imatrix=plan.imatrix and _source_version(plan.imatrix))
    return json.dumps({**ident, "version": _source_version(src)}, sort_keys=True)


def destination_action(
    plan: GGUFPlan, out: str | os.PathLike[str], *, overwrite: bool = False
) -> str:
    """What writing ``plan`` to ``out`` does with what is there (read-only): ``create``,
    ``complete`` (this export, finished: nothing to do) or ``replace`` (``overwrite`` of a
    qstream export); a file qstream did not write, or another export without ``overwrite``,
    is refused (:class:`StoreError`)."""
    out = os.fspath(out)
    if not out.endswith(".gguf"):
        raise InvalidParameterError(f"{out}: a GGUF export's name must end in .gguf")
    kind = kind_of(out)
    if kind is None:
        return "create"
    found = identity(out) if kind == "file" else None
    if found is None:
        raise StoreError(
            f"{out} exists and is not a qstream export; qstream never replaces what it did"
            " not write (even with overwrite=True): remove it yourself or export elsewhere"
        )
    if found == _job(plan) and not overwrite:
        return "complete"
    if not overwrite:
        raise StoreError(
            f"{out} holds another export (of another source, spec or type); pass overwrite=True"
            " to replace it"
        )
    return "replace"


def write_plan(
    plan: GGUFPlan,
    out: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    max_memory: int | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """Write the GGUF file ``out`` as ``plan`` (:func:`plan_gguf`) says; the report of
    :func:`export_gguf` (``progress``: as there)."""
    out = os.fspath(out)
    done = {"file": out, "already_complete": True, "tensors": {}, "bytes": 0,
            "plan": plan.rows(), "error": {}}  # fmt: skip
    if destination_action(plan, out, overwrite=overwrite) == "complete":
        return done
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)  # (the rule of every command)
    with export_lock(out):  # (one export at a time writes a folder, as safetensors exports)
        if destination_action(plan, out, overwrite=overwrite) == "complete":
            return done  # (another process finished it meanwhile)
        return _write_locked(plan, out, max_memory, progress)


def _write_locked(
    plan: GGUFPlan, out: str, max_memory: int | None, progress: Any = None
) -> dict[str, Any]:
    job = _job(plan)
    budget = max(1 << 20, min(SLAB, (max_memory or SLAB) // 8))
    tensors: list[GGUFTensor] = []
    types: dict[str, str] = {}
    sums: dict[str, ErrorSums] = {}
    errors: dict[str, dict[str, Any]] = {}
    for t in plan.tensors:
        if not t.kept and not t.copied:
            sums[t.name] = ErrorSums()
        if t.parts:
            parts = [plan.opened[p] for p in t.parts]
            tensors.append(experts_tensor(t.gguf_name, parts, t.type, budget, sums.get(t.name),
                                          plan.weights.get(t.gguf_name)))  # fmt: skip
        elif t.copied:
            v = plan.opened[t.name]
            tensors.append(quantized_tensor(t.gguf_name, t.name, v, t.heads))
            recorded = (getattr(v, "report", None) or {}).get("error")
            if isinstance(recorded, dict):  # (its values are the conversion's, exactly)
                errors[t.name] = {k: recorded.get(k) for k in _ERROR_KEYS}
        else:
            v = plan.opened[t.name]
            tensors.append(float_tensor(t.gguf_name, v, t.type, t.heads, budget,
                                        sums.get(t.name), add=t.add, rows=t.rows,
                                        imatrix=plan.weights.get(t.gguf_name)))  # fmt: skip
        types[t.name] = t.type
    kv: dict[str, Value] = {MARK: (STR, job)}
    for item in plan.meta:
        kv[item.key] = (item.type, item.value) if item.element is None else (
            item.type, item.value, item.element)  # fmt: skip
    named = {t.name: t.gguf_name for t in plan.tensors if t.name in sums or t.name in errors}
    if named:  # each one's SQNR, measured as it is written (recorded in the header after)

        def sqnr_text() -> str:
            found = {**errors, **{n: s.summary() for n, s in sums.items()}}
            return json.dumps({g: sqnr_value(found[n].get("sqnr_db")) for n, g in named.items()})

        size = sum(len(json.dumps(g)) + 14 for g in named.values()) + 2  # (': ' value ', ')
        kv[SQNR] = (STR, Later(size, sqnr_text))
    write_gguf(out, kv, tensors, byte_ticks(progress, sum(t.nbytes for t in tensors)))
    for name, s in sums.items():
        errors[name] = s.summary()
    return {
        "file": out,
        "already_complete": False,
        "tensors": types,
        "bytes": sum(t.nbytes for t in tensors),  # (every byte it holds for its tensors)
        "file_bytes": os.path.getsize(out),
        "architecture": plan.architecture,
        "tokenizer": plan.tokenizer,
        "plan": plan.rows(),
        "error": errors,
    }


def block_type(name: str, spec: QuantSpec) -> str:
    """The GGUF block type that holds ``spec`` (see :func:`qstream.exports.gguf.plan.spec_type`,
    which also checks the spec's blocks against a tensor's ``shape``)."""
    try:
        return spec_type(spec, (0, q.BLOCK))
    except InvalidParameterError as e:
        raise InvalidParameterError(f"{name}: {e}") from None
