"""The complete method for ReLU networks: a mixed-integer program solved by HiGHS (scipy.optimize.milp).

Encoding (Tjeng et al.'s big-M): per affine node, variables z = Σ_i M_i h_i + c over its inputs (M_i sparse: dense for
Linear, index arithmetic for Conv, diagonal for Scale, selections for Sum/Concat/Permute); per ReLU unit with input interval [l, u]:
dead (u ≤ 0): output fixed at 0; active (l ≥ 0): output = input; unstable: a binary δ and
a ≥ 0, a ≥ z, a ≤ z − l(1 − δ), a ≤ u·δ. The intervals are the tightest bounds known for the box
(`bounds.Bounder`: CROWN/α-CROWN ∩ IBP), so the binaries are the units those bounds leave unstable
(53–133 of 1024 on the default MLP at ε = 0.005, against 590–675 with IBP) and the big-M constants are
as small as those bounds allow.

Per open disjunct {A y ≤ b} (the ones the bounds did not exclude; the disjunction is split so each
MILP is small and an excluded disjunct costs nothing): (1) the LP relaxation minimizing Σ A y:
infeasible proves the disjunct empty, and its optimum, run through the network, may be a
counterexample; (2) the MILP min Σ A y subject to A y ≤ b with an equal share of the remaining time:
infeasible proves it empty; a solution is checked in float64 (big-M with HiGHS's integrality tolerance
can place it slightly off the network; a point on the unsafe set's boundary, as int8 grid logits that tie, is none either,
as `Problem.confirm` counts), and if it is not a real counterexample a second MILP asks for
A y ≤ b − margin. "Infeasible" means so within HiGHS's feasibility tolerance (1e-7). HiGHS's time limit
is wall-clock time.

Other activations with a fixed relaxation (the int8 graph's `ops.Rounding` and `ops.QuantizedInput`) are encoded by
their lines and interval; a rounding to a grid also as y = s·k with k an integer and |y − x| ≤ E, which is every value
the runtime may compute (and a few more: both roundings within E − s/2 of a half step). The program is then a
relaxation, so its infeasibility still proves a disjunct empty, and a point it returns is only a candidate that
`Problem.confirm` re-checks on the model itself.

HiGHS runs on the host: `encode` and `solve` are the engine's one boundary to the CPU. Whatever device the search
computes on, they take the graph and the intervals there and move them to the CPU first (`on_cpu`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .graph import Graph
from .ops.base import Activation, Affine, UnsupportedModel
from .ops.relu import ReLU
from .ops.rounding import QuantizedInput, Rounding
from .vnnlib import VnnlibSpec

MIN_MILP_SECONDS = 0.05  # a shorter HiGHS run than this decides nothing: its presolve alone takes longer


@dataclass(frozen=True, eq=False)
class Encoding:
    """Rows row_lo ≤ M v ≤ row_hi, bounds var_lb ≤ v ≤ var_ub, integrality per variable; x and y slices."""

    matrix: Any  # scipy.sparse.csr_matrix
    row_lo: np.ndarray
    row_hi: np.ndarray
    var_lb: np.ndarray
    var_ub: np.ndarray
    integrality: np.ndarray
    x: slice  # the variables whose values, moved into the box, are the input a solution stands for
    y: slice
    num_unstable: int
    # an input quantized after its normalization a·x + b (`ops.QuantizedInput`): x is (value − b)/a of those variables
    x_affine: tuple[np.ndarray, np.ndarray] | None = None

    def input_of(self, v: np.ndarray) -> np.ndarray:
        """The input a solution vector stands for (before it is moved into the box)."""
        x = v[self.x]
        return x if self.x_affine is None else (x - self.x_affine[1]) / self.x_affine[0]

    @property
    def num_vars(self) -> int:
        return self.var_lb.size


def on_cpu(net: Graph, pre: Sequence[tuple[Any, Any]]) -> tuple[Graph, list[tuple[torch.Tensor, torch.Tensor]]]:
    """The graph and the intervals on the CPU, where HiGHS and the sparse matrices live (the boundary of a search that
    runs on another device)."""
    return net.to("cpu"), [(torch.as_tensor(l).cpu(), torch.as_tensor(u).cpu()) for l, u in pre]


def encode(net: Graph, lb: np.ndarray, ub: np.ndarray, pre: Sequence[tuple[Any, Any]]) -> Encoding:
    """Big-M encoding of a merged ReLU graph over the box; `pre[s]` = (l, u) of ReLU site s's input."""
    from scipy import sparse

    net, pre = on_cpu(net, pre)
    if net.smooth:
        raise UnsupportedModel("the MILP encodes ReLU networks only (smooth gates have no exact linear encoding)")
    lb, ub = np.asarray(lb, dtype=np.float64), np.asarray(ub, dtype=np.float64)
    var_lb, var_ub, integ = [lb], [ub], [np.zeros(lb.size)]
    row_lo: list[np.ndarray] = []
    row_hi: list[np.ndarray] = []
    num_vars = lb.size
    triplets: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    num_rows = 0

    def new_vars(lo: np.ndarray, hi: np.ndarray, integer: bool = False) -> slice:
        nonlocal num_vars
        s = slice(num_vars, num_vars + lo.size)
        num_vars += lo.size
        var_lb.append(lo)
        var_ub.append(hi)
        integ.append(np.full(lo.size, 1.0 if integer else 0.0))
        return s

    def add_rows(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        nonlocal num_rows
        triplets.append((rows + num_rows, cols, vals))
        row_lo.append(lo)
        row_hi.append(hi)
        num_rows += lo.size

    sites = net.activations
    site_input = {net.nodes[k].inputs[0]: s for s, k in enumerate(sites)}  # a node read by a ReLU: its tight bounds
    def _tightest(interval, k):
        """An activation's range, intersected with the tight bounds of the site that reads it (if one does)."""
        ylo, yhi = interval
        if k in site_input:
            pl, pu = pre[site_input[k]]
            ylo, yhi = torch.maximum(ylo, pl), torch.minimum(yhi, pu)
        return ylo, yhi

    var: list[slice | None] = [None] * len(net.nodes)
    box: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(net.nodes)
    var[0], box[0] = slice(0, lb.size), (torch.as_tensor(lb)[None], torch.as_tensor(ub)[None])
    num_unstable = 0
    for k, node in enumerate(net.nodes[1:], start=1):
        ins = [var[i] for i in node.inputs]
        if isinstance(node.op, Affine):
            lo_t, hi_t = node.op.ibp(*(box[i] for i in node.inputs))
            if k in site_input:
                pl, pu = pre[site_input[k]]
                lo_t, hi_t = torch.maximum(lo_t, pl[None]), torch.minimum(hi_t, pu[None])
            box[k] = (lo_t, hi_t)
            mats, c = node.op.sparse()
            z = new_vars(lo_t[0].numpy().copy(), hi_t[0].numpy().copy())
            m = c.size
            # Σ_i M_i h_i − z = −c
            rows_, cols_, vals_ = [np.arange(m)], [z.start + np.arange(m)], [-np.ones(m)]
            for M, h in zip(mats, ins):
                M = M.tocoo()
                rows_.append(M.row)
                cols_.append(h.start + M.col)
                vals_.append(M.data)
            add_rows(np.concatenate(rows_), np.concatenate(cols_), np.concatenate(vals_), -c, -c)
            var[k] = z
        elif isinstance(node.op, ReLU):
            h = ins[0]
            lo_t, hi_t = box[node.inputs[0]]
            l, u = lo_t[0].numpy(), hi_t[0].numpy()
            a = new_vars(np.maximum(l, 0.0), np.maximum(u, 0.0))
            act = np.flatnonzero(l >= 0)  # a = z
            n = act.size
            add_rows(np.repeat(np.arange(n), 2), np.ravel(np.column_stack([a.start + act, h.start + act])),
                     np.tile([1.0, -1.0], n), np.zeros(n), np.zeros(n))
            idx = np.flatnonzero((l < 0) & (u > 0))
            n = idx.size
            num_unstable += n
            d = new_vars(np.zeros(n), np.ones(n), integer=True)
            zi, ai, di = h.start + idx, a.start + idx, d.start + np.arange(n)
            li, ui = l[idx], u[idx]
            ones, ninf = np.ones(n), np.full(n, -np.inf)
            r = np.arange(n)
            add_rows(np.repeat(r, 2), np.ravel(np.column_stack([zi, ai])), np.tile([1.0, -1.0], n), ninf, np.zeros(n))  # z − a ≤ 0
            add_rows(np.repeat(r, 3), np.ravel(np.column_stack([ai, zi, di])),
                     np.ravel(np.column_stack([ones, -ones, -li])), ninf, -li)  # a ≤ z − l(1 − δ)
            add_rows(np.repeat(r, 2), np.ravel(np.column_stack([ai, di])),
                     np.ravel(np.column_stack([ones, -ui])), ninf, np.zeros(n))  # a ≤ u δ
            box[k] = (lo_t.clamp(min=0), hi_t.clamp(min=0))
            var[k] = a
        elif isinstance(node.op, Activation) and not node.op.elementwise:  # a product of two variables: lo ≤ y − M·x ≤ hi
            h = ins[0]
            lo_t, hi_t = box[node.inputs[0]]
            ylo, yhi = _tightest(node.op.interval(lo_t[0], hi_t[0]), k)
            m = ylo.numel()
            a = new_vars(ylo.numpy().copy(), yhi.numpy().copy())
            for M, glo, ghi in node.op.milp_rows(lo_t[0], hi_t[0]):
                M = M.tocoo()
                add_rows(np.concatenate([np.arange(m), M.row]), np.concatenate([a.start + np.arange(m), h.start + M.col]),
                         np.concatenate([np.ones(m), -M.data]), glo, ghi)
            box[k] = (ylo[None], yhi[None])
            var[k] = a
        elif isinstance(node.op, Activation):  # a fixed relaxation (int8 rounding, exp, ...): al·x + bl ≤ y ≤ au·x + bu
            h = ins[0]
            lo_t, hi_t = box[node.inputs[0]]
            al, bl, au, bu = (np.broadcast_to(np.asarray(t, dtype=np.float64), lo_t[0].shape) for t in
                              node.op.lines(lo_t[0], hi_t[0]))
            ylo, yhi = _tightest(node.op.interval(lo_t[0], hi_t[0]), k)
            n = al.size
            a = new_vars(ylo.numpy().copy(), yhi.numpy().copy())
            r = np.repeat(np.arange(n), 2)
            yx = np.ravel(np.column_stack([a.start + np.arange(n), h.start + np.arange(n)]))  # (y_i, x_i) per row
            for slope, lo_, hi_ in ((al, bl, np.full(n, np.inf)), (au, np.full(n, -np.inf), bu)):
                add_rows(r, yx, np.ravel(np.column_stack([np.ones(n), -slope])), lo_, hi_)  # y − slope·x vs the intercept
            if isinstance(node.op, Rounding) and node.op.step is not None:  # |y − x| ≤ E whatever the lines chose
                add_rows(r, yx, np.tile([1.0, -1.0], n), -node.op.E.numpy(), node.op.E.numpy())
            grid = node.op.grid() if isinstance(node.op, (Rounding, QuantizedInput)) else None
            if grid is not None:  # y on the grid: |y − s·k| ≤ slack with k an integer (units with one value left are fixed)
                step, slack = (np.broadcast_to(np.asarray(t, dtype=np.float64), (n,)) for t in grid)
                wide = np.flatnonzero(yhi.numpy() > ylo.numpy())
                m = wide.size
                kv = new_vars(np.floor(ylo.numpy()[wide] / step[wide]), np.ceil(yhi.numpy()[wide] / step[wide]), integer=True)
                add_rows(np.repeat(np.arange(m), 2), np.ravel(np.column_stack([a.start + wide, kv.start + np.arange(m)])),
                         np.ravel(np.column_stack([np.ones(m), -step[wide]])), -slack[wide], slack[wide])
            box[k] = (ylo[None], yhi[None])
            var[k] = a
        else:
            raise UnsupportedModel(f"the MILP has no encoding for {type(node.op).__name__}")
    h = var[net.output]
    # an input quantized first: the program chooses its grid points, the box's own variables are free; a grid point moved
    # into the box is an input that the runtime quantizes to it (the grid is monotone and the point lies between the
    # grid values of the box's ends)
    readers = [k for k, node in enumerate(net.nodes) if 0 in node.inputs]
    first = readers[0] if len(readers) == 1 and isinstance(net.nodes[readers[0]].op, QuantizedInput) else None
    x_var = var[first] if first is not None else slice(0, lb.size)
    x_affine = None
    if first is not None and net.nodes[first].op.pre_scale is not None:
        q = net.nodes[first].op
        x_affine = (q.pre_scale.numpy(), q.pre_shift.numpy())
    rr, cc, vv = (np.concatenate(t) for t in zip(*triplets))
    matrix = sparse.csr_matrix((vv, (rr, cc)), shape=(num_rows, num_vars))
    return Encoding(matrix=matrix, row_lo=np.concatenate(row_lo), row_hi=np.concatenate(row_hi),
                    var_lb=np.concatenate(var_lb), var_ub=np.concatenate(var_ub), integrality=np.concatenate(integ),
                    x=x_var, y=h, num_unstable=num_unstable, x_affine=x_affine)


def solve(net: Graph, spec: VnnlibSpec, pre: Sequence[tuple[Any, Any]], open_disjuncts: Sequence[int],
          left: Callable[[], float], margin: float = 1e-4, lp_first: bool = True,
          order: Sequence[float] | None = None) -> tuple[str, np.ndarray | None, str]:
    """Decide the open disjuncts of `spec` on `net` (merged, ReLU): ("unsat" | "sat" | "timeout" | "unknown",
    counterexample or None, message). `left()`: seconds of budget left (HiGHS gets them as wall time).
    `order`: a score per open disjunct, most promising for a counterexample first (e.g. its lower bound)."""
    from scipy import sparse
    from scipy.optimize import Bounds, LinearConstraint, milp

    net, pre = on_cpu(net, pre)

    def real(x: np.ndarray) -> bool:
        # strictly unsafe, as `Problem.confirm` counts a counterexample: a point on the unsafe set's boundary (an int8
        # model's grid logits tie there often) is no answer, and the margin run then looks for one strictly inside
        return spec.violation(net.forward(x).numpy()) < 0

    enc = encode(net, spec.lb, spec.ub, pre)
    n = enc.num_vars
    summary = f"{enc.num_unstable} unstable ReLUs"

    def run(A: np.ndarray, b: np.ndarray, shift: float, integral: bool, time_limit: float):
        """None on timeout, else (feasible, x or None, objective, HiGHS message)."""
        if time_limit <= 0:
            return None
        out_rows = sparse.hstack([sparse.csr_matrix((A.shape[0], enc.y.start)), sparse.csr_matrix(A),
                                  sparse.csr_matrix((A.shape[0], n - enc.y.stop))])
        cons = LinearConstraint(sparse.vstack([enc.matrix, out_rows], format="csr"),
                                np.concatenate([enc.row_lo, np.full(A.shape[0], -np.inf)]),
                                np.concatenate([enc.row_hi, b - shift]))
        # minimize Σ A y under A y ≤ b: the LP also ranks disjuncts (how far it can push A y down), and the MILP
        # proves infeasibility several times faster with this objective than as a pure feasibility problem
        c = np.zeros(n)
        c[enc.y] = A.sum(axis=0)
        res = milp(c, constraints=cons, integrality=enc.integrality if integral else np.zeros(n),
                   bounds=Bounds(enc.var_lb, enc.var_ub), options={"time_limit": max(time_limit, 1e-3), "disp": False})
        if res.status == 2:
            return False, None, np.inf, res.message
        if res.x is None:
            return None if res.status == 1 else (True, None, 0.0, res.message)
        return True, np.clip(enc.input_of(res.x), spec.lb, spec.ub), float(res.fun), res.message

    todo = list(open_disjuncts)
    if order is not None:
        todo = [d for _, d in sorted(zip(order, todo))]
    pending: list[tuple[float, int]] = []
    for d in todo:
        A, b = spec.disjuncts[d]
        if not lp_first:
            pending.append((0.0, d))
            continue
        out = run(A, b, 0.0, False, left())
        if out is None:
            return "timeout", None, f"during the LP relaxation; {summary}"
        feasible, x, value, _ = out
        if not feasible:
            continue
        if x is not None and real(x):
            return "sat", x, f"LP relaxation point is a counterexample; {summary}"
        pending.append((value, d))
    lp_closed = len(todo) - len(pending)
    # nearest to closed first (the LP's least negative Σ A y): the MILPs likeliest to finish early go first and leave
    # their time to the rest, since a turn no longer than one that failed is not tried again (HiGHS starts over;
    # docs/EXPERIMENTS.md, "The MILP's order").
    pending.sort(key=lambda vd: -vd[0])  # stable: ties keep the order given
    unclear = milp_runs = undecided = 0
    start = time.perf_counter()
    # A disjunct that ran out of its share waits at the back of the queue: the time the others leave (finished
    # early, or closed) goes to it on its next turn, as long as that turn is longer than its last one.
    queue = [d for _, d in pending]
    ran_for: dict[int, float] = {}
    while queue:
        d = queue.pop(0)
        share = left() / (len(queue) + 1)
        if share <= max(ran_for.get(d, 0.0), MIN_MILP_SECONDS):
            undecided += 1  # no longer turn than its last: its time is spent
            continue
        ran_for[d] = share
        A, b = spec.disjuncts[d]
        turn_end = left() - share  # the budget left when this turn is over
        for shift in (0.0, margin):
            out = run(A, b, shift, True, left() - turn_end)  # the margin run gets what the first left of the turn
            milp_runs += 1
            if out is None:
                queue.append(d)
                break
            feasible, x, _, msg = out
            if not feasible:
                unclear += shift > 0  # a margin-0 point that was no real counterexample
                break
            if x is None:
                return "unknown", None, f"HiGHS: {msg}"
            if real(x):
                return "sat", x, f"MILP counterexample (margin {shift:g}); {summary}"
        else:
            unclear += 1
    detail = (f"{lp_closed}/{len(todo)} open disjuncts closed by the LP relaxation, {milp_runs} MILPs "
              f"({time.perf_counter() - start:.2f} s); {summary}")
    if undecided:
        return "timeout", None, f"{undecided} disjuncts undecided; {detail}"
    if unclear:
        return "unknown", None, (f"{unclear} disjuncts have MILP points that are no float64 counterexample "
                                 f"and none at margin {margin:g}; {detail}")
    return "unsat", None, detail
