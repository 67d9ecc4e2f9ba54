"""``qstream warm-up``: every kernel of the common job kinds compiled into Numba's on-disk
cache, in parallel processes, and the bytecode of qstream's modules (once per machine or
image). Each process runs whole tiny jobs of its share of :data:`COMMON_SPECS`
(:func:`qstream.engine.warmup.run_full_jobs`) and, beyond tiny in-memory arrays, what users'
jobs run (:func:`_run_checkpoint_jobs`; one of them also :func:`_run_gguf_jobs`); after it
those jobs compile nothing (``tests/e2e/test_warm_up_covers_common_jobs.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..engine import warmup

if TYPE_CHECKING:
    from ..spec import QuantSpec

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
            [sys.executable, "-m", "qstream.workflows.warm_up", json.dumps(share)]
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
            warmup.end_process(p)  # (Ctrl-C: none goes on compiling)
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


def _run_checkpoint_jobs(specs: Sequence[QuantSpec], folder: str) -> None:
    """What users' jobs run beyond tiny in-memory arrays, for ``specs``: a source whose rows
    are longer than a tile (the tiled calibration and report kernels: a weight matrix of a
    real model quantized per tensor), one of several row blocks (their report's sums land
    in a part of the channels' accumulators), and a tiny checkpoint of alike tensors
    converted into packs (their stacked, read-only, mapped tensors), float32 and bfloat16;
    files in ``folder``."""
    import numpy as np

    from ..engine.jobs import QuantizeJob
    from ..errors import QStreamError
    from ..io.storage import MEMORY_STORES
    from ..spec import Recipe
    from .conversion_run import convert as convert_checkpoint

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
    from .conversion_run import convert as convert_checkpoint

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


if __name__ == "__main__":  # one of warm_common's processes: its share, and GGUF jobs last
    from ..spec import QuantSpec

    wanted = [QuantSpec.from_dict(d) for d in json.loads(sys.argv[1])]
    warmup.run_full_jobs(
        wanted,
        per_spec=lambda spec, folder: _run_checkpoint_jobs([spec], folder),
        after=_run_gguf_jobs if sys.argv[2:] == ["--gguf"] else None,
    )
