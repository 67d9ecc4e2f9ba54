"""A quantized output's parameters are held to the reader's memory bound (issue 51, item 2).

An output's scale and zero point are read whole when it is opened. A crafted or damaged
output can declare any number of them in a ``zarr.json`` (its chunk missing: read as the fill
value); without a bound they were read whatever ``--max-memory`` said (dequantize: 845 MB peak
under ``--max-memory 64MiB``; inspect: 906 MB). Parameters that need more than half the bound
are refused when the output is opened, in one line naming the bound and the declared count,
before a byte of them is read; a legitimate output whose parameters the bound holds opens and
reads exactly. Every CLI case runs in a child under a hard address-space cap, its own peak
measured (tests/support/memory_peak.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from safetensors.numpy import save_file

import qstream as qs
from qstream.errors import InvalidParameterError

from ..support.memory_peak import PREAMBLE, run_child

CAP = 3 << 29  # 1.5 GiB of address space (a normal run needs ~1.2 GiB of it: numba, threads)
BOUND = "64MiB"
PEAK = 2 * (64 << 20) + (300 << 20)  # twice the bound plus the interpreter, numba and zarr
DECLARED = 1 << 26  # parameters a crafted output declares: 320 MiB of scales and zero points


def _craft(array: Path, shape: list[int], chunks: list[int]) -> None:
    """Make the array at ``array`` declare ``shape`` in chunks of ``chunks``, its chunk files
    gone (missing chunks read as the fill value)."""
    doc = json.loads((array / "zarr.json").read_text())
    doc["shape"] = shape
    doc["chunk_grid"]["configuration"]["chunk_shape"] = chunks
    (array / "zarr.json").write_text(json.dumps(doc))
    for f in array.iterdir():
        if f.name != "zarr.json":
            f.unlink()


def _one_line_error(err: str) -> str:
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and len(err.strip().splitlines()) == 1, err
    assert "internal error" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Path:
    """A 64 x 256 float array quantized per channel (axis 1, asymmetric) and in blocks of 32
    along axis 1; a checkpoint of one 256 x 512 tensor (per channel along axis 0) and a norm,
    converted."""
    root = tmp_path_factory.mktemp("params")
    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    zarr.create_array(str(root / "a.zarr"), shape=x.shape, dtype="f4", chunks=(64, 256))[...] = x
    per_channel = qs.QuantSpec(dtype="int8", axis=1, symmetric=False)
    qs.quantize_store(root / "a.zarr", root / "channel.zarr", per_channel)
    blocked = qs.QuantSpec(dtype="int8", axis=1, block_size=32, method="dynamic")
    qs.quantize_store(root / "a.zarr", root / "blocked.zarr", blocked)
    rng = np.random.default_rng(1)
    tensors = {
        "model.layers.0.mlp.up_proj.weight": rng.standard_normal((256, 512)).astype(np.float32),
        "model.norm.weight": rng.standard_normal(512).astype(np.float32),
    }
    save_file(tensors, str(root / "ck.safetensors"))
    qs.convert_checkpoint(root / "ck.safetensors", root / "ck.zarr", max_memory=64 << 20)
    return root


@pytest.fixture(params=["per-channel", "blocked"])
def crafted(request, outputs, tmp_path) -> tuple[Path, int]:
    """A quantized array declaring 2^26 parameters in one missing chunk (its data in missing
    chunks of the stored size: no chunk the bound cannot hold); the parameter count."""
    out = tmp_path / "q.zarr"
    if request.param == "per-channel":  # one scale per column of 2^26 columns
        shutil.copytree(outputs / "channel.zarr", out)
        _craft(out / "data", [64, DECLARED], [64, 256])
        params = [DECLARED]
    else:  # 2^21 rows of 1024 in blocks of 32: 2^21 x 32 groups
        shutil.copytree(outputs / "blocked.zarr", out)
        _craft(out / "data", [DECLARED >> 5, 1024], [64, 1024])
        params = [DECLARED >> 5, 32]
    for m in ("scale", "zero_point"):
        _craft(out / m, params, params)
    return out, DECLARED


COMMANDS = {
    "dequantize": lambda src, tmp: ["dequantize", src, tmp / "r.zarr"],
    "export": lambda src, tmp: ["export", src, tmp / "e.safetensors"],
    "export-qstream": lambda src, tmp: [
        "export",
        src,
        tmp / "e.safetensors",
        "--format",
        "qstream",
    ],
    "export-gguf": lambda src, tmp: ["export", src, tmp / "e.gguf"],
    "inspect": lambda src, tmp: ["inspect", src],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_parameters_declared_past_the_bound_are_refused_naming_it(crafted, tmp_path, command):
    """Before this was held to the bound: dequantize 845 MB peak, inspect 906 MB."""
    src, declared = crafted
    args = [*COMMANDS[command](src, tmp_path), "--max-memory", BOUND]
    r = run_child(args, address_space=CAP)
    assert r.returncode == 2, r.stderr
    line = _one_line_error(r.stderr)
    assert f"declares {declared:,} parameters" in line, line
    assert "--max-memory (64.0 MiB) must be at least 640.0 MiB" in line, line
    assert r.peak < PEAK
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.zarr"]  # nothing written


@pytest.fixture
def crafted_checkpoint(outputs, tmp_path) -> Path:
    """The converted checkpoint, its 256 x 512 tensor declaring 2^26 rows (per-channel
    scales along axis 0) in missing chunks, its scales in one missing chunk."""
    out = tmp_path / "q.zarr"
    shutil.copytree(outputs / "ck.zarr", out)
    tensor = out / "model.layers.0.mlp.up_proj.weight"
    _craft(tensor / "data", [DECLARED, 512], [256, 512])
    for m in ("scale", "zero_point"):
        _craft(tensor / m, [DECLARED], [DECLARED])
    return out


@pytest.mark.parametrize("command", ["dequantize", "export", "export-qstream", "export-gguf"])
def test_a_converted_tensor_declaring_parameters_past_the_bound_is_refused(
    crafted_checkpoint, tmp_path, command
):
    args = [*COMMANDS[command](crafted_checkpoint, tmp_path), "--max-memory", BOUND]
    r = run_child(args, address_space=CAP)
    assert r.returncode == 2, r.stderr
    line = _one_line_error(r.stderr)
    assert "model.layers.0.mlp.up_proj.weight" in line, line
    assert f"declares {DECLARED:,} parameters" in line and "--max-memory (64.0 MiB)" in line
    assert r.peak < PEAK
    if command.startswith("export"):  # (refused by the export's plan: nothing written)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["q.zarr"]


def test_open_xarray_holds_a_converted_tensors_parameters_to_its_bound(crafted_checkpoint):
    code = (
        PREAMBLE
        + "import qstream as qs\n"
        + "from qstream.errors import InvalidParameterError\n"
        + "try:\n"
        + "    qs.open_xarray(sys.argv[1], max_memory=64 << 20)\n"
        + "except InvalidParameterError as e:\n"
        + "    print(e); sys.exit(3)\n"
    )
    r = run_child([crafted_checkpoint], code=code, address_space=CAP)
    assert r.returncode == 3, r.stderr
    assert f"declares {DECLARED:,} parameters" in r.stdout, r.stdout
    assert "max_memory (64.0 MiB)" in r.stdout, r.stdout
    assert r.peak < PEAK


# ------------------------------------------------- legitimate outputs open under the bound

CHANNELS = 1 << 18


@pytest.fixture(scope="module")
def many_channels(tmp_path_factory) -> Path:
    """4 x 262,144 values quantized per channel along axis 1, asymmetric: 262,144 scales and
    zero points (1.25 MiB held when opened)."""
    root = tmp_path_factory.mktemp("channels")
    x = np.random.default_rng(2).standard_normal((4, CHANNELS)).astype(np.float32)
    x *= np.linspace(0.1, 10, CHANNELS, dtype=np.float32)  # (every channel its own range)
    zarr.create_array(str(root / "a.zarr"), shape=x.shape, dtype="f4", chunks=(4, 1 << 16))[...] = x
    spec = qs.QuantSpec(dtype="int8", axis=1, symmetric=False)
    qs.quantize_store(root / "a.zarr", root / "q.zarr", spec)
    return root / "q.zarr"


def _reference(path: Path) -> np.ndarray:
    """The output's values computed from its stored members: (q - zero_point) * scale."""
    g = zarr.open_group(str(path), mode="r")
    q, s, z = g["data"][...], g["scale"][...], g["zero_point"][...]
    return ((q.astype(np.float32) - z.astype(np.float32)) * s).astype(np.float32)


def test_many_channels_open_and_read_exactly_under_a_bound_that_holds_them(many_channels):
    want = _reference(many_channels)
    assert np.unique(zarr.open_array(str(many_channels / "zero_point"))[...]).size > 1
    arr = qs.open_quantized(many_channels, max_memory=4 << 20)
    assert isinstance(arr, qs.QuantizedArray) and arr.scale.shape == (CHANNELS,)
    assert np.array_equal(arr[...], want)
    assert np.array_equal(arr[1:3, 1000:70000], want[1:3, 1000:70000])
    with pytest.raises(InvalidParameterError) as e:
        qs.open_quantized(many_channels, max_memory=2 << 20)
    message = str(e.value)
    assert f"declares {CHANNELS:,} parameters (scale, zero_point: 1.2 MiB)" in message
    assert "max_memory (2.0 MiB) must be at least 2.5 MiB" in message


def test_many_channels_dequantize_and_export_within_the_bound(many_channels, tmp_path):
    want = _reference(many_channels)
    args = ["--max-memory", BOUND, "--quiet"]
    r = run_child(["dequantize", many_channels, tmp_path / "r.zarr", *args], address_space=CAP)
    assert r.returncode == 0, r.stderr
    assert r.peak < PEAK
    assert np.array_equal(zarr.open_array(str(tmp_path / "r.zarr"), mode="r")[...], want)
    out = tmp_path / "e.safetensors"
    r = run_child(["export", many_channels, out, "--format", "qstream", *args], address_space=CAP)
    assert r.returncode == 0, r.stderr
    assert r.peak < PEAK
    exported = qs.open_quantized(out)
    assert isinstance(exported, qs.QuantizedCheckpoint)  # (one reader type, issue 50)
    assert np.array_equal(np.asarray(exported["weight"][...]), want)
