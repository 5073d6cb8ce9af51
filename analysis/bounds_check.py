"""What the check stage measures (the stage: `pipeline/stages/check.py`; `analysis.api.check` for a model of your
own): per gate layer, measured quantities against their closed-form predictions, and the swap certificate
(`analysis/theory/certificate/`) against the measured logit change. Every verdict compares two named quantities with a
stated tolerance, and every one can fail.

Per gate layer ℓ with hardness λ (per unit for per-channel gates), on the validation pre-activations x
(streamed: running sums, never all activations at once):

- `sup`: the deployed gate module's own output f̂(x) stays within c/λ of ReLU (c of the gate's family,
  `pipeline.gates.sup_constant`, as the certificate has it),
      max λ·(|ReLU(x) − f̂(x)| − rounding(x)) ≤ c·(1 + check.sup_rtol),
  rounding(x) = SAFETY·(K_GATE·u·|x| + UNDERFLOW) the float32 evaluation allowance of the certificate. This is the
  premise of the global certificate (c/λ per unit), measured on the module that ships rather than on
  the formula: a gate that computes something other than x·g(λx) with its reported λ fails it.
- `gate_l1`: the density-weighted gate error E_p|H(x) − g(λx)| against its prediction p̂(0)·E∞(λ) =
  p̂(0)·a/λ, where p̂(0) is the fraction of |λx| < check.band over 2·band/λ. The prediction is
  the first term of E_p|H − g(λx)| = ∫p(x)|H(x) − g(λx)|dx for a density p that is flat over the
  soft band |x| ≲ band/λ; it fails where the pre-activation density is not flat on that scale (small λ,
  e.g. GELU at λ = 1, or an atom of pre-activations at 0).
- `act_l1`: the mean |ReLU(x) − f_λ(x)| against p̂(0)·∫|ReLU − f_λ| = p̂(0)·b/λ² (per unit: the mean of
  1{|λx| < band}·b/(2·band·λ)), under the same assumption.
  Tolerance of both predictions: PREDICTION_RTOL + PREDICTION_Z/√n_band relative (named below).

Per model, the swap certificate: the float32 logit change of the swap measured on every validation
sample against the certified bound for that sample (`float32`: δ̃ + ε̃; `float32_global`: the global
bound B plus both networks' rounding on the sample). A violation is a bug in the certificate, in the
swap or in a gate; the report then claims nothing for that statement. A statement the certificate
cannot prove is recorded as refused with its reason.

The per-layer means are computed in float64 from the gate family's formula at the module's λ; the
`sup` check uses the module's actual output. The GELU baseline is a gate at λ = 1.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn

from pipeline import gates, render
from pipeline.activations import gate_of, gate_sites
from pipeline.data import batches
from pipeline.devices import cpu_model
from pipeline.progress import Progress
from pipeline.relu_swap import to_relu

from .theory import certificate, symbolic
from .theory.certificate import chain32

# The closed-form predictions hold for a pre-activation density that is flat over |x| < band/λ: the
# curvature term is (band/λ)²·|p''(0)/p(0)|/6 relative, under 1% at λ ≥ 100 for unit-scale densities.
# The tolerance allows 10% for that and for the estimator p̂(0), plus PREDICTION_Z binomial standard errors
# of the band count (the measured mean and p̂(0) come from the same few samples near 0).
PREDICTION_RTOL = 0.10
PREDICTION_Z = 4.0
# The float32 allowance in the `sup` check: the certificate's own bound on a gate's float32 evaluation error.
def _gate_rounding(x_abs: torch.Tensor) -> torch.Tensor:
    return certificate.SAFETY * certificate.gate_rounding(x_abs)


class _LayerStats:
    """Running sums for one gate layer (float64)."""

    def __init__(self, gate: str, lam: torch.Tensor, delta: float, band: float):
        self.gate = gate
        self.g = gates.family(gate).g
        self.lam, self.delta, self.band = lam, delta, band
        self.n = 0
        self.sum_gap = self.sum_gate = 0.0
        self.max_gap = self.max_gap_module = self.max_excess_scaled = 0.0
        self.n_soft = self.n_band = self.n_nonpos = 0
        self.sum_inv_lam_band = 0.0

    def update(self, x: torch.Tensor, out: torch.Tensor) -> None:
        x = x.detach().double()  # where the model runs: a GPU computes these float64 statistics too
        if self.lam.device != x.device:
            self.lam = self.lam.to(x.device)
        lam = gates.per_channel(self.lam, x).expand_as(x)  # the gate's own channel axis (last for [B, T, C] tokens)
        z = lam * x
        gz = self.g(z)
        gap = (torch.relu(x) - x * gz).abs()
        module_gap = (torch.relu(x) - out.detach().double()).abs()  # the deployed module's own output
        heav = (x > 0).double() + 0.5 * (x == 0).double()
        in_band = z.abs() < self.band
        self.n += x.numel()
        self.sum_gap += float(gap.sum())
        self.sum_gate += float((heav - gz).abs().sum())
        self.max_gap = max(self.max_gap, float(gap.max()))
        self.max_gap_module = max(self.max_gap_module, float(module_gap.max()))
        # c/λ per unit ⇒ compare λ·(gap − float32 allowance) with c
        self.max_excess_scaled = max(self.max_excess_scaled, float(((module_gap - _gate_rounding(x.abs())) * lam).max()))
        self.n_soft += int(((gz > self.delta) & (gz < 1 - self.delta)).sum())
        self.n_band += int(in_band.sum())
        self.sum_inv_lam_band += float((in_band.double() / lam).sum())
        self.n_nonpos += int((x <= 0).sum())


def _prediction(measured: float, predicted: float, n_band: int, what: str) -> dict[str, Any]:
    tol = PREDICTION_RTOL + PREDICTION_Z / math.sqrt(max(n_band, 1))
    rel = abs(measured - predicted) / predicted if predicted > 0 else math.inf
    return {"pass": bool(rel <= tol), "measured": measured, "predicted": predicted, "relative_error": rel, "tolerance": tol,
            "rule": f"|{what} − prediction| ≤ (PREDICTION_RTOL + PREDICTION_Z/√n_band)·prediction "
                    f"(PREDICTION_RTOL = {PREDICTION_RTOL}, PREDICTION_Z = {PREDICTION_Z}, n_band = {n_band})"}


def layer_report(st: _LayerStats, summary: dict[str, Any], sup_rtol: float) -> dict[str, Any]:
    """The layer's statistics against the predictions (a, b from the sympy derivations in `summary`) and the `sup`
    check against the family's c (`gates.sup_constant`: the constant the certificate and the relaxations use, nudged
    up to a sound bound), not against sympy's own c."""
    a = summary["gate_l1"]["coeff"]  # E∞(λ) = a/λ
    b = summary["act_l1"]["coeff"]  # ∫|ReLU − f_λ| = b/λ²
    c = gates.sup_constant(st.gate)
    n = max(st.n, 1)
    # p̂(0)·a/λ per element = 1{|λx| < B}·(λ/2B)·(a/λ) = 1{…}·a/(2B); likewise b/λ² → 1{…}·b/(2Bλ).
    pred_gate = st.n_band / n * a / (2 * st.band)
    pred_act = st.sum_inv_lam_band / n * b / (2 * st.band)
    mean_gap, mean_gate = st.sum_gap / n, st.sum_gate / n
    lam = st.lam
    checks = {
        "sup": {"pass": bool(st.max_excess_scaled <= c * (1 + sup_rtol)), "measured": st.max_excess_scaled, "bound": c,
                "rule": "max λ·(|ReLU(x) − f̂(x)| − SAFETY·(K_GATE·u·|x| + UNDERFLOW)) ≤ c·(1 + check.sup_rtol), f̂ the gate module's output",
                "sup_rtol": sup_rtol},
        "gate_l1": _prediction(mean_gate, pred_gate, st.n_band, "E_p|H(x) − g(λx)|"),
        "act_l1": _prediction(mean_gap, pred_act, st.n_band, "mean |ReLU(x) − f_λ(x)|"),
    }
    return {
        "lambda_mean": float(lam.mean()), "lambda_min": float(lam.min()), "lambda_max": float(lam.max()),
        "n_preactivations": st.n, "n_band": st.n_band,
        "max_gap": st.max_gap, "max_gap_module": st.max_gap_module, "sup_bound": c / float(lam.min()), "c": c,
        "mean_gap": mean_gap, "mean_gap_predicted": pred_act,
        "gate_error": mean_gate, "gate_error_predicted": pred_gate,
        "soft_fraction": st.n_soft / n, "density_at_0": st.n_band / n / (2 * st.band) * float(lam.mean()),
        "nonpositive_fraction": st.n_nonpos / n,
        "checks": checks,
    }


@torch.no_grad()
def empirical_check(model: nn.Module, split, batch_size: int, device, delta: float, band: float,
                    sup_rtol: float, progress: str | None = None) -> list[dict[str, Any]]:
    """Per gate layer, the streamed statistics and checks (module docstring). `progress`: a label to report
    progress under (`pipeline.progress`), None for none."""
    sites = [(n, m, *gate_of(m)) for n, m in gate_sites(model)]  # (name, module, family, λ)
    stats = [_LayerStats(fam, lam, delta, band) for _, _, fam, lam in sites]
    hooks = [m.register_forward_hook(lambda mod, inp, out, st=st: st.update(inp[0], out)) for (_, m, _, _), st in zip(sites, stats)]
    bar = _progress(progress, "per-layer statistics", split, batch_size) if sites else None
    try:
        model.eval()
        for b, (x, _) in enumerate(batches(split, batch_size), start=1):
            model(x.to(device))
            if bar:
                bar.step(line=f"    {progress}: per-layer statistics, batch {b}/{bar.total}")
    finally:
        for h in hooks:
            h.remove()
        if bar:
            bar.close()
    out = []
    for i, ((name, _, fam, _), st) in enumerate(zip(sites, stats)):
        rep = layer_report(st, symbolic.gate_summary(fam), sup_rtol)
        out.append({"layer": i, "module": name, "gate": fam, **rep})
    return out


PROGRESS_EVERY_S = 5.0  # at most one progress line per task every this many seconds (and the last)


def _progress(label: str | None, task: str, split, batch_size: int) -> Progress | None:
    return None if label is None else Progress(f"{label}: {task}", -(-len(split) // batch_size), "batch", every_s=PROGRESS_EVERY_S)


def plot_layers(per_variant: dict[str, list[dict]], path) -> None:
    render.save(layers_figure(per_variant), path, layout=False)


def layers_figure(per_variant: dict[str, list[dict]]):
    """Per layer and variant, the gate error against its prediction and the module's largest gap against c/λ; one
    legend under both panels, where it covers no bar."""
    fig = render.figure(11, 4.6)
    axes = fig.subplots(1, 2)
    width = 0.8 / max(1, len(per_variant))
    for k, (variant, layers) in enumerate(per_variant.items()):
        idx = [l["layer"] + k * width for l in layers]
        axes[0].bar(idx, [l["gate_error"] for l in layers], width, color=f"C{k}", label=variant)
        axes[0].scatter(idx, [l["gate_error_predicted"] for l in layers], marker="_", s=200, color="k")
        axes[1].bar(idx, [l["max_gap_module"] for l in layers], width, color=f"C{k}")
        axes[1].scatter(idx, [l["sup_bound"] for l in layers], marker="_", s=200, color="k")
    axes[0].set(yscale="log", xlabel="gate layer", ylabel="E_p|H(x) − g(λx)|", title="gate error (— = prediction p̂(0)·E∞(λ))")
    axes[1].set(yscale="log", xlabel="gate layer", ylabel="max |ReLU(x) − f̂(x)|", title="max gap of the gate module (— = c/λ)")
    n_layers = max(len(layers) for layers in per_variant.values())
    for ax in axes:
        ax.set_xticks([i + width * (len(per_variant) - 1) / 2 for i in range(n_layers)], [str(i) for i in range(n_layers)])
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def _verdict(violations: int, n: int, excess: float, rule: str) -> dict[str, Any]:
    return {"status": "sound", "pass": violations == 0, "violations": violations, "samples": n, "max_excess": excess, "rule": rule}


@torch.no_grad()
def swap_certificate(model: nn.Module, split, batch_size: int, example: torch.Tensor, progress: str | None = None,
                     jacobian_samples: int = 0, device: torch.device | str = "cpu") -> dict[str, Any]:
    """The certificate's statements for `model`, each with its status, and the measured float32 change.

    Keys: `about` (what each statement bounds); `global`, `per_sample`, `float32`, `float32_global`: each
    {"status": "sound" | "refused", "reason"?, ...}; the two float32 statements carry the verdict
    `pass` = the measured change stayed within the bound on every sample of `split`, and the fraction of
    samples whose top-1 prediction is provably kept (`certified_fraction`), given only when sound and passed.
    `bound_max` (the global bound) is kept at the top level for readers of older bounds.json files.
    `float32_jacobian`, on the first `jacobian_samples` samples of a chain network (`certificate.chain32`): δ plus
    both networks' rounding carried through their Jacobians, a far tighter float32 statement than the boxes', its
    float64 arithmetic on `device` (the statements stay about CPU runs: the walks run on a CPU copy of the model).
    """
    model = cpu_model(model).eval()  # float32 statements about CPU runs; the caller's model stays where it is
    relu = to_relu(copy.deepcopy(model), example)
    about = {k: v.format(samples=jacobian_samples) for k, v in certificate.ABOUT.items()}  # the count, not the key
    out: dict[str, Any] = {"about": about, "note": "δ̃ + ε̃ and B + ρ + ε̃ include both networks' float32 rounding "
                           "(analysis/theory/certificate/); the exact statements are about real arithmetic"}
    try:
        cert = certificate.Certifier(model)
    except certificate.Refused as exc:
        return {**out, **{k: {"status": "refused", "reason": str(exc)} for k in ("global", "per_sample", "float32", "float32_global", "float32_jacobian")}}
    glob = None
    try:
        glob = cert.global_bound(example)
        out["global"] = {"status": "sound", "bound_max": glob.max, "bound_per_logit": glob.per_logit.tolist(), "layers": glob.layers}
        out["bound_max"] = glob.max
    except certificate.Refused as exc:
        out["global"] = {"status": "refused", "reason": str(exc)}
    n = 0
    measured = exact_max = 0.0
    acc = {k: {"violations": 0, "certified": 0, "excess": -math.inf, "refused": None, "ratios": [], "n": 0}
           for k in ("float32", "float32_global", "float32_jacobian", "per_sample")}
    if jacobian_samples <= 0 or chain32.chain(model) is None:
        acc["float32_jacobian"]["refused"] = ("not a chain of Linear layers and activations (certificate.chain32)"
                                              if jacobian_samples > 0 else "not asked for (check.float32_jacobian_samples = 0)")
    per_sample_refused = growth = None
    bar = _progress(progress, "swap certificate", split, batch_size)
    for b, (x, _) in enumerate(batches(split, batch_size), start=1):
        if bar:
            bar.step(line=f"    {progress}: swap certificate, batch {b}/{bar.total}")
        smooth, swapped = model(x).double(), relu(x).double()
        n += len(x)
        change = (smooth - swapped).abs().reshape(len(x), -1)
        measured = max(measured, float(change.max()))
        if per_sample_refused is not None:
            continue
        try:
            ps = cert.per_sample(x, trace=b == 1)  # where its boxes grow: said if the bound keeps no prediction
        except certificate.Refused as exc:
            per_sample_refused = str(exc)
            continue
        exact_max = max(exact_max, ps.max)
        growth = ps.growth if b == 1 else growth
        k = max(0, min(len(x), jacobian_samples - (n - len(x))))  # this batch's samples among the first jacobian_samples
        jac = None
        if k and acc["float32_jacobian"]["refused"] is None:
            jac = (ps.per_logit[:k] + chain32.rounding_bound(model, x[:k], device)
                   + chain32.rounding_bound(relu, x[:k], device))
        bounds = {"float32": (ps.float32, ps.float32_refused),
                  "float32_global": (None if glob is None or ps.rounding is None else glob.per_logit + ps.rounding,
                                     "the global bound is refused" if glob is None else ps.rounding_refused),
                  "float32_jacobian": (jac, None),
                  # real arithmetic: not a statement about float32 runs, a diagnostic of what rounding costs
                  "per_sample": (ps.per_logit, None)}
        for key, (bound, why) in bounds.items():
            a = acc[key]
            if bound is None:
                a["refused"] = a["refused"] or why
                continue
            if key == "float32_jacobian":
                sm, ch = smooth[:k], change[:k]
            else:
                sm, ch = smooth, change
            a["n"] += len(ch)
            a["violations"] += int((ch > bound).any(dim=1).sum())
            a["excess"] = max(a["excess"], float((ch - bound).max()))
            a["certified"] += int(certificate.certified_mask(sm, bound).reshape(len(ch), -1).all(dim=1).sum())
            largest = ch.max(dim=1).values  # how loose: the bound's largest logit over the measured largest change
            a["ratios"] += (bound.reshape(len(ch), -1).max(dim=1).values[largest > 0] / largest[largest > 0]).tolist()
    if bar:
        bar.close()
    out["measured_max_logit_change"] = measured
    def ratio(a: dict[str, Any]) -> dict[str, float] | None:
        r = sorted(a["ratios"])
        return {"median": r[len(r) // 2], "max": r[-1], "samples": len(r)} if r else None

    exact = acc.pop("per_sample")
    if per_sample_refused is not None:
        out["per_sample"] = {"status": "refused", "reason": per_sample_refused}
        acc = {k: {**a, "refused": per_sample_refused} for k, a in acc.items()}
    else:
        out["per_sample"] = {"status": "sound", "bound_max": exact_max, "bound_to_change": ratio(exact),
                             "top1_kept_in_real_arithmetic": exact["certified"] / n if n else None,
                             **({"growth": growth} if growth else {})}
    rules = {"float32": "measured float32 |Δlogit| ≤ δ̃ + ε̃ (the per-sample float32 bound) on every validation sample",
             "float32_global": "measured float32 |Δlogit| ≤ B + ρ + ε̃ (the global bound plus both networks' rounding) on every sample",
             "float32_jacobian": f"measured float32 |Δlogit| ≤ δ + ρ_J + ε_J (rounding through the Jacobians) on the first "
                                 f"{jacobian_samples} samples"}
    for key, a in acc.items():
        if a["refused"]:
            out[key] = {"status": "refused", "reason": a["refused"]}
            continue
        v = _verdict(a["violations"], a["n"], a["excess"], rules[key])
        v["certified_fraction"] = a["certified"] / a["n"] if v["pass"] and a["n"] else None  # a violated bound certifies nothing
        v["bound_to_change"] = ratio(a)
        out[key] = v
    return out


# ---------------------------------------------------------------------------------------------
# What the check means: the certificate's verdict, and the predictions as a diagnostic

CERTIFIED = ("float32", "float32_global", "float32_jacobian")  # the statements checked against the measured float32 change
PREDICTIONS = ("gate_l1", "act_l1")  # closed-form predictions of per-layer means: a diagnostic, not a verdict


def verdict(layers: list[dict[str, Any]], cert: dict[str, Any]) -> dict[str, Any]:
    """What the check proved about the swap. `certificate`:
    - "fails": a sound statement was violated by the measured change on some sample, or a gate module is farther
      from ReLU than c/λ (the `sup` check, the certificate's premise): a bug in the certificate, the swap or a gate;
    - "refused": no float32 statement could be proved (each carries its reason);
    - "holds": every sound statement held on every sample and every gate is within c/λ; `statements` lists which,
      `certified_fraction` the largest share of samples whose top-1 prediction one of them keeps (0: the bounds hold
      but are wider than every margin, and `why` says so).
    The closed-form predictions are not part of it (`predictions`)."""
    sup_failed = [l["layer"] for l in layers if not l["checks"]["sup"]["pass"]]
    sound = {k: cert[k]["pass"] for k in CERTIFIED if cert[k]["status"] == "sound"}
    if sup_failed or not all(sound.values()):
        violated = [k for k, ok in sound.items() if not ok]
        why = "; ".join([*(f"{k} violated on {cert[k]['violations']} of {cert[k]['samples']} samples" for k in violated),
                         *([f"gate layer(s) {', '.join(map(str, sup_failed))} farther from ReLU than c/λ"] if sup_failed else [])])
        return {"certificate": "fails", "statements": violated, "why": why}
    if not sound:
        reasons: dict[str, list[str]] = {}  # one reason often refuses every statement: said once, naming them
        for k in CERTIFIED:
            reasons.setdefault(cert[k]["reason"], []).append(k)
        return {"certificate": "refused", "statements": [],
                "why": "; ".join(f"{', '.join(ks)}: {r}" for r, ks in reasons.items())}
    # a sound bound can still be too wide to keep any prediction: say so, or "holds" reads as a guarantee it is not
    kept = max((cert[k].get("certified_fraction") or 0.0) for k in sound)
    why = f"{', '.join(sound)} held on every sample; every gate within c/λ of ReLU"
    if kept == 0:
        why += ("; but no bound is below any sample's top-1 margin, so it proves no prediction unchanged (the share "
                "of samples whose top-1 it keeps is 0)")
        growth = (cert.get("per_sample") or {}).get("growth")
        if growth:  # which ops make it vacuous
            why += f"; the per-sample bound ({cert['per_sample']['bound_max']:.2g}): {growth}"
    return {"certificate": "holds", "statements": list(sound), "why": why, "certified_fraction": kept}


def predictions(layers: list[dict[str, Any]]) -> dict[str, Any]:
    """The closed-form predictions p̂(0)·a/λ (gate error) and p̂(0)·b/λ² (activation gap) per layer against the
    measured means: a diagnostic of how flat the pre-activation density is near 0, which says nothing about what
    the swap does to the logits. `pass`: every prediction within its tolerance; `off`: the ones that are not."""
    off = [{"layer": l["layer"], "check": k, "relative_error": l["checks"][k]["relative_error"],
            "tolerance": l["checks"][k]["tolerance"]} for l in layers for k in PREDICTIONS if not l["checks"][k]["pass"]]
    return {"pass": not off, "off": off,
            "about": "closed-form predictions of per-layer means under a pre-activation density flat near 0; a diagnostic, "
                     "not a verdict on the swap"}