"""Smooth gate work left in a forward: what no walk over a model's classes can see.

`x = F.gelu(x)` in some forward is no module and no attribute, so `to_gates` cannot convert it, the `Hardener`
cannot anneal it and `to_relu` cannot swap it: a model "hardened" and "swapped" would still compute GELU there. The
same holds for an activation module of a class nothing here names that computes a gate by its own formula (GPT-2's
`NewGELUActivation`: 0.5x(1 + tanh(...))). The one way to find such work is to run the forward and watch:
`smooth_calls` runs one no-grad forward in eval mode under a `TorchFunctionMode` that records, with the module whose
forward made it, every F.gelu / F.silu / F.mish call, and every elementwise tanh, sigmoid, erf, exp, softplus call
made inside an activation module that computes a gate (`pipeline.recognize`: by what it computes) but that the caller
does not cover. A Softmax, a LayerNorm or a Tanh activation is no gate: its work is not recorded.

`probe_inputs` gives the input: the caller's `example`, or a zero batch of two read from the model: a declared input
shape (a module's `input_shape`, `img_size` or a config's `image_size`, timm's `pretrained_cfg`), an nn.Linear's
in_features, an nn.Embedding's ids, or a convolution's in_channels on a few square sizes tried in turn. Only where
none runs is the caller told, in one line, to pass `example=`. `to_gates`, the `Hardener`, `to_relu`,
`swap_report` and `analysis.api.check` all use it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from . import gates, recognize

PROBE_BATCH = 2  # rows of the zero input read from the first layer (2: a batch, for BatchNorm-like layers in eval)
PROBE_TOKENS = 4  # sequence length of the probe for a model whose first layer is an nn.Embedding
# Spatial sizes tried, in turn, for a model that starts with a convolution and declares no input size: 32 fits
# CIFAR-sized stems and a stride-32 backbone (ResNet, ConvNeXt), 224 ImageNet-sized ones.
PROBE_SIZES = (32, 64, 224)
# Elementwise functions that carry a gate's smooth work inside an activation's own code (as the function mode names
# them: torch.*, Tensor methods, F.*)
SMOOTH_WORK = frozenset({"tanh", "tanh_", "sigmoid", "sigmoid_", "erf", "erf_", "erfc", "exp", "exp_", "expm1", "softplus",
                         "gelu", "silu", "mish", "logistic", "special_expit", "expit", "ndtr", "log_ndtr", "erfcx",
                         # a hard gate's clip: timm's own hard_swish is x·relu6(x + 3)/6
                         "hardswish", "hardswish_", "hardsigmoid", "hardsigmoid_", "relu6", "hardtanh", "hardtanh_",
                         "clamp", "clamp_", "clip", "clip_"})


def gate_function(fn: Any) -> str | None:
    """The family of a gate function (`GateFamily.functions`, by identity: attribute values need not be hashable):
    converted when a module holds one as an attribute, reported when a forward calls one; None for others."""
    return gates.of_function(fn)


def function_name(fn: Any) -> str:
    if isinstance(fn, functools.partial):
        kw = ", ".join(f"{k}={v!r}" for k, v in fn.keywords.items())
        return f"partial(F.{fn.func.__name__}{', ' + kw if kw else ''})"
    return f"F.{getattr(fn, '__name__', repr(fn))}"


@dataclass(frozen=True)
class Call:
    """A gate function called by the forward of module `fqn` ("" = the model itself) of class `owner`, or the smooth
    work of an activation module that computes a gate (`computes`: what `recognize.match` found it computes)."""

    fqn: str
    owner: str
    name: str  # "F.gelu", "F.gelu(approximate='tanh')", or "torch.tanh, torch.pow" inside a gate-like module
    computes: str = ""

    def where(self) -> str:
        return f"`{self.fqn or '(root)'}` ({self.owner}{', which ' + self.computes if self.computes else ''})"

    def describe(self) -> str:
        return f"{self.name} in {self.where()}"


@dataclass(frozen=True)
class Probed:
    """What one probe found: `calls` (None: the forward was not run, `how` says why) and how it ran."""

    calls: list[Call] | None
    how: str


class _Recorder(TorchFunctionMode):
    """Records gate-function calls made while no module on the stack is `covered` (a site that something else
    converts, swaps or reports), and the smooth work done inside a gate-like module (`gate_like`: id → what it
    computes) that is not covered."""

    def __init__(self, stack: list[tuple[str, nn.Module]], covered: Callable[[nn.Module], bool],
                 gate_like: dict[int, str]):
        super().__init__()
        self.stack, self.covered, self.gate_like = stack, covered, gate_like
        self.found: dict[Call, None] = {}
        self.work: dict[tuple[str, str, str], dict[str, None]] = {}  # gate-like module -> the smooth functions it called

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.stack and id(self.stack[-1][1]) in self.gate_like and _short(func) in SMOOTH_WORK \
                and not any(self.covered(m) for _, m in self.stack):
            fqn, owner = self.stack[-1]
            self.work.setdefault((fqn, type(owner).__name__, self.gate_like[id(owner)]), {})[f"torch.{_short(func)}"] = None
        elif gate_function(func) is not None and not any(self.covered(m) for _, m in self.stack):
            fqn, owner = self.stack[-1] if self.stack else ("", None)
            form = kwargs.get("approximate", "none")
            name = function_name(func) + (f"(approximate={form!r})" if form != "none" else "")
            self.found.setdefault(Call(fqn, type(owner).__name__, name), None)
        return func(*args, **kwargs)

    def calls(self) -> list[Call]:
        return list(self.found) + [Call(fqn, owner, ", ".join(names), computes) for (fqn, owner, computes), names in self.work.items()]


def _short(func: Any) -> str:
    return getattr(func, "__name__", "").removeprefix("__").removesuffix("__")


def gate_like_modules(model: nn.Module, covered: Callable[[nn.Module], bool]) -> dict[int, str]:
    """id → what it computes, for every module of `model` that computes a gate by its own formula
    (`recognize.match`) and is not `covered`."""
    out = {}
    for m in model.modules():
        if not covered(m) and recognize.candidate(m):
            found = recognize.match(m)
            if found is not None:
                out[id(m)] = found.describe()
    return out


def _run(model: nn.Module, example: Any, covered: Callable[[nn.Module], bool]) -> list[Call]:
    """One no-grad forward in eval mode (no running statistics move, no dropout) with every module's fqn on a
    stack; the modes are restored afterwards."""
    stack: list[tuple[str, nn.Module]] = []
    handles = []
    for name, m in model.named_modules():
        handles.append(m.register_forward_pre_hook(functools.partial(_push, stack, name)))
        handles.append(m.register_forward_hook(functools.partial(_pop, stack)))
    recorder = _Recorder(stack, covered, gate_like_modules(model, covered))
    modes = {m: m.training for m in model.modules()}
    model.eval()
    # the fused eval-mode kernels of nn.MultiheadAttention and nn.Transformer*Layer compute their GELU inside one op,
    # where no function call can be seen: the probe takes the unfused path (quantize/mha.py does the same for export)
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad(), recorder:
            model(*example) if isinstance(example, tuple) else model(example)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
        for h in handles:
            h.remove()
        for m, training in modes.items():
            m.training = training
    return recorder.calls()


def _push(stack: list, name: str, module: nn.Module, _args: Any) -> None:
    stack.append((name, module))


def _pop(stack: list, _module: nn.Module, _args: Any, _output: Any) -> None:
    stack.pop()  # returns None: the output is kept


def _declared_shape(model: nn.Module) -> tuple[tuple[int, ...], str] | None:
    """An input shape (without the batch) the model states itself, and where: a module's `input_shape` (this project's
    Normalize), a patch embedding's `img_size` with the in_channels of its convolution (timm), a Hugging Face config's
    `num_channels` and `image_size`, or timm's `pretrained_cfg["input_size"]`."""
    config = getattr(model, "config", None)
    if config is not None and isinstance(getattr(config, "image_size", None), (int, tuple, list)):
        size = getattr(config, "image_size")
        hw = (size, size) if isinstance(size, int) else tuple(size)
        return (int(getattr(config, "num_channels", 3)), *hw), "its config's num_channels and image_size"
    for fqn, m in model.named_modules():
        shape = getattr(m, "input_shape", None)
        if isinstance(shape, (tuple, list)) and shape and all(isinstance(v, int) for v in shape):
            return tuple(shape), f"`{fqn or '(root)'}`.input_shape"
        size = getattr(m, "img_size", None)
        conv = next((c for c in m.modules() if isinstance(c, nn.modules.conv._ConvNd)), None)
        if size is not None and conv is not None:
            hw = (size,) * (conv.weight.dim() - 2) if isinstance(size, int) else tuple(size)
            if all(isinstance(v, int) for v in hw):
                return (conv.in_channels, *hw), f"`{fqn}`.img_size and the in_channels of `{fqn}`'s convolution"
    cfg = getattr(model, "pretrained_cfg", None)
    if isinstance(cfg, dict) and isinstance(cfg.get("input_size"), (tuple, list)):
        return tuple(cfg["input_size"]), "its pretrained_cfg's input_size"
    return None


def probe_inputs(model: nn.Module) -> tuple[list[tuple[Any, str]], str]:
    """(zero input batches to try in turn, each with how it was read), and why there is none when the list is empty."""
    param = next((p for p in model.parameters() if p.is_floating_point()), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = param.dtype if param is not None else torch.float32
    tries: list[tuple[Any, str]] = []
    declared = _declared_shape(model)
    if declared is not None:
        shape, where = declared
        tries.append((torch.zeros(PROBE_BATCH, *shape, device=device, dtype=dtype),
                      f"a zero {[PROBE_BATCH, *shape]} input (from {where})"))
    for fqn, m in model.named_modules():
        where = f"`{fqn or '(root)'}`"
        if isinstance(m, nn.Linear) and not isinstance(m, nn.modules.lazy.LazyModuleMixin):
            x = torch.zeros(PROBE_BATCH, m.in_features, device=device, dtype=m.weight.dtype)
            return tries + [(x, f"a zero [{PROBE_BATCH}, {m.in_features}] input (the in_features of its first layer "
                                f"{where}, nn.Linear)")], ""
        if isinstance(m, nn.Embedding):
            x = torch.zeros(PROBE_BATCH, PROBE_TOKENS, device=device, dtype=torch.long)
            return tries + [(x, f"[{PROBE_BATCH}, {PROBE_TOKENS}] token ids 0 (its first layer {where} is nn.Embedding)")], ""
        if isinstance(m, nn.modules.conv._ConvNd) and not isinstance(m, nn.modules.lazy.LazyModuleMixin):
            dims = m.weight.dim() - 2
            for size in PROBE_SIZES:
                shape = [PROBE_BATCH, m.in_channels, *([size] * dims)]
                tries.append((torch.zeros(*shape, device=device, dtype=m.weight.dtype),
                              f"a zero {shape} input (the in_channels of its first layer {where}, {type(m).__name__}, "
                              f"at size {size})"))
            return tries, f"its forward failed on every size tried for its first layer {where} ({type(m).__name__})"
        if isinstance(m, (nn.RNNBase, nn.MultiheadAttention)):
            return tries, f"its first layer {where} ({type(m).__name__}) does not say the input's size"
    return tries, "it has no Linear, Embedding or convolution to read the input's size from"


def smooth_calls(model: nn.Module, example: Any = None, covered: Callable[[nn.Module], bool] = lambda m: False) -> Probed:
    """Gate functions called inside forward() outside `covered` modules, and the smooth work of gate-like modules that
    are not covered, found by one forward on `example` (a tensor, or a tuple of forward's arguments) or on the inputs
    `probe_inputs` reads from the model, tried in turn. A forward that fails on every input read from the model is
    reported as not run (the model wants another input: pass `example=`); one that fails on the caller's own example
    raises."""
    if example is not None:
        return Probed(_run(model, example, covered), "the example given")
    tries, why = probe_inputs(model)
    failed = ""
    for x, how in tries:
        try:
            return Probed(_run(model, x, covered), how)
        except Exception as e:  # the guess was wrong for this model: not an error of the caller's
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            failed = f"its forward on {how} failed ({type(e).__name__}: {first[:200]})"
    return Probed(None, (f"{why}; the last: {failed}" if why else failed) if failed else why)
