"""The plan of a store job: its axis, parameter shape, statistics channels and output chunks.

:func:`plan_job` checks the spec against the source and gives the
:class:`~qstream.engine.blocks.regions.JobPlan` every pass reads; the blocks are the output's chunks
(:func:`~qstream.budget.default_chunks`, or the user's, checked by
:func:`~qstream.engine.blocks.chunking.check_chunks`).
"""

from __future__ import annotations

from typing import Any

from ...budget import block_budget, check_block_size, default_chunks, memory_limit
from ...core import blocked_param_shape, normalize_axis
from ...errors import InvalidParameterError
from ...io.storage import Source
from ...spec import QuantSpec
from ..blocks import JobPlan, check_chunks


def plan_job(spec: QuantSpec, source: Source, chunks: Any, max_memory: int | None) -> JobPlan:
    """The plan of quantizing ``source`` under ``spec``; ``chunks``: the output's chunks the
    user chose (None: multiples of the source's, within the memory bound's block budget).
    Refuses a blocked spec with a method blocks cannot take, and warns about a per-channel
    spec of a 1-D array."""
    shape = source.shape
    axis = None if spec.axis is None else normalize_axis(spec.axis, len(shape))
    bs = spec.block_size
    check_block_size(bs)
    if axis is None:
        param_shape: tuple[int, ...] = ()
    elif not bs:
        param_shape = (shape[axis],)
    else:
        param_shape = blocked_param_shape(shape, axis, bs)
    if bs and spec.scale is None and spec.method not in ("minmax", "dynamic"):
        raise InvalidParameterError(
            f"method {spec.method!r} is not available for blocked quantization; blocks take"
            " their own range (method 'dynamic' or 'minmax')"
        )
    if axis is not None and not bs and len(shape) == 1 and shape[0] > 1:
        import warnings

        from ...errors import QStreamWarning

        warnings.warn(
            f"per-channel quantization of a 1-D array (axis {spec.axis}) gives every"
            f" element its own scale: {shape[0]} parameters for {shape[0]} values, more"
            " bytes than the values; quantize it per tensor (axis=None) or keep it",
            QStreamWarning,
            stacklevel=4,  # (whoever called the API function that made the job)
        )
    # statistics are per channel along a per-axis spec's axis, else one set for the tensor
    # (a blocked spec reports per tensor: its parameter blocks are too many to list)
    stat_axis = None if bs else axis
    if chunks is not None:
        chunks = check_chunks(chunks, shape, bs, axis, source.dtype, max_memory)
    else:
        try:
            chunks = default_chunks(
                shape,
                max(4, source.dtype.itemsize),
                source.chunks,
                axis=axis,
                block_size=bs,
                budget=block_budget(max_memory),
                limit=memory_limit(max_memory),
            )
        except InvalidParameterError as e:  # (a block the bound cannot hold: which array)
            raise InvalidParameterError(
                f"{source.description.get('path', 'the array')}: {e}"
            ) from None
    return JobPlan(
        spec=spec,
        shape=shape,
        chunks=chunks,
        axis=axis,
        stat_axis=stat_axis,
        channels=1 if stat_axis is None else shape[stat_axis],
        param_shape=param_shape,
        dynamic=spec.scale is None and (spec.method == "dynamic" or bs is not None),
    )
