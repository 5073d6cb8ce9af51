"""The report matches its files: the training table describes the checkpoint that ships (the manifest's
best_epoch, its λ), the figures mark it and can be read (whole-number epochs, layers that anneal to one λ each
visible, a legend that covers no bar), the APoZ histograms are linked, and a per-feature input range is summarised
instead of pasted."""

from __future__ import annotations

import csv

import pytest

from pipeline import lambda_stats, render
from pipeline import variant_record as records
from pipeline.stages import train
from pipeline.config import Config
from pipeline.rundir import RunDir

T = 4


def _run(tmp_path) -> RunDir:
    """A run whose best validation epoch (2) is not the shipped one (4, harden.select=best_hardened)."""
    cfg = Config(name="r", out_dir=str(tmp_path), variants=["lambda_gelu", "gelu"], device="cpu")
    cfg.train.epochs = T
    run = RunDir.create(cfg)
    run.record_variants({v: records.decide(v, cfg.harden, cfg.train) for v in cfg.variants})
    rows = []
    for v in cfg.variants:
        for e in range(1, T + 1):
            lam = {"lambda_0": 1.0 + 50 * (e - 1), "lambda_1": 1.5 + 50 * (e - 1)} if v == "lambda_gelu" else {"lambda_0": "", "lambda_1": ""}
            rows.append({"variant": v, "epoch": e, "val_accuracy": [0.80, 0.95, 0.90, 0.91][e - 1], **lam})
    with open(run.dir("train") / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    run.mark_stage("train", status="done", metrics={v: {"best_epoch": 1} for v in cfg.variants})
    run.mark_stage("harden", status="done", metrics={"lambda_gelu": {"best_epoch": 4}, "gelu": {"best_epoch": 2}})
    return run


def _table_row(section: str, variant: str) -> list[str]:
    line = next(l for l in section.splitlines() if l.startswith(f"| {variant} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_the_training_table_describes_the_shipped_checkpoint(tmp_path):
    run = _run(tmp_path)
    section = train.report_section(run.cfg, run)
    row = _table_row(section, "lambda_gelu")
    assert row[1] == "4"  # the manifest's best_epoch, not the best validation epoch (2)
    assert float(row[2]) == pytest.approx(0.91)  # the validation metric at epoch 4
    assert float(row[5]) == pytest.approx((151.0 + 151.5) / 2)  # mean λ at epoch 4
    assert "0.9500 (epoch 2)" in section  # the best validation epoch is still there, named as such
    assert _table_row(section, "gelu")[1] == "2"


def test_validation_curves_mark_the_shipped_epoch_with_whole_number_ticks(tmp_path):
    run = _run(tmp_path)
    rows = list(csv.DictReader(open(run.file("train", "metrics.csv"))))
    fig = train.curves_figure(rows, ["lambda_gelu", "gelu"], "val_accuracy", {"lambda_gelu": 4, "gelu": 2})
    ax = fig.axes[0]
    fig.canvas.draw()
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)
    stars = [(l.get_xdata()[0], l.get_ydata()[0]) for l in ax.lines if l.get_marker() == "*"]
    assert sorted(stars) == [(2, pytest.approx(0.95)), (4, pytest.approx(0.91))]


def test_layers_that_anneal_to_one_lambda_stay_distinguishable():
    lams = [[1.0, 1.0, 1.0], [80.0, 80.0, 80.0], [160.0, 160.0, 160.0]]  # three layers on one line
    fig = lambda_stats.lambda_figure(lams, target=160.0, marked_epoch=3)
    lines = [l for l in fig.axes[0].lines if l.get_label().startswith("layer")]
    assert len({(l.get_linestyle(), l.get_marker()) for l in lines}) == 3
    widths = [l.get_linewidth() for l in lines]
    assert widths == sorted(widths, reverse=True) and widths[0] > widths[-1]  # thick below, thin on top
    assert any(l.get_label().startswith("shipped") for l in fig.axes[0].lines)


def test_the_gate_error_legend_covers_no_bar():
    from analysis.bounds_check import layers_figure

    layer = {"layer": 0, "gate_error": 1e-3, "gate_error_predicted": 1.1e-3, "max_gap_module": 1e-3, "sup_bound": 1.1e-3}
    fig = layers_figure({"lambda_gelu": [layer, {**layer, "layer": 1}], "gelu": [layer, {**layer, "layer": 1}]})
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0].get_window_extent(renderer)
    assert all(not legend.overlaps(ax.get_window_extent(renderer)) for ax in fig.axes)


def test_the_sparsity_section_links_the_apoz_histograms(tmp_path):
    from pipeline.stages import sparsity

    run = _run(tmp_path)
    summary = {"split": "val", "samples": 10, "variants": {"lambda_gelu": {
        "layers": {"act0": {}}, "units": 4, "apoz_mean": 0.5, "dead": 1, "always_active": 0}}}
    (run.dir("sparsity") / "sparsity.json").write_text(__import__("json").dumps(summary))
    section = sparsity.report_section(run.cfg, run)
    assert "](../sparsity/lambda_gelu/apoz_hist.png)" in section


def test_a_stage_json_is_read_one_way_and_a_corrupt_one_names_its_writer(tmp_path):
    """RunDir.read_json: None before the stage wrote the file (its section is left out), the JSON after, and for a
    corrupt file one line naming the --redo of the stage the manifest says wrote it."""
    from pipeline.errors import RunDirError
    from pipeline.stages import int8

    run = _run(tmp_path)
    assert run.read_json("quantize", "quantize.json") is None and int8.report_section(run.cfg, run) is None
    path = run.dir("quantize") / "quantize.json"
    path.write_text('{"metric": "accuracy"}')
    assert run.read_json("quantize", "quantize.json") == {"metric": "accuracy"}
    run.mark_stage("int8", status="done", outputs={"quantize/quantize.json": "0" * 64})
    path.write_text('{"metric": ')
    with pytest.raises(RunDirError, match=r"quantize\.json is corrupt .*--redo int8`$") as e:
        run.read_json("quantize", "quantize.json")
    assert "\n" not in str(e.value)
    run.mark_stage("int8", status="done", outputs={})  # no record of the writer: the fix still names the way
    with pytest.raises(RunDirError, match=r"rerun the stage that writes quantize/ \(`pipeline stages` lists them\)"):
        run.read_json("quantize", "quantize.json")


def test_a_per_feature_input_range_is_summarised_not_pasted():
    low, high = [float(i) for i in range(26)], [100.0 + i for i in range(26)]
    text = render.value_range(low, high, [f"f{i}" for i in range(26)])
    assert "26 features" in text and "[0, 125]" in text and "(f0, f25)" in text
    assert len([t for t in text.replace(",", " ").replace("[", " ").replace("]", " ").split() if t.replace(".", "").isdigit()]) <= 8
    assert render.value_range(0.0, 1.0) == "[0, 1]"


def test_the_chain_says_why_a_float_proof_stops_short_of_the_int8_model():
    """Each kind of open int8 answer behind a float ReLU proof gets its own reason, with both margin bounds as
    details.csv holds them (not a sentence that covers every case with an "or")."""
    from analysis.robustness.chain import chain_rows
    from analysis.verification.bounds import UNKNOWN

    def row(variant, sample, result, reason="", margin=""):
        return {"variant": variant, "sample": sample, "eps": 0.002, "verifier": "auto", "result": result,
                "reason": reason, "margin_lb": margin}

    relu = [row("v", s, "unsat", margin="2.5") for s in range(6)]
    relu.append(row("v", 6, "unsat", margin="-1.6") | {"stage": "bab"})
    int8 = [row("v-int8", 0, "unsat", margin="0.4"), row("v-int8", 1, "timeout", "timeout", "-8.06"),
            row("v-int8", 2, "timeout", "tie", "-0.5"), row("v-int8", 3, "timeout", "budget", "-3e8"),
            row("v-int8", 4, "unknown", "unknown", str(-UNKNOWN)),
            row("v-int8", 6, "timeout", "timeout", "-3.4")]
    said = [c["carries_over"] for c in chain_rows(["v"], relu + int8, [], "auto")]
    assert said[0].startswith("proven for the int8 model itself")
    assert said[1].endswith("its best margin bound through the rounding is -8.06 against the float ReLU network's 2.5")
    assert "tie exactly" in said[2] and "no strict counterexample" in said[2]
    assert "no bound pass on it finished" in said[3]
    assert "no finite bound" in said[4]
    assert said[5].endswith("no int8 model was verified")  # sample 5 has no int8 row
    assert said[6].endswith("is -3.4, where the float ReLU network's proof needed branch and bound")
