"""The architecture, checked: the project's imports form no cycle, dependencies run one way, and a stage is registered
in one place, by import.

Layers, bottom to top: pipeline (config → registries → training, swap, run directory) → quantize → analysis → the
stages of `pipeline run` (`pipeline/stages/`, one module each, and their registry) with the runner, the sweep and the
CLI that run them. A module imports only its own layer and the ones below: nothing under the top layer imports a stage,
and `quantize` never imports `analysis`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pipeline", "quantize", "analysis")
# The top layer: the stages and what runs them. They may import every package; nothing below imports them.
TOP = {"pipeline.stages", "pipeline.runner", "pipeline.sweep", "pipeline.cli"}
LAYERS = ("pipeline", "quantize", "analysis", "top")  # bottom to top
GROUND = {"pipeline.errors", "pipeline.opset", "pipeline.config"}  # config imports nothing of the project but its errors and the opset
REGISTRY = "pipeline.stages"  # the one module that registers a stage


def layer(module: str) -> int:
    """The layer of a project module (an index into LAYERS)."""
    if module in TOP or any(module.startswith(t + ".") for t in TOP):
        return LAYERS.index("top")
    return LAYERS.index(module.split(".")[0])


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
    assert "pipeline.stages.verify" in GRAPH["pipeline.stages"]  # "from . import ..., verify, verify_report"
    assert "pipeline.relu_swap" in GRAPH["analysis.theory.certificate.interpreter"]  # a function-level import
    assert "quantize.ort" in GRAPH["quantize.export"]  # "from . import ort as ort_util"
    assert "analysis.paper" in GRAPH["pipeline.cli"]  # a command's import inside its function


def test_no_import_cycles():
    assert _cycles() == []


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports of a higher layer than the importer's own."""
    return sorted((m, t) for m, ts in graph.items() for t in ts if layer(t) > layer(m))


def test_the_layer_rule_sees_an_upward_import():
    # a guard on the checker itself: each way up is found, and the top layer may import everything
    graph = {"pipeline.rundir": {"pipeline.stages", "pipeline.config"}, "quantize.export": {"analysis.verification"},
             "analysis.api": {"pipeline.stages.check", "quantize.export"}, "pipeline.sweep": {"pipeline.runner"},
             "pipeline.evaluate": {"pipeline.runner"}, "pipeline.stages.verify": {"analysis.verification", "quantize.ort"}}
    assert upward_imports(graph) == [("analysis.api", "pipeline.stages.check"), ("pipeline.evaluate", "pipeline.runner"),
                                     ("pipeline.rundir", "pipeline.stages"), ("quantize.export", "analysis.verification")]


def test_dependencies_run_one_way():
    assert upward_imports(GRAPH) == []
    assert all(layer(m) == LAYERS.index("top") for m in MODULES if m.startswith("pipeline.stages"))


def test_config_is_the_ground_floor():
    assert GRAPH["pipeline.config"] <= GROUND and GRAPH["pipeline.errors"] == set() and GRAPH["pipeline.opset"] == set()


# --------------------------------------------------------------------------------------------------
# A stage is registered in one place, by import: `STAGES` in pipeline/stages/__init__.py builds every `Stage` from the
# functions of the stage modules it imports. No other module makes a Stage or adds to STAGES, and no module names a
# function by a "module:function" string that something resolves on use (which neither imports, nor an IDE, nor a
# reader can follow).

TARGET = re.compile(r"^(pipeline|quantize|analysis)(\.\w+)*:\w+$")  # "analysis.verify:run_verify"
# `import pipeline` stays light: its public names resolve on first use (PEP 562), from these strings only
LAZY_EXPORTS = {"pipeline"}


def stage_registrations(source: str, module: str) -> list[str]:
    """Where `module` registers a stage outside the registry: a `Stage(...)` made (or `dataclasses.replace`d), STAGES
    assigned, extended or mutated, or a "module:function" string."""
    tree = ast.parse(source)
    aliases = _aliases(tree, module)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and TARGET.match(node.value) \
                and module not in LAZY_EXPORTS:
            bad.append(f"{module}:{node.lineno} names {node.value!r} by a string")
        if module == REGISTRY:
            continue
        if isinstance(node, ast.Call):
            name = _qualified(node.func, aliases)
            if name == f"{REGISTRY}.Stage" or (name == "dataclasses.replace" and node.args
                                                and "STAGES" in ast.unparse(node.args[0])):
                bad.append(f"{module}:{node.lineno} makes a Stage")
            if (isinstance(node.func, ast.Attribute) and node.func.attr in ("update", "setdefault", "__setitem__", "pop")
                    and _qualified(node.func.value, aliases) == f"{REGISTRY}.STAGES"):
                bad.append(f"{module}:{node.lineno} changes STAGES")
        targets = (node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign))
                   else [])
        for t in targets:
            base = t.value if isinstance(t, ast.Subscript) else t
            if _qualified(base, aliases) == f"{REGISTRY}.STAGES" or (isinstance(base, ast.Name) and base.id == "STAGES"):
                bad.append(f"{module}:{node.lineno} changes STAGES")
    return bad


def test_the_registration_rule_sees_a_stage_made_elsewhere():
    # a guard on the checker itself: each way of registering a stage outside the registry is found
    src = ("import dataclasses\nfrom pipeline import stages\nfrom pipeline.stages import STAGES, Stage\n"
           "import pipeline.stages as S\n"
           "extra = Stage(lambda cfg, run: {}, 'extra', 'help', ())\n"
           "STAGES['extra'] = extra\n"
           "stages.STAGES.update(more=S.Stage(print, 'more', 'help', ()))\n"
           "twin = dataclasses.replace(STAGES['train'], directory='twin')\n"
           "TARGETS = {'report': 'analysis.paper:write_report'}\n")
    found = stage_registrations(src, "pipeline.somewhere")
    assert sorted(found, key=lambda f: (int(f.split(":")[1].split()[0]), f)) == [
        "pipeline.somewhere:5 makes a Stage", "pipeline.somewhere:6 changes STAGES", "pipeline.somewhere:7 changes STAGES",
        "pipeline.somewhere:7 makes a Stage", "pipeline.somewhere:8 makes a Stage",
        "pipeline.somewhere:9 names 'analysis.paper:write_report' by a string"], found
    # the registry itself may make stages, never name one by a string
    assert stage_registrations(src.replace("TARGETS = {'report': 'analysis.paper:write_report'}\n", ""), REGISTRY) == []
    assert stage_registrations("X = 'pipeline.stages.verify:run_verify'\n", REGISTRY) != []
    assert stage_registrations("note = 'see docs: the layout'\n", "pipeline.somewhere") == []


def test_stages_are_registered_only_in_the_registry():
    bad = [f for m, path in MODULES.items() for f in stage_registrations(path.read_text(), m)]
    assert bad == []


def test_every_stage_is_a_module_of_the_package_registered_by_import():
    """Each stage's functions come from the stage modules (`pipeline/stages/<name>.py`), which the registry imports, and
    each stage module serves a registered stage."""
    from pipeline.stages import STAGES, run_report

    homes = {f.__module__ for s in STAGES.values() for f in (s.run, s.report, s.validate) if f is not None}
    assert homes - {REGISTRY} <= {m for m in MODULES if m.startswith(REGISTRY + ".")}, homes
    assert STAGES["report"].run is run_report  # the report stage: every section, from the registry's own data
    modules = {m for m in MODULES if m.startswith(REGISTRY + ".")}
    assert modules <= GRAPH[REGISTRY] | {h for h in homes}, modules - GRAPH[REGISTRY]


# --------------------------------------------------------------------------------------------------
# One home for each fact: a variant's facts are decided once (pipeline/variant_record.py, from the config) and read
# from its record (`RunDir.variant`); nothing else derives them again.

# The deciding functions, by qualified name -> the modules that may call them (besides the one defining them).
DECIDERS = {
    "pipeline.gates.lambda_target": {"pipeline.variant_record", "pipeline.hardener"},  # the record; the library schedule
    "pipeline.schedule.switch_epoch": {"pipeline.variant_record", "pipeline.hardener"},
    "pipeline.activations.swapped_activation": {"pipeline.variant_record"},
    "pipeline.variant_record.decide": {"pipeline.stages.train"},  # the one writer of the records
}
RELU_FORMS = "pipeline.activations.RELU_FORMS"  # `x in RELU_FORMS` decides "is it ReLU": the record's is_relu
RELU_FORMS_HOMES = {"pipeline.activations", "pipeline.variant_record"}


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
    assert rederived_facts(src, "pipeline.variant_record") == []  # the record writer may


def test_no_fact_is_derived_twice():
    bad = [f for m, path in MODULES.items()
           for f in rederived_facts(path.read_text(), m)]
    assert bad == []


# --------------------------------------------------------------------------------------------------
# One home for each number a proof depends on: float32 rounding (u, γ_n, the library's ulps, the dot product's bound)
# in pipeline/numerics.py, and what a gate is (Φ, its constants, its family's numbers) in pipeline/gates.py. Elsewhere
# they are imported, never defined again, as a name or as a literal.

NUMERICS_HOME, GATES_HOME = "pipeline.numerics", "pipeline.gates"
# Names only the home may define (a module-level constant or a function of that name).
NUMERIC_NAMES = {"U", "U32", "UNDERFLOW", "GAMMA_SLACK", "SAFETY", "ULPS", "LIBRARY_ULPS", "ULP_ELEMENTWISE",
                 "gamma", "dot_error", "dot_rounding"}
GATE_NAMES = {"INV_SQRT2", "INV_SQRT_2PI", "TWO_OVER_SQRT_PI", "Phi", "SMOOTH_GATE_CONSTANTS"}
# Values only the home may write (a literal, or an expression of literals and math.sqrt/exp/log/pi/e), compared to
# VALUE_RTOL: float32's u and its underflow threshold; Φ's constants; the gate families' b, c and argmax of c. (Φ's
# a = 2/√(2π) = √(2/π) is left out: it is also the tanh-GELU's coefficient, and the claims quote the papers' formulas.)
VALUE_RTOL = 1e-9
NUMERIC_VALUES = {"u = 2⁻²⁴": 2.0**-24, "2⁻¹²⁶": 2.0**-126}
GATE_VALUES = {"1/√2": 2**-0.5, "1/√(2π)": (2 * 3.141592653589793) ** -0.5, "c of Φ": 0.169971207480,
               "argmax of c for Φ": 0.751791535175, "a of σ, 2 ln 2": 1.3862943611198906, "b of σ, π²/6": 1.6449340668482264,
               "c of σ, W(1/e)": 0.27846454276}
MATH = {"sqrt", "exp", "log", "pi", "e"}


def _const(node: ast.AST) -> float | None:
    """The value of an expression of number literals and math.sqrt/exp/log/pi/e (torch.pi, np.sqrt, sp.sqrt alike),
    or None when it holds anything else."""
    import math

    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.Attribute) and node.attr in ("pi", "e"):
        return getattr(math, node.attr)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _const(node.operand)
        return None if v is None else (-v if isinstance(node.op, ast.USub) else v)
    if isinstance(node, ast.BinOp):
        a, b = _const(node.left), _const(node.right)
        ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b, ast.Div: lambda: a / b,
               ast.Pow: lambda: a ** b}
        if a is None or b is None or type(node.op) not in ops:
            return None
        try:
            v = ops[type(node.op)]()
        except (ZeroDivisionError, OverflowError):
            return None
        return v if isinstance(v, float) else float(v)
    if (isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords
            and (node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")) in MATH):
        v = _const(node.args[0])
        name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
        try:
            return None if v is None else float(getattr(math, name)(v))
        except (ValueError, OverflowError):
            return None
    return None


def _mentions_sqrt2(node: ast.AST) -> bool:
    """Does the expression divide or multiply by √2 (a name for it, or a value ±√2, ±1/√2)?"""
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and "SQRT2" in n.id.upper():
            return True
        v = _const(n) if isinstance(n, (ast.Call, ast.BinOp, ast.Constant)) else None
        if v is not None and any(abs(abs(v) - t) <= VALUE_RTOL * t for t in (2**0.5, 2**-0.5)):
            return True
    return False


def defined_outside_home(source: str, module: str) -> list[str]:
    """Where `module` defines a number of float32 rounding or of a gate again instead of importing it from its home."""
    tree = ast.parse(source)
    bad = []
    homes = ((NUMERICS_HOME, NUMERIC_NAMES, NUMERIC_VALUES), (GATES_HOME, GATE_NAMES, GATE_VALUES))
    for home, names, values in homes:
        if module == home:
            continue
        for node in tree.body:  # module-level constants
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            value = getattr(node, "value", None)
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name) and n.id in names and value is not None and _const(value) is not None:
                        bad.append(f"{module}:{node.lineno} defines {n.id} (its home is {home})")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
                bad.append(f"{module}:{node.lineno} defines {node.name}() (its home is {home})")
            if isinstance(node, (ast.BinOp, ast.Call, ast.Constant, ast.UnaryOp)):
                v = _const(node)
                for what, target in values.items():
                    if v is not None and abs(v - target) <= VALUE_RTOL * abs(target):
                        bad.append(f"{module}:{node.lineno} writes {what} (its home is {home})")
    if module != NUMERICS_HOME:  # the dot product's bound written inline: γ(...) and the underflow term in one sum
        for node in ast.walk(tree):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
                parts = list(ast.walk(node))
                if (any(isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", "")) == "gamma" for n in parts)
                        and any(isinstance(n, (ast.Name, ast.Attribute)) and getattr(n, "id", getattr(n, "attr", "")) == "UNDERFLOW"
                                for n in parts)):
                    bad.append(f"{module}:{node.lineno} writes the dot product's bound (its home is {NUMERICS_HOME}.dot_error)")
    if module != GATES_HOME:  # Φ: erf or erfc of a multiple of 1/√2 (torch, scipy, sympy, an in-place .erfc_())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
                receiver = [node.func.value] if isinstance(node.func, ast.Attribute) else []
                if name.rstrip("_") in ("erf", "erfc") and any(_mentions_sqrt2(a) for a in [*node.args, *receiver]):
                    bad.append(f"{module}:{node.lineno} computes Φ from {name} (its home is {GATES_HOME}.Phi)")
    return sorted(set(bad))


def test_the_home_rule_sees_a_number_defined_again():
    # a guard on the checker itself: each way of writing a home's number again is found
    src = ("import math\nimport torch\nimport sympy as sp\nU32 = 2.0**-24\nINV_SQRT2 = 1.0 / math.sqrt(2.0)\n"
           "def gamma(n):\n    return n * 5.960464477539063e-08\n"
           "def f(x, lam):\n    return 0.5 * torch.erfc(-lam * x / math.sqrt(2.0))\n"
           "def g(x):\n    return torch.mul(x, -INV2).erfc_()\n"
           "def h(y):\n    return (1 + sp.erf(y / sp.sqrt(2))) / 2\n"
           "C = 0.169971207480\nTINY = 2.0 ** -126\nX = torch.erf(torch.nn.functional.softplus(1.0))\n"
           "def r(n, m):\n    return 1.000001 * numerics.gamma(n + 1) * m + (2 * n + 1) * numerics.UNDERFLOW\n")
    found = defined_outside_home(src, "pipeline.somewhere")
    kinds = [f.split(" ", 1)[1] for f in found]
    assert "defines U32 (its home is pipeline.numerics)" in kinds and "defines INV_SQRT2 (its home is pipeline.gates)" in kinds
    assert "defines gamma() (its home is pipeline.numerics)" in kinds
    assert "writes u = 2⁻²⁴ (its home is pipeline.numerics)" in kinds and "writes 2⁻¹²⁶ (its home is pipeline.numerics)" in kinds
    assert "writes 1/√2 (its home is pipeline.gates)" in kinds and "writes c of Φ (its home is pipeline.gates)" in kinds
    assert "writes the dot product's bound (its home is pipeline.numerics.dot_error)" in kinds
    assert sum(k.startswith("computes Φ from erf") for k in kinds) == 2, kinds  # torch.erfc(... / sqrt 2), sp.erf(y / √2)
    assert not any(f.startswith(("pipeline.somewhere:11 ", "pipeline.somewhere:16 ")) for f in found), found  # g: INV2 names no √2; SERF's erf is no Φ
    assert defined_outside_home(src.replace("U32 = 2.0**-24\n", ""), "pipeline.numerics") != []  # the gates' still count
    assert defined_outside_home("from pipeline.numerics import U as U32\nfrom pipeline.gates import Phi\n", "x") == []


def test_every_number_of_float32_rounding_and_of_a_gate_has_one_home():
    bad = [f for m, path in MODULES.items() for f in defined_outside_home(path.read_text(), m)]
    assert bad == []


def test_the_engine_depends_only_on_itself_and_its_leaves():
    """analysis/verification/ reads the numbers of float32 rounding, the gate families and the few leaf modules of IO
    it shares with the stages; nothing of the stages, the registries or quantize."""
    # pipeline.distributed: `device=auto|cpu|cuda|cuda:N` resolved as a run resolves it (harness.resolve_device);
    # pipeline.cores: `pipeline vnncomp --threads 0` counts the free cores as a run's `threads = 0` does
    leaves = {"pipeline.numerics", "pipeline.gates", "pipeline.errors", "pipeline.atomic_io", "pipeline.onnx_io",
              "pipeline.shards", "pipeline.devices", "pipeline.progress", "pipeline.distributed", "pipeline.opset",
              "pipeline.cores"}
    engine = {m for m in MODULES if m == "analysis.verification" or m.startswith("analysis.verification.")}
    bad = sorted((m, t) for m in engine for t in GRAPH[m] if t not in engine and t not in leaves)
    assert bad == []
    for leaf in leaves:  # and the leaves import nothing of the project but each other and the errors
        assert GRAPH[leaf] <= leaves, (leaf, GRAPH[leaf])
