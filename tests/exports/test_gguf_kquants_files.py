"""qstream's K-quant GGUF files equal llama-quantize's: a tiny float32 Llama (rows of whole
super-blocks, 8 layers so that the mixes' layer rules differ between layers) converted by
llama.cpp's converter to F32 then quantized by ``llama_model_quantize`` with each mix's ftype
(with and without an importance matrix written by :func:`qstream.compute_imatrix` from
activation dumps), against ``qstream convert MODEL x.gguf --gguf-type MIX [--imatrix FILE]``:
the same tensor names, types, shapes and bytes, the same ``general.file_type``, the same
logits in llama.cpp; ``--pure`` equals ``params.pure``; rows that are not whole super-blocks
fall back to Q5_0 / Q5_1 / Q8_0 / Q4_0 as in llama.cpp."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app
from qstream.exports.gguf.imatrix import importance_weights, read_imatrix
from tests.support.activations import dump_activations, tiny_llama
from tests.support.gguf_models import load_llama, read_gguf_keys, run_converter

zarr = pytest.importorskip("zarr")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if sys.version_info >= (3, 12):
    pytest.importorskip("llama_cpp", reason="not in the Python >= 3.12 test extras")
llama_cpp = pytest.importorskip("llama_cpp")

HIDDEN, INTER, LAYERS = 256, 512, 8
#: llama.cpp's ``llama_ftype`` of each mix
FTYPE = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K_M": 12,
         "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18}  # fmt: skip
TEXT = "Hello world, the quick brown fox 12345!"


def cli(*args: Any) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def _model(folder: Path, inter: int = INTER, layers: int = LAYERS) -> Path:
    return tiny_llama(folder, hidden=HIDDEN, inter=inter, layers=layers)


def _dump(model_dir: Path, out: Path) -> None:
    dump_activations(model_dir, out, lengths=(37, 50, 29), chunk_rows=32)


def _files(root: Path, **model: int) -> dict[str, Path]:
    """The model in ``root``, its activation dumps, its imatrix (``qstream calibrate``) and
    llama.cpp's converter's F32 file of it."""
    folder = _model(root / "model", **model)
    _dump(folder, root / "acts.zarr")
    imx = root / "model.imatrix"
    r = cli("calibrate", root / "acts.zarr", "--imatrix", imx, "--model", folder)
    assert r.exit_code == 0, r.output
    return {"root": root, "model": folder, "f32": run_converter(folder, root / "f32.gguf"),
            "imatrix": imx}  # fmt: skip


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _files(tmp_path_factory.mktemp("kquant_files"))


def _llama_quantize(src: Path, dst: Path, ftype: int, imatrix: Path | None, pure: bool) -> None:
    """``llama_model_quantize`` with ``params.imatrix`` as llama-quantize builds it from the
    file (``load_imatrix``: sums / counts per entry)."""
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread, params.pure = ftype, 1, pure
    keep: list[Any] = []
    if imatrix is not None:
        weights = importance_weights(read_imatrix(imatrix))
        arr = (llama_cpp.llama_model_imatrix_data * (len(weights) + 1))()
        for i, (name, w) in enumerate(weights.items()):
            w = np.ascontiguousarray(w, dtype=np.float32)
            keep += [name.encode(), w]
            arr[i].name = keep[-2]
            arr[i].data = w.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            arr[i].size = w.size
        params.imatrix = ctypes.cast(arr, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
        keep.append(arr)
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params) == 0


def _tensors(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    from gguf import GGUFReader

    return {
        t.name: (t.tensor_type.name, tuple(int(d) for d in t.shape), bytes(t.data.tobytes()))
        for t in GGUFReader(str(path)).tensors
    }


def _pair(wide: dict[str, Path], mix: str, weighted: bool, pure: bool = False) -> tuple[Path, Path]:
    tag = f"{mix}-{'imx' if weighted else 'plain'}-{'pure' if pure else 'mix'}"
    ref, mine = wide["root"] / f"{tag}-ref.gguf", wide["root"] / f"{tag}-qstream.gguf"
    if not ref.exists():
        imx = wide["imatrix"] if weighted else None
        ftype = FTYPE.get(mix, {"Q4_K": 15}.get(mix, 0))
        _llama_quantize(wide["f32"], ref, ftype, imx, pure)
    if not mine.exists():
        extra = (["--imatrix", imx] if weighted else []) + (["--pure"] if pure else [])
        r = cli("convert", wide["model"], mine, "--gguf-type", mix, "-q", *extra)
        assert r.exit_code == 0, r.output
    return ref, mine


def _assert_same_tensors(ref: Path, mine: Path) -> dict[str, str]:
    got, want = _tensors(mine), _tensors(ref)
    assert sorted(got) == sorted(want)
    for name, (kind, shape, raw) in want.items():
        assert got[name][:2] == (kind, shape), name
        assert got[name][2] == raw, f"{name} ({kind}): bytes differ"
    key = "general.file_type"
    assert read_gguf_keys(mine)[key] == read_gguf_keys(ref)[key]
    return {n: v[0] for n, v in want.items()}


MIXES = ["Q4_K_M", "Q6_K", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q3_K_M", "Q2_K", "Q4_0", "Q4_1", "Q8_0",
         "Q5_0", "Q5_1"]  # fmt: skip


@pytest.mark.parametrize("mix", MIXES)
def test_mix_file_equals_llama_quantize_tensor_for_tensor(wide: dict[str, Path], mix: str) -> None:
    types = _assert_same_tensors(*_pair(wide, mix, weighted=False))
    if mix == "Q4_K_M":  # (the layer rules at work: use_more_bits' layers in Q6_K)
        assert types["blk.0.ffn_down.weight"] == types["blk.7.ffn_down.weight"] == "Q6_K"
        assert types["blk.1.ffn_down.weight"] == "Q4_K" and types["output.weight"] == "Q6_K"
    if mix in ("Q4_0", "Q5_0", "Q5_1"):
        assert types["output.weight"] == "Q6_K" and types["blk.0.attn_q.weight"] == mix


@pytest.mark.parametrize(
    "mix", ["Q4_K_M", "Q6_K", "Q5_K_S", "Q3_K_M", "Q2_K", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]
)
def test_mix_file_with_imatrix_equals_llama_quantize_with_it(
    wide: dict[str, Path], mix: str
) -> None:
    ref, mine = _pair(wide, mix, weighted=True)
    _assert_same_tensors(ref, mine)
    plain = _tensors(_pair(wide, mix, weighted=False)[1])
    weighted = _tensors(mine)
    name = "blk.0.ffn_down.weight"
    assert weighted[name][2] != plain[name][2]  # (the importance matrix changed its bytes)


def test_pure_k_type_equals_llama_quantize_pure(wide: dict[str, Path]) -> None:
    types = _assert_same_tensors(*_pair(wide, "Q4_K", weighted=False, pure=True))
    assert {t for n, t in types.items() if n.endswith(".weight") and "norm" not in n} == {"Q4_K"}


def _logits(path: Path) -> np.ndarray:
    llm = load_llama(llama_cpp, path, n_ctx=64, logits_all=True, verbose=False)
    tokens = llm.tokenize(TEXT.encode(), add_bos=True, special=False)
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)])


LOGITS = [("Q4_K_M", True, False), ("Q6_K", False, False), ("Q4_0", False, True),
          ("Q4_1", False, True), ("Q5_0", True, False)]  # fmt: skip


@pytest.mark.parametrize(("mix", "weighted", "pure"), LOGITS)
def test_llama_cpp_gives_the_same_logits(
    wide: dict[str, Path], mix: str, weighted: bool, pure: bool
) -> None:
    ref, mine = _pair(wide, mix, weighted, pure)
    _assert_same_tensors(ref, mine)
    got, want = _logits(mine), _logits(ref)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("mix", "up"), [("Q4_0", "Q4_1"), ("Q5_0", "Q5_1")])
def test_q4_0_and_q5_0_mixes_with_imatrix_equal_llama_quantize_with_it(
    wide: dict[str, Path], mix: str, up: str
) -> None:
    # (with an imatrix llama.cpp moves the first eighth of ffn_down to Q4_1 / Q5_1, and
    # quantizes every Q4_0 / Q4_1 / Q5_0 / Q5_1 tensor by its weighted search)
    types = _assert_same_tensors(*_pair(wide, mix, weighted=True))
    assert types["blk.0.ffn_down.weight"] == up and types["blk.1.ffn_down.weight"] == mix
    plain = _tensors(_pair(wide, mix, weighted=False)[1])
    weighted = _tensors(_pair(wide, mix, weighted=True)[1])
    name = "blk.1.ffn_down.weight"
    assert weighted[name][2] != plain[name][2]  # (the same type, other bytes)


@pytest.fixture(scope="module")
def narrow(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A model whose ffn_down rows (288 values) are whole blocks of 32, not of 256."""
    return _files(tmp_path_factory.mktemp("kquant_fallback"), inter=288, layers=2)


@pytest.mark.parametrize(("mix", "down"), [("Q6_K", "Q8_0"), ("Q2_K", "Q4_0")])
def test_rows_not_whole_super_blocks_fall_back_as_llama_quantize(
    narrow: dict[str, Path], mix: str, down: str
) -> None:
    types = _assert_same_tensors(*_pair(narrow, mix, weighted=False))
    assert types["blk.0.ffn_down.weight"] == down  # (Q6_K -> Q8_0; Q2_K's Q3_K -> Q4_0)
    assert types["blk.0.ffn_up.weight"] == mix  # (its rows are whole super-blocks)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize(("mix", "down"), [("Q4_K_M", "Q5_0"), ("Q5_K_M", "Q5_1")])
def test_q5_fallbacks_equal_llama_quantize_tensor_for_tensor(
    narrow: dict[str, Path], mix: str, down: str, weighted: bool
) -> None:
    # (Q4_K -> Q5_0, Q5_K -> Q5_1 for rows of 288; layer 1's ffn_down is Q6_K -> Q8_0)
    types = _assert_same_tensors(*_pair(narrow, mix, weighted=weighted))
    assert types["blk.0.ffn_down.weight"] == down and types["blk.1.ffn_down.weight"] == "Q8_0"


def test_expert_rows_read_across_experts_take_each_experts_importance_weights() -> None:
    """A merged 3-D expert tensor read in slabs that straddle experts: every row quantized
    with its own expert's weights, as ``quantize(x, "Q4_K", imatrix=[experts, columns])``."""
    from qstream.compat.gguf import quantize
    from qstream.exports.gguf.tensors import experts_tensor

    rng = np.random.default_rng(3)
    parts = [rng.standard_normal((6, 256)).astype(np.float32) for _ in range(3)]
    w = rng.random((3, 256)).astype(np.float32) + 0.01
    t = experts_tensor("blk.0.ffn_down_exps.weight", parts, "Q4_K", 4 * 256 * 4, imatrix=w)
    assert t.step == 4 and t.rows == 18  # (slabs of 4 rows: 4:8 straddles experts 0 and 1)
    got = np.concatenate([t.read(r, min(r + t.step, t.rows)) for r in range(0, t.rows, t.step)])
    want = quantize(np.stack(parts), "Q4_K", imatrix=w).reshape(18, -1)
    assert got.tobytes() == want.tobytes()
    unweighted = quantize(np.stack(parts), "Q4_K").reshape(18, -1)
    assert got.tobytes() != unweighted.tobytes()
