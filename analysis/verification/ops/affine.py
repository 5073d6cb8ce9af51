"""Affine ops (`base.Affine`): y = Σ_i M_i x_i + c, each with its forward, interval arithmetic `ibp`, back-substitution
`back(A) -> ([A_i per input], A·c)`, `abs_forward` (the swap gap's |M|·δ) and `sparse` (the MILP's matrices).

- `Linear(W, b)`: y = W x + b (Gemm; MatMul + Add);
- `Conv`: a 2-d convolution on (C, H, W), kept as a convolution (back-substitution never builds a (C·H·W)² matrix);
- `Scale(scale, shift)`: y = x·scale + shift elementwise (normalization, BatchNorm in eval, Mul/Add/Sub/Div by constants);
- `Sum(signs)`: y = Σ_i signs_i·x_i over inputs of one size (residual Add, Sub of two tensors);
- `TokenLinear(W, b, rows)`: W x + b on each row of [rows, in] (a MatMul by a constant on tokens);
- `compose`: two one-input maps fused where the result is as cheap as the parts (`graph.Graph.merged`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from .base import Affine, as_tensor, numel

# float64 back-substitution of a Conv on the CPU, where torch's transposed convolution has no fast kernel (it loops over
# the rows): on a map of at most DENSE_MAX_PIXELS output pixels a matrix product with the convolution's matrix (at most
# DENSE_MAX_ENTRIES entries: 8 MB), else Wᵀ per pixel and col2im (measured on 128 rows of preact_resnet [16,32]'s
# convolutions: 1.7x and 1.4x faster than conv_transpose2d)
DENSE_MAX_PIXELS = 16
DENSE_MAX_ENTRIES = 2 ** 20


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

    def unit_rows(self, units: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.W[units], self.b[units]

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

    def unit_rows(self, units: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The kernel of each output unit placed on its window of the input (taps in the padding dropped; a grouped
        conv's on its group's input channels): `back` of a one-hot row, without a transposed convolution of a whole
        row of zeros."""
        c, h, w = self.in_shape
        _, ho, wo = self.out_shape
        cig, kh, kw = self.weight.shape[1:]
        k = units.numel()
        co, y, x = units // (ho * wo), units % (ho * wo) // wo, units % wo
        dev = units.device
        iy = y.view(k, 1, 1, 1) * self.stride[0] - self.padding[0] + torch.arange(kh, device=dev).view(1, 1, kh, 1) * self.dilation[0]
        ix = x.view(k, 1, 1, 1) * self.stride[1] - self.padding[1] + torch.arange(kw, device=dev).view(1, 1, 1, kw) * self.dilation[1]
        inside = (iy >= 0) & (iy < h) & (ix >= 0) & (ix < w)
        first = (co // (self.weight.shape[0] // self.groups)) * cig  # the unit's group's first input channel
        flat = (first.view(k, 1, 1, 1) + torch.arange(cig, device=dev).view(1, cig, 1, 1)) * (h * w) + iy * w + ix
        vals = torch.where(inside, self.weight[co], torch.zeros((), dtype=self.weight.dtype, device=dev))
        rows = torch.zeros(k, c * h * w, dtype=self.weight.dtype, device=dev)
        rows.scatter_add_(1, torch.where(inside, flat, torch.zeros_like(flat)).expand(k, cig, kh, kw).reshape(k, -1),
                          vals.reshape(k, -1))  # distinct taps, distinct inputs: each a sum of one weight and zeros
        return rows, self.bias[co]

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
            # grouped: the same per group, W_gᵀ·A_g as one batched product over the groups; a depthwise conv's (one
            # input and one output channel a group) as a broadcast product, since a batched product of kh·kw×1 by
            # 1×pixels matrices costs more than the dense product of the same conv written without groups
            g, (co, cig) = self.groups, self.weight.shape[:2]
            if self.depthwise:
                cols = (self.weight.reshape(1, g, kh * kw, 1) * Ai.reshape(rows, g, 1, -1)).reshape(rows, g * kh * kw, -1)
            else:
                Wg = self.weight.reshape(g, co // g, cig * kh * kw).transpose(1, 2)
                cols = torch.matmul(Wg, Ai.reshape(rows, g, co // g, -1)).reshape(rows, g * cig * kh * kw, -1)
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
    def depthwise(self) -> bool:
        """One input and one output channel a group."""
        return self.groups > 1 and self.weight.shape[0] == self.groups and self.weight.shape[1] == 1

    @property
    def grouped(self) -> bool:
        """Several groups (depthwise or not)."""
        return self.groups > 1

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


@dataclass(eq=False)
class Scale(Affine):
    """y = x·scale + shift elementwise; both flat, one value per unit."""

    scale: torch.Tensor
    shift: torch.Tensor

    copies: ClassVar[bool] = True  # each unit an affine function of one input unit
    has_back_units: ClassVar[bool] = True

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

    def back_units(self, A: torch.Tensor, units: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return A * self.scale[units], A @ self.shift[units]

    def ibp(self, bounds: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = self.forward(bounds[0]), self.forward(bounds[1])
        return torch.minimum(a, b), torch.maximum(a, b)

    def abs_forward(self, d: torch.Tensor) -> torch.Tensor:
        return d * self.scale.abs()

    def unit_sources(self) -> torch.Tensor:
        return torch.arange(self.scale.numel(), device=self.scale.device)

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
