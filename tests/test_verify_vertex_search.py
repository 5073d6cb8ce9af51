"""The attack scored on the model itself (`attack.vertex_search`, the int8 probe in `pgd_verifier.PgdVerifier`): on
functions with no useful gradient it finds a strictly unsafe point, reports a tie (margin exactly 0) as a tie and
never as a counterexample, keeps to the box and its time; on a quantized network its answers agree with exhaustive
enumeration of the input grid in onnxruntime; a tie ends the staged chain with reason ``tie``."""

from __future__ import annotations

import time

import numpy as np
import torch

from analysis.verification import attack
from analysis.verification.graph import Graph
from analysis.verification.ops.affine import Linear
from analysis.verification.ops.rounding import QuantizedInput, Rounding
from analysis.verification.pgd_verifier import PgdVerifier
from analysis.verification.problem import Budget, Problem, float32_in_box, open_reason
from analysis.verification.quantized import grid_index
from analysis.verification.readers import from_onnx
from analysis.verification.registry import get_verifier
from analysis.verification.vnnlib import VnnlibSpec, robustness_spec
from quantize import ort as ort_util
from test_verify_int8 import _tiny

N = 40  # inputs of the synthetic staircases


def _two_class(score) -> callable:
    """Outputs [y_0, y_1] = [0, score(x)]: the property "y_0 > y_1" is violated where score ≥ 0."""
    return lambda xs: np.stack([np.zeros(len(xs)), score(np.asarray(xs))], 1)


def _spec(lo: float = 0.0, hi: float = 1.0) -> VnnlibSpec:
    return robustness_spec(np.full(N, (lo + hi) / 2), (hi - lo) / 2, lo, hi, 0, 2)


def test_it_finds_a_counterexample_on_a_staircase_whose_gradient_is_zero():
    """The score counts the inputs at the box's upper end, floored to steps of 4: flat almost everywhere, unsafe only
    with 32 of 40 inputs at the top, which a random corner reaches with probability 1e-4."""
    spec = _spec()
    evaluate = _two_class(lambda xs: np.floor((xs >= 1.0).sum(1) / 4.0) * 4.0 - 31.5)
    r = attack.vertex_search(evaluate, spec, spec.lb, spec.ub, batch=64, rounds=400, seed=0)
    assert r.x is not None and r.violation < 0
    assert np.all(r.x >= spec.lb) and np.all(r.x <= spec.ub)
    assert spec.violation(evaluate(r.x[None])[0]) == r.violation  # the score it reports is the model's at x
    assert r.tie is None


def test_a_tie_is_reported_as_a_tie_and_never_as_a_counterexample():
    """The score can reach 0 (all inputs at the top) but never go below: no counterexample exists, and a certificate
    cannot either."""
    spec = _spec()
    evaluate = _two_class(lambda xs: np.minimum(np.floor((xs >= 1.0).sum(1) / 4.0) * 4.0 - 40.0, 0.0))
    r = attack.vertex_search(evaluate, spec, spec.lb, spec.ub, batch=64, rounds=400, seed=1)
    assert r.x is None and r.violation == 0.0
    assert r.tie is not None and spec.violation(evaluate(r.tie[None])[0]) == 0.0


def test_it_stops_when_its_time_is_up_and_keeps_float32_points_in_the_box():
    spec = _spec(0.1, 0.3)
    lo, hi = float32_in_box(spec.lb, spec.lb, spec.ub), float32_in_box(spec.ub, spec.lb, spec.ub)
    seen = []

    def evaluate(xs):
        seen.append(np.asarray(xs))
        return np.stack([np.ones(len(xs)), np.zeros(len(xs))], 1)  # always safe

    r = attack.vertex_search(evaluate, spec, lo, hi, batch=32, rounds=400, expired=lambda: True)
    assert r.x is None and r.tie is None and r.evaluated == 32 and len(seen) == 1
    r = attack.vertex_search(evaluate, spec, lo, hi, batch=32, rounds=20)
    pts = np.concatenate(seen[1:])
    assert r.evaluated == 20 * 32 == len(pts)
    assert np.all(pts >= spec.lb) and np.all(pts <= spec.ub)
    assert np.array_equal(pts.astype(np.float32).astype(np.float64), pts)  # float32 values: a witness as it runs


def test_batched_rechecks_equal_one_at_a_time(tmp_path):
    """`Problem.recheck_many` through each kind of model: an ONNX file with a free batch dimension (one call), one with
    a fixed batch of 1 (a verifier's form: a call per row), one with no batch dimension (a VNN-COMP form),
    `harness.OnnxRecheck` and `harness.ModuleRecheck`: the same outputs as `recheck` row by row, and as torch's."""
    from analysis.verification.harness import ModuleRecheck, OnnxRecheck

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3)).eval()
    free, fixed = tmp_path / "free.onnx", tmp_path / "fixed.onnx"
    torch.onnx.export(net, torch.zeros(1, 6), str(free), input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "b"}, "y": {0: "b"}}, dynamo=False)
    torch.onnx.export(net, torch.zeros(1, 6), str(fixed), input_names=["x"], output_names=["y"], dynamo=False)
    flat = tmp_path / "flat.onnx"
    torch.onnx.export(net, torch.zeros(6), str(flat), input_names=["x"], output_names=["y"], dynamo=False)
    xs = np.random.default_rng(0).uniform(-1, 1, (7, 6)).astype(np.float32).astype(np.float64)
    with torch.no_grad():
        reference = net(torch.as_tensor(xs, dtype=torch.float32)).double().numpy()
    spec = robustness_spec(np.zeros(6), 1.0, -1.0, 1.0, 0, 3)
    for problem in (Problem([spec], onnx=free), Problem([spec], onnx=fixed), Problem([spec], onnx=flat),
                    Problem([spec], onnx=free, recheck=OnnxRecheck(fixed)),
                    Problem([spec], onnx=free, recheck=ModuleRecheck(net, (6,)))):
        many = problem.recheck_many(xs)
        assert many.shape == (7, 3)
        np.testing.assert_allclose(many, np.stack([problem.recheck(x) for x in xs]), rtol=0, atol=1e-6)
        np.testing.assert_allclose(many, reference, rtol=0, atol=1e-5)  # float32 runtimes, the same weights


def test_with_the_time_left_its_batches_fit_in_it():
    """A model that takes 2 ms a point, 0.3 s given, batches of up to 256 (0.5 s each): the first batch is small and
    the later ones are sized by the measured rate, so the search ends within the time (plus one small batch)."""
    spec = _spec()
    sizes = []

    def evaluate(xs):
        sizes.append(len(xs))
        time.sleep(0.002 * len(xs))
        return np.stack([np.ones(len(xs)), np.zeros(len(xs))], 1)

    budget = Budget(0.3)
    r = attack.vertex_search(evaluate, spec, spec.lb, spec.ub, batch=256, expired=budget.expired, left=budget.left)
    assert sizes[0] == attack.FIRST_BATCH and max(sizes) < 256
    assert budget.used() < 0.3 + 0.05 and r.evaluated == sum(sizes)


def test_on_a_quantized_net_it_agrees_with_enumerating_the_input_grid(tmp_path):
    """2 inputs: the input QuantizeLinear maps a box to a few grid points, which onnxruntime runs one by one. Where one
    is strictly misclassified, the search finds a strictly misclassified point; where the worst is a tie, it reports
    the tie; whatever it returns is what onnxruntime gives at that point."""
    path, _ = _tiny(tmp_path, "int8")
    sess = ort_util.session(path)
    qin = from_onnx(path).nodes[1].op
    assert isinstance(qin, QuantizedInput)
    s, z = qin.scale.numpy(), qin.zero.numpy()
    rng = np.random.default_rng(5)
    cand = rng.uniform(-1, 2, (4000, 2)).astype(np.float32)
    near = cand[ort_util.infer(sess, cand).argmax(1) != ort_util.infer(sess, cand + np.float32(0.1)).argmax(1)]
    kinds = {"sat": 0, "tie": 0, "safe": 0}
    for i, x0 in enumerate(near[:24].astype(np.float64)):
        eps = float(rng.choice([0.01, 0.05]))
        label = int(np.argmax(ort_util.forward_flat(sess, x0.astype(np.float32))))
        spec = robustness_spec(x0, eps, -4.0, 4.0, label, 3)
        qlo, qhi = (grid_index(b, s, z, qin.qmin, qin.qmax, side) for b, side in ((spec.lb, "low"), (spec.ub, "high")))
        grid = np.stack(np.meshgrid(*[np.arange(a, b + 1) for a, b in zip(qlo, qhi)], indexing="ij"), -1).reshape(-1, 2)
        pts = float32_in_box(np.clip(s * (grid - z), spec.lb, spec.ub), spec.lb, spec.ub)
        worst = float(spec.violations(ort_util.infer(sess, pts.astype(np.float32)).astype(np.float64)).min())
        lo, hi = float32_in_box(spec.lb, spec.lb, spec.ub), float32_in_box(spec.ub, spec.lb, spec.ub)
        r = attack.vertex_search(lambda xs: ort_util.infer(sess, xs.astype(np.float32)).astype(np.float64), spec,
                                 lo, hi, batch=64, rounds=200, seed=i)
        if worst < 0:
            assert r.x is not None, f"property {i}: a grid point is misclassified by {-worst:.3g}, the search found none"
            assert spec.violation(ort_util.forward_flat(sess, r.x.astype(np.float32))) < 0
            kinds["sat"] += 1
        elif worst == 0:
            assert r.x is None and r.tie is not None, f"property {i}"
            assert spec.violation(ort_util.forward_flat(sess, r.tie.astype(np.float32))) == 0
            kinds["tie"] += 1
        else:
            assert r.x is None and r.tie is None and r.violation >= worst, f"property {i}"
            kinds["safe"] += 1
    assert kinds["sat"] >= 3 and kinds["tie"] >= 1 and kinds["safe"] >= 3, kinds


def _grid_problem(n: int, recheck) -> Problem:
    """A network with a grid rounding (so the probe searches on the model) whose model is `recheck`."""
    net = Graph.sequential((n,), [Rounding(np.full(n, 0.05), step=np.full(n, 0.1)), Linear(np.ones((2, n)) / n, np.zeros(2))])
    return Problem([robustness_spec(np.full(n, 0.5), 0.1, 0.0, 1.0, 0, 2)], network=net, recheck=recheck)


def test_after_a_tie_no_bound_runs_and_the_search_has_the_time_left():
    """The model ties everywhere: the probe finds the tie in its share, the bounding links after it (α-CROWN, branch
    and bound) never run, the search goes on to the end of the limit, and the property is open with reason ``tie``."""
    res = get_verifier("auto").run(_grid_problem(2, lambda x: np.zeros(2)), Budget(2.0))
    assert res.status == "timeout" and open_reason(res) == "tie", res.message
    assert "no certificate exists" in res.message
    assert "alpha-crown" not in res.message and "bab" not in res.message
    assert 2.0 <= res.seconds < 3.0
    assert res.info["stage_seconds"]["pgd"] > 1.5  # the time after the tie went to the search


def test_a_tie_does_not_end_the_search_for_a_strict_counterexample(monkeypatch):
    """Ties on most of the box, a strict counterexample where 26 of 30 inputs sit at the top (3e-5 of the corners).
    The probe's share is cut to 20 µs, so its search scores only its first round (`attack.FIRST_BATCH` seeded corners,
    none strict) and meets the tie there whatever the machine's speed; it finds the counterexample only in the time it
    gets after the tie; the witness is confirmed on the model."""
    monkeypatch.setattr(PgdVerifier, "probe_share", 1e-6)
    n = 30

    def recheck(x):
        return np.array([0.0, 1.0 if (np.asarray(x) > 0.55).sum() >= 26 else 0.0])

    res = get_verifier("auto").run(_grid_problem(n, recheck), Budget(20.0))
    assert res.status == "sat", res.message
    assert res.message.count("pgd:") == 2 and "no certificate exists" in res.message  # it met the tie first
    assert (res.counterexample > 0.55).sum() >= 26 and open_reason(res) == ""


def test_a_tie_that_pgd_ends_on_counts_as_a_tie(monkeypatch):
    """With the search on the model finding nothing, PGD's candidate at which the model ties (margin exactly 0 there,
    not strict) marks the tie too: no bound runs after it and the property is open with reason ``tie``."""
    monkeypatch.setattr(attack, "vertex_search", lambda *a, **k: attack.VertexResult(None, 1.0, None, 1))
    res = get_verifier("auto").run(_grid_problem(2, lambda x: np.zeros(2)), Budget(2.0))
    assert open_reason(res) == "tie" and "PGD counterexample: candidate" in res.message, res.message
    assert "alpha-crown" not in res.message and "bab" not in res.message


def test_a_model_that_gives_nan_is_no_counterexample_and_no_crash():
    spec = _spec()
    r = attack.vertex_search(lambda xs: np.full((len(xs), 2), np.nan), spec, spec.lb, spec.ub, batch=16, rounds=5)
    assert r.x is None and r.tie is None and r.evaluated == 5 * 16


def test_after_a_tie_every_input_box_gets_its_part_of_the_search():
    """Two input boxes, the model tying everywhere: the search after the tie does not spend the whole limit on the
    first box; the second box is searched too (its points scored)."""
    n = 2
    net = Graph.sequential((n,), [Rounding(np.full(n, 0.05), step=np.full(n, 0.1)), Linear(np.ones((2, n)) / n, np.zeros(2))])
    specs = [robustness_spec(np.full(n, c), 0.1, 0.0, 1.0, 0, 2) for c in (0.3, 0.7)]
    seen = []

    def recheck(x):
        seen.append(float(np.asarray(x)[0]))
        return np.zeros(2)

    res = get_verifier("auto").run(Problem(specs, network=net, recheck=recheck), Budget(2.0))
    assert open_reason(res) == "tie"
    assert any(v < 0.5 for v in seen) and any(v > 0.5 for v in seen)  # both boxes were searched
