"""The record of one variant's facts: decided once by the train stage from the config, written to the manifest
(`RunDir.record_variants`) and read one way (`RunDir.variant`) by every later stage, the report and the paper
tables. Nothing else derives these facts again: `tests/test_layout.py` fails on a call of the deciding functions
(`lambda_target`, `swapped_activation`, `switch_epoch`, a test `in RELU_FORMS`) outside their homes and this file.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .activations import ACTIVATIONS, RELU_FORMS, swapped_activation
from .config import HardenConfig, TrainConfig
from .gates import lambda_target
from .schedule import switch_epoch


@dataclass(frozen=True)
class VariantRecord:
    """What every stage needs to know about one variant (one activation trained in a run)."""

    activation: str  # its registry name (`pipeline.activations.ACTIVATIONS`)
    gate: str | None  # the family of its gate g in x·g(λx) (`pipeline.gates`); None: not a gate
    hardenable: bool  # has a λ that Algorithm 1 anneals
    smooth: bool  # has a form other than ReLU (export writes it as "smooth")
    is_relu: bool  # already ReLU (relu, linked_relu): the swap has nothing to change
    lambda_target: float | None  # the λ its gates are annealed to (hardenable variants only)
    swapped_to: str | None  # its activation after the swap stage; None: not a gate, the swap leaves it as it is
    switch_epoch: int  # e_s: λ learned in epochs 1..e_s, annealed (or the gates swapped, harden.method=swap) after

    @property
    def swap_changes(self) -> bool:
        """The swap turns its gates into ReLU (a gate, not ReLU already)."""
        return self.swapped_to is not None and not self.is_relu

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


FIELDS = tuple(f.name for f in dataclasses.fields(VariantRecord))


def decide(name: str, harden: HardenConfig, train: TrainConfig) -> VariantRecord:
    """The record of the variant `name` under a run's harden and train settings (the train stage's one call)."""
    spec = ACTIVATIONS[name]
    return VariantRecord(
        activation=name,
        gate=spec.gate,
        hardenable=spec.hardenable,
        smooth=name not in RELU_FORMS,
        is_relu=name in RELU_FORMS,
        lambda_target=lambda_target(harden.epsilon, harden.criterion, harden.lambda_target, spec.gate) if spec.hardenable else None,
        swapped_to=swapped_activation(name),
        switch_epoch=switch_epoch(train.epochs, train.switch_fraction),
    )


def from_dict(facts: dict[str, Any]) -> VariantRecord | None:
    """The record as the manifest holds it, or None when its fields are not this version's (an older run)."""
    if not isinstance(facts, dict) or set(facts) != set(FIELDS):
        return None
    return VariantRecord(**facts)
