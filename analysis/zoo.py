"""The activation zoo of the GELU analysis paper (Table 1), on Fashion-MNIST, plus SERF, Mish and λ-GELU.

Same protocol as the paper: its pre-activation residual CNN (conv stem, six pre-activation blocks with
stride 2 in the 3rd and 5th, pool, linear: `models.preact_resnet`), cross-entropy, Adam at lr 1e-3
(`adamw` with weight decay 0 is Adam), batch 128, constant lr, one seed, the same initial weights for
every activation. Smaller than the paper on purpose, to fit two shared CPU cores: stage widths
[8, 16, 32], a Fashion-MNIST training subset and a few epochs (the table header states them; the paper
trained 20 epochs on CIFAR-10). λ-GELU runs Algorithm 1 (λ learned, then annealed to λ_target).

Reported: test loss and accuracy of the final-epoch model (as the paper's curves end), and for the
gates (GELU, SiLU, SERF, Mish, λ-GELU) the accuracy after swapping them to ReLU with no retraining.
One command: `pipeline zoo` (training runs through the staged pipeline, so a killed zoo resumes).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from pipeline import checkpoint
from pipeline.activations import swapped_activation
from pipeline.config import Config
from pipeline.data import Split
from pipeline.rundir import RunDir, atomic_write_json, atomic_write_text

ZOO = ("elu", "hardshrink", "hardsigmoid", "hardtanh", "hardswish", "leaky_relu", "logsigmoid", "prelu", "relu",
       "relu6", "rrelu", "selu", "celu", "gelu", "sigmoid", "softplus", "softshrink", "softsign", "tanh", "tanhshrink",
       "serf", "mish", "lambda_gelu")

# The paper's Table 1 (CIFAR-10, 20 epochs): test loss, test accuracy in %. For orientation only: other
# data, other widths, other epoch count.
PAPER_TABLE1 = {
    "elu": (0.4232, 86.22), "hardshrink": (1.1266, 60.81), "hardsigmoid": (1.4296, 54.00), "hardtanh": (0.5573, 82.01),
    "hardswish": (0.3921, 88.77), "leaky_relu": (0.4036, 87.93), "logsigmoid": (0.5755, 81.42), "prelu": (0.5552, 86.33),
    "relu": (0.4478, 87.19), "relu6": (0.4145, 88.70), "rrelu": (0.4308, 85.91), "selu": (0.4983, 83.37),
    "celu": (0.4260, 86.21), "sigmoid": (3.2102, 33.90), "softplus": (0.5762, 80.82), "softshrink": (0.5626, 81.93),
    "softsign": (0.6819, 78.33), "tanh": (0.5318, 82.91), "tanhshrink": (0.5776, 80.78), "gelu": (0.3685, 89.52),
}


def zoo_config() -> Config:
    """The zoo's defaults; a config file and key=value overrides apply on top (`pipeline zoo`)."""
    cfg = Config()
    cfg.name, cfg.out_dir, cfg.threads = "zoo-fmnist", "runs", 1
    cfg.variants = list(ZOO)
    cfg.stages = ["train", "harden"]
    cfg.data.name, cfg.data.subset, cfg.data.batch_size = "fashion_mnist", 5000, 128
    cfg.model.name, cfg.model.channels = "preact_resnet", [8, 16, 32]
    t = cfg.train
    t.optimizer, t.lr, t.weight_decay, t.schedule, t.epochs = "adamw", 1e-3, 0.0, "constant", 3
    return cfg


@torch.no_grad()
def _evaluate(model: torch.nn.Module, split: Split, cfg: Config, device) -> dict[str, float]:
    from pipeline.train import predict, score

    s = score(predict(model, split, cfg.data.eval_batch_size, device), split.y)
    return {"loss": s["loss"], "accuracy": s["metric"]}


def run_zoo(cfg: Config, test_samples: int = 0, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train every activation in cfg.variants (train + harden stages), then evaluate on the test set
    (the first `test_samples` examples; 0 = all). Writes zoo.json and zoo.md into the run directory."""
    from pipeline.stages import run_pipeline
    from pipeline.swap import to_relu
    from pipeline.train import dataset_for, resolve_device

    run = RunDir.create(cfg)
    log(f"zoo run directory: {run.path}")
    t0 = time.time()
    run_pipeline(cfg, run, log=log)
    ds = dataset_for(cfg)
    device = resolve_device(cfg.device)
    n = len(ds.test) if test_samples <= 0 else min(test_samples, len(ds.test))
    test = Split(ds.test.x[:n], ds.test.y[:n])
    rows = []
    for v in cfg.variants:
        model, payload = checkpoint.load_model(run.file("train", v, "last.pt"), device)
        row: dict[str, Any] = {"activation": v, "epoch": payload["state"]["epoch"], **_evaluate(model, test, cfg, device)}
        if swapped_activation(v) not in (None, v):  # a gate: how far a direct swap to ReLU lands
            row["accuracy_swapped"] = _evaluate(to_relu(model), test, cfg, device)["accuracy"]
        lams = [h.get("lambda_0") for h in payload["state"]["history"][-1:]]
        if lams and lams[0] is not None:
            row["lambda_final"] = lams[0]
        row["train_seconds"] = sum(h["seconds"] for h in payload["state"]["history"])
        row["paper_cifar10"] = PAPER_TABLE1.get(v)
        rows.append(row)
    result = {"data": cfg.data.name, "train_subset": cfg.data.subset, "val_fraction": cfg.data.val_fraction,
              "test_samples": n, "model": cfg.model.name, "channels": cfg.model.channels, "epochs": cfg.train.epochs,
              "optimizer": f"{cfg.train.optimizer} lr {cfg.train.lr:g} wd {cfg.train.weight_decay:g} ({cfg.train.schedule})",
              "batch_size": cfg.data.batch_size, "seed": cfg.seed, "threads": cfg.threads,
              "seconds": time.time() - t0, "rows": rows}
    atomic_write_json(run.file("zoo.json"), result)
    atomic_write_text(run.file("zoo.md"), render_markdown(result))
    log(f"zoo table: {run.file('zoo.md')}")
    return result


def _marks(values: list[float], higher_better: bool) -> dict[int, str]:
    """Best in bold, second best underlined (the paper's convention)."""
    order = sorted(range(len(values)), key=lambda i: -values[i] if higher_better else values[i])
    return {order[0]: "**", **({order[1]: "<u>"} if len(order) > 1 else {})}


def _fmt(v: float, mark: str | None, digits: int) -> str:
    s = f"{v:.{digits}f}"
    if mark == "**":
        return f"**{s}**"
    return f"<u>{s}</u>" if mark else s


def render_markdown(result: dict[str, Any]) -> str:
    rows = result["rows"]
    loss_m = _marks([r["loss"] for r in rows], higher_better=False)
    acc_m = _marks([r["accuracy"] for r in rows], higher_better=True)
    subset = f"a {result['train_subset']}-example training subset (of which {result['val_fraction']:.0%} validation)" \
        if result["train_subset"] else "the full training set"
    head = (f"Test loss and accuracy, {result['data']}, **{result['epochs']} epochs** on {subset}, tested on "
            f"{result['test_samples']} test images; {result['model']} (stage widths {result['channels']}, 6 blocks), "
            f"{result['optimizer']}, batch {result['batch_size']}, seed {result['seed']}, final-epoch model. "
            f"'swapped' = every gate replaced by ReLU, no retraining. Paper columns: its Table 1 (CIFAR-10, 20 epochs, "
            f"for orientation only). **Bold** best, <u>underline</u> second best.\n\n")
    lines = ["| activation | test loss | test accuracy (%) | swapped to ReLU (%) | paper loss | paper acc. (%) |",
             "|---|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(rows):
        sw = f"{100 * r['accuracy_swapped']:.2f}" if "accuracy_swapped" in r else "no swap"
        p = r.get("paper_cifar10")
        name = r["activation"] + (f" (λ = {r['lambda_final']:.0f})" if "lambda_final" in r else "")
        lines.append(f"| {name} | {_fmt(r['loss'], loss_m.get(i), 4)} | {_fmt(100 * r['accuracy'], acc_m.get(i), 2)} | {sw} | "
                     f"{p[0]:.4f} | {p[1]:.2f} |" if p else
                     f"| {name} | {_fmt(r['loss'], loss_m.get(i), 4)} | {_fmt(100 * r['accuracy'], acc_m.get(i), 2)} | {sw} | – | – |")
    return head + "\n".join(lines) + f"\n\nTotal wall time {result['seconds'] / 60:.1f} min ({result['threads']} thread).\n"
