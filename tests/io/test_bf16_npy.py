"""bfloat16 (and float8_e5m2) arrays saved with np.save / np.savez / np.savez_compressed read
as those types, and convert as the same tensors of a safetensors file do."""

import io
import json
import subprocess
import sys
import textwrap
import zipfile

import ml_dtypes
import numpy as np
import pytest
import zarr

import qstream as qs
from qstream.errors import StoreError
from qstream.io.checkpoints.npy_files import npy_ml_dtypes as _npy_ml_dtypes
from qstream.io.checkpoints.open import open_checkpoint

from .test_fp8_checkpoints import write_safetensors

BF16 = np.dtype(ml_dtypes.bfloat16)
E5M2 = np.dtype(ml_dtypes.float8_e5m2)
KINDS = ["npy", "npz", "npz-compressed"]


def _header(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    raw = buf.getvalue()
    return raw[10 : 10 + int.from_bytes(raw[8:10], "little")]


def _tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((48, 96)) * rng.uniform(0.01, 2, (48, 1))).astype(BF16)
    return {
        "w": w,
        "wt": np.asfortranarray(  # stored in Fortran order
            (rng.standard_normal((64, 40)) * 0.05).astype(BF16)
        ),
        "norm": (1 + 0.1 * rng.standard_normal(96)).astype(BF16),  # rank 1: kept
        "e5": (rng.standard_normal((32, 64)) * 0.5).astype(E5M2),
    }


def _write(tmp_path, kind: str) -> tuple[str, dict[str, np.ndarray]]:
    """The checkpoint file of ``kind`` and the tensors it holds (by their names in it)."""
    tensors = _tensors()
    if kind == "npy":
        path = tmp_path / "w.npy"
        np.save(path, tensors["w"])
        return str(path), {"w": tensors["w"]}
    path = tmp_path / "ck.npz"
    (np.savez if kind == "npz" else np.savez_compressed)(path, **tensors)
    return str(path), tensors


def test_the_headers_np_save_writes_and_the_ones_read_as_ml_dtypes():
    """What np.save writes for these types (NumPy reads '<V2' as raw bytes and refuses
    '<f1'); the 1-byte types other than float8_e5m2 all write '<V1' and say nothing of
    which they are, so only bfloat16 and float8_e5m2 are recognised."""
    assert b"'descr': '<V2'" in _header(np.zeros(3, BF16))
    assert b"'descr': '<f1'" in _header(np.zeros(3, E5M2))
    for t in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2fnuz", "int4", "float4_e2m1fn"):
        assert b"'descr': '<V1'" in _header(np.zeros(3, getattr(ml_dtypes, t)))
    assert b"'descr': '|V2'" in _header(np.zeros(3, "V2"))  # NumPy's own raw bytes
    assert _npy_ml_dtypes() == {"<V2": BF16, "<f1": E5M2}


@pytest.mark.parametrize("kind", KINDS)
def test_bfloat16_members_open_as_bfloat16_bit_for_bit(tmp_path, kind):
    path, tensors = _write(tmp_path, kind)
    ck = open_checkpoint(path)
    assert list(ck) == list(tensors)
    for name, want in tensors.items():
        t = ck[name]
        assert (t.dtype, t.shape, t.nbytes) == (want.dtype, want.shape, want.nbytes), name
        got = t[...]
        assert got.dtype == want.dtype and got.tobytes() == np.ascontiguousarray(want).tobytes()
        if want.ndim == 2:
            assert t[3:7, 5:].tobytes() == np.ascontiguousarray(want[3:7, 5:]).tobytes()


_CONVERT = textwrap.dedent(
    """
    import sys
    import qstream as qs
    recipe = qs.Recipe.from_dict(__import__("json").loads(sys.argv[3]))
    qs.convert_checkpoint(sys.argv[1], sys.argv[2], recipe)
    """
)

RECIPES = {
    "int8-per-channel": {"defaults": {"dtype": "int8", "axis": 0}},
    "int4-groups": {
        "defaults": {"dtype": "int4", "axis": 1, "block_size": 32, "method": "dynamic"}
    },
}


def _convert(src: str, dst: str, recipe: dict) -> str:
    """Convert in a fresh process; its stderr."""
    r = subprocess.run(
        [sys.executable, "-c", _CONVERT, src, dst, json.dumps(recipe)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    return r.stderr


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("kind", KINDS)
def test_bfloat16_members_convert_as_safetensors_bf16_tensors_do(tmp_path, kind, recipe):
    """Quantized: the codes and scales of the same tensors in a safetensors file; kept: the
    bfloat16 Zarr type, bit for bit; and no warning (raw bytes made zarr warn)."""
    path, tensors = _write(tmp_path, kind)
    ref = tmp_path / "ref.safetensors"
    write_safetensors(ref, {k: np.ascontiguousarray(v) for k, v in tensors.items()})
    err = _convert(path, str(tmp_path / "out.zarr"), RECIPES[recipe])
    assert "warn" not in err.lower(), err
    _convert(str(ref), str(tmp_path / "ref.zarr"), RECIPES[recipe])
    got, want = qs.open_quantized(tmp_path / "out.zarr"), qs.open_quantized(tmp_path / "ref.zarr")
    assert sorted(got) == sorted(want) == sorted(tensors)
    for name, values in tensors.items():
        if values.ndim >= 2:  # quantized
            g, w = got[name], want[name]
            assert g.quantized().dtype == w.quantized().dtype
            assert g.quantized().tobytes() == w.quantized().tobytes(), name
            assert g.scale.tobytes() == w.scale.tobytes(), name
        else:  # kept, as the registered bfloat16 data type
            qs.register_zarr_types()
            kept = zarr.open_array(str(tmp_path / "out.zarr" / name), mode="r")
            assert kept.dtype == BF16
            assert kept[...].tobytes() == values.tobytes()


def _npy_with_header(path, header: str, data: bytes = b"\0" * 64) -> None:
    text = header.encode("latin1")
    text += b" " * (-(10 + len(text) + 1) % 64) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + data)


def test_other_headers_read_as_before(tmp_path):
    """NumPy's own 2-byte raw bytes stay raw bytes, and so do the ambiguous '<V1' ones (a
    float8_e4m3fn array, say); a '<V2' header that is no array description, or is code, is
    refused and never run."""
    np.save(tmp_path / "void.npy", np.zeros(4, "V2"))
    assert open_checkpoint(tmp_path / "void.npy")["void"].dtype == np.dtype("V2")
    e4m3 = np.arange(8, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    np.savez(tmp_path / "f8.npz", x=e4m3)
    t = open_checkpoint(tmp_path / "f8.npz")["x"]
    assert t.dtype == np.dtype("V1") and t[...].tobytes() == e4m3.tobytes()

    _npy_with_header(tmp_path / "bad.npy", "{'descr': '<V2', 'fortran_order': 0, 'shape': (4,), }")
    with pytest.raises(StoreError):
        open_checkpoint(tmp_path / "bad.npy")
    marker = tmp_path / "ran"
    code = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    for header in (
        f"{{'descr': '<V2', 'fortran_order': False, 'shape': ({code},), }}",
        f"{{'descr': {code} or '<V2', 'fortran_order': False, 'shape': (4,), }}",
    ):
        _npy_with_header(tmp_path / "code.npy", header)
        for how in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            with zipfile.ZipFile(tmp_path / "code.npz", "w", how) as z:
                z.write(tmp_path / "code.npy", "m.npy")
            for path in ("code.npy", "code.npz"):
                with pytest.raises(StoreError):
                    open_checkpoint(tmp_path / path)
    assert not marker.exists()
