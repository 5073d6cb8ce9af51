"""VNN-LIB 1.0 writing and parsing (one and several input boxes, gzip), instances.csv, the VNN-COMP
benchmark layout, and counterexample witnesses."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from analysis.verification.vnnlib import (VnnlibSpec, format_real, format_vnnlib, format_witness, parse_vnnlib,
                                          parse_vnnlib_all, parse_witness, read_instances_csv, read_vnnlib,
                                          read_vnnlib_all, robustness_spec, write_instances_csv,
                                          write_robustness_benchmark, write_robustness_vnnlib, write_vnnlib)

finite = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False, width=64)


@st.composite
def robustness_cases(draw):
    n = draw(st.integers(1, 24))
    x0 = draw(arrays(np.float64, n, elements=finite))
    eps = draw(st.floats(min_value=0.0, max_value=10.0, allow_nan=False, width=64))
    lo = draw(st.floats(min_value=-2e3, max_value=-1e-3, width=64)) if draw(st.booleans()) else float(np.min(x0)) - 1.0
    hi = draw(st.floats(min_value=1e-3, max_value=2e3, width=64)) if draw(st.booleans()) else float(np.max(x0)) + 1.0
    lo, hi = min(lo, hi), max(lo, hi)
    x0 = np.clip(x0, lo, hi)
    k = draw(st.integers(2, 12))
    c = draw(st.integers(0, k - 1))
    return x0, eps, lo, hi, c, k


def _same_disjuncts(a: VnnlibSpec, b: VnnlibSpec) -> bool:
    return len(a.disjuncts) == len(b.disjuncts) and all(
        np.array_equal(A1, A2) and np.array_equal(b1, b2)
        for (A1, b1), (A2, b2) in zip(a.disjuncts, b.disjuncts))


@settings(max_examples=60, deadline=None)
@given(robustness_cases())
def test_robustness_file_parses_back_exactly(tmp_path_factory, case):
    x0, eps, lo, hi, c, k = case
    path = tmp_path_factory.mktemp("v") / "p.vnnlib"
    spec = write_robustness_vnnlib(path, x0, eps, lo, hi, c, k)
    back = read_vnnlib(path)
    # bitwise equal: the writer prints the shortest digits that round-trip a float64
    assert np.array_equal(back.lb, spec.lb) and np.array_equal(back.ub, spec.ub)
    assert np.array_equal(spec.lb, np.maximum(x0 - eps, lo)) and np.array_equal(spec.ub, np.minimum(x0 + eps, hi))
    assert back.num_outputs == k and _same_disjuncts(back, spec)
    # the unsafe set is exactly {some Y_j >= Y_c, j != c}: one disjunct per j, row Y_c - Y_j <= 0
    expected = {j for j in range(k) if j != c}
    got = set()
    for A, b in back.disjuncts:
        assert A.shape == (1, k) and b.tolist() == [0.0]
        (j,) = np.flatnonzero(A[0] == -1.0)
        assert A[0, c] == 1.0 and np.count_nonzero(A[0]) == 2
        got.add(int(j))
    assert got == expected


def test_robustness_file_layout(tmp_path):
    x0 = np.array([0.0, 0.25, 1.0])
    path = tmp_path / "p.vnnlib"
    write_robustness_vnnlib(path, x0, 0.1, 0.0, 1.0, true_class=1, num_classes=3)
    text = path.read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(";")]
    assert lines[:3] == [f"(declare-const X_{i} Real)" for i in range(3)]
    assert lines[3:6] == [f"(declare-const Y_{j} Real)" for j in range(3)]
    # one pair of bound asserts per input, clipped to [0, 1]
    assert lines[6:12] == ["(assert (<= X_0 0.1))", "(assert (>= X_0 0.0))",
                           "(assert (<= X_1 0.35))", "(assert (>= X_1 0.15))",
                           "(assert (<= X_2 1.0))", "(assert (>= X_2 0.9))"]
    assert re.sub(r"\s+", " ", " ".join(lines[12:])) == "(assert (or (and (>= Y_0 Y_1)) (and (>= Y_2 Y_1)) ))"
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*"))


def test_format_real_is_exact_and_positional():
    for v in [0.1, 1e-5, 1 / 3, -2.5e-7, 123456.789, 0.0, -0.0, 1.0, 0.30000000000000004]:
        s = format_real(v)
        assert "e" not in s.lower() and float(s) == v
    with pytest.raises(ValueError):
        format_real(float("inf"))


def test_parser_reads_vnncomp_style_linear_constraints():
    text = """
    ; comment line
    (declare-const X_0 Real)
    (declare-const X_1 Real)
    (declare-const Y_0 Real) (declare-const Y_1 Real) (declare-const Y_2 Real)
    (assert (>= X_0 -1e-1))  ; trailing comment
    (assert (<= X_0 0.5))
    (assert (<= -0.25 X_1))
    (assert (>= 2.0 X_1))
    (assert (or (and (<= Y_0 Y_1) (<= Y_0 Y_2))
                (and (>= (- Y_2 Y_1) 0.5))))
    (assert (<= (+ (* 2.0 Y_0) Y_2) 3.0))
    """
    spec = parse_vnnlib(text)
    np.testing.assert_array_equal(spec.lb, [-0.1, -0.25])
    np.testing.assert_array_equal(spec.ub, [0.5, 2.0])
    assert spec.num_outputs == 3 and len(spec.disjuncts) == 2
    (A0, b0), (A1, b1) = spec.disjuncts
    # conjunction with the last assert is distributed into every disjunct
    np.testing.assert_array_equal(A0, [[1, -1, 0], [1, 0, -1], [2, 0, 1]])
    np.testing.assert_array_equal(b0, [0, 0, 3])
    np.testing.assert_array_equal(A1, [[0, 1, -1], [2, 0, 1]])
    np.testing.assert_array_equal(b1, [-0.5, 3])
    assert spec.violation(np.array([0.0, 1.0, 1.0])) <= 0  # first disjunct holds
    assert spec.violation(np.array([5.0, 0.0, 0.0])) > 0


@st.composite
def general_specs(draw):
    n = draw(st.integers(1, 6))
    m = draw(st.integers(1, 5))
    lb = draw(arrays(np.float64, n, elements=finite))
    ub = lb + draw(arrays(np.float64, n, elements=st.floats(0, 10, width=64)))
    coef = st.sampled_from([0.0, 1.0, -1.0, 0.5, -3.25, 1e-4])
    disjuncts = []
    for _ in range(draw(st.integers(1, 4))):
        rows = draw(st.integers(1, 3))
        A = draw(arrays(np.float64, (rows, m), elements=coef))
        A[:, 0] = np.where(np.all(A == 0, axis=1), 1.0, A[:, 0])  # no empty rows
        b = draw(arrays(np.float64, rows, elements=finite))
        disjuncts.append((A, b))
    return VnnlibSpec(lb=lb, ub=ub, disjuncts=tuple(disjuncts), num_outputs=m)


@settings(max_examples=60, deadline=None)
@given(general_specs())
def test_general_spec_round_trip(spec):
    back = parse_vnnlib(format_vnnlib(spec))
    assert np.array_equal(back.lb, spec.lb) and np.array_equal(back.ub, spec.ub)
    assert back.num_outputs == spec.num_outputs
    for (A1, b1), (A2, b2) in zip(back.disjuncts, spec.disjuncts):
        # rows with a single +-1 coefficient are written as bounds: compare as normalized rows
        np.testing.assert_array_equal(A1, A2)
        np.testing.assert_array_equal(b1, b2)


@pytest.mark.parametrize("text, match", [
    ("(declare-const X_0 Real)(declare-const Y_0 Real)(assert (<= X_0 1.0))(assert (or (and (>= Y_0 0.0))))",
     "without both bounds"),
    ("(declare-const X_0 Real)(declare-const Y_0 Real)(assert (<= X_0 1.0))(assert (>= X_0 0.0))"
     "(assert (<= X_0 Y_0))", "mix inputs and outputs"),
    ("(declare-const X_0 Real)(declare-const Y_0 Real)(assert (<= X_0 0.0))(assert (>= X_0 1.0))"
     "(assert (>= Y_0 0.0))", "empty input box"),
    ("(declare-const X_0 Real)(declare-const Y_0 Real)(assert (<= X_0 1.0))(assert (>= X_0 0.0))"
     "(assert (or (and (>= Y_0 0.0)) (and (<= Y_0 -1.0) (frob Y_0))))", "unsupported comparison"),
    ("(declare-const X_0 Real)(assert (<= X_0 1.0)", "unbalanced"),
    ("(declare-const X_0 Int)", "unsupported declaration"),
    ("(declare-const X_1 Real)(declare-const Y_0 Real)(assert (<= X_1 1.0))(assert (>= X_1 0.0))", "numbered"),
])
def test_parser_rejects_what_it_cannot_represent(text, match):
    with pytest.raises(ValueError, match=match):
        parse_vnnlib(text)


def test_robustness_spec_validates_arguments():
    with pytest.raises(ValueError):
        robustness_spec(np.zeros(2), 0.1, 0.0, 1.0, true_class=3, num_classes=3)
    with pytest.raises(ValueError):
        robustness_spec(np.zeros(2), -0.1, 0.0, 1.0, true_class=0, num_classes=3)
    with pytest.raises(ValueError):
        robustness_spec(np.full(2, 5.0), 0.1, 0.0, 1.0, true_class=0, num_classes=3)  # empty box


def test_instances_csv_and_benchmark_layout(tmp_path):
    onnx_src = tmp_path / "model.onnx"
    onnx_src.write_bytes(b"not really onnx")
    xs = np.linspace(0, 1, 6).reshape(2, 3)
    rows = write_robustness_benchmark(tmp_path / "bench", onnx_src, xs, [0, 2], eps=0.01, lo=0.0, hi=1.0,
                                      num_classes=3, timeout_s=60)
    bench = tmp_path / "bench"
    assert read_instances_csv(bench / "instances.csv") == rows
    assert (bench / "instances.csv").read_text().splitlines()[0] == \
        "onnx/model.onnx,vnnlib/prop_0_eps_0.01.vnnlib,60"
    for onnx_rel, vnn_rel, timeout in rows:
        assert (bench / onnx_rel).read_bytes() == b"not really onnx" and timeout == 60.0
        spec = read_vnnlib(bench / vnn_rel)
        assert spec.num_inputs == 3 and spec.num_outputs == 3
    spec1 = read_vnnlib(bench / rows[1][1])
    assert np.array_equal(spec1.ub, np.minimum(xs[1] + 0.01, 1.0))
    assert not [p for p in bench.rglob("*") if p.name.endswith(".tmp")]

    write_instances_csv(tmp_path / "i.csv", [("onnx/a.onnx", "vnnlib/b.vnnlib", 2.5)])
    assert read_instances_csv(tmp_path / "i.csv") == [("onnx/a.onnx", "vnnlib/b.vnnlib", 2.5)]


def test_write_is_atomic_on_failure(tmp_path):
    path = tmp_path / "p.vnnlib"
    write_robustness_vnnlib(path, np.zeros(2), 0.1, -1.0, 1.0, 0, 2)
    before = path.read_text()
    bad = VnnlibSpec(lb=np.zeros(2), ub=np.ones(2), disjuncts=(), num_outputs=2)
    with pytest.raises(ValueError):
        write_vnnlib(path, bad)  # fails while formatting: the old file stays whole
    assert path.read_text() == before and not list(tmp_path.glob(".*tmp"))


def test_several_input_boxes_and_mixed_conjunctions():
    """VNN-COMP writes some properties as (or (and <input box> <output condition>) ...)."""
    text = """
    (declare-const X_0 Real) (declare-const X_1 Real) (declare-const Y_0 Real) (declare-const Y_1 Real)
    (assert (<= X_1 1.0)) (assert (>= X_1 0.0))
    (assert (or (and (>= X_0 0.0) (<= X_0 0.5) (>= Y_0 Y_1))
                (and (>= X_0 0.5) (<= X_0 1.0) (<= Y_0 -2.0))
                (and (>= X_0 0.5) (<= X_0 1.0) (>= Y_1 3.0))))
    """
    specs = parse_vnnlib_all(text)
    assert len(specs) == 2
    a, b = specs
    np.testing.assert_array_equal(a.lb, [0.0, 0.0])
    np.testing.assert_array_equal(a.ub, [0.5, 1.0])
    np.testing.assert_array_equal(b.lb, [0.5, 0.0])
    np.testing.assert_array_equal(b.ub, [1.0, 1.0])
    assert len(a.disjuncts) == 1 and len(b.disjuncts) == 2
    assert a.violation(np.array([1.0, 0.0])) <= 0 and b.violation(np.array([0.0, 3.0])) <= 0
    with pytest.raises(ValueError, match="2 input boxes"):
        parse_vnnlib(text)


def test_gzipped_property_reads_like_the_plain_one(tmp_path):
    import gzip

    spec = write_robustness_vnnlib(tmp_path / "p.vnnlib", np.linspace(0, 1, 5), 0.1, 0.0, 1.0, 1, 3)
    with gzip.open(tmp_path / "p.vnnlib.gz", "wt") as f:
        f.write((tmp_path / "p.vnnlib").read_text())
    (back,) = read_vnnlib_all(tmp_path / "p.vnnlib.gz")
    assert np.array_equal(back.lb, spec.lb) and _same_disjuncts(back, spec)


@settings(max_examples=40, deadline=None)
@given(arrays(np.float64, st.integers(1, 30), elements=finite), arrays(np.float64, st.integers(1, 12), elements=finite))
def test_witness_round_trip(x, y):
    text = format_witness(x, y)
    assert text.startswith("sat\n((X_0 ") and text.rstrip().endswith(")")
    assert re.fullmatch(r"sat\n\((\([XY]_\d+ [-0-9.]+\)\n ?)*\([XY]_\d+ [-0-9.]+\)\)\n", text)
    bx, by = parse_witness(text)
    assert np.array_equal(bx, x) and np.array_equal(by, y)


def test_files_are_readable_by_others(tmp_path):
    import stat

    path = write_vnnlib(tmp_path / "p.vnnlib", robustness_spec(np.zeros(2), 0.1, -1.0, 1.0, 0, 2))
    write_instances_csv(tmp_path / "instances.csv", [("a.onnx", "p.vnnlib", 1)])
    for p in (path, tmp_path / "instances.csv"):
        assert p.stat().st_mode & stat.S_IROTH, oct(p.stat().st_mode)
