"""α-CROWN (`AlphaCrown`, a part of `bounds.Bounder`): the relaxations' slopes of every site that has them (each op's
`optimizable`, `initial_slopes`, `project`) optimized by projected gradient for the spec rows (`alpha_spec`) or for
the inputs of the sites whose op asks for it (`alpha_intermediate`: ReLU and smooth sites, `alpha_bounds`); every
iterate is sound, so the best seen per row is.

Intermediate bounds are optimized site by site, each for the sum of its own units' widths, with its own slopes for
every earlier site: auto_LiRPA's α-CROWN (`optimized_bounds._get_optimized_bounds`) likewise gives each intermediate
bound its own α per start node and keeps the best bounds seen, but moves them all jointly for the final objective.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch


class Adam:
    """Adam (Kingma & Ba 2015, torch.optim.Adam's defaults without weight decay) on a list of tensors. Not
    torch.optim: its first use in a process imports torch._dynamo (1.5–5 s measured here), time a verifier under a
    limit of a second or two cannot spend and that no budget check can interrupt."""

    def __init__(self, params: Sequence[torch.Tensor], lr: float | Sequence[float], betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8):
        self.params, self.eps = list(params), eps
        self.lrs = [float(v) for v in lr] if isinstance(lr, Sequence) else [float(lr)] * len(self.params)  # per tensor
        self.b1, self.b2 = betas
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.d = [torch.empty_like(p) for p in self.params]  # the denominator, in place (no allocation per step)
        self.t = 0

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        c1, c2 = 1 - self.b1 ** self.t, 1 - self.b2 ** self.t
        for p, m, v, d, lr in zip(self.params, self.m, self.v, self.d, self.lrs):
            if p.grad is None:
                continue
            m.mul_(self.b1).add_(p.grad, alpha=1 - self.b1)
            v.mul_(self.b2).addcmul_(p.grad, p.grad, value=1 - self.b2)
            # p −= lr·(m/c1)/(√(v/c2) + eps) (torch.optim.Adam's order of operations), the denominator in a kept buffer
            torch.sqrt(v, out=d)
            p.addcdiv_(m, d.div_(math.sqrt(c2)).add_(self.eps), value=-lr / c1)


class AlphaCrown:
    """α-CROWN's methods of `bounds.Bounder` (which gives `backward`, `relaxation`, `pre`, `sites`, `expired`)."""

    @classmethod
    def alpha_spec_many(cls, work: Sequence[tuple[Any, Any, Sequence[int]]], steps: int = 30,
                        lr: float = 0.1) -> list[torch.Tensor]:
        """α-CROWN (`alpha_spec`) for several (Bounder, rows, owner) of one graph, each over its own box: returns, per
        item, what its own `alpha_spec(spec, owner, steps, lr)` returns (lower bounds of its rows, sound; each stops
        where its bounder's `expired` says) and leaves its `spec_slopes` as that call would. The plain loop, to be
        replaced by one optimization over the batch where that pays."""
        return [b.alpha_spec(spec, owner, steps, lr) for b, spec, owner in work]

    # -- α-CROWN ---------------------------------------------------------------------------------
    def _optimize(self, A: torch.Tensor, node: int, steps: int, lr: float,
                  objective: Callable[[torch.Tensor], torch.Tensor], done: Callable[[torch.Tensor], bool],
                  until: Callable[[], bool] | None = None, keep: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        """Maximize objective(lower bounds of A·h) over the slopes of the sites node `node` depends on, until the
        steps are done, the budget ends or `until()`; returns the elementwise best lower bounds seen (each iterate
        is sound, so their max is). `keep` receives each branchable site's slopes [rows, n] of each row's best bound (branch and bound's warm start)."""
        stop = self._stop(until)
        sites = [s for s in self.sites_before(node) if self.optimizable(s)]
        rows = A.shape[0]
        slopes = {s: self.initial_slopes(s, rows) for s in sites}
        params, lrs = [], []
        for s in sites:
            for p in (slopes[s] if isinstance(slopes[s], tuple) else (slopes[s],)):
                p.requires_grad_(True)
                params.append(p)
                lrs.append(lr * self.op(s).alpha_lr)
        relu = [s for s in sites if self.op(s).branchable]

        def remember(better: torch.Tensor | None) -> None:  # the slopes of each row's best bound so far
            if keep is not None:
                for s in relu:
                    keep[s] = slopes[s].detach().clone() if better is None else \
                        torch.where(better[:, None], slopes[s].detach(), keep[s])

        with torch.no_grad():
            best = self.backward(A, node, None, exact=True)
        remember(None)
        if not params or done(best):
            return best
        opt = Adam(params, lr=lrs)
        for _ in range(steps):
            if stop():
                break
            # every iterate is sound (a coarser bisection only widens the slack), so the running max is too
            bound = self.backward(A, node, slopes, exact=False)
            remember(bound.detach() > best)
            best = torch.maximum(best, bound.detach())
            if done(best):
                break
            opt.zero_grad()
            (-objective(bound)).backward()
            opt.step()
            with torch.no_grad():
                for s in sites:
                    self._project(s, slopes[s])
        with torch.no_grad():  # the final slopes, with the exact (sound) intercepts
            final = self.backward(A, node, {s: _detach(v) for s, v in slopes.items()}, exact=True)
            remember(final > best)
            best = torch.maximum(best, final)
        return best

    def _stop(self, until: Callable[[], bool] | None) -> Callable[[], bool]:
        return self.expired if until is None else (lambda: self.expired() or until())

    def alpha_intermediate(self, steps: int = 20, lr: float = 0.1, until: Callable[[], bool] | None = None) -> bool:
        """α-CROWN for the inputs of the sites whose op asks for it (`alpha_bounds`: ReLU, the smooth activations) and
        that depend on an earlier site, one site at a time in order: the queried units' bounds both ways, slopes of the
        sites before optimized for their sum, each later site relaxed on the tightened intervals before it. Gate sites
        keep CROWN's. Stops at the budget's end or `until()`; a later call goes on from the first site not done. True
        when every site is done."""
        stop = self._stop(until)
        for s in range(len(self.sites)):
            if s in self.alpha_done:
                continue
            if stop():
                return False
            self._alpha_site(s, steps, lr, stop)
            self.alpha_done.add(s)  # also when stopped inside: its best bounds so far are kept
        self.method = "alpha-crown"
        return True

    def _alpha_site(self, s: int, steps: int, lr: float, stop: Callable[[], bool]) -> None:
        op = self.op(s)
        if not op.alpha_bounds:
            return
        j = self.site_input[s]
        if not any(self.optimizable(t) for t in self.sites_before(j)):
            return  # nothing to optimize behind it: CROWN's bounds are α-CROWN's
        idx = self._query(s)
        if idx.numel() == 0 or not self.fits(2 * idx.numel(), j):
            return  # nothing to tighten, or too wide to optimize at once: CROWN's bounds stay
        m = idx.numel()
        # stop once no unit is `unstable` (a ReLU's sign is what the MILP's binaries and the branching need; a smooth
        # unit never is stable, so its steps all run)
        best = self._optimize(self._query_rows(idx, self.pre[s][0].numel()), j, steps, lr, objective=lambda b: b.sum(),
                              done=lambda b: not bool(op.unstable(b[:m], -b[m:]).any()), until=stop)
        self._tighten(s, idx, best[:m], -best[m:])

    def alpha_spec(self, spec: Any, owner: Sequence[int], steps: int = 30, lr: float = 0.1) -> torch.Tensor:
        """α-CROWN lower bounds of the spec rows (slopes per row), stopping once every disjunct is excluded."""
        own = torch.as_tensor(list(owner), device=self.device)
        n_disj = max(owner) + 1 if len(owner) else 0

        def per_disjunct(b: torch.Tensor) -> torch.Tensor:
            return b.new_full((n_disj,), -math.inf).scatter_reduce(0, own, b, reduce="amax")

        def objective(b: torch.Tensor) -> torch.Tensor:
            # each disjunct is excluded by its best row: push that row up, no further than 0 (then it is done)
            return per_disjunct(b).clamp(max=0).sum() + 1e-3 * b.clamp(max=0).sum()

        keep: dict[int, torch.Tensor] = {}
        best = self._optimize(spec.C, self.net.output, steps, lr, objective=lambda b: objective(b + spec.d),
                              done=lambda b: bool(torch.all(per_disjunct(b + spec.d) > 0)), keep=keep)
        self.spec_slopes = (spec.C, keep)  # branch and bound starts its rows from them (α,β-CROWN's warm start)
        return best + spec.d

    def optimizable(self, s: int) -> bool:
        """Does site s have slopes α-CROWN optimizes, or a fixed relaxation?"""
        return self.op(s).optimizable()

    def initial_slopes(self, s: int, rows: int):
        """Starting point of α-CROWN for site s with `rows` query rows: CROWN's own choice, one copy per row."""
        return self.op(s).initial_slopes(self.relaxation(s), rows)

    def _project(self, s: int, p) -> None:
        self.op(s).project(p, *self.pre[s])


def _detach(v):
    return tuple(t.detach() for t in v) if isinstance(v, tuple) else v.detach()
