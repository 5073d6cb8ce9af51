"""Evaluation: logits of a whole split, the loss, and the data's metric (accuracy or perplexity).

Every stage that scores a model uses these, so "accuracy" means the same thing everywhere.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .data import Split, batches


@torch.no_grad()
def predict(model: nn.Module, split: Split, batch_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Logits for the whole split, on CPU, shape [N, K] (or [N, T, V] for a language model)."""
    model.eval()
    p = next(model.parameters(), None)
    dtype = p.dtype if p is not None and p.is_floating_point() else None
    out = [model(x.to(device, dtype if x.is_floating_point() else None)).float().cpu() for x, _ in batches(split, batch_size)]
    return torch.cat(out)


def loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the last dim: [N, K] classification or [N, T, V] next-token prediction."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


# metric name -> (value from logits and labels, higher is better)
METRICS = {
    "accuracy": (lambda logits, y: float((logits.argmax(-1) == y).float().mean()), True),
    "perplexity": (lambda logits, y: math.exp(float(loss(logits, y))), False),
}


def score(logits: torch.Tensor, y: torch.Tensor, metric: str = "accuracy") -> dict[str, float]:
    """{"loss", "metric"} for a whole split; `metric` names an entry of METRICS."""
    return {"loss": float(loss(logits, y)), "metric": METRICS[metric][0](logits, y)}


def evaluate(model: nn.Module, split: Split, batch_size: int, device: torch.device | str, metric: str = "accuracy") -> dict[str, float]:
    """score(predict(...)) in one call."""
    return score(predict(model, split, batch_size, device), split.y, metric)


def worst(metric: str) -> float:
    """The starting value of a best-so-far search for `metric`."""
    return -math.inf if METRICS[metric][1] else math.inf
