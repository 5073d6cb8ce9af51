"""The device a run resolves once and hands on: each stage records where its work really ran, and no stage moves the
model it is given (a user's model through the API comes back where it was)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeline.devices import cpu_model, model_on
from pipeline.stages import STAGES

GPU_CPU_RTOL = 1e-4  # one float32 Linear layer evaluated by cuBLAS and by the CPU: pre-activations within a few ulp


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 3))


def test_a_model_already_there_is_used_as_it_is():
    m = _mlp()
    assert cpu_model(m) is m and model_on(m, "cpu") is m


def test_each_stage_names_where_it_runs():
    want = {"train": "cuda", "harden": "cuda", "swap": "cuda", "export": "cpu", "int8": "cpu",
            "verify": "cpu",  # verify.device=cpu below; its bound passes follow verify.device
            "downstream": "cpu",
            "report": "cpu", "check": "cuda (per-layer statistics, the float32 Jacobian bound's arithmetic), cpu (the "
                                       "certificate's walks: statements about CPU runs)",
            "sparsity": "cuda (APoZ pass), cpu (pruning, its check and export)"}
    from pipeline.config import Config, apply_overrides

    cfg = apply_overrides(Config(), ["verify.device=cpu"])
    assert {name: st.device("cuda", cfg) for name, st in STAGES.items()} == want
    assert all(st.device("cpu", cfg) == "cpu" for st in STAGES.values())
    if torch.cuda.is_available():  # verify.device=auto: the bound passes on the GPU, the MILP and replays on the CPU
        assert STAGES["verify"].device("cuda", Config()).startswith("cuda (bound passes")


def test_a_cpu_run_records_cpu_for_every_stage(tmp_path):
    from pipeline import runner
    from pipeline.config import Config, apply_overrides

    cfg = apply_overrides(Config(), ["data.name=digits", "model.hidden=[16]", "train.epochs=2", "variants=lambda_gelu",
                                     "stages=train,harden,check,swap", f"out_dir={tmp_path}", "name=d", "device=cpu",
                                     "check.float32_jacobian_samples=0"])
    run = runner.create(cfg)
    runner.run_pipeline(cfg, run, log=lambda m: None)
    assert run.device == torch.device("cpu")
    assert {s: v["device"] for s, v in run.manifest()["stages"].items()} == dict.fromkeys(
        ("train", "harden", "check", "swap"), "cpu")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_stage_functions_leave_a_cuda_model_on_cuda(tmp_path):
    from analysis.bounds_check import empirical_check, swap_certificate
    from analysis.sparsity import unit_stats
    from pipeline.activations import ACTIVATIONS, GateContext
    from pipeline.config import GateConfig
    from pipeline.data import Split
    from quantize.export import to_onnx

    torch.manual_seed(0)
    gate = ACTIVATIONS["lambda_gelu"].build(GateContext(8, 0, 1, GateConfig(), {}))
    model = nn.Sequential(nn.Linear(4, 8), gate, nn.Linear(8, 3)).cuda()
    split = Split(torch.randn(64, 4), torch.zeros(64, dtype=torch.long))
    layers = empirical_check(model, split, 32, "cuda", 1e-3, 3.0, 1e-9)
    cert = swap_certificate(model, split, 32, split.x[:1], jacobian_samples=64, device="cuda")
    stats = unit_stats(model, split, 32, "cuda")
    to_onnx(model, split.x[:1], 20)
    assert all(p.is_cuda for p in model.parameters())
    cpu = cpu_model(model)
    for a, b in zip(layers, empirical_check(cpu, split, 32, "cpu", 1e-3, 3.0, 1e-9)):
        # the same float64 statistics of the same pre-activations (cuBLAS and the CPU round the Linear differently)
        assert a["n_preactivations"] == b["n_preactivations"]
        assert a["mean_gap"] == pytest.approx(b["mean_gap"], rel=GPU_CPU_RTOL)
        assert a["max_gap"] == pytest.approx(b["max_gap"], rel=GPU_CPU_RTOL)
    ref = swap_certificate(cpu, split, 32, split.x[:1], jacobian_samples=64)
    assert cert["global"] == ref["global"]
    # the Jacobian bound's float64 arithmetic on the GPU: the same bound up to summation order
    assert cert["float32_jacobian"]["certified_fraction"] == ref["float32_jacobian"]["certified_fraction"]
    assert cert["float32_jacobian"]["bound_to_change"]["median"] == pytest.approx(
        ref["float32_jacobian"]["bound_to_change"]["median"], rel=1e-9)
    assert stats.keys() == unit_stats(cpu, split, 32, "cpu").keys()
