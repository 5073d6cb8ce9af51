"""The stages of `pipeline run`, one module each in this package, and their registry: `STAGES` below lists them in run
order as data. A stage is `run(cfg, run) -> metrics`, a thin entry that reads its inputs from the run directory, calls
the library (`pipeline/`, `quantize/`, `analysis/`) and writes only under its own directory; it may have a `report`
section `(cfg, run) -> Markdown | None` and a `validate(cfg)` hook for its own config section, and it declares the
config sections it reads and the files it writes (its module's `OUTPUTS`, `pipeline.rundir.Output`; the runner checks
every stage's writes against them, `check_outputs`).

This module is the one place a stage is registered: its functions are imported, never named by strings, so a reader
(or an IDE) follows `pipeline run` from here into each stage and on into the library. `tests/test_layout.py` fails on
a `Stage` made anywhere else, and on a "module:function" string. The package is the top layer with the runner and the
CLI: it imports `analysis` and `quantize`; nothing below it imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pipeline.config import Config, check_choice
from pipeline.devices import resolve as resolve_device
from pipeline.errors import PipelineError
from pipeline.rundir import Output, RunDir

from . import check, downstream, export, int8, report, sparsity, swap, train, verify, verify_report

Run = Callable[[Config, RunDir], dict[str, Any]]
Section = Callable[[Config, RunDir], "str | None"]


@dataclass(frozen=True)
class Stage:
    run: Run  # -> the metrics recorded in the manifest
    directory: str  # where the stage writes (train and harden share train/)
    help: str  # what it does; "{cfg.<section>.<key>}" fields are filled from the run's config (`describe`)
    reads: tuple[str, ...]  # the config sections it reads: a --resume override of one takes effect from the first reader
    outputs: tuple[Output, ...]  # every file it writes under the run directory (its module's OUTPUTS)
    report: Section | None = None  # this stage's section of report.md (None: no section of its own)
    validate: Callable[[Config], None] | None = None  # raises ConfigError for a bad setting of its own section
    # Where its work runs, recorded in the manifest: (device, what) pairs; "run" is the run's device (`device=`, resolved
    # once by the runner and handed on as RunDir.device), "cpu" work that is about the CPU or runs in onnxruntime there,
    # "section.key" the device a config key names (verify.device).
    where: tuple[tuple[str, str], ...] = (("run", ""),)

    def device(self, run_device: str, cfg: Config | None = None) -> str:
        """The device(s) the stage really uses on a run whose device is `run_device`, e.g. "cuda (per-layer statistics),
        cpu (swap certificate)"; one name when every part runs on one device."""
        def name(dev: str) -> str:
            if dev == "run":
                return run_device
            if "." in dev:  # a config key naming a device ("auto" resolved as the stage resolves it)
                section, key = dev.split(".")
                return str(resolve_device(getattr(getattr(cfg if cfg is not None else Config(), section), key)))
            return dev

        parts = [(name(dev), what) for dev, what in self.where]
        if len({d for d, _ in parts}) == 1:
            return parts[0][0]
        return ", ".join(f"{d} ({what})" if what else d for d, what in parts)

    def describe(self, cfg: Config | None = None) -> str:
        """`help` with the config's values (the defaults without one)."""
        return self.help.format(cfg=cfg if cfg is not None else Config())


def run_report(cfg: Config, run: RunDir) -> dict[str, Any]:
    """The report stage: the overview, then every stage's own section in run order (`report.write_report`)."""
    return report.write_report(cfg, run, {name: stage.report for name, stage in STAGES.items() if stage.report})


_MODEL = ("seed", "variants", "data", "model", "gate", "train")  # what builds and trains a variant
# In run order.
STAGES: dict[str, Stage] = {
    "train": Stage(train.run_train, "train",
                   "learn weights and λ for epochs 1..e_s, e_s = ⌊{cfg.train.switch_fraction:g}·T⌋ (Algorithm 1, line 1)",
                   _MODEL, train.OUTPUTS["train"], report=train.report_section),
    "harden": Stage(train.run_harden, "train",
                    "epochs e_s+1..T by harden.method={cfg.harden.method} (anneal: λ linearly to λ_target; swap: ReLU, "
                    "fine-tuned); keep the checkpoint harden.select={cfg.harden.select} picks", (*_MODEL, "harden"),
                    train.OUTPUTS["harden"]),
    "check": Stage(check.run_check, "check", "bounds: sympy closed forms, per-layer check on validation pre-activations, swap certificate",
                   ("variants", "data", "harden", "check"), check.OUTPUTS, report=check.report_section,
                   where=(("run", "per-layer statistics, the float32 Jacobian bound's arithmetic"),
                          ("cpu", "the certificate's walks: statements about CPU runs"))),
    "swap": Stage(swap.run_swap, "swap", "replace every gate of the selected checkpoint by ReLU and re-evaluate, no weight update",
                  ("variants", "data", "train"), swap.OUTPUTS, report=swap.report_section),
    "export": Stage(export.run_export, "export", "fp32 ONNX (opset {cfg.export.opset}, onnxsim, dynamic batch) of the smooth and "
                    "the swapped models, checked against PyTorch", ("variants", "data", "export"), export.OUTPUTS,
                    report=export.report_section,
                    where=(("cpu", ""),)),
    "int8": Stage(int8.run_int8, "quantize", "onnxruntime static int8 (QDQ, per-channel): accuracy, size, latency, op counts, SQNR",
                  ("variants", "data", "export", "quantize"), int8.OUTPUTS, report=int8.report_section,
                  where=(("cpu", "onnxruntime"),)),
    "sparsity": Stage(sparsity.run_sparsity, "sparsity", "APoZ of the swapped ReLU models, dead units pruned losslessly and exported",
                      ("variants", "data", "export", "quantize", "sparsity"), sparsity.OUTPUTS, report=sparsity.report_section,
                      where=(("run", "APoZ pass"), ("cpu", "pruning, its check and export"))),
    "verify": Stage(verify.run_verify, "verify", "L∞ robustness of the swapped ReLU, int8 and smooth models (VNN-COMP layout, staged verifier, tight bounds)",
                    ("variants", "data", "export", "quantize", "verify"), verify.OUTPUTS, report=verify_report.report_section,
                    validate=verify.validate_config,
                    where=(("verify.device", "bound passes and branch and bound"),
                           ("cpu", "the MILP, onnxruntime's replays of witnesses"))),
    "downstream": Stage(downstream.run_downstream, "downstream",
                        "per shipped network: certified radius per sample by bisection (float ReLU and int8), unstable "
                        "ReLUs after one CROWN pass per ε, pruned vs unpruned latency; with the int8, sparsity and verify "
                        "stages' numbers (downstream.json)",
                        ("variants", "data", "export", "quantize", "sparsity", "verify", "downstream"), downstream.OUTPUTS,
                        report=downstream.report_section, validate=downstream.validate_config,
                        where=(("cpu", ""),)),
    "report": Stage(run_report, "report", "report.md with tables and figures from every stage above", _MODEL, report.OUTPUTS,
                    where=(("cpu", ""),)),
}


def check_outputs(name: str, run: RunDir, variants: list[str], written: dict[str, str]) -> str | None:
    """One line when a stage has written a file its declaration does not name, or finished without a file it declares it
    always writes (either is a bug in the stage); None when its files match its declaration."""
    stage = STAGES[name]
    where = "its OUTPUTS (its module in pipeline/stages/)"
    stray = [rel for rel in written if not any(o.matches(rel) for o in stage.outputs)]
    if stray:
        return (f"the {name} stage wrote {stray[0]}, which {where} do not declare: a bug in the stage, declare it there "
                f"({len(stray)} undeclared file{'s' if len(stray) > 1 else ''})")
    missing = [p for o in stage.outputs for p in o.missing(run, variants)]
    if missing:
        return (f"the {name} stage finished without writing {missing[0]}, which {where} say it always writes: a bug in "
                f"the stage ({len(missing)} missing)")
    return None


def first_readers() -> dict[str, str]:
    """Config section -> the first stage (in run order) that reads it: where a --resume override of it takes effect."""
    out: dict[str, str] = {}
    for name, stage in STAGES.items():
        for section in stage.reads:
            out.setdefault(section, name)
    return out


# Stages every torchrun rank runs together (data-parallel training); the others run on rank 0 only.
DISTRIBUTED = {"train", "harden"}


def check_names(names: list[str], key: str = "stages") -> None:
    for n in names:
        check_choice(key, n, STAGES)


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
