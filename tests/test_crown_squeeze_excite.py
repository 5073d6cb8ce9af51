"""CROWN on a small SiLU network with squeeze-excite blocks (efficientnet's layout shrunk, exported by torch.onnx): its
product sites bounded from their exact operands, smooth units whose lines are already near-exact left unqueried, and
1×1 expansions bounded through their input's linear bounds (`crown.CrownPass`). The bounds hold at sampled points,
each side apart; every unit left unqueried meets the stated criterion; the logit bounds stay near those of CROWN
querying every unit; a ReLU network's pass is unchanged, its squeeze-excite products included."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from analysis.verification import crown
from analysis.verification.bounds import Bounder, Spec

SHAPE = (3, 8, 8)
EPS = 0.02
POINTS = 2000
FLOAT64_TOL = 1e-9  # the graph's float64 values against float64 bounds, relative to the values' scale
# the logits' bound width against CROWN querying every unit: each unqueried unit's lines (and each unit bounded through
# an expansion's input) are within NEAR_EXACT (1%) of its sampled movement of exact; what that adds up to over the
# sites behind a logit, measured at most 1.020 here
LOOSER = 1.05


class SqueezeExcite(nn.Module):
    def __init__(self, c: int, r: int):
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(c, r, 1), nn.Conv2d(r, c, 1)

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        return x * torch.sigmoid(self.expand(nn.functional.silu(self.reduce(s))))


class TinyEfficientNet(nn.Module):
    """Stem, a depthwise block with squeeze-excite, an inverted residual (1×1 expansion ×4, depthwise, squeeze-excite,
    projection, residual add), pooled head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.dw1, self.se1, self.proj1 = nn.Conv2d(8, 8, 3, padding=1, groups=8), SqueezeExcite(8, 2), nn.Conv2d(8, 8, 1)
        self.exp2, self.dw2 = nn.Conv2d(8, 32, 1), nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.se2, self.proj2 = SqueezeExcite(32, 4), nn.Conv2d(32, 8, 1)
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        silu = nn.functional.silu
        h = self.proj1(self.se1(silu(self.dw1(silu(self.stem(x))))))
        h = h + self.proj2(self.se2(silu(self.dw2(silu(self.exp2(h))))))
        return self.head(h.mean((2, 3)))


def _net(tmp_path, module: nn.Module):
    from analysis.verification.readers import from_onnx

    torch.manual_seed(0)
    for p in module.parameters():  # weights of a trained net's scale (the default init leaves the SE products flat)
        nn.init.normal_(p, std=0.5)
    path = tmp_path / "net.onnx"
    torch.onnx.export(module.eval(), torch.zeros(1, *SHAPE), str(path), opset_version=17, dynamo=False)
    net = from_onnx(path)
    x0 = np.random.default_rng(1).uniform(0, 1, int(np.prod(SHAPE)))
    return net, torch.tensor(x0 - EPS), torch.tensor(x0 + EPS)


def _points(lb: torch.Tensor, ub: torch.Tensor) -> torch.Tensor:
    """POINTS points of the box, a quarter of them corners."""
    t = torch.rand(POINTS, lb.numel(), generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    t[: POINTS // 4] = (t[: POINTS // 4] > 0.5).double()
    return lb + t * (ub - lb)


def _logits(b: Bounder) -> tuple[torch.Tensor, torch.Tensor]:
    n = b.net.num_outputs
    eye = torch.eye(n, dtype=torch.float64)
    both = b.spec_bounds(Spec(torch.cat([eye, -eye]), torch.zeros(2 * n)))
    return both[:n], -both[n:]


def _full(monkeypatch):
    """CROWN querying every unit of every smooth site straight back to the input."""
    monkeypatch.setattr(crown, "NEAR_EXACT", 0.0)
    monkeypatch.setattr(crown, "THROUGH_RATIO", 0.0)


def test_bounds_hold_at_sampled_points_each_side(tmp_path, monkeypatch):
    net, lb, ub = _net(tmp_path, TinyEfficientNet())
    kinds = [type(net.nodes[k].op).__name__ for k in net.activations]
    assert {"Gate", "Smooth", "Product"} <= set(kinds), kinds
    through, rows = [], []
    orig_through, orig_rows = crown.CrownPass._rows_through, crown.CrownPass._rows
    monkeypatch.setattr(crown.CrownPass, "_rows_through",
                        lambda self, j, idx, **kw: through.append(j) or orig_through(self, j, idx, **kw))
    monkeypatch.setattr(crown.CrownPass, "_rows",
                        lambda self, j, idx, n, **kw: rows.append(j) or orig_rows(self, j, idx, n, **kw))
    b = Bounder(net, lb, ub)
    b.crown()
    assert b.method == "crown" and through, (b.method, through)  # the expansion went through its input
    products = [b.site_input[s] for s, k in enumerate(b.sites) if kinds[s] == "Product"]
    assert not set(products) & set(rows + through)  # a product's operands are exact: never queried
    xs = _points(lb, ub)
    vals = b.net.values(xs)
    for s, k in enumerate(b.sites):  # every site's input interval, each side
        v = vals[b.site_input[s]]
        lo, hi = b.pre[s]
        tol = FLOAT64_TOL * (1 + float(v.abs().max()))
        assert float((lo - v).max()) <= tol, (s, kinds[s], "lower")
        assert float((v - hi).max()) <= tol, (s, kinds[s], "upper")
    lo, hi = _logits(b)
    y = vals[b.net.output]
    tol = FLOAT64_TOL * (1 + float(y.abs().max()))
    assert float((lo - y).max()) <= tol and float((y - hi).max()) <= tol
    assert bool(torch.isfinite(lo).all() and torch.isfinite(hi).all())


def test_unqueried_units_meet_the_criterion_and_logits_stay_near_full_crown(tmp_path, monkeypatch):
    net, lb, ub = _net(tmp_path, TinyEfficientNet())
    skipped: dict[int, torch.Tensor] = {}
    orig = crown.CrownPass._near_exact

    def spy(self, s, idx):
        mask = orig(self, s, idx)
        skipped[s] = idx[mask]
        return mask

    monkeypatch.setattr(crown.CrownPass, "_near_exact", spy)
    b = Bounder(net, lb, ub)
    b.crown()
    lo, hi = _logits(b)
    monkeypatch.setattr(crown.CrownPass, "_near_exact", orig)
    with monkeypatch.context() as m:
        _full(m)
        ref = Bounder(net, lb, ub)
        ref.crown()
        ref_lo, ref_hi = _logits(ref)
    assert sum(t.numel() for t in skipped.values()) > 0, "no unit was left unqueried: the criterion is not exercised"
    for s, idx in skipped.items():  # the gap of each unqueried unit's lines ≤ NEAR_EXACT × how far it moves (at most
        op = b.op(s)               # the width of its output's full-CROWN interval)
        gap = op.line_gap(*b.pre[s])[idx]
        out_lo, out_hi = op.interval(*ref.pre[s])
        assert bool((gap <= crown.NEAR_EXACT * (out_hi - out_lo)[idx] * (1 + 1e-12)).all()), s
    assert bool((lo <= hi).all())
    assert float(((hi - lo) / (ref_hi - ref_lo)).max()) <= LOOSER


def test_a_relu_network_pass_is_unchanged(tmp_path, monkeypatch):
    class ReluExpand(nn.Module):  # a 1×1 expansion into a ReLU, a squeeze-excite whose hard sigmoid is a ReLU clamp
        def __init__(self):
            super().__init__()
            self.stem, self.exp, self.dw = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 32, 1), nn.Conv2d(32, 32, 3, padding=1, groups=32)
            self.reduce, self.expand = nn.Conv2d(32, 4, 1), nn.Conv2d(4, 32, 1)
            self.head = nn.Linear(32 * 64, 10)

        def forward(self, x):
            h = torch.relu(self.dw(torch.relu(self.exp(torch.relu(self.stem(x))))))
            h = h * nn.functional.hardsigmoid(self.expand(torch.relu(self.reduce(h.mean((2, 3), keepdim=True)))))
            return self.head(h.flatten(1))

    net, lb, ub = _net(tmp_path, ReluExpand())
    assert "Product" in {type(net.nodes[k].op).__name__ for k in net.activations}
    b = Bounder(net, lb, ub)
    b.crown()
    with monkeypatch.context() as m:
        _full(m)
        # and every copy site queried at the site itself (a ReLU's stable units keep interval arithmetic's bounds)
        m.setattr(crown.CrownPass, "_crown_plan", lambda self: (set(), set()))
        ref = Bounder(net, lb, ub)
        ref.crown()
    for (l, u), (rl, ru) in zip(b.pre, ref.pre):
        assert torch.equal(l, rl) and torch.equal(u, ru)
    assert all(torch.equal(x, y) for x, y in zip(_logits(b), _logits(ref)))
