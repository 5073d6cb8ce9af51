"""End to end on sklearn digits: every stage, artifacts, kill-and-resume, and bad input."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline import checkpoint
from pipeline.cli import main
from pipeline.rundir import RunDir, sha256
from pipeline.stages import STAGES

ROOT = Path(__file__).resolve().parent.parent
TINY = ["-c", str(ROOT / "configs" / "digits-tiny.toml")]
SWAP_KEYS = {"val_before", "val_after", "test_before", "test_after", "argmax_agreement", "max_logit_change",
             "test_loss_before", "test_loss_after"}
SWAP_DROP_TOL = 0.02  # hardened λ-GELU → ReLU on digits: at most one validation example in ~50 may flip


def _run(*args: str) -> int:
    return main(["run", *TINY, *args])


def _rows(run: Path) -> list[dict]:
    with open(run / "train" / "metrics.csv") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    assert _run(f"out_dir={out}", "name=ref") == 0
    return out / "ref"


def test_every_stage_done_with_hashed_outputs(finished):
    m = json.loads((finished / "manifest.json").read_text())
    assert list(m["stages"]) == list(STAGES)
    latest = {}  # train and harden share train/: a file's current hash is the last stage's record
    for name, st in m["stages"].items():
        assert st["status"] == "done" and st["device"] == "cpu" and st["seconds"] >= 0, name
        latest.update(st["outputs"])
    assert latest and all(sha256(finished / rel) == digest for rel, digest in latest.items())
    assert "train/lambda_gelu/switch.pt" in m["stages"]["train"]["outputs"]
    switch = checkpoint.load_payload(finished / "train" / "lambda_gelu" / "switch.pt")
    assert switch["state"]["epoch"] == 2 and switch["state"]["hardener"]["lambda_switch"] is None
    assert {"torch", "numpy", "python"} <= set(m["versions"]) and m["seed"] == 0
    cfg = json.loads((finished / "config.json").read_text())
    assert cfg["data"]["name"] == "digits" and cfg["train"]["epochs"] == 8


def test_metrics_csv_follows_algorithm_1(finished):
    rows = _rows(finished)
    T, e_s = 8, 2
    lam_rows = [r for r in rows if r["variant"] == "lambda_gelu"]
    assert [int(r["epoch"]) for r in lam_rows] == list(range(1, T + 1))
    assert [r["phase"] for r in lam_rows] == ["learn"] * e_s + ["anneal"] * (T - e_s)
    lam_cols = [k for k in rows[0] if k.startswith("lambda_")]
    assert len(lam_cols) == 2  # one λ per activation layer of the 32-32 MLP
    target = 2 / (5e-3 * math.sqrt(2 * math.pi))  # E∞(λ) = 2/(λ√(2π)) = ε, the config's ε = 5e-3
    for col in lam_cols:
        series = [float(r[col]) for r in lam_rows]
        assert series[-1] == pytest.approx(target, rel=1e-6)  # λ(T) = λ_target (float32 storage)
        lam_s = series[e_s - 1]
        for e in range(e_s + 1, T + 1):
            assert series[e - 1] == pytest.approx(lam_s + (e - e_s) / (T - e_s) * (target - lam_s), rel=1e-5)
        assert series[0] != series[1]  # λ is learned in the first phase
    gelu_rows = [r for r in rows if r["variant"] == "gelu"]
    assert len(gelu_rows) == T and all(r["lambda_0"] == "" for r in gelu_rows)


def test_swap_json_shape_and_hardened_swap_is_nearly_lossless(finished):
    swap = json.loads((finished / "swap" / "swap.json").read_text())
    assert set(swap) == {"lambda_gelu", "gelu"}
    for v in swap.values():
        assert set(v) == SWAP_KEYS | {"swapped", "kept"} and all(isinstance(v[k], float) for k in SWAP_KEYS)
        assert v["swapped"] == 2 and v["kept"] == []  # the MLP's two gate layers, nothing kept
    lam = swap["lambda_gelu"]
    assert lam["val_before"] > 0.8
    assert lam["val_before"] - lam["val_after"] <= SWAP_DROP_TOL
    # At λ = 159.6 each unit moves by at most 0.17/λ ≈ 1e-3: logits barely change.
    assert lam["max_logit_change"] < 0.1 and lam["argmax_agreement"] >= 1 - SWAP_DROP_TOL


def test_checkpoints_rebuild_their_models(finished):
    model, payload = checkpoint.load_model(finished / "train" / "lambda_gelu" / "best.pt")
    assert payload["epoch"] >= 1 and len(payload["lambdas"]) == 2
    relu, rp = checkpoint.load_model(finished / "swap" / "lambda_gelu" / "relu.pt")
    assert rp["spec"]["activation"] == "relu"
    assert sum(isinstance(m, torch.nn.ReLU) for m in relu.modules()) == 2
    x = torch.rand(5, 1, 8, 8)
    with torch.no_grad():
        assert (model(x) - relu(x)).abs().max() < 0.1


def test_existing_name_with_other_config_is_refused(finished, capsys):
    assert _run(f"out_dir={finished.parent}", "name=ref", "seed=1") == 2
    assert "already exists with a different config" in capsys.readouterr().err


def _subprocess_run(args: list[str], kill_after: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("PIPELINE_KILL_AFTER", None)
    if kill_after:
        env["PIPELINE_KILL_AFTER"] = kill_after
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # three child processes
def test_sigkill_and_resume_gives_identical_results(finished, tmp_path):
    out = tmp_path / "runs"
    # Killed in the train stage (gelu's first epoch), then in the harden stage (λ-GELU epoch 5).
    p = _subprocess_run(["run", *TINY, f"out_dir={out}", "name=k"], kill_after="gelu:1")
    assert p.returncode == -signal.SIGKILL, p.stderr
    run = out / "k"
    assert json.loads((run / "manifest.json").read_text())["stages"]["train"]["status"] == "running"
    p = _subprocess_run(["run", "--resume", str(run)], kill_after="lambda_gelu:5")
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert checkpoint.load_payload(run / "train" / "lambda_gelu" / "last.pt")["state"]["epoch"] == 5
    p = _subprocess_run(["run", "--resume", str(run)], kill_after=None)
    assert p.returncode == 0, p.stderr
    assert "[train] done already, skipped" in p.stdout
    assert json.loads((run / "swap" / "swap.json").read_text()) == json.loads((finished / "swap" / "swap.json").read_text())
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(_rows(run)) == strip(_rows(finished))


def test_missing_dataset_is_a_clear_error(tmp_path, capsys):
    code = main(["run", f"out_dir={tmp_path}", "data.name=adult", f"data.root={tmp_path / 'nowhere'}", "name=x"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: adult: adult.data, adult.test not found (looked in")
    assert "data.download=true" in err and "\n" not in err


def test_corrupt_checkpoint_is_a_clear_error_and_keeps_old_outputs(finished, tmp_path, capsys):
    import shutil

    run = tmp_path / "c"
    shutil.copytree(finished, run)
    old_swap = (run / "swap" / "swap.json").read_text()
    (run / "train" / "gelu" / "best.pt").write_bytes(b"not a checkpoint")
    assert main(["run", "--resume", str(run), "--redo", "swap"]) == 2
    err = capsys.readouterr().err
    assert "checkpoint" in err and "is corrupt" in err and "best.pt" in err
    superseded = list((run / "superseded").glob("swap-*/swap.json"))
    assert len(superseded) == 1 and superseded[0].read_text() == old_swap  # redo never deletes finished work
    assert json.loads((run / "manifest.json").read_text())["stages"]["swap"]["status"] == "failed"


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, capsys):
    out = tmp_path / "runs"
    assert _run(f"out_dir={out}", "name=n", "stages=train") == 0
    run = out / "n"
    good = (run / "train" / "lambda_gelu" / "last.pt").read_bytes()
    code = main(["run", "--resume", str(run), "stages=", "train.lr=1e30"])
    err = capsys.readouterr().err
    assert code == 2 and "at epoch 3" in err and "last good checkpoint (epoch 2)" in err
    assert (run / "train" / "lambda_gelu" / "last.pt").read_bytes() == good
    assert checkpoint.load_payload(run / "train" / "lambda_gelu" / "best.pt")["epoch"] <= 2


# Declared files the tiny run need not reach, each with why: one verifier (auto), no resume state set aside, and a
# falsified property only where an attack finds one at the tiny radii.
MAY_BE_ABSENT = {"verify/results.*.csv", "train/<variant>/*.unusable-*", "verify/counterexamples/*.counterexample"}


def test_every_stage_writes_exactly_what_it_declares(finished):
    m = json.loads((finished / "manifest.json").read_text())
    on_disk = {str(p.relative_to(finished)) for p in finished.rglob("*") if p.is_file() and not p.name.startswith(".")}
    # what each stage wrote: its record, and the files a later stage rewrote (harden rewrites train's)
    wrote = {name: {*st["outputs"], *st.get("rewritten_by", {})} for name, st in m["stages"].items()}
    assert on_disk - {"config.json", "manifest.json"} == set().union(*wrote.values())  # every file, by some stage
    for name, files in wrote.items():
        for rel in files:
            assert any(o.matches(rel) for o in STAGES[name].outputs), (name, rel)
    run = RunDir.open(finished)
    for name, stage in STAGES.items():
        for o in stage.outputs:
            mine = [rel for rel in wrote[name] if o.matches(rel)]
            expected = o.expected(run, run.cfg.variants)
            if o.path in MAY_BE_ABSENT:
                continue
            assert mine, (name, o.path)  # no declaration this run leaves unused
            if "*" not in o.path:  # one file per variant (and form) the declaration names; a conditional one, some
                assert set(mine) <= set(expected) and (o.when or set(mine) == set(expected)), (name, o.path, mine)
    forms = {v: run.forms(v) for v in run.cfg.variants}
    assert forms == {"lambda_gelu": ("smooth", "relu"), "gelu": ("smooth", "relu")}


def test_a_stage_writing_other_files_than_it_declares_is_named_in_one_line_and_keeps_its_work(finished, tmp_path,
                                                                                               monkeypatch, capsys):
    import dataclasses
    import shutil

    from pipeline.rundir import Output

    run = tmp_path / "o"
    shutil.copytree(finished, run)
    report = STAGES["report"]
    undeclared = tuple(o for o in report.outputs if o.path != "report/report.md")
    monkeypatch.setitem(STAGES, "report", dataclasses.replace(report, outputs=undeclared))
    assert main(["run", "--resume", str(run), "--redo", "report"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "the report stage wrote report/report.md, which" in x)
    assert line.startswith("warning: ") and "do not declare" in line
    st = json.loads((run / "manifest.json").read_text())["stages"]["report"]
    assert st["status"] == "done" and st["outputs_mismatch"] == line.removeprefix("warning: ")
    never = (*report.outputs, Output("report/never.md"))
    monkeypatch.setitem(STAGES, "report", dataclasses.replace(report, outputs=never))
    assert main(["run", "--resume", str(run), "--redo", "report"]) == 0
    assert "warning: the report stage finished without writing report/never.md" in capsys.readouterr().out


def test_readme_run_directory_table_names_every_declared_file():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## The run directory"):readme.index("## Hardening")]
    for name, stage in STAGES.items():
        for o in stage.outputs:
            assert o.path.rsplit("/", 1)[-1] in table, (name, o.path)  # the declaration, as the README spells it


def test_two_redos_of_a_stage_within_one_second_keep_both_superseded_outputs(finished, tmp_path, monkeypatch):
    import shutil

    import pipeline.runner as runner_mod

    run = tmp_path / "r"
    shutil.copytree(finished, run)
    monkeypatch.setattr(runner_mod.time, "strftime", lambda fmt, *a: "20260101-000000")  # the same second, twice
    assert main(["run", "--resume", str(run), "--redo", "report"]) == 0
    assert main(["run", "--resume", str(run), "--redo", "report"]) == 0
    kept = sorted(p.name for p in (run / "superseded").iterdir())
    assert kept == ["report-20260101-000000", "report-20260101-000000-1"], kept
    assert all((run / "superseded" / k / "report.md").exists() for k in kept)
