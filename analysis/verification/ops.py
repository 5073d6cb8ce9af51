"""The operations of a verification graph (`graph.Graph`), each on flat float64 vectors.

Every tensor is the C-order flattening of one example's tensor (batch axis dropped), which is also how
VNN-LIB numbers the inputs X_i; a value is [B, size]. Reshape and Flatten only change how a later op reads
that vector, so they are no ops.

Affine ops (`Affine`): `forward(*h)`, interval arithmetic `ibp(*(lo, hi))`, and back-substitution
`back(A) -> ([A_i per input], A·bias)`: the coefficients on each input of a linear function of the output.
- `Linear(W, b)`: y = W x + b (Gemm; MatMul + Add);
- `Conv`: a 2-d convolution on (C, H, W), kept as a convolution (back-substitution is `conv_transpose2d` of the
  coefficient rows, so a bound pass never builds a (C·H·W)² matrix: 12544 × 6272 float64 = 630 MB for the
  default CNN's second conv); average pooling is a grouped `Conv` with constant weights;
- `Scale(scale, shift)`: y = x·scale + shift elementwise (normalization, BatchNorm in eval, Mul/Add/Sub/Div by
  constants, Neg);
- `Sum(signs)`: y = Σ_i signs_i·x_i over inputs of one size (residual Add, Sub of two tensors);
- `Concat(shapes, axis, consts)` (constant inputs such as a class token in its constant term), `Permute(index)`
  (Transpose) and `Select(index)` (Gather, Slice, Split, Expand, a broadcast): rearrangements of their inputs' units;
- `Pool(group, weight, size, index)`: sparse sums with fixed entries (ReduceMean/ReduceSum; a max's tree of
  differences and running maxima, `readers._max_tree`), back-substituted as a gather and a scatter-add;
- `PairMax`: a Pool that is one level of a max's tree, a + ReLU(b − a) = max(a, b), whose interval and swap-gap rule
  are the max's;
- `TokenLinear(W, b, rows)`: W x + b on each row of [rows, in] (a MatMul by a constant on tokens).

Activations (`Activation`, one input): `ReLU`, and `Gate(kind, lam)`: y = x·g(λx) with g a
family of `pipeline.gates.GATES` ("phi": λ-GELU and GELU at λ = 1, "sigmoid": λ-Swish and SiLU, "serf":
SERF), λ per unit (a per-layer λ repeated, a per-channel λ broadcast over its channel's positions); the int8 graph's
`Rounding` and `QuantizedInput`; a transformer's ops in `nonlinear` (elementwise curves, and ops that are not
elementwise, `elementwise = False`, which back-substitute themselves: products of two variables, a LayerNorm's
variance, the int8 LayerNorm's float32 error).

Everything is float64. A graph read from a float32 model computes with its float32 weights exactly (each
converts to float64 without rounding); float32 inference rounding is not modelled here.

Devices: an op's tensors live on one device (`Op.to`; readers build on the CPU, `graph.Graph.to` moves a whole graph),
and every op computes on the device of its tensors. What an op makes itself (`back`'s constant term, masks) is made
with `new_zeros`/`*_like` or `device=` from its inputs, never on a default device; only `sparse` (the MILP's
matrices) reads values on the host, from a graph the MILP has moved to the CPU (`milp.on_cpu`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.numerics import U

DTYPE = torch.float64
# float64 back-substitution of a Conv on the CPU, where torch's transposed convolution has no fast kernel (it loops over
# the rows): on a map of at most DENSE_MAX_PIXELS output pixels a matrix product with the convolution's matrix (at most
# DENSE_MAX_ENTRIES entries: 8 MB), else Wᵀ per pixel and col2im (measured on 128 rows of preact_resnet [16,32]'s
# convolutions: 1.7x and 1.4x faster than conv_transpose2d)
DENSE_MAX_PIXELS = 16
DENSE_MAX_ENTRIES = 2 ** 20


class UnsupportedModel(NotImplementedError):
    """The model holds something no tool here reads; the message is one line that names it and where it is.

    Structured for callers that report it (the verify stage's `not_verified`): `node` (the ONNX node's name, or a module
    path), `op` (its op type), `what` (the form met, in the node's own terms) and `fix` (what would make it readable,
    or None); each may be None where the message is about the model as a whole."""

    def __init__(self, message: str = "", *, node: str | None = None, op: str | None = None, what: str | None = None,
                 fix: str | None = None):
        super().__init__(message)
        self.node, self.op, self.what, self.fix = node, op, what, fix


def as_tensor(a: Any, device: torch.device | str | None = None) -> torch.Tensor:
    """A float64 tensor on `device`; None: a tensor's own device, the CPU for anything else (a numpy array is copied:
    broadcast views are read-only)."""
    if isinstance(a, torch.Tensor):
        return a.detach().to(a.device if device is None else device, DTYPE)
    t = torch.from_numpy(np.array(a, dtype=np.float64))
    return t if device is None else t.to(device)


def numel(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64))


class Op:
    arity: ClassVar[int] = 1

    def cast(self, dtype: torch.dtype) -> "Op":
        """A shallow copy whose floating-point tensors are in `dtype` (branch and bound searches in float32)."""
        return self._mapped(lambda t: t.to(dtype) if t.is_floating_point() else t)

    def to(self, device: torch.device | str) -> "Op":
        """A shallow copy whose tensors live on `device` (itself when they already do)."""
        device = torch.device(device)
        if all(t.device == device for t in self.tensors()):
            return self
        return self._mapped(lambda t: t.to(device))

    def tensors(self) -> list[torch.Tensor]:
        return [v for v in vars(self).values() if isinstance(v, torch.Tensor)]

    def _mapped(self, fn) -> "Op":
        new = copy.copy(self)
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor):
                setattr(new, name, fn(value))
        return new

    def in_sizes(self) -> tuple[int, ...]:
        raise NotImplementedError

    @property
    def out_size(self) -> int:
        raise NotImplementedError


class Affine(Op):
    """y = Σ_i M_i x_i + c."""

    def forward(self, *h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def back(self, A: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        raise NotImplementedError

    def ibp(self, *bounds: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def abs_forward(self, *d: torch.Tensor) -> torch.Tensor:
        """Σ_i |M_i| d_i: how far the output can move when each input moves by at most d_i (elementwise)."""
        raise NotImplementedError

    def sparse(self) -> tuple[list[Any], np.ndarray]:
        """([scipy CSR M_i per input], c): the same map as matrices, for the MILP."""
        raise NotImplementedError


class Activation(Op):
    """One input, elementwise. ReLU and Gate are relaxed by `bounds.Bounder` itself (their slopes are optimized and
    ReLUs are split by branch and bound); any other activation gives its own fixed sound relaxation on an input
    interval [l, u]: `interval` (its range) and `lines` (al·x + bl ≤ op(x) ≤ au·x + bu)."""

    size: int
    # False: `lines` does not depend on the input interval, so tightening it by CROWN buys nothing (`Rounding` off a grid)
    needs_bounds: ClassVar[bool] = True
    # False: not elementwise (a product of two variables, `nonlinear`): `relax(l, u)` and `back(A, relax)` instead of lines
    elementwise: ClassVar[bool] = True

    def in_sizes(self) -> tuple[int, ...]:
        return (self.size,)

    @property
    def out_size(self) -> int:
        return self.size

    def interval(self, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError(f"{type(self).__name__} has no interval relaxation")

    def lines(self, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        raise NotImplementedError(f"{type(self).__name__} has no linear relaxation")


# ---------------------------------------------------------------------------------------------
# affine ops


@dataclass(eq=False)
class Linear(Affine):
    """y = W x + b; W (out, in), b (out,)."""

    W: torch.Tensor
    b: torch.Tensor

    def __post_init__(self) -> None:
        self.W, self.b = as_tensor(self.W), as_tensor(self.b).reshape(-1)
        if self.W.dim() != 2 or self.b.shape != (self.W.shape[0],):
            raise ValueError(f"Linear needs W (out, in) and b (out,), got {tuple(self.W.shape)} and {tuple(self.b.shape)}")

    def in_sizes(self) -> tuple[int, ...]:
        return (self.W.shape[1],)

    @property
    def out_size(self) -> int:
        return self.W.shape[0]

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # [B, in] -> [B, out]
        return h @ self.W.T + self.b

    def back(self, A: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        return [A @ self.W], A @ self.b

    def ibp(self, bounds: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        lo, hi = bounds
        # W⁺l + W⁻u, not centre/radius: equal to a per-neuron loop up to summation order
        Wp, Wn = self.W.clamp(min=0), self.W.clamp(max=0)
        return lo @ Wp.T + hi @ Wn.T + self.b, hi @ Wp.T + lo @ Wn.T + self.b

    def abs_forward(self, d: torch.Tensor) -> torch.Tensor:
        return d @ self.W.abs().T

    def sparse(self):
        from scipy import sparse

        return [sparse.csr_matrix(self.W.numpy())], self.b.numpy()


@dataclass(eq=False)
class Conv(Affine):
    """2-d convolution on a (C, H, W) tensor, flat in and out; zero padding, symmetric per axis."""

    weight: torch.Tensor  # (C_out, C_in / groups, kh, kw)
    bias: torch.Tensor  # (C_out,)
    in_shape: tuple[int, int, int]
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)  # top = bottom, left = right
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    out_shape: tuple[int, int, int] = field(init=False)

    def __post_init__(self) -> None:
        self.weight, self.bias = as_tensor(self.weight), as_tensor(self.bias).reshape(-1)
        self.in_shape = tuple(int(d) for d in self.in_shape)
        self.stride, self.padding, self.dilation = (tuple(int(v) for v in t) for t in (self.stride, self.padding, self.dilation))
        c, h, w = self.in_shape
        kh, kw = self.weight.shape[2:]
        ho = (h + 2 * self.padding[0] - self.dilation[0] * (kh - 1) - 1) // self.stride[0] + 1
        wo = (w + 2 * self.padding[1] - self.dilation[1] * (kw - 1) - 1) // self.stride[1] + 1
        if self.weight.shape[1] * self.groups != c or ho < 1 or wo < 1 or self.bias.numel() != self.weight.shape[0]:
            raise ValueError(f"Conv weight {tuple(self.weight.shape)} (groups {self.groups}) does not fit input {self.in_shape}")
        self.out_shape = (self.weight.shape[0], ho, wo)

    def in_sizes(self) -> tuple[int, ...]:
        return (numel(self.in_shape),)

    @property
    def out_size(self) -> int:
        return numel(self.out_shape)

    def _conv(self, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y = F.conv2d(h.reshape(-1, *self.in_shape), weight, bias, self.stride, self.padding, self.dilation, self.groups)
        return y.reshape(h.shape[0], -1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self._conv(h, self.weight, self.bias)

    def _output_padding(self) -> list[int]:
        """conv_transpose2d's output padding: it may come out short of the input size where the stride skipped the
        last rows."""
        _c, h, w = self.in_shape
        kh, kw = self.weight.shape[2:]
        _, ho, wo = self.out_shape
        return [h - ((ho - 1) * self.stride[0] - 2 * self.padding[0] + self.dilation[0] * (kh - 1) + 1),
                w - ((wo - 1) * self.stride[1] - 2 * self.padding[1] + self.dilation[1] * (kw - 1) + 1)]

    def back(self, A: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """A (rows, C_out·Ho·Wo) -> (A·Conv as a matrix, via conv_transpose2d, and A·bias)."""
        rows = A.shape[0]
        _c, h, w = self.in_shape
        _, ho, wo = self.out_shape
        kh, kw = self.weight.shape[2:]
        op = self._output_padding()
        Ai = A.reshape(rows, *self.out_shape)
        if (kh, kw) == (1, 1) and self.padding == (0, 0) and self.groups == 1:
            return [self._back_1x1(Ai)], Ai.sum(dim=(2, 3)) @ self.bias
        if max(op) >= max(self.stride[0], self.dilation[0], self.stride[1], self.dilation[1]):
            raise ValueError(f"Conv {self.in_shape} -> {self.out_shape}: cannot transpose (output padding {op})")
        if A.dtype == torch.float64 and A.device.type == "cpu" and not A.requires_grad:
            if ho * wo <= DENSE_MAX_PIXELS and self.out_size * self.in_sizes()[0] <= DENSE_MAX_ENTRIES:
                return [A @ self._dense()], Ai.sum(dim=(2, 3)) @ self.bias
            if self.groups == 1:  # Wᵀ per output pixel, then the overlapping patches summed (col2im)
                cols = torch.matmul(self.weight.reshape(self.weight.shape[0], -1).T, Ai.reshape(rows, self.weight.shape[0], -1))
                back = F.fold(cols, (h, w), (kh, kw), self.dilation, self.padding, self.stride)
                return [back.reshape(rows, -1)], Ai.sum(dim=(2, 3)) @ self.bias
        back = F.conv_transpose2d(Ai, self.weight, None, self.stride, self.padding, tuple(op), self.groups, self.dilation)
        return [back.reshape(rows, -1)], Ai.sum(dim=(2, 3)) @ self.bias

    def _dense(self) -> torch.Tensor:
        """The convolution as a matrix, (out, in), made once: `back` on small feature maps is one matrix product."""
        M = self.__dict__.get("_matrix")
        if M is None or M.dtype != self.weight.dtype or M.device != self.weight.device:
            n = self.in_sizes()[0]
            eye = torch.eye(n, dtype=self.weight.dtype, device=self.weight.device)
            M = self.__dict__["_matrix"] = self._conv(eye, self.weight, None).T.contiguous()
        return M

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_matrix"}  # a cache: not sent to worker processes

    def _back_1x1(self, Ai: torch.Tensor) -> torch.Tensor:
        """`back` of an unpadded 1×1 convolution (a normalization, a strided shortcut) as one batched matrix product
        per pixel, Wᵀ·A, placed on the pixels the stride reads: torch's float64 transposed convolution loops over the
        rows (10-20x slower here)."""
        rows, co, ho, wo = Ai.shape
        ci, h, w = self.in_shape
        B = torch.matmul(self.weight.reshape(co, ci).T, Ai.reshape(rows, co, ho * wo)).reshape(rows, ci, ho, wo)
        if self.stride == (1, 1):
            return B.reshape(rows, -1)
        out = B.new_zeros(rows, ci, h, w)
        out[:, :, :(ho - 1) * self.stride[0] + 1:self.stride[0], :(wo - 1) * self.stride[1] + 1:self.stride[1]] = B
        return out.reshape(rows, -1)

    @property
    def back_terms(self) -> int:
        """How many products each coefficient of `back` sums (at most): output channels per group × kernel."""
        kh, kw = self.weight.shape[2:]
        return (self.weight.shape[0] // self.groups) * kh * kw

    def back32(self, A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`back`'s coefficients on the input computed in float32 (A and the weight rounded to float32, the
        transposed convolution in float32: on the CPU a oneDNN kernel about 10x faster than float64's), returned in
        float64, with A in float32; None where the shapes need what `back` refuses. Each coefficient is a float32 dot
        product of `back_terms` products of rounded factors: its error is what `bounds.Bounder` adds to the bound
        (`pipeline.numerics`' dot-product bound with two more roundings); an overflow is an inf there."""
        rows = A.shape[0]
        op = self._output_padding()
        if max(op) >= max(self.stride[0], self.dilation[0], self.stride[1], self.dilation[1]):
            return None
        A32 = A.float()
        back = F.conv_transpose2d(A32.reshape(rows, *self.out_shape), self.weight.float(), None, self.stride,
                                  self.padding, tuple(op), self.groups, self.dilation)
        return back.reshape(rows, -1).to(A.dtype), A32

    def ibp(self, bounds: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        lo, hi = bounds
        mid, rad = (hi + lo) / 2, (hi - lo) / 2
        c = self._conv(mid, self.weight, self.bias)
        r = self._conv(rad, self.weight.abs(), None)
        return c - r, c + r

    def abs_forward(self, d: torch.Tensor) -> torch.Tensor:
        return self._conv(d, self.weight.abs(), None)

    def sparse(self):
        """The same map as a scipy CSR matrix (out, in), from index arithmetic."""
        from scipy import sparse

        co, ci_g, kh, kw = self.weight.shape
        _c, h, w = self.in_shape
        _, ho, wo = self.out_shape
        g_out = co // self.groups
        o, i, a, b, y, x = np.meshgrid(np.arange(co), np.arange(ci_g), np.arange(kh), np.arange(kw),
                                       np.arange(ho), np.arange(wo), indexing="ij")
        cin = (o // g_out) * ci_g + i
        hy = y * self.stride[0] - self.padding[0] + a * self.dilation[0]
        wx = x * self.stride[1] - self.padding[1] + b * self.dilation[1]
        ok = (hy >= 0) & (hy < h) & (wx >= 0) & (wx < w)
        rows = ((o * ho + y) * wo + x)[ok]
        cols = ((cin * h + hy) * w + wx)[ok]
        vals = self.weight.numpy()[o[ok], i[ok], a[ok], b[ok]]
        m = sparse.csr_matrix((vals, (rows, cols)), shape=(self.out_size, self.in_sizes()[0]))
        m.sum_duplicates()
        return [m], np.repeat(self.bias.numpy(), ho * wo)


def average_pool(in_shape: tuple[int, int, int], kernel: tuple[int, int], stride: tuple[int, int],
                 padding: tuple[int, int] = (0, 0)) -> Conv:
    """Average pooling (padding counted in the divisor) as a grouped convolution with weights 1/(kh·kw)."""
    c = in_shape[0]
    w = torch.full((c, 1, *kernel), 1.0 / (kernel[0] * kernel[1]), dtype=DTYPE)
    return Conv(w, torch.zeros(c, dtype=DTYPE), in_shape, stride, padding, (1, 1), c)


@dataclass(eq=False)
class Scale(Affine):
    """y = x·scale + shift elementwise; both flat, one value per unit."""

    scale: torch.Tensor
    shift: torch.Tensor

    def __post_init__(self) -> None:
        self.scale, self.shift = as_tensor(self.scale).reshape(-1), as_tensor(self.shift).reshape(-1)
        if self.scale.shape != self.shift.shape:
            raise ValueError(f"Scale needs scale and shift of one size, got {tuple(self.scale.shape)}, {tuple(self.shift.shape)}")

    def in_sizes(self) -> tuple[int, ...]:
        return (self.scale.numel(),)

    @property
    def out_size(self) -> int:
        return self.scale.numel()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h * self.scale + self.shift

    def back(self, A: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        return [A * self.scale], A @ self.shift

    def ibp(self, bounds: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = self.forward(bounds[0]), self.forward(bounds[1])
        return torch.minimum(a, b), torch.maximum(a, b)

    def abs_forward(self, d: torch.Tensor) -> torch.Tensor:
        return d * self.scale.abs()

    def sparse(self):
        from scipy import sparse

        return [sparse.diags(self.scale.numpy()).tocsr()], self.shift.numpy()


@dataclass(eq=False)
class Sum(Affine):
    """y = Σ_i signs_i·x_i: a residual Add (signs 1, 1) or a Sub of two tensors (1, −1)."""

    size: int
    signs: tuple[float, ...] = (1.0, 1.0)

    def __post_init__(self) -> None:
        self.signs = tuple(float(s) for s in self.signs)

    @property
    def arity(self) -> int:  # type: ignore[override]
        return len(self.signs)

    def in_sizes(self) -> tuple[int, ...]:
        return (self.size,) * len(self.signs)

    @property
    def out_size(self) -> int:
        return self.size

    def forward(self, *h: torch.Tensor) -> torch.Tensor:
        return sum(s * x for s, x in zip(self.signs, h))

    def back(self, A: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        return [A if s == 1.0 else s * A for s in self.signs], A.new_zeros(A.shape[0])

    def ibp(self, *bounds: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        lo = sum(s * (l if s > 0 else u) for s, (l, u) in zip(self.signs, bounds))
        hi = sum(s * (u if s > 0 else l) for s, (l, u) in zip(self.signs, bounds))
        return lo, hi

    def abs_forward(self, *d: torch.Tensor) -> torch.Tensor:
        return sum(abs(s) * x for s, x in zip(self.signs, d))

    def sparse(self):
        from scipy import sparse

        return [sparse.identity(self.size, format="csr") * s for s in self.signs], np.zeros(self.size)


@dataclass(eq=False)
class Concat(Affine):
    """Inputs of the given shapes (no batch axis) concatenated along `axis` (of those shapes). `consts`: per input, a
    constant tensor of that shape (a class token, a constant pad) or None for a variable; the op reads the variables
    only (its arity) and adds the constants' place in the output as its constant term."""

    shapes: tuple[tuple[int, ...], ...]
    axis: int
    consts: tuple[torch.Tensor | None, ...] | None = None
    out_shape: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.shapes = tuple(tuple(int(d) for d in s) for s in self.shapes)
        first = self.shapes[0]
        ax = self.axis
        if not 0 <= ax < len(first) or any(len(s) != len(first) or s[:ax] + s[ax + 1:] != first[:ax] + first[ax + 1:]
                                           for s in self.shapes):
            raise ValueError(f"cannot concatenate shapes {self.shapes} along axis {ax}")
        self.out_shape = first[:ax] + (sum(s[ax] for s in self.shapes),) + first[ax + 1:]
        consts = self.consts or (None,) * len(self.shapes)
        if len(consts) != len(self.shapes) or all(c is not None for c in consts):
            raise ValueError("Concat needs one entry per input in consts and at least one variable input")
        self.consts = None
        # the constant term: the constants in their places, zeros where a variable goes (one flat tensor, so that
        # `Op.to`/`cast` move it like any other)
        parts = [as_tensor(c).reshape(s) if c is not None else torch.zeros(s, dtype=DTYPE) for c, s in zip(consts, self.shapes)]
        self.const = torch.cat(parts, dim=ax).reshape(-1) if any(c is not None for c in consts) else None
        self.variable = tuple(c is None for c in consts)

    @property
    def arity(self) -> int:  # type: ignore[override]
        return sum(self.variable)

    def in_sizes(self) -> tuple[int, ...]:
        return tuple(numel(s) for s, v in zip(self.shapes, self.variable) if v)

    @property
    def out_size(self) -> int:
        return numel(self.out_shape)

    def _join(self, h: tuple[torch.Tensor, ...], fill: float | None = 0.0) -> torch.Tensor:
        """The variables in their places; the constants' places 0 (`fill` 0) — `forward` adds `const`."""
        B = h[0].shape[0]
        it = iter(h)
        parts = [next(it).reshape(B, *s) if v else h[0].new_zeros(B, *s) for s, v in zip(self.shapes, self.variable)]
        return torch.cat(parts, dim=self.axis + 1).reshape(B, -1)

    def forward(self, *h: torch.Tensor) -> torch.Tensor:
        y = self._join(h)
        return y if self.const is None else y + self.const.to(y.dtype)

    def back(self, A: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        rows = A.shape[0]
        parts = torch.split(A.reshape(rows, *self.out_shape), [s[self.axis] for s in self.shapes], dim=self.axis + 1)
        c = A.new_zeros(rows) if self.const is None else A @ self.const.to(A.dtype)
        return [p.reshape(rows, -1) for p, v in zip(parts, self.variable) if v], c

    def ibp(self, *bounds: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.forward(*(b[0] for b in bounds)), self.forward(*(b[1] for b in bounds))

    def abs_forward(self, *d: torch.Tensor) -> torch.Tensor:
        return self._join(d)

    def sparse(self):
        from scipy import sparse

        src = torch.cat([torch.full(s, i, dtype=torch.long) for i, s in enumerate(self.shapes)], dim=self.axis).reshape(-1).numpy()
        pos = torch.cat([torch.arange(numel(s)).reshape(s) for s in self.shapes], dim=self.axis).reshape(-1).numpy()
        mats = []
        for i, s in enumerate(self.shapes):
            if not self.variable[i]:
                continue
            rows = np.flatnonzero(src == i)
            mats.append(sparse.csr_matrix((np.ones(rows.size), (rows, pos[rows])), shape=(self.out_size, numel(s))))
        return mats, (np.zeros(self.out_size) if self.const is None else self.const.numpy().copy())


@dataclass(eq=False)
class Select(Affine):
    """y[j] = x[index[j]] for any index into the input (repeats allowed): a Gather, Slice, Split, Expand or Tile on a
    variable, a broadcast of one operand of a two-variable op to the other's shape."""

    index: torch.Tensor
    in_size: int

    def __post_init__(self) -> None:
        self.index = torch.as_tensor(self.index, dtype=torch.long).reshape(-1)
        self.in_size = int(self.in_size)
        if self.index.numel() and not (0 <= int(self.index.min()) and int(self.index.max()) < self.in_size):
            raise ValueError(f"Select indices must lie in 0..{self.in_size - 1}")

    def in_sizes(self) -> tuple[int, ...]:
        return (self.in_size,)

    @property
    def out_size(self) -> int:
        return self.index.numel()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h[:, self.index]

    def back(self, A: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        return [A.new_zeros(A.shape[0], self.in_size).index_add_(1, self.index, A)], A.new_zeros(A.shape[0])

    def ibp(self, bounds: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.forward(bounds[0]), self.forward(bounds[1])

    def abs_forward(self, d: torch.Tensor) -> torch.Tensor:
        return self.forward(d)

    def sparse(self):
        from scipy import sparse

        n = self.index.numel()
        return [sparse.csr_matrix((np.ones(n), (np.arange(n), self.index.cpu().numpy())), shape=(n, self.in_size))], np.zeros(n)


@dataclass(eq=False)
class Permute(Select):
    """y[j] = x[index[j]] for a permutation `index` (a Transpose): a Select whose back is a scatter, not a sum."""

    in_size: int = -1  # the index's length

    def __post_init__(self) -> None:
        self.index = torch.as_tensor(self.index, dtype=torch.long).reshape(-1)
        if not torch.equal(torch.sort(self.index).values, torch.arange(self.index.numel(), device=self.index.device)):
            raise ValueError("Permute needs a permutation of 0..n-1")
        self.in_size = self.index.numel()

    def back(self, A: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        out = torch.empty_like(A)
        out[:, self.index] = A
        return [out], A.new_zeros(A.shape[0])


@dataclass(eq=False)
class Pool(Affine):
    """y[group[k]] += weight[k]·x[index[k]] for every entry k: a sparse matrix kept as its entries (row, column, value).
    Without `index` each input unit is one entry (index k = unit k): a ReduceSum or ReduceMean over any axes (weight 1/n),
    a sum of grouped units. With it, any fixed fan-in: a max's tree (`readers._max_tree`) gathers the differences of a
    window's elements and its running maxima. Back-substitution is a gather and a scatter-add, never a dense (out, in)
    matrix."""

    group: torch.Tensor
    weight: torch.Tensor
    size: int  # outputs
    index: torch.Tensor | None = None  # the input unit of each entry (None: entry k reads unit k)
    in_size: int = -1  # inputs (given with `index`; else the entries' count)

    def __post_init__(self) -> None:
        self.group = torch.as_tensor(self.group, dtype=torch.long).reshape(-1)
        self.weight = as_tensor(self.weight).reshape(-1).expand(self.group.numel()).clone()
        self.size = int(self.size)
        if self.index is None:
            self.in_size = self.group.numel()
        else:
            self.index = torch.as_tensor(self.index, dtype=torch.long).reshape(-1)
            self.in_size = int(self.in_size)
            if self.index.shape != self.group.shape or (self.index.numel() and not (
                    0 <= int(self.index.min()) and int(self.index.max()) < self.in_size)):
                raise ValueError(f"Pool needs one index per entry, each in 0..{self.in_size - 1}")
        if self.group.numel() and not (0 <= int(self.group.min()) and int(self.group.max()) < self.size):
            raise ValueError(f"Pool groups must lie in 0..{self.size - 1}")

    def in_sizes(self) -> tuple[int, ...]:
        return (self.in_size,)

    @property
    def out_size(self) -> int:
        return self.size

    def _entries(self, v: torch.Tensor) -> torch.Tensor:  # [B, in] -> [B, entries]
        return v if self.index is None else v[:, self.index]

    def _sum(self, v: torch.Tensor) -> torch.Tensor:
        return v.new_zeros(v.shape[0], self.size).index_add_(1, self.group, v)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self._sum(self._entries(h) * self.weight.to(h.dtype))

    def back(self, A: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        per_entry = A[:, self.group] * self.weight.to(A.dtype)
        if self.index is not None:
            per_entry = A.new_zeros(A.shape[0], self.in_size).index_add_(1, self.index, per_entry)
        return [per_entry], A.new_zeros(A.shape[0])

    def ibp(self, bounds: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        lo, hi = self._entries(bounds[0]), self._entries(bounds[1])
        wp, wn = self.weight.clamp(min=0).to(lo.dtype), self.weight.clamp(max=0).to(lo.dtype)
        return self._sum(lo * wp + hi * wn), self._sum(hi * wp + lo * wn)

    def abs_forward(self, d: torch.Tensor) -> torch.Tensor:
        return self._sum(self._entries(d) * self.weight.abs().to(d.dtype))

    def sparse(self):
        from scipy import sparse

        cols = np.arange(self.group.numel()) if self.index is None else self.index.numpy()
        m = sparse.csr_matrix((self.weight.numpy(), (self.group.numpy(), cols)), shape=(self.size, self.in_size))
        m.sum_duplicates()
        return [m], np.zeros(self.size)


@dataclass(eq=False)
class PairMax(Pool):
    """One level of a max's tree (`readers._max_tree`): on the concatenation (x, r) of a value x [n] and the ReLUs
    r = ReLU(x[b] − x[a]) of its pairs, y_j = x[a_j] + r_k = max(x[a_j], x[b_j]), or x[a_j] carried (b_j = −1). Built by
    `of`. As a map it is the Pool of those entries (`back`, `sparse`: exact); its interval and the swap gap's rule
    read the max it computes, which holds wherever r is that ReLU of x (in every network the tree is read into, on
    every box): [max(l_a, l_b), max(u_a, u_b)] and max(δ_a, δ_b) (max is 1-Lipschitz in L∞), each intersected with
    the Pool's own, which counts a twice (a + ReLU(b − a) by interval arithmetic is 3× as wide even where b − a has
    one sign)."""

    first: torch.Tensor | None = None  # a_j per output
    other: torch.Tensor | None = None  # b_j per output (a_j where carried)

    @classmethod
    def of(cls, a: Any, b: Any, n: int) -> "PairMax":
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        paired = b >= 0
        relu = n + np.cumsum(paired) - 1  # the ReLU of output j's pair, after x in the concatenation
        group = np.concatenate([np.arange(a.size), np.flatnonzero(paired)])
        index = np.concatenate([a, relu[paired]])
        return cls(group, np.ones(group.size), a.size, index, n + int(paired.sum()),
                   torch.as_tensor(a), torch.as_tensor(np.where(paired, b, a)))

    def ibp(self, bounds: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        lo, hi = super().ibp(bounds)
        (l, u), a, b = bounds, self.first, self.other
        return torch.maximum(lo, torch.maximum(l[:, a], l[:, b])), torch.minimum(hi, torch.maximum(u[:, a], u[:, b]))

    def abs_forward(self, d: torch.Tensor) -> torch.Tensor:
        return torch.minimum(super().abs_forward(d), torch.maximum(d[:, self.first], d[:, self.other]))


@dataclass(eq=False)
class TokenLinear(Affine):
    """y[r] = W x[r] + b for each of `rows` rows of a [rows, in] value (a MatMul of tokens [.., T, d] by a constant
    (d, e) matrix, a softmax's pairwise differences, a LayerNorm's centring): the per-row matrix is applied as a
    matrix product, never as the (rows·out, rows·in) block-diagonal one."""

    W: torch.Tensor  # (out, in)
    b: torch.Tensor  # (out,)
    rows: int

    def __post_init__(self) -> None:
        self.W, self.b = as_tensor(self.W), as_tensor(self.b).reshape(-1)
        self.rows = int(self.rows)
        if self.W.dim() != 2 or self.b.shape != (self.W.shape[0],):
            raise ValueError(f"TokenLinear needs W (out, in) and b (out,), got {tuple(self.W.shape)} and {tuple(self.b.shape)}")

    def in_sizes(self) -> tuple[int, ...]:
        return (self.rows * self.W.shape[1],)

    @property
    def out_size(self) -> int:
        return self.rows * self.W.shape[0]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        B = h.shape[0]
        return (h.reshape(B, self.rows, -1) @ self.W.T.to(h.dtype) + self.b.to(h.dtype)).reshape(B, -1)

    def back(self, A: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        R = A.shape[0]
        Ar = A.reshape(R, self.rows, -1)
        return [(Ar @ self.W.to(A.dtype)).reshape(R, -1)], Ar.sum(1) @ self.b.to(A.dtype)

    def ibp(self, bounds: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        lo, hi = bounds
        B = lo.shape[0]
        Wp, Wn = self.W.clamp(min=0).T.to(lo.dtype), self.W.clamp(max=0).T.to(lo.dtype)
        l, u = lo.reshape(B, self.rows, -1), hi.reshape(B, self.rows, -1)
        b = self.b.to(lo.dtype)
        return (l @ Wp + u @ Wn + b).reshape(B, -1), (u @ Wp + l @ Wn + b).reshape(B, -1)

    def abs_forward(self, d: torch.Tensor) -> torch.Tensor:
        B = d.shape[0]
        return (d.reshape(B, self.rows, -1) @ self.W.abs().T.to(d.dtype)).reshape(B, -1)

    def sparse(self):
        from scipy import sparse

        return [sparse.kron(sparse.identity(self.rows), sparse.csr_matrix(self.W.numpy()), format="csr")], np.tile(self.b.numpy(), self.rows)


# ---------------------------------------------------------------------------------------------
# activations


@dataclass(eq=False)
class ReLU(Activation):
    size: int
    source: str = ""  # the ONNX tensor feeding it, when read from ONNX (Marabou's name for those variables)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h.clamp(min=0)


@dataclass(eq=False)
class Gate(Activation):
    """y = x·g(λx), g = `pipeline.gates.family(kind).g`; lam: one λ > 0 per unit."""

    kind: str
    lam: torch.Tensor
    source: str = ""

    def __post_init__(self) -> None:
        from pipeline.gates import GATES

        if self.kind not in GATES:
            raise UnsupportedModel(f"unknown gate family {self.kind!r}; known: {', '.join(GATES)}")
        self.lam = as_tensor(self.lam).reshape(-1)
        if not bool(torch.all(self.lam > 0)):
            raise ValueError("every λ of a gate must be > 0")

    @property
    def size(self) -> int:  # type: ignore[override]
        return self.lam.numel()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        from pipeline.gates import family

        return family(self.kind).f(h, self.lam)


@dataclass(eq=False)
class Rounding(Activation):
    """y = x + e for some |e| ≤ E (per unit): what rounding to a quantization grid, and the float32 arithmetic around
    it, may add to an exact value (`quantized.requant_error` derives E; the clamp to the grid's range follows as ReLUs).

    Without a grid (`step` None: the output DequantizeLinear's float32 product) the relaxation is x − E ≤ y ≤ x + E on
    any interval. With one, y is a multiple of the grid step s (y = s·k, k = round(t/s), |t − x| ≤ E − s/2 the
    arithmetic before the rounding), so over an input interval [l, u] k lies in [⌈(l − E')/s − ½⌉, ⌊(u + E')/s + ½⌋]
    (E' = E − s/2; ties either way): a unit whose interval stays inside one grid cell has an exact, constant value,
    and the clamp's ReLUs after it see the snapped range (a unit just below a grid point's half step is dead, not
    unstable). CROWN's lines are, per side, x ± E or the snapped end, whichever is tighter at the interval's middle;
    α-CROWN may choose per row among every supporting line of the staircase's hull (`hull_lines`,
    `bounds.Bounder.OPTIMIZE_ROUNDING`, off by default).

    `forward` is the surrogate an attack searches on: the grid value s·round(x/s) (x itself without a grid), with
    the identity's gradient. A point it finds counts only once the int8 model itself misclassifies it."""

    E: torch.Tensor
    step: torch.Tensor | None = None  # per unit, the grid step s as a float64 (None: no grid)
    source: str = ""

    # slack on k's bounds, in grid steps: (l − E')/s in float64 is off by ~1e-16 of its size (≤ 1e-12 for the ranges
    # an int8 grid spans); a value right at a half step may round either way, so the bounds must never move inward
    SNAP_SLACK: ClassVar[float] = 1e-9

    def __post_init__(self) -> None:
        self.E = as_tensor(self.E).reshape(-1)
        if not bool(torch.all(self.E >= 0)):
            raise ValueError("a rounding error bound must be >= 0")
        if self.step is not None:
            self.step = as_tensor(self.step).reshape(-1).expand_as(self.E).clone()
            if not bool(torch.all((self.step > 0) & (self.E >= self.step / 2))):
                raise ValueError("a grid's step must be > 0 and its rounding error bound at least half of it")

    @property
    def needs_bounds(self) -> bool:  # type: ignore[override]
        return self.step is not None

    @property
    def size(self) -> int:  # type: ignore[override]
        return self.E.numel()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.step is None:
            return h
        s = self.step.to(h.dtype)
        return h + (torch.round(h / s) * s - h).detach()

    def k_range(self, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The grid indices k the output may take over the input interval [l, u] (floats holding integers)."""
        s, E = self.step.to(l.dtype), self.E.to(l.dtype)
        inner = E - s / 2
        return (torch.ceil((l - inner) / s - 0.5 - self.SNAP_SLACK),
                torch.floor((u + inner) / s + 0.5 + self.SNAP_SLACK))

    def _snapped(self, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s, E = self.step.to(l.dtype), self.E.to(l.dtype)
        klo, khi = self.k_range(l, u)
        return torch.maximum(klo * s, l - E), torch.minimum(khi * s, u + E)

    def settled(self, l: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Units whose interval already has one value on the grid: a tighter interval changes nothing of theirs, so
        CROWN does not bound them (`bounds.Bounder._query`)."""
        if self.step is None:
            return torch.ones_like(l, dtype=torch.bool)
        lo, hi = self._snapped(l, u)
        return hi <= lo

    def grid(self) -> tuple[torch.Tensor, float] | None:
        """(step, slack): every value is within slack of a multiple of step (the MILP's integer encoding)."""
        return None if self.step is None else (self.step, 0.0)

    def interval(self, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        E = self.E.to(l.dtype)
        if self.step is None:
            return l - E, u + E
        return self._snapped(l, u)

    def lines(self, l: torch.Tensor, u: torch.Tensor, k: tuple[torch.Tensor, torch.Tensor] | None = None):
        """CROWN's lines: per side x ± E or the snapped end, whichever is tighter at the interval's middle (`hull_lines`
        has every other line the staircase allows, for α-CROWN to choose from).

        `k` = (k_lo, k_hi): a branch and bound domain's grid split (`bab`) allows only these indices. Then y lies in
        [s·k_lo, s·k_hi] and, as |y − x| ≤ E, x in [s·k_lo − E, s·k_hi + E]: the lines are those of that narrower
        interval (they need hold only where the domain's points lie), a single index a constant."""
        one, E = torch.ones_like(l), self.E.to(l.dtype).expand_as(l)
        if self.step is None:
            return one, -E, one, E
        if k is not None:
            s = self.step.to(l.dtype)
            l = torch.maximum(l, k[0] * s - E)
            u = torch.maximum(torch.minimum(u, k[1] * s + E), l)  # an empty domain: any line is sound there
        lo, hi = self._snapped(l, u)
        if k is not None:
            lo, hi = torch.maximum(lo, k[0] * s), torch.minimum(hi, k[1] * s)
            hi = torch.maximum(hi, lo)
        mid = (l + u) / 2
        flat_lo, flat_hi = lo >= mid - E, hi <= mid + E  # the constant line is the tighter one at the middle
        zero = torch.zeros_like(l)
        return (torch.where(flat_lo, zero, one), torch.where(flat_lo, lo, -E),
                torch.where(flat_hi, zero, one), torch.where(flat_hi, hi, E))

    def hull_lines(self, l: torch.Tensor, u: torch.Tensor, slopes: tuple[torch.Tensor, torch.Tensor]):
        """(al, bl, au, bu): per side the supporting line of the staircase's hull over [l, u] with the given slope
        (α-CROWN's parameters, one per row and unit; `slope_range` gives their range).

        The pairs (x, y) the runtime may give are exactly y = s·k with |y − x| ≤ E (k = round(t/s), |t − x| ≤ E',
        ties either way), so the largest value at x is the staircase s·⌊(x + E)/s⌋, whose steps start at the corners
        (s·k − E, s·k). Its upper hull over [l, u] is concave with vertices (l, s·k_l), the corners, and (u, s·k_max):
        facets of slope s/(c₁ − l) ≥ 1 (to the first corner c₁), 1 (y = x + E, through the corners) and 0 (after the
        last corner c_m). A line of slope a is a supporting line through c_m for a ≤ 1, through c₁ for 1 ≤ a ≤
        s/(c₁ − l), through (l, s·k_l) beyond (and through it for every a ≥ 0 when no corner lies in the interval).
        Slope 0 is the snapped end, slope 1 is x + E, the steepest facet beats both on an interval of under two cells
        (CROWN's midpoint choice of it lowered 27 of 30 margin bounds on a preact_resnet: a slope above 1 multiplies
        everything before the unit, so only an optimizer that sees the whole bound should choose it: α-CROWN with
        `bounds.Bounder.OPTIMIZE_ROUNDING`). The corners are
        moved left by `SNAP_SLACK` steps and the intercepts outward by their own float64 rounding. The lower side is
        the same staircase turned by half a turn."""
        if self.step is None:
            return self.lines(l, u)
        a_lo, a_up = slopes
        au, bu = self._hull_upper(l, u, a_up)
        al, nb = self._hull_upper(-u, -l, a_lo)  # y ≤ a·(−x) + b on the turned staircase: y ≥ a·x − b here
        return al, -nb, au, bu

    def _vertices(self, l: torch.Tensor, u: torch.Tensor):
        """The upper hull's vertices over [l, u]: (y0 = s·k_l at l, the first corner c1 with y1 = y0 + s, the last corner
        cm with ym, whether a corner lies in the interval), corners moved left by `SNAP_SLACK` steps."""
        s, E = self.step.to(l.dtype), self.E.to(l.dtype)
        k_l = torch.floor((l + E) / s + self.SNAP_SLACK)
        k_u = torch.floor((u + E) / s + self.SNAP_SLACK)
        k_l = torch.where((k_l + 1) * s - E - self.SNAP_SLACK * s <= l, k_l + 1, k_l)  # a corner at l itself: above it
        k_u = torch.maximum(k_u, k_l)
        y0 = k_l * s
        c1 = (k_l + 1) * s - E - self.SNAP_SLACK * s
        cm = k_u * s - E - self.SNAP_SLACK * s
        corner = k_u > k_l  # c1 > l, c1 ≤ cm
        return y0, c1, y0 + s, cm, k_u * s, corner

    def slope_range(self, l: torch.Tensor, u: torch.Tensor):
        """Per side ((low, high) lower side, (low, high) upper side), the slopes α-CROWN may choose: [0, the steep
        facet's] on an interval with at most `FREE_CORNERS` corners, 1 (x ± E) on a wider one and 0 on one with a
        single value. On a wide interval no other line is worth it (they part from the staircase by (1 − a) per unit
        of x), and an optimizer that moves every slope by its step size (Adam) would only spoil them."""
        def side(l_, u_):
            _, c1, _, _, _, corner = self._vertices(l_, u_)
            s, E = self.step.to(l_.dtype), self.E.to(l_.dtype)
            corners = torch.floor((u_ + E) / s + self.SNAP_SLACK) - torch.floor((l_ + E) / s + self.SNAP_SLACK)
            run = (c1 - l_).clamp(min=torch.finfo(l_.dtype).tiny)
            free = corner & (corners <= self.FREE_CORNERS)
            top = torch.where(free, (s / run).clamp(min=1.0, max=self.STEEP_MAX), torch.where(corner, torch.ones_like(l_), torch.zeros_like(l_)))
            low = torch.where(free | ~corner, torch.zeros_like(l_), torch.ones_like(l_))
            return low, top
        return side(-u, -l), side(l, u)

    FREE_CORNERS: ClassVar[int] = 2

    # slopes above this are not offered (an interval far narrower than a cell, right below a corner: a huge slope would
    # only magnify float64 rounding)
    STEEP_MAX: ClassVar[float] = 1e3

    def _hull_upper(self, l: torch.Tensor, u: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y0, c1, y1, cm, ym, corner = self._vertices(l, u)
        steep = torch.where(corner, self.step.to(l.dtype) / (c1 - l).clamp(min=torch.finfo(l.dtype).tiny), torch.zeros_like(l))
        a = a.clamp(min=0)
        px = torch.where(corner & (a <= 1), cm, torch.where(corner & (a <= steep), c1, l))
        py = torch.where(corner & (a <= 1), ym, torch.where(corner & (a <= steep), y1, y0))
        b = py - a * px
        return a, b + 1e-12 * (py.abs() + (a * px).abs())  # the intercept's own float64 rounding, outward


@dataclass(eq=False)
class QuantizedInput(Activation):
    """The first quantization of the graph input: y = fl32(s·(q(t) − z)), q(t) = saturate(round(t/s) + z) as the runtime
    computes it (`quantized.grid_index`, a monotone map), of t = x or, where the model normalizes its input with constants
    before quantizing it (a CNN's Mul/Add, `pre_*`), of t = a·x + b computed by `pre_ops` float32 operations: within
    δ = 2·γ_{ops+1}·(|a·x| + |b|) of the exact a·x + b, and monotone in x. Over an input interval [l, u] the values y takes
    are the grid points between those of the interval's ends (t − δ at the lower one, t + δ at the upper one), so that
    pair is its range and the constant lines y(l) ≤ y ≤ y(u) the tightest relaxation of a box; `forward` is the grid
    value of fl32(a·x + b), with the identity's gradient so that an attack can move x."""

    scale: torch.Tensor  # per unit, the float32 scale as a float64
    zero: torch.Tensor  # per unit, integer-valued
    qmin: int
    qmax: int
    source: str = ""
    pre_scale: torch.Tensor | None = None  # per unit a (None: t = x)
    pre_shift: torch.Tensor | None = None  # per unit b
    pre_ops: int = 0

    def __post_init__(self) -> None:
        self.scale, self.zero = as_tensor(self.scale).reshape(-1), as_tensor(self.zero).reshape(-1)
        if self.pre_ops == 0 and self.pre_scale is not None and bool(torch.all(as_tensor(self.pre_scale) == 1)) \
                and bool(torch.all(as_tensor(self.pre_shift) == 0)):
            self.pre_scale = self.pre_shift = None  # the raw input itself
        if self.pre_scale is not None:
            self.pre_scale = as_tensor(self.pre_scale).reshape(-1).expand_as(self.scale).clone()
            self.pre_shift = as_tensor(self.pre_shift).reshape(-1).expand_as(self.scale).clone()
            if not bool(torch.all(self.pre_scale != 0)):
                raise ValueError("a normalization before the first quantization must not multiply by 0")

    @property
    def size(self) -> int:  # type: ignore[override]
        return self.scale.numel()

    def _pre(self, x: torch.Tensor, side: str) -> torch.Tensor:
        if self.pre_scale is None:
            return x
        from pipeline.numerics import gamma

        a, b = self.pre_scale.to(x.dtype), self.pre_shift.to(x.dtype)
        t = x * a + b
        if side == "nearest":
            return t
        delta = 2 * gamma(self.pre_ops + 1) * ((x * a).abs() + b.abs())
        return t - delta if side == "low" else t + delta

    def value(self, x: torch.Tensor, side: str = "nearest") -> torch.Tensor:
        from .quantized import grid_index

        q = grid_index(self._pre(x.detach(), side), self.scale, self.zero, self.qmin, self.qmax, side)
        # DequantizeLinear in float32, as the runtime computes it: one rounding of the exact (q − z)·s
        y = (q - self.zero).to(torch.float32) * self.scale.to(torch.float32)
        return y.to(x.dtype)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + (self.value(h) - h).detach()

    def grid(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(step, slack): a value is fl32(s·k), k = q − z an integer: within 2⁻²⁴·|y| of s·k."""
        top = self.scale * torch.maximum((self.qmin - self.zero).abs(), (self.qmax - self.zero).abs())
        return self.scale, top * U

    def interval(self, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lo = torch.minimum(self.value(l[None], "low")[0], self.value(u[None], "low")[0])  # a < 0 reverses the ends
        hi = torch.maximum(self.value(l[None], "high")[0], self.value(u[None], "high")[0])
        return lo, hi

    def k_range(self, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The grid indices k = q − z the input takes over [l, u] (floats holding integers; a < 0 reverses the ends)."""
        from .quantized import grid_index

        def q(x: torch.Tensor, side: str) -> torch.Tensor:
            return grid_index(self._pre(x[None], side)[0], self.scale, self.zero, self.qmin, self.qmax, side).to(l.dtype)

        return (torch.minimum(q(l, "low"), q(u, "low")) - self.zero.to(l.dtype),
                torch.maximum(q(l, "high"), q(u, "high")) - self.zero.to(l.dtype))

    def at(self, k: torch.Tensor) -> torch.Tensor:
        """The dequantized value of grid index k, as the runtime's float32 DequantizeLinear computes it."""
        return (k.to(torch.float32) * self.scale.to(torch.float32)).to(k.dtype)

    @property
    def step(self) -> torch.Tensor:
        return self.scale

    def lines(self, l: torch.Tensor, u: torch.Tensor, k: tuple[torch.Tensor, torch.Tensor] | None = None):
        """Constant lines at the interval's ends; `k` = (k_lo, k_hi): a branch and bound domain's split of the input
        grid (`bab`), which narrows them to those indices' values."""
        lo, hi = self.interval(l, u)
        if k is not None:
            lo, hi = torch.maximum(lo, self.at(k[0])), torch.minimum(hi, self.at(k[1]))
            hi = torch.maximum(hi, lo)  # an empty domain: any line is sound there
        zero = torch.zeros_like(l)
        return zero, lo, zero, hi


# ---------------------------------------------------------------------------------------------
# composing affine maps (what `Graph.merged` fuses)


def compose(first: Affine, second: Affine) -> Affine | None:
    """second ∘ first for one-input maps when the result is as cheap as the parts; else None."""
    if isinstance(first, (Linear, Scale)) and isinstance(second, (Linear, Scale)):
        if isinstance(first, Scale) and isinstance(second, Scale):
            return Scale(first.scale * second.scale, first.shift * second.scale + second.shift)
        if isinstance(first, Scale):  # W (x s + t) + b
            return Linear(second.W * first.scale[None, :], second.W @ first.shift + second.b)
        if isinstance(second, Scale):  # (W x + b) s + t
            return Linear(first.W * second.scale[:, None], first.b * second.scale + second.shift)
        return Linear(second.W @ first.W, second.W @ first.b + second.b)
    if isinstance(first, Conv) and isinstance(second, Scale):  # BatchNorm after a conv: constant per channel
        co, ho, wo = first.out_shape
        scale, shift = second.scale.reshape(co, ho * wo), second.shift.reshape(co, ho * wo)
        if not (bool(torch.all(scale == scale[:, :1])) and bool(torch.all(shift == shift[:, :1]))):
            return None
        a, t = scale[:, 0], shift[:, 0]
        return Conv(first.weight * a[:, None, None, None], first.bias * a + t, first.in_shape, first.stride, first.padding,
                    first.dilation, first.groups)
    if isinstance(first, Scale) and isinstance(second, Conv):  # normalization before the first conv: constant per channel
        c, h, w = second.in_shape
        scale, shift = first.scale.reshape(c, h * w), first.shift.reshape(c, h * w)
        if not (bool(torch.all(scale == scale[:, :1])) and bool(torch.all(shift == shift[:, :1]))) or any(second.padding):
            return None  # zero padding pads the normalized input with 0, not the raw one: only without padding
        a, t = scale[:, 0], shift[:, 0]
        if second.groups != 1:
            return None
        return Conv(second.weight * a[None, :, None, None], second.bias + (second.weight * t[None, :, None, None]).sum((1, 2, 3)),
                    second.in_shape, second.stride, second.padding, second.dilation, second.groups)
    return None
