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


def _from_base(node: ast.ImportFrom, module: str) -> str:
    """The absolute module a `from … import` in `module` reads from (relative imports resolved)."""
    base = node.module or ""
    if node.level:
        package = module if MODULES.get(module, Path("x.py")).name == "__init__.py" else module.rpartition(".")[0]
        anchor = package.split(".")
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    return base


def imports_of(module: str) -> set[str]:
    """Every project module `module` imports, at the top or inside functions."""
    path = MODULES[module]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, module)
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
    assert "pipeline.relu_swap" in GRAPH["analysis.theory.certificate.interpreter"]  # a function-level import
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


# --------------------------------------------------------------------------------------------------
# One home for each fact: a variant's facts are decided once (pipeline/records.py, from the config) and read
# from its record (`RunDir.variant`); nothing else derives them again.

# The deciding functions, by qualified name -> the modules that may call them (besides the one defining them).
DECIDERS = {
    "pipeline.gates.lambda_target": {"pipeline.records", "pipeline.hardener"},  # the record; the library schedule
    "pipeline.schedule.switch_epoch": {"pipeline.records", "pipeline.hardener"},
    "pipeline.activations.swapped_activation": {"pipeline.records"},
    "pipeline.records.decide": {"pipeline.train"},  # the one writer of the records
}
RELU_FORMS = "pipeline.activations.RELU_FORMS"  # `x in RELU_FORMS` decides "is it ReLU": the record's is_relu
RELU_FORMS_HOMES = {"pipeline.activations", "pipeline.records"}


def _aliases(tree: ast.AST, module: str) -> dict[str, str]:
    """Local name -> the qualified name it stands for ("pipeline.gates" for a module, "pipeline.gates.lambda_target"
    for a function), from the module's imports."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, module)
            for a in node.names:
                out[a.asname or a.name] = f"{base}.{a.name}"
    return out


def _qualified(node: ast.AST, aliases: dict[str, str]) -> str | None:
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _qualified(node.value, aliases)
        return f"{base}.{node.attr}" if base else None
    return None


def rederived_facts(source: str, module: str) -> list[str]:
    """Where `module` decides a variant's fact again instead of reading its record."""
    tree = ast.parse(source)
    aliases = _aliases(tree, module)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _qualified(node.func, aliases)
            if name in DECIDERS and module not in DECIDERS[name] and module != name.rpartition(".")[0]:
                bad.append(f"{module}:{node.lineno} calls {name}")
        elif isinstance(node, ast.Compare) and module not in RELU_FORMS_HOMES:
            for op, right in zip(node.ops, node.comparators):
                if isinstance(op, (ast.In, ast.NotIn)) and _qualified(right, aliases) == RELU_FORMS:
                    bad.append(f"{module}:{node.lineno} tests `in RELU_FORMS`")
    return bad


def test_the_fact_rule_sees_a_rederived_fact():
    # a guard on the checker itself: each way of deciding a fact again is found
    src = ("from pipeline.gates import lambda_target\nfrom pipeline import schedule\nimport pipeline.activations as A\n"
           "from .activations import RELU_FORMS, swapped_activation\n"
           "a = lambda_target(1e-3)\nb = schedule.switch_epoch(8, 0.25)\nc = 'relu' in A.RELU_FORMS\n"
           "d = swapped_activation('gelu')\ne = 'x' not in RELU_FORMS\n")
    found = rederived_facts(src, "pipeline.somewhere")
    assert [f.split(" ", 1)[1] for f in found] == [
        "calls pipeline.gates.lambda_target", "calls pipeline.schedule.switch_epoch", "tests `in RELU_FORMS`",
        "calls pipeline.activations.swapped_activation", "tests `in RELU_FORMS`"], found
    assert rederived_facts(src, "pipeline.records") == []  # the record writer may


def test_no_fact_is_derived_twice():
    bad = [f for m, path in MODULES.items()
           for f in rederived_facts(path.read_text(), m)]
    assert bad == []
