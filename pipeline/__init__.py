"""λ-GELU training, hardening and ReLU-ization pipeline.

The library API for a model of your own (README, "Use it on your own model"):

    from pipeline import to_gates, Hardener, swap_report, to_relu
    model, report = to_gates(model)          # nn.GELU / nn.SiLU / F.gelu attributes -> hardenable gates
    hardener = Hardener(model, epochs=T)     # Algorithm 1 inside your loop
    swap_report(model, (x, y))               # what the swap to ReLU changes
    to_relu(model)                           # every gate -> ReLU

Check, export, quantize and verify a model: `analysis.api`. Names resolve on first use, so `import pipeline` stays light.
It also makes torchvision importable beside a CPU-only torch (`pipeline.extras`), so that `import timm` and
`from transformers import …` work after it with no call.
"""

from . import extras

__version__ = "0.1.0"
extras.install()

# public name -> "module:attribute"
_EXPORTS = {
    "to_gates": "pipeline.convert:to_gates",
    "ConvertReport": "pipeline.convert:ConvertReport",
    "to_relu": "pipeline.relu_swap:to_relu",
    "swap_report": "pipeline.relu_swap:swap_report",
    "Hardener": "pipeline.hardener:Hardener",
    "GateConfig": "pipeline.config:GateConfig",
    "as_split": "pipeline.data:as_split",
    "Split": "pipeline.data:Split",
}
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
    import importlib

    module, _, attr = _EXPORTS[name].partition(":")
    return getattr(importlib.import_module(module), attr)
