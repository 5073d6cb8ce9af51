"""Each verifier and the staged chain on properties whose answer is known independently: one that holds
(IBP proves it; IBP is sound, see test_verify_bounds) and one that fails (a sampled witness); the MILP and
branch and bound against brute-force enumeration of activation patterns on tiny networks; MILP, branch and
bound and Marabou against each other;
counterexamples re-checked in onnxruntime; timeouts and errors."""

from __future__ import annotations

import itertools
import stat
import time

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
import torch
import torch.nn as nn
import torch.nn.functional as F

from _modules import Affine
from analysis.verification import milp
from analysis.verification.bab import Settings, bab
from analysis.verification.bab_domains import Search
from analysis.verification.bounds import Bounder
from analysis.verification.complete_verifiers import MarabouVerifier, MilpVerifier
from analysis.verification.problem import BOX_TOL, Budget, Problem, Result
from analysis.verification.readers import from_torch
from analysis.verification.registry import STAGED, VERIFIERS, Verifier, available_verifiers, check_name, get_verifier
from analysis.verification.vnnlib import read_vnnlib, robustness_spec, write_robustness_vnnlib
from quantize.export import export_for_verifiers
from quantize.ort import forward_flat

needs_marabou = pytest.mark.skipif(not MarabouVerifier.available(), reason="maraboupy is not installed")

IN_SHAPE = (4,)
NUM_CLASSES = 3
TIMEOUT_S = 60
WITNESS_MARGIN = 1e-3  # a sampled witness must beat the true class by this much, so it is no float32 tie
KILL_SLACK_S = 5.0  # extra wall time allowed over timeout + grace for the hard-kill path
ENUM_TOL = 1e-6  # brute-force minima this close to 0 are left out (either answer is right within tolerance)


def to_onnx(model: nn.Module, shape: tuple[int, ...], path):
    x = torch.rand(8, *shape, generator=torch.Generator().manual_seed(0))
    return export_for_verifiers(model, shape, path, x)["path"]


def tiny_model() -> nn.Sequential:
    torch.manual_seed(0)  # this seed predicts two classes over [0, 1]^4 (many seeds give one)
    return nn.Sequential(Affine([2.0, 1.0, 0.5, 3.0], [-1.0, 0.0, 0.5, -0.2]),
                         nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, NUM_CLASSES)).eval()


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """ONNX model, a property that holds and one that fails, with the facts that make them known."""
    root = tmp_path_factory.mktemp("bench")
    model = tiny_model()
    onnx_path = to_onnx(model, IN_SHAPE, root / "onnx" / "tiny.onnx")
    net = from_torch(model, IN_SHAPE)
    rng = np.random.default_rng(0)
    xs = rng.uniform(0, 1, (20000, 4))
    ys = net.forward(xs).numpy()
    top2 = np.sort(ys, axis=1)[:, -2:]
    i0 = int(np.argmax(top2[:, 1] - top2[:, 0]))  # the largest top-1 margin: a tiny ball around it is robust
    x0, c = xs[i0], int(np.argmax(ys[i0]))
    other = np.max(np.delete(ys, c, axis=1), axis=1) - ys[:, c] >= WITNESS_MARGIN
    assert other.any(), "the seeded network predicts one class everywhere; pick another seed"
    dist = np.where(other, np.max(np.abs(xs - x0), axis=1), np.inf)
    iw = int(np.argmin(dist))
    eps_fail = float(dist[iw]) * 1.001  # the nearest sample another class wins clearly lies inside this ball
    write_robustness_vnnlib(root / "vnnlib" / "holds.vnnlib", x0, 1e-3, 0.0, 1.0, c, NUM_CLASSES)
    fails = write_robustness_vnnlib(root / "vnnlib" / "fails.vnnlib", x0, eps_fail, 0.0, 1.0, c, NUM_CLASSES)
    assert fails.in_box(xs[iw]) and fails.violation(ys[iw]) <= -WITNESS_MARGIN
    assert get_verifier("ibp").verify(onnx_path, root / "vnnlib" / "holds.vnnlib", TIMEOUT_S).status == "unsat"
    return dict(root=root, model=model, onnx=onnx_path, net=net, x0=x0, c=c, eps_fail=eps_fail,
                holds=root / "vnnlib" / "holds.vnnlib", fails=root / "vnnlib" / "fails.vnnlib", fails_spec=fails)


# "milp-only": no bounds tightening and no LP relaxation first, so the MILP itself (on IBP bounds) decides.
VARIANTS = {
    "auto": lambda: get_verifier("auto"),
    "bab": lambda: get_verifier("bab"),
    "milp": lambda: get_verifier("milp"),
    "milp-only": lambda: MilpVerifier(lp_first=False, tighten=False),
    "marabou": lambda: get_verifier("marabou"),
    "pgd+marabou": lambda: get_verifier("pgd+crown+marabou"),
}
COMPLETE = ["auto", "bab", "milp", "milp-only", pytest.param("marabou", marks=needs_marabou),
            pytest.param("pgd+marabou", marks=needs_marabou)]


@pytest.mark.parametrize("name", COMPLETE + ["ibp", "crown", "alpha-crown"])
def test_property_that_holds_is_unsat(bench, name):
    v = VARIANTS[name]() if name in VARIANTS else get_verifier(name)
    r = v.verify(bench["onnx"], bench["holds"], TIMEOUT_S)
    assert r.status == "unsat", r.message
    assert r.counterexample is None and r.seconds >= 0


@pytest.mark.parametrize("name", COMPLETE + ["pgd"])
def test_property_that_fails_is_sat_with_a_checked_counterexample(bench, name):
    r = VARIANTS[name]().verify(bench["onnx"], bench["fails"], TIMEOUT_S) if name in VARIANTS else \
        get_verifier(name).verify(bench["onnx"], bench["fails"], TIMEOUT_S)
    assert r.status == "sat", r.message
    if name == "milp-only":
        assert "MILP counterexample" in r.message
    x, spec = r.counterexample, bench["fails_spec"]
    assert spec.in_box(x) and np.array_equal(x, x.astype(np.float32).astype(np.float64))  # a float32 point in the box
    y = forward_flat(bench["onnx"], x)  # independent of the spec machinery: another class beats the true one, strictly
    assert np.max(np.delete(y, bench["c"])) > y[bench["c"]]
    np.testing.assert_array_equal(r.output, y)  # the witness's Y values are onnxruntime's


@pytest.mark.parametrize("name", ["ibp", "crown", "alpha-crown"])
def test_bounds_never_claim_the_false_property(bench, name):
    assert get_verifier(name).verify(bench["onnx"], bench["fails"], TIMEOUT_S).status == "unknown"


def test_staged_chain_answers_with_its_stage_and_counts(bench):
    assert STAGED == "crown+pgd+alpha-crown+bab" and get_verifier("auto").name == STAGED
    r = get_verifier("auto").verify(bench["onnx"], bench["holds"], TIMEOUT_S)
    assert r.status == "unsat" and r.stage in ("crown", "alpha-crown", "bab")
    assert r.info["relus"] == 16 and r.info["unstable_tight"] <= r.info["unstable_ibp"]
    assert r.info["margin_lb"] > 0
    r = get_verifier("auto").verify(bench["onnx"], bench["fails"], TIMEOUT_S)
    assert r.status == "sat" and r.stage == "pgd"


@pytest.mark.parametrize("eps_scale", [0.05, 0.7, 0.9, 1.5])
def test_complete_verifiers_agree_and_match_sampling(bench, eps_scale):
    """0.05: IBP proves it; 0.7: holds but IBP cannot tell; 0.9, 1.5: false."""
    eps = bench["eps_fail"] * eps_scale
    path = bench["root"] / "vnnlib" / f"scan_{eps_scale}.vnnlib"
    spec = write_robustness_vnnlib(path, bench["x0"], eps, 0.0, 1.0, bench["c"], NUM_CLASSES)
    names = ["auto", "bab", "milp", "milp-only"] + (["marabou"] if MarabouVerifier.available() else [])
    statuses = {n: VARIANTS[n]().verify(bench["onnx"], path, TIMEOUT_S).status for n in names}
    assert len(set(statuses.values())) == 1 and statuses["milp"] in ("unsat", "sat"), statuses
    if statuses["milp"] == "unsat":  # no sampled point may contradict a proof
        xs = np.random.default_rng(1).uniform(spec.lb, spec.ub, (5000, 4))
        assert np.all(np.argmax(bench["net"].forward(xs).numpy(), axis=1) == bench["c"])
    if eps_scale >= 1.0:
        assert statuses["milp"] == "sat"  # the sampled witness is inside the box
    if eps_scale == 0.7:
        assert statuses["milp"] == "unsat"
        assert get_verifier("ibp").verify(bench["onnx"], path, TIMEOUT_S).status == "unknown"


# ---------------------------------------------------------------------------------------------
# the MILP against brute force


def _enumerate_min(layers: list[tuple[np.ndarray, np.ndarray]], lb: np.ndarray, ub: np.ndarray, c: np.ndarray) -> float:
    """min over the box of c·y by enumerating every activation pattern: one LP per pattern (linprog)."""
    from scipy.optimize import linprog

    hidden = [W.shape[0] for W, _ in layers[:-1]]
    best = np.inf
    for pattern in itertools.product([0, 1], repeat=sum(hidden)):
        M, m0 = np.eye(lb.size), np.zeros(lb.size)  # the current layer's input as M x + m0
        A_ub, b_ub, k = [], [], 0
        for W, b in layers[:-1]:
            Z, z0 = W @ M, W @ m0 + b
            d = np.array(pattern[k:k + W.shape[0]], dtype=float)
            k += W.shape[0]
            # active: z ≥ 0  ⇔  −Z x ≤ z0; inactive: Z x ≤ −z0
            sign = np.where(d > 0, -1.0, 1.0)
            A_ub.append(sign[:, None] * Z)
            b_ub.append(np.where(d > 0, z0, -z0))
            M, m0 = d[:, None] * Z, d * z0
        W, b = layers[-1]
        obj, const = c @ (W @ M), c @ (W @ m0 + b)
        res = linprog(obj, A_ub=np.vstack(A_ub), b_ub=np.concatenate(b_ub), bounds=list(zip(lb, ub)), method="highs")
        if res.status == 0:
            best = min(best, float(res.fun + const))
    return best


@pytest.mark.parametrize("method", ["milp", "bab"])
@pytest.mark.parametrize("seed", range(5))
def test_complete_methods_match_brute_force_enumeration(seed, method):
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 3)).eval()
    net = from_torch(model, (3,))
    layers = [(m.weight.detach().double().numpy(), m.bias.detach().double().numpy()) for m in model if isinstance(m, nn.Linear)]
    seen = set()
    for eps in (0.05, 0.2, 0.5, 1.0):
        x0 = rng.uniform(0, 1, 3)
        c = int(np.argmax(net.forward(x0).numpy()))
        spec = robustness_spec(x0, eps, -1.0, 2.0, c, 3)
        mins = []
        for A, b in spec.disjuncts:
            mins.append(_enumerate_min(layers, spec.lb, spec.ub, A[0]) - b[0])
        if min(abs(v) for v in mins) < ENUM_TOL:
            continue
        truth = "unsat" if min(mins) > 0 else "sat"
        b = Bounder(net, spec.lb, spec.ub)  # IBP bounds only: the complete method must decide by itself
        if method == "milp":
            status, x, _ = milp.solve(b.net, spec, b.pre, list(range(len(spec.disjuncts))), lambda: 30.0, lp_first=False)
        else:
            status, x, _, _ = bab(b, spec, list(range(len(spec.disjuncts))), lambda: False, lambda: 30.0,
                                  Settings(batch=4, steps=5))
        assert status == truth, (seed, eps, mins, status)
        if status == "sat":
            assert spec.in_box(x, 1e-9) and spec.violation(net.forward(x).numpy()) <= 0
        seen.add(truth)
    assert seen, "every case sat within tolerance of 0"


UNBATCHED = Settings(batch=1, candidates=0, max_split_depth=1, attack_every=0)  # one domain at a time, BaBSR alone


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), eps=st.sampled_from([0.1, 0.3, 0.6]), batch=st.sampled_from([2, 16, 64]))
def test_batched_branch_and_bound_gives_the_verdicts_of_the_unbatched_search_and_the_milp(seed, eps, batch):
    """Batches with kFSB, multi-unit splits and warm starts decide as one domain at a time with BaBSR and as the MILP
    (cases whose exact margin lies within ENUM_TOL of 0 are left out: either answer is right there)."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 3)).eval()  # 2^8 patterns
    net = from_torch(model, (3,))
    x0 = rng.uniform(0, 1, 3)
    c = int(np.argmax(net.forward(x0).numpy()))
    spec = robustness_spec(x0, eps, -1.0, 2.0, c, 3)
    layers = [(m.weight.detach().double().numpy(), m.bias.detach().double().numpy()) for m in model if isinstance(m, nn.Linear)]
    mins = [_enumerate_min(layers, spec.lb, spec.ub, A[0]) - bv[0] for A, bv in spec.disjuncts]
    assume(min(abs(v) for v in mins) >= ENUM_TOL)
    truth = "unsat" if min(mins) > 0 else "sat"
    every = list(range(len(spec.disjuncts)))
    got = {}
    for name, cfg in (("batched", Settings(batch=batch, steps=5, candidates=3)), ("unbatched", UNBATCHED),
                      ("rebound", Settings(batch=batch, steps=5, rebound=2))):
        b = Bounder(net, spec.lb, spec.ub)
        got[name], x, _, _ = bab(b, spec, every, lambda: False, lambda: 30.0, cfg)
        if got[name] == "sat":
            assert spec.in_box(x) and spec.violation(net.forward(x).numpy()) <= 0
    b = Bounder(net, spec.lb, spec.ub)
    got["milp"], _, _ = milp.solve(b.net, spec, b.pre, every, lambda: 30.0, lp_first=False)
    assert set(got.values()) == {truth}, (got, truth)


SOUND_TOL = 1e-9  # float64 back-substitution misses by ~1e-12 relative


def _three_layer_case(seed: int, width: int, eps: float):
    """A 3-8..-3 ReLU net with three hidden layers, a robustness property at `eps` around a random point, its CROWN bounds."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width),
                          nn.ReLU(), nn.Linear(width, 3)).eval()
    net = from_torch(model, (3,))
    x0 = np.random.default_rng(seed).uniform(0, 1, 3)
    spec = robustness_spec(x0, eps, -1.0, 2.0, int(np.argmax(net.forward(x0).numpy())), 3)
    b = Bounder(net, spec.lb, spec.ub)
    b.crown()
    return net, spec, b


@pytest.mark.parametrize("seed", range(3))
def test_per_domain_intervals_hold_on_every_point_of_the_domain_and_only_tighten(seed):
    """`rebound`: a child's intervals of the sites after its split, bounded again with its splits, contain every sampled
    point of the child's region (the box with the split units' signs), and never widen the parent's."""
    net, spec, b = _three_layer_case(seed, 8, 0.4)
    search = Search(b, spec, list(range(len(spec.disjuncts))), Settings(rebound=3), lambda: False)
    cross0 = torch.nonzero((b.pre[search.relu_sites[0]][0] < 0) & (b.pre[search.relu_sites[0]][1] > 0)).flatten()
    assert cross0.numel() >= 2
    U = sum(search.sizes)
    parent = torch.zeros(1, U, dtype=torch.int8)
    splits, _ = search.children(parent, cross0[:2][None])  # 4 children: both signs of two units of the first site
    root = [b.pre[site] for site in search.relu_sites]
    pre = [(l.expand(4, -1), u.expand(4, -1)) for l, u in root]
    new, empty = search.rebound(search.per_site(splits), pre, torch.zeros(4, dtype=torch.long))
    xs = torch.as_tensor(np.random.default_rng(1).uniform(spec.lb, spec.ub, (SAMPLES, 3)))
    vals = b.net.values(xs)
    z = [vals[b.net.nodes[b.sites[site]].inputs[0]] for site in search.relu_sites]
    gained, seen = 0.0, 0
    for c in range(4):
        t = search.per_site(splits[c])[0]
        inside = torch.all(torch.where(t > 0, z[0] >= 0, torch.where(t < 0, z[0] <= 0, True)), 1)
        if not bool(inside.any()):
            continue  # these two signs together hold nowhere in the box (the child may be found empty)
        seen += 1
        assert not bool(empty[c])
        for j in range(1, len(search.relu_sites)):
            l, u = new[j][0][c], new[j][1][c]
            assert bool(torch.all(l >= root[j][0] - SOUND_TOL)) and bool(torch.all(u <= root[j][1] + SOUND_TOL))
            zj = z[j][inside]
            assert bool(torch.all(zj >= l - SOUND_TOL)) and bool(torch.all(zj <= u + SOUND_TOL)), (c, j)
            gained += float((l - root[j][0]).sum() + (root[j][1] - u).sum())
    assert seen >= 2 and gained > 0  # the splits do tighten the later sites


def test_milp_refinement_of_the_early_sites_is_sound_and_tightens():
    """`refine.Refiner`: the MILP bounds of the early sites' inputs contain every sampled value, never widen the
    α-CROWN intervals, and do tighten some; the later sites bounded again from them stay sound; branch and bound with
    the refiner beside it gives the enumerated verdicts."""
    from analysis.verification.bounds import Spec
    from analysis.verification.refine import Refiner

    gained, checked = 0.0, 0
    for seed in range(6):
        net, spec, b = _three_layer_case(seed, 10, 0.5)
        b.alpha_intermediate(10)
        assert Refiner.worth_it(b)
        before = [(l.clone(), u.clone()) for l, u in b.pre]
        rows, _ = Spec.from_disjuncts(spec.disjuncts)
        r = Refiner(b, rows.C, lambda: 60.0, unit_s=5.0)
        r._run()  # in this thread: the same work, deterministic
        r.apply(b)
        xs = torch.as_tensor(np.random.default_rng(1).uniform(spec.lb, spec.ub, (SAMPLES, 3)))
        vals = b.net.values(xs)
        for s, k in enumerate(b.sites):
            z = vals[b.net.nodes[k].inputs[0]]
            l, u = b.pre[s]
            assert bool(torch.all(l >= before[s][0] - SOUND_TOL)) and bool(torch.all(u <= before[s][1] + SOUND_TOL))
            assert bool(torch.all(z >= l - SOUND_TOL)) and bool(torch.all(z <= u + SOUND_TOL)), (seed, s)
            gained += float((l - before[s][0]).sum() + (before[s][1] - u).sum())
        checked += r.stats["units"]
        every = list(range(len(spec.disjuncts)))
        b2 = Bounder(net, spec.lb, spec.ub)
        b2.crown()
        thread = Refiner(b2, rows.C, lambda: 60.0).start()
        got, x, _, _ = bab(b2, spec, every, lambda: False, lambda: 30.0, Settings(batch=4, steps=3), refiner=thread)
        thread.stop()
        ref, _, _ = milp.solve(Bounder(net, spec.lb, spec.ub).net, spec, Bounder(net, spec.lb, spec.ub).pre, every,
                               lambda: 30.0, lp_first=False)
        assert got == ref, (seed, got, ref)
    assert checked > 0 and gained > 1e-3


PRIOR_TOL = 1e-9  # a row bounded with or without the other rows beside it: the same arithmetic up to BLAS order
SAMPLES = 20_000


def _two_disjunct_case():
    """A 2-disjunct robustness property on a small ReLU net whose first disjunct's CROWN row is < 0 at the root."""
    for seed in range(50):
        torch.manual_seed(seed)
        rng = np.random.default_rng(seed)
        model = nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 3)).eval()
        net = from_torch(model, (3,))
        x0 = rng.uniform(0, 1, 3)
        c = int(np.argmax(net.forward(x0).numpy()))
        spec = robustness_spec(x0, 0.3, -1.0, 2.0, c, 3)
        b = Bounder(net, spec.lb, spec.ub)
        b.crown()
        search = Search(b, spec, [0, 1], Settings(dtype=torch.float64), lambda: False)
        R = search.R
        zero = torch.zeros(1, search.U + 2 * search.V, dtype=torch.int8)  # every split of one domain (no grid: V = 0)
        alpha = [b.relaxation(site)[0].expand(R, -1)[None].float() for site in search.relu_sites]
        beta = [torch.zeros(1, R, n) for n in search.sizes]
        root = search.bound(zero, alpha, beta, 0, True)
        if float(root.lower[0, 0]) < 0:
            return net, spec, search, zero, alpha, beta, root
    raise AssertionError("no seed in 0..49 gives an open first disjunct")


def test_a_child_bounds_only_the_disjuncts_its_parent_leaves_open():
    """Rows of a disjunct the prior excludes keep the prior's value and are not bounded again; the rows bounded are
    the ones the search without a prior bounds, with the same values, and they are sound (dense sampling)."""
    net, spec, search, zero, alpha, beta, root = _two_disjunct_case()
    prior = torch.tensor([[-1.0, 0.25]], dtype=torch.float64)  # disjunct 1 excluded, disjunct 0 open
    r = search.bound(zero, alpha, beta, 3, True, prior)
    full = search.bound(zero, alpha, beta, 3, True)
    assert r.rows.tolist() == [0] and full.rows.tolist() == [0, 1]
    assert float(r.lower[0, 1]) == 0.25
    assert abs(float(r.lower[0, 0]) - float(full.lower[0, 0])) <= PRIOR_TOL * max(1.0, abs(float(full.lower[0, 0])))
    assert r.points.shape == (1, 3)
    xs = np.random.default_rng(0).uniform(spec.lb, spec.ub, (SAMPLES, 3))
    ys = net.forward(xs).numpy()
    A, bv = spec.disjuncts[0]
    assert float(r.lower[0, 0]) <= float(np.min(ys @ A[0] - bv[0])) + 1e-9


def test_a_domain_closes_only_when_every_row_holds_in_float64_the_priors_too():
    """A float32 search trusts a prior only for choosing what to bound: before a domain is closed every row, the
    prior's included, is bounded again in float64, so a prior that claims too much cannot close it."""
    net, spec, search, zero, alpha, beta, root = _two_disjunct_case()
    search.s = Settings(dtype=torch.float32)
    search.d = search.d.clone()
    search.d[1] += 1e3  # disjunct 1 now holds by a wide margin
    claim = torch.tensor([[5.0, -1.0]], dtype=torch.float64)  # a false claim that disjunct 0 is excluded
    r = search.bound(zero, alpha, beta, 0, False, claim)
    assert r.rows.tolist() == [1] and float(r.lower[0, 1]) > 0
    assert not bool(r.closed[0]) and float(r.lower[0, 0]) < 0  # re-bounded in float64: the root's value, not 5


def test_branch_and_bound_stops_at_the_step_where_its_budget_ends(monkeypatch):
    """The budget's end is seen between Adam steps: no further bound pass runs (no last pass for the batch's records,
    no float64 re-check), so a search overruns its limit by at most one step."""
    net, spec, *_ = _two_disjunct_case()
    b = Bounder(net, spec.lb, spec.ub)
    b.crown()
    calls = {"n": 0, "after": 0, "ended": False}
    real = Bounder.backward

    def counting(self, *args, **kwargs):
        calls["n"] += 1
        calls["after"] += calls["ended"]
        calls["ended"] = calls["ended"] or calls["n"] >= 3  # the budget ends during the third pass
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Bounder, "backward", counting)
    status, _, msg, _ = bab(b, spec, [0, 1], lambda: calls["ended"], lambda: 0.0, Settings(steps=10))
    assert status == "timeout" and "inside the root's bound" in msg
    assert calls["n"] == 3 and calls["after"] == 0


# ---------------------------------------------------------------------------------------------
# re-checks, limits, registry


class _Fixed(Verifier):
    """Reports a given counterexample, to exercise the re-check."""

    name = "fixed"

    def __init__(self, x):
        self.x = x

    def solve(self, problem, k, budget):
        return "sat", self.x, "fake"


def test_a_candidate_that_fails_the_recheck_is_no_answer(bench):
    r = _Fixed(bench["x0"].copy()).verify(bench["onnx"], bench["fails"], TIMEOUT_S)  # the centre of a robust ball is safe
    assert r.status == "unknown" and "not a counterexample in float32" in r.message and r.counterexample is None
    r = _Fixed(bench["x0"] + 10 * bench["eps_fail"]).verify(bench["onnx"], bench["fails"], TIMEOUT_S)
    assert r.status == "unknown" and "outside the input box" in r.message


def _boundary_point(bench):
    """A point of the fails box where the true class and the runner-up tie in float64 up to ~1e-9 (a solver's
    boundary point), by bisection between the box centre (safe) and the sampled witness (unsafe)."""
    net, spec = bench["net"], bench["fails_spec"]
    safe = bench["x0"].copy()
    unsafe = spec.lb + (spec.ub - spec.lb) * 0.5
    rng = np.random.default_rng(5)
    while spec.violation(net.forward(unsafe).numpy()) > 0:
        unsafe = rng.uniform(spec.lb, spec.ub)
    for _ in range(200):
        mid = 0.5 * (safe + unsafe)
        if spec.violation(net.forward(mid).numpy()) <= 0:
            unsafe = mid
        else:
            safe = mid
    return unsafe


def test_a_boundary_point_is_reported_only_as_a_strict_violation_in_float32(bench):
    """The old rule accepted onnxruntime outputs within 1e-5·max(1, |y|) of violating, so witnesses whose own Y values
    satisfied the property were reported sat. Now: the float32 point written to the witness must violate strictly in
    onnxruntime, after a short attack from the boundary point pushes it inward."""
    x = _boundary_point(bench)
    spec = bench["fails_spec"]
    assert abs(spec.violation(bench["net"].forward(x).numpy())) < 1e-6
    r = _Fixed(x).verify(bench["onnx"], bench["fails"], TIMEOUT_S)
    assert r.status == "sat", r.message
    x32 = r.counterexample
    assert np.array_equal(x32, x32.astype(np.float32).astype(np.float64)) and spec.in_box(x32)
    y = forward_flat(bench["onnx"], x32)
    assert spec.violation(y) < 0 and np.array_equal(r.output, y)


def test_timeouts_and_shape_mismatch(bench, tmp_path):
    assert get_verifier("milp").verify(bench["onnx"], bench["fails"], 0).status == "timeout"
    assert get_verifier("auto").verify(bench["onnx"], bench["holds"], 0).status == "timeout"
    write_robustness_vnnlib(tmp_path / "w.vnnlib", np.zeros(5), 0.1, 0, 1, 0, NUM_CLASSES)
    for name in ["milp", "ibp", "auto"]:
        r = get_verifier(name).verify(bench["onnx"], tmp_path / "w.vnnlib", TIMEOUT_S)
        assert r.status == "error" and "takes 4 inputs and gives 3 outputs, but the property w.vnnlib has 5 inputs" in r.message, (name, r)


def test_cpu_clock_counts_cpu_seconds():
    b = Budget(0.2, "cpu")
    t0 = time.perf_counter()
    time.sleep(0.3)  # sleeping uses no CPU
    assert not b.expired() and time.perf_counter() - t0 >= 0.3
    x = 0
    while not b.expired():
        x += 1
    assert b.used() >= 0.2
    with pytest.raises(ValueError):
        Budget(1, "gpu")


def test_registry():
    assert {"pgd", "ibp", "crown", "alpha-crown", "bab", "milp", "marabou", "via-relu"} <= set(VERIFIERS)
    assert {"milp", "ibp", "crown"} <= set(available_verifiers())
    for bad in ["nope", "pgd+crow", ""]:
        with pytest.raises(ValueError, match="choose from auto"):
            check_name(bad)
    check_name("auto")
    check_name("pgd+milp")
    with pytest.raises(ValueError):
        Result("verified", 0.0)
    assert isinstance(get_verifier("milp", margin=1e-3), MilpVerifier)


def test_several_input_boxes_are_each_checked(bench):
    """A property with two boxes (a VNN-LIB disjunction over inputs) is unsat only if both are."""
    holds = read_vnnlib(bench["holds"])
    fails = bench["fails_spec"]
    problem = Problem([holds, fails], onnx=bench["onnx"])
    r = get_verifier("auto").run(problem, Budget(TIMEOUT_S))
    assert r.status == "sat" and fails.in_box(r.counterexample, BOX_TOL)
    r = get_verifier("auto").run(Problem([holds, holds], onnx=bench["onnx"]), Budget(TIMEOUT_S))
    assert r.status == "unsat"


# ---------------------------------------------------------------------------------------------
# Marabou


def _fake_python(tmp_path, body: str) -> str:
    p = tmp_path / "fake_python"
    p.write_text(f"#!/bin/sh\n{body}\n")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


@needs_marabou
def test_marabou_child_is_killed_at_the_hard_limit(bench, tmp_path):
    v = MarabouVerifier(grace_s=0.5, python=_fake_python(tmp_path, "exec sleep 60"))
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
    assert f"Operation {op} not implemented" in r.message


@needs_marabou
def test_milp_and_marabou_agree_on_random_networks(tmp_path):
    """Two independent complete methods on random 3-6-6-3 networks, eps around the distance to the nearest
    sampled point of another class (so both answers occur); Marabou once with the tight bounds, once without."""
    rng = np.random.default_rng(42)
    seen, used = set(), 0
    for seed in range(40):
        if used == 6:
            break
        torch.manual_seed(100 + seed)
        model = nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 3)).eval()
        onnx_path = to_onnx(model, (3,), tmp_path / f"r{seed}.onnx")
        net = from_torch(model, (3,))
        xs = rng.uniform(0, 1, (4000, 3))
        ys = net.forward(xs).numpy()
        c = int(np.argmax(ys[0]))
        other = np.argmax(ys, axis=1) != c
        if not other.any():
            continue
        dist = np.min(np.max(np.abs(xs[other] - xs[0]), axis=1))
        eps = float(dist * (0.5 if used % 2 else 1.2))
        used += 1
        vnn = tmp_path / f"r{seed}.vnnlib"
        write_robustness_vnnlib(vnn, xs[0], eps, 0.0, 1.0, c, 3)
        a = MilpVerifier(lp_first=False, tighten=False).verify(onnx_path, vnn, TIMEOUT_S)
        b = get_verifier("marabou").verify(onnx_path, vnn, TIMEOUT_S)
        t = get_verifier("crown+marabou").verify(onnx_path, vnn, TIMEOUT_S)  # Marabou gets CROWN's bounds
        z = get_verifier("bab").verify(onnx_path, vnn, TIMEOUT_S)
        assert a.status == b.status and a.status in ("unsat", "sat"), (seed, a, b)
        assert t.status == a.status and z.status == a.status, (seed, t, z)
        seen.add(a.status)
    assert used == 6 and seen == {"unsat", "sat"}


def test_an_affine_network_is_decided_by_branch_and_bound_and_the_milp():
    """No ReLU at all: nothing to branch on, one LP decides (both answers)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)).eval()
    net = from_torch(model, (3,))
    x0 = np.full(3, 0.5)
    c = int(np.argmax(net.forward(x0).numpy()))
    for eps, want in ((1e-4, "unsat"), (10.0, "sat")):
        spec = robustness_spec(x0, eps, -20.0, 20.0, c, 2)
        for name in ("bab", "milp"):
            r = get_verifier(name).run(Problem([spec], network=net), Budget(TIMEOUT_S))
            assert r.status == want, (name, eps, r)


def test_milp_gives_the_time_a_finished_disjunct_leaves_to_one_that_ran_out(monkeypatch):
    """Disjunct 0 needs 4 s of HiGHS, disjuncts 1-3 are infeasible at once; 10 s for all four. Its first turn (a
    quarter, 2.5 s) runs out, the others close, and the ~7.5 s they leave go to disjunct 0 on a second turn: unsat,
    not timeout (a simulated HiGHS and clock: what is under test is how the time is dealt)."""
    import scipy.optimize

    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 5)).eval()
    net = from_torch(model, (3,))
    x0 = np.full(3, 0.5)
    spec = robustness_spec(x0, 0.3, -1.0, 2.0, int(np.argmax(net.forward(x0).numpy())), 5)
    hard_row = spec.disjuncts[0][0][0]
    clock = {"used": 0.0}
    runs = []
    real_milp = scipy.optimize.milp

    def fake_milp(c, constraints, integrality, bounds, options):
        limit = options["time_limit"]
        hard = np.allclose(c[-5:], hard_row)
        need = 4.0 if hard else 0.01
        runs.append((hard, round(limit, 3)))
        clock["used"] += min(need, limit)
        if need > limit:
            return scipy.optimize.OptimizeResult(status=1, x=None, fun=None, message="time limit")
        return scipy.optimize.OptimizeResult(status=2, x=None, fun=None, message="infeasible")

    monkeypatch.setattr(scipy.optimize, "milp", fake_milp)
    b = Bounder(net, spec.lb, spec.ub)
    status, _, msg = milp.solve(b.net, spec, b.pre, [0, 1, 2, 3], lambda: 10.0 - clock["used"], lp_first=False)
    monkeypatch.setattr(scipy.optimize, "milp", real_milp)
    assert status == "unsat", (status, msg, runs)
    assert [h for h, _ in runs] == [True, False, False, False, True] and runs[-1][1] > 4.0


FIRST_CALL_OVERRUN_S = 0.25  # what a link may run past its budget, warm-up of a fresh process included
FIRST_CALL_SCRIPT = """
import json, sys, time
import torch
from torch import nn
torch.set_num_threads(1)
torch.manual_seed(0)
from analysis.verification.problem import Budget, Problem
from analysis.verification.readers import from_torch
from analysis.verification.registry import get_verifier
from analysis.verification.vnnlib import robustness_spec
model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), *[m for _ in range(3) for m in (nn.Linear(256, 256), nn.ReLU())],
                      nn.Linear(256, 10)).eval()
net = from_torch(model, (784,))
x0 = torch.rand(784).double().numpy()
c = int(net.forward(x0).numpy().argmax())
out = {}
for name in sys.argv[1:]:
    spec = robustness_spec(x0, 0.05, 0.0, 1.0, c, 10)
    out[name] = get_verifier(name).run(Problem([spec], network=net), Budget(0.3, "cpu")).cpu_seconds
print(json.dumps(out))
"""


def test_the_first_call_in_a_fresh_process_keeps_its_budget():
    """The first bound computation in a process pays torch's warm-up; it must still stop within its budget (each
    verifier is the first of its kind in the process, α-CROWN the first of all). On the CPU clock: the suite's two
    workers on two cores once gave this process 0.87 s of wall time for the MILP's ~0.36 s of work."""
    import json
    import subprocess
    import sys

    names = ["alpha-crown", "bab", "milp"]
    out = subprocess.run([sys.executable, "-c", FIRST_CALL_SCRIPT, *names], capture_output=True, text=True, timeout=120,
                         check=True)
    seconds = json.loads(out.stdout.strip().splitlines()[-1])
    assert all(seconds[n] <= 0.3 + FIRST_CALL_OVERRUN_S for n in names), seconds


def test_a_search_cut_short_goes_on_from_its_open_domains_in_the_next_call():
    """bab(resume=): a timed-out call leaves its open domains (the batch in flight included) and the next call on the
    same Bounder goes on from them: the domains add up, no root is bounded twice, and the verdict is the one-call
    verdict."""
    net, spec, b = _three_layer_case(7, 10, 0.8)  # 8 rounds of batch 4 in one call
    every = list(range(len(spec.disjuncts)))
    whole, _, _, full = bab(b, spec, every, lambda: False, lambda: 30.0, Settings(batch=4, steps=3))
    assert whole in ("sat", "unsat") and full["rounds"] >= 3
    net, spec, b = _three_layer_case(7, 10, 0.8)
    resume: dict = {}
    calls = {"n": 0}
    status, total = "timeout", 0
    for turn in range(100):
        limit = {"n": 0}

        def expired():  # each call stops after a few checks of the clock: a short turn of a stage budget
            limit["n"] += 1
            return limit["n"] > 8

        status, _, msg, stats = bab(b, spec, every, expired, lambda: 30.0, Settings(batch=4, steps=3), resume=resume)
        calls["n"] += 1
        if status != "timeout":
            break
        assert resume["store"] is not None and len(resume["store"]) > 0, msg
    assert status == whole and calls["n"] >= 2
    assert stats.get("resumed", 0) == calls["n"] - 1 and resume == {}


def test_a_chain_skips_branch_and_bound_on_smooth_gates_and_says_why():
    """Branch and bound splits ReLUs: on a network with smooth gates a chain's bab link is not run (said in the
    message, the chain's answer is the links' before it), and bab alone answers an error naming the ReLU version."""
    from pipeline import to_gates

    torch.manual_seed(0)
    model, _ = to_gates(nn.Sequential(nn.Linear(4, 16), nn.GELU(), nn.Linear(16, NUM_CLASSES)).eval())
    net = from_torch(model.eval(), (4,))
    assert net.smooth
    x0 = np.full(4, 0.5)
    label = int(net.forward(x0).argmax())
    spec = robustness_spec(x0, 1.0, -np.inf, np.inf, label, NUM_CLASSES)  # too wide for CROWN to prove
    chained = get_verifier("crown+bab").run(Problem([spec], net), Budget(10.0))
    assert chained.status == "unknown", chained
    assert "bab: not run (branch and bound splits ReLUs" in chained.message and "to_relu" in chained.message
    alone = get_verifier("bab").run(Problem([spec], net), Budget(10.0))
    assert alone.status == "error" and "to_relu" in alone.message
    relu_net = from_torch(nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, NUM_CLASSES)).eval(), (4,))
    assert get_verifier("bab").refuses(Problem([spec], relu_net)) is None


def test_a_cpu_search_that_fills_its_memory_share_ends_as_a_timeout_that_says_so(monkeypatch):
    """The open domains of a search on the CPU are capped like a GPU's (the host's available memory, its share per
    worker): past the cap the search answers timeout with the reason, never grows until the kernel kills the process."""
    from analysis.verification import bab as bab_mod

    free, total = bab_mod.host_memory()
    assert 0 < free <= total
    assert bab_mod.device_memory(torch.device("cpu"), sharers=4) <= total / 4
    net, spec, b = _three_layer_case(7, 10, 0.8)  # needs several rounds of batch 4
    every = list(range(len(spec.disjuncts)))
    monkeypatch.setattr(bab_mod, "device_memory", lambda device, sharers=1: 1)  # room for no open domain
    status, x, msg, stats = bab(b, spec, every, lambda: False, lambda: 30.0, Settings(batch=4, steps=3))
    assert status == "timeout" and x is None and "domains open" in msg and "this process may keep on cpu" in msg
    assert stats["rounds"] == 1
