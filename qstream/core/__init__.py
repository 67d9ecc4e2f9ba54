"""In-memory numerics: array layouts, the affine core, offsets, buffers."""

from .affine import affine_dequantize, affine_quantize, quantize_call
from .indexing import expand_key, step1_slices
from .layout import (
    Layout,
    blocked_param_shape,
    dimension_names,
    normalize_axis,
    param_dimension_names,
    param_region,
    plan_layout,
)
from .offsets import (
    BF16_MAX,
    BF16_MIN,
    HALF_MAX,
    HALF_MIN,
    SCALE_MODES,
    bf16_scales,
    codec_constants,
    codec_decode,
    half_scales,
    offset_dequantize,
    offset_params,
    offset_quantize,
    round_scales,
)
from .scratch_pool import ALIGN, aligned_empty, scratch

# the names the folders above may use; the submodules named here are loaded on demand
__all__ = [
    "ALIGN",
    "BF16_MAX",
    "BF16_MIN",
    "HALF_MAX",
    "HALF_MIN",
    "SCALE_MODES",
    "Layout",
    "affine_dequantize",
    "affine_quantize",
    "aligned_empty",
    "bf16_scales",
    "blocked_param_shape",
    "buffers",
    "checks",
    "codec_constants",
    "codec_decode",
    "dimension_names",
    "expand_key",
    "float_formats",
    "half_scales",
    "normalize_axis",
    "nvfp4",
    "offset_dequantize",
    "offset_params",
    "offset_quantize",
    "param_dimension_names",
    "param_region",
    "plan_layout",
    "presets",
    "quantize_call",
    "round_scales",
    "scratch",
    "step1_slices",
]
