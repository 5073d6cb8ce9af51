"""The project's verifier and neuralsat on the same VNN-COMP folder, row by row.

    # the project: `pipeline vnncomp` in --jobs processes at once, each on its own share of the rows
    .venv/bin/python -m benchmarks.peers.side_by_side project runs/standins/mnist_fc --timeout 30 --jobs 2 \\
        --rows 0:30 --out runs/peers/mnist_fc-30s/project.csv
    # neuralsat: benchmarks/peers/run_neuralsat.py (same limit, same rows, same --jobs)
    # both: one CSV/JSON row per instance, the counts and times, witnesses re-checked, a markdown summary
    .venv/bin/python -m benchmarks.peers.side_by_side compare runs/standins/mnist_fc \\
        --project runs/peers/mnist_fc-30s/project.csv --neuralsat runs/peers/mnist_fc-30s/neuralsat.csv \\
        --out benchmarks/peers/mnist_fc-30s

`folder` gathers finished runs' float ReLU instances (their verify/ folders: the ONNX files the verify stage ships
for verifiers and its VNN-LIB properties, not the int8 ones, which neither tool reads as a float network) into one
VNN-COMP folder, each file named after its run:

    .venv/bin/python -m benchmarks.peers.side_by_side folder --out runs/peers/conv --timeout 30 \
        cnn48=runs/cnn48 preact816=runs/preact816

`project` appends to --out (rows already there are kept and not run again), so a long benchmark runs in chunks
of --rows. Each process is `python -m pipeline.cli vnncomp FOLDER --timeout T --instances shards/...` with one
torch / OpenMP thread; its rows are every --jobs-th row of the range, its results.csv is merged into --out in
the folder's order, and its witnesses land in counterexamples/ beside --out.

`compare` counts per tool: decided (sat, unsat), timeouts, the median run time on decided instances; a
disagreement is sat against unsat on one instance (there must be none); every sat witness of either tool is
re-checked in onnxruntime (`run_neuralsat.check_witness`). The share CROWN alone decides comes from the
stand-in's record in benchmarks/standins.json when there is one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from analysis.verification.vnncomp import read_results, witness_path, write_results
from analysis.verification.vnnlib import read_instances_csv, write_instances_csv
from pipeline.atomic_io import atomic_write_text

from .. import common
from .run_neuralsat import check_witness

ROOT = Path(__file__).resolve().parents[2]
DECIDED = ("sat", "unsat")


def _key(onnx: str, vnnlib: str) -> tuple[str, str]:
    return onnx, vnnlib


def run_project(folder: Path, out: Path, timeout: float, jobs: int, rows: slice, python: str) -> list[dict[str, Any]]:
    """`pipeline vnncomp` on the rows not yet in `out`, `jobs` processes at once; returns every row of `out`."""
    rows_in = read_instances_csv(folder / "instances.csv")
    have = {_key(r["onnx"], r["vnnlib"]): r for r in read_results(out)} if out.is_file() else {}
    todo = [r for r in rows_in[rows] if _key(r[0], r[1]) not in have]
    out.parent.mkdir(parents=True, exist_ok=True)
    procs = []
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    for k in range(min(jobs, len(todo))):
        part = todo[k::jobs]
        rel = Path("shards") / f"{out.stem}-{k}.csv"
        write_instances_csv(folder / rel, part)
        part_out = out.parent / f"{out.stem}.part{k}.csv"
        cmd = [python, "-m", "pipeline.cli", "vnncomp", str(folder), "--timeout", f"{timeout:g}", "--instances", str(rel),
               "--out", str(part_out), "--category", folder.name]
        procs.append((part_out, subprocess.Popen(cmd, cwd=ROOT, env=env)))
    for part_out, proc in procs:
        proc.wait()
        if part_out.is_file():
            for r in read_results(part_out):
                have[_key(r["onnx"], r["vnnlib"])] = r
            # witnesses went beside the part file, which is beside `out`: the same counterexamples/ folder
            part_out.unlink()
    ordered = [have[_key(o, v)] for o, v, _ in rows_in if _key(o, v) in have]
    write_results(out, ordered)
    return ordered


def gather(runs: dict[str, Path], out: Path, timeout: float) -> list[tuple[str, str, float]]:
    """One VNN-COMP folder of the runs' float ReLU instances: onnx/<run>-<network>.onnx, vnnlib/<run>-<property>.vnnlib."""
    rows = []
    for name, run in runs.items():
        verify = run / "verify"
        summary = json.loads((verify / "summary.json").read_text())
        relu = {m["onnx"] for m in summary["models"].values() if m.get("network") == "relu" and m.get("onnx")}
        for onnx_rel, vnnlib_rel, _ in read_instances_csv(verify / "instances.csv"):
            if onnx_rel not in relu:
                continue
            o, v = f"onnx/{name}-{Path(onnx_rel).name}", f"vnnlib/{name}-{Path(vnnlib_rel).name}"
            for src, dst in ((verify / onnx_rel, out / o), (verify / vnnlib_rel, out / v)):
                dst.parent.mkdir(parents=True, exist_ok=True)
                if not dst.is_file():
                    shutil.copyfile(src, dst)
            rows.append((o, v, timeout))
    write_instances_csv(out / "instances.csv", rows)
    return rows


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def tool_summary(rows: list[dict[str, Any]], result: str, time: str) -> dict[str, Any]:
    c = Counter(r[result] for r in rows)
    solved = [r[time] for r in rows if r[result] in DECIDED]
    return {"instances": len(rows), "decided": c["sat"] + c["unsat"], "sat": c["sat"], "unsat": c["unsat"],
            "timeout": c["timeout"], "unknown": c["unknown"], "error": c["error"], "median_s_solved": _median(solved),
            "max_s": round(max((r[time] for r in rows), default=0.0), 2)}


def compare(folder: Path, project_csv: Path, neuralsat_csvs: list[Path], record: Path,
            timeout: float | None = None) -> dict[str, Any]:
    """Both tools' results on the rows both ran, in the folder's order (neuralsat's from one or more chunk files
    written side by side, each with its JSON)."""
    proj = {_key(r["onnx"], r["vnnlib"]): r for r in read_results(project_csv)}
    ns, ns_extra, ns_file = {}, {}, {}
    for path in neuralsat_csvs:
        js = path.with_suffix(".json")
        for r in json.loads(js.read_text())["rows"] if js.is_file() else []:
            ns_extra[_key(r["onnx"], r["vnnlib"])] = r
        for r in read_results(path):
            ns[_key(r["onnx"], r["vnnlib"])] = r
            ns_file[_key(r["onnx"], r["vnnlib"])] = path
    rows = []
    for onnx, vnnlib, limit in read_instances_csv(folder / "instances.csv"):
        limit = timeout if timeout is not None else limit
        k = _key(onnx, vnnlib)
        if k not in proj or k not in ns:
            continue
        p, n, extra = proj[k], ns[k], ns_extra.get(k, {})
        row = {"network": Path(onnx).stem, "vnnlib": Path(vnnlib).stem, "limit_s": limit,
               "project": p["result"], "project_s": round(p["run_time"], 3), "project_prepare_s": round(p["prepare_time"], 3),
               "neuralsat": n["result"], "neuralsat_s": round(n["run_time"], 3), "neuralsat_answer": extra.get("answer"),
               "disagree": {p["result"], n["result"]} == set(DECIDED)}
        row["neuralsat_process_s"] = round(extra["wall"], 3) if "wall" in extra else None
        for tool, res, path in (("project", p, project_csv), ("neuralsat", n, ns_file[k])):
            if res["result"] == "sat":
                wit = witness_path(path, onnx, vnnlib)
                chk = check_witness(folder / onnx, folder / vnnlib, wit) if wit.is_file() else {"valid": False, "error": "no witness file"}
                row[f"{tool}_witness_valid"] = chk["valid"]
                row[f"{tool}_witness_margin"] = chk.get("unsafe_margin")
        rows.append(row)
    nets = list(dict.fromkeys(r["network"] for r in rows))
    out: dict[str, Any] = {
        "folder": str(folder), "instances": len(rows),
        "project": tool_summary(rows, "project", "project_s"), "neuralsat": tool_summary(rows, "neuralsat", "neuralsat_s"),
        "by_network": {net: {"project": tool_summary([r for r in rows if r["network"] == net], "project", "project_s"),
                             "neuralsat": tool_summary([r for r in rows if r["network"] == net], "neuralsat", "neuralsat_s")}
                       for net in nets},
        "disagreements": sum(r["disagree"] for r in rows),
        "invalid_witnesses": {t: sum(1 for r in rows if r.get(f"{t}_witness_valid") is False) for t in ("project", "neuralsat")},
        "either_decided": sum(r["project"] in DECIDED or r["neuralsat"] in DECIDED for r in rows),
        "only_project": sum(r["project"] in DECIDED and r["neuralsat"] not in DECIDED for r in rows),
        "only_neuralsat": sum(r["neuralsat"] in DECIDED and r["project"] not in DECIDED for r in rows),
        "neuralsat_over_limit": sum(1 for r in rows if r["neuralsat_s"] > r["limit_s"]),
        "project_over_limit": sum(1 for r in rows if r["project_s"] > r["limit_s"]),
        "rows": rows,
    }
    out["crown_alone"] = crown_share(folder, record, rows)
    return out


def crown_share(folder: Path, record: Path, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """From the stand-in's build record: how many of these instances the attack alone and CROWN alone decide."""
    if not record.is_file():
        return None
    rec = json.loads(record.read_text()).get(folder.name)
    if not rec or "measured" not in rec:
        return None
    pgd = crown = hard = n = 0
    for r in rows:
        m = rec["measured"].get(r["network"])
        stem = r["vnnlib"]  # prop_<k>_eps_<eps>
        parts = stem.split("_")
        if m is None or len(parts) < 4:
            continue
        per = m["per_eps"].get(parts[3])
        hit = next((x for x in per["rows"] if str(x["sample"]) == parts[1]), None) if per else None
        if hit is None:
            continue
        n += 1
        pgd += hit["pgd"] == "sat"
        crown += hit["crown"] == "unsat"
        hard += hit["pgd"] != "sat" and hit["crown"] != "unsat"
    if n == 0:  # the record measured other instances
        return None
    return {"instances": n, "pgd_sat": pgd, "crown_unsat": crown, "neither": hard,
            "timeout_s": rec.get("measure_timeout_s")}


def markdown(res: dict[str, Any], limit: str, load: list[dict[str, Any]]) -> str:
    from pipeline.render import table

    def line(name: str, s: dict[str, Any]) -> list[Any]:
        return [name, f"{s['decided']}/{s['instances']}", s["sat"], s["unsat"], s["timeout"] + s["unknown"], s["error"],
                "—" if s["median_s_solved"] is None else f"{s['median_s_solved']:.2f}", f"{s['max_s']:.1f}"]

    rows = [line("project (pipeline vnncomp)", res["project"]), line("neuralsat 0.2.17", res["neuralsat"])]
    for net, d in res["by_network"].items():
        rows += [line(f"{net}: project", d["project"]), line(f"{net}: neuralsat", d["neuralsat"])]
    c = res["crown_alone"]
    crown = (f"Of these instances the project's attack alone (`pgd`) finds {c['pgd_sat']} counterexamples and CROWN alone "
             f"(`crown`) proves {c['crown_unsat']}; {c['neither']} ({100 * c['neither'] / c['instances']:.0f}%) need more "
             f"than CROWN (each run on its own, {c['timeout_s']:g} s limit).") if c else ""
    inv = res["invalid_witnesses"]
    return (f"# Side by side: {Path(res['folder']).name}, {limit} per instance\n\n"
            f"{res['instances']} instances, one core per instance, two at a time, torch threads 1, in chunks (one hold "
            "of the machine's heavy-job lock each; other jobs outside the lock shared the 2 cores). Load average "
            "(1, 5, 15 min) at the start and end of each chunk: "
            + "; ".join(f"{c['chunk']}: {c['before']} → {c['after']}" for c in load) + ".\n\n"
            + table(["tool", "decided", "sat", "unsat", "timeout/unknown", "error", "median s (solved)", "max s"], rows)
            + f"\n\nDisagreements (sat against unsat): **{res['disagreements']}**. Witnesses failing the onnxruntime re-check "
              f"(unsafe set at tolerance 0, box within float32 rounding): project {inv['project']}, neuralsat {inv['neuralsat']}. "
              f"Decided by either: {res['either_decided']}; only by the project: {res['only_project']}; only by neuralsat: "
              f"{res['only_neuralsat']}. Run time over the limit: project {res['project_over_limit']}, neuralsat "
              f"{res['neuralsat_over_limit']} (an answer after the limit counts as timeout). {crown}\n\n"
              "Times: VNN-COMP's run_time. The project's excludes reading the network (its prepare_time, in the CSV); "
              "neuralsat's is its own clock, which starts after its Python imports and includes reading the network and "
              "the property (it has no separate preparation; the whole process, start-up included, is "
              "`neuralsat_process_s` in side_by_side.csv).\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("project", help="run pipeline vnncomp on rows of a folder, --jobs processes at once")
    a.add_argument("folder")
    a.add_argument("--out", required=True)
    a.add_argument("--timeout", type=float, required=True)
    a.add_argument("--jobs", type=int, default=2)
    a.add_argument("--rows", default=":", metavar="START:END")
    a.add_argument("--python", default=sys.executable)
    f = sub.add_parser("folder", help="one VNN-COMP folder of finished runs' float ReLU instances")
    f.add_argument("runs", nargs="+", metavar="NAME=RUN_DIR")
    f.add_argument("--out", required=True)
    f.add_argument("--timeout", type=float, default=30.0)
    c = sub.add_parser("compare", help="both tools' results row by row; writes CSV, JSON and a markdown summary")
    c.add_argument("folder")
    c.add_argument("--project", required=True)
    c.add_argument("--neuralsat", required=True, nargs="+", help="run_neuralsat's results.csv (several: chunks of one run)")
    c.add_argument("--out", required=True, help="folder for side_by_side.{csv,json}, SUMMARY.md and copies of both results")
    c.add_argument("--timeout", type=float, default=None, help="the limit both ran with (default: instances.csv's)")
    c.add_argument("--limit", default="30 s", help="how the limit is named in the summary")
    c.add_argument("--load", default="[]", help='JSON [{"chunk": "...", "before": [...], "after": [...]}, ...] recorded around the runs')
    c.add_argument("--record", default=str(ROOT / "benchmarks" / "standins.json"))
    args = p.parse_args(argv)
    if args.cmd == "folder":
        runs = dict((n, Path(d)) for n, _, d in (r.partition("=") for r in args.runs))
        rows = gather(runs, Path(args.out), args.timeout)
        print(f"{len(rows)} instances of {len(runs)} runs in {args.out}")
        return 0
    folder = Path(args.folder)
    if not (folder / "instances.csv").is_file():
        print(f"error: {folder / 'instances.csv'} is missing: build the stand-in first (python -m benchmarks.standins)", file=sys.stderr)
        return 2
    if args.cmd == "project":
        s, _, e = args.rows.partition(":")
        load0 = common.load()
        rows = run_project(folder, Path(args.out), args.timeout, args.jobs, slice(int(s) if s else None, int(e) if e else None),
                           args.python)
        print(f"{len(rows)} rows in {args.out}: {dict(Counter(r['result'] for r in rows))}; load {load0} → {common.load()}")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ns_paths = [Path(x) for x in args.neuralsat]
    res = compare(folder, Path(args.project), ns_paths, Path(args.record), args.timeout)
    res["load"] = json.loads(args.load)
    res["machine"] = common.machine()
    shutil.copyfile(args.project, out / "project.csv")
    ns_rows = [r for path in ns_paths for r in read_results(path)]
    order = {_key(o, v): i for i, (o, v, _) in enumerate(read_instances_csv(folder / "instances.csv"))}
    write_results(out / "neuralsat.csv", sorted(ns_rows, key=lambda r: order.get(_key(r["onnx"], r["vnnlib"]), len(order))))
    ns_json = [r for path in ns_paths if path.with_suffix(".json").is_file()
               for r in json.loads(path.with_suffix(".json").read_text())["rows"]]
    atomic_write_text(out / "neuralsat.json", json.dumps({"tool": "neuralsat 0.2.17", "rows": sorted(
        ns_json, key=lambda r: order.get(_key(r["onnx"], r["vnnlib"]), len(order)))}, indent=2) + "\n")
    cols = list(dict.fromkeys(k for r in res["rows"] for k in r))
    lines = [",".join(cols)] + [",".join("" if r.get(k) is None else str(r.get(k)) for k in cols) for r in res["rows"]]
    atomic_write_text(out / "side_by_side.csv", "\n".join(lines) + "\n")
    atomic_write_text(out / "side_by_side.json", json.dumps({k: v for k, v in res.items() if k != "rows"}, indent=2) + "\n")
    atomic_write_text(out / "SUMMARY.md", markdown(res, args.limit, res["load"]))
    print((out / "SUMMARY.md").read_text())
    return 1 if res["disagreements"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
