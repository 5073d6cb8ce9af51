"""Soundness of every graph bound, by dense sampling in float64 (one side at a time, auto_LiRPA's practice): IBP /
CROWN / α-CROWN through every op (Linear, Conv, normalization, BatchNorm, ReLU, each gate, per-channel λ, linked
pairs) on torch models read through their export, and on random DAGs built in code (residual sums, concatenations,
convolutions, permutations; hypothesis over their structure); the swap gap; IBP against a per-neuron reference.
The gate relaxations themselves are tested in test_verify_relaxations.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
from hypothesis import HealthCheck, given, settings, strategies as st

from _modules import Affine
from analysis.verification.bounds import Bounder, Spec
from analysis.verification.gap import swap_gap
from analysis.verification.graph import Graph, Node
from analysis.verification.ops.affine import Conv, Linear, Scale, Sum
from analysis.verification.ops.gates import Gate
from analysis.verification.ops.pooling import average_pool
from analysis.verification.ops.relu import ReLU
from analysis.verification.ops.shape import Concat, Permute
from analysis.verification.readers import from_torch
from pipeline.activations import GELU, SERF, LambdaGELU, LambdaSERF, LambdaSwish, Linked, SiLU

# network bounds vs sampled activations (float64, summation order only)
NET_TOL = 1e-9
# a torch module in float64 vs its graph (float32 weights and λ after the export)
TORCH_F64_ATOL = 1e-6

# ---------------------------------------------------------------------------------------------
# networks


def _lambda_gate(cls, lam: torch.Tensor) -> nn.Module:
    gate = cls(nn.Parameter(torch.zeros(lam.numel())), 0.1)
    gate.freeze(lam)
    return gate


def _act(kind: str, channels: int, per_channel: bool) -> nn.Module:
    lam = torch.linspace(1.5, 40.0, channels) if per_channel else torch.tensor([12.0])
    return {"relu": lambda: nn.ReLU(), "gelu": lambda: GELU(), "silu": lambda: SiLU(), "serf": lambda: SERF(),
            "lambda_gelu": lambda: _lambda_gate(LambdaGELU, lam), "lambda_swish": lambda: _lambda_gate(LambdaSwish, lam),
            "lambda_serf": lambda: _lambda_gate(LambdaSERF, lam), "nn.gelu": lambda: nn.GELU()}[kind]()


ACTS = ["relu", "gelu", "silu", "serf", "lambda_gelu", "lambda_swish", "lambda_serf", "nn.gelu"]


def mlp(kind: str, seed: int, per_channel: bool = False, linked: bool = False) -> tuple[nn.Module, tuple[int, ...]]:
    torch.manual_seed(seed)
    shape = (6,)
    act = (lambda c: Linked(_act(kind, c, per_channel))) if linked else (lambda c: _act(kind, c, per_channel))
    w = 2 if linked else 1
    model = nn.Sequential(Affine(torch.linspace(-2, 2, 6), torch.linspace(0.3, -0.3, 6)), nn.Linear(6, 12), act(12),
                          nn.Linear(12 * w, 10), nn.BatchNorm1d(10), act(10), nn.Linear(10 * w, 4)).eval()
    with torch.no_grad():
        bn = model[4]
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.uniform_(-1.5, 1.5)
        bn.bias.uniform_(-0.3, 0.3)
    return model, shape


def cnn(kind: str, seed: int, per_channel: bool = True, linked: bool = False) -> tuple[nn.Module, tuple[int, ...]]:
    torch.manual_seed(seed)
    shape = (2, 7, 6)
    act = (lambda c: Linked(_act(kind, c, per_channel))) if linked else (lambda c: _act(kind, c, per_channel))
    w = 2 if linked else 1
    model = nn.Sequential(Affine(torch.tensor([1.5, -0.5]).reshape(2, 1, 1), torch.tensor([0.2, 0.1]).reshape(2, 1, 1)),
                          nn.Conv2d(2, 4, 3, stride=1, padding=1), nn.BatchNorm2d(4), act(4),
                          nn.Conv2d(4 * w, 4, 3, stride=2, padding=1, dilation=1), act(4),
                          nn.Conv2d(4 * w, 4, 2, stride=1, padding=0, dilation=2, groups=2), act(4),
                          nn.Flatten(), nn.Linear(4 * w * 2 * 1, 3)).eval()
    with torch.no_grad():
        bn = model[2]
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    return model, shape


def _check_graph(net: Graph, lb: torch.Tensor, ub: torch.Tensor, xs: torch.Tensor, gen: torch.Generator,
                 alpha_steps: int = 10) -> None:
    """Every bound of every stage (IBP, CROWN, α-CROWN) holds on the sampled points xs of the box."""
    b = Bounder(net, lb, ub)
    stages = {"ibp": [(l.clone(), u.clone()) for l, u in b.pre]}
    b.crown()
    stages["crown"] = list(b.pre)
    b.alpha_intermediate(steps=alpha_steps)
    stages["alpha"] = list(b.pre)
    C = torch.randn(5, net.num_outputs, generator=gen, dtype=torch.float64)
    spec = Spec(C, torch.zeros(5))
    spec_lo = {"ibp": b.ibp_spec(spec), "crown": b.spec_bounds(spec), "alpha": b.alpha_spec(spec, list(range(5)), steps=alpha_steps)}
    vals = b.net.values(xs)
    for s, j in enumerate(b.site_input):
        h = vals[j]
        for name, pre in stages.items():
            l, u = pre[s]
            assert float((l - h).max()) <= NET_TOL, f"{name} lower bound of site {s} violated by {float((l - h).max()):.3g}"
            assert float((h - u).max()) <= NET_TOL, f"{name} upper bound of site {s} violated by {float((h - u).max()):.3g}"
        # tighter than IBP (or equal)
        assert torch.all(stages["alpha"][s][0] >= stages["ibp"][s][0] - NET_TOL)
        assert torch.all(stages["alpha"][s][1] <= stages["ibp"][s][1] + NET_TOL)
    out = vals[b.net.output]
    y = out @ C.T
    for name, lo in spec_lo.items():
        assert float((lo - y).max()) <= NET_TOL, f"{name} spec bound violated by {float((lo - y).max()):.3g}"
    out_lo, out_hi = b.ibp_out
    assert torch.all(out >= out_lo - NET_TOL) and torch.all(out <= out_hi + NET_TOL)


def _samples(lb: torch.Tensor, ub: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    xs = lb + (ub - lb) * torch.rand(n, lb.numel(), generator=gen, dtype=torch.float64)
    corners = torch.where(torch.rand(n // 6, lb.numel(), generator=gen) < 0.5, lb, ub)
    return torch.cat([xs, corners])


def _check_network(model: nn.Module, shape: tuple[int, ...], radius: float, seed: int, samples: int = 3000,
                   alpha_steps: int = 10) -> None:
    net = from_torch(model, shape)
    gen = torch.Generator().manual_seed(seed)
    x0 = torch.rand(int(np.prod(shape)), generator=gen, dtype=torch.float64)
    lb, ub = x0 - radius, x0 + radius
    xs = _samples(lb, ub, samples, gen)
    with torch.no_grad():  # the reader computes what torch computes (up to the export's float32 rounding)
        ref = model.double()(xs.reshape(-1, *shape))
    np.testing.assert_allclose(net.forward(xs).numpy(), ref.numpy(), rtol=0, atol=TORCH_F64_ATOL)
    _check_graph(net, lb, ub, xs, gen, alpha_steps)


def _random_dag(seed: int, conv: bool) -> Graph:
    """A random DAG: blocks of (affine, activation) with residual sums to an earlier value of the same size, a
    concatenation of two branches, a permutation; on (C, H, W) when `conv` (convolutions, pooling)."""
    rng = np.random.default_rng(seed)
    acts = ["relu", "phi", "sigmoid", "serf"]
    if conv:
        shape = (2, 4, 4)
        nodes = [Node(Conv(rng.normal(0, 0.5, (3, 2, 3, 3)), rng.normal(0, 0.2, 3), shape, padding=(1, 1)), (0,))]
        shape = (3, 4, 4)
    else:
        shape = (7,)
        nodes = [Node(Linear(rng.normal(0, 0.6, (9, 7)), rng.normal(0, 0.2, 9)), (0,))]
        shape = (9,)
    size = int(np.prod(shape))

    def act(k: int) -> Node:
        kind = acts[int(rng.integers(len(acts)))]
        op = ReLU(size) if kind == "relu" else Gate(kind, rng.uniform(0.8, 30.0, size))
        return Node(op, (k,))

    def affine(k: int) -> Node:
        if conv:
            c = shape[0]
            return Node(Conv(rng.normal(0, 0.4, (c, c, 3, 3)), rng.normal(0, 0.2, c), shape, padding=(1, 1)), (k,))
        return Node(Linear(rng.normal(0, 0.5, (size, size)), rng.normal(0, 0.2, size)), (k,))

    nodes.append(act(len(nodes)))
    for _ in range(int(rng.integers(1, 3))):  # residual blocks
        skip = len(nodes)
        nodes.append(affine(skip))
        nodes.append(act(len(nodes)))
        nodes.append(affine(len(nodes)))
        nodes.append(Node(Sum(size, (1.0, float(rng.choice([1.0, -1.0])))), (len(nodes), skip)))
        nodes.append(act(len(nodes)))
    last = len(nodes)
    nodes.append(Node(Scale(rng.uniform(-1.5, 1.5, size), rng.normal(0, 0.1, size)), (last,)))
    nodes.append(Node(Concat((shape, shape), 0), (last, len(nodes))))  # two branches side by side
    cat_shape = (2 * shape[0], *shape[1:])
    n_cat = 2 * size
    if conv:
        nodes.append(Node(average_pool(cat_shape, (2, 2), (2, 2)), (len(nodes),)))
        pooled = nodes[-1].op.out_shape
        n_cat = int(np.prod(pooled))
        perm = np.transpose(np.arange(n_cat).reshape(pooled), (0, 2, 1)).reshape(-1)
    else:
        perm = rng.permutation(n_cat)
    nodes.append(Node(Permute(perm), (len(nodes),)))
    nodes.append(Node(ReLU(n_cat), (len(nodes),)))
    nodes.append(Node(Linear(rng.normal(0, 0.5, (3, n_cat)), rng.normal(0, 0.1, 3)), (len(nodes),)))
    return Graph((2, 4, 4) if conv else (7,), nodes)


def _check_random_dag(seed: int, conv: bool, radius: float) -> None:
    net = _random_dag(seed, conv)
    gen = torch.Generator().manual_seed(seed)
    x0 = torch.rand(net.num_inputs, generator=gen, dtype=torch.float64)
    lb, ub = x0 - radius, x0 + radius
    _check_graph(net, lb, ub, _samples(lb, ub, 1000, gen), gen, alpha_steps=2)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), conv=st.booleans(), radius=st.sampled_from([0.05, 0.3]))
def test_bounds_on_random_dags_are_sound(seed, conv, radius):
    _check_random_dag(seed, conv, radius)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), conv=st.booleans(), radius=st.sampled_from([0.02, 0.1, 0.3, 1.0]))
def test_bounds_on_many_random_dags_are_sound(seed, conv, radius):
    _check_random_dag(seed, conv, radius)


def test_adam_matches_torch_optim():
    """alpha.Adam (used instead of torch.optim, whose first use costs seconds) takes torch.optim.Adam's steps."""
    from analysis.verification.alpha import Adam

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(50, generator=gen, dtype=torch.float64, requires_grad=True)
    b = a.detach().clone().requires_grad_(True)
    ours, ref = Adam([a], 0.1), torch.optim.Adam([b], lr=0.1)
    weights = torch.arange(50, dtype=torch.float64)
    for _ in range(30):
        for p, opt in ((a, ours), (b, ref)):
            opt.zero_grad()
            ((p - 3) ** 2 * weights).sum().backward()
            opt.step()
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ACTS)
def test_mlp_bounds_are_sound(kind):
    """Normalization (negative scales), Linear, BatchNorm1d, and the activation, one λ per layer."""
    model, shape = mlp(kind, seed=1)
    _check_network(model, shape, radius=0.3, seed=1)


@pytest.mark.parametrize("kind", ["relu", "lambda_gelu", "lambda_swish", "lambda_serf"])
def test_per_channel_lambda_and_linked_pairs_are_sound(kind):
    model, shape = mlp(kind, seed=2, per_channel=True, linked=True)
    _check_network(model, shape, radius=0.2, seed=2)


@pytest.mark.parametrize("kind", ["relu", "lambda_gelu", pytest.param("gelu", marks=pytest.mark.slow),
                                  pytest.param("lambda_serf", marks=pytest.mark.slow)])
def test_conv_bounds_are_sound(kind):
    """Conv2d with padding, stride, dilation and groups; BatchNorm2d folded into the conv; per-channel λ."""
    model, shape = cnn(kind, seed=3, linked=kind == "relu")
    _check_network(model, shape, radius=0.15, seed=3, samples=1200, alpha_steps=4)  # float64 conv on CPU is slow


@pytest.mark.parametrize("conv", [False, True])
def test_back_substitution_of_every_affine_op_is_its_matrix_transpose(conv):
    """For each affine op of a random DAG (and the cnn's convolutions): forward = M x + c and back(A) = (A M_i, A c)
    with M_i the op's own sparse matrices, which the MILP encodes."""
    ops = [n.op for n in _random_dag(11, conv).nodes[1:] if not isinstance(n.op, (ReLU, Gate))]
    model, shape = cnn("relu", seed=4)
    ops += [n.op for n in from_torch(model, shape).merged().nodes if isinstance(n.op, Conv)]
    gen = torch.Generator().manual_seed(5)
    # grouped and depthwise convolutions on maps past the dense path (their back-substitution is batched per group)
    ops += [Conv(torch.randn(co, ci // g, 3, 3, generator=gen, dtype=torch.float64), torch.randn(co, generator=gen, dtype=torch.float64),
                 (ci, 9, 9), (st, st), (1, 1), (dl, dl), g)
            for ci, co, g, st, dl in [(6, 6, 6, 1, 1), (6, 12, 6, 2, 1), (6, 9, 3, 1, 2), (4, 8, 2, 2, 1)]]
    for op in ops:
        mats, c = op.sparse()
        mats = [torch.as_tensor(M.toarray()) for M in mats]
        xs = [torch.randn(7, n, dtype=torch.float64) for n in op.in_sizes()]
        ref = sum(x @ M.T for x, M in zip(xs, mats)) + torch.as_tensor(c)
        np.testing.assert_allclose(op.forward(*xs).numpy(), ref.numpy(), atol=1e-12)
        A = torch.randn(5, op.out_size, dtype=torch.float64)
        back, bias = op.back(A)
        for Ai, M in zip(back, mats):
            np.testing.assert_allclose(Ai.numpy(), (A @ M).numpy(), atol=1e-12)
        np.testing.assert_allclose(bias.numpy(), (A @ torch.as_tensor(c)).numpy(), atol=1e-12)


def _reference_ibp(ops, lb, ub):
    """Textbook interval arithmetic, one neuron and one weight at a time (Linear / Scale / ReLU)."""
    lo, hi = [float(v) for v in lb], [float(v) for v in ub]
    pre = []
    for layer in ops:
        if isinstance(layer, Linear):
            W, b = layer.W.tolist(), layer.b.tolist()
            nl, nh = [], []
            for i in range(len(W)):
                a = c = b[i]
                for j, w in enumerate(W[i]):
                    a += w * lo[j] if w >= 0 else w * hi[j]
                    c += w * hi[j] if w >= 0 else w * lo[j]
                nl.append(a)
                nh.append(c)
            lo, hi = nl, nh
        elif isinstance(layer, Scale):
            pairs = [sorted((lo[i] * s + t, hi[i] * s + t)) for i, (s, t) in enumerate(zip(layer.scale.tolist(), layer.shift.tolist()))]
            lo, hi = [p[0] for p in pairs], [p[1] for p in pairs]
        else:
            pre.append((lo, hi))
            lo, hi = [max(v, 0.0) for v in lo], [max(v, 0.0) for v in hi]
    return pre, (lo, hi)


@pytest.mark.parametrize("seed", range(6))
def test_ibp_matches_per_neuron_reference(seed):
    rng = np.random.default_rng(seed)
    widths = [int(rng.integers(2, 7))] + [int(rng.integers(3, 12)) for _ in range(int(rng.integers(1, 4)))] + [3]
    layers = [Scale(rng.uniform(-2, 2, widths[0]), rng.normal(0, 0.5, widths[0]))]
    for k in range(len(widths) - 1):
        layers.append(Linear(rng.normal(0, 1 / np.sqrt(widths[k]), (widths[k + 1], widths[k])), rng.normal(0, 0.3, widths[k + 1])))
        if k < len(widths) - 2:
            layers.append(ReLU(widths[k + 1]))
    net = Graph.sequential((widths[0],), layers)
    c = rng.uniform(-1, 1, widths[0])
    lb, ub = c - 0.3, c + 0.3
    b = Bounder(net, lb, ub)  # merged inside: compare on the merged ops
    ref_pre, ref_out = _reference_ibp([n.op for n in b.net.nodes[1:]], lb, ub)
    for (l, u), (rl, ru) in zip(b.ibp_pre, ref_pre):
        np.testing.assert_allclose(l.numpy(), rl, atol=1e-10)
        np.testing.assert_allclose(u.numpy(), ru, atol=1e-10)
    np.testing.assert_allclose(b.ibp_out[0].numpy(), ref_out[0], atol=1e-10)


def test_swap_gap_bounds_the_smooth_relu_difference_by_sampling():
    """|smooth(x) − relu(x)| ≤ swap_gap on the box, per output, for λ-GELU at a small and a large λ."""
    for lam, seed in ((3.0, 0), (150.0, 1)):
        model, shape = mlp("lambda_gelu", seed=seed, per_channel=True)
        for g in model.modules():
            if isinstance(g, LambdaGELU):
                g.freeze(torch.full_like(g.lam_fixed, lam))
        smooth = from_torch(model, shape)
        relu = smooth.relu_version()
        gen = torch.Generator().manual_seed(seed)
        x0 = torch.rand(6, generator=gen, dtype=torch.float64)
        lb, ub = x0 - 0.2, x0 + 0.2
        b = Bounder(relu, lb, ub)
        b.crown()
        gap = swap_gap(smooth, b.pre)
        xs = lb + (ub - lb) * torch.rand(20000, 6, generator=gen, dtype=torch.float64)
        diff = (smooth.forward(xs) - relu.forward(xs)).abs().max(0).values
        assert torch.all(diff <= gap + 1e-12), (diff, gap)
        assert float(gap.max()) < (1.0 if lam > 100 else math.inf)


RESUME_TOL = 1e-12  # the same float64 steps in the same order, interrupted between sites or not


def test_alpha_intermediate_stopped_between_sites_goes_on_where_it_stopped():
    """`until` stops the intermediate layers' α-CROWN between sites (what a time share does); a later call optimizes
    only the sites not done, and the bounds come out as one uninterrupted call's."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(3, 12), nn.ReLU(), nn.Linear(12, 12), nn.ReLU(), nn.Linear(12, 12), nn.ReLU(),
                          nn.Linear(12, 2)).eval()
    net = from_torch(model, (3,))
    lb, ub = -np.ones(3), np.ones(3)
    whole = Bounder(net, lb, ub)
    whole.crown()
    assert whole.alpha_intermediate(10)
    parts = Bounder(net, lb, ub)
    parts.crown()
    assert not parts.alpha_intermediate(10, until=lambda: len(parts.alpha_done) >= 2)  # stops before the third site
    assert parts.alpha_done == {0, 1} and parts.method == "crown"
    assert parts.alpha_intermediate(10) and parts.alpha_done == {0, 1, 2} and parts.method == "alpha-crown"
    crown = Bounder(net, lb, ub)
    crown.crown()
    assert any(float((l1 - l0).abs().max()) > 1e-3 for (l1, _), (l0, _) in zip(whole.pre, crown.pre))  # α did tighten
    for (l1, u1), (l2, u2) in zip(whole.pre, parts.pre):
        assert float((l1 - l2).abs().max()) <= RESUME_TOL and float((u1 - u2).abs().max()) <= RESUME_TOL


def test_bab_refuses_an_intermediate_share_outside_0_1():
    from analysis.verification.registry import get_verifier

    with pytest.raises(ValueError, match="intermediate_share must be in"):
        get_verifier("bab", intermediate_share=0.0)
