"""A sound bound on how far any logit moves when every λ-GELU gate of a feed-forward network is
replaced by ReLU (the swap stage), and the fraction of samples whose prediction provably survives.

Per unit, |ReLU(z) − z·Φ(λz)| ≤ c/λ for every z (c = max_u u·Φ(−u), `pipeline.gates`), and
ReLU is 1-Lipschitz. If the swapped network's gate input is z + Δ with |Δ| ≤ δ elementwise, then

    |ReLU(z + Δ) − f_λ(z)| ≤ |ReLU(z + Δ) − ReLU(z)| + |ReLU(z) − f_λ(z)| ≤ δ + c/λ      (global)

and, knowing z (one sample), exactly max(|ReLU(z − δ) − f_λ(z)|, |ReLU(z + δ) − f_λ(z)|), because
t ↦ ReLU(t) − f_λ(z) is monotone on [z − δ, z + δ]                                         (per sample).

Linear maps carry the box exactly: W·Δ ∈ [−|W|δ, |W|δ] (elementwise |W|, tighter than any norm);
Conv2d is the same with |W| and no bias. Modules before the first gate see identical inputs in
both networks (δ = 0), so any module may sit there; after it, an unknown module is an error.

The bounds hold in exact arithmetic; both networks' float rounding comes on top (tiny in float64,
relevant for float32 logits at very small bounds).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pipeline import gates
from pipeline.activations import gate_of

SUPPORTED = (
    "nn.Linear, nn.Conv2d, nn.Flatten, nn.ReLU, nn.Identity, nn.Dropout (eval), nn.BatchNorm1d/2d (eval), "
    "nn.AvgPool2d, nn.MaxPool2d, affine modules with `scale`/`shift` (Normalize), "
    "gates with `.lam` (x·g(λx)), nn.GELU / GELU (λ = 1)"
)


def gate_constant(gate: str = "phi") -> float:
    """c with sup_z |ReLU(z) − z·g(λz)| ≤ c/λ (`pipeline.gates`, nudged up so the bound stays sound)."""
    return gates.sup_constant(gate)


def _leaves(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """Children in order, nested nn.Sequential flattened."""
    for name, m in model.named_children():
        if isinstance(m, nn.Sequential):
            for sub, mm in _leaves(m):
                yield f"{name}.{sub}", mm
        else:
            yield name, m


def _gate_of(m: nn.Module) -> tuple[str, torch.Tensor] | None:
    """(gate family, λ as a flat float64 tensor) for a swappable gate, else None (`activations.gate_of`);
    nn.GELU(approximate='tanh') is a gate of no family here, so no bound can be given for it."""
    if isinstance(m, nn.GELU) and m.approximate != "none":
        raise TypeError("nn.GELU(approximate='tanh') is not x·Φ(x); no bound for it here")
    return gate_of(m)


def _per_unit(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Broadcast a [1] (per layer) or [C] (per channel, dim 1) tensor against `like` [N, C, ...]."""
    if value.numel() == 1:
        return value.reshape(())
    if like.dim() < 2 or like.shape[1] != value.numel():
        raise ValueError(f"per-channel λ of size {value.numel()} does not match activations of shape {tuple(like.shape)}")
    return value.view(1, -1, *([1] * (like.dim() - 2)))


def _abs_linear(m: nn.Module, d: torch.Tensor) -> torch.Tensor:
    """|W|·δ for the linear part of `m` (no bias); δ ≥ 0 elementwise."""
    if isinstance(m, nn.Linear):
        return F.linear(d, m.weight.detach().to(d.dtype).abs())
    if isinstance(m, nn.Conv2d):
        w = m.weight.detach().to(d.dtype).abs()
        if m.padding_mode != "zeros":
            d = F.pad(d, m._reversed_padding_repeated_twice, mode=m.padding_mode)
            padding: Any = 0
        else:
            padding = m.padding
        return F.conv2d(d, w, None, m.stride, padding, m.dilation, m.groups)
    if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
        if m.training or m.running_var is None:
            raise TypeError(f"{type(m).__name__} must be in eval mode with running stats")
        scale = (m.weight.detach() if m.weight is not None else torch.ones_like(m.running_var)) / torch.sqrt(m.running_var + m.eps)
        return d * _per_unit(scale.to(d.dtype).abs(), d)
    if isinstance(m, nn.AvgPool2d):
        return m(d)  # non-negative weights: maps the box exactly
    if hasattr(m, "scale") and hasattr(m, "shift"):  # Normalize: x·scale + shift
        return d * torch.as_tensor(m.scale).detach().to(d.dtype).abs()
    raise TypeError(f"no deviation rule for {type(m).__name__}; supported: {SUPPORTED}")


def _has_rule(m: nn.Module) -> bool:
    return isinstance(m, (nn.Linear, nn.Conv2d, nn.BatchNorm1d, nn.BatchNorm2d, nn.AvgPool2d)) or (
        hasattr(m, "scale") and hasattr(m, "shift")
    )


def _zeros_after(m: nn.Module, d: torch.Tensor) -> torch.Tensor:
    p = next(iter(m.parameters()), None)
    dtype = p.dtype if p is not None else d.dtype
    return torch.zeros(m(d.to(dtype)).shape, dtype=torch.float64)


def _passes_through(m: nn.Module) -> bool:
    return isinstance(m, (nn.Flatten, nn.Identity, nn.Dropout, nn.MaxPool2d, nn.ReLU))


@dataclass
class SwapBound:
    """|logit_ReLU − logit_smooth| ≤ per_logit, elementwise.

    per_logit is [K] for the global bound, [N, K] for the per-sample bound.
    layers: after each module, its name, type and the largest deviation bound so far.
    """

    per_logit: torch.Tensor
    max: float
    layers: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"per_logit": self.per_logit.tolist(), "max": self.max, "layers": self.layers}


def swap_bound(model: nn.Sequential, input_shape: tuple[int, ...], gate_constants: Mapping[str, float] | None = None) -> SwapBound:
    """Input-independent bound: holds for every input x of shape `input_shape` (no batch dim).

    δ starts at 0; a gate adds c/λ (per layer or per channel); Linear/Conv map δ by |W|; ReLU,
    Flatten, max-pooling and dropout (eval) pass δ through (1-Lipschitz per coordinate).
    """
    consts = dict(gate_constants or {})
    d = torch.zeros((1, *input_shape), dtype=torch.float64)
    seen_gate = False
    layers = []
    with torch.no_grad():
        for name, m in _leaves(model):
            g = _gate_of(m)
            if g is not None:
                gate, lam = g
                c = consts.setdefault(gate, gate_constant(gate))
                d = d + _per_unit(c / lam, d)
                seen_gate = True
            elif isinstance(m, nn.MaxPool2d):
                d = m(d)
            elif _passes_through(m):
                d = m(d) if isinstance(m, nn.Flatten) else d
            elif not seen_gate and not _has_rule(m):
                d = _zeros_after(m, d)  # both networks still agree exactly: only the shape matters
            else:
                d = _abs_linear(m, d)
            layers.append({"name": name, "type": type(m).__name__, "max_deviation": float(d.max())})
    per_logit = d.reshape(-1)
    return SwapBound(per_logit=per_logit, max=float(per_logit.max()), layers=layers)


def swap_bound_per_sample(model: nn.Sequential, x: torch.Tensor, gate_constants: Mapping[str, float] | None = None) -> SwapBound:
    """Sample-specific bound [N, K] from the smooth network's own pre-activations on `x` [N, ...].

    At a gate with input z and incoming deviation bound δ the new bound is
    max(|ReLU(z − δ) − f(z)|, |ReLU(z + δ) − f(z)|), f the gate itself (exact interval image).
    Everything runs on a float64 copy of `model` in eval mode; `model` is not touched.
    """
    del gate_constants  # the per-sample rule uses the gates' own outputs, not c
    net = copy.deepcopy(model).to(torch.float64).eval()
    z = x.detach().to(torch.float64)
    d = torch.zeros_like(z)
    seen_gate = False
    layers = []
    with torch.no_grad():
        for name, m in _leaves(net):
            if _gate_of(m) is not None or isinstance(m, nn.ReLU):
                y = m(z)
                d = torch.maximum((F.relu(z - d) - y).abs(), (F.relu(z + d) - y).abs())
                z = y
                seen_gate = True
            elif not seen_gate and not _has_rule(m):
                z = m(z)
                d = torch.zeros_like(z)
            elif isinstance(m, nn.MaxPool2d):
                d, z = m(d), m(z)
            elif _passes_through(m):
                d = m(d) if isinstance(m, nn.Flatten) else d
                z = m(z)
            else:
                d, z = _abs_linear(m, d), m(z)
            layers.append({"name": name, "type": type(m).__name__, "max_deviation": float(d.max())})
    per_logit = d.reshape(d.shape[0], -1)
    return SwapBound(per_logit=per_logit, max=float(per_logit.max()), layers=layers)


def certified_mask(logits: torch.Tensor, bound: torch.Tensor | float) -> torch.Tensor:
    """[N] bool: the top-1 class cannot change when each logit moves by at most `bound`.

    `bound` is a scalar, [K] or [N, K]. Sample n is certified when, with t its top class,
    logit_t − logit_j > bound_t + bound_j for every j ≠ t (for a scalar bound: margin > 2·bound).
    """
    logits = logits.detach().to(torch.float64)
    b = torch.as_tensor(bound, dtype=torch.float64).expand_as(logits)
    top = logits.argmax(dim=1, keepdim=True)
    lt, bt = logits.gather(1, top), b.gather(1, top)
    ok = (lt - logits) > (bt + b)
    ok.scatter_(1, top, True)
    return ok.all(dim=1)


def certified_fraction(logits: torch.Tensor, bound: torch.Tensor | float) -> float:
    """Fraction of samples whose top-1 prediction provably survives the swap (see `certified_mask`)."""
    if logits.shape[0] == 0:
        return math.nan
    return float(certified_mask(logits, bound).to(torch.float64).mean())


def relu_swapped(model: nn.Module) -> nn.Module:
    """A copy of `model` with every gate replaced by ReLU (`pipeline.swap.to_relu`, the swap stage's walker)."""
    from pipeline.swap import to_relu

    return to_relu(copy.deepcopy(model))
