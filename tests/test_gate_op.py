"""The λ-gates as torch.library ops (`pipeline/kernels/gate_op.py`), what torch.compile traces on CUDA: the
registration (schema, autograd, fake tensors) and the gradients, on the CPU through the ops' CPU kernels; on CUDA, a
model compiled with mode="reduce-overhead" against the same model eager."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is not installed: the ops are Triton ops")

from pipeline.kernels import gate_op  # noqa: E402  (registers the ops)
from pipeline.kernels import triton_gate as tg  # noqa: E402

T = 0.5
REF_RTOL = 1e-12  # the CPU kernel in float64 against the erfc/σ reference: both are float64 expressions of one function
CASES = {"layer": ((5, 6), 1, 1), "channel": ((5, 6), 6, 1), "tokens": ((2, 3, 4), 4, -1), "image": ((2, 3, 4, 4), 3, 1)}


def _reference(x, p, gate, channel_dim, from_s):
    lam = 1.0 + F.softplus(p / T) if from_s else p
    if p.numel() > 1:
        shape = [1] * x.dim()
        shape[channel_dim % x.dim()] = -1
        lam = lam.reshape(shape)
    z = lam * x
    return x * (0.5 * torch.special.erfc(-z / math.sqrt(2.0)) if gate == "phi" else torch.sigmoid(z))


@pytest.mark.parametrize("gate", ["phi", "sigmoid"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("from_s", [True, False], ids=["learned", "frozen"])
def test_values_gradients_and_registration_on_the_cpu(gate, case, from_s):
    shape, n, cd = CASES[case]
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    p = (torch.randn(n, generator=gen, dtype=torch.float64) if from_s else torch.rand(n, generator=gen, dtype=torch.float64) * 4 + 1)
    p.requires_grad_(from_s)
    kid = tg.GATES[gate]
    op = lambda a, b: torch.ops.lambda_gates.gate(a, b, T, kid, cd, from_s)  # noqa: E731
    y = op(x, p)
    torch.testing.assert_close(y, _reference(x, p, gate, cd, from_s), rtol=REF_RTOL, atol=0.0)
    torch.autograd.gradcheck(op, (x, p))
    checks = ("test_schema", "test_autograd_registration", "test_faketensor")  # the others compile the CUDA body
    assert set(torch.library.opcheck(torch.ops.lambda_gates.gate.default, (x, p, T, kid, cd, from_s),
                                     test_utils=checks).values()) == {"SUCCESS"}
    args = (torch.randn_like(x), x.detach(), p.detach(), T, kid, cd, from_s, from_s)
    assert set(torch.library.opcheck(torch.ops.lambda_gates.gate_backward.default, args,
                                     test_utils=("test_schema", "test_faketensor")).values()) == {"SUCCESS"}


def test_a_frozen_lambda_gets_no_gradient():
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    lam = torch.full((3,), 2.5, dtype=torch.float64, requires_grad=True)
    torch.ops.lambda_gates.gate(x, lam, T, 0, 1, False).sum().backward()
    assert lam.grad is None and x.grad is not None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_compiled_model_runs_the_op_and_matches_eager():
    from pipeline.activations import ACTIVATIONS, GateContext
    from pipeline.config import GateConfig

    torch.manual_seed(0)
    gate = ACTIVATIONS["lambda_gelu"].build(GateContext(32, 0, 1, GateConfig(granularity="channel"), {}))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), gate, torch.nn.Linear(32, 4)).cuda()
    x = torch.randn(64, 16, device="cuda")
    compiled = torch.compile(model, mode="reduce-overhead")
    for _ in range(3):  # warm-up replays of the captured graphs
        y = compiled(x)
        y.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    ref = model(x)
    ref.sum().backward()
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g / 3, p.grad, rtol=1e-4, atol=1e-6)  # three accumulated backward passes


def _ttir(kernel, constexprs: dict, scalar_t: str) -> str:
    """The kernel lowered to Triton IR for sm_90 with the float scalar `t` typed `scalar_t`: the front end, which
    needs no GPU (the step where a wrong dtype fails to compile)."""
    try:
        from triton._C.libtriton import ir
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from triton.compiler.compiler import make_backend

        target = GPUTarget("cuda", 90, 32)
        backend = make_backend(target)
    except (ImportError, AttributeError, RuntimeError) as exc:  # Triton's internals, not the kernel
        pytest.skip(f"this Triton cannot lower for sm_90 here: {exc}")
    names = kernel.arg_names
    sig = {n: ("constexpr" if n in constexprs else "fp64" if n == "t" and scalar_t == "fp64" else
               "fp32" if n == "t" else "*i32" if n == "cnt_ptr" else "*fp32" if n.endswith("_ptr") else "i32")
           for n in names}
    src = ASTSource(kernel, signature=sig, constexprs={(names.index(k),): v for k, v in constexprs.items()})
    options = backend.parse_options({})
    ctx = ir.context()
    ir.load_dialects(ctx)
    backend.load_dialects(ctx)
    return str(src.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(), ctx))


@pytest.mark.parametrize("scalar_t", ["fp32", "fp64"])
@pytest.mark.parametrize("from_s", [True, False])
def test_the_kernels_compile_when_inductor_passes_t_as_fp64(scalar_t, from_s):
    # torch.compile's wrap_triton types the Python float t as fp64, the eager launcher as fp32 (an H200 run failed to
    # compile the op under torch.compile: the fp64 λ reached a 32-bit bitcast)
    common = {"COL": True, "FROM_S": from_s, "GATE": 0, "PRECISE": True, "FAST": True, "BM": 8, "BN": 32}
    assert "tt.func" in _ttir(tg._gate_fwd, common, scalar_t)
    assert "tt.func" in _ttir(tg._gate_bwd, {**common, "NEED_X": True, "NEED_P": from_s, "PR": 32}, scalar_t)
