"""Regenerate the bundled samples (deterministic). Run: python samples/make_samples.py

- tiny-transformer.safetensors: a transformer-like checkpoint (bf16 weights, f32 embeddings
  and norms, ~2.5 MB), written directly in the safetensors format.
- activations.zarr: an activation dump (float32, heavy-tailed, chunked, zstd).
- weights.npy: one projection weight, for the quickstart script.
"""

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np

HERE = Path(__file__).parent


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    names = {
        np.dtype(np.float32): "F32",
        np.dtype(ml_dtypes.bfloat16): "BF16",
        np.dtype(np.float16): "F16",
    }
    header, offset, blobs = {}, 0, []
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {
            "dtype": names[a.dtype],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt", "generator": "qstream samples"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def main() -> None:
    rng = np.random.default_rng(2026)
    d, ff, layers, vocab = 128, 512, 4, 1000

    def w(*shape, scale=0.02):
        rows = np.exp(rng.normal(0, 0.4, (shape[0],) + (1,) * (len(shape) - 1)))
        return (rng.standard_normal(shape) * scale * rows).astype(ml_dtypes.bfloat16)

    t = {"embed_tokens.weight": (rng.standard_normal((vocab, d)) * 0.02).astype(np.float32)}
    for i in range(layers):
        p = f"layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            t[p + f"self_attn.{proj}.weight"] = w(d, d)
        t[p + "mlp.up_proj.weight"] = w(ff, d)
        t[p + "mlp.down_proj.weight"] = w(d, ff)
        t[p + "input_layernorm.weight"] = np.ones(d, np.float32)
        t[p + "mlp.down_proj.bias"] = np.zeros(d, np.float32)
    t["norm.weight"] = np.ones(d, np.float32)
    write_safetensors(HERE / "tiny-transformer.safetensors", t)

    import zarr

    acts = (rng.standard_t(4, (512, 256)) * 0.5).astype(np.float32)
    a = zarr.create_array(
        str(HERE / "activations.zarr"),
        shape=acts.shape,
        chunks=(128, 256),
        dtype="float32",
        overwrite=True,
    )
    a[...] = acts

    rows = np.exp(rng.normal(0, 0.5, (256, 1))).astype(np.float32)
    np.save(
        HERE / "weights.npy", (rng.standard_normal((256, 512)) * 0.02 * rows).astype(np.float32)
    )


if __name__ == "__main__":
    main()
