"""Recognize an activation by what it computes, not by its class.

timm's `GELU`, Hugging Face's `NewGELUActivation` (GPT-2's tanh GELU), `QuickGELUActivation` (x·σ(1.702x)) and
a user's own `Swish` are classes no registry here names. `match` evaluates an elementwise module (or function) in
float64 on a fixed grid and fits every registered gate family x·g(λx) (`pipeline.gates`) to it over λ: the family
whose best λ leaves the smallest largest difference, if that difference is within `MATCH_ATOL`, is what the module
computes. The grid reaches ±`GRID_FAR` so that a clipped form (HF's `gelu_10`: GELU clipped to [−10, 10]) is told
apart from the gate; the difference is taken on the whole grid.

The tolerance admits the tanh form of GELU, 0.5x(1 + tanh(√(2/π)(x + 0.044715x³))), as λ-GELU at λ ≈ 1
(largest difference 4.7e-4) and rejects GELU as a λ-Swish (QuickGELU is 0.020 from GELU): the families are far
apart compared with the approximations people use of them.

Only a module with no parameters and no buffers is evaluated (an activation with learnable slopes is no fixed
function), on a copy of the grid (in-place activations), in eval mode, and it must be elementwise: the same values
for the grid laid out as a row and as a column (a Softmax is not).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from scipy import optimize
from torch import nn

from . import gates

MATCH_ATOL = 2e-3  # largest |module − x·g(λx)| on the grid for a match (tanh GELU vs λ-GELU: 4.7e-4)
GRID_NEAR, GRID_POINTS = 8.0, 1601  # dense part of the grid, where the gates bend
GRID_FAR = (12.0, 20.0, 50.0)  # and these magnitudes, both signs: clipped forms fail here
LAMBDA_RANGE = (1.0, 16.0)  # λ searched; the hardenable gates have λ ≥ 1
ELEMENTWISE_ATOL = 1e-9
CLAMP = 40.0  # |λx| beyond which every family's g is 0 or 1 in float64  # the grid as a row and as a column must agree to this


def grid() -> torch.Tensor:
    near = torch.linspace(-GRID_NEAR, GRID_NEAR, GRID_POINTS, dtype=torch.float64)
    far = torch.tensor([s * v for v in GRID_FAR for s in (-1.0, 1.0)], dtype=torch.float64)
    return torch.cat([near, far])


@dataclass(frozen=True)
class Match:
    """What an elementwise activation computes: x·g(λx) of gate family `family` at `lam`, within `max_diff`."""

    family: str
    lam: float
    max_diff: float

    def describe(self) -> str:
        return (f"computes {' '.join(gates.family(self.family).label.split())} at λ = {self.lam:.4g} (largest difference "
                f"{self.max_diff:.2g} on [−{GRID_FAR[-1]:g}, {GRID_FAR[-1]:g}])")


def evaluate(fn: Callable[[torch.Tensor], Any]) -> torch.Tensor | None:
    """fn on the grid (float64), or None when it is not an elementwise function of a tensor there."""
    x = grid()
    try:
        with torch.no_grad():
            row = fn(x.clone()[None, :])
            col = fn(x.clone()[:, None])
    except Exception:  # noqa: BLE001 - any module that cannot take a plain tensor is no activation
        return None
    if not (isinstance(row, torch.Tensor) and isinstance(col, torch.Tensor)) or row.shape != (1, len(x)) \
            or col.shape != (len(x), 1) or not row.is_floating_point():
        return None
    row, col = row.reshape(-1).to(torch.float64), col.reshape(-1).to(torch.float64)
    if not torch.allclose(row, col, rtol=0, atol=ELEMENTWISE_ATOL, equal_nan=True):
        return None
    return row


def _fit(y: torch.Tensor, x: torch.Tensor, family: str) -> tuple[float, float]:
    """(λ, largest |y − x·g(λx)|) at the best λ in LAMBDA_RANGE (a grid, then a bounded search around its best)."""
    fam = gates.family(family)

    def err(lam: float) -> float:
        # g(±40) is 0 or 1 to float64 for every family, and float64 erfc is slow far out in its tail
        return float((y - x * fam.g((lam * x).clamp(-CLAMP, CLAMP))).abs().max())

    lams = np.geomspace(*LAMBDA_RANGE, 41)
    errs = [err(lam) for lam in lams]
    i = int(np.argmin(errs))
    lo, hi = lams[max(i - 1, 0)], lams[min(i + 1, len(lams) - 1)]
    res = optimize.minimize_scalar(err, bounds=(lo, hi), method="bounded", options={"xatol": 1e-7})
    lam, e = (float(res.x), float(res.fun)) if res.fun <= errs[i] else (float(lams[i]), errs[i])
    return lam, e


def match_values(y: torch.Tensor) -> Match | None:
    """The family whose x·g(λx) is closest to y on the grid, if within MATCH_ATOL."""
    x = grid()
    if not torch.isfinite(y).all():
        return None
    # every gate is ≈ x far right and ≈ 0 far left: the identity, tanh, a sigmoid or a clamp stop here, unfitted
    far = x.abs() == GRID_FAR[-1]
    if not torch.allclose(y[far], torch.where(x[far] > 0, x[far], 0.0), rtol=0, atol=10 * MATCH_ATOL):
        return None
    best = None
    for name in gates.GATES:
        lam, e = _fit(y, x, name)
        if best is None or e < best.max_diff:
            best = Match(name, lam, e)
    return best if best is not None and best.max_diff <= MATCH_ATOL else None


def candidate(m: nn.Module) -> bool:
    """A module `match` evaluates: a leaf with no parameters and no buffers (a fixed function)."""
    return (next(m.children(), None) is None and next(m.parameters(recurse=False), None) is None
            and next(m.buffers(recurse=False), None) is None)


def _key(m: nn.Module) -> tuple | None:
    """A module's class and public settings (approximate='tanh', a clip's bounds, a held function), when they are all
    hashable: two modules with the same key compute the same function. None: not cached."""
    items = tuple(sorted((k, v) for k, v in vars(m).items() if not k.startswith("_") and k != "training"))
    try:
        hash(items)
    except TypeError:
        return None
    return (type(m), items)


_matches: dict[tuple, Match | None] = {}


def match(m: nn.Module) -> Match | None:
    """What the module computes, if it is an elementwise gate x·g(λx) of a registered family (module docstring)."""
    if not candidate(m):
        return None
    key = _key(m)
    if key is not None and key in _matches:
        return _matches[key]
    found = _evaluate_module(m)
    if key is not None:
        _matches[key] = found
    return found


def _evaluate_module(m: nn.Module) -> Match | None:
    training = m.training
    m.eval()
    try:
        y = evaluate(m)
    finally:
        m.train(training)
    return None if y is None else match_values(y)


def forget() -> None:
    """Drop the cached matches (a gate family was registered or removed)."""
    _matches.clear()


gates.on_change(lambda name, fam: forget())


def match_function(fn: Callable) -> Match | None:
    """The same for a function held as an attribute (e.g. functools.partial(F.gelu, approximate="tanh"))."""
    y = evaluate(fn)
    return None if y is None else match_values(y)


def distance(m: nn.Module | Callable) -> float | None:
    """The smallest largest difference between an elementwise module or function and any family's x·g(λx), λ in
    LAMBDA_RANGE (for saying how far an unmatched activation is); None when it is not elementwise."""
    y = evaluate(m) if not isinstance(m, nn.Module) or candidate(m) else None
    if y is None or not torch.isfinite(y).all():
        return None if y is None else math.inf
    return min(_fit(y, grid(), name)[1] for name in gates.GATES)


def family_names() -> str:
    """The values a module's GATE may take (for messages)."""
    return ", ".join(repr(n) for n in gates.GATES)
