"""The verify stage end to end on small digits models (λ-GELU swapped, GELU swapped, ReLU from the
start): the VNN-COMP layout, statuses, counterexamples re-checked, unstable-ReLU counts, summary
arithmetic, resuming, the smooth-model probe, and the report section.

The library pieces (VNN-LIB round trip, IBP vs brute force, each verifier on known answers) are
tested in test_verify_vnnlib.py, test_verify_intervals.py and test_verify_verifiers.py.
"""

from __future__ import annotations

import csv
import json
import statistics

import numpy as np
import pytest
import torch

from _digits import digits, make_run, trained
from analysis import verify as verify_mod
from analysis.intervals import count_unstable, layers_from_torch
from analysis.verifiers import MarabouVerifier, check_counterexample
from analysis.verify import STATUSES, read_results, report_section, resolve_verifiers, run_verify
from analysis.vnnlib import read_instances_csv, read_vnnlib, robustness_spec
from pipeline import checkpoint
from pipeline.config import Config, ConfigError, apply_overrides, validate
from pipeline.stages import STAGES

VARIANTS = ["lambda_gelu", "gelu", "relu"]
SAMPLES = 3
EPSILONS = [0.01, 0.1]  # on digits (8x8, [0, 1]) 0.01 is provable in well under a second, 0.1 mostly falsifiable
TIMEOUT_S = 1.0
HAS_MARABOU = MarabouVerifier.available()
VERIFIERS = ["pgd+marabou", "ibp"] if HAS_MARABOU else ["milp", "ibp"]  # ibp: instant, a second opinion


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny nets: extra threads only spin (13 s CPU per net instead of 0.3 s on a busy machine)
    try:
        nets = {v: trained(v) for v in VARIANTS}
    finally:
        torch.set_num_threads(threads)
    run = make_run(tmp_path_factory.mktemp("verify"), nets)
    run.cfg.verify.samples = SAMPLES
    run.cfg.verify.epsilons = list(EPSILONS)
    run.cfg.verify.verifiers = list(VERIFIERS)
    run.cfg.verify.timeout_s = TIMEOUT_S
    from quantize.export import run_export

    run_export(run.cfg, run)  # the smooth ONNX files the probe reads
    metrics = run_verify(run.cfg, run)
    return run, nets, metrics


def _rows(run):
    return read_results(run.file("verify", "results.csv"))


def test_stage_is_registered_before_report_with_small_defaults():
    names = list(STAGES)
    assert names.index("verify") == names.index("report") - 1 and STAGES["verify"].directory == "verify"
    cfg = Config()
    assert cfg.verify.samples <= 10 and cfg.verify.timeout_s <= 30 and cfg.verify.verifiers == ["auto"]
    apply_overrides(cfg, ["verify.verifiers=pgd+marabou,milp", "verify.epsilons=[0.005,0.01]"])
    assert validate(cfg).verify.epsilons == [0.005, 0.01]
    with pytest.raises(ConfigError, match="choose from auto"):
        validate(apply_overrides(Config(), ["verify.verifiers=pgd+crown"]))
    with pytest.raises(ConfigError, match="epsilons"):
        validate(apply_overrides(Config(), ["verify.epsilons=[0.0]"]))


def test_auto_falls_back_to_milp_without_maraboupy(monkeypatch):
    monkeypatch.setattr(MarabouVerifier, "available", classmethod(lambda cls: False))
    names, note = resolve_verifiers(["auto"])
    assert names == ["milp"] and "maraboupy" in note
    monkeypatch.setattr(MarabouVerifier, "available", classmethod(lambda cls: True))
    assert resolve_verifiers(["auto", "pgd+marabou"]) == (["pgd+marabou"], "")


def test_vnncomp_layout_and_instances_point_to_files(done):
    run, _, _ = done
    out = run.file("verify")
    assert {p.name for p in (out / "onnx").iterdir()} == {f"{v}.onnx" for v in VARIANTS}
    inst = read_instances_csv(out / "instances.csv")
    assert len(inst) == len(VARIANTS) * SAMPLES * len(EPSILONS)
    assert len(list((out / "vnnlib").glob("*.vnnlib"))) == len(inst)
    for onnx_rel, vnnlib_rel, t in inst:
        assert (out / onnx_rel).is_file() and (out / vnnlib_rel).is_file() and t == TIMEOUT_S
    assert (out / "summary.json").is_file() and (out / "results.csv").is_file()


def test_property_files_state_the_right_box_and_label(done):
    run, _, _ = done
    ds = digits()
    x = ds.val.x[:SAMPLES].double().numpy().reshape(SAMPLES, -1)
    for v in VARIANTS:
        for eps in EPSILONS:
            for k in range(SAMPLES):
                got = read_vnnlib(run.file("verify", "vnnlib", f"{v}_{k}_{eps:g}.vnnlib"))
                want = robustness_spec(x[k], eps, 0.0, 1.0, int(ds.val.y[k]), 10)
                assert np.array_equal(got.lb, want.lb) and np.array_equal(got.ub, want.ub)
                assert len(got.disjuncts) == len(want.disjuncts) == 9
                for (A, b), (A2, b2) in zip(got.disjuncts, want.disjuncts):
                    assert np.array_equal(A, A2) and np.array_equal(b, b2)


def test_every_property_answered_with_an_allowed_status(done):
    run, _, _ = done
    rows = _rows(run)
    assert len(rows) == len(VARIANTS) * SAMPLES * len(EPSILONS) * len(VERIFIERS)
    assert {r["status"] for r in rows} <= set(STATUSES)
    for r in rows:
        assert (r["status"] == "misclassified") == (r["predicted"] != r["label"]), r
    small = [r for r in rows if float(r["eps"]) == 0.01 and r["status"] != "misclassified"]
    assert small and all(r["status"] == "verified" for r in small), [r["message"] for r in small]
    assert any(r["status"] == "falsified" for r in rows if float(r["eps"]) == 0.1)
    assert json.loads(run.file("verify", "summary.json").read_text())["conflicts"] == []


def test_falsified_rows_carry_counterexamples_that_recheck(done):
    run, _, _ = done
    out = run.file("verify")
    falsified = [r for r in _rows(run) if r["status"] == "falsified"]
    assert falsified
    for r in falsified:
        x = np.load(out / r["counterexample"])
        ok, why = check_counterexample(out / "onnx" / f"{r['variant']}.onnx", read_vnnlib(out / r["vnnlib"]), x)
        assert ok, why
    assert all(r["counterexample"] == "" for r in _rows(run) if r["status"] != "falsified")


def test_unstable_counts_match_a_fresh_interval_computation(done):
    run, nets, _ = done
    out = run.file("verify")
    for r in _rows(run):
        spec = read_vnnlib(out / r["vnnlib"])
        assert int(r["unstable_relus"]) == count_unstable(out / "onnx" / f"{r['variant']}.onnx", spec.lb, spec.ub)
        # the same count on the torch ReLU model (normalization not folded): float rounding aside, equal
        relu = checkpoint.load_model(run.file("swap", r["variant"], "relu.pt"))[0]
        assert int(r["unstable_relus"]) == count_unstable(layers_from_torch(relu, (1, 8, 8)), spec.lb, spec.ub)
        assert int(r["relus"]) == 96  # 64 + 32 hidden units


def test_summary_fractions_match_results(done):
    run, _, metrics = done
    rows = _rows(run)
    s = json.loads(run.file("verify", "summary.json").read_text())
    assert s["verifiers"] == VERIFIERS and s["samples"] == SAMPLES and "not the int8 model" in s["certificates_are_for"]
    entries = [e for e in s["table"] if e["verifier"] != "any"]
    assert len(entries) == len(VARIANTS) * len(EPSILONS) * len(VERIFIERS)
    for e in entries:
        sel = [r for r in rows if r["variant"] == e["variant"] and float(r["eps"]) == e["eps"] and r["verifier"] == e["verifier"]]
        n = len(sel)
        assert e["properties"] == n == SAMPLES
        assert e["certified_fraction"] == sum(r["status"] == "verified" for r in sel) / n
        assert e["falsified_fraction"] == sum(r["status"] in ("falsified", "misclassified") for r in sel) / n
        assert e["timeout_fraction"] == sum(r["status"] == "timeout" for r in sel) / n
        ran = [float(r["seconds"]) for r in sel if r["status"] != "misclassified"]
        assert e["median_seconds"] == (statistics.median(ran) if ran else None)
        assert e["mean_unstable_relus"] == pytest.approx(statistics.fmean(int(r["unstable_relus"]) for r in sel))
        assert metrics["certified"][f"{e['variant']}/{e['eps']:g}/{e['verifier']}"] == round(e["certified_fraction"], 4)


def test_smooth_models_are_probed(done):
    run, _, _ = done
    smooth = json.loads(run.file("verify", "summary.json").read_text())["smooth"]
    assert set(smooth) == {"lambda_gelu", "gelu"}  # the ReLU baseline has no smooth form
    for v, f in smooth.items():
        assert "Gelu" in f["ops"] and not f["intervals"]["ok"] and "Gelu" in f["intervals"]["message"]
        if HAS_MARABOU:
            assert not f["marabou"]["ok"] and "Operation Gelu not implemented" in f["marabou"]["message"]


def test_report_section_has_the_comparison(done):
    run, _, _ = done
    md = report_section(run.cfg, run)
    assert "## Verification" in md and "not the int8 model" in md
    for eps in EPSILONS:
        assert f"### ε = {eps:g}" in md
    assert all(f"| {v} |" in md for v in VARIANTS)
    if HAS_MARABOU:
        assert "Operation Gelu not implemented" in md


def test_rerun_keeps_finished_properties(done):
    run, _, _ = done
    path = run.file("verify", "results.csv")
    before = _rows(run)
    kept, dropped = before[:-2], before[-2:]
    with open(path, "w", newline="") as f:  # as if the stage had been killed two properties early
        w = csv.DictWriter(f, fieldnames=verify_mod.FIELDS)
        w.writeheader()
        w.writerows(kept)
    run_verify(run.cfg, run)
    after = _rows(run)
    assert len(after) == len(before)
    key = lambda r: (r["variant"], r["sample"], r["eps"], r["verifier"])  # noqa: E731
    by_key = {key(r): r for r in after}
    assert all(by_key[key(r)] == r for r in kept)  # reused verbatim, seconds included
    assert all(by_key[key(r)]["status"] in STATUSES for r in dropped)


def test_misclassified_samples_are_recorded_not_verified(tmp_path):
    net, spec = trained("relu", epochs=0)  # untrained: most samples are misclassified
    run = make_run(tmp_path, {"relu": (net, spec)})
    run.cfg.verify.samples = 5
    run.cfg.verify.verifiers = ["pgd"]
    run.cfg.verify.probe_smooth = False
    run_verify(run.cfg, run)
    rows = _rows(run)
    wrong = [r for r in rows if r["predicted"] != r["label"]]
    assert wrong and all(r["status"] == "misclassified" and float(r["seconds"]) == 0 for r in wrong)
    s = json.loads(run.file("verify", "summary.json").read_text())
    assert s["table"][0]["misclassified"] == len(wrong) and s["table"][0]["certified_fraction"] <= 1 - len(wrong) / 5


def test_pgd_never_claims_a_proof_and_marabou_timeouts_count_cpu(done):
    from analysis.verifiers import PgdVerifier

    run, _, _ = done
    out = run.file("verify")
    rows = _rows(run)
    proved = next(r for r in rows if r["status"] == "verified" and r["verifier"] != "ibp")
    res = PgdVerifier().verify(out / "onnx" / f"{proved['variant']}.onnx", out / proved["vnnlib"], 5.0)
    assert res.status == "unknown" and res.counterexample is None
    for r in rows:
        assert float(r["cpu_seconds"]) >= 0
        if r["verifier"] == "pgd+marabou" and r["status"] == "timeout":
            assert "CPU limit of 1 s reached" in r["message"], r["message"]
