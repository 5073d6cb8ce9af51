"""Hand-built ONNX models for the tests, readable by any onnxruntime that runs their opset."""

from __future__ import annotations

from onnx import helper


def make_model(graph, opset: int):
    """`helper.make_model` at the lowest IR version the opset needs: onnx's default is its own newest IR version,
    which an older onnxruntime refuses (onnx 1.23 writes IR 14; onnxruntime 1.30 reads up to 13)."""
    ops = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=ops, ir_version=helper.find_min_ir_version_for(ops))
