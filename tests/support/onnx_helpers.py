"""Run single ONNX nodes through the reference evaluator and ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

NP_TO_ONNX = {
    "float32": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "int8": TensorProto.INT8,
    "uint8": TensorProto.UINT8,
    "int16": TensorProto.INT16,
    "uint16": TensorProto.UINT16,
    "int32": TensorProto.INT32,
}


def node_model(op, inputs: dict, attrs: dict, out_type: int, opset=21, domain=""):
    """A model of one node; every input becomes an initializer except ``x`` (a graph input)."""
    names = list(inputs)
    x = inputs[names[0]]
    graph_inputs = [helper.make_tensor_value_info(names[0], _elem(x), None)]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in list(inputs.items())[1:]]
    y = helper.make_tensor_value_info("y", out_type, None)
    node = helper.make_node(op, names, ["y"], domain=domain, **attrs)
    graph = helper.make_graph([node], "g", graph_inputs, [y], initializer=inits)
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model


def _elem(a):
    return onnx.helper.np_dtype_to_tensor_dtype(np.asarray(a).dtype)


def run_reference(model, x):
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(None, {model.graph.input[0].name: x})[0]


def run_ort(model, x):
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {model.graph.input[0].name: x})[0]
