"""The swap certificate: how far can any logit move when every gate of a network becomes ReLU (the swap
stage)? A bound proved by walking the network's real computation, or a refusal that says why.

## The statements
S is the smooth network, R the swapped one: the same weights, with every module that
`pipeline.activations.gate_of` recognises (exactly the modules `pipeline.swap.to_relu` replaces) computing
ReLU instead of x·g(λx). S̃ and R̃ are the same two networks evaluated in float32, as deployed.

    exact, global        |R(x) − S(x)|   ≤ B             for every input x (real arithmetic)
    exact, per sample    |R(x) − S(x)|   ≤ δ(x)          on the given x
    float32, per sample  |R̃(x) − S̃(x)| ≤ δ̃(x) + ε̃(x)
    float32, global      |R̃(x) − S̃(x)| ≤ B + ρ(x) + ε̃(x)

elementwise over the logits. Where no rule below applies, the statement is refused with the reason
(`Refused` for the exact ones; the float32 ones carry their own refusal string).

## How: boxes carried through the model's own forward
The model runs on a float64 copy with its input wrapped in `_Dev`, a tensor subclass that carries beside
every value z of S one box per *channel*: a tensor d ≥ 0 with |v − z| ≤ d elementwise, v being the other
network's value at the same place. Every torch function the forward calls (F.linear, conv2d, layer_norm,
scaled_dot_product_attention, +, cat, view, ...) dispatches through `_Dev.__torch_function__`, which
computes z with the real function and each box with that function's rule; gates and the registry's other
activations are intercepted as modules. Nothing is assumed about how modules are wired: residual blocks,
linked pairs (g(z), g(−z)) concatenated, transformer blocks are whatever their forward does. A function
with no rule is a refusal, except where the box is still exactly zero (before the first gate: identical
computations on identical inputs give identical values in real arithmetic, whatever the function).

Channels (a box each): `exact` bounds |R − S| (δ, or B in the global walk); `relu32` bounds |R̃ − S| (δ̃);
`smooth32` bounds |S̃ − S| (ε̃); `relu_rounding` bounds |R̃ − R| (ρ) with the global rules, which hold
around any point, so the unknown R is never needed. Then |R̃ − S̃| ≤ δ̃ + ε̃ and ≤ |R̃ − R| + |R − S| +
|S − S̃| ≤ ρ + B + ε̃.

## The rules (d, d' input boxes; |W| elementwise absolute weights; every rule is a proof of |v' − z'| ≤ d_out)
- Linear / Conv: |W(v − z)| ≤ |W|·d. Affine ops with constants: |c|·d; a sum of two deviated tensors
  (residual add): d + d'; a product of two (per sample): |z|·d' + |z'|·d + d·d'. Reshapes, views,
  indexing, concatenation, negation, max-pooling: the same op on the box (max is 1-Lipschitz per window);
  average pooling: the same op (non-negative weights). BatchNorm (eval): |γ/√(var + eps)|·d per channel.
- Gate (swap): |ReLU(v) − f_λ(z)| ≤ |ReLU(v) − ReLU(z)| + |ReLU(z) − f_λ(z)| ≤ d + c/λ (global, c of
  `pipeline.gates`); per sample exactly max(|ReLU(z ± d) − f_λ(z)|), ReLU being monotone. A linked pair
  is cat(g(z), g(−z)): both halves get the rule, through the real cat and neg.
- Other activations h (present in both networks): L_h·d with L_h the Lipschitz constant (`ACTIVATION_RULES`);
  per sample the interval image max |h(z ± d) − h(z)| for monotone h; a jump of size J (Hardshrink, and
  torch's Softplus switching to x at βx = threshold) adds J where the interval can cross it.
- LayerNorm over D features, σ = √(var(z) + eps): per sample, with r = rms(d) ≥ |σ(v) − σ(z)| (the map
  v ↦ √(‖v − mean v‖²/D + eps) is 1/√D-Lipschitz in ℓ2) and s = max(σ − r, √eps) ≤ σ(v):
  |LN(v)_i − LN(z)_i| ≤ |γ_i|·((d_i + mean d)/s + |z_i − mean z|·r/(σ·s)). Global: the Jacobian of
  v ↦ (v − mean v)/σ(v) has spectral norm ≤ 1/σ ≤ 1/√eps, so |γ_i|·‖d‖₂/√eps.
- Attention softmax(q·kᵀ·scale)·v, per sample only (it has no global Lipschitz constant): score boxes
  e = scale·(|q|·d_kᵀ + d_q·|k|ᵀ + d_q·d_kᵀ); softmax ratios p'_j/p_j ∈ [e^{−e_j − max e}, e^{e_j + max e}],
  so |p' − p| ≤ p·(e^{e_j + max e} − 1) =: Δp; output box Δp·|v| + (p + Δp)·d_v. Causal masks are the
  same in both networks. The rule checks that the function's output is softmax(q·kᵀ·scale)·v first.

## float32 rounding (the `*32` and `relu_rounding` channels)
On top of the rules each float32 operation adds its local rounding, bounded in the standard model
fl(a ∘ b) = (a ∘ b)(1 + θ), |θ| ≤ u = 2⁻²⁴ (round to nearest, no underflow):
- a dot product of length n plus a bias, in any summation order, with or without FMA (GEMM, direct or
  im2col convolution): |fl(w·x + b) − (w·x + b)| ≤ γ_{n+1}·(|w|·|x| + |b|), γ_n = nu/(1 − nu) (Higham,
  Accuracy and Stability of Numerical Algorithms, §3.1); a sum of two: u·(|a| + |b|); a product: u·|a·b|;
  scalars given as Python floats add one more u (the constant's own rounding);
- elementwise library functions (exp, log1p, erf, tanh, sqrt) within `ULP_ELEMENTWISE` ulp; a gate
  f_λ(x) = x·g(λx) as a whole within K_GATE·u·|x| (≤ 4 roundings and g's ulp error, each at most ~u·|x| in
  absolute terms because 0 ≤ g ≤ 1, plus λ's own float32 rounding, |∂f/∂λ|·|Δλ| ≤ 0.25·|x|·2u);
- LayerNorm, BatchNorm and the softmax: the γ bounds of their sums (`_layer_norm_rounding`, `_sdpa`);
- every local term is multiplied by `SAFETY` = 2, which absorbs the float64 reference's own rounding
  (2²⁹ times smaller per operation than float32's) and slack in the ulp assumptions.
The magnitudes |x| these need are |z| + d of a channel that bounds the float32 value (|R̃| ≤ |z| + δ̃).
Assumptions stated: float32 matmuls at full precision (`torch.get_float32_matmul_precision() ==
"highest"`, checked), parameters that are float32 numbers (checked), no Winograd/FFT convolution (their
error is not bounded by γ_n; PyTorch's CPU and cuDNN defaults for these layers are direct or GEMM-based
unless benchmark mode picks otherwise). The tests measure float32 changes by sampling and by gradient
ascent on every registered model and assert they stay under δ̃ + ε̃.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pipeline import gates
from pipeline.activations import Gate, LogSigmoid, PReLU, channel_axis, gate_of, per_channel

U32 = 2.0**-24  # float32 unit roundoff
SAFETY = 2.0  # every local rounding bound, doubled (see the module docstring)
ULP_ELEMENTWISE = 4  # exp, log1p, erf, tanh, sqrt of the float32 library: within 4 ulp
K_GATE = 16  # |fl(f_λ(x)) − f_λ(x)| ≤ K_GATE·u·|x| for every gate family (module docstring)
# The statements a certificate can make, for reports.
ABOUT = {
    "global": "any input, real arithmetic",
    "per_sample": "each validation input, real arithmetic",
    "float32": "each validation input, both networks evaluated in float32 as deployed, rounding included",
    "float32_global": "each validation input in float32: the global bound plus both networks' rounding on it",
}


class Refused(Exception):
    """No bound can be proved for this model (the message says why)."""


class _NoRule(Exception):
    """One channel has no rule for one function; `_Walk` decides whether that refuses everything."""


_INJECTED: dict[str, float] = {}  # c per family given by a caller of `global_bound` (tests inject wrong ones)


def gate_constant(gate: str = "phi") -> float:
    """c with sup_z |ReLU(z) − z·g(λz)| ≤ c/λ (`pipeline.gates`, nudged up so the bound stays sound)."""
    return _INJECTED[gate] if gate in _INJECTED else gates.sup_constant(gate)


@contextlib.contextmanager
def _injected(consts: Mapping[str, float] | None):
    saved = dict(_INJECTED)
    _INJECTED.update(consts or {})
    try:
        yield
    finally:
        _INJECTED.clear()
        _INJECTED.update(saved)


def gamma(n: float) -> float:
    """γ_n = n·u/(1 − n·u) for float32 (∞ once n·u ≥ 1/2: no bound claimed)."""
    nu = n * U32
    return nu / (1.0 - nu) if nu < 0.5 else math.inf


@functools.cache
def _gate_lipschitz(gate: str) -> float:
    """sup |d/dx x·g(λx)| (the same for every λ), from the sympy derivation, nudged up."""
    from . import symbolic

    return float(symbolic.lipschitz_constant(gate).value) * (1 + 1e-9)


def _per_unit(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Broadcast a [1] (per layer) or [C] (per channel) tensor against `like` along its channel axis, the
    gates' own convention (`pipeline.activations.per_channel`: dim 1, the last dim of [B, T, C] tokens)."""
    if value.numel() > 1 and (like.dim() < 2 or like.shape[channel_axis(like)] != value.numel()):
        raise Refused(f"per-channel λ of size {value.numel()} does not match activations of shape {tuple(like.shape)}")
    return per_channel(value, like)


def _inf_for_nan(t: torch.Tensor) -> torch.Tensor:
    """A box that became NaN (0·∞) is unknown: ∞, never silently 0."""
    return torch.nan_to_num(t, nan=math.inf, posinf=math.inf, neginf=-math.inf)


# ---------------------------------------------------------------------------------------------
# Channels and the walk


@dataclass(frozen=True)
class _Channel:
    name: str
    sample: bool  # per-sample rules (use the smooth values z); else rules that hold around any point
    gate: str  # "swap": S's gate vs R's ReLU; "smooth": S̃'s gate vs S's; "relu": R̃'s ReLU vs R's
    rounding: bool  # adds float32 local rounding
    mag: int = -1  # the channel whose box bounds this channel's float32 values around z


GLOBAL_CHANNELS = (_Channel("exact", False, "swap", False),)
SAMPLE_CHANNELS = (
    _Channel("exact", True, "swap", False),
    _Channel("relu32", True, "swap", True, 1),
    _Channel("smooth32", True, "smooth", True, 2),
    _Channel("relu_rounding", False, "relu", True, 1),
)
EXACT, RELU32, SMOOTH32, RELU_ROUNDING = range(4)

# Functions that read metadata only: their result never depends on a value.
METADATA = {"shape", "ndim", "dtype", "device", "dim", "ndimension", "size", "numel", "__len__", "is_floating_point",
            "requires_grad", "is_cuda", "layout", "stride", "is_contiguous", "is_complex", "element_size", "names",
            "is_sparse", "is_quantized", "is_meta", "is_nested", "grad_fn", "is_leaf", "__format__", "__repr__",
            "data_ptr", "storage_offset", "_version", "is_mkldnn", "nelement"}


def _name(func: Callable) -> str:
    name = getattr(func, "__name__", repr(func))
    if name in ("__get__", "__set__"):  # a property of Tensor (shape, dtype, ...)
        name = getattr(getattr(func, "__self__", None), "__name__", name)
    return name


def _map(obj: Any, fn: Callable[[_Dev], Any]) -> Any:
    if isinstance(obj, _Dev):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    return obj


def _devs(obj: Any) -> list[_Dev]:
    out: list[_Dev] = []
    _map(obj, lambda d: out.append(d))
    return out


class _Dev(torch.Tensor):
    """A value z of the smooth network with one box per channel; see the module docstring."""

    value: torch.Tensor
    boxes: tuple[torch.Tensor, ...]
    walk: _Walk

    @staticmethod
    def __new__(cls, value: torch.Tensor, boxes: tuple[torch.Tensor, ...], walk: _Walk):
        t = torch.Tensor._make_subclass(cls, value)
        t.value, t.boxes, t.walk = value, boxes, walk
        return t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        devs = _devs((args, kwargs))
        plain = lambda d: d.value
        out = func(*_map(args, plain), **_map(kwargs, plain))
        name = _name(func)
        if name in METADATA or not devs:
            return out
        return devs[0].walk.apply(name, func, args, kwargs, out, devs)

    def __repr__(self) -> str:  # a _Dev in an error message
        return f"_Dev(shape={tuple(self.value.shape)})"


class _Walk:
    """One pass of `_Dev` boxes through a model: the channels, and which of them were refused where."""

    def __init__(self, channels: tuple[_Channel, ...]):
        self.channels = channels
        self.refused: dict[int, str] = {}  # channel index -> the first reason

    def zeros(self, like: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(torch.zeros(like.shape, dtype=torch.float64) for _ in self.channels)

    def wrap(self, value: torch.Tensor, boxes: list[torch.Tensor]) -> _Dev:
        return _Dev(value, tuple(_inf_for_nan(b.to(torch.float64)) for b in boxes), self)

    def fail(self, ci: int, reason: str) -> None:
        if self.channels[ci].rounding:  # only a float32 statement is lost
            self.refused.setdefault(ci, reason)
        else:
            raise Refused(reason)

    def apply(self, name: str, func: Callable, args: tuple, kwargs: dict, out: Any, devs: list[_Dev]) -> Any:
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if not all(isinstance(o, torch.Tensor) for o in outs):
            # A Python value read out of a tensor (item, bool, tolist): the forward may branch on it.
            moved = any(bool((d.boxes[ci] != 0).any()) for d in devs for ci in range(len(self.channels)))
            if moved or not self.channels[0].sample:
                raise Refused(f"the forward reads a value out of a tensor (`{name}`): its control flow may depend on the "
                              "input" + ("" if not moved else " and differ between the networks") + ", so no bound is proved")
            return out
        rule = RULES.get(name)
        boxes: list[list[torch.Tensor]] = []
        for ci, ch in enumerate(self.channels):
            if not ch.rounding and all(not bool(d.boxes[ci].any()) for d in devs):
                b = [torch.zeros(o.shape, dtype=torch.float64) for o in outs]  # identical computations, identical values
            elif ci in self.refused:
                b = [torch.full(o.shape, math.inf, dtype=torch.float64) for o in outs]
            else:
                try:
                    if rule is None:
                        raise _NoRule(f"no rule for the torch function `{name}` on a tensor that differs between the networks "
                                      "(after a gate, or with float32 rounding)")
                    r = rule(_Call(self, ci, ch, name, func, args, kwargs, out))
                    b = list(r) if isinstance(r, (tuple, list)) else [r]
                    b = [torch.broadcast_to(x, o.shape) for x, o in zip(b, outs)]
                except _NoRule as exc:
                    self.fail(ci, str(exc))
                    b = [torch.full(o.shape, math.inf, dtype=torch.float64) for o in outs]
            boxes.append(b)
        wrapped = [self.wrap(o, [boxes[ci][j] for ci in range(len(self.channels))]) for j, o in enumerate(outs)]
        return type(out)(wrapped) if isinstance(out, (tuple, list)) else wrapped[0]


@dataclass
class _Call:
    """One torch function call as one channel's rule sees it."""

    walk: _Walk
    ci: int
    ch: _Channel
    name: str
    func: Callable
    args: tuple
    kwargs: dict
    out: Any

    def box(self, a: Any) -> torch.Tensor:
        """The box of an argument in this channel: 0 for a constant (a parameter, a number)."""
        if isinstance(a, _Dev):
            return a.boxes[self.ci]
        if isinstance(a, torch.Tensor):
            return torch.zeros(a.shape, dtype=torch.float64)
        return torch.zeros((), dtype=torch.float64)

    def value(self, a: Any) -> Any:
        return a.value if isinstance(a, _Dev) else a

    def mag(self, a: Any) -> torch.Tensor:
        """A bound on |a| as this channel's float32 network holds it."""
        if isinstance(a, _Dev):
            return a.value.abs().to(torch.float64) + a.boxes[self.ch.mag]
        if isinstance(a, torch.Tensor):
            return a.detach().abs().to(torch.float64)
        return torch.tensor(abs(float(a)), dtype=torch.float64)

    def bind(self, names: tuple[str, ...], defaults: dict[str, Any]) -> dict[str, Any]:
        """Positional and keyword arguments by name (the functional signature of the op)."""
        out = dict(defaults)
        out.update(zip(names, self.args))
        out.update(self.kwargs)
        return out


# ---------------------------------------------------------------------------------------------
# Rules for torch functions


def _structural(c: _Call):
    """The op copies, rearranges or broadcasts entries: applied to the box, it is the box (exact in float)."""
    first = c.args[0]
    if isinstance(first, (list, tuple)):  # cat / stack of a sequence
        first = type(first)(c.box(a) for a in first)
    else:
        first = c.box(first)
    return c.func(first, *_map(c.args[1:], c.value), **_map(c.kwargs, c.value))


def _same(c: _Call):
    return c.box(c.args[0])


def _add(c: _Call, alpha_pos: int = 2):
    a, b = c.args[0], c.args[1]
    alpha = c.kwargs.get("alpha", c.args[alpha_pos] if len(c.args) > alpha_pos else 1)
    box = c.box(a) + abs(alpha) * c.box(b)
    if c.ch.rounding:  # one rounding of the sum; Python-number operands and alpha add their own
        box = box + SAFETY * 2 * U32 * (c.mag(a) + abs(alpha) * c.mag(b))
    return box


def _mul(c: _Call):
    a, b = c.args[0], c.args[1]
    if isinstance(a, _Dev) and isinstance(b, _Dev):
        if not c.ch.sample:
            raise _NoRule("a product of two tensors that both differ between the networks has no global bound")
        da, db = c.box(a), c.box(b)
        box = a.value.abs() * db + b.value.abs() * da + da * db
    else:
        x, k = (a, b) if isinstance(a, _Dev) else (b, a)
        box = c.mag(k) * c.box(x)
    if c.ch.rounding:
        box = box + SAFETY * 2 * U32 * c.mag(a) * c.mag(b)
    return box


def _div(c: _Call):
    a, b = c.args[0], c.args[1]
    if isinstance(b, _Dev) or c.name in ("__rtruediv__", "__rdiv__"):
        raise _NoRule("division by a tensor that differs between the networks")
    if c.kwargs.get("rounding_mode") is not None:
        raise _NoRule("rounded division is not continuous")
    box = c.box(a) / c.mag(b)
    if c.ch.rounding:
        box = box + SAFETY * 2 * U32 * c.mag(a) / c.mag(b)
    return box


def _weights(c: _Call, w: Any, b: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    if isinstance(w, _Dev) or isinstance(b, _Dev):
        raise _NoRule(f"`{c.name}` with weights computed from the input")
    return w.detach().abs().to(torch.float64), None if b is None else b.detach().abs().to(torch.float64)


def _linear(c: _Call):
    p = c.bind(("input", "weight", "bias"), {"bias": None})
    w, b = _weights(c, p["weight"], p["bias"])
    box = F.linear(c.box(p["input"]), w)
    if c.ch.rounding:
        local = F.linear(c.mag(p["input"]), w) + (0 if b is None else b)
        box = box + SAFETY * gamma(w.shape[-1] + 1) * local
    return box


def _conv(c: _Call):
    p = c.bind(("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
               {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1})
    w, b = _weights(c, p["weight"], p["bias"])
    conv = lambda t: c.func(t, w, None, p["stride"], p["padding"], p["dilation"], p["groups"])
    box = conv(c.box(p["input"]))
    if c.ch.rounding:
        local = conv(c.mag(p["input"])) + (0 if b is None else b.view(1, -1, *([1] * (w.dim() - 2))))
        box = box + SAFETY * gamma(w[0].numel() + 1) * local
    return box


def _pad(c: _Call):
    p = c.bind(("input", "pad", "mode", "value"), {"mode": "constant", "value": None})
    if p["mode"] == "constant":
        box = F.pad(c.box(p["input"]), p["pad"], "constant", 0.0)
        if c.ch.rounding and p["value"]:  # the pad value as a float32 number
            box = box + F.pad(torch.zeros_like(c.box(p["input"])), p["pad"], "constant", SAFETY * U32 * abs(p["value"]))
        return box
    return F.pad(c.box(p["input"]), p["pad"], p["mode"])  # reflect / replicate / circular: copies of entries


def _batch_norm(c: _Call):
    p = c.bind(("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps"),
               {"weight": None, "bias": None, "training": False, "momentum": 0.1, "eps": 1e-5})
    if p["training"] or p["running_var"] is None:
        raise _NoRule("BatchNorm in training mode (batch statistics couple the samples)")
    x, rv = p["input"], p["running_var"].detach().to(torch.float64)
    w = torch.ones_like(rv) if p["weight"] is None else p["weight"].detach().to(torch.float64)
    scale = w / torch.sqrt(rv + p["eps"])
    shape = (1, -1, *([1] * (c.value(x).dim() - 2)))
    box = c.box(x) * scale.abs().view(shape)
    if c.ch.rounding:  # α = γ/√(var + eps) and β = b − μ·α (≤ 3 roundings each), then x·α + β (2)
        b = torch.zeros_like(rv) if p["bias"] is None else p["bias"].detach().to(torch.float64)
        mu = p["running_mean"].detach().to(torch.float64)
        local = c.mag(x) * scale.abs().view(shape) + ((mu * scale).abs() + b.abs()).view(shape)
        box = box + SAFETY * 8 * U32 * local
    return box


def _layer_norm_rounding(M: torch.Tensor, C: torch.Tensor, s_lo: torch.Tensor, s_hi: torch.Tensor, D: int, dims: tuple,
                         w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    """float32 LayerNorm of an input with |x| ≤ M, |x − mean x| ≤ C, σ(x) ∈ [s_lo, s_hi]: mean (γ_{D+1}),
    centering (one more u), variance (γ of its D-term sum, and the centering errors squared), √ and the
    normalisation (≤ 3u), γ·x̂ + β (2u)."""
    mean = lambda t: t.mean(dim=dims, keepdim=True)
    e_c = gamma(D + 2) * (M + mean(M))  # |ĉ − c|
    e_sq = mean(e_c * (2 * C + e_c))  # |mean(ĉ²) − mean(c²)|
    e_v = e_sq + gamma(D + 2) * (s_hi**2 + e_sq)
    s_hat = torch.sqrt(torch.clamp(s_lo**2 - e_v, min=eps)) * (1 - 2 * U32)  # σ̂ ≥ s_hat
    e_s = e_v / (s_lo + s_hat) + 2 * U32 * (s_hi + e_v / (s_lo + s_hat))  # |σ̂ − σ|
    norm = e_c / s_hat + C * e_s / (s_lo * s_hat) + 3 * U32 * (C + e_c) / s_hat
    return SAFETY * (w * norm + 2 * U32 * (w * (C + e_c) / s_hat + b))


def _layer_norm(c: _Call):
    p = c.bind(("input", "normalized_shape", "weight", "bias", "eps"), {"weight": None, "bias": None, "eps": 1e-5})
    x, eps = p["input"], float(p["eps"])
    dims = tuple(range(-len(p["normalized_shape"]), 0))
    D = math.prod(p["normalized_shape"])
    mean = lambda t: t.mean(dim=dims, keepdim=True)
    w, b = _weights(c, torch.ones(()) if p["weight"] is None else p["weight"], torch.zeros(()) if p["bias"] is None else p["bias"])
    d = c.box(x)
    if c.ch.sample:
        z = c.value(x).to(torch.float64)
        cz = z - mean(z)
        sigma = torch.sqrt(mean(cz**2) + eps)
        r = torch.sqrt(mean(d**2))
        s_lo = torch.clamp(sigma - r, min=math.sqrt(eps))
        box = w * ((d + mean(d)) / s_lo + cz.abs() * r / (sigma * s_lo))
        C, s_hi = cz.abs() + d + mean(d), sigma + r
    else:
        box = w * torch.sqrt((d**2).sum(dim=dims, keepdim=True)) / math.sqrt(eps)
        M = c.mag(x) if c.ch.rounding else None
        s_lo = torch.full_like(mean(d), math.sqrt(eps))
        C = None if M is None else M + mean(M)
        s_hi = None if M is None else torch.sqrt(mean(M**2) + eps)
    if c.ch.rounding:
        box = box + _layer_norm_rounding(c.mag(x), C, s_lo, s_hi, D, dims, w, b if b is not None else 0, eps)
    return box


def _dropout(c: _Call):
    p = c.bind(("input", "p", "training", "inplace"), {"p": 0.5, "training": True, "inplace": False})
    if p["training"] and p["p"] > 0:
        raise _NoRule("dropout in training mode is random")
    return c.box(p["input"])


def _pool_same(c: _Call):
    """Max-pooling: |max(v) − max(z)| ≤ max over the window of d: the op itself on the box."""
    if isinstance(c.out, (tuple, list)):
        raise _NoRule("pooling indices are not continuous")
    return c.func(c.box(c.args[0]), *_map(c.args[1:], c.value), **_map(c.kwargs, c.value))


def _avg_pool(c: _Call):
    """Average pooling: non-negative weights, the op on the box; rounding of ≤ (spatial size) terms."""
    op = lambda t: c.func(t, *_map(c.args[1:], c.value), **_map(c.kwargs, c.value))
    box = op(c.box(c.args[0]))
    if c.ch.rounding:
        x = c.value(c.args[0])
        box = box + SAFETY * gamma(math.prod(x.shape[2:]) + 1) * op(c.mag(c.args[0]))
    return box


def _embedding(c: _Call):
    if bool(c.box(c.args[0]).any()):
        raise _NoRule("embedding lookups with indices that differ between the networks")
    return torch.zeros(c.out.shape, dtype=torch.float64)  # a lookup copies float32 weights: exact


def _sdpa(c: _Call):
    """softmax(q·kᵀ·scale + mask)·v, per sample (module docstring); float32: the scores' dot products,
    the subtraction of the row maximum, exp and the normalising sum (κ), and the p·v sums."""
    if not c.ch.sample:
        raise _NoRule("softmax attention has no global Lipschitz bound (it is not Lipschitz on unbounded inputs); "
                      "only the per-sample certificate covers attention")
    p = c.bind(("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"),
               {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False})
    if p["attn_mask"] is not None or p["dropout_p"] > 0 or p["enable_gqa"]:
        raise _NoRule("scaled_dot_product_attention with an explicit mask, dropout or grouped heads")
    q, k, v = (c.value(p[n]).to(torch.float64) for n in ("query", "key", "value"))
    dq, dk, dv = (c.box(p[n]) for n in ("query", "key", "value"))
    E, Lq, Lk = q.shape[-1], q.shape[-2], k.shape[-2]
    scale = p["scale"] if p["scale"] is not None else 1.0 / math.sqrt(E)
    allowed = torch.ones(Lq, Lk, dtype=torch.bool).tril() if p["is_causal"] else torch.ones(Lq, Lk, dtype=torch.bool)
    s = (q @ k.transpose(-2, -1)) * scale
    P = torch.softmax(s.masked_fill(~allowed, -math.inf), dim=-1)
    ref = P @ v
    if not torch.allclose(ref, c.out.to(torch.float64), rtol=1e-9, atol=1e-12 * (1 + float(v.abs().max()))):
        raise _NoRule("scaled_dot_product_attention's output is not softmax(q·kᵀ·scale)·v here")
    e = scale * (q.abs() @ dk.transpose(-2, -1) + dq @ k.abs().transpose(-2, -1) + dq @ dk.transpose(-2, -1))
    kappa = 0.0
    if c.ch.rounding:
        Mq, Mk = c.mag(p["query"]), c.mag(p["key"])
        e = e + SAFETY * gamma(E + 2) * scale * (Mq @ Mk.transpose(-2, -1))
        top = (s.abs() + e).masked_fill(~allowed, 0).amax(dim=-1, keepdim=True)
        e = e + SAFETY * 2 * U32 * (s.abs() + e + top)  # s − max s, rounded, is exp's argument
        kappa = SAFETY * (gamma(Lk + 1) + (ULP_ELEMENTWISE + 4) * U32)  # exp, the sum, the division, online rescaling
    e = e.masked_fill(~allowed, 0)
    grow = torch.exp(e + e.amax(dim=-1, keepdim=True))
    dP = torch.where(allowed, _inf_for_nan(P * (grow * (1 + kappa) - 1)), torch.zeros_like(P))
    box = dP @ v.abs() + (P + dP) @ dv
    if c.ch.rounding:
        box = box + SAFETY * gamma(Lk + 1) * ((P + dP) @ c.mag(p["value"]))
    return box


_STRUCTURAL = ("flatten", "view", "reshape", "transpose", "permute", "contiguous", "expand", "expand_as", "unsqueeze",
               "squeeze", "__getitem__", "select", "narrow", "clone", "detach", "unbind", "chunk", "split", "t", "movedim",
               "unflatten", "cat", "concat", "concatenate", "stack", "repeat", "tile", "broadcast_to", "view_as", "reshape_as",
               "swapaxes", "flip", "roll")
RULES: dict[str, Callable[[_Call], Any]] = {
    **{n: _structural for n in _STRUCTURAL},
    **{n: _same for n in ("neg", "negative", "__neg__", "positive", "__pos__")},
    **{n: _add for n in ("add", "__add__", "__radd__", "sub", "__sub__", "__rsub__", "rsub", "subtract")},
    **{n: _mul for n in ("mul", "__mul__", "__rmul__", "multiply")},
    **{n: _div for n in ("div", "__truediv__", "true_divide", "divide", "__rtruediv__", "__rdiv__")},
    "linear": _linear,
    **{n: _conv for n in ("conv1d", "conv2d", "conv3d")},
    "pad": _pad,
    "batch_norm": _batch_norm,
    "layer_norm": _layer_norm,
    **{n: _dropout for n in ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")},
    **{n: _pool_same for n in ("max_pool1d", "max_pool2d", "max_pool3d", "adaptive_max_pool1d", "adaptive_max_pool2d",
                               "adaptive_max_pool3d")},
    **{n: _avg_pool for n in ("avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
                              "adaptive_avg_pool3d")},
    "embedding": _embedding,
    "scaled_dot_product_attention": _sdpa,
}


# ---------------------------------------------------------------------------------------------
# Gates and the other activations, as modules


def _gate_forward(fam: str, lam: torch.Tensor, orig: Callable, x: Any) -> Any:
    if not isinstance(x, _Dev):
        return orig(x)
    walk, z = x.walk, x.value
    y = orig(z)
    boxes = []
    for ci, ch in enumerate(walk.channels):
        d = x.boxes[ci]
        if ch.gate == "swap" and ch.sample:  # R's ReLU on [z − d, z + d] against S's value: monotone, exact image
            b = torch.maximum((F.relu(z - d) - y).abs(), (F.relu(z + d) - y).abs())
        elif ch.gate == "swap":
            b = d + _per_unit(gate_constant(fam) / lam, d)
        elif ch.gate == "smooth":  # S̃'s gate at ṽ vs S's at z: Lipschitz, plus its float32 evaluation
            b = _gate_lipschitz(fam) * d + SAFETY * K_GATE * U32 * (z.abs() + d)
        else:  # R̃ vs R: ReLU on both sides, 1-Lipschitz and exact in float
            b = d
        boxes.append(b)
    return walk.wrap(y, boxes)


@dataclass(frozen=True)
class ActivationRule:
    """What the certificate knows of an activation h that both networks keep (not a gate)."""

    lipschitz: Callable[[nn.Module], float | torch.Tensor]  # sup |h'| (per channel for PReLU)
    monotone: Callable[[nn.Module], bool]  # non-decreasing: the per-sample rule uses the interval image
    ulps: int = 0  # float32 evaluation error ≤ ulps·u·(|h| + |x| + const); 0 for exact ones (max, clamp)
    const: Callable[[nn.Module], float] = lambda m: 0.0
    jumps: Callable[[nn.Module], list[tuple[float, float]]] = lambda m: []


def _slope(m: nn.Module) -> float:
    return (m.lower + m.upper) / 2  # RReLU in eval


SELU_SCALE_ALPHA = 1.0507009873554804934193349852946 * 1.6732632423543772848170429916717
ACTIVATION_RULES: dict[type[nn.Module], ActivationRule] = {
    nn.ReLU: ActivationRule(lambda m: 1.0, lambda m: True),
    nn.ReLU6: ActivationRule(lambda m: 1.0, lambda m: True),
    nn.Hardtanh: ActivationRule(lambda m: 1.0, lambda m: True),
    nn.LeakyReLU: ActivationRule(lambda m: max(1.0, abs(m.negative_slope)), lambda m: m.negative_slope >= 0, ulps=1),
    nn.PReLU: ActivationRule(lambda m: torch.clamp(m.weight.detach().abs().to(torch.float64), min=1.0),
                             lambda m: bool((m.weight >= 0).all()), ulps=1),
    PReLU: ActivationRule(lambda m: torch.clamp(m.weight.detach().abs().to(torch.float64), min=1.0),
                          lambda m: bool((m.weight >= 0).all()), ulps=1),  # slopes on the channel axis of tokens
    nn.RReLU: ActivationRule(lambda m: max(1.0, abs(_slope(m))), lambda m: _slope(m) >= 0, ulps=1),
    nn.ELU: ActivationRule(lambda m: max(1.0, abs(m.alpha)), lambda m: m.alpha >= 0, ULP_ELEMENTWISE + 2, lambda m: abs(m.alpha)),
    nn.CELU: ActivationRule(lambda m: 1.0, lambda m: True, ULP_ELEMENTWISE + 3, lambda m: abs(m.alpha)),  # e^{x/α} ≤ 1 for x < 0
    nn.SELU: ActivationRule(lambda m: SELU_SCALE_ALPHA, lambda m: True, ULP_ELEMENTWISE + 3, lambda m: SELU_SCALE_ALPHA),
    # x·1{|x| > λ}: 1-Lipschitz between its jumps of size λ at ±λ
    nn.Hardshrink: ActivationRule(lambda m: 1.0, lambda m: False, 0, jumps=lambda m: [(-m.lambd, m.lambd), (m.lambd, m.lambd)]),
    nn.Softshrink: ActivationRule(lambda m: 1.0, lambda m: True, 1, lambda m: m.lambd),
    # torch switches to x where βx > threshold: a jump of log1p(e^{−threshold})/β there (≈ 2e-9 at the defaults)
    nn.Softplus: ActivationRule(lambda m: 1.0, lambda m: False, ULP_ELEMENTWISE + 2, lambda m: 1.0 / m.beta,
                                jumps=lambda m: [(m.threshold / m.beta, math.log1p(math.exp(-m.threshold)) / m.beta)]),
    nn.Hardsigmoid: ActivationRule(lambda m: 1 / 6, lambda m: True, 2, lambda m: 0.5),
    nn.Hardswish: ActivationRule(lambda m: 1.5, lambda m: False, 4),  # (2x + 3)/6 at x → 3⁻
    nn.Sigmoid: ActivationRule(lambda m: 0.25, lambda m: True, ULP_ELEMENTWISE + 2, lambda m: 1.0),
    nn.Tanh: ActivationRule(lambda m: 1.0, lambda m: True, ULP_ELEMENTWISE + 2, lambda m: 1.0),
    nn.Tanhshrink: ActivationRule(lambda m: 1.0, lambda m: True, ULP_ELEMENTWISE + 3, lambda m: 1.0),  # h' = tanh² ≤ 1
    nn.Softsign: ActivationRule(lambda m: 1.0, lambda m: True, 4),
    nn.LogSigmoid: ActivationRule(lambda m: 1.0, lambda m: True, ULP_ELEMENTWISE + 3, lambda m: 1.0),
    LogSigmoid: ActivationRule(lambda m: 1.0, lambda m: True, ULP_ELEMENTWISE + 3, lambda m: 1.0),
}


def _activation_forward(rule: ActivationRule, m: nn.Module, orig: Callable, x: Any) -> Any:
    if not isinstance(x, _Dev):
        return orig(x)
    walk, z = x.walk, x.value
    y = orig(z)
    lip = rule.lipschitz(m)
    lip = _per_unit(lip, z) if isinstance(lip, torch.Tensor) else lip
    boxes = []
    for ci, ch in enumerate(walk.channels):
        d = x.boxes[ci]
        if ch.sample and rule.monotone(m):
            b = torch.maximum((orig(z + d) - y).abs(), (orig(z - d) - y).abs())
        else:
            b = lip * d
        for at, size in rule.jumps(m):
            crosses = (z - d <= at) & (at <= z + d) if ch.sample else d > 0
            b = b + size * (crosses & (d > 0)).to(torch.float64)
        if ch.rounding and rule.ulps:
            b = b + SAFETY * rule.ulps * U32 * (y.abs() + b + z.abs() + d + rule.const(m))
        boxes.append(b)
    return walk.wrap(y, boxes)


def _intercept(net: nn.Module) -> None:
    """Gates and the registry's other activations compute their boxes as modules (instance forwards)."""
    for name, m in net.named_modules():
        g = gate_of(m)
        if g is not None:
            if isinstance(m, Gate) and type(m.to_relu()) is not nn.ReLU:
                raise Refused(f"the swap turns {name or 'the root'} ({type(m).__name__}) into {type(m.to_relu()).__name__}, not ReLU")
            m.forward = functools.partial(_gate_forward, g[0], g[1], m.forward)
        elif type(m) in ACTIVATION_RULES:
            if isinstance(m, nn.RReLU) and m.training:
                raise Refused(f"{name}: RReLU in training mode is random")
            m.forward = functools.partial(_activation_forward, ACTIVATION_RULES[type(m)], m, m.forward)
        elif isinstance(m, nn.GELU):  # approximate="tanh": gate_of does not count it, so the swap keeps it
            pass  # both networks keep it; its torch function has no rule, so it refuses once it sees a box


# ---------------------------------------------------------------------------------------------
# The certificate


@dataclass
class SwapBound:
    """Bounds on |logit_ReLU − logit_smooth|, elementwise.

    per_logit: the exact-arithmetic bound, [K] (global: every input) or [N, K] (per sample).
    float32: [N, K], per sample only: the bound on the float32 networks' change (δ̃ + ε̃), or None with the
      reason in `float32_refused`.
    rounding: [N, K], per sample only: ρ + ε̃, what a global exact bound needs added to hold in float32 on
      these inputs, or None with the reason in `rounding_refused`.
    layers: after each module, its name, type and the largest exact box so far.
    """

    per_logit: torch.Tensor
    max: float
    layers: list[dict[str, Any]] = field(default_factory=list)
    float32: torch.Tensor | None = None
    float32_refused: str | None = None
    rounding: torch.Tensor | None = None
    rounding_refused: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"per_logit": self.per_logit.tolist(), "max": self.max, "layers": self.layers}


def _float32_premise(model: nn.Module) -> str | None:
    """Why float32 statements cannot be made for this model, or None."""
    if torch.get_float32_matmul_precision() != "highest":
        return f"float32 matmuls run at precision {torch.get_float32_matmul_precision()!r} (TF32/bf16), not full float32"
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.is_floating_point() and not torch.equal(t.detach().float().to(t.dtype), t.detach()):
            return f"{name} holds values that are not float32 numbers: the float32 network is a different function"
    return None


class Certifier:
    """Builds the float64 walking copy of `model` once; `global_bound` and `per_sample` reuse it.

    `model` is not changed. Modules run in eval mode (dropout off, BatchNorm on running statistics).
    """

    def __init__(self, model: nn.Module):
        self.net = copy.deepcopy(model).to(torch.float64).eval()
        _intercept(self.net)
        self.float32_premise = _float32_premise(model)
        self.records: list[dict[str, Any]] | None = None
        for name, m in self.net.named_modules():
            if not list(m.children()) or gate_of(m) is not None:
                m.register_forward_hook(functools.partial(self._record, name))

    def _record(self, name: str, module: nn.Module, inputs: Any, output: Any) -> None:
        if self.records is not None and isinstance(output, _Dev):
            self.records.append({"name": name, "type": type(module).__name__, "max_deviation": float(output.boxes[EXACT].max())})

    def _walk(self, x: torch.Tensor, channels: tuple[_Channel, ...]) -> tuple[_Dev, _Walk, list[dict[str, Any]]]:
        walk = _Walk(channels)
        value = x.detach().to(torch.float64) if x.is_floating_point() else x.detach()
        self.records = []
        try:
            with torch.no_grad():
                out = self.net(walk.wrap(value, list(walk.zeros(value))))
        finally:
            layers, self.records = self.records, None
        if not isinstance(out, _Dev):
            raise Refused(f"the model's output ({type(out).__name__}) is not computed from its input by torch functions")
        return out, walk, layers

    def global_bound(self, example: torch.Tensor, gate_constants: Mapping[str, float] | None = None) -> SwapBound:
        """B with |R(x) − S(x)| ≤ B for every input shaped like `example` [1, ...] (only its shape and dtype
        are used: no rule reads a value in this walk)."""
        with _injected(gate_constants):
            out, _, layers = self._walk(example[:1], GLOBAL_CHANNELS)
        per_logit = out.boxes[EXACT].reshape(-1)
        return SwapBound(per_logit=per_logit, max=float(per_logit.max()), layers=layers)

    def per_sample(self, x: torch.Tensor) -> SwapBound:
        """δ(x) (exact), δ̃ + ε̃ (float32) and ρ + ε̃ (rounding beside a global bound) for a batch x [N, ...]."""
        out, walk, layers = self._walk(x, SAMPLE_CHANNELS)
        flat = lambda t: t.reshape(t.shape[0], -1)
        exact = flat(out.boxes[EXACT])
        bound = SwapBound(per_logit=exact, max=float(exact.max()), layers=layers)
        premise = self.float32_premise
        reason = lambda *cs: premise or next((walk.refused[c] for c in cs if c in walk.refused), None)
        bound.float32_refused = reason(RELU32, SMOOTH32)
        if bound.float32_refused is None:
            bound.float32 = flat(out.boxes[RELU32] + out.boxes[SMOOTH32])
        bound.rounding_refused = reason(RELU_ROUNDING, SMOOTH32)
        if bound.rounding_refused is None:
            bound.rounding = flat(out.boxes[RELU_ROUNDING] + out.boxes[SMOOTH32])
        return bound


def swap_bound(model: nn.Module, input_shape: tuple[int, ...], gate_constants: Mapping[str, float] | None = None,
               example: torch.Tensor | None = None) -> SwapBound:
    """Input-independent exact bound (raises `Refused`). `example` gives the input dtype (token ids are
    integers); otherwise a float input of `input_shape`."""
    ex = example if example is not None else torch.zeros((1, *input_shape), dtype=torch.float64)
    return Certifier(model).global_bound(ex, gate_constants)


def swap_bound_per_sample(model: nn.Module, x: torch.Tensor, gate_constants: Mapping[str, float] | None = None) -> SwapBound:
    """Per-sample bounds on `x` [N, ...] (raises `Refused`); see `Certifier.per_sample`."""
    del gate_constants  # the per-sample rule uses the gates' own outputs, not c
    return Certifier(model).per_sample(x)


def certified_mask(logits: torch.Tensor, bound: torch.Tensor | float) -> torch.Tensor:
    """[N] bool: the top-1 class cannot change when each logit moves by at most `bound`.

    `bound` is a scalar, [K] or [N, K]. Sample n is certified when, with t its top class,
    logit_t − logit_j > bound_t + bound_j for every j ≠ t (for a scalar bound: margin > 2·bound).
    Language models' [N, T, V] logits count every position as a sample.
    """
    logits = logits.detach().to(torch.float64)
    logits = logits.reshape(-1, logits.shape[-1])
    b = torch.as_tensor(bound, dtype=torch.float64)
    b = b.reshape(-1, logits.shape[-1]) if b.dim() > 1 else b
    b = b.expand_as(logits)
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
