"""The verify stage: L∞ local robustness of every variant, in the VNN-COMP layout, for the swapped ReLU
network and for the smooth network the user trained.

Which network a certificate is about:
- **swapped ReLU** (`results.csv`, `details.csv`): ``verify/onnx/<variant>.onnx``, the float32 ReLU network of
  ``swap/<variant>/relu.pt`` (λ-GELU or GELU after the swap, or the ReLU baseline itself), input
  normalization folded into its first Gemm (`quantize.export.export_for_verifiers`), evaluated in float64 with
  its float32 weights. Decided by the staged verifier (`verify.verifiers`, default "auto": PGD attack →
  CROWN → α-CROWN → branch and bound on the unstable ReLUs those bounds leave); every counterexample is
  re-checked in onnxruntime on the float32 point its witness states (`analysis.verification.problem`).
- **smooth** (`smooth.csv`): the model of ``train/<variant>/best.pt`` with its λ-GELU/GELU gates, read through its
  ONNX export, in float64. Two routes, each recorded on its own: ``direct`` (bounds through the gates' linear
  relaxations, then the attack; a counterexample is re-checked on the torch model in float32) and ``via-relu``
  (the same weights with ReLU: its margin lower bound minus a sound bound on |smooth − ReLU| over the box;
  `analysis.verification.bounds.swap_gap`).
- **int8** (rows and files named ``<variant>-int8``, their own category in ``results.csv``): the int8 QDQ model of
  the variant's ReLU form that the int8 stage wrote, as onnxruntime's CPU kernels run it. The reader
  (`analysis.verification.readers`) turns each QuantizeLinear/DequantizeLinear pair into a sound relaxation of the
  runtime's rounding (`analysis.verification.quantized`: the first one exact on its grid, the others a rounding to
  the grid within x ± E, then the clamp to the grid's range as two ReLUs); the same staged verifier decides it, and a
  counterexample counts only when the int8 model itself misclassifies it in onnxruntime. ``chain.csv`` puts the three networks side by side per
  property, with what carries over.

Properties: for each of the first ``verify.samples`` validation examples ``x0`` (the same for every variant)
and each ``eps`` in ``verify.epsilons``, the box ``[max(x0 − eps, lo), min(x0 + eps, hi)]`` (``lo``/``hi``: the
data's valid range; ε is in the data's own input units) must keep the true class's logit above every other. A
sample the network already gets wrong is ``sat`` with ``x0`` itself as the witness (stage "clean"; no verifier
runs).

Time: one wall-clock budget for the float networks' properties (``verify.budget_s``, ReLU and smooth), shared
through the one property loop (`analysis.verification.harness.StageBudget`): rounds of growing per-property limits,
so easy properties finish first and the time they leave goes to the hard ones; then the int8 models' properties
the same way under their own ``verify.int8_budget_s``, so that what they add to the stage is bounded apart.
``verify.timeout_s`` > 0 caps any one property. ``verify.jobs`` worker processes (0: the run's thread count) solve properties side by side.

Layout under ``verify/``: ``onnx/<variant>.onnx``, ``vnnlib/<variant>_<sample>_<eps>.vnnlib``, ``instances.csv``
(``onnx,vnnlib,timeout``: the budget's fair share per property, or the cap), ``results.csv`` (VNN-COMP:
``category,onnx,vnnlib,prepare_time,result,run_time``, the category being the variant),
``counterexamples/*.counterexample`` (VNN-COMP witnesses), ``details.csv`` (per property: stage that decided, wall
and CPU seconds, unstable ReLUs by IBP and by the tight bounds, margin lower bound, message), ``smooth.csv``,
``summary.json``. A further verifier in ``verify.verifiers`` writes ``results.<name>.csv`` beside.

Resumable per property: ``details.csv`` and ``smooth.csv`` are rewritten as answers arrive; a rerun keeps the
rows marked final and solves the rest.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from analysis.verification import harness, registry
from analysis.verification.ops import Gate, UnsupportedModel
from analysis.verification.problem import Result
from analysis.verification.readers import from_onnx, from_torch
from analysis.verification.vnncomp import witness_path, write_results
from analysis.verification.vnnlib import format_real, format_witness, robustness_spec, write_instances_csv, write_vnnlib
from pipeline import checkpoint
from pipeline.config import Config, ConfigError
from pipeline.data import dataset_for
from pipeline.progress import Progress
from pipeline.render import figure, pct, save, table
from pipeline.atomic_io import atomic_write_bytes, atomic_write_csv, atomic_write_json, atomic_write_text
from pipeline.rundir import RunDir
from quantize import export as export_mod
from quantize import ort as ort_util

DETAIL_FIELDS = ["variant", "sample", "eps", "verifier", "label", "predicted", "result", "stage", "seconds",
                 "cpu_seconds", "prepare_seconds", "unstable_ibp", "unstable_tight", "relus", "margin_lb", "vnnlib",
                 "witness", "final", "message"]
SMOOTH_FIELDS = ["variant", "sample", "eps", "route", "network", "label", "predicted", "result", "stage", "seconds",
                 "margin_lb", "gap_max", "final", "message"]
# direct: the bounds before the attack, unlike the ReLU chain: through the gates CROWN costs ~0.2 s and the attack on
# the smooth network ~0.3 s, and most properties are certified (measured on the default model at ε = 0.005)
ROUTES = {"direct": "crown+pgd+alpha-crown", "via-relu": "via-relu"}
RELU_NETWORK = ("the float32 ReLU ONNX in verify/onnx/ (the swapped model, normalization folded into the first Gemm), "
                "evaluated in float64; not the int8 model")
SMOOTH_NETWORK = "the smooth model of train/<variant>/best.pt (its λ-GELU/GELU gates), evaluated in float64; not the int8 model"
INT8_NETWORK = ("the int8 QDQ ONNX of the int8 stage (quantize/<variant>/relu/model.int8.onnx, copied to verify/onnx/"
                "<variant>-int8.onnx) as onnxruntime's CPU kernels run it: integer sums, the requantization's float32 "
                "multiply and rounding bounded per unit (analysis/verification/quantized.py); a counterexample counts "
                "only when that model itself, in onnxruntime, misclassifies it")
INT8 = "-int8"  # the rows, files and results.csv category of a variant's int8 model carry its name with this suffix
SMOOTH_PROBE_TIMEOUT_S = 120.0
PROGRESS_EVERY_S = 5.0  # at most one progress line in the log this often (and the last one)

# Runs in a fresh interpreter (maraboupy's C++ side may abort the process): argv = onnx path.
_READ_ONNX = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
try:
    from maraboupy import Marabou
    net = Marabou.read_onnx(sys.argv[1])
    print(json.dumps({"ok": True, "message": f"read: {len(net.inputVars)} input tensor(s), {net.numVars} variables"}))
except BaseException as e:
    print(json.dumps({"ok": False, "message": f"{type(e).__name__}: {e}"}))
"""


# ---------------------------------------------------------------------------------------------
# config


def validate_config(cfg: Config) -> None:
    """ConfigError (one line) for bad verify.* settings: the one validation of this section."""
    v = cfg.verify
    if v.samples < 1:
        raise ConfigError(f"verify.samples must be >= 1, got {v.samples}")
    if not v.budget_s > 0:
        raise ConfigError(f"verify.budget_s must be > 0 (wall seconds for the whole stage), got {v.budget_s}")
    if v.int8 and not v.int8_budget_s > 0:
        raise ConfigError(f"verify.int8_budget_s must be > 0 (wall seconds for the int8 properties), got {v.int8_budget_s}; "
                          "or verify.int8=false")
    if v.timeout_s < 0:
        raise ConfigError(f"verify.timeout_s must be >= 0 (a cap per property; 0 = none), got {v.timeout_s}")
    if v.jobs < 0:
        raise ConfigError(f"verify.jobs must be >= 0 (0 = the run's thread count), got {v.jobs}")
    try:
        harness.resolve_device(v.device)
    except ValueError as e:
        raise ConfigError(f"verify.{e}".replace(" device=", " verify.device=")) from None
    if not v.epsilons or not all(e > 0 for e in v.epsilons):
        raise ConfigError(f"verify.epsilons must be a non-empty list of radii > 0, got {v.epsilons}")
    if not v.verifiers:
        raise ConfigError("verify.verifiers must name at least one verifier, e.g. verify.verifiers=auto")
    for name in v.verifiers:
        try:
            registry.check_name(name)
        except ValueError as e:
            raise ConfigError(f"verify.verifiers: {e}") from None


def property_name(variant: str, sample: int, eps: float) -> str:
    return f"{variant}_{sample}_{format_real(eps)}"


def read_rows(path: Path) -> list[dict[str, str]]:
    import csv

    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _clean(msg: str) -> str:
    return msg.replace("\n", " ")


def _r(v: Any) -> Any:
    return "" if v is None else round(float(v), 6)


def _final(row: dict[str, Any]) -> bool:
    return str(row.get("final", "1")) in ("1", "True", "true", "")  # rows of an older stage version carry no flag


# ---------------------------------------------------------------------------------------------
# the stage


def run_verify(cfg: Config, run: RunDir) -> dict[str, Any]:
    vcfg = cfg.verify
    validate_config(cfg)
    out = run.dir("verify")
    ds = dataset_for(cfg)
    info = ds.info
    n = min(vcfg.samples, len(ds.val.y))
    xs = ds.val.x[:n].double().numpy().reshape(n, -1)
    labels = [int(c) for c in ds.val.y[:n]]
    lo = np.asarray(info.input_low, dtype=np.float64)
    hi = np.asarray(info.input_high, dtype=np.float64)
    clock = "cpu" if vcfg.cpu_time else "wall"
    names = list(dict.fromkeys(vcfg.verifiers))
    jobs = vcfg.jobs or torch.get_num_threads()
    device = harness.resolve_device(vcfg.device)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small matrices: one thread is as fast, and the workers share the cores
    try:
        relu = _relu_properties(cfg, run, out, ds, xs, labels, lo, hi, n, names)
        smooth = _smooth_properties(cfg, run, out, info, xs, labels, lo, hi, n) if vcfg.smooth else _Kind("smooth", {}, [], {})
        int8_keys = {t.key for t in relu.tasks if relu.rows[t.key]["variant"].endswith(INT8)}
        open_int8 = sum(1 for t in relu.tasks if t.known is None and t.key in int8_keys)
        open_float = sum(1 for t in relu.tasks + smooth.tasks if t.known is None) - open_int8
        share = {False: vcfg.timeout_s or vcfg.budget_s / max(1, open_float),
                 True: vcfg.timeout_s or vcfg.int8_budget_s / max(1, open_int8)}
        write_instances_csv(out / "instances.csv", [(o, v, round(share[Path(o).stem.endswith(INT8)], 3))
                                                     for o, v in relu.instances])
        seconds, int8_wall = _solve(vcfg, out, names, relu, smooth, int8_keys, clock, jobs, device)
    finally:
        torch.set_num_threads(threads)
    probe = _probe(cfg, run) if vcfg.probe_smooth else {}
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
    summary = {
        "networks": {"relu": RELU_NETWORK, "smooth": SMOOTH_NETWORK, "int8": INT8_NETWORK},
        "samples": n, "sample_selection": f"the first {n} validation examples, the same for every variant",
        "epsilons": list(vcfg.epsilons), "input_range": [info.input_low, info.input_high],
        "eps_units": _eps_units(info),
        "budget_s": vcfg.budget_s, "int8_budget_s": vcfg.int8_budget_s if vcfg.int8 else 0.0, "timeout_s": vcfg.timeout_s,
        "jobs": jobs, "device": device, "solve_seconds": round(seconds, 3), "int8_solve_seconds": round(int8_wall, 3),
        "clock": clock, "verifiers": names, "chains": {v: registry.resolve(v) for v in names},
        "models": relu.models, "smooth_models": smooth.models, "table": table_, "smooth_table": smooth_table,
        "decided": {"relu": _decided([r for r in relu_rows if not r["variant"].endswith(INT8)]),
                    "int8": _decided([r for r in relu_rows if r["variant"].endswith(INT8)]), "smooth": _decided(smooth_rows)},
        "int8_seconds": round(sum(float(r.get("seconds") or 0) for r in relu_rows if r["variant"].endswith(INT8)), 3),
        "chain": chain_rows(cfg.variants, relu_rows, smooth_rows, names[0]),
        "conflicts": conflicts(relu_rows), "probe": probe, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    atomic_write_csv(out / "chain.csv", summary["chain"], CHAIN_FIELDS)
    atomic_write_json(out / "summary.json", summary)
    return {"verifiers": names, "samples": n, "conflicts": len(summary["conflicts"]), "solve_seconds": round(seconds, 3),
            "decided": summary["decided"],
            "certified": {f"{r['variant']}/{format_real(r['eps'])}/{r['verifier']}": round(r["certified_fraction"], 4)
                          for r in table_},
            "smooth_certified": {f"{r['variant']}/{format_real(r['eps'])}/{r['route']}": round(r["certified_fraction"], 4)
                                 for r in smooth_table}}


def _eps_units(info) -> str:
    if getattr(info, "feature_names", None):
        return "raw feature units of each input column (the model standardizes inside)"
    return f"the input's own units (valid range {info.input_low} to {info.input_high})"


def _decided(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    d = sum(r["result"] in ("sat", "unsat") for r in rows)
    return {"properties": len(rows), "decided": d, "fraction": d / len(rows) if rows else None}


class _Kind:
    """One family of properties of the stage (the swapped ReLU networks; the smooth ones): its models, tasks and
    rows, the CSV it is written to."""

    def __init__(self, name: str, models: dict[str, Any], tasks: list[harness.Task], rows: dict[Any, dict[str, Any]],
                 instances: list[tuple[str, str]] | None = None):
        self.name, self.models, self.tasks, self.rows = name, models, tasks, rows
        self.instances = instances or []
        self.order = {t.key: i for i, t in enumerate(tasks)}
        for k in rows:
            self.order.setdefault(k, len(self.order))


def _relu_properties(cfg: Config, run: RunDir, out: Path, ds, xs: np.ndarray, labels: list[int], lo, hi, n: int,
                     names: list[str]) -> _Kind:
    """Every ONNX, property file and instances row first (the benchmark exists before any solving), and a task per
    property and verifier; the rows a previous run finished are kept."""
    vcfg, info = cfg.verify, ds.info
    done = {(r["variant"], int(r["sample"]), format_real(float(r["eps"])), r["verifier"]): r
            for r in read_rows(out / "details.csv") if _final(r)}
    models: dict[str, Any] = {}
    tasks: list[harness.Task] = []
    rows: dict[Any, dict[str, Any]] = {}
    instances: list[tuple[str, str]] = []
    # (the name its rows and files carry, the variant, "relu" | "int8", the int8 stage's file relative to the run)
    entries: list[tuple[str, str, str, str | None]] = []
    for variant in cfg.variants:
        if run.variant(variant).swapped_to is None:
            models[variant] = {"onnx": None, "note": "not verified: its activation is no gate, so the swap left it smooth"}
            continue
        entries.append((variant, variant, "relu", None))
    quantized = (run.read_json("quantize", "quantize.json") or {}) if vcfg.int8 else {}
    if vcfg.int8:
        for variant in cfg.variants:
            entry = (quantized.get("models", {}).get(variant) or {}).get("relu")
            if entry is None:
                models[variant + INT8] = {"onnx": None, "variant": variant, "network": "int8",
                                          "note": "not verified: the int8 stage wrote no int8 model of its ReLU form"}
                continue
            entries.append((variant + INT8, variant, "int8", entry["int8_path"]))
    for name, variant, network, source in entries:
        onnx_rel = Path("onnx") / f"{name}.onnx"
        onnx_path = out / onnx_rel
        facts = run.variant(variant)
        if not onnx_path.is_file() and network == "relu":
            model, _ = checkpoint.load_model(run.file("swap", variant, "relu.pt"))
            export_mod.export_for_verifiers(model, info.input_shape, onnx_path, ds.val.x[:cfg.export.check_samples],
                                            cfg.export.opset, cfg.export.atol, cfg.export.rtol)
        elif not onnx_path.is_file():  # the int8 stage's file itself, so that the benchmark folder stands alone
            atomic_write_bytes(onnx_path, (run.path / source).read_bytes())
        t0 = time.perf_counter()
        try:
            net = from_onnx(onnx_path)
        except UnsupportedModel as e:
            models[name] = {"onnx": None, "variant": variant, "network": network, "note": f"not verified: {e}"}
            continue
        read_s = time.perf_counter() - t0
        sess = ort_util.session(onnx_path)
        predicted = [int(np.argmax(ort_util.forward_flat(sess, x))) for x in xs]
        models[name] = {"onnx": onnx_rel.as_posix(), "variant": variant, "network": network, "activation": facts.activation,
                        "relus": net.num_relus, "read_seconds": round(read_s, 4),
                        "clean_correct": int(sum(p == c for p, c in zip(predicted, labels))), "samples": n}
        if network == "int8":
            models[name].update(source=source, reduce_range=quantized["settings"].get("reduce_range", False))
        for eps in vcfg.epsilons:
            for k in range(n):
                spec = robustness_spec(xs[k], eps, lo, hi, labels[k], info.num_classes)
                rel = Path("vnnlib") / f"{property_name(variant, k, eps)}.vnnlib"
                if not (out / rel).is_file():
                    write_vnnlib(out / rel, spec, comment=f"L-inf robustness of validation sample {k}: eps={format_real(eps)}, "
                                                          f"true class {labels[k]} of {info.num_classes}; model {onnx_rel.as_posix()}")
                instances.append((onnx_rel.as_posix(), rel.as_posix()))
                for verifier in names:
                    key = (name, k, format_real(eps), verifier)
                    base = {"variant": name, "sample": k, "eps": format_real(eps), "verifier": verifier, "label": labels[k],
                            "predicted": predicted[k], "relus": net.num_relus, "vnnlib": rel.as_posix()}
                    if key in done:
                        rows[key] = done[key]
                        continue
                    known = None
                    if predicted[k] != labels[k]:  # the sample itself is the counterexample
                        x32 = xs[k].astype(np.float32).astype(np.float64)
                        known = Result("sat", 0.0, x32, ort_util.forward_flat(sess, x32),
                                       f"the network predicts {predicted[k]} at the sample itself (true class {labels[k]}); "
                                       "no verifier ran", "clean")
                    tasks.append(harness.FileTask(key=key, verifier=verifier, timeout=vcfg.timeout_s or None, known=known,
                                                  onnx=onnx_path, vnnlib=out / rel))
                    rows[key] = {**base, "result": "", "final": 0}
    return _Kind("relu", models, tasks, rows, instances)


def _smooth_properties(cfg: Config, run: RunDir, out: Path, info, xs: np.ndarray, labels: list[int], lo, hi,
                       n: int) -> _Kind:
    """A task per property and route for every variant with a smooth model; rows a previous run finished are kept."""
    vcfg = cfg.verify
    done = {(r["variant"], int(r["sample"]), format_real(float(r["eps"])), r["route"]): r
            for r in read_rows(out / "smooth.csv") if _final(r)}
    models: dict[str, Any] = {}
    tasks: list[harness.Task] = []
    rows: dict[Any, dict[str, Any]] = {}
    for variant in cfg.variants:
        facts = run.variant(variant)
        if not facts.smooth:
            continue
        src = run.file("train", variant, "best.pt")
        model, _ = checkpoint.load_model(src)
        try:
            net = from_torch(model, info.input_shape)
        except UnsupportedModel as e:
            models[variant] = {"network": None, "note": f"not certified: {e}"}
            continue
        lam = [float(node.op.lam.mean()) for node in net.nodes if isinstance(node.op, Gate)]
        models[variant] = {"network": str(src.relative_to(run.path)), "activation": facts.activation,
                           "mean_lambda_per_layer": [round(v, 4) for v in lam]}
        recheck = harness.ModuleRecheck(model, info.input_shape, load=functools.partial(checkpoint.load_module, src))
        with torch.no_grad():
            predicted = [int(v) for v in model(torch.as_tensor(xs, dtype=torch.float32).reshape(n, *info.input_shape)).argmax(1)]
        models[variant]["clean_correct"] = int(sum(p == c for p, c in zip(predicted, labels)))
        for eps in vcfg.epsilons:
            for k in range(n):
                spec = robustness_spec(xs[k], eps, lo, hi, labels[k], info.num_classes)
                for route, chain in ROUTES.items():
                    key = (variant, k, format_real(eps), route)
                    if key in done:
                        rows[key] = done[key]
                        continue
                    known = None
                    if predicted[k] != labels[k]:
                        known = Result("sat", 0.0, message=f"the smooth network predicts {predicted[k]} at the sample itself",
                                       stage="clean")
                    tasks.append(harness.SpecTask(key=key, verifier=chain, timeout=vcfg.timeout_s or None, known=known,
                                                  net=net, specs=[spec], recheck=recheck))
                    rows[key] = {"variant": variant, "sample": k, "eps": format_real(eps), "route": route,
                                 "network": f"smooth {facts.activation} ({src.relative_to(run.path)})",
                                 "label": labels[k], "predicted": predicted[k], "result": "", "final": 0}
    return _Kind("smooth", models, tasks, rows)


def _solve(vcfg, out: Path, names: list[str], relu: _Kind, smooth: _Kind, int8_keys: set[Any], clock: str,
           jobs: int, device: str = "cpu") -> tuple[float, float]:
    """Every open property through the one property loop: the float networks' under `verify.budget_s`, then the int8
    models' (`int8_keys`) under `verify.int8_budget_s`; the CSVs rewritten as answers come. Returns the wall seconds of both, and of
    the int8 part."""
    tasks = relu.tasks + smooth.tasks
    is_relu = {t.key: True for t in relu.tasks} | {t.key: False for t in smooth.tasks}

    def save() -> None:
        rows = [relu.rows[k] for k in sorted(relu.rows, key=relu.order.__getitem__)]
        atomic_write_csv(out / "details.csv", rows, DETAIL_FIELDS)
        for i, name in enumerate(names):
            mine = [r for r in rows if r["verifier"] == name and r["result"]]
            write_results(out / ("results.csv" if i == 0 else f"results.{name}.csv"),
                          [{"category": r["variant"], "onnx": f"onnx/{r['variant']}.onnx", "vnnlib": r["vnnlib"],
                            "prepare_time": r.get("prepare_seconds") or 0.0, "result": r["result"], "run_time": r["seconds"]}
                           for r in mine])
        atomic_write_csv(out / "smooth.csv", [smooth.rows[k] for k in sorted(smooth.rows, key=smooth.order.__getitem__)],
                         SMOOTH_FIELDS)

    def done(o: harness.Outcome) -> None:
        res = o.result
        if is_relu[o.key]:
            row = relu.rows[o.key]
            wfile = witness_path(out / "results.csv", f"onnx/{row['variant']}.onnx", row["vnnlib"])
            row.update(result=res.status, stage=res.stage, seconds=round(res.seconds, 4),
                       cpu_seconds=round(res.cpu_seconds, 4), prepare_seconds=round(o.prepare_seconds, 4),
                       unstable_ibp=res.info.get("unstable_ibp", ""), unstable_tight=res.info.get("unstable_tight", ""),
                       margin_lb=_r(res.info.get("margin_lb")), witness="", final=int(o.final), message=_clean(res.message))
            if res.status == "sat" and o.final:
                atomic_write_text(wfile, format_witness(res.counterexample, res.output))
                row["witness"] = wfile.relative_to(out).as_posix()
        else:
            smooth.rows[o.key].update(result=res.status, stage=res.stage, seconds=round(res.seconds, 4),
                                      margin_lb=_r(res.info.get("margin_lb")), gap_max=_r(res.info.get("gap_max")),
                                      final=int(o.final), message=_clean(res.message))
        save()

    save()
    started = time.perf_counter()
    int8_seconds = 0.0
    if tasks:
        finished: dict[str, int] = {}
        with Progress("verify", len(tasks), "property", every_s=PROGRESS_EVERY_S) as bar:
            def done_and_shown(o: harness.Outcome) -> None:
                done(o)
                if o.final:
                    finished[o.result.status] = finished.get(o.result.status, 0) + 1
                    bar.step(line=f"    verify: {sum(finished.values())}/{len(tasks)} properties final ("
                                  + ", ".join(f"{k} {n}" for k, n in sorted(finished.items())) + ")")

            for int8, budget in ((False, vcfg.budget_s), (True, vcfg.int8_budget_s)):
                part = [t for t in tasks if (t.key in int8_keys) == int8]
                t0 = time.perf_counter()
                if part:
                    harness.run(part, harness.StageBudget(budget), jobs=jobs, clock=clock, on_done=done_and_shown,
                                device=device)
                    if int8:
                        int8_seconds = time.perf_counter() - t0
    save()
    return time.perf_counter() - started, int8_seconds


def _probe(cfg: Config, run: RunDir) -> dict[str, Any]:
    """What Marabou's and our ONNX readers say about the smooth ONNX files of the export stage."""
    import onnx

    out: dict[str, Any] = {}
    for variant in cfg.variants:
        path = run.file("export", variant, "smooth", "model.onnx")
        if not path.is_file():
            continue
        entry: dict[str, Any] = {"onnx": str(path.relative_to(run.path)),
                                 "ops": sorted({node.op_type for node in onnx.load(str(path)).graph.node})}
        if registry.VERIFIERS["marabou"].available():
            try:
                proc = subprocess.run([sys.executable, "-c", _READ_ONNX, str(path)], capture_output=True, text=True,
                                      timeout=SMOOTH_PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
                last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
                entry["marabou"] = json.loads(last) if last.startswith("{") else {
                    "ok": False, "message": f"reader process exited with code {proc.returncode}"}
            except subprocess.TimeoutExpired:
                entry["marabou"] = {"ok": False, "message": f"Marabou.read_onnx did not return within {SMOOTH_PROBE_TIMEOUT_S:g} s"}
        else:
            entry["marabou"] = {"ok": False, "message": "maraboupy is not installed"}
        try:
            from_onnx(path)
            entry["ours"] = {"ok": True, "message": "read"}
        except UnsupportedModel as e:
            entry["ours"] = {"ok": False, "message": str(e).split(";")[0]}
        out[variant] = entry
    return out


CHAIN_FIELDS = ["variant", "sample", "eps", "smooth_direct", "smooth_via_relu", "relu", "int8", "carries_over"]


def chain_rows(variants: Sequence[str], relu_rows: list[dict[str, Any]], smooth_rows: list[dict[str, Any]],
               verifier: str) -> list[dict[str, Any]]:
    """Per variant, sample and ε: what is proven about each network of the chain (smooth by both routes, the float
    ReLU network, the int8 model) and one sentence on what carries over."""
    res = {(r["variant"], int(r["sample"]), format_real(float(r["eps"]))): r["result"] or "—" for r in relu_rows
           if r["verifier"] == verifier}
    smo = {(r["variant"], int(r["sample"]), format_real(float(r["eps"])), r["route"]): r["result"] or "—" for r in smooth_rows}
    keys = sorted({(v, s, e) for (v, s, e) in res if not v.endswith(INT8)} | {(v, s, e) for (v, s, e, _) in smo},
                  key=lambda t: (list(variants).index(t[0]) if t[0] in variants else len(variants), float(t[2]), t[1]))
    out = []
    for v, smp, e in keys:
        row = {"variant": v, "sample": smp, "eps": e, "smooth_direct": smo.get((v, smp, e, "direct"), "—"),
               "smooth_via_relu": smo.get((v, smp, e, "via-relu"), "—"), "relu": res.get((v, smp, e), "—"),
               "int8": res.get((v + INT8, smp, e), "—")}
        row["carries_over"] = _carries(row)
        out.append(row)
    return out


def _carries(r: dict[str, Any]) -> str:
    smooth = "unsat" in (r["smooth_direct"], r["smooth_via_relu"])
    relu, q = r["relu"], r["int8"]
    if q == "unsat":
        head = "proven for the int8 model itself"
        rest = "and for every float network before it" if smooth and relu == "unsat" else (
            "and for the float ReLU network" if relu == "unsat" else
            "while the float ReLU network is falsified: quantization changed the answer" if relu == "sat" else
            "while the float ReLU network is undecided")
        return f"{head}, {rest}"
    if q == "sat":
        if relu == "unsat":
            return "the float ReLU proof does not carry over: the int8 model misclassifies a point of the box (witness re-checked in onnxruntime)"
        return "falsified for the int8 model (witness re-checked in onnxruntime)" + (
            ", and for the float ReLU network" if relu == "sat" else "")
    if relu == "unsat":
        return "proven for the float ReLU network" + (" and the smooth one" if smooth else "") + \
            "; not carried to int8 (its bound through the rounding did not close, or no int8 model was verified)"
    if smooth:
        return "proven for the smooth network only"
    return "nothing proven" if relu != "sat" else "falsified for the float ReLU network"


def conflicts(rows: list[dict[str, Any]]) -> list[str]:
    """Properties that one verifier proved and another falsified (there should be none)."""
    seen: dict[tuple, set[str]] = {}
    for r in rows:
        seen.setdefault((r["variant"], int(r["sample"]), format_real(float(r["eps"]))), set()).add(r["result"])
    return [property_name(v, s, float(e)) for (v, s, e), st in seen.items() if {"sat", "unsat"} <= st]


# ---------------------------------------------------------------------------------------------
# report


FRACTIONS_PNG = "verify_fractions.png"
KINDS = (("relu", "float ReLU"), ("smooth", "smooth"), ("int8", "int8"))
OUTCOME_COLORS = {"certified": "#2a9d4b", "falsified": "#d1495b", "open": "#b8b8b8"}


def fractions(chain: Sequence[dict[str, Any]]) -> dict[tuple[str, str, float], dict[str, float]]:
    """(network kind, variant, ε) -> the fraction of its properties certified, falsified and open, from the chain rows
    (one per property; "—" where a network has no answer: left out). The smooth network: certified when either route
    proved the property, falsified when one found a counterexample (no route proves what another falsified)."""
    counts: dict[tuple[str, str, float], dict[str, int]] = {}
    for c in chain:
        smooth = [c["smooth_direct"], c["smooth_via_relu"]]
        answers = {"relu": c["relu"], "int8": c["int8"],
                   "smooth": "unsat" if "unsat" in smooth else "sat" if "sat" in smooth else
                             ("—" if all(v == "—" for v in smooth) else "open")}
        for kind, res in answers.items():
            if res in ("—", "", None):
                continue
            n = counts.setdefault((kind, c["variant"], float(c["eps"])), {"certified": 0, "falsified": 0, "open": 0})
            n["certified" if res == "unsat" else "falsified" if res == "sat" else "open"] += 1
    return {k: {o: v / sum(n.values()) for o, v in n.items()} for k, n in counts.items()}


def fractions_figure(chain: Sequence[dict[str, Any]], variants: Sequence[str]):
    """One panel per network kind that has answers: at each ε a stacked bar per variant, certified / falsified /
    open fractions of its properties."""
    fr = fractions(chain)
    kinds = [(k, name) for k, name in KINDS if any(key[0] == k for key in fr)]
    eps = sorted({key[2] for key in fr})
    fig = figure(4.2 * max(1, len(kinds)), 3.9)
    for i, (kind, name) in enumerate(kinds):
        ax = fig.add_subplot(1, len(kinds), i + 1)
        vs = [v for v in variants if any(key[:2] == (kind, v) for key in fr)]
        width = 0.8 / max(1, len(vs))
        for j, v in enumerate(vs):
            xs = [e_i + (j - (len(vs) - 1) / 2) * width for e_i in range(len(eps))]
            bottom = [0.0] * len(eps)
            for outcome, color in OUTCOME_COLORS.items():
                h = [fr.get((kind, v, e), {}).get(outcome, 0.0) for e in eps]
                ax.bar(xs, h, width * 0.92, bottom=bottom, color=color, edgecolor="k", linewidth=0.4,
                       label=outcome if j == 0 else None)
                bottom = [b + x for b, x in zip(bottom, h)]
            for x in xs:
                ax.text(x, 1.01, v, rotation=90, ha="center", va="bottom", fontsize=6)
        ax.set_xticks(range(len(eps)), [f"{e:g}" for e in eps])
        ax.set(xlabel="ε", ylim=(0, 1.3), title=f"{name} network")
        ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
        if i == 0:
            ax.set_ylabel("fraction of properties")
    handles, labels = fig.axes[0].get_legend_handles_labels() if fig.axes else ([], [])
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))  # room for the legend below the panels
    return fig


def _sec(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def report_section(cfg: Config, run: RunDir) -> str | None:
    """Markdown for report.md: one certified-fraction table (swapped ReLU networks, and the smooth networks by
    both routes) per eps, how each was decided, and which network each certificate is about. None when the
    verify stage has not run."""
    path = run.file("verify", "summary.json")
    if not path.is_file():
        return None
    s = json.loads(path.read_text())
    if "budget_s" not in s:  # written by an older version of this stage
        return "## Verification (L∞ local robustness)\n\nverify/summary.json predates this report; rerun the verify stage."
    clock = "wall-clock" if s["clock"] == "wall" else "CPU"
    main = s["verifiers"][0]
    cap = f", at most {s['timeout_s']:g} s per property" if s["timeout_s"] else ""
    dec = s["decided"]["relu"]
    out = ["## Verification (L∞ local robustness)",
           f"Properties: {s['sample_selection']}; the true class's logit beats every other on the L∞ box of radius ε "
           f"clipped to the input range {s['input_range']} (ε in {s['eps_units']}). Time: one budget of {s['budget_s']:g} s "
           f"for the float networks, shared by their properties (easy ones first, what they leave to the hard ones{cap}; "
           f"{clock} seconds per property, {s['jobs']} worker process(es)); solving took {s['solve_seconds']:.1f} s. "
           f"Decided: {dec['decided']} of {dec['properties']} ReLU properties. Certified = unsat (proved); falsified = "
           f"sat (a counterexample, re-checked in float32 on the network itself; a sample the network already "
           f"misclassifies counts as falsified)."]
    eps_cols = [f"ε = {e:g}" for e in s["epsilons"]]
    rows = []
    for v in [m for m, x in s["models"].items() if x.get("onnx")]:
        cells = []
        for e in s["epsilons"]:
            r = next((t for t in s["table"] if t["variant"] == v and t["eps"] == e and t["verifier"] == main), None)
            cells.append("—" if r is None else f"{pct(r['certified_fraction'])} ({pct(r['falsified_fraction'])} sat)")
        m = s["models"][v]
        base = m.get("variant", v)
        label = f"{base} (ReLU from the start)" if run.variant(base).is_relu else f"{base} swapped to ReLU"
        if m.get("network") == "int8":
            rows.append([f"{label}, int8", "int8 ONNX (onnxruntime)", f"`{s['chains'][main]}` on the rounding's relaxation", *cells])
        else:
            rows.append([label, "ReLU ONNX", f"`{s['chains'][main]}`", *cells])
    for v in s.get("smooth_models", {}):
        for route in ROUTES:
            cells = []
            for e in s["epsilons"]:
                r = next((t for t in s["smooth_table"] if t["variant"] == v and t["eps"] == e and t["route"] == route), None)
                cells.append("—" if r is None else f"{pct(r['certified_fraction'])} ({pct(r['falsified_fraction'])} sat)")
            how = ("bounds through its gates (CROWN, α-CROWN)" if route == "direct"
                   else "via the swap: ReLU margin minus the smooth-to-ReLU gap bound")
            rows.append([f"{v} smooth", "smooth (train best.pt)", how, *cells])
    out.append("Certified fraction (falsified in brackets):\n\n" + table(["model", "network", "method", *eps_cols], rows))
    out.append(f"Which network each certificate is about: **ReLU ONNX** = {s['networks']['relu']}; "
               f"**int8 ONNX** = {s['networks'].get('int8', '—')}; "
               f"**smooth** = {s['networks']['smooth']}. The smooth routes: *direct* proves the smooth network itself "
               "through sound linear relaxations of x·Φ(λx); *via the swap* proves the ReLU network with the same weights "
               "and carries the proof over where its margin exceeds the sound bound on |smooth − ReLU| over the box "
               "(per logit, from the pre-activation bounds; each unit adds at most c/λ, exponentially less when its "
               "interval stays away from 0).")
    detail = [[r["variant"], f"{r['eps']:g}", r["verifier"], r["properties"], r["unsat"], r["sat"], r["timeout"],
               r["unknown"] + r["error"], pct(r["decided_fraction"]), _sec(r["median_seconds"]), _sec(r["max_seconds"]),
               "—" if r["mean_unstable_ibp"] is None else f"{r['mean_unstable_ibp']:.1f}",
               "—" if r["mean_unstable_tight"] is None else f"{r['mean_unstable_tight']:.1f}", r["relus"]]
              for r in s["table"]]
    int8_note = (" For an int8 model (its `-int8` rows) the ReLU units are those of the clamps the reader puts after "
                 "every requantization (`analysis/verification/readers.py`): clamp(x, lo, hi) = lo + ReLU(x − lo) − "
                 "ReLU(x − hi), two ReLUs per requantized unit (the ReLU the quantizer absorbed is the lower end), the "
                 "logits' too; hence about twice the float network's count (a network of hidden widths h₁…h_k with K "
                 "outputs: 2·(h₁ + … + h_k + K))." if any(m.get("network") == "int8" and m.get("onnx") for m in s["models"].values())
                 else "")
    out.append("How the swapped ReLU networks were decided. Unstable ReLUs: units whose input interval crosses 0 over the "
               "box, by IBP and by the tight CROWN/α-CROWN bounds branch and bound starts from, each the **mean** over the "
               "properties a verifier ran on (one decimal). ReLU units: what branch and bound can split." + int8_note +
               "\n\n" + table(
                   ["model", "ε", "verifier", "properties", "unsat", "sat", "timeout", "unknown/error", "decided",
                    f"median {s['clock']} s", f"max {s['clock']} s", "mean unstable (IBP)", "mean unstable (tight)",
                    "ReLU units"], detail))
    if s.get("chain"):
        save(fractions_figure(s["chain"], [m for m in s["models"] if not m.endswith(INT8)]), run.dir("report") / FRACTIONS_PNG,
             layout=False)
        out.append(f"![certified, falsified and open fraction against ε per network]({FRACTIONS_PNG})\n\n"
                   "Per network kind (the float ReLU network after the swap, the smooth network the user trained, the int8 "
                   "model that ships) and variant: the fraction of properties certified (unsat), falsified (sat) and left "
                   "open (timeout, unknown, error) at each ε, with the first verifier. The smooth network counts as "
                   "certified when either route proved it.")
    if "int8" in s["decided"] and s["decided"]["int8"]["properties"]:
        d8 = s["decided"]["int8"]
        took = (f"in {s['int8_solve_seconds']:.1f} s (their own budget of {s['int8_budget_s']:g} s, after the float "
                "networks')") if "int8_solve_seconds" in s else f"in {s['int8_seconds']:.1f} s of solving (summed over properties)"
        out.append(f"int8 models: {d8['decided']} of {d8['properties']} properties decided {took}.")
    if s.get("chain"):
        crow = [[c["variant"], c["sample"], c["eps"], c["smooth_direct"], c["smooth_via_relu"], c["relu"], c["int8"],
                 c["carries_over"]] for c in s["chain"]]
        out.append("The chain, per property (`verify/chain.csv`): what is proven about each network, from the smooth one "
                   "the user trained to the int8 model that ships (unsat = proven robust, sat = a re-checked counterexample):"
                   "\n\n" + table(["variant", "sample", "ε", "smooth (direct)", "smooth (via swap)", "float ReLU", "int8",
                                    "what carries over"], crow))
    for v, m in s["models"].items():
        if not m.get("onnx"):
            out.append(f"`{v}`: {m['note']}")
    for v, m in s.get("smooth_models", {}).items():
        if not m.get("network"):
            out.append(f"`{v}` (smooth): {m['note']}")
    if s["conflicts"]:
        out.append(f"**Verifiers disagree** (one proved, another falsified) on: {', '.join(s['conflicts'])}.")
    for v, f in (s.get("probe") or {}).items():
        out.append(f"`{v}` smooth ONNX (`{f['onnx']}`, ops {', '.join(f['ops'])}): Marabou's reader → "
                   f"{'reads it' if f['marabou']['ok'] else '`' + f['marabou']['message'] + '`'}; ours → "
                   f"{'reads it' if f['ours']['ok'] else '`' + f['ours']['message'] + '`'}.")
    return "\n\n".join(out)
