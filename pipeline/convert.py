"""Convert any model: its activations become hardenable gates, and `to_relu` turns them into ReLU.

    model, report = to_gates(model)     # a copy (inplace=True changes `model` itself)
    print(report)                       # what was converted, what was left and why
    ...                                 # harden it in any loop: pipeline.hardener.Hardener
    relu = to_relu(model)               # every gate -> ReLU, in place (pipeline.relu_swap.to_relu)

Like torchao's `quantize_(model, config, filter_fn)`: `filter_fn(module, fqn)` chooses the sites, a
`GateConfig` sets each gate's granularity (layer / channel / global), initial λ and temperature, and the one
walker (`pipeline.relu_swap.replace_modules`) puts the new modules in. What becomes what:

- a gate of family g (`activations.gate_of`: torch's nn.GELU in its exact erf form, nn.SiLU, nn.Mish, nn.Hardswish,
  the registry's GELU / SiLU / SERF / Mish / HardSwish, a user's module declaring `GATE`) becomes the registry's
  hardenable activation of that family (λ-GELU, λ-Swish, λ-SERF, λ-HardSwish; `hardenable_for`), with λ(0) from the
  GateConfig. A
  family without one (Mish today) is left and reported; a plug-in that registers one makes it convert;
- an activation module of any other class that computes a registered gate, recognized by what it computes
  (`pipeline.recognize`: timm's GELU, GPT-2's NewGELUActivation, QuickGELU, nn.GELU(approximate='tanh'), HF's
  GELUActivation as one site, not its inner F.gelu), becomes that family's gate starting at the matched λ where it
  is above λ(0) (QuickGELU: 1.702); the site records the λ and the largest difference (`match_lambda`, `match_diff`);
- a function held as a module attribute (a block's `self.act_fn = F.silu`, a partial(F.gelu, approximate='tanh'))
  becomes the same gate, set under that attribute name (a submodule now, called the same way); `filter_fn` gets the
  owning module and the attribute's fqn;
- a hardenable gate is kept as it is; ReLU is already the swapped form.

Every other activation is listed, never skipped silently: in `report.left` what stays smooth through the anneal and
the swap (a family with no hardenable gate, F.gelu / F.silu / F.mish called inside some forward, found by one watched
forward, `pipeline.probe`, on `example` or on an input read from the model; when none can run, `report.probe` says so
and names `example=`), and in `report.not_gates` the activations that compute no gate x·g(λx) (Tanh, ELU, ReLU6,
Hardsigmoid, a clipped GELU: the swap keeps them as they are). `strict=True` raises `ConvertError` when anything is left (and when
the forward could not be watched).

The converted model is not the same function: λ starts at `gate.init_lambda` (λ = 1 + softplus(s/t) is
never exactly 1), so a pretrained model wants an init_lambda close to 1 and some fine-tuning.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from . import recognize, render
from .activations import ACTIVATION_NAME, ACTIVATIONS, NOT_ACTIVATIONS, GateContext, HardenableGate, Linked, activation_types, gate_of, s_from_lambda
from .gates import channel_axis
from .config import GateConfig
from .errors import PipelineError
from .probe import function_name, gate_function, smooth_calls
from .recognize import Match
from .relu_swap import replace_modules, sync_fused_activation, to_relu

__all__ = ["to_gates", "to_relu", "ConvertReport", "Site", "ConvertError", "hardenable_for"]

FilterFn = Callable[[nn.Module, str], bool]



class ConvertError(PipelineError):
    pass


@dataclass(frozen=True)
class Site:
    """One activation site: where (fqn), what was there (source), what it became (target: a registry name,
    None when left) and why it was left; for a site recognized by what it computes (`pipeline.recognize`), the λ of
    the gate it matched and the largest difference between the two (`match_lambda`, `match_diff`)."""

    fqn: str
    source: str
    target: str | None = None
    reason: str = ""
    match_lambda: float | None = None
    match_diff: float | None = None


KINDS = ("converted", "kept", "left", "not_gates", "filtered")


@dataclass
class ConvertReport:
    converted: list[Site] = field(default_factory=list)  # now hardenable gates (target = registry name)
    kept: list[Site] = field(default_factory=list)  # hardenable already
    # smooth gates that were not converted, with the reason: they would stay smooth through the anneal and the swap
    left: list[Site] = field(default_factory=list)
    # activations that compute no gate x·g(λx) (Tanh, ELU, Hardsigmoid, ...): no λ form, and the swap keeps them as they are
    not_gates: list[Site] = field(default_factory=list)
    filtered: list[Site] = field(default_factory=list)  # convertible, excluded by filter_fn
    # how gate functions called inside forward() were looked for (`pipeline.probe`), or why they were not
    probe: str = ""
    probed: bool = False  # a forward was run and watched: `left` holds every such call it made

    @property
    def unknown_types(self) -> list[str]:
        """The activation types found and left, sorted."""
        return sorted({s.source for s in self.left})

    def to_dict(self) -> dict[str, Any]:
        return {**{k: [asdict(s) for s in getattr(self, k)] for k in KINDS}, "probe": self.probe, "probed": self.probed}

    def __str__(self) -> str:
        label = {"not_gates": "not a gate"}
        rows = [[s.fqn or "(root)", s.source, label.get(kind, kind) if s.target is None else f"{kind} → {s.target}", s.reason]
                for kind in KINDS for s in getattr(self, kind)]
        head = (f"{len(self.converted)} converted, {len(self.kept)} already hardenable, {len(self.left)} left, "
                f"{len(self.not_gates)} not a gate (kept as they are), {len(self.filtered)} excluded by filter_fn")
        return head + f"\n{self.probe}" + ("\n\n" + render.table(["site", "was", "now", "why"], rows) if rows else "")


def hardenable_for(family: str) -> str | None:
    """The registry's hardenable activation (one output per unit) of gate family `family`, or None."""
    return next((name for name, spec in ACTIVATIONS.items()
                 if spec.hardenable and spec.gate == family and spec.expansion == 1), None)


def _type_name(obj: Any) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    return f"nn.{cls.__name__}" if cls.__module__.startswith("torch.nn") else f"{cls.__module__}.{cls.__qualname__}"


@dataclass(frozen=True)
class _Kind:
    """How `to_gates` sees one module or attribute: "gate" (of `family`; `match` when recognized by what it computes),
    "hardenable", "left" / "not_gate" (with the reason) or "other"."""

    kind: str
    family: str = ""
    reason: str = ""
    match: Match | None = None


def _not_a_gate(m: Any) -> str:
    d = recognize.distance(m)
    far = f" (every registered x·g(λx), λ ≥ 1, differs from it by ≥ {d:.2g})" if d is not None else ""
    return f"computes no gate x·g(λx){far}: no λ form, and the swap keeps it as it is"


def _classify(m: nn.Module) -> _Kind:
    if isinstance(m, HardenableGate):
        return _Kind("hardenable")
    try:
        g = gate_of(m)
    except ValueError as exc:  # a user's class declaring a GATE no family has
        return _Kind("left", reason=str(exc))
    if g is not None:
        return _Kind("gate", g[0])
    # ReLU is the swapped form already; a linked pair is no site itself (the walk reaches its inner gate)
    if isinstance(m, (nn.ReLU, Linked, *NOT_ACTIVATIONS)):
        return _Kind("other")
    found = recognize.match(m)  # timm's GELU, HF's NewGELUActivation, nn.GELU(approximate='tanh'), a user's Swish
    if found is not None:
        return _Kind("gate", found.family, found.describe(), found)
    if isinstance(m, activation_types()) or type(m).__module__ == "torch.nn.modules.activation":
        return _Kind("not_gate", reason=_not_a_gate(m))
    if next(m.children(), None) is None and ACTIVATION_NAME.search(type(m).__name__):
        return _Kind("not_gate", reason=_not_a_gate(m) + f" (if it is a gate x·g(λx), declare GATE = one of "
                                                          f"{recognize.family_names()} on its class)")
    return _Kind("other")


def _classify_function(fn: Any) -> _Kind:
    """How a module attribute's value is seen: a gate function, a partial of one (F.gelu(approximate='tanh') is
    recognized by what it computes), or "other"."""
    if gate_function(fn) is not None:
        return _Kind("gate", gate_function(fn))
    if isinstance(fn, functools.partial) and gate_function(fn.func) is not None:
        found = recognize.match_function(fn)
        if found is not None:
            return _Kind("gate", found.family, found.describe(), found)
        return _Kind("left", reason="a partial of a gate function that computes no registered gate: not converted "
                                    "(hold the plain function or a module)")
    return _Kind("other")


class _Probe(nn.Module):
    """Stands in for a site during the example forward: runs what was there, records its width."""

    def __init__(self, inner: Any):
        super().__init__()
        self.inner = inner
        self.widths: set[int] = set()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.widths.add(int(x.shape[channel_axis(x)]) if x.dim() > 1 else 1)
        return self.inner(x)


def to_gates(model: nn.Module, gate: GateConfig | None = None, filter_fn: FilterFn | None = None, *,
            inplace: bool = False, strict: bool = False, example: Any = None) -> tuple[nn.Module, ConvertReport]:
    """Replace the activations of `model` by hardenable gates; returns (the converted model, the report).

    gate: granularity, init (uniform / increasing / decreasing with depth), init_lambda(_max), temperature of
        the new gates (`GateConfig()` by default: one λ per layer, λ(0) = 1.05, t = 0.1).
    filter_fn(module, fqn) -> bool: convert only the sites it accepts (the others are listed in `filtered`).
    inplace: change `model` itself (else a deep copy is converted and returned).
    strict: raise ConvertError when any activation is left.
    example: an input batch (a tensor, or a tuple of forward's arguments). Needed for
        granularity="channel" (each site's width is read from it). Smooth work left inside a forward is found by one
        forward on it; without it, on a zero batch read from the model (`pipeline.probe.probe_inputs`: a declared input
        shape, a first nn.Linear or nn.Embedding, a first convolution's in_channels at a few sizes). Where none runs the
        report says so (`report.probe`) and names example=, since such a call can be seen no other way.
    """
    gate = gate or GateConfig()
    if gate.granularity == "channel" and example is None:
        raise ConvertError("gate.granularity='channel' needs example=<an input batch> to learn each site's width")
    root = model if inplace else copy.deepcopy(model)
    report = ConvertReport()
    accept = filter_fn or (lambda m, fqn: True)

    # 1. Plan: every site, in module order (the order λ's init ramp follows).
    sites: list[tuple[str, _Kind, nn.Module, str | None]] = []  # (fqn, kind, owner-or-module, attribute)
    seen_attrs: set[tuple[int, str]] = set()
    reported: set[int] = set()  # modules converted, kept or reported: their own calls are no finding of the probe
    # remove_duplicate=False: a module registered under two names is two sites (the walker visits both)
    for fqn, m in root.named_modules(remove_duplicate=False):
        if any(fqn.startswith(s[0] + ".") for s in sites if s[3] is None):
            continue  # inside a site (a user's gate with children)
        k = _classify(m)
        if k.kind != "other":
            reported.add(id(m))
        if k.kind == "hardenable":
            report.kept.append(Site(fqn, _type_name(m), None, "hardenable already"))
        elif k.kind == "left":
            report.left.append(Site(fqn, _type_name(m), None, k.reason))
        elif k.kind == "not_gate":
            report.not_gates.append(Site(fqn, _type_name(m), None, k.reason))
        elif k.kind == "gate":
            sites.append((fqn, k, m, None))
            continue  # a wrapper that is a gate as a whole (HF's GELUActivation holds F.gelu): one site, itself
        for attr, value in list(vars(m).items()):
            if attr.startswith("__") or isinstance(value, (nn.Module, torch.Tensor)):
                continue
            fk = _classify_function(value)
            if fk.kind == "other" or (id(m), attr) in seen_attrs:
                continue
            seen_attrs.add((id(m), attr))
            afqn = f"{fqn}.{attr}" if fqn else attr
            if fk.kind == "gate":
                sites.append((afqn, fk, m, attr))
            else:
                report.left.append(Site(afqn, function_name(value), None, fk.reason))
    # a module whose gate attribute is a site is reported through that site, once (not also as a non-gate)
    owners = {id(obj) for _, _, obj, attr in sites if attr is not None}
    report.not_gates = [s for s in report.not_gates if id(root.get_submodule(s.fqn)) not in owners]

    chosen = []
    for fqn, k, obj, attr in sites:
        source = function_name(getattr(obj, attr)) if attr else _type_name(obj)
        target = hardenable_for(k.family)
        if not accept(obj, fqn):
            report.filtered.append(Site(fqn, source, target, "excluded by filter_fn"))
        elif target is None:
            report.left.append(Site(fqn, source, None, f"gate family {k.family!r} has no hardenable activation in the "
                                                       "registry (register one to harden it)"))
        else:
            chosen.append((fqn, obj, attr, source, target, k))

    # 2. Probe: each site's width (with an example), and gate functions called inside a forward. Every planned site
    # is probed, so a filtered attribute's calls are not reported again.
    widths: dict[str, int] = {}
    where = {fqn: (obj, attr) for fqn, _, obj, attr in sites}
    probes = {fqn: _Probe(getattr(obj, attr) if attr else obj) for fqn, (obj, attr) in where.items()}
    _install(root, where, lambda fqn, _: probes[fqn])
    try:
        found = smooth_calls(root, example, lambda m: isinstance(m, _Probe) or id(m) in reported)
    finally:
        _install(root, where, lambda fqn, _: probes[fqn].inner)
    report.probed = found.calls is not None
    if found.calls is None:
        report.probe = (f"Smooth work inside forward() was not looked for: {found.how}. Pass example=<an input batch> "
                        "to find it (x = F.gelu(x) in a forward is no module: nothing can harden or swap it).")
    else:
        report.probe = f"Smooth work inside forward() looked for by one forward on {found.how}."
        for c in sorted(found.calls, key=lambda c: (c.fqn, c.name)):
            report.left.append(Site(c.fqn, c.name, None, "called inside forward(): not a module, so nothing can harden or "
                                                         "swap it (hold it as a module or attribute, e.g. self.act = nn.GELU())"))
    if example is not None:
        for fqn, p in ((fqn, probes[fqn]) for fqn, *_ in chosen):
            if gate.granularity == "channel" and len(p.widths) != 1:
                raise ConvertError(f"{fqn}: " + ("not reached by the example's forward" if not p.widths else
                                   f"called on {len(p.widths)} widths {sorted(p.widths)}") +
                                   "; per-channel λ needs one width per site (use gate.granularity=layer)")
            widths[fqn] = next(iter(p.widths), 1)

    # 3. Build each gate through the registry (one shared scratch dict: the global λ lives there). A site recognized
    # at λ above the configured λ(0) (QuickGELU: x·σ(1.702x)) starts at its own λ, so the converted model starts as the
    # function it was; a shared global λ cannot, and keeps the configured one.
    param = next(root.parameters(), None)
    shared: dict = {}
    gates: dict[str, nn.Module] = {}
    for i, (fqn, _, _, source, target, k) in enumerate(chosen):
        ctx = GateContext(widths.get(fqn, 1), i, len(chosen), gate, shared)
        g = ACTIVATIONS[target].build(ctx)
        if k.match is not None and gate.granularity != "global" and k.match.lam > float(g.lam.detach().max()):
            with torch.no_grad():
                g.s.fill_(s_from_lambda(k.match.lam, g.temperature))
        gates[fqn] = g if param is None else g.to(param.device, param.dtype if param.is_floating_point() else None)
        report.converted.append(Site(fqn, source, target, k.reason, *((k.match.lam, k.match.max_diff) if k.match else ())))
    root = _install(root, {fqn: (obj, attr) for fqn, obj, attr, *_ in chosen}, lambda fqn, _: gates[fqn])
    sync_fused_activation(root)  # a transformer layer's fused kernel would compute GELU itself, ignoring the new gate

    if strict and report.left:
        raise ConvertError(f"{len(report.left)} activation(s) left: " +
                           "; ".join(f"{s.fqn or '(root)'} ({s.source}): {s.reason}" for s in report.left))
    if strict and not report.probed:
        raise ConvertError(report.probe)
    return root, report


def _install(root: nn.Module, where: dict[str, tuple[nn.Module, str | None]], make: Callable[[str, Any], nn.Module]) -> nn.Module:
    """Put make(fqn, old) at every planned site: module sites through the one walker (`replace_modules`),
    attribute sites on their owner (an nn.Module set as an attribute becomes a submodule)."""
    modules = {fqn for fqn, (_, attr) in where.items() if attr is None}
    root = replace_modules(root, lambda m, fqn: fqn in modules, lambda m, fqn: make(fqn, m))
    for fqn, (owner, attr) in where.items():
        if attr is not None:
            old = owner._modules.get(attr) if attr in owner._modules else vars(owner).get(attr)
            if attr in owner._modules:
                del owner._modules[attr]
            else:
                delattr(owner, attr)
            new = make(fqn, old)
            if isinstance(new, nn.Module):
                setattr(owner, attr, new)
            else:  # back to the plain function (after the probe)
                object.__setattr__(owner, attr, new)
    return root
