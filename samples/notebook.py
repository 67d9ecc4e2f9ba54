"""Notebook-style tour: run cell by cell in Jupyter, or `python samples/notebook.py`.

The same cells as a notebook: `samples/notebook.ipynb` (written by `samples/make_notebook.py`).
"""

# %% quantize an activation dump out of core, with calibration along the way
import tempfile
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

# %% int4 groups of 32: each group's SQNR, as a distribution (the notebook view draws it)
w4 = qs.quantize_store(
    x,
    "memory://weights-int4",
    qs.QuantSpec(dtype="int4", axis=1, block_size=32, method="dynamic"),
    overwrite=True,
)
groups = w4.error["groups"]  # fixed 0.25 dB bins, exact counts, bounded whatever the size
print(
    f"int4 groups: SQNR {w4.error['sqnr_db']:.2f} dB over {groups['groups']} groups, worst group"
    f" {w4.error['worst_groups'][0]['sqnr_db']:.2f} dB at {w4.error['worst_groups'][0]['group']}"
)
q4 = qs.open_quantized("memory://weights-int4")
q4  # noqa: B018  (in Jupyter: the per-group SQNR histogram and the worst groups; q4.plot())

# %% a whole checkpoint: SQNR and size per tensor, bounded for any number of tensors
work = tempfile.TemporaryDirectory(prefix="qstream-notebook-")  # removed when Python exits
qs.convert_checkpoint(here / "tiny-transformer.safetensors", f"{work.name}/tiny-int8.zarr")
ck = qs.open_quantized(f"{work.name}/tiny-int8.zarr")
view = ck.view
print(
    f"{view.tensors} tensors ({view.kept} kept): {view.bytes_before} -> {view.bytes_after} bytes,"
    f" worst {view.worst[0]['name']} at {view.worst[0]['sqnr_db']:.2f} dB"
)
ck  # noqa: B018  (in Jupyter: SQNR over tensors, worst tensors, sizes; ck.plot())
