"""The verification engine computes on its graph's device and makes nothing elsewhere.

No GPU is needed to test that: the engine runs on the CPU while torch's default device is `meta`, so a tensor made
without naming a device (the bug that breaks the engine on a GPU) lands on `meta`, and a guard over every torch call
fails on any tensor that is not on the CPU. The guard also fails on a numpy round trip (`Tensor.numpy`,
`torch.from_numpy`) inside the bound passes and branch and bound's rounds: on a GPU each is a wait for the device.
The MILP (the engine's one boundary to the host) and the counterexample re-check run with the guard paused."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from analysis.verification import bab as bab_mod, milp
from analysis.verification.bab import Settings, bab
from analysis.verification.bounds import Bounder, Spec
from analysis.verification.ops.rounding import QuantizedInput
from analysis.verification.readers import from_torch
from analysis.verification.vnnlib import robustness_spec

HOST_CROSSINGS = {torch.Tensor.numpy, torch.from_numpy}


class DeviceGuard(TorchFunctionMode):
    """Every tensor a torch call returns must be on `device`; numpy round trips fail too (unless paused)."""

    def __init__(self, device: str = "cpu"):
        super().__init__()
        self.device = torch.device(device)
        self.paused = False

    @contextlib.contextmanager
    def pause(self):
        self.paused, before = True, self.paused
        try:
            yield
        finally:
            self.paused = before

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.paused and func in HOST_CROSSINGS:
            raise AssertionError(f"{getattr(func, '__name__', func)}: a numpy round trip inside the engine's hot path")
        out = func(*args, **kwargs)
        if not self.paused:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.device != self.device:
                    raise AssertionError(f"{getattr(func, '__name__', func)} made a tensor on {t.device}, "
                                         f"not on the engine's device {self.device}")
        return out


@contextlib.contextmanager
def guarded():
    """Implicitly placed tensors go to `meta`; the guard requires the CPU (where the test's weights are)."""
    guard = DeviceGuard("cpu")
    with torch.device("meta"), guard:
        yield guard


def _case(seed: int = 8, eps: float = 0.3):  # branch and bound needs 4 rounds of batch 4 here
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = nn.Sequential(nn.Linear(4, 12), nn.ReLU(), nn.Linear(12, 12), nn.ReLU(), nn.Linear(12, 3)).eval()
    net = from_torch(model, (4,))
    x0 = rng.uniform(0, 1, 4)
    c = int(np.argmax(net.forward(x0).numpy()))
    return net, robustness_spec(x0, eps, -1.0, 2.0, c, 3)


def test_the_guard_catches_a_tensor_made_on_the_default_device():
    with guarded(), pytest.raises(AssertionError, match="meta"):
        torch.ones(3) + torch.zeros(3, device="cpu")
    with guarded(), pytest.raises(AssertionError, match="numpy"):
        torch.zeros(2, device="cpu").numpy()


def test_bound_passes_make_every_tensor_on_the_graphs_device():
    net, spec = _case()
    rows, owner = Spec.from_disjuncts(spec.disjuncts)
    b = Bounder(net, spec.lb, spec.ub)  # built outside: readers and the box's numpy arrays are the host's side
    with guarded():
        b.crown()
        b.alpha_intermediate(steps=3)
        lower = b.alpha_spec(rows, owner, steps=3)
    assert lower.device.type == "cpu" and b.method == "alpha-crown"


def test_branch_and_bound_rounds_make_every_tensor_on_the_graphs_device(monkeypatch):
    net, spec = _case()
    b = Bounder(net, spec.lb, spec.ub)
    b.crown()
    guard_box = {}
    real_solve = milp.solve

    def host_solve(*args, **kwargs):  # the leaf LPs: HiGHS on the host, by design
        with guard_box["guard"].pause():
            return real_solve(*args, **kwargs)

    monkeypatch.setattr(bab_mod.milp, "solve", host_solve)

    def confirm(x):
        return x

    with guarded() as guard:
        guard_box["guard"] = guard

        def paused_confirm(x):
            with guard.pause():
                return confirm(x)

        status, _, msg, stats = bab(b, spec, list(range(len(spec.disjuncts))), lambda: False, lambda: 30.0,
                                    Settings(batch=4, steps=3), paused_confirm)
    assert status in ("unsat", "sat") and stats["rounds"] >= 2, (status, msg, stats)


def test_a_graph_moves_whole_and_keeps_its_values():
    net, spec = _case()
    moved = net.to("meta")
    assert moved.device.type == "meta" and moved.to("meta") is moved and net.to("cpu") is net
    assert all(t.device.type == "meta" for n in moved.nodes[1:] for t in n.op.tensors())
    x = torch.rand(5, 4, dtype=torch.float64)
    assert torch.equal(net.to("cpu").forward(x), net.forward(x))


def test_the_first_quantization_is_computed_on_its_device_as_the_runtime_does():
    """QuantizedInput's grid points in torch are the numpy reference's (float32 x/s, half to even, float32 dequantize)."""
    from analysis.verification.quantized import grid_index

    rng = np.random.default_rng(0)
    scale = np.full(1000, np.float32(0.0173))
    zero = np.full(1000, 3.0)
    q = QuantizedInput(scale.astype(np.float64), zero, 0, 255)
    x = rng.uniform(-0.2, 4.5, 1000)
    x[:10] = (np.arange(10) + 0.5) * np.float32(0.0173)  # ties
    with guarded():
        got = q.value(torch.tensor(x, dtype=torch.float64, device="cpu"))
    ref_q = np.clip(np.rint(x.astype(np.float32) / scale).astype(np.float64) + zero, 0, 255)  # numpy, as before
    assert np.array_equal(grid_index(x, scale, zero, 0, 255), ref_q)
    ref = ((ref_q - zero).astype(np.float32) * scale.astype(np.float32)).astype(np.float64)
    assert np.array_equal(got.numpy(), ref)


def test_the_batch_on_a_gpu_is_planned_from_its_memory_and_shared(monkeypatch):
    """`bab.default_batch`: 256 on a CPU; on an 80 GB GPU thousands of domains for one process, a share for each of
    several processes (within GPU_BATCH)."""
    from types import SimpleNamespace

    from analysis.verification.bab import CPU_BATCH, GPU_BATCH, default_batch

    net, spec = _case()
    cpu = Bounder(net, spec.lb, spec.ub)
    assert default_batch(cpu, 9, 1024) == CPU_BATCH
    gib = 2 ** 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (78 * gib, 80 * gib))
    fake = SimpleNamespace(device=torch.device("cuda", 0), net=SimpleNamespace(sizes=[784, 256, 256, 256, 256, 10]))
    one = default_batch(fake, 9, 1024)
    eight = default_batch(fake, 9, 1024, sharers=8)
    assert 2000 <= one <= GPU_BATCH[1] and GPU_BATCH[0] <= eight <= one // 4


def test_the_harness_tells_verifiers_how_many_processes_share_a_gpu(monkeypatch):
    from analysis.verification import harness

    seen = {}
    monkeypatch.setattr(harness, "_run_pool", lambda indexed, loop, *rest:
                        seen.update(options=loop.options, device=loop.device, jobs=loop.workers))
    tasks = [harness.Task(key=i) for i in range(5)]
    harness.run(tasks, harness.PerTask(1.0), jobs=3, device="cuda:0")  # resolved by the caller
    assert seen == {"options": {"sharers": 3}, "device": "cuda:0", "jobs": 3}


def _vit_case(eps: float = 0.05):
    """A ReLU ViT (nn.MultiheadAttention, LayerNorm, a class token) whose property CROWN leaves open at this radius."""
    from _modules import ClassTokenViT
    from pipeline.relu_swap import to_relu

    torch.manual_seed(1)
    model = ClassTokenViT(dim=8, heads=2, hidden=16).eval()
    with torch.no_grad():
        model.pos.normal_(0, 0.5)
        model.cls.normal_(0, 0.5)
    net = from_torch(to_relu(model), (1, 8, 8))
    x0 = torch.rand(1, 1, 8, 8, generator=torch.Generator().manual_seed(4)).reshape(-1).double().numpy()  # robust here
    c = int(np.argmax(net.forward(x0).numpy()))
    return net, robustness_spec(x0, eps, 0.0, 1.0, c, 10)


def test_transformer_bound_passes_and_branch_and_bound_stay_on_the_graphs_device(monkeypatch):
    """Softmax (exp, reciprocal), LayerNorm (variance, rsqrt, product), MatMuls of two variables, class-token Concat:
    CROWN, α-CROWN and branch and bound rounds make every tensor on the graph's device, with no numpy round trip."""
    net, spec = _vit_case()
    rows, owner = Spec.from_disjuncts(spec.disjuncts)
    b = Bounder(net, spec.lb, spec.ub)
    real_solve = milp.solve
    box = {}

    def host_solve(*args, **kwargs):
        with box["guard"].pause():
            return real_solve(*args, **kwargs)

    monkeypatch.setattr(bab_mod.milp, "solve", host_solve)
    calls = []

    def expired():  # three rounds' worth of checks
        calls.append(1)
        return len(calls) > 40

    with guarded() as guard:
        box["guard"] = guard
        b.crown()
        assert any(float(v) <= 0 for v in b.spec_bounds(rows))  # open after CROWN: branch and bound has work
        b.alpha_spec(rows, owner, steps=2)
        status, _, msg, stats = bab(b, spec, list(range(len(spec.disjuncts))), expired, lambda: 30.0,
                                    Settings(batch=4, steps=2), lambda x: x)
    assert status in ("unsat", "timeout") and stats["rounds"] >= 1, (status, msg, stats)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.cuda
@needs_cuda
def test_on_a_gpu_the_bounds_and_branch_and_bound_match_the_cpu():
    """The same property on the CPU and on the GPU: CROWN and α-CROWN bounds equal to float64 rounding, branch and
    bound gives the same verdict, and its tensors stay on the GPU (bab's store, the Bounder's intervals)."""
    net, spec = _case()
    rows, owner = Spec.from_disjuncts(spec.disjuncts)
    out = {}
    for dev in ("cpu", "cuda"):
        b = Bounder(net.to(dev), spec.lb, spec.ub)
        b.crown()
        crown = b.spec_bounds(Spec(rows.C.to(dev), rows.d.to(dev)))
        b.alpha_intermediate(steps=3)
        assert all(l.device.type == dev for l, _ in b.pre)
        status, _, _, stats = bab(b, spec, list(range(len(spec.disjuncts))), lambda: False, lambda: 30.0,
                                  Settings(batch=4, steps=3))
        out[dev] = (crown.cpu(), [(l.cpu(), u.cpu()) for l, u in b.pre], status)
    torch.testing.assert_close(out["cuda"][0], out["cpu"][0], rtol=1e-9, atol=1e-9)
    for (lc, uc), (lg, ug) in zip(out["cpu"][1], out["cuda"][1]):
        torch.testing.assert_close(lg, lc, rtol=1e-6, atol=1e-6)  # α-CROWN's Adam path may differ in summation order
        torch.testing.assert_close(ug, uc, rtol=1e-6, atol=1e-6)
    assert out["cuda"][2] == out["cpu"][2]
