"""A LayerNorm's nonlinear parts: its `Variance` (one op on the whole row, whose range uses ‖P(x − x₀)‖ ≤ ‖r‖₂:
interval arithmetic through Square gives a lower bound of 0 as soon as every centred unit's interval holds 0, and a
LayerNorm's 1/√(var + ε) then reaches 1/√ε) and the int8 LayerNorm's float32 error (`LayerNormRounding`). A LayerNorm
is read as centring, its Variance, Rsqrt and a Product (`readers`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from .base import DTYPE, as_tensor
from .curves import REL_SLACK, TINY
from .products import _Bilinear, _read

@dataclass(eq=False)
class Variance(_Bilinear):
    """v = mean(c²) + ε per row of R rows × N, c = x − mean x (a LayerNorm's variance). Its input is the concatenation
    (x, c), so that both come with their own (CROWN-tightened) intervals: with c = Px (P the centring, a projection)
    and x in a box of centre x₀ and half-widths r, ‖c‖ ≥ ‖Px₀‖ − ‖P(x − x₀)‖ ≥ ‖Px₀‖ − ‖r‖₂, so
    v ≥ (‖Px₀‖ − ‖r‖₂)₊²/N + ε, the same from c's own box (‖c‖ ≥ ‖c_m‖ − ‖ρ‖₂, c_m and ρ its centre and half-widths),
    besides the separable bound Σ dist(0, [c_l, c_u])²/N + ε of c's intervals (what interval
    arithmetic through Square gives, 0 as soon as every unit's interval holds 0). Lines on c: below, the tangent plane
    at a point t (‖c‖² ≥ 2tᵀc − ‖t‖², for every t): c's centre by default, or with `tangent="near"` each unit's end
    nearest 0 (0 where its interval holds 0: auto_LiRPA's `BoundSqr`), which is never below the separable bound, or
    points given (`refine_rows` optimizes them per row of a variance's query); above, the chords
    c_i² ≤ (c_l + c_u)c_i − c_l·c_u."""

    R: int
    N: int
    eps: float
    source: str = ""

    # `refine_rows`' Adam steps on each queried row's tangent points (0: the two fixed choices only). Off: on a 17-token
    # ViT it raised margin bounds a lot but decided nothing more on deit_tiny 32×2's verify stage, whose float pass it
    # made 3× as long (benchmarks/peers/crown-vit/README.md)
    STEPS: ClassVar[int] = 0
    LR: ClassVar[float] = 0.1  # in units of each centred unit's interval width

    def in_sizes(self) -> tuple[int, ...]:
        return (2 * self.R * self.N,)

    @property
    def out_size(self) -> int:
        return self.R

    def split(self, v):
        n = self.R * self.N
        rows = lambda t: t.reshape(*t.shape[:-1], self.R, self.N)  # noqa: E731
        return rows(v[..., :n]), rows(v[..., n:])

    def forward(self, h):
        _, c = self.split(h)
        return (c * c).mean(-1) + self.eps

    def interval(self, l, u):
        (xl, cl), (xu, cu) = self.split(l), self.split(u)
        sep = torch.where((cl <= 0) & (cu >= 0), torch.zeros_like(cl), torch.minimum(cl * cl, cu * cu)).sum(-1)
        x0 = (xl + xu) / 2
        c0 = x0 - x0.mean(-1, keepdim=True)
        norm = (c0.norm(dim=-1) - ((xu - xl) / 2).norm(dim=-1)).clamp(min=0) ** 2
        # the same from c's own box (centre m, half-widths ρ): ‖c‖ ≥ ‖m‖ − ‖c − m‖ ≥ ‖m‖ − ‖ρ‖₂; tighter where CROWN
        # bounds c closer than x's box does (c = Px from x's correlated units)
        norm_c = (((cl + cu) / 2).norm(dim=-1) - ((cu - cl) / 2).norm(dim=-1)).clamp(min=0) ** 2
        lo = torch.maximum(torch.maximum(sep, norm), norm_c) / self.N + self.eps
        hi = torch.maximum(cl * cl, cu * cu).sum(-1) / self.N + self.eps
        return lo * (1 - 4 * REL_SLACK) - TINY, hi * (1 + 4 * REL_SLACK) + TINY

    @staticmethod
    def tangent_points(cl: torch.Tensor, cu: torch.Tensor, tangent: str) -> torch.Tensor:
        """The lower plane's tangent point of each centred unit over [cl, cu]: "centre", or "near" (its end nearest 0;
        0 where the interval holds 0)."""
        return (cl + cu) / 2 if tangent == "centre" else cl.clamp(min=0) - (-cu).clamp(min=0)

    def relax(self, l, u, tangent: str | torch.Tensor = "centre"):
        """`tangent`: "centre", "near", or the tangent points themselves ([R, N], inside c's intervals: a point outside
        gives a plane that the nearest end's dominates over the box)."""
        (_, cl), (_, cu) = self.split(l), self.split(u)
        c0 = tangent if isinstance(tangent, torch.Tensor) else self.tangent_points(cl, cu, tangent)
        lo_coef = 2 * c0 / self.N
        lo_const = -(c0 * c0).sum(-1) / self.N + self.eps
        up_coef = (cl + cu) / self.N
        up_const = -(cl * cu).sum(-1) / self.N + self.eps
        mag = torch.maximum(cl.abs(), cu.abs())
        slack = 8 * REL_SLACK * ((mag * mag).sum(-1) / self.N + self.eps) + TINY
        return lo_coef.reshape(-1), lo_const - slack, up_coef.reshape(-1), up_const + slack

    def back(self, A, relax, unknown: bool = True):
        lo_coef, lo_const, up_coef, up_const = relax
        Ap, An = A.clamp(min=0), A.clamp(max=0)  # [rows, R]
        lc, uc = lo_coef.reshape(self.R, self.N), up_coef.reshape(self.R, self.N)
        coef = Ap[..., None] * lc + An[..., None] * uc  # [rows, R, N] on c
        return torch.cat([A.new_zeros(A.shape[0], self.R * self.N), coef.reshape(A.shape[0], -1)], -1), \
            _read(Ap, lo_const, unknown).sum(-1) + _read(An, up_const, unknown).sum(-1)

    def milp_rows(self, l, u):
        from scipy import sparse

        lo_coef, lo_const, up_coef, up_const = (t.numpy() for t in self.relax(l, u))
        n = self.R * self.N
        rows = np.repeat(np.arange(self.R), self.N)
        cols = n + np.arange(n)
        shape = (self.R, 2 * n)
        inf = np.full(self.R, np.inf)
        return [(sparse.csr_matrix((lo_coef, (rows, cols)), shape=shape), lo_const, inf),
                (sparse.csr_matrix((up_coef, (rows, cols)), shape=shape), -inf, up_const)]

    def gap(self, l, u, d):
        # |mean(c'²) − mean(c²)| ≤ (‖c'‖ + ‖c‖)·‖c' − c‖/N ≤ (2‖c‖_max + ‖d_c‖)·‖d_c‖/N per row
        (_, cl), (_, cu) = self.split(l), self.split(u)
        _, dc = self.split(d)
        cmax = torch.maximum(cl.abs(), cu.abs()).norm(dim=-1)
        dn = dc.norm(dim=-1)
        return (2 * cmax + dn) * dn / self.N * (1 + REL_SLACK) + TINY

    def refine_rows(self, b: Any, s: int, idx: torch.Tensor, n: int, lo: torch.Tensor, up: torch.Tensor, float32: bool,
                    cuts: dict | None) -> torch.Tensor:
        """The variance's lower bound (CROWN's `lo`, with the tangent planes of c² at c's centre) raised by other tangent
        points: each unit's end nearest 0 (`relax(tangent="near")`, auto_LiRPA's `BoundSqr`), then points optimized by
        Adam for each row's bound (`STEPS`, from the better of the two, kept inside c's intervals). Every tangent plane
        is a sound lower bound, so the best seen is. Neither fixed choice dominates (the centre keeps more of the row's
        correlation, the near ends never fall below the separable bound), and a variance's lower bound is what keeps
        1/√(var + ε) finite. `b` is the `bounds.Bounder` whose site s this is."""
        l, u = b.pre[s]
        (_, cl), (_, cu) = self.split(l), self.split(u)
        cl, cu = cl.reshape(self.R, self.N), cu.reshape(self.R, self.N)
        keep, fin = b._relax_cache.get(s), b._finite.get(s)
        rows = torch.zeros(idx.numel(), n, dtype=DTYPE, device=idx.device)
        rows[torch.arange(idx.numel(), device=idx.device), idx] = 1.0  # e_i: lower bounds only

        def query(tangent) -> torch.Tensor:
            relax = self.relax(l, u, tangent=tangent)
            b._relax_cache[s], b._finite[s] = relax, all(bool(torch.isfinite(t).all()) for t in relax)
            out = b.backward(rows, b.sites[s], float32=float32, cuts=cuts, depth=b.cut_depth or 1)
            return torch.where(torch.isnan(out), torch.full_like(out, -math.inf), out)  # NaN (∞ − ∞): no bound

        try:
            with torch.no_grad():
                near = query("near")
            best = torch.maximum(lo, near)
            todo = torch.nonzero(best < up).flatten()  # a row whose interval is a point has nothing to gain
            finite = bool(torch.isfinite(cl).all() & torch.isfinite(cu).all())
            if not self.STEPS or todo.numel() == 0 or b.expired() or not finite:
                return best
            centre, width = self.tangent_points(cl, cu, "centre"), cu - cl
            near_pt = self.tangent_points(cl, cu, "near")
            rows_t = idx[todo]  # the variance rows (LayerNorm rows) to optimize
            # each point as centre + θ·width, θ in [−½, ½] (inside c's interval: a point outside gives a plane the
            # nearest end's dominates), so that Adam's steps are in units of each interval's width
            w = width[rows_t].clamp(min=1e-30)
            start = torch.where((near[todo] > lo[todo])[:, None], (near_pt[rows_t] - centre[rows_t]) / w, 0.0)
            theta = start.clamp(-0.5, 0.5).requires_grad_(True)
            opt = torch.optim.Adam([theta], lr=self.LR)

            def points(th: torch.Tensor) -> torch.Tensor:
                return centre.index_put((rows_t,), centre[rows_t] + th * width[rows_t])

            for _ in range(self.STEPS):
                if b.expired():
                    break
                bound = query(points(theta))
                with torch.no_grad():
                    best[todo] = torch.maximum(best[todo], bound[todo])
                opt.zero_grad()
                (-bound[todo].sum()).backward()
                opt.step()
                with torch.no_grad():
                    theta.clamp_(-0.5, 0.5)
            with torch.no_grad():
                best[todo] = torch.maximum(best[todo], query(points(theta.detach()))[todo])
            return best
        finally:
            if keep is None:
                b._relax_cache.pop(s, None)
                b._finite.pop(s, None)
            else:
                b._relax_cache[s], b._finite[s] = keep, fin


@dataclass(eq=False)
class LayerNormRounding(_Bilinear):
    """y + e, |e| ≤ E: onnxruntime's float32 LayerNormalization of an int8 graph, on the exact one y. Its input is
    the concatenation (y [R·N], x [R·N], v [R]) of the LayerNorm's exact output, its input and its variance + ε
    (graph nodes), so E can use their intervals over the box.

    Derivation (`layer_norm_rounding`; x̃ the runtime's input, |x̃ − x| ≤ e, |x̃| ≤ A, v + ε ≥ V over the box):
    |ỹ − y(x)| ≤ |ỹ − LN(x̃)| + |LN(x̃) − LN(x)|. The second term: LN's Jacobian γ·r·(P − z·zᵀ/N) has row sums
    ≤ |γ|·r·(2 + √N) (Σz² ≤ N), r ≤ 1/√V along the segment. The first: the one-pass sums m̃ and E[x²]~ are within
    γ_{N+2}·A and γ_{N+2}·A² of m and E[x²], so the variance within Δv = γ_{N+2}A² + Δm(2A + Δm) + u(A + Δm)² +
    2.1uA², √(fl(v + ε)) within a relative ρ = τ + u + τu of √(v + ε) (τ = (Δv + u(V + Δv))/V, |√(1 + t) − 1| ≤ |t|),
    x − m̃ within Δc = Δm + u(2A + Δm), the quotient within Δz = Δc·r/(1 − ρ) + √N·ρ/(1 − ρ), and the scale and
    shift add 2.1u·(|γ|(√N + Δq) + |β|). Where ρ ≥ ½ or E exceeds `LN_CAP` of the output's bound, E is ∞ (unknown)."""

    R: int
    N: int
    eps: float
    e_in: torch.Tensor  # [R]: max |x̃ − x| per row (the LayerNorm input's followed error)
    gamma_: torch.Tensor  # [N]
    beta: torch.Tensor  # [N]
    source: str = ""

    def __post_init__(self):
        self.e_in, self.gamma_, self.beta = (as_tensor(t).reshape(-1) for t in (self.e_in, self.gamma_, self.beta))

    def in_sizes(self):
        return (2 * self.R * self.N + self.R,)

    @property
    def out_size(self):
        return self.R * self.N

    def cap(self) -> torch.Tensor:
        from ..quantized import LN_CAP

        return LN_CAP * (self.gamma_.abs() * math.sqrt(self.N) + self.beta.abs()) + 1e-30

    def split(self, v):
        n = self.R * self.N
        return v[..., :n], v[..., n:2 * n], v[..., 2 * n:]

    def bound(self, l, u):
        """E per unit on the box the intervals (l, u) of (y, x, v) describe; ∞ beyond `cap` (no bound, or a larger one
        than the reading's magnitudes allow): those units are unknown, which costs nothing where nothing reads them (a
        LayerNorm over every token of which the head reads one)."""
        _, xl, vl = self.split(l)
        _, xu, _ = self.split(u)
        mag = torch.maximum(xl.abs(), xu.abs()).reshape(self.R, self.N) + self.e_in.to(l.dtype)[:, None]
        A = (mag.mean(1), (mag * mag).mean(1), mag.max(1).values)
        from ..quantized import layer_norm_rounding

        E = layer_norm_rounding(A, vl, self.e_in.to(l.dtype), self.gamma_.to(l.dtype), self.beta.to(l.dtype),
                                self.N, self.eps)
        beyond = ~(E <= self.cap().to(l.dtype)[None])
        return torch.where(beyond, torch.full_like(E, math.inf), E).reshape(-1)

    def forward(self, h):
        return self.split(h)[0]

    def interval(self, l, u):
        E = self.bound(l, u)
        return self.split(l)[0] - E, self.split(u)[0] + E

    def relax(self, l, u):
        return (self.bound(l, u),)

    def back(self, A, relax, unknown: bool = True):
        (E,) = relax
        rest = A.new_zeros(A.shape[0], self.R * self.N + self.R)
        # an unbounded unit costs −∞ only to the rows that read it (0·∞ is 0 here, not NaN)
        cost = torch.where(A != 0, A.abs() * E, torch.zeros_like(A))
        return torch.cat([A, rest], dim=-1), -cost.sum(-1)

    def milp_rows(self, l, u):
        from scipy import sparse

        E = self.bound(l, u).numpy()
        n = self.R * self.N
        M = sparse.hstack([sparse.identity(n), sparse.csr_matrix((n, n + self.R))], format="csr")
        return [(M, -E, E)]

    def gap(self, l, u, d):
        return self.split(d)[0]

    def unbounded_note(self, l: torch.Tensor, u: torch.Tensor, needed: torch.Tensor) -> str:
        rows = (torch.isinf(self.bound(l, u)) & needed).reshape(self.R, self.N).any(1)
        if not bool(rows.any()):
            return ""
        return (f"{self.source or 'a LayerNorm'} has no float32 error bound on {int(rows.sum())} of {self.R} "
                f"rows (the bounds leave them too little spread: they may be constant over the box)")
