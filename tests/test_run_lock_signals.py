"""One process per run directory, signals that unwind like Ctrl-C, and folders that cannot be written.

Each defect is reproduced with a real `pipeline run` child process (tests/_held_run.py) on sklearn digits
with the tiny config, stopped or signalled right after a chosen epoch's checkpoint.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.cli import main

ROOT = Path(__file__).resolve().parent.parent
TINY = ["-c", str(ROOT / "configs" / "digits-tiny.toml")]
FAST = ["stages=train,harden,swap"]
WAIT_S = 120  # for a child to reach its epoch (import and data load take seconds on a busy machine)


def _child(out: Path, name: str, at: str, action: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "tests" / "_held_run.py"), at, action, *TINY, *FAST,
                             f"out_dir={out}", f"name={name}"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)


def _manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


def _swap(run: Path) -> dict:
    return json.loads((run / "swap" / "swap.json").read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref")
    assert main(["run", *TINY, *FAST, f"out_dir={out}", "name=ref"]) == 0
    return out / "ref"


# 1. A run directory is held by one process ----------------------------------------------------------


def test_a_second_process_is_refused_with_the_first_ones_pid_and_a_killed_holder_blocks_nothing(tmp_path, capsys, reference):
    child = _child(tmp_path, "r", "lambda_gelu:2", "pause")
    try:
        deadline = time.time() + WAIT_S
        while not (tmp_path / "PAUSED").exists():
            assert child.poll() is None and time.time() < deadline, child.communicate()
            time.sleep(0.1)
        run = tmp_path / "r"
        before = (run / "config.json").read_bytes(), (run / "manifest.json").read_bytes()
        for args in (["--resume", str(run)], ["--resume", str(run), "--redo", "train"],
                     [*TINY, *FAST, f"out_dir={tmp_path}", "name=r"]):  # the same name and config reopens the run
            assert main(["run", *args]) == 2
            err = capsys.readouterr().err
            assert f"pid {child.pid}" in err and "in use" in err and err.count("\n") == 1, err
        assert ((run / "config.json").read_bytes(), (run / "manifest.json").read_bytes()) == before
    finally:
        child.kill()  # SIGKILL: no clean-up runs, the kernel drops its lock
        child.communicate()
    assert main(["run", "--resume", str(run)]) == 0
    assert _swap(run) == _swap(reference)


# 2. SIGTERM unwinds like Ctrl-C; both name the real run directory -----------------------------------


@pytest.mark.parametrize("sig,code", [("TERM", 143), ("INT", 130)])
def test_a_signal_marks_the_stage_interrupted_and_says_how_to_resume(tmp_path, reference, sig, code):
    child = _child(tmp_path, "s", "lambda_gelu:1", sig)
    _, err = child.communicate(timeout=WAIT_S)
    run = tmp_path / "s"
    assert child.returncode == code, err
    last = err.strip().splitlines()[-1]
    assert f"`pipeline run --resume {run}`" in last and "<run dir>" not in last, last
    train = _manifest(run)["stages"]["train"]
    assert train["status"] == "interrupted", train
    assert main(["run", "--resume", str(run)]) == 0
    assert _swap(run) == _swap(reference)


# 3. A folder that cannot be written is a one-line error (exit 2) -------------------------------------


def _obey_permissions() -> None:
    """Root ignores permission bits (CAP_DAC_OVERRIDE): a child that drops the capability from its bounding
    set, which exec keeps, obeys them like any other user."""
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
            if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def _read_only(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        p.chmod(stat.S_IMODE(p.stat().st_mode) & ~0o222)


def _restore(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        p.chmod(stat.S_IMODE(p.stat().st_mode) | 0o200)


def _unprivileged_run(*args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-m", "pipeline.cli", "run", *args], cwd=ROOT, capture_output=True, text=True,
                              preexec_fn=_obey_permissions, timeout=WAIT_S)
    except subprocess.SubprocessError as exc:  # a container without CAP_SETPCAP cannot drop it
        pytest.skip(f"cannot run a child that obeys permission bits here: {exc}")


def test_a_read_only_out_dir_is_one_line_and_exit_2(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    _read_only(ro)
    try:  # an existing folder (creating it is no write, so a probe file tells)
        done = _unprivileged_run(*TINY, *FAST, f"out_dir={ro}", "name=x")
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"error: cannot create a run directory in {ro}") and done.stderr.count("\n") == 1
    finally:
        _restore(ro)


def test_resuming_a_read_only_run_directory_is_one_line_and_exit_2(tmp_path, reference):
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(reference, run)
    _read_only(run)
    try:
        done = _unprivileged_run("--resume", str(run), "--redo", "swap")
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"error: cannot write to {run}") and done.stderr.count("\n") == 1
    finally:
        _restore(run)
    assert _manifest(run) == _manifest(reference) | {"name": _manifest(run)["name"]}  # nothing was written


def test_an_os_error_the_user_can_fix_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    from pipeline import runner

    def read_only(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "x" / "report.md"))

    monkeypatch.setattr(runner, "run_pipeline", read_only)
    assert main(["run", *TINY, f"out_dir={tmp_path}", "name=x"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {tmp_path / 'x' / 'report.md'}: Read-only file system; use a writable folder\n"
