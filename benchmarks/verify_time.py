"""Where the verifier's time goes (issue 40, items 1 and 4): the verify stage on finished runs before and after, and
every time limit held.

    # the verify stage again on copies of finished runs (their verify/ made by an earlier commit: the "before")
    python -m benchmarks.verify_time stage --runs /work/runs --names preact816,preact1632,cnn1632,deit32x2,mlp \
        --work /work/runs-i40sched
    # api.verify's limit on a model whose one CROWN pass is longer than the limit (timm's ViT, as in the issue)
    python -m benchmarks.verify_time limits --timeout 30 --samples 2

Sections:
- stage: each run of `--names` under `--runs` is copied to `--work` (its verify/ replaced) and its verify stage rerun
  (`pipeline run --resume COPY --redo verify`, this checkout's code, one process). Per run, before (the original's
  verify/summary.json) and after: float ReLU, int8 and smooth (either route) properties decided, the verify stage's
  seconds, each part's first pass (one CROWN pass per network, measured on its first property; whether the budget
  covered it) and the open properties' reasons.
- standin: two `pipeline vnncomp` results of the same stand-in folder (`--before`, `--after`: results.csv files),
  compared instance by instance: decided per network, the instances whose answer changed, sat/unsat conflicts, the
  largest run_time against the limit. The runs themselves (under the lock, 2 jobs):
  `pipeline vnncomp FOLDER --instances FILE --timeout 30 --jobs 2 --out CSV`, once from each checkout.
- limits: `analysis.api.verify` with `timeout_s` on timm's `vit_tiny_patch16_224` shrunk to 64 tokens (img 32, patch 4,
  dim 64, depth 2, 2 heads; ReLU, seeded random weights, random images), verifier "crown" and "auto": each property's
  reported seconds and the wall time of the call, against the limit plus one second.

Writes benchmarks/verify-results/issue40.json (merged per section) and benchmarks/verify-results/ISSUE40.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from . import common

HERE = Path(__file__).resolve().parent
OUT = HERE / "verify-results"
ROOT = HERE.parent


def _decided(summary: dict[str, Any], smooth_csv: Path) -> dict[str, Any]:
    """float ReLU, int8 and smooth (either route) decided/properties from a verify stage's summary (an older summary
    counts smooth rows per route: read per property from smooth.csv instead)."""
    import csv

    d = summary["decided"]
    out = {k: [d[k]["decided"], d[k]["properties"]] for k in ("relu", "int8") if k in d}
    rows = list(csv.DictReader(open(smooth_csv))) if smooth_csv.is_file() else []
    either: dict[tuple, bool] = {}
    for r in rows:
        key = (r["variant"], r["sample"], r["eps"])
        either[key] = either.get(key, False) or r["result"] in ("sat", "unsat")
    out["smooth"] = [sum(either.values()), len(either)]
    return out


def _reasons(verify: Path) -> dict[str, dict[str, int]]:
    import csv

    out: dict[str, dict[str, int]] = {}
    for name in ("details.csv", "smooth.csv"):
        path = verify / name
        if not path.is_file():
            continue
        for r in csv.DictReader(open(path)):
            if r["result"] in ("sat", "unsat") or r.get("verifier", "auto") != "auto":
                continue
            kind = "int8" if r["variant"].endswith("-int8") else ("smooth " + r["route"] if "route" in r else "float ReLU")
            why = r.get("reason") or r["result"]
            out.setdefault(kind, {})[why] = out.setdefault(kind, {}).get(why, 0) + 1
    return out


def _measure_run(run: Path) -> dict[str, Any]:
    verify = run / "verify"
    s = json.loads((verify / "summary.json").read_text())
    manifest = json.loads((run / "manifest.json").read_text())
    return {"decided": _decided(s, verify / "smooth.csv"), "stage_seconds": manifest["stages"]["verify"].get("seconds"),
            "solve_seconds": s.get("solve_seconds"), "int8_seconds": s.get("int8_solve_seconds"), "jobs": s.get("jobs"),
            "first_pass": s.get("first_pass"), "open_reasons": _reasons(verify)}


def section_stage(args: argparse.Namespace, log) -> dict[str, Any]:
    out: dict[str, Any] = {}
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    for name in [n for n in args.names.split(",") if n]:
        src, dst = Path(args.runs) / name, work / name
        if not (src / "report" / "report.md").is_file():
            log(f"  {name}: {src} is not a finished run; skipped")
            continue
        before = _measure_run(src)
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(src, dst)
        shutil.rmtree(dst / "verify", ignore_errors=True)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "run", "--resume", str(dst), "--redo", "verify"],
                              cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        (dst / "verify_time.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            log(f"  {name}: the rerun failed ({proc.returncode}); see {dst / 'verify_time.log'}")
            out[name] = {"before": before, "error": proc.returncode}
            continue
        after = _measure_run(dst)
        lines = [ln.strip() for ln in proc.stdout.splitlines() if "cannot cover one bound pass" in ln]
        out[name] = {"before": before, "after": after, "rerun_wall_s": round(wall, 1), "budget_lines": lines,
                     "config": json.loads((dst / "config.json").read_text())["model"]}
        log(f"  {name}: before {before['decided']} {before['stage_seconds']} s; after {after['decided']} "
            f"{after['stage_seconds']} s")
    return {"runs": out, "load": common.load()}


def _vit():
    """timm's vit_tiny_patch16_224 shrunk to 64 tokens (the issue's), ReLU MLPs, seeded weights."""
    import torch
    from torch import nn

    try:
        from pipeline.extras import import_timm  # the shared home of the torchvision repair, where it exists
        timm = import_timm()
    except ImportError:
        lib = torch.library.Library("torchvision", "DEF")  # a CUDA torchvision beside a CPU torch: its C ops' schemas
        for schema in ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
                       "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"):
            lib.define(schema)
        _vit.lib = lib
        import timm
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=4, embed_dim=64, depth=2,
                             num_heads=2, num_classes=10, act_layer=nn.ReLU).eval()


def section_standin(args: argparse.Namespace, log) -> dict[str, Any]:
    from analysis.verification.vnncomp import read_results

    before = {(r["onnx"], r["vnnlib"]): r for r in read_results(Path(args.before))}
    after = {(r["onnx"], r["vnnlib"]): r for r in read_results(Path(args.after))}

    def count(rows: dict) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for (onnx, _), r in rows.items():
            out.setdefault(Path(onnx).stem, {}).setdefault(r["result"], 0)
            out[Path(onnx).stem][r["result"]] += 1
        return out

    changed = [[k[0], k[1], before[k]["result"], after[k]["result"]] for k in before if k in after
               and before[k]["result"] != after[k]["result"]]
    conflicts = [k for k in before if k in after and {before[k]["result"], after[k]["result"]} == {"sat", "unsat"}]
    decided = {n: sum(r["result"] in ("sat", "unsat") for r in rows.values()) for n, rows in (("before", before), ("after", after))}
    out = {"before_file": args.before, "after_file": args.after, "instances": len(after), "decided": decided,
           "by_network": {"before": count(before), "after": count(after)}, "changed": changed,
           "conflicts": [list(k) for k in conflicts], "max_run_time": {
               "before": max(r["run_time"] for r in before.values()), "after": max(r["run_time"] for r in after.values())}}
    log(f"  decided {decided}, changed {len(changed)}, conflicts {len(conflicts)}")
    return out


def section_limits(args: argparse.Namespace, log) -> dict[str, Any]:
    import torch

    from analysis import api

    torch.set_num_threads(1)
    model = _vit()
    x = torch.rand(args.samples, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = model(x).argmax(1)
    out: dict[str, Any] = {"model": "timm vit_tiny_patch16_224, img 32, patch 4, dim 64, depth 2, 2 heads, ReLU, seeded "
                                    "random weights", "timeout_s": args.timeout, "samples": args.samples, "eps": 0.002}
    for verifier in ("crown", "auto"):
        t0 = time.perf_counter()
        res = api.verify(model, (x, y), epsilons=[0.002], samples=args.samples, timeout_s=args.timeout, verifier=verifier,
                         progress=False)
        wall = time.perf_counter() - t0
        rows = [{k: r[k] for k in ("sample", "result", "reason", "seconds", "margin_lb", "message")} for r in res["rows"]]
        worst = max(r["seconds"] for r in rows)
        out[verifier] = {"rows": rows, "max_seconds": round(worst, 3), "wall_s": round(wall, 2),
                         "held": worst <= args.timeout + 1.0, "first_pass_s": res["first_pass"], "note": res["note"]}
        log(f"  {verifier}: max {worst:.2f} s per property (limit {args.timeout:g}), call {wall:.1f} s; "
            f"{Counter(r['result'] for r in rows)}")
    out["load"] = common.load()
    return out


SECTIONS = {"stage": section_stage, "standin": section_standin, "limits": section_limits}


def markdown(res: dict[str, Any]) -> str:
    from pipeline.render import table

    summary = OUT / "ISSUE40-summary.md"  # hand-written: the goals, each with its number
    out = ["# Issue 40: time where it decides (the verify stage, api.verify, pipeline vnncomp)",
           *([summary.read_text().strip()] if summary.is_file() else []),
           f"Machine: {res['machine']['cpu']}, {res['machine']['cores_available']} cores (shared), torch threads 1. "
           "Command: `python -m benchmarks.verify_time SECTION` (see its docstring). Measured at "
           + ", ".join(f"{k} {res[k]['commit']}" for k in SECTIONS if k in res) + "."]
    st = res.get("stage")
    if st:
        rows = []
        for name, r in st["runs"].items():
            if "after" not in r:
                rows.append([name, "rerun failed", "", "", "", ""])
                continue
            b, a = r["before"], r["after"]

            def cell(k: str) -> str:
                if k not in b["decided"] or k not in a["decided"]:
                    return "—"
                (db, nb), (da, na) = b["decided"][k], a["decided"][k]
                return f"{db}/{nb} → **{da}/{na}**"

            covered = "; ".join(f"{part}: " + ("covered" if p["covered"] else
                                                f"**short**: {p['needed_s']:.0f} s needed, {p['budget_s']:g} s given")
                                for part, p in (a.get("first_pass") or {}).items())
            rows.append([name, cell("relu"), cell("smooth"), cell("int8"),
                         f"{b['stage_seconds']:.1f} → **{a['stage_seconds']:.1f}**", covered])
        out.append("## The verify stage before (main c1c507a, the run's own verify/) and after (this branch), same run\n\n"
                   "Decided = sat or unsat; smooth = per property, either route; stage = the verify stage's seconds "
                   f"(manifest). Load {st['load']}.\n\n"
                   + table(["run", "float ReLU decided", "smooth decided", "int8 decided", "verify stage s",
                            "first pass (one CROWN pass per property) within the budget?"], rows))
        reasons = [[name, kind, ", ".join(f"{k} {n}" for k, n in why.items())]
                   for name, r in st["runs"].items() if "after" in r for kind, why in r["after"]["open_reasons"].items()]
        if reasons:
            out.append("Why the open properties are open, after (`reason` in details.csv / smooth.csv):\n\n"
                       + table(["run", "network", "open"], reasons))
        costs = [[name, part, ", ".join(f"{n} {c['seconds']:.3g} s" for n, c in p["costs"].items()), f"{p['needed_s']:.0f}",
                  f"{p['budget_s']:g}"]
                 for name, r in st["runs"].items() if "after" in r for part, p in (r["after"].get("first_pass") or {}).items()]
        out.append("One CROWN pass per network, measured on its first property (the stage's own measurement):\n\n"
                   + table(["run", "part", "one pass", "needed for all, s", "budget s"], costs))
    sd = res.get("standin")
    if sd:
        nets = sorted(sd["by_network"]["after"])
        rows = [[n, *[", ".join(f"{k} {v}" for k, v in sorted(sd["by_network"][w].get(n, {}).items())) for w in ("before", "after")]]
                for n in nets]
        out.append(f"## The mnist_fc stand-in, {sd['instances']} instances, 30 s each, 2 jobs: main c1c507a against this "
                   f"branch\n\n`{sd['before_file']}` against `{sd['after_file']}`: decided {sd['decided']['before']} → "
                   f"**{sd['decided']['after']}**; {len(sd['changed'])} instances changed their answer, "
                   f"{len(sd['conflicts'])} sat/unsat conflicts; largest run_time {sd['max_run_time']['before']:.2f} s → "
                   f"{sd['max_run_time']['after']:.2f} s.\n\n" + table(["network", "before", "after"], rows))
    lim = res.get("limits")
    if lim:
        rows = [[v, f"{lim[v]['max_seconds']:.2f}", f"{lim[v]['wall_s']:.1f}", "yes" if lim[v]["held"] else "**no**",
                 ", ".join(f"{k} {n}" for k, n in Counter(f"{r['result']} ({r['reason']})" if r["reason"] else r["result"]
                                                          for r in lim[v]["rows"]).items()), lim[v]["note"] or "—"]
                for v in ("crown", "auto") if v in lim]
        out.append(f"## api.verify's limit: {lim['model']}, ε {lim['eps']}, {lim['samples']} samples, "
                   f"timeout_s={lim['timeout_s']:g}\n\nThe issue measured 49.4 s for one property under timeout_s=30 "
                   f"(verifier crown). Load {lim['load']}.\n\n"
                   + table(["verifier", "max s per property", "call wall s", "held (≤ limit + 1 s)", "answers", "note"],
                           rows))
    return "\n\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sections", nargs="+", choices=list(SECTIONS))
    p.add_argument("--runs", default="/work/runs", help="stage: where the finished runs are")
    p.add_argument("--names", default="preact816,preact1632,cnn1632,deit32x2,mlp", help="stage: the runs, comma-separated")
    p.add_argument("--work", default="runs/verify-time", help="stage: where the copies go")
    p.add_argument("--before", default="", help="standin: the results.csv of the earlier checkout")
    p.add_argument("--after", default="", help="standin: the results.csv of this checkout")
    p.add_argument("--timeout", type=float, default=30.0, help="limits: timeout_s per property")
    p.add_argument("--samples", type=int, default=2, help="limits: properties per verifier")
    p.add_argument("--out", default=str(OUT / "issue40.json"))
    args = p.parse_args(argv)
    out_path = Path(args.out)
    res: dict[str, Any] = json.loads(out_path.read_text()) if out_path.is_file() else {}
    res["machine"] = common.machine()
    for name in args.sections:
        t0 = time.perf_counter()
        print(f"[{name}] load {common.load()}", flush=True)
        res[name] = {**SECTIONS[name](args, lambda m: print(m, flush=True)), "commit": common.commit(),
                     "seconds": round(time.perf_counter() - t0, 1), "argv": sys.argv[1:]}
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(res, indent=1, default=str) + "\n")
        (out_path.parent / "ISSUE40.md").write_text(markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
