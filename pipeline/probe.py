"""Gate functions called inside forward(): what no walk over a model's modules can see.

`x = F.gelu(x)` in some forward is no module and no attribute, so `to_gates` cannot convert it, the `Hardener`
cannot anneal it and `to_relu` cannot swap it: a model "hardened" and "swapped" would still compute GELU there.
The one way to find such a call is to run the forward and watch: `smooth_calls` runs one no-grad forward in eval
mode under a `TorchFunctionMode` that records every F.gelu / F.silu / F.mish call with the module whose forward made
it. `probe_input` gives the input: the caller's `example`, or a zero batch of two read from the model's first layer
(an nn.Linear's in_features, an nn.Embedding's ids) where one can be read; a convolution's spatial size cannot, and
then the caller is told to pass `example=`. `to_gates`, the `Hardener`, `to_relu` and `swap_report` all use it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from . import gates

PROBE_BATCH = 2  # rows of the zero input read from the first layer (2: a batch, for BatchNorm-like layers in eval)
PROBE_TOKENS = 4  # sequence length of the probe for a model whose first layer is an nn.Embedding


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
    """A gate function called by the forward of module `fqn` ("" = the model itself) of class `owner`."""

    fqn: str
    owner: str
    name: str  # "F.gelu", or "F.gelu(approximate='tanh')"

    def where(self) -> str:
        return f"`{self.fqn or '(root)'}` ({self.owner})"


@dataclass(frozen=True)
class Probed:
    """What one probe found: `calls` (None: the forward was not run, `how` says why) and how it ran."""

    calls: list[Call] | None
    how: str


class _Recorder(TorchFunctionMode):
    """Records gate-function calls made while no module on the stack is `covered` (a site that something else
    converts, swaps or reports)."""

    def __init__(self, stack: list[tuple[str, nn.Module]], covered: Callable[[nn.Module], bool]):
        super().__init__()
        self.stack, self.covered, self.found = stack, covered, {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if gate_function(func) is not None and not any(self.covered(m) for _, m in self.stack):
            fqn, owner = self.stack[-1] if self.stack else ("", None)
            form = kwargs.get("approximate", "none")
            name = function_name(func) + (f"(approximate={form!r})" if form != "none" else "")
            self.found.setdefault(Call(fqn, type(owner).__name__, name), None)
        return func(*args, **kwargs)


def _run(model: nn.Module, example: Any, covered: Callable[[nn.Module], bool]) -> list[Call]:
    """One no-grad forward in eval mode (no running statistics move, no dropout) with every module's fqn on a
    stack; the modes are restored afterwards."""
    stack: list[tuple[str, nn.Module]] = []
    handles = []
    for name, m in model.named_modules():
        handles.append(m.register_forward_pre_hook(functools.partial(_push, stack, name)))
        handles.append(m.register_forward_hook(functools.partial(_pop, stack)))
    recorder = _Recorder(stack, covered)
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
    return list(recorder.found)


def _push(stack: list, name: str, module: nn.Module, _args: Any) -> None:
    stack.append((name, module))


def _pop(stack: list, _module: nn.Module, _args: Any, _output: Any) -> None:
    stack.pop()  # returns None: the output is kept


def probe_input(model: nn.Module) -> tuple[torch.Tensor | None, str]:
    """(a zero input batch read from the first layer, how it was read), or (None, why none can be)."""
    param = next((p for p in model.parameters() if p.is_floating_point()), None)
    device = param.device if param is not None else torch.device("cpu")
    for fqn, m in model.named_modules():
        where = f"`{fqn or '(root)'}`"
        if isinstance(m, nn.Linear) and not isinstance(m, nn.modules.lazy.LazyModuleMixin):
            x = torch.zeros(PROBE_BATCH, m.in_features, device=device, dtype=m.weight.dtype)
            return x, f"a zero [{PROBE_BATCH}, {m.in_features}] input (the in_features of its first layer {where}, nn.Linear)"
        if isinstance(m, nn.Embedding):
            x = torch.zeros(PROBE_BATCH, PROBE_TOKENS, device=device, dtype=torch.long)
            return x, f"[{PROBE_BATCH}, {PROBE_TOKENS}] token ids 0 (its first layer {where} is nn.Embedding)"
        if isinstance(m, (nn.modules.conv._ConvNd, nn.RNNBase, nn.MultiheadAttention)):
            return None, f"its first layer {where} ({type(m).__name__}) does not say the input's size"
    return None, "it has no Linear, Embedding or convolution to read the input's size from"


def smooth_calls(model: nn.Module, example: Any = None, covered: Callable[[nn.Module], bool] = lambda m: False) -> Probed:
    """Gate functions called inside forward() outside `covered` modules, found by one forward on `example` (a
    tensor, or a tuple of forward's arguments) or on `probe_input(model)`. A forward that fails on the input read
    from the first layer is reported as not run (the model wants another input: pass `example=`); one that fails
    on the caller's own example raises."""
    if example is not None:
        return Probed(_run(model, example, covered), "the example given")
    x, how = probe_input(model)
    if x is None:
        return Probed(None, how)
    try:
        return Probed(_run(model, x, covered), how)
    except Exception as e:  # the guess was wrong for this model: not an error of the caller's
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return Probed(None, f"its forward on {how} failed ({type(e).__name__}: {first})")
