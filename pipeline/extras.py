"""timm and Hugging Face transformers, the optional extra (`pip install -e ".[models]"`): one import of each that the
library, its tests, docs and benchmarks share, and the repair of torchvision's import that both need.

timm imports torchvision unconditionally, transformers' model classes where it is installed (`timm/layers/create_norm.py`, `norm_act.py`: FrozenBatchNorm2d). The
torchvision wheel that matches a CPU-only torch on PyPI is a CUDA build: its C ops cannot load without libtorch_cuda,
and then its `_meta_registrations.py` stops the import with `RuntimeError: operator torchvision::nms does not exist`.
Only its pure-Python parts are needed by timm and transformers, so where (and only where) its C ops did not load,
the two op schemas that module registers fake kernels for are defined before it runs (`define_missing_ops`). A
working torchvision is never touched.

`import pipeline` installs `TorchvisionRepair` on `sys.meta_path` (`install`): a finder that does nothing but, when
`torchvision._meta_registrations` is about to be imported, define the schemas where the ops are missing. So any
`import timm` or `from transformers import …` after `import pipeline` works, in any process, with no call and no
cost to `import pipeline` (torch is not imported by it).
"""

from __future__ import annotations

import sys
from types import ModuleType

_SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
            "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_library: list = []  # the schemas live as long as their torch.library.Library object
_META = "torchvision._meta_registrations"  # the module that fails where the C ops are missing


def _missing_ops(exc: BaseException) -> bool:
    return "torchvision::" in str(exc) and "does not exist" in str(exc)


def define_missing_ops() -> None:
    """Define torchvision's nms/qnms schemas, once, where its C ops did not load (a CUDA wheel beside a CPU torch)."""
    import torch

    if _library or hasattr(torch.ops.torchvision, "nms"):  # defined already, by its C ops or by us
        return
    lib = torch.library.Library("torchvision", "DEF")
    for schema in _SCHEMAS:
        lib.define(schema)
    _library.append(lib)


class TorchvisionRepair:
    """A meta path finder that finds nothing: it defines the missing op schemas just before torchvision imports the
    module that needs them, after its own C ops had their chance to load (`torchvision.extension`)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == _META:
            extension = sys.modules.get("torchvision.extension")
            if extension is not None and not extension._has_ops():
                define_missing_ops()
        return None  # the ordinary finders import it

    @staticmethod
    def invalidate_caches() -> None:
        pass


def install() -> None:
    """Put `TorchvisionRepair` on sys.meta_path (once; `import pipeline` calls this)."""
    if TorchvisionRepair not in sys.meta_path:
        sys.meta_path.insert(0, TorchvisionRepair)


def import_torchvision() -> ModuleType:
    """torchvision, importable where its C ops are not (a CUDA wheel beside a CPU torch): see the module docstring.
    A torchvision whose import failed before the repair was installed is imported again."""
    install()
    try:
        import torchvision
        return torchvision
    except RuntimeError as exc:
        if not _missing_ops(exc):
            raise
    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
        del sys.modules[name]  # the failed import's half-made modules
    define_missing_ops()
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
