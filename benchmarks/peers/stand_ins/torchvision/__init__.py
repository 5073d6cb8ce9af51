"""A stand-in for torchvision, put first on PYTHONPATH when a peer ONNX loader runs (benchmarks/peers/readers.py).

onnx2pytorch 0.6.0 and onnx2torch 1.5.15 require torchvision and import it at the top of the modules of a few image
and detection ops (NonMaxSuppression, RoiAlign, MaxRoiPool, DeformConv, ImageDecoder). PyPI's torchvision 0.28.0, the
build for torch 2.13, fails at import on the CPU torch ("operator torchvision::nms does not exist"). α,β-CROWN imports
its `datasets` and `transforms` at the top of its data loading, used only for its built-in image datasets, never for
a VNN-COMP instance's ONNX + VNN-LIB. None of the graphs we ship has one of those ops: here every name exists and raises when it is used, so such a graph fails in its own terms.
"""

from __future__ import annotations


class Missing:
    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise ImportError(f"torchvision.{self._name}: torchvision is a stand-in here (benchmarks/peers/stand_ins)")

    def __getattr__(self, attr: str) -> Missing:
        return Missing(f"{self._name}.{attr}")


def __getattr__(name: str) -> Missing:
    return Missing(name)
