"""Large data, marked slow: run with ``python -m pytest -m slow``.

A 2.25 GiB float32 store is quantized in a child process whose address space is limited to
2 GiB (less than the array); its peak RSS must stay bounded (the same whatever the array size)
and sampled blocks must equal in-memory quantization.
"""

import json
import subprocess
import sys

import numpy as np
import pytest
import zarr

from ..support.memory_peak import HWM

pytestmark = pytest.mark.slow

ROWS, COLS, CHUNK = 147_456, 4096, 256  # 2.25 GiB of float32

# Peak RSS from VmHWM (this process's own memory map; see tests/support/memory_peak.py): ru_maxrss
# would also count what the forking pytest process held before exec (Linux keeps the larger
# of the two across exec).
CHILD = (
    HWM
    + r"""
import json, resource, sys
# a real limit: the address space is smaller than the 2.25 GiB array (the job peaks near 1.2 GiB)
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
import qstream as qs
spec = qs.QuantSpec.from_dict(json.loads(sys.argv[3]))
report = qs.quantize_store(sys.argv[1], sys.argv[2], spec)
peak_mb = vm_hwm() / 2**20
print(json.dumps({"peak_mb": peak_mb, "passes": report.passes, "seconds": report.seconds}))
"""
)


@pytest.fixture(scope="module")
def big_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("large") / "big.zarr"
    a = zarr.create_array(
        str(path), shape=(ROWS, COLS), chunks=(CHUNK, COLS), dtype="float32", compressors=None
    )
    rng = np.random.default_rng(0)
    for r in range(0, ROWS, 16 * CHUNK):
        n = min(16 * CHUNK, ROWS - r)
        a[r : r + n] = (rng.standard_normal((n, COLS)) * 0.02).astype(np.float32)
    return str(path)


@pytest.mark.parametrize("spec", [{"dtype": "int8", "scale": 0.0005}, {"dtype": "int8", "axis": 0}])
def test_two_gib_store_runs_in_bounded_memory_and_matches_in_memory_quantize(
    big_store, tmp_path, spec
):
    dst = str(tmp_path / "q.zarr")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, big_store, dst, json.dumps(spec)],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["peak_mb"] < 600, result
    import qstream as qs

    arr = qs.open_quantized(dst)
    src = zarr.open_array(big_store)
    for r in (0, ROWS // 2 + 3, ROWS - 100):
        x = src[r : r + 100]
        want = qs.quantize(
            x,
            arr.scale if arr.axis is None else arr.scale[r : r + 100],
            arr.zero_point.astype(np.int64)
            if arr.axis is None
            else arr.zero_point[r : r + 100].astype(np.int64),
            axis=arr.axis,
            dtype="int8",
        )
        np.testing.assert_array_equal(arr.quantized(np.s_[r : r + 100]), want)
