"""Plug-ins: data sets, models and activations registered by another installed package through Python entry
points, one group per registry. A plug-in package declares them in its pyproject.toml:

    [project.entry-points."lambda_gelu_pipeline.datasets"]
    my_data = "my_pkg.data:load"        # (DataConfig) -> pipeline.data.Dataset
    [project.entry-points."lambda_gelu_pipeline.models"]
    my_net = "my_pkg.nets:build"        # (ModelConfig, input_shape, num_classes, act) -> [(name, module)] | nn.Module
    [project.entry-points."lambda_gelu_pipeline.activations"]
    my_act = "my_pkg.acts:MyGate"       # an activations.ActivationSpec, or a Gate subclass (hardenable when it
                                        # subclasses HardenableGate); linked_<name> comes with it

`load()` imports every entry point once per process and adds it to its registry (`data.DATASETS`,
`models.MODELS`, `activations.ACTIVATIONS`); `runner.validate` calls it before any name is checked, so a
config may name a plug-in like a built-in. A plug-in that cannot be imported, has the wrong type or reuses a
taken name stops the run with one line naming its package and entry point. `pipeline plugins` lists them.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from typing import Any, Callable

from . import activations, data, models
from .errors import PipelineError

PREFIX = "lambda_gelu_pipeline"
GROUPS = {"datasets": f"{PREFIX}.datasets", "models": f"{PREFIX}.models", "activations": f"{PREFIX}.activations"}


class PluginError(PipelineError):
    pass


@dataclass(frozen=True)
class Plugin:
    kind: str  # datasets | models | activations
    name: str  # the registry name
    target: str  # "module:attribute"
    package: str  # "name version" of the distribution that declares it
    error: str = ""  # why it is not registered ("" = registered)


def _registry(kind: str) -> dict[str, Any]:
    return {"datasets": data.DATASETS, "models": models.MODELS, "activations": activations.ACTIVATIONS}[kind]


def _as_activation(obj: Any) -> activations.ActivationSpec:
    if isinstance(obj, activations.ActivationSpec):
        return obj
    if isinstance(obj, type) and issubclass(obj, activations.Gate):
        return activations.gate_spec(obj)  # the registry's own constructor for a gate class
    raise TypeError(f"is a {type(obj).__name__}; expected an ActivationSpec or a Gate subclass")


def _callable(obj: Any) -> Any:
    if not callable(obj):
        raise TypeError(f"is a {type(obj).__name__}; expected a callable")
    return obj


ADAPT: dict[str, Callable[[Any], Any]] = {"datasets": _callable, "models": _callable, "activations": _as_activation}

_found: list[Plugin] | None = None  # None: not loaded yet in this process
_added: dict[str, list[str]] = {}  # kind -> registry names added (unload removes exactly these)


def _package(ep: importlib.metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "an unknown package"


def _register(kind: str, ep: importlib.metadata.EntryPoint) -> Plugin:
    plugin = Plugin(kind, ep.name, ep.value, _package(ep))
    where = f"plug-in {ep.name!r} ({ep.group} = {ep.value}, from {plugin.package})"
    registry = _registry(kind)
    names = [ep.name] + ([f"linked_{ep.name}"] if kind == "activations" else [])
    taken = next((n for n in names if n in registry), None)
    if taken is not None:
        return Plugin(**{**plugin.__dict__, "error": f"{where}: the name {taken!r} is taken; rename the entry point"})
    try:
        value = ADAPT[kind](ep.load())
    except Exception as exc:  # an import error, an exception at import time, a wrong type: all one line
        why = str(exc).splitlines()[0] if str(exc) else ""
        return Plugin(**{**plugin.__dict__, "error": f"{where}: {type(exc).__name__}: {why}"})
    registry[ep.name] = value
    if kind == "activations":
        registry[f"linked_{ep.name}"] = activations.linked(value)
        activations.activation_types.cache_clear()  # the module classes that count as activations changed
    _added.setdefault(kind, []).extend(names)
    return plugin


def load(strict: bool = True) -> list[Plugin]:
    """Register every installed plug-in (once per process); returns them all. strict: raise PluginError for the
    first that failed (else each failure is only recorded in its Plugin.error)."""
    global _found
    if _found is None:
        found = []
        for kind, group in GROUPS.items():
            for ep in sorted(importlib.metadata.entry_points(group=group), key=lambda e: e.name):
                found.append(_register(kind, ep))
        _found = found
    bad = next((p for p in _found if p.error), None)
    if strict and bad is not None:
        raise PluginError(bad.error)
    return list(_found)


def unload() -> None:
    """Remove every plug-in from the registries; the next `load()` looks for them again (tests use this)."""
    global _found
    for kind, names in _added.items():
        for n in names:
            _registry(kind).pop(n, None)
    _added.clear()
    activations.activation_types.cache_clear()
    _found = None


def table(plugins: list[Plugin]) -> str:
    """The plug-ins as a Markdown table (`pipeline plugins`)."""
    from .render import table as md_table

    rows = [[GROUPS[p.kind], p.name, p.target, p.package, p.error or "registered"] for p in plugins]
    return md_table(["entry point group", "name", "target", "package", "status"], rows)
