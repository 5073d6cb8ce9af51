"""timm and Hugging Face transformers, the optional extra (`pip install -e ".[models]"`): one import of each that the
library, its tests, docs and benchmarks share.

timm imports torchvision unconditionally, transformers' model classes where it is installed (`timm/layers/create_norm.py`, `norm_act.py`: FrozenBatchNorm2d). The
torchvision wheel that matches a CPU-only torch on PyPI is a CUDA build: its C ops cannot load without libtorch_cuda,
and then its `_meta_registrations.py` stops the import with `RuntimeError: operator torchvision::nms does not exist`.
Only its pure-Python parts are needed by timm, so where (and only where) that import fails, `import_timm` defines the
two op schemas that module registers fake kernels for, and imports it again. A working torchvision is never touched.
"""

from __future__ import annotations

import sys
from types import ModuleType

import torch

_SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
            "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_library: list[torch.library.Library] = []  # the schemas live as long as their Library object


def _missing_ops(exc: BaseException) -> bool:
    return "torchvision::" in str(exc) and "does not exist" in str(exc)


def import_torchvision() -> ModuleType:
    """torchvision, importable where its C ops are not (a CUDA wheel beside a CPU torch): see the module docstring."""
    try:
        import torchvision
        return torchvision
    except RuntimeError as exc:
        if not _missing_ops(exc):
            raise
    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
        del sys.modules[name]  # the failed import's half-made modules
    if not _library:
        lib = torch.library.Library("torchvision", "DEF")
        for schema in _SCHEMAS:
            lib.define(schema)
        _library.append(lib)
    import torchvision
    return torchvision


def import_timm() -> ModuleType:
    """timm (a one-line ImportError naming the extra when it is not installed)."""
    try:
        import_torchvision()
    except ImportError:
        pass  # timm says itself what it misses
    try:
        import timm
    except ImportError as exc:
        raise ImportError(f"timm is not installed ({exc}): pip install -e '.[models]'") from None
    return timm


def import_transformers() -> ModuleType:
    """transformers (a one-line ImportError naming the extra when it is not installed). Its model classes import
    torchvision where it is installed (`image_utils`), so the same repair applies."""
    try:
        import_torchvision()
    except ImportError:
        pass
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(f"transformers is not installed ({exc}): pip install -e '.[models]'") from None
    return transformers
