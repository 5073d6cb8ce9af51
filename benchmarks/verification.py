"""Verification goals, measured on a finished default run and the stand-ins (2 CPU cores, one torch thread).

    .venv/bin/python -m benchmarks.verification --run RUN                        # every section
    .venv/bin/python -m benchmarks.verification --run RUN --only goal,crosscheck  # some; merged into verification.json
    .venv/bin/python -m benchmarks.verification --run RUN --samples 50

RUN is a finished default run's directory (`pipeline run`, stages train..export), e.g. runs/<name>.

Sections:
- goal: the three swapped ReLU networks (λ-GELU, GELU, ReLU from scratch) of the run, ε = 0.005, the first
  `--samples` validation samples each network classifies correctly: decided fraction, median and max wall
  seconds per property, which stage decided, under the staged verifier with `--timeout` wall seconds.
- crosscheck: properties the staged verifier decided, re-decided by complete methods run to the end on their
  own: the MILP (HiGHS branch and cut instead of our branch and bound; every disjunct through it) and Marabou
  (its own bounds and search); any disagreement is a wrong answer.
- certified: ε ∈ {0.005, 0.01, 0.02}: certified fraction of each swapped network and of the smooth λ-GELU and
  GELU networks by both routes (direct through the gates; via the swap), on the same samples.
- stage: the default verify stage (`VerifyConfig()` defaults) on a copy of the run: total wall seconds and what
  it decided.
- vnncomp: the stand-ins of VNN-COMP benchmarks that `benchmarks/standins.py` builds (mnist_fc's MLPs, a CNN, a
  ResNet; NOT the public benchmarks, which cannot be downloaded here), run through `pipeline vnncomp`'s library call.

Writes benchmarks/verification.json and benchmarks/VERIFICATION.md; the load average is recorded next to
every timing (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from analysis.verification import registry
from analysis.verification.complete_verifiers import MarabouVerifier, MilpVerifier
from analysis.verification.graph import Graph
from analysis.verification.problem import RESULTS, Budget, Problem, Result
from analysis.verification.readers import from_onnx, from_torch
from analysis.verification.vnnlib import robustness_spec
from pipeline import checkpoint
from pipeline.config import from_dict
from pipeline.data import dataset_for

from . import common

HERE = Path(__file__).resolve().parent
VARIANTS = ("lambda_gelu", "gelu", "relu")
SMOOTH = ("lambda_gelu", "gelu")
EPSILONS = (0.005, 0.01, 0.02)


def _setup(run_dir: Path):
    cfg = from_dict(json.loads((run_dir / "config.json").read_text()))
    ds = dataset_for(cfg)
    return cfg, ds


def _relu_net(run_dir: Path, variant: str, ds, tmp: Path) -> tuple[Path, Graph]:
    """The verify stage's ONNX of the swapped model (export_for_verifiers), and its network."""
    from quantize.export import export_for_verifiers

    path = tmp / f"{variant}.onnx"
    if not path.is_file():
        model, _ = checkpoint.load_model(run_dir / "swap" / variant / "relu.pt")
        export_for_verifiers(model, ds.info.input_shape, path, ds.val.x[:256])
    return path, from_onnx(path)


def _samples(ds, nets: dict[str, Any], n: int) -> list[int]:
    """The first n validation samples that every network given classifies correctly."""
    out = []
    xs = ds.val.x.double().reshape(len(ds.val.y), -1)
    for k in range(len(ds.val.y)):
        if all(int(net(xs[k]).argmax()) == int(ds.val.y[k]) for net in nets.values()):
            out.append(k)
        if len(out) == n:
            break
    return out


def _spec(ds, k: int, eps: float):
    x = ds.val.x[k].double().numpy().reshape(-1)
    return robustness_spec(x, eps, np.asarray(ds.info.input_low), np.asarray(ds.info.input_high), int(ds.val.y[k]),
                           ds.info.num_classes)


def _run(verifier, net, onnx_path, spec, timeout: float, recheck=None) -> Result:
    problem = Problem([spec], network=net, onnx=onnx_path, recheck=recheck)
    return verifier.run(problem, Budget(timeout, "wall"))


def _stats(results: list[Result]) -> dict[str, Any]:
    c = Counter(r.status for r in results)
    secs = [r.seconds for r in results]
    return {"properties": len(results), **{s: c[s] for s in RESULTS},
            "decided_fraction": (c["sat"] + c["unsat"]) / len(results), "certified_fraction": c["unsat"] / len(results),
            "median_seconds": statistics.median(secs), "p90_seconds": float(np.percentile(secs, 90)), "max_seconds": max(secs),
            "mean_seconds": statistics.fmean(secs), "decided_by": dict(Counter(r.stage for r in results if r.status in ("sat", "unsat")))}


# ---------------------------------------------------------------------------------------------
# sections


def section_goal(args, run_dir: Path, tmp: Path, log) -> dict[str, Any]:
    _cfg, ds = _setup(run_dir)
    nets = {v: _relu_net(run_dir, v, ds, tmp) for v in VARIANTS}
    ks = _samples(ds, {v: n.forward for v, (_, n) in nets.items()}, args.samples)
    verifier = registry.get_verifier("auto")
    out: dict[str, Any] = {"eps": 0.005, "samples": ks, "timeout_s": args.timeout, "verifier": registry.resolve("auto"),
                           "models": {}, "load_before": common.load()}
    every: list[Result] = []
    for v, (path, net) in nets.items():
        res = []
        for k in ks:
            r = _run(verifier, net, path, _spec(ds, k, 0.005), args.timeout)
            res.append(r)
            if r.status not in ("sat", "unsat"):
                log(f"  {v} sample {k}: {r.status} after {r.seconds:.1f} s: {r.message[:200]}")
        every += res
        out["models"][v] = {**_stats(res), "unstable_ibp_mean": statistics.fmean(r.info.get("unstable_ibp", 0) for r in res),
                            "unstable_tight_mean": statistics.fmean(r.info.get("unstable_tight", 0) for r in res if "unstable_tight" in r.info)
                            if any("unstable_tight" in r.info for r in res) else None,
                            "per_property": [{"sample": k, "result": r.status, "stage": r.stage, "seconds": round(r.seconds, 4),
                                              "unstable_ibp": r.info.get("unstable_ibp"), "unstable_tight": r.info.get("unstable_tight")}
                                             for k, r in zip(ks, res)]}
        log(f"  {v}: {out['models'][v]['decided_fraction']:.3f} decided, median {out['models'][v]['median_seconds']:.3f} s, "
            f"max {out['models'][v]['max_seconds']:.2f} s, by {out['models'][v]['decided_by']}")
    out["all"] = _stats(every)
    out["load_after"] = common.load()
    return out


def section_crosscheck(args, run_dir: Path, tmp: Path, log) -> dict[str, Any]:
    """Re-decide a sample of properties with complete methods run to the end on their own: the MILP (big-M from
    the tight bounds, but every disjunct through the MILP, none closed by the bounds) and Marabou (its own
    bounds). The sample: the first --crosscheck samples per model at ε = 0.005 and 0.01, plus every property the
    goal section decided by branch and bound (the hard ones)."""
    from analysis.verification.vnnlib import write_vnnlib

    _cfg, ds = _setup(run_dir)
    nets = {v: _relu_net(run_dir, v, ds, tmp) for v in VARIANTS}
    ks = _samples(ds, {v: n.forward for v, (_, n) in nets.items()}, args.samples)
    todo = [(v, k, eps) for eps in (0.005, 0.01) for v in VARIANTS for k in ks[: args.crosscheck]]
    prev = json.loads(Path(args.out).read_text()).get("goal", {}) if Path(args.out).is_file() else {}
    for v, m in prev.get("models", {}).items():
        todo += [(v, p["sample"], 0.005) for p in m["per_property"] if p["stage"] == "bab" and (v, p["sample"], 0.005) not in todo]
    staged = registry.get_verifier("auto")
    milp_all = MilpVerifier(skip_closed=False)
    marabou = MarabouVerifier(tight_bounds=False) if MarabouVerifier.available() else None
    rows, wrong = [], 0
    for v, k, eps in todo:
        path, net = nets[v]
        spec = _spec(ds, k, eps)
        a = _run(staged, net, path, spec, args.timeout)
        if a.status not in ("sat", "unsat"):
            continue
        vnn = tmp / f"{v}_{k}_{eps}.vnnlib"
        write_vnnlib(vnn, spec)
        b = milp_all.run(Problem([spec], network=net, onnx=path), Budget(args.crosscheck_timeout))
        c = marabou.run(Problem([spec], onnx=path, vnnlib_path=vnn), Budget(args.crosscheck_timeout)) \
            if marabou is not None else None
        bad = any(x is not None and x.status in ("sat", "unsat") and x.status != a.status for x in (b, c))
        wrong += bad
        rows.append({"variant": v, "sample": k, "eps": eps, "staged": a.status, "staged_stage": a.stage,
                     "staged_seconds": round(a.seconds, 3), "milp": b.status, "milp_seconds": round(b.seconds, 2),
                     "marabou": c.status if c else "not installed", "marabou_seconds": round(c.seconds, 2) if c else None,
                     "disagree": bad})
        log(f"  {v} k={k} eps={eps}: staged {a.status} ({a.stage}, {a.seconds:.2f}s), milp {b.status} {b.seconds:.1f}s, "
            f"marabou {c.status if c else '-'} {c.seconds if c else 0:.1f}s{'  DISAGREE' if bad else ''}")
    return {"rows": rows, "checked": len(rows), "wrong_answers": wrong,
            "milp_agrees": sum(r["milp"] == r["staged"] for r in rows),
            "marabou_agrees": sum(r["marabou"] == r["staged"] for r in rows),
            "crosscheck_timeout_s": args.crosscheck_timeout,
            "note": "a property counts when the staged verifier decided it; 'agrees' counts the independent method "
                    "reaching the same answer within its limit (a timeout neither agrees nor disagrees)",
            "load": common.load()}


def section_certified(args, run_dir: Path, tmp: Path, log) -> dict[str, Any]:
    _cfg, ds = _setup(run_dir)
    nets = {v: _relu_net(run_dir, v, ds, tmp) for v in VARIANTS}
    smooth = {}
    for v in SMOOTH:
        model, _ = checkpoint.load_model(run_dir / "train" / v / "best.pt")
        smooth[v] = (model, from_torch(model, ds.info.input_shape))
    every = {**{v: n.forward for v, (_, n) in nets.items()}, **{f"smooth_{v}": n.forward for v, (_, n) in smooth.items()}}
    ks = _samples(ds, every, args.certified_samples)
    staged = registry.get_verifier("auto")
    routes = {"direct": registry.get_verifier("pgd+crown+alpha-crown"), "via-relu": registry.get_verifier("via-relu")}
    out: dict[str, Any] = {"samples": ks, "timeout_s": args.certified_timeout, "epsilons": list(EPSILONS), "rows": [],
                           "load_before": common.load()}
    for eps in EPSILONS:
        for v, (path, net) in nets.items():
            res = [_run(staged, net, path, _spec(ds, k, eps), args.certified_timeout) for k in ks]
            out["rows"].append({"network": f"{v} swapped ReLU (ONNX)", "variant": v, "route": "staged", "eps": eps, **_stats(res)})
            log(f"  eps {eps} {v} relu: certified {out['rows'][-1]['certified_fraction']:.2f}, sat {out['rows'][-1]['sat']}, "
                f"median {out['rows'][-1]['median_seconds']:.2f} s")
        for v, (model, net) in smooth.items():
            def recheck(x, model=model):
                with torch.no_grad():
                    return model(torch.as_tensor(x, dtype=torch.float32).reshape(1, *ds.info.input_shape)).double().numpy().reshape(-1)
            for route, verifier in routes.items():
                res = [verifier.run(Problem([_spec(ds, k, eps)], network=net, recheck=recheck),
                                    Budget(args.certified_timeout)) for k in ks]
                out["rows"].append({"network": f"{v} smooth (train best.pt)", "variant": v, "route": route, "eps": eps, **_stats(res)})
                log(f"  eps {eps} {v} smooth {route}: certified {out['rows'][-1]['certified_fraction']:.2f}, "
                    f"median {out['rows'][-1]['median_seconds']:.2f} s")
    out["load_after"] = common.load()
    return out


def section_stage(args, run_dir: Path, tmp: Path, log) -> dict[str, Any]:
    """The default verify stage on a copy of the run (its config's verify block reset to today's defaults)."""
    from analysis.robustness.properties import is_int8
    from pipeline.stages.verify import run_verify
    from pipeline.config import VerifyConfig
    from pipeline.rundir import RunDir
    from pipeline.cores import choose_threads

    dst = tmp / "stage-run"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(run_dir, dst, ignore=shutil.ignore_patterns("verify", "report"))
    cfg, _ = _setup(run_dir)
    cfg.verify = VerifyConfig()
    run = RunDir(dst, cfg)
    load0 = common.load()
    threads = torch.get_num_threads()
    # the thread count `pipeline run` gives its stages (verify.jobs = 0 follows it), not this script's one thread
    torch.set_num_threads(choose_threads(cfg.threads))
    t0 = time.perf_counter()
    try:
        metrics = run_verify(cfg, run)
    finally:
        torch.set_num_threads(threads)
    seconds = time.perf_counter() - t0
    summary = json.loads((dst / "verify" / "summary.json").read_text())
    floats = [r for r in summary["table"] if not is_int8(r["variant"])]
    int8 = [r for r in summary["table"] if is_int8(r["variant"])]
    decided = sum(r["sat"] + r["unsat"] for r in floats)
    total = sum(r["properties"] for r in floats)
    log(f"  default verify stage: {seconds:.1f} s, {decided}/{total} ReLU properties decided")
    return {"seconds": seconds, "config": vars(VerifyConfig()), "jobs": summary["jobs"], "relu_properties": total, "relu_decided": decided,
            "relu_certified": sum(r["unsat"] for r in floats),
            "int8_properties": sum(r["properties"] for r in int8), "int8_decided": sum(r["sat"] + r["unsat"] for r in int8),
            "int8_certified": sum(r["unsat"] for r in int8), "int8_seconds": summary.get("int8_solve_seconds"),
            "smooth_certificates": sum(r["properties"] for r in summary["smooth_table"]),
            "smooth_certified": sum(r["unsat"] for r in summary["smooth_table"]),
            "table": summary["table"], "smooth_table": summary["smooth_table"], "metrics": metrics,
            "load_before": load0, "load_after": common.load()}


def section_vnncomp(args, run_dir: Path, tmp: Path, log) -> dict[str, Any]:
    """The stand-ins of VNN-COMP benchmarks (`benchmarks/standins.py` makes the folders) through
    `pipeline vnncomp`'s library call, at `--vnncomp-timeout` seconds per instance (0: each instance's own limit,
    VNN-COMP's) with `--jobs` worker processes."""
    from analysis.verification.vnncomp import run_benchmark, summary

    out: dict[str, Any] = {}
    for name in args.standins.split(","):
        folder = Path(args.standins_dir) / name
        if not (folder / "instances.csv").is_file():
            raise SystemExit(f"{folder}/instances.csv is missing: make the stand-ins first with "
                             f"`.venv/bin/python -m benchmarks.standins`")
        limit = args.vnncomp_timeout or None
        load0 = common.load()
        t0 = time.perf_counter()
        if args.results:  # read what `pipeline vnncomp` wrote (the command is in the note) instead of running again
            from analysis.verification.vnncomp import read_results

            src = Path(args.results.format(name=name))
            rows = read_results(src)
            load0 = None  # recorded where the run was made (benchmarks/VERIFICATION-summary.md), not at this read
            log(f"  {name}: read {src}")
        else:
            rows = run_benchmark(folder, tmp / f"{name}-results.csv", timeout_override=limit, jobs=args.jobs)
        seconds = None if args.results else time.perf_counter() - t0  # a run read back was timed where it ran
        log(f"  {name}: {summary(rows)}" + (f" in {seconds:.0f} s" if seconds is not None else ""))
        by: dict[str, Counter] = {}
        for r in rows:
            key = f"{Path(r['onnx']).stem} eps={Path(r['vnnlib']).stem.split('_eps_')[-1]}"
            by.setdefault(key, Counter())[r["result"]] += 1
        decided = [r["run_time"] for r in rows if r["result"] in ("sat", "unsat")]
        out[name] = {"folder": str(folder), "instances": len(rows), "summary": summary(rows), "seconds": seconds,
                     "timeout_s": limit or "instances.csv", "jobs": args.jobs,
                     "counts": dict(Counter(r["result"] for r in rows)),
                     "by_network_and_eps": {k: dict(v) for k, v in sorted(by.items())},
                     "median_run_time": statistics.median(r["run_time"] for r in rows),
                     "median_decided_run_time": statistics.median(decided) if decided else None,
                     "rows": [{k: r.get(k) for k in ("onnx", "vnnlib", "result", "run_time", "prepare_time", "stage")} for r in rows],
                     "note": "stand-ins built here on Fashion-MNIST (benchmarks/STANDINS.md); NOT the public benchmarks",
                     "source": args.results.format(name=name) if args.results else "run here",
                     "load_before": load0, "load_after": common.load() if load0 is not None else None}
    return out


SECTIONS = {"goal": section_goal, "crosscheck": section_crosscheck, "certified": section_certified, "stage": section_stage,
            "vnncomp": section_vnncomp}


def markdown(res: dict[str, Any]) -> str:
    from pipeline.render import table

    m = res["machine"]
    summary = HERE / "VERIFICATION-summary.md"  # hand-written: the goals, each with its number and where it comes from
    out = ["# Verification benchmarks", *([summary.read_text().strip()] if summary.is_file() else []),
           f"Machine: {m['cpu']}, {m['cores_available']} cores (shared with other jobs), torch threads 1. "
           f"Run: `{res.get('run')}`. Command: `.venv/bin/python -m benchmarks.verification` (sections with `--only`). "
           "Times are wall-clock seconds; the load average (1, 5, 15 min) is recorded beside each section.",
           "Measured at: " + ", ".join(f"{k} {res[k].get('commit') or 'before the engine rewrite (commit a539506), with the earlier engine'}"
                                        for k in SECTIONS if k in res) + "."]
    g = res.get("goal")
    if g:
        rows = [[v, s["properties"], s["unsat"], s["sat"], s["timeout"] + s["unknown"] + s["error"], f"{100 * s['decided_fraction']:.1f}%",
                 f"{s['median_seconds']:.3f}", f"{s['p90_seconds']:.2f}", f"{s['max_seconds']:.2f}",
                 f"{s['unstable_ibp_mean']:.0f}", "—" if s["unstable_tight_mean"] is None else f"{s['unstable_tight_mean']:.0f}",
                 ", ".join(f"{k} {n}" for k, n in sorted(s["decided_by"].items()))] for v, s in g["models"].items()]
        a = g["all"]
        rows.append(["all", a["properties"], a["unsat"], a["sat"], a["timeout"] + a["unknown"] + a["error"],
                     f"{100 * a['decided_fraction']:.1f}%", f"{a['median_seconds']:.3f}", f"{a['p90_seconds']:.2f}", f"{a['max_seconds']:.2f}",
                     "", "", ", ".join(f"{k} {n}" for k, n in sorted(a["decided_by"].items()))])
        out.append(f"## Goal: ε = 0.005, {len(g['samples'])} correctly classified validation samples per model\n\n"
                   f"Staged verifier `{g['verifier']}`, limit {g['timeout_s']:g} s per property. Load {g['load_before']} → {g['load_after']}.\n\n"
                   + table(["swapped model", "properties", "unsat", "sat", "undecided", "decided", "median s", "p90 s", "max s",
                            "unstable (IBP)", "unstable (tight)", "decided by"], rows))
    c = res.get("crosscheck")
    if c:
        out.append(f"## Cross-check: {c['checked']} decided properties re-decided by complete methods run on their own\n\n"
                   f"The MILP (every disjunct through it, none closed by the bounds) agrees on {c['milp_agrees']}, "
                   f"Marabou (its own bounds) on {c['marabou_agrees']} "
                   f"(limit {c['crosscheck_timeout_s']:g} s each; a timeout neither agrees nor disagrees). "
                   f"**Wrong answers: {c['wrong_answers']}.** Load {c['load']}.")
    ce = res.get("certified")
    if ce:
        eps = ce["epsilons"]
        nets = list(dict.fromkeys((r["network"], r["route"]) for r in ce["rows"]))
        rows = []
        for net, route in nets:
            cells = []
            for e in eps:
                r = next(x for x in ce["rows"] if x["network"] == net and x["route"] == route and x["eps"] == e)
                cells.append(f"{100 * r['certified_fraction']:.0f}% ({100 * r['sat'] / r['properties']:.0f}% sat, median {r['median_seconds']:.2f} s)")
            how = {"staged": "staged (attack, CROWN, α-CROWN, BaB)", "direct": "direct through the gates",
                   "via-relu": "via the swap (ReLU margin − gap bound)"}[route]
            rows.append([net, how, *cells])
        out.append(f"## Certified fraction, {len(ce['samples'])} samples, limit {ce['timeout_s']:g} s per property\n\n"
                   f"Load {ce['load_before']} → {ce['load_after']}.\n\n" + table(["network", "method", *[f"ε = {e:g}" for e in eps]], rows))
    s = res.get("stage")
    if s:
        out.append(f"## The default verify stage\n\n`VerifyConfig()` = {s['config']}, {s.get('jobs', 1)} worker process(es): "
                   f"**{s['seconds']:.1f} s** in total; "
                   f"{s['relu_decided']}/{s['relu_properties']} ReLU properties decided ({s['relu_certified']} certified), "
                   + (f"{s['int8_decided']}/{s['int8_properties']} int8 properties decided ({s['int8_certified']} certified) in "
                      f"{s['int8_seconds']:.1f} s of it, " if s.get("int8_properties") else "")
                   + f"{s['smooth_certified']}/{s['smooth_certificates']} smooth certificates. Load {s['load_before']} → {s['load_after']}. "
                   "(Before the verification engine: 15 properties in 162 s, 14 timeouts, 0 certified.)")
    for name, v in (res.get("vnncomp") or {}).items():
        if not isinstance(v, dict):  # the section's own argv, commit and seconds
            continue
        rows = [[k, *[d.get(x, 0) for x in ("unsat", "sat", "timeout", "unknown", "error")]] for k, d in v["by_network_and_eps"].items()]
        med = "—" if v["median_decided_run_time"] is None else f"{v['median_decided_run_time']:.2f} s"
        out.append(f"## Stand-in `{name}` at {v['timeout_s']} s per instance, {v['jobs']} jobs\n\n"
                   f"{v['note']}. Folder `{v['folder']}` (git-ignored); {v['summary']}; median run time {v['median_run_time']:.2f} s "
                   f"(decided ones: {med})" + (f"; {v['seconds']:.0f} s in all. " if v.get("seconds") is not None else ". ")
                   + (f"Load {v['load_before']} → {v['load_after']}." if v.get("load_before") else
                      f"Read from `{v.get('source')}` (written by `pipeline vnncomp runs/standins/{name} --timeout 30 --jobs 2 --out …`).")
                   + "\n\n"
                   + table(["network, ε", "unsat", "sat", "timeout", "unknown", "error"], rows))
    return "\n\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True, help="a finished default run's directory (train..export)")
    p.add_argument("--only", default=",".join(SECTIONS), help=f"sections: {', '.join(SECTIONS)}")
    p.add_argument("--samples", type=int, default=50)
    p.add_argument("--timeout", type=float, default=30.0, help="goal section: wall seconds per property")
    p.add_argument("--crosscheck", type=int, default=6, help="samples per model and eps re-decided in the cross-check")
    p.add_argument("--crosscheck-timeout", type=float, default=120.0)
    p.add_argument("--certified-samples", type=int, default=50)
    p.add_argument("--certified-timeout", type=float, default=5.0)
    p.add_argument("--standins-dir", default="runs/standins", help="where benchmarks.standins wrote the folders")
    p.add_argument("--standins", default="mnist_fc,conv,resnet", help="vnncomp section: which stand-ins")
    p.add_argument("--vnncomp-timeout", type=float, default=30.0, help="vnncomp section: seconds per instance (0: instances.csv's)")
    p.add_argument("--jobs", type=int, default=2, help="vnncomp section: instances solved at once")
    p.add_argument("--results", default="", help="vnncomp section: read results.csv files `pipeline vnncomp RUNS/standins/"
                   "{name} --timeout T --jobs J --out FILE` wrote (a pattern with {name}) instead of running")
    p.add_argument("--out", default=str(HERE / "verification.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    run_dir = Path(args.run)
    if not run_dir.is_dir():
        raise SystemExit(f"error: --run {run_dir} is not a directory; pass a finished default run (pipeline run)")
    out_path = Path(args.out)
    res: dict[str, Any] = json.loads(out_path.read_text()) if out_path.is_file() else {}
    res.update(machine=common.machine(), versions=common.versions(), run=str(run_dir))
    tmp = Path("runs") / "verification-bench"
    tmp.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(msg, flush=True)

    for name in [s.strip() for s in args.only.split(",") if s.strip()]:
        if name not in SECTIONS:
            print(f"unknown section {name!r}; choose from {', '.join(SECTIONS)}", file=sys.stderr)
            return 2
        log(f"[{name}] load {common.load()}")
        t0 = time.perf_counter()
        res[name] = {**SECTIONS[name](args, run_dir, tmp, log), "section_seconds": time.perf_counter() - t0,
                     "argv": sys.argv[1:], "commit": common.commit()}
        out_path.write_text(json.dumps(res, indent=2, default=str) + "\n")
        (HERE / "VERIFICATION.md").write_text(markdown(res))
        log(f"[{name}] done in {time.perf_counter() - t0:.0f} s, load {common.load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
