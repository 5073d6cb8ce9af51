"""The int8 graph's float32 values as the reader follows them (`quantized`'s module docstring, second part): between a
DequantizeLinear and the next QuantizeLinear onnxruntime computes in float32 (a residual Add, a BatchNorm, a ReLU, an
average, a Softmax, a LayerNorm, a product of two dequantized tensors); per unit the reader knows a bound on
|runtime − exact| and the exact value's range over every input (`Float`), carried through each op (`follow`, and the
ops that are not one graph op: `batchnorm_float`, `matmul_float`, `softmax_float`, `layer_norm_float`). A
QuantizeLinear of such a value is then a rounding of it (`quantized.float_error`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.numerics import SAFETY, U, gamma

from .ops.affine import Conv, Linear, Scale, Sum, TokenLinear
from .ops.base import Activation
from .ops.norm import LayerNormRounding
from .ops.pooling import Pool
from .ops.relu import ReLU
from .ops.shape import Concat, Select
from .quantized import SOFTMAX_K, affine_error


@dataclass
class Float:
    """What an int8 graph's reader knows of a float32 value onnxruntime computes between a DequantizeLinear and the next
    QuantizeLinear: |runtime − node value| ≤ err per unit, the node's value in [lo, hi] per unit for every input (±inf:
    unknown, a value of the raw input), and for a value of the raw input through elementwise constant ops only, that
    map (`chain` = (a, b, ops): the exact a·x + b, computed by `ops` float32 operations)."""

    err: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    chain: tuple[np.ndarray, np.ndarray, int] | None = None

    @property
    def mag(self) -> np.ndarray:
        return np.maximum(np.abs(self.lo), np.abs(self.hi))

def _t(a: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a, dtype=np.float64))[None]


def _ranges(op, fls) -> tuple[np.ndarray, np.ndarray]:
    """The op's output range from its inputs' (interval arithmetic; NaN from ∞·0 is unknown: ±∞)."""
    with torch.no_grad():
        if isinstance(op, Activation):
            lo, hi = op.interval(_t(fls[0].lo)[0], _t(fls[0].hi)[0])
            lo, hi = lo[None], hi[None]
        else:
            lo, hi = op.ibp(*((_t(f.lo), _t(f.hi)) for f in fls))
    lo, hi = lo[0].numpy(), hi[0].numpy()
    return np.where(np.isnan(lo), -np.inf, lo), np.where(np.isnan(hi), np.inf, hi)


def follow(op, fls, flops: int | None, info: dict | None):
    """The `Float` of `op`'s output from its inputs' (None: not followed, e.g. exp or a product, whose handler
    gives its own or leaves the value unbounded). `flops`: float32 operations per unit of an elementwise op; `info`: an
    affine node's weight scales and bias (`readers.affine.record_affine`)."""
    if not isinstance(op, (Concat, Conv, Linear, Pool, ReLU, Scale, Select, Sum, TokenLinear)):
        return None
    if isinstance(op, ReLU):
        return Float(fls[0].err.copy(), np.maximum(fls[0].lo, 0), np.maximum(fls[0].hi, 0))
    lo, hi = _ranges(op, fls)
    with torch.no_grad():
        moved = op.abs_forward(*(_t(f.err) for f in fls))[0].numpy()  # the inputs' errors carried through |M|
        if isinstance(op, (Concat, Select)):  # data movement (Permute is a Select): exact
            return Float(moved, lo, hi)
        mags = [_t(np.maximum(np.abs(f.lo), np.abs(f.hi)) + f.err) for f in fls]
        if isinstance(op, Scale):
            k = 1 if flops is None else flops
            own = SAFETY * gamma(k) * (op.abs_forward(mags[0])[0].numpy() + np.abs(op.shift.numpy())) if k else 0.0
            chain = fls[0].chain
            if chain is not None:
                a, b, ops = chain
                chain = (a * op.scale.numpy(), b * op.scale.numpy() + op.shift.numpy(), ops + k)
            return Float(moved + own, lo, hi, chain)
        if isinstance(op, Sum):
            own = SAFETY * gamma(op.arity - 1) * op.abs_forward(*mags)[0].numpy() if flops is None or flops else 0.0
            return Float(moved + own, lo, hi)
        # a dot product (Linear, Conv, TokenLinear, Pool): dequantized weights with the fused kernels' bound, else γ_{n+2}
        if info is not None:
            in_range = (torch.as_tensor(fls[0].lo - fls[0].err), torch.as_tensor(fls[0].hi + fls[0].err))
            own = affine_error(op, in_range, info["terms"], info.get("bias_step"))
        else:
            terms = flops if flops is not None else _terms(op)
            c = np.abs(op.forward(torch.zeros(1, op.in_sizes()[0], dtype=torch.float64))[0].numpy())
            own = gamma(terms + 2) * (op.abs_forward(mags[0])[0].numpy() + c)
        return Float(moved + own, lo, hi)


def _terms(op) -> int:
    if isinstance(op, (Linear, TokenLinear)):
        return int(op.W.shape[1])
    if isinstance(op, Conv):
        return int(np.prod(op.weight.shape[1:]))
    if isinstance(op, Pool):
        return int(torch.bincount(op.group).max())
    return 1


def batchnorm_float(fl, a: np.ndarray, mean: np.ndarray, bias: np.ndarray):
    """A BatchNormalization y = a·(x − μ) + β in float32, however the kernel groups it (module docstring)."""
    if fl is None:
        return None
    m = fl.mag + fl.err
    lo = np.where(a >= 0, a * (fl.lo - mean) + bias, a * (fl.hi - mean) + bias)
    hi = np.where(a >= 0, a * (fl.hi - mean) + bias, a * (fl.lo - mean) + bias)
    err = np.abs(a) * fl.err + gamma(8) * (np.abs(a) * (m + np.abs(mean)) + np.abs(bias))
    return Float(err, np.where(np.isnan(lo), -np.inf, lo), np.where(np.isnan(hi), np.inf, hi))


def matmul_float(fa, fb, nb: int, m: int, k: int, n: int):
    """A @ B of two float32 values (a QLinearMatMul on int8 operands or a float32 MatMul on dequantized ones)."""
    A = lambda v: torch.as_tensor(v).reshape(nb, m, k)  # noqa: E731
    B = lambda v: torch.as_tensor(v).reshape(nb, k, n)  # noqa: E731
    ma, mb = A(fa.mag), B(fb.mag)
    ea, eb = A(fa.err), B(fb.err)
    err = ma @ eb + ea @ mb + ea @ eb + gamma(k + 8) * ((ma + ea) @ (mb + eb))
    tot = (ma @ mb).reshape(-1).numpy()
    return Float(err.reshape(-1).numpy(), -tot, tot)


def softmax_float(fl, rows: int, T: int, last: bool):
    """A Softmax over T values per row (module docstring): outputs in [0, 1], err ½·max err_in + SOFTMAX_K·u·(T + W + 4)."""
    if fl is None or not last or not (np.all(np.isfinite(fl.lo)) and np.all(np.isfinite(fl.hi))):
        return None
    e = fl.err.reshape(rows, T)
    W = (fl.hi.reshape(rows, T) + e).max(1) - (fl.lo.reshape(rows, T) - e).min(1)
    err = 0.5 * e.max(1) + SOFTMAX_K * U * (T + W + 4)
    n = rows * T
    return Float(np.repeat(err, T), np.zeros(n), np.ones(n))


def layer_norm_float(r, x, var, out, gamma_: np.ndarray, beta: np.ndarray, N: int, rows: int, eps: float):
    """The Value of a LayerNormalization in an int8 graph: its exact output `out` with onnxruntime's float32 error as a
    `LayerNormRounding` node (refused where the input's float32 value is not followed)."""
    if x.fl is None or not (np.all(np.isfinite(x.fl.err)) and np.all(np.isfinite(x.fl.mag))):
        out.fl = None
        return out
    n = rows * N
    cat = r.add(Concat(((n,), (n,), (rows,)), 0), [type(x)(out.node, (n,)), type(x)(x.node, (n,)), var], (2 * n + rows,))
    e_row = x.fl.err.reshape(rows, N).max(1)
    op = LayerNormRounding(rows, N, eps, e_row, gamma_, beta, source=r.node.name)
    node = r.add(op, [cat], out.shape)
    bound = np.tile(np.abs(gamma_) * math.sqrt(N) + np.abs(beta), rows) + np.tile(op.cap().numpy(), rows)
    node.fl = Float(np.zeros(n), -bound, bound)
    return node
