"""The small things a new user trips on: a misspelt type gets a suggestion, ``info`` prints
integer ranges in full, ``inspect`` names its compression in words, tables keep a row a line
in an 80-column terminal, and a NumPy source is named as one in the notebook view."""

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import zarr
from safetensors.numpy import save_file
from typer.testing import CliRunner

import qstream as qs
from cli.main import app
from cli.output import abbreviate, column_widths, readable

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "samples" / "tiny-transformer.safetensors"
runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def src(tmp_path):
    x = np.random.default_rng(0).standard_normal((64, 300)).astype(np.float32)
    zarr.create_array(str(tmp_path / "x.zarr"), shape=x.shape, dtype="float32")[...] = x
    return tmp_path / "x.zarr"


def test_a_misspelt_dtype_is_refused_with_the_nearest_type(src, tmp_path):
    r = run("quantize", src, tmp_path / "q.zarr", "--dtype", "in8")
    assert r.exit_code == 2 and "did you mean 'int8'?" in r.stderr, r.output
    r = run("convert", SAMPLE, tmp_path / "c.zarr", "--dtype", "unit8")
    assert r.exit_code == 2 and "did you mean 'uint8'?" in r.stderr, r.output
    r = run("quantize", src, tmp_path / "q.zarr", "--dtype", "fp8")  # nothing near: no guess
    assert r.exit_code == 2 and "did you mean" not in r.stderr and "expected one of" in r.stderr
    assert not (tmp_path / "q.zarr").exists() and not (tmp_path / "c.zarr").exists()


def test_info_prints_integer_ranges_in_full():
    r = run("info")
    assert r.exit_code == 0
    rows = {ln.split()[0]: ln.split() for ln in r.stdout.splitlines() if ln.strip()}
    assert rows["int32"][3:5] == [str(np.iinfo(np.int32).min), str(np.iinfo(np.int32).max)]
    assert rows["uint16"][3:5] == ["0", "65535"] and rows["float8_e4m3fn"][3:5] == ["-448", "448"]
    assert "e+" not in r.stdout


def test_info_and_version_print_json_with_the_version_and_whole_integer_ranges():
    r = run("info", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["qstream_version"] == qs.__version__
    assert data["types"]["int32"] == {
        "kind": "int", "bits": 32, "min": -(2**31), "max": 2**31 - 1,
    }  # fmt: skip
    assert data["types"]["float8_e4m3fn"]["max"] == 448 and data["round_modes"] == list(
        qs.ROUND_MODES
    )
    assert data["summary"] == {"types": len(qs.QTYPES), "round_modes": len(qs.ROUND_MODES)}
    r = run("version", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["qstream_version"] == qs.__version__ and data["dependencies"]["numpy"] == (
        np.__version__
    )


@pytest.mark.parametrize(
    "option, shown",
    [
        ("zstd", "zstd (level 0: default)"),
        ("gzip:3", "gzip (level 3)"),
        ("blosc:lz4:5", "blosc lz4 (level 5)"),
        ("none", "none (raw)"),
    ],
)
def test_inspect_names_the_compression_in_words_and_json_keeps_the_option(
    src, tmp_path, option, shown
):
    q = tmp_path / "q.zarr"
    assert run("quantize", src, q, "--compression", option, "-q").exit_code == 0
    r = run("inspect", q)
    rows = dict(ln.split(None, 1) for ln in r.stdout.splitlines() if ln.startswith("compression"))
    assert rows["compression"].strip() == shown
    canonical = option if ":" in option or option == "none" else "zstd:0"
    assert json.loads(run("inspect", q, "--json").stdout)["compression"] == canonical


LONG = "model.language_model.layers.{}.block_sparse_moe.experts.{}.down_proj.weight"


def test_long_names_are_abbreviated_apart_keeping_numbers_and_the_last_part():
    names = [LONG.format(i, j) for i in (3, 11) for j in (0, 117)]
    for width in (30, 40, 60):
        short = [abbreviate(n, width) for n in names]
        assert all(len(s) <= width for s in short) and len(set(short)) == len(names)
        assert all("…" in s for s in short)
        assert width < 40 or all(s.endswith(".weight") for s in short)  # (the last cut last)
        assert all(re.search(rf"\b{i}\b.*\b{j}\b", s) for s, (i, j) in zip(
            short, [(3, 0), (3, 117), (11, 0), (11, 117)], strict=True))  # fmt: skip
    assert abbreviate("embed_tokens.weight", 30) == "embed_tokens.weight"
    widths = column_widths(80, ["tensor", "shape", "SQNR dB"], [[names[0], "[16, 32]", "44.89"]])
    assert widths is not None  # (the others fit whole)
    assert sum(widths) + 3 * 3 + 1 <= 80 and widths[1:] == [8, 7]


def _terminal_lines(tmp_path, columns: int, *args) -> list[str]:
    """What ``qstream *args`` prints on a terminal ``columns`` wide, escapes removed."""
    env = {**os.environ, "FORCE_COLOR": "1", "NO_COLOR": "1", "COLUMNS": str(columns)}
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", *map(str, args)],
        capture_output=True, text=True, env=env, cwd=ROOT, check=True,
    ).stdout  # fmt: skip
    return [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", ln) for ln in out.splitlines()]


def test_tables_in_an_80_column_terminal_keep_names_on_one_line_and_every_value_whole(tmp_path):
    rng = np.random.default_rng(0)
    names = [LONG.format(i, j) for i in range(2) for j in range(3)]
    save_file({n: rng.standard_normal((16, 32)).astype(np.float32) for n in names},
              str(tmp_path / "m.safetensors"))  # fmt: skip
    assert run("convert", tmp_path / "m.safetensors", tmp_path / "m.zarr", "-q").exit_code == 0
    listed = json.loads(run("inspect", tmp_path / "m.zarr", "--json").stdout)["tensors"]
    assert list(listed) == names
    lines = _terminal_lines(tmp_path, 80, "inspect", tmp_path / "m.zarr")
    assert lines and all(len(ln) <= 80 for ln in lines), lines
    # (names and values do not fit side by side: a name a line, whole, its values below it)
    at = [lines.index(n) for n in names]
    for n, i in zip(names, at, strict=True):
        cells = lines[i + 1].split()
        assert cells[:3] == ["[16,", "32]", "float32"], lines[i + 1]
        assert cells[3] == "int8/axis0/minmax" and "…" not in lines[i + 1]
        sqnr = listed[n]["error"]["sqnr_db"]
        assert cells[-1] == f"{sqnr:.2f}"
    plain = run("inspect", tmp_path / "m.zarr")  # (not a terminal: full names, for grep)
    assert all(n in plain.stdout for n in names)


def test_a_terminal_table_cuts_names_part_by_part_where_the_values_leave_room(tmp_path):
    names = [LONG.format(i, j) for i in range(2) for j in range(3)]
    rows = [[n, "[16, 32]", "44.89"] for n in names]
    widths = column_widths(80, ["tensor", "shape", "SQNR dB"], rows)
    assert widths is not None and widths[1:] == [8, 7] and sum(widths) + 3 * 3 + 1 == 80
    assert readable(abbreviate(names[0], widths[0]))
    assert column_widths(200, ["tensor", "shape", "SQNR dB"], rows) == [len(names[0]), 8, 7]
    # a cut that leaves parts of 1-3 letters (m….la….0.mlp.ex….) says less than stacked rows
    assert column_widths(60, ["tensor", "shape", "SQNR dB"], rows) is None
    assert not readable(abbreviate("model.layers.0.mlp.experts.0.down_proj.weight", 29))
    wide = [[n, "[16, 32]", "float32", "int8/axis0/percentile", "2.0 KiB -> 640 B", "44.89"]
            for n in names]  # fmt: skip
    assert column_widths(80, ["tensor", "shape", "dtype", "as", "bytes", "SQNR"], wide) is None


def test_a_numpy_source_is_named_as_one_in_the_notebook_view():
    x = np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32)
    where = f"memory://small-things-{uuid.uuid4().hex}"
    qs.quantize_store(x, where, qs.QuantSpec(axis=0))
    view = qs.open_quantized(where).view
    assert view.title == "int8 [64, 32] (from numpy array [64, 32] float32)"
    assert "memory://" not in qs.open_quantized(where)._repr_html_()


def test_a_misspelt_dequantize_dtype_and_a_file_where_a_group_goes_are_named(src, tmp_path):
    q = tmp_path / "q.zarr"
    assert run("quantize", src, q, "-q").exit_code == 0
    r = run("dequantize", q, tmp_path / "y.zarr", "--dtype", "flaot32")
    assert r.exit_code == 2 and "(did you mean 'float32'?)" in r.output, r.output
    with pytest.raises(qs.InvalidDTypeError, match=r"did you mean 'float16'"):
        qs.plan_dequantize(q, tmp_path / "y.zarr", dtype="flaot16")
    r = run("inspect", ROOT / "samples" / "weights.npy")
    assert r.exit_code == 1
    assert r.output.strip().endswith("weights.npy is a NumPy .npy file, not a Zarr group"), r.output


def test_a_conversions_tensor_lines_fit_a_narrow_terminal_with_fewer_words():
    from cli.output import fit_line

    head, name = "[29/34] ", "layers.3.self_attn.o_proj.weight"
    forms = [
        " [128, 128] bfloat16 -> int8/axis0/minmax: 32.0 KiB -> 16.5 KiB  SQNR 43.66 dB",
        " -> int8/axis0/minmax: 32.0 KiB -> 16.5 KiB  SQNR 43.66 dB",
        " int8/axis0/minmax 16.5 KiB  SQNR 43.66 dB",
    ]
    assert fit_line(head, name, forms, None) == head + name + forms[0]  # (not a terminal)
    assert fit_line(head, name, forms, 120) == head + name + forms[0]
    assert fit_line(head, name, forms, 100) == head + name + forms[1]
    assert fit_line(head, name, forms, 85) == head + name + forms[2]
    short = fit_line(head, name, forms, 80)
    assert len(short) <= 80 and short.endswith(forms[2]) and ".o_proj.weight" in short


def test_a_conversion_whose_output_reader_goes_away_ends_as_a_cut_pipe_does(tmp_path):
    """``qstream convert ... | head -1``: exit 141 and no error line (SIGPIPE's way), and the
    same command resumes what it had done."""
    out = tmp_path / "o.zarr"
    argv = [sys.executable, "-m", "cli.main", "convert", str(SAMPLE), str(out)]
    p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline().startswith(b"[ 1/34] ")
    p.stdout.close()
    _, err = p.communicate(timeout=300)
    assert p.returncode == 141 and b"error" not in err, err.decode()[-2000:]
    again = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "resuming: " in again.stderr, again.stderr[-2000:]


def test_a_quiet_dry_run_prints_nothing_and_exits_as_the_run_would(src, tmp_path):
    r = run("quantize", src, tmp_path / "q.zarr", "--dry-run", "-q")
    assert r.exit_code == 0 and r.output == ""
    r = run("convert", SAMPLE, tmp_path / "c.zarr", "--dry-run", "-q")
    assert r.exit_code == 0 and r.output == ""
    r = run("convert", SAMPLE, tmp_path / "c.bin", "--dry-run", "-q")  # refused: said, exit 2
    assert r.exit_code == 2 and r.stderr.startswith("error: ")
    r = run("convert", SAMPLE, tmp_path / "c.zarr", "--dry-run", "-q", "--json")  # JSON stays
    assert r.exit_code == 0 and json.loads(r.stdout)["action"] == "create"
    assert not (tmp_path / "q.zarr").exists() and not (tmp_path / "c.zarr").exists()


def test_a_quiet_conversion_loads_no_rich(tmp_path):
    """``convert -q`` prints no line, so it loads no Rich (~20 ms of the sample's ~0.26 s
    conversion: `benchmarks/bench_startup.py`)."""
    code = (
        "import sys\nfrom cli.main import main\n"
        f"sys.argv = ['qstream', 'convert', {str(SAMPLE)!r}, {str(tmp_path / 'o.zarr')!r}, '-q']\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
        "print(code, sorted(m for m in sys.modules if m.split('.')[0] == 'rich'))"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert run.stdout.split() == ["0", "[]"], (run.stdout, run.stderr[-2000:])
