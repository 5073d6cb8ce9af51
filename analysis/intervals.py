"""Interval bound propagation (IBP) through feed-forward ReLU networks.

A network is a flat list of layers acting on a flat float64 vector (C-order flattening of
the model's input, which is also how VNN-LIB numbers the inputs ``X_i``):

- ``Affine(W, b)``: ``y = W @ x + b`` (``nn.Linear``, ONNX ``Gemm`` / ``MatMul`` + ``Add``);
- ``Scale(scale, shift)``: ``y = x * scale + shift`` elementwise (an input normalization);
- ``ReLU()``.

``layers_from_torch`` reads an ``nn.Sequential`` of ``nn.Linear`` / ``nn.ReLU`` / ``nn.Flatten``
and any module that has tensor attributes ``scale`` and ``shift`` (taken to compute
``x * scale + shift``); ``layers_from_onnx`` reads the same kind of network from an ONNX graph.
``interval_bounds`` returns the pre-activation interval of every ReLU layer and the output
interval for an input box; a ReLU is *unstable* when its interval straddles zero
(``lb < 0 < ub``), i.e. neither phase is fixed over the box, which is what makes exact
verification branch.

All arithmetic is float64. Affine layers use ``W⁺ l + W⁻ u`` (not centre/radius) so that the
result matches a per-neuron loop up to summation order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np

__all__ = [
    "Affine",
    "Scale",
    "ReLU",
    "Layer",
    "IntervalBounds",
    "as_layers",
    "layers_from_torch",
    "layers_from_onnx",
    "canonical_layers",
    "forward",
    "interval_bounds",
    "count_unstable",
]


@dataclass(frozen=True, eq=False)
class Affine:
    """``y = W @ x + b``; ``W`` is (out, in), ``b`` is (out,), both float64."""

    W: np.ndarray
    b: np.ndarray

    def __post_init__(self) -> None:
        W = np.asarray(_to_numpy(self.W), dtype=np.float64)
        b = np.asarray(_to_numpy(self.b), dtype=np.float64).reshape(-1)
        if W.ndim != 2 or b.shape != (W.shape[0],):
            raise ValueError(f"Affine needs W (out, in) and b (out,), got {W.shape} and {b.shape}")
        object.__setattr__(self, "W", W)
        object.__setattr__(self, "b", b)

    @property
    def in_features(self) -> int:
        return self.W.shape[1]

    @property
    def out_features(self) -> int:
        return self.W.shape[0]


@dataclass(frozen=True, eq=False)
class Scale:
    """Elementwise ``y = x * scale + shift``; both flat float64 arrays of the input's size."""

    scale: np.ndarray
    shift: np.ndarray

    def __post_init__(self) -> None:
        scale = np.asarray(_to_numpy(self.scale), dtype=np.float64).reshape(-1)
        shift = np.asarray(_to_numpy(self.shift), dtype=np.float64).reshape(-1)
        if scale.shape != shift.shape:
            raise ValueError(f"Scale needs scale and shift of one size, got {scale.shape}, {shift.shape}")
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "shift", shift)


@dataclass(frozen=True)
class ReLU:
    pass


Layer = Union[Affine, Scale, ReLU]


def _to_numpy(a: Any) -> np.ndarray:
    if hasattr(a, "detach"):  # torch tensor
        return a.detach().cpu().double().numpy()
    return np.asarray(a, dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# readers
# ---------------------------------------------------------------------------------------------


def _is_affine_normalize(module: Any) -> bool:
    return hasattr(module, "scale") and hasattr(module, "shift")


def layers_from_torch(model: Any, input_shape: Sequence[int] | None = None) -> list[Layer]:
    """Layers of an ``nn.Sequential`` (nested Sequentials are walked in order).

    ``input_shape`` (without the batch dimension) is needed to broadcast the ``scale`` /
    ``shift`` of a normalization module that comes before ``Flatten`` (e.g. per-channel
    ``(C, 1, 1)``); a normalization after flattening broadcasts over its own size.
    Dropout and Identity are skipped (the model is read as in eval mode).
    """
    import torch.nn as nn

    layers: list[Layer] = []
    shape: tuple[int, ...] | None = tuple(input_shape) if input_shape is not None else None
    width: int | None = int(np.prod(shape)) if shape is not None else None

    def walk(module: nn.Module) -> None:
        nonlocal shape, width
        if isinstance(module, nn.Sequential):
            for child in module:
                walk(child)
        elif _is_affine_normalize(module):
            scale = _to_numpy(module.scale)
            shift = _to_numpy(module.shift)
            if shape is None and width is None:
                # flat normalization without a known input: its own size decides
                n = max(scale.size, shift.size)
                target: tuple[int, ...] = (n,)
            else:
                target = shape if shape is not None else (width,)
            layers.append(Scale(np.broadcast_to(scale, target).ravel(),
                                np.broadcast_to(shift, target).ravel()))
            if width is None:
                width = int(np.prod(target))
        elif isinstance(module, nn.Linear):
            if width is not None and module.in_features != width:
                raise ValueError(f"Linear expects {module.in_features} inputs, the network has {width} here")
            bias = module.bias if module.bias is not None else np.zeros(module.out_features)
            layers.append(Affine(module.weight, bias))
            shape, width = (module.out_features,), module.out_features
        elif isinstance(module, nn.ReLU):
            layers.append(ReLU())
        elif isinstance(module, nn.Flatten):
            if module.start_dim != 1 or module.end_dim != -1:
                raise ValueError("only nn.Flatten(start_dim=1, end_dim=-1) is supported")
            if shape is not None:
                shape = (int(np.prod(shape)),)
        elif isinstance(module, (nn.Identity, nn.Dropout)):
            pass
        else:
            raise TypeError(
                f"unsupported module {type(module).__name__}; supported: nn.Sequential, nn.Linear, "
                "nn.ReLU, nn.Flatten, nn.Identity, nn.Dropout, and modules with `scale` and `shift`"
            )

    walk(model)
    return layers


def layers_from_onnx(path: str | Path) -> list[Layer]:
    """Layers of a sequential ONNX graph of Gemm / MatMul / Add / Sub / Mul / Div (by constants),
    Relu, Flatten, Reshape, Identity and Constant nodes, with one float input and one output.

    Anything else (Gelu, Erf, Conv, ...) raises ``NotImplementedError`` naming the op.
    """
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    consts: dict[str, np.ndarray] = {
        init.name: numpy_helper.to_array(init).astype(np.float64) for init in graph.initializer
    }
    inputs = [i for i in graph.input if i.name not in consts]
    if len(inputs) != 1 or len(graph.output) != 1:
        raise NotImplementedError("only graphs with one input and one output are supported")
    current = inputs[0].name
    # shape of the current tensor, batch dimension included (a free batch counts as 1)
    shape: tuple[int, ...] = tuple(d.dim_value if d.dim_value > 0 else 1
                                   for d in inputs[0].type.tensor_type.shape.dim)
    layers: list[Layer] = []

    def attr(node: Any, name: str, default: Any) -> Any:
        for a in node.attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return default

    for node in graph.node:
        op = node.op_type
        if op == "Constant":
            consts[node.output[0]] = numpy_helper.to_array(attr(node, "value", None)).astype(np.float64)
            continue
        if all(i in consts or i == "" for i in node.input):
            if op in ("Identity", "Cast"):  # constant plumbing around shape tensors
                consts[node.output[0]] = consts[node.input[0]]
                continue
            raise NotImplementedError(f"constant subgraph op {op} is not supported")
        var_inputs = [i for i in node.input if i and i not in consts]
        if var_inputs != [current]:
            raise NotImplementedError(f"node {node.name or op} is not on the sequential chain")
        if op == "Gemm":
            if node.input[0] != current or attr(node, "transA", 0):
                raise NotImplementedError("Gemm with a transposed or constant first input")
            W = consts[node.input[1]]
            W = W if attr(node, "transB", 0) else W.T  # now (out, in)
            alpha, beta = attr(node, "alpha", 1.0), attr(node, "beta", 1.0)
            has_bias = len(node.input) > 2 and node.input[2]
            b = consts[node.input[2]] if has_bias else np.zeros(W.shape[0])
            layers.append(Affine(alpha * W, beta * np.broadcast_to(b, (1, W.shape[0])).ravel()))
            shape = (shape[0], W.shape[0])
        elif op == "MatMul":
            if node.input[0] != current:
                raise NotImplementedError("MatMul with a constant first input")
            W = consts[node.input[1]]
            if W.ndim != 2 or int(np.prod(shape)) != W.shape[0]:
                raise NotImplementedError(f"MatMul of {shape} by {W.shape} is not a dense layer")
            layers.append(Affine(W.T, np.zeros(W.shape[1])))
            shape = shape[:-1] + (W.shape[1],)
        elif op in ("Add", "Sub", "Mul", "Div"):
            if op in ("Sub", "Div") and node.input[0] != current:
                raise NotImplementedError(f"{op} with the variable as second operand")
            other = consts[node.input[1] if node.input[0] == current else node.input[0]]
            if np.broadcast_shapes(other.shape, shape) != shape:
                raise NotImplementedError(f"{op} broadcasts {shape} to a larger shape")
            v = np.broadcast_to(other, shape).ravel()
            one, zero = np.ones_like(v), np.zeros_like(v)
            layers.append({"Add": Scale(one, v), "Sub": Scale(one, -v),
                           "Mul": Scale(v, zero), "Div": Scale(1.0 / v, zero)}[op])
        elif op == "Relu":
            layers.append(ReLU())
        elif op in ("Flatten", "Reshape", "Identity", "Dropout"):
            # the flat C-order vector is unchanged; only its view differs
            if op == "Flatten":
                axis = attr(node, "axis", 1)
                axis = axis + len(shape) if axis < 0 else axis
                shape = (int(np.prod(shape[:axis])), int(np.prod(shape[axis:])))
            elif op == "Reshape":
                target = [int(d) for d in consts[node.input[1]]]
                target = [shape[i] if d == 0 else d for i, d in enumerate(target)]
                if -1 in target:
                    known = int(np.prod([d for d in target if d != -1]))
                    target[target.index(-1)] = int(np.prod(shape)) // known
                shape = tuple(target)
        else:
            raise NotImplementedError(f"ONNX op {op} is not supported by layers_from_onnx")
        current = node.output[0]
    if current != graph.output[0].name:
        raise NotImplementedError("graph output is not the end of the sequential chain")
    return layers


def as_layers(net: Any, input_shape: Sequence[int] | None = None) -> list[Layer]:
    """Normalize a network description to a list of layers.

    Accepts an ``nn.Module`` (see ``layers_from_torch``), a path to an ``.onnx`` file, or an
    iterable whose items are ``Affine`` / ``Scale`` / ``ReLU``, ``(W, b)`` pairs (numpy or torch),
    the string ``"relu"``, or single torch modules.
    """
    if isinstance(net, (str, Path)):
        return layers_from_onnx(net)
    try:
        import torch.nn as nn

        if isinstance(net, nn.Module):
            return layers_from_torch(net, input_shape)
    except ImportError:  # pragma: no cover - torch is a hard dependency of the project
        pass
    out: list[Layer] = []
    for item in net:
        if isinstance(item, (Affine, Scale, ReLU)):
            out.append(item)
        elif isinstance(item, str) and item.lower() == "relu":
            out.append(ReLU())
        elif isinstance(item, tuple) and len(item) == 2:
            out.append(Affine(*item))
        else:
            out.extend(layers_from_torch(item, input_shape))
    return out


def canonical_layers(layers: Iterable[Layer]) -> list[Layer]:
    """Compose every run of Affine / Scale layers into one Affine (exact in float64), so the
    result alternates ``Affine, ReLU, Affine, ..., Affine``. Used by the MILP encoding and by
    the ONNX export that folds an input normalization into the first Linear layer."""
    out: list[Layer] = []
    pending: Affine | Scale | None = None
    for layer in layers:
        if isinstance(layer, ReLU):
            if pending is None:
                raise ValueError("a ReLU must follow an affine layer")
            out.append(_as_affine(pending))
            out.append(layer)
            pending = None
        else:
            pending = layer if pending is None else _compose(pending, layer)
    if pending is not None:
        out.append(_as_affine(pending))
    return out


def _as_affine(layer: Affine | Scale) -> Affine:
    if isinstance(layer, Affine):
        return layer
    return Affine(np.diag(layer.scale), layer.shift)


def _compose(first: Affine | Scale, second: Affine | Scale) -> Affine | Scale:
    """``second(first(x))``."""
    if isinstance(first, Scale) and isinstance(second, Scale):
        return Scale(first.scale * second.scale, first.shift * second.scale + second.shift)
    if isinstance(first, Scale):  # W (x*s + t) + b = (W*s) x + (W t + b)
        return Affine(second.W * first.scale[None, :], second.W @ first.shift + second.b)
    if isinstance(second, Scale):  # (W x + b)*s + t
        return Affine(first.W * second.scale[:, None], first.b * second.scale + second.shift)
    return Affine(second.W @ first.W, second.W @ first.b + second.b)


# ---------------------------------------------------------------------------------------------
# evaluation and bounds
# ---------------------------------------------------------------------------------------------


def forward(layers: Sequence[Layer], x: np.ndarray) -> np.ndarray:
    """Exact float64 evaluation; ``x`` is flat (n,) or a batch (m, n)."""
    h = np.asarray(x, dtype=np.float64)
    for layer in layers:
        if isinstance(layer, Affine):
            h = h @ layer.W.T + layer.b
        elif isinstance(layer, Scale):
            h = h * layer.scale + layer.shift
        else:
            h = np.maximum(h, 0.0)
    return h


@dataclass(frozen=True)
class IntervalBounds:
    """``pre_activation[k]`` is the (lb, ub) of the input to the k-th ReLU layer;
    ``output`` the (lb, ub) of the network's output."""

    pre_activation: list[tuple[np.ndarray, np.ndarray]]
    output: tuple[np.ndarray, np.ndarray]

    @property
    def unstable_per_layer(self) -> list[int]:
        return [int(np.count_nonzero((lb < 0) & (ub > 0))) for lb, ub in self.pre_activation]

    @property
    def num_unstable(self) -> int:
        return sum(self.unstable_per_layer)

    @property
    def num_relus(self) -> int:
        return sum(lb.size for lb, _ in self.pre_activation)


def _affine_bounds(W: np.ndarray, b: np.ndarray, lb: np.ndarray, ub: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    Wp, Wn = np.maximum(W, 0.0), np.minimum(W, 0.0)
    return Wp @ lb + Wn @ ub + b, Wp @ ub + Wn @ lb + b


def interval_bounds(net: Any, lb: np.ndarray, ub: np.ndarray,
                    input_shape: Sequence[int] | None = None) -> IntervalBounds:
    """IBP over the input box ``[lb, ub]`` (flat arrays in the network's input units)."""
    layers = as_layers(net, input_shape)
    lo = np.asarray(lb, dtype=np.float64).reshape(-1)
    hi = np.asarray(ub, dtype=np.float64).reshape(-1)
    if lo.shape != hi.shape:
        raise ValueError(f"lb and ub differ in size: {lo.shape} vs {hi.shape}")
    if np.any(lo > hi):
        raise ValueError("empty box: some lb > ub")
    pre: list[tuple[np.ndarray, np.ndarray]] = []
    for layer in layers:
        if isinstance(layer, Affine):
            if layer.in_features != lo.size:
                raise ValueError(f"layer expects {layer.in_features} inputs, got {lo.size}")
            lo, hi = _affine_bounds(layer.W, layer.b, lo, hi)
        elif isinstance(layer, Scale):
            a, c = lo * layer.scale + layer.shift, hi * layer.scale + layer.shift
            lo, hi = np.minimum(a, c), np.maximum(a, c)
        else:
            pre.append((lo, hi))
            lo, hi = np.maximum(lo, 0.0), np.maximum(hi, 0.0)
    return IntervalBounds(pre_activation=pre, output=(lo, hi))


def count_unstable(net: Any, lb: np.ndarray, ub: np.ndarray,
                   input_shape: Sequence[int] | None = None) -> int:
    """Number of ReLUs whose IBP pre-activation interval has ``lb < 0 < ub``."""
    return interval_bounds(net, lb, ub, input_shape).num_unstable
