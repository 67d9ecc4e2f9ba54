"""The per-block work of each pass, as small picklable objects.

A work object holds only what names the job: where the source and destination are (paths or
URLs and their storage options), the plan, the spec and the small parameter arrays. Calling
it on a block opens what it needs once per process (cached), reads the block, runs the
kernels, writes the block's output chunk (the quantize and dequantize passes) and returns the
block's statistics. No closures, no locks, no open files travel with it, so an executor can
run blocks in this process's threads or hand them to other processes.

The pieces live in modules of their own; this one names them all in one place:

- :mod:`~qstream.engine.run.handles`: the worker's cache and the source/destination references;
- :mod:`~qstream.engine.blocks.regions`: the job's plan and reading a block region by region;
- :mod:`~qstream.engine.blocks.stats_work`: passes 1 and 2 (ranges, histograms);
- :mod:`~qstream.engine.blocks.quantize_work`: the quantize pass;
- :mod:`~qstream.engine.blocks.dequantize_work`: the dequantize pass.
"""

from __future__ import annotations

from ..run import DestRef, SourceRef, forget, worker_cached
from .dequantize_work import DequantizeWork
from .quantize_work import BlockDest, NonFiniteBlock, QuantizeWork, fill_nan
from .regions import JobPlan, channel_pieces, read_pieces, read_region, relative_key
from .stats_work import HistogramWork, RangesWork

__all__ = [
    "BlockDest",
    "DequantizeWork",
    "DestRef",
    "HistogramWork",
    "JobPlan",
    "NonFiniteBlock",
    "QuantizeWork",
    "RangesWork",
    "SourceRef",
    "channel_pieces",
    "fill_nan",
    "forget",
    "read_pieces",
    "read_region",
    "relative_key",
    "worker_cached",
]
