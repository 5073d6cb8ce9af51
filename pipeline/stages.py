"""The stage registry: every stage of a run, in run order, as data. A stage is `run(cfg, run) -> metrics`
that writes only under its own directory; it may name a `report` section `(cfg, run) -> Markdown | None`
and a `validate(cfg)` hook for its own config section. Targets are "module:function" strings, imported
on use, so `pipeline stages` stays fast and this module imports no stage: the runner (`runner.py`) and
the report stage resolve them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from . import activations, data, models, plugins
from .config import Config, check_choice
from .config import validate as validate_fields
from .errors import PipelineError


def resolve(target: str) -> Callable[..., Any]:
    """The function a "module:function" target names."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Stage:
    run: str  # "module:function" -> metrics dict
    directory: str  # where the stage writes (train and harden share train/)
    help: str
    report: str | None = None  # "module:function" -> this stage's section of report.md (None: no section of its own)
    validate: str | None = None  # "module:function" -> raises ConfigError for a bad setting of its own section

    def fn(self) -> Callable[[Config, Any], dict[str, Any]]:
        return resolve(self.run)


# In run order.
STAGES: dict[str, Stage] = {
    "train": Stage("pipeline.train:run_train", "train", "learn weights and λ for the first 25% of epochs (Algorithm 1, line 1)",
                   report="analysis.report:section_training"),
    "harden": Stage("pipeline.train:run_harden", "train", "freeze s, anneal λ linearly to λ_target, keep the best-validation checkpoint"),
    "check": Stage("analysis.check:run_check", "check", "bounds: sympy closed forms, per-layer check on validation pre-activations, swap certificate",
                   report="analysis.check:report_section"),
    "swap": Stage("pipeline.swap:run_swap", "swap", "replace every gate of the best checkpoint by ReLU and re-evaluate, no weight update",
                  report="analysis.report:section_swap"),
    "export": Stage("quantize.export:run_export", "export", "fp32 ONNX (opset 20, onnxsim, dynamic batch) of the smooth and the swapped models, checked against PyTorch",
                    report="quantize.export:report_section"),
    "int8": Stage("quantize.int8:run_int8", "quantize", "onnxruntime static int8 (QDQ, per-channel): accuracy, size, latency, op counts, SQNR",
                  report="quantize.int8:report_section"),
    "sparsity": Stage("analysis.sparsity:run_sparsity", "sparsity", "APoZ of the swapped ReLU models, dead units pruned losslessly and exported",
                      report="analysis.sparsity:report_section"),
    "verify": Stage("analysis.verify:run_verify", "verify", "L∞ robustness of the swapped ReLU and the smooth models (VNN-COMP layout, staged verifier, tight bounds)",
                    report="analysis.verify:report_section", validate="analysis.verify:validate_config"),
    "report": Stage("analysis.report:run_report", "report", "report.md with tables and figures from every stage above"),
}


# Stages every torchrun rank runs together (data-parallel training); the others run on rank 0 only.
DISTRIBUTED = {"train", "harden"}


def check_names(names: list[str], key: str = "stages") -> None:
    for n in names:
        check_choice(key, n, STAGES)


def validate(cfg: Config) -> Config:
    """Everything a run checks before it starts: fields, registry names (plug-ins registered first), and each
    stage's own hook."""
    validate_fields(cfg)
    plugins.load()
    data.check_config(cfg.data)
    models.check_config(cfg.model)
    activations.check_names(cfg.variants)
    check_names(cfg.stages)
    for stage in STAGES.values():
        if stage.validate:
            resolve(stage.validate)(cfg)
    return cfg


def selected(cfg: Config) -> list[str]:
    return [s for s in STAGES if not cfg.stages or s in cfg.stages]


def expand_redo(names: list[str]) -> list[str]:
    """Redoing a stage redoes every later one, and starts at the first stage sharing its directory."""
    order = list(STAGES)
    for n in names:
        if n not in STAGES:
            raise PipelineError(f"--redo {n}: unknown stage; choose from {', '.join(order)}")
    if not names:
        return []
    first = min(order.index(n) for n in names)
    first = min(i for i, s in enumerate(order) if STAGES[s].directory == STAGES[order[first]].directory)
    return order[first:]
