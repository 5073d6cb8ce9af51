"""Small models trained on sklearn's digits in about a second, for the export/int8/sparsity tests.

Not a test module (no `test_` prefix): the test files import it, and cache what they build in
module-scoped fixtures.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.activations import hardenable_gates
from pipeline.config import DataConfig, GateConfig, ModelConfig
from pipeline.data import Dataset, batches, load_dataset
from pipeline.models import build_model, make_spec
from pipeline.rundir import RunDir

_DATA: dict[str, Dataset] = {}


def digits() -> Dataset:
    if "digits" not in _DATA:
        _DATA["digits"] = load_dataset(DataConfig(name="digits"))
    return _DATA["digits"]


def trained(activation: str, model: str = "mlp", epochs: int = 15, lam: float | None = 20.0,
            seed: int = 0, hidden: tuple[int, ...] = (64, 32)) -> tuple[nn.Sequential, dict]:
    """(model in eval mode, spec). MLP `hidden` (64-32) or CNN [8, 16] + 32, Adam; λ-gates frozen at `lam`."""
    torch.manual_seed(seed)
    ds = digits()
    mcfg = ModelConfig(name=model, hidden=list(hidden), channels=[8, 16], cnn_hidden=32)
    spec = make_spec(mcfg, activation, GateConfig(), ds.info)
    net = build_model(spec)
    for g in hardenable_gates(net):
        if lam is not None:
            g.freeze(torch.tensor(lam))  # a fixed λ, as after hardening
    opt = torch.optim.Adam([p for p in net.parameters() if p.requires_grad], lr=1e-2)
    gen = torch.Generator().manual_seed(seed)
    net.train()
    for _ in range(epochs):
        for x, y in batches(ds.train, 64, gen):
            opt.zero_grad()
            F.cross_entropy(net(x), y).backward()
            opt.step()
    return net.eval(), spec


def make_run(out, nets: dict[str, tuple[nn.Module, dict]], **quantize) -> RunDir:
    """A run directory holding train/<v>/best.pt and swap/<v>/relu.pt for each variant, as the
    train/harden/swap stages would leave it, so a later stage can be called directly."""
    from pipeline import checkpoint, variant_record as records
    from pipeline.config import Config
    from pipeline.rundir import RunDir
    from pipeline.relu_swap import relu_spec, to_relu

    cfg = Config(name="r", out_dir=str(out), variants=list(nets), device="cpu")
    cfg.data.name = "digits"
    cfg.quantize.repeats = 3  # timing is not what these tests check
    for k, v in quantize.items():
        setattr(cfg.quantize, k, v)
    run = RunDir.create(cfg)
    run.record_variants({v: records.decide(spec["activation"], cfg.harden, cfg.train) for v, (_, spec) in nets.items()})
    for variant, (net, spec) in nets.items():
        checkpoint.save(run.file("train", variant, "best.pt"), net, spec, epoch=1)
        swapped_to = run.variant(variant).swapped_to or spec["activation"]  # a non-gate keeps its own
        checkpoint.save(run.file("swap", variant, "relu.pt"), to_relu(copy.deepcopy(net), allow_unchanged=True),
                        relu_spec(spec, swapped_to))
    return run
