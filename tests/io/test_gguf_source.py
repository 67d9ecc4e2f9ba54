"""GGUF files as a checkpoint source (issue 49): files written by gguf-py's GGUFWriter and by
llama.cpp's converter, read by qstream and compared with gguf-py's own reader and
``dequantize`` bit for bit; Hugging Face names and layouts against the model that was
converted; crafted headers refused in one line, without allocating."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf import GGUFReader, GGUFWriter, quants  # noqa: E402

from qstream.compat import gguf as qstream_blocks  # noqa: E402
from qstream.errors import QStreamWarning, StoreError  # noqa: E402
from qstream.io.checkpoints import gguf_source  # noqa: E402
from qstream.io.checkpoints.gguf_metadata import describe_gguf, gguf_config  # noqa: E402
from qstream.io.checkpoints.gguf_source import open_gguf  # noqa: E402
from tests.support.memory_peak import PREAMBLE, run_child  # noqa: E402

TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "MXFP4")  # fmt: skip
SHAPES = ((5, 512), (3, 4, 256), (768,), (2, 2, 2, 256))


def _bits(a: np.ndarray) -> np.ndarray:
    """float32 values as their bits (NaN payloads compared too)."""
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _stored(x: np.ndarray, t: str) -> np.ndarray:
    """``x`` in the GGUF type ``t``: gguf-py's quantizer, or llama.cpp's K-quant layout as
    qstream writes it (gguf-py 0.19 does not quantize K-quants; only its decoding is the
    reference here)."""
    if t == "F32":
        return x
    if t == "F16":
        return x.astype(np.float16)
    if t.endswith("_K"):
        return qstream_blocks.quantize(x, t)
    return quants.quantize(x, T[t])


def _random_bytes(rng: np.random.Generator, shape: tuple[int, ...], t: str) -> np.ndarray:
    """Random blocks of type ``t`` (any bits: NaN, infinite and subnormal scales too)."""
    block, size = gguf.GGML_QUANT_SIZES[T[t]]
    byte_shape = (*shape[:-1], shape[-1] // block * size)
    raw = rng.integers(0, 256, byte_shape, dtype=np.uint8)
    if t == "F32":
        return raw.view(np.float32)
    return raw.view(np.float16) if t == "F16" else raw


def _write(path: Path, arrays: dict[str, tuple[np.ndarray, str]], arch: str = "testarch",
           kv: dict[str, Any] | None = None) -> Path:  # fmt: skip
    w = GGUFWriter(str(path), arch)
    for k, v in (kv or {}).items():
        if isinstance(v, list):
            w.add_array(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        else:
            w.add_string(k, v)
    for name, (a, t) in arrays.items():
        if t in ("F32", "F16"):
            w.add_tensor(name, a)
        else:
            w.add_tensor(name, a, raw_shape=a.shape, raw_dtype=T[t])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _reference(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of the file as gguf-py reads and dequantizes it (NumPy order)."""
    out = {}
    for rt in GGUFReader(str(path)).tensors:
        with np.errstate(invalid="ignore", over="ignore"):  # (random blocks: NaN scales)
            values = quants.dequantize(rt.data, rt.tensor_type)
        out[rt.name] = values.reshape(tuple(reversed([int(d) for d in rt.shape])))
    return out


@pytest.fixture(scope="module", params=["quantized", "random_bytes"])
def every_type(request, tmp_path_factory) -> Path:
    """A GGUF file from GGUFWriter holding every read type in every shape of SHAPES, and a
    long array and string array in its keys."""
    rng = np.random.default_rng(7)
    arrays = {}
    for t in TYPES:
        for shape in SHAPES:
            if request.param == "quantized":
                x = (rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 40.0])).astype(np.float32)
                a = _stored(x, t)
            else:
                a = _random_bytes(rng, shape, t)
            arrays[f"{t}.{len(shape)}d"] = (a, t)
    kv = {"test.numbers": list(range(5000)), "test.words": ["ab", "cd"] * 3000}
    path = tmp_path_factory.mktemp("types") / f"{request.param}.gguf"
    return _write(path, arrays, kv=kv)


def test_every_type_and_shape_decodes_bit_equal_to_gguf_py(every_type):
    ref = _reference(every_type)
    with pytest.warns(QStreamWarning, match="testarch.*GGUF names"):
        got = open_gguf(str(every_type))
    assert list(got) == list(ref)
    for name, values in ref.items():
        t = got[name]
        assert t.shape == values.shape and t.dtype == np.float32, name
        assert np.array_equal(_bits(t[...]), _bits(values)), name


@pytest.mark.parametrize(
    "key",
    [slice(1, 3), slice(0, 1), slice(None, None, 2), slice(None, None, -1), 2, -1,
     (slice(1, 2), Ellipsis, slice(32, 96)), (Ellipsis, 7), slice(2, 2)],
)  # fmt: skip
def test_region_reads_equal_the_whole_read(every_type, key):
    got = open_gguf(str(every_type), hf_names=False)
    for name, t in got.items():
        whole = t[...]
        k = key
        if isinstance(key, tuple) and len(key) > t.ndim:  # (1-D: the last axis' part)
            k = key[-1]
        if isinstance(key, int) and t.shape[0] <= 2:
            k = 0
        assert np.array_equal(_bits(t[k]), _bits(whole[k])), (name, key)


def test_a_row_read_reads_the_bytes_of_those_rows_only(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 64, 512)).astype(np.float32)
    path = _write(tmp_path / "rows.gguf", {"q": (_stored(x, "Q4_K"), "Q4_K"),
                                           "v": (_stored(x[0, 0], "Q8_0"), "Q8_0")})  # fmt: skip
    reads: list[tuple[int, int]] = []
    real = gguf_source.read_file_run

    def spy(path: str, first: int, out: np.ndarray, what: str = "") -> None:
        reads.append((first, out.nbytes))
        real(path, first, out, what)

    monkeypatch.setattr(gguf_source, "read_file_run", spy)
    t = open_gguf(str(path), hf_names=False)["q"]
    start = next(r.data_offset for r in GGUFReader(str(path)).tensors if r.name == "q")
    row = 512 // 256 * 144  # two Q4_K super-blocks per row
    t[2, 10:13]
    assert reads == [(start + 2 * 64 * row, 64 * row)]  # the 3-D tensor: expert 2's rows
    reads.clear()
    v = open_gguf(str(path), hf_names=False)["v"]
    v[40:70]  # a 1-D tensor: the blocks holding values 40..69 (blocks 1 and 2 of 34 bytes)
    v_start = next(r.data_offset for r in GGUFReader(str(path)).tensors if r.name == "v")
    assert reads == [(v_start + 34, 2 * 34)]


# -- files from llama.cpp's converter --------------------------------------------------------


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Convert tiny transformers models with llama.cpp's converter, once per (arch, type)."""
    from tests.support.gguf_models import build_model, llama_cpp_converter, run_converter

    llama_cpp_converter()  # (skips, or fails under CI, when absent)
    root = tmp_path_factory.mktemp("converted")
    done: dict[tuple[str, str], tuple[Path, Path]] = {}
    tokenizers = {"llama": "sentencepiece", "mixtral": "sentencepiece",
                  "qwen2moe": "qwen2", "gemma3": "sentencepiece"}  # fmt: skip

    def get(arch: str, outtype: str) -> tuple[Path, Path]:
        if (arch, outtype) not in done:
            folder = root / arch
            if not (folder / "config.json").exists():
                build_model(folder, arch, tokenizers[arch])
            out = run_converter(folder, root / f"{arch}.{outtype}.gguf", outtype)
            done[arch, outtype] = (folder, out)
        return done[arch, outtype]

    return get


def _model_tensors(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    out: dict[str, np.ndarray] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


@pytest.mark.parametrize("outtype", ["f32", "f16", "q8_0"])
def test_converter_files_decode_bit_equal_to_gguf_py(converted, outtype):
    _, path = converted("llama", outtype)
    ref = _reference(path)
    got = open_gguf(str(path), hf_names=False)
    assert list(got) == list(ref)
    for name, values in ref.items():
        assert np.array_equal(_bits(got[name][...]), _bits(values)), name
        assert np.array_equal(_bits(got[name][3:5]), _bits(values[3:5])), name


@pytest.mark.parametrize("arch", ["llama", "mixtral", "qwen2moe"])
def test_hf_names_give_back_the_f32_model_exactly(converted, arch):
    """Names, the inverse q/k permutation (llama, Mixtral) and experts split back (Mixtral,
    Qwen2-MoE): every tensor of the converted model, bit for bit."""
    folder, path = converted(arch, "f32")
    model = _model_tensors(folder)
    got = open_gguf(str(path))
    assert sorted(got) == sorted(model)
    for name, values in model.items():
        t = got[name]
        assert t.shape == values.shape, name
        assert np.array_equal(t[...], values.astype(np.float32)), name
        assert np.array_equal(t[5:9], values[5:9].astype(np.float32)), name


def test_hf_names_of_q8_0_are_the_permuted_back_dequantized_values(converted):
    from qstream.compat.gguf_names import row_order

    folder, path = converted("llama", "q8_0")
    ref = _reference(path)
    got = open_gguf(str(path))
    cfg = json.loads((folder / "config.json").read_text())
    heads = {"q_proj": cfg["num_attention_heads"], "k_proj": cfg["num_key_value_heads"]}
    layer = "model.layers.1.self_attn."
    for proj, short in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v")):
        gg = ref[f"blk.1.{short}.weight"]
        rows = gg.shape[0]
        back = gg[np.argsort(row_order(rows, heads[proj]))] if proj in heads else gg
        assert np.array_equal(got[layer + proj + ".weight"][...], back), proj
        assert np.array_equal(got[layer + proj + ".weight"][3:11], back[3:11]), proj
    # and near the model's own weights (Q8_0: half a step of the block's scale, plus the
    # scale's own rounding to float16 over up to 127 steps)
    model = _model_tensors(folder)[layer + "q_proj.weight"]
    step = np.abs(model).reshape(-1, 32).max(axis=1) / 127
    err = np.abs(got[layer + "q_proj.weight"][...] - model).reshape(-1, 32).max(axis=1)
    assert np.all(err <= step * (0.5 + 127 * 2.0**-11))


def test_gemma_norms_have_the_converters_offset_taken_off(converted):
    folder, path = converted("gemma3", "f32")
    ref = _reference(path)
    got = open_gguf(str(path))
    model = _model_tensors(folder)
    name = "model.layers.0.input_layernorm.weight"
    assert np.array_equal(got[name][...], ref["blk.0.attn_norm.weight"] - np.float32(1))
    assert np.allclose(got[name][...], model[name], rtol=0, atol=1e-6)
    embed = "model.embed_tokens.weight"
    assert np.array_equal(got[embed][...], model[embed])


@pytest.mark.parametrize("arch", ["llama", "qwen2moe"])
def test_transformers_loads_the_decoded_folder_and_computes_the_same_logits(
    converted, tmp_path, arch
):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from safetensors.numpy import save_file

    folder, path = converted(arch, "f32")
    out = tmp_path / "decoded"
    out.mkdir()
    save_file({k: t[...] for k, t in open_gguf(str(path)).items()},
              str(out / "model.safetensors"))  # fmt: skip
    (out / "config.json").write_text(json.dumps(gguf_config(str(path))))
    ids = torch.tensor([[1, 5, 9, 42, 7, 3]])
    with torch.no_grad():
        want = transformers.AutoModelForCausalLM.from_pretrained(str(folder))(ids).logits
        have = transformers.AutoModelForCausalLM.from_pretrained(str(out))(ids).logits
    assert torch.equal(want, have)


def test_gguf_config_gives_the_models_hyper_parameters(converted):
    folder, path = converted("qwen2moe", "f32")
    orig = json.loads((folder / "config.json").read_text())
    cfg = gguf_config(str(path))
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps",
            "num_experts", "num_experts_per_tok", "moe_intermediate_size",
            "shared_expert_intermediate_size", "architectures", "model_type",
            "tie_word_embeddings")  # fmt: skip
    assert {k: cfg[k] for k in keys} == {k: orig[k] for k in keys}


def test_describe_gguf_counts_what_gguf_py_reads(converted):
    _, path = converted("llama", "q8_0")
    tensors = GGUFReader(str(path)).tensors
    d = describe_gguf(str(path))
    assert d["architecture"] == "llama" and d["hf_names"] and d["tensors"] == len(tensors)
    want: dict[str, int] = {}
    for rt in tensors:
        want[rt.tensor_type.name] = want.get(rt.tensor_type.name, 0) + 1
    assert d["types"] == want and d["parameters"] == sum(int(rt.n_elements) for rt in tensors)


# -- crafted headers -------------------------------------------------------------------------


def _header(
    *,
    magic: bytes = b"GGUF",
    version: int = 3,
    n_tensors: int | None = None,
    n_kv: int | None = None,
    kv: list[bytes] | None = None,
    tensors: list[tuple[bytes, list[int], int, int]] | None = None,
    data: int = 256,
) -> bytes:
    """A GGUF file by hand: ``kv`` encoded entries; ``tensors`` (name, dims fastest first,
    type id, offset); ``data`` bytes of zeros after the aligned header."""
    kv = kv if kv is not None else [_kv_str("general.architecture", "testarch")]
    tensors = tensors if tensors is not None else [(b"w", [32, 1], 0, 0)]
    n = len(tensors) if n_tensors is None else n_tensors
    keys = len(kv) if n_kv is None else n_kv
    head = magic + struct.pack("<IQQ", version, n, keys) + b"".join(kv)
    for name, dims, kind, offset in tensors:
        head += struct.pack("<Q", len(name)) + name + struct.pack("<I", len(dims))
        head += struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", kind, offset)
    head += b"\0" * (-len(head) % 32)
    return head + b"\0" * data


def _kv_str(key: str, value: str) -> bytes:
    k, v = key.encode(), value.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<IQ", 8, len(v)) + v


CRAFTED = {
    "truncated header": (lambda: _header(tensors=[])[:40], "past the end of the file"),
    "truncated data": (lambda: _header()[:-200], "ends past the end of the file"),
    "bad magic": (lambda: _header(magic=b"GGML"), "not a GGUF file"),
    "version 1": (lambda: _header(version=1), "version 1"),
    "huge tensor count": (lambda: _header(n_tensors=1 << 60), "tensor count"),
    "huge key count": (lambda: _header(kv=[], n_kv=1 << 59), "key count"),
    "string length past EOF": (lambda: _header(kv=[
        struct.pack("<Q", 4) + b"k.ey" + struct.pack("<IQ", 8, 1 << 40)]), "value of key 'k.ey'"),
    "key length past the limit": (lambda: _header(kv=[struct.pack("<Q", 1 << 62)]), "key 0"),
    "array count past EOF": (lambda: _header(kv=[
        struct.pack("<Q", 1) + b"a" + struct.pack("<IIQ", 9, 6, 1 << 50)]), "array elements"),
    "offset past EOF": (lambda: _header(tensors=[(b"w", [32, 1], 0, 1 << 40)]), "'w'"),
    "unknown type id": (lambda: _header(tensors=[(b"w", [32, 1], 77, 0)]), "type id 77"),
    "undecoded type": (lambda: _header(tensors=[(b"w", [256, 1], 16, 0)]), "IQ2_XXS"),
    "dims overflow": (lambda: _header(tensors=[(b"w", [1 << 40, 1 << 40], 0, 0)]), "overflow"),
    "zero dimension": (lambda: _header(tensors=[(b"w", [32, 0], 0, 0)]), "dimension 1"),
    "five dimensions": (lambda: _header(tensors=[(b"w", [32, 1, 1, 1, 1], 0, 0)]), "5 dim"),
    "overlapping tensors": (lambda: _header(tensors=[(b"a", [32, 1], 0, 0),
                                                     (b"b", [32, 1], 0, 64)]),
                            "overlap"),  # (a holds 128 bytes from 0; b starts at 64)
    "unaligned offset": (lambda: _header(tensors=[(b"w", [8], 0, 4)]), "alignment"),
    "partial block": (lambda: _header(tensors=[(b"w", [48, 1], 8, 0)]), "blocks of 32"),
    "duplicate tensor": (lambda: _header(tensors=[(b"w", [8], 0, 0), (b"w", [8], 0, 32)]),
                         "appears twice"),
    "duplicate key": (lambda: _header(kv=[_kv_str("a", "x"), _kv_str("a", "y")]), "twice"),
}  # fmt: skip


def test_the_hand_built_header_is_a_valid_gguf(tmp_path):
    """The crafted files' baseline is a file gguf-py and qstream both read."""
    path = tmp_path / "ok.gguf"
    path.write_bytes(_header())
    assert [t.name for t in GGUFReader(str(path)).tensors] == ["w"]
    with pytest.warns(QStreamWarning):
        assert open_gguf(str(path))["w"].shape == (1, 32)


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_crafted_header_is_refused_in_one_line_naming_the_field(tmp_path, case):
    make, field = CRAFTED[case]
    path = tmp_path / "crafted.gguf"
    path.write_bytes(make())
    with pytest.raises(StoreError) as e:
        open_gguf(str(path))
    message = str(e.value)
    assert "\n" not in message and str(path) in message
    assert field in message, message


def test_crafted_headers_are_refused_without_allocating(tmp_path):
    paths = []
    for i, case in enumerate(sorted(CRAFTED)):
        p = tmp_path / f"c{i}.gguf"
        p.write_bytes(CRAFTED[case][0]())
        paths.append(p)
    code = PREAMBLE + (
        "from qstream.io.checkpoints.gguf_source import open_gguf\n"
        "from qstream.errors import StoreError\n"
        "base = vm_hwm()\n"
        "for p in sys.argv[1:]:\n"
        "    try:\n"
        "        open_gguf(p)\n"
        "        print('OPENED', p)\n"
        "    except StoreError:\n"
        "        print('REFUSED')\n"
        "print('GROWTH', vm_hwm() - base)\n"
    )
    r = run_child(paths, code=code, address_space=2 << 30)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:-1] == ["REFUSED"] * len(paths)
    growth = int(lines[-1].split()[1])
    print(f"peak growth over {len(paths)} crafted files: {growth / 2**20:.2f} MiB")
    assert growth < 4 << 20


def test_dequantize_of_a_gguf_file_gives_a_folder_transformers_loads(converted, tmp_path):
    """``qstream dequantize model.gguf out/model.safetensors``: the decoded tensors under their
    Hugging Face names and a config rebuilt from the file's metadata; transformers computes
    the original model's logits from it (an f32 GGUF holds the model's values exactly), and
    ``qs.open_checkpoint`` reads a .gguf as the same tensors."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from typer.testing import CliRunner

    import qstream as qs
    from cli.main import app

    folder, path = converted("llama", "f32")
    opened = qs.open_checkpoint(str(path))
    assert set(opened) == set(open_gguf(str(path)))
    out = tmp_path / "decoded"
    r = CliRunner().invoke(app, ["dequantize", str(path), str(out / "model.safetensors")])
    assert r.exit_code == 0, r.output
    assert json.loads((out / "config.json").read_text()) == gguf_config(str(path))
    ids = torch.tensor([[1, 5, 9, 42, 7, 3]])
    with torch.no_grad():
        want = transformers.AutoModelForCausalLM.from_pretrained(str(folder))(ids).logits
        have = transformers.AutoModelForCausalLM.from_pretrained(str(out))(ids).logits
    assert torch.equal(want, have)
    # a config.json qstream did not write is never replaced: refused before any work
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text("{}")
    r = CliRunner().invoke(app, ["dequantize", str(path), str(other / "model.safetensors")])
    assert r.exit_code == 2 and "qstream does not replace a file" in r.output
    assert sorted(p.name for p in other.iterdir()) == ["config.json"]


def test_inspect_of_a_gguf_another_tool_wrote_says_what_its_header_holds(converted):
    from typer.testing import CliRunner

    from cli.main import app

    _, path = converted("llama", "q8_0")
    r = CliRunner().invoke(app, ["inspect", str(path), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output[r.output.index("{") :])
    got = doc.get("summary", doc) if "architecture" not in doc else doc
    assert got["architecture"] == "llama" and got["written_by"] == "another tool"
    assert got["tensors"] == len(GGUFReader(str(path)).tensors)
    assert got["tokenizer"] == "llama"
    assert got["quantization"] == "GGUF Q8_0"


FT = gguf.LlamaFileType


@pytest.mark.parametrize(
    "file_type", [FT.MOSTLY_Q4_K_M, FT.MOSTLY_IQ2_XS, FT.MOSTLY_MXFP4_MOE, None]
)
def test_inspect_names_a_gguf_quantization_as_gguf_py_names_its_file_type(tmp_path, file_type):
    from typer.testing import CliRunner

    from cli.main import app

    a = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    kv = {} if file_type is None else {"general.file_type": int(file_type)}
    h = a.astype(np.float16)
    path = _write(tmp_path / "m.gguf", {"a": (a, "F32"), "b": (h, "F16"), "c": (h, "F16")}, kv=kv)
    r = CliRunner().invoke(app, ["inspect", str(path), "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.output[r.output.index("{") :])
    got = got.get("summary", got) if "quantization" not in got else got
    if file_type is None:
        assert got["quantization"] == "GGUF F16 (most tensors)"
    else:
        assert got["quantization"] == "GGUF " + file_type.name.removeprefix("MOSTLY_")
