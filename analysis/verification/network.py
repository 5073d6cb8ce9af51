"""The network every verification tool here works on, and its two readers (torch modules, ONNX graphs).

A `Network` is an input shape and a list of layers acting on flat float64 vectors: the C-order
flattening of one input (which is also how VNN-LIB numbers the inputs X_i) and of every hidden tensor.

- `Linear(W, b)`: y = W x + b (nn.Linear; ONNX Gemm, MatMul + Add);
- `Conv(weight, bias, in_shape, stride, padding, dilation, groups)`: nn.Conv2d / ONNX Conv on (C, H, W);
- `Scale(scale, shift)`: y = x·scale + shift elementwise (input normalization, Sub/Div, Mul/Add by
  constants, BatchNorm in eval), one value per flat unit;
- `ReLU()`;
- `Gate(kind, lam)`: y = x·g(λx) elementwise, g a family of `pipeline.gates.GATES` (`bounds` relaxes
  "phi": λ-GELU and GELU at λ = 1, "sigmoid": λ-Swish and SiLU, "serf": SERF), λ per unit (a per-layer
  λ is repeated, a per-channel λ broadcast over its channel's positions).

Flatten and Reshape change only the view of the flat vector, so they are no layers. A linked pair
(g(z), g(−z)) (CReLU when g = ReLU) is a mirroring affine map [I; −I] (a Linear, or a 1×1 Conv on
images) followed by the elementwise activation, λ shared by the pair.

Conv is kept as a convolution (not an explicit matrix): forward is `conv2d`, back-substitution is
`conv_transpose2d` of the coefficient rows, so a bound pass needs memory for the rows only, never for
a (C·H·W)² matrix (12544 × 6272 float64 = 630 MB for the default CNN's second conv). The MILP wants
matrices: `Conv.sparse()` builds the sparse one from index arithmetic.

Everything is float64. A network read from a float32 model computes with its float32 weights exactly
(each weight converts to float64 without rounding); the float32 rounding of inference itself is not
modelled (see `analysis/verify.py` for what a certificate is about).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import numpy as np
import torch
import torch.nn.functional as F

DTYPE = torch.float64
ONNX_OPS = ("Gemm, MatMul (+ Add), Conv, Flatten, Reshape, Relu, BatchNormalization, Add/Sub/Mul/Div by constants, "
            "Identity, Dropout, Constant")


class UnsupportedModel(NotImplementedError):
    """The model holds something no tool here reads; the message is one line that names it."""


def _t(a: Any) -> torch.Tensor:
    if isinstance(a, torch.Tensor):
        return a.detach().to("cpu", DTYPE)
    return torch.from_numpy(np.array(a, dtype=np.float64))  # a copy: broadcast views are read-only


# ---------------------------------------------------------------------------------------------
# layers


@dataclass(eq=False)
class Linear:
    """y = W x + b; W (out, in), b (out,)."""

    W: torch.Tensor
    b: torch.Tensor

    def __post_init__(self) -> None:
        self.W, self.b = _t(self.W), _t(self.b).reshape(-1)
        if self.W.dim() != 2 or self.b.shape != (self.W.shape[0],):
            raise ValueError(f"Linear needs W (out, in) and b (out,), got {tuple(self.W.shape)} and {tuple(self.b.shape)}")

    @property
    def in_size(self) -> int:
        return self.W.shape[1]

    @property
    def out_size(self) -> int:
        return self.W.shape[0]

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # [B, in] -> [B, out]
        return h @ self.W.T + self.b

    def back(self, A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A (rows, out) on the output -> (A W (rows, in), A b (rows,))."""
        return A @ self.W, A @ self.b

    def ibp(self, lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # W⁺l + W⁻u, not centre/radius: equal to a per-neuron loop up to summation order
        Wp, Wn = self.W.clamp(min=0), self.W.clamp(max=0)
        return lo @ Wp.T + hi @ Wn.T + self.b, hi @ Wp.T + lo @ Wn.T + self.b

    def sparse(self):
        from scipy import sparse

        return sparse.csr_matrix(self.W.numpy()), self.b.numpy()


@dataclass(eq=False)
class Conv:
    """2-d convolution on a (C, H, W) tensor, flat in and out."""

    weight: torch.Tensor  # (C_out, C_in / groups, kh, kw)
    bias: torch.Tensor  # (C_out,)
    in_shape: tuple[int, int, int]
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)  # symmetric (top = bottom, left = right)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    out_shape: tuple[int, int, int] = field(init=False)

    def __post_init__(self) -> None:
        self.weight, self.bias = _t(self.weight), _t(self.bias).reshape(-1)
        self.in_shape = tuple(int(d) for d in self.in_shape)
        c, h, w = self.in_shape
        kh, kw = self.weight.shape[2:]
        ho = (h + 2 * self.padding[0] - self.dilation[0] * (kh - 1) - 1) // self.stride[0] + 1
        wo = (w + 2 * self.padding[1] - self.dilation[1] * (kw - 1) - 1) // self.stride[1] + 1
        if self.weight.shape[1] * self.groups != c or ho < 1 or wo < 1:
            raise ValueError(f"Conv weight {tuple(self.weight.shape)} (groups {self.groups}) does not fit input {self.in_shape}")
        self.out_shape = (self.weight.shape[0], ho, wo)

    @property
    def in_size(self) -> int:
        return int(np.prod(self.in_shape))

    @property
    def out_size(self) -> int:
        return int(np.prod(self.out_shape))

    def _conv(self, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y = F.conv2d(h.reshape(-1, *self.in_shape), weight, bias, self.stride, self.padding, self.dilation, self.groups)
        return y.reshape(h.shape[0], -1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self._conv(h, self.weight, self.bias)

    def back(self, A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A (rows, C_out·Ho·Wo) -> (A·Conv as a matrix, via conv_transpose2d, and A·bias)."""
        rows = A.shape[0]
        _c, h, w = self.in_shape
        kh, kw = self.weight.shape[2:]
        _, ho, wo = self.out_shape
        # conv_transpose2d may come out short of the input size where the stride skipped the last rows
        op = [h - ((ho - 1) * self.stride[0] - 2 * self.padding[0] + self.dilation[0] * (kh - 1) + 1),
              w - ((wo - 1) * self.stride[1] - 2 * self.padding[1] + self.dilation[1] * (kw - 1) + 1)]
        Ai = A.reshape(rows, *self.out_shape)
        if max(op) >= max(self.stride[0], self.dilation[0], self.stride[1], self.dilation[1]):
            raise ValueError(f"Conv {self.in_shape} -> {self.out_shape}: cannot transpose (output padding {op})")
        back = F.conv_transpose2d(Ai, self.weight, None, self.stride, self.padding, tuple(op), self.groups, self.dilation)
        return back.reshape(rows, -1), Ai.sum(dim=(2, 3)) @ self.bias

    def ibp(self, lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mid, rad = (hi + lo) / 2, (hi - lo) / 2
        c = self._conv(mid, self.weight, self.bias)
        r = self._conv(rad, self.weight.abs(), None)
        return c - r, c + r

    def sparse(self):
        """(scipy CSR matrix (out, in), bias (out,)) of the same map, from index arithmetic."""
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
        m = sparse.csr_matrix((vals, (rows, cols)), shape=(self.out_size, self.in_size))
        m.sum_duplicates()
        return m, np.repeat(self.bias.numpy(), ho * wo)


@dataclass(eq=False)
class Scale:
    """y = x·scale + shift elementwise; both flat, one value per unit."""

    scale: torch.Tensor
    shift: torch.Tensor

    def __post_init__(self) -> None:
        self.scale, self.shift = _t(self.scale).reshape(-1), _t(self.shift).reshape(-1)
        if self.scale.shape != self.shift.shape:
            raise ValueError(f"Scale needs scale and shift of one size, got {tuple(self.scale.shape)}, {tuple(self.shift.shape)}")

    @property
    def in_size(self) -> int:
        return self.scale.numel()

    out_size = in_size

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h * self.scale + self.shift

    def back(self, A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return A * self.scale, A @ self.shift

    def ibp(self, lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = self.forward(lo), self.forward(hi)
        return torch.minimum(a, b), torch.maximum(a, b)

    def sparse(self):
        from scipy import sparse

        return sparse.diags(self.scale.numpy()).tocsr(), self.shift.numpy()


@dataclass(eq=False)
class ReLU:
    size: int
    source: str = ""  # the ONNX tensor feeding it, when read from ONNX (Marabou's name for those variables)

    @property
    def in_size(self) -> int:
        return self.size

    out_size = in_size

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h.clamp(min=0)


@dataclass(eq=False)
class Gate:
    """y = x·g(λx), g = `pipeline.gates.family(kind).g`; lam: one λ > 0 per unit."""

    kind: str
    lam: torch.Tensor
    source: str = ""  # the torch module it was read from

    def __post_init__(self) -> None:
        from pipeline.gates import GATES

        if self.kind not in GATES:
            raise UnsupportedModel(f"unknown gate family {self.kind!r}; known: {', '.join(GATES)}")
        self.lam = _t(self.lam).reshape(-1)
        if not bool(torch.all(self.lam > 0)):
            raise ValueError("every λ of a gate must be > 0")

    @property
    def in_size(self) -> int:
        return self.lam.numel()

    out_size = in_size

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        from pipeline.gates import family

        return family(self.kind).f(h, self.lam)


AFFINE = (Linear, Conv, Scale)
ACTIVATION = (ReLU, Gate)
Layer = Union[Linear, Conv, Scale, ReLU, Gate]


@dataclass(eq=False)
class Network:
    input_shape: tuple[int, ...]
    layers: list[Layer]

    def __post_init__(self) -> None:
        self.input_shape = tuple(int(d) for d in self.input_shape)
        size = self.num_inputs
        for k, layer in enumerate(self.layers):
            if layer.in_size != size:
                raise ValueError(f"layer {k} ({type(layer).__name__}) takes {layer.in_size} inputs, gets {size}")
            size = layer.out_size

    @property
    def num_inputs(self) -> int:
        return int(np.prod(self.input_shape))

    @property
    def num_outputs(self) -> int:
        return self.layers[-1].out_size if self.layers else self.num_inputs

    @property
    def activations(self) -> list[int]:
        """Indices of the activation layers (ReLU or Gate), in order."""
        return [k for k, layer in enumerate(self.layers) if isinstance(layer, ACTIVATION)]

    @property
    def is_relu(self) -> bool:
        return not any(isinstance(layer, Gate) for layer in self.layers)

    @property
    def num_relus(self) -> int:
        return sum(self.layers[k].in_size for k in self.activations)

    def forward(self, x: torch.Tensor | np.ndarray, upto: int | None = None) -> torch.Tensor:
        """Flat inputs [B, n] (or [n]) through layers[:upto], float64 (differentiable in a tensor x)."""
        h = x.to(DTYPE) if isinstance(x, torch.Tensor) else _t(x)
        flat = h.dim() == 1
        h = h.reshape(1, -1) if flat else h.reshape(h.shape[0], -1)
        for layer in self.layers[:upto]:
            h = layer.forward(h)
        return h[0] if flat else h

    def merged(self) -> "Network":
        """Runs of Linear/Scale composed into one Linear (exact up to float64 rounding); fewer
        back-substitution steps. Conv is kept (a dense conv matrix is what `Conv` avoids)."""
        out: list[Layer] = []
        for layer in self.layers:
            prev = out[-1] if out else None
            if isinstance(layer, (Linear, Scale)) and isinstance(prev, (Linear, Scale)):
                out[-1] = _compose(prev, layer)
            elif isinstance(layer, Scale) and isinstance(prev, Conv) and (folded := _conv_then_scale(prev, layer)):
                out[-1] = folded  # BatchNorm after a conv; a scale that varies within a channel stays separate
            else:
                out.append(layer)
        return Network(self.input_shape, out)

    def relu_version(self) -> "Network":
        """Every Gate replaced by ReLU (the swap stage's network, same weights)."""
        return Network(self.input_shape, [ReLU(l.in_size, l.source) if isinstance(l, Gate) else l for l in self.layers])


def _compose(first: Linear | Scale, second: Linear | Scale) -> Linear | Scale:
    """second ∘ first."""
    if isinstance(first, Scale) and isinstance(second, Scale):
        return Scale(first.scale * second.scale, first.shift * second.scale + second.shift)
    if isinstance(first, Scale):  # W (x s + t) + b
        return Linear(second.W * first.scale[None, :], second.W @ first.shift + second.b)
    if isinstance(second, Scale):  # (W x + b) s + t
        return Linear(first.W * second.scale[:, None], first.b * second.scale + second.shift)
    return Linear(second.W @ first.W, second.W @ first.b + second.b)


def _conv_then_scale(conv: Conv, s: Scale) -> Conv | None:
    """BatchNorm after a conv: a scale and shift constant per output channel fold into the conv."""
    co, ho, wo = conv.out_shape
    scale, shift = s.scale.reshape(co, ho * wo), s.shift.reshape(co, ho * wo)
    if not (bool(torch.all(scale == scale[:, :1])) and bool(torch.all(shift == shift[:, :1]))):
        return None
    a, t = scale[:, 0], shift[:, 0]
    return Conv(conv.weight * a[:, None, None, None], conv.bias * a + t, conv.in_shape, conv.stride, conv.padding,
                conv.dilation, conv.groups)


def mirror(size: int, shape: tuple[int, ...]) -> Layer:
    """[I; −I]: the affine half of a linked pair (g(z), g(−z)), concatenated on the channel axis."""
    if len(shape) == 3:
        c = shape[0]
        eye = torch.eye(c, dtype=DTYPE)
        return Conv(torch.cat([eye, -eye])[:, :, None, None], torch.zeros(2 * c), shape)
    eye = torch.eye(size, dtype=DTYPE)
    return Linear(torch.cat([eye, -eye]), torch.zeros(2 * size))


# ---------------------------------------------------------------------------------------------
# torch reader

TORCH_MODULES = ("nn.Sequential, nn.Linear, nn.Conv2d, nn.Flatten, nn.BatchNorm1d/2d (eval), nn.ReLU, nn.GELU, nn.SiLU, "
                 "nn.Identity, nn.Dropout, modules with `scale`/`shift` (Normalize), the gates of pipeline.activations "
                 "(λ-GELU, GELU, λ-Swish, SiLU, λ-SERF, SERF) and linked pairs of these")


def _per_unit(value: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A per-layer (1 value), per-channel (C values, channel axis first) or per-unit tensor, flat per unit."""
    v = _t(value).reshape(-1)
    n = int(np.prod(shape))
    if v.numel() == 1:
        return v.expand(n).clone()
    if v.numel() == shape[0]:
        return v.reshape(-1, *([1] * (len(shape) - 1))).expand(*shape).reshape(-1).clone()
    if v.numel() == n:
        return v.clone()
    raise UnsupportedModel(f"a per-unit parameter of {v.numel()} values does not fit a tensor of shape {shape}")


def _gate_of(module: Any) -> tuple[str, torch.Tensor] | None:
    """(gate family, λ [1] or [C]) for an activation x·g(λx) (`pipeline.activations.gate_of`), else None."""
    from pipeline.activations import gate_of

    try:
        return gate_of(module)
    except ValueError as e:
        raise UnsupportedModel(str(e)) from None


def from_torch(model: Any, input_shape: Sequence[int]) -> Network:
    """The layers of an nn.Sequential (nested Sequentials walked in order), eval semantics.

    `input_shape` excludes the batch axis. Raises UnsupportedModel (one line naming the module) for
    anything outside `TORCH_MODULES`.
    """
    import torch.nn as nn

    from pipeline.activations import Linked

    shape = tuple(int(d) for d in input_shape)
    layers: list[Layer] = []

    def size() -> int:
        return int(np.prod(shape))

    def activation(module: Any, where: str) -> None:
        if isinstance(module, nn.ReLU):
            layers.append(ReLU(size(), source=where))
            return
        g = _gate_of(module)
        if g is None:
            raise UnsupportedModel(f"unsupported activation {type(module).__name__} at {where}; supported: {TORCH_MODULES}")
        layers.append(Gate(g[0], _per_unit(g[1], shape), source=where))

    def walk(module: nn.Module, where: str) -> None:
        nonlocal shape
        if isinstance(module, nn.Sequential):
            for name, child in module.named_children():
                walk(child, f"{where}.{name}" if where else name)
        elif hasattr(module, "scale") and hasattr(module, "shift"):
            n = size()
            scale = torch.broadcast_to(_t(module.scale), shape).reshape(n)
            shift = torch.broadcast_to(_t(module.shift), shape).reshape(n)
            layers.append(Scale(scale, shift))
        elif isinstance(module, nn.Linear):
            if len(shape) != 1 or shape[0] != module.in_features:
                raise UnsupportedModel(f"{where}: Linear takes {module.in_features} features, gets a tensor of shape {shape}")
            b = module.bias if module.bias is not None else torch.zeros(module.out_features)
            layers.append(Linear(module.weight, b))
            shape = (module.out_features,)
        elif isinstance(module, nn.Conv2d):
            if len(shape) != 3 or module.padding_mode != "zeros" or isinstance(module.padding, str):
                raise UnsupportedModel(f"{where}: Conv2d needs a (C, H, W) input, zero padding given as numbers; got {shape}, "
                                       f"{module.padding_mode}, {module.padding}")
            b = module.bias if module.bias is not None else torch.zeros(module.out_channels)
            conv = Conv(module.weight, b, shape, tuple(module.stride), tuple(module.padding), tuple(module.dilation), module.groups)
            layers.append(conv)
            shape = conv.out_shape
        elif isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
            if module.running_mean is None:
                raise UnsupportedModel(f"{where}: BatchNorm without running statistics")
            inv = 1.0 / torch.sqrt(_t(module.running_var) + module.eps)
            w = _t(module.weight) if module.weight is not None else torch.ones_like(inv)
            b = _t(module.bias) if module.bias is not None else torch.zeros_like(inv)
            a = w * inv
            layers.append(Scale(_per_unit(a, shape), _per_unit(b - _t(module.running_mean) * a, shape)))
        elif isinstance(module, nn.Flatten):
            if module.start_dim != 1 or module.end_dim != -1:
                raise UnsupportedModel(f"{where}: only nn.Flatten(start_dim=1, end_dim=-1) is supported")
            shape = (size(),)
        elif isinstance(module, (nn.Identity, nn.Dropout)):
            pass
        elif isinstance(module, Linked):
            layers.append(mirror(size(), shape))
            pair = (2 * shape[0], *shape[1:])
            inner = module.inner
            if isinstance(inner, nn.ReLU):
                layers.append(ReLU(int(np.prod(pair)), source=where))
            else:
                g = _gate_of(inner)
                if g is None:
                    raise UnsupportedModel(f"unsupported activation {type(inner).__name__} in a linked pair at {where}")
                lam = _per_unit(g[1], shape)
                layers.append(Gate(g[0], torch.cat([lam, lam]), source=where))  # the pair shares λ
            shape = pair
        else:
            activation(module, where)

    walk(model, "")
    return Network(tuple(int(d) for d in input_shape), layers)


# ---------------------------------------------------------------------------------------------
# ONNX reader


def from_onnx(model: Any) -> Network:
    """A sequential ONNX graph (a path, bytes or a ModelProto) with one float input and one output.

    Reads Gemm, MatMul (+ Add), Conv, Flatten, Reshape, Relu, BatchNormalization, Add/Sub/Mul/Div by
    constants (normalization), Identity/Dropout and constants. Anything else raises UnsupportedModel whose
    message names the op: "unsupported ONNX op Erf (node 'n3'); this reader takes ...".
    """
    import onnx
    from onnx import numpy_helper

    if isinstance(model, (str, Path)):
        model = onnx.load(str(model))
    elif isinstance(model, (bytes, bytearray)):
        model = onnx.load_from_string(bytes(model))
    graph = model.graph
    consts: dict[str, np.ndarray] = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in consts]
    if len(inputs) != 1 or len(graph.output) != 1:
        raise UnsupportedModel(f"the graph has {len(inputs)} inputs and {len(graph.output)} outputs; one of each is supported")
    dims = [d.dim_value if d.dim_value > 0 else 1 for d in inputs[0].type.tensor_type.shape.dim]
    if not dims:
        raise UnsupportedModel("the graph input has no shape")
    # the batch axis: a leading 1 (fixed or symbolic); a graph without one takes a single flat input
    shape: tuple[int, ...] = tuple(dims[1:]) if len(dims) > 1 and dims[0] == 1 else tuple(dims)
    batch = len(dims) > 1 and dims[0] == 1
    input_shape = shape
    current = inputs[0].name
    layers: list[Layer] = []

    def attr(node: Any, name: str, default: Any) -> Any:
        for a in node.attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return default

    def where(node: Any) -> str:
        return f"node {node.name!r}" if node.name else f"a {node.op_type} node"

    def unsupported(node: Any, why: str = "") -> UnsupportedModel:
        return UnsupportedModel(f"unsupported ONNX op {node.op_type} ({where(node)}){': ' + why if why else ''}; "
                                f"this reader takes {ONNX_OPS}")

    def full(v: np.ndarray) -> np.ndarray:
        """A constant broadcast to the current tensor (batch axis dropped)."""
        v = np.asarray(v, dtype=np.float64)
        if batch and v.ndim == len(shape) + 1:
            if v.shape[0] != 1:
                raise UnsupportedModel(f"a constant of shape {v.shape} does not broadcast to {shape}")
            v = v[0]
        try:
            return np.broadcast_to(v, shape).reshape(-1).copy()
        except ValueError:
            raise UnsupportedModel(f"a constant of shape {v.shape} does not broadcast to {shape}") from None

    pending_matmul: Linear | None = None  # MatMul waiting for its Add (a bias)
    for node in graph.node:
        op = node.op_type
        if op == "Constant":
            consts[node.output[0]] = numpy_helper.to_array(attr(node, "value", None))
            continue
        if all(i in consts or i == "" for i in node.input):
            if op in ("Identity", "Cast"):
                consts[node.output[0]] = consts[node.input[0]]
                continue
            raise unsupported(node, "a constant subgraph")
        var = [i for i in node.input if i and i not in consts]
        if var != [current]:
            raise UnsupportedModel(f"{where(node)} ({op}) is not on a single sequential chain; only sequential graphs are read")
        if pending_matmul is not None and op != "Add":
            layers.append(pending_matmul)
            pending_matmul = None
        if op == "Gemm":
            if node.input[0] != current or attr(node, "transA", 0):
                raise unsupported(node, "transposed or constant first input")
            W = consts[node.input[1]].astype(np.float64)
            W = W if attr(node, "transB", 0) else W.T  # (out, in)
            b = consts[node.input[2]].astype(np.float64) if len(node.input) > 2 and node.input[2] else np.zeros(W.shape[0])
            if len(shape) != 1 or shape[0] != W.shape[1]:
                raise unsupported(node, f"a Gemm of {W.shape[::-1]} on a tensor of shape {shape}")
            layers.append(Linear(attr(node, "alpha", 1.0) * W, attr(node, "beta", 1.0) * np.broadcast_to(b, (1, W.shape[0])).ravel()))
            shape = (W.shape[0],)
        elif op == "MatMul":
            W = consts[node.input[1]].astype(np.float64)
            if node.input[0] != current or W.ndim != 2 or len(shape) != 1 or shape[0] != W.shape[0]:
                raise unsupported(node, f"only x·W with x flat ({shape}) and a constant 2-d W")
            pending_matmul = Linear(W.T, np.zeros(W.shape[1]))
            shape = (W.shape[1],)
        elif op in ("Add", "Sub", "Mul", "Div"):
            if op in ("Sub", "Div") and node.input[0] != current:
                raise unsupported(node, "the variable as second operand")
            v = full(consts[node.input[1] if node.input[0] == current else node.input[0]])
            if op == "Add" and pending_matmul is not None:
                pending_matmul = Linear(pending_matmul.W, pending_matmul.b + torch.as_tensor(v))
            else:
                if pending_matmul is not None:
                    layers.append(pending_matmul)
                    pending_matmul = None
                one, zero = np.ones_like(v), np.zeros_like(v)
                scale, shift = {"Add": (one, v), "Sub": (one, -v), "Mul": (v, zero), "Div": (1.0 / v, zero)}[op]
                layers.append(Scale(scale, shift))
        elif op == "Conv":
            if len(shape) != 3:
                raise unsupported(node, f"a 2-d Conv on a tensor of shape {shape}")
            w = consts[node.input[1]].astype(np.float64)
            if w.ndim != 4:
                raise unsupported(node, "only 2-d convolutions")
            b = consts[node.input[2]].astype(np.float64) if len(node.input) > 2 and node.input[2] else np.zeros(w.shape[0])
            pads = list(attr(node, "pads", [0, 0, 0, 0]))
            if attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") or pads[0] != pads[2] or pads[1] != pads[3]:
                raise unsupported(node, "auto_pad or asymmetric padding")
            conv = Conv(w, b, shape, tuple(attr(node, "strides", [1, 1])), (pads[0], pads[1]),
                        tuple(attr(node, "dilations", [1, 1])), attr(node, "group", 1))
            layers.append(conv)
            shape = conv.out_shape
        elif op == "BatchNormalization":
            scale, bias, mean, var_ = (consts[i].astype(np.float64) for i in node.input[1:5])
            a = scale / np.sqrt(var_ + attr(node, "epsilon", 1e-5))
            layers.append(Scale(_per_unit(a, shape), _per_unit(bias - mean * a, shape)))
        elif op == "Relu":
            layers.append(ReLU(int(np.prod(shape)), source=node.input[0]))
        elif op == "Flatten":
            axis = attr(node, "axis", 1)
            full_shape = ((1,) if batch else ()) + shape
            axis = axis + len(full_shape) if axis < 0 else axis
            if batch and axis != 1:
                raise unsupported(node, f"Flatten over the batch axis (axis={axis})")
            shape = (int(np.prod(full_shape[axis:])),) if batch else (int(np.prod(full_shape[:axis])), int(np.prod(full_shape[axis:])))
        elif op == "Reshape":
            target = [int(d) for d in consts[node.input[1]]]
            full_shape = ((1,) if batch else ()) + shape
            target = [full_shape[i] if d == 0 else d for i, d in enumerate(target)]
            if -1 in target:
                known = int(np.prod([d for d in target if d != -1]))
                target[target.index(-1)] = int(np.prod(full_shape)) // known
            if int(np.prod(target)) != int(np.prod(full_shape)):
                raise unsupported(node, f"reshape of {full_shape} to {target}")
            if batch:
                if target[0] != 1:
                    raise unsupported(node, f"a reshape that moves the batch axis ({target})")
                target = target[1:]
            shape = tuple(target)
        elif op in ("Identity", "Dropout"):
            pass
        else:
            raise unsupported(node)
        current = node.output[0]
    if pending_matmul is not None:
        layers.append(pending_matmul)
    if current != graph.output[0].name:
        raise UnsupportedModel("the graph output is not the end of its sequential chain")
    return Network(input_shape, layers)


def read(model: Any, input_shape: Sequence[int] | None = None) -> Network:
    """A Network from a Network, an nn.Module (needs `input_shape`), or an ONNX path/bytes/ModelProto."""
    if isinstance(model, Network):
        return model
    import torch.nn as nn

    if isinstance(model, nn.Module):
        if input_shape is None:
            raise ValueError("reading a torch model needs its input_shape (without the batch axis)")
        return from_torch(model, input_shape)
    return from_onnx(model)
