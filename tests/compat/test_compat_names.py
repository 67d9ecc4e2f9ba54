"""Every dtype argument of every profile takes the spec's own names and qstream's names (and
dtypes) for each type the profile supports, with the same result; anything else is refused with
a message listing both spellings."""

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto

from qstream.compat import ngraph, onednn, onnx, tensorflow, torch
from qstream.errors import InvalidDTypeError

X = np.array(
    [[-3.7, -0.5, 0.0, 0.5, 2.5, 300.0], [1e6, -1e6, 7.25, 0.49999997, 1.5, -2.5]], np.float32
)

ONEDNN = [
    ("s8", "int8", np.int8),
    ("u8", "uint8", np.uint8),
    ("f8_e4m3", "float8_e4m3fn", ml_dtypes.float8_e4m3fn),
    ("f8_e5m2", "float8_e5m2", ml_dtypes.float8_e5m2),
]


@pytest.mark.parametrize(("native", "name", "dtype"), ONEDNN)
def test_onednn_dst_dtype_names(native, name, dtype):
    want = onednn.quantize(X, scales=[0.5], dst_dtype=native)
    assert want.dtype == np.dtype(dtype)
    for alias in (name, name.upper(), dtype, np.dtype(dtype)):
        got = onednn.quantize(X, scales=[0.5], dst_dtype=alias)
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
        assert got.dtype == want.dtype
    y = onednn.dequantize(want, scales=[0.5])
    assert y.dtype == np.float32


@pytest.mark.parametrize("bad", ["int16", "f8_e4m3fnuz", "float8_e4m3fnuz", "s4", np.int16, "f32"])
def test_onednn_refuses_other_types_listing_names(bad):
    with pytest.raises(
        InvalidDTypeError, match=r"s8, u8, f8_e4m3, f8_e5m2.*int8, uint8, float8_e4m3fn"
    ):
        onednn.quantize(X, scales=[0.5], dst_dtype=bad)


def test_onednn_dequantize_refuses_other_types():
    with pytest.raises(InvalidDTypeError, match="s8, u8, f8_e4m3 or f8_e5m2"):
        onednn.dequantize(np.zeros(3, np.int16), scales=[1.0])


NGRAPH = [("i8", "int8", np.int8), ("u8", "uint8", np.uint8), ("i32", "int32", np.int32)]


@pytest.mark.parametrize(("native", "name", "dtype"), NGRAPH)
@pytest.mark.parametrize(
    ("rnative", "rname", "real"), [("f32", "float32", np.float32), ("f64", "float64", np.float64)]
)
def test_ngraph_type_names(native, name, dtype, rnative, rname, real):
    x = X.astype(real)
    z = dtype(1)
    want = ngraph.quantize(x, real(0.5), z, type=native)
    for alias in (name, native.upper(), dtype, np.dtype(dtype)):
        np.testing.assert_array_equal(ngraph.quantize(x, real(0.5), z, type=alias), want)
    y = ngraph.dequantize(want, real(0.5), z, type=rnative)
    assert y.dtype == real
    for alias in (rname, rnative.upper(), real, np.dtype(real)):
        np.testing.assert_array_equal(ngraph.dequantize(want, real(0.5), z, type=alias), y)


@pytest.mark.parametrize("bad", ["int16", "i16", "s8", "qint8", "float8_e4m3fn", np.int16])
def test_ngraph_refuses_other_quantized_types(bad):
    with pytest.raises(
        InvalidDTypeError, match=r"i8, u8, i32 \(or qstream's names: int8, uint8, int32\)"
    ):
        ngraph.quantize(X, np.float32(1), np.int8(0), type=bad)


@pytest.mark.parametrize("bad", ["f16", "float16", "bf16", "double", np.float16])
def test_ngraph_refuses_other_real_types(bad):
    with pytest.raises(
        InvalidDTypeError, match=r"f32, f64 \(or qstream's names: float32, float64\)"
    ):
        ngraph.dequantize(np.zeros(3, np.int8), np.float32(1), np.int8(0), type=bad)


TORCH = [("qint8", "int8", np.int8), ("quint8", "uint8", np.uint8), ("qint32", "int32", np.int32)]


@pytest.mark.parametrize(("native", "name", "dtype"), TORCH)
def test_torch_dtype_names(native, name, dtype):
    real_torch = pytest.importorskip("torch")
    zp = 3 if native != "quint8" else 128
    want = torch.quantize_per_tensor(X, 0.5, zp, native)
    assert want.dtype == np.dtype(dtype)
    for alias in (name, f"torch.{native}", getattr(real_torch, native), dtype, np.dtype(dtype)):
        np.testing.assert_array_equal(torch.quantize_per_tensor(X, 0.5, zp, alias), want)
        got = torch.quantize_per_channel(X, [0.5, 0.25], [zp, zp], 0, alias)
        np.testing.assert_array_equal(
            got, torch.quantize_per_channel(X, [0.5, 0.25], [zp, zp], 0, native)
        )


@pytest.mark.parametrize("bad", ["torch.uint8", "torch.int8", "quint4x2", "int16", "s8", np.int16])
def test_torch_refuses_other_types(bad):
    with pytest.raises(
        InvalidDTypeError, match=r"qint8, quint8, qint32 \(or qstream's names: int8, uint8, int32\)"
    ):
        torch.quantize_per_tensor(X, 0.5, 0, bad)


TF = [
    ("qint8", "int8", np.int8),
    ("quint8", "uint8", np.uint8),
    ("qint16", "int16", np.int16),
    ("quint16", "uint16", np.uint16),
    ("qint32", "int32", np.int32),
]


@pytest.mark.parametrize(("native", "name", "dtype"), TF)
def test_tensorflow_type_names(native, name, dtype):
    want = tensorflow.quantize(X, -2.0, 3.0, native, mode="SCALED")
    assert want[0].dtype == np.dtype(dtype)
    for alias in (name, native.upper(), dtype, np.dtype(dtype)):
        got = tensorflow.quantize(X, -2.0, 3.0, alias, mode="SCALED")
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)
    y = tensorflow.dequantize(want[0], -2.0, 3.0, mode="SCALED")
    for alias in ("float", "float32", "FLOAT", np.float32):
        np.testing.assert_array_equal(
            tensorflow.dequantize(want[0], -2.0, 3.0, mode="SCALED", dtype=alias), y
        )
    b = tensorflow.dequantize(want[0], -2.0, 3.0, dtype="bfloat16")
    np.testing.assert_array_equal(
        tensorflow.dequantize(want[0], -2.0, 3.0, dtype=ml_dtypes.bfloat16), b
    )


def test_tensorflow_accepts_its_dtype_objects():
    tf = pytest.importorskip("tensorflow")
    want = tensorflow.quantize(X, -2.0, 3.0, "qint8")[0]
    np.testing.assert_array_equal(tensorflow.quantize(X, -2.0, 3.0, tf.qint8)[0], want)
    y = tensorflow.dequantize(want, -2.0, 3.0, dtype=tf.bfloat16)
    assert y.dtype == ml_dtypes.bfloat16


@pytest.mark.parametrize("bad", ["int64", "qint4", "s8", np.float32])
def test_tensorflow_refuses_other_types(bad):
    with pytest.raises(
        InvalidDTypeError,
        match=r"Value for attr 'T'.*qint8, quint8, qint16, quint16, qint32 \(or qstream's names",
    ):
        tensorflow.quantize(X, -2.0, 3.0, bad)


@pytest.mark.parametrize("bad", ["float16", "float64", "double", np.float64])
def test_tensorflow_refuses_other_output_types(bad):
    with pytest.raises(
        InvalidDTypeError, match=r"Value for attr 'dtype'.*float, float32, bfloat16"
    ):
        tensorflow.dequantize(np.zeros(3, np.int8), -1.0, 1.0, dtype=bad)


ONNX_QUANTIZED = [
    (TensorProto.INT8, "INT8", "int8"),
    (TensorProto.UINT8, "UINT8", "uint8"),
    (TensorProto.INT16, "INT16", "int16"),
    (TensorProto.UINT16, "UINT16", "uint16"),
    (TensorProto.INT32, "INT32", "int32"),
    (TensorProto.INT4, "INT4", "int4"),
    (TensorProto.UINT4, "UINT4", "uint4"),
    (TensorProto.INT2, "INT2", "int2"),
    (TensorProto.UINT2, "UINT2", "uint2"),
    (TensorProto.FLOAT8E4M3FN, "FLOAT8E4M3FN", "float8_e4m3fn"),
    (TensorProto.FLOAT8E4M3FNUZ, "FLOAT8E4M3FNUZ", "float8_e4m3fnuz"),
    (TensorProto.FLOAT8E5M2, "FLOAT8E5M2", "float8_e5m2"),
    (TensorProto.FLOAT8E5M2FNUZ, "FLOAT8E5M2FNUZ", "float8_e5m2fnuz"),
    (TensorProto.FLOAT4E2M1, "FLOAT4E2M1", "float4_e2m1fn"),
]


@pytest.mark.parametrize(("code", "native", "name"), ONNX_QUANTIZED)
def test_onnx_output_dtype_names(code, native, name):
    want = onnx.quantize_linear(X, np.float32(0.5), output_dtype=code)
    for alias in (native, native.lower(), name, want.dtype, want.dtype.type):
        got = onnx.quantize_linear(X, np.float32(0.5), output_dtype=alias)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize(
    ("code", "native", "name"),
    [
        (TensorProto.FLOAT, "FLOAT", "float32"),
        (TensorProto.FLOAT16, "FLOAT16", "float16"),
        (TensorProto.BFLOAT16, "BFLOAT16", "bfloat16"),
        (TensorProto.DOUBLE, "DOUBLE", "float64"),
    ],
)
def test_onnx_real_type_names(code, native, name):
    x16 = X.astype(np.float16)
    want = onnx.quantize_linear(x16, np.float16(0.3), np.int8(0), precision=code)
    q = np.array([-128, -1, 0, 1, 127], np.int8)
    dq = onnx.dequantize_linear(q, np.float32(0.1), output_dtype=code)
    for alias in (native, native.lower(), name, np.dtype(name)):
        np.testing.assert_array_equal(
            onnx.quantize_linear(x16, np.float16(0.3), np.int8(0), precision=alias), want
        )
        got = onnx.dequantize_linear(q, np.float32(0.1), output_dtype=alias)
        assert got.dtype == dq.dtype
        np.testing.assert_array_equal(got, dq)
    # ONNX's "float" is float32 (NumPy's "float" would be float64)
    assert onnx.dequantize_linear(q, np.float32(0.1), output_dtype="float").dtype == np.float32


@pytest.mark.parametrize(
    "bad", [TensorProto.INT64, "INT64", "int64", "float32", TensorProto.FLOAT, "f4"]
)
def test_onnx_refuses_other_output_types(bad):
    with pytest.raises(InvalidDTypeError, match=r"UINT8, INT8|2 \(UINT8\), 3 \(INT8\)"):
        onnx.quantize_linear(X, np.float32(0.5), output_dtype=bad)


@pytest.mark.parametrize("bad", ["INT8", "int8", TensorProto.INT8, "half"])
def test_onnx_refuses_other_precisions(bad):
    with pytest.raises(InvalidDTypeError, match=r"FLOAT|1 \(FLOAT\)"):
        onnx.quantize_linear(X, np.float32(0.5), precision=bad)
