"""Sizes that come from documents or recipes are held to the memory bound (issue 51, item 2).

A crafted or damaged output can declare any shape and chunk in a ``zarr.json``, and a recipe
any block size: each is checked before anything is allocated, and either runs within the
bound or is refused in one line naming it. Every case runs the real CLI in a subprocess
under a hard address-space cap (``RLIMIT_AS``), so a regression fails here instead of
eating the machine; each reports its peak RSS (``-s`` shows them).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr
from safetensors.numpy import save_file

import qstream as qs
from qstream.errors import InvalidParameterError

from ..support.memory_peak import CLI, PREAMBLE, run_child

CAP = 3 << 29  # 1.5 GiB of address space: numba and the threads need ~1.2 GiB (measured)
BOUND = "64MiB"
# what a run may hold: twice the bound plus the interpreter, numba and zarr (~250 MB)
PEAK = 2 * (64 << 20) + (300 << 20)
# (each child's own peak: VmHWM of its memory map, see tests/support/memory_peak.py)
PYTHON = PREAMBLE


def _run(
    args: list, *, code: str = CLI, cwd: Path | None = None, env: dict[str, str] | None = None
) -> tuple[int, str, int]:
    """Run ``args`` (the command line, or ``code``) in a child under :data:`CAP`: its exit
    code, stderr and peak RSS."""
    r = run_child(args, code=code, cwd=cwd, env=env, address_space=CAP)
    return r.returncode, r.stderr, r.peak


def _one_line_error(err: str) -> str:
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "internal error" not in err, err
    return lines[0]


def _craft(array: Path, shape: list[int], chunks: list[int]) -> None:
    """Make the array at ``array`` declare ``shape`` in chunks of ``chunks``, its chunk files
    gone (missing chunks read as the fill value)."""
    doc = json.loads((array / "zarr.json").read_text())
    doc["shape"] = shape
    doc["chunk_grid"]["configuration"]["chunk_shape"] = chunks
    (array / "zarr.json").write_text(json.dumps(doc))
    for f in array.iterdir():
        if f.name != "zarr.json":
            if f.is_dir():
                import shutil

                shutil.rmtree(f)
            else:
                f.unlink()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """70 experts of 16 x 24 (packed together) and one 256 x 512 tensor, converted."""
    root = tmp_path_factory.mktemp("declared")
    rng = np.random.default_rng(0)
    tensors = {
        f"model.layers.0.mlp.experts.{e}.up_proj.weight": rng.standard_normal((16, 24)).astype(
            np.float32
        )
        for e in range(70)
    }
    tensors["model.layers.0.big.weight"] = rng.standard_normal((256, 512)).astype(np.float32)
    save_file(tensors, str(root / "ck.safetensors"))
    qs.convert_checkpoint(root / "ck.safetensors", root / "q.zarr", max_memory=64 << 20)
    assert len(list((root / "q.zarr" / "_packs").glob("p*"))) == 1
    return root


@pytest.fixture
def crafted_pack(checkpoint, tmp_path) -> Path:
    """The converted checkpoint, its pack declaring 70 x 16 x 4e6 int8 codes (4.2 GiB) in
    one missing chunk."""
    import shutil

    out = tmp_path / "q.zarr"
    shutil.copytree(checkpoint / "q.zarr", out)
    (pack,) = (out / "_packs").glob("p*")
    _craft(pack / "data", [70, 16, 4_000_000], [70, 16, 4_000_000])
    return out


@pytest.fixture
def crafted_tensor(checkpoint, tmp_path) -> Path:
    """The converted checkpoint, its 256 x 512 tensor declaring 256 x 4e6 codes (1 GB) in
    one missing chunk (its 256 per-channel scales stay right)."""
    import shutil

    out = tmp_path / "q.zarr"
    shutil.copytree(checkpoint / "q.zarr", out)
    _craft(out / "model.layers.0.big.weight" / "data", [256, 4_000_000], [256, 4_000_000])
    return out


def test_a_normal_run_fits_under_the_cap(checkpoint, tmp_path):
    """The cap leaves room for what a real run needs (else every case below proves nothing)."""
    for args in (
        ["dequantize", checkpoint / "q.zarr", tmp_path / "r.zarr", "--max-memory", BOUND],
        ["export", checkpoint / "q.zarr", tmp_path / "e.safetensors"],
    ):
        code, err, peak = _run([*args, "--quiet"])
        assert code == 0, err
        assert peak < PEAK


@pytest.mark.parametrize(
    "command",
    ["dequantize", "export", "export-qstream", "open_xarray"],
)
def test_a_pack_declaring_gigabytes_is_refused_naming_the_bound(crafted_pack, tmp_path, command):
    if command == "dequantize":
        args = ["dequantize", crafted_pack, tmp_path / "r.zarr", "--max-memory", BOUND]
        bound = "--max-memory (64.0 MiB)"
    elif command.startswith("export"):
        args = ["export", crafted_pack, tmp_path / "e.safetensors", "--max-memory", BOUND]
        args += ["--format", "qstream"] if command == "export-qstream" else []
        bound = "--max-memory (64.0 MiB)"
    else:
        code, err, _ = _run(
            [crafted_pack],
            code=PYTHON
            + "import qstream as qs\n"
            + "from qstream.errors import StoreError\n"
            + "try:\n"
            + "    qs.open_xarray(sys.argv[1], max_memory=64 << 20).compute()\n"
            + "except StoreError as e:\n"
            + "    print('refused:', e); sys.exit(3)\n",
        )
        assert code == 3, err
        return
    code, err, peak = _run([*args, "--quiet"])
    assert code == (2 if command.startswith("export") else 1), err  # (export: in its plan)
    line = _one_line_error(err)
    assert "_packs/p000000" in line and "[70, 16, 4000000]" in line and bound in line, line
    assert peak < PEAK
    assert not (tmp_path / "e.safetensors").exists()


def test_a_tensor_declaring_one_huge_chunk_is_refused_naming_the_bound(crafted_tensor, tmp_path):
    code, err, peak = _run(
        ["dequantize", crafted_tensor, tmp_path / "r.zarr", "--max-memory", BOUND, "--quiet"]
    )
    assert code == 2, err
    line = _one_line_error(err)
    assert "[256, 4000000]" in line and "--max-memory (64.0 MiB)" in line, line
    assert peak < PEAK
    code, err, _ = _run(
        [crafted_tensor],
        code=PYTHON
        + "import qstream as qs\n"
        + "from qstream.errors import StoreError\n"
        + "try:\n"
        + "    qs.open_xarray(sys.argv[1]).compute()\n"
        + "except StoreError as e:\n"
        + "    print('refused:', e); sys.exit(3)\n",
    )
    assert code == 3, err


def test_a_region_of_a_missing_declared_chunk_is_refused_without_its_buffer(crafted_tensor):
    """Reading a few values of a finished output's chunk declared 10 GB and never written is
    refused (every chunk of a finished output's codes is written: an absent one is damage,
    never zeros); the chunk's buffer is never made."""
    big = crafted_tensor / "model.layers.0.big.weight"
    _craft(big / "data", [256, 40_000_000], [256, 40_000_000])
    code, err, peak = _run(
        [big],
        code=PYTHON
        + "import qstream as qs\n"
        + "a = qs.open_quantized(sys.argv[1])\n"
        + "try:\n"
        + "    a[0:2, 5:13]\n"
        + "except qs.StoreError as e:\n"
        + "    assert 'missing chunk' in str(e), e; sys.exit(3)\n",
    )
    assert code == 3, err
    assert peak < PEAK


@pytest.fixture(scope="module")
def small_array(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("arr") / "a.zarr"
    x = np.random.default_rng(1).standard_normal((512, 256)).astype(np.float32)
    zarr.create_array(str(path), shape=x.shape, dtype="f4", chunks=(128, 256))[...] = x
    return path


def _codes(path: Path) -> dict[str, np.ndarray]:
    g = zarr.open_group(str(path), mode="r")
    return {m: g[m][...] for m in ("data", "scale", "zero_point")}


@pytest.mark.parametrize("block", [4_000_000, 10_000_000, 50_000_000])
def test_a_block_size_past_the_axis_runs_within_the_bound(small_array, tmp_path, block):
    """Blocks of millions along an axis of 256 are one group along the axis: the same codes
    and parameters as blocks of 256, in chunks of the axis (the block's padding to a chunk of
    ``block`` had been allocated: 2.1 GB at 4M, 23.8 GiB asked at 50M)."""
    out = tmp_path / "q.zarr"
    args = ["--axis", "1", "--method", "dynamic", "--max-memory", BOUND, "--quiet"]
    code, err, peak = _run(["quantize", small_array, out, "--block-size", block, *args])
    assert code == 0, err
    assert peak < PEAK
    ref = tmp_path / "ref.zarr"
    assert _run(["quantize", small_array, ref, "--block-size", 256, *args])[0] == 0
    got, want = _codes(out), _codes(ref)
    for m in want:
        assert np.array_equal(got[m], want[m]), m
    assert zarr.open_array(str(out / "data"), mode="r").chunks == (512, 256)
    assert qs.open_quantized(out).spec.block_size == block  # (the spec is as asked)


@pytest.mark.parametrize("block", [50_000_000, 200_000_000])
def test_a_recipe_block_size_past_every_axis_runs_within_the_bound(checkpoint, tmp_path, block):
    """A recipe's block size past every tensor's axis: each tensor's codes and parameters
    are those of blocks as long as its axis."""
    recipe = '[defaults]\ndtype = "int8"\naxis = 1\nmethod = "dynamic"\nblock_size = {}\n'
    (tmp_path / "big.toml").write_text(recipe.format(block))
    (tmp_path / "axis.toml").write_text(recipe.format(512))
    src = checkpoint / "ck.safetensors"
    args = ["--max-memory", BOUND, "--quiet"]
    out, ref = tmp_path / "q.zarr", tmp_path / "ref.zarr"
    code, err, peak = _run(["convert", src, out, "--recipe", tmp_path / "big.toml", *args])
    assert code == 0, err
    assert peak < PEAK
    assert _run(["convert", src, ref, "--recipe", tmp_path / "axis.toml", *args])[0] == 0
    got, want = qs.open_quantized(out), qs.open_quantized(ref)
    for name in want:
        a, b = got[name], want[name]
        assert np.array_equal(a.quantized(), b.quantized()), name
        assert np.array_equal(a.scale, b.scale) and np.array_equal(a.zero_point, b.zero_point)


def test_a_block_size_beyond_any_axis_is_refused(checkpoint, small_array, tmp_path):
    (tmp_path / "r.toml").write_text(
        f'[defaults]\ndtype = "int8"\naxis = 1\nmethod = "dynamic"\nblock_size = {2**70}\n'
    )
    args = ["convert", checkpoint / "ck.safetensors", tmp_path / "q.zarr"]
    code, err, _ = _run([*args, "--recipe", tmp_path / "r.toml", "--quiet"])
    assert code == 2, err
    assert "recipe [defaults]: block_size must be at most" in _one_line_error(err)
    assert not (tmp_path / "q.zarr").exists()
    spec = qs.QuantSpec(dtype="int8", axis=1, block_size=2**63, method="dynamic")
    with pytest.raises(InvalidParameterError, match="block_size must be at most"):
        qs.quantize_store(small_array, tmp_path / "q2.zarr", spec)


def test_a_block_the_bound_cannot_hold_is_refused_naming_it(tmp_path):
    """Blocks of 2000 along an axis of 2048 hold 2000 x 512 values (3.9 MiB): a bound of
    4 MiB is refused before any work."""
    src = tmp_path / "a.zarr"
    x = np.random.default_rng(2).standard_normal((2048, 512)).astype(np.float32)
    zarr.create_array(str(src), shape=x.shape, dtype="f4", chunks=(512, 512))[...] = x
    out = tmp_path / "q.zarr"
    args = ["--axis", "0", "--block-size", "2000", "--method", "dynamic", "--quiet"]
    code, err, _ = _run(["quantize", src, out, *args, "--max-memory", "4MiB"])
    assert code == 2, err
    line = _one_line_error(err)
    assert "--block-size 2000" in line and "--max-memory (4.0 MiB)" in line, line
    assert not out.exists()
    # (on the kernels' serial builds, as other tests compile them: the parallel build of the
    # blocked kernel, ~11 s of first compile, adds nothing to what this test checks)
    serial = {"QSTREAM_SERIAL_BELOW": str(1 << 30)}
    code, err, _ = _run(["quantize", src, out, *args, "--max-memory", "16MiB"], env=serial)
    assert code == 0, err


# ---------------------------------------------------------------- item 6: plans stay lazy

LAZY = """
import sys, tracemalloc
from qstream.engine.run import pipeline
from qstream.budget import plan_blocks

grid = plan_blocks((4096, 4096), (1, 1))  # 16.7M blocks
assert len(grid) == 4096 * 4096


class Stop(Exception):
    pass


def run(n):
    seen = [0]

    def merge(b, r):
        assert r == seen[0]  # (in block order)
        seen[0] += 1
        if seen[0] == n:
            raise Stop

    try:
        pipeline.run(grid, lambda b: b.index, merge, workers=2)
    except Stop:
        pass


run(100)  # (imports, the pool's first start)
for n in (10_000, 100_000):
    tracemalloc.start()
    run(n)
    print(n, tracemalloc.get_traced_memory()[1])
    tracemalloc.stop()
"""


def test_a_pass_over_millions_of_blocks_holds_none_of_them(tmp_path):
    """A pass over a plan of 16.7M one-element blocks makes each block as it starts: its
    memory does not grow with the blocks run (listing them first had taken > 3 GB)."""
    r = run_child([], code=LAZY, cwd=tmp_path, address_space=CAP)
    assert r.returncode == 0, r.stderr
    peaks = dict(map(int, line.split()) for line in r.stdout.split("\n") if line.strip())
    print("traced peak bytes by blocks run:", peaks)
    assert max(peaks.values()) < 1 << 20


@pytest.fixture(scope="module")
def square(tmp_path_factory) -> Path:
    """4096 x 4096 float32 (64 MiB) in chunks of 1024 x 1024."""
    path = tmp_path_factory.mktemp("sq") / "a.zarr"
    x = np.random.default_rng(3).standard_normal((4096, 4096)).astype(np.float32)
    zarr.create_array(str(path), shape=x.shape, dtype="f4", chunks=(1024, 1024))[...] = x
    return path


def test_chunks_too_many_for_the_bound_are_refused_before_any_work(square, tmp_path):
    """``--chunks 1,1`` on 64 MiB: 16.7M chunks, each a file listed when a run resumes;
    refused naming the bound (and, under any bound, above 4M chunks)."""
    out = tmp_path / "q.zarr"
    args = ["quantize", square, out, "--chunks", "1,1", "--quiet"]
    code, err, peak = _run([*args, "--max-memory", BOUND])
    assert code == 2, err
    line = _one_line_error(err)
    assert "16,777,216 chunks" in line and "--max-memory (64.0 MiB)" in line, line
    assert peak < PEAK and not out.exists()
    code, err, _ = _run([*args, "--max-memory", "8GiB"])
    assert code == 2, err
    assert "more than qstream writes one by one (4,194,304)" in _one_line_error(err)
    assert not out.exists()


def test_one_element_chunks_within_the_bound_give_the_same_values(tmp_path):
    """1024 one-element blocks: the codes and parameters of the default chunks."""
    src = tmp_path / "a.zarr"
    x = np.random.default_rng(4).standard_normal((32, 32)).astype(np.float32)
    zarr.create_array(str(src), shape=x.shape, dtype="f4", chunks=(16, 32))[...] = x
    args = ["--axis", "0", "--max-memory", BOUND, "--quiet"]
    code, err, peak = _run(["quantize", src, tmp_path / "q.zarr", "--chunks", "1,1", *args])
    assert code == 0, err
    assert peak < PEAK
    assert _run(["quantize", src, tmp_path / "ref.zarr", *args])[0] == 0
    got, want = _codes(tmp_path / "q.zarr"), _codes(tmp_path / "ref.zarr")
    for m in want:
        assert np.array_equal(got[m], want[m]), m
    assert zarr.open_array(str(tmp_path / "q.zarr" / "data"), mode="r").chunks == (1, 1)


def test_a_recipe_block_the_bound_cannot_hold_is_named_with_its_rule_and_tensor(tmp_path):
    """Blocks of 2000 rows of 512 (3.9 MiB) under a 4 MiB bound: ``Recipe.check_blocks``
    refuses them for every tensor at once, naming the rule and the tensor (a conversion's
    plan can call it before anything is written); the conversion itself names the tensor."""
    from qstream.io.checkpoints.open import open_checkpoint
    from qstream.spec.recipe import Recipe

    rng = np.random.default_rng(5)
    tensors = {
        "a.weight": rng.standard_normal((64, 64)).astype(np.float32),
        "b.weight": rng.standard_normal((2048, 512)).astype(np.float32),
    }
    save_file(tensors, str(tmp_path / "ck.safetensors"))
    text = '[defaults]\ndtype = "int8"\naxis = 0\nmethod = "dynamic"\nblock_size = {}\n'
    (tmp_path / "r.toml").write_text(text.format(2000))
    recipe = Recipe.load(tmp_path / "r.toml")
    opened = open_checkpoint(str(tmp_path / "ck.safetensors"))
    with pytest.raises(InvalidParameterError) as e:
        recipe.check_blocks(opened, 4 << 20)
    assert str(e.value).startswith("recipe [defaults] on tensor b.weight: block_size 2000")
    assert "max_memory (4.0 MiB)" in str(e.value)
    recipe.check_blocks(opened, 16 << 20)
    (tmp_path / "past.toml").write_text(text.format(50_000_000))
    Recipe.load(tmp_path / "past.toml").check_blocks(opened, 16 << 20)  # whole-axis blocks
    src, out = tmp_path / "ck.safetensors", tmp_path / "q.zarr"
    args = ["--recipe", tmp_path / "r.toml", "--max-memory", "4MiB", "--quiet"]
    code, err, _ = _run(["convert", src, out, *args])
    assert code == 2, err
    line = _one_line_error(err)
    # (refused by the conversion's plan, before any tensor is written: the recipe's rule named)
    assert line.startswith("error: recipe [defaults] on tensor b.weight: "), line
    assert "--max-memory (4.0 MiB)" in line, line
    assert not out.exists()
