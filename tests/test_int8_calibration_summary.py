"""benchmarks/int8_calibration.py reads a run's int8 fidelity and verify answers: counts from a hand-made run
directory (decided = sat or unsat, a misclassified sample's clean row left out, float rows apart from int8 ones)."""

from __future__ import annotations

import csv
import json

from benchmarks.int8_calibration import summarize

FIELDS = ["variant", "sample", "eps", "result", "reason", "stage", "margin_lb"]


def test_counts_and_fidelity_of_a_hand_made_run(tmp_path):
    run = tmp_path / "p99.5"
    for d in ("quantize", "verify"):
        (run / d).mkdir(parents=True)
    fid = {"percentile": 99.9, "test_argmax_agreement": 0.99, "test_drop_pt": 0.1, "output_sqnr_db": 16.0, "test_max_logit_change": 20.0}
    (run / "quantize" / "quantize.json").write_text(json.dumps(
        {"settings": {"calibration_method": "percentile"}, "models": {"relu": {"relu": fid}}}))
    (run / "config.json").write_text(json.dumps({"quantize": {"percentile": 99.5}}))
    (run / "verify" / "summary.json").write_text(json.dumps({"int8_solve_seconds": 20.0, "solve_seconds": 35.0}))
    rows = [("relu", 0, 0.002, "unsat", "", "crown", "1.5"), ("relu", 1, 0.002, "sat", "", "pgd", "-0.5"),
            ("relu-int8", 0, 0.002, "unsat", "", "bab", "-1.0"), ("relu-int8", 1, 0.002, "timeout", "timeout", "bab", "-2.0"),
            ("relu-int8", 2, 0.002, "timeout", "tie", "pgd", "-0.5"), ("relu-int8", 3, 0.002, "sat", "", "clean", "")]
    with open(run / "verify" / "details.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        w.writerows(rows)
    got = summarize(run)
    v = got["variants"]["relu"]
    assert got["percentile"] == 99.5 and (got["int8_decided"], got["int8_properties"]) == (1, 3)
    assert (v["int8_unsat"], v["int8_sat"], v["float_decided"], v["float_properties"]) == (1, 0, 2, 2)
    assert v["int8_open"] == {"1@0.002": {"reason": "timeout", "margin_lb": "-2.0"},
                              "2@0.002": {"reason": "tie", "margin_lb": "-0.5"}}
    assert v["int8_median_margin_lb"] == -1.0 and v["output_sqnr_db"] == 16.0
    assert v["percentile"] == 99.9  # the clip the stage chose for this model
