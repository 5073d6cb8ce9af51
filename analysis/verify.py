"""The verify stage: L∞ local robustness of every variant, in the VNN-COMP layout, for the swapped ReLU
network and for the smooth network the user trained.

Which network a certificate is about:
- **swapped ReLU** (`results.csv`, `details.csv`): ``verify/onnx/<variant>.onnx``, the float32 ReLU network of
  ``swap/<variant>/relu.pt`` (λ-GELU or GELU after the swap, or the ReLU baseline itself), input
  normalization folded into its first Gemm (`quantize.export.export_for_verifiers`), evaluated in float64 with
  its float32 weights. Decided by the staged verifier (`verify.verifiers`, default "auto": PGD attack →
  CROWN → α-CROWN → branch and bound on the unstable ReLUs those bounds leave); every
  counterexample is re-checked in onnxruntime and written as a VNN-COMP witness.
- **smooth** (`smooth.csv`): the model of ``train/<variant>/best.pt`` with its λ-GELU/GELU gates, in float64.
  Two routes, each recorded on its own: ``direct`` (attack, then CROWN and α-CROWN through the gates' linear
  relaxations; a counterexample is re-checked on the torch model in float32) and ``via-relu`` (the same
  weights with ReLU: its margin lower bound minus a sound bound on |smooth − ReLU| over the box, from the
  pre-activation bounds; `analysis.verification.bounds.swap_gap`).
Neither is about the int8 model (its QDQ graph rounds differently and drops ReLUs).

Properties: for each of the first ``verify.samples`` validation examples ``x0`` (the same for every variant)
and each ``eps`` in ``verify.epsilons``, the box ``[max(x0 − eps, lo), min(x0 + eps, hi)]`` (``lo``/``hi``: the
data's valid range) must keep the true class's logit above every other. A sample the network already gets
wrong is ``sat`` with ``x0`` itself as the witness (stage "clean"; no verifier runs).

Layout under ``verify/``: ``onnx/<variant>.onnx``, ``vnnlib/<variant>_<sample>_<eps>.vnnlib``, ``instances.csv``
(``onnx,vnnlib,timeout``), ``results.csv`` (VNN-COMP: ``category,onnx,vnnlib,prepare_time,result,run_time``, the
category being the variant), ``counterexamples/*.counterexample`` (VNN-COMP witnesses), ``details.csv`` (per
property: stage that decided, wall and CPU seconds, unstable ReLUs by IBP and by the tight bounds, margin
lower bound, message), ``smooth.csv``, ``summary.json``. A further verifier in ``verify.verifiers`` writes
``results.<name>.csv`` beside.

Limits: ``timeout_s`` per property counts wall-clock seconds (or CPU seconds with ``verify.cpu_time``), the
same limit for each smooth route. Resumable per property: ``details.csv`` and ``smooth.csv`` are rewritten
after every property and a rerun keeps the rows it finds.
"""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.render import pct, table
from analysis.verification import network as netmod
from analysis.verification import registry
from analysis.verification.vnncomp import witness_path, write_results
from analysis.verification.vnnlib import format_real, format_witness, robustness_spec, write_instances_csv, write_vnnlib
from pipeline import checkpoint
from pipeline.config import Config, ConfigError
from pipeline.data import dataset_for
from pipeline.rundir import RunDir, atomic_write_csv, atomic_write_json, atomic_write_text
from quantize import export as export_mod
from quantize import ort as ort_util

DETAIL_FIELDS = ["variant", "sample", "eps", "verifier", "label", "predicted", "result", "stage", "seconds",
                 "cpu_seconds", "unstable_ibp", "unstable_tight", "relus", "margin_lb", "vnnlib", "witness", "message"]
SMOOTH_FIELDS = ["variant", "sample", "eps", "route", "network", "label", "predicted", "result", "seconds",
                 "margin_lb", "gap_max", "message"]
# direct: the bounds before the attack, unlike the ReLU chain: through the gates CROWN costs ~0.2 s and the attack on
# the smooth network ~0.3 s, and most properties are certified (measured on the default model at ε = 0.005)
ROUTES = {"direct": "crown+pgd+alpha-crown", "via-relu": "via-relu"}
RELU_NETWORK = ("the float32 ReLU ONNX in verify/onnx/ (the swapped model, normalization folded into the first Gemm), "
                "evaluated in float64; not the int8 model")
SMOOTH_NETWORK = "the smooth model of train/<variant>/best.pt (its λ-GELU/GELU gates), evaluated in float64; not the int8 model"
SMOOTH_PROBE_TIMEOUT_S = 120.0

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
# config and run facts


def validate_config(cfg: Config) -> None:
    """ConfigError (one line) for bad verify.* settings."""
    v = cfg.verify
    if v.samples < 1:
        raise ConfigError(f"verify.samples must be >= 1, got {v.samples}")
    if not v.timeout_s > 0:
        raise ConfigError(f"verify.timeout_s must be > 0 (seconds per property), got {v.timeout_s}")
    if not v.epsilons or not all(e > 0 for e in v.epsilons):
        raise ConfigError(f"verify.epsilons must be a non-empty list of radii > 0, got {v.epsilons}")
    if not v.verifiers:
        raise ConfigError("verify.verifiers must name at least one verifier, e.g. verify.verifiers=auto")
    for name in v.verifiers:
        try:
            registry.check_name(name)
        except ValueError as e:
            raise ConfigError(f"verify.verifiers: {e}") from None


def variant_facts(run: RunDir, variant: str) -> dict[str, Any]:
    """What the train stage decided about a variant (activation, smooth, swapped_to, ...): the manifest's record
    (`RunDir.variant`), or, for a run recorded before the train stage wrote one, its checkpoint's spec."""
    try:
        return run.variant(variant)
    except Exception:  # an older run directory: no facts in its manifest
        from pipeline.activations import RELU_FORMS, swapped_activation

        act = checkpoint.load_payload(run.file("train", variant, "best.pt"))["spec"]["activation"]
        return {"activation": act, "smooth": act not in RELU_FORMS, "swapped_to": swapped_activation(act)}


def property_name(variant: str, sample: int, eps: float) -> str:
    return f"{variant}_{sample}_{format_real(eps)}"


def read_rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _clean(msg: str) -> str:
    return msg.replace("\n", " ")


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
    solvers = {name: registry.get_verifier(name) for name in names}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small matrices: one thread is as fast, and the machine is shared
    try:
        models, pending, instances = _prepare(cfg, run, out, ds, xs, labels, lo, hi, n)
        write_instances_csv(out / "instances.csv", instances)
        rows = _solve_relu(vcfg, out, pending, names, solvers, xs, labels, clock)
        smooth_rows, smooth_models = (_solve_smooth(cfg, run, out, info, xs, labels, lo, hi, n, clock)
                                      if vcfg.smooth else ([], {}))
    finally:
        torch.set_num_threads(threads)
    probe = _probe(cfg, run) if vcfg.probe_smooth else {}
    verified = [v for v in cfg.variants if models.get(v, {}).get("onnx")]
    summary = {
        "networks": {"relu": RELU_NETWORK, "smooth": SMOOTH_NETWORK},
        "samples": n, "sample_selection": f"the first {n} validation examples, the same for every variant",
        "epsilons": list(vcfg.epsilons), "input_range": [info.input_low, info.input_high],
        "timeout_s": vcfg.timeout_s, "clock": clock, "verifiers": names,
        "chains": {v: registry.resolve(v) for v in names},
        "models": models, "smooth_models": smooth_models,
        "table": summarize(rows, verified, vcfg.epsilons, names),
        "smooth_table": summarize_smooth(smooth_rows, list(smooth_models), vcfg.epsilons),
        "conflicts": conflicts(rows), "probe": probe, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    atomic_write_json(out / "summary.json", summary)
    return {"verifiers": names, "samples": n, "conflicts": len(summary["conflicts"]),
            "certified": {f"{r['variant']}/{format_real(r['eps'])}/{r['verifier']}": round(r["certified_fraction"], 4)
                          for r in summary["table"]},
            "smooth_certified": {f"{r['variant']}/{format_real(r['eps'])}/{r['route']}": round(r["certified_fraction"], 4)
                                 for r in summary["smooth_table"]}}


def _prepare(cfg: Config, run: RunDir, out: Path, ds, xs: np.ndarray, labels: list[int], lo, hi, n: int):
    """Every ONNX, property file and instances row first: the benchmark exists before any solving."""
    vcfg, info = cfg.verify, ds.info
    models: dict[str, Any] = {}
    pending = []
    instances: list[tuple[str, str, float]] = []
    for variant in cfg.variants:
        onnx_rel = Path("onnx") / f"{variant}.onnx"
        onnx_path = out / onnx_rel
        facts = variant_facts(run, variant)
        if facts.get("swapped_to") is None and facts.get("activation") not in ("relu", "linked_relu"):
            models[variant] = {"onnx": None, "note": "not verified: its activation is no gate, so the swap left it smooth"}
            continue
        if not onnx_path.is_file():
            model, _ = checkpoint.load_model(run.file("swap", variant, "relu.pt"))
            export_mod.export_for_verifiers(model, info.input_shape, onnx_path, ds.val.x[:cfg.export.check_samples],
                                            cfg.export.opset, cfg.export.atol, cfg.export.rtol)
        t0 = time.perf_counter()
        try:
            net = netmod.from_onnx(onnx_path)
        except netmod.UnsupportedModel as e:
            models[variant] = {"onnx": None, "note": f"not verified: {e}"}
            continue
        read_s = time.perf_counter() - t0
        sess = ort_util.session(onnx_path)
        predicted = [int(np.argmax(ort_util.forward_flat(sess, x))) for x in xs]
        specs = []
        for eps in vcfg.epsilons:
            for k in range(n):
                spec = robustness_spec(xs[k], eps, lo, hi, labels[k], info.num_classes)
                rel = Path("vnnlib") / f"{property_name(variant, k, eps)}.vnnlib"
                if not (out / rel).is_file():
                    write_vnnlib(out / rel, spec, comment=f"L-inf robustness of validation sample {k}: eps={format_real(eps)}, "
                                                          f"true class {labels[k]} of {info.num_classes}; model {onnx_rel.as_posix()}")
                instances.append((onnx_rel.as_posix(), rel.as_posix(), vcfg.timeout_s))
                specs.append((k, eps, spec, rel))
        models[variant] = {"onnx": onnx_rel.as_posix(), "activation": facts.get("activation"), "relus": net.num_relus,
                           "read_seconds": round(read_s, 4),
                           "clean_correct": int(sum(p == c for p, c in zip(predicted, labels))), "samples": n}
        pending.append((variant, onnx_path, onnx_rel, net, sess, specs, predicted))
    return models, pending, instances


def _solve_relu(vcfg, out: Path, pending, names: list[str], solvers: dict, xs: np.ndarray, labels: list[int],
                clock: str) -> list[dict]:
    """Every property of every swapped ReLU network, one at a time; details.csv and the results files are
    rewritten after each. Order: eps, sample, variant, so that a stopped stage still compares the variants
    on the same properties."""
    path = out / "details.csv"
    done = {(r["variant"], int(r["sample"]), format_real(float(r["eps"])), r["verifier"]): r for r in read_rows(path)}
    rows: list[dict[str, Any]] = []
    order = {p[0]: i for i, p in enumerate(pending)}
    eps_rank = {format_real(e): i for i, e in enumerate(vcfg.epsilons)}

    def save() -> None:
        rows.sort(key=lambda r: (order[r["variant"]], eps_rank[format_real(float(r["eps"]))], int(r["sample"]),
                                 names.index(r["verifier"])))
        atomic_write_csv(path, rows, DETAIL_FIELDS)
        for i, name in enumerate(names):
            mine = [r for r in rows if r["verifier"] == name]
            file = out / ("results.csv" if i == 0 else f"results.{name}.csv")
            write_results(file, [{"category": r["variant"], "onnx": f"onnx/{r['variant']}.onnx", "vnnlib": r["vnnlib"],
                                  "prepare_time": 0.0, "result": r["result"], "run_time": r["seconds"]} for r in mine])

    tasks = sorted(((eps_rank[format_real(eps)], k, order[variant]), variant, onnx_path, onnx_rel, net, sess, predicted[k], k, eps,
                    spec, rel)
                   for variant, onnx_path, onnx_rel, net, sess, specs, predicted in pending for k, eps, spec, rel in specs)
    for _, variant, onnx_path, onnx_rel, net, sess, pred, k, eps, spec, rel in tasks:
        for name, solver in solvers.items():
            prev = done.get((variant, k, format_real(eps), name))
            if prev is not None:
                rows.append(prev)
                continue
            row: dict[str, Any] = {"variant": variant, "sample": k, "eps": format_real(eps), "verifier": name,
                                   "label": labels[k], "predicted": pred, "relus": net.num_relus, "vnnlib": rel.as_posix()}
            wfile = witness_path(out / "results.csv", onnx_rel.as_posix(), rel.as_posix())
            if pred != labels[k]:  # the sample itself is the counterexample
                atomic_write_text(wfile, format_witness(xs[k], ort_util.forward_flat(sess, xs[k])))
                row.update(result="sat", stage="clean", seconds=0.0, cpu_seconds=0.0, witness=wfile.relative_to(out).as_posix(),
                           message=f"the network predicts {pred} at the sample itself (true class {labels[k]}); no verifier ran")
            else:
                problem = registry.Problem([spec], network=net, onnx=onnx_path, vnnlib_path=out / rel)
                problem.cache["session"] = sess
                res = solver.run(problem, registry.Budget(vcfg.timeout_s, clock))
                row.update(result=res.status, stage=res.stage, seconds=round(res.seconds, 4),
                           cpu_seconds=round(res.cpu_seconds, 4), message=_clean(res.message),
                           unstable_ibp=res.info.get("unstable_ibp", ""), unstable_tight=res.info.get("unstable_tight", ""),
                           margin_lb=_r(res.info.get("margin_lb")), witness="")
                if res.status == "sat":
                    atomic_write_text(wfile, format_witness(res.counterexample, res.output))
                    row["witness"] = wfile.relative_to(out).as_posix()
            rows.append(row)
            save()
    save()
    return rows


def _r(v: Any) -> Any:
    return "" if v is None else round(float(v), 6)


def _solve_smooth(cfg: Config, run: RunDir, out: Path, info, xs: np.ndarray, labels: list[int], lo, hi, n: int,
                  clock: str) -> tuple[list[dict], dict]:
    """Both routes for every variant that has a smooth model; smooth.csv rewritten after each certificate."""
    vcfg = cfg.verify
    path = out / "smooth.csv"
    done = {(r["variant"], int(r["sample"]), format_real(float(r["eps"])), r["route"]): r for r in read_rows(path)}
    rows: list[dict[str, Any]] = []
    models: dict[str, Any] = {}
    verifiers = {route: registry.get_verifier(name) for route, name in ROUTES.items()}
    for variant in cfg.variants:
        facts = variant_facts(run, variant)
        if not facts.get("smooth"):
            continue
        src = run.file("train", variant, "best.pt")
        model, _ = checkpoint.load_model(src)
        try:
            net = netmod.from_torch(model, info.input_shape)
        except netmod.UnsupportedModel as e:
            models[variant] = {"network": None, "note": f"not certified: {e}"}
            continue
        lam = [float(layer.lam.mean()) for layer in net.layers if isinstance(layer, netmod.Gate)]
        models[variant] = {"network": str(src.relative_to(run.path)), "activation": facts.get("activation"),
                           "mean_lambda_per_layer": [round(v, 4) for v in lam]}

        def recheck(x: np.ndarray, model=model) -> np.ndarray:
            with torch.no_grad():
                return model(torch.as_tensor(x, dtype=torch.float32).reshape(1, *info.input_shape)).double().numpy().reshape(-1)

        with torch.no_grad():
            predicted = [int(v) for v in model(torch.as_tensor(xs, dtype=torch.float32).reshape(n, *info.input_shape)).argmax(1)]
        models[variant]["clean_correct"] = int(sum(p == c for p, c in zip(predicted, labels)))
        for eps in vcfg.epsilons:
            for k in range(n):
                spec = robustness_spec(xs[k], eps, lo, hi, labels[k], info.num_classes)
                for route, solver in verifiers.items():
                    prev = done.get((variant, k, format_real(eps), route))
                    if prev is not None:
                        rows.append(prev)
                        continue
                    row: dict[str, Any] = {"variant": variant, "sample": k, "eps": format_real(eps), "route": route,
                                           "network": f"smooth {facts.get('activation')} ({src.relative_to(run.path)})",
                                           "label": labels[k], "predicted": predicted[k]}
                    if predicted[k] != labels[k]:
                        row.update(result="sat", seconds=0.0, margin_lb="", gap_max="",
                                   message=f"the smooth network predicts {predicted[k]} at the sample itself")
                    else:
                        problem = registry.Problem([spec], network=net, recheck=recheck)
                        res = solver.run(problem, registry.Budget(vcfg.timeout_s, clock))
                        row.update(result=res.status, seconds=round(res.seconds, 4), margin_lb=_r(res.info.get("margin_lb")),
                                   gap_max=_r(res.info.get("gap_max")), message=_clean(res.message))
                    rows.append(row)
                    atomic_write_csv(path, rows, SMOOTH_FIELDS)
    atomic_write_csv(path, rows, SMOOTH_FIELDS)
    return rows, models


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
        if registry.MarabouVerifier.available():
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
            netmod.from_onnx(path)
            entry["ours"] = {"ok": True, "message": "read"}
        except netmod.UnsupportedModel as e:
            entry["ours"] = {"ok": False, "message": str(e).split(";")[0]}
        out[variant] = entry
    return out


# ---------------------------------------------------------------------------------------------
# summaries


def _counts(sel: Sequence[dict[str, Any]]) -> dict[str, int]:
    return {s: sum(r["result"] == s for r in sel) for s in registry.RESULTS}


def summarize(rows: list[dict[str, Any]], variants: Sequence[str], epsilons: Sequence[float],
              verifiers: Sequence[str]) -> list[dict[str, Any]]:
    """Per variant × eps × verifier: counts, fractions over all properties (a misclassified sample counts as
    sat), median wall and CPU seconds over the properties a verifier ran on, mean unstable ReLUs."""
    out = []
    for v in variants:
        for eps in epsilons:
            for name in verifiers:
                sel = [r for r in rows if r["variant"] == v and format_real(float(r["eps"])) == format_real(eps)
                       and r["verifier"] == name]
                if not sel:
                    continue
                c = _counts(sel)
                ran = [r for r in sel if r["stage"] != "clean"]
                m = len(sel)

                def mean(key: str) -> float | None:
                    vals = [float(r[key]) for r in ran if str(r.get(key, "")) != ""]
                    return statistics.fmean(vals) if vals else None

                out.append({"variant": v, "eps": float(eps), "verifier": name, "properties": m, **c,
                            "misclassified": sum(r["stage"] == "clean" for r in sel),
                            "certified_fraction": c["unsat"] / m, "falsified_fraction": c["sat"] / m,
                            "decided_fraction": (c["sat"] + c["unsat"]) / m,
                            "median_seconds": statistics.median(float(r["seconds"]) for r in ran) if ran else None,
                            "median_cpu_seconds": statistics.median(float(r["cpu_seconds"]) for r in ran) if ran else None,
                            "max_seconds": max(float(r["seconds"]) for r in ran) if ran else None,
                            "mean_unstable_ibp": mean("unstable_ibp"), "mean_unstable_tight": mean("unstable_tight"),
                            "relus": int(sel[0]["relus"])})
    return out


def summarize_smooth(rows: list[dict[str, Any]], variants: Sequence[str], epsilons: Sequence[float]) -> list[dict[str, Any]]:
    out = []
    for v in variants:
        for eps in epsilons:
            for route in ROUTES:
                sel = [r for r in rows if r["variant"] == v and format_real(float(r["eps"])) == format_real(eps)
                       and r["route"] == route]
                if not sel:
                    continue
                c = _counts(sel)
                ran = [float(r["seconds"]) for r in sel if float(r["seconds"]) > 0]
                out.append({"variant": v, "eps": float(eps), "route": route, "properties": len(sel), **c,
                            "certified_fraction": c["unsat"] / len(sel), "falsified_fraction": c["sat"] / len(sel),
                            "median_seconds": statistics.median(ran) if ran else None})
    return out


def conflicts(rows: list[dict[str, Any]]) -> list[str]:
    """Properties that one verifier proved and another falsified (there should be none)."""
    seen: dict[tuple, set[str]] = {}
    for r in rows:
        seen.setdefault((r["variant"], int(r["sample"]), format_real(float(r["eps"]))), set()).add(r["result"])
    return [property_name(v, s, float(e)) for (v, s, e), st in seen.items() if {"sat", "unsat"} <= st]


# ---------------------------------------------------------------------------------------------
# report


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
    if "networks" not in s:  # written by an older version of this stage
        return "## Verification (L∞ local robustness)\n\nverify/summary.json predates this report; rerun the verify stage."
    clock = "wall-clock" if s["clock"] == "wall" else "CPU"
    main = s["verifiers"][0]
    out = ["## Verification (L∞ local robustness)",
           f"Properties: {s['sample_selection']}; the true class's logit beats every other on the L∞ box of radius ε "
           f"clipped to the input range {s['input_range']}. Limit: {s['timeout_s']:g} s of {clock} time per property (and "
           f"per smooth certificate). Certified = unsat (proved); falsified = sat (a counterexample, re-checked on the "
           f"network itself; a sample the network already misclassifies counts as falsified)."]
    eps_cols = [f"ε = {e:g}" for e in s["epsilons"]]
    rows = []
    for v in [m for m, x in s["models"].items() if x.get("onnx")]:
        cells = []
        for e in s["epsilons"]:
            r = next((t for t in s["table"] if t["variant"] == v and t["eps"] == e and t["verifier"] == main), None)
            cells.append("—" if r is None else f"{pct(r['certified_fraction'])} ({pct(r['falsified_fraction'])} sat)")
        label = f"{v} (ReLU from the start)" if s["models"][v].get("activation") in ("relu", "linked_relu") else f"{v} swapped to ReLU"
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
               f"**smooth** = {s['networks']['smooth']}. The smooth routes: *direct* proves the smooth network itself "
               "through sound linear relaxations of x·Φ(λx); *via the swap* proves the ReLU network with the same weights "
               "and carries the proof over where its margin exceeds the sound bound on |smooth − ReLU| over the box "
               "(per logit, from the pre-activation bounds; each unit adds at most c/λ, exponentially less when its "
               "interval stays away from 0).")
    detail = [[r["variant"], f"{r['eps']:g}", r["verifier"], r["properties"], r["unsat"], r["sat"], r["timeout"],
               r["unknown"] + r["error"], pct(r["decided_fraction"]), _sec(r["median_seconds"]), _sec(r["max_seconds"]),
               "—" if r["mean_unstable_ibp"] is None else f"{r['mean_unstable_ibp']:.0f}",
               "—" if r["mean_unstable_tight"] is None else f"{r['mean_unstable_tight']:.0f}", r["relus"]]
              for r in s["table"]]
    out.append("How the swapped ReLU networks were decided (unstable ReLUs: the input interval crosses 0 over the box; "
               "IBP vs the tight CROWN/α-CROWN bounds branch and bound starts from):\n\n" + table(
                   ["model", "ε", "verifier", "properties", "unsat", "sat", "timeout", "unknown/error", "decided",
                    f"median {s['clock']} s", f"max {s['clock']} s", "unstable (IBP)", "unstable (tight)", "ReLUs"], detail))
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
