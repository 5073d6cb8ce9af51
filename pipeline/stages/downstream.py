"""The downstream stage: one record per shipped network of what hardening buys after the swap (the library and what
each field means: `analysis/downstream.py`).

Reads the int8 stage's `quantize/quantize.json`, the sparsity stage's `sparsity/sparsity.json` and pruned ONNX models,
the export stage's `export/export.json`, the verify stage's `verify/summary.json`, `verify/details.csv` and
`verify/onnx/` graphs; measures only what no stage records: each sample's certified radius by bisection on the float
ReLU network and its int8 model (`analysis.robustness.radius`), the unstable ReLUs after one CROWN pass at each
verify.epsilons (`analysis.robustness.unstable`), and the pruned model's latency beside the unpruned one (timed
round-robin in onnxruntime). Each network's bisection is an independent job, run in the verify stage's worker
processes on its device and clock. Writes `downstream/downstream.json` (the record, per-sample brackets and per-layer
shares included), `downstream/certified_accuracy.png` and the compact record into the manifest; and its section of
report.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from analysis import downstream as ds_mod
from analysis.robustness import radius as radius_mod
from analysis.robustness.unstable import unstable_sweep
from analysis.verification import harness
from analysis.verification.readers import read
from pipeline import render
from pipeline.atomic_io import atomic_write_json
from pipeline.config import Config, ConfigError
from pipeline.data import dataset_for
from pipeline.errors import RunDirError
from pipeline.progress import Progress
from pipeline.rundir import Output, RunDir
from quantize import ort as ort_util

CURVE_FILE = "certified_accuracy.png"
OUTPUTS = (Output("downstream/downstream.json"), Output(f"downstream/{CURVE_FILE}"))


def validate_config(cfg: Config) -> None:
    d = cfg.downstream
    if d.samples < 0:
        raise ConfigError(f"downstream.samples must be >= 0 (0 = verify.samples), got {d.samples}")
    if not d.eps_max > 0:
        raise ConfigError(f"downstream.eps_max must be > 0 (the bisection's upper end, data units), got {d.eps_max}")
    if d.tol < 0 or d.tol >= d.eps_max:
        raise ConfigError(f"downstream.tol must be in [0, downstream.eps_max) (0 = eps_max / 64), got {d.tol}")
    if not d.timeout_s > 0:
        raise ConfigError(f"downstream.timeout_s must be > 0 (seconds per bisection property), got {d.timeout_s}")
    if d.curve_points < 2:
        raise ConfigError(f"downstream.curve_points must be >= 2, got {d.curve_points}")


def _models(summary: dict[str, Any], variant: str) -> dict[str, str]:
    """{"relu": name, "int8": name} of the variant's verified graphs (only those the verify stage read)."""
    return {m["network"]: name for name, m in (summary.get("models") or {}).items()
            if m.get("variant") == variant and m.get("onnx") and m.get("network") in ("relu", "int8")}


def run_downstream(cfg: Config, run: RunDir) -> dict[str, Any]:
    d = cfg.downstream
    validate_config(cfg)
    summary = run.read_json("verify", "summary.json")
    if summary is None:
        raise RunDirError(f"{run.path}: the verify stage has written no verify/summary.json; run it first "
                          f"(`pipeline run --resume {run.path} --redo verify`)")
    details = ds_mod.read_details(run.file("verify", "details.csv"))
    quantize, sparsity = run.read_json("quantize", "quantize.json"), run.read_json("sparsity", "sparsity.json")
    exported = (run.read_json("export", "export.json") or {}).get("models") or {}
    data = dataset_for(cfg)
    n = min(d.samples or cfg.verify.samples, len(data.val.y))
    xs = data.val.x[:n].double().numpy().reshape(n, -1)
    labels = [int(c) for c in data.val.y[:n]]
    lo, hi = np.asarray(data.info.input_low, dtype=np.float64), np.asarray(data.info.input_high, dtype=np.float64)
    tol = d.tol or d.eps_max / 64
    verifier = summary["verifiers"][0]
    grid = [float(e) for e in np.linspace(0.0, d.eps_max, d.curve_points)]
    # each network's bisection is an independent job, run where the verify stage ran its properties (its worker count,
    # device and clock), so that a bisection property gets what a verify property got
    networks = [(v, kind, name) for v in cfg.variants for kind, name in _models(summary, v).items()
                if kind == "relu" or d.int8]
    # on a GPU the bisections go one after another: the device does the parallel work, and workers would each plan
    # with all of its memory
    workers = 1 if str(summary.get("device", "cpu")).startswith("cuda") else int(summary.get("jobs") or 1)
    common = dict(xs=xs, labels=labels, lo=lo, hi=hi, eps_max=d.eps_max, tol=tol, verifier=verifier,
                  timeout_s=d.timeout_s, clock=summary.get("clock", "wall"), device=summary.get("device", "cpu"),
                  epsilons=list(cfg.verify.epsilons), grid=grid)
    measured: dict[tuple[str, str], dict[str, Any]] = {}
    threads = torch.get_num_threads()
    try:
        with Progress("downstream", len(networks), "network") as bar:
            for (v, kind, name), rec in _each(_network_record, networks, workers, [
                    dict(kind=kind, name=name, path=str(run.file("verify", summary["models"][name]["onnx"])), **common)
                    for v, kind, name in networks]):
                measured[(v, kind)] = rec
                bar.step(line=f"    downstream {v} ({kind}): median radius ≥ {rec['radius']['median_proved']:.4g}")
    finally:
        torch.set_num_threads(threads)
    record: dict[str, Any] = {}
    for v in cfg.variants:
        models = _models(summary, v)
        entry: dict[str, Any] = {"int8": ds_mod.int8_columns(quantize, v), "sparsity": ds_mod.sparsity_columns(sparsity, v),
                                 "verify": {net: ds_mod.verify_columns(details, name, verifier)
                                            for net, name in models.items()},
                                 "radius": {k: m["radius"] for (v_, k), m in measured.items() if v_ == v},
                                 "unstable": {k: m["unstable"] for (v_, k), m in measured.items() if v_ == v and "unstable" in m}}
        if entry["sparsity"] and entry["sparsity"]["pruned_onnx"] and (exported.get(v) or {}).get("relu"):
            entry["sparsity"].update(_pruned_speed(cfg, run, data, run.path / exported[v]["relu"]["path"],
                                                   run.path / entry["sparsity"]["pruned_onnx"]))
        record[v] = entry
    out = {"samples": n, "sample_selection": f"the first {n} validation examples (the verify stage's first)",
           "verifier": verifier, "eps_max": d.eps_max, "tol": tol, "timeout_s": d.timeout_s, "workers": workers,
           "epsilons": list(cfg.verify.epsilons), "input_range": [data.info.input_low, data.info.input_high],
           "variants": record}
    atomic_write_json(run.file("downstream", "downstream.json"), out)
    _plot(run.file("downstream", CURVE_FILE), record)
    return {"samples": n, "eps_max": d.eps_max, "variants": ds_mod.compact(record)}


def _network_record(*, kind: str, name: str, path: str, xs: np.ndarray, labels: list[int], lo, hi, eps_max: float,
                    tol: float, verifier: str, timeout_s: float, clock: str, device: str, epsilons: list[float],
                    grid: list[float]) -> dict[str, Any]:
    """One network's measured columns: its radii by bisection (and for the float ReLU network its unstable ReLUs per ε).
    A module-level function of plain values, so that a worker process can run it."""
    torch.set_num_threads(1)  # small matrices: one thread, as the verify stage
    net = read(Path(path))
    radii = radius_mod.bisect(net, harness.OnnxRecheck(Path(path)), xs, labels, eps_max, low=lo, high=hi, tol=tol,
                              verifier=verifier, timeout_s=timeout_s, clock=clock, device=device, network=name)
    out = {"radius": ds_mod.radius_columns([radius_mod.record(r) for r in radii], radius_mod.certified_curve(radii, grid),
                                           eps_max, tol)}
    if kind == "relu":
        out["unstable"] = ds_mod.unstable_columns(unstable_sweep(net, xs, epsilons, lo, hi))
    return out


def _each(fn, keys: list[Any], workers: int, kwargs: list[dict[str, Any]]):
    """(key, fn(**kw)) for every job, as each finishes: in this process when one worker is asked for, else in
    `workers` spawned processes (the bisections are independent, each a long serial loop of short properties)."""
    if workers <= 1 or len(kwargs) <= 1:
        for key, kw in zip(keys, kwargs):
            yield key, fn(**kw)
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=min(workers, len(kwargs)), mp_context=mp.get_context("spawn")) as pool:
        futures = {pool.submit(fn, **kw): key for key, kw in zip(keys, kwargs)}
        for f in as_completed(futures):
            yield futures[f], f.result()


def _pruned_speed(cfg: Config, run: RunDir, data, unpruned: Path, pruned: Path) -> dict[str, Any]:
    """Size and batch-1 latency of the pruned and the unpruned fp32 ONNX models, timed round-robin in one window."""
    q = cfg.quantize
    b = q.throughput_batch
    t = ort_util.speed_table({"unpruned": unpruned, "pruned": pruned}, data.val.x[:b].numpy(), b, q.repeats, q.threads,
                             q.timing_blocks)
    u, p = t["unpruned"]["latency_b1_ms"], t["pruned"]["latency_b1_ms"]
    return {"bytes_unpruned": ort_util.file_bytes(unpruned), "bytes_pruned": ort_util.file_bytes(pruned),
            "latency_b1_ms_unpruned": u, "latency_b1_ms_pruned": p, "latency_ratio": p / u}


def certified_steps(brackets: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """The exact certified-accuracy curve of one network as steps (x, y, drawn steps-post): the share of samples
    classified correctly at ε = 0, then one sample fewer after each proved radius."""
    n = max(len(brackets), 1)
    radii = sorted(b["proved"] for b in brackets if b["clean"])
    xs, ys = [0.0], [len(radii) / n]
    for i, r in enumerate(radii):
        xs.append(float(r))
        ys.append((len(radii) - i - 1) / n)
    return xs, ys


def shown_eps_max(record: dict[str, Any]) -> float:
    """Where the figure and the table stop: eps_max when a radius reached it, else 1.5× the widest bracket's open end
    (past it every curve is flat at its last value, so a wider axis shows only that)."""
    ends, eps_max = [], 0.0
    for e in record.values():
        for r in (e.get("radius") or {}).values():
            eps_max = max(eps_max, r["eps_max"])
            for b in r.get("brackets") or []:
                if b["open"] is None:
                    return r["eps_max"]
                ends.append(b["open"])
    return min(eps_max, 1.5 * max(ends)) if ends else eps_max


def _plot(path: Path, record: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    right = shown_eps_max(record)
    for v, e in record.items():
        for kind, style in (("relu", "-"), ("int8", "--")):
            r = e["radius"].get(kind)
            if r:
                xs, ys = certified_steps(r["brackets"])
                ax.plot([*xs, right], [100 * y for y in (*ys, ys[-1])], style, drawstyle="steps-post",
                        label=f"{v} ({'float ReLU' if kind == 'relu' else 'int8'})")
    ax.set_xlabel("ε (L∞, data units)")
    ax.set_ylabel("certified accuracy (%)")
    ax.set_xlim(0, right)
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report_section(cfg: Config, run: RunDir) -> str | None:
    """Per variant: certified accuracy vs ε (figure and table), unstable ReLUs per ε, and the int8 and pruning columns."""
    rec = run.read_json("downstream", "downstream.json")
    if rec is None:
        return None
    variants = rec["variants"]
    pct = lambda v: "—" if v is None else f"{100 * v:.1f}"  # noqa: E731
    right = shown_eps_max(variants)
    curve_eps = sorted({c["eps"] for e in variants.values() for r in e["radius"].values() for c in r["curve"]
                        if c["eps"] <= right + 1e-12})
    shown = curve_eps[:: max(1, -(-len(curve_eps) // 7))]
    curve_rows = [[f"{v} ({k})", render.fmt(r["median_proved"], 4), r["censored"], r["falsified"],
                   *(pct(next(c["certified"] for c in r["curve"] if c["eps"] == e)) for e in shown)]
                  for v, e_ in variants.items() for k, r in e_["radius"].items()]
    eps = rec["epsilons"]
    verify_rows = []
    for v, e in variants.items():
        for k, cols in e["verify"].items():
            un = {u["eps"]: u for u in e["unstable"].get(k, [])}
            for c in cols:
                u = un.get(c["eps"])
                verify_rows.append([f"{v} ({k})", render.fmt(c["eps"], 4), c["properties"], pct(c["certified"]),
                                    pct(c["falsified"]), render.fmt(c["median_decided_seconds"], 3),
                                    "—" if u is None else f"{u['unstable_mean']:.1f} / {u['relus']}",
                                    "—" if u is None else " · ".join(f"{100 * l['active']:.0f}/{100 * l['dead']:.0f}"
                                                                     for l in u["layers"])])
    side = []
    for v, e in variants.items():
        i8, sp = e.get("int8") or {}, e.get("sparsity") or {}
        side.append([v, render.fmt(i8.get("test_drop_pt"), 2), pct(i8.get("test_argmax_agreement")),
                     render.fmt(i8.get("output_sqnr_db"), 1), pct(sp.get("apoz_mean")), pct(sp.get("pruned_fraction")),
                     f"{sp['bytes_pruned'] / sp['bytes_unpruned']:.3f}" if sp.get("bytes_unpruned") else "—",
                     render.fmt(sp.get("latency_ratio"), 3)])
    return "\n\n".join([
        "## Downstream: int8, pruning and verification of the shipped networks",
        (f"Certified radius per sample by bisection over the verifier's sound answers (`{rec['verifier']}`) on the first {rec['samples']} "
         f"validation examples, in [0, {rec['eps_max']:g}] to a bracket of {rec['tol']:.3g} ({rec['timeout_s']:g} s per "
         "property); certified accuracy at ε = share of samples proved at ε or beyond (a misclassified sample never). "
         "'censored': proved at eps_max (radius ≥ eps_max); 'falsified': a strict counterexample found within eps_max. "
         f"The figure draws each network's curve exactly from its proved radii; it and the table stop at ε = "
         f"{right:.3g}, past which no curve changes."),
        f"![certified accuracy vs ε](../downstream/{CURVE_FILE})",
        render.table(["network", "median radius ≥", "censored", "falsified",
                      *(f"cert. acc. at ε={e:.3g} (%)" for e in shown)], curve_rows),
        (f"The verify stage's properties per ε ({', '.join(f'{e:g}' for e in eps)}): certified and falsified shares and "
         "the median seconds per decided property (verify/details.csv); unstable ReLUs after one CROWN pass over each "
         "sample's box (mean over samples / all ReLUs) and per layer the share of units stable active / stable dead (%)."),
        render.table(["network", "ε", "properties", "certified (%)", "falsified (%)", "median s per decided",
                      "unstable ReLUs (CROWN)", "stable active/dead per layer (%)"], verify_rows),
        ("int8 (the int8 stage, the ReLU form): test accuracy drop in points, test argmax agreement, logits' SQNR. "
         "Pruning (the sparsity stage): mean APoZ, the share of units pruned losslessly; the pruned fp32 ONNX model's "
         "size and batch-1 latency over the unpruned one's (timed side by side in onnxruntime)."),
        render.table(["variant", "int8 test drop (pt)", "int8 argmax agreement (%)", "logits SQNR (dB)",
                      "mean APoZ (%)", "pruned (%)", "pruned size ratio", "pruned latency ratio"], side),
    ])
