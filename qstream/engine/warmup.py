"""Compile (or load from Numba's cache) kernels ahead of need.

- :func:`warm_kernels`: the common jobs' kernels, in this process (a Dask worker at start-up
  does not stall its first task).
- :func:`warm_common`: every kernel of the common job kinds, in parallel processes, and the
  bytecode of qstream's modules (``qstream warm-up``: once per machine or image).
- :func:`warm_up`: the quantize pass's kernels of given specs, optionally in a background
  process. A first run on a machine compiles the calibration kernels in the job's process
  while a second process compiles the quantize pass's into Numba's on-disk cache, from
  which the job then loads them: on two cores the compile time of the first run is about
  halved. Nothing is started when those kernels are cached already. Before them it compiles
  the kernels a job of the specs runs after its quantize pass (the worst groups of a
  group-wise report, sub-byte packing): a dynamic spec has no calibration, and its job
  compiles its fused quantize kernel straight away, then those.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from ..spec import QuantSpec


def warm_kernels() -> float:
    """Run tiny float32 -> int8 jobs (per-tensor min/max, per-channel percentile) through the
    engine in this process; returns the seconds it took. Kernels go to ``NUMBA_CACHE_DIR``
    when it is writable, so the next process loads instead of compiling."""
    import time

    import numpy as np

    from ..io.storage import MEMORY_STORES
    from ..spec import QuantSpec
    from .jobs import QuantizeJob

    t0 = time.perf_counter()
    x = np.linspace(-1.0, 1.0, 64 * 64, dtype=np.float32).reshape(64, 64)
    for spec in (
        QuantSpec(dtype="int8", method="minmax"),
        QuantSpec(dtype="int8", axis=0, method="percentile"),
    ):
        name = f"qstream-warmup-{uuid.uuid4().hex}"
        try:
            QuantizeJob(x, spec).run(f"memory://{name}")
        finally:
            MEMORY_STORES.pop(name, None)
    return time.perf_counter() - t0


#: the job kinds ``qstream warm-up`` compiles: checkpoint conversions and store jobs users
#: run most (int8 per tensor / per channel / percentile, int4 and int8 groups, asymmetric
#: uint8 and uint4 groups, float8)
COMMON_SPECS: tuple[dict[str, Any], ...] = (
    {"dtype": "int8"},
    {"dtype": "int8", "axis": 0},
    {"dtype": "int8", "axis": 0, "method": "percentile"},
    {"dtype": "int4", "axis": 1, "block_size": 32, "method": "dynamic"},
    {"dtype": "int8", "axis": 1, "block_size": 32, "method": "dynamic"},
    {"dtype": "uint8", "symmetric": False},
    {"dtype": "uint4", "axis": 1, "block_size": 32, "method": "dynamic", "symmetric": False},
    {"dtype": "float8_e4m3fn", "axis": 0},
)


def warm_common(
    processes: int | None = None, progress: Callable[[int, int], None] | None = None
) -> dict[str, Any]:
    """Compile every kernel the common job kinds (:data:`COMMON_SPECS`: calibration,
    quantize and report passes, serial and parallel builds, and their dequantize) into
    Numba's on-disk cache, spread over ``processes`` processes (default: the cores), so that
    no later job on this machine compiles them: what a Dockerfile, a cron host or a Dask
    worker image runs once. First it writes qstream's bytecode (:func:`write_bytecode`).
    ``progress(done, total)`` is called as each spec's serial, then parallel, builds are
    ready (``total``: twice the specs; ``stage(name, total, done)`` first, if it has one),
    from this thread. Ctrl-C ends the processes.
    Returns the specs compiled, whether the bytecode was written, and the seconds it took."""
    import time

    t0 = time.perf_counter()
    bytecode = write_bytecode()  # (first: the processes below start from it)
    n = max(1, min(len(COMMON_SPECS), processes or os.cpu_count() or 1))
    shares = _shares(COMMON_SPECS, n)
    total = 2 * len(COMMON_SPECS)  # (serial and parallel builds of each)
    stage = getattr(progress, "stage", None)
    if stage is not None:
        stage("kernel builds", total, 0)
    elif progress is not None:
        progress(0, total)
    procs = [  # (the last share also converts tiny GGUF files)
        subprocess.Popen(
            [sys.executable, "-m", "qstream.engine.warmup", json.dumps(share), "--full"]
            + (["--gguf"] if i == len(shares) - 1 else []),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i, share in enumerate(shares)
    ]
    try:
        failed = _wait_reporting(procs, total, progress)
    finally:
        for p in procs:
            _end(p)  # (Ctrl-C: none goes on compiling)
    if failed:
        from ..errors import QStreamError

        raise QStreamError(f"warming the kernels failed: {failed[0]}")
    return {"specs": list(COMMON_SPECS), "bytecode": bytecode, "seconds": time.perf_counter() - t0}


def _wait_reporting(
    procs: Sequence[subprocess.Popen[bytes]],
    total: int,
    progress: Callable[[int, int], None] | None,
) -> list[list[str]]:
    """Wait for warm_common's processes, calling ``progress(done, total)`` as each reports a
    spec done (a line on its stdout); the last stderr line of each that failed."""
    import selectors

    sel = selectors.DefaultSelector()
    for p in procs:
        assert p.stdout is not None and p.stderr is not None
        sel.register(p.stdout, selectors.EVENT_READ, p)
        sel.register(p.stderr, selectors.EVENT_READ, p)
    errs: dict[int, bytes] = {id(p): b"" for p in procs}
    done = 0
    while sel.get_map():
        for key, _ in sel.select(timeout=0.2):
            chunk = os.read(key.fd, 65536)
            p = key.data
            if not chunk:
                sel.unregister(key.fileobj)
                continue
            if key.fileobj is p.stdout:
                done += chunk.count(b"\n")
                if progress is not None:
                    progress(min(done, total), total)
            else:
                errs[id(p)] += chunk
    failed = []
    for p in procs:
        if p.wait():
            failed.append(errs[id(p)].decode(errors="replace").strip().splitlines()[-1:])
    return failed


def write_bytecode() -> bool:
    """Write the bytecode of qstream's own modules into their ``__pycache__`` folders, as
    installing a wheel does. An editable install under ``PYTHONDONTWRITEBYTECODE`` has none,
    and every start then compiles the ~130 modules a conversion imports (~0.2 s on 2 cores).
    False where some could not be written (a read-only install: they are then compiled in
    memory at each start, as without this)."""
    import compileall

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return bool(compileall.compile_dir(package, quiet=2))


def _shares(specs: Sequence[dict[str, Any]], n: int) -> list[list[dict[str, Any]]]:
    """``specs`` (dicts) dealt to ``n`` processes: the dynamic group-wise specs whose fused
    kernel builds are the same (one widened code type: int4 and int8) to one process, which
    compiles them once; the heaviest first (each such set of builds weighs about as much as
    four other specs), each to the least loaded process; in ``specs``' order within each."""
    import numpy as np

    from ..qtypes import qtype
    from ..spec import QuantSpec

    groups: dict[Any, list[int]] = {}
    for i, d in enumerate(specs):
        spec = QuantSpec.from_dict(d)
        fused = spec.method == "dynamic" and spec.block_size
        key = ("fused", np.dtype(qtype(spec.dtype).widened).str) if fused else i
        groups.setdefault(key, []).append(i)
    weight = {k: 3 + len(v) if isinstance(k, tuple) else 1 for k, v in groups.items()}
    load = [0] * n
    dealt: list[list[int]] = [[] for _ in range(n)]
    for key in sorted(groups, key=lambda k: -weight[k]):  # (stable: ties in specs' order)
        j = load.index(min(load))
        load[j] += weight[key]
        dealt[j] += groups[key]
    return [[specs[i] for i in sorted(d)] for d in dealt if d]


def _run_full_jobs(specs: Sequence[QuantSpec], gguf: bool = False) -> None:
    """Whole tiny jobs (calibration, quantize, report, dequantize) of ``specs``, with the
    serial and then the parallel builds of the kernels, and the jobs of
    :func:`_run_checkpoint_jobs`; with ``gguf``, those of :func:`_run_gguf_jobs` too."""
    import numpy as np

    from .. import budget
    from ..io.storage import MEMORY_STORES
    from ..kernels import runtime
    from .jobs import QuantizeJob, dequantize

    x = np.linspace(-1.0, 1.0, 64 * 256, dtype=np.float32).reshape(64, 256)
    before = runtime.SERIAL_BELOW
    budget.NUMPY_JOB = 0  # (this process's jobs are tiny: they would run the NumPy twins)
    with tempfile.TemporaryDirectory(prefix="qstream-warm-up-") as folder:
        try:
            for serial_below in (1 << 62, 0):
                runtime.SERIAL_BELOW = serial_below
                for spec in specs:
                    names = [f"qstream-warmup-{uuid.uuid4().hex}" for _ in range(2)]
                    try:
                        QuantizeJob(x, spec).run(f"memory://{names[0]}")
                        dequantize(f"memory://{names[0]}", f"memory://{names[1]}")
                    finally:
                        for name in names:
                            MEMORY_STORES.pop(name, None)
                    _run_fused(spec, x)
                    _run_checkpoint_jobs([spec], folder)
                    print(json.dumps(spec.to_dict()), flush=True)  # (a line for warm_common)
                if gguf:
                    _run_gguf_jobs(folder)
        finally:
            runtime.SERIAL_BELOW = before


def _run_checkpoint_jobs(specs: Sequence[QuantSpec], folder: str) -> None:
    """What users' jobs run beyond tiny in-memory arrays, for ``specs``: a source whose rows
    are longer than a tile (the tiled calibration and report kernels: a weight matrix of a
    real model quantized per tensor), one of several row blocks (their report's sums land
    in a part of the channels' accumulators), and a tiny checkpoint of alike tensors
    converted into packs (their stacked, read-only, mapped tensors), float32 and bfloat16;
    files in ``folder``."""
    import numpy as np

    from ..api.convert import convert_checkpoint
    from ..errors import QStreamError
    from ..io.storage import MEMORY_STORES
    from ..spec import Recipe
    from .jobs import QuantizeJob

    wide = np.linspace(-1.0, 1.0, 2 * 20000, dtype=np.float32).reshape(2, 20000)
    tall = np.linspace(-1.0, 1.0, 2000 * 512, dtype=np.float32).reshape(2000, 512)
    sources = {}
    for dtype in ("float32", "bfloat16"):
        path = os.path.join(folder, f"warm-up-{dtype}.safetensors")
        if not os.path.exists(path):
            _tiny_checkpoint(path, dtype)
        sources[dtype] = path
    for spec in specs:
        for x in (wide, tall):
            name = f"qstream-warmup-{uuid.uuid4().hex}"
            try:
                QuantizeJob(x, spec).run(f"memory://{name}")
            except Exception:  # a spec this array cannot take (an axis, a block size): skip
                pass
            finally:
                MEMORY_STORES.pop(name, None)
        recipe = Recipe.from_dict({"defaults": spec.to_dict()})
        for source in sources.values():
            out = os.path.join(folder, f"out-{uuid.uuid4().hex}.zarr")
            with contextlib.suppress(QStreamError):  # (a spec these tensors cannot take)
                convert_checkpoint(source, out, recipe, compression="none")


def _run_gguf_jobs(folder: str) -> None:
    """Tiny GGUF conversions (K-quant mixes and their fallbacks for rows that are not whole
    super-blocks, Q8_0, and the default types) of two one-layer llamas: rows of whole
    K-quant super-blocks (256 values) and of fewer (96, 64); files in ``folder``."""
    from ..api.convert import convert_checkpoint

    for hidden, inner in ((256, 96), (64, 64)):
        config = {**LLAMA, "hidden_size": hidden, "intermediate_size": inner}
        source = os.path.join(folder, f"warm-up-gguf-{hidden}.safetensors")
        _tiny_checkpoint(source, "float32", gguf=config)
        for kind in ("compressed-tensors", "Q4_K_M", "Q8_0"):
            out = os.path.join(folder, f"out-{uuid.uuid4().hex}.gguf")
            convert_checkpoint(source, out, format=kind, config=config, tokenizer=False)


#: the config of :func:`_run_gguf_jobs`' llamas (their sizes set there)
LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 1,
    "vocab_size": 64,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "max_position_embeddings": 128,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
}


def _tiny_checkpoint(path: str, dtype: str, gguf: dict[str, Any] | None = None) -> None:
    """A tiny safetensors checkpoint at ``path``: 64 alike expert weights (packed by a
    conversion), a norm; with ``gguf`` (a config like :data:`LLAMA`), that llama's one layer."""
    import struct

    import ml_dtypes
    import numpy as np

    rng = np.random.default_rng(0)
    tensors: dict[str, np.ndarray] = {}
    if gguf is not None:
        h, f, v = gguf["hidden_size"], gguf["intermediate_size"], gguf["vocab_size"]
        layer = "model.layers.0"
        for name, shape in (
            ("model.embed_tokens.weight", (v, h)),
            *((f"{layer}.self_attn.{p}_proj.weight", (h, h)) for p in "qkvo"),
            (f"{layer}.mlp.gate_proj.weight", (f, h)),
            (f"{layer}.mlp.up_proj.weight", (f, h)),
            (f"{layer}.mlp.down_proj.weight", (h, f)),
            (f"{layer}.input_layernorm.weight", (h,)),
            (f"{layer}.post_attention_layernorm.weight", (h,)),
            ("model.norm.weight", (h,)),
            ("lm_head.weight", (v, h)),
        ):
            tensors[name] = rng.standard_normal(shape).astype(np.float32)
    else:
        for i in range(64):
            tensors[f"model.layers.0.mlp.experts.{i}.up_proj.weight"] = rng.standard_normal(
                (32, 64)
            ).astype(np.float32)
        tensors["model.layers.0.post_attention_layernorm.weight"] = np.ones(64, np.float32)
    kind = {"float32": ("F32", np.float32), "bfloat16": ("BF16", ml_dtypes.bfloat16)}[dtype]
    header: dict[str, Any] = {}
    offset, blobs = 0, []
    for name, t in tensors.items():
        raw = t.astype(kind[1]).tobytes()
        header[name] = {"dtype": kind[0], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}  # fmt: skip
        offset += len(raw)
        blobs.append(raw)
    doc = json.dumps(header).encode()
    doc += b" " * (-len(doc) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(doc)) + doc + b"".join(blobs))


def _run_fused(spec: QuantSpec, x: np.ndarray) -> None:
    """For a dynamic spec, every build of the fused quantize kernel its jobs may run: groups
    along the rows and down the columns (blocked along the last axis or an outer one), for
    finite values and with a NaN (the builds that handle them)."""
    import numpy as np

    from ..qtypes import qtype
    from .blocks import dynamic_blocked

    if spec.method != "dynamic" or not spec.block_size:
        return
    qt = qtype(spec.dtype)
    bad = x.copy()
    bad[0, 0] = np.nan
    for values in (x, bad):
        for axis in (0, 1):
            dynamic_blocked(values, qt, spec, axis, np.empty(values.shape, qt.dtype), True)


def _run_after_pass(specs: Sequence[QuantSpec]) -> None:
    """The kernels a job of ``specs`` runs after its quantize pass: the worst groups of a
    group-wise spec's report, the packing of sub-byte codes."""
    import numpy as np

    from ..kernels.error_stats import worst_candidates
    from ..kernels.packing import pack_codes
    from ..qtypes import qtype
    from ..spec import WorstGroups

    if any(s.block_size for s in specs):
        worst_candidates(np.ones(4), np.ones(4), WorstGroups.KEEP, 1.0 + 1e-9)
    for bits in sorted({qtype(s.dtype).bits for s in specs} & {2, 4}):
        pack_codes(np.zeros(8, np.uint8), bits, np.zeros(8, np.uint8))


def _quantize_pass_specs(specs: Iterable[QuantSpec]) -> list[QuantSpec]:
    """Explicit-scale versions of ``specs``: the same quantize pass with no calibration."""
    from dataclasses import replace

    out = []
    for spec in specs:
        if spec.method != "dynamic" and spec.scale is None:
            spec = replace(spec, method="minmax", scale=0.01, zero_point=None)
        if spec not in out:
            out.append(spec)
    return out


def _run_quantize_passes(specs: Sequence[QuantSpec], parallel: bool) -> None:
    import numpy as np

    from ..io.storage import MEMORY_STORES
    from ..kernels import runtime
    from .jobs import QuantizeJob

    before = runtime.SERIAL_BELOW
    runtime.SERIAL_BELOW = 0 if parallel else 1 << 62
    x = _Tensor(np.linspace(-1.0, 1.0, 64 * 64, dtype=np.float32).reshape(64, 64))
    try:
        for spec in _quantize_pass_specs(specs):
            name = f"qstream-warmup-{uuid.uuid4().hex}"
            try:
                QuantizeJob(x, spec).run(f"memory://{name}")
            except Exception:  # a spec this tiny array cannot take (e.g. a bad axis): skip
                pass
            finally:
                MEMORY_STORES.pop(name, None)
    finally:
        runtime.SERIAL_BELOW = before


def _cached(kernel: Any) -> bool:
    """Whether Numba's on-disk cache holds some build of ``kernel`` (best effort)."""
    try:
        return os.path.exists(kernel._cache._cache_file._index_path)
    except AttributeError:
        return True  # unknown: do not start anything


def warm_up(
    specs: Iterable[QuantSpec], *, background: bool = False
) -> subprocess.Popen[bytes] | None:
    """Compile the quantize pass's kernels of ``specs`` (serial builds first, then parallel
    ones) into Numba's cache, and before them the kernels their jobs run after that pass.
    ``background``: in a separate process, started only on a first run (no build of the
    specs' quantize kernels cached yet; the process is ended when this one exits); returns
    it."""
    specs = list(specs)
    if not background:
        _run_after_pass(specs)
        _run_quantize_passes(specs, parallel=False)
        _run_quantize_passes(specs, parallel=True)
        return None
    if all(any(_cached(k) or _cached(k.serial) for k in _pass_kernels(s)) for s in specs):
        return None  # not a first run
    payload = json.dumps([s.to_dict() for s in specs])
    proc = subprocess.Popen(
        [sys.executable, "-m", "qstream.engine.warmup", payload],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    atexit.register(_end, proc)
    return proc


def _pass_kernels(spec: QuantSpec) -> list[Any]:
    """The kernels (parallel builds, with their serial twins) a quantize pass of ``spec``
    runs: the fused kernel's builds for finite values, either layout, for a dynamic spec it
    applies to, else the quantize kernel of its round mode."""
    from ..qtypes import qtype
    from .blocks import fused_applies

    if spec.method == "dynamic" and fused_applies(qtype(spec.dtype), spec):
        from ..kernels import blocked

        return [blocked.dynamic_kernel(1, finite=True), blocked.dynamic_kernel(2, finite=True)]
    from ..kernels.affine import QUANTIZE_KERNELS
    from ..rounding import round_code

    return [QUANTIZE_KERNELS[round_code(spec.round_mode)]]


class _Tensor:
    """A warm-up job's source read by slices, as checkpoint tensors are (a NumPy source is
    also hashed for the job's identity, a kernel that a checkpoint conversion never runs)."""

    name = "warm-up"

    def __init__(self, values: np.ndarray) -> None:
        self.values = values
        self.shape = values.shape
        self.dtype = values.dtype

    def __getitem__(self, key: Any) -> np.ndarray:
        """The values at ``key`` (a slice of the tensor)."""
        part: np.ndarray = self.values[key]
        return part


def _end(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()  # Numba writes cache files by rename: a kill leaves none half-written
        proc.wait()


if __name__ == "__main__":  # the background process of warm_up, or one of warm_common's
    from ..spec import QuantSpec

    wanted = [QuantSpec.from_dict(d) for d in json.loads(sys.argv[1])]
    if sys.argv[2:3] == ["--full"]:
        _run_full_jobs(wanted, gguf=sys.argv[3:] == ["--gguf"])
    else:
        warm_up(wanted)
