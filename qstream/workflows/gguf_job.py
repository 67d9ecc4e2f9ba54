"""The plan of a conversion into a ``.gguf`` file (:mod:`qstream.exports.gguf`): the fields
of its :class:`~qstream.workflows.conversion_plan.ConversionPlan`."""

from __future__ import annotations

import os
from typing import Any

from ..errors import InvalidParameterError


def gguf_plan(args: dict[str, Any]) -> dict[str, Any]:
    """The plan fields of a GGUF conversion, from
    :func:`~qstream.workflows.conversion_plan.plan_convert`'s arguments (``checkpoint``,
    ``dst``, ``recipe``, ``format``: a GGUF type or mix, or ``compressed-tensors`` for the
    recipe's; ``config``, ``overwrite``, ``max_memory``, ``tokenizer``, ``pure``,
    ``imatrix``); refusals are raised here, before any tensor byte is read."""
    from ..exports.gguf import destination_action, plan_gguf

    dst = os.fspath(args["dst"])
    if "://" in dst:
        raise InvalidParameterError(f"cannot write {dst}: a GGUF file is written to a local path")
    fmt = args["format"]
    plan = plan_gguf(
        args["checkpoint"],
        args["recipe"],
        None if fmt == "compressed-tensors" else fmt,
        args["config"],
        max_memory=args["max_memory"],
        tokenizer=bool(args["tokenizer"]),
        pure=bool(args["pure"]),
        imatrix=args["imatrix"],
        storage_options=args.get("storage_options"),
        store=args.get("store"),
    )
    return {
        "checkpoint": str(args["checkpoint"]),
        "destination": dst,
        "kind": "gguf",
        "action": destination_action(plan, dst, overwrite=bool(args["overwrite"])),
        "rows": plan.rows,
        "config": plan.config_path,
        "notes": list(plan.warnings),
        "gguf": plan,
    }
