"""The Triton kernels' Φ tail, refitted and checked: R(a) = Φ(−a)/exp(−a²/2) = erfcx(a/√2)/2 as t·Q(t) with
t = 1/(1 + p·a), Q of 8th degree, minimax relative error on a ∈ [0, A_MAX] (Lawson's iteratively reweighted least
squares on Chebyshev nodes in t, after a scan over p). `triton_gate.PHI_TAIL` holds the result.

    python -m pipeline.kernels.phi_fit        # refit, print the coefficients and their error in float32 arithmetic
"""

from __future__ import annotations

import numpy as np
from scipy.special import erfcx

A_MAX = 40.0  # the kernels clamp |λx| at PHI_CLAMP = 40
DEGREE = 8


def tail(a: np.ndarray) -> np.ndarray:
    """R(a) = Φ(−a)·exp(a²/2) in float64 (scipy's erfcx keeps relative accuracy in the tail)."""
    return 0.5 * erfcx(np.asarray(a, dtype=np.float64) / np.sqrt(2.0))


def fit(p: float, degree: int = DEGREE, nodes: int = 3000, iters: int = 80) -> tuple[np.ndarray, float]:
    """Coefficients of Q (t⁰ up) minimizing the largest relative error of t·Q(t) against R, and that error."""
    t_min = 1.0 / (1.0 + p * A_MAX)
    t = np.cos(np.linspace(0.0, np.pi, nodes)) * 0.5 * (1.0 - t_min) + 0.5 * (1.0 + t_min)
    y = tail((1.0 / t - 1.0) / p) / t
    V = np.vander(t, degree + 1, increasing=True)
    w = np.full(nodes, 1.0 / nodes)
    for _ in range(iters):  # Lawson: weights grow where the relative error is largest
        W = np.sqrt(w) / y
        c, *_ = np.linalg.lstsq(V * W[:, None], y * W, rcond=None)
        e = np.abs(V @ c - y) / y
        w = w * e / (w * e).sum()
    return c, float(e.max())


def float32_error(p: float, coeffs, points: int = 400_001) -> float:
    """Largest relative error of t·Q(t) evaluated in float32 (Horner, as the kernel does) on a ∈ [0, A_MAX], against R
    at the same float32 a."""
    a = np.linspace(0.0, A_MAX, points).astype(np.float32)
    one = np.float32(1.0)
    t = one / (one + np.float32(p) * a)
    q = np.float32(coeffs[-1])
    for c in coeffs[-2::-1]:
        q = q * t + np.float32(c)
    ref = tail(a.astype(np.float64))
    return float(np.max(np.abs((t * q).astype(np.float64) - ref) / ref))


def best(degree: int = DEGREE) -> tuple[float, list[float], float]:
    """(p, float32 coefficients, their float32 error), p scanned on a grid of float32 values."""
    scan = [(fit(float(p), degree, 1200, 40)[1], float(np.float32(p))) for p in np.linspace(0.2, 0.7, 51)]
    p = min(scan)[1]
    c, _ = fit(p, degree)
    coeffs = [float(np.float32(v)) for v in c]
    return p, coeffs, float32_error(p, coeffs)


def main() -> int:
    p, coeffs, err = best()
    print(f"PHI_TAIL = ({p!r},\n            ({', '.join(repr(c) for c in coeffs)}))")
    print(f"largest relative error of t·Q(t) in float32 on [0, {A_MAX:g}]: {err:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
