"""Algorithm 1 for any model with hardenable gates, in any training loop.

`Hardener` owns what the λ-GELU paper adds to a training loop: the optimizer groups (s at c·lr, no weight
decay), the learn phase (epochs 1..e_s, λ = 1 + softplus(s/t) learned), the switch (s frozen, λ(e_s)
saved), the anneal phase (λ moved linearly to each gate family's λ_target, reached at epoch T − hold), an
optional hold at λ_target, and the state a checkpoint needs. The pipeline's train stage drives it; so can a
plain loop, a Lightning callback or a Hugging Face Trainer callback:

    hardener = Hardener(model, epochs=T)     # or Hardener(model, HardenConfig(epsilon=..., hold=...), T)
    opt = torch.optim.SGD(hardener.param_groups(lr=0.05, weight_decay=1e-4), lr=0.05, momentum=0.9)
    for epoch in range(1, T + 1):
        hardener.start_epoch(epoch)          # sets every gate's λ for this epoch
        for x, y in loader:
            ...                              # forward, loss, backward, opt.step() as usual
        # (per-step annealing: hardener.start_step(epoch, i, steps_per_epoch) before each step)
    torch.save({"model": model.state_dict(), "hardener": hardener.state_dict()}, path)

λ(p) = λ(e_s) + (p − e_s)/(T_a − e_s)·(λ_target − λ(e_s)) for progress p ∈ (e_s, T_a], T_a = T − hold, and
λ_target afterwards; per epoch, p is the epoch number, so λ(T_a) = λ_target exactly (the paper's schedule
when hold = 0).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .activations import HardenableGate, hardenable_gates
from .config import GateConfig, HardenConfig, TrainConfig
from .gates import lambda_target
from .records import VariantRecord
from .schedule import annealed_lambda, param_groups, switch_epoch

HARDENED_RTOL = 1e-6  # λ ≥ λ_target·(1 − this) counts as hardened (float32 storage of λ)


class Hardener:
    """Algorithm 1's schedule for the hardenable gates of `model` (found by walking it once)."""

    def __init__(self, model: nn.Module, harden: HardenConfig | None = None, epochs: int | None = None, *,
                 switch_fraction: float = TrainConfig.switch_fraction, lr_mult: float = GateConfig.lr_mult,
                 record: VariantRecord | None = None):
        """`harden` is the run's harden section (ε, criterion, a λ_target override, hold; defaults: `HardenConfig()`),
        `epochs` T; `switch_fraction` (train.switch_fraction) sets e_s = ⌊fraction·T⌋, `lr_mult` (gate.lr_mult) the
        hardness parameters' learning-rate factor c. In a pipeline run `record` is the variant's record
        (`pipeline.records`), which holds e_s and λ_target as the train stage decided them once: they are read
        from it, not derived again."""
        if epochs is None or epochs < 1:
            raise ValueError(f"Hardener needs epochs >= 1 (the T of Algorithm 1), got {epochs}")
        harden = harden if harden is not None else HardenConfig()
        self.gates: list[HardenableGate] = hardenable_gates(model)
        self.epochs = epochs
        self.switch = record.switch_epoch if record is not None else switch_epoch(epochs, switch_fraction)
        self.hold = max(0, min(int(harden.hold), epochs - self.switch - 1)) if epochs > self.switch else 0
        self.lr_mult = lr_mult
        self.model = model
        # Each gate family has its own λ_target: the smallest λ whose bound is ≤ ε for that g.
        self.targets = [self._target(g.GATE, harden, record) for g in self.gates]
        self.lambda_switch: list[torch.Tensor] | None = None  # λ(e_s) per gate, saved at the switch
        self.epoch = 0

    @staticmethod
    def _target(gate: str, harden: HardenConfig, record: VariantRecord | None) -> float:
        if record is None:
            return lambda_target(harden.epsilon, harden.criterion, harden.lambda_target, gate)
        if record.gate != gate or record.lambda_target is None:
            raise ValueError(f"the record of {record.activation!r} holds λ_target for gate {record.gate!r}, not for this "
                             f"model's {gate!r} gates")
        return record.lambda_target

    # -- optimizer ------------------------------------------------------------------------------
    def param_groups(self, lr: float, weight_decay: float) -> list[dict]:
        """Weights with weight decay; every hardness parameter s at c·lr with no weight decay. Each group
        carries `lr_mult`, so a schedule sets `group["lr"] = lr * group["lr_mult"]`."""
        return param_groups(self.model, lr, weight_decay, self.lr_mult)

    # -- schedule -------------------------------------------------------------------------------
    @property
    def anneal_end(self) -> int:
        """The epoch at which λ reaches λ_target."""
        return self.epochs - self.hold

    def phase(self, epoch: int) -> str:
        if not self.gates:
            return "train"
        if epoch <= self.switch:
            return "learn"
        return "anneal" if epoch <= self.anneal_end else "hold"

    def start_epoch(self, epoch: int) -> str:
        """Set every gate's λ for training epoch `epoch` (1-based); returns the phase."""
        return self._set(epoch, float(epoch))

    def start_step(self, epoch: int, step: int, steps: int) -> str:
        """Per-step annealing: λ at progress (epoch − 1) + (step + 1)/steps, so it rises within an epoch and
        ends each epoch where the per-epoch schedule would be."""
        return self._set(epoch, (epoch - 1) + (step + 1) / max(steps, 1))

    def _set(self, epoch: int, progress: float) -> str:
        self.epoch = epoch
        phase = self.phase(epoch)
        if phase in ("anneal", "hold"):
            if self.lambda_switch is None:  # Algorithm 1, line 2: save λ(e_s), freeze s
                self.lambda_switch = [g.lam.detach().cpu().clone() for g in self.gates]
            for g, lam_s, target in zip(self.gates, self.lambda_switch, self.targets):
                p = min(progress, float(self.anneal_end))
                g.freeze(annealed_lambda(lam_s, p, self.switch, self.anneal_end, target).to(g.lam_fixed.device))
        return phase

    # -- state ----------------------------------------------------------------------------------
    def lambdas(self) -> list[float]:
        """One λ per gate (the channel mean for per-channel gates)."""
        return [float(g.lam.detach().mean()) for g in self.gates]

    def hardness(self) -> float:
        """min over gates of min λ / λ_target: 1 when every gate is at its target (nan: no gates)."""
        if not self.gates:
            return math.nan
        return min(float(g.lam.detach().min()) / t for g, t in zip(self.gates, self.targets))

    def hardened(self) -> bool:
        """Every gate at (or beyond) its λ_target; True for a model without hardenable gates."""
        return not self.gates or self.hardness() >= 1 - HARDENED_RTOL

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs beside the model's own state dict (which holds s, λ and the frozen flags)."""
        return {"epoch": self.epoch, "switch": self.switch, "epochs": self.epochs, "hold": self.hold,
                "targets": list(self.targets),
                "lambda_switch": None if self.lambda_switch is None else [t.clone() for t in self.lambda_switch]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state["switch"], state["epochs"], state.get("hold", 0)) != (self.switch, self.epochs, self.hold):
            raise ValueError(f"hardener state is for T={state['epochs']}, e_s={state['switch']}, hold={state.get('hold', 0)}; "
                             f"this one has T={self.epochs}, e_s={self.switch}, hold={self.hold}")
        if len(state["targets"]) != len(self.gates):
            raise ValueError(f"hardener state has {len(state['targets'])} gates, the model {len(self.gates)}")
        self.epoch = state["epoch"]
        self.targets = list(state["targets"])
        ls = state["lambda_switch"]
        self.lambda_switch = None if ls is None else [torch.as_tensor(t).clone() for t in ls]
