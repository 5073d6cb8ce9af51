"""The walk: the smooth network's own forward on a float64 copy, its input wrapped in `_Dev`, every torch function
dispatched to its rule (`rules/`), gates and activations intercepted as modules (`activations.py`); and the
certificate built on it (`Certifier`: the global bound and the per-sample bounds), with its readers
(`certified_mask`, `certified_fraction`).
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from pipeline.activations import gate_of
from pipeline.outputs import LogitsView

from .activations import _intercept
from .core import (EXACT, GLOBAL_CHANNELS, RELU32, RELU_ROUNDING, SAMPLE_CHANNELS, SMOOTH32, Refused, _Call, _Channel,
                   _Dev, _devs, _inf_for_nan, _injected, _NoRule)
from .rules import DECOMPOSED, RULES
from .signed import carry

class _Walk:
    """One pass of `_Dev` boxes through a model: the channels, and which of them were refused where."""

    def __init__(self, channels: tuple[_Channel, ...], stack: list[tuple[str, str]] | None = None, signed: bool = False):
        self.channels = channels
        self.signed = signed  # the exact channel also carries its change with signs (`signed.py`)
        self.refused: dict[int, str] = {}  # channel index -> the first reason
        self.stack = stack if stack is not None else []  # (fqn, class) of the modules whose forward runs now
        # (torch function, innermost module, largest exact input box, largest exact output box) per op, when asked for
        self.trace: list[tuple[str, str, float, float]] | None = None

    def where(self) -> str:
        """The innermost module running, for a refusal's message."""
        if not self.stack:
            return "in the model's own forward"
        fqn, cls = self.stack[-1]
        return f"in `{fqn or '(root)'}` ({cls})"

    def zeros(self, like: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(torch.zeros(like.shape, dtype=torch.float64) for _ in self.channels)

    def wrap(self, value: torch.Tensor, boxes: list[torch.Tensor], signed: tuple[torch.Tensor, torch.Tensor] | None = None) -> _Dev:
        d = _Dev(value, tuple(_inf_for_nan(b.to(torch.float64)) for b in boxes), self)
        if signed is not None:  # the box takes the signed form where that is tighter (`signed.py`)
            d.boxes = (torch.minimum(d.boxes[EXACT], signed[0].abs() + signed[1]), *d.boxes[1:])
        d.signed = signed
        return d

    def fail(self, ci: int, reason: str) -> None:
        if self.channels[ci].rounding:  # only a float32 statement is lost
            self.refused.setdefault(ci, reason)
        else:
            raise Refused(reason)

    def apply(self, name: str, func: Callable, args: tuple, kwargs: dict, out: Any, devs: list[_Dev]) -> Any:
        if name in DECOMPOSED:  # a composite function (nn.MultiheadAttention's): the ops it runs, each by its rule
            return DECOMPOSED[name](self, func, args, kwargs, out)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if not all(isinstance(o, torch.Tensor) for o in outs):
            # A Python value read out of a tensor (item, bool, tolist): the forward may branch on it.
            moved = any(bool((d.boxes[ci] != 0).any()) for d in devs for ci in range(len(self.channels)))
            if moved or not self.channels[0].sample:
                raise Refused(f"{self.where()}: the forward reads a value out of a tensor (`{name}`): its control flow may depend on the "
                              "input" + ("" if not moved else " and differ between the networks") + ", so no bound is proved")
            return out
        rule = RULES.get(name)
        if not any(t.is_floating_point() for t in [*outs, *(d.value for d in devs)]):
            rule = _integers  # token ids, masks, positions: integers in, integers out
        boxes: list[list[torch.Tensor]] = []
        for ci, ch in enumerate(self.channels):
            if not ch.rounding and all(not bool(d.boxes[ci].any()) for d in devs):
                b = [torch.zeros(o.shape, dtype=torch.float64) for o in outs]  # identical computations, identical values
            elif ci in self.refused:
                b = [torch.full(o.shape, math.inf, dtype=torch.float64) for o in outs]
            else:
                try:
                    if rule is None:
                        raise _NoRule(f"the certificate has no rule for `{name}` on a value that differs between the "
                                      "networks (after a gate, or with float32 rounding): write that step with functions "
                                      "it has rules for (`analysis.theory.certificate.RULES` lists them)")
                    r = rule(_Call(self, ci, ch, name, func, args, kwargs, out))
                    b = list(r) if isinstance(r, (tuple, list)) else [r]
                    b = [torch.broadcast_to(x, o.shape) for x, o in zip(b, outs)]
                except _NoRule as exc:
                    self.fail(ci, f"{self.where()}: {exc}")
                    b = [torch.full(o.shape, math.inf, dtype=torch.float64) for o in outs]
            boxes.append(b)
        signed = [None] * len(outs)
        if self.signed and name not in ("shape",) and all(isinstance(d.value, torch.Tensor) for d in devs):
            signed = carry(name, func, args, kwargs, outs, boxes[EXACT], EXACT)
        wrapped = [self.wrap(o, [boxes[ci][j] for ci in range(len(self.channels))], signed[j]) for j, o in enumerate(outs)]
        if self.trace is not None and self.channels[EXACT].sample:
            top = lambda ts: max((float(t.max()) for t in ts if t.numel()), default=0.0)
            self.trace.append((name, self.stack[-1][0] if self.stack else "", top([d.boxes[EXACT] for d in devs]),
                               top(boxes[EXACT])))
        return type(out)(wrapped) if isinstance(out, (tuple, list)) else wrapped[0]


def _integers(c: _Call) -> torch.Tensor:
    """An op on integers (or booleans) with an integer result: exact, and the same in every network where its inputs
    are (token ids, `input_ids != pad`, the last token's position); where they differ, the result can jump."""
    if any(bool(c.box(d).any()) for d in _devs((c.args, c.kwargs))):
        raise _NoRule(f"`{c.name}` on integers that differ between the networks: the result can jump")
    return torch.zeros((), dtype=torch.float64)


@dataclass
class SwapBound:
    """Bounds on |logit_ReLU − logit_smooth|, elementwise.

    per_logit: the exact-arithmetic bound, [K] (global: every input) or [N, K] (per sample).
    float32: [N, K], per sample only: the bound on the float32 networks' change (δ̃ + ε̃), or None with the
      reason in `float32_refused`.
    rounding: [N, K], per sample only: ρ + ε̃, what a global exact bound needs added to hold in float32 on
      these inputs, or None with the reason in `rounding_refused`.
    layers: after each module, its name, type and the largest exact box so far.
    """

    per_logit: torch.Tensor
    max: float
    layers: list[dict[str, Any]] = field(default_factory=list)
    float32: torch.Tensor | None = None
    float32_refused: str | None = None
    rounding: torch.Tensor | None = None
    rounding_refused: str | None = None
    growth: str | None = None  # per sample, when traced: where the exact boxes grow (`growth_note`)

    def as_dict(self) -> dict[str, Any]:
        return {"per_logit": self.per_logit.tolist(), "max": self.max, "layers": self.layers}


def _float32_premise(model: nn.Module) -> str | None:
    """Why float32 statements cannot be made for this model, or None."""
    if torch.get_float32_matmul_precision() != "highest":
        return f"float32 matmuls run at precision {torch.get_float32_matmul_precision()!r} (TF32/bf16), not full float32"
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.is_floating_point() and not torch.equal(t.detach().float().to(t.dtype), t.detach()):
            return f"{name} holds values that are not float32 numbers: the float32 network is a different function"
    return None


class Certifier:
    """Builds the float64 walking copy of `model` once; `global_bound` and `per_sample` reuse it.

    `model` is not changed. Modules run in eval mode (dropout off, BatchNorm on running statistics).
    """

    def __init__(self, model: nn.Module):
        self.net = copy.deepcopy(model).to(torch.float64).eval()
        _intercept(self.net)
        self.float32_premise = _float32_premise(model)
        self.records: list[dict[str, Any]] | None = None
        self.stack: list[tuple[str, str]] = []  # the modules running now: a refusal names the innermost
        for name, m in self.net.named_modules():
            m.register_forward_pre_hook(functools.partial(self._enter, name))
            m.register_forward_hook(self._leave)
            if not list(m.children()) or gate_of(m) is not None:
                m.register_forward_hook(functools.partial(self._record, name))

    def _enter(self, name: str, module: nn.Module, inputs: Any) -> None:
        self.stack.append((name, type(module.model if isinstance(module, LogitsView) else module).__name__))

    def _leave(self, module: nn.Module, inputs: Any, output: Any) -> None:
        self.stack.pop()

    def _record(self, name: str, module: nn.Module, inputs: Any, output: Any) -> None:
        if self.records is not None and isinstance(output, _Dev):
            self.records.append({"name": name, "type": type(module).__name__, "max_deviation": float(output.boxes[EXACT].max())})

    def _walk(self, x: torch.Tensor, channels: tuple[_Channel, ...], trace: bool = False,
              signed: bool = False) -> tuple[_Dev, _Walk, list[dict[str, Any]]]:
        self.stack.clear()  # a refused walk may have left modules on it
        walk = _Walk(channels, self.stack, signed)
        walk.trace = [] if trace else None
        value = x.detach().to(torch.float64) if x.is_floating_point() else x.detach()
        self.records = []
        try:
            with torch.no_grad():
                out = self.net(walk.wrap(value, list(walk.zeros(value))))
        finally:
            layers, self.records = self.records, None
        if not isinstance(out, _Dev):
            raise Refused(f"the model's output ({type(out).__name__}) is not computed from its input by torch functions")
        return out, walk, layers

    def global_bound(self, example: torch.Tensor, gate_constants: Mapping[str, float] | None = None) -> SwapBound:
        """B with |R(x) − S(x)| ≤ B for every input shaped like `example` [1, ...] (only its shape and dtype
        are used: no rule reads a value in this walk)."""
        with _injected(gate_constants):
            out, _, layers = self._walk(example[:1], GLOBAL_CHANNELS)
        per_logit = out.boxes[EXACT].reshape(-1)
        return SwapBound(per_logit=per_logit, max=float(per_logit.max()), layers=layers)

    def per_sample(self, x: torch.Tensor, trace: bool = False, signed: bool = True) -> SwapBound:
        """δ(x) (exact), δ̃ + ε̃ (float32) and ρ + ε̃ (rounding beside a global bound) for a batch x [N, ...]; `trace`:
        also where the exact boxes grow (`growth`); `signed`: δ(x) is the tighter of the box and the change carried
        with its signs (`signed.py`), else the box alone."""
        out, walk, layers = self._walk(x, SAMPLE_CHANNELS, trace, signed)
        flat = lambda t: t.reshape(t.shape[0], -1)
        # the signed form where it reached the logits: the box leaves out the smooth network's float64 rounding
        exact = flat(out.boxes[EXACT] if out.signed is None else out.signed[0].abs() + out.signed[1])
        bound = SwapBound(per_logit=exact, max=float(exact.max()), layers=layers,
                          growth=growth_note(walk.trace, float(exact.max())) if trace else None)
        premise = self.float32_premise
        reason = lambda *cs: premise or next((walk.refused[c] for c in cs if c in walk.refused), None)
        bound.float32_refused = reason(RELU32, SMOOTH32)
        if bound.float32_refused is None:
            bound.float32 = flat(out.boxes[RELU32] + out.boxes[SMOOTH32])
        bound.rounding_refused = reason(RELU_ROUNDING, SMOOTH32)
        if bound.rounding_refused is None:
            bound.rounding = flat(out.boxes[RELU_ROUNDING] + out.boxes[SMOOTH32])
        return bound


def growth_note(trace: list[tuple[str, str, float, float]], final: float) -> str | None:
    """Where a walk's exact boxes grow, as one clause: from the first box an op reads (a gate's deviation) to `final`,
    the largest so far raised step by step, each step's factor credited to its torch function (the factors telescope
    to the whole growth); the three functions that raise it most, with their steps' count and mean factor."""
    start = next((i for _, _, i, _ in trace if i > 0), 0.0)
    if not start or not final > start:
        return None
    credit: dict[str, list] = {}  # function -> [log factor, steps]
    top = start
    for name, _, _, out in trace:
        if out > top:
            c = credit.setdefault(name, [0.0, 0])
            c[0], c[1] = c[0] + (math.log(out / top) if math.isfinite(out) else math.inf), c[1] + 1
            top = out
    parts = [f"×{math.exp(lf):.2g} at `{name}` ({n} step{'s' * (n > 1)}, ×{math.exp(lf / n):.3g} each on average)"
             for name, (lf, n) in sorted(credit.items(), key=lambda kv: -kv[1][0])[:3]]
    return (f"its boxes grow from {start:.2g} (the first gate's deviation) to {final:.2g}: " + ", ".join(parts)
            + " (a box carries |W|·d through a linear map, dropping the signs that cancel; the change carried with its "
              "signs has float64 rounding in its radius, which |W| compounds the same way)")


def swap_bound(model: nn.Module, input_shape: tuple[int, ...], gate_constants: Mapping[str, float] | None = None,
               example: torch.Tensor | None = None) -> SwapBound:
    """Input-independent exact bound (raises `Refused`). `example` gives the input dtype (token ids are
    integers); otherwise a float input of `input_shape`."""
    ex = example if example is not None else torch.zeros((1, *input_shape), dtype=torch.float64)
    return Certifier(model).global_bound(ex, gate_constants)


def swap_bound_per_sample(model: nn.Module, x: torch.Tensor, gate_constants: Mapping[str, float] | None = None) -> SwapBound:
    """Per-sample bounds on `x` [N, ...] (raises `Refused`); see `Certifier.per_sample`."""
    del gate_constants  # the per-sample rule uses the gates' own outputs, not c
    return Certifier(model).per_sample(x)


def certified_mask(logits: torch.Tensor, bound: torch.Tensor | float) -> torch.Tensor:
    """[N] bool: the top-1 class cannot change when each logit moves by at most `bound`.

    `bound` is a scalar, [K] or [N, K]. Sample n is certified when, with t its top class,
    logit_t − logit_j > bound_t + bound_j for every j ≠ t (for a scalar bound: margin > 2·bound).
    Language models' [N, T, V] logits count every position as a sample.
    """
    logits = logits.detach().to(torch.float64)
    logits = logits.reshape(-1, logits.shape[-1])
    b = torch.as_tensor(bound, dtype=torch.float64)
    b = b.reshape(-1, logits.shape[-1]) if b.dim() > 1 else b
    b = b.expand_as(logits)
    top = logits.argmax(dim=1, keepdim=True)
    lt, bt = logits.gather(1, top), b.gather(1, top)
    ok = (lt - logits) > (bt + b)
    ok.scatter_(1, top, True)
    return ok.all(dim=1)


def certified_fraction(logits: torch.Tensor, bound: torch.Tensor | float) -> float:
    """Fraction of samples whose top-1 prediction provably survives the swap (see `certified_mask`)."""
    if logits.shape[0] == 0:
        return math.nan
    return float(certified_mask(logits, bound).to(torch.float64).mean())


def relu_swapped(model: nn.Module, example: Any = None) -> nn.Module:
    """A copy of `model` with every gate replaced by ReLU (`pipeline.relu_swap.to_relu`, the swap stage's walker;
    `example`: an input batch for its watched forward where none can be read from the model)."""
    from pipeline.relu_swap import to_relu

    return to_relu(copy.deepcopy(model), example, allow_unchanged=True)  # no gate: its swap is itself
