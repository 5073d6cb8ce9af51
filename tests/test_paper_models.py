"""The paper's GPU models (ResNet-18 CIFAR, DeiT-Tiny, GPT) at a tiny size on synthetic tensors:
every activation site is a gate built through `act`, one training step moves every λ, the swap
walker reaches every gate in the module tree, checkpoints rebuild; and each GPU config in
configs/ runs train → harden → swap end to end on synthetic data of its real input shape."""

from __future__ import annotations

import copy

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pipeline import checkpoint, data
from pipeline.activations import Gate, hardenable_gates
from pipeline.hardener import Hardener
from pipeline.cli import main
from pipeline.config import GateConfig, ModelConfig
from pipeline.schedule import param_groups
from pipeline.models import build_model
from pipeline.relu_swap import to_relu

ROOT = Path(__file__).resolve().parent.parent
HARD_LAMBDA = 1e4  # |ReLU − xΦ(λx)| ≤ 0.17/λ per unit: the swap moves logits by ~1e-4 or less
SWAP_ATOL = 1e-2

# name -> (model overrides, input_shape, classes, activation sites)
TINY = {
    "resnet18_cifar": ({"resnet_width": 4}, (3, 16, 16), 10, 17),
    "deit_tiny": ({"dim": 16, "depth": 2, "heads": 2, "patch_size": 4}, (3, 16, 16), 7, 2),
    "gpt": ({"dim": 16, "depth": 3, "heads": 2}, (12,), 11, 3),
}


def _spec(name: str, activation: str = "lambda_gelu", init: str = "increasing") -> dict:
    over, shape, k, _ = TINY[name]
    images = len(shape) == 3
    return {"model": asdict(ModelConfig(name=name, **over)), "activation": activation,
            "gate": asdict(GateConfig(init=init)), "input_shape": list(shape), "num_classes": k,
            "mean": [0.5, 0.4, 0.3] if images else [], "std": [0.2, 0.2, 0.2] if images else []}


def _batch(name: str, n: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    _, shape, k, _ = TINY[name]
    g = torch.Generator().manual_seed(seed)
    if len(shape) == 1:  # token ids; targets are the next tokens
        seq = torch.randint(0, k, (n, shape[0] + 1), generator=g)
        return seq[:, :-1], seq[:, 1:]
    return torch.rand(n, *shape, generator=g), torch.randint(0, k, (n,), generator=g)


@pytest.mark.parametrize("name", list(TINY))
def test_every_site_is_a_gate_with_depth_ordered_lambda(name):
    model = build_model(_spec(name))
    sites = TINY[name][3]
    gates = hardenable_gates(model)
    assert len(gates) == sites
    lams = Hardener(model, epochs=1).lambdas()
    assert lams == sorted(lams) and lams[0] == pytest.approx(1.05) and lams[-1] == pytest.approx(2.0)
    assert ("norm" in dict(model.named_children())) == (len(TINY[name][1]) == 3)  # token models skip Normalize


@pytest.mark.parametrize("name", list(TINY))
def test_one_training_step_moves_every_lambda(name):
    torch.manual_seed(0)
    model = build_model(_spec(name)).train()
    x, y = _batch(name)
    opt = torch.optim.AdamW(param_groups(model, 1e-3, 1e-2, 9.0), lr=1e-3)
    before = [g.s.detach().clone() for g in hardenable_gates(model)]
    logits = model(x)
    assert logits.shape == (*y.shape, TINY[name][2])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    assert torch.isfinite(loss)
    loss.backward()
    for i, g in enumerate(hardenable_gates(model)):
        assert g.s.grad is not None and float(g.s.grad.abs().sum()) > 0, f"site {i} got no gradient"
    opt.step()
    assert all(not torch.equal(b, g.s) for b, g in zip(before, hardenable_gates(model)))


@pytest.mark.parametrize("name", list(TINY))
def test_swap_reaches_every_gate_in_the_module_tree(name):
    model = build_model(_spec(name)).eval()
    for g in hardenable_gates(model):
        g.freeze(torch.tensor(HARD_LAMBDA))
    x, _ = _batch(name)
    with torch.no_grad():
        smooth = model(x)
        swapped = to_relu(copy.deepcopy(model))
        hard = swapped(x)
    assert not any(isinstance(m, Gate) for m in swapped.modules())
    assert sum(isinstance(m, nn.ReLU) for m in swapped.modules()) == TINY[name][3]
    assert hard.shape == smooth.shape
    assert float((hard - smooth).abs().max()) < SWAP_ATOL


@pytest.mark.parametrize("name", list(TINY))
def test_checkpoint_rebuilds_the_model(name, tmp_path):
    torch.manual_seed(1)
    spec = _spec(name, activation="gelu")
    model = build_model(spec).eval()
    checkpoint.save(tmp_path / "m.pt", model, spec)
    again, _ = checkpoint.load_model(tmp_path / "m.pt")
    x, _ = _batch(name)
    with torch.no_grad():
        assert torch.equal(model(x), again(x))


def test_gpt_is_causal():
    model = build_model(_spec("gpt")).eval()
    x, _ = _batch("gpt", n=1)
    x2 = x.clone()
    x2[0, -1] = (x2[0, -1] + 1) % TINY["gpt"][2]
    with torch.no_grad():
        a, b = model(x), model(x2)
    assert torch.equal(a[0, :-1], b[0, :-1]) and not torch.equal(a[0, -1], b[0, -1])


def test_residual_models_refuse_a_width_doubling_activation():
    from pipeline.models import resnet18_cifar

    class Doubling:
        expansion = 2

        def __call__(self, ch):
            return nn.Identity()

    with pytest.raises(ValueError, match="expansion 2"):
        resnet18_cifar(ModelConfig(resnet_width=4), (3, 8, 8), 10, Doubling())


# ---------------------------------------------------------------------------------------------
# The GPU configs, end to end at a tiny size

# config -> (tiny model overrides, synthetic DataInfo arguments)
GPU_CONFIGS = {
    "cifar10-resnet18.toml": (["model.resnet_width=4"], ((3, 32, 32), 10, [0.49, 0.48, 0.45], [0.25, 0.24, 0.26])),
    "cifar100-resnet18.toml": (["model.resnet_width=4"], ((3, 32, 32), 100, [0.5, 0.49, 0.44], [0.27, 0.26, 0.28])),
    "tinyimagenet-deit.toml": (["model.dim=16", "model.depth=2", "model.heads=2"], ((3, 64, 64), 200, [0.48, 0.45, 0.4], [0.28, 0.27, 0.28])),
    "wikitext2-gpt2.toml": (["model.dim=16", "model.depth=2", "model.heads=2", "data.seq_len=16", "train.lr=1e-3"], ((16,), 256, [], [])),
}


def _synthetic(name: str, shape: tuple, classes: int, mean: list, std: list):
    """A loader with the real data set's shapes: 24 train, 8 val, 8 test examples."""

    def load(cfg):
        g = torch.Generator().manual_seed(0)
        text = len(shape) == 1

        def split(n):
            if text:
                seq = torch.randint(0, classes, (n, shape[0] + 1), generator=g)
                return data.Split(seq[:, :-1], seq[:, 1:])
            return data.Split(torch.rand(n, *shape, generator=g), torch.randint(0, classes, (n,), generator=g))

        info = data.DataInfo(name, shape, classes, mean, std, 0.0, 1.0 if not text else classes - 1,
                             metric="perplexity" if text else "accuracy", source="synthetic")
        return data.Dataset(info, split(24), split(8), split(8))

    return load


@pytest.mark.parametrize("cfg_name", list(GPU_CONFIGS))
def test_gpu_config_runs_train_harden_swap_at_tiny_size(cfg_name, tmp_path, monkeypatch):
    from pipeline import config as config_mod

    overrides, (shape, classes, mean, std) = GPU_CONFIGS[cfg_name]
    cfg = config_mod.load(ROOT / "configs" / cfg_name)
    monkeypatch.setitem(data.DATASETS, cfg.data.name, _synthetic(cfg.data.name, shape, classes, mean, std))
    data._cached_dataset.cache_clear()
    try:
        code = main(["run", "-c", str(ROOT / "configs" / cfg_name), *overrides, f"out_dir={tmp_path}", "name=tiny",
                     "train.epochs=4", "data.batch_size=8", "data.eval_batch_size=8", "stages=train,harden,swap",
                     "device=cpu", "threads=1"])
    finally:
        data._cached_dataset.cache_clear()
    assert code == 0
    run = tmp_path / "tiny"
    swap = json.loads((run / "swap" / "swap.json").read_text())
    assert set(swap) == {"lambda_gelu", "gelu", "relu"}
    assert swap["relu"]["val_before"] == swap["relu"]["val_after"]  # the ReLU baseline has nothing to swap
    header = (run / "train" / "metrics.csv").read_text().splitlines()[0].split(",")
    metric = "val_perplexity" if len(shape) == 1 else "val_accuracy"
    assert metric in header
    sites = {"resnet18_cifar": 17, "deit_tiny": 2, "gpt": 2}[cfg.model.name]
    assert sum(h.startswith("lambda_") for h in header) == sites
    payload = checkpoint.load_payload(run / "train" / "lambda_gelu" / "last.pt")
    assert payload["state"]["history"][-1]["lambda_0"] == pytest.approx(159.577, rel=1e-4)  # annealed to λ_target
    for name, v in swap.items():
        assert all(isinstance(x, float) for k, x in v.items() if k not in ("swapped", "kept"))
        assert v["swapped"] == (0 if name == "relu" else sites) and v["kept"] == []  # every gate site made ReLU
