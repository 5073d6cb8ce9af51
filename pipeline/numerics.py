"""Float32 rounding, the one home of its numbers: the unit roundoff u, γ_n, the float32 library's accuracy and the
bound on a float32 dot product. The export check's rounding bound (`quantize/rounding.py`), the swap certificate
(`analysis/theory/certificate/`) and the verifier's int8 reading (`analysis/verification/quantized.py`, `ops/rounding.py`)
read them here; `tests/test_layout.py` fails on a definition of any of them elsewhere, and
`tests/test_float32_statement.py` tests each against float32 arithmetic as this machine does it.

The standard model (Higham, "Accuracy and Stability of Numerical Algorithms", ch. 2-3): a float32 operation rounds
its exact result once, fl(a ∘ b) = (a ∘ b)(1 + θ), |θ| ≤ u = 2⁻²⁴ (round to nearest), as long as nothing underflows.
A quantity that passes through k roundings is within γ_k = k·u/(1 − k·u) of its exact value, relatively.

**The dot product** (`dot_error`): a float32 sum of `terms` summands, each a product w_j·x_j or a bias, in any
summation order, blocked or not, with or without FMA (GEMM, direct or im2col convolution):

    |fl(Σ w_j·x_j + b) − (Σ w_j·x_j + b)| ≤ slack·γ_terms·(Σ|w_j|·|x_j| + |b|) + (2·terms − 1)·UNDERFLOW.

Each product term is rounded at most once as a product and `terms` − 1 times in the sum, hence γ_terms. Below 2⁻¹²⁶
the standard model fails: a product or a sum that goes subnormal is off by up to 2⁻¹⁵⁰ absolutely, and one that a
flush-to-zero mode flushes by up to 2⁻¹²⁶ (`UNDERFLOW`), whatever the relative bound says; there are `terms`
products and `terms` − 1 additions. `slack` (`GAMMA_SLACK` = 1 + 2⁻²⁰ by default) covers the float64 evaluation
of the bound itself, relatively 2⁻⁴⁰ or less.

Three bounds read `dot_error`: the certificate's (its `core.dot_rounding`, terms = n + 1 with the underflow term and
the slack, which a proof needs: tests/test_float32_statement.py builds subnormal dot products that exceed γ_n·m); the
export check's (`quantize/rounding.py`, slack = 1: a first-order estimate whose `export.atol` slack dominates both
terms); the int8 requantization bound's (`analysis/verification/quantized.py`, slack = 1: its γ_{n+8} is room over
the γ_{n+3} it needs). Why each form: docs/EXPERIMENTS.md, "One rounding bound".

**The library's accuracy.** The float32 library functions are within `LIBRARY_ULPS` = 4 units of u of the exact
result (SLEEF's u10/u35 and ATen's vectorized erf stay within 2.5 on the CPU; tests/test_float32_statement.py), and
every bound built on it is doubled (`SAFETY`), so `ULPS` = SAFETY·LIBRARY_ULPS = 8.
"""

from __future__ import annotations

import math
from typing import Any

import torch

U = 2.0**-24  # float32 unit roundoff, round to nearest
UNDERFLOW = 2.0**-126  # the smallest normal float32: what one underflowing operation can be off by, absolutely
GAMMA_SLACK = 1 + 2.0**-20  # the float64 evaluation of a γ bound (relatively 2⁻⁴⁰ or less), with room
LIBRARY_ULPS = 4  # exp, log, log1p, erf, erfc, tanh, sigmoid, sqrt of the float32 library: within this many u
SAFETY = 2.0  # every local bound built on an ulp assumption is doubled (the certificate's and the export check's)
ULPS = SAFETY * LIBRARY_ULPS  # the export check's allowance for one library call or activation, in units of u


def gamma(n: int | float | torch.Tensor) -> Any:
    """γ_n = n·u/(1 − n·u): the relative error bound of n float32 roundings in sequence (Higham, Lemma 3.1); ∞ once
    n·u ≥ 1/2, where the lemma claims nothing."""
    nu = n * U
    if isinstance(nu, torch.Tensor):
        return torch.where(nu < 0.5, nu / (1 - nu), torch.full_like(nu, math.inf))
    return nu / (1 - nu) if nu < 0.5 else math.inf


def dot_error(terms: int, magnitude: Any, slack: float = GAMMA_SLACK) -> Any:
    """A bound on |fl(Σ w_j·x_j + b) − (Σ w_j·x_j + b)| for a float32 sum of `terms` summands (products and a bias)
    in any order, with or without FMA: slack·γ_terms·magnitude + (2·terms − 1)·UNDERFLOW, `magnitude` =
    Σ|w_j|·|x_j| + |b| (computed by the caller; a tensor or an array). See the module docstring for `slack`."""
    return slack * gamma(terms) * magnitude + (2 * terms - 1) * UNDERFLOW
