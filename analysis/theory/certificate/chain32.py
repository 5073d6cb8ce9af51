"""Float32 rounding of a chain network carried through its own Jacobian at each sample: |S̃ − S| and |R̃ − R|.

The box channels of the walk (`interpreter.py`) carry a rounding error e through a linear layer as |W|·|e|, which
compounds by ‖|W|‖ per layer (about 15× per 256-wide layer of the default MLP): on the default run the float32
bound is ≥ 17 while the real-arithmetic bound is 0.07. Here the errors keep their signs through the layers.

For a chain x → Normalize? → Flatten? → (Linear → σ)* → Linear, with u_l the exact pre-activations of layer l and
ũ_l the float32 ones, the error e_l = ũ_l − u_l obeys

    e_{l+1} = W_{l+1}·(σ(ũ_l) − σ(u_l) + s_l) + r_{l+1}
    σ(ũ_l) − σ(u_l) = D_l·e_l + q_l

where r is the affine op's rounding (|r| ≤ γ_{n+1}·(|W|·|h̃| + |b|), any summation order), s the activation's own
evaluation error, D_l a diagonal slope and q a remainder:
- a smooth gate f_λ(x) = x·g(λx): D = f'(u) and, ξ lying between u and ũ,
  |q| = |f'(ξ) − f'(u)|·|e| ≤ min(½·sup|f''|·ē², (sup f' − inf f')·ē), sup|f''| taken over [u − ē, u + ē]:
  λ·F''-envelope at λ·(|u| − ē) when that interval excludes 0, λ·C2 otherwise (`gates.curvature`: f'' is
  exponentially small away from 0, and large, λ·C2, only within a few 1/λ of it; where λ·[u − ē, u + ē] holds a
  kink of F, a jump of F' (a clipped gate such as hardsigmoid), only the first-order term); |s| ≤ K_GATE·u·|ũ| + UNDERFLOW
  (`core.K_GATE`, the walk's gate rule);
- ReLU, exact in float: a unit with |u| > ē cannot change side (D = its 0/1 slope, q = 0); one that can gets the
  slope ½ and |q| ≤ ½·ē (the true slope of ReLU between u and ũ lies in [0, 1]).
The terms entering at layer l (W·(q + s) + r) form one source ν_l with |ν_l| ≤ |W|·(q̄ + s̄) + r̄, taken in absolute
value once; the sources are then carried exactly: e_L = Σ_k P_{k→L}·ν_k, P_{k→l} = W_l·D_{l−1}···W_{k+1}·D_k, so
|e_L| ≤ Σ_k |P_{k→L}|·ν̄_k. Every bound ē_l needed on the way (the remainders, which units can flip, |ũ|) comes
from the same sum. Every local term is multiplied by `core.SAFETY`, as in the walk, except r (`pipeline.numerics.dot_error`).

The statement covers the float32 forward of these modules in PyTorch on the CPU (GEMM-based Linear, full-precision
float32 matmuls: the walk's premise). Models that are not such a chain get None: the walk's bound stands alone.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from pipeline.activations import gate_of
from pipeline.gates import CURVATURE_STEP, curvature
from pipeline.models import Normalize

from .core import SAFETY, U32, dot_error, gate_rounding

CHUNK = 100  # samples per pass: the P matrices are [chunk, width, width] float64


def chain(model: nn.Module) -> list[tuple[str, nn.Module]] | None:
    """The model's layers as ("norm" | "flatten" | "linear" | "gate" | "relu", module), or None when it is not a chain
    of these ending in a Linear."""
    if not isinstance(model, nn.Sequential):
        return None
    out: list[tuple[str, nn.Module]] = []
    for m in model:
        if isinstance(m, Normalize):
            kind = "norm"
        elif isinstance(m, nn.Flatten):
            kind = "flatten"
        elif isinstance(m, nn.Linear):
            kind = "linear"
        elif gate_of(m) is not None:
            kind = "gate"
        elif type(m) is nn.ReLU:
            kind = "relu"
        else:
            return None
        out.append((kind, m))
    kinds = [k for k, _ in out]
    if "linear" not in kinds or kinds[-1] != "linear":
        return None
    first = kinds.index("linear")
    if any(k in ("norm", "flatten") for k in kinds[first:]) or any(k in ("gate", "relu") for k in kinds[:first]):
        return None  # the input transforms first, then Linear layers and activations
    if kinds.count("norm") > 1:
        return None  # the input's rounding is modelled for one normalization
    if any(a in ("gate", "relu") and b in ("gate", "relu") for a, b in zip(kinds, kinds[1:])):
        return None  # two activations in a row: not this chain
    return out


def rounding_bound(model: nn.Module, x: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor | None:
    """[N, K] on the CPU: a bound on |fl32(model)(x) − model(x)| per logit (model evaluated exactly vs in float32 by
    PyTorch on the CPU), or None when `model` is not a chain `chain` reads. The bound's own float64 arithmetic (batched
    [CHUNK, width, width] products) runs on `device`: a GPU does it in a fraction of the CPU's time."""
    layers = chain(model)
    if layers is None:
        return None
    net = [(k, copy.deepcopy(m).to(device, torch.float64).eval()) for k, m in layers]
    return torch.cat([_bound(net, x[i:i + CHUNK].detach().to(device, torch.float64)).cpu() for i in range(0, len(x), CHUNK)])


def _bound(net: list[tuple[str, nn.Module]], h: torch.Tensor) -> torch.Tensor:
    n = h.shape[0]
    hbar = torch.zeros_like(h)  # bound on |h̃ − h| before the first Linear (the normalization's rounding)
    # sources (P, ν̄): e = Σ P·ν with |ν| ≤ ν̄; P [N, width, n_k], None for the identity (a source of this layer)
    sources: list[tuple[torch.Tensor | None, torch.Tensor]] = []
    slope: torch.Tensor | None = None  # D of the last activation, [N, width]; None right after a Linear
    pending = ebar = u = None  # (|q| + |s|) bound of the last activation; ē on the current pre-activations
    for kind, m in net:
        if kind == "norm":
            y = h * m.scale + m.shift
            # fl(fl(x·scale) + shift): u·|x·scale| + u·|result|, each rounding once, doubled
            hbar = SAFETY * U32 * (2 * (h * m.scale).abs() + m.shift.abs().expand_as(y))
            h = y
        elif kind == "flatten":
            h, hbar = h.reshape(n, -1), hbar.reshape(n, -1)
        elif kind == "linear":
            w = m.weight
            b = m.bias if m.bias is not None else w.new_zeros(m.out_features)
            if not sources:  # the first Linear: its input's error enters as one source, through |W| once
                dev_h, nu = hbar, hbar @ w.abs().T
            else:
                if slope is None:  # a Linear right after a Linear: the identity in between
                    slope, pending = torch.ones_like(h), torch.zeros_like(h)
                dev_h = slope.abs() * ebar + pending  # |h̃ − h| ≤ |D|·ē + q̄ + s̄
                wd = w.unsqueeze(0) * slope.unsqueeze(1)  # W·D per sample, [N, out, width]
                sources = [(wd if p is None else wd @ p, nb) for p, nb in sources]
                nu = pending @ w.abs().T
            r = dot_error(m.in_features + 1, (h.abs() + dev_h) @ w.abs().T + b.abs())  # the products and the bias
            sources.append((None, nu + r))
            ebar = _ebar(sources)
            u = h @ w.T + b
            h, slope = u, None
        elif kind == "gate":
            fam, lam = gate_of(m)  # λ comes back on the CPU
            lam = (lam.reshape(1, -1) if lam.numel() > 1 else lam.reshape(1, 1)).to(u.device)
            with torch.enable_grad():
                z = u.detach().clone().requires_grad_(True)
                y = m(z)
                (d,) = torch.autograd.grad(y.sum(), z)
            q = gate_remainder(curvature(fam), lam, u, ebar)
            s = gate_rounding(u.abs() + ebar)
            pending, slope, h = SAFETY * (q + s), d, y.detach()
        else:  # ReLU
            flip = u.abs() <= ebar
            slope = torch.where(flip, torch.full_like(u, 0.5), (u > 0).to(u.dtype))
            pending = torch.where(flip, 0.5 * ebar, torch.zeros_like(u))
            h = torch.relu(u)
    return ebar


def gate_remainder(cv, lam: torch.Tensor, u: torch.Tensor, ebar: torch.Tensor) -> torch.Tensor:
    """q̄ ≥ |f(ũ) − f(u) − D·(ũ − u)| for every |ũ − u| ≤ ē, f(x) = F(λx)/λ and D = f'(u) (at a kink of F, either
    one-sided slope), from `pipeline.gates.curvature`'s `cv` (F'' envelope, kinks, sup F' − inf F'): the second-order
    term where λ·[u − ē, u + ē] holds no kink of F, else only the first-order one."""
    far = ((u.abs() - ebar) * lam).clamp_min(0.0)  # λ·distance of the interval [u − ē, u + ē] from 0
    idx = (far / CURVATURE_STEP).floor().clamp_max(len(cv.envelope) - 1).long()
    first = cv.slope_range * ebar  # sound across a kink of F too: F' stays within its range on either side
    q = torch.minimum(0.5 * lam * cv.envelope.to(u.device)[idx] * ebar * ebar, first)
    for k in cv.kinks:  # an interval λ·[u − ē, u + ē] that holds a kink has no bound on F''
        q = torch.where((lam * (u - ebar) <= k) & (k <= lam * (u + ebar)), first, q)
    return q


def _ebar(sources: list[tuple[torch.Tensor | None, torch.Tensor]]) -> torch.Tensor:
    """Σ_k |P_k|·ν̄_k: the bound on |e| every source gives together."""
    return sum(nb if p is None else torch.einsum("nij,nj->ni", p.abs(), nb) for p, nb in sources)
