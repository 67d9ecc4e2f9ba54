"""What a checkpoint's conversion or restore tells ``on_tensor``, and how it names a target."""

from __future__ import annotations

from dataclasses import dataclass

from ...spec import QuantSpec


@dataclass(frozen=True)
class TensorEvent:
    """Reported to ``on_tensor`` before (``result`` None) and after each tensor."""

    index: int
    total: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    target: str  # e.g. "int8 per_axis(0)" or "keep"
    result: dict | None = None


def describe_target(spec: QuantSpec) -> str:
    """A short label: ``int8/axis0/minmax``, ``int4/axis1:b32/dynamic``, ``int8/tensor/mse``;
    scales that are not float32 are named: ``int8/axis0/minmax/bfloat16-scales``."""
    where = "tensor" if spec.axis is None else f"axis{spec.axis}"
    if spec.block_size:
        where += f":b{spec.block_size}"
    method = "explicit" if spec.scale is not None else spec.method
    scales = "" if spec.scale_dtype == "float32" else f"/{spec.scale_dtype}-scales"
    return f"{spec.dtype}/{where}/{method}{scales}"
