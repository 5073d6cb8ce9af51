"""Sound bounds of a `graph.Graph` over an input box: IBP, CROWN (linear relaxations with back-substitution
over the DAG, DeepPoly's idea) and α-CROWN (`alpha`: the relaxations' slopes optimized by projected gradient).

`Bounder` is the driver: it walks the graph and asks each op for what it owns (`ops.base`: an affine op's `ibp` and
`back`, an activation's `interval`, `crown_lines`, its α, which units to query); it never switches on an op's type.

Back-substitution over a DAG: the coefficients A_k on each node's output are summed over its consumers; nodes are
visited in reverse topological order, so A_k is complete when node k is reached (auto_LiRPA's `backward_general`
does the same). An affine node passes A_k to its inputs (`Affine.back`); an activation node replaces A_k by
A⁺·lower line + A⁻·upper line of its relaxation on its input's interval.

One small engine in torch float64; bounds are computed without directed rounding (as auto_LiRPA does): what
they miss by float64 rounding is ~1e-12 relative, far below the margins a decision rests on. The gate
relaxations' own evaluation error is covered (`ops.gates.G_REL_ERROR`).

Device-generic: a `Bounder` computes on its graph's device (`Graph.device`, the weights'); the box, the query rows and
every tensor it makes are created there, so a bound pass never reads a value on the host (the budget checks and the
per-site loops read Python numbers only). `tests/test_verify_device.py` runs the passes with tensors made anywhere
else turned into an error.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from .alpha import AlphaCrown
from .crown import CHUNK_ELEMENTS, CUT_DEPTH, CUT_MIN_WIDTH, CrownPass
from .float32 import Float32Back
from .graph import Graph
from .ops.base import DTYPE, as_tensor
from .ops.relu import ReluLines


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
        return [int(op.unstable(l, u).sum()) for (l, u), op in zip(pre, ops)]

    def stable(self, which: str = "tight") -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per site, (dead mask u ≤ 0, active mask l ≥ 0)."""
        pre = self.pre if which == "tight" else self.ibp_pre
        return [(u <= 0, l >= 0) for l, u in pre]


class Bounder(CrownPass, AlphaCrown, Float32Back):
    """Bounds of one graph over one input box [lb, ub] (flat, in the graph's input units), on the graph's device."""

    def __init__(self, net: Graph, lb: Any, ub: Any, expired: Callable[[], bool] | None = None):
        self.net = net.merged()
        self.device = self.net.device
        for node in self.net.nodes[1:]:
            if not node.op.affine:
                node.op.check_bounded()
        self.lb = as_tensor(lb, self.device).reshape(-1).clone()  # copies: the caller's arrays may be views
        self.ub = as_tensor(ub, self.device).reshape(-1).clone()
        if self.lb.numel() != self.net.num_inputs or self.lb.shape != self.ub.shape:
            raise ValueError(f"the box has {self.lb.numel()} inputs, the network {self.net.num_inputs}")
        if bool(torch.any(self.lb > self.ub)):
            raise ValueError("empty box: some lb > ub")
        self.expired = expired or (lambda: False)
        self.sites = self.net.activations  # node id of each activation site
        self.alpha_done: set[int] = set()  # sites whose bounds α-CROWN has optimized (alpha_intermediate)
        # (rows C, {branchable site: slopes [rows, n]}) of the last `alpha_spec`: the lower slopes of each row's best bound
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
        self._consumers: list[list[int]] | None = None  # per node, the nodes reading it (`_not_worth_querying`)
        self._ranges: list[torch.Tensor] | None = None  # per site, its output's sampled range (`_sampled_ranges`)
        self._chains: dict[int, tuple[list[int], int] | None] = {}  # per queried node, `_local_chain`
        self.crown_failed: Exception | None = None  # what stopped the last `crown()` (an exp that may overflow)
        # attention (a product of two variables, a softmax): a site read through copies is bounded through their sources
        # (`_crown_plan`), and on a wide graph CROWN's intermediate queries stop at the first cut; neither elsewhere
        self.attention = any(n.op.attention for n in self.net.nodes[1:])
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
            if node.op.affine:
                vals[k] = _unknown_nan(*node.op.ibp(*(vals[i] for i in node.inputs)))
                if at_node is not None:
                    vals[k] = at_node(k, *vals[k])
                continue
            lo, hi = vals[node.inputs[0]]
            l, u = at_site(self.site_of[k], lo[0], hi[0])
            glo, ghi = _unknown_nan(*node.op.interval(l, u))
            vals[k] = (glo[None], ghi[None])
            if at_node is not None:
                vals[k] = at_node(k, *vals[k])
        lo, hi = vals[self.net.output]
        return lo[0], hi[0]

    def ibp_spec(self, spec: Spec) -> torch.Tensor:
        """Interval bounds of the rows C y + d; C folded into a last one-input affine map after an activation site
        (tighter than bounding y first: the rows' weights on the site's output are combined before the interval)."""
        out = self.net.nodes[self.net.output]
        C, d = spec.C, spec.d
        if out.op.affine and len(out.inputs) == 1 and out.inputs[0] in self.site_of:
            s = self.site_of[out.inputs[0]]
            lo, hi = _unknown_nan(*self.op(s).interval(*self.ibp_pre[s]))
            (W,), c = out.op.back(C)
            return W.clamp(min=0) @ lo + W.clamp(max=0) @ hi + c + d
        lo, hi = self.ibp_out
        return C.clamp(min=0) @ lo + C.clamp(max=0) @ hi + d

    # -- relaxations -------------------------------------------------------------------------------
    def relaxation(self, s: int, slopes: Any = None, exact: bool = True):
        """(al, bl, au, bu) with al·x + bl ≤ act(x) ≤ au·x + bu on site s's interval; shapes [n] or [rows, n]
        when `slopes` is per row (bl None for a ReLU: 0); the op's own `crown_lines`."""
        if slopes is None and s in self._relax_cache:
            return self._relax_cache[s]
        out = self.op(s).crown_lines(*self.pre[s], slopes, exact)
        if slopes is None:
            self._relax_cache[s] = out
            if not self.op(s).elementwise:  # read once per relaxation (`_Bilinear.back`'s `unknown`)
                self._finite[s] = all(bool(torch.isfinite(t).all()) for t in out)
        return out

    # -- back-substitution -----------------------------------------------------------------------
    def _ops(self, dtype: torch.dtype) -> list:
        if dtype not in self._cast:
            self._cast[dtype] = [None] + [n.op.cast(dtype) for n in self.net.nodes[1:]]
        return self._cast[dtype]

    def backward(self, A: torch.Tensor, node: int, slopes: dict[int, Any] | None = None,
                 exact: bool = True, bounds: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
                 extra: dict[int, torch.Tensor] | None = None, record: dict[int, torch.Tensor] | None = None,
                 inputs: list[torch.Tensor] | None = None, float32: bool = False,
                 cuts: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None, depth: int = 1,
                 consts: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Lower bounds of A·h over the box, h the value of graph node `node`; A (rows, size), computed in A's dtype
        (float64 unless branch and bound searches in float32; what float32 closes is re-checked in float64 there).
        `float32`: the Convs that pay run in float32 with their rounding error added (`_float32_back`): sound, and
        looser than float64's by that error (CROWN's screen of a ReLU site's units, `_relu_rows`).

        For branch and bound: `bounds[s]` replaces site s's interval (per row: [rows, n]), or gives its relaxation (a ReLU
        site's `ReluLines`, a grid rounding's `FixedLines` on a domain's index range: computed once for many
        passes); `extra[s]` is added to
        the coefficients of site s's input after its relaxation (β·split terms); `record[s]` receives the
        coefficients of site s's output; `inputs` receives the final coefficients on the input (rows, n_in), `consts`
        the constant (rows): each row's lower bound as a linear function of the input.

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
            passed = passed or not n.op.affine
            if n.op.affine:
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
                al, bl, au, bu = self.op(s).crown_lines(*bounds[s], sl, exact)
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
        if consts is not None:
            consts.append(const.detach())
        return A_in.clamp(min=0) @ self.lb.to(dtype) + A_in.clamp(max=0) @ self.ub.to(dtype) + const

    def _crossing(self, s: int, al: torch.Tensor, au: torch.Tensor, bu: torch.Tensor) -> torch.Tensor:
        """The units of ReLU site s whose CROWN lines are not one line through 0 (a stable unit's are x or 0), kept until
        the site's bounds change (as its relaxation)."""
        if s not in self._cross:
            self._cross[s] = torch.nonzero((au != al) | (bu != 0)).flatten()
        return self._cross[s]

    def width(self, node: int) -> int:
        """The widest value back-substitution from `node` carries (for chunking its rows)."""
        return max(self.net.sizes[k] for k in self.ancestors(node))

    def fits(self, rows: int, node: int) -> bool:
        """Do `rows` query rows back-substituted from `node` fit in one batch (CHUNK_ELEMENTS)?"""
        return rows * self.width(node) <= CHUNK_ELEMENTS

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

    def spec_bounds(self, spec: Spec, slopes: dict[int, Any] | None = None, exact: bool = True) -> torch.Tensor:
        """Lower bounds of each row of C y + d."""
        return self.backward(spec.C, self.net.output, slopes, exact) + spec.d


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




def excluded(lower: torch.Tensor, owner: Sequence[int], n_disjuncts: int) -> list[bool]:
    """Per disjunct: does some row's lower bound (of A_r y − b_r) exceed 0?"""
    out = [False] * n_disjuncts
    for v, j in zip(lower.tolist(), owner):
        out[j] = out[j] or v > 0
    return out

