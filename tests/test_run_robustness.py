"""A run directory that cannot be corrupted: each defect a trial of the README found, as a test.

Runs go through `pipeline run` (the CLI's main) on sklearn digits with the tiny config, train/harden/swap only,
so each takes a second or two; kills are SIGKILLs at a chosen epoch (PIPELINE_KILL_AFTER) in a child process.
The tests that start child processes are marked slow (`pytest -m slow`); the fast suite keeps the in-process ones.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import checkpoint
from pipeline.cli import main
from pipeline.atomic_io import FILE_MODE
from pipeline.rundir import sha256

ROOT = Path(__file__).resolve().parent.parent
TINY = ["-c", str(ROOT / "configs" / "digits-tiny.toml")]
FAST = ["stages=train,harden,swap"]


def _run(*args: str) -> int:
    return main(["run", *TINY, *FAST, *args])


def _killed_run(out: Path, name: str, kill_after: str, *overrides: str) -> Path:
    """A run SIGKILLed right after the checkpoint of `kill_after` (variant:epoch), in a child process."""
    code = subprocess.run([sys.executable, "-m", "pipeline.cli", "run", *TINY, *FAST, f"out_dir={out}", f"name={name}",
                           *overrides], env={**os.environ, "PIPELINE_KILL_AFTER": kill_after}, cwd=ROOT,
                          capture_output=True, text=True).returncode
    assert code == -9, code
    return out / name


def _swap(run: Path) -> dict:
    return json.loads((run / "swap" / "swap.json").read_text())


def _lambda_epochs(run: Path) -> list[int]:
    import csv

    with open(run / "train" / "metrics.csv") as f:
        return [int(r["epoch"]) for r in csv.DictReader(f) if r["variant"] == "lambda_gelu"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref")
    assert _run(f"out_dir={out}", "name=ref", "train.epochs=16") == 0
    return out / "ref"


# 1. Following the tool's own advice must not corrupt a run --------------------------------------


@pytest.mark.slow  # child processes
@pytest.mark.parametrize("damage", ["truncate", "delete", "truncate_then_delete"])
def test_corrupt_or_missing_last_pt_during_harden_reruns_from_a_valid_state(tmp_path, reference, damage):
    run = _killed_run(tmp_path, "c", "lambda_gelu:6", "train.epochs=16")  # e_s = 4: killed during harden
    last = run / "train" / "lambda_gelu" / "last.pt"
    if damage.startswith("truncate"):
        with open(last, "r+b") as f:
            f.truncate(5000)
    if damage.endswith("delete"):  # "truncate_then_delete": what the old error message told users to do
        last.unlink()
    assert main(["run", "--resume", str(run)]) == 0
    # every epoch of the learn phase is there, once, and the results equal an uninterrupted run's
    assert _lambda_epochs(run) == list(range(1, 17))
    assert _swap(run) == _swap(reference)
    if damage == "truncate":
        assert list((run / "train" / "lambda_gelu").glob("last.pt.unusable-*")), "the damaged file is kept, set aside"


@pytest.mark.slow  # child processes
def test_no_valid_state_at_all_restarts_the_variant_from_epoch_1(tmp_path, reference):
    run = _killed_run(tmp_path, "c", "lambda_gelu:6", "train.epochs=16")
    for name in ("last.pt", "switch.pt"):
        (run / "train" / "lambda_gelu" / name).unlink()
    assert main(["run", "--resume", str(run)]) == 0
    assert _lambda_epochs(run) == list(range(1, 17))
    assert _swap(run) == _swap(reference)


def test_a_corrupt_checkpoint_in_a_later_stage_names_the_stage_that_wrote_it(tmp_path, capsys):
    assert _run(f"out_dir={tmp_path}", "name=r") == 0
    run = tmp_path / "r"
    (run / "train" / "gelu" / "best.pt").write_bytes(b"not a checkpoint")
    assert main(["run", "--resume", str(run), "--redo", "swap"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--redo harden" in err and "gelu/best.pt" in err


# 2. --resume with overrides checks before it writes ---------------------------------------------


def test_overrides_that_cannot_apply_to_a_finished_run_are_refused_and_nothing_is_written(tmp_path, capsys):
    assert _run(f"out_dir={tmp_path}", "name=r") == 0
    run = tmp_path / "r"
    before = (run / "config.json").read_bytes(), (run / "manifest.json").read_bytes()
    assert main(["run", "--resume", str(run), "train.epochs=20", "model.hidden=64,64"]) == 2
    err = capsys.readouterr().err
    assert "--redo train" in err and err.count("\n") == 1
    assert ((run / "config.json").read_bytes(), (run / "manifest.json").read_bytes()) == before


@pytest.mark.slow  # child processes
def test_a_shape_change_on_an_interrupted_run_is_refused_and_a_plain_resume_still_works(tmp_path):
    run = _killed_run(tmp_path, "k", "gelu:3")  # killed during harden (T = 8, e_s = 2)
    cfg_before = (run / "config.json").read_bytes()
    assert main(["run", "--resume", str(run), "model.hidden=64,64"]) == 2
    assert (run / "config.json").read_bytes() == cfg_before
    assert main(["run", "--resume", str(run)]) == 0


@pytest.mark.slow  # child processes
def test_an_accepted_override_is_recorded_with_the_stage_it_takes_effect_from(tmp_path):
    run = _killed_run(tmp_path, "k", "gelu:1")  # killed in the train stage
    assert main(["run", "--resume", str(run), "train.lr=0.05"]) == 0
    m = json.loads((run / "manifest.json").read_text())
    assert m["resumed_with"][-1]["keys"] == [{"key": "train.lr", "from_stage": "train"}]
    assert json.loads((run / "config.json").read_text())["train"]["lr"] == 0.05


def test_redo_makes_a_refused_override_apply(tmp_path):
    assert _run(f"out_dir={tmp_path}", "name=r") == 0
    run = tmp_path / "r"
    assert main(["run", "--resume", str(run), "harden.select=last", "--redo", "harden"]) == 0
    assert json.loads((run / "config.json").read_text())["harden"]["select"] == "last"
    assert checkpoint.load_payload(run / "train" / "lambda_gelu" / "best.pt")["epoch"] == 8


# 3. Divergence is not success ---------------------------------------------------------------------


def test_divergence_at_lr_5_stops_with_the_epoch_and_the_fix(tmp_path, capsys):
    assert _run(f"out_dir={tmp_path}", "name=d", "train.lr=5", "variants=gelu") == 2
    err = capsys.readouterr().err
    assert "epoch 1" in err and "train.lr" in err and ("diverged" in err or "non-finite" in err)
    m = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert m["stages"]["train"]["status"] == "failed" and "swap" not in m["stages"]
    assert not (tmp_path / "d" / "train" / "gelu" / "last.pt").exists()  # no diverged state to resume from


def test_the_swap_stage_refuses_a_diverged_checkpoint(tmp_path, capsys):
    assert _run(f"out_dir={tmp_path}", "name=r", "variants=gelu") == 0
    best = tmp_path / "r" / "train" / "gelu" / "best.pt"
    payload = checkpoint.load_payload(best)
    payload["train_loss"] = 551.0  # what lr = 5 produced, with the divergence check switched off
    import torch

    torch.save(payload, best)
    assert main(["run", "--resume", str(tmp_path / "r"), "--redo", "swap"]) == 2
    assert "diverged" in capsys.readouterr().err


# 4. Errors before anything is created; one line each --------------------------------------------


@pytest.mark.parametrize("override,needle", [
    ("device=foo", "device='foo' is not a device"),
    ("device=cuda", "asked for CUDA but none is available"),
    ("data.root=/nonexistent", "not found"),
])
def test_bad_data_or_device_fail_before_the_run_folder_exists(tmp_path, capsys, override, needle):
    if override == "device=cuda":
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    args = [override] + (["data.name=adult"] if "data.root" in override else [])  # adult has no system copy
    assert _run(f"out_dir={tmp_path}", "name=x", *args) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
    assert not (tmp_path / "x").exists()


def test_yaml_errors_name_the_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  epochs: 3\n  lr: [1, 2\n")
    assert main(["run", "-c", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "at line 4" in err and err.count("\n") == 1


def test_unexpected_errors_are_one_line_and_debug_shows_the_traceback(tmp_path, capsys, monkeypatch):
    from pipeline import runner

    def boom(*a, **k):
        raise ValueError("injected\nsecond line")

    monkeypatch.setattr(runner, "run_pipeline", boom)
    assert _run(f"out_dir={tmp_path}", "name=e") == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ValueError: injected") and err.count("\n") == 1 and "--debug" in err
    with pytest.raises(ValueError):
        main(["--debug", "run", *TINY, f"out_dir={tmp_path}", "name=e2"])


def _create(args):
    out, barrier = args
    from pipeline import config as config_mod
    from pipeline.rundir import RunDir

    barrier.wait()
    return str(RunDir.create(config_mod.load(ROOT / "configs" / "digits-tiny.toml", [f"out_dir={out}"])).path)


def test_concurrent_creation_gets_distinct_run_directories(tmp_path):
    n = 6
    with mp.Manager() as manager:
        barrier = manager.Barrier(n)
        with mp.get_context("spawn").Pool(n) as pool:
            paths = pool.map(_create, [(str(tmp_path), barrier)] * n)
    assert len(set(paths)) == n and all((Path(p) / "config.json").is_file() for p in paths)


# 5. Files readable by others; 6. a manifest whose hashes stay true; reproducible bytes -----------


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fin")
    assert main(["run", *TINY, f"out_dir={out}", "name=f", "stages=train,harden,check,swap,export,sparsity,report"]) == 0
    return out / "f"


def test_every_file_gets_the_users_umask_like_open(finished):
    modes = {str(p.relative_to(finished)): stat.S_IMODE(p.stat().st_mode) for p in finished.rglob("*") if p.is_file()}
    assert modes and set(modes.values()) == {FILE_MODE}, {k: oct(v) for k, v in modes.items() if v != FILE_MODE}


def test_every_hash_in_the_manifest_is_true_after_later_stages_rewrote_files(finished):
    m = json.loads((finished / "manifest.json").read_text())
    listed = {rel: h for st in m["stages"].values() for rel, h in st.get("outputs", {}).items()}
    assert listed and all(sha256(finished / rel) == h for rel, h in listed.items())
    train, harden = m["stages"]["train"], m["stages"]["harden"]
    assert train["rewritten_by"]["train/lambda_gelu/last.pt"] == "harden"  # train's own record moved aside
    assert "train/lambda_gelu/switch.pt" in train["outputs"] and "train/lambda_gelu/last.pt" in harden["outputs"]


def test_two_identical_runs_in_two_processes_write_identical_checkpoint_bytes(tmp_path):
    # This process and a child, so anything process-specific that reaches the files (a pid in a temp name,
    # which torch.save records in every zip entry name) shows up as a difference.
    args = [*TINY, "stages=train,harden", "train.epochs=4", f"out_dir={tmp_path}"]
    assert main(["run", *args, "name=a"]) == 0
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "run", *args, "name=b"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    files = [p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.pt")]
    assert len(files) >= 8
    for rel in files:
        assert sha256(tmp_path / "a" / rel) == sha256(tmp_path / "b" / rel), rel


# 8. Progress reaches a log file -------------------------------------------------------------------


@pytest.mark.slow  # child processes
def test_progress_lines_go_to_a_redirected_log(tmp_path):
    log = subprocess.run([sys.executable, "-m", "pipeline.cli", "run", *TINY, *FAST, f"out_dir={tmp_path}", "name=p"],
                         cwd=ROOT, capture_output=True, text=True)
    assert log.returncode == 0
    assert "lambda_gelu epoch 8/8 (anneal)" in log.stdout and "[harden] done in" in log.stdout


def test_auto_threads_leave_the_busy_cores_alone(monkeypatch):
    """threads=0 counts the cores other work keeps busy now (not the load average, which remembers a job that
    just ended): all cores when idle, one when a competitor fills every core."""
    from pipeline import cores as cores_mod

    cores = len(os.sched_getaffinity(0))
    monkeypatch.setattr(cores_mod, "busy_cores", lambda: 0.02)
    assert cores_mod.choose_threads(0) == cores and cores_mod.choose_threads(3) == 3
    monkeypatch.setattr(cores_mod, "busy_cores", lambda: float(cores))
    assert cores_mod.choose_threads(0) == 1
    monkeypatch.undo()  # the real sampler reads /proc/stat: a share of the machine's cores
    assert 0.0 <= cores_mod.busy_cores() <= (os.cpu_count() or 1) + 1e-9


def test_atomic_path_writes_under_the_destinations_own_name_and_leaves_nothing(tmp_path):
    from pipeline.atomic_io import atomic_path
    from pipeline.rundir import RunDir

    dest = tmp_path / "train" / "best.pt"
    with atomic_path(dest) as tmp:
        assert tmp.name == dest.name and tmp.parent.name.startswith(".")
        tmp.write_bytes(b"x")
        assert RunDir(tmp_path, None).snapshot("train") == {}  # a write under way is no output yet
    assert dest.read_bytes() == b"x" and [p.name for p in dest.parent.iterdir()] == ["best.pt"]
    with pytest.raises(RuntimeError), atomic_path(dest) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("writer failed")
    assert dest.read_bytes() == b"x" and [p.name for p in dest.parent.iterdir()] == ["best.pt"]
