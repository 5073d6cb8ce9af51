"""The `report` stage: one Markdown page (`report/report.md`) and its figures, built only from what
the earlier stages wrote: the overview here, then each stage's own section (its `report` function in the stage
registry, `pipeline/stages/__init__.py`, which hands them to `write_report` in run order). A stage that has not run
returns None and is left out, never filled in.
"""

from __future__ import annotations

from typing import Any, Callable

from pipeline.config import Config
from pipeline.render import table
from pipeline.atomic_io import atomic_write_text
from pipeline.rundir import Output, RunDir

from .verify_report import FRACTIONS_PNG

# The page, and the figures the stages' sections draw beside it (train.py's, verify_report.py's).
OUTPUTS = (Output("report/report.md"), Output("report/validation.png", when="the train stage wrote metrics"),
           Output("report/lambda_<variant>.png", when="the variant has λ"),
           Output(f"report/{FRACTIONS_PNG}", when="the verify stage ran"))


def section_overview(cfg: Config, run: RunDir) -> str:
    m = run.manifest()
    stages = [[name, st.get("status"), st.get("seconds"), st.get("device")] for name, st in m["stages"].items() if name != "report"]
    total = sum(s[2] or 0 for s in stages)
    records = run.variants()
    targets = {v: r.lambda_target for v, r in records.items() if r.lambda_target}
    schedule = ""
    if records:
        e_s = next(iter(records.values())).switch_epoch
        schedule = (f"; λ learned for e_s = {e_s} epochs (t = {cfg.gate.temperature}, c = {cfg.gate.lr_mult}, "
                    f"{cfg.gate.granularity}, init {cfg.gate.init}), then annealed to λ_target ({cfg.harden.criterion}, "
                    f"ε = {cfg.harden.epsilon:g}): " + (", ".join(f"`{v}` {t:.3f}" for v, t in targets.items()) or "no hardened variant"))
    return "\n\n".join([
        f"# Run `{run.path.name}`",
        f"Data `{cfg.data.name}`, model `{cfg.model.name}`, variants {', '.join(f'`{v}`' for v in cfg.variants)}, "
        f"seed {cfg.seed}, {cfg.train.epochs} epochs ({cfg.train.optimizer}, lr {cfg.train.lr}, wd {cfg.train.weight_decay}, "
        f"{cfg.train.schedule} schedule){schedule}.",
        table(["stage", "status", "seconds", "device"], stages) + f"\n\nTotal stage time: {total:.1f} s.",
    ])


def write_report(cfg: Config, run: RunDir, sections: dict[str, Callable[[Config, RunDir], str | None]]) -> dict[str, Any]:
    """The overview, then each stage's section (`sections`: stage name -> its report function, in run order; a stage
    that has not run returns None and is left out, never filled in)."""
    texts = {"overview": section_overview(cfg, run)}
    for name, section in sections.items():
        texts[name] = section(cfg, run)
    parts = [text for text in texts.values() if text]
    atomic_write_text(run.file("report", "report.md"), "\n\n".join(parts) + "\n")
    return {"sections": [k for k, text in texts.items() if text]}
