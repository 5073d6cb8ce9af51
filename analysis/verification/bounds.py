"""Sound bounds of a `graph.Graph` over an input box: IBP, CROWN (linear relaxations with back-substitution
over the DAG, DeepPoly's idea) and α-CROWN (the relaxations' slopes optimized by projected gradient), for ReLU
and for the smooth gates (`relaxations`), λ per unit; plus the swap gap |smooth − ReLU| (`swap_gap`).

Back-substitution over a DAG: the coefficients A_k on each node's output are summed over its consumers; nodes are
visited in reverse topological order, so A_k is complete when node k is reached (auto_LiRPA's `backward_general`
does the same). An affine node passes A_k to its inputs (`ops.Affine.back`); an activation node replaces A_k by
A⁺·lower line + A⁻·upper line of its relaxation on its input's interval.

One small engine in torch float64; bounds are computed without directed rounding (as auto_LiRPA does): what
they miss by float64 rounding is ~1e-12 relative, far below the margins a decision rests on. The gate
relaxations' own evaluation error is covered (`relaxations.G_REL_ERROR`).

Device-generic: a `Bounder` computes on its graph's device (`Graph.device`, the weights'); the box, the query rows and
every tensor it makes are created there, so a bound pass never reads a value on the host (the budget checks and the
per-site loops read Python numbers only). `tests/test_verify_device.py` runs the passes with tensors made anywhere
else turned into an error.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np
import torch

from pipeline.numerics import UNDERFLOW, U, dot_error

from .graph import Graph
from .nonlinear import BatchMatMul, ExpSums, LayerNormRounding, OutOfDomain, Variance
from .ops import DTYPE, Affine, Concat, Conv, Gate, Linear, ReLU, Rounding, Scale, Select, UnsupportedModel, as_tensor
from .relaxations import (BISECT_STEPS, OPT_BISECT_STEPS, SMOOTH_GATES, default_slopes, gate_range, intercepts, slope_range,
                          swap_gap_unit)

CHUNK_ELEMENTS = 2 ** 25  # coefficient rows × width per back-substitution batch (256 MB of float64)
# CROWN's query rows on the CPU, per batch: a batch whose coefficients (1 MB of float64) stay in the core's cache across
# the ops of a back-substitution step is 35% faster than one batch of all rows on preact_resnet [16,32]
CPU_CROWN_CHUNK = 2 ** 17
# with attention, a row back-substitutes through layers 2–3× the widest node's size (a softmax's T×T coefficients per
# head) and a batch of 2^17 elements is ~7 rows, whose per-op overhead dominates: on the 64-token ViT (12,610 units)
# 2^19 is 24–33% faster a query than 2^17, and 2^21 or more slower again (`benchmarks/verify-results/VIT64.md`)
CPU_CROWN_CHUNK_ATTENTION = 2 ** 19
# A Conv whose back-substitution sums at least this many products per coefficient (`Conv.back_terms`) runs it in
# float32 on the CPU, its rounding error added to the bound (`Bounder._float32_back`); below it float64's kernel is as
# fast as the float32 one with the error's extra passes (a 1×1 shortcut, a one-channel stem). 0 turns it off.
FLOAT32_MIN_TERMS = 64
FLOAT32_RANGE = 2.0 ** 100  # interval ends and weights beyond this (or nonzero weights below its inverse): float64
# The smooth gates' sites bounded with float32 convolutions too (their rounding error added: sound). A gate's relaxation
# depends on every unit's interval, so float32's looser intervals (on the [16,32] preact ResNet at most 0.14% of a
# width) reach the spec rows' bounds (1.4e-5 lower there than float64's CROWN); for that the smooth network's pass costs
# a fifth (6.5 s → 1.3 s), and that preact run's verify stage decides 29/30 smooth properties instead of 22/30 in the
# same budget (benchmarks/verify-results/crown-speed.md). On; False gives float64's CROWN exactly.
FLOAT32_GATES = True
CUT_DEPTH = 1  # on a wide graph with attention: CROWN's intermediate queries concretize at this many cuts behind them
CUT_MIN_WIDTH = 8192  # "wide": a node of this many units (the 64-token ViT's qkv: 12,480; deit_tiny 32×2 on 8×8: 2,176)
# ops whose every output unit is a copy of one input unit (Permute is a Select) or an affine function of one (Scale): the
# CROWN bounds of such a unit are its source's, mapped
COPIES = (Concat, Select, Scale)
ATTENTION = (BatchMatMul, ExpSums)


@dataclass
class Spec:
    """Rows of a linear function of the outputs, C y + d, whose LOWER bounds we want (rows, outputs)."""

    C: torch.Tensor
    d: torch.Tensor

    def __post_init__(self) -> None:
        self.C = as_tensor(self.C)
        self.d = as_tensor(self.d, self.C.device).reshape(-1)

    @classmethod
    def from_disjuncts(cls, disjuncts: Sequence[tuple[np.ndarray, np.ndarray]],
                       device: torch.device | str = "cpu") -> tuple["Spec", list[int]]:
        """A disjunct {A y ≤ b} is empty when some row has lower bound of A_r y − b_r > 0: all rows stacked (on
        `device`), with the disjunct index of each row."""
        C = np.concatenate([A for A, _ in disjuncts])
        d = -np.concatenate([b for _, b in disjuncts])
        owner = [k for k, (A, _) in enumerate(disjuncts) for _ in range(A.shape[0])]
        return cls(as_tensor(C, device), as_tensor(d, device)), owner


@dataclass
class ReluLines:
    """A ReLU site's relaxation on fixed intervals l < 0 < u (crossing) or stable, all but the lower slope: computed
    once for the many passes of an optimization over the same intervals (branch and bound's Adam steps)."""

    cross: torch.Tensor
    active: torch.Tensor  # 1 where l ≥ 0
    au: torch.Tensor  # upper line u/(u − l)·(x − l) on crossing units, the identity or 0 elsewhere
    bu: torch.Tensor
    al0: torch.Tensor  # CROWN's lower slope (1 where u > −l) when no slopes are given

    @classmethod
    def of(cls, l: torch.Tensor, u: torch.Tensor) -> "ReluLines":
        cross = (l < 0) & (u > 0)
        active = (l >= 0).to(l.dtype)
        au = torch.where(cross, u / (u - l).clamp(min=torch.finfo(l.dtype).tiny), active)
        bu = torch.where(cross, -l * au, torch.zeros_like(l))
        return cls(cross, active, au, bu, torch.where(cross, (u > -l).to(l.dtype), active))

    def lines(self, slopes: torch.Tensor | None = None):
        """(al, bl, au, bu): bl is None, the lower line passing through 0."""
        return (self.al0 if slopes is None else torch.where(self.cross, slopes, self.active)), None, self.au, self.bu


class FixedLines(NamedTuple):
    """A site's relaxation given whole, (al, bl, au, bu) per row ([rows, n]): branch and bound's lines of a grid rounding
    on a domain's index range (`ops.Rounding.lines`), fixed over its passes."""

    al: torch.Tensor
    bl: torch.Tensor
    au: torch.Tensor
    bu: torch.Tensor

    def lines(self, slopes: Any = None):
        return tuple(self)

    def to(self, dtype: torch.dtype) -> "FixedLines":
        return FixedLines(*(t.to(dtype) for t in self))


@dataclass
class BoxBounds:
    """What is known about one network on one box. `pre[s]` = (l, u) of the input of activation site s
    (the tightest found: IBP ∩ CROWN ∩ α-CROWN)."""

    net: Graph
    lb: torch.Tensor
    ub: torch.Tensor
    ibp_pre: list[tuple[torch.Tensor, torch.Tensor]]
    ibp_out: tuple[torch.Tensor, torch.Tensor]
    pre: list[tuple[torch.Tensor, torch.Tensor]]
    method: str = "ibp"

    def unstable(self, which: str = "tight") -> list[int]:
        """Per activation site, the units whose input interval has l < 0 < u (0 at a site with a fixed relaxation, an
        int8 rounding: its units are not split, and 0 is no kink of theirs)."""
        pre = self.pre if which == "tight" else self.ibp_pre
        ops = [self.net.nodes[k].op for k in self.net.activations]
        return [int(((l < 0) & (u > 0)).sum()) if isinstance(op, (ReLU, Gate)) else 0 for (l, u), op in zip(pre, ops)]

    def stable(self, which: str = "tight") -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per site, (dead mask u ≤ 0, active mask l ≥ 0)."""
        pre = self.pre if which == "tight" else self.ibp_pre
        return [(u <= 0, l >= 0) for l, u in pre]


class Adam:
    """Adam (Kingma & Ba 2015, torch.optim.Adam's defaults without weight decay) on a list of tensors. Not
    torch.optim: its first use in a process imports torch._dynamo (1.5–5 s measured here), time a verifier under a
    limit of a second or two cannot spend and that no budget check can interrupt."""

    def __init__(self, params: Sequence[torch.Tensor], lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        self.params, self.lr, self.eps = list(params), float(lr), eps
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
        for p, m, v, d in zip(self.params, self.m, self.v, self.d):
            if p.grad is None:
                continue
            m.mul_(self.b1).add_(p.grad, alpha=1 - self.b1)
            v.mul_(self.b2).addcmul_(p.grad, p.grad, value=1 - self.b2)
            # p −= lr·(m/c1)/(√(v/c2) + eps) (torch.optim.Adam's order of operations), the denominator in a kept buffer
            torch.sqrt(v, out=d)
            p.addcdiv_(m, d.div_(math.sqrt(c2)).add_(self.eps), value=-self.lr / c1)


class Bounder:
    """Bounds of one graph over one input box [lb, ub] (flat, in the graph's input units), on the graph's device."""

    def __init__(self, net: Graph, lb: Any, ub: Any, expired: Callable[[], bool] | None = None):
        self.net = net.merged()
        self.device = self.net.device
        for node in self.net.nodes:
            if isinstance(node.op, Gate) and node.op.kind not in SMOOTH_GATES:
                raise UnsupportedModel(f"gate {node.op.kind!r} has no linear relaxation here; supported: {', '.join(SMOOTH_GATES)}")
        self.lb = as_tensor(lb, self.device).reshape(-1).clone()  # copies: the caller's arrays may be views
        self.ub = as_tensor(ub, self.device).reshape(-1).clone()
        if self.lb.numel() != self.net.num_inputs or self.lb.shape != self.ub.shape:
            raise ValueError(f"the box has {self.lb.numel()} inputs, the network {self.net.num_inputs}")
        if bool(torch.any(self.lb > self.ub)):
            raise ValueError("empty box: some lb > ub")
        self.expired = expired or (lambda: False)
        self.sites = self.net.activations  # node id of each activation site
        self.alpha_done: set[int] = set()  # sites whose bounds α-CROWN has optimized (alpha_intermediate)
        # (rows C, {ReLU site: slopes [rows, n]}) of the last `alpha_spec`: the lower slopes of each row's best bound
        self.spec_slopes: tuple[torch.Tensor, dict[int, torch.Tensor]] | None = None
        self.site_of = {k: s for s, k in enumerate(self.sites)}
        self.site_input = [self.net.nodes[k].inputs[0] for k in self.sites]
        self._ancestors: dict[int, set[int]] = {}
        self.ibp_pre, self.ibp_out = self._ibp()
        self.pre = list(self.ibp_pre)
        self.method = "ibp"
        self._relax_cache: dict[int, tuple[torch.Tensor, ...]] = {}  # CROWN's relaxation per site, until its bounds change
        self._finite: dict[int, bool] = {}  # per cached relaxation of a non-elementwise site: is every tensor of it finite?
        self._cross: dict[int, torch.Tensor] = {}  # its crossing units (`_crossing`), as long
        self._plan: tuple[set[int], set[int]] | None = None
        self._needed: list[torch.Tensor] | None = None  # per node, the units the output depends on (`needed`)
        self.crown_failed: Exception | None = None  # what stopped the last `crown()` (an exp that may overflow)
        # attention (a product of two variables, a softmax): a site read through copies is bounded through their sources
        # (`_crown_plan`), and on a wide graph CROWN's intermediate queries stop at the first cut; neither elsewhere
        self.attention = any(isinstance(n.op, ATTENTION) for n in self.net.nodes)
        # cuts only where full back-substitution is out of reach: a wide transformer (on a small one they cost tightness
        # for nothing: the tests' one-block TinyViT's branch and bound bound fell from above −1 to −2.0)
        self.cut_depth = CUT_DEPTH if self.attention and max(self.net.sizes) >= CUT_MIN_WIDTH else None
        self._cast: dict[torch.dtype, list] = {}  # the ops in another dtype (branch and bound's float32 search)

    def ancestors(self, node: int) -> set[int]:
        if node not in self._ancestors:
            self._ancestors[node] = self.net.ancestors(node)
        return self._ancestors[node]

    def sites_before(self, node: int) -> list[int]:
        """The activation sites `node`'s value depends on."""
        anc = self.ancestors(node)
        return [s for s, k in enumerate(self.sites) if k in anc]

    def op(self, s: int):
        return self.net.nodes[self.sites[s]].op

    # -- IBP -------------------------------------------------------------------------------------
    def _ibp(self):
        pre: list[tuple[torch.Tensor, torch.Tensor]] = []

        def record(s: int, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            pre.append((l, u))
            return l, u

        lo, hi = self._interval_pass(record)
        return pre, (lo, hi)

    def _interval_pass(self, at_site: Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
                       at_node: Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None):
        """Interval arithmetic through the graph in topological order; at activation site s, `at_site(s, l, u)` gets
        the interval reaching its input and returns the one to relax (IBP records it; CROWN tightens it first);
        `at_node(k, l, u)`, when given, may tighten any node's interval ([1, n] tensors) before its consumers read it."""
        vals: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(self.net.nodes)
        vals[0] = (self.lb[None], self.ub[None])
        self._iv = vals  # every node's interval (the last pass's; `_float32_back` reads its affine nodes' inputs')
        self._f32: dict[int, Any] = {}
        self._f32_used = 0  # float32 back-substitutions so far (`_relu_rows` tells whether its pass used one)
        for k, node in enumerate(self.net.nodes[1:], start=1):
            if isinstance(node.op, Affine):
                vals[k] = _unknown_nan(*node.op.ibp(*(vals[i] for i in node.inputs)))
                if at_node is not None:
                    vals[k] = at_node(k, *vals[k])
                continue
            lo, hi = vals[node.inputs[0]]
            l, u = at_site(self.site_of[k], lo[0], hi[0])
            if isinstance(node.op, ReLU):
                glo, ghi = l.clamp(min=0), u.clamp(min=0)
            elif isinstance(node.op, Gate):
                glo, ghi = gate_range(SMOOTH_GATES[node.op.kind], node.op.lam, l, u)
            else:
                glo, ghi = _unknown_nan(*node.op.interval(l, u))
            vals[k] = (glo[None], ghi[None])
            if at_node is not None:
                vals[k] = at_node(k, *vals[k])
        lo, hi = vals[self.net.output]
        return lo[0], hi[0]

    def ibp_spec(self, spec: Spec) -> torch.Tensor:
        """Interval bounds of the rows C y + d; C folded into a last Linear after a ReLU (tighter than bounding y first)."""
        out = self.net.nodes[self.net.output]
        C, d = spec.C, spec.d
        if len(out.inputs) == 1 and out.inputs[0] in self.site_of and isinstance(self.op(self.site_of[out.inputs[0]]), ReLU) \
                and isinstance(out.op, Linear):
            l, u = self.ibp_pre[self.site_of[out.inputs[0]]]
            W, c = C @ out.op.W, C @ out.op.b
            return W.clamp(min=0) @ l.clamp(min=0) + W.clamp(max=0) @ u.clamp(min=0) + c + d
        lo, hi = self.ibp_out
        return C.clamp(min=0) @ lo + C.clamp(max=0) @ hi + d

    # -- relaxations -------------------------------------------------------------------------------
    def relaxation(self, s: int, slopes: Any = None, exact: bool = True):
        """(al, bl, au, bu) with al·x + bl ≤ act(x) ≤ au·x + bu on site s's interval; shapes [n] or [rows, n]
        when `slopes` is per row (bl None for a ReLU: 0). ReLU slopes: the lower slope α; gates: (lower slope, upper slope)."""
        if slopes is None and s in self._relax_cache:
            return self._relax_cache[s]
        out = self._relaxation(s, slopes, exact, self.pre[s])
        if slopes is None:
            self._relax_cache[s] = out
            if not self.op(s).elementwise:  # read once per relaxation (`_Bilinear.back`'s `unknown`)
                self._finite[s] = all(bool(torch.isfinite(t).all()) for t in out)
        return out

    def _relaxation(self, s: int, slopes: Any, exact: bool, bounds: tuple[torch.Tensor, torch.Tensor]):
        op = self.op(s)
        l, u = bounds
        if isinstance(op, ReLU):
            return ReluLines.of(l, u).lines(slopes)  # bl None: the lower line passes through 0
        if isinstance(op, Rounding) and slopes is not None:  # α-CROWN's choice among the staircase hull's lines
            return op.hull_lines(l, u, slopes)
        if not isinstance(op, Gate):
            return op.lines(l, u) if op.elementwise else op.relax(l, u)
        gate = SMOOTH_GATES[op.kind]
        lam = op.lam
        L, U = lam * l, lam * u
        if slopes is None:
            a_lo, a_up = default_slopes(gate, L, U)
        else:
            a_lo, a_up = slopes
        steps = BISECT_STEPS if exact else OPT_BISECT_STEPS
        a_lo, a_up = torch.broadcast_tensors(a_lo, a_up)
        lo, hi = intercepts(gate, L, U, torch.stack([a_lo, a_up]), steps)  # one call for both lines
        return a_lo, lo[0] / lam, a_up, hi[1] / lam

    # α-CROWN also chooses the grid roundings' lines among the staircase hull's (`ops.Rounding.hull_lines`). Off by
    # default, by measurement (issue 41; benchmarks/int8-results/hull-*.json): on preact_resnet [4,8] int8 it raised 26
    # of 30 margin bounds at 30 steps, by a median 0.04 (margins −3.5 to −28, none decided either way), but each step
    # costs 45% more, and within the stage's int8 budget (20 s) the margins reached came out lower on 19 of 24 open
    # properties (median −0.52 against a run without it; timing alone moved them by a median 0.31 between two runs)
    OPTIMIZE_ROUNDING: ClassVar[bool] = False

    def optimizable(self, s: int) -> bool:
        """Does site s have slopes α-CROWN optimizes (ReLU, the gates; a grid's rounding with `OPTIMIZE_ROUNDING`), or a
        fixed relaxation?"""
        op = self.op(s)
        return isinstance(op, (ReLU, Gate)) or (self.OPTIMIZE_ROUNDING and isinstance(op, Rounding) and op.step is not None)

    def initial_slopes(self, s: int, rows: int):
        """Starting point of α-CROWN for site s with `rows` query rows: CROWN's own choice, one copy per row."""
        al, _, au, _ = self.relaxation(s)
        if isinstance(self.op(s), ReLU):
            return al.expand(rows, -1).clone()
        return al.expand(rows, -1).clone(), au.expand(rows, -1).clone()

    def _project(self, s: int, p):
        op = self.op(s)
        if isinstance(op, ReLU):
            p.data.clamp_(0.0, 1.0)
            return
        l, u = self.pre[s]
        if isinstance(op, Rounding):
            for q, (low, top) in zip(p, op.slope_range(l, u)):
                q.data.copy_(torch.minimum(torch.maximum(q.data, low.to(q.dtype)), top.to(q.dtype)))
            return
        lo, hi = slope_range(SMOOTH_GATES[op.kind], op.lam * l, op.lam * u)
        for q in p:
            q.data.copy_(torch.maximum(torch.minimum(q.data, hi), lo))

    # -- back-substitution -----------------------------------------------------------------------
    def _ops(self, dtype: torch.dtype) -> list:
        if dtype not in self._cast:
            self._cast[dtype] = [None] + [n.op.cast(dtype) for n in self.net.nodes[1:]]
        return self._cast[dtype]

    def backward(self, A: torch.Tensor, node: int, slopes: dict[int, Any] | None = None,
                 exact: bool = True, bounds: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
                 extra: dict[int, torch.Tensor] | None = None, record: dict[int, torch.Tensor] | None = None,
                 inputs: list[torch.Tensor] | None = None, float32: bool = False,
                 cuts: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None, depth: int = 1) -> torch.Tensor:
        """Lower bounds of A·h over the box, h the value of graph node `node`; A (rows, size), computed in A's dtype
        (float64 unless branch and bound searches in float32; what float32 closes is re-checked in float64 there).
        `float32`: the Convs that pay run in float32 with their rounding error added (`_float32_back`): sound, and
        looser than float64's by that error (CROWN's screen of a ReLU site's units, `_relu_rows`).

        For branch and bound: `bounds[s]` replaces site s's interval (per row: [rows, n]), or gives its relaxation (a ReLU
        site's `ReluLines`, a grid rounding's `FixedLines` on a domain's index range: computed once for many
        passes); `extra[s]` is added to
        the coefficients of site s's input after its relaxation (β·split terms); `record[s]` receives the
        coefficients of site s's output; `inputs` receives the final coefficients on the input (rows, n_in).

        `cuts` (CROWN's intermediate bounds, `crown`): nodes with a known interval [l, u]; once every coefficient of
        the pass has reached one of them (a cut of the graph: all that is left flows through it) after at least one
        activation site, at the `depth`-th such cut, the rows are concretized there, A⁺·l + A⁻·u, instead of carried to
        the input: sound (the interval holds on the box), looser by what the correlations behind the cut carried,
        and as many fewer back-substitution steps."""
        rows, dtype = A.shape[0], A.dtype
        ops = self._ops(dtype) if dtype != DTYPE else [n.op for n in self.net.nodes]
        acc: dict[int, torch.Tensor] = {node: A}
        const = A.new_zeros(rows)
        passed = False  # an activation site behind the rows (a cut before any is an affine map: nothing to gain)
        for k in range(node, 0, -1):
            A = acc.pop(k, None)
            if A is None:
                continue
            if cuts is not None and passed and not acc and k in cuts:
                depth -= 1
                if depth <= 0:
                    l, u = cuts[k]
                    return A.clamp(min=0) @ l.to(dtype) + A.clamp(max=0) @ u.to(dtype) + const
            n = self.net.nodes[k]
            passed = passed or not isinstance(n.op, Affine)
            if isinstance(n.op, Affine):
                fast = self._float32_back(k, A) if float32 and dtype == DTYPE else None
                parts, c = ops[k].back(A) if fast is None else fast
                const = const + c
                for i, Ai in zip(n.inputs, parts):
                    acc[i] = acc[i] + Ai if i in acc else Ai
                continue
            s = self.site_of[k]
            if record is not None:
                record[s] = A.detach()
            sl = None if slopes is None else slopes.get(s)
            if bounds is not None and isinstance(bounds.get(s), (ReluLines, FixedLines)):
                al, bl, au, bu = bounds[s].lines(sl)
            elif bounds is not None and s in bounds:
                al, bl, au, bu = self._relaxation(s, sl, exact, bounds[s])
            else:
                relax = tuple(None if t is None else t.to(dtype) for t in self.relaxation(s, sl, exact))
                if not n.op.elementwise:  # a product of two variables (`nonlinear`): its own back-substitution
                    # finite in float64 may overflow in float32 (branch and bound's search): then guarded
                    A, c = ops[k].back(A, relax, unknown=dtype != DTYPE or not self._finite.get(s, False))
                    const = const + c
                    i = n.inputs[0]
                    acc[i] = acc[i] + A if i in acc else A
                    continue
                al, bl, au, bu = relax
                if bl is None and sl is None and al.dim() == 1 and A.device.type == "cpu":
                    # CROWN's ReLU lines: A⁺·al + A⁻·au differs from A·al only on the crossing units (au ≠ al, bu ≠ 0)
                    cross = self._crossing(s, al, au, bu)
                    Ac = A[:, cross].clamp(max=0)
                    const = const + Ac @ bu[cross]
                    A = A * al
                    A[:, cross] += Ac * (au - al)[cross]
                    if extra is not None and s in extra:
                        A = A + extra[s]
                    i = n.inputs[0]
                    acc[i] = acc[i] + A if i in acc else A
                    continue
            # A⁺·al + A⁻·au as A·al + A⁻·(au − al): two passes over A instead of four
            An = A.clamp(max=0)
            const = const + _dot(An, bu) + (0 if bl is None else _dot(A.clamp(min=0), bl))
            A = torch.addcmul(A * al, An, au - al)
            if extra is not None and s in extra:
                A = A + extra[s]
            i = n.inputs[0]
            acc[i] = acc[i] + A if i in acc else A
        A_in = acc.pop(0, None)
        if A_in is None:
            A_in = A.new_zeros(rows, self.net.num_inputs)
        if inputs is not None:
            inputs.append(A_in.detach())
        return A_in.clamp(min=0) @ self.lb.to(dtype) + A_in.clamp(max=0) @ self.ub.to(dtype) + const

    def _crossing(self, s: int, al: torch.Tensor, au: torch.Tensor, bu: torch.Tensor) -> torch.Tensor:
        """The units of ReLU site s whose CROWN lines are not one line through 0 (a stable unit's are x or 0), kept until
        the site's bounds change (as its relaxation)."""
        if s not in self._cross:
            self._cross[s] = torch.nonzero((au != al) | (bu != 0)).flatten()
        return self._cross[s]

    def _float32_back(self, k: int, A: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor] | None:
        """`back` of the Conv node k in float32 where that is sound and pays, as ([Â], c): the float64 result of the
        float32 kernel Â (`Conv.back32`) and a constant that makes A·h ≥ Â·z + c hold for every z in the interval
        [z_mid − r, z_mid + r] of k's input (the interval pass's, `_iv`), h = M z + b the node's value:

            A·h − Â·z = (A·M − Â)·z + A·b = [A·y_mid − Â·z_mid] + (A·M − Â)·(z − z_mid),   y_mid = M z_mid + b,

        and each entry of the rounding error A·M − Â is at most γ_{n+2}·(|A|·|M|) + η (n = `back_terms` products, A
        and M each rounded to float32 once more; `pipeline.numerics.dot_error` of n + 2 terms, η its underflow), so
        the last term is at least −GAMMA_SLACK·γ_{n+2}·|A|·(|M| r) − η·Σr. The bracket is computed in float64 (its
        rounding, as the rest of the engine's, ~1e-16 relative). The added looseness is γ_{n+2} ≈ n·6e-8 of |A|·|M| r,
        the interval part of the coefficients' contribution (≈ 1e-5 of it for a 3×3 conv of 32 channels).

        None (float64's `back`): a node other than a Conv, one that sums fewer than FLOAT32_MIN_TERMS products, a
        computation off the CPU (a GPU's float32 convolution may run in TF32) or with gradients (α-CROWN's steps), a
        float32 precision setting other than IEEE, an input interval or weight outside FLOAT32_RANGE, or a float32
        result that is not finite."""
        op = self.net.nodes[k].op
        if not FLOAT32_MIN_TERMS or not isinstance(op, Conv) or op.back_terms < FLOAT32_MIN_TERMS or A.requires_grad \
                or A.device.type != "cpu":
            return None
        data = self._f32.get(k)
        if data is None:
            data = self._f32[k] = self._float32_data(k, op)
        if data is False or not _ieee_float32():
            return None
        out = op.back32(A)
        if out is None:
            return None
        Ai, A32 = out
        z_mid, y_mid, w32, wsum, n, eta, m = data
        # Σ_j |A_j|·w_j from float32: t = fl(Σ|fl(A_j)|·w32_j) is a float32 dot product of m nonnegative terms, so its
        # exact value is at most t + dot_error(m, 2t + 4m·UNDERFLOW) (the exact value is below twice t plus the
        # underflow); then |A| ≤ |fl(A)|/(1 − u) + UNDERFLOW and w ≤ w32 (rounded up)
        t = (A32.abs() @ w32).to(A.dtype)
        mag = (t + dot_error(m, 2 * t + 4 * m * UNDERFLOW)) / (1 - U) + UNDERFLOW * wsum
        c = A @ y_mid - Ai @ z_mid - (dot_error(n + 2, mag) + eta)
        if not bool(torch.isfinite(c).all()):  # an inf or NaN in float32 (an overflow) reaches c through Ai·z_mid
            return None
        self._f32_used += 1
        return [Ai], c

    def _float32_data(self, k: int, op: Conv):
        """(z_mid, y_mid, |M|·r in float32 rounded up and its sum, n = `back_terms`, η·Σr, the node's size) for node
        k's input interval, or False where float32 is not used (`_float32_back`)."""
        lo, hi = (t.reshape(-1) for t in self._iv[self.net.nodes[k].inputs[0]])
        wabs = op.weight.abs()
        if not (bool(torch.isfinite(lo).all()) and bool(torch.isfinite(hi).all())) \
                or float(torch.maximum(lo.abs(), hi.abs()).max()) > FLOAT32_RANGE \
                or float(wabs.max()) > FLOAT32_RANGE or bool(((wabs > 0) & (wabs < 1 / FLOAT32_RANGE)).any()):
            return False
        z_mid = (lo + hi) / 2
        r = torch.maximum(hi - z_mid, z_mid - lo) * (1 + 2.0 ** -50)  # ≥ |z − z_mid| on the interval
        n = op.back_terms
        y_mid = op.forward(z_mid[None])[0]
        w = op.abs_forward(r[None])[0]
        w32 = w.float()
        w32 = torch.where(w32.double() < w, torch.nextafter(w32, torch.full_like(w32, math.inf)), w32)  # rounded up
        # each coefficient's underflow: its dot product's (dot_error's, counted per unit of r here) and A's rounding to
        # float32 (at most UNDERFLOW per entry, times at most n weights)
        eta = ((2 * (n + 2) - 1) + 2 * n * float(wabs.max())) * UNDERFLOW * float(r.sum())
        return z_mid, y_mid, w32, float(w32.double().sum()), n, eta, w.numel()

    def width(self, node: int) -> int:
        """The widest value back-substitution from `node` carries (for chunking its rows)."""
        return max(self.net.sizes[k] for k in self.ancestors(node))

    def _query(self, s: int) -> torch.Tensor:
        """Units of site s whose bounds are worth tightening: IBP-unstable ReLUs, every unit of other activations."""
        l, u = self.pre[s]
        if isinstance(self.op(s), ReLU):
            return torch.nonzero((l < 0) & (u > 0)).flatten()
        op = self.op(s)
        if not op.needs_bounds:
            return torch.arange(0, device=l.device)
        if hasattr(op, "settled"):  # a grid's rounding: units whose interval has one grid value already are final
            return torch.nonzero(~op.settled(l, u)).flatten()
        return torch.arange(l.numel(), device=l.device)

    def tighten(self, s: int, idx: torch.Tensor, lo: torch.Tensor, up: torch.Tensor) -> None:
        """Intersect the interval of site s's units `idx` with [lo, up] (sound bounds found elsewhere: `refine`)."""
        self._tighten(s, idx, lo, up)

    def _tighten(self, s: int, idx: torch.Tensor, lo: torch.Tensor, up: torch.Tensor) -> None:
        l, u = self.pre[s]
        l, u = l.clone(), u.clone()
        # a NaN bound (∞ − ∞ in a relaxation's constants on an unknown interval) says nothing: torch.maximum would keep it
        lo = torch.nan_to_num(lo, nan=-math.inf, posinf=math.inf, neginf=-math.inf)
        up = torch.nan_to_num(up, nan=math.inf, posinf=math.inf, neginf=-math.inf)
        l[idx] = torch.maximum(l[idx], lo)
        u[idx] = torch.minimum(u[idx], up)
        self.pre[s] = (l, u)
        self._relax_cache.pop(s, None)
        self._cross.pop(s, None)

    def _exact_by_ibp(self, s: int) -> bool:
        """A site fed by one affine op on the input (or the input itself): its interval bounds are the exact range."""
        j = self.site_input[s]
        node = self.net.nodes[j]
        return j == 0 or (isinstance(node.op, Affine) and all(i == 0 for i in node.inputs) and len(node.inputs) == 1)

    def _query_rows(self, idx: torch.Tensor, n: int) -> torch.Tensor:
        """Rows e_i and −e_i for the units idx of an n-vector: lower bounds of both give the interval."""
        E = torch.zeros(2 * idx.numel(), n, dtype=DTYPE, device=idx.device)
        r = torch.arange(idx.numel(), device=idx.device)
        E[r, idx] = 1.0
        E[idx.numel() + r, idx] = -1.0
        return E

    def _crown_plan(self) -> tuple[set[int], set[int]]:
        """(the sites whose input is a copy of other nodes' units, the nodes CROWN queries for them). A Concat, Select
        or Permute copies units: CROWN bounds of a copy are those of its source, so such a site (a product's operands,
        a LayerNorm's (x, x − mean x), a broadcast 1/√var) is bounded through its sources, each queried once however
        many sites read it. A source needs no query when interval arithmetic is already exact on it: the input, an
        affine map of the input alone, the output of an elementwise activation (its range over its input's interval,
        which CROWN cannot beat: a 1/√var spread over a token's N units, queried N times before)."""
        if self._plan is None:
            via: set[int] = set()
            nodes: set[int] = set()
            for s, j in enumerate(self.site_input):
                # only with attention: elsewhere a copy feeds a ReLU (a BatchNorm's Scale), whose unstable units alone
                # are queried at the site itself
                if not self.attention or not isinstance(self.net.nodes[j].op, COPIES):
                    continue
                via.add(s)
                stack = [j]
                while stack:
                    k = stack.pop()
                    node = self.net.nodes[k]
                    if k == 0 or (k in self.site_of and node.op.elementwise):
                        continue
                    if isinstance(node.op, COPIES):
                        stack.extend(node.inputs)
                    elif not (isinstance(node.op, Affine) and all(i == 0 for i in node.inputs)):
                        nodes.add(k)
            self._plan = (via, nodes)
        return self._plan

    def needed(self) -> list[torch.Tensor]:
        """Per node, a mask of the units the output depends on (through any path; structurally, whatever the box).
        A unit off every path to the output needs no tight interval: its relaxation multiplies a coefficient that is 0
        in every back-substitution from the output, and a query row of a unit on a path has coefficients only on units
        on a path (what a unit depends on, the output does too). In a ViT whose head reads the class token, the last
        block's queries after its keys and values are one token's, not 65 tokens'.

        One back-substitution of a row of positive weights, each op's coefficients replaced by their magnitudes
        (random positive relaxation coefficients at the nonlinear sites, whose `relax` gives their shapes), so no two
        paths cancel; where an exact cancellation of random weights marked a needed unit off, that unit would keep its
        interval arithmetic bounds: sound, only looser. Computed on graphs with attention only (elsewhere every unit)."""
        if self._needed is None and not self.attention:  # a conv net's or an MLP's output reads every unit
            self._needed = [torch.ones(n, dtype=torch.bool, device=self.device) for n in self.net.sizes]
        if self._needed is None:
            gen = torch.Generator(device=self.device).manual_seed(0)

            def positive(t: torch.Tensor) -> torch.Tensor:
                return torch.rand(t.shape, generator=gen, dtype=DTYPE, device=self.device) + 0.5

            sizes = self.net.sizes
            masks = [torch.zeros(n, dtype=torch.bool, device=self.device) for n in sizes]
            acc = {self.net.output: torch.ones(1, sizes[self.net.output], dtype=DTYPE, device=self.device)}
            for k in range(self.net.output, 0, -1):
                w = acc.pop(k, None)
                if w is None:
                    continue
                masks[k] = w[0] > 0
                A = positive(w) * masks[k]
                node = self.net.nodes[k]
                if isinstance(node.op, Affine):
                    parts, _ = node.op.back(A)
                elif node.op.elementwise:
                    parts = [A]
                else:  # a product, a variance, a softmax's sums: random positive lines of relax's shapes
                    n_in = sizes[node.inputs[0]]
                    ones = torch.ones(n_in, dtype=DTYPE, device=self.device)
                    relax = tuple(positive(t) for t in node.op.relax(ones, 2 * ones))
                    parts = [node.op.back(A, relax)[0]]
                for i, Ai in zip(node.inputs, parts):
                    Ai = Ai.abs()
                    acc[i] = acc[i] + Ai if i in acc else Ai
            masks[0] = torch.ones(sizes[0], dtype=torch.bool, device=self.device)
            self._needed = masks
        return self._needed

    def _rows(self, j: int, idx: torch.Tensor, n: int, float32: bool = False,
              cuts: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """CROWN's (lower, upper) bounds of the units idx of node j's value (n units), in batches of rows (on the CPU
        of CPU_CROWN_CHUNK elements, else CHUNK_ELEMENTS); `cuts`: where the queries stop (`backward`)."""
        chunk = (CPU_CROWN_CHUNK_ATTENTION if self.attention else CPU_CROWN_CHUNK) if self.device.type == "cpu" \
            else CHUNK_ELEMENTS
        step = max(1, chunk // max(1, self.width(j)) // 2)
        los, ups = [], []
        for i in range(0, idx.numel(), step):
            part = idx[i:i + step]
            b = self.backward(self._query_rows(part, n), j, float32=float32, cuts=cuts, depth=self.cut_depth or 1)
            los.append(b[:part.numel()])
            ups.append(-b[part.numel():])
        lo, up = torch.cat(los), torch.cat(ups)
        s = self.site_of.get(j)
        if s is not None and isinstance(self.op(s), Variance):
            lo = self._variance_lower(s, idx, n, lo, up, float32, cuts)
        return lo, up

    # a LayerNorm variance's lower bound: Adam steps on each queried row's tangent points (0: the two fixed choices only).
    # Off by default, by measurement (benchmarks/peers/crown-vit/README.md): at 20 steps it raised the margin bounds of
    # a 17-token timm ViT a lot (−1973 → −19 on one property) but decided nothing more on deit_tiny 32×2's verify
    # stage, whose float pass took 3× as long (260 s against 87 s) and whose int8 properties used their whole budget
    VARIANCE_STEPS: ClassVar[int] = 0
    VARIANCE_LR: ClassVar[float] = 0.1  # in units of each centred unit's interval width

    def _variance_lower(self, s: int, idx: torch.Tensor, n: int, lo: torch.Tensor, up: torch.Tensor, float32: bool,
                        cuts: dict | None) -> torch.Tensor:
        """A LayerNorm variance's lower bound (CROWN's `lo`, with the tangent planes of c² at c's centre) raised by other
        tangent points: each unit's end nearest 0 (`Variance.relax(tangent="near")`, auto_LiRPA's `BoundSqr`), then
        points optimized by Adam for each row's bound (`VARIANCE_STEPS`, from the better of the two, kept inside c's
        intervals; on the 17-token ViT, optimizing only the rows below half their upper bound left a margin bound at
        −3421 where every row's gave −73.9). Every tangent plane is a sound lower bound, so the best seen is. Neither
        fixed choice dominates (the centre keeps more of the row's correlation, the near ends never fall below the
        separable bound), and a variance's lower bound is what keeps 1/√(var + ε) finite. On a 17-token timm ViT, the
        final LayerNorm's class-token variance was bounded below by −0.004 at the centres and 0.010 at the near ends;
        the optimized points raised the margin bounds of 10 properties further, at a cost measured too high for the
        verify stage (`VARIANCE_STEPS`; benchmarks/peers/crown-vit/README.md)."""
        op = self.op(s)
        l, u = self.pre[s]
        (_, cl), (_, cu) = op.split(l), op.split(u)
        R, N = op.R, op.N
        cl, cu = cl.reshape(R, N), cu.reshape(R, N)
        keep, fin = self._relax_cache.get(s), self._finite.get(s)
        rows = torch.zeros(idx.numel(), n, dtype=DTYPE, device=idx.device)
        rows[torch.arange(idx.numel(), device=idx.device), idx] = 1.0  # e_i: lower bounds only

        def query(tangent) -> torch.Tensor:
            relax = op.relax(l, u, tangent=tangent)
            self._relax_cache[s], self._finite[s] = relax, all(bool(torch.isfinite(t).all()) for t in relax)
            out = self.backward(rows, self.sites[s], float32=float32, cuts=cuts, depth=self.cut_depth or 1)
            return torch.where(torch.isnan(out), torch.full_like(out, -math.inf), out)  # NaN (∞ − ∞): no bound

        try:
            with torch.no_grad():
                near = query("near")
            best = torch.maximum(lo, near)
            todo = torch.nonzero(best < up).flatten()  # a row whose interval is a point has nothing to gain
            finite = bool(torch.isfinite(cl).all() & torch.isfinite(cu).all())
            if not self.VARIANCE_STEPS or todo.numel() == 0 or self.expired() or not finite:
                return best
            centre, width = op.tangent_points(cl, cu, "centre"), cu - cl
            near_pt = op.tangent_points(cl, cu, "near")
            rows_t = idx[todo]  # the variance rows (LayerNorm rows) to optimize
            # each point as centre + θ·width, θ in [−½, ½] (inside c's interval: a point outside gives a plane the
            # nearest end's dominates), so that Adam's steps are in units of each interval's width
            w = width[rows_t].clamp(min=1e-30)
            start = torch.where((near[todo] > lo[todo])[:, None], (near_pt[rows_t] - centre[rows_t]) / w, 0.0)
            theta = start.clamp(-0.5, 0.5).requires_grad_(True)
            opt = torch.optim.Adam([theta], lr=self.VARIANCE_LR)

            def points(th: torch.Tensor) -> torch.Tensor:
                return centre.index_put((rows_t,), centre[rows_t] + th * width[rows_t])

            for _ in range(self.VARIANCE_STEPS):
                if self.expired():
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
                self._relax_cache.pop(s, None)
                self._finite.pop(s, None)
            else:
                self._relax_cache[s], self._finite[s] = keep, fin

    def _relu_rows(self, j: int, idx: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`_rows` for the input of a ReLU site at a fraction of float64's cost: first every unit with float32
        convolutions (`backward(float32=True)`: sound, a little looser), then again in float64 only the units whose
        float32 interval still crosses 0, which get float64's bounds. A ReLU's relaxation of a stable unit is exact
        whatever its interval, so this site's relaxations, its unstable units and their intervals are float64
        CROWN's (to float64 rounding), and so is every back-substitution through them: the spec rows', α-CROWN's,
        branch and bound's. A unit float32 proves stable keeps float32's interval, wider than float64's by at most
        the rounding error added (`_float32_back`); it reaches another bound only through interval arithmetic (the
        reference interval the later sites' CROWN bounds are intersected with), so a later unit whose interval
        arithmetic, not CROWN, is the binding side may be that much looser (on the [16,32] preact ResNet: the same
        spec bounds to 1e-14 and the same unstable units, benchmarks/peers/crown-preact1632). There most units
        queried end stable (2472 queried, 61 unstable at ε 0.002), and the float32 pass costs a quarter of float64's."""
        used = self._f32_used
        lo, up = self._rows(j, idx, n, float32=True)
        if self._f32_used == used:
            return lo, up  # no Conv ran in float32: these are float64's bounds
        open_ = torch.nonzero((lo < 0) & (up > 0)).flatten()
        if open_.numel():
            lo64, up64 = self._rows(j, idx[open_], n)
            lo, up = lo.clone(), up.clone()
            lo[open_], up[open_] = lo64, up64
        return lo, up

    def crown(self) -> None:
        """CROWN bounds of every site's input, site by site in topological order (each uses the ones before it), each
        intersected with the interval that the sites before it give by interval arithmetic: an activation whose range
        is narrower than its lines say (a grid's rounding, `ops.Rounding`) passes that on to the ReLUs after it.

        In a network whose every activation is a ReLU (or also a smooth gate, with FLOAT32_GATES), the ReLU sites'
        units are screened with float32 convolutions first (`_relu_rows`); in others (an int8 rounding's or a
        transformer op's relaxation depends on every unit's interval) every site is float64's. A site read through
        copies is bounded through its sources (`_crown_plan`). On a wide graph with attention, each query stops at the
        `cut_depth`-th cut of the graph whose interval CROWN has bounded (`backward`'s `cuts`)."""
        self.crown_failed = None
        self._crown_site: int | None = None
        try:
            self._crown()
        except Exception as e:
            note = self._unbounded_layer_norms() if isinstance(e, OutOfDomain) else ""
            if note:  # the cause upstream of an overflow: say it in the answer's one line
                e = OutOfDomain(f"{str(e).splitlines()[0]}; upstream, {note}")
            self.crown_failed = e  # what stopped this box's pass (`first_pass` does not run it again to learn it)
            raise e from None

    def _unbounded_layer_norms(self, everywhere: bool = False) -> str:
        """An int8 LayerNorm whose float32 error has no bound on rows the output reads (`LayerNormRounding`: the box as
        bounded leaves those rows too little spread, or none: they may be constant), as one clause; "" if none. Only
        those the site CROWN stopped at reads, unless `everywhere` (a pass that finished with an unbounded margin)."""
        needed = self.needed()
        at = self._crown_site
        before = self.ancestors(self.sites[at]) if at is not None else set()
        parts = []
        for s, k in enumerate(self.sites):
            op = self.op(s)
            if not isinstance(op, LayerNormRounding) or not (everywhere or k in before):  # what the refusing site reads
                continue
            l, u = self.pre[s]
            rows = (torch.isinf(op.bound(l, u)) & needed[k]).reshape(op.R, op.N).any(1)
            if bool(rows.any()):
                parts.append(f"{op.source or 'a LayerNorm'} has no float32 error bound on {int(rows.sum())} of {op.R} "
                             f"rows (the bounds leave them too little spread: they may be constant over the box)")
        return "; ".join(parts)

    def why_unbounded(self) -> str:
        """Why a finished pass leaves a margin with no finite bound, as one clause ("" if no int8 LayerNorm says)."""
        return self._unbounded_layer_norms(everywhere=True)

    def _crown(self) -> None:
        stopped = False
        screen = all(isinstance(self.op(s), ReLU) or (FLOAT32_GATES and isinstance(self.op(s), Gate))
                     for s in range(len(self.sites)))
        via, nodes = self._crown_plan()
        need = self.needed()
        cuts: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = {} if self.cut_depth else None

        def tighten(s: int, lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            nonlocal stopped
            self._crown_site = s  # where a relaxation that refuses its interval stops the pass (`_unbounded_layer_norms`)
            self._tighten(s, torch.arange(lo.numel(), device=lo.device), lo, hi)
            stopped = stopped or self.expired()
            if stopped or self._exact_by_ibp(s) or s in via:
                return self.pre[s]
            j = self.site_input[s]
            idx = self._query(s)
            every = idx.numel() == self.net.sizes[j]
            idx = idx[need[j][idx]]  # the units the output depends on (`needed`)
            if idx.numel() == 0:
                return self.pre[s]
            n = self.pre[s][0].numel()
            if screen and isinstance(self.op(s), ReLU):
                lo, up = self._relu_rows(j, idx, n)
            else:
                lo, up = self._rows(j, idx, n, float32=screen and isinstance(self.op(s), Gate), cuts=cuts)
            self._tighten(s, idx, lo, up)
            if cuts is not None and every:  # every needed unit queried (the rest are read by no query row)
                cuts[j] = self.pre[s]
            return self.pre[s]

        def at_node(k: int, lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            nonlocal stopped
            if k not in nodes or stopped:
                return lo, hi
            stopped = self.expired()
            if stopped:
                return lo, hi
            idx = torch.nonzero(need[k]).flatten()
            if idx.numel() == 0:
                return lo, hi
            l, u = self._rows(k, idx, self.net.sizes[k], cuts=cuts)
            lo, hi = lo.clone(), hi.clone()
            lo[0, idx], hi[0, idx] = torch.maximum(lo[0, idx], l), torch.minimum(hi[0, idx], u)
            if cuts is not None:
                cuts[k] = (lo[0], hi[0])
            return lo, hi

        self._interval_pass(tighten, at_node if nodes else None)
        if not stopped:
            self.method = "crown"

    @classmethod
    def crown_many(cls, bounders: Sequence["Bounder"]) -> None:
        """CROWN for several Bounders of one graph (built from the same Graph, each over its own box: the properties of
        one network), leaving each exactly as its own `crown()` would (its `pre`, `method`, relaxation cache), each
        stopping where its own `expired` says, as `crown()` does. The scheduler's batched first pass
        (`first_pass.run`) calls it; this body is the plain loop, to be replaced by one pass with the boxes as a batch
        dimension (as α,β-CROWN batches domains) that must leave the same bounds up to float64 rounding."""
        for b in bounders:
            b.crown()

    @classmethod
    def alpha_spec_many(cls, work: Sequence[tuple["Bounder", Spec, Sequence[int]]], steps: int = 30,
                        lr: float = 0.1) -> list[torch.Tensor]:
        """α-CROWN (`alpha_spec`) for several (Bounder, rows, owner) of one graph, each over its own box: returns, per
        item, what its own `alpha_spec(spec, owner, steps, lr)` returns (lower bounds of its rows, sound; each stops
        where its bounder's `expired` says) and leaves its `spec_slopes` as that call would. The plain loop, to be
        replaced by one optimization over the batch where that pays."""
        return [b.alpha_spec(spec, owner, steps, lr) for b, spec, owner in work]

    def spec_bounds(self, spec: Spec, slopes: dict[int, Any] | None = None, exact: bool = True) -> torch.Tensor:
        """Lower bounds of each row of C y + d."""
        return self.backward(spec.C, self.net.output, slopes, exact) + spec.d

    # -- α-CROWN ---------------------------------------------------------------------------------
    def _optimize(self, A: torch.Tensor, node: int, steps: int, lr: float,
                  objective: Callable[[torch.Tensor], torch.Tensor], done: Callable[[torch.Tensor], bool],
                  until: Callable[[], bool] | None = None, keep: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        """Maximize objective(lower bounds of A·h) over the slopes of the sites node `node` depends on, until the
        steps are done, the budget ends or `until()`; returns the elementwise best lower bounds seen (each iterate
        is sound, so their max is). `keep` receives each ReLU site's slopes [rows, n] of each row's best bound."""
        stop = self._stop(until)
        sites = [s for s in self.sites_before(node) if self.optimizable(s)]
        rows = A.shape[0]
        slopes = {s: self.initial_slopes(s, rows) for s in sites}
        params = []
        for s in sites:
            for p in (slopes[s] if isinstance(slopes[s], tuple) else (slopes[s],)):
                p.requires_grad_(True)
                params.append(p)
        relu = [s for s in sites if isinstance(self.op(s), ReLU)]

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
        opt = Adam(params, lr=lr)
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
        """α-CROWN for the inputs of ReLU sites that depend on an earlier site, one site at a time in order: the
        unstable units' bounds both ways, slopes of the sites before optimized for their sum. Gate sites keep CROWN's.
        Stops at the budget's end or `until()`; a later call goes on from the first site not done. True when every
        site is done."""
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
        if not isinstance(self.op(s), ReLU):
            return
        j = self.site_input[s]
        if not self.sites_before(j):
            return
        idx = self._query(s)
        if idx.numel() == 0 or 2 * idx.numel() * self.width(j) > CHUNK_ELEMENTS:
            return  # nothing unstable, or too wide to optimize at once: CROWN's bounds stay
        m = idx.numel()
        # stop once every unit is stable: sign is what the MILP's binaries and the branching need
        best = self._optimize(self._query_rows(idx, self.pre[s][0].numel()), j, steps, lr, objective=lambda b: b.sum(),
                              done=lambda b: bool(torch.all((b[:m] >= 0) | (b[m:] >= 0))), until=stop)
        self._tighten(s, idx, best[:m], -best[m:])

    def alpha_spec(self, spec: Spec, owner: Sequence[int], steps: int = 30, lr: float = 0.1) -> torch.Tensor:
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

    def result(self) -> BoxBounds:
        return BoxBounds(self.net, self.lb, self.ub, self.ibp_pre, self.ibp_out, list(self.pre), self.method)


# |values| beyond this are unknown: far beyond float32's range (3.4e38), so beyond any value a float32 network computes;
# finite, so that interval arithmetic on an unknown unit never meets ∞·0 or ∞ − ∞ (0·UNKNOWN is 0)
UNKNOWN = 1e300


def unbounded_below(margin: float) -> bool:
    """Whether a margin bound is an unknown unit's −`UNKNOWN` (no finite bound), however it was summed or rounded."""
    return float(margin) <= -UNKNOWN / 2


def _unknown_nan(lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An interval whose ends may be ±∞ or NaN (a transformer op outside what the box proves: an exp that overflows, a
    divisor not provably positive, a LayerNorm's float32 error beyond its bound) with unknown ends as ∓UNKNOWN."""
    return (torch.nan_to_num(lo, nan=-UNKNOWN, neginf=-UNKNOWN, posinf=UNKNOWN).clamp(min=-UNKNOWN),
            torch.nan_to_num(hi, nan=UNKNOWN, neginf=-UNKNOWN, posinf=UNKNOWN).clamp(max=UNKNOWN))


def _dot(A: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Σ_j A[:, j]·v[..., j] per row: v one vector [n] (a matrix-vector product) or one per row [rows, n]."""
    return A @ v if v.dim() == 1 else (A * v).sum(-1)


def _ieee_float32() -> bool:
    """Does torch compute float32 matrix products and oneDNN convolutions in IEEE float32 (not TF32 or bf16)?"""
    mk = torch.backends.mkldnn
    modes = {getattr(mk, "fp32_precision", "none"), getattr(getattr(mk, "conv", None), "fp32_precision", "none")}
    return torch.get_float32_matmul_precision() == "highest" and modes <= {"none", "ieee"}


def _detach(v):
    return tuple(t.detach() for t in v) if isinstance(v, tuple) else v.detach()


def excluded(lower: torch.Tensor, owner: Sequence[int], n_disjuncts: int) -> list[bool]:
    """Per disjunct: does some row's lower bound (of A_r y − b_r) exceed 0?"""
    out = [False] * n_disjuncts
    for v, j in zip(lower.tolist(), owner):
        out[j] = out[j] or v > 0
    return out


# ---------------------------------------------------------------------------------------------
# the swap gap: |smooth(x) − ReLU(x)| over a box


def swap_gap(smooth: Graph, relu_pre: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """A sound bound, per output, on |smooth(x) − relu(x)| for every x in the box on which `relu_pre` bounds
    the ReLU network's activation inputs (site by site; relu = `smooth.relu_version()`, same weights).

    δ bounds |z' − z| elementwise (z' the smooth network's values, z the ReLU network's), node by node; δ = 0 on
    the input. Affine maps carry it as |M|·δ (`ops.Affine.abs_forward`). At a gate site with ReLU-network input
    z ∈ [l, u], z' ∈ [l − δ, u + δ]:

        |f(z') − ReLU(z)| ≤ sup_{[l−δ, u+δ]} |f − ReLU| + (0 if u + δ ≤ 0 else δ)      (ReLU is 1-Lipschitz)
        |f(z') − ReLU(z)| ≤ |f(z') − f(z)| + |f(z) − ReLU(z)| ≤ L·δ + sup_{[l, u]} |f − ReLU|,

    L the largest |f'| on [l − δ, u + δ]; the smaller of the two per unit. A unit whose interval stays a
    distance r from 0 adds at most r·tail(λr), exponentially small in λr."""
    net = smooth.merged()
    sites = net.activations
    if len(relu_pre) != len(sites):
        raise ValueError(f"{len(relu_pre)} pre-activation bounds for {len(sites)} activation sites")
    site_of = {k: s for s, k in enumerate(sites)}
    d: list[torch.Tensor | None] = [None] * len(net.nodes)
    d[0] = torch.zeros(1, net.num_inputs, dtype=DTYPE, device=net.device)
    for k, node in enumerate(net.nodes[1:], start=1):
        if isinstance(node.op, Affine):
            d[k] = node.op.abs_forward(*(d[i] for i in node.inputs))
            continue
        dk = d[node.inputs[0]][0]
        l, u = relu_pre[site_of[k]]
        relu_moves = torch.where(u + dk <= 0, torch.zeros_like(dk), dk)
        if isinstance(node.op, ReLU):
            d[k] = relu_moves[None]
            continue
        if not isinstance(node.op, Gate):
            if not hasattr(node.op, "gap"):
                raise UnsupportedModel(f"the swap gap has no rule for {type(node.op).__name__}")
            # an op both networks share (exp, a product, ...): how far its output moves when its input moves by dk
            d[k] = node.op.gap(l, u, dk)[None]
            continue
        gate = SMOOTH_GATES[node.op.kind]
        lam = node.op.lam
        via_relu = swap_gap_unit(gate, lam, l - dk, u + dk) + relu_moves
        lo, hi = slope_range(gate, lam * (l - dk), lam * (u + dk))
        via_gate = torch.maximum(lo.abs(), hi.abs()) * dk + swap_gap_unit(gate, lam, l, u)
        d[k] = torch.minimum(via_relu, via_gate)[None]
    return d[net.output][0]
