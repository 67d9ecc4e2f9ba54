"""Notebook-style tour: run cell by cell in Jupyter, or `python samples/notebook.py`."""

# %% quantize an activation dump out of core, with calibration along the way
from pathlib import Path

import numpy as np

import qstream as qs


def samples_folder() -> Path:
    """This file's folder; in Jupyter (no ``__file__``) the working folder or its
    ``samples/``, whichever holds the sample data."""
    if "__file__" in globals():
        return Path(__file__).resolve().parent
    for d in (Path.cwd(), Path.cwd() / "samples"):
        if (d / "activations.zarr").is_dir():
            return d
    raise FileNotFoundError("start Jupyter in the repository or in samples/ (the sample data)")


here = samples_folder()
report = qs.quantize_store(
    here / "activations.zarr",
    "memory://acts-int8",
    qs.QuantSpec(dtype="int8", method="entropy"),
    overwrite=True,
)
print(
    f"entropy calibration: {report.passes} passes, SQNR {report.error['sqnr_db']:.2f} dB,"
    f" clipped {100 * report.error['clip_fraction']:.3f} %"
)

# %% read lazily: only the slab you index is read and dequantized
acts = qs.open_quantized("memory://acts-int8")
print(acts, acts[0:4, 0:6])

# %% compare calibration methods on the same data
for method in ("minmax", "percentile", "mse", "l2"):
    r = qs.quantize_store(
        here / "activations.zarr",
        f"memory://acts-{method}",
        qs.QuantSpec(method=method),
        overwrite=True,
    )
    print(f"{method:>10}: SQNR {r.error['sqnr_db']:6.2f} dB")

# %% every method from one histogram pass: thresholds and the SQNR predicted from the histogram
cal = qs.compare_methods(here / "activations.zarr", qs.QuantSpec(method="mse"))
for p in cal.view.predictions:
    print(f"{p.method:>10}: clip at {p.hi:6.3f}, predicted SQNR {p.sqnr_db:6.2f} dB")
print("best predicted:", cal.view.best)
cal  # noqa: B018  (in Jupyter: a table and the histogram with every threshold; cal.plot())

# %% the same arithmetic as a framework's operator, bit for bit
x = np.load(here / "weights.npy")
q_onnx = qs.compat.onnx.quantize_linear(x, np.float32(0.001), np.int8(0))
q_torch = qs.compat.torch.quantize_per_tensor(x, 0.001, 0, "qint8")
print("ONNX vs torch arithmetic differ in", int((q_onnx != q_torch).sum()), "elements")
