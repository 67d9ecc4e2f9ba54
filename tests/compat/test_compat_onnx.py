"""The ONNX profile against onnx's backend node cases, its reference evaluator and ONNX Runtime."""

import importlib
import warnings

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from qstream.compat import onnx as qonnx

from ..support.onnx_helpers import NP_TO_ONNX, node_model, run_ort, run_reference

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    # ONNX's own node test cases of the three operators: their modules alone (importing one
    # runs its cases' expectations; ``collect_testcases`` runs every operator's, ~4 s of each
    # test process's collection)
    import onnx.backend.test.case.node as node_cases

    for _op in ("quantizelinear", "dequantizelinear", "dynamicquantizelinear"):
        importlib.import_module(f"onnx.backend.test.case.node.{_op}")
    CASES = [c for c in node_cases._NodeTestCases if "quantizelinear" in c.name]


def _arr(v):
    return numpy_helper.to_array(v) if isinstance(v, TensorProto) else np.asarray(v)


def _run_case_node(model, inputs):
    inputs = [_arr(v) for v in inputs]
    graph = model.graph
    if "_expanded" in model.graph.name or len(graph.node) > 1:
        return list(qonnx.dynamic_quantize_linear(*inputs))
    node = graph.node[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "QuantizeLinear":
        return [qonnx.quantize_linear(*inputs, **attrs)]
    if node.op_type == "DequantizeLinear":
        return [qonnx.dequantize_linear(*inputs, **attrs)]
    if node.op_type == "DynamicQuantizeLinear":
        return list(qonnx.dynamic_quantize_linear(*inputs))
    raise AssertionError(node.op_type)


def test_all_33_backend_cases_are_collected():
    assert len(CASES) == 33


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_backend_node_case_is_bit_exact(case):
    for inputs, expected in case.data_sets:
        got = _run_case_node(case.model, inputs)
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            g, e = np.asarray(g), _arr(e)
            assert g.dtype == e.dtype, (g.dtype, e.dtype)
            assert g.shape == e.shape
            np.testing.assert_array_equal(g.view(f"u{g.itemsize}"), e.view(f"u{e.itemsize}"))


SPECIAL = np.array(
    [
        0.5,
        1.5,
        2.5,
        -0.5,
        -1.5,
        -2.5,
        127.5,
        128.5,
        -128.5,
        -129.5,
        3.4e38,
        -3.4e38,
        0.0,
        -0.0,
        0.49999997,
        -0.49999997,
        1e-30,
    ],
    np.float32,
)


def _inputs(rng, n=4000, scale=3.0):
    x = (rng.standard_normal(n) * 200).astype(np.float32)
    # exact ties x / s = k + 0.5 for s = 0.25
    ties = ((rng.integers(-600, 600, 500) + 0.5) * np.float32(0.25)).astype(np.float32)
    return np.concatenate([x, ties, SPECIAL])


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint16"])
@pytest.mark.parametrize("zp_val", [0, 1])
def test_per_tensor_matches_reference_and_ort_on_finite_inputs(dtype, zp_val):
    rng = np.random.default_rng(7)
    x = _inputs(rng)
    zp = np.array(zp_val, dtype)
    for s in (np.float32(0.25), np.float32(0.3), np.float32(7.0)):
        model = node_model("QuantizeLinear", {"x": x, "s": s, "z": zp}, {}, NP_TO_ONNX[dtype])
        got = qonnx.quantize_linear(x, s, zp)
        defined = np.abs(x / s) < 2**31  # the reference's int32 cast is undefined beyond
        np.testing.assert_array_equal(got[defined], run_reference(model, x)[defined])
        np.testing.assert_array_equal(got, run_ort(model, x))


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint16"])
def test_non_finite_inputs_follow_onnx_runtime(dtype):
    x = np.array([np.nan, np.inf, -np.inf, 1e10, -1e10], np.float32)
    zp = np.array(0, dtype)
    model = node_model(
        "QuantizeLinear", {"x": x, "s": np.float32(1), "z": zp}, {}, NP_TO_ONNX[dtype]
    )
    np.testing.assert_array_equal(qonnx.quantize_linear(x, np.float32(1), zp), run_ort(model, x))


def test_zero_and_negative_scale_follow_onnx_runtime():
    x = np.array([-2.0, -0.0, 0.0, 1.0, 3.5], np.float32)
    for s in (np.float32(0), np.float32(-1.5)):
        zp = np.int8(0)
        model = node_model("QuantizeLinear", {"x": x, "s": s, "z": zp}, {}, TensorProto.INT8)
        np.testing.assert_array_equal(qonnx.quantize_linear(x, s, zp), run_ort(model, x))


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_per_axis_matches_reference_and_ort(axis):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 4, 5)) * 50).astype(np.float32)
    d = x.shape[axis]
    s = rng.uniform(0.1, 2, d).astype(np.float32)
    z = rng.integers(-20, 20, d).astype(np.int8)
    model = node_model("QuantizeLinear", {"x": x, "s": s, "z": z}, {"axis": axis}, TensorProto.INT8)
    got = qonnx.quantize_linear(x, s, z, axis=axis)
    np.testing.assert_array_equal(got, run_reference(model, x))
    np.testing.assert_array_equal(got, run_ort(model, x))
    dq = node_model(
        "DequantizeLinear", {"x": got, "s": s, "z": z}, {"axis": axis}, TensorProto.FLOAT
    )
    y = qonnx.dequantize_linear(got, s, z, axis=axis)
    np.testing.assert_array_equal(y, run_reference(dq, got))
    np.testing.assert_array_equal(y, run_ort(dq, got))


@pytest.mark.parametrize(("axis", "block"), [(1, 2), (1, 3), (0, 2), (-1, 4), (2, 5)])
def test_blocked_matches_reference_and_ort(axis, block):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((4, 6, 7)) * 50).astype(np.float32)
    shape = list(x.shape)
    shape[axis] = -(-shape[axis] // block)
    s = rng.uniform(0.1, 2, shape).astype(np.float32)
    z = rng.integers(0, 40, shape).astype(np.uint8)
    attrs = {"axis": axis, "block_size": block}
    model = node_model("QuantizeLinear", {"x": x, "s": s, "z": z}, attrs, TensorProto.UINT8)
    got = qonnx.quantize_linear(x, s, z, **attrs)
    np.testing.assert_array_equal(got, run_reference(model, x))
    np.testing.assert_array_equal(got, run_ort(model, x))
    dq = node_model("DequantizeLinear", {"x": got, "s": s, "z": z}, attrs, TensorProto.FLOAT)
    np.testing.assert_array_equal(qonnx.dequantize_linear(got, s, z, **attrs), run_ort(dq, got))


def test_float16_divides_in_float16_like_the_reference_and_float32_on_request():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(20000) * 100).astype(np.float16)
    s, z = np.float16(0.3), np.int16(0)
    model = node_model("QuantizeLinear", {"x": x, "s": s, "z": z}, {}, TensorProto.INT16)
    np.testing.assert_array_equal(qonnx.quantize_linear(x, s, z), run_reference(model, x))
    ort_style = qonnx.quantize_linear(x, s, z, precision=TensorProto.FLOAT)
    np.testing.assert_array_equal(ort_style, run_ort(model, x))


@pytest.mark.parametrize(
    "name", ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"]
)
@pytest.mark.parametrize("saturate", [0, 1])
def test_float8_matches_reference(name, saturate):
    x = np.array(
        [
            0,
            1,
            -1,
            448,
            449,
            464,
            480,
            500,
            57344,
            60000,
            61440,
            1e6,
            -1e6,
            1e-9,
            np.nan,
            np.inf,
            -np.inf,
            2**-10,
            1.5 * 2**-10,
        ],
        np.float32,
    )
    x = np.concatenate(
        [x, (np.random.default_rng(0).standard_normal(3000) * 300).astype(np.float32)]
    )
    zp = np.zeros((), getattr(ml_dtypes, name))
    elem = getattr(TensorProto, name.upper().replace("FLOAT8_", "FLOAT8"))
    model = node_model(
        "QuantizeLinear", {"x": x, "s": np.float32(1.25), "z": zp}, {"saturate": saturate}, elem
    )
    got = qonnx.quantize_linear(x, np.float32(1.25), zp, saturate=saturate)
    want = run_reference(model, x)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_int32_dequantize_with_zero_point_matches_reference():
    q = np.array([10, 2**31 - 1, -(2**31), 123456789], np.int32)
    z = np.array(3, np.int32)
    s = np.float32(0.37)
    model = node_model("DequantizeLinear", {"x": q, "s": s, "z": z}, {}, TensorProto.FLOAT)
    np.testing.assert_array_equal(qonnx.dequantize_linear(q, s, z), run_reference(model, q))


def test_contrib_ops_match_onnx_runtime():
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((3, 8)) * 30).astype(np.float32)
    s, z = np.float32(0.2), np.uint8(100)
    model = node_model(
        "QuantizeLinear", {"x": x, "s": s, "z": z}, {}, TensorProto.UINT8, domain="com.microsoft"
    )
    got = qonnx.contrib_quantize_linear(x, s, z)
    np.testing.assert_array_equal(got, run_ort(model, x))
    sv = rng.uniform(0.1, 1, 8).astype(np.float32)
    zv = rng.integers(0, 255, 8).astype(np.uint8)
    model = node_model(
        "QuantizeLinear",
        {"x": x, "s": sv, "z": zv},
        {"axis": -1},
        TensorProto.UINT8,
        domain="com.microsoft",
    )
    np.testing.assert_array_equal(
        qonnx.contrib_quantize_linear(x, sv, zv, axis=-1), run_ort(model, x)
    )
    dq = node_model(
        "DequantizeLinear",
        {"x": got, "s": s, "z": z},
        {},
        TensorProto.FLOAT,
        domain="com.microsoft",
    )
    np.testing.assert_array_equal(qonnx.contrib_dequantize_linear(got, s, z), run_ort(dq, got))


def test_onnx_profile_rejects_what_onnx_rejects():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="out of boundary"):
        qonnx.quantize_linear(x, np.ones(3, np.float32), axis=2)
    with pytest.raises(ValueError, match="out of boundary"):
        qonnx.quantize_linear(np.zeros(3, np.float32), np.ones(3, np.float32))
    with pytest.raises(ValueError, match="Mismatched output data-types"):
        qonnx.quantize_linear(x, np.float32(1), np.int8(0), output_dtype=TensorProto.UINT8)
    with pytest.raises(ValueError, match="block_size must be a positive"):
        qonnx.quantize_linear(x, np.ones((2, 2), np.float32), axis=1, block_size=-1)
    with pytest.raises(TypeError, match="Type mismatch"):
        qonnx.dequantize_linear(np.zeros(3, np.int8), np.float32(1), np.uint8(0))
    with pytest.raises(ValueError, match="should be zero for float8"):
        qonnx.dequantize_linear(
            np.zeros(3, ml_dtypes.float8_e4m3fn),
            np.float32(1),
            np.ones((), ml_dtypes.float8_e4m3fn),
        )
