"""`pipeline sweep` (grid expansion, restart, failures) and `pipeline report` (Tables I/II, the
(t, c) heatmap, Spearman across init modes), on digits and on hand-made records."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from analysis import paper
from pipeline import lambda_stats
from pipeline.cli import main
from pipeline.errors import ConfigError
from pipeline.sweep import Block, Sweep, expand, parse_axis, point_name, read_sweep, run_sweep

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "configs" / "digits-tiny.toml")


# ---------------------------------------------------------------------------------------------
# Grid expansion


def test_parse_axis():
    assert parse_axis("seed=0,1,2") == ("seed", ["0", "1", "2"])
    assert parse_axis('variants=[["gelu","relu"],"lambda_gelu"]') == ("variants", ["gelu,relu", "lambda_gelu"])
    with pytest.raises(ConfigError, match="key.sub=v1,v2"):
        parse_axis("seed")


def test_blocks_are_cartesian_products_and_their_union():
    sweep = Sweep(set=["train.epochs=2"], blocks=[
        Block({"gate.temperature": ["0.1", "0.3"], "gate.lr_mult": ["1", "9"], "seed": ["0", "1"]}, ["variants=lambda_gelu"], "lam"),
        Block({"seed": ["0", "1"]}, ["variants=gelu"], "gelu"),
    ])
    points = expand(sweep)
    assert len(points) == 2 * 2 * 2 + 2
    assert points[0].name == "lam-t0.1-c1-s0" and points[0].overrides == [
        "train.epochs=2", "variants=lambda_gelu", "gate.temperature=0.1", "gate.lr_mult=1", "seed=0"]
    assert [p.name for p in points[-2:]] == ["gelu-s0", "gelu-s1"]
    # A command-line axis crosses into every block and replaces a block's own axis.
    points = expand(sweep, {"seed": ["7"]})
    assert len(points) == 4 + 1 and all(p.overrides[-1] == "seed=7" or "seed=7" in p.overrides for p in points)


def test_names_are_unique_or_refused():
    assert point_name("", {"variants": "gelu,relu", "seed": "0"}) == "gelu+relu-s0"
    assert point_name("x", {"train.lr": "0.01"}) == "x-lr0.01"
    clash = Sweep(blocks=[Block({"seed": ["0"]}, ["variants=gelu"]), Block({"seed": ["0"]}, ["variants=relu"])])
    with pytest.raises(ConfigError, match="both named 's0'"):
        expand(clash)
    same = Sweep(blocks=[Block({"seed": ["0"]}), Block({"seed": ["0", "1"]})])
    assert [p.name for p in expand(same)] == ["s0", "s1"]  # an identical point runs once


def test_sweep_file_is_strict_and_resolves_its_config(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text('config = "../base.toml"\nout_dir = "o"\n[[grid]]\nseed = [0, 1]\n')
    sweep = read_sweep(spec)
    assert sweep.config == str((tmp_path.parent / "base.toml").resolve())
    assert sweep.blocks[0].axes == {"seed": ["0", "1"]}
    spec.write_text('outdir = "o"\n')
    with pytest.raises(ConfigError, match="unknown sweep keys"):
        read_sweep(spec)


@pytest.mark.parametrize("spec", sorted((ROOT / "configs" / "sweeps").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_sweep_validates_every_point(spec, tmp_path):
    """All configs (the GPU ones too) and every override in every point are valid config keys."""
    summary = run_sweep(read_sweep(spec), out_dir=str(tmp_path), dry_run=True, log=lambda m: None)
    assert summary["points"] and all(p["status"] == "planned" for p in summary["points"])
    assert not any(tmp_path.iterdir())  # a dry run writes nothing


# ---------------------------------------------------------------------------------------------
# A tiny sweep on digits, end to end


def _sweep(out: Path, *args: str) -> int:
    """Options first, then overrides (argparse collects trailing positionals only)."""
    opts = [a for i, a in enumerate(args) if a.startswith("--") or (i and args[i - 1] in ("--label", "--grid"))]
    rest = [a for a in args if a not in opts]
    return main(["sweep", "-c", TINY, "--out", str(out), *opts, "train.epochs=4", *rest])


@pytest.fixture(scope="module")
def digits_sweep(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sweep")
    assert _sweep(out, "--label", "base", "variants=gelu,relu", "--grid", "seed=0,1") == 0
    assert _sweep(out, "--label", "learn", "variants=lambda_gelu", "train.switch_fraction=1",
                  "--grid", "gate.lr_mult=1,9", "--grid", "gate.init=uniform,decreasing", "--grid", "seed=0,1") == 0
    assert _sweep(out, "--label", "anneal", "variants=lambda_gelu", "--grid", "seed=0,1", "--report") == 0
    return out


def test_each_point_is_a_normal_run_directory(digits_sweep):
    runs = sorted(p.parent.name for p in digits_sweep.glob("*/config.json"))
    assert len(runs) == 2 + 8 + 2 and "learn-c9-decreasing-s1" in runs
    cfg = json.loads((digits_sweep / "learn-c9-decreasing-s1" / "config.json").read_text())
    assert cfg["gate"]["lr_mult"] == 9 and cfg["gate"]["init"] == "decreasing" and cfg["seed"] == 1
    assert cfg["stages"] == ["train", "harden", "swap"]  # the sweep default
    m = json.loads((digits_sweep / "learn-c9-decreasing-s1" / "manifest.json").read_text())
    assert list(m["stages"]) == ["train", "harden", "swap"] and m["argv"][0] == "sweep"
    index = json.loads((digits_sweep / "sweep.json").read_text())
    assert len(index["points"]) == 12  # three sweeps into one folder, one index


def test_restart_skips_finished_points_and_resumes_partial_ones(digits_sweep, capsys):
    run = digits_sweep / "base-s1"
    m = json.loads((run / "manifest.json").read_text())
    m["stages"]["swap"]["status"] = "failed"  # as if killed in its last stage
    (run / "manifest.json").write_text(json.dumps(m))
    before = (run / "train" / "metrics.csv").read_text()
    capsys.readouterr()
    assert _sweep(digits_sweep, "--label", "base", "variants=gelu,relu", "--grid", "seed=0,1") == 0
    out = capsys.readouterr().out
    assert "base-s0: done already, skipped" in out
    assert "[train] done already, skipped" in out and "[swap] replace" in out  # base-s1 resumed at swap
    assert (run / "train" / "metrics.csv").read_text() == before
    assert json.loads((run / "manifest.json").read_text())["stages"]["swap"]["status"] == "done"


def test_a_failing_point_is_recorded_and_the_sweep_goes_on(tmp_path, capsys):
    code = _sweep(tmp_path, "variants=gelu", "train.epochs=1", "--grid", "train.lr=1e30,0.1")
    assert code == 1
    index = {p["name"]: p for p in json.loads((tmp_path / "sweep.json").read_text())["points"]}
    assert index["lr1e30"]["status"] == "failed" and "non-finite at epoch 1" in index["lr1e30"]["error"]
    assert index["lr0.1"]["status"] == "done"


def test_report_tables_match_the_runs(digits_sweep):
    rep = digits_sweep / "paper-report"
    for f in ("report.md", "table1.md", "table1.png", "table2.md", "table2.png", "numbers.json",
              "fig1-tc-mlp-digits.png", "fig3-mlp-digits.png"):
        assert (rep / f).is_file() and (rep / f).stat().st_size > 0, f
    numbers = json.loads((rep / "numbers.json").read_text())
    rows = {(r["act"], r["mode"], r["c"]): r for r in numbers["table1"]}
    assert set(rows) == {("GELU", "-", None), ("ReLU", "-", None), ("λ-GELU", "uni", 1.0), ("λ-GELU", "dec", 1.0),
                         ("λ-GELU", "uni", 9.0), ("λ-GELU", "dec", 9.0)}
    # Recompute one row from the CSVs.
    bvs, drifts = [], []
    for seed in (0, 1):
        with open(digits_sweep / f"learn-c9-uniform-s{seed}" / "train" / "metrics.csv") as f:
            lam = [r for r in csv.DictReader(f) if r["variant"] == "lambda_gelu"]
        bvs.append(max(float(r["val_accuracy"]) for r in lam))
        drifts.append(lambda_stats.drift([[float(r["lambda_0"]), float(r["lambda_1"])] for r in lam]))
    row = rows[("λ-GELU", "uni", 9.0)]
    assert row["seeds"] == 2 and row["bvs"][0] == pytest.approx(np.mean(bvs)) and row["bvs"][1] == pytest.approx(np.std(bvs, ddof=1))
    assert row["drift"][0] == pytest.approx(np.mean(drifts))
    modes = {r["mode"] for r in numbers["table2"]}
    assert modes == {"GELU", "ReLU (from scratch)", "λ-GELU (annealed)", "λ-GELU (learned, not annealed)"}
    relu = next(r for r in numbers["table2"] if r["mode"] == "ReLU (from scratch)")  # no swap: original = swapped
    assert relu["val_original"][0] == relu["val_substituted"][0] and relu["val_change"][0] == 0
    annealed = next(r for r in numbers["table2"] if r["mode"] == "λ-GELU (annealed)")
    swaps = [json.loads((digits_sweep / f"anneal-s{s}" / "swap" / "swap.json").read_text())["lambda_gelu"] for s in (0, 1)]
    assert annealed["original"][0] == pytest.approx(np.mean([s["val_before"] for s in swaps]))
    assert annealed["substituted"][0] == pytest.approx(np.mean([s["val_after"] for s in swaps]))
    grid = numbers["heatmaps"]["MLP/digits"]
    assert grid["t"] == [0.1] and grid["c"] == [1.0, 9.0] and grid["runs"] == [[4, 4]]
    md = (rep / "report.md").read_text()
    assert "## Table I" in md and "## Table II" in md and "## Figure 1" in md and "## Figure 3" in md


def test_report_on_nothing_is_a_clear_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "no finished runs" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# The report's arithmetic on hand-made records


def _rec(variant="lambda_gelu", mode="uniform", t=0.1, c=9.0, seed=0, val=(0.5, 0.7, 0.6), lams=None,
         annealed=False, metric="accuracy", swap=None, bench="B"):
    val = np.array(val, dtype=float)
    lams = np.zeros((len(val), 0)) if variant != "lambda_gelu" else np.array(lams, dtype=float)
    return paper.Record(run=f"{variant}-{mode}-{t}-{c}-{seed}", benchmark=bench, variant=variant,
                        mode=mode if variant == "lambda_gelu" else "-", t=t, c=c, seed=seed, epochs=len(val),
                        annealed=annealed, is_relu=variant == "relu", metric=metric, val=val, lambdas=lams, swap=swap)


def test_bvs_respects_lower_is_better_and_drift_is_v_lambda():
    r = _rec(val=(30.0, 20.0, 25.0), metric="perplexity", lams=[[1, 2], [2, 2], [4, 1]])
    assert r.bvs == 20.0 and r.best_index == 1
    assert r.drift == pytest.approx(((1 + 2) + (0 + 1)) / 2)  # layer 0: |2−1|+|4−2|, layer 1: 0+|1−2|
    assert r.lambda_mean == pytest.approx(2.5)


def test_tc_grid_cells_and_delta_bvs():
    lam = [[1, 1], [2, 1]]
    recs = [_rec("gelu", val=(0.5, 0.8)), _rec("gelu", seed=1, val=(0.5, 0.6))]
    recs += [_rec(t=0.1, c=1, val=(0.5, 0.9), lams=lam), _rec(t=0.1, c=1, mode="increasing", val=(0.5, 0.7), lams=[[1, 1], [1, 1]]),
             _rec(t=0.3, c=9, val=(0.5, 0.5), lams=lam)]
    grid = paper.tc_grid(recs)
    assert grid["t"] == [0.1, 0.3] and grid["c"] == [1.0, 9.0]
    assert grid["gelu_bvs"] == pytest.approx(0.7)
    assert grid["delta_bvs"][0, 0] == pytest.approx(0.8 - 0.7)  # mean over the two init modes
    assert grid["drift"][0, 0] == pytest.approx((0.5 + 0.0) / 2)
    assert grid["runs"][0, 0] == 2 and math.isnan(grid["drift"][0, 1]) and grid["runs"][1, 1] == 1


def test_spearman_curves_average_over_seeds_that_ran_both_modes():
    a = [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]
    b = [[3.0, 2.0, 1.0], [1.0, 2.0, 3.0]]
    recs = [_rec(mode="uniform", seed=0, val=(0.1, 0.2), lams=a), _rec(mode="decreasing", seed=0, val=(0.1, 0.2), lams=b),
            _rec(mode="uniform", seed=1, val=(0.1, 0.2), lams=a), _rec(mode="decreasing", seed=1, val=(0.1, 0.2), lams=a),
            _rec(mode="increasing", seed=5, val=(0.1, 0.2), lams=a)]
    curves = paper.spearman_curves(recs, (0.1, 9.0))
    assert set(curves) == {"uni–dec"}  # increasing ran a seed no other mode ran
    assert curves["uni–dec"]["n"] == 2
    assert curves["uni–dec"]["mean"].tolist() == pytest.approx([0.0, 1.0])  # (−1 + 1)/2, then (1 + 1)/2


def test_baselines_trained_twice_count_once():
    col = paper.Collection([_rec("gelu", val=(0.5, 0.8)), _rec("gelu", val=(0.5, 0.8)), _rec("gelu", seed=1, val=(0.5, 0.6))])
    (row,) = paper.table1(col)
    assert row["seeds"] == 2 and row["bvs"][0] == pytest.approx(0.7)


def test_table2_rows_and_side_by_side_with_the_paper():
    sw = lambda b, a: {"val_before": b, "val_after": a, "argmax_agreement": 0.9}  # noqa: E731
    recs = [_rec("gelu", val=(0.5, 0.86), swap=sw(0.86, 0.80), bench="MLP/Fashion-MNIST"),
            _rec(annealed=True, val=(0.5, 0.87), lams=[[1, 1], [160, 160]], swap=sw(0.87, 0.87), bench="MLP/Fashion-MNIST")]
    t2 = paper.table2(paper.Collection(recs))
    assert [r["mode"] for r in t2] == ["GELU", "λ-GELU (annealed)"]
    assert t2[0]["change"][0] == pytest.approx(-0.06)
    _, s2 = paper.side_by_side([], t2)
    assert s2[0][1] == "FMNIST" and s2[0][6:8] == ["0.86", "0.83"] and s2[1][6:8] == ["0.86", "0.85"]


# ---------------------------------------------------------------------------------------------
# What the (t, c) grid measures under SGD


def _lambda_history(out: Path, name: str, *overrides: str) -> np.ndarray:
    assert main(["run", "-c", TINY, f"out_dir={out}", f"name={name}", "variants=lambda_gelu", "train.epochs=3",
                 "train.switch_fraction=1", "stages=train,harden", "gate.init=increasing", *overrides]) == 0
    with open(out / name / "train" / "metrics.csv") as f:
        return np.array([[float(r["lambda_0"]), float(r["lambda_1"])] for r in csv.DictReader(f)])


SAME_C_OVER_T2_RTOL = 1e-4  # float32 rounding of s0 = t·softplus⁻¹(λ0 − 1), carried through 3 epochs


def test_under_sgd_the_grid_depends_on_c_over_t_squared_only(tmp_path):
    """With u = s/t, λ = 1 + softplus(u) and SGD(+momentum) on s at c·η gives
    u ← u − (c/t²)·η·σ(u)·∂L/∂λ: (t, c) = (0.1, 1) and (0.3, 9) (c/t² = 100) are one run.
    Adam normalizes the step on s, so there u moves by ~c·η/t and the two cells differ."""
    a = _lambda_history(tmp_path, "a", "gate.temperature=0.1", "gate.lr_mult=1")
    b = _lambda_history(tmp_path, "b", "gate.temperature=0.3", "gate.lr_mult=9")
    assert np.abs(a[-1] - a[0]).max() > 1e-3  # λ did move
    np.testing.assert_allclose(a, b, rtol=SAME_C_OVER_T2_RTOL)
    a = _lambda_history(tmp_path, "c", "gate.temperature=0.1", "gate.lr_mult=1", "train.optimizer=adamw", "train.lr=1e-3")
    b = _lambda_history(tmp_path, "d", "gate.temperature=0.3", "gate.lr_mult=9", "train.optimizer=adamw", "train.lr=1e-3")
    assert np.abs(a - b).max() > 100 * SAME_C_OVER_T2_RTOL * np.abs(a).max()
