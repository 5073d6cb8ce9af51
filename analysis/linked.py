"""Linked neurons (Riera & Pujol): dead-unit counts as the paper defines them, and the single vs linked
vs √2-wide comparison on the MLP.

A unit is dead when its activation is zero for every sample (the paper, Sec. 4.1); for a conv channel,
at every position of every sample. A linked unit has two outputs (g(z), g(−z)); it is dead only when
both are, which for ReLU means z = 0 on every sample, so CReLU units essentially never die.

`compare_linked` trains, per activation g: g at the given widths ("single"), g at √2 × the widths
("√2", the paper's parameter-matched baseline), linked g at the given widths ("linked") and linked g
narrowed to single g's parameter count ("linked, params = single"); then swaps gates to ReLU and
counts dead units of the swapped models on the test set. "single, params = linked" widens g to the exact
parameter count of linked g (the paper's √2 is exact only for square hidden-to-hidden layers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline import checkpoint
from pipeline.activations import ACTIVATIONS, GateContext, Linked
from pipeline.config import Config, GateConfig
from pipeline.data import Split, batches
from pipeline.rundir import RunDir, atomic_write_json, atomic_write_text


def activation_types() -> tuple[type, ...]:
    """Module classes the activation registry builds (one probe build per entry)."""
    ctx = GateContext(1, 0, 1, GateConfig(), {})
    return tuple({type(spec.build(ctx)) for spec in ACTIVATIONS.values()})


def activation_sites(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Outermost activation modules in forward order (a linked pair counts once, not its inner g)."""
    types = activation_types()
    sites: list[tuple[str, nn.Module]] = []
    for name, m in model.named_modules():
        if isinstance(m, types) and not any(name.startswith(n + ".") for n, _ in sites):
            sites.append((name, m))
    return sites


@torch.no_grad()
def dead_units(model: nn.Module, split: Split, batch_size: int = 2048, device: torch.device | str = "cpu") -> dict[str, dict[str, int]]:
    """Per activation site: outputs that are exactly 0 for every sample (and position), and units dead in
    the paper's sense (for a linked pair: both of its outputs dead; otherwise the same as outputs)."""
    model = model.eval().to(device)
    sites = activation_sites(model)
    alive: dict[str, torch.Tensor] = {}

    def hook(name: str):
        def fn(_m, _inp, out):
            dims = [d for d in range(out.dim()) if d != 1]  # every axis but the unit axis
            nz = (out != 0).any(dim=dims).cpu() if dims else (out != 0).cpu()
            alive[name] = alive[name] | nz if name in alive else nz
        return fn

    handles = [m.register_forward_hook(hook(n)) for n, m in sites]
    try:
        for x, _ in batches(split, batch_size):
            model(x.to(device))
    finally:
        for h in handles:
            h.remove()
    out: dict[str, dict[str, int]] = {}
    for name, m in sites:
        dead = ~alive[name]
        if isinstance(m, Linked):  # outputs [g(z_1..z_C), g(−z_1..−z_C)]
            c = dead.numel() // 2
            units = dead[:c] & dead[c:]
        else:
            c, units = dead.numel(), dead
        out[name] = {"units": c, "outputs": dead.numel(), "dead_outputs": int(dead.sum()), "dead_units": int(units.sum())}
    return out


# ---------------------------------------------------------------------------------------------
# The comparison (one pipeline run per width setting, variants side by side)

ARMS = (  # (label, width_match, linked)
    ("single", "none", False),
    ("√2", "sqrt2", False),
    ("single, params = linked", "params", False),
    ("linked", "none", True),
    ("linked, params = single", "params", True),
)


def _param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def compare_linked(base: Config, bases: list[str], out_dir: str | Path, log=print) -> dict[str, Any]:
    """Train the four arms for every activation in `bases` (train → harden → swap), then measure.

    `base` supplies data, model (an MLP or CNN), training and hardening settings; its variants,
    width_match, stages and out_dir are set here. Writes linked.json and linked.md to out_dir.
    """
    from dataclasses import replace

    from pipeline.stages import run_pipeline
    from pipeline.train import dataset_for, predict, resolve_device, score

    out_dir = Path(out_dir)
    rows: list[dict[str, Any]] = []
    for label, width_match, linked in ARMS:
        cfg = _copy_config(base)
        cfg.out_dir = str(out_dir)
        cfg.name = f"{cfg.name or 'linked'}-{width_match}-{'linked' if linked else 'single'}"
        cfg.model = replace(cfg.model, width_match=width_match)
        cfg.variants = [f"linked_{b}" if linked else b for b in bases]
        cfg.stages = ["train", "harden", "swap"]
        run = RunDir.create(cfg)
        log(f"[linked] {label}: {run.path}")
        run_pipeline(cfg, run, log=log)
        ds = dataset_for(cfg)
        device = resolve_device(cfg.device)
        swap = json.loads(run.file("swap", "swap.json").read_text()) if run.file("swap", "swap.json").is_file() else {}
        for b, v in zip(bases, cfg.variants):
            model, payload = checkpoint.load_model(run.file("train", v, "best.pt"), device)
            test = score(predict(model, ds.test, cfg.data.eval_batch_size, device), ds.test.y)
            relu, _ = checkpoint.load_model(run.file("swap", v, "relu.pt"), device)
            dead = dead_units(relu, ds.test, cfg.data.eval_batch_size, device)
            widths = [m.out_features for m in model.modules() if isinstance(m, nn.Linear)][:-1]
            rows.append({
                "activation": b, "arm": label, "variant": v, "width_match": width_match, "widths": widths,
                "params": _param_count(model), "best_epoch": payload.get("epoch"),
                "test_loss": test["loss"], "test_accuracy": test["metric"],
                "test_accuracy_swapped": swap.get(v, {}).get("test_after"),
                "dead_units": sum(d["dead_units"] for d in dead.values()),
                "dead_outputs": sum(d["dead_outputs"] for d in dead.values()),
                "units": sum(d["units"] for d in dead.values()), "outputs": sum(d["outputs"] for d in dead.values()),
                "run": str(run.path),
            })
    result = {"data": base.data.name, "model": base.model.name, "hidden": base.model.hidden, "epochs": base.train.epochs,
              "subset": base.data.subset, "seed": base.seed, "rows": rows}
    atomic_write_json(out_dir / "linked.json", result)
    atomic_write_text(out_dir / "linked.md", render_markdown(result))
    return result


def _copy_config(cfg: Config) -> Config:
    from pipeline import config as config_mod

    return config_mod.apply(Config(), cfg.to_dict())


def render_markdown(result: dict[str, Any]) -> str:
    head = (f"Linked vs single vs √2 on {result['data']}, {result['model']} {result['hidden']}, {result['epochs']} epochs"
            f"{', subset ' + str(result['subset']) if result['subset'] else ''}, seed {result['seed']}. Test metrics of the "
            f"best-validation checkpoint; 'swapped' = gates replaced by ReLU (CReLU for linked pairs); dead = zero on every "
            f"test sample, counted on the swapped (ReLU) model; a linked unit is dead when both of its outputs are.\n\n")
    lines = ["| activation | arm | widths | params | test loss | test acc | test acc swapped | dead units | dead outputs |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        sw = "" if r["test_accuracy_swapped"] is None else f"{100 * r['test_accuracy_swapped']:.2f}"
        lines.append(f"| {r['activation']} | {r['arm']} | {r['widths']} | {r['params']:,} | {r['test_loss']:.4f} | "
                     f"{100 * r['test_accuracy']:.2f} | {sw} | {r['dead_units']}/{r['units']} | {r['dead_outputs']}/{r['outputs']} |")
    return head + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """`python -m analysis.linked -c configs/fmnist-mlp.toml --out runs/linked train.epochs=6`"""
    import argparse

    from pipeline import config as config_mod

    p = argparse.ArgumentParser(prog="python -m analysis.linked", description="single vs √2 vs linked activations on one model")
    p.add_argument("-c", "--config", help="base config (data, model, training); default: the built-in Fashion-MNIST MLP")
    p.add_argument("--bases", default="relu,lambda_gelu", help="comma-separated activations g (each also run as linked_g)")
    p.add_argument("--out", default="runs/linked", help="folder for the run directories and linked.json / linked.md")
    p.add_argument("overrides", nargs="*", metavar="key.sub=value")
    args = p.parse_args(argv)
    compare_linked(config_mod.load(args.config, args.overrides), args.bases.split(","), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
