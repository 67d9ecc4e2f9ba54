"""The rows of a conversion's plan: a row per tensor, with its bytes before and after (one
definition of "after" for every destination, see :func:`tensor_rows`), and the embedding a
compressed-tensors export unties (:func:`tied`, :func:`tied_note`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..io.outputs import qarray
from ..spec import Recipe


def tied(
    tensors: dict[str, Any], recipe: Recipe, config: str | dict[str, Any] | None
) -> str | None:
    """The quantized embedding the model ties its output layer to, which the export unties
    as llm-compressor does (``lm_head.weight`` written with the embedding's quantized
    values, ``tie_word_embeddings: false``; transformers would otherwise run lm_head on the
    embedding's codes); without a config (the export's config then holds its
    ``quantization_config`` alone) the model is taken as tied, as transformers takes a
    config without ``tie_word_embeddings``, when the checkpoint has no ``lm_head.weight``.
    None when nothing is tied. Quantized MoE experts are refused here
    (:func:`~qstream.exports.compressed_tensors.refuse_recipe_experts`)."""
    from ..exports import compressed_tensors as ct
    from ..io.checkpoints import read_json

    doc = read_json(config) if isinstance(config, str) else config
    quantized = [n for n, t in tensors.items() if recipe.spec_for(n, t.shape, t.dtype)]
    ct.refuse_recipe_experts(tensors, recipe, quantized, doc)
    return ct.tied_embedding(quantized, list(tensors), doc if doc is not None else {})


def tied_note(tied: str, no_config: bool) -> str:
    """What the plan says of the embedding :func:`tied` found."""
    from ..exports import compressed_tensors as ct

    why = (
        f"the checkpoint has no {ct.HEAD} and no config.json to say it is untied"
        if no_config
        else "tie_word_embeddings"
    )
    return (
        f"{tied} is tied to the output layer ({why}) and quantized: untied as llm-compressor"
        f" does, {ct.HEAD} written with its quantized values and tie_word_embeddings: false"
        " (keep the embedding, --exclude '*embed_tokens*', to stay tied)"
    )


def tensor_rows(
    tensors: dict[str, Any],
    recipe: Recipe,
    *,
    export: str | None = None,
    untied: str | None = None,
) -> list[dict[str, Any]]:
    """A row per tensor: its name, shape, stored dtype, target (the spec, or ``keep``) and
    bytes before and after (codes and parameters: ``qarray.quantized_nbytes``; for a
    ``.safetensors`` destination in the layout ``export``, its entries' bytes as the file
    stores them: :func:`~qstream.exports.entries.exported_nbytes`), and for the embedding
    the export unties (``untied``), a row for the ``lm_head.weight`` it adds (nothing
    before, the embedding's entries after)."""
    from ..engine.convert import describe_target
    from ..exports import compressed_tensors as ct
    from ..exports import exported_nbytes

    rows = []
    for name, t in tensors.items():
        shape = tuple(int(d) for d in t.shape)
        n = math.prod(shape)
        stored = np.dtype(getattr(t, "source_dtype", t.dtype))
        spec = recipe.spec_for(name, shape, t.dtype)
        if spec is None:
            keep = recipe.keep_dtype(name, shape, t.dtype)
            after = n * (np.dtype(keep).itemsize if keep else np.dtype(t.dtype).itemsize)
            target = f"keep/{keep}" if keep else "keep"
        elif export in ("compressed-tensors", "qstream"):
            after = exported_nbytes(name, shape, spec, export)
            target = describe_target(spec)
        else:
            after = qarray.quantized_nbytes(shape, spec)
            target = describe_target(spec)
        rows.append(
            {
                "name": name,
                "shape": list(shape),
                "dtype": stored.name,
                "target": target,
                "bytes_before": int(n * stored.itemsize),
                "bytes_after": int(after),
            }
        )
        if name == untied:
            rows.append({**rows[-1], "name": ct.HEAD, "target": f"untied {name}",
                         "bytes_before": 0})  # fmt: skip
    return rows
