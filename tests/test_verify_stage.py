"""The verify stage end to end on small digits models (λ-GELU swapped, GELU swapped, ReLU from the start):
the VNN-COMP layout and results format, witnesses that re-check, unstable-ReLU counts, the smooth
certificates by both routes (and their soundness by sampling), summary arithmetic, resuming, config checks,
and the report section.

The library pieces are tested in test_verify_vnnlib.py, test_verify_network.py, test_verify_bounds.py,
test_verify_verifiers.py and test_verify_vnncomp.py.
"""

from __future__ import annotations

import csv
import json
import statistics

import numpy as np
import pytest
import torch

from _digits import digits, make_run, trained
from pipeline.stages import verify as verify_mod
from analysis.verification.readers import from_onnx, from_torch
from analysis.verification.bounds import Bounder
from analysis.verification.vnncomp import read_results, witness_path
from analysis.verification.vnnlib import parse_witness, read_instances_csv, read_vnnlib, robustness_spec
from analysis.robustness.properties import read_rows
from pipeline.stages.verify import run_verify, validate_config
from pipeline.stages.verify_report import report_section
from pipeline.config import Config, ConfigError, apply_overrides
from pipeline.stages import STAGES, export as export_stage
from quantize.ort import forward_flat

VARIANTS = ["lambda_gelu", "gelu", "relu"]
SAMPLES = 3
EPSILONS = [0.01, 0.2]  # on digits (8x8, [0, 1]) 0.01 is provable in well under a second, 0.2 mostly falsifiable
BUDGET_S = 120.0  # the stage's budget: ample, every property here is decided within a second or two
VERIFIERS = ["auto", "ibp"]  # ibp: instant, a second opinion


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny nets: extra threads only spin
    try:
        nets = {v: trained(v) for v in VARIANTS}
    finally:
        torch.set_num_threads(threads)
    run = make_run(tmp_path_factory.mktemp("verify"), nets)
    export_stage.run_export(run.cfg, run)  # the verifiers' form of each ReLU model is the export stage's
    run.cfg.verify.samples = SAMPLES
    run.cfg.verify.epsilons = list(EPSILONS)
    run.cfg.verify.verifiers = list(VERIFIERS)
    run.cfg.verify.budget_s = BUDGET_S
    import contextlib
    import io

    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        metrics = run_verify(run.cfg, run)
    run.progress_log = log.getvalue()
    return run, nets, metrics


def test_the_stage_shows_its_progress_in_the_log(done):
    """Without a terminal, progress lines go to the log; the last one counts every property (ReLU and smooth)."""
    run, _, _ = done
    lines = [line for line in run.progress_log.splitlines() if "verify:" in line and "properties final" in line]
    total = len(_rows(run)) + len(read_rows(run.file("verify", "smooth.csv")))
    assert lines and lines[-1].strip().startswith(f"verify: {total}/{total} properties final")


def _rows(run):
    return read_rows(run.file("verify", "details.csv"))


def test_stage_is_registered_before_report_and_config_is_checked():
    names = list(STAGES)
    assert names.index("verify") < names.index("report") and STAGES["verify"].directory == "verify"
    cfg = Config()
    assert cfg.verify.verifiers == ["auto"] and not cfg.verify.cpu_time and 0.005 in cfg.verify.epsilons
    validate_config(cfg)
    apply_overrides(cfg, ["verify.verifiers=pgd+crown+milp,marabou", "verify.epsilons=[0.005,0.01]"])
    validate_config(cfg)
    for override, match in ([("verify.verifiers=pgd+crow", "unknown verifier 'crow'"), ("verify.epsilons=[0.0]", "epsilons"),
                            ("verify.samples=0", "samples"), ("verify.budget_s=0", "budget_s"),
                            ("verify.timeout_s=-1", "timeout_s"), ("verify.jobs=-1", "jobs"),
                            ("verify.int8_budget_s=0", "int8_budget_s"),
                            ("verify.device=gpu", "verify.device='gpu' is not a device; use auto, cpu, cuda or cuda:N")]
                           + ([("verify.device=cuda", "use verify.device=cpu or verify.device=auto")]
                              if not torch.cuda.is_available() else [])):
        with pytest.raises(ConfigError, match=match) as e:
            validate_config(apply_overrides(Config(), [override]))
        assert "\n" not in str(e.value)


def test_a_variant_named_like_an_int8_row_is_refused():
    """Whether a row is an int8 model's is decided by its name (`is_int8`): a variant whose own name ends so would be
    read as one, so the stage's check refuses it (unless the int8 rows are off)."""
    from analysis.robustness.properties import int8_name, is_int8

    assert is_int8(int8_name("relu")) and not is_int8("relu") and not is_int8("int8_relu")
    cfg = Config()
    cfg.variants = ["relu", int8_name("relu")]
    with pytest.raises(ConfigError, match="relu-int8.*verify.int8=false") as e:
        validate_config(cfg)
    assert "\n" not in str(e.value)
    cfg.verify.int8 = False
    validate_config(cfg)


def test_vnncomp_layout_and_instances_point_to_files(done):
    run, _, _ = done
    out = run.file("verify")
    assert {p.name for p in (out / "onnx").iterdir()} == {f"{v}.onnx" for v in VARIANTS}
    inst = read_instances_csv(out / "instances.csv")
    assert len(inst) == len(VARIANTS) * SAMPLES * len(EPSILONS)
    assert len(list((out / "vnnlib").glob("*.vnnlib"))) == len(inst)
    share = BUDGET_S / (len(inst) * len(VERIFIERS) + 2 * 2 * SAMPLES * len(EPSILONS))  # every ReLU and smooth task
    for onnx_rel, vnnlib_rel, t in inst:  # the misclassified samples need no time, so the share is at least this
        assert (out / onnx_rel).is_file() and (out / vnnlib_rel).is_file() and t >= round(share, 3)
    results = read_results(out / "results.csv")  # VNN-COMP's format, the stage's verifier
    assert [(r["onnx"], r["vnnlib"]) for r in results] == [(o, v) for o, v, _ in inst]
    assert {r["category"] for r in results} == set(VARIANTS)
    assert len(read_results(out / "results.ibp.csv")) == len(inst)
    assert not list(out.rglob("*.npy"))


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
                assert len(got.disjuncts) == 9


def test_every_property_decided_and_witnesses_recheck(done):
    run, _, _ = done
    out = run.file("verify")
    rows = [r for r in _rows(run) if r["verifier"] == "auto"]
    assert len(rows) == len(VARIANTS) * SAMPLES * len(EPSILONS)
    assert all(r["result"] in ("sat", "unsat") for r in rows), [r["message"] for r in rows if r["result"] not in ("sat", "unsat")]
    for r in rows:
        assert (r["stage"] == "clean") == (r["predicted"] != r["label"]), r
    assert all(r["result"] == "unsat" for r in rows if r["eps"] == "0.01" and r["stage"] != "clean")
    assert any(r["result"] == "sat" and r["stage"] != "clean" for r in rows)
    for r in rows:
        w = witness_path(out / "results.csv", f"onnx/{r['variant']}.onnx", r["vnnlib"])
        assert w.is_file() == (r["result"] == "sat") and (r["witness"] != "") == (r["result"] == "sat")
        if r["result"] == "sat":
            x, y = parse_witness(w.read_text())
            spec = read_vnnlib(out / r["vnnlib"])
            got = forward_flat(out / "onnx" / f"{r['variant']}.onnx", x)
            np.testing.assert_array_equal(y, got)  # VNN-COMP's check: the witness's own Y values, output tolerance 0
            assert spec.in_box(x) and spec.violation(got) < 0
    assert json.loads(run.file("verify", "summary.json").read_text())["conflicts"] == []


def test_unstable_counts_are_tight_and_ibp_matches_a_fresh_computation(done):
    run, _, _ = done
    out = run.file("verify")
    for r in _rows(run):
        if r["verifier"] != "auto" or r["stage"] in ("clean", "pgd"):
            continue
        spec = read_vnnlib(out / r["vnnlib"])
        b = Bounder(from_onnx(out / "onnx" / f"{r['variant']}.onnx"), spec.lb, spec.ub)
        assert int(r["unstable_ibp"]) == sum(b.result().unstable("ibp"))
        assert int(r["unstable_tight"]) <= int(r["unstable_ibp"])
        assert int(r["relus"]) == 96  # 64 + 32 hidden units


def test_smooth_certificates_both_routes_and_sound_by_sampling(done):
    """Route via-relu for λ-GELU (λ = 20) certifies at eps 0.01 and its |smooth − ReLU| bound is far below GELU's
    (λ = 1); every smooth certificate holds on samples of its box for the smooth model itself."""
    run, nets, _ = done
    rows = read_rows(run.file("verify", "smooth.csv"))
    assert {r["variant"] for r in rows} == {"lambda_gelu", "gelu"} and {r["route"] for r in rows} == {"direct", "via-relu"}
    assert all(r["network"].startswith("smooth ") for r in rows)
    ds = digits()
    small = [r for r in rows if r["eps"] == "0.01" and r["predicted"] == r["label"]]
    assert all(r["result"] == "unsat" for r in small if r["route"] == "direct")
    assert all(r["result"] == "unsat" for r in small if r["route"] == "via-relu" and r["variant"] == "lambda_gelu")
    gap = {v: statistics.fmean(float(r["gap_max"]) for r in small if r["route"] == "via-relu" and r["variant"] == v)
           for v in ("lambda_gelu", "gelu")}
    assert gap["gelu"] > 5 * gap["lambda_gelu"]  # c/λ per unit: λ = 1 against λ = 20
    gen = torch.Generator().manual_seed(0)
    for r in rows:
        if r["result"] != "unsat":
            continue
        model = nets[r["variant"]][0]
        k, eps = int(r["sample"]), float(r["eps"])
        x0 = ds.val.x[k].double().reshape(-1)
        lb, ub = (x0 - eps).clamp(0, 1), (x0 + eps).clamp(0, 1)
        xs = lb + (ub - lb) * torch.rand(2000, x0.numel(), generator=gen, dtype=torch.float64)
        xs = torch.cat([xs, torch.where(torch.rand(500, x0.numel(), generator=gen) < 0.5, lb, ub)])
        logits = from_torch(model, (1, 8, 8)).forward(xs)  # float64, the network the certificate is about
        margin = logits[:, int(r["label"])] - logits.clone().index_fill_(1, torch.tensor([int(r["label"])]), -torch.inf).max(1).values
        assert float(margin.min()) > 0 and float(margin.min()) >= float(r["margin_lb"]) - 1e-9, r


def test_every_property_got_its_first_bound_pass_and_open_ones_say_why(done):
    """The first pass's costs per network are in summary.json, the budget covered them here (no line in the log);
    every row records the last bound pass that finished, and a reason exactly when it is open."""
    run, _, _ = done
    s = json.loads(run.file("verify", "summary.json").read_text())
    assert s["first_pass"]["float"]["covered"] and s["first_pass"]["float"]["line"] == ""
    assert set(s["first_pass"]["float"]["costs"]) >= {f"{v}.onnx" for v in VARIANTS}
    assert "cannot cover one bound pass" not in run.progress_log
    for r in _rows(run) + read_rows(run.file("verify", "smooth.csv")):
        assert (r["reason"] == "") == (r["result"] in ("sat", "unsat")), r
        if r["stage"] != "clean" and r.get("verifier", "auto") == "auto":
            assert r["bound"] in ("crown", "alpha-crown", "alpha-milp"), r
    assert s["open"] == [o for o in s["open"] if o["reason"]]
    assert "One bound pass (CROWN) per float network" in report_section(run.cfg, run)


def test_the_line_for_a_budget_that_cannot_cover_one_pass_per_property():
    from analysis.verification import harness
    from analysis.verification.first_pass import Cost

    def first(budget: float, properties: int, plans) -> harness.FirstPass:
        said = []
        fp = harness.FirstPass(harness.StageBudget(budget), "verify.budget_s=", properties, said.append)
        for p in plans:
            fp(p)
        fp.finish()
        assert fp.lines == said and len(said) <= 1
        return fp

    plans = [harness.Plan([Cost("a.onnx", 2.0, True, 20), Cost("b.onnx", 1.0, False, 10)], 1.0, 50.0, 2, worker=1),
             harness.Plan([Cost("a.onnx", 2.5, True, 20)], 1.2, 52.0, 2, worker=2)]
    line = " ".join(first(30.0, 50, plans).lines)
    assert "verify.budget_s=30 cannot cover" in line and "2.5 s on a.onnx" in line and "≥ 1 s on b.onnx" in line
    assert "need at least 52 s" in line and "verify.budget_s=70 or more would" in line
    assert first(60.0, 50, plans).lines == []
    rec = first(30.0, 50, plans).record()
    assert rec["costs"]["a.onnx"] == {"seconds": 2.5, "finished": True, "properties": 40, "limit_s": 5} and not rec["covered"]
    assert rec["setting"] == "verify.budget_s" and rec["would_s"] == 70 and rec["line"] == line
    # the estimate covered the budget, but the pass itself (a batch costlier per property than one alone) did not
    done = [harness.Plan([Cost("a.onnx", 0.2, True, 30)], 25.0, 37.0, 1, worker=1, reached=20, properties=30,
                         pass_seconds=24.0)]
    line = " ".join(first(30.0, 30, done).lines)
    assert "the pass reached 20 of 30 properties in 24 s" in line and "verify.budget_s=50 would" in line


def test_summary_fractions_match_results(done):
    run, _, metrics = done
    rows = _rows(run)
    s = json.loads(run.file("verify", "summary.json").read_text())
    assert s["clock"] == "wall" and s["verifiers"] == VERIFIERS and s["chains"]["auto"] == "crown+pgd+alpha-crown+bab"
    assert "not the int8 model" in s["networks"]["relu"] and "best.pt" in s["networks"]["smooth"]
    assert len(s["table"]) == len(VARIANTS) * len(EPSILONS) * len(VERIFIERS)
    for e in s["table"]:
        sel = [r for r in rows if r["variant"] == e["variant"] and float(r["eps"]) == e["eps"] and r["verifier"] == e["verifier"]]
        assert e["properties"] == len(sel) == SAMPLES
        assert e["certified_fraction"] == sum(r["result"] == "unsat" for r in sel) / SAMPLES
        assert e["falsified_fraction"] == sum(r["result"] == "sat" for r in sel) / SAMPLES
        ran = [float(r["seconds"]) for r in sel if r["stage"] != "clean"]
        assert e["median_seconds"] == (statistics.median(ran) if ran else None)
        assert metrics["certified"][f"{e['variant']}/{e['eps']:g}/{e['verifier']}"] == round(e["certified_fraction"], 4)
    assert {(t["variant"], t["route"]) for t in s["smooth_table"]} == {(v, r) for v in ("lambda_gelu", "gelu") for r in ("direct", "via-relu")}


def test_report_section_has_one_table_with_every_network(done):
    run, _, _ = done
    md = report_section(run.cfg, run)
    assert "## Verification" in md and "not the int8 model" in md and f"one budget of {BUDGET_S:g} s for the float networks" in md
    for eps in EPSILONS:
        assert f"ε = {eps:g}" in md
    assert "| lambda_gelu swapped to ReLU |" in md and "| gelu swapped to ReLU |" in md and "| relu (ReLU from the start) |" in md
    assert "| lambda_gelu smooth |" in md and "| gelu smooth |" in md and "via the swap: ReLU margin minus" in md
    assert "| 100% (0% sat) |" in md  # eps 0.01 is certified for every network
    # the unstable columns say they are means and show them to one decimal, as details.csv gives them
    assert "| mean unstable (IBP) | mean unstable (tight) |" in md and "**mean**" in md
    rows = [r for r in _rows(run) if r["stage"] != "clean"]
    for variant in ("lambda_gelu", "relu"):
        for eps in EPSILONS:
            sel = [r for r in rows if r["variant"] == variant and float(r["eps"]) == eps and r["verifier"] == "auto"
                   and r["unstable_ibp"] != ""]
            if sel:
                ibp = sum(int(r["unstable_ibp"]) for r in sel) / len(sel)
                tight = sum(int(r["unstable_tight"]) for r in sel) / len(sel)
                assert f"| {ibp:.1f} | {tight:.1f} | 96 |" in md, (variant, eps, ibp, tight)
    assert "two ReLUs per requantized unit" not in md  # no int8 model here
    assert (run.file("report") / "verify_fractions.png").is_file() and "verify_fractions.png" in md


def test_rerun_keeps_finished_properties(done):
    run, _, _ = done
    path = run.file("verify", "details.csv")
    before = _rows(run)
    kept, dropped = before[:-2], before[-2:]
    with open(path, "w", newline="") as f:  # as if the stage had been killed two properties early
        w = csv.DictWriter(f, fieldnames=verify_mod.DETAIL_FIELDS)
        w.writeheader()
        w.writerows(kept)
    run_verify(run.cfg, run)
    after = _rows(run)
    assert len(after) == len(before)
    key = lambda r: (r["variant"], r["sample"], r["eps"], r["verifier"])  # noqa: E731
    by_key = {key(r): r for r in after}
    assert [r for r in kept if by_key[key(r)] != r] == []  # reused verbatim, seconds included
    assert all(by_key[key(r)]["result"] == r["result"] for r in dropped)  # solved again, same answer


def test_misclassified_samples_are_sat_at_the_sample(tmp_path):
    net, spec = trained("relu", epochs=0)  # untrained: most samples are misclassified
    run = make_run(tmp_path, {"relu": (net, spec)})
    export_stage.run_export(run.cfg, run)
    run.cfg.verify.samples = 5
    run.cfg.verify.epsilons = [0.01]
    run.cfg.verify.verifiers = ["pgd"]
    run_verify(run.cfg, run)
    rows = _rows(run)
    wrong = [r for r in rows if r["predicted"] != r["label"]]
    assert wrong and all(r["result"] == "sat" and r["stage"] == "clean" and float(r["seconds"]) == 0 for r in wrong)
    ds = digits()
    for r in wrong:
        x, _ = parse_witness(run.file("verify", r["witness"]).read_text())
        np.testing.assert_array_equal(x, ds.val.x[int(r["sample"])].double().numpy().reshape(-1))
    s = json.loads(run.file("verify", "summary.json").read_text())
    assert s["table"][0]["misclassified"] == len(wrong) and s["smooth_table"] == []


def test_the_radius_units_are_named_for_tables_and_images():
    """A table's radius is in its raw feature units (the model standardizes inside); an image's in its pixel range."""
    from types import SimpleNamespace

    from analysis.robustness.properties import eps_units

    table_info = SimpleNamespace(feature_names=["age", "hours"], input_low=[17.0, 1.0], input_high=[90.0, 99.0])
    image_info = SimpleNamespace(feature_names=[], input_low=0.0, input_high=1.0)
    assert "raw feature units" in eps_units(table_info)
    assert eps_units(image_info) == "the input's own units (valid range 0.0 to 1.0)"


def test_nothing_unverified_passes_in_silence(done):
    """A network the stage does not verify (here the int8 models: this run has no int8 stage) is named with its reason
    in the log at the stage's end, in summary.json's `not_verified`, first in the report's verify section, and again in
    the run's closing summary."""
    from pipeline.runner import closing_lines

    run, _, metrics = done
    missing = metrics["not_verified"]
    want = {f"{v}-int8" for v in VARIANTS} if run.cfg.verify.int8 else set()
    assert set(missing) == want and all("int8 stage wrote no int8 model" in why for why in missing.values())
    for model, why in missing.items():
        assert f"NOT VERIFIED {model}: {why}" in run.progress_log
    assert json.loads(run.file("verify", "summary.json").read_text())["not_verified"] == missing
    section = report_section(run.cfg, run)
    if missing:
        assert section.index("**Not verified**") < section.index("Properties:")
    run.mark_stage("verify", status="done", metrics=metrics)
    assert [line for line in closing_lines(run) if line.startswith("NOT VERIFIED")] == [
        f"NOT VERIFIED {m}: {why}" for m, why in missing.items()]


def test_the_open_table_shows_an_unbounded_margin_as_minus_infinity():
    from pipeline.stages.verify_report import _open_section

    rows = [{"model": "m-int8", "network": "int8", "eps": 0.002, "sample": s, "reason": "timeout", "result": "timeout",
             "margin_lb": m, "bound": "crown"} for s, m in enumerate(["-2e+300", "-inf", "-1.25", ""])]
    assert "0: −∞ (crown), 1: −∞ (crown), 2: -1.25 (crown), 3: — (crown)" in _open_section(rows)
