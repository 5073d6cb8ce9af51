"""The swap certificate: how far can any logit move when every gate of a network becomes ReLU (the swap
stage)? A bound proved by walking the network's real computation, or a refusal that says why.

## The statements
S is the smooth network, R the swapped one: the same weights, with every module that
`pipeline.activations.gate_of` recognises (exactly the modules `pipeline.relu_swap.to_relu` replaces) computing
ReLU instead of x·g(λx). S̃ and R̃ are the same two networks evaluated in float32 by PyTorch on the CPU (eval mode, full-precision float32
matmuls; the premises are listed under "float32 rounding" below): what the float32 statements are about.

    exact, global        |R(x) − S(x)|   ≤ B             for every input x (real arithmetic)
    exact, per sample    |R(x) − S(x)|   ≤ δ(x)          on the given x
    float32, per sample  |R̃(x) − S̃(x)| ≤ δ̃(x) + ε̃(x)
    float32, global      |R̃(x) − S̃(x)| ≤ B + ρ(x) + ε̃(x)
    float32, Jacobian    |R̃(x) − S̃(x)| ≤ δ(x) + ρ_J(x) + ε_J(x)   (chain networks, `chain32.py`)

elementwise over the logits. Where no rule below applies, the statement is refused with the reason
(`Refused` for the exact ones; the float32 ones carry their own refusal string).

## How: boxes carried through the model's own forward
The model runs on a float64 copy with its input wrapped in `_Dev`, a tensor subclass that carries beside
every value z of S one box per *channel*: a tensor d ≥ 0 with |v − z| ≤ d elementwise, v being the other
network's value at the same place. Every torch function the forward calls (F.linear, conv2d, layer_norm,
scaled_dot_product_attention, +, cat, view, ...) dispatches through `_Dev.__torch_function__`, which
computes z with the real function and each box with that function's rule; gates and the registry's other
activations are intercepted as modules. Nothing is assumed about how modules are wired: residual blocks,
linked pairs (g(z), g(−z)) concatenated, transformer blocks are whatever their forward does. A function
with no rule is a refusal, except where the box is still exactly zero (before the first gate: identical
computations on identical inputs give identical values in real arithmetic, whatever the function).

Channels (a box each): `exact` bounds |R − S| (δ, or B in the global walk); `relu32` bounds |R̃ − S| (δ̃);
`smooth32` bounds |S̃ − S| (ε̃); `relu_rounding` bounds |R̃ − R| (ρ) with the global rules, which hold
around any point, so the unknown R is never needed. Then |R̃ − S̃| ≤ δ̃ + ε̃ and ≤ |R̃ − R| + |R − S| +
|S − S̃| ≤ ρ + B + ε̃.

Per sample, the exact channel also carries its change with signs (`signed.py`): a centre c and a radius r with
|v − z − c| ≤ r, through W·c instead of |W|·d, cut to the box after every op; the box becomes |c| + r where that is
smaller, so the changes of two gates cancel where the weights cancel them. Its statement is about R in real
arithmetic from the values both networks share against S as the walk evaluates it in float64; the float64 rounding
of both is in r, and compounds by |W| per layer like any box.

## Where
`core.py` (constants, channels, `_Dev`, `_Call`), `interpreter.py` (the walk, `Certifier`), `rules/` (one file per
family of torch functions, `RULES`), `signed.py` (the per-sample change with its signs), `activations.py` (gates and
the other activations, as modules), `chain32.py`
(each network's float32 rounding carried through its own Jacobian, for chains of Linear layers and activations:
the boxes compound |W| per layer, ~15× per 256-wide layer, and keep no prediction of the default MLP provably).

## The rules (d, d' input boxes; |W| elementwise absolute weights; every rule is a proof of |v' − z'| ≤ d_out)
- Linear / Conv: |W(v − z)| ≤ |W|·d. Affine ops with constants: |c|·d; a sum of two deviated tensors
  (residual add): d + d'; a product of two (per sample): |z|·d' + |z'|·d + d·d'. Reshapes, views,
  indexing, concatenation, negation, max-pooling: the same op on the box (max is 1-Lipschitz per window);
  average pooling, means and sums over dims: the same op (non-negative weights: a mean never grows the largest
  deviation). BatchNorm (eval): |γ/√(var + eps)|·d per channel.
- Powers and roots (RMSNorm's x·rsqrt(mean(x²) + eps), per sample only): |v^k − z^k| ≤ (|z| + d)^k − |z|^k for a
  positive integer k; √ and 1/√ by their interval image, ∞ where the interval reaches 0. The squeeze-excite product
  x·σ(W·pool(x)) is the product rule above.
- Floating casts (`to`, `float`, ...): the identity in real arithmetic, so the walk keeps its float64 value and the
  exact boxes pass; the float32 network's cast down to float32 adds one rounding (below), a cast below float32
  (float16, bfloat16) refuses the float32 statements.
- Gate (swap): |ReLU(v) − f_λ(z)| ≤ |ReLU(v) − ReLU(z)| + |ReLU(z) − f_λ(z)| ≤ d + c/λ (global, c of
  `pipeline.gates`); per sample exactly max(|ReLU(z ± d) − f_λ(z)|), ReLU being monotone. A linked pair
  is cat(g(z), g(−z)): both halves get the rule, through the real cat and neg.
- Other activations h (present in both networks): L_h·d with L_h the Lipschitz constant (`ACTIVATION_RULES`);
  per sample the interval image max |h(z ± d) − h(z)| for monotone h; a jump of size J (Hardshrink, and
  torch's Softplus switching to x at βx = threshold) adds J where the interval can cross it.
- LayerNorm over D features, σ = √(var(z) + eps): per sample, with r = rms(d) ≥ |σ(v) − σ(z)| (the map
  v ↦ √(‖v − mean v‖²/D + eps) is 1/√D-Lipschitz in ℓ2) and s = max(σ − r, √eps) ≤ σ(v):
  |LN(v)_i − LN(z)_i| ≤ |γ_i|·((d_i + mean d)/s + |z_i − mean z|·r/(σ·s)). Global: the Jacobian of
  v ↦ (v − mean v)/σ(v) has spectral norm ≤ 1/σ ≤ 1/√eps, so |γ_i|·‖d‖₂/√eps.
- Attention softmax(q·kᵀ·scale)·v, per sample only (it has no global Lipschitz constant): score boxes
  e = scale·(|q|·d_kᵀ + d_q·|k|ᵀ + d_q·d_kᵀ); softmax ratios p'_j/p_j ∈ [e^{−e_j − max e}, e^{e_j + max e}],
  so |p' − p| ≤ p·(e^{e_j + max e} − 1) =: Δp; output box Δp·|v| + (p + Δp)·d_v. Causal masks are the
  same in both networks. The rule checks that the function's output is softmax(q·kᵀ·scale)·v first.

## float32 rounding (the `*32` and `relu_rounding` channels)
On top of the rules each float32 operation adds its local rounding, bounded in the standard model
fl(a ∘ b) = (a ∘ b)(1 + θ), |θ| ≤ u = 2⁻²⁴ (round to nearest, no underflow):
- a dot product of length n plus a bias, in any summation order, with or without FMA (GEMM, direct or
  im2col convolution): |fl(w·x + b) − (w·x + b)| ≤ γ_{n+1}·(|w|·|x| + |b|), γ_n = nu/(1 − nu) (Higham,
  Accuracy and Stability of Numerical Algorithms, §3.1); a sum of two: u·(|a| + |b|); a product: u·|a·b|;
  scalars given as Python floats add one more u (the constant's own rounding);
- elementwise library functions (exp, log1p, erf, tanh, sqrt) within `ULP_ELEMENTWISE` ulp; a gate
  f_λ(x) = x·g(λx) as a whole within K_GATE·u·|x| + UNDERFLOW (`core.gate_rounding`: the last term for a value the
  kernels flush to 0; ≤ 4 roundings and g's ulp error, each at most ~u·|x| in
  absolute terms because 0 ≤ g ≤ 1, plus λ's own float32 rounding, |∂f/∂λ|·|Δλ| ≤ 0.25·|x|·2u);
- LayerNorm, BatchNorm and the softmax: the γ bounds of their sums (`_layer_norm_rounding`, `_sdpa`);
- every local term is multiplied by `SAFETY` = 2, which absorbs the float64 reference's own rounding
  (2²⁹ times smaller per operation than float32's) and slack in the ulp assumptions; except the dot products
  (`pipeline.numerics.dot_error`): γ_n assumes nothing beyond round to nearest, so they get `GAMMA_SLACK` = 1 + 2⁻²⁰ for the
  float64 evaluation, plus `UNDERFLOW` per operation where the standard model stops (subnormals, flush-to-zero).
The magnitudes |x| these need are |z| + d of a channel that bounds the float32 value (|R̃| ≤ |z| + δ̃).
Assumptions stated: float32 matmuls at full precision (`torch.get_float32_matmul_precision() ==
"highest"`, checked), parameters that are float32 numbers (checked), no Winograd/FFT convolution (their
error is not bounded by γ_n; PyTorch's CPU and cuDNN defaults for these layers are direct or GEMM-based
unless benchmark mode picks otherwise). The tests measure float32 changes by sampling and by gradient
ascent on every registered model and assert they stay under δ̃ + ε̃.
"""

from __future__ import annotations

from .activations import ACTIVATION_RULES, ActivationRule
from .core import ABOUT, K_GATE, SAFETY, U32, ULP_ELEMENTWISE, Refused, gamma, gate_constant, gate_rounding
from .interpreter import Certifier, SwapBound, certified_fraction, certified_mask, relu_swapped, swap_bound, swap_bound_per_sample
from .rules import RULES

__all__ = ["ABOUT", "ACTIVATION_RULES", "ActivationRule", "Certifier", "K_GATE", "RULES", "Refused", "SAFETY", "SwapBound", "U32",
           "ULP_ELEMENTWISE", "certified_fraction", "certified_mask", "gamma", "gate_constant", "gate_rounding", "relu_swapped", "swap_bound",
           "swap_bound_per_sample"]
