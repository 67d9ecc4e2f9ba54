"""Serial twins of parallel kernels give the same bytes; compile notices fire on cache misses."""

import hashlib
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import qstream as qs
from qstream.kernels import runtime

SPECS = [
    dict(dtype="int8"),
    dict(dtype="uint8", symmetric=False, axis=0),
    dict(dtype="int8", axis=1),  # channels on the fast axis
    dict(dtype="int8", axis=0, method="percentile", percentile=99.0),
    dict(dtype="int8", method="entropy"),
    dict(dtype="int8", axis=1, method="mse"),
    dict(dtype="int4", axis=1, block_size=16, method="dynamic"),
    dict(dtype="uint4", axis=0, block_size=8, method="dynamic", symmetric=False),
    dict(dtype="int8", axis=0, round_mode="half_away_from_zero"),
]


def _store_bytes(root):
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and "_progress" not in p.parts and p.name != ".qstream-lock":
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
def test_serial_twins_write_the_same_bytes_and_report_as_parallel_kernels(
    tmp_path, monkeypatch, spec
):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((96, 160)) * rng.uniform(0.1, 3, (96, 1))).astype(np.float32)
    x[3, 5] = np.nan
    results = {}
    for name, below in (("serial", 1 << 40), ("parallel", 0)):
        monkeypatch.setattr(runtime, "SERIAL_BELOW", below)
        dst = tmp_path / f"{name}.zarr"
        rep = qs.quantize_store(x, dst, qs.QuantSpec(nan_policy="zero_point", **spec))
        d = rep.to_dict()
        d.pop("seconds", None)
        d.pop("elapsed_s", None)
        text = json.dumps(d, sort_keys=True, default=str).replace(str(dst), "DST")
        results[name] = (_store_bytes(dst), text)
    assert results["serial"][0].keys() == results["parallel"][0].keys()
    for key in results["serial"][0]:
        if key.endswith("zarr.json"):
            continue  # holds the run's timings
        assert results["serial"][0][key] == results["parallel"][0][key], key
    assert results["serial"][1] == results["parallel"][1]


def test_compile_notice_names_the_kernel_on_a_cache_miss_only(tmp_path):
    code = textwrap.dedent(
        """
        import numpy as np
        import qstream as qs
        from qstream.kernels import runtime
        seen = []
        runtime.on_compile(seen.append)
        qs.quantize(np.linspace(-1, 1, 64, dtype=np.float32), 0.01, 0, dtype="int8")
        print(",".join(seen))
        """
    )
    env = {**__import__("os").environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert "q_half_to_even" in first.stdout.split(",")[0]
    again = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == ""


def test_background_warm_up_compiles_the_quantize_pass_for_the_job_on_a_first_run(tmp_path):
    import os

    code = textwrap.dedent(
        """
        import sys
        import numpy as np
        import qstream as qs
        spec = qs.QuantSpec(dtype="int8", axis=0, method="percentile")
        if sys.argv[1] == "warm":
            proc = qs.warm_up([spec], background=True)
            print("started" if proc is not None else "none")
            if proc is not None:
                proc.wait()
        else:
            from qstream.kernels import runtime
            seen = []
            runtime.on_compile(seen.append)
            shape = (64, 48) if sys.argv[1] == "job" else (1024, 512)  # (big: the fused kernel)
            x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
            qs.quantize_store(x, sys.argv[2], spec)
            print(",".join(seen))
        """
    )
    # (the kernels, not their NumPy twins, even for the small job)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "QSTREAM_NUMPY_JOB": "0"}

    def child(*args):
        r = subprocess.run(
            [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    assert child("warm") == "started"
    compiled = child("job", str(tmp_path / "q.zarr")).split(",")
    # the calibration kernels compile in the job; the quantize pass's were compiled ahead
    assert "_ranges_channel_rows" in compiled
    assert not {"q_half_to_even", "_error_sums_channel_rows"} & set(compiled)
    # a piece big enough for the fused quantize-and-sum kernel: compiled ahead too
    compiled = child("big job", str(tmp_path / "big.zarr")).split(",")
    assert not [k for k in compiled if k.startswith(("quantize_rows_sums", "row_sums"))]
    assert child("warm") == "none"  # cached now: nothing is started


def test_warm_up_compiles_the_fused_kernel_a_conversion_runs(tmp_path):
    """``qstream warm-up``'s jobs are tiny, yet they compile the fused quantize-and-sum kernel
    that a checkpoint's packs (and any larger piece of rows that are channels) run: a
    conversion after it compiles nothing."""
    import os

    from safetensors.numpy import save_file

    ck = tmp_path / "ck.safetensors"
    rng = np.random.default_rng(0)
    experts = {f"layers.0.experts.{i}.weight": rng.standard_normal((512, 256)) for i in range(8)}
    save_file({k: v.astype(np.float32) for k, v in experts.items()}, ck)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "QSTREAM_NUMPY_JOB": "0"}
    code = textwrap.dedent(
        """
        import sys
        import qstream as qs
        from qstream.kernels import runtime
        seen = []
        runtime.on_compile(seen.append)
        if sys.argv[1] == "warm":
            from qstream.engine.warmup import run_full_jobs
            run_full_jobs([qs.QuantSpec(dtype="int8", axis=0)])
        else:
            qs.convert_checkpoint(sys.argv[2], sys.argv[3], packs=True)  # (one pack of 8)
            print("compiled:" + ",".join(seen))
        """
    )

    def child(*args):
        r = subprocess.run(
            [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        return r.stdout.strip().splitlines()[-1]

    child("warm")
    compiled = child("job", str(ck), str(tmp_path / "out.zarr")).removeprefix("compiled:")
    assert list((tmp_path / "out.zarr" / "_packs").glob("p0*"))  # (converted as a pack)
    assert not [k for k in compiled.split(",") if k.startswith(("quantize_rows_sums", "row_sums"))]


def test_prefetch_hints_anywhere_without_faulting_or_changing_data():
    """The prefetch hint may point past an array's end (the fused kernel hints the row after
    the last one): it never faults and never changes memory."""
    from numba import njit

    from qstream.kernels.blocked import prefetch

    @njit
    def hint_and_sum(x, reach):
        s = 0.0
        for i in range(x.size):
            prefetch(x, i + reach)
            s += x[i]
        return s

    x = np.arange(1000, dtype=np.float32)
    before = x.copy()
    for reach in (0, 16, 4096, 1 << 40):  # in the array, past its end, far off any mapping
        assert hint_and_sum(x, reach) == before.sum(dtype=np.float64)
    np.testing.assert_array_equal(x, before)


def test_cached_kernels_load_without_numbas_registry_refresh_and_compute_the_same(tmp_path):
    # a build loaded from Numba's cache skips Numba's registry refresh (numba.np.linalg is one
    # of the modules it imports); a build compiled after that in the same process still works
    code = textwrap.dedent(
        """
        import hashlib, json, sys
        import numpy as np
        import qstream as qs
        from qstream.kernels import runtime
        seen = []
        runtime.on_compile(seen.append)
        x = np.random.default_rng(3).standard_normal((700, 600)).astype(np.float32)
        out = {}
        for dtype in sys.argv[1:]:
            q = qs.quantize(x.astype(dtype), 0.01, 0, dtype="int8")
            out[dtype] = hashlib.sha256(np.asarray(q).tobytes()).hexdigest()
            out["refreshed after " + dtype] = "numba.np.linalg" in sys.modules
        out["compiled"] = seen
        print(json.dumps(out))
        """
    )
    env = {**__import__("os").environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}

    def run(*dtypes):
        r = subprocess.run(
            [sys.executable, "-c", code, *dtypes], env=env, capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    x = np.random.default_rng(3).standard_normal((700, 600)).astype(np.float32)
    want = np.clip(np.rint(x / np.float32(0.01)), -128, 127).astype(np.int8)
    digest = hashlib.sha256(want.tobytes()).hexdigest()
    first = run("float32")
    assert first["compiled"] and first["refreshed after float32"]
    assert first["float32"] == digest
    again = run("float32", "float64")
    assert again["float32"] == digest
    assert not again["refreshed after float32"]  # loaded from the cache: no refresh
    assert again["compiled"]  # the float64 build: compiled here, after the load
    assert (
        again["float64"]
        == hashlib.sha256(
            np.clip(np.rint(x.astype(np.float64) / 0.01), -128, 127).astype(np.int8).tobytes()
        ).hexdigest()
    )


def test_parallel_kernels_are_made_on_first_use_and_typed_inside_other_kernels():
    import numba

    @runtime.parallel_kernel
    def add_one(x, out):
        for i in numba.prange(x.shape[0]):
            out[i] = x[i] + 1.0

    assert add_one._builds is None  # defined: no Numba dispatcher made yet

    @runtime.njit
    def twice(x, out):
        add_one(x, out)  # a parallel kernel named inside another: typed as its parallel build
        add_one(out, out)

    x = np.arange(6.0)
    out = np.zeros(6)
    twice(x, out)
    np.testing.assert_array_equal(out, x + 2.0)
    assert add_one.signatures and add_one.serial is add_one.builds()[1]
    runtime.run(add_one, x, out)  # small: the serial twin
    np.testing.assert_array_equal(out, x + 1.0)
    assert add_one.serial.signatures


def test_kernel_caches_are_made_when_a_kernel_first_needs_a_build(tmp_path):
    # Numba makes a cache (and checks its folder with a temporary file) where a kernel is
    # defined; qstream's are made at a kernel's first build: importing every kernel module
    # touches no cache folder, the first call writes the kernel's index there
    code = textwrap.dedent(
        """
        import os, sys
        import numpy as np
        from qstream.engine.run.worker_imports import KERNELS
        for name in KERNELS:
            __import__(name)
        cache = os.environ["NUMBA_CACHE_DIR"]
        print(len(list(os.walk(cache))) if os.path.isdir(cache) else 0)
        from qstream.kernels.stats import channel_ranges
        x = np.ones((1, 3, 4), np.float32)
        mins, maxs = np.full(3, np.inf), np.full(3, -np.inf)
        counts = [np.zeros(3, np.int64) for _ in range(4)]
        channel_ranges(x, mins, maxs, *counts)
        print(sum(f.endswith(".nbi") for _, _, fs in os.walk(cache) for f in fs))
        """
    )
    env = {**__import__("os").environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    folders, indexes = map(int, r.stdout.split())
    assert folders == 0
    assert indexes >= 1


def test_a_parallel_kernel_pickles_as_itself_and_takes_keywords():
    import pickle

    from qstream.kernels.affine import QUANTIZE_KERNELS
    from qstream.kernels.stats import _ranges_channel_rows

    k = QUANTIZE_KERNELS[0]
    assert pickle.loads(pickle.dumps(k)) is k  # (by name: the same kernel, its builds kept)
    x = np.ones((1, 2, 4), np.float32)
    mins, maxs = np.full(2, np.inf), np.full(2, -np.inf)
    counts = [np.zeros(2, np.int64) for _ in range(4)]
    _ranges_channel_rows(x, mins, maxs, *counts[:3], neginf=counts[3])
    np.testing.assert_array_equal(maxs, [1.0, 1.0])
