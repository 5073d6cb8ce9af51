"""Gate families: the one place that knows a gate, as one object per family (`GateFamily`).

A self-gated activation is f_λ(x) = x·g(λx) with a smooth step g (g(−∞) = 0, g(+∞) = 1), so f_λ → ReLU
as λ → ∞. A family is named by its gate g ("phi" for λ-GELU, "sigmoid" for λ-Swish, ...); activation
modules declare it in their `GATE` class attribute. Everything that needs to know what a gate is reads its
family here: the activations (`pipeline/activations.py`: g, its torch modules and functions, and the hardenable
activation a registered family gets), the kernels (`kernel`), λ_target, the per-layer check, the swap certificate
(the constants, `curvature`), the sympy derivations (`analysis/theory/symbolic.py`: `sym`), the verifier's
relaxations (`relaxation`, `inflections`, `tail_peaks`) and its ONNX reader (`onnx`), and `pipeline.convert`
(`modules`, `functions`). Adding a family is one call, `register(GateFamily(...))`: tests/test_gate_family.py
registers a new one and runs it through every stage of a pipeline run.

Per family, three constants, each a bound over a power of λ:
  a: E∞(λ) = ∫|H(x) − g(λx)| dx = a/λ                (the λ-GELU paper's criterion, `gate_l1`)
  b: ∫|ReLU(x) − f_λ(x)| dx = b/λ²                     (`act_l1`)
  c: sup_x |ReLU(x) − f_λ(x)| = c/λ                    (`sup`: what a swap changes per unit)
a and b in closed form where one exists, scipy quadrature of the two tails otherwise; c always from the tails
(`tail_peaks`, computed once per family and nudged up so that it is a sound upper bound; `sup_constant`). The sympy
derivations in `analysis/theory/symbolic.py` are tested against these numbers.

Φ (the standard normal CDF, from erfc) and its constants are written here once (`Phi`, `INV_SQRT2`, `INV_SQRT_2PI`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from scipy import integrate, optimize, special
from torch import nn

CRITERIA = ("gate_l1", "act_l1", "sup")
QUAD_RTOL = 1e-12  # scipy quad's relative tolerance for the gates without closed forms (SERF, Mish)
# A peak found by a bounded search is the function's value at the best point found, at most the true maximum:
# the reported maximum is raised by this relative amount (far above the search's xatol² and float64 rounding).
PEAK_NUDGE = 1e-12

INV_SQRT2 = 1.0 / math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def Phi(y: torch.Tensor) -> torch.Tensor:
    """The standard normal CDF Φ(y) = erfc(−y/√2)/2: erfc keeps float32 relative accuracy in the far left tail, where
    1 + erf cancels. The one torch Φ of the project (the gate of λ-GELU, its kernels' reference, the relaxations)."""
    return 0.5 * torch.erfc(-y * INV_SQRT2)


@dataclass(frozen=True)
class GateBounds:
    """How far f_λ(x) = x·g(λx) is from ReLU, for one gate g; every bound is a constant over a power of λ."""

    gate_l1: float  # a: E∞(λ) = a/λ
    act_l1: float  # b: ∫|ReLU − f_λ| = b/λ²
    sup: float  # c: sup|ReLU − f_λ| = c/λ

    def bound(self, criterion: str, lam: float) -> float:
        return {"gate_l1": self.gate_l1 / lam, "act_l1": self.act_l1 / lam**2, "sup": self.sup / lam}[criterion]

    def lambda_for(self, criterion: str, eps: float) -> float:
        """The smallest λ whose bound is ≤ eps (every bound decreases in λ)."""
        return {"gate_l1": self.gate_l1 / eps, "act_l1": math.sqrt(self.act_l1 / eps), "sup": self.sup / eps}[criterion]


@dataclass(frozen=True)
class Relaxation:
    """What the verifier's linear relaxations of F(y) = y·g(y) need beyond g (`analysis/verification/ops/gates.py`).
    F has exactly two inflection points y₁ < y₂ (F'' < 0, > 0, < 0 on the three pieces), one in each bracket."""

    dF: Callable[[torch.Tensor], torch.Tensor]  # F'(y) = g(y) + y·g'(y), float64 tensors
    d2F_sign: Callable[[torch.Tensor], torch.Tensor]  # a function with the sign of F''
    inflection_brackets: tuple[tuple[float, float], tuple[float, float]]


@dataclass(frozen=True)
class OnnxPattern:
    """How a gate module exports to ONNX and how the verifier's reader reads it back as one gate node. `ops` is the
    chain of one-input ops the exporter writes: applied to λx, they compute g (and a Mul by x makes the gate), or,
    with `whole`, F(y) = y·g(y) itself (λ-GELU's Mul → Gelu → Div, F(λx)/λ)."""

    ops: tuple[str, ...]
    whole: bool = False
    # With `whole`, F(y) = y·g(y) as one torch function that exports as `ops` (F.hardswish → HardSwish): the family's
    # hardenable gate then traces as F(λx)/λ, ops the verifier reads exactly, instead of a product of two variables.
    F: Callable[[torch.Tensor], torch.Tensor] | None = None


@dataclass(frozen=True)
class GateFamily:
    """One gate g of the family x·g(λx): everything the project knows about it."""

    name: str
    label: str
    # g(y) on tensors, accurate in both tails (the float64 reference), with finite gradients everywhere (training
    # differentiates it); traced for ONNX, it writes the ops of `onnx`
    g: Callable[[torch.Tensor], torch.Tensor]
    sym: Callable[[Any], Any]  # g(y) as a sympy expression (sympy is imported by the caller's first use)
    upper_tail: Callable[[float], float]  # 1 − g(u) for u ≥ 0: the x > 0 side, where f_λ falls short of ReLU
    lower_tail: Callable[[float], float]  # g(−u) for u ≥ 0: the x < 0 side, where f_λ is below 0
    # (a, b) in closed form; None: scipy quadrature of the tails (`gate_bounds`)
    l1: Callable[[], tuple[float, float]] | None = None
    # The tail 1 − g(u), u > 0, as Σ_{k≥1} a(k)·e^{−b(k)u}: lets sympy integrate moments it cannot do directly.
    tail_series: Callable[[Any], tuple[Any, Any]] | None = None
    # No closed forms (and g(−y) ≠ 1 − g(y)): sympy builds the expressions, mpmath does the integrals.
    numeric: bool = False
    # 1 − g(y) on tensors without cancellation; None: g(−y) (a symmetric gate, g(−y) = 1 − g(y))
    complement: Callable[[torch.Tensor], torch.Tensor] | None = None
    relaxation: Relaxation | None = None  # None: the verifier has no relaxation of it (and does not read it)
    onnx: OnnxPattern | None = None  # None: no pattern the verifier's reader knows
    kernel: str | None = None  # the fused kernels' id for it (`pipeline.kernels`); None: its autograd expression
    modules: tuple[type[nn.Module], ...] = ()  # torch modules that compute x·g(x) (λ = 1; nn.GELU in its erf form)
    functions: tuple[Callable, ...] = ()  # torch functions that do (a module attribute `self.act = F.gelu`)
    # The registry name of its hardenable activation; `register` adds one (`pipeline.activations`) where none exists.
    hardenable: str | None = None
    # The points y where F' = g + y·g' jumps (a clipped gate: F is not C¹ there); `curvature` has no bound on F''
    # within their reach, so the float32 certificate takes its first-order term there.
    kinks: tuple[float, ...] = ()

    def f(self, x: torch.Tensor, lam: torch.Tensor | float = 1.0) -> torch.Tensor:
        """f_λ(x) = x·g(λx)."""
        return x * self.g(lam * x)

    def one_minus_g(self, y: torch.Tensor) -> torch.Tensor:
        """1 − g(y) on tensors, accurate where g(y) is near 1."""
        return self.complement(y) if self.complement is not None else self.g(-y)


# ---------------------------------------------------------------------------------------------
# The families


def _softplus(u: float) -> float:
    return float(np.logaddexp(0.0, u))


def _sym_phi(y):
    import sympy as sp

    return (1 + sp.erf(y / sp.sqrt(2))) / 2


def _sym_sigmoid(y):
    import sympy as sp

    return 1 / (1 + sp.exp(-y))


def _sym_serf(y):
    """SERF's gate erf(ln(1 + e^y))."""
    import sympy as sp

    return sp.erf(sp.log(1 + sp.exp(y)))


def _sym_mish(y):
    """Mish's gate tanh(ln(1 + e^y))."""
    import sympy as sp

    return sp.tanh(sp.log(1 + sp.exp(y)))


def _phi_tail(u: float) -> float:
    return float(special.ndtr(-u))


def _sigmoid_tail(u: float) -> float:
    return float(special.expit(-u))


def _serf(y: torch.Tensor) -> torch.Tensor:
    return torch.erf(F.softplus(y))


def _serf_dF(y: torch.Tensor) -> torch.Tensor:
    s = F.softplus(y)
    return torch.erf(s) + y * (2.0 / math.sqrt(math.pi)) * torch.exp(-s * s) * torch.sigmoid(y)


def _softplus_t(y: torch.Tensor) -> torch.Tensor:
    # F.softplus returns y itself above 20 (off by e^-20): the exact form in both tails
    return y.clamp(min=0) + torch.log1p(torch.exp(-y.abs()))


def _mish(y: torch.Tensor) -> torch.Tensor:
    return torch.tanh(_softplus_t(y))


def _sym_hardsigmoid(y):
    """hardsigmoid(y) = clip(y/6 + 1/2, 0, 1)."""
    import sympy as sp

    return sp.Piecewise((0, y <= -3), (y / 6 + sp.Rational(1, 2), y < 3), (1, True))


def _hardsigmoid(y: torch.Tensor) -> torch.Tensor:
    """clip(y/6 + 1/2, 0, 1) as a clamp, which autograd differentiates twice (`curvature`); F.hardsigmoid's
    backward has no derivative."""
    return (y / 6.0 + 0.5).clamp(0.0, 1.0)


def _hardsigmoid_tail(u: float) -> float:
    return max(0.0, 0.5 - u / 6.0)


def _mish_dF(y: torch.Tensor) -> torch.Tensor:
    s = _softplus_t(y)
    return torch.tanh(s) + y * 4.0 * torch.sigmoid(2.0 * s) * torch.sigmoid(-2.0 * s) * torch.sigmoid(y)


GATES: dict[str, GateFamily] = {
    # E∞ = 2/(λ√(2π)), 1/(2λ²); c = max_u u·Φ(−u) ≈ 0.169971 (both tails are Φ(−u)); F'' = φ(y)(2 − y²): inflections ±√2
    "phi": GateFamily("phi", "λ-GELU  x·Φ(λx)", Phi, _sym_phi, _phi_tail, _phi_tail,
                      l1=lambda: (2.0 / math.sqrt(2 * math.pi), 0.5),
                      relaxation=Relaxation(lambda y: Phi(y) + y * INV_SQRT_2PI * torch.exp(-0.5 * y * y), lambda y: 2.0 - y * y,
                                            ((-3.0, -1.0), (1.0, 3.0))),
                      onnx=OnnxPattern(("Gelu",), whole=True), kernel="phi", modules=(nn.GELU,), functions=(F.gelu,),
                      hardenable="lambda_gelu"),
    # E∞ = 2·ln2/λ, π²/(6λ²); c = W(1/e) (u·σ(−u) is largest where u − 1 = e^{−u}); 1/(1 + e^u) = Σ (−1)^{k+1} e^{−ku};
    # F'' = σ'(y)(2 − y·tanh(y/2)): inflections ±2.3994
    "sigmoid": GateFamily("sigmoid", "λ-Swish  x·σ(λx)", torch.sigmoid, _sym_sigmoid, _sigmoid_tail, _sigmoid_tail,
                          l1=lambda: (2 * math.log(2), math.pi**2 / 6), tail_series=lambda k: ((-1) ** (k + 1), k),
                          relaxation=Relaxation(lambda y: torch.sigmoid(y) * (1.0 + y * torch.sigmoid(-y)),
                                                lambda y: 2.0 - y * torch.tanh(y / 2), ((-4.0, -1.0), (1.0, 4.0))),
                          onnx=OnnxPattern(("Sigmoid",)), kernel="sigmoid", modules=(nn.SiLU,), functions=(F.silu,),
                          hardenable="lambda_swish"),
    # erf(softplus(y)): not symmetric (g(0) = erf(ln 2) ≈ 0.673), so the two sides differ; with s = softplus(y),
    # F'' = (2/√π)·e^{−s²}·σ(y)·(2 + y(1 − σ(y) − 2sσ(y))): inflections ≈ −2.2565, 1.0960
    "serf": GateFamily("serf", "λ-SERF  x·erf(softplus(λx))", _serf, _sym_serf,
                       lambda u: float(special.erfc(_softplus(u))), lambda u: float(special.erf(math.log1p(math.exp(-u)))),
                       numeric=True, complement=lambda y: torch.erfc(F.softplus(y)),
                       relaxation=Relaxation(_serf_dF, lambda y: 2.0 + y * (1.0 - torch.sigmoid(y) - 2.0 * F.softplus(y) * torch.sigmoid(y)),
                                             ((-4.0, -1.0), (0.5, 2.0))),
                       onnx=OnnxPattern(("Softplus", "Erf")), hardenable="lambda_serf"),
    # tanh(softplus(y)): 1 − tanh(s) = 2σ(−2s); with g = tanh(s), g' = (1 − g²)σ(y) and
    # F'' = (1 − g²)·σ(y)·(2 + y(1 − σ(y) − 2gσ(y))): inflections ≈ −2.2564, 1.4905
    "mish": GateFamily("mish", "λ-Mish  x·tanh(softplus(λx))", _mish, _sym_mish,
                       lambda u: 2.0 * float(special.expit(-2.0 * _softplus(u))), lambda u: math.tanh(math.log1p(math.exp(-u))),
                       numeric=True, complement=lambda y: 2.0 * torch.sigmoid(-2.0 * _softplus_t(y)),
                       relaxation=Relaxation(_mish_dF, lambda y: 2.0 + y * (1.0 - torch.sigmoid(y) - 2.0 * _mish(y) * torch.sigmoid(y)),
                                             ((-4.0, -1.0), (1.0, 2.0))),
                       onnx=OnnxPattern(("Softplus", "Tanh")), modules=(nn.Mish,), functions=(F.mish,)),
    # hardsigmoid(y) = clip(y/6 + 1/2, 0, 1), the hard gate of HardSwish (MobileNetV3): both tails are (1/2 − u/6)₊, so
    # a = 2∫₀³(1/2 − u/6) = 3/2, b = 2∫₀³u(1/2 − u/6) = 3/2, c = max u(1/2 − u/6) = 3/8 at u = 3/2. F is piecewise
    # quadratic (F'' = 1/3 on |y| < 3, 0 outside) with F' jumping at ±3 (0 → −1/2, 3/2 → 1): no relaxation data, as
    # the verifier reads its export HardSwish(λx)/λ through its own HardSwish op
    "hardsigmoid": GateFamily("hardsigmoid", "λ-HardSwish  x·hardsigmoid(λx)", _hardsigmoid, _sym_hardsigmoid,
                              _hardsigmoid_tail, _hardsigmoid_tail, l1=lambda: (1.5, 1.5),
                              onnx=OnnxPattern(("HardSwish",), whole=True, F=F.hardswish), modules=(nn.Hardswish,),
                              functions=(F.hardswish,), hardenable="lambda_hardswish", kinks=(-3.0, 3.0)),
}


def family(name: str) -> GateFamily:
    try:
        return GATES[name]
    except KeyError:
        raise ValueError(f"unknown gate {name!r}; registered gates: {', '.join(GATES)}") from None


# Called with (name, family) after `register` and (name, None) after `unregister`: the registries built on the
# families (`pipeline.activations`, the sympy caches of `analysis.theory.symbolic`) follow them.
_listeners: list[Callable[[str, GateFamily | None], None]] = []


def on_change(listener: Callable[[str, GateFamily | None], None]) -> None:
    """Call `listener(name, family)` for every family registered now and later, and `listener(name, None)` when one
    is unregistered."""
    _listeners.append(listener)
    for name, fam in list(GATES.items()):
        listener(name, fam)


def _changed(name: str, fam: GateFamily | None) -> None:
    for cache in (tail_peaks, gate_bounds, curvature, inflections):
        cache.cache_clear()
    for listener in _listeners:
        listener(name, fam)


def register(fam: GateFamily) -> None:
    """Add (or replace) a gate family: its constants are derived on first use, and every registry built on the
    families follows (a hardenable activation named `fam.hardenable` where the registry has none)."""
    GATES[fam.name] = fam
    _changed(fam.name, fam)


def unregister(name: str) -> None:
    """Remove a gate family that `register` added (tests use this), and what the registries built on it."""
    GATES.pop(name, None)
    _changed(name, None)


def of_module(cls: type) -> str | None:
    """The family whose gate a torch module class computes at λ = 1 (`GateFamily.modules`), or None."""
    return next((fam.name for fam in GATES.values() if cls in fam.modules), None)


def of_function(fn: Callable) -> str | None:
    """The family whose gate a torch function computes at λ = 1 (`GateFamily.functions`), or None."""
    return next((fam.name for fam in GATES.values() if any(fn is f for f in fam.functions)), None)


class TailPeaks(NamedTuple):
    """Per side of a gate, (u*, max_{u ≥ 0} u·tail(u)) with the maximum nudged up (`PEAK_NUDGE`): with u = λ|x|,
    |ReLU(x) − x·g(λx)| = u·tail(u)/λ, so each side's maximum over λ is the constant of that side's c/λ bound."""

    upper: tuple[float, float]  # x > 0: u·(1 − g(u))
    lower: tuple[float, float]  # x < 0: u·g(−u)


def _peak(tail: Callable[[float], float]) -> tuple[float, float]:
    """(argmax, nudged max) of u·tail(u) on u ≥ 0 (unimodal): a grid, then a bounded search around its best point."""
    grid = np.linspace(0.0, 20.0, 2001)
    i = int(np.argmax([u * tail(u) for u in grid]))
    res = optimize.minimize_scalar(lambda u: -u * tail(u), bounds=(grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]),
                                   method="bounded", options={"xatol": 1e-12})
    return float(res.x), -float(res.fun) * (1 + PEAK_NUDGE)


@functools.lru_cache(maxsize=None)
def tail_peaks(gate: str = "phi") -> TailPeaks:
    """Both sides' peaks of u·tail(u) for one gate family, computed once."""
    fam = family(gate)
    return TailPeaks(_peak(fam.upper_tail), _peak(fam.lower_tail))


@functools.lru_cache(maxsize=None)
def gate_bounds(gate: str = "phi") -> GateBounds:
    """a, b (closed forms, or quadrature of the tails: E∞ = (∫t₊ + ∫t₋)/λ, ∫|ReLU − f_λ| = (∫u·t₊ + ∫u·t₋)/λ²)
    and c = the larger tail peak (`tail_peaks`)."""
    fam = family(gate)
    if fam.l1 is not None:
        a, b = fam.l1()
    else:
        quad = lambda f: integrate.quad(f, 0.0, np.inf, epsabs=0.0, epsrel=QUAD_RTOL, limit=200)[0]  # noqa: E731
        a = quad(fam.upper_tail) + quad(fam.lower_tail)
        b = quad(lambda u: u * fam.upper_tail(u)) + quad(lambda u: u * fam.lower_tail(u))
    peaks = tail_peaks(gate)
    return GateBounds(a, b, max(peaks.upper[1], peaks.lower[1]))


@functools.lru_cache(maxsize=None)
def inflections(gate: str = "phi") -> tuple[float, float]:
    """The two inflection points y₁ < y₂ of F(y) = y·g(y) (the roots of `Relaxation.d2F_sign` in its brackets, by
    Brent's method to float64 precision), computed once: F' is monotone between them (the relaxations' pieces)."""
    rel = family(gate).relaxation
    if rel is None:
        raise ValueError(f"gate {gate!r} has no relaxation data (GateFamily.relaxation)")

    def sign_at(v: float) -> float:
        return float(rel.d2F_sign(torch.tensor(v, dtype=torch.float64)))

    y1, y2 = (float(optimize.brentq(sign_at, a, b, xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=200))
              for a, b in rel.inflection_brackets)
    return y1, y2


CURVATURE_MARGIN = 0.01  # the grid maxima below, raised by this relative amount
CURVATURE_STEP = 1e-3  # their grid's step on |y| ≤ 60 (beyond it the tails have decayed)


class Curvature(NamedTuple):
    """Bounds on the derivatives of F(y) = y·g(y) (f_λ(x) = x·g(λx) = F(λx)/λ, so f_λ' = F'(λx), f_λ'' = λ·F''(λx)).
    `envelope[i]` ≥ sup |F''(y)| over |y| ≥ i·CURVATURE_STEP (non-increasing; envelope[0] = C2 = sup |F''|), on the
    pieces between the kinks of F (`GateFamily.kinks`, where F' jumps): an interval that holds a kink has no bound on
    F'' at all, and its users take `slope_range` ≥ sup F' − inf F' there."""

    envelope: torch.Tensor
    slope_range: float
    kinks: tuple[float, ...] = ()


@functools.lru_cache(maxsize=None)
def curvature(gate: str = "phi") -> Curvature:
    """The maxima over a float64 grid, raised by `CURVATURE_MARGIN`: between grid points |F''| can exceed the grid's
    maximum by at most ½·step·sup|F'''| and F' its extremes by ½·step·sup|F''|, well under 1% for these gates.
    C2 = 2φ(0) ≈ 0.798 for Φ (at y = 0)."""
    n = int(round(60.0 / CURVATURE_STEP))
    with torch.enable_grad():  # callers may run under no_grad
        y = torch.linspace(-60.0, 60.0, 2 * n + 1, dtype=torch.float64, requires_grad=True)
        h = y * family(gate).g(y)
        (d1,) = torch.autograd.grad(h.sum(), y, create_graph=True)
        (d2,) = torch.autograd.grad(d1.sum(), y)
    a = d2.detach().abs()
    both = torch.maximum(a[n:], a[:n + 1].flip(0))  # |y| = i·step, either sign
    envelope = both.flip(0).cummax(0).values.flip(0) * (1 + CURVATURE_MARGIN)  # sup over |y| ≥ i·step
    d1 = d1.detach()  # autograd differentiates a clipped gate piece by piece: no spike at a kink in d1 or d2
    return Curvature(envelope, float(d1.max() - d1.min()) * (1 + CURVATURE_MARGIN), family(gate).kinks)


def sup_constant(gate: str = "phi") -> float:
    """c of sup|ReLU − f_λ| ≤ c/λ: a sound upper bound (`tail_peaks` nudges it up)."""
    return gate_bounds(gate).sup


def lambda_target(epsilon: float, criterion: str = "gate_l1", override: float = 0.0, gate: str = "phi") -> float:
    """λ_target for the gate g of x·g(λx): the smallest λ whose bound `criterion` is ≤ ε (at least 1), or the
    override when one is set (> 0)."""
    if override > 0:
        return float(override)
    if criterion not in CRITERIA:
        raise ValueError(f"unknown criterion {criterion!r}; choose one of {', '.join(CRITERIA)}")
    return max(1.0, gate_bounds(gate).lambda_for(criterion, epsilon))


# ---------------------------------------------------------------------------------------------
# Where a per-channel λ varies


def channel_axis(x: torch.Tensor) -> int:
    """Where a per-channel λ varies: dim 1 of [N, C] features and [N, C, H, W] images, the last dim of token
    sequences [B, T, C] (a transformer's features)."""
    return x.dim() - 1 if x.dim() == 3 else 1


def per_channel(p: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A [1] or [C] parameter viewed to broadcast against x along `channel_axis`."""
    if p.numel() == 1:
        return p.reshape(())
    shape = [1] * x.dim()
    shape[channel_axis(x)] = -1
    return p.view(shape)
