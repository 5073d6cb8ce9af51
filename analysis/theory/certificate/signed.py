"""The per-sample change carried with its signs: beside the exact channel's box d (|v − z| ≤ d), each value of a
per-sample walk carries a signed centre c and a radius r with |v − z − c| ≤ r, so that the changes two gates make
cancel where the network's own weights cancel them (W·c, not |W|·d).

v is the ReLU network's value in real arithmetic, z the smooth network's as the walk computes it in float64 (the
values every per-sample rule reads), so the statement at the logits is |R(x) − S₆₄(x)| ≤ |c| + r, R taken from the
values the two networks share (computed once, in float64, up to the first gate: the walk's boxes are 0 there). Each rule bounds
the float64 arithmetic of both: of its own work on c, and of the smooth network's step that made z (v' − z' =
W·(v − z) + (W·z + b − fl(W·z + b))): a dot product of n terms within γ_n·(|W|·|c| + |W|·|z| + |b|) (u = 2⁻⁵³,
`gamma64`), one rounding per other operation, each doubled (`SAFETY`). A linear map takes (c, r) to (W·c, |W|·r + its
rounding); a product of two changing values to z_a·c_b + z_b·c_a + c_a·c_b; a monotone activation h (the swap's ReLU
against the gate, or one both networks keep) to the centre and half-width of [h(z + c − r), h(z + c + r)] − h(z),
which holds across a kink too. After every op the box becomes min(d, |c| + r), so the box channel never gets looser.
The form is not cut to the box: the box's rules take the walked z as the smooth network's exact values and leave out
its float64 rounding, which a change carried to 1e-16 of itself must count. An op with no rule here restarts the form
from the box, (0, d), and so from the box's premise.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .core import CASTS, SAFETY, _Dev, _map, _NoRule

U64 = 2.0**-53  # float64 unit roundoff, round to nearest
TINY64 = 2.0**-1022  # the smallest normal float64: what one underflowing operation can be off by, absolutely


def gamma64(n: int) -> float:
    """γ_n = n·u/(1 − n·u) for float64 (Higham, Lemma 3.1)."""
    nu = n * U64
    return nu / (1 - nu) if nu < 0.5 else math.inf


def _round(mag: torch.Tensor, ops: int = 1) -> torch.Tensor:
    """`ops` float64 roundings of a result whose terms are at most `mag`, doubled."""
    return SAFETY * (ops * U64 * mag + ops * TINY64)


class SCall:
    """One torch function call as the signed rules see it."""

    def __init__(self, name: str, func: Callable, args: tuple, kwargs: dict, exact: int):
        self.name, self.func, self.args, self.kwargs, self.exact = name, func, args, kwargs, exact

    def sg(self, a: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(c, r) of an argument: a constant does not change."""
        if isinstance(a, _Dev):
            return signed_of(a, self.exact)
        zero = torch.zeros(a.shape if isinstance(a, torch.Tensor) else (), dtype=torch.float64)
        return zero, zero

    @staticmethod
    def value(a: Any) -> Any:
        return a.value if isinstance(a, _Dev) else a

    def rest(self, t: torch.Tensor) -> torch.Tensor:
        """The function itself applied to `t` in place of its first argument, the others as values."""
        return self.func(t, *_map(self.args[1:], self.value), **_map(self.kwargs, self.value))


def _mag(s: SCall, a: Any) -> torch.Tensor:
    """|z| of an argument: the smooth network's own float64 operation rounds in proportion to it, and the change
    v − z of the real ReLU network against the walked z takes that rounding in."""
    return torch.as_tensor(s.value(a)).detach().abs().to(torch.float64)


def signed_of(d: _Dev, exact: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(c, r) of a walked value: its own, or (0, its exact box) where no rule carried one."""
    s = getattr(d, "signed", None)
    if s is not None:
        return s
    box = d.boxes[exact]
    return torch.zeros_like(box), box


def _structural(s: SCall):
    """Copies and rearrangements (and constant padding with 0): exact in float, on c and r alike."""
    first = s.args[0]
    if isinstance(first, (list, tuple)):  # cat / stack of a sequence
        pairs = [s.sg(a) for a in first]
        cs, rs = type(first)(p[0] for p in pairs), type(first)(p[1] for p in pairs)
        return s.func(cs, *_map(s.args[1:], s.value), **_map(s.kwargs, s.value)), \
            s.func(rs, *_map(s.args[1:], s.value), **_map(s.kwargs, s.value))
    c, r = s.sg(first)
    return s.rest(c), s.rest(r)


def _same(s: SCall):
    c, r = s.sg(s.args[0])
    return (-c if s.name in ("neg", "negative", "__neg__") else c), r


def _pad(s: SCall):
    p = dict(zip(("input", "pad", "mode", "value"), s.args))
    p.update(s.kwargs)
    c, r = s.sg(p["input"])
    if p.get("mode", "constant") != "constant":  # reflect / replicate / circular: copies of entries
        return F.pad(c, p["pad"], p["mode"]), F.pad(r, p["pad"], p["mode"])
    return F.pad(c, p["pad"]), F.pad(r, p["pad"])  # the pad value is the same in both networks


def _add(s: SCall):
    a, b = s.args[0], s.args[1]
    alpha = float(s.kwargs.get("alpha", s.args[2] if len(s.args) > 2 else 1))
    (ca, ra), (cb, rb) = s.sg(a), s.sg(b)
    if s.name in ("sub", "__sub__", "subtract"):
        c = ca - alpha * cb
    elif s.name in ("__rsub__", "rsub"):  # b − alpha·a
        c = cb - alpha * ca
    else:
        c = ca + alpha * cb
    za, zb = _mag(s, a), _mag(s, b)  # the smooth network's sum rounds too (`_mag`)
    r = ra + abs(alpha) * rb + _round(ca.abs() + abs(alpha) * cb.abs() + za + abs(alpha) * zb, 2)
    return c, r


def _mul(s: SCall):
    a, b = s.args[0], s.args[1]
    (ca, ra), (cb, rb) = s.sg(a), s.sg(b)
    if isinstance(a, _Dev) and isinstance(b, _Dev):
        # v_a·v_b − z_a·z_b = z_a·Δb + z_b·Δa + Δa·Δb, with Δ = c ± r
        za, zb = a.value.to(torch.float64), b.value.to(torch.float64)
        c = za * cb + zb * ca + ca * cb
        r = za.abs() * rb + zb.abs() * ra + ca.abs() * rb + cb.abs() * ra + ra * rb
        return c, r + _round((za * cb).abs() + (zb * ca).abs() + (ca * cb).abs() + (za * zb).abs(), 4)
    x, k = (a, b) if isinstance(a, _Dev) else (b, a)
    cx, rx = s.sg(x)
    k = torch.as_tensor(s.value(k), dtype=torch.float64)
    c = k * cx
    return c, k.abs() * rx + _round(c.abs() + (k * _mag(s, x)).abs(), 2)


def _div(s: SCall):
    a, b = s.args[0], s.args[1]
    if isinstance(b, _Dev) or s.name in ("__rtruediv__", "__rdiv__") or s.kwargs.get("rounding_mode") is not None:
        raise _NoRule("division by a changing value")
    ca, ra = s.sg(a)
    k = torch.as_tensor(s.value(b), dtype=torch.float64)
    c = ca / k
    return c, ra / k.abs() + _round(c.abs() + _mag(s, a) / k.abs(), 2)


def _weights(s: SCall, w: Any) -> torch.Tensor:
    if isinstance(w, _Dev):
        raise _NoRule("weights computed from the input")
    return w.detach().to(torch.float64)


def _linear(s: SCall):
    p = dict(zip(("input", "weight", "bias"), s.args))
    p.update(s.kwargs)
    w = _weights(s, p["weight"])
    if isinstance(p.get("bias"), _Dev):
        raise _NoRule("a bias computed from the input")
    c, r = s.sg(p["input"])
    b = 0 if p.get("bias") is None else p["bias"].detach().abs().to(torch.float64)
    n = w.shape[-1] + 1  # the products and the bias
    local = F.linear(c.abs(), w.abs()) + F.linear(_mag(s, p["input"]), w.abs()) + b
    return F.linear(c, w), F.linear(r, w.abs()) + SAFETY * gamma64(n) * local + SAFETY * n * TINY64


def _addmm(s: SCall):
    """β·input + α·(mat1 @ mat2) with one constant factor (GPT-2's Conv1D): linear in the other."""
    p = {"beta": 1, "alpha": 1}
    p.update(zip(("input", "mat1", "mat2"), s.args))
    p.update(s.kwargs)
    a, b = p["mat1"], p["mat2"]
    if isinstance(a, _Dev) == isinstance(b, _Dev):
        raise _NoRule("a product of two changing factors")
    alpha, beta = float(p["alpha"]), float(p["beta"])
    mm = torch.bmm if s.value(a).dim() == 3 else torch.mm
    (ca, ra), (cb, rb), (ci, ri) = s.sg(a), s.sg(b), s.sg(p["input"])
    va, vb = s.value(a).detach().to(torch.float64), s.value(b).detach().to(torch.float64)
    if isinstance(a, _Dev):
        c, r, local = mm(ca, vb), mm(ra, vb.abs()), mm(ca.abs() + va.abs(), vb.abs())
    else:
        c, r, local = mm(va, cb), mm(va.abs(), rb), mm(va.abs(), cb.abs() + vb.abs())
    n = va.shape[-1] + 1
    local = abs(alpha) * local + abs(beta) * (ci.abs() + _mag(s, p["input"]))
    return alpha * c + beta * ci, abs(alpha) * r + abs(beta) * ri + SAFETY * gamma64(n) * local + SAFETY * n * TINY64


def _conv(s: SCall):
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    p = {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1}
    p.update(zip(names, s.args))
    p.update(s.kwargs)
    w = _weights(s, p["weight"])
    if isinstance(p["bias"], _Dev):
        raise _NoRule("a bias computed from the input")
    conv = lambda t, k: s.func(t, k, None, p["stride"], p["padding"], p["dilation"], p["groups"])
    c, r = s.sg(p["input"])
    n = w[0].numel() + 1
    b = 0 if p["bias"] is None else p["bias"].detach().abs().to(torch.float64).view(1, -1, *([1] * (w.dim() - 2)))
    local = conv(c.abs(), w.abs()) + conv(_mag(s, p["input"]), w.abs()) + b
    return conv(c, w), conv(r, w.abs()) + SAFETY * gamma64(n) * local + SAFETY * n * TINY64


def _batch_norm(s: SCall):
    names = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")
    p = {"weight": None, "bias": None, "training": False, "momentum": 0.1, "eps": 1e-5}
    p.update(zip(names, s.args))
    p.update(s.kwargs)
    if p["training"] or p["running_var"] is None:
        raise _NoRule("BatchNorm in training mode")
    rv = p["running_var"].detach().to(torch.float64)
    w = torch.ones_like(rv) if p["weight"] is None else p["weight"].detach().to(torch.float64)
    shape = (1, -1, *([1] * (s.value(p["input"]).dim() - 2)))
    scale = (w / torch.sqrt(rv + p["eps"])).view(shape)
    c, r = s.sg(p["input"])
    out = c * scale
    b = 0 if p["bias"] is None else p["bias"].detach().abs().to(torch.float64).view(shape)
    mu = p["running_mean"].detach().abs().to(torch.float64).view(shape)
    local = out.abs() + (_mag(s, p["input"]) + mu) * scale.abs() + b  # the smooth network's own normalization too
    return out, r * scale.abs() + _round(local, 8)


def _reduce(s: SCall):
    if s.kwargs.get("dtype") is not None:
        raise _NoRule("a reduction at another precision")
    c, r = s.sg(s.args[0])
    n = max(1, s.value(s.args[0]).numel() // max(1, s.rest(c).numel()))
    local = s.rest(c.abs()) + s.rest(_mag(s, s.args[0]))
    return s.rest(c), s.rest(r) + SAFETY * gamma64(n + 1) * local + SAFETY * n * TINY64


def _avg_pool(s: SCall):
    c, r = s.sg(s.args[0])
    n = math.prod(s.value(s.args[0]).shape[2:]) + 1
    local = s.rest(c.abs()) + s.rest(_mag(s, s.args[0]))
    return s.rest(c), s.rest(r) + SAFETY * gamma64(n) * local + SAFETY * n * TINY64


def _dropout(s: SCall):
    p = dict(zip(("input", "p", "training", "inplace"), s.args))
    p.update(s.kwargs)
    if p.get("training", True) and p.get("p", 0.5) > 0:
        raise _NoRule("dropout in training mode")
    return s.sg(p["input"])


_STRUCTURAL = ("flatten", "view", "reshape", "transpose", "permute", "contiguous", "expand", "expand_as", "unsqueeze",
               "squeeze", "__getitem__", "select", "narrow", "clone", "detach", "t", "movedim", "unflatten", "cat",
               "concat", "concatenate", "stack", "repeat", "tile", "broadcast_to", "view_as", "reshape_as", "swapaxes",
               "flip", "roll")

SIGNED: dict[str, Callable[[SCall], tuple[torch.Tensor, torch.Tensor]]] = {
    **{n: _structural for n in _STRUCTURAL},
    **{n: _same for n in ("neg", "negative", "__neg__", "positive", "__pos__", *CASTS)},
    **{n: _add for n in ("add", "__add__", "__radd__", "sub", "__sub__", "__rsub__", "rsub", "subtract")},
    **{n: _mul for n in ("mul", "__mul__", "__rmul__", "multiply")},
    **{n: _div for n in ("div", "__truediv__", "true_divide", "divide")},
    "linear": _linear,
    "addmm": _addmm,
    **{n: _conv for n in ("conv1d", "conv2d", "conv3d")},
    "pad": _pad,
    "batch_norm": _batch_norm,
    "mean": _reduce,
    "sum": _reduce,
    **{n: _avg_pool for n in ("avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
                              "adaptive_avg_pool3d")},
    **{n: _dropout for n in ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")},
}


def carry(name: str, func: Callable, args: tuple, kwargs: dict, outs: list, boxes: list[torch.Tensor],
          exact: int) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
    """(c, r) per output of one call; None (the box alone) where no rule applies."""
    rule = SIGNED.get(name)
    if rule is None or len(outs) != 1 or not outs[0].is_floating_point():
        return [None] * len(outs)
    try:
        c, r = rule(SCall(name, func, args, kwargs, exact))
    except (_NoRule, TypeError, RuntimeError):  # a call form this rule does not read: the box stands
        return [None]
    shape = outs[0].shape
    return [finite(torch.broadcast_to(c, shape), torch.broadcast_to(r, shape))]


def monotone_image(h: Callable[[torch.Tensor], torch.Tensor], z: torch.Tensor, y: torch.Tensor, c: torch.Tensor,
                   r: torch.Tensor, ops: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(c, r) of h(v) − y for a non-decreasing h, v = z + Δ, |Δ − c| ≤ r: the centre and half-width of
    [h(z + c − r), h(z + c + r)] − y, widened by the float64 roundings of z + c ± r, of h (`ops` roundings of its
    result) and of the differences."""
    e = _round(z.abs() + c.abs() + r, 3)  # the roundings of z + c ± r, so that the computed interval holds the real one
    lo_in, hi_in = z + c - r - e, z + c + r + e
    lo, hi = h(lo_in) - y, h(hi_in) - y
    slack = _round(torch.maximum(h(lo_in).abs(), h(hi_in).abs()), ops) + _round(lo.abs() + hi.abs() + y.abs(), 2)
    return (lo + hi) / 2, (hi - lo) / 2 + slack


def finite(c: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A centre or radius that overflowed: nothing is known there (0 ± ∞)."""
    bad = ~torch.isfinite(c) | ~torch.isfinite(r)
    return torch.where(bad, torch.zeros_like(c), c), torch.where(bad, torch.full_like(r, math.inf), r)
