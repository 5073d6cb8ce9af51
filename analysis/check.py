"""The `check` stage: the bounds derived in `symbolic.py`, checked per layer on the real
pre-activations of the best checkpoint (validation set, streamed: running sums, never all
activations at once), plus a certificate for the swap.

Per gate layer ℓ with hardness λ (per unit for per-channel gates), on pre-activations x:
- max |ReLU(x) − f_λ(x)| against the sup bound c/λ (a hard bound: failing it means a bug);
- mean |ReLU(x) − f_λ(x)| and the density-weighted gate error E_p|H(x) − g(λx)|;
- each mean against its closed form times the pre-activation density at 0, p̂(0)·E∞(λ) and
  p̂(0)·∫|ReLU − f_λ|, with p̂(0) estimated from the fraction of |λx| < band (the gate error lives
  within a few 1/λ of 0, where the density is flat at λ = 160);
- the fraction of pre-activations in the soft band δ < g(λx) < 1 − δ;
- a certificate for the swap: a sound bound on every logit's change (global and per sample),
  the measured change, and the fraction of samples whose prediction provably survives;
- pass/fail: the sup bound (tolerance `check.sup_rtol`) and E_p|H − g(λx)| ≤ ε (`harden.epsilon`,
  the tolerance the hardening targeted, now on the real distribution instead of Lebesgue measure).
The GELU baseline is checked as λ-GELU at λ = 1: that is how far a direct swap is from ReLU.
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch
from torch import nn

from pipeline import checkpoint, gates, render
from pipeline.activations import gate_of, gate_sites
from pipeline.config import Config
from pipeline.data import batches, dataset_for
from pipeline.distributed import resolve_device
from pipeline.rundir import RunDir, atomic_write_json

from .theory import certificate, symbolic


class _LayerStats:
    """Running sums for one gate layer (float64)."""

    def __init__(self, gate: str, lam: torch.Tensor, delta: float, band: float):
        self.g = gates.family(gate).g
        self.lam, self.delta, self.band = lam, delta, band
        self.n = 0
        self.sum_gap = self.sum_gate = self.max_gap = self.max_gap_scaled = 0.0
        self.n_soft = self.n_band = self.n_nonpos = 0
        self.sum_inv_lam_band = 0.0

    def update(self, x: torch.Tensor) -> None:
        x = x.detach().double().cpu()
        lam = self.lam.reshape(()) if self.lam.numel() == 1 else self.lam.view(1, -1, *([1] * (x.dim() - 2)))
        lam = lam.expand_as(x)
        z = lam * x
        gz = self.g(z)
        gap = (torch.relu(x) - x * gz).abs()
        heav = (x > 0).double() + 0.5 * (x == 0).double()
        in_band = z.abs() < self.band
        self.n += x.numel()
        self.sum_gap += float(gap.sum())
        self.sum_gate += float((heav - gz).abs().sum())
        self.max_gap = max(self.max_gap, float(gap.max()))
        self.max_gap_scaled = max(self.max_gap_scaled, float((gap * lam).max()))  # c/λ per unit ⇒ compare λ·gap with c
        self.n_soft += int(((gz > self.delta) & (gz < 1 - self.delta)).sum())
        self.n_band += int(in_band.sum())
        self.sum_inv_lam_band += float((in_band.double() / lam).sum())
        self.n_nonpos += int((x <= 0).sum())


def layer_report(st: _LayerStats, summary: dict[str, Any], eps: float, sup_rtol: float) -> dict[str, Any]:
    a = summary["gate_l1"]["coeff"]  # E∞(λ) = a/λ
    b = summary["act_l1"]["coeff"]  # ∫|ReLU − f_λ| = b/λ²
    c = summary["sup"]["c"]
    n = max(st.n, 1)
    # p̂(0)·a/λ per element = 1{|λx| < B}·(λ/2B)·(a/λ) = 1{…}·a/(2B); likewise b/λ² → 1{…}·b/(2Bλ).
    pred_gate = st.n_band / n * a / (2 * st.band)
    pred_act = st.sum_inv_lam_band / n * b / (2 * st.band)
    mean_gap, mean_gate = st.sum_gap / n, st.sum_gate / n
    sup_ok = st.max_gap_scaled <= c * (1 + sup_rtol)
    gate_ok = mean_gate <= eps
    lam = st.lam
    return {
        "lambda_mean": float(lam.mean()), "lambda_min": float(lam.min()), "lambda_max": float(lam.max()),
        "n_preactivations": st.n,
        "max_gap": st.max_gap, "sup_bound": c / float(lam.min()), "max_gap_times_lambda": st.max_gap_scaled, "c": c,
        "mean_gap": mean_gap, "mean_gap_predicted": pred_act,
        "gate_error": mean_gate, "gate_error_predicted": pred_gate,
        "soft_fraction": st.n_soft / n, "density_at_0": st.n_band / n / (2 * st.band) * float(lam.mean()),
        "nonpositive_fraction": st.n_nonpos / n,
        "checks": {
            "sup": {"pass": sup_ok, "rule": "max λ·|ReLU(x) − f_λ(x)| ≤ c·(1 + sup_rtol)", "sup_rtol": sup_rtol},
            "gate_l1": {"pass": gate_ok, "rule": "E_p|H(x) − g(λx)| ≤ ε on the validation pre-activations", "epsilon": eps},
        },
        "pass": bool(sup_ok and gate_ok),
    }


@torch.no_grad()
def empirical_check(model: nn.Module, split, batch_size: int, device, eps: float, delta: float, band: float,
                    sup_rtol: float) -> list[dict[str, Any]]:
    sites = [(n, m, *gate_of(m)) for n, m in gate_sites(model)]  # (name, module, family, λ)
    stats = [_LayerStats(fam, lam, delta, band) for _, _, fam, lam in sites]
    hooks = [m.register_forward_hook(lambda mod, inp, out, st=st: st.update(inp[0])) for (_, m, _, _), st in zip(sites, stats)]
    try:
        model.eval()
        for x, _ in batches(split, batch_size):
            model(x.to(device))
    finally:
        for h in hooks:
            h.remove()
    out = []
    for i, ((name, _, fam, _), st) in enumerate(zip(sites, stats)):
        rep = layer_report(st, symbolic.gate_summary(fam), eps, sup_rtol)
        out.append({"layer": i, "module": name, "gate": fam, **rep})
    return out


def plot_layers(per_variant: dict[str, list[dict]], eps: float, path) -> None:
    fig = render.figure(11, 4)
    axes = fig.subplots(1, 2)
    width = 0.8 / max(1, len(per_variant))
    for k, (variant, layers) in enumerate(per_variant.items()):
        idx = [l["layer"] + k * width for l in layers]
        axes[0].bar(idx, [l["gate_error"] for l in layers], width, label=f"{variant}: E_p|H − g(λx)|")
        axes[0].scatter(idx, [l["gate_error_predicted"] for l in layers], marker="_", s=200, color="k")
        axes[1].bar(idx, [l["max_gap"] for l in layers], width, label=f"{variant}: max|ReLU − f|")
        axes[1].scatter(idx, [l["sup_bound"] for l in layers], marker="_", s=200, color="k")
    axes[0].axhline(eps, color="r", ls="--", label=f"ε = {eps:g}")
    axes[0].set(yscale="log", xlabel="gate layer", ylabel="density-weighted gate error", title="gate error (— = p̂(0)·E∞(λ))")
    axes[1].set(yscale="log", xlabel="gate layer", ylabel="|ReLU(x) − f_λ(x)|", title="max gap per unit (— = c/λ)")
    n_layers = max(len(layers) for layers in per_variant.values())
    for ax in axes:
        ax.set_xticks([i + width * (len(per_variant) - 1) / 2 for i in range(n_layers)], [str(i) for i in range(n_layers)])
        ax.legend(fontsize=7)
    render.save(fig, path)


@torch.no_grad()
def swap_certificate(model: nn.Module, split, batch_size: int, input_shape: tuple[int, ...]) -> dict[str, Any]:
    """Sound bounds on |logit_ReLU − logit_smooth| (certificate.py) beside the measured change on `split`.

    The global bound holds for every input; the per-sample bound uses each sample's own
    pre-activations. A sample is certified when its top-1 margin beats the two logits' bounds.
    """
    import copy

    from pipeline.swap import to_relu

    model = model.cpu().eval()
    relu = to_relu(copy.deepcopy(model))
    glob = certificate.swap_bound(model, input_shape)
    n = n_glob = n_samp = 0
    measured = 0.0
    excess = -math.inf  # max over samples of (measured − per-sample bound): ≤ 0 up to float32 rounding
    for x, _ in batches(split, batch_size):
        smooth, swapped = model(x).double(), relu(x).double()
        per = certificate.swap_bound_per_sample(model, x)
        change = (smooth - swapped).abs()
        measured = max(measured, float(change.max()))
        excess = max(excess, float((change - per.per_logit).max()))
        n += len(x)
        n_glob += int(certificate.certified_mask(smooth, glob.per_logit).sum())
        n_samp += int(certificate.certified_mask(smooth, per.per_logit).sum())
    return {
        "bound_max": glob.max, "bound_per_logit": glob.per_logit.tolist(),
        "measured_max_logit_change": measured, "sound_on_split": measured <= glob.max,
        "certified_fraction": n_glob / n, "certified_fraction_per_sample": n_samp / n,
        "max_excess_over_per_sample_bound": excess,
        "note": "bounds hold in exact arithmetic; float32 rounding of both networks comes on top",
        "layers": glob.layers,
    }


def run_check(cfg: Config, run: RunDir) -> dict[str, Any]:
    device = resolve_device(cfg.device)
    ds = dataset_for(cfg)
    eps = cfg.harden.epsilon
    out: dict[str, Any] = {"symbolic": symbolic.summary(eps), "variants": {}}
    per_layer: dict[str, list[dict]] = {}
    for variant in cfg.variants:
        model, payload = checkpoint.load_model(run.file("train", variant, "best.pt"), device)
        layers = empirical_check(model, ds.val, cfg.data.eval_batch_size, device, eps,
                                 cfg.check.soft_delta, cfg.check.band, cfg.check.sup_rtol)
        if not layers:  # a ReLU baseline has no gate to check
            out["variants"][variant] = {"layers": [], "note": "no smooth gates: nothing to check"}
            continue
        per_layer[variant] = layers
        out["variants"][variant] = {"epoch": payload.get("epoch"), "layers": layers, "pass": all(l["pass"] for l in layers)}
        try:
            out["variants"][variant]["certificate"] = swap_certificate(model, ds.val, cfg.data.eval_batch_size, ds.info.input_shape)
        except (TypeError, NotImplementedError, RuntimeError) as exc:  # an architecture certificate.py has no rule for (e.g. token embeddings)
            out["variants"][variant]["certificate_unavailable"] = str(exc)
    if per_layer:
        plot_layers(per_layer, eps, run.file("check", "gate_error.png"))
    atomic_write_json(run.file("check", "bounds.json"), out)
    return {v: {"pass": r.get("pass"), "max_gate_error": max((l["gate_error"] for l in r["layers"]), default=math.nan),
                "certified_fraction": r.get("certificate", {}).get("certified_fraction_per_sample")}
            for v, r in out["variants"].items()}


def report_section(cfg: Config, run: RunDir) -> str | None:
    """The check stage's section of report.md (None when it has not run)."""
    path = run.file("check", "bounds.json")
    if not path.is_file():
        return None
    b = json.loads(path.read_text())
    out = ["## Bounds (check stage)"]
    for gate, s in b["symbolic"]["gates"].items():
        out.append(f"- gate `{gate}` ({s['label']}): E∞(λ) = `{s['gate_l1']['expr']}`, ∫|ReLU − f_λ| = `{s['act_l1']['expr']}`, "
                   f"sup|ReLU − f_λ| = {s['sup']['c']:.6f}/λ at x = ±{s['sup']['u']:.6f}/λ, Lipschitz {s['lipschitz']['value']:.6f}; "
                   f"λ_target at ε = {b['symbolic']['eps']:g}: " + ", ".join(f"{k} {v:.3f}" for k, v in s["lambda_target"].items()))
    for v, r in b["variants"].items():
        if not r["layers"]:
            out.append(f"`{v}`: {r.get('note', 'no gates')}.")
            continue
        rows = [[l["layer"], l["lambda_mean"], l["max_gap"], l["sup_bound"], l["mean_gap"], l["mean_gap_predicted"], l["gate_error"],
                 l["gate_error_predicted"], l["soft_fraction"], "pass" if l["pass"] else "FAIL"] for l in r["layers"]]
        out.append(f"### `{v}` (best epoch {r.get('epoch')})\n\n" + render.table(
            ["layer", "λ", "max gap", "c/λ", "mean gap", "p̂(0)/(2λ²)", "E_p|H − g|", "p̂(0)·E∞(λ)", "soft fraction", "verdict"], rows))
        cert = r.get("certificate")
        if cert:
            out.append(f"Swap certificate: any logit moves by at most **{cert['bound_max']:.4g}** (global) when every gate becomes ReLU; "
                       f"measured max change {cert['measured_max_logit_change']:.4g}. "
                       f"{100 * cert['certified_fraction']:.2f}% of validation samples have a top-1 margin above twice the bound "
                       f"(prediction provably unchanged by the swap)" + (
                           f"; per-sample bound: {100 * cert['certified_fraction_per_sample']:.2f}%." if "certified_fraction_per_sample" in cert else "."))
    out.append("![gate error per layer](../check/gate_error.png)")
    return "\n\n".join(out)
