"""The check stage: the measured gate errors against their closed-form bounds, and the swap certificate against the
measured logit change (the library: `analysis/bounds_check.py`; the certificate itself: `analysis/theory/certificate/`).

Reads: `train/<variant>/best.pt`, each variant's record (λ_target). Writes: `check/bounds.json`, `check/gate_error.png`;
and the stage's section of report.md.
"""

from __future__ import annotations

from typing import Any

from analysis.bounds_check import (CERTIFIED, PREDICTION_RTOL, PREDICTION_Z, empirical_check, plot_layers, predictions,
                                   swap_certificate, verdict)
from analysis.theory import symbolic
from pipeline import checkpoint, render
from pipeline.atomic_io import atomic_write_json
from pipeline.config import Config
from pipeline.data import dataset_for
from pipeline.rundir import Output, RunDir

OUTPUTS = (Output("check/bounds.json"), Output("check/gate_error.png", when="a variant has gates"))


def run_check(cfg: Config, run: RunDir) -> dict[str, Any]:
    device = run.compute_device()
    ds = dataset_for(cfg)
    eps = cfg.harden.epsilon
    out: dict[str, Any] = {"symbolic": symbolic.summary(eps), "variants": {}}
    per_layer: dict[str, list[dict]] = {}
    for variant in cfg.variants:
        model, payload = checkpoint.load_model(run.file("train", variant, "best.pt"), device)
        layers = empirical_check(model, ds.val, cfg.data.eval_batch_size, device, cfg.check.soft_delta, cfg.check.band,
                                 cfg.check.sup_rtol, progress=f"check {variant}")
        if not layers:  # a ReLU baseline or a non-gate activation: the swap changes nothing
            out["variants"][variant] = {"layers": [], "note": "no gates: the swap leaves this model unchanged"}
            continue
        target = run.variant(variant).lambda_target
        for layer in layers:
            layer["lambda_target"] = target  # recorded by the train stage (per variant); for reading, not a verdict
        per_layer[variant] = layers
        cert = swap_certificate(model, ds.val, cfg.data.eval_batch_size, ds.val.x[:1], progress=f"check {variant}",
                                jacobian_samples=cfg.check.float32_jacobian_samples, device=device)
        out["variants"][variant] = {"epoch": payload.get("epoch"), "lambda_target": target, "layers": layers, "certificate": cert,
                                    "verdict": verdict(layers, cert), "predictions": predictions(layers)}
    if per_layer:
        plot_layers(per_layer, run.file("check", "gate_error.png"))
    atomic_write_json(run.file("check", "bounds.json"), out)
    return {v: {"verdict": r["verdict"]["certificate"],
                "certificate": {k: (r["certificate"][k]["status"] if r["certificate"][k]["status"] == "refused"
                                    else "pass" if r["certificate"][k].get("pass", True) else "FAIL")
                                for k in ("global", *CERTIFIED)},
                "certified_fraction": r["certificate"]["float32"].get("certified_fraction"),
                "certified_fraction_jacobian": r["certificate"]["float32_jacobian"].get("certified_fraction"),
                "predictions": "pass" if r["predictions"]["pass"] else "off"} if "certificate" in r else {"verdict": None}
            for v, r in out["variants"].items()}


def _mark(ok: bool) -> str:
    return "pass" if ok else "FAIL"


def _near(ok: bool) -> str:
    return "near" if ok else "off"


def verdict_line(v: dict[str, Any], pred: dict[str, Any]) -> str:
    """The verdict in words, and the predictions apart as a diagnostic."""
    head = {"holds": "**Verdict: the certificate holds**", "refused": "**Verdict: refused** (nothing is proved)",
            "fails": "**Verdict: the certificate fails**"}[v["certificate"]]
    diag = ("every closed-form prediction near its measurement" if pred["pass"] else
            f"{len(pred['off'])} closed-form prediction(s) off (" + ", ".join(f"layer {o['layer']} {o['check']}" for o in pred["off"])
            + "): the pre-activations are not flat near 0 there; this says nothing about the swap")
    return f"{head}: {v['why']}. Diagnostic: {diag}."


def certificate_lines(cert: dict[str, Any]) -> list[str]:
    """What the certificate proved, statement by statement, never more."""
    lines = []
    for key in ("global", "per_sample"):
        g = cert[key]
        lines.append(f"- {key} bound on max |Δlogit| ({cert['about'][key]}): "
                     + (f"**{g['bound_max']:.4g}**" if g["status"] == "sound" else f"refused: {g['reason']}"))
        kept, r = g.get("top1_kept_in_real_arithmetic"), g.get("bound_to_change")
        if kept is not None and r:
            lines.append(f"  (in real arithmetic this bound keeps the top-1 prediction of {100 * kept:.2f}% of the samples and is "
                         f"{r['median']:.3g}× the measured change, median over samples; it says nothing about float32 runs)")
    for key in ("float32", "float32_global", "float32_jacobian"):
        if key not in cert:  # written before this statement existed
            continue
        s = cert[key]
        head = f"- {key} ({cert['about'][key]}): "
        if s["status"] == "refused":
            lines.append(head + f"refused: {s['reason']}")
        elif not s["pass"]:
            lines.append(head + f"**violated** on {s['violations']} of {s['samples']} samples (max excess {s['max_excess']:.3g}): "
                         "a bug in the certificate, the swap or a gate; nothing is claimed")
        else:
            r = s.get("bound_to_change")
            loose = f"; the bound is {r['median']:.3g}× the measured change (median over samples, max {r['max']:.3g}×)" if r else ""
            lines.append(head + f"holds on all {s['samples']} samples (smallest slack, bound minus measured change: "
                         f"{-s['max_excess']:.3g}); {100 * s['certified_fraction']:.2f}% of them keep their top-1 "
                         f"prediction provably{loose}")
    lines.append(f"- measured max |Δlogit| of the swap: {cert['measured_max_logit_change']:.4g}")
    return lines


def report_section(cfg: Config, run: RunDir) -> str | None:
    """The check stage's section of report.md (None when it has not run)."""
    b = run.read_json("check", "bounds.json")
    if b is None:
        return None
    out = ["## Bounds (check stage)"]
    for gate, s in b["symbolic"]["gates"].items():
        out.append(f"- gate `{gate}` ({s['label']}): E∞(λ) = `{s['gate_l1']['expr']}`, ∫|ReLU − f_λ| = `{s['act_l1']['expr']}`, "
                   f"sup|ReLU − f_λ| = {s['sup']['c']:.6f}/λ at x = ±{s['sup']['u']:.6f}/λ, Lipschitz {s['lipschitz']['value']:.6f}")
    out.append("λ_target: the value each variant's record holds (decided once by the train stage from the `harden` section), "
               "in the tables' λ_target column.")
    out.append("Per layer: `sup` compares the gate module's own output with the bound c/λ (float32 allowance included); "
               "`gate_l1` and `act_l1` compare the measured means with their closed-form predictions p̂(0)·E∞(λ) and "
               "p̂(0)/(2λ²)-type terms, which assume a pre-activation density flat over |x| < band/λ (tolerance "
               f"{PREDICTION_RTOL:g} + {PREDICTION_Z:g}/√n_band relative). A prediction marked off says the closed form does not "
               "describe that layer's distribution (a diagnostic); what the swap does to the logits is the certificate's verdict below.")
    for v, r in b["variants"].items():
        if not r["layers"]:
            out.append(f"`{v}`: {r.get('note', 'no gates')}.")
            continue
        rows = [[l["layer"], l["lambda_mean"], l.get("lambda_target"), l["max_gap_module"], l["sup_bound"], _mark(l["checks"]["sup"]["pass"]),
                 l["mean_gap"], l["mean_gap_predicted"], _near(l["checks"]["act_l1"]["pass"]),
                 l["gate_error"], l["gate_error_predicted"], _near(l["checks"]["gate_l1"]["pass"]), l["soft_fraction"]]
                for l in r["layers"]]
        out.append(f"### `{v}` (best epoch {r.get('epoch')})\n\n" + render.table(
            ["layer", "λ", "λ_target", "max gap (module)", "c/λ", "sup", "mean gap", "predicted", "act_l1",
             "E_p|H − g|", "p̂(0)·E∞(λ)", "gate_l1", "soft fraction"], rows))
        if r.get("certificate"):
            out.append("Swap certificate (every gate → ReLU):\n\n" + "\n".join(certificate_lines(r["certificate"])))
            out.append(verdict_line(r["verdict"], r["predictions"]))
    out.append("![gate error per layer](../check/gate_error.png)")
    return "\n\n".join(out)
