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

A Hardener never does nothing silently: it refuses a model without a hardenable gate (convert it with `to_gates`
first), and one whose forward calls F.gelu / F.silu / F.mish itself (`pipeline.probe`: such a call is no module,
so it can be neither annealed nor swapped). `hardened()` is then true only when every gate is at its λ_target.
"""

from __future__ import annotations

import operator
import warnings
from typing import Any

import torch
from torch import nn

from .activations import HardenableGate, gate_of, hardenable_gates
from .config import GateConfig, HardenConfig, TrainConfig
from .errors import PipelineError
from .gates import lambda_target
from .probe import smooth_calls
from .relu_swap import smooth_work_error
from .variant_record import VariantRecord
from .schedule import annealed_lambda, param_groups, switch_epoch

HARDENED_RTOL = 1e-6  # λ ≥ λ_target·(1 − this) counts as hardened (float32 storage of λ)


class HardenError(PipelineError, ValueError):
    """A model the Hardener cannot harden, or a call outside its schedule (one line naming the fix)."""


class Hardener:
    """Algorithm 1's schedule for the hardenable gates of `model` (found by walking it once)."""

    def __init__(self, model: nn.Module, harden: HardenConfig | None = None, epochs: int | None = None, *,
                 switch_fraction: float = TrainConfig.switch_fraction, lr_mult: float = GateConfig.lr_mult,
                 example: Any = None, allow_no_gates: bool = False, record: VariantRecord | None = None):
        """`harden` is the run's harden section (ε, criterion, a λ_target override, hold; defaults: `HardenConfig()`),
        `epochs` T; `switch_fraction` (train.switch_fraction) sets e_s = ⌊fraction·T⌋, `lr_mult` (gate.lr_mult) the
        hardness parameters' learning-rate factor c. `example`: an input batch for the watched forward that finds
        gate functions called inside forward() (default: a zero batch read from the first layer, `pipeline.probe`).
        `allow_no_gates`: the train stage's plain training (its baselines, the fine-tuned swap): no gate, no check.
        In a pipeline run `record` is the variant's record (`pipeline.variant_record`), which holds e_s and λ_target as the
        train stage decided them once: they are read from it, not derived again."""
        if _as_int(epochs) is None or epochs < 1:
            raise HardenError(f"Hardener needs epochs >= 1 (the T of Algorithm 1), got {epochs!r}")
        epochs = _as_int(epochs)
        harden = harden if harden is not None else HardenConfig()
        self.gates: list[HardenableGate] = hardenable_gates(model)
        if not allow_no_gates:
            _check_hardenable(model, self.gates, example)
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
        """Set every gate's λ for training epoch `epoch` (1..T); returns the phase."""
        epoch = self._check_epoch(epoch, "start_epoch")
        return self._set(epoch, float(epoch))

    def start_step(self, epoch: int, step: int, steps: int) -> str:
        """Per-step annealing: λ at progress (epoch − 1) + (step + 1)/steps, so it rises within an epoch and
        ends each epoch where the per-epoch schedule would be (epoch 1..T, step 0..steps − 1)."""
        epoch = self._check_epoch(epoch, "start_step")
        if _as_int(step) is None or _as_int(steps) is None:
            raise HardenError(f"start_step: step and steps must be ints, got step={step!r}, steps={steps!r}")
        step, steps = _as_int(step), _as_int(steps)
        if steps < 1 or not 0 <= step < steps:
            raise HardenError(f"start_step(epoch={epoch}, step={step}, steps={steps}): step runs 0..steps − 1 within an "
                              "epoch of steps >= 1 steps")
        return self._set(epoch, (epoch - 1) + (step + 1) / steps)

    def _check_epoch(self, epoch: Any, who: str) -> int:
        """The epoch, checked: it must lie in 1..T, and once λ(e_s) is saved (s frozen) the learn phase cannot come back."""
        if _as_int(epoch) is None:
            raise HardenError(f"{who}: epoch must be an int in 1..{self.epochs}, got {epoch!r}")
        epoch = _as_int(epoch)
        if not 1 <= epoch <= self.epochs:
            raise HardenError(f"{who}({epoch}): epochs run 1..{self.epochs} (1-based, T = {self.epochs} as given to "
                              f"the Hardener); Lightning and Hugging Face count from 0: pass their epoch + 1")
        if self.lambda_switch is not None and epoch <= self.switch and self.gates:
            raise HardenError(f"{who}({epoch}): the learn phase (epochs 1..{self.switch}) is over: λ(e_s) was saved and s "
                              f"frozen at epoch {self.switch + 1}; to go back, load a model and hardener state saved before it")
        return epoch

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

    def hardness(self) -> float | None:
        """min over gates of min λ / λ_target: 1 when every gate is at its target. None only without gates (the
        train stage's plain training, `allow_no_gates`): a Hardener refuses such a model otherwise."""
        if not self.gates:
            return None
        return min(float(g.lam.detach().min()) / t for g, t in zip(self.gates, self.targets))

    def hardened(self) -> bool:
        """Every gate at (or beyond) its λ_target. Without gates (only under `allow_no_gates`: a baseline, or the
        ReLU network the swap method fine-tunes) nothing is left to anneal, so True."""
        h = self.hardness()
        return h is None or h >= 1 - HARDENED_RTOL

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


def _check_hardenable(model: nn.Module, gates: list[HardenableGate], example: Any) -> None:
    """HardenError unless the model has a hardenable gate and its forward calls no gate function outside gate modules
    (`pipeline.probe`): such a call would stay smooth through the anneal and the swap."""
    found = smooth_calls(model, example, lambda m: gate_of(m) is not None)
    if found.calls:  # the anneal would not reach them either
        raise HardenError(smooth_work_error(found.calls, "Hardener"))
    if found.calls is None and gates:  # cannot be seen here; the swap of a model with data (swap_report) still looks
        warnings.warn(f"Hardener: smooth work inside forward() was not looked for ({found.how}); pass "
                      "example=<an input batch> so that an F.gelu called there is found before training, not at the swap",
                      UserWarning, stacklevel=3)
    if not gates:
        raise HardenError(_nothing_to_anneal(model, example, found))


def _nothing_to_anneal(model: nn.Module, example: Any, found: Any) -> str:
    """Why a model without hardenable gates has nothing to anneal, from what `to_gates` would do to it: convert it first
    only where to_gates would convert something; else what its activations are and why none can be hardened."""
    from .convert import to_gates

    _, report = to_gates(model, example=example)
    seen = ("" if found.calls is not None else
            f"; smooth work inside forward() was not looked for ({found.how}): to_gates(model, example=<an input batch>) finds it")
    head = "Hardener: the model has no hardenable gate, so there is nothing to anneal"
    if report.converted or report.filtered:
        sites = report.converted or report.filtered
        return (f"{head}: convert it with to_gates(model) first, which converts {len(sites)} activation(s) "
                f"({_counted(sites)})" + seen)
    relus = sum(isinstance(m, nn.ReLU) for m in model.modules())
    have = [*([f"{relus} nn.ReLU (already the swapped form)"] if relus else []),
            *([f"{len(report.not_gates)} that compute no gate x·g(λx) ({_counted(report.not_gates)}: no λ form, the swap "
               "keeps them as they are)"] if report.not_gates else []),
            *([f"{len(report.left)} smooth gate(s) with no hardenable form ({_counted(report.left)}: "
               f"{report.left[0].reason})"] if report.left else [])]
    what = "its activations are " + "; ".join(have) if have else "it has no activation to_gates knows"
    return (f"{head}, and to_gates(model) converts nothing in it: {what}. Train it as it is; to harden an activation "
            "to_gates leaves, register a hardenable family for it (pipeline.activations)" + seen)


def _counted(sites: list[Any]) -> str:
    """'19 nn.Hardswish, 9 nn.Hardsigmoid': the sites' types with their counts, most first."""
    counts: dict[str, int] = {}
    for s in sites:
        counts[s.source] = counts.get(s.source, 0) + 1
    return ", ".join(f"{n} {t}" for t, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def _as_int(v: Any) -> int | None:
    """v as an int (Python, numpy or a 0-dim integer tensor); None for anything else, bool included."""
    if isinstance(v, bool):
        return None
    try:
        return operator.index(v)
    except TypeError:
        return None
