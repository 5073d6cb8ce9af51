"""The verify stage: L∞ local robustness of every variant's swapped float ReLU model, with a
complete verifier, in the VNN-COMP layout.

Which model a certificate is for: ``verify/onnx/<variant>.onnx``, the float32 ReLU network of
``swap/<variant>/relu.pt`` (the λ-GELU or GELU model after the swap, or the ReLU baseline itself)
with its input normalization folded into the first Gemm (``analysis.verifiers.to_verifier_onnx``).
Not the int8 model (its QDQ graph rounds differently and drops ReLUs), and not the smooth model
(no verifier here reads Gelu/Erf/Div; ``summary.json["smooth"]`` records what each reader says).

Properties: for each of the first ``verify.samples`` validation examples ``x0`` (the same for every
variant) and each ``eps`` in ``verify.epsilons``, the box ``[max(x0 − eps, lo), min(x0 + eps, hi)]``
(``lo``/``hi``: the data's valid range, natural units) must keep the true class's logit above every
other (VNN-LIB states the unsafe set, see ``analysis.vnnlib``). A sample the model already gets
wrong is not certified: it is recorded as ``misclassified`` and no verifier runs on it.

Layout under ``verify/``: ``onnx/<variant>.onnx``, ``vnnlib/<variant>_<sample>_<eps>.vnnlib``,
``instances.csv`` (``onnx,vnnlib,timeout_s``, no header), ``results.csv`` (one row per property
and verifier), ``counterexamples/<variant>_<sample>_<eps>_<verifier>.npy`` (flat input, natural
units; re-checked in onnxruntime before ``falsified`` is written), ``summary.json``.

Verifiers (``verify.verifiers``): names from ``analysis.verifiers.VERIFIERS`` or chains ``a+b``
that run in order until one answers ``verified``/``falsified``, sharing one timeout. The default
``auto`` is ``pgd+marabou``: a PGD attack (about a second) first, because Marabou is slow to find
counterexamples, then Marabou (complete); ``milp`` when maraboupy is missing. Timeouts count CPU
seconds by default (``verify.cpu_time``; RLIMIT_CPU on Marabou's child process), because on a
shared machine a wall-clock limit turns proofs into timeouts at random; rows record both the wall
and the CPU seconds (this process and its children).

``unstable_relus`` is the number of ReLUs whose interval (IBP) pre-activation bounds over the box
cross 0, computed on the exported ONNX graph in float64 (``analysis.intervals``): the size of the
case split a complete verifier faces.

Resumable at property granularity: ``results.csv`` is rewritten (atomically) after every property,
and a rerun keeps the rows it finds, so a killed stage only repeats the property it was in.
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

from analysis.intervals import interval_bounds, layers_from_onnx
from analysis.linked import unfold_linked_relu
from analysis.verifiers import STATUSES as VERIFIER_STATUSES
from analysis.verifiers import MarabouVerifier, Result, get_verifier, to_verifier_onnx
from analysis.vnnlib import format_real, robustness_spec, write_instances_csv, write_vnnlib
from pipeline import checkpoint
from pipeline.config import Config
from pipeline.rundir import RunDir, atomic_path, atomic_write_csv, atomic_write_json
from pipeline.train import dataset_for

STATUSES: tuple[str, ...] = (*VERIFIER_STATUSES, "misclassified")
FIELDS = ["variant", "sample", "eps", "verifier", "label", "predicted", "status", "seconds", "cpu_seconds",
          "unstable_relus", "relus", "vnnlib", "counterexample", "message"]
CERTIFIED_FOR = ("the float32 ReLU ONNX in verify/onnx/ (swapped model, normalization folded into the first Gemm); "
                 "not the int8 model and not the smooth model")
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


def resolve_verifiers(names: Sequence[str]) -> tuple[list[str], str]:
    """Replace "auto" by pgd+marabou (maraboupy importable) or milp; returns (names, a note)."""
    out, note = [], ""
    for n in names:
        if n == "auto":
            if MarabouVerifier.available():
                n = "pgd+marabou"
            else:
                n = "milp"
                note = "verify.verifiers=auto: maraboupy is not importable, so the MILP verifier (scipy/HiGHS) ran instead"
        if n not in out:
            out.append(n)
    return out, note


def cpu_seconds() -> float:
    """CPU time of this process (all threads) and of its finished, waited-for children."""
    import resource

    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + ch.ru_utime + ch.ru_stime


class Chain:
    """Verifiers run in order on one property until one answers ``verified`` or ``falsified``;
    each gets what is left of the one timeout (CPU seconds when ``cpu_time``, else wall). The
    result: that answer (or the last link's), the total wall time, and every link's message."""

    DECISIVE = ("verified", "falsified")

    def __init__(self, name: str, cpu_time: bool = False):
        self.name = name
        self.cpu_time = cpu_time
        self.links = [(part, get_verifier(part, **({"cpu_time": cpu_time} if part == "marabou" else {})))
                      for part in name.split("+")]

    def verify(self, onnx_path: Path, vnnlib_path: Path, timeout_s: float) -> tuple[Result, float]:
        """(result, CPU seconds spent, children included)."""
        wall = cpu = 0.0
        messages: list[str] = []
        res = Result("timeout", 0.0, None, "no time given")
        for part, solver in self.links:
            left = timeout_s - (cpu if self.cpu_time else wall)
            if left <= 0:
                res = Result("timeout", 0.0, None, "no time left")
                messages.append(f"{part}: not run, no time left")
                break
            c0 = cpu_seconds()
            res = solver.verify(onnx_path, vnnlib_path, left)
            cpu += cpu_seconds() - c0
            wall += res.seconds
            messages.append(f"{part}: {res.status}" + (f" ({res.message})" if res.message else ""))
            if res.status in self.DECISIVE:
                break
        message = "; ".join(messages) if len(self.links) > 1 else res.message
        return Result(res.status, wall, res.counterexample, message), cpu


def property_name(variant: str, sample: int, eps: float) -> str:
    return f"{variant}_{sample}_{format_real(eps)}"


def _key(variant: str, sample: int | str, eps: float | str, verifier: str) -> tuple[str, int, str, str]:
    return variant, int(sample), format_real(float(eps)), verifier


def read_results(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _predict(onnx_path: Path, xs: np.ndarray) -> np.ndarray:
    """Logits of a batch-1 ONNX model for each flat row of xs (onnxruntime, float32, one session)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    shape = [d if isinstance(d, int) and d > 0 else 1 for d in inp.shape]
    return np.stack([np.asarray(sess.run(None, {inp.name: x.reshape(shape).astype(np.float32)})[0]).reshape(-1)
                     for x in xs])


def probe_smooth(onnx_path: Path) -> dict[str, Any]:
    """What each verifier's ONNX reader says about a smooth (Gelu/Erf/Div) graph."""
    import onnx

    ops = sorted({n.op_type for n in onnx.load(str(onnx_path)).graph.node})
    out: dict[str, Any] = {"onnx": str(onnx_path), "ops": ops}
    if MarabouVerifier.available():
        try:
            proc = subprocess.run([sys.executable, "-c", _READ_ONNX, str(onnx_path)], capture_output=True, text=True,
                                  timeout=SMOOTH_PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
            last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
            res = json.loads(last) if last.startswith("{") else {
                "ok": False, "message": f"reader process exited with code {proc.returncode}: {proc.stderr.strip()[-300:]}"}
        except subprocess.TimeoutExpired:
            res = {"ok": False, "message": f"Marabou.read_onnx did not return within {SMOOTH_PROBE_TIMEOUT_S:g} s"}
        out["marabou"] = res
    else:
        out["marabou"] = {"ok": False, "message": "maraboupy is not installed"}
    try:  # the reader the milp and ibp verifiers (and the unstable-ReLU count) use
        layers_from_onnx(onnx_path)
        out["intervals"] = {"ok": True, "message": "read"}
    except Exception as e:
        out["intervals"] = {"ok": False, "message": f"{type(e).__name__}: {e}"}
    return out


def summarize(rows: list[dict[str, Any]], variants: Sequence[str], epsilons: Sequence[float],
              verifiers: Sequence[str], samples: int) -> list[dict[str, Any]]:
    """Per variant × eps × verifier (and "any" over verifiers when there are several): counts,
    fractions over all ``samples`` properties (misclassified ones count as not certified), the
    median verifier time over the properties it ran on, and the mean unstable ReLUs."""
    out = []
    names = list(verifiers) + (["any"] if len(verifiers) > 1 else [])
    for v in variants:
        for eps in epsilons:
            tag = format_real(eps)
            mine = [r for r in rows if r["variant"] == v and format_real(float(r["eps"])) == tag]
            if not mine:
                continue
            for name in names:
                if name == "any":  # the best answer per property: verified or falsified beats the rest
                    by_sample: dict[int, dict[str, Any]] = {}
                    rank = {"verified": 0, "falsified": 0, "misclassified": 0, "unknown": 1, "timeout": 2, "error": 3}
                    for r in mine:
                        s = int(r["sample"])
                        if s not in by_sample or rank[r["status"]] < rank[by_sample[s]["status"]]:
                            by_sample[s] = r
                    sel = list(by_sample.values())
                else:
                    sel = [r for r in mine if r["verifier"] == name]
                counts = {s: sum(r["status"] == s for r in sel) for s in STATUSES}
                ran = [float(r["seconds"]) for r in sel if r["status"] != "misclassified"]
                ran_cpu = [float(r["cpu_seconds"]) for r in sel if r["status"] != "misclassified"]
                unstable = [int(r["unstable_relus"]) for r in sel]
                n = len(sel)
                out.append({
                    "variant": v, "eps": float(eps), "verifier": name, "properties": n, "complete": n == samples,
                    **counts,
                    "certified_fraction": counts["verified"] / n if n else float("nan"),
                    # falsified by the verifier, or already wrong at x0 (its own counterexample)
                    "falsified_fraction": (counts["falsified"] + counts["misclassified"]) / n if n else float("nan"),
                    "timeout_fraction": counts["timeout"] / n if n else float("nan"),
                    "median_seconds": statistics.median(ran) if ran and name != "any" else None,
                    "median_cpu_seconds": statistics.median(ran_cpu) if ran_cpu and name != "any" else None,
                    "mean_unstable_relus": statistics.fmean(unstable) if unstable else float("nan"),
                    "relus": int(sel[0]["relus"]) if sel else 0,
                })
    return out


def conflicts(rows: list[dict[str, Any]]) -> list[str]:
    """Properties that one verifier proved and another falsified (there should be none)."""
    seen: dict[tuple, set[str]] = {}
    for r in rows:
        seen.setdefault((r["variant"], int(r["sample"]), format_real(float(r["eps"]))), set()).add(r["status"])
    return [property_name(v, s, float(e)) for (v, s, e), st in seen.items() if {"verified", "falsified"} <= st]


def run_verify(cfg: Config, run: RunDir) -> dict[str, Any]:
    vcfg = cfg.verify
    out = run.dir("verify")
    ds = dataset_for(cfg)
    info = ds.info
    n = min(vcfg.samples, len(ds.val.y))
    xs = ds.val.x[:n].double().numpy().reshape(n, -1)
    labels = [int(c) for c in ds.val.y[:n]]
    lo = np.asarray(info.input_low, dtype=np.float64)
    hi = np.asarray(info.input_high, dtype=np.float64)
    verifiers, verifier_note = resolve_verifiers(vcfg.verifiers)
    solvers = {name: Chain(name, vcfg.cpu_time) for name in verifiers}
    results_path = out / "results.csv"
    done = {_key(r["variant"], r["sample"], r["eps"], r["verifier"]): r for r in read_results(results_path)}
    rows: list[dict[str, Any]] = []
    instances: list[tuple[str, str, float]] = []
    models: dict[str, Any] = {}
    pending: list[tuple[str, Path, list, np.ndarray, list[int]]] = []

    # 1. every ONNX, property file and instances row first: the benchmark exists before any solving
    for variant in cfg.variants:
        onnx_rel = Path("onnx") / f"{variant}.onnx"
        onnx_path = out / onnx_rel
        if not onnx_path.is_file():
            model, _ = checkpoint.load_model(run.file("swap", variant, "relu.pt"))
            try:
                # a linked ReLU pair (CReLU) becomes Linear([W; −W]) → ReLU, which every verifier reads
                to_verifier_onnx(unfold_linked_relu(model), info.input_shape, onnx_path)
            except (TypeError, ValueError, NotImplementedError) as e:
                # a CNN or a paired activation: to_verifier_onnx takes Linear/ReLU MLPs only
                models[variant] = {"onnx": None, "note": f"not verified: {type(e).__name__}: {e}"}
                continue
        layers = layers_from_onnx(onnx_path)
        logits = _predict(onnx_path, xs)
        predicted = [int(k) for k in logits.argmax(1)]
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
        bounds_relus = interval_bounds(layers, xs[0], xs[0]).num_relus
        models[variant] = {"onnx": onnx_rel.as_posix(), "relus": bounds_relus,
                           "clean_correct": int(sum(p == c for p, c in zip(predicted, labels))), "samples": n}
        pending.append((variant, onnx_path, specs, layers, predicted))
    write_instances_csv(out / "instances.csv", instances)

    # 2. solve, one property at a time, results.csv rewritten after each. Order: eps, then sample,
    # then variant, so that a stage stopped part way still compares the variants on the same properties.
    order = {v: i for i, v in enumerate(cfg.variants)}
    eps_rank = {format_real(e): i for i, e in enumerate(vcfg.epsilons)}

    def save() -> None:
        rows.sort(key=lambda r: (order[r["variant"]], eps_rank[format_real(float(r["eps"]))], int(r["sample"]),
                                 verifiers.index(r["verifier"])))
        atomic_write_csv(results_path, rows, FIELDS)

    tasks = sorted(((eps_rank[format_real(eps)], k, order[variant]), variant, onnx_path, layers, predicted[k], k, eps, spec, rel)
                   for variant, onnx_path, specs, layers, predicted in pending for k, eps, spec, rel in specs)
    for _, variant, onnx_path, layers, pred, k, eps, spec, rel in tasks:
        ib = interval_bounds(layers, spec.lb, spec.ub)
        base = {"variant": variant, "sample": k, "eps": format_real(eps), "label": labels[k], "predicted": pred,
                "unstable_relus": ib.num_unstable, "relus": ib.num_relus, "vnnlib": rel.as_posix()}
        for name, solver in solvers.items():
            prev = done.get(_key(variant, k, eps, name))
            if prev is not None:
                rows.append(prev)
                continue
            row = {**base, "verifier": name, "counterexample": ""}
            if pred != labels[k]:
                row.update(status="misclassified", seconds=0.0, cpu_seconds=0.0,
                           message=f"the model predicts {pred} at the sample itself; verifier not run")
            else:
                res, cpu = solver.verify(onnx_path, out / rel, vcfg.timeout_s)
                row.update(status=res.status, seconds=round(res.seconds, 4), cpu_seconds=round(cpu, 4),
                           message=res.message.replace("\n", " "))
                if res.counterexample is not None:
                    cex_rel = Path("counterexamples") / f"{property_name(variant, k, eps)}_{name}.npy"
                    (out / cex_rel).parent.mkdir(parents=True, exist_ok=True)
                    with atomic_path(out / cex_rel) as tmp, open(tmp, "wb") as f:
                        np.save(f, np.asarray(res.counterexample, dtype=np.float64))
                    row["counterexample"] = cex_rel.as_posix()
            rows.append(row)
            save()
    save()

    # 3. the smooth models: can any verifier here read them?
    smooth: dict[str, Any] = {}
    if vcfg.probe_smooth:
        for variant in cfg.variants:
            path = run.file("export", variant, "smooth", "model.onnx")
            if path.is_file():
                smooth[variant] = {**probe_smooth(path), "onnx": str(path.relative_to(run.path))}
            elif checkpoint.load_payload(run.file("train", variant, "best.pt"))["spec"]["activation"] != "relu":
                smooth[variant] = {"onnx": None, "note": "export/<variant>/smooth/model.onnx is absent: run the export stage"}

    table = summarize(rows, [v for v in cfg.variants if models.get(v, {}).get("onnx")], vcfg.epsilons, verifiers, n)
    summary = {
        "certificates_are_for": CERTIFIED_FOR,
        "samples": n, "sample_selection": f"the first {n} validation examples, the same for every variant",
        "epsilons": list(vcfg.epsilons), "input_range": [info.input_low, info.input_high],
        "timeout_s": vcfg.timeout_s, "timeout_counts": "CPU seconds" if vcfg.cpu_time else "wall seconds",
        "verifiers": verifiers, "verifier_note": verifier_note,
        "models": models, "table": table, "conflicts": conflicts(rows), "smooth": smooth,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    atomic_write_json(out / "summary.json", summary)
    return {"verifiers": verifiers, "samples": n, "conflicts": len(summary["conflicts"]),
            "certified": {f"{r['variant']}/{format_real(r['eps'])}/{r['verifier']}": round(r["certified_fraction"], 4) for r in table}}


# ---------------------------------------------------------------------------------------------
# report


def _pct(x: float) -> str:
    return "—" if x != x else f"{100 * x:.0f}%"


def _sec(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def report_section(cfg: Config, run: RunDir) -> str | None:
    """Markdown for report.md: the comparison table per eps, the smooth-model finding, and
    which model a certificate is for. None when the verify stage has not run."""
    from analysis.report import table

    path = run.file("verify", "summary.json")
    if not path.is_file():
        return None
    s = json.loads(path.read_text())
    unit = "CPU s" if s.get("timeout_counts", "").startswith("CPU") else "s"
    out = ["## Verification (L∞ local robustness)",
           f"Certificates are for **{s['certificates_are_for']}**. Properties: {s['sample_selection']}; "
           f"the true class's logit beats every other on the L∞ box of radius ε clipped to the input range "
           f"{s['input_range']}; verifier {', '.join(f'`{v}`' for v in s['verifiers'])}, timeout {s['timeout_s']:g} "
           f"{unit} per property. Falsified includes samples the model already misclassifies (not run); every "
           "counterexample was re-checked in onnxruntime. Unstable ReLUs: IBP pre-activation interval over the box crosses 0."
           + (f" {s['verifier_note']}." if s.get("verifier_note") else "")]
    for eps in s["epsilons"]:
        rows = [[r["variant"], r["verifier"], r["properties"], _pct(r["certified_fraction"]), _pct(r["falsified_fraction"]),
                 _pct(r["timeout_fraction"]), r["error"] + r["unknown"], _sec(r.get("median_cpu_seconds")),
                 _sec(r["median_seconds"]), f"{r['mean_unstable_relus']:.1f} / {r['relus']}"]
                for r in s["table"] if r["eps"] == eps]
        out.append(f"### ε = {eps:g}\n\n" + table(
            ["model (swapped to ReLU)", "verifier", "properties", "certified", "falsified", "timeout", "error/unknown",
             "median CPU s", "median wall s", "mean unstable ReLUs"], rows))
    for v, m in s["models"].items():
        if not m.get("onnx"):
            out.append(f"`{v}`: {m['note']}")
    if s["conflicts"]:
        out.append(f"**Verifiers disagree** (one proved, another falsified) on: {', '.join(s['conflicts'])}.")
    smooth = s.get("smooth") or {}
    if smooth:
        lines = []
        for v, f in smooth.items():
            if not f.get("ops"):
                lines.append(f"- `{v}`: {f.get('note')}")
                continue
            lines.append(f"- `{v}` (`{f['onnx']}`, ops {', '.join(f['ops'])}): Marabou `read_onnx` → "
                         f"{'reads it' if f['marabou']['ok'] else '`' + f['marabou']['message'] + '`'}; "
                         f"interval/MILP reader → {'reads it' if f['intervals']['ok'] else '`' + f['intervals']['message'] + '`'}.")
        bounds = run.file("check", "bounds.json")
        transfer = ""
        if bounds.is_file():
            certs = {v: r.get("certificate") for v, r in json.loads(bounds.read_text()).get("variants", {}).items()}
            parts = [f"`{v}` {c['bound_max']:.3g}" for v, c in certs.items() if c and "bound_max" in c]
            if parts:
                transfer = (" The check stage's global swap bound (max logit change from the swap, any input) is "
                            + ", ".join(parts) + ": a ReLU certificate transfers to the smooth model only where the "
                            "ReLU model's margin over the whole box exceeds twice that.")
        out.append("**The smooth models themselves** (before the swap), as exported by the export stage:\n\n" + "\n".join(lines)
                   + "\n\nA certificate above is therefore for the swapped ReLU network only." + transfer)
    return "\n\n".join(out)
