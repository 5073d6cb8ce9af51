"""Do other verifiers read the ONNX files we ship for them (`verify/onnx/`, the verifiers' form of
`quantize/verifier_form.py`)? Four readers that install from PyPI or GitHub, each in its own venv:

- onnx2pytorch 0.6.0 (PyPI's release of the loader α,β-CROWN uses in a fork; `readers_setup.sh onnx2pytorch`),
- onnx2torch 1.5.15 (`readers_setup.sh onnx2torch`),
- auto_LiRPA's convolutional path: onnx2pytorch → `BoundedModule` and one CROWN pass (`auto_lirpa_setup.sh`, from
  auto_LiRPA's GitHub source: PyPI's auto-lirpa 0.3 does not import on torch 2.13),
- neuralsat 0.2.17 (`neuralsat_setup.sh`): its own main.py on one property (`run_neuralsat.run_one`).

    flock /tmp/heavy.lock .venv/bin/python -m benchmarks.peers.readers --out benchmarks/peers/readers \\
        --venv onnx2pytorch=/work/peers/onnx2pytorch --venv onnx2torch=/work/peers/onnx2torch \\
        --venv auto_lirpa=/work/peers/auto_lirpa --venv neuralsat=/work/peers/neuralsat \\
        [--run preact816=/work/runs/preact816 ...]

The cases: every built-in architecture's tiny instance (`analysis.robustness.coverage.TINY`, random weights: reading
depends on the ops) as the verify stage ships it, its float ReLU file (`export_for_verifiers`) and its int8 file (the
coverage table's int8 path), with the L∞ box of radius `EPS` around its first input; and each `--run`'s
`verify/onnx/*.onnx` with the box of its first property of that network (to show a finished run's files, made by
any commit, as they are). A loader reads a file when it builds a model whose outputs match onnxruntime's on the
inputs (`read_check.py`; auto_LiRPA's CROWN bounds must also hold at sampled points of the box); neuralsat reads it
when its main.py answers the property (sat, unsat, timeout or unknown: an answer it reached by reading the network,
whose conversion it checks against onnxruntime itself) rather than failing, and its sat witnesses are re-checked
in onnxruntime.

Writes, under --out: `record.json` (per case and tool: read or why not, with the float ReLU file's form
`signature`; analysis/robustness/coverage.py reads the tiny float ReLU rows for the "what is verified" table's
column and checks the signature against the form it exports now), `SUMMARY.md`, and each tool's raw rows.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from analysis.robustness import coverage
from analysis.verification.vnnlib import read_instances_csv, read_vnnlib_all, robustness_spec, write_vnnlib
from pipeline.atomic_io import atomic_write_text
from quantize import export as export_mod
from quantize import ort as ort_util
from quantize.int8 import quantize_file
from quantize.verifier_form import signature

from .. import common

ROOT = Path(__file__).resolve().parents[2]
STAND_INS = Path(__file__).resolve().parent / "stand_ins"
LOADERS = ("onnx2pytorch", "onnx2torch", "auto_lirpa")  # run by read_check.py in their venvs
TOOLS = (*LOADERS, "neuralsat")
LABELS = {"onnx2pytorch": "onnx2pytorch", "onnx2torch": "onnx2torch", "auto_lirpa": "auto_LiRPA", "neuralsat": "neuralsat"}
EPS = 0.002  # the box of a tiny case: the issue's ε, around the first input
SAMPLES = 8  # inputs on which a loader's model must match onnxruntime's
NEURALSAT_LIMIT = 30.0
RECORD = ROOT / "benchmarks" / "peers" / "readers" / "record.json"


def _safe(name: str) -> str:
    """A case's name as one file name."""
    return re.sub(r"[^\w.-]+", "_", name)


def _npz(path: Path, onnx_path: Path, x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
    y = ort_util.infer(ort_util.session(onnx_path), x)
    np.savez(path, x=x.astype(np.float32), y=y, box_lo=lo.astype(np.float32), box_hi=hi.astype(np.float32))


def tiny_cases(work: Path) -> list[dict[str, Any]]:
    """Each built-in architecture's float ReLU and int8 files, made the way the coverage table makes them."""
    from pipeline.config import Config

    cases = []
    for name in coverage.TINY:
        relu, shape, x = coverage._build(name, "relu")
        if not x.is_floating_point():
            continue  # token ids: no verifier here reads an integer input (the coverage table says so)
        x = x.numpy()
        lo, hi = np.clip(x[0] - EPS, 0, 1), np.clip(x[0] + EPS, 0, 1)
        for kind in ("float ReLU", "int8"):
            path = work / f"{name}.{'relu' if kind == 'float ReLU' else 'int8'}.onnx"
            if kind == "float ReLU":
                export_mod.export_for_verifiers(relu, shape, path, torch_tensor(x))
            else:
                proto, _ = export_mod.to_onnx(export_mod.fold_normalization(relu, shape) or relu, torch_tensor(x[:2]), 20, True, None)
                export_mod.save(proto, work / f"{name}.fp32.onnx")
                quantize_file(work / f"{name}.fp32.onnx", path, x, Config().quantize, work)
            _npz(path.with_suffix(".npz"), path, x, lo, hi)
            cases.append({"name": f"{name} ({kind})", "architecture": name, "kind": kind, "source": "tiny",
                          "onnx": str(path), "npz": str(path.with_suffix(".npz")),
                          "signature": signature(onnx.load(str(path))), "vnnlib": None})
    return cases


def torch_tensor(x: np.ndarray):
    import torch

    return torch.from_numpy(x)


def run_cases(run_name: str, run_dir: Path, work: Path) -> list[dict[str, Any]]:
    """A finished run's verify/onnx files, each with the box of its first property; inputs drawn in that box's range."""
    verify = run_dir / "verify"
    rows = read_instances_csv(verify / "instances.csv")
    cases = []
    for onnx_rel in dict.fromkeys(o for o, _, _ in rows):
        vnnlib_rel = next(v for o, v, _ in rows if o == onnx_rel)
        spec = read_vnnlib_all(verify / vnnlib_rel)[0]
        sess = ort_util.session(verify / onnx_rel)
        shape = [d if isinstance(d, int) else 1 for d in sess.get_inputs()[0].shape][1:]
        lo, hi = spec.lb.reshape(shape), spec.ub.reshape(shape)
        gen = np.random.default_rng(0)
        x = np.concatenate([((lo + hi) / 2)[None], gen.uniform(lo.min(), hi.max(), (SAMPLES - 1, *shape))])
        stem = _safe(f"{run_name}.{Path(onnx_rel).stem}")
        _npz(work / f"{stem}.npz", verify / onnx_rel, x, lo, hi)
        kind = "int8" if Path(onnx_rel).stem.endswith("-int8") else "float ReLU"
        cases.append({"name": f"{run_name} {Path(onnx_rel).name}", "architecture": None, "kind": kind, "source": run_name,
                      "onnx": str(verify / onnx_rel), "npz": str(work / f"{stem}.npz"),
                      "signature": signature(onnx.load(str(verify / onnx_rel))), "vnnlib": str(verify / vnnlib_rel)})
    return cases


def run_loader(tool: str, venv: Path, cases: list[dict[str, Any]], work: Path,
               first: Path | None = None) -> tuple[str, dict[str, dict[str, Any]]]:
    """read_check.py's `tool` in `venv` on every case; `first`: a folder put before everything on PYTHONPATH (a loader
    installed as source, α,β-CROWN's fork)."""
    jobs, out = work / f"{tool}.jobs.json", work / f"{tool}.out.json"
    jobs.write_text(json.dumps([{k: c[k] for k in ("name", "onnx", "npz")} for c in cases]))
    path = os.pathsep.join(str(p) for p in (first, STAND_INS) if p is not None)
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([str(venv / "bin" / "python"), str(Path(__file__).with_name("read_check.py")), tool, str(jobs), str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not out.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        raise SystemExit(f"error: {tool} ({venv}) failed: {tail[-1] if tail else proc.returncode}; is its venv set up "
                         f"(benchmarks/peers/readers_setup.sh)?")
    res = json.loads(out.read_text())
    return res["version"], {r["name"]: r for r in res["rows"]}


def run_neuralsat(venv: Path, cases: list[dict[str, Any]], work: Path) -> tuple[str, dict[str, dict[str, Any]]]:
    """neuralsat's main.py on one property per case: the case's run property, or the robustness of the tiny case's
    first input (its onnxruntime class) in the ε box."""
    from .run_neuralsat import check_witness, run_one, source_dir

    python = venv / "bin" / "python"
    src = source_dir(python)
    out: dict[str, dict[str, Any]] = {}
    for c in cases:
        folder = work / "neuralsat" / _safe(c["name"])
        (folder / "onnx").mkdir(parents=True, exist_ok=True)
        (folder / "vnnlib").mkdir(exist_ok=True)
        (folder / "onnx" / "net.onnx").write_bytes(Path(c["onnx"]).read_bytes())
        if c["vnnlib"]:
            (folder / "vnnlib" / "prop.vnnlib").write_bytes(Path(c["vnnlib"]).read_bytes())
        else:
            data = np.load(c["npz"])
            lo, hi = data["box_lo"].astype(np.float64).reshape(-1), data["box_hi"].astype(np.float64).reshape(-1)
            center = (lo + hi) / 2
            y = ort_util.infer(ort_util.session(c["onnx"]), center.reshape(data["box_lo"].shape)[None].astype(np.float32))[0]
            write_vnnlib(folder / "vnnlib" / "prop.vnnlib",
                         robustness_spec(center, float(np.max(hi - lo)) / 2, lo, hi, int(np.argmax(y)), int(y.size)))
        t0 = time.perf_counter()
        row = run_one(python, src, folder, "onnx/net.onnx", "vnnlib/prop.vnnlib", NEURALSAT_LIMIT, 30.0, folder)
        r: dict[str, Any] = {"name": c["name"], "answer": row["answer"], "wall_s": round(time.perf_counter() - t0, 2),
                             "read": row["answer"] in ("sat", "unsat", "timeout", "unknown")}
        if not r["read"]:
            r["error"] = row.get("message", f"exit {row['returncode']}")
        if row["answer"] == "sat" and "witness" in row:
            (folder / "witness.txt").write_text(row["witness"])
            r["witness_check"] = check_witness(folder / "onnx" / "net.onnx", folder / "vnnlib" / "prop.vnnlib", folder / "witness.txt")
        out[c["name"]] = r
        print(f"neuralsat: {c['name']}: {'read' if r['read'] else 'not read'} ({r['answer'] or r.get('error')}, {r['wall_s']} s)",
              flush=True)
    version = subprocess.run([str(python), "-c", "import importlib.metadata as m, torch; print('neuralsat', m.version('neuralsat') + ';', 'torch', torch.__version__)"],
                             capture_output=True, text=True).stdout.strip()
    return version, out


def _keep(previous: dict[str, Any], cases: list[dict[str, Any]], versions: dict[str, str],
          results: dict[str, dict[str, dict[str, Any]]]) -> None:
    """The tools not run now: their recorded result for each case whose form (signature) is unchanged, else a result
    that says it was not measured on this form (it counts as not read)."""
    old = {c["name"]: c for c in previous["cases"]}
    for tool in [t for t in TOOLS if t not in results]:
        versions[tool] = previous["tools"][tool]["version"]
        results[tool] = {}
        for c in cases:
            was = old.get(c["name"])
            same = was is not None and was["signature"] == c["signature"] and tool in was["results"]
            results[tool][c["name"]] = was["results"][tool] if same else {"read": False, "not_measured": True}


def write_record(out: Path, record: dict[str, Any], render) -> None:
    """`out`/record.json and `out`/SUMMARY.md (`render(record)`), which is printed too."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "record.json", json.dumps(record, indent=2) + "\n")
    atomic_write_text(out / "SUMMARY.md", render(record))
    print(render(record))


def why(result: dict[str, Any]) -> str:
    """A result's cell: "read" (with neuralsat's answer, auto_LiRPA's CROWN time), or "not read: <what failed>"."""
    if result.get("not_measured"):
        return "not measured on this form"
    if result["read"]:
        if "answer" in result:
            wit = result.get("witness_check")
            return f"read ({result['answer']}" + (f", witness {'valid' if wit['valid'] else 'INVALID'}" if wit else "") + ")"
        return f"read (CROWN {result['crown']['crown_s']:.2f} s)" if "crown" in result else "read"
    if "error" in result:  # an assertion without a message is named by where it failed
        return f"not read: {result['error']}" + (f" at {result['at']}" if result["error"].endswith(": ") and result.get("at") else "")
    if not result.get("same_function", True):
        return f"not read: another function (max |diff| {result['max_abs_diff']:.3g} > {result['tolerance']:.3g})"
    c = result.get("crown") or {}
    return "not read: CROWN bounds " + ("not finite" if not c.get("finite") else
                                        f"violated by {max(c['max_below_lower'], c['max_above_upper']):.3g} at a sampled point")


def markdown(record: dict[str, Any]) -> str:
    from pipeline.render import table

    tools = list(record["tools"])
    labels = [record["tools"][t]["label"] for t in tools]
    cases = {k: [c for c in record["cases"] if c["kind"] == k] for k in ("float ReLU", "int8")}
    read = {k: {t: sum(c["results"][t]["read"] for c in cs) for t in tools} for k, cs in cases.items()}
    int8_why = {t: sorted({why(c["results"][t]).removeprefix("not read: ") for c in cases["int8"] if not c["results"][t]["read"]})
                for t in tools}
    return (f"# Which verifiers read the ONNX files we ship\n\n"
            f"Made by `benchmarks/peers/readers.py` on {record['commit']} ({record['seconds']:.0f} s; load "
            f"{record['load_before']} → {record['load_after']}). Tools: "
            + "; ".join(f"{v['label']}: {v['version']}" for v in record["tools"].values()) + ".\n\n"
            "Files: each built-in architecture's tiny instance (random weights) as the verify stage ships it, and the "
            "verify/onnx files of finished runs, named `<run> <file>`; `main-c1c507a/<run>` is the run as main c1c507a "
            "wrote it, `<run>` the same run with its verify stage redone on this branch.\n\n"
            f"Float ReLU files read, of {len(cases['float ReLU'])}: "
            + ", ".join(f"{record['tools'][t]['label']} {read['float ReLU'][t]}" for t in tools) + ".\n\n"
            + table(["float ReLU file", *labels], [[c["name"], *[why(c["results"][t]) for t in tools]] for c in cases["float ReLU"]])
            + f"\n\nThe int8 files (QDQ), {len(cases['int8'])}: read by "
            + ", ".join(f"{record['tools'][t]['label']} {read['int8'][t]}" for t in tools) + ". What stopped each:\n\n"
            + "\n".join(f"- {record['tools'][t]['label']}: " + "; ".join(f"`{w}`" for w in int8_why[t]) for t in tools if int8_why[t])
            + "\n\nRead: the loader's model computes onnxruntime's outputs on 8 inputs (within 1e-4·(1 + max|y|)); for "
            "auto_LiRPA also one CROWN pass (time in the cell) whose bounds hold at 512 points of the box; for neuralsat, "
            f"its main.py answers one property within {NEURALSAT_LIMIT:g} s (sat, unsat, timeout or unknown; it checks its "
            "own conversion against onnxruntime first), a sat witness re-checked in onnxruntime. Every row is in "
            "record.json.\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=RECORD.parent)
    p.add_argument("--venv", action="append", default=[], metavar="TOOL=DIR",
                   help=f"a tool's venv (default .peers/<tool>); tools: {', '.join(TOOLS)}")
    p.add_argument("--run", action="append", default=[], metavar="NAME=RUN_DIR", help="a finished run's verify/onnx too")
    p.add_argument("--no-tiny", action="store_true", help="only the --run files")
    p.add_argument("--render", action="store_true", help="only rewrite SUMMARY.md from --out's record.json")
    p.add_argument("--only", action="append", default=[], metavar="TOOL",
                   help="run only these tools; the others keep --out's recorded results where a file's form (signature) "
                        "is unchanged and are 'not measured' on a changed one")
    args = p.parse_args(argv)
    if args.render:
        atomic_write_text(args.out / "SUMMARY.md", markdown(json.loads((args.out / "record.json").read_text())))
        return 0
    run = args.only or list(TOOLS)
    if unknown := sorted(set(run) - set(TOOLS)):
        p.error(f"--only {', '.join(unknown)}: unknown (tools: {', '.join(TOOLS)})")
    previous = json.loads((args.out / "record.json").read_text()) if set(run) != set(TOOLS) else None
    if previous is None and set(run) != set(TOOLS):
        p.error(f"--only needs a record to keep the other tools' results from: {args.out / 'record.json'}")
    venvs = {t: ROOT / ".peers" / t for t in run}
    for item in args.venv:
        tool, _, path = item.partition("=")
        if tool not in TOOLS:
            p.error(f"--venv {item}: unknown tool {tool!r} (one of {', '.join(TOOLS)})")
        venvs[tool] = Path(path)
    missing = [f"{t} ({d})" for t, d in venvs.items() if not (d / "bin" / "python").is_file()]
    if missing:
        p.error(f"no venv for {', '.join(missing)}: run benchmarks/peers/readers_setup.sh (or pass --venv TOOL=DIR)")
    t0, load0 = time.perf_counter(), common.load()
    with tempfile.TemporaryDirectory(prefix="readers-") as tmp:
        work = Path(tmp)
        cases = [] if args.no_tiny else tiny_cases(work)
        for item in args.run:
            name, _, path = item.partition("=")
            cases += run_cases(name, Path(path), work)
        results: dict[str, dict[str, dict[str, Any]]] = {}
        versions: dict[str, str] = {}
        for tool in [t for t in LOADERS if t in run]:
            versions[tool], results[tool] = run_loader(tool, venvs[tool], cases, work)
            for c in cases:
                print(f"{tool}: {c['name']}: {why(results[tool][c['name']])}", flush=True)
        if "neuralsat" in run:
            versions["neuralsat"], results["neuralsat"] = run_neuralsat(venvs["neuralsat"], cases, work)
        if previous is not None:
            _keep(previous, cases, versions, results)
    record = {"commit": common.commit(), "seconds": time.perf_counter() - t0,
              "load_before": load0, "load_after": common.load(), "eps": EPS,
              "tools": {t: {"label": LABELS[t], "version": versions[t]} for t in TOOLS},
              "cases": [{**{k: c[k] for k in ("name", "architecture", "kind", "source", "signature")},
                         "onnx": c["onnx"] if c["source"] != "tiny" else Path(c["onnx"]).name,
                         "results": {t: results[t][c["name"]] for t in TOOLS}} for c in cases]}
    if previous is not None:  # the finished runs' files this call did not read again, as recorded
        now = {c["name"] for c in record["cases"]}
        record["cases"] += [c for c in previous["cases"] if c["name"] not in now and c["source"] != "tiny"]
    for c in record["cases"]:  # temporary paths are meaningless afterwards
        for r in c["results"].values():
            r.pop("onnx", None)
    write_record(args.out, record, markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
