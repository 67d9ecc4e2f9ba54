"""Quantize the bundled sample weight to int8 per output channel, restore it, report the error.

Run: python samples/quickstart.py
"""

from pathlib import Path

import numpy as np

import qstream as qs
from qstream.compat import onnx as qonnx

w = np.load(Path(__file__).parent / "weights.npy")

# Symmetric per-channel int8: one scale per row (axis 0), absmax / 127.
scale = (np.abs(w).max(axis=1) / 127).astype(np.float32)
q = qs.quantize(w, scale, np.zeros(w.shape[0], np.int8), axis=0, dtype="int8")
restored = qs.dequantize(q, scale, np.zeros(w.shape[0], np.int8), axis=0)

err = w - restored
sqnr = 10 * np.log10(np.sum(w.astype(np.float64) ** 2) / np.sum(err.astype(np.float64) ** 2))
print(f"weights {w.shape} {w.dtype} -> {q.dtype}: {w.nbytes} -> {q.nbytes + scale.nbytes} bytes")
print(f"SQNR {sqnr:.2f} dB, max abs error {np.abs(err).max():.3g}")

# The same call through the ONNX profile gives the same bytes as ONNX's QuantizeLinear.
same = qonnx.quantize_linear(w, scale, np.zeros(w.shape[0], np.int8), axis=0)
print("ONNX QuantizeLinear profile identical:", bool(np.array_equal(same, q)))
