"""The downstream record, held to recomputation from the run's own files: the int8, sparsity and verify columns
equal what those stages wrote (recomputed here from quantize.json, sparsity.json and details.csv with the csv module),
the radius brackets agree with every verify-stage answer at the same sample and ε (a proof at ε below a falsified ε
would be unsound), and the certified-accuracy curve equals the share of brackets proved at each ε."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from analysis import downstream as ds_mod
from pipeline.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXACT = 1e-12  # values copied from one JSON into another: equal up to float formatting


def test_verify_columns_count_and_take_the_median_over_decided_properties_only():
    rows = [{"variant": "a", "verifier": "auto", "eps": "0.1", "result": r, "stage": s, "seconds": str(t)}
            for r, s, t in (("unsat", "crown", 1.0), ("sat", "pgd", 3.0), ("timeout", "bab", 9.0), ("sat", "clean", 0.0),
                            ("unsat", "bab", 2.0))]
    rows.append({"variant": "a", "verifier": "milp", "eps": "0.1", "result": "unsat", "stage": "milp", "seconds": "50"})
    (c,) = ds_mod.verify_columns(rows, "a", "auto")
    assert c["properties"] == 5 and c["certified"] == 2 / 5 and c["falsified"] == 2 / 5 and c["decided"] == 4 / 5
    assert c["median_decided_seconds"] == statistics.median([1.0, 3.0, 2.0])  # the clean and the timeout left out


@pytest.mark.slow
def test_the_record_equals_the_stages_files(tmp_path):
    out = tmp_path / "runs"
    assert main(["run", "-c", str(ROOT / "configs" / "digits-tiny.toml"), f"out_dir={out}", "name=r",
                 "variants=lambda_gelu,relu", "train.epochs=3", "verify.samples=4", "verify.budget_s=10",
                 "verify.int8_budget_s=5", "downstream.eps_max=0.3", "downstream.timeout_s=0.5", "threads=2"]) == 0
    run = out / "r"
    rec = json.loads((run / "downstream" / "downstream.json").read_text())
    assert rec["workers"] == 2  # the bisections ran in the verify stage's two worker processes
    q = json.loads((run / "quantize" / "quantize.json").read_text())
    sp = json.loads((run / "sparsity" / "sparsity.json").read_text())
    with open(run / "verify" / "details.csv", newline="") as f:
        details = list(csv.DictReader(f))
    manifest = json.loads((run / "manifest.json").read_text())
    assert set(manifest["stages"]["downstream"]["metrics"]["variants"]) == {"lambda_gelu", "relu"}
    for v, e in rec["variants"].items():
        m = q["models"][v]["relu"]
        assert e["int8"]["test_drop_pt"] == pytest.approx(100 * (m["fp32"]["test_accuracy"] - m["int8"]["test_accuracy"]), abs=1e-9)
        assert e["int8"]["test_argmax_agreement"] == m["test_argmax_agreement"]
        assert e["int8"]["output_sqnr_db"] == m["output_sqnr_db"]
        s = sp["variants"][v]
        assert e["sparsity"]["apoz_mean"] == s["apoz_mean"]
        assert e["sparsity"]["pruned_fraction"] == pytest.approx(sum(s["pruning"]["removed"].values()) / s["units"], abs=EXACT)
        assert e["sparsity"]["bytes_pruned"] == (run / s["pruning"]["onnx"]).stat().st_size
        assert e["sparsity"]["latency_b1_ms_pruned"] > 0 and e["sparsity"]["latency_b1_ms_unpruned"] > 0
        for kind, name in (("relu", v), ("int8", f"{v}-int8")):
            mine = [r for r in details if r["variant"] == name and r["verifier"] == "auto"]
            for c in e["verify"][kind]:
                sel = [r for r in mine if float(r["eps"]) == c["eps"]]
                assert c["properties"] == len(sel) == 4
                assert c["certified"] == sum(r["result"] == "unsat" for r in sel) / 4
                assert c["falsified"] == sum(r["result"] == "sat" for r in sel) / 4
            rad = e["radius"][kind]
            assert len(rad["brackets"]) == 4
            for b in rad["brackets"]:
                proved = b["proved"]
                top = b["falsified"] if b["falsified"] is not None else float("inf")
                assert proved < top or (not b["clean"] and proved == 0 == top)
                for r in mine:  # the verify stage's answers on the same sample never contradict the bracket
                    if int(r["sample"]) == b["sample"]:
                        assert not (r["result"] == "unsat" and float(r["eps"]) >= top)
                        assert not (r["result"] == "sat" and float(r["eps"]) <= proved)
            for c in rad["curve"]:
                want = sum(b["clean"] and (b["proved"] >= c["eps"] if c["eps"] > 0 else True) for b in rad["brackets"]) / 4
                assert c["certified"] == want
        assert e["unstable"]["relu"][0]["eps"] == 0.002 and e["unstable"]["relu"][0]["samples"] == 4
    report = (run / "report" / "report.md").read_text()
    assert "## Downstream" in report and (run / "downstream" / "certified_accuracy.png").is_file()


def test_each_network_job_is_answered_once_under_its_own_key_in_worker_processes():
    from pipeline.stages.downstream import _each

    keys = [("a", "relu"), ("a", "int8"), ("b", "relu")]
    kwargs = [{"k": i} for i in range(3)]
    for workers in (1, 2):  # dict(**kw) is picklable by reference, so a spawned worker runs it without our imports
        assert dict(_each(dict, keys, workers, kwargs)) == {k: kw for k, kw in zip(keys, kwargs)}


def _variant(drop: float, certified: float, radius: float) -> dict:
    return {"int8": {"test_drop_pt": drop}, "sparsity": None,
            "verify": {"relu": [{"eps": 0.01, "properties": 100, "certified": certified, "falsified": 0.0,
                                 "decided": certified, "median_decided_seconds": 0.5}]},
            "radius": {"relu": {"median_proved": radius, "curve": [{"eps": 0.0, "certified": 1.0},
                                                                  {"eps": 0.1, "certified": radius}]}},
            "unstable": {}}


def test_the_study_pairs_seeds_and_gives_t_intervals_of_the_differences():
    from scipy import stats as sps

    from analysis import downstream_study as st

    drops = {"lambda_gelu": [0.1, 0.3, 0.2], "relu": [0.5, 0.4, 0.9], "gelu": [0.2, 0.2, 0.6]}
    cert = {"lambda_gelu": [0.9, 0.8, 0.95], "relu": [0.7, 0.8, 0.9], "gelu": [0.6, 0.5, 0.9]}
    study = {"b": {v: {s: _variant(drops[v][s], cert[v][s], 0.05 * s) for s in range(3)} for v in drops}}
    study["b"]["relu"][3] = _variant(9.0, 0.0, 0.0)  # a seed the annealed variant lacks: not paired
    t = st.rows(study)["b"]
    for other in ("relu", "gelu"):
        d = np.array(drops["lambda_gelu"]) - np.array(drops[other][:3])
        mean, sd = d.mean(), d.std(ddof=1)
        half = sps.t.ppf(0.975, 2) * sd / np.sqrt(3)
        m = t["pairs"][f"lambda_gelu − {other}"]["int8 test drop (pt)"]
        assert m[0] == pytest.approx(mean, abs=EXACT) and m[2] == pytest.approx(half, abs=EXACT) and m[3] == 3
    m = t["variants"]["relu"]["float certified @ 0.01"]
    assert m[3] == 4 and m[0] == pytest.approx(np.mean([0.7, 0.8, 0.9, 0.0]), abs=EXACT)
    assert "lambda_swish − relu" not in t["pairs"]  # no λ-Swish runs
    curves = st._curves(study["b"], "relu")
    assert curves["gelu"][1][1][0] == pytest.approx(np.mean([0.0, 0.05, 0.1]), abs=EXACT)


def test_properties_never_posed_for_lack_of_budget_are_counted_and_named_in_the_report():
    from analysis import downstream_study as st

    rows = [{"variant": v, "reason": r} for v, r in (("relu", "budget"), ("relu", "timeout"), ("relu-int8", "budget"),
                                                      ("relu-int8", "budget"), ("gelu", ""), ("gelu-int8", "budget"))]
    assert ds_mod.unposed(rows) == {"relu": 1, "relu-int8": 2, "gelu-int8": 1}  # "timeout" and decided rows are posed
    variants = {"relu": {0: {"unposed": {"float": 0, "int8": 0}}, 4: {"unposed": {"float": 0, "int8": 269}}},
                "gelu": {0: {"unposed": {"float": 0, "int8": 0}}}}
    (line, blank) = st.unposed_lines(variants)
    assert "ReLU from scratch seed 4 int8 269" in line and "GELU" not in line and "seed 0" not in line and blank == ""
    assert st.unposed_lines({"relu": {0: {"unposed": {"float": 0, "int8": 0}}}}) == []


def test_the_figure_s_steps_equal_the_share_proved_at_every_eps_and_the_axis_stops_where_curves_do():
    from pipeline.stages.downstream import certified_steps, shown_eps_max

    rng = np.random.default_rng(0)
    brackets = [{"clean": bool(c), "proved": float(p) if c else 0.0, "open": float(p) + 0.01}
                for c, p in zip(rng.random(40) > 0.2, rng.uniform(0, 0.2, 40))]
    xs, ys = certified_steps(brackets)
    for eps in rng.uniform(1e-6, 0.25, 2000):  # steps-post: the value of the last step starting at or before ε
        i = max(k for k, x in enumerate(xs) if x < eps)
        truth = sum(b["clean"] and b["proved"] >= eps for b in brackets) / len(brackets)
        assert abs(ys[i] - truth) <= EXACT
    assert ys[0] == sum(b["clean"] for b in brackets) / len(brackets)
    rec = {"v": {"radius": {"relu": {"eps_max": 1.0, "brackets": brackets}}}}
    assert shown_eps_max(rec) == pytest.approx(1.5 * max(b["open"] for b in brackets), abs=EXACT)
    brackets[3]["open"] = None  # one radius reached eps_max: the axis goes there
    assert shown_eps_max(rec) == 1.0
