"""The architecture, checked: the project's imports form no cycle, dependencies run one way, and every
"module:function" target the registries name exists.

Layers, bottom to top: pipeline (config → registries → stages, training, swap) → quantize → analysis. The
stage registry and the CLI name upper-layer functions by "module:function" strings resolved on use, so no
module of `pipeline` imports `quantize` or `analysis`, and `quantize` never imports `analysis`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pipeline", "quantize", "analysis")
# Who may import whom (by top-level package): the one-way rule.
ALLOWED = {"pipeline": {"pipeline"}, "quantize": {"pipeline", "quantize"}, "analysis": {"pipeline", "quantize", "analysis"}}
GROUND = {"pipeline.errors", "pipeline.config"}  # config imports nothing of the project but its errors


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The project module an import names (a package's __init__ when it is one), or None."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> set[str]:
    """Every project module `module` imports, at the top or inside functions."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for n in names:
            target = _resolve(n)
            if target and target != module and target.split(".")[0] in PACKAGES:
                out.add(target)
    # "from pkg import mod" names pkg as well; keep pkg only when nothing below it was meant
    return {m for m in out if not any(o.startswith(m + ".") for o in out) or MODULES[m].name != "__init__.py"}


GRAPH = {m: imports_of(m) for m in MODULES}


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in GRAPH:
        if v not in index:
            visit(v)
    return out


def test_the_reader_sees_the_imports_that_exist():
    # a guard on the checker itself: known edges must be found, or the tests below prove nothing
    assert "pipeline.config" in GRAPH["pipeline.stages"]
    assert "pipeline.swap" in GRAPH["analysis.theory.certificate"]  # a function-level import
    assert "quantize.ort" in GRAPH["quantize.export"]  # "from . import ort as ort_util"


def test_no_import_cycles():
    assert _cycles() == []


def test_dependencies_run_one_way():
    bad = [(m, t) for m, ts in GRAPH.items() for t in ts if t.split(".")[0] not in ALLOWED[m.split(".")[0]]]
    assert bad == []


def test_config_is_the_ground_floor():
    assert GRAPH["pipeline.config"] <= GROUND and GRAPH["pipeline.errors"] == set()


@pytest.mark.parametrize("kind", ["stages", "cli"])
def test_every_named_target_exists(kind):
    from pipeline import cli, stages

    targets = ([t for s in stages.STAGES.values() for t in (s.run, s.report, s.validate) if t] if kind == "stages"
               else list(cli.TARGETS.values()))
    for target in targets:
        assert callable(stages.resolve(target)), target
