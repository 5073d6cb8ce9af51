"""CROWN's intermediate bounds (`CrownPass`, a part of `bounds.Bounder`): site by site in topological order, the units
each op says are worth it (`Activation.query`) queried by back-substitution in batches, through copies to their
sources on a graph with attention (elsewhere where those sources are exact already), only the units the output depends
on and, at a smooth site, only those whose lines are not already near-exact on their interval arithmetic interval
(`_near_exact`), a site behind a 1×1 expansion through the expansion's input (`_rows_through`); each interval
intersected with interval arithmetic's; a site's op may raise its own rows (`Activation.refine_rows`) and say why a
bound is missing (`Activation.unbounded_note`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from . import float32
from .ops.base import DTYPE, OutOfDomain

CHUNK_ELEMENTS = 2 ** 25  # coefficient rows × width per back-substitution batch (256 MB of float64)
# CROWN's query rows on the CPU, per batch: a batch whose coefficients (1 MB of float64) stay in the core's cache across
# the ops of a back-substitution step is faster than one batch of all rows (benchmarks/verify-results/crown-speed.md)
CPU_CROWN_CHUNK = 2 ** 17
# with attention, a row back-substitutes through layers 2–3× the widest node's size (a softmax's T×T coefficients per
# head) and a batch of 2^17 elements is ~7 rows, whose per-op overhead dominates; 2^19 is the fastest measured on the
# 64-token ViT (`benchmarks/verify-results/VIT64.md`)
CPU_CROWN_CHUNK_ATTENTION = 2 ** 19
# A smooth site's unit is left unqueried when the gap between its lines on its interval arithmetic interval is at most
# this part of its output's range over NEAR_EXACT_SAMPLES points of the box (`CrownPass._near_exact`): a query could
# narrow that gap, never below 0, so each back-substitution through the unit loses at most this part of what the unit
# moves. 0 queries every unit.
NEAR_EXACT = 0.01
NEAR_EXACT_SAMPLES = 64
# A smooth site's input j = M h_k + b read from a node k of at most this part of the units queried at j: CROWN bounds
# k's units as linear functions of the input and substitutes them into M (`CrownPass._rows_through`), so many fewer
# rows go back through the graph (a squeeze-excite block's 1×1 expansion: 6× fewer)
THROUGH_RATIO = 0.5
THROUGH_ELEMENTS = 2 ** 25  # k's linear bounds (2·n_k rows × the input's units, float64: 256 MB) at most this many
# `_local_back`: query rows carried on the units they reach only where those are at most this share of the node's
LOCAL_SHARE = 0.25
CUT_DEPTH = 1  # on a wide graph with attention: CROWN's intermediate queries concretize at this many cuts behind them
CUT_MIN_WIDTH = 8192  # "wide": a node of this many units (the 64-token ViT's qkv: 12,480; deit_tiny 32×2 on 8×8: 2,176)


class CrownPass:
    """CROWN's methods of `bounds.Bounder` (which gives `backward`, `_interval_pass`, `_tighten`, `pre`, `sites`)."""

    def _query(self, s: int) -> torch.Tensor:
        """Units of site s whose bounds are worth tightening (the op's `query`: a ReLU's unstable units, ...)."""
        return self.op(s).query(*self.pre[s])

    def _exact_by_ibp(self, s: int) -> bool:
        """A site fed by one affine op on the input (or the input itself): its interval bounds are the exact range. So
        are those of one affine op on a site whose lines are flat (`flat_lines`: an int8 graph's first quantization),
        as far as CROWN can tell: its back-substitution reaches that site's constant lines, the interval's ends."""
        j = self.site_input[s]
        node = self.net.nodes[j]
        if j == 0:
            return True
        if not node.op.affine or len(node.inputs) != 1:
            return False
        i = node.inputs[0]
        return i == 0 or (i in self.site_of and self.op(self.site_of[i]).flat_lines)

    def _copied(self, s: int) -> tuple[int, torch.Tensor] | None:
        """(site t, the unit of t per unit of s) when site s's input is per-unit copies (`unit_sources`) of the output of
        a site t whose interval is its exact range (`exact_interval`: a clamp's second ReLU reads its first's output):
        then a unit of s whose source CROWN queried at t has an interval CROWN cannot beat (the source's relaxation
        evaluated at the source's CROWN bounds), and needs no query of its own; None otherwise."""
        j, units = self.site_input[s], None
        while j not in self.site_of:
            node = self.net.nodes[j]
            src = node.op.unit_sources() if j and node.op.affine and len(node.inputs) == 1 else None
            if src is None:
                return None
            units = src if units is None else src[units]
            j = node.inputs[0]
        t = self.site_of[j]
        return (t, units) if units is not None and self.op(t).exact_interval else None

    def _readers(self, j: int) -> list[int]:
        """The nodes reading node j's value (the graph's consumer lists, built once)."""
        if self._consumers is None:
            self._consumers = self.net.consumers()
        return self._consumers[j]

    def _unit_to_unit(self, k: int) -> bool:
        """Is node k a one-input affine op whose output unit i reads its input's unit i alone (a Scale)?"""
        node = self.net.nodes[k]
        src = node.op.unit_sources() if node.op.affine and len(node.inputs) == 1 else None
        return (src is not None and src.numel() == self.net.sizes[node.inputs[0]]
                and torch.equal(src, torch.arange(src.numel(), device=src.device)))

    def _not_worth_querying(self, s: int) -> torch.Tensor | None:
        """Mask of site s's units whose CROWN query would change no relaxation. Their output reaches the rest of the graph
        only through one-input elementwise affine ops and elementwise sites (an int8 rounding's clamp: two ReLUs) up to
        an op that mixes units, and on the interval each site gets from s's current one, either
        - some site on the way is `constant` (the clamp's dead ReLU): every back-substitution gives them coefficient 0,
          and the sites' intervals only narrow; or
        - every site on the way is `fixed` (a stable ReLU: x or 0 on any narrower interval) and s's own lines are `loose`
          (a grid rounding over many steps): the tighter interval would move no line, only the interval arithmetic
          after the mixing op, which the next sites' own queries tighten.
        None where s's output is read otherwise (two consumers, a site that is not elementwise), or where s's op is not
        elementwise (a LayerNorm's variance: its output units are not its input's, which CROWN queries)."""
        if not self.op(s).elementwise:
            return None
        lo, hi = (t[None] for t in self.op(s).interval(*self.pre[s]))
        skip = torch.zeros(lo.shape[1], dtype=torch.bool, device=lo.device)
        through = ~skip  # fixed lines at every site so far
        j, mixed = self.sites[s], False
        while j != self.net.output:
            if len(self._readers(j)) != 1:
                break
            j = self._readers(j)[0]
            if j in self.site_of:
                t = self.op(self.site_of[j])
                if not t.elementwise:
                    break
                dead = t.constant(lo[0], hi[0])
                skip = skip | (through & dead)
                through = through & t.fixed(lo[0], hi[0]) & ~dead
                lo, hi = (v[None] for v in t.interval(lo[0], hi[0]))
                continue
            op = self.net.nodes[j].op
            if not self._unit_to_unit(j):
                mixed = op.affine  # interval arithmetic alone reads them there
                break
            lo, hi = op.ibp((lo, hi))
        else:
            mixed = True  # the output: the spec rows read no interval
        if mixed:
            skip = skip | (through & self.op(s).loose(*self.pre[s]))
        return skip if bool(skip.any()) else None

    def _near_exact(self, s: int, idx: torch.Tensor) -> torch.Tensor:
        """Mask of the units idx of site s that CROWN need not query: the op allows it (`skip_near_exact`: a smooth
        curve) and the gap of its lines on the unit's current interval (`line_gap`) is at most NEAR_EXACT times the
        range of the unit's output over sampled points of the box (`_sampled_ranges`), so tightening the interval
        could make its lines better by at most that. Sound whatever it says (an unqueried unit keeps its interval
        arithmetic bounds); the samples only say where a query pays."""
        op = self.op(s)
        if not NEAR_EXACT or not op.skip_near_exact or idx.numel() == 0:
            return torch.zeros(idx.numel(), dtype=torch.bool, device=idx.device)
        gap = op.line_gap(*self.pre[s])[idx]  # on the whole site: an op's tensors are per unit (a gate's λ)
        return gap <= NEAR_EXACT * self._sampled_ranges()[s][idx]

    def _sampled_ranges(self) -> list[torch.Tensor]:
        """Per site, the range (max − min) of each output unit over NEAR_EXACT_SAMPLES points of the box (a quarter of
        them corners, the rest uniform; seed 0), computed once."""
        if self._ranges is None:
            gen = torch.Generator(device=self.device).manual_seed(0)
            n = NEAR_EXACT_SAMPLES
            t = torch.rand(n, self.lb.numel(), generator=gen, dtype=DTYPE, device=self.device)
            t[: n // 4] = (t[: n // 4] > 0.5).to(DTYPE)
            lo = [None] * len(self.sites)
            hi = [None] * len(self.sites)
            for i in range(0, n, 16):  # a few points at a time: every node's values are kept until the last
                vals = self.net.values(self.lb + t[i:i + 16] * (self.ub - self.lb))
                for s, k in enumerate(self.sites):
                    v = vals[k]
                    lo[s] = v.min(0).values if lo[s] is None else torch.minimum(lo[s], v.min(0).values)
                    hi[s] = v.max(0).values if hi[s] is None else torch.maximum(hi[s], v.max(0).values)
            self._ranges = [h - l for l, h in zip(lo, hi)]
        return self._ranges

    def _through(self, s: int, idx: torch.Tensor) -> bool:
        """Are site s's units idx better bounded through the input of its input node (`_rows_through`)? Its op allows
        it (`skip_near_exact`: a smooth curve; a ReLU site's few unstable units go straight back), its input is a
        one-input affine map of a node k ≠ the input, with at most THROUGH_RATIO times as many units as idx, whose
        linear bounds fit THROUGH_ELEMENTS."""
        j = self.site_input[s]
        node = self.net.nodes[j]
        if not self.op(s).skip_near_exact or self.cut_depth or not node.op.affine or len(node.inputs) != 1 \
                or node.inputs[0] == 0:
            return False
        n_k = self.net.sizes[node.inputs[0]]
        return n_k <= THROUGH_RATIO * idx.numel() and 2 * n_k * self.net.num_inputs <= THROUGH_ELEMENTS

    def _rows_through(self, j: int, idx: torch.Tensor, float32: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """CROWN's (lower, upper) bounds of the units idx of the affine node j = M h_k + b by way of its input node k:
        CROWN's lower and upper linear functions of the input, L(x) ≤ h_k(x) ≤ U(x) on the box (one query row per unit
        of k and side), substituted into M: with mid = (L + U)/2 and rad = (U − L)/2 ≥ 0,

            M·mid(x) − |M|·rad(x) + b ≤ h_j(x) ≤ M·mid(x) + |M|·rad(x) + b,

        each side linear in x, concretized on the box. Sound; looser than querying j's units themselves by |M|·rad,
        the gaps of the relaxations behind k, and 2·n_k rows go back instead of 2·|idx|. The caller queries straight
        back the units whose lines on these bounds are not near-exact (`_near_exact`), where that looseness would
        reach the site's relaxation."""
        op = self.net.nodes[j].op
        k = self.net.nodes[j].inputs[0]
        n_k, n_in = self.net.sizes[k], self.net.num_inputs
        chunk = CPU_CROWN_CHUNK if self.device.type == "cpu" else CHUNK_ELEMENTS
        step = max(1, chunk // max(1, self.width(k)) // 2)
        units = torch.arange(n_k, device=self.device)
        coef, const = [], []
        for i in range(0, n_k, step):
            part = units[i:i + step]
            self.backward(self._query_rows(part, n_k), k, float32=float32, inputs=coef, consts=const)
        lower_c = torch.cat([c[:c.shape[0] // 2] for c in coef])  # rows e_i: h_k ≥ L; rows −e_i: −h_k ≥ −U
        upper_c = -torch.cat([c[c.shape[0] // 2:] for c in coef])
        lower_b = torch.cat([c[:c.shape[0] // 2] for c in const])
        upper_b = -torch.cat([c[c.shape[0] // 2:] for c in const])
        mid_c, rad_c = ((upper_c + lower_c) / 2).T, ((upper_c - lower_c) / 2).T  # [n_in, n_k]
        del coef, lower_c, upper_c
        bias = op.forward(torch.zeros(1, n_k, dtype=DTYPE, device=self.device))[0]
        mid_b = op.forward(((upper_b + lower_b) / 2)[None])[0]
        rad_b = op.abs_forward(((upper_b - lower_b) / 2)[None])[0]
        lo, up = mid_b - rad_b, mid_b + rad_b
        rows = max(1, chunk // max(1, self.net.sizes[j]))
        for i in range(0, n_in, rows):  # the inputs' coefficients a few at a time: M·mid_c is n_in × n_j
            m = op.forward(mid_c[i:i + rows]) - bias
            r = op.abs_forward(rad_c[i:i + rows])
            xl, xu = self.lb[i:i + rows, None], self.ub[i:i + rows, None]
            c_lo, c_up = m - r, m + r
            lo = lo + (c_lo.clamp(min=0) * xl + c_lo.clamp(max=0) * xu).sum(0)
            up = up + (c_up.clamp(min=0) * xu + c_up.clamp(max=0) * xl).sum(0)
        return lo[idx], up[idx]

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
        which CROWN cannot beat: a 1/√var spread over a token's N units, queried N times before).

        Without attention, only the sites whose every source is the input or a smooth curve's output (`skip_near_exact`:
        a squeeze-excite's product x·σ(pooled) of SiLU outputs), whose every unit CROWN queried or left with lines
        near-exact on its interval: a ReLU's or a HardSwish's stable units keep interval arithmetic's bounds (their
        lines are exact whatever the interval), which a product reading them would inherit (mobilenetv3's
        squeeze-excite, whose hard sigmoid is a clamp's two ReLUs), and a copy that feeds a
        ReLU from an affine node (a BatchNorm's Scale) is queried at the site itself, its unstable units alone."""
        if self._plan is None:
            via: set[int] = set()
            nodes: set[int] = set()
            for s, j in enumerate(self.site_input):
                if j == 0 or not self.net.nodes[j].op.copies:
                    continue
                sources: set[int] = set()
                stack = [j]
                while stack:
                    k = stack.pop()
                    node = self.net.nodes[k]
                    if k == 0 or (k in self.site_of and node.op.elementwise and (self.attention or node.op.skip_near_exact)):
                        continue
                    if node.op.copies:
                        stack.extend(node.inputs)
                    elif not (node.op.affine and all(i == 0 for i in node.inputs)):
                        sources.add(k)
                if self.attention or not sources:
                    via.add(s)
                    nodes |= sources
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
                if node.op.affine:
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

    def _local_chain(self, j: int) -> tuple[list[int], int] | None:
        """(the nodes behind node j's one-input affine op that map unit i to unit i, in back-substitution order: elementwise
        sites and ops with `back_units`, each read by the one before it alone; the node behind them), or None where node
        j is not a one-input affine op or no such node follows it (`_local_back`)."""
        if j not in self._chains:
            node, out = self.net.nodes[j], None
            if j and node.op.affine and len(node.inputs) == 1:
                chain, k = [], node.inputs[0]
                while k and len(self._readers(k)) == 1:
                    op = self.net.nodes[k].op
                    if k in self.site_of:
                        if not op.elementwise:
                            break
                    elif not (self._unit_to_unit(k) and op.has_back_units):  # no rows on units alone
                        break
                    chain.append(k)
                    k = self.net.nodes[k].inputs[0]
                out = (chain, k) if chain else None
            self._chains[j] = out
        return self._chains[j]

    def _local_back(self, idx: torch.Tensor, j: int) -> torch.Tensor | None:
        """`backward` of CROWN's query rows of node j's units idx (`_query_rows`): back through j's affine op they are
        its rows as a matrix (`unit_rows`: a conv's kernel on its window), nonzero on few units, so through the
        unit-to-unit ops behind it (`_local_chain`: an int8 rounding, its clamp's ReLUs and Scales) they are carried on
        the units some row reaches alone, and scattered into full rows where the next op mixes units, from which
        `backward` goes on. The same bounds up to float64 summation order; None where node j has no such chain."""
        chain = self._local_chain(j)
        if chain is None:
            return None
        nodes, m = chain
        R, c = self.net.nodes[j].op.unit_rows(idx)
        A, const = torch.cat([R, -R]), torch.cat([c, -c])
        units = torch.nonzero((A != 0).any(0)).flatten()
        if units.numel() > LOCAL_SHARE * A.shape[1]:
            return const + self.backward(A, nodes[0])
        A = A[:, units]
        for k in nodes:
            if k in self.site_of:
                al, bl, au, bu = (None if t is None else t[units] for t in self.relaxation(self.site_of[k]))
                An = A.clamp(max=0)  # A⁺·al + A⁻·au as A·al + A⁻·(au − al), as `backward`
                const = const + An @ bu + (0 if bl is None else A.clamp(min=0) @ bl)
                A = torch.addcmul(A * al, An, au - al)
            else:
                A, c = self.net.nodes[k].op.back_units(A, units)
                const = const + c
        full = A.new_zeros(A.shape[0], self.net.sizes[m])
        full[:, units] = A
        return const + self.backward(full, m)

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
            b = None if float32 or cuts is not None else self._local_back(part, j)
            if b is None:
                b = self.backward(self._query_rows(part, n), j, float32=float32, cuts=cuts, depth=self.cut_depth or 1)
            los.append(b[:part.numel()])
            ups.append(-b[part.numel():])
        lo, up = torch.cat(los), torch.cat(ups)
        s = self.site_of.get(j)
        if s is not None:  # a site's own better lower bounds (a LayerNorm variance's other tangent points)
            lo = self.op(s).refine_rows(self, s, idx, n, lo, up, float32, cuts)
        return lo, up

    # a LayerNorm variance's lower bound: Adam steps on each queried row's tangent points (0: the two fixed choices only).
    # Off by default, by measurement (benchmarks/peers/crown-vit/README.md): at 20 steps it raised the margin bounds of
    # a 17-token timm ViT a lot (−1973 → −19 on one property) but decided nothing more on deit_tiny 32×2's verify
    # stage, whose float pass took 3× as long (260 s against 87 s) and whose int8 properties used their whole budget
    def crown(self) -> None:
        """CROWN bounds of every site's input, site by site in topological order (each uses the ones before it), each
        intersected with the interval that the sites before it give by interval arithmetic: an activation whose range
        is narrower than its lines say (a grid's rounding, `ops.Rounding`) passes that on to the ReLUs after it.

        In a network whose every site allows float32 (`float32_rows`: a ReLU, a smooth gate with FLOAT32_GATES), the ReLU
        sites' units are screened with float32 convolutions first (`_relu_rows`); in others (an int8 rounding's or a
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
        """Sites that leave a bound infinite on rows the output reads (`unbounded_note`: an int8 LayerNorm whose float32
        error has no bound where the box leaves its rows too little spread), as one clause; "" if none. Only those the
        site CROWN stopped at reads, unless `everywhere` (a pass that finished with an unbounded margin)."""
        needed = self.needed()
        at = self._crown_site
        before = self.ancestors(self.sites[at]) if at is not None else set()
        parts = [self.op(s).unbounded_note(*self.pre[s], needed[k]) for s, k in enumerate(self.sites)
                 if everywhere or k in before]  # what the refusing site reads
        return "; ".join(p for p in parts if p)

    def why_unbounded(self) -> str:
        """Why a finished pass leaves a margin with no finite bound, as one clause ("" if no int8 LayerNorm says)."""
        return self._unbounded_layer_norms(everywhere=True)

    def _crown(self) -> None:
        stopped = False
        allowed = {"sign", "gate"} if float32.FLOAT32_GATES else {"sign"}
        screen = all(self.op(s).float32_rows in allowed for s in range(len(self.sites)))
        via, nodes = self._crown_plan()
        need = self.needed()
        cuts: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = {} if self.cut_depth else None
        queried: dict[int, torch.Tensor] = {}  # per site, the units CROWN queried (`_copied`)

        def tighten(s: int, lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            nonlocal stopped
            self._crown_site = s  # where a relaxation that refuses its interval stops the pass (`_unbounded_layer_norms`)
            self._tighten(s, torch.arange(lo.numel(), device=lo.device), lo, hi)
            stopped = stopped or self.expired()
            j = self.site_input[s]
            if not stopped and self._exact_by_ibp(s):  # exact already: as good as queried
                queried[s] = torch.ones(self.net.sizes[j], dtype=torch.bool, device=lo.device)
            if stopped or self._exact_by_ibp(s) or s in via:
                return self.pre[s]
            idx = self._query(s)
            every = idx.numel() == self.net.sizes[j]
            copied = self._copied(s)
            if copied is not None and copied[0] in queried:
                idx = idx[~queried[copied[0]][copied[1][idx]]]
            idx = idx[need[j][idx]]  # the units the output depends on (`needed`)
            skip = self._not_worth_querying(s)
            if skip is not None:
                idx = idx[~skip[idx]]
            idx = idx[~self._near_exact(s, idx)]
            queried[s] = torch.zeros(self.net.sizes[j], dtype=torch.bool, device=idx.device)
            queried[s][idx] = True
            if idx.numel() == 0:
                return self.pre[s]
            n = self.pre[s][0].numel()
            f32 = screen and self.op(s).float32_rows == "gate"
            if self._through(s, idx):
                self._tighten(s, idx, *self._rows_through(j, idx, float32=f32))
                idx = idx[~self._near_exact(s, idx)]  # lines still far from exact there: straight back
            if idx.numel() and screen and self.op(s).float32_rows == "sign":
                self._tighten(s, idx, *self._relu_rows(j, idx, n))
            elif idx.numel():
                self._tighten(s, idx, *self._rows(j, idx, n, float32=f32, cuts=cuts))
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
    def crown_many(cls, bounders: Sequence[Any]) -> None:
        """CROWN for several Bounders of one graph (built from the same Graph, each over its own box: the properties of
        one network), leaving each exactly as its own `crown()` would (its `pre`, `method`, relaxation cache), each
        stopping where its own `expired` says, as `crown()` does. The scheduler's batched first pass
        (`first_pass.run`) calls it; this body is the plain loop, to be replaced by one pass with the boxes as a batch
        dimension (as α,β-CROWN batches domains) that must leave the same bounds up to float64 rounding."""
        for b in bounders:
            b.crown()
