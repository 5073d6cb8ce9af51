"""Verifiers end to end through ONNX + VNN-LIB files on a tiny ReLU network whose answers are
known independently: a property that IBP (sound, tested in test_verify_intervals) proves, and one
with a sampled witness of another class inside the box."""

from __future__ import annotations

import os
import stat
import time

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from analysis.intervals import forward, layers_from_torch
from analysis.verifiers import (BOX_TOL, EXPORT_ATOL, VERIFIERS, MarabouVerifier, MilpVerifier, Result,
                                Verifier, available_verifiers, check_counterexample, get_verifier,
                                onnx_forward, to_verifier_onnx)
from analysis.vnnlib import read_vnnlib, write_robustness_vnnlib

needs_marabou = pytest.mark.skipif(not MarabouVerifier.available(), reason="maraboupy is not installed")

IN_SHAPE = (4,)
NUM_CLASSES = 3
TIMEOUT_S = 60
# A sampled witness must beat the true class by this much, so it is no float32 tie.
WITNESS_MARGIN = 1e-3
# Extra wall time allowed over timeout + grace for the hard-kill path.
KILL_SLACK_S = 5.0


class Normalize(nn.Module):
    def __init__(self, scale, shift):
        super().__init__()
        self.register_buffer("scale", torch.as_tensor(scale, dtype=torch.float32))
        self.register_buffer("shift", torch.as_tensor(shift, dtype=torch.float32))

    def forward(self, x):
        return x * self.scale + self.shift


def tiny_model() -> nn.Sequential:
    torch.manual_seed(0)  # this seed predicts two classes over [0, 1]^4 (many seeds give one)
    return nn.Sequential(Normalize([2.0, 1.0, 0.5, 3.0], [-1.0, 0.0, 0.5, -0.2]),
                         nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, NUM_CLASSES)).eval()


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """ONNX model, a property that holds and one that fails, with the facts that make them known."""
    root = tmp_path_factory.mktemp("bench")
    model = tiny_model()
    onnx_path = to_verifier_onnx(model, IN_SHAPE, root / "onnx" / "tiny.onnx")
    layers = layers_from_torch(model, IN_SHAPE)
    rng = np.random.default_rng(0)
    xs = rng.uniform(0, 1, (20000, 4))
    ys = forward(layers, xs)
    top2 = np.sort(ys, axis=1)[:, -2:]
    # the point with the largest top-1 margin: a tiny ball around it is robust
    i0 = int(np.argmax(top2[:, 1] - top2[:, 0]))
    x0, c = xs[i0], int(np.argmax(ys[i0]))
    # the nearest sample (L∞) that another class wins clearly: any ball reaching it is not robust
    other = np.max(np.delete(ys, c, axis=1), axis=1) - ys[:, c] >= WITNESS_MARGIN
    assert other.any(), "the seeded network predicts one class everywhere; pick another seed"
    dist = np.where(other, np.max(np.abs(xs - x0), axis=1), np.inf)
    iw = int(np.argmin(dist))
    eps_fail = float(dist[iw]) * 1.001
    holds = write_robustness_vnnlib(root / "vnnlib" / "holds.vnnlib", x0, 1e-3, 0.0, 1.0, c, NUM_CLASSES)
    fails = write_robustness_vnnlib(root / "vnnlib" / "fails.vnnlib", x0, eps_fail, 0.0, 1.0, c, NUM_CLASSES)
    assert fails.in_box(xs[iw]) and fails.violation(ys[iw]) <= -WITNESS_MARGIN
    # the holding property is proved by IBP, which is sound (see test_verify_intervals)
    assert get_verifier("ibp").verify(onnx_path, root / "vnnlib" / "holds.vnnlib", TIMEOUT_S).status == "verified"
    return dict(root=root, model=model, onnx=onnx_path, layers=layers, x0=x0, c=c, eps_fail=eps_fail,
                holds=root / "vnnlib" / "holds.vnnlib", fails=root / "vnnlib" / "fails.vnnlib",
                holds_spec=holds, fails_spec=fails)


# "milp-only": no PGD attack and no LP relaxation first, so the MILP itself must decide.
VARIANTS = {
    "milp": lambda: get_verifier("milp"),
    "milp-only": lambda: MilpVerifier(lp_first=False, attack_steps=0),
    "marabou": lambda: get_verifier("marabou"),
    "ibp": lambda: get_verifier("ibp"),
}
COMPLETE = ["milp", "milp-only", pytest.param("marabou", marks=needs_marabou)]


@pytest.mark.parametrize("name", COMPLETE + ["ibp"])
def test_property_that_holds_is_verified(bench, name):
    r = VARIANTS[name]().verify(bench["onnx"], bench["holds"], TIMEOUT_S)
    assert r.status == "verified", r.message
    assert r.counterexample is None and r.seconds >= 0


@pytest.mark.parametrize("name", COMPLETE)
def test_property_that_fails_is_falsified_with_a_checked_counterexample(bench, name):
    r = VARIANTS[name]().verify(bench["onnx"], bench["fails"], TIMEOUT_S)
    assert r.status == "falsified", r.message
    assert ("MILP counterexample" in r.message) if name == "milp-only" else True
    x = r.counterexample
    spec = bench["fails_spec"]
    assert spec.in_box(x, tol=BOX_TOL)
    ok, why = check_counterexample(bench["onnx"], spec, x)
    assert ok, why
    # independent of the spec machinery: another class reaches the true class's logit
    y = onnx_forward(bench["onnx"], x)
    assert np.max(np.delete(y, bench["c"])) >= y[bench["c"]] - 1e-5 * max(1.0, np.max(np.abs(y)))


def test_ibp_does_not_claim_the_false_property(bench):
    assert get_verifier("ibp").verify(bench["onnx"], bench["fails"], TIMEOUT_S).status == "unknown"


@pytest.mark.parametrize("eps_scale", [0.05, 0.7, 0.9, 1.5])
def test_complete_verifiers_agree_and_match_sampling(bench, eps_scale):
    """0.05: IBP proves it; 0.7: holds but IBP cannot tell (unstable ReLUs); 0.9, 1.5: false."""
    eps = bench["eps_fail"] * eps_scale
    path = bench["root"] / "vnnlib" / f"scan_{eps_scale}.vnnlib"
    spec = write_robustness_vnnlib(path, bench["x0"], eps, 0.0, 1.0, bench["c"], NUM_CLASSES)
    names = ["milp", "milp-only"] + (["marabou"] if MarabouVerifier.available() else [])
    statuses = {n: VARIANTS[n]().verify(bench["onnx"], path, TIMEOUT_S).status for n in names}
    assert len(set(statuses.values())) == 1 and statuses["milp"] in ("verified", "falsified"), statuses
    if statuses["milp"] == "verified":  # no sampled point may contradict a proof
        xs = np.random.default_rng(1).uniform(spec.lb, spec.ub, (5000, 4))
        ys = forward(bench["layers"], xs)
        assert np.all(np.argmax(ys, axis=1) == bench["c"])
    if eps_scale >= 1.0:
        assert statuses["milp"] == "falsified"  # the sampled witness is inside the box
    if eps_scale == 0.7:  # this case needs a complete verifier
        assert statuses["milp"] == "verified"
        assert get_verifier("ibp").verify(bench["onnx"], path, TIMEOUT_S).status == "unknown"


class _Fixed(Verifier):
    """Reports a given counterexample, to exercise the onnxruntime re-check."""

    def __init__(self, x):
        self.x = x

    def _solve(self, onnx_path, vnnlib_path, spec, timeout_s):
        return "falsified", self.x, "fake"


def test_counterexample_failing_the_recheck_becomes_error(bench):
    # the centre of a robust ball is safe
    r = _Fixed(bench["x0"].copy()).verify(bench["onnx"], bench["fails"], TIMEOUT_S)
    assert r.status == "error" and "re-check" in r.message and "not unsafe" in r.message
    assert r.counterexample is None
    # a point outside the box, however unsafe, is not a counterexample to this property
    outside = bench["x0"] + 10 * bench["eps_fail"]
    r = _Fixed(outside).verify(bench["onnx"], bench["fails"], TIMEOUT_S)
    assert r.status == "error" and "outside the input box" in r.message


def test_milp_timeout_and_shape_mismatch(bench, tmp_path):
    assert get_verifier("milp").verify(bench["onnx"], bench["fails"], 0).status == "timeout"
    wrong = write_robustness_vnnlib(tmp_path / "w.vnnlib", np.zeros(5), 0.1, 0, 1, 0, NUM_CLASSES)
    assert wrong.num_inputs == 5
    for name in ["milp", "ibp"]:
        r = get_verifier(name).verify(bench["onnx"], tmp_path / "w.vnnlib", TIMEOUT_S)
        assert r.status == "error", (name, r)


def test_registry():
    assert {"marabou", "milp", "ibp"} <= set(VERIFIERS)
    assert {"milp", "ibp"} <= set(available_verifiers())
    with pytest.raises(KeyError, match="choose one of"):
        get_verifier("nope")
    with pytest.raises(ValueError):
        Result("proved", 0.0)
    assert isinstance(get_verifier("milp", margin=1e-3), MilpVerifier)


def _fake_python(tmp_path, body: str) -> str:
    p = tmp_path / "fake_python"
    p.write_text(f"#!/bin/sh\n{body}\n")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


def test_marabou_child_is_killed_at_the_hard_limit(bench, tmp_path):
    v = MarabouVerifier(grace_s=0.5, python=_fake_python(tmp_path, "exec sleep 60"))
    if not v.available():
        pytest.skip("maraboupy is not installed")
    start = time.perf_counter()
    r = v.verify(bench["onnx"], bench["holds"], 1)
    assert r.status == "timeout" and "killed" in r.message
    assert time.perf_counter() - start < 1 + 0.5 + KILL_SLACK_S


@needs_marabou
def test_marabou_child_without_result_is_an_error(bench, tmp_path):
    r = MarabouVerifier(python=_fake_python(tmp_path, "exit 3")).verify(bench["onnx"], bench["holds"], 5)
    assert r.status == "error" and "code 3" in r.message


class LambdaGelu(nn.Module):
    def __init__(self, lam):
        super().__init__()
        self.lam = lam

    def forward(self, x):
        return F.gelu(x * self.lam) / self.lam


@needs_marabou
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("opset, op", [(17, "Div"), (20, "Gelu")])
def test_marabou_rejects_smooth_lambda_gelu(bench, tmp_path, opset, op):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), LambdaGelu(10.0), nn.Linear(8, NUM_CLASSES)).eval()
    path = tmp_path / f"gelu{opset}.onnx"
    torch.onnx.export(model, (torch.zeros(1, 4),), str(path), dynamo=False, opset_version=opset,
                      input_names=["input"], output_names=["output"])
    r = get_verifier("marabou").verify(path, bench["holds"], 10)
    assert r.status == "error"
    assert r.message == f"NotImplementedError: Operation {op} not implemented"


def test_to_verifier_onnx_folds_normalization_exactly(tmp_path):
    torch.manual_seed(5)
    shape = (2, 3, 3)
    model = nn.Sequential(Normalize(torch.tensor([0.5, -2.0]).reshape(2, 1, 1),
                                    torch.tensor([0.1, -0.3]).reshape(2, 1, 1)),
                          nn.Flatten(), nn.Linear(18, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                          nn.Linear(16, 5)).eval()
    path = to_verifier_onnx(model, shape, tmp_path / "m.onnx")
    graph = onnx.load(str(path)).graph
    assert [n.op_type for n in graph.node] == ["Flatten", "Gemm", "Relu", "Gemm", "Relu", "Gemm"]
    assert [d.dim_value for d in graph.input[0].type.tensor_type.shape.dim] == [1, *shape]
    xs = torch.rand(32, *shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(xs).numpy()
    got = np.stack([onnx_forward(path, x.numpy()) for x in xs])
    np.testing.assert_allclose(got, ref, rtol=0, atol=EXPORT_ATOL)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert model.training is False and os.path.getsize(path) > 0


@needs_marabou
def test_milp_and_marabou_agree_on_random_networks(tmp_path):
    """Two independent complete methods on random 3-6-6-3 networks, with eps around the distance
    to the nearest sampled point of another class (so both answers occur)."""
    rng = np.random.default_rng(42)
    seen, used = set(), 0
    for seed in range(40):
        if used == 6:
            break
        torch.manual_seed(100 + seed)
        model = nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 3)).eval()
        onnx_path = to_verifier_onnx(model, (3,), tmp_path / f"r{seed}.onnx")
        layers = layers_from_torch(model, (3,))
        xs = rng.uniform(0, 1, (4000, 3))
        ys = forward(layers, xs)
        x0 = xs[0]
        c = int(np.argmax(ys[0]))
        other = np.argmax(ys, axis=1) != c
        if not other.any():
            continue  # one class everywhere: nothing to find
        dist = np.min(np.max(np.abs(xs[other] - x0), axis=1))
        eps = float(dist * (0.5 if used % 2 else 1.2))
        used += 1
        vnn = tmp_path / f"r{seed}.vnnlib"
        write_robustness_vnnlib(vnn, x0, eps, 0.0, 1.0, c, 3)
        a = MilpVerifier(lp_first=False, attack_steps=0).verify(onnx_path, vnn, TIMEOUT_S)
        b = get_verifier("marabou").verify(onnx_path, vnn, TIMEOUT_S)
        assert a.status == b.status and a.status in ("verified", "falsified"), (seed, a, b)
        seen.add(a.status)
    assert used == 6 and seen == {"verified", "falsified"}
