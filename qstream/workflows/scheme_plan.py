"""The plan of ``convert --scheme NAME`` (:mod:`qstream.exports.scheme_export`): the fields
of its :class:`~qstream.workflows.conversion_plan.ConversionPlan`."""

from __future__ import annotations

import os
from typing import Any


def scheme_plan(args: dict[str, Any]) -> dict[str, Any]:
    """The plan fields of a conversion under a compressed-tensors preset, from
    :func:`~qstream.workflows.conversion_plan.plan_convert`'s arguments (``checkpoint``, ``dst``,
    ``scheme``, ``overwrite``, ``config``, ``model_files``, ``storage_options``, ``store``);
    refusals are raised here, before any tensor byte is read. The run makes missing folders."""
    from ..exports.scheme_export import plan_scheme

    job = plan_scheme(
        args["checkpoint"],
        args["dst"],
        args["scheme"],
        overwrite=bool(args["overwrite"]),
        config=args["config"],
        model_files=bool(args["model_files"]),
        storage_options=args["storage_options"],
        store=args["store"],
    )
    return {
        "checkpoint": str(args["checkpoint"]),
        "destination": os.fspath(args["dst"]),
        "kind": "safetensors",
        "action": job.action,
        "config": "(source's, with the preset's quantization_config)",
        "notes": list(job.notes),
        "files": list(job.files),
        "prepared": job,
        "rows": list(job.rows),
    }
