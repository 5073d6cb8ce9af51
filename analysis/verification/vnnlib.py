"""VNN-LIB 1.0 properties (writer and parser), instances.csv, and VNN-COMP counterexample witnesses.

A property states the *unsafe* set: a solver answers ``sat`` with a counterexample or ``unsat`` when the
network is safe. For L∞ robustness of input ``x0`` with true class ``c`` of ``K`` the file is::

    (declare-const X_0 Real) ...            one per input, C-order flattening of the ONNX input
    (declare-const Y_0 Real) ...            one per output
    (assert (<= X_i ub_i)) (assert (>= X_i lb_i))     lb = max(x0 - eps, lo), ub = min(x0 + eps, hi)
    (assert (or (and (>= Y_j Y_c)) ...))    one disjunct per j != c

Numbers are written in positional notation with the shortest digits that round-trip a float64
(``np.format_float_positional(unique=True)``): exact on parse-back, and without exponents, which some
VNN-LIB 1.0 readers do not take.

The parser reads the VNN-LIB 1.0 that VNN-COMP 2021-2024 benchmarks use: ``declare-const`` of ``X_i`` /
``Y_j``; asserts built from ``and`` / ``or`` of ``<=`` / ``>=`` between linear terms (``+``, ``-``, ``*``
by a constant), each comparison over inputs only or outputs only. Inputs must end up in boxes: a property
whose input constraints sit inside a disjunction (several boxes, as some VNN-COMP benchmarks write them)
is read by `parse_vnnlib_all` as one `VnnlibSpec` per box; each spec's unsafe set is a union of polytopes
``{y : A y <= b}``. The PyPI package ``vnnlib`` 1.0.x parses VNN-LIB 2.0 only, hence this small parser.

Witness (VNN-COMP's counterexample file): ``sat`` on the first line, then ``((X_0 v) (X_1 v) … (Y_0 v) …)``
one pair per line. Files are written atomically and readable by others (``pipeline.rundir``'s writers).
"""

from __future__ import annotations

import csv
import gzip
import io
import re
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pipeline.atomic_io import atomic_path, atomic_write_text

__all__ = [
    "VnnlibSpec", "robustness_spec", "format_vnnlib", "write_vnnlib", "write_robustness_vnnlib",
    "parse_vnnlib", "parse_vnnlib_all", "read_vnnlib", "read_vnnlib_all", "read_text",
    "write_instances_csv", "read_instances_csv", "write_robustness_benchmark", "format_real",
    "format_witness", "parse_witness",
]


@dataclass(frozen=True, eq=False)
class VnnlibSpec:
    """An input box and an unsafe output set.

    ``lb``, ``ub``: flat float64 arrays, one entry per input ``X_i``.
    ``disjuncts``: the unsafe set is the union over ``(A, b)`` of ``{y : A @ y <= b}``; ``A`` is
    (rows, num_outputs). The property holds (``unsat``) when no ``x`` in the box maps into the unsafe set.
    """

    lb: np.ndarray
    ub: np.ndarray
    disjuncts: tuple[tuple[np.ndarray, np.ndarray], ...]
    num_outputs: int

    @property
    def num_inputs(self) -> int:
        return self.lb.size

    def in_box(self, x: np.ndarray, tol: float = 0.0) -> bool:
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        return bool(x.size == self.lb.size and np.all(x >= self.lb - tol) and np.all(x <= self.ub + tol))

    def violation(self, y: np.ndarray) -> float:
        """``min over disjuncts of max over rows of (A y - b)``: <= 0 means ``y`` is unsafe."""
        return float(self.violations(np.asarray(y).reshape(1, -1))[0])

    def violations(self, ys):
        """`violation` of each row of ``ys`` ([N, outputs]) at once; a torch tensor is answered on its own device
        (branch and bound checks its bound minimizers where they are)."""
        if isinstance(ys, torch.Tensor):
            return torch.stack([(ys @ torch.as_tensor(A, dtype=ys.dtype, device=ys.device).T
                                 - torch.as_tensor(b, dtype=ys.dtype, device=ys.device)).amax(1)
                                for A, b in self.disjuncts]).amin(0)
        ys = np.asarray(ys, dtype=np.float64)
        return np.min(np.stack([np.max(ys @ A.T - b, axis=1) for A, b in self.disjuncts]), axis=0)


def robustness_spec(x0: np.ndarray, eps: float, lo: float | np.ndarray, hi: float | np.ndarray,
                    true_class: int, num_classes: int) -> VnnlibSpec:
    """The L∞ ball of radius ``eps`` around ``x0`` clipped to ``[lo, hi]``, unsafe when some
    ``Y_j >= Y_c`` (``j != c``)."""
    x = np.asarray(x0, dtype=np.float64).reshape(-1)
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    if not 0 <= true_class < num_classes or num_classes < 2:
        raise ValueError(f"true class {true_class} is not in range({num_classes}) (need >= 2 classes)")
    lo_arr = np.broadcast_to(np.asarray(lo, dtype=np.float64), x.shape)
    hi_arr = np.broadcast_to(np.asarray(hi, dtype=np.float64), x.shape)
    lb = np.maximum(x - eps, lo_arr)
    ub = np.minimum(x + eps, hi_arr)
    if np.any(lb > ub):
        raise ValueError("x0 lies outside [lo, hi] by more than eps: empty box")
    disjuncts = []
    for j in range(num_classes):
        if j == true_class:
            continue
        A = np.zeros((1, num_classes))
        A[0, true_class], A[0, j] = 1.0, -1.0  # Y_c - Y_j <= 0  <=>  Y_j >= Y_c
        disjuncts.append((A, np.zeros(1)))
    return VnnlibSpec(lb=lb, ub=ub, disjuncts=tuple(disjuncts), num_outputs=num_classes)


# ---------------------------------------------------------------------------------------------
# writing


def format_real(v: float) -> str:
    """Shortest positional decimal that parses back to the same float64 (``1e-05`` → ``0.00001``)."""
    v = float(v)
    if not np.isfinite(v):
        raise ValueError(f"VNN-LIB has no literal for {v}")
    return np.format_float_positional(np.float64(v), unique=True, trim="0")


def _row_to_sexpr(a: np.ndarray, b: float) -> str:
    nz = np.flatnonzero(a)
    # the robustness form, as verifiers expect it: (>= Y_j Y_c)
    if b == 0 and nz.size == 2 and sorted(a[nz].tolist()) == [-1.0, 1.0]:
        pos, neg = (nz[0], nz[1]) if a[nz[0]] > 0 else (nz[1], nz[0])
        return f"(>= Y_{neg} Y_{pos})"
    if nz.size == 1 and a[nz[0]] == 1.0:
        return f"(<= Y_{nz[0]} {format_real(b)})"
    if nz.size == 1 and a[nz[0]] == -1.0:
        return f"(>= Y_{nz[0]} {format_real(-b)})"
    terms = [f"(* {format_real(a[k])} Y_{k})" for k in nz]
    lhs = terms[0] if len(terms) == 1 else "(+ " + " ".join(terms) + ")"
    return f"(<= {lhs} {format_real(b)})"


def format_vnnlib(spec: VnnlibSpec, comment: str | None = None) -> str:
    """VNN-LIB 1.0 text of ``spec`` (see the module docstring for the layout)."""
    out = io.StringIO()
    if comment:
        for line in comment.splitlines():
            out.write(f"; {line}\n")
    for i in range(spec.num_inputs):
        out.write(f"(declare-const X_{i} Real)\n")
    out.write("\n")
    for j in range(spec.num_outputs):
        out.write(f"(declare-const Y_{j} Real)\n")
    out.write("\n")
    for i, (lo, hi) in enumerate(zip(spec.lb, spec.ub)):
        out.write(f"(assert (<= X_{i} {format_real(hi)}))\n")
        out.write(f"(assert (>= X_{i} {format_real(lo)}))\n")
    out.write("\n")
    if not spec.disjuncts:
        raise ValueError("a property needs at least one unsafe disjunct")
    out.write("(assert (or\n")
    for A, b in spec.disjuncts:
        rows = " ".join(_row_to_sexpr(A[r], float(b[r])) for r in range(A.shape[0]))
        out.write(f"    (and {rows})\n")
    out.write("))\n")
    return out.getvalue()


def write_vnnlib(path: str | Path, spec: VnnlibSpec, comment: str | None = None) -> Path:
    path = Path(path)
    atomic_write_text(path, format_vnnlib(spec, comment))
    return path


def write_robustness_vnnlib(path: str | Path, x0: np.ndarray, eps: float, lo: float | np.ndarray,
                            hi: float | np.ndarray, true_class: int, num_classes: int) -> VnnlibSpec:
    """Write the L∞ robustness property (see ``robustness_spec``) and return its spec."""
    spec = robustness_spec(x0, eps, lo, hi, true_class, num_classes)
    write_vnnlib(path, spec, comment=f"L-inf robustness: eps={format_real(eps)}, "
                                     f"true class {true_class} of {num_classes}")
    return spec


def write_instances_csv(path: str | Path, rows: Iterable[tuple[str, str, float]]) -> Path:
    """VNN-COMP ``instances.csv``: ``onnx,vnnlib,timeout_s`` per row, paths relative to the
    benchmark folder, no header."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for onnx_path, vnnlib_path, timeout_s in rows:
        t = float(timeout_s)
        writer.writerow([str(onnx_path), str(vnnlib_path), str(int(t)) if t.is_integer() else repr(t)])
    path = Path(path)
    atomic_write_text(path, buf.getvalue())
    return path


def read_instances_csv(path: str | Path) -> list[tuple[str, str, float]]:
    """Rows of an instances.csv; a malformed row raises ValueError naming its line."""
    out = []
    with open(path, newline="") as f:
        for i, r in enumerate(csv.reader(f), 1):
            if not r or not "".join(r).strip():
                continue
            if len(r) < 3:
                raise ValueError(f"{path}:{i}: expected onnx,vnnlib,timeout, got {','.join(r)!r}")
            try:
                out.append((r[0].strip(), r[1].strip(), float(r[2])))
            except ValueError:
                raise ValueError(f"{path}:{i}: timeout {r[2]!r} is not a number") from None
    return out


def write_robustness_benchmark(out_dir: str | Path, onnx_path: str | Path, inputs: np.ndarray,
                               labels: Sequence[int], eps: float, lo: float | np.ndarray,
                               hi: float | np.ndarray, num_classes: int, timeout_s: float,
                               prefix: str = "prop") -> list[tuple[str, str, float]]:
    """VNN-COMP layout under ``out_dir``: ``onnx/<model>.onnx`` (a copy), one
    ``vnnlib/<prefix>_<k>_eps_<eps>.vnnlib`` per input, and ``instances.csv``.

    ``inputs``: (n, ...) in the ONNX model's input units; returns the instance rows."""
    out = Path(out_dir)
    onnx_rel = Path("onnx") / Path(onnx_path).name
    with atomic_path(out / onnx_rel) as tmp:
        shutil.copyfile(onnx_path, tmp)
    xs = np.asarray(inputs, dtype=np.float64).reshape(len(labels), -1)
    rows = []
    for k, (x, c) in enumerate(zip(xs, labels)):
        rel = Path("vnnlib") / f"{prefix}_{k}_eps_{format_real(eps)}.vnnlib"
        write_robustness_vnnlib(out / rel, x, eps, lo, hi, int(c), num_classes)
        rows.append((onnx_rel.as_posix(), rel.as_posix(), float(timeout_s)))
    write_instances_csv(out / "instances.csv", rows)
    return rows


# ---------------------------------------------------------------------------------------------
# parsing

_TOKEN = re.compile(r"\(|\)|[^\s()]+")
_VAR = re.compile(r"^([XY])_(\d+)$")
_NUM = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _tokenize(text: str) -> list[str]:
    text = re.sub(r";[^\n]*", "", text)  # comments
    return _TOKEN.findall(text)


def _read_sexprs(tokens: list[str]) -> list:
    stack: list[list] = [[]]
    for tok in tokens:
        if tok == "(":
            stack.append([])
        elif tok == ")":
            if len(stack) == 1:
                raise ValueError("unbalanced ')'")
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(tok)
    if len(stack) != 1:
        raise ValueError("unbalanced '('")
    return stack[0]


# A linear term: ({("X"|"Y", index): coefficient}, constant)
_Lin = tuple[dict[tuple[str, int], float], float]


def _linear(expr) -> _Lin:
    if isinstance(expr, str):
        m = _VAR.match(expr)
        if m:
            return {(m.group(1), int(m.group(2))): 1.0}, 0.0
        if _NUM.match(expr):
            return {}, float(expr)
        raise ValueError(f"unknown symbol {expr!r}")
    if not expr or not isinstance(expr[0], str):
        raise ValueError(f"not a term: {expr!r}")
    head, args = expr[0], [_linear(a) for a in expr[1:]]
    if head == "+" or (head == "-" and len(args) >= 1):
        coeffs: dict[tuple[str, int], float] = {}
        const = 0.0
        for k, (c, v) in enumerate(args):
            sign = -1.0 if head == "-" and (k > 0 or len(args) == 1) else 1.0
            for var, a in c.items():
                coeffs[var] = coeffs.get(var, 0.0) + sign * a
            const += sign * v
        return coeffs, const
    if head == "*":
        coeffs, const = {}, 1.0
        for c, v in args:
            if c and coeffs:
                raise ValueError("nonlinear product")
            if c:
                coeffs = {var: a * const for var, a in c.items()}
                const = v * const
            else:
                coeffs = {var: a * v for var, a in coeffs.items()}
                const *= v
        return coeffs, const
    raise ValueError(f"unsupported operator {head!r}")


# An atom in normal form: (coeffs, rhs) meaning sum(coeffs * vars) <= rhs
_Atom = tuple[dict[tuple[str, int], float], float]


def _atom(expr) -> _Atom:
    if not isinstance(expr, list) or not expr:
        raise ValueError(f"not a comparison: {expr!r}")
    op = expr[0]
    if op not in ("<=", ">=") or len(expr) != 3:
        raise ValueError(f"unsupported comparison {expr!r}")
    (cl, vl), (cr, vr) = _linear(expr[1]), _linear(expr[2])
    coeffs = dict(cl)
    for var, a in cr.items():
        coeffs[var] = coeffs.get(var, 0.0) - a
    rhs = vr - vl
    if op == ">=":
        coeffs, rhs = {var: -a for var, a in coeffs.items()}, 0.0 - rhs
    coeffs = {var: a for var, a in coeffs.items() if a != 0.0}
    if len({name for name, _ in coeffs}) > 1:
        raise ValueError(f"comparisons that mix inputs and outputs are not supported: {expr!r}")
    return coeffs, rhs


def _dnf(expr) -> list[list[_Atom]]:
    """Disjunctive normal form of a boolean term: a list of conjunctions of atoms."""
    if not isinstance(expr, list) or not expr:
        raise ValueError(f"not a formula: {expr!r}")
    head = expr[0]
    if head == "or":
        return [conj for arg in expr[1:] for conj in _dnf(arg)]
    if head == "and":
        result: list[list[_Atom]] = [[]]
        for arg in expr[1:]:
            result = [a + b for a in result for b in _dnf(arg)]
        return result
    return [[_atom(expr)]]


def _kind(atom: _Atom) -> str:
    return next(iter(atom[0]))[0] if atom[0] else "const"


def parse_vnnlib_all(text: str) -> list[VnnlibSpec]:
    """Parse VNN-LIB 1.0 text into one spec per input box (see the module doc)."""
    inputs: set[int] = set()
    outputs: set[int] = set()
    box_atoms: list[_Atom] = []  # asserts that bound inputs outside any disjunction
    terms: list[list[list[_Atom]]] = []  # every other assert, in DNF
    for form in _read_sexprs(_tokenize(text)):
        if not isinstance(form, list) or not form:
            raise ValueError(f"unexpected top-level form {form!r}")
        if form[0] == "declare-const":
            m = _VAR.match(form[1]) if len(form) == 3 and isinstance(form[1], str) else None
            if not m or form[2] != "Real":
                raise ValueError(f"unsupported declaration {form!r}")
            (inputs if m.group(1) == "X" else outputs).add(int(m.group(2)))
        elif form[0] == "assert":
            if len(form) != 2:
                raise ValueError(f"assert takes one formula: {form!r}")
            dnf = _dnf(form[1])
            if len(dnf) == 1 and all(_kind(a) == "X" for a in dnf[0]):
                box_atoms.extend(dnf[0])
            else:
                terms.append(dnf)
        else:
            raise ValueError(f"unsupported command {form[0]!r}")
    n, m = len(inputs), len(outputs)
    if inputs != set(range(n)) or outputs != set(range(m)):
        raise ValueError("inputs and outputs must be numbered X_0..X_{n-1}, Y_0..Y_{m-1}")
    if n == 0 or m == 0:
        raise ValueError("a property needs declared inputs X_i and outputs Y_j")
    combined: list[list[_Atom]] = [[]]
    for dnf in terms:
        combined = [a + b for a in combined for b in dnf]
        if len(combined) > 100_000:
            raise ValueError("the property's disjunctive normal form has over 100000 terms")
    by_box: dict[tuple, list[list[_Atom]]] = {}
    for conj in combined:
        xs = [a for a in conj if _kind(a) == "X"]
        ys = [a for a in conj if _kind(a) != "X"]
        key = tuple(sorted((tuple(sorted(c.items())), r) for c, r in xs))
        by_box.setdefault(key, []).append(ys)
    specs = []
    for key, output_conjs in by_box.items():
        lb, ub = _box(n, box_atoms + [(dict(c), r) for c, r in key])
        disjuncts = []
        for conj in output_conjs:
            rows = [a for a in conj if _kind(a) == "Y"] or [({}, 0.0)]  # no output condition: always unsafe
            if any(_kind(a) == "const" and a[1] < 0 for a in conj):
                continue  # a constant contradiction (0 <= negative): this disjunct is empty
            A, b = np.zeros((len(rows), m)), np.zeros(len(rows))
            for r, (coeffs, rhs) in enumerate(rows):
                for (_, j), a in coeffs.items():
                    if j not in outputs:
                        raise ValueError(f"undeclared output Y_{j}")
                    A[r, j] = a
                b[r] = rhs
            disjuncts.append((A, b))
        if disjuncts:
            specs.append(VnnlibSpec(lb=lb, ub=ub, disjuncts=tuple(disjuncts), num_outputs=m))
    if not specs:
        raise ValueError("the property has no unsafe disjunct (it is trivially unsat); nothing to verify")
    return specs


def _box(n: int, atoms: list[_Atom]) -> tuple[np.ndarray, np.ndarray]:
    lb, ub = np.full(n, -np.inf), np.full(n, np.inf)
    for coeffs, rhs in atoms:
        if len(coeffs) != 1:
            raise ValueError("input constraints must bound one input each (a box)")
        ((_, i), a), = coeffs.items()
        if i >= n:
            raise ValueError(f"undeclared input X_{i}")
        if a > 0:
            ub[i] = min(ub[i], rhs / a)
        else:
            lb[i] = max(lb[i], rhs / a)
    if not (np.all(np.isfinite(lb)) and np.all(np.isfinite(ub))):
        raise ValueError(f"inputs without both bounds: {np.flatnonzero(~(np.isfinite(lb) & np.isfinite(ub))).tolist()[:10]}")
    if np.any(lb > ub):
        raise ValueError(f"empty input box: lb > ub at X_{int(np.flatnonzero(lb > ub)[0])}")
    return lb, ub


def parse_vnnlib(text: str) -> VnnlibSpec:
    """Parse VNN-LIB 1.0 text with one input box (see `parse_vnnlib_all` for several)."""
    specs = parse_vnnlib_all(text)
    if len(specs) != 1:
        raise ValueError(f"the property has {len(specs)} input boxes; read it with parse_vnnlib_all")
    return specs[0]


def read_text(path: str | Path) -> str:
    """A text file, gunzipped when its name ends in .gz (VNN-COMP ships benchmarks that way)."""
    path = Path(path)
    if path.suffix == ".gz":
        with gzip.open(path, "rt") as f:
            return f.read()
    return path.read_text()


def read_vnnlib(path: str | Path) -> VnnlibSpec:
    return parse_vnnlib(read_text(path))


def read_vnnlib_all(path: str | Path) -> list[VnnlibSpec]:
    return parse_vnnlib_all(read_text(path))


# ---------------------------------------------------------------------------------------------
# witnesses

_PAIR = re.compile(r"\(\s*([XY])_(\d+)\s+([^\s()]+)\s*\)")


def format_witness(x: np.ndarray, y: np.ndarray) -> str:
    """VNN-COMP's counterexample: ``sat`` then ``((X_0 v) … (Y_0 v) …)``, one pair per line."""
    pairs = [f"(X_{i} {format_real(v)})" for i, v in enumerate(np.asarray(x, dtype=np.float64).reshape(-1))]
    pairs += [f"(Y_{j} {format_real(v)})" for j, v in enumerate(np.asarray(y, dtype=np.float64).reshape(-1))]
    return "sat\n(" + "\n ".join(pairs) + ")\n"


def parse_witness(text: str) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) from a witness (the leading ``sat`` line is optional)."""
    vals: dict[str, dict[int, float]] = {"X": {}, "Y": {}}
    for kind, idx, v in _PAIR.findall(text):
        vals[kind][int(idx)] = float(v)
    out = []
    for kind in "XY":
        d = vals[kind]
        if sorted(d) != list(range(len(d))):
            raise ValueError(f"witness {kind}_i are not numbered 0..{len(d) - 1}")
        out.append(np.array([d[i] for i in range(len(d))], dtype=np.float64))
    if out[0].size == 0:
        raise ValueError("witness has no (X_i v) pairs")
    return out[0], out[1]
