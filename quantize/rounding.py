"""How far float32 may move a network's outputs from their exact values: a per-output bound, derived from the
network and the input, that every export check compares each engine against (quantize/export.py).

The model runs once in float64 (the reference) with every op's float32 rounding error made explicit. The
standard model of floating point (Higham, "Accuracy and Stability of Numerical Algorithms", ch. 2-3) bounds
what one float32 op adds to its result y, whatever the engine's summation order, blocking or FMA use:

  a sum or dot product of n terms (Linear, Conv, MatMul, a reduction)  γ_n·(|W|·|x| + |b|) + (2n − 1)·2⁻¹²⁶
  an elementwise add or mul                                            γ_1·|y| (one rounding)
  erf, erfc, tanh, sigmoid (bounded; library accuracy is absolute)     ULPS·u·(|y| + 1)
  exp, log, sqrt, rsqrt, pow                                           ULPS·u·|y|
  an activation (GELU, SiLU, the project's gates, ...), any formula    ULPS·u·(|y| + |x|)
  ReLU, max, clamp, pooling by max, data movement                      0 (exact)

with u = 2⁻²⁴ and γ_n = n·u/(1 − n·u) (`pipeline.numerics`, the home of u, γ_n, ULPS and the dot product's bound
`dot_error`, which says why this first-order bound takes no slack for its float64 evaluation). Each op's term r
is injected as y + ε⊙r with ε = 0, and the bound on output k is, to first order in u, Σ over ops Σ over elements
|∂y_k/∂ε|·r (FPTaylor's first-order term, Solovyev et al., TOPLAS 2018): the local errors carried to the output by
the network's actual Jacobian. Weight norms, widths and
depth enter through |W|·|x|, n and that Jacobian. Not covered by first order: a ReLU whose input lies
within rounding of 0 can switch; the output then moves by at most that rounding times the downstream gain,
which the worst-case γ_n (n·u, against the ~√n·u that real sums show) covers many times over. Soundness is
tested by sampling (tests/test_rounding.py): the float32 error of PyTorch and of onnxruntime stays below
the bound on every output, while a changed weight exceeds it.

Engines may fold consecutive affine ops (an input normalization into the first Gemm, a BatchNorm into its
Conv) and evaluate them as one: every affine op's term uses the magnitude of its whole affine chain (|W|
applied to the chain's |terms|, reset at each nonlinearity) and the chain's total number of terms, which
covers any such regrouping. LayerNorm's variance term allows for a one-pass E[x²] − E[x]² formula.
An op without a rule is taken as correctly rounded to ULPS ulps of its output and named in `unmodelled`.
"""

from __future__ import annotations

import copy
import inspect
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from pipeline.numerics import ULPS, U, dot_error, gamma
from pipeline.onnx_io import mha_fastpath

# A first-order bound (O(u) terms) takes no slack for the float64 evaluation of γ_n (`pipeline.numerics`).
FIRST_ORDER = 1.0
MAX_OUTPUTS = 64  # output coordinates per sample that get a bound (one backward pass each); more are subsampled evenly
CHUNK_ELEMENTS = 1 << 22  # float64 elements of traced activations per chunk of samples (memory: ~4 copies of this)


@dataclass
class Bound:
    """Float64 outputs and the first-order bound on |float32 − exact| per output, on `index` (flat output
    coordinates per sample; all of them unless subsampled)."""

    reference: np.ndarray  # [N, ...] float64 outputs
    bound: np.ndarray  # [N, len(index)]
    index: np.ndarray  # flat output coordinates the bound covers
    unmodelled: dict[str, int] = field(default_factory=dict)  # ops without a rule, with their call counts


# ---------------------------------------------------------------------------------------------
# Which torch functions each rule covers (as the function mode sees them: torch.*, Tensor methods, F.*)

_SPACES = (torch, torch.Tensor, F, torch.special, torch._C._nn)


def _fns(*names: str) -> frozenset:
    out = set()
    for name in names:
        for space in _SPACES:
            for attr in (name, f"__{name}__", f"__r{name}__", f"__i{name}__", f"{name}_"):
                f = getattr(space, attr, None)
                if f is not None and callable(f):
                    out.add(f)
    return frozenset(out)


LINEAR = _fns("linear")
CONV = _fns("conv1d", "conv2d", "conv3d")
CONV_T = _fns("conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
MATMUL = _fns("matmul", "mm", "bmm")
ADDMM = _fns("addmm", "baddbmm")
ADD, SUB = _fns("add"), _fns("sub", "subtract", "rsub")
MUL, DIV = _fns("mul", "multiply"), _fns("div", "divide", "true_divide")
REDUCE = _fns("sum", "mean")
AVG_POOL = _fns("avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d")
BOUNDED = _fns("erf", "erfc", "tanh", "sigmoid", "sin", "cos", "hardsigmoid")
RELATIVE = _fns("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal", "pow", "square",
                "leaky_relu", "prelu", "rrelu")
SCALED = _fns("gelu", "silu", "mish", "softplus", "elu", "selu", "celu", "hardswish", "softsign", "logsigmoid",
              "tanhshrink", "softshrink", "hardshrink")
EXACT = _fns("relu", "relu6", "hardtanh", "clamp", "clamp_min", "clamp_max", "clip", "abs", "neg", "negative", "maximum",
             "minimum", "amax", "amin", "max", "min", "max_pool1d", "max_pool2d", "max_pool3d", "max_pool1d_with_indices",
             "max_pool2d_with_indices", "max_pool3d_with_indices", "adaptive_max_pool1d", "adaptive_max_pool2d",
             "threshold", "sign", "floor", "ceil", "round", "trunc", "embedding", "masked_fill", "where", "tril", "triu")
MOVE = _fns("view", "reshape", "flatten", "unflatten", "permute", "transpose", "t", "contiguous", "clone", "getitem",
            "squeeze", "unsqueeze", "expand", "expand_as", "repeat", "chunk", "split", "unbind", "cat", "concat", "concatenate",
            "stack", "narrow", "select", "index_select", "gather", "flip", "roll", "movedim", "view_as", "reshape_as", "tile",
            "repeat_interleave", "split_with_sizes", "tensor_split", "pad", "dropout", "alpha_dropout", "dropout1d",
            "dropout2d", "dropout3d", "feature_alpha_dropout", "to", "type_as", "float", "double", "detach")
SOFTMAX, LOG_SOFTMAX = _fns("softmax"), _fns("log_softmax")
LAYER_NORM, BATCH_NORM = _fns("layer_norm"), frozenset({F.batch_norm})  # torch.batch_norm orders its arguments otherwise
SDPA = _fns("scaled_dot_product_attention")


def _name(func: Callable) -> str:
    return getattr(func, "__name__", None) or repr(func)


def _floating(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


# ---------------------------------------------------------------------------------------------
# The tracer


class _Trace(TorchFunctionMode):
    """A float64 forward pass in which every op's output y becomes y + ε⊙r (ε = 0 requiring grad, r its rounding
    bound); `sources` collects the ε. Each data tensor carries (m, n): the magnitude of its affine chain and the
    chain's number of summed terms. Tensors the trace did not make (parameters, buffers) are constants."""

    def __init__(self) -> None:
        super().__init__()
        self.sources: list[torch.Tensor] = []
        # id(data tensor) -> (tensor, m, n); the tensor is held so its id stays its own while the trace lives
        self.info: dict[int, tuple[torch.Tensor, torch.Tensor, int]] = {}
        self.unmodelled: Counter[str] = Counter()
        self.opaque = 0  # > 0 inside a module that is injected as a whole (pointwise activations)

    # -- bookkeeping ------------------------------------------------------------------------
    def data(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and id(t) in self.info

    def mag(self, t: Any) -> Any:
        """The affine-chain magnitude of a data tensor; |c| of a constant (tensor or number)."""
        if isinstance(t, torch.Tensor):
            return self.info[id(t)][1] if id(t) in self.info else t.detach().abs()
        return abs(t) if isinstance(t, (int, float)) else t

    def terms(self, t: Any) -> int:
        return self.info[id(t)][2] if self.data(t) else 0

    def register(self, t: torch.Tensor, m: torch.Tensor, n: int) -> torch.Tensor:
        self.info[id(t)] = (t, m.detach(), n)
        return t

    def inject(self, y: torch.Tensor, r: torch.Tensor, m: torch.Tensor | None = None, n: int = 0) -> torch.Tensor:
        # Outside this mode: a forward hook (`_hooks`) calls this while the mode is active, and its own arithmetic is
        # no op of the network (no rule of its own, no term of its own).
        with torch._C.DisableTorchFunction():
            eps = torch.zeros_like(y, requires_grad=True)
            self.sources.append(eps)
            # a masked −inf score rounds to itself: its term (|y|·u = ∞) is 0. nan_to_num, not isfinite + where:
            # 18x cheaper on a ViT's activations (benchmarks/EXPORT.md); where y is ±∞ its ε gets no gradient anyway
            r = torch.nan_to_num(r.detach(), nan=0.0, posinf=0.0, neginf=0.0)
            out = y + eps * r
        return self.register(out, y.detach().abs() if m is None else m, n)

    def reenter(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """Evaluate a composite with this mode active again, so that its parts get their own rules."""
        with self:
            return fn(*args, **kwargs)

    def decompose(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """A composite torch.nn.functional writes in Python (F.multi_head_attention_forward, ...), op by op. Its
        own first line hands it to the active mode again, so that check is off for the call (torch.nn.functional's
        names only; the C++ ops inside dispatch to this mode as usual)."""
        module = inspect.getmodule(fn)
        names = [n for n in ("has_torch_function", "has_torch_function_unary", "has_torch_function_variadic")
                 if hasattr(module, n)]
        saved = {n: getattr(module, n) for n in names}
        for n in names:
            setattr(module, n, lambda *a: False)
        try:
            return self.reenter(fn, *args, **kwargs)
        finally:
            for n, f in saved.items():
                setattr(module, n, f)

    # -- dispatch -----------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.opaque:
            return func(*args, **kwargs)
        if not any(self.data(a) for a in _tensors(args, kwargs)):
            return func(*args, **kwargs)  # constants only (a parameter's view, λ from s): no data flows here
        for rules, rule in _RULES:
            if func in rules:
                return rule(self, func, args, kwargs)
        if _name(func) == "__get__":  # attribute access (.T, .mT, .shape)
            return _move(self, func, args, kwargs)
        if inspect.isfunction(func):  # a composite written in Python (F.multi_head_attention_forward, ...)
            return self.decompose(func, *args, **kwargs)
        out = func(*args, **kwargs)
        if not _floating(out):
            return out
        self.unmodelled[_name(func)] += 1
        return self.inject(out, ULPS * U * out.detach().abs())


def _tensors(args, kwargs) -> list[torch.Tensor]:
    flat = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            flat.append(a)
        elif isinstance(a, (list, tuple)):
            flat.extend(x for x in a if isinstance(x, torch.Tensor))
    return flat


def _swap(tr: _Trace, a: Any) -> Any:
    """A call's argument with every data tensor replaced by its magnitude and constants by |c|."""
    if isinstance(a, torch.Tensor):
        return tr.mag(a) if a.is_floating_point() else a
    if isinstance(a, (list, tuple)):
        return type(a)(_swap(tr, x) for x in a)
    return a


# ---------------------------------------------------------------------------------------------
# Rules: each returns the op's output, injected and registered


def _move(tr, func, args, kwargs):
    """Data movement: exact; the magnitude moves the same way."""
    if _name(func) == "detach":  # keep the path to ε: the bound needs ∂y/∂ε through everything
        return args[0]
    out = func(*args, **kwargs)
    with torch.no_grad():
        m = func(*_swap(tr, args), **{k: _swap(tr, v) for k, v in kwargs.items()})
    n = max((tr.terms(a) for a in _tensors(args, kwargs)), default=0)
    for o, mo in (zip(out, m) if isinstance(out, (list, tuple)) else [(out, m)]):
        if _floating(o):
            tr.register(o, mo, n)
        elif isinstance(o, torch.Tensor) and o.dtype != torch.bool:  # token ids reshaped (HF models view them first)
            tr.register(o, o.detach().abs().double(), 0)
    return out


def _sum(n, m):
    """The rounding of a float32 sum of n terms of magnitude m (`pipeline.numerics.dot_error`)."""
    return dot_error(n, m, FIRST_ORDER)


def _affine(tr, y, m, n):
    """An op of an affine chain: its term is the sum's bound over the chain's terms and magnitude."""
    return tr.inject(y, _sum(n, m), m, n)


def _linear(tr, func, args, kwargs):
    x, w = args[0], args[1] if len(args) > 1 else kwargs["weight"]
    b = args[2] if len(args) > 2 else kwargs.get("bias")
    y = func(*args, **kwargs)
    with torch.no_grad():
        m = F.linear(tr.mag(x), tr.mag(w), None if b is None else tr.mag(b))
    return _affine(tr, y, m, tr.terms(x) + w.shape[-1] + 1)


def _conv(tr, func, args, kwargs):
    x, w = args[0], args[1]
    b = args[2] if len(args) > 2 else kwargs.get("bias")
    rest = {k: v for k, v in kwargs.items() if k != "bias"}
    y = func(*args, **kwargs)
    groups = args[6] if len(args) > 6 else kwargs.get("groups", 1)  # the same position in conv and conv_transpose
    # terms per output: weights are [C_out, C_in/groups, k...] (conv) or [C_in, C_out/groups, k...] (transposed)
    fan_in = (w.shape[1] if func in CONV else w.shape[0] // groups) * math.prod(w.shape[2:])
    with torch.no_grad():
        m = func(tr.mag(x), tr.mag(w), None if b is None else tr.mag(b), *args[3:], **rest)
    return _affine(tr, y, m, tr.terms(x) + fan_in + 1)


def _matmul(tr, func, args, kwargs):
    a, b = args[0], args[1]
    y = func(*args, **kwargs)
    k = a.shape[-1]
    with torch.no_grad():
        m = func(tr.mag(a), tr.mag(b))
    if tr.data(a) and tr.data(b):  # two data operands (attention): a product, no chain to fold into
        return tr.inject(y, _sum(k, m), m, k)
    return _affine(tr, y, m, max(tr.terms(a), tr.terms(b)) + k)


def _addmm(tr, func, args, kwargs):
    c, a, b = args[0], args[1], args[2]
    y = func(*args, **kwargs)
    with torch.no_grad():
        m = tr.mag(c) + (torch.bmm if a.dim() == 3 else torch.mm)(tr.mag(a), tr.mag(b))
    return _affine(tr, y, m, max(tr.terms(a), tr.terms(b), tr.terms(c)) + a.shape[-1] + 1)


def _add(tr, func, args, kwargs):
    a, b = args[0], args[1] if len(args) > 1 else kwargs["other"]
    alpha = abs(kwargs.get("alpha", 1))
    y = func(*args, **kwargs)
    n = max(tr.terms(a), tr.terms(b)) + 1
    with torch.no_grad():
        if tr.data(a) and tr.data(b):
            # A residual add: an engine may fuse it into the accumulation of the Gemm on either side, never into
            # what follows, so it ends both chains (each side's own terms, the other side's value).
            m = torch.maximum(tr.mag(a) + alpha * b.detach().abs(), a.detach().abs() + alpha * tr.mag(b))
            return tr.register(tr.inject(y, _sum(n, m), m, n) if not _inplace(func) else _inject_inplace(tr, y, _sum(n, m)),
                               y.detach().abs(), 0)
        m = tr.mag(a) + alpha * tr.mag(b)
    m = torch.broadcast_to(torch.as_tensor(m, dtype=y.dtype), y.shape)
    if _inplace(func):
        return tr.register(_inject_inplace(tr, y, _sum(n, m)), m, n)
    return _affine(tr, y, m, n)


def _inplace(func) -> bool:
    return _name(func).startswith("__i") or _name(func).endswith("_")


def _inject_inplace(tr, y, r):
    """`x += y` keeps its tensor: the term goes into it in place."""
    eps = torch.zeros_like(y, requires_grad=True)
    tr.sources.append(eps)
    return y.add_(eps * r.detach())


def _mul(tr, func, args, kwargs):
    a, b = args[0], args[1] if len(args) > 1 else kwargs["other"]
    y = func(*args, **kwargs)
    if tr.data(a) and tr.data(b):  # a product of data (a gate x·Φ(λx)): one rounding, no chain
        return tr.inject(y, U * y.detach().abs())
    with torch.no_grad():
        if func in DIV:
            m = tr.mag(a) / torch.as_tensor(b).abs() if tr.data(a) else None
        else:
            m = tr.mag(a) * tr.mag(b)
    if m is None:  # constant / data: a reciprocal of data, nonlinear
        return tr.inject(y, U * y.detach().abs())
    m = torch.broadcast_to(torch.as_tensor(m, dtype=y.dtype), y.shape)
    return _affine(tr, y, m, max(tr.terms(a), tr.terms(b)) + 1)


def _reduce(tr, func, args, kwargs):
    x = args[0]
    y = func(*args, **kwargs)
    with torch.no_grad():
        m = func(*_swap(tr, args), **kwargs)
    count = max(1, x.numel() // max(1, y.numel()))
    return _affine(tr, y, m, tr.terms(x) + count)


def _avg_pool(tr, func, args, kwargs):
    x = args[0]
    y = func(*args, **kwargs)
    with torch.no_grad():
        m = func(*_swap(tr, args), **kwargs)
    spatial = x.shape[-(y.dim() - 2):] if y.dim() > 2 else x.shape[-1:]
    window = math.prod(math.ceil(i / o) + 1 for i, o in zip(spatial, y.shape[-len(spatial):]))
    return _affine(tr, y, m, tr.terms(x) + window)


def _pointwise(scale: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    def rule(tr, func, args, kwargs):
        y = func(*args, **kwargs)
        if not _floating(y):
            return y
        return tr.inject(y, ULPS * U * scale(args[0].detach(), y.detach()))
    return rule


def _exact(tr, func, args, kwargs):
    out = func(*args, **kwargs)
    for o in (out if isinstance(out, (list, tuple)) else [out]):
        if _floating(o):
            tr.register(o, o.detach().abs(), 0)
    return out


def _softmax_parts(tr, x, dim):
    mx = torch.amax(x, dim=dim, keepdim=True)  # exact
    z = x - mx
    e = torch.exp(z)
    s = e.sum(dim=dim, keepdim=True)
    return z, e, s


def _softmax(tr, func, args, kwargs):
    x, dim = args[0], args[1] if len(args) > 1 else kwargs.get("dim", -1)
    if x.dtype != torch.float64:
        return func(*args, **kwargs)

    def parts():
        z, e, s = _softmax_parts(tr, x, dim)
        return e / s if func in SOFTMAX else z - torch.log(s)

    return tr.reenter(parts)


def _layer_norm(tr, func, args, kwargs):
    x, shape = args[0], args[1]
    w = args[2] if len(args) > 2 else kwargs.get("weight")
    b = args[3] if len(args) > 3 else kwargs.get("bias")
    eps = args[4] if len(args) > 4 else kwargs.get("eps", 1e-5)
    dims = tuple(range(-len(shape), 0))
    count = math.prod(shape)

    def parts():
        mu = x.mean(dim=dims, keepdim=True)
        d = x - mu
        var = (d * d).mean(dim=dims, keepdim=True)
        return d, var

    d, var = tr.reenter(parts)
    # onnxruntime's CPU LayerNormalization computes the variance in one pass, E[x²] − E[x]², in float32: its
    # rounding is relative to E[x²], which is far larger than the variance where the inputs sit far from 0
    with torch.no_grad():
        extra = gamma(count + 2) * (x.detach() ** 2).mean(dim=dims, keepdim=True)
    var = tr.inject(var, extra)

    def rest():
        y = d * torch.rsqrt(var + eps)
        if w is not None:
            y = y * w
        if b is not None:
            y = y + b
        return y

    return tr.reenter(rest)


def _batch_norm(tr, func, args, kwargs):
    x, rm, rv = args[0], args[1], args[2]
    w = args[3] if len(args) > 3 else kwargs.get("weight")
    b = args[4] if len(args) > 4 else kwargs.get("bias")
    training = args[5] if len(args) > 5 else kwargs.get("training", False)
    eps = args[7] if len(args) > 7 else kwargs.get("eps", 1e-5)
    y = func(*args, **kwargs)
    if training or rm is None:
        tr.unmodelled[f"{_name(func)} (training mode)"] += 1
        return tr.inject(y, ULPS * U * y.detach().abs())
    shape = [1, -1] + [1] * (x.dim() - 2)
    with torch.no_grad():  # eval: x·s + (β − μ·s) per channel, s = γ/√(σ² + eps); engines fold it into the Conv before
        s = torch.rsqrt(rv + eps) * (w if w is not None else 1.0)
        m = tr.mag(x) * s.abs().view(shape) + (rm * s).abs().view(shape) + (b.abs().view(shape) if b is not None else 0.0)
    return _affine(tr, y, m, tr.terms(x) + 2)


def _sdpa(tr, func, args, kwargs):
    q, k, v = args[:3]
    mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
    causal = args[5] if len(args) > 5 else kwargs.get("is_causal", False)
    scale = kwargs.get("scale") or 1.0 / math.sqrt(q.shape[-1])

    def parts():
        s = (q @ k.transpose(-2, -1)) * scale
        if causal:
            keep = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool, device=s.device).tril()
            s = s.masked_fill(~keep, float("-inf"))
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
        return torch.softmax(s, dim=-1) @ v

    return tr.reenter(parts)


_RULES: list[tuple[frozenset, Callable]] = [
    (LINEAR, _linear), (CONV | CONV_T, _conv), (MATMUL, _matmul), (ADDMM, _addmm), (ADD | SUB, _add),
    (MUL | DIV, _mul), (REDUCE, _reduce), (AVG_POOL, _avg_pool),
    (BOUNDED, _pointwise(lambda x, y: y.abs() + 1)), (RELATIVE, _pointwise(lambda x, y: y.abs())),
    (SCALED, _pointwise(lambda x, y: y.abs() + x.abs())), (EXACT, _exact), (MOVE, _move),
    (SOFTMAX | LOG_SOFTMAX, _softmax), (LAYER_NORM, _layer_norm), (BATCH_NORM, _batch_norm), (SDPA, _sdpa),
]


# ---------------------------------------------------------------------------------------------
# Pointwise activation modules: injected as a whole, however they compute (fused kernel, erfc, erf)


def _is_pointwise_activation(m: nn.Module) -> bool:
    from pipeline.activations import gate_of

    return gate_of(m) is not None


def _hooks(net: nn.Module, tr: _Trace) -> list[Any]:
    def pre(mod, inputs):
        tr.opaque += 1

    def post(mod, inputs, out):
        tr.opaque -= 1
        if tr.opaque or not tr.data(inputs[0]):
            return out
        x = inputs[0].detach()
        return tr.inject(out, ULPS * U * (out.detach().abs() + x.abs()))

    handles = []
    for m in net.modules():
        if _is_pointwise_activation(m):
            handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    return handles


# ---------------------------------------------------------------------------------------------
# The bound


def _chunk_size(net: nn.Module, x: torch.Tensor) -> int:
    """Samples per traced pass: about CHUNK_ELEMENTS float64 elements of activations in all."""
    tr = _Trace()
    with torch.no_grad(), tr:
        _forward(net, _register_input(tr, x[:1]), tr)
    per_sample = max(1, sum(s.numel() for s in tr.sources))
    return max(1, min(len(x), CHUNK_ELEMENTS // per_sample))


def _forward(net: nn.Module, x: torch.Tensor, tr: _Trace) -> torch.Tensor:
    handles = _hooks(net, tr)
    try:
        return net(x)
    finally:
        for h in handles:
            h.remove()


def _input(x: torch.Tensor) -> torch.Tensor:
    return x.double() if x.is_floating_point() else x


def _register_input(tr: _Trace, x: torch.Tensor) -> torch.Tensor:
    """The input is data (token ids too: what an embedding looks up from them is)."""
    x = x.clone()
    return tr.register(x, x.abs().double(), 0)


def forward_bound(model: nn.Module, x: torch.Tensor, max_outputs: int = MAX_OUTPUTS) -> Bound:
    """The float64 outputs of `model` on `x` and, per sample and output coordinate, the first-order bound on
    how far a float32 evaluation of the same ops may be from them (see the module docstring)."""

    net = copy.deepcopy(model).cpu().double().eval().requires_grad_(False)  # gradients go to the ε only
    x = _input(x.detach().cpu())
    refs, bounds, unmodelled = [], [], Counter()
    index, layouts = None, {}  # (chunk size, source shapes) -> which sources have the sample as dim 0
    with mha_fastpath(False):  # the fused attention op has no rule; its unfused path is what exports
        chunk = _chunk_size(net, x)
        for i in range(0, len(x), chunk):
            xc = x[i:i + chunk]
            tr = _Trace()
            with torch.enable_grad():  # also where the caller is under no_grad: the bound is made of gradients
                with tr:
                    y = _forward(net, _register_input(tr, xc), tr)
                unmodelled.update(tr.unmodelled)
                flat = y.reshape(len(xc), -1)
                if index is None:
                    p = flat.shape[1]
                    index = np.arange(p) if p <= max_outputs else np.unique(np.linspace(0, p - 1, max_outputs).round().astype(int))
                refs.append(y.detach().numpy())
                bounds.append(_bound(flat, tr.sources, index, layouts))
    return Bound(np.concatenate(refs), np.concatenate(bounds), index, dict(unmodelled))


def _bound(flat: torch.Tensor, sources: list[torch.Tensor], index: np.ndarray, layouts: dict[tuple, list[bool]]) -> np.ndarray:
    """Σ_sources Σ_elements |∂y_ik/∂ε| per sample i and output k in `index`. The samples of a chunk are
    independent, so one backward pass of Σ_i y_ik serves all of them where a source's dim 0 is the sample
    (checked); a source laid out otherwise adds its whole sum to every sample (sound, looser)."""
    n = flat.shape[0]
    used = [s for s in sources if s.requires_grad]
    key = (n, tuple(s.shape for s in used))
    if key not in layouts:
        layouts[key] = _batch_first(flat, used)
    per_sample = layouts[key]
    out = np.zeros((n, len(index)))
    for j, k in enumerate(index):
        grads = torch.autograd.grad(flat[:, int(k)].sum(), used, retain_graph=True, allow_unused=True)
        total = torch.zeros(n, dtype=torch.float64)
        for g, rows in zip(grads, per_sample):
            if g is None:
                continue
            total += g.abs().reshape(n, -1).sum(1) if rows else g.abs().sum()
        out[:, j] = total.numpy()
    return out


def _batch_first(flat: torch.Tensor, sources: list[torch.Tensor]) -> list[bool]:
    """Per source: is its dim 0 the sample, i.e. do the first and last samples' outputs reach only their own row?"""
    n = flat.shape[0]
    ok = [s.dim() > 0 and s.shape[0] == n for s in sources]
    if n == 1:
        return ok
    for i in (0, n - 1):
        grads = torch.autograd.grad(flat[i].sum(), sources, retain_graph=True, allow_unused=True)
        for j, g in enumerate(grads):
            if ok[j] and g is not None:
                others = torch.cat([g[:i], g[i + 1:]])
                ok[j] = bool((others == 0).all())
    return ok
