"""CROWN's back-substitution through convolutions in float32 with its rounding error added (`Float32Back`, a part of
`bounds.Bounder`): sound, about a quarter of float64's cost on a convolutional network, and looser by that error only,
which a ReLU site's screen (`_relu_rows`) then removes where it matters (the units float32 leaves crossing 0)."""

from __future__ import annotations

import math
from typing import Any

import torch

from pipeline.numerics import U, UNDERFLOW, dot_error

# A Conv whose back-substitution sums at least this many products per coefficient (`Conv.back_terms`) runs it in
# float32 on the CPU, its rounding error added to the bound (`Float32Back._float32_back`); below it float64's kernel is as
# fast as the float32 one with the error's extra passes (a 1×1 shortcut, a one-channel stem). A grouped conv (depthwise:
# kh·kw terms) runs in float32 whatever its terms: its float64 route (a product per group, col2im) costs more than
# oneDNN's float32 grouped transposed convolution. 0 turns it off.
FLOAT32_MIN_TERMS = 64
FLOAT32_RANGE = 2.0 ** 100  # interval ends and weights beyond this (or nonzero weights below its inverse): float64
# The smooth gates' sites bounded with float32 convolutions too (their rounding error added: sound). A gate's relaxation
# depends on every unit's interval, so float32's looser intervals (on the [16,32] preact ResNet at most 0.14% of a
# width) reach the spec rows' bounds; for that the smooth network's pass costs a fifth, which decides more properties in
# the verify stage's budget (benchmarks/verify-results/crown-speed.md). On; False gives float64's CROWN exactly.
FLOAT32_GATES = True


class Float32Back:
    """The float32 parts of `bounds.Bounder` (which gives `net`, `_iv`, `_f32`, `_f32_used`, `_rows`)."""

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

        None (float64's `back`): a node other than a Conv, one that sums fewer than FLOAT32_MIN_TERMS products (unless
        grouped), a computation off the CPU (a GPU's float32 convolution may run in TF32) or with gradients (α-CROWN's
        steps), a float32 precision setting other than IEEE, an input interval or weight outside FLOAT32_RANGE, or a
        float32 result that is not finite."""
        op = self.net.nodes[k].op
        if not FLOAT32_MIN_TERMS or (op.back_terms < FLOAT32_MIN_TERMS and not op.grouped) \
                or A.requires_grad or A.device.type != "cpu":
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

    def _float32_data(self, k: int, op: Any):
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


def _ieee_float32() -> bool:
    """Does torch compute float32 matrix products and oneDNN convolutions in IEEE float32 (not TF32 or bf16)?"""
    mk = torch.backends.mkldnn
    modes = {getattr(mk, "fp32_precision", "none"), getattr(getattr(mk, "conv", None), "fp32_precision", "none")}
    return torch.get_float32_matmul_precision() == "highest" and modes <= {"none", "ieee"}
