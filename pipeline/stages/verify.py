"""The verify stage: L∞ local robustness of every variant, in the VNN-COMP layout, for the swapped ReLU network, its
int8 model and the smooth network the user trained. The properties and which network each certificate is about:
`analysis/robustness/properties.py`; what the answers say together: `analysis/robustness/chain.py`; the engine that
decides them: `analysis/verification/`; the stage's section of report.md: `pipeline/stages/verify_report.py`.

Time: one budget for the float networks' properties (``verify.budget_s``, ReLU and smooth; wall seconds, or CPU
seconds with ``verify.cpu_time``, as every limit of the stage), shared
through the one property loop (`analysis.verification.harness.StageBudget`): first one bound pass for every property
(CROWN, the properties of a network batched; then α-CROWN where there is time), its cost measured on each network's
first property; when the budget cannot cover one pass per property, one line in the log says so with the budget
that would. Then rounds of growing per-property limits for what is still open (the attack a probe with its own small
share, then branch and bound), the properties nearest to a decision first, so easy properties finish first and the
time they leave goes to the hard ones; then the int8 models' properties the same way under their own
``verify.int8_budget_s``, so that what they add to the stage is bounded apart. ``verify.timeout_s`` > 0 caps any one
property. ``verify.jobs`` worker processes (0: the run's thread count) solve properties side by side, on
``verify.device``.

Reads: the export stage's verifiers' form of each ReLU model (`export/export.json`), `train/<variant>/best.pt`,
`quantize/quantize.json` and its int8 files, each variant's record, the validation split. Writes under ``verify/``
(`OUTPUTS`): ``onnx/<variant>.onnx`` (a copy of its network's file, so the folder stands alone as a benchmark),
``vnnlib/<variant>_<sample>_<eps>.vnnlib``, ``instances.csv`` (``onnx,vnnlib,timeout``: the budget's fair share per
property, at least what its network's first bound pass needs as measured (`harness.PASS_SHARE` of the limit, rounded up
to a second), or the cap), ``results.csv`` (VNN-COMP: ``category,onnx,vnnlib,prepare_time,result,run_time``, the
category being the variant), ``counterexamples/*.counterexample`` (VNN-COMP witnesses), ``details.csv`` (per property:
stage that decided, why an open one is open (``reason``: ``budget`` when no bound pass finished in its time, ``timeout``
when the search after it ran out, ``unknown``, ``error``; `analysis.verification.problem.open_reason`), wall and CPU
seconds (all it spent: its share of the first pass and its turns), unstable ReLUs by IBP and by the tight bounds, the
best bound pass that finished and its margin lower bound, message), ``smooth.csv`` (the same per route), ``chain.csv``,
``summary.json`` (with each part's first pass: the measured cost of one pass per network, whether the budget covered
it). A further verifier in ``verify.verifiers`` writes ``results.<name>.csv`` beside.

Resumable per property: ``details.csv`` and ``smooth.csv`` are rewritten as answers arrive; a rerun keeps the
rows marked final and solves the rest.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from analysis.robustness.chain import (CHAIN_FIELDS, chain_rows, conflicts, decided, either_route, not_verified,
                                       open_rows)
from analysis.robustness.properties import (INT8, INT8_NETWORK, RELU_NETWORK, ROUTES, SMOOTH_NETWORK, Kind, Network,
                                            RunFacts, Samples, eps_units, is_int8, relu_properties,
                                            smooth_properties)
from analysis.verification import harness, registry
from analysis.verification.vnncomp import results_row, write_results, write_witness
from analysis.verification.vnnlib import format_real, write_instances_csv
from pipeline.atomic_io import atomic_write_csv, atomic_write_json
from pipeline.config import Config, ConfigError
from pipeline.data import dataset_for
from pipeline.errors import RunDirError
from pipeline.progress import Progress
from pipeline.rundir import Output, RunDir

DETAIL_FIELDS = ["variant", "sample", "eps", "verifier", "label", "predicted", "result", "reason", "stage", "seconds",
                 "cpu_seconds", "prepare_seconds", "unstable_ibp", "unstable_tight", "relus", "bound", "margin_lb",
                 "vnnlib", "witness", "final", "message"]
SMOOTH_FIELDS = ["variant", "sample", "eps", "route", "network", "label", "predicted", "result", "reason", "stage",
                 "seconds", "bound", "margin_lb", "gap_max", "final", "message"]
OUTPUTS = (*(Output(f"verify/{f}") for f in ("instances.csv", "results.csv", "details.csv", "smooth.csv", "chain.csv", "summary.json")),
           Output("verify/results.*.csv", when="a further verifier in verify.verifiers"),
           *(Output(f, when="a network is verified") for f in ("verify/onnx/*.onnx", "verify/vnnlib/*.vnnlib")),
           Output("verify/counterexamples/*.counterexample", when="a property is falsified"))
PROGRESS_EVERY_S = 5.0  # at most one progress line in the log this often (and the last one)


def validate_config(cfg: Config) -> None:
    """ConfigError (one line) for bad verify.* settings: the one validation of this section."""
    v = cfg.verify
    if v.samples < 1:
        raise ConfigError(f"verify.samples must be >= 1, got {v.samples}")
    if not v.budget_s > 0:
        raise ConfigError(f"verify.budget_s must be > 0 (seconds for the whole stage), got {v.budget_s}")
    if v.int8 and not v.int8_budget_s > 0:
        raise ConfigError(f"verify.int8_budget_s must be > 0 (seconds for the int8 properties), got {v.int8_budget_s}; "
                          "or verify.int8=false")
    if v.timeout_s < 0:
        raise ConfigError(f"verify.timeout_s must be >= 0 (a cap per property; 0 = none), got {v.timeout_s}")
    if v.jobs < 0:
        raise ConfigError(f"verify.jobs must be >= 0 (0 = the run's thread count), got {v.jobs}")
    harness.resolve_device(v.device, setting="verify.device=")  # a DeviceError is a ConfigError in the setting's words
    if not v.epsilons or not all(e > 0 for e in v.epsilons):
        raise ConfigError(f"verify.epsilons must be a non-empty list of radii > 0, got {v.epsilons}")
    if not v.verifiers:
        raise ConfigError("verify.verifiers must name at least one verifier, e.g. verify.verifiers=auto")
    clash = [name for name in cfg.variants if is_int8(name)] if v.int8 else []
    if clash:
        raise ConfigError(f"variant {clash[0]!r}: names ending in {INT8!r} are the verify stage's int8 models; register the "
                          "activation under another name, or set verify.int8=false")
    for name in v.verifiers:
        try:
            registry.check_name(name)
        except ValueError as e:
            raise ConfigError(f"verify.verifiers: {e}") from None


def _r(v: Any) -> Any:
    return "" if v is None else round(float(v), 6)


def run_verify(cfg: Config, run: RunDir) -> dict[str, Any]:
    vcfg = cfg.verify  # validated once, by the runner (`validate_config` is the stage's hook)
    out = run.dir("verify")
    ds = dataset_for(cfg)
    samples = Samples.of(ds, vcfg.samples)
    n = samples.n
    clock = "cpu" if vcfg.cpu_time else "wall"
    names = list(dict.fromkeys(vcfg.verifiers))
    jobs = vcfg.jobs or torch.get_num_threads()
    device = harness.resolve_device(vcfg.device, setting="verify.device=")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small matrices: one thread is as fast, and the workers share the cores
    try:
        facts = run_facts(cfg, run)
        relu = relu_properties(facts, out, samples, names)
        smooth = smooth_properties(facts, out, samples) if vcfg.smooth else Kind("smooth", {}, [], {})
        share = {False: vcfg.timeout_s or vcfg.budget_s / max(1, relu.open(int8=False) + smooth.open()),
                 True: vcfg.timeout_s or vcfg.int8_budget_s / max(1, relu.open(int8=True))}
        write_instances_csv(out / "instances.csv", [(o, v, round(share[i8], 3)) for o, v, i8 in relu.instances])
        seconds, int8_wall, passes = _solve(vcfg, out, names, relu, smooth, clock, jobs, device)
        if not vcfg.timeout_s:  # no instance's limit below what its network's first bound pass needs
            need = {name: c["limit_s"] for rec in passes.values() for name, c in rec["costs"].items()}
            write_instances_csv(out / "instances.csv", [
                (o, v, round(max(share[i8], need.get(Path(o).name, 0)), 3)) for o, v, i8 in relu.instances])
    finally:
        torch.set_num_threads(threads)
    verified = [name for name, m in relu.models.items() if m.get("onnx")]
    relu_rows = [relu.rows[k] for k in sorted(relu.rows, key=relu.order.__getitem__)]
    smooth_rows = [smooth.rows[k] for k in sorted(smooth.rows, key=smooth.order.__getitem__)]
    table_ = [r for r in harness.summarize(relu_rows, ("variant", "eps", "verifier")) if r["variant"] in verified]
    for r in table_:
        r["eps"] = float(r["eps"])
        r["relus"] = relu.models[r["variant"]]["relus"]
    smooth_table = harness.summarize(smooth_rows, ("variant", "eps", "route"))
    for r in smooth_table:
        r["eps"] = float(r["eps"])
    missing = not_verified(relu.models, smooth.models)
    for model, why in missing.items():  # at the stage's end, one line each: never in silence
        print(f"    verify: NOT VERIFIED {model}: {why}")
    summary = {
        "networks": {"relu": RELU_NETWORK, "smooth": SMOOTH_NETWORK, "int8": INT8_NETWORK},
        "not_verified": missing,
        "samples": n, "sample_selection": f"the first {n} validation examples, the same for every variant",
        "epsilons": list(vcfg.epsilons), "input_range": [samples.info.input_low, samples.info.input_high],
        "eps_units": eps_units(samples.info),
        "budget_s": vcfg.budget_s, "int8_budget_s": vcfg.int8_budget_s if vcfg.int8 else 0.0, "timeout_s": vcfg.timeout_s,
        "jobs": jobs, "device": device, "solve_seconds": round(seconds, 3), "int8_solve_seconds": round(int8_wall, 3),
        "first_pass": passes,
        "clock": clock, "verifiers": names, "chains": {v: registry.resolve(v) for v in names},
        "models": relu.models, "smooth_models": smooth.models, "table": table_, "smooth_table": smooth_table,
        "decided": {"relu": decided([r for r in relu_rows if not is_int8(r["variant"])]),
                    "int8": decided([r for r in relu_rows if is_int8(r["variant"])]),
                    "smooth": decided(either_route(smooth_rows)),
                    "smooth_routes": {route: decided([r for r in smooth_rows if r["route"] == route]) for route in ROUTES}},
        "int8_seconds": round(sum(float(r.get("seconds") or 0) for r in relu_rows if is_int8(r["variant"])), 3),
        "chain": chain_rows(cfg.variants, relu_rows, smooth_rows, names[0]),
        "open": open_rows(relu_rows, smooth_rows, names[0]),
        "conflicts": conflicts(relu_rows), "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    atomic_write_csv(out / "chain.csv", summary["chain"], CHAIN_FIELDS)
    atomic_write_json(out / "summary.json", summary)
    return {"verifiers": names, "samples": n, "conflicts": len(summary["conflicts"]), "solve_seconds": round(seconds, 3),
            "decided": summary["decided"], "not_verified": missing,
            "certified": {f"{r['variant']}/{format_real(r['eps'])}/{r['verifier']}": round(r["certified_fraction"], 4)
                          for r in table_},
            "smooth_certified": {f"{r['variant']}/{format_real(r['eps'])}/{r['route']}": round(r["certified_fraction"], 4)
                                 for r in smooth_table}}


def run_facts(cfg: Config, run: RunDir) -> RunFacts:
    """What the property builders read of the run: each variant's record, networks and the verify settings."""
    v = cfg.verify
    exported = (run.read_json("export", "export.json") or {}).get("models", {})
    quantized = (run.read_json("quantize", "quantize.json") or {}) if v.int8 else {}
    nets = []
    for name in cfg.variants:
        rec = run.variant(name)
        form = (exported.get(name) or {}).get("relu", {}).get("verifiers") if rec.swapped_to is not None else None
        if rec.swapped_to is not None and form is None:
            raise RunDirError(f"{run.path}: export/export.json has no verifiers' form of {name}'s ReLU model (the "
                              f"export stage writes it); run `pipeline run --resume {run.path} --redo export`")
        int8 = (quantized.get("models", {}).get(name) or {}).get("relu")
        nets.append(Network(name, rec.activation, form, int8["int8_path"] if int8 else None,
                            str(Path("train", name, "best.pt")) if rec.smooth else None))
    return RunFacts(run.path, tuple(nets), tuple(v.epsilons), v.timeout_s or None, v.int8,
                    quantized.get("settings", {}).get("reduce_range", False))


def _solve(vcfg, out: Path, names: list[str], relu: Kind, smooth: Kind, clock: str, jobs: int,
           device: str = "cpu") -> tuple[float, float, dict[str, Any]]:
    """Every open property through the one property loop: the float networks' under `verify.budget_s`, then the int8
    models' (`relu.int8`) under `verify.int8_budget_s`; the CSVs rewritten as answers come. Returns the wall seconds of
    both, of the int8 part, and each part's first pass (`FirstPass.record`). When a budget cannot cover one bound pass per
    property (measured on each network's first), one line says so with the budget that would."""
    tasks = relu.tasks + smooth.tasks
    is_relu = {t.key: True for t in relu.tasks} | {t.key: False for t in smooth.tasks}

    def save() -> None:
        rows = [relu.rows[k] for k in sorted(relu.rows, key=relu.order.__getitem__)]
        atomic_write_csv(out / "details.csv", rows, DETAIL_FIELDS)
        for i, name in enumerate(names):
            mine = [r for r in rows if r["verifier"] == name and r["result"]]
            write_results(out / ("results.csv" if i == 0 else f"results.{name}.csv"),
                          [results_row(r["variant"], f"onnx/{r['variant']}.onnx", r["vnnlib"], r, r.get("prepare_seconds") or 0.0)
                           for r in mine])
        atomic_write_csv(out / "smooth.csv", [smooth.rows[k] for k in sorted(smooth.rows, key=smooth.order.__getitem__)],
                         SMOOTH_FIELDS)

    def done(o: harness.Outcome) -> None:
        res = o.result
        common = o.row()
        common.update(seconds=round(res.seconds, 4), margin_lb=_r(common["margin_lb"]), final=int(o.final),
                      message=res.message.replace("\n", " "))
        if is_relu[o.key]:
            row = relu.rows[o.key]
            row.update(common, cpu_seconds=round(res.cpu_seconds, 4), prepare_seconds=round(o.prepare_seconds, 4),
                       unstable_ibp=res.info.get("unstable_ibp", ""), unstable_tight=res.info.get("unstable_tight", ""),
                       witness="")
            if res.status == "sat" and o.final:
                wfile = write_witness(out / "results.csv", f"onnx/{row['variant']}.onnx", row["vnnlib"], res)
                row["witness"] = wfile.relative_to(out).as_posix()
        else:
            smooth.rows[o.key].update(common, gap_max=_r(res.info.get("gap_max")))
        save()

    save()
    started = time.perf_counter()
    int8_seconds = 0.0
    passes: dict[str, Any] = {}
    if tasks:
        finished: dict[str, int] = {}
        with Progress("verify", len(tasks), "property", every_s=PROGRESS_EVERY_S) as bar:
            def done_and_shown(o: harness.Outcome) -> None:
                done(o)
                if o.final:
                    finished[o.result.status] = finished.get(o.result.status, 0) + 1
                    bar.step(line=f"    verify: {sum(finished.values())}/{len(tasks)} properties final ("
                                  + ", ".join(f"{k} {n}" for k, n in sorted(finished.items())) + ")")

            for int8, budget, setting in ((False, vcfg.budget_s, "verify.budget_s"),
                                          (True, vcfg.int8_budget_s, "verify.int8_budget_s")):
                part = [t for t in tasks if (t.key in relu.int8) == int8]
                t0 = time.perf_counter()
                if part:
                    ran = harness.run(part, harness.StageBudget(budget), jobs=jobs, clock=clock, on_done=done_and_shown,
                                      device=device, setting=f"{setting}=", note=lambda line: bar.note(f"    verify: {line}"))
                    passes["int8" if int8 else "float"] = ran.first_pass.record()
                    if int8:
                        int8_seconds = time.perf_counter() - t0
    save()
    return time.perf_counter() - started, int8_seconds, passes


