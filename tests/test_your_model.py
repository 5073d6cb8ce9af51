"""A user's own model through the library API, honestly.

A gate function called inside forward() is found without `example=` and refused by the Hardener and the swap; the
three ways users write GELU (a module, an attribute as in Hugging Face, a call inside forward) either harden and swap
to exactly the ReLU network or are refused in one line; a converted model pickles; `Hardener.start_epoch` checks its
range; `api.quantize` gives the int8 stage's file; `api.verify` returns counterexamples that onnxruntime confirms;
progress and the `--out` check of `pipeline vnncomp`; the report's wording and figure."""

from __future__ import annotations

import copy
import csv
import io
import math
import pickle

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from _digits import digits, trained
from analysis import api
from pipeline import Hardener, swap_report, to_gates, to_relu
from pipeline.activations import HardenableGate, LambdaGELU, gate_sites
from pipeline.hardener import HARDENED_RTOL, HardenError
from pipeline.relu_swap import SwapError

EPOCHS = 6
LOGIT_ATOL = 1e-6  # float32 recomputation of the same ReLU network, same operation order


class ModuleGELU(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.act, self.b = nn.Linear(64, 32), nn.GELU(), nn.Linear(32, 10)

    def forward(self, x):
        return self.b(self.act(self.a(x.flatten(1))))


class AttrGELU(nn.Module):  # Hugging Face style: the function held as an attribute
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, 32), nn.Linear(32, 10)
        self.act_fn = F.gelu

    def forward(self, x):
        return self.b(self.act_fn(self.a(x.flatten(1))))


class InlineGELU(nn.Module):  # the issue's reproducer, on digits' 64 inputs
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, 32), nn.Linear(32, 10)

    def forward(self, x):
        return self.b(F.gelu(self.a(x.flatten(1))))


class ConvInline(nn.Module):  # a first layer that does not say the input's size, and a forward for 8×8 inputs only
    def __init__(self):
        super().__init__()
        self.c, self.head = nn.Conv2d(1, 4, 3), nn.Linear(4 * 6 * 6, 10)

    def forward(self, x):
        return self.head(F.gelu(self.c(x)).flatten(1))


class _GeluCalls(TorchFunctionMode):
    """Counts every F.gelu call, wherever it is made: the reference for "the model computes no GELU"."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.n += func is F.gelu
        return func(*args, **(kwargs or {}))


def _gelu_calls(model: nn.Module, x: torch.Tensor) -> int:
    with torch.no_grad(), _GeluCalls() as mode:
        model(x)
    return mode.n


def _train(model: nn.Module, hardener: Hardener) -> list[float]:
    ds = digits()
    hardness = []
    opt = torch.optim.SGD(hardener.param_groups(lr=0.1, weight_decay=1e-4), lr=0.1, momentum=0.9)
    for epoch in range(1, EPOCHS + 1):
        hardener.start_epoch(epoch)
        model.train()
        for i in torch.randperm(len(ds.train), generator=torch.Generator().manual_seed(epoch)).split(64):
            opt.zero_grad()
            F.cross_entropy(model(ds.train.x[i]), ds.train.y[i]).backward()
            opt.step()
        hardness.append(hardener.hardness())
    return hardness


# ------------------------------------------------------------------------------------------------
# 1. hardening never silently does nothing


def test_a_gelu_called_inside_forward_is_found_without_example_and_refused_everywhere():
    ds = digits()
    model, report = to_gates(InlineGELU())
    assert report.probed and "[2, 64]" in report.probe
    assert [(s.fqn, s.source) for s in report.left] == [("", "F.gelu")] and "called inside forward()" in report.left[0].reason
    assert "1 left" in str(report)
    for refuse in (lambda: Hardener(model, epochs=4), lambda: to_relu(copy.deepcopy(model)),
                   lambda: swap_report(model, ds.val), lambda: api.swap(model, (ds.val.x, ds.val.y))):
        with pytest.raises((HardenError, SwapError)) as e:
            refuse()
        msg = str(e.value)
        assert "F.gelu in `(root)` (InlineGELU)" in msg and "inside forward()" in msg and "\n" not in msg


def test_where_the_forward_cannot_be_watched_the_report_and_the_hardener_name_example():
    model, report = to_gates(ConvInline())
    assert not report.probed and "was not looked for" in report.probe and "example=" in str(report)
    with pytest.raises(HardenError) as e:
        Hardener(model, epochs=4)
    assert "no hardenable gate" in str(e.value) and "example=" in str(e.value) and "\n" not in str(e.value)
    x = torch.rand(2, 1, 8, 8)
    gated, _ = to_gates(nn.Sequential(ConvInline(), nn.GELU()))  # a gate to anneal, and a call nobody could look for
    with pytest.warns(UserWarning, match="example="):
        Hardener(gated, epochs=4)
    with pytest.raises(HardenError, match="F.gelu in `0` \\(ConvInline\\)"):
        Hardener(gated, epochs=4, example=x)
    _, with_example = to_gates(ConvInline(), example=x)
    assert [(s.fqn, s.source) for s in with_example.left] == [("", "F.gelu")]
    with pytest.raises(SwapError, match="F.gelu in `\\(root\\)`"):
        to_relu(ConvInline(), example=x)
    from pipeline.convert import ConvertError

    with pytest.raises(ConvertError, match="example="):
        to_gates(nn.Sequential(nn.Conv2d(1, 2, 3), nn.GELU(), nn.Flatten(), nn.Linear(2 * 6 * 6, 3)), strict=True)


@pytest.mark.parametrize("cls", [ModuleGELU, AttrGELU])
def test_a_gelu_module_or_attribute_hardens_and_swaps_to_exactly_the_relu_network(cls):
    torch.manual_seed(0)
    ds = digits()
    model, report = to_gates(cls())
    assert len(report.converted) == 1 and report.left == [] and report.probed
    hardener = Hardener(model, epochs=EPOCHS)
    hardness = _train(model, hardener)
    assert all(isinstance(h, float) and math.isfinite(h) for h in hardness)  # never nan
    assert hardener.hardened() and hardness[-1] >= 1 - HARDENED_RTOL and not any(h >= 1 - HARDENED_RTOL for h in hardness[:-1])
    model.eval()
    swap = swap_report(model, ds.test)
    assert swap["before"] > 0.8 and swap["argmax_agreement"] >= 1 - 2 / len(ds.test)
    relu = to_relu(copy.deepcopy(model))
    assert gate_sites(relu) == [] and _gelu_calls(relu, ds.val.x) == 0
    with torch.no_grad():
        reference = model.b(F.relu(model.a(ds.val.x.flatten(1))))  # the same weights, ReLU written out
        assert torch.allclose(relu(ds.val.x), reference, rtol=0, atol=LOGIT_ATOL)


def test_hardener_with_gates_is_hardened_only_at_every_target():
    model, _ = to_gates(nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 8), nn.SiLU(), nn.Linear(8, 2)))
    h = Hardener(model, epochs=4)
    for epoch in range(1, 4):
        h.start_epoch(epoch)
        assert not h.hardened() and 0 < h.hardness() < 1
    model[3].freeze(torch.tensor(1000.0))  # one gate beyond its target does not make the other hardened
    assert not h.hardened()
    h.start_epoch(4)
    assert h.hardened() and h.hardness() == pytest.approx(1.0, rel=HARDENED_RTOL)


def test_a_transformer_layers_fused_kernel_does_not_hide_the_gate_or_the_swap():
    """torch's nn.TransformerEncoderLayer runs a fused kernel in eval mode that computes GELU itself: after
    conversion the gate's λ must change the output, and after the swap the output must be the ReLU layer's."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu", batch_first=True)
    model, report = to_gates(nn.Sequential(nn.Linear(4, 8), layer))
    assert [s.fqn for s in report.converted] == ["1.activation"]
    x = torch.randn(3, 5, 4)
    model.eval()
    with torch.no_grad():
        soft = model(x)
        model[1].activation.freeze(torch.tensor(200.0))
        hard = model(x)
        assert (soft - hard).abs().max() > 1e-3  # the gate is what the layer computes
        relu = to_relu(copy.deepcopy(model))
        ref_layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="relu", batch_first=True)
        ref_layer.load_state_dict(layer.state_dict())
        reference = ref_layer.eval()(model[0](x))
        assert torch.allclose(relu(x), reference, rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# 2. a converted model pickles whole


def test_a_converted_model_pickles_and_torch_saves_whole(tmp_path):
    torch.manual_seed(0)
    model, _ = to_gates(AttrGELU())
    h = Hardener(model, epochs=4)
    for epoch in (1, 2, 3):
        h.start_epoch(epoch)  # mid-anneal: λ frozen in a buffer
    x = digits().val.x
    clone = pickle.loads(pickle.dumps(model))
    torch.save(model, tmp_path / "m.pt")
    loaded = torch.load(tmp_path / "m.pt", weights_only=False)
    with torch.no_grad():
        for other in (clone, loaded):
            assert torch.equal(other(x), model(x)) and other.act_fn._frozen
    fresh, _ = to_gates(AttrGELU())  # the load hook survives pickling: a frozen state loaded into it freezes it
    fresh = pickle.loads(pickle.dumps(fresh))
    assert not fresh.act_fn._frozen
    fresh.load_state_dict(model.state_dict())
    assert fresh.act_fn._frozen and isinstance(fresh.act_fn, HardenableGate)


# ------------------------------------------------------------------------------------------------
# 6. start_epoch checks its range


def test_start_epoch_and_start_step_check_their_range():
    model, _ = to_gates(ModuleGELU())
    h = Hardener(model, epochs=8)  # e_s = 2
    for bad in (9, 0, -1, 2.5, True, "3"):
        with pytest.raises(HardenError) as e:
            h.start_epoch(bad)
        assert "\n" not in str(e.value)
    with pytest.raises(HardenError, match=r"1\.\.8"):
        h.start_epoch(9)
    assert h.start_epoch(np.int64(1)) == "learn" and h.start_epoch(3) == "anneal"
    with pytest.raises(HardenError, match="learn phase"):
        h.start_epoch(1)  # λ(e_s) is saved and s frozen: going back would say "learn" with λ frozen
    for args in ((4, 5, 5), (4, -1, 5), (4, 0, 0), (9, 0, 5)):
        with pytest.raises(HardenError):
            h.start_step(*args)
    assert h.start_step(4, 4, 5) == "anneal"
    with pytest.raises(HardenError, match="epochs >= 1"):
        Hardener(model, epochs=0)


# ------------------------------------------------------------------------------------------------
# 3. api.quantize


@pytest.fixture(scope="module")
def relu_mlp():
    model, _ = trained("relu", epochs=5)
    return model


def test_api_quantize_gives_the_int8_stages_file_and_a_report_onnxruntime_confirms(tmp_path):
    from pipeline.config import Config
    from quantize import int8 as int8_mod

    ds = digits()
    model = ModuleGELU()
    torch.manual_seed(0)
    relu = to_relu(model)  # a plain ReLU network of the user's own class
    report = api.quantize(relu, ds.train.x, tmp_path / "a.int8.onnx", data=(ds.test.x, ds.test.y))
    xt = ds.test.x.numpy()
    int8 = ort.InferenceSession(str(tmp_path / "a.int8.onnx"))
    got = int8.run(None, {"input": xt})[0]
    assert report["int8"]["accuracy"] == float((got.argmax(1) == ds.test.y.numpy()).mean())
    with torch.no_grad():
        fp32 = relu(ds.test.x).numpy()
    assert report["fp32"]["accuracy"] == pytest.approx(float((fp32.argmax(1) == ds.test.y.numpy()).mean()), abs=1 / len(xt))
    assert report["argmax_agreement"] == pytest.approx(float((fp32.argmax(1) == got.argmax(1)).mean()), abs=1 / len(xt))
    assert report["settings"]["calibration_samples"] == min(1024, len(ds.train)) and report["int8"]["integer_only"]
    # the stage's own defaults: the same file as quantize_file with Config()'s quantize section and seed, its clip
    # chosen on the same inputs
    api.export_onnx(relu, ds.train.x[:2], tmp_path / "a.fp32.onnx")
    cfg = Config()
    calib = int8_mod.calibration_samples(cfg.quantize, ds.train.x, cfg.seed)
    made = int8_mod.quantize_file(tmp_path / "a.fp32.onnx", tmp_path / "stage.int8.onnx", calib, cfg.quantize, tmp_path, check=xt)
    # 359 test inputs: 0.2 points is less than one of them, so the reference clip, and the report says why
    assert report["settings"]["percentile"] == made.percentile == 99.999 and "clip_search" not in report["settings"]
    assert report["settings"]["clip_note"].startswith("359 validation outputs: 0.2 points of agreement is less than one")
    stage = ort.InferenceSession(str(tmp_path / "stage.int8.onnx")).run(None, {"input": xt})[0]
    assert np.array_equal(stage, got)
    weights = [onnx.numpy_helper.to_array(t) for t in onnx.load(str(tmp_path / "a.int8.onnx")).graph.initializer
               if t.data_type == onnx.TensorProto.INT8 and len(t.dims) == 2]
    assert weights and all(np.abs(w.astype(int)).max() <= 64 for w in weights)  # 7-bit weights (reduce_range)
    # an ONNX file in: the same int8 model
    again = api.quantize(tmp_path / "a.fp32.onnx", ds.train.x.numpy(), tmp_path / "b.int8.onnx", data=xt)
    assert np.array_equal(ort.InferenceSession(again["path"]).run(None, {"input": xt})[0], got)
    assert "accuracy" not in again["int8"] and again["samples"] == len(xt)
    from pipeline.config import ConfigError, QuantizeConfig

    with pytest.raises(ConfigError, match="quantize.percentile"):  # one line naming the setting, before any work
        api.quantize(tmp_path / "a.fp32.onnx", ds.train.x.numpy(), tmp_path / "c.int8.onnx",
                     config=QuantizeConfig(percentile=120.0))
    assert not (tmp_path / "c.int8.onnx").exists()
    # a tolerance the inputs can resolve (1 point: 3.6 inputs): the clip chosen on them, every candidate recorded
    searched = api.quantize(tmp_path / "a.fp32.onnx", ds.train.x.numpy(), tmp_path / "d.int8.onnx", data=xt,
                            config=QuantizeConfig(clip_tolerance_pt=1.0))
    rows = searched["settings"]["clip_search"]
    assert [r["percentile"] for r in rows] == [99.999, 99.99, 99.9, 99.5]
    assert searched["settings"]["percentile"] == int8_mod.choose_clip(rows, 1.0)
    assert 1 - searched["argmax_agreement"] == pytest.approx(
        next(r for r in rows if r["percentile"] == searched["settings"]["percentile"])["disagreements"] / len(xt))


# ------------------------------------------------------------------------------------------------
# 4 and 5. api.verify: counterexamples, progress


def test_api_verify_returns_counterexamples_that_onnxruntime_confirms_and_shows_progress(relu_mlp, tmp_path, capsys):
    ds = digits()
    eps = [1e-3, 0.5]
    out = api.verify(relu_mlp, (ds.val.x, ds.val.y), eps, low=0.0, high=1.0, samples=3, timeout_s=10.0)
    api.export_onnx(relu_mlp, ds.val.x[:2], tmp_path / "m.onnx")  # an export of our own, replayed independently
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"))
    sat = [r for r in out["rows"] if r["result"] == "sat"]
    assert {r["eps"] for r in sat} == {0.5} and len(sat) == 3
    for r in out["rows"]:
        if r["result"] != "sat":
            assert r["counterexample"] is None and r["output"] is None
            continue
        x, x0 = r["counterexample"], ds.val.x[r["sample"]].numpy()
        assert x.dtype == np.float32 and x.shape == x0.shape
        assert np.all(x >= np.maximum(x0 - r["eps"], 0.0)) and np.all(x <= np.minimum(x0 + r["eps"], 1.0))
        y = sess.run(None, {"input": x[None]})[0][0]
        assert y.argmax() != r["label"] and np.max(np.delete(y, r["label"])) > y[r["label"]]
        np.testing.assert_allclose(r["output"], y, rtol=1e-5, atol=1e-6)
    lines = [l for l in capsys.readouterr().out.splitlines() if "verify:" in l]
    assert len(lines) == 6 and lines[-1].strip().startswith("verify: 6/6")
    api.verify(relu_mlp, (ds.val.x, ds.val.y), [1e-3], samples=1, progress=False)
    assert "verify:" not in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------
# 5 and 8. pipeline vnncomp: progress, and --out checked before the first instance


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    from analysis.verification.vnnlib import write_instances_csv, write_robustness_benchmark
    from quantize.export import export_for_verifiers

    root = tmp_path_factory.mktemp("bench")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, 3)).eval()
    export_for_verifiers(model, (1, 4, 4), root / "net.onnx", torch.rand(8, 1, 4, 4))
    xs = np.random.default_rng(0).uniform(0, 1, (2, 16))
    with torch.no_grad():
        labels = [int(v) for v in model(torch.as_tensor(xs, dtype=torch.float32).reshape(2, 1, 4, 4)).argmax(1)]
    rows = write_robustness_benchmark(root, root / "net.onnx", xs, labels, 0.01, 0.0, 1.0, 3, 10, prefix="n")
    write_instances_csv(root / "instances.csv", rows)
    return root


def test_vnncomp_shows_a_line_per_instance(bench, tmp_path, capsys):
    from analysis.verification.vnncomp import main

    assert main([str(bench), "--out", str(tmp_path / "r.csv")]) == 0
    out = capsys.readouterr().out.splitlines()
    progress = [l.strip() for l in out if l.strip().startswith("vnncomp:")]
    assert len(progress) == 2 and progress[0].startswith("vnncomp: 1/2 onnx/net.onnx vnnlib/n_0")
    with open(tmp_path / "r.csv") as f:
        results = list(csv.reader(f))
    assert [p.split(": ")[2].split()[0] for p in progress] == [r[4] for r in results]


@pytest.mark.parametrize("where", ["file", "system"])
def test_vnncomp_out_to_an_unwritable_place_fails_before_the_first_instance(bench, tmp_path, capsys, monkeypatch, where):
    import tempfile

    from analysis.verification import harness
    from analysis.verification.vnncomp import main

    if where == "file":
        (tmp_path / "afile").write_text("")
        out = tmp_path / "afile" / "results.csv"
    else:  # /sys is read-only for every user, root included, where it is mounted
        out = "/sys/results.csv"
        try:
            with tempfile.NamedTemporaryFile(dir="/sys"):
                pytest.skip("/sys is writable here")
        except OSError:
            pass

    def solved(*a, **k):
        raise AssertionError("an instance was solved before --out was checked")

    monkeypatch.setattr(harness, "run", solved)
    assert main([str(bench), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot write the results to") and "\n" not in err and "--out" in err


# ------------------------------------------------------------------------------------------------
# 7. the report


def test_the_training_table_lists_every_epoch_at_the_best_value(tmp_path):
    from pipeline import variant_record as records
    from pipeline.config import Config
    from pipeline.stages import train
    from pipeline.rundir import RunDir

    cfg = Config(name="r", out_dir=str(tmp_path), variants=["lambda_gelu"], device="cpu")
    cfg.train.epochs = 4
    run = RunDir.create(cfg)
    run.record_variants({v: records.decide(v, cfg.harden, cfg.train) for v in cfg.variants})
    rows = [{"variant": "lambda_gelu", "epoch": e, "val_accuracy": acc, "lambda_0": 1.0 + 50 * (e - 1)}
            for e, acc in zip(range(1, 5), [0.80, 0.9861, 0.90, 0.9861])]
    with open(run.dir("train") / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    run.mark_stage("train", status="done", metrics={"lambda_gelu": {"best_epoch": 2}})
    run.mark_stage("harden", status="done", metrics={"lambda_gelu": {"best_epoch": 4}})
    section = train.report_section(run.cfg, run)
    row = next(l for l in section.splitlines() if l.startswith("| lambda_gelu |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "4" and cells[3] == "0.9861 (epochs 2, 4)"  # the shipped epoch ties the best: both named
    assert "best over all epochs" in section and "best among the epochs at λ_target" in section


def test_the_certificate_bullet_gives_the_sample_count_not_the_config_key():
    from analysis.bounds_check import swap_certificate
    from pipeline.stages.check import certificate_lines
    from pipeline.data import Split

    model, _ = trained("lambda_gelu", epochs=2)
    ds = digits()
    split = Split(ds.val.x[:32], ds.val.y[:32])
    cert = swap_certificate(model, split, 32, split.x[:1], jacobian_samples=7)
    bullet = next(l for l in certificate_lines(cert) if l.startswith("- float32_jacobian"))
    assert "each of the first 7 validation inputs" in bullet and "`check.float32_jacobian_samples` validation" not in bullet
    assert cert["float32_jacobian"]["samples"] == 7


def test_the_verification_figure_counts_each_network_kind():
    from analysis.robustness.chain import fractions
    from pipeline.stages.verify_report import fractions_figure

    def row(v, s, e, direct, via, relu, q):
        return {"variant": v, "sample": s, "eps": e, "smooth_direct": direct, "smooth_via_relu": via, "relu": relu, "int8": q}

    chain = [row("lg", 0, "0.01", "unsat", "timeout", "unsat", "unsat"), row("lg", 1, "0.01", "timeout", "unknown", "sat", "timeout"),
             row("lg", 0, "0.1", "sat", "timeout", "sat", "sat"), row("lg", 1, "0.1", "timeout", "timeout", "timeout", "—"),
             row("relu", 0, "0.01", "—", "—", "unsat", "sat"), row("relu", 1, "0.01", "—", "—", "unsat", "unsat")]
    fr = fractions(chain)
    assert fr[("relu", "lg", 0.01)] == {"certified": 0.5, "falsified": 0.5, "open": 0.0}
    assert fr[("smooth", "lg", 0.01)] == {"certified": 0.5, "falsified": 0.0, "open": 0.5}  # either route proves
    assert fr[("smooth", "lg", 0.1)] == {"certified": 0.0, "falsified": 0.5, "open": 0.5}
    assert fr[("int8", "lg", 0.1)] == {"certified": 0.0, "falsified": 1.0, "open": 0.0}  # "—": no int8 answer, left out
    assert ("smooth", "relu", 0.01) not in fr and fr[("int8", "relu", 0.01)]["certified"] == 0.5
    fig = fractions_figure(chain, ["lg", "relu"])
    assert [ax.get_title() for ax in fig.axes] == ["float ReLU network", "smooth network", "int8 network"]
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    assert buf.getvalue()[:4] == b"\x89PNG"


def test_the_hardener_names_to_gates_only_where_to_gates_would_convert_something():
    """A model already through to_gates with nothing it converts (ReLU6, Hardsigmoid, ReLU) is not told to convert it
    first: the message counts what its activations are and why none is hardened; a model to_gates would convert is
    told so, with what it would convert."""
    done, report = to_gates(nn.Sequential(nn.Linear(4, 8), nn.ReLU6(), nn.Linear(8, 8), nn.Hardsigmoid(), nn.Linear(8, 8),
                                          nn.ReLU(), nn.Linear(8, 2)))
    assert not report.converted
    with pytest.raises(HardenError) as e:
        Hardener(done, epochs=3)
    msg = str(e.value)
    assert "to_gates(model) first" not in msg and "converts nothing" in msg and "\n" not in msg
    assert "1 nn.ReLU (already the swapped form)" in msg and "1 nn.ReLU6, 1 nn.Hardsigmoid" in msg
    with pytest.raises(HardenError) as e:
        Hardener(nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 8), nn.SiLU(), nn.Linear(8, 2)), epochs=3)
    assert "convert it with to_gates(model) first, which converts 2 activation(s) (1 nn.GELU, 1 nn.SiLU)" in str(e.value)
