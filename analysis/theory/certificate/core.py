"""The certificate's building blocks: the constants of its float32 rounding model, the refusal, the channels,
`_Dev` (a value of the smooth network carrying one box per channel) and `_Call` (one torch function call as one
channel's rule sees it). The walk that drives them is `interpreter.py`; the rules are `rules/` and `activations.py`.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from pipeline import gates
from pipeline.gates import channel_axis, per_channel
# u, γ_n, the library's ulps, SAFETY and the dot product's bound (`dot_error`: GAMMA_SLACK·γ_{n+1}·(|w|·|x| + |b|)
# + (2n + 1)·UNDERFLOW for n products and a bias; a proof, so not doubled by SAFETY) have one home
# (`pipeline.numerics`); the rules import them from here under the certificate's names.
from pipeline.numerics import GAMMA_SLACK, SAFETY, UNDERFLOW, dot_error, gamma  # noqa: F401
from pipeline.numerics import LIBRARY_ULPS as ULP_ELEMENTWISE
from pipeline.numerics import U as U32

K_GATE = 16  # |fl(f_λ(x)) − f_λ(x)| ≤ K_GATE·u·|x| + UNDERFLOW for every gate family (module docstring)


def gate_rounding(x_abs):
    """The float32 evaluation error of a gate f_λ(x) = x·g(λx) at |x| ≤ x_abs: K_GATE·u·|x|, plus UNDERFLOW for a
    value flushed to 0 (the C++ kernel runs with flush-to-zero, `pipeline/kernels/lambda_gelu.cpp`; the CUDA kernels
    flush their exponential)."""
    return K_GATE * U32 * x_abs + UNDERFLOW


# The statements a certificate can make, for reports ({samples}: filled in by the check with the count it was given).
ABOUT = {
    "global": "any input, real arithmetic",
    "per_sample": "each validation input, real arithmetic",
    "float32": "each validation input, both networks evaluated in float32 by PyTorch on the CPU, rounding included",
    "float32_global": "each validation input, both networks in float32 by PyTorch on the CPU: the global bound plus both "
                      "networks' rounding on it",
    "float32_jacobian": "each of the first {samples} validation inputs (`check.float32_jacobian_samples`), both networks in float32 by "
                        "PyTorch on the CPU: the real-arithmetic bound plus each network's rounding carried through its own "
                        "Jacobian at the input (chain networks)",
}


class Refused(Exception):
    """No bound can be proved for this model (the message says why)."""


class _NoRule(Exception):
    """One channel has no rule for one function; `Any` decides whether that refuses everything."""


_INJECTED: dict[str, float] = {}  # c per family given by a caller of `global_bound` (tests inject wrong ones)


def gate_constant(gate: str = "phi") -> float:
    """c with sup_z |ReLU(z) − z·g(λz)| ≤ c/λ (`pipeline.gates`, nudged up so the bound stays sound)."""
    return _INJECTED[gate] if gate in _INJECTED else gates.sup_constant(gate)


@contextlib.contextmanager
def _injected(consts: Mapping[str, float] | None):
    saved = dict(_INJECTED)
    _INJECTED.update(consts or {})
    try:
        yield
    finally:
        _INJECTED.clear()
        _INJECTED.update(saved)


@functools.cache
def _gate_lipschitz(gate: str) -> float:
    """sup |d/dx x·g(λx)| (the same for every λ), from the sympy derivation, nudged up."""
    from .. import symbolic

    return float(symbolic.lipschitz_constant(gate).value) * (1 + 1e-9)


gates.on_change(lambda name, fam: _gate_lipschitz.cache_clear())  # a family registered anew or removed


def _per_unit(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Broadcast a [1] (per layer) or [C] (per channel) tensor against `like` along its channel axis, the
    gates' own convention (`pipeline.gates.per_channel`: dim 1, the last dim of [B, T, C] tokens)."""
    if value.numel() > 1 and (like.dim() < 2 or like.shape[channel_axis(like)] != value.numel()):
        raise Refused(f"per-channel λ of size {value.numel()} does not match activations of shape {tuple(like.shape)}")
    return per_channel(value, like)


def _inf_for_nan(t: torch.Tensor) -> torch.Tensor:
    """A box that became NaN (0·∞) is unknown: ∞, never silently 0."""
    return torch.nan_to_num(t, nan=math.inf, posinf=math.inf, neginf=-math.inf)


# ---------------------------------------------------------------------------------------------
# Channels, values with boxes, calls

@dataclass(frozen=True)
class _Channel:
    name: str
    sample: bool  # per-sample rules (use the smooth values z); else rules that hold around any point
    gate: str  # "swap": S's gate vs R's ReLU; "smooth": S̃'s gate vs S's; "relu": R̃'s ReLU vs R's
    rounding: bool  # adds float32 local rounding
    mag: int = -1  # the channel whose box bounds this channel's float32 values around z


GLOBAL_CHANNELS = (_Channel("exact", False, "swap", False),)
SAMPLE_CHANNELS = (
    _Channel("exact", True, "swap", False),
    _Channel("relu32", True, "swap", True, 1),
    _Channel("smooth32", True, "smooth", True, 2),
    _Channel("relu_rounding", False, "relu", True, 1),
)
EXACT, RELU32, SMOOTH32, RELU_ROUNDING = range(4)

# Functions that read metadata only: their result never depends on a value.
METADATA = {"shape", "ndim", "dtype", "device", "dim", "ndimension", "size", "numel", "__len__", "is_floating_point",
            "requires_grad", "is_cuda", "layout", "stride", "is_contiguous", "is_complex", "element_size", "names",
            "is_sparse", "is_quantized", "is_meta", "is_nested", "grad_fn", "is_leaf", "__format__", "__repr__",
            "data_ptr", "storage_offset", "_version", "is_mkldnn", "nelement"}


# In-place arithmetic and the out-of-place function whose rule bounds it (`_Dev.__torch_function__`)
INPLACE = {"add_": torch.add, "__iadd__": torch.add, "sub_": torch.sub, "__isub__": torch.sub, "mul_": torch.mul,
           "__imul__": torch.mul, "div_": torch.div, "__itruediv__": torch.div}


# Casts: the walk keeps its float64 value through a floating cast (real arithmetic has no dtypes); `rules.shape._to`
# adds what the float32 network rounds there
CASTS = ("to", "float", "double", "half", "bfloat16", "type", "type_as")


def _name(func: Callable) -> str:
    name = getattr(func, "__name__", repr(func))
    if name in ("__get__", "__set__"):  # a property of Tensor (shape, dtype, ...)
        name = getattr(getattr(func, "__self__", None), "__name__", name)
    return name


def _map(obj: Any, fn: Callable[[_Dev], Any]) -> Any:
    if isinstance(obj, _Dev):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    return obj


def _devs(obj: Any) -> list[_Dev]:
    out: list[_Dev] = []
    _map(obj, lambda d: out.append(d))
    return out


class _Dev(torch.Tensor):
    """A value z of the smooth network with one box per channel; see the module docstring."""

    value: torch.Tensor
    boxes: tuple[torch.Tensor, ...]
    walk: Any  # interpreter._Walk (which imports this module)
    signed: tuple[torch.Tensor, torch.Tensor] | None  # the exact change's signed centre and radius (`signed.py`)

    @staticmethod
    def __new__(cls, value: torch.Tensor, boxes: tuple[torch.Tensor, ...], walk: Any):
        t = torch.Tensor._make_subclass(cls, value)
        t.value, t.boxes, t.walk, t.signed = value, boxes, walk, None
        return t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        devs = _devs((args, kwargs))
        plain = lambda d: d.value
        name = _name(func)
        if name in INPLACE and isinstance(args[0], _Dev):
            # timm's `x += shortcut`: the out-of-place op and its rule (which reads x as it was), then the result goes
            # into x's own tensor and boxes, since `x.add_(y)` may be used without its return value
            base = INPLACE[name]
            res = devs[0].walk.apply(base.__name__, base, args, kwargs, base(*_map(args, plain), **_map(kwargs, plain)), devs)
            args[0].value.copy_(res.value)
            args[0].boxes, args[0].signed = res.boxes, res.signed
            return args[0]
        out = func(*_map(args, plain), **_map(kwargs, plain))
        if (name in CASTS and isinstance(args[0], _Dev) and args[0].value.is_floating_point()
                and isinstance(out, torch.Tensor) and out.is_floating_point() and out.dtype != args[0].value.dtype):
            out = args[0].value.to(device=out.device, copy=True)
        if name in METADATA or not devs:
            return out
        return devs[0].walk.apply(name, func, args, kwargs, out, devs)

    def __repr__(self) -> str:  # a _Dev in an error message
        return f"_Dev(shape={tuple(self.value.shape)})"


@dataclass
class _Call:
    """One torch function call as one channel's rule sees it."""

    walk: Any  # interpreter._Walk (which imports this module)
    ci: int
    ch: _Channel
    name: str
    func: Callable
    args: tuple
    kwargs: dict
    out: Any

    def box(self, a: Any) -> torch.Tensor:
        """The box of an argument in this channel: 0 for a constant (a parameter, a number)."""
        if isinstance(a, _Dev):
            return a.boxes[self.ci]
        if isinstance(a, torch.Tensor):
            return torch.zeros(a.shape, dtype=torch.float64)
        return torch.zeros((), dtype=torch.float64)

    def value(self, a: Any) -> Any:
        return a.value if isinstance(a, _Dev) else a

    def mag(self, a: Any) -> torch.Tensor:
        """A bound on |a| as this channel's float32 network holds it."""
        if isinstance(a, _Dev):
            return a.value.abs().to(torch.float64) + a.boxes[self.ch.mag]
        if isinstance(a, torch.Tensor):
            return a.detach().abs().to(torch.float64)
        return torch.tensor(abs(float(a)), dtype=torch.float64)

    def bind(self, names: tuple[str, ...], defaults: dict[str, Any]) -> dict[str, Any]:
        """Positional and keyword arguments by name (the functional signature of the op)."""
        out = dict(defaults)
        out.update(zip(names, self.args))
        out.update(self.kwargs)
        return out
