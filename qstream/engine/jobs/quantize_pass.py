"""A store job's quantize pass: every block quantized and written, its error sums folded.

Blocks run on the job's executor (:class:`~qstream.engine.blocks.quantize_work.QuantizeWork`
writes each block's chunks); their error statistics merge in block order in this thread, and
the driver alone saves the progress snapshot
(:class:`~qstream.io.outputs.progress_log.ProgressLog`) from
which an interrupted pass resumes after its last saved block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from ...budget import Block
from ...errors import StoreError
from ...io.outputs import Lease, ProgressLog
from ...spec import Calibration, ErrorStats, WorstGroups, merge_into
from ..blocks import NonFiniteBlock, QuantizeWork
from ..run import DestRef
from .calibration_passes import check_nonfinite, ranges
from .job_report import Found, keeps_worst_groups
from .passes import JobView, Progress, fspath, report_stage


def quantize_pass(
    job: JobView,
    dst: Any,
    group: Any,
    cal: Calibration,
    progress: Progress | None,
    arrays: dict[str, Any] | None = None,
) -> tuple[Found, int]:
    """Quantize the blocks after the progress snapshot; fold their error sums onto it.
    ``group``: the output (a ``zarr.Group``); ``arrays``: the members of a group
    :func:`~qstream.engine.jobs.job_output.create` just made (nothing landed yet). Returns the
    folded sums and the number of blocks resumed from the snapshot."""
    plan, blocks = job.plan, job.blocks
    fresh = WorstGroups.empty() if keeps_worst_groups(plan) else None
    if arrays is None:
        log = ProgressLog.open(group)
        start, errors, worst = log.load()
    else:
        log = ProgressLog(arrays[ProgressLog.NAME])
        start, errors, worst = 0, ErrorStats.empty(plan.channels), fresh
    if errors.count.size != plan.channels or start > len(blocks):
        start, errors, worst = 0, ErrorStats.empty(plan.channels), fresh
    if start and not blocks_landed(group, blocks, start):
        start, errors, worst = 0, ErrorStats.empty(plan.channels), fresh
    if (worst is None) != (fresh is None):
        start, errors, worst = 0, ErrorStats.empty(plan.channels), fresh
    found: list[WorstGroups | None] = [worst]
    todo = blocks[start:]
    # per-tensor and per-axis parameters travel with the work; blocked ones are members
    params = None if job.spec.block_size else cal.params
    dest = DestRef(job.token, fspath(dst), job.storage_options)
    dest.register(group, arrays)
    work = QuantizeWork(
        plan,
        job.ref,
        dest,
        None if params is None else params.scale,
        None if params is None else (params.zero_point if params.offset is None else params.offset),
    )
    done = [start]
    report_stage(progress, "quantize", len(blocks), start)
    lease = Lease(group, job.token, dst)

    def merge(b: Block, result: Found) -> None:
        err, groups = result
        merge_into(errors, err, plan.offset(b.key))  # in block order: deterministic
        if groups is not None:
            kept = found[0]
            assert kept is not None  # (blocks return groups only where the job keeps them)
            found[0] = kept.merged(groups)
        done[0] += 1
        if log.due():
            log.save(done[0], errors, found[0])
        lease.renew()
        if progress:
            progress(done[0], len(blocks))

    finished = False
    try:
        job.scan(todo, work, merge, None)
        finished = True
    except NonFiniteBlock:
        check_nonfinite(job, ranges(job))  # the whole array's count and first index
        raise
    except OSError as e:
        if isinstance(e, StoreError):
            raise
        raise StoreError(f"cannot write {dst}: {e}") from None
    finally:
        # a failed pass (e.g. a full disk) leaves its last snapshot; a finished one needs
        # none (the report written next supersedes it; a kill before that redoes the
        # blocks after the last periodic snapshot)
        if not finished and done[0] > start:
            with contextlib.suppress(OSError):
                log.save(done[0], errors, found[0])
    return (errors, found[0]), start


def blocks_landed(group: Any, blocks: Sequence[Block], n: int) -> bool:
    """Whether the data chunks of the first ``n`` of ``blocks`` exist in the output
    ``group`` (one listing of the store: a killed writer's last chunk, or chunks deleted
    since)."""
    from ...io.storage import stored_sizes

    data = group["data"]
    sizes = stored_sizes(data.store_path.store, data.store_path.path)
    for b in blocks[:n]:
        coords = tuple(k.start // c for k, c in zip(b.key, data.chunks, strict=True))
        if not sizes.get(data.metadata.encode_chunk_key(coords)):
            return False
    return True
