"""Transformers in the verification engine: a ViT of one's own (nn.MultiheadAttention, LayerNorm, a class token, 4×4
patches; `_modules.ClassTokenViT`) read from its torch module and from a dynamic-batch ONNX export (the
Shape/Gather/Equal/Where chain folded), every transformer op against onnxruntime, bounds that contain sampled outputs
(CROWN, α-CROWN; float and int8 against onnxruntime), verdicts whose witnesses replay, branch and bound and the MILP
on the new ops, and `api.check` through nn.MultiheadAttention."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from _modules import ClassTokenViT
from analysis.verification import milp
from analysis.verification.bab import Settings, bab
from analysis.verification.bounds import Bounder, Spec
from analysis.verification.ops.base import UnsupportedModel
from analysis.verification.readers import from_onnx, from_torch, supported_ops
from analysis.verification.vnnlib import robustness_spec
from pipeline.relu_swap import to_relu
from quantize import ort as ort_util
from quantize.export import save, to_onnx

# the exported graph runs the float32 weights in float64: its outputs and torch's float64 ones agree to rounding
READ_TOL = 1e-9
# onnxruntime (float32) against the float64 graph: a few float32 ulps of the logits' scale
ORT_TOL = 1e-4


def _vit(seed: int = 0, relu: bool = True, **kw) -> torch.nn.Module:
    torch.manual_seed(seed)
    m = ClassTokenViT(**{"dim": 8, "heads": 2, "hidden": 16, **kw}).eval()
    with torch.no_grad():  # learned positions and class token of a trained model's size, not the init's 0.02
        m.pos.normal_(0, 0.5)
        m.cls.normal_(0, 0.5)
    return to_relu(m) if relu else m


def _ort(path, x: np.ndarray) -> np.ndarray:
    sess = ort_util.session(path)
    return sess.run(None, {sess.get_inputs()[0].name: np.asarray(x, dtype=np.float32)})[0].astype(np.float64)


def _x(n: int, seed: int = 1) -> torch.Tensor:
    return torch.rand(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


def _export(model, path, dynamic: bool = True):
    proto, _ = to_onnx(copy.deepcopy(model).float(), torch.zeros(1, 1, 8, 8), opset=20, simplify=True, dynamic_batch=dynamic)
    save(proto, path)
    return proto


@pytest.mark.parametrize("relu", [True, False])
def test_vit_module_reads_back_as_the_same_function(relu):
    model = _vit(relu=relu, depth=2)
    net = from_torch(model, (1, 8, 8))
    x = _x(16)
    with torch.no_grad():
        ref = copy.deepcopy(model).double()(x.double()).numpy()
    np.testing.assert_allclose(net.forward(x.reshape(16, -1).double()).numpy(), ref, atol=READ_TOL * 1e3, rtol=READ_TOL)
    assert net.smooth != relu and net.num_outputs == 10


def test_dynamic_batch_export_with_the_equal_where_chain_reads_and_matches_onnxruntime(tmp_path):
    model = _vit()
    proto = _export(model, tmp_path / "vit.onnx")
    ops = {n.op_type for n in proto.graph.node}
    assert {"Equal", "Where", "Softmax", "LayerNormalization", "MatMul"} <= ops  # what nn.MultiheadAttention exports
    net = from_onnx(tmp_path / "vit.onnx")
    x = _x(32).numpy()
    y = _ort(tmp_path / "vit.onnx", x)
    np.testing.assert_allclose(net.forward(x.reshape(32, -1).astype(np.float64)).numpy(), y, atol=ORT_TOL)


def _typed(v):
    kind = np.asarray(v).dtype.kind
    return np.asarray(v, dtype={"f": np.float32, "b": np.bool_}.get(kind, np.int64))


def _model(nodes, inits, in_shape, out_shape, path):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                              [onnx.numpy_helper.from_array(_typed(v), k) for k, v in inits.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), path)
    return path


def test_every_transformer_op_on_a_variable_agrees_with_onnxruntime(tmp_path):
    """LayerNormalization, Softmax on a middle axis, ReduceMean, a division by a positive variable, Sqrt, Pow 2, Exp,
    Gather, Slice, Split, Where on a constant condition, Expand, Tile, Concat with a constant, a MatMul of two variables."""
    rng = np.random.default_rng(0)
    T, D = 3, 4
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], axis=-1, epsilon=1e-5),
        helper.make_node("Softmax", ["ln"], ["sm"], axis=1),
        helper.make_node("Mul", ["sm", "sm"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "ax2"], ["rm"], keepdims=1),
        helper.make_node("Add", ["rm", "one"], ["den"]),
        helper.make_node("Div", ["x", "den"], ["q"]),  # x / (mean(sm²) + 1): a positive divisor
        helper.make_node("Pow", ["q", "two"], ["p2"]),
        helper.make_node("Add", ["p2", "one"], ["p2b"]),
        helper.make_node("Sqrt", ["p2b"], ["sr"]),
        helper.make_node("Exp", ["sm"], ["ex"]),
        helper.make_node("Gather", ["sr", "i0"], ["g0"], axis=1),  # [1, D]
        helper.make_node("Slice", ["ex", "s0", "s1", "s2"], ["sl"]),  # [1, T, 2]
        helper.make_node("Split", ["sl", "sp"], ["a1", "a2"], axis=2),
        helper.make_node("Where", ["cond", "a1", "c3"], ["wh"]),
        helper.make_node("Expand", ["g0", "eshape"], ["exq"]),  # [1, T, D]
        helper.make_node("Tile", ["a2", "reps"], ["ti"]),  # [1, T, 4]
        helper.make_node("Transpose", ["exq"], ["tr"], perm=[0, 2, 1]),  # [1, D, T]
        helper.make_node("MatMul", ["ti", "tr"], ["mm"]),  # [1, T, T]
        helper.make_node("Concat", ["mm", "wh", "cst"], ["y"], axis=2),  # [1, T, T + 1 + 1]
    ]
    inits = {"g": rng.normal(size=D), "b": rng.normal(size=D), "ax2": np.array([2]), "one": np.array([1.0]),
             "two": np.array(2.0), "i0": np.array(1), "s0": np.array([0]), "s1": np.array([2]), "s2": np.array([2]),
             "sp": np.array([1, 1]), "cond": np.array([[[True], [False], [True]]]), "c3": np.array([[[0.5]]]),
             "eshape": np.array([1, T, D]), "reps": np.array([1, 1, 4]), "cst": rng.normal(size=(1, T, 1))}
    path = _model(nodes, inits, [1, T, D], [1, T, T + 2], tmp_path / "ops.onnx")
    net = from_onnx(path)
    x = rng.normal(size=(50, 1, T, D)).astype(np.float32)
    y = np.concatenate([_ort(path, xi).reshape(1, -1) for xi in x])  # the graph is written for batch 1
    np.testing.assert_allclose(net.forward(x.reshape(50, -1).astype(np.float64)).numpy(), y, atol=ORT_TOL, rtol=ORT_TOL)
    for op in ("LayerNormalization", "Softmax", "ReduceMean", "Sqrt", "Pow", "Exp", "Where", "Expand", "Split"):
        assert op in supported_ops()


def _sampled(net, lb, ub, n, seed=0):
    rng = np.random.default_rng(seed)
    pts = np.concatenate([rng.uniform(lb, ub, (n, lb.size)), np.where(rng.random((n, lb.size)) < 0.5, lb, ub)])
    return pts


@pytest.mark.parametrize("eps", [0.003, 0.03])
def test_crown_and_alpha_crown_bounds_of_a_vit_contain_every_sampled_output(eps):
    model = _vit(depth=1)
    net = from_torch(model, (1, 8, 8))
    x0 = _x(1, seed=3).reshape(-1).double().numpy()
    lb, ub = np.clip(x0 - eps, 0, 1), np.clip(x0 + eps, 0, 1)
    b = Bounder(net, lb, ub)
    K = net.num_outputs
    spec = Spec(np.concatenate([np.eye(K), -np.eye(K)]), np.zeros(2 * K))
    b.crown()
    crown = b.spec_bounds(spec).numpy()
    alpha = b.alpha_spec(spec, list(range(2 * K)), steps=10).numpy()
    pts = _sampled(net, lb, ub, 3000)
    with torch.no_grad():
        y = copy.deepcopy(model).double()(torch.as_tensor(pts).reshape(-1, 1, 8, 8)).numpy()
    for low in (crown, alpha):
        assert np.all(y >= low[:K] - 1e-9) and np.all(y <= -low[K:] + 1e-9)
    assert np.all(alpha >= crown - 1e-9)  # α-CROWN only tightens
    width = -alpha[K:] - alpha[:K]
    assert np.all(width < 50 * (y.max(0) - y.min(0)) + 1e-6)  # and is not vacuous


@pytest.mark.parametrize("depth", [1, 2, None])
def test_crown_through_copies_and_cuts_bounds_every_sampled_site_input(depth):
    """CROWN's intermediate bounds on a two-block ViT as `crown` computes them on attention (sources of copies queried
    once, each query concretized at a cut, `depth` cuts back; None: to the input): every site's interval contains its
    input at dense samples of the box (lower and upper side apart). What a cut costs in tightness against full CROWN
    (measured here at ε 0.01, random weights: more than 20× wider on some units at depth 1) is the price of its speed."""
    model = _vit(depth=2)
    net = from_torch(model, (1, 8, 8))
    x0 = _x(1, seed=4).reshape(-1).double().numpy()
    eps = 0.01
    lb, ub = np.clip(x0 - eps, 0, 1), np.clip(x0 + eps, 0, 1)
    b = Bounder(net, lb, ub)
    assert b.attention and b.cut_depth is None  # a graph with attention, too small for cuts by default
    b.cut_depth = depth
    b.crown()
    assert b.method == "crown"
    pts = torch.as_tensor(_sampled(net, lb, ub, 1500, seed=2))
    vals = b.net.values(pts)
    for s, k in enumerate(b.sites):
        v = vals[b.site_input[s]]
        l, u = b.pre[s]
        assert bool(torch.all(v >= l - 1e-9)), (s, float((l - v).max()))  # the lower side
        assert bool(torch.all(v <= u + 1e-9)), (s, float((v - u).max()))  # the upper side
    # not vacuous: finite on every unit the output reads (the others keep interval arithmetic's bounds, `needed`), and
    # never wider than interval arithmetic (an intersection with it)
    need = b.needed()
    for s, ((l, u), (il, iu)) in enumerate(zip(b.pre, b.ibp_pre)):
        on = need[b.site_input[s]]
        assert bool(torch.all((u - l)[on] < 1e6)) and bool(torch.all((l >= il) & (u <= iu)))
    assert sum(float((u - l).sum()) for l, u in b.pre) < sum(float((u - l).sum()) for l, u in b.ibp_pre)


def test_a_site_read_through_copies_queries_its_sources_once():
    """A LayerNorm's Variance and Product read (x, c) and (c, 1/√var spread over the row): c is queried once, x once,
    the spread 1/√var never (its range is the image of its input's interval); q and k through their Scale not again."""
    net = from_torch(_vit(depth=1), (1, 8, 8))
    b = Bounder(net, np.zeros(64), np.full(64, 0.01))
    via, nodes = b._crown_plan()
    assert via and nodes
    for k in nodes:
        op = b.net.nodes[k].op
        assert not (k in b.site_of and op.elementwise)  # never an elementwise activation's output
        assert type(op).__name__ not in ("Concat", "Select", "Permute", "Scale")


@pytest.mark.parametrize("eps", [0.01, 0.03, 0.05])
def test_a_layer_norm_variance_takes_the_better_tangents_and_holds_at_sampled_points(eps, monkeypatch):
    """A LayerNorm variance's lower bound is the larger of CROWN's with the tangent planes at c's centre and at each
    unit's end nearest 0 (`Variance.refine_rows`); with `Variance.STEPS` the optimized points raise it further. Each
    lies below every sampled variance of the box."""
    from analysis.verification.ops.norm import Variance

    model = _vit(depth=2, seed=2)
    net = from_torch(model, (1, 8, 8))
    x0 = _x(1, seed=3).reshape(-1).double()
    lb, ub = (x0 - eps).clamp(0, 1), (x0 + eps).clamp(0, 1)

    def variance_lowers():
        b = Bounder(net, lb, ub)
        b.crown()
        return b, {s: b.pre[s + 1][0] for s in range(len(b.sites)) if isinstance(b.op(s), Variance)}

    both, got = variance_lowers()
    assert got
    with monkeypatch.context() as m:
        m.setattr(Variance, "refine_rows", lambda self, b, s, idx, n, lo, up, f32, cuts: lo)
        _, only_centre = variance_lowers()
    with monkeypatch.context() as m:
        m.setattr(Variance, "STEPS", 10)
        _, optimized = variance_lowers()
    # each variance's rows sampled: x uniform and at corners of the box, the variance node's value from the graph
    gen = torch.Generator().manual_seed(0)
    xs = torch.cat([lb + torch.rand(3000, 64, generator=gen, dtype=torch.float64) * (ub - lb),
                    torch.where(torch.rand(3000, 64, generator=gen) < 0.5, lb, ub)])
    values = both.net.values(xs)
    for s, lo in got.items():
        assert bool(torch.all(lo >= only_centre[s] - 1e-12))  # never below the centre's alone
        smallest = values[both.sites[s]].min(0).values
        assert bool(torch.all(smallest >= lo - 1e-12)) and bool(torch.all(smallest >= optimized[s] - 1e-12))
    # somewhere the near ends raised it (the last LayerNorms' rows, where c's intervals hold 0 on most units), and the
    # optimized points somewhere above that
    assert any(bool(torch.any(got[s] > only_centre[s] + 1e-9)) for s in got)
    assert any(bool(torch.any(optimized[s] > got[s] + 1e-9)) for s in got)


def test_a_vit_property_is_decided_and_a_witness_replays_in_onnxruntime(tmp_path):
    from analysis.verification.harness import OnnxRecheck
    from analysis.verification.problem import Budget, Problem
    from analysis.verification.registry import get_verifier

    model = _vit(depth=1, seed=1)  # a margin of 0.13 at this sample: proved at 1e-4, broken at 0.1
    path = tmp_path / "m.onnx"
    _export(model, path)
    net = from_onnx(path)
    x0 = _x(1, seed=4).reshape(-1).double().numpy()
    label = int(np.argmax(_ort(path, x0.reshape(1, 1, 8, 8))[0]))

    answers = {}
    for eps in (1e-4, 0.1):
        problem = Problem([robustness_spec(x0, eps, 0.0, 1.0, label, 10)], net, path, recheck=OnnxRecheck(path))
        answers[eps] = get_verifier("auto").run(problem, Budget(30.0))
    assert answers[1e-4].status == "unsat"
    sat = answers[0.1]
    assert sat.status == "sat"
    x = sat.counterexample.astype(np.float32)
    lb, ub = np.clip(x0 - 0.1, 0, 1), np.clip(x0 + 0.1, 0, 1)
    assert np.all(x >= lb.astype(np.float32)) and np.all(x <= ub.astype(np.float32))
    y = _ort(path, x.reshape(1, 1, 8, 8))[0]
    assert np.max(np.delete(y, label)) > y[label]  # strictly violating in onnxruntime


def test_branch_and_bound_and_the_milp_read_the_new_ops():
    """Branch and bound splits the MLP's ReLUs while the attention keeps its relaxations: a verdict, or a timeout with a
    finite global lower bound below every sampled value; the MILP encodes the attention by the same planes, so its LP relaxation's
    minimum of each spec row is at least CROWN's bound and at most every sampled value."""
    from scipy.optimize import linprog

    model = _vit(depth=1, seed=1)
    net = from_torch(model, (1, 8, 8))
    x0 = _x(1, seed=4).reshape(-1).double().numpy()
    label = int(net.forward(x0).argmax())
    spec = robustness_spec(x0, 0.05, 0.0, 1.0, label, 10)
    b = Bounder(net, spec.lb, spec.ub)
    b.crown()
    rows, owner = Spec.from_disjuncts(spec.disjuncts)
    crown = b.spec_bounds(rows)
    opn = [d for d in range(len(spec.disjuncts)) if not any(float(crown[i]) > 0 for i, o in enumerate(owner) if o == d)]
    assert opn  # CROWN leaves some open here
    t = __import__("time").perf_counter()
    status, x, msg, stats = bab(b, spec, opn, lambda: __import__("time").perf_counter() - t > 4, lambda: 4.0, Settings(batch=16, steps=3))
    assert status in ("unsat", "timeout"), msg
    pts = _sampled(net, spec.lb, spec.ub, 2000)
    values = net.forward(pts).numpy() @ rows.C.numpy().T + rows.d.numpy()
    if status == "timeout":  # a finite global lower bound, below every sampled value of the open rows
        mine = [i for i, o in enumerate(owner) if o in opn]
        assert -1.0 < stats["global_lower"] <= values[:, mine].min()
    enc = milp.encode(b.net, spec.lb, spec.ub, b.pre)
    for r in range(rows.C.shape[0]):
        c = np.zeros(enc.num_vars)
        c[enc.y] = rows.C[r].numpy()
        lp = linprog(c, A_ub=np.concatenate([enc.matrix.toarray(), -enc.matrix.toarray()]),
                     b_ub=np.concatenate([np.where(np.isfinite(enc.row_hi), enc.row_hi, 1e30),
                                          -np.where(np.isfinite(enc.row_lo), enc.row_lo, -1e30)]),
                     bounds=list(zip(enc.var_lb, enc.var_ub)), method="highs")
        assert lp.status == 0
        low = lp.fun + float(rows.d[r])
        assert low >= float(crown[r]) - 1e-6 and low <= values[:, r].min() + 1e-9


def test_an_unreadable_transformer_names_the_form_and_the_fix():
    class Floory(torch.nn.Module):  # Floor: a step, no sound linear relaxation is read for it
        def forward(self, x):
            return torch.floor(x.flatten(1) @ torch.ones(64, 3))

    with pytest.raises(UnsupportedModel) as e:
        from_torch(Floory(), (1, 8, 8))
    assert "unsupported op Floor" in str(e.value) and e.value.op == "Floor" and e.value.fix


def test_api_check_holds_through_multi_head_attention():
    from analysis import api

    from pipeline import to_gates

    model, _ = to_gates(_vit(relu=False), inplace=False)
    x = _x(64)
    y = torch.zeros(64, dtype=torch.long)
    r = api.check(model.eval(), (x, y))
    assert r["verdict"]["certificate"] == "holds", r["verdict"]
    assert r["certificate"]["per_sample"]["status"] == "sound"


def test_a_narrow_softmax_keeps_its_differences_a_layer_and_a_wide_one_takes_expsums(monkeypatch):
    from analysis.verification.ops.curves import Exp
    from analysis.verification.ops.softmax import ExpSums

    model = _vit(depth=1)
    x0 = _x(1, seed=3).reshape(-1).double().numpy()
    eps = 0.03
    lb, ub = np.clip(x0 - eps, 0, 1), np.clip(x0 + eps, 0, 1)
    pts = _sampled(None, lb, ub, 2000)
    with torch.no_grad():
        y = copy.deepcopy(model).double()(torch.as_tensor(pts).reshape(-1, 1, 8, 8)).numpy()
    widths = {}
    for form, min_diffs in (("layer", 10**9), ("expsums", 0)):
        monkeypatch.setattr(ExpSums, "MIN_DIFFS", min_diffs)
        net = from_torch(model, (1, 8, 8))
        kinds = {type(n.op) for n in net.nodes[1:]}
        assert (ExpSums in kinds) == (form == "expsums") and (Exp in kinds) == (form == "layer")
        b = Bounder(net, lb, ub)
        b.crown()
        K = net.num_outputs
        low = b.spec_bounds(Spec(np.concatenate([np.eye(K), -np.eye(K)]), np.zeros(2 * K))).numpy()
        assert np.all(y >= low[:K] - 1e-9) and np.all(y <= -low[K:] + 1e-9)  # both forms sound
        widths[form] = float(np.sum(-low[K:] - low[:K]))
    # the layer's intervals come from CROWN (x_j and x_i correlated), ExpSums' from [l_j − u_i, u_j − l_i]: on a
    # narrow softmax the layer is the tighter form, which is why readers keep it below ExpSums.MIN_DIFFS
    assert widths["layer"] <= widths["expsums"]


@pytest.mark.parametrize("min_diffs", [0, 10**9])
def test_needed_units_are_those_the_output_depends_on(monkeypatch, min_diffs):
    """`Bounder.needed` against the Jacobian of the output with respect to each node's value (autograd, float64) at
    random inputs: every unit the output moves with is marked, and the last block reads the class token alone (its MLP:
    `hidden` units of the 5 tokens' 5·hidden; its softmax: one row per head)."""
    from analysis.verification.ops.softmax import ExpSums

    monkeypatch.setattr(ExpSums, "MIN_DIFFS", min_diffs)  # both softmax forms: ExpSums (wide graphs') and the layer
    model = _vit(depth=2)
    net = from_torch(model, (1, 8, 8))
    b = Bounder(net, np.zeros(64), np.full(64, 0.01))
    need = b.needed()
    g = b.net
    x = torch.rand(40, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 4 - 2
    w = torch.randn(g.sizes[g.output], generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for k in range(1, g.output):
        vals = g.values(x)
        leaf = vals[k].detach().requires_grad_(True)
        vals[k] = leaf
        for j in range(k + 1, g.output + 1):
            if j in g.ancestors(g.output):
                vals[j] = g.nodes[j].op.forward(*(vals[i] for i in g.nodes[j].inputs))
        if not vals[g.output].requires_grad:
            assert not bool(need[k].any()), k
            continue
        (grad,) = torch.autograd.grad((vals[g.output] @ w).sum(), leaf, allow_unused=True)
        moved = torch.zeros(g.sizes[k], dtype=torch.bool) if grad is None else (grad != 0).any(0)
        assert bool(torch.all(need[k][moved])), (k, type(g.nodes[k].op).__name__)  # every unit it moves with is marked
    relus = [k for k in b.sites if type(g.nodes[k].op).__name__ == "ReLU"]
    assert [int(need[k].sum()) for k in relus] == [5 * 16, 16]  # block 0's MLP on every token, block 1's on the class token
    sums = [k for k in b.sites if type(g.nodes[k].op).__name__ == "ExpSums"]
    assert [int(need[k].sum()) for k in sums] == ([2 * 5 * 5, 2 * 5] if min_diffs == 0 else [])


def test_crown_ignores_the_intervals_of_units_the_output_does_not_read(monkeypatch):
    """On a two-block ViT, every unit off the paths to the output widened until block 1's softmax overflows on them:
    CROWN's spec bounds are the same (those units are read by no row), and hold at dense samples of the box."""
    from analysis.verification.ops.softmax import ExpSums

    monkeypatch.setattr(ExpSums, "MIN_DIFFS", 0)  # the wide graphs' softmax form, on a small ViT
    model = _vit(depth=2)
    net = from_torch(model, (1, 8, 8))
    x0 = _x(1, seed=4).reshape(-1).double().numpy()
    lb, ub = np.clip(x0 - 0.01, 0, 1), np.clip(x0 + 0.01, 0, 1)
    b = Bounder(net, lb, ub)
    b.crown()
    K = net.num_outputs
    spec = Spec(np.concatenate([np.eye(K), -np.eye(K)]), np.zeros(2 * K))
    before = b.spec_bounds(spec)
    need = b.needed()
    (s,) = [s for s, k in enumerate(b.sites) if type(b.op(s)).__name__ == "ExpSums" and not bool(need[k].all())]
    l, u = b.pre[s]
    off = ~need[b.site_input[s]]
    assert bool(off.any())
    b.tighten(s, torch.arange(0), l[:0], u[:0])  # (clears the cached relaxation)
    b.pre[s] = (torch.where(off, l - 1000, l), torch.where(off, u + 1000, u))
    after = b.spec_bounds(spec)
    assert torch.allclose(before, after, rtol=0, atol=1e-12)
    pts = _sampled(net, lb, ub, 1500, seed=3)
    with torch.no_grad():
        y = copy.deepcopy(model).double()(torch.as_tensor(pts).reshape(-1, 1, 8, 8)).numpy()
    low = after.numpy()
    assert np.all(y >= low[:K] - 1e-9) and np.all(y <= -low[K:] + 1e-9)
    # a row that reads an overflowing sum's upper line is refused, not bounded
    b.pre[s] = (l - 1000, u + 1000)
    b._relax_cache.pop(s, None)
    with pytest.raises(UnsupportedModel, match="exp overflows"):
        b.spec_bounds(spec)


def test_a_pass_that_overflows_runs_once_and_says_so(monkeypatch):
    """A ViT whose attention logits are scaled until a softmax overflows on the box: `api.verify`'s first pass raises
    OutOfDomain once; the property reports it (not decided) without a second CROWN pass of the same box (on the
    64-token ViT a pass is ~35 s, and the fallback ran it twice: 79 s)."""
    from analysis import api

    model = _vit(depth=1)
    with torch.no_grad():
        model.blocks[0].attn.in_proj_weight[:16] *= 300.0  # q and k
    calls = []
    orig = Bounder._crown

    def counted(self):
        calls.append(1)
        return orig(self)

    monkeypatch.setattr(Bounder, "_crown", counted)
    x = _x(1, seed=5)
    y = torch.as_tensor([int(model(x).argmax())])
    res = api.verify(model, (x, y), epsilons=[0.05], low=0.0, high=1.0, samples=1, timeout_s=20, progress=False)
    (row,) = res["rows"]
    assert row["result"] == "unknown" and "OutOfDomain" in row["message"], row["message"]
    assert len(calls) == 1


# the graph's float64 outputs against the float64 bounds: a few roundings of the logits' scale
MLP_SOUND_TOL = 1e-9


@pytest.mark.parametrize("eps", [0.01, 0.1])
def test_a_layer_norm_mlp_without_attention_gets_its_crown_pass_and_bounds_that_hold(eps):
    """A LayerNorm in a network without attention (an MLP, MLP-Mixer's channel norm): CROWN queries its variance's
    input units, which are not its output's, so no per-output-unit skip may index them (that crashed the pass). The
    pass finishes, and the logits' bounds contain the graph's outputs at 4000 points of the box, each side apart."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    net = from_torch(model.eval(), (6,))
    x0 = torch.rand(6, dtype=torch.float64)
    lb, ub = x0 - eps, x0 + eps
    b = Bounder(net, lb, ub)
    b.crown()
    assert b.method == "crown"
    eye = torch.eye(3, dtype=torch.float64)
    both = b.spec_bounds(Spec(torch.cat([eye, -eye]), torch.zeros(6, dtype=torch.float64)))
    lower, upper = both[:3], -both[3:]
    gen = torch.Generator().manual_seed(1)
    xs = torch.cat([lb + torch.rand(2000, 6, generator=gen, dtype=torch.float64) * (ub - lb),
                    torch.where(torch.rand(2000, 6, generator=gen) < 0.5, lb, ub)])
    ys = net.values(xs)[net.output]
    assert bool(torch.all(ys >= lower - MLP_SOUND_TOL)), "below the lower bound"
    assert bool(torch.all(ys <= upper + MLP_SOUND_TOL)), "above the upper bound"
