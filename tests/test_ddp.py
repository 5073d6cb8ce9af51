"""DistributedDataParallel under torchrun: 2 CPU processes (gloo) on digits, against one process.

What can be asserted, and why:
- The ranks hold bitwise identical weights and λ: DDP starts them from rank 0's state and applies
  the same all-reduced gradient on each.
- Against one process with the same global batch: every rank takes half of each batch and the
  loss is scaled so DDP's gradient average *is* the single-process gradient. Only the order of
  the sums differs (half-batch sums, then an all-reduce). Both runs train in float64
  (train.precision=fp64), so that order costs ~1e-15 per step and stays far below DDP_VS_SINGLE_ATOL
  after 8 epochs of SGD with momentum on any CPU; in float32 the same comparison measures rounding
  noise that the CPU's vector width and thread count decide (2e-5 on 2 AVX2 cores, 1.1e-4 seen on a
  16-core AVX-512 machine), not the DDP semantics.
- Only rank 0 writes: a spy on the package's two write primitives logs every write per rank.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline import checkpoint
from pipeline.cli import main

pytestmark = pytest.mark.slow  # child processes (torchrun, 2 ranks)

ROOT = Path(__file__).resolve().parent.parent
TINY = ["-c", str(ROOT / "configs" / "digits-tiny.toml"), "stages=train,harden,swap", "variants=lambda_gelu,gelu,relu",
        "train.precision=fp64"]
DDP_VS_SINGLE_ATOL = 1e-9  # max |weight or λ difference| after 8 epochs, float64 sum order only
LAMBDA_RTOL = 1e-9  # λ per layer per epoch, DDP vs one process
LOSS_RTOL = 1e-9


def _torchrun(out: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "PIPELINE_KILL_AFTER"}}
    env["OMP_NUM_THREADS"] = "1"
    env["PIPELINE_DIST_BACKEND"] = "gloo"  # CPU even where a GPU exists
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "tests" / "_ddp_worker.py"), str(out), *overrides]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    p = _torchrun(out, *TINY, f"out_dir={out / 'runs'}", "name=ddp", "device=cpu")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert main(["run", *TINY, f"out_dir={out / 'runs'}", "name=single", "device=cpu"]) == 0
    return out


def _rows(run: Path) -> list[dict]:
    with open(run / "train" / "metrics.csv") as f:
        return list(csv.DictReader(f))


def test_ranks_hold_identical_weights_and_lambdas(runs):
    r0 = torch.load(runs / "rank0-state.pt")
    r1 = torch.load(runs / "rank1-state.pt")
    assert set(r0) == set(r1) == {"lambda_gelu", "gelu", "relu"}
    for variant in r0:
        assert r0[variant].keys() == r1[variant].keys()
        for name in r0[variant]:
            assert torch.equal(r0[variant][name], r1[variant][name]), f"{variant}.{name} differs between ranks"
    s = [k for k in r0["lambda_gelu"] if k.endswith(".s")]
    assert len(s) == 2  # both λ parameters travelled through DDP like any weight
    # What rank 0 holds in memory is what it wrote.
    last = checkpoint.load_payload(runs / "runs" / "ddp" / "train" / "lambda_gelu" / "last.pt")["state_dict"]
    assert all(torch.equal(last[k], r0["lambda_gelu"][k]) for k in last)


def test_only_rank_0_writes(runs):
    w0 = json.loads((runs / "rank0-writes.json").read_text())
    w1 = json.loads((runs / "rank1-writes.json").read_text())
    assert w0["code"] == 0 and w1["code"] == 0
    assert w1["writes"] == []
    written = {Path(p).relative_to(runs / "runs" / "ddp").as_posix() for p in w0["writes"]}
    assert {"config.json", "manifest.json", "train/metrics.csv", "train/lambda_gelu/best.pt", "train/lambda_gelu/switch.pt",
            "swap/swap.json"} <= written
    m = json.loads((runs / "runs" / "ddp" / "manifest.json").read_text())
    assert [m["stages"][s]["status"] for s in ("train", "harden", "swap")] == ["done"] * 3
    assert m["stages"]["train"]["metrics"]["world_size"] == 2


def test_ddp_matches_one_process_with_the_same_global_batch(runs):
    for variant in ("lambda_gelu", "gelu", "relu"):
        a = checkpoint.load_payload(runs / "runs" / "ddp" / "train" / variant / "last.pt")["state_dict"]
        b = checkpoint.load_payload(runs / "runs" / "single" / "train" / variant / "last.pt")["state_dict"]
        worst = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
        assert worst <= DDP_VS_SINGLE_ATOL, f"{variant}: max |DDP − single| = {worst:.3g}"
    ddp, single = _rows(runs / "runs" / "ddp"), _rows(runs / "runs" / "single")
    assert [(r["variant"], r["epoch"], r["phase"]) for r in ddp] == [(r["variant"], r["epoch"], r["phase"]) for r in single]
    for rd, rs in zip(ddp, single):
        assert rd["val_accuracy"] == rs["val_accuracy"]
        assert float(rd["train_loss"]) == pytest.approx(float(rs["train_loss"]), rel=LOSS_RTOL)
        for k in (k for k in rd if k.startswith("lambda_") and rd[k]):
            assert float(rd[k]) == pytest.approx(float(rs[k]), rel=LAMBDA_RTOL)
    sd = json.loads((runs / "runs" / "ddp" / "swap" / "swap.json").read_text())
    ss = json.loads((runs / "runs" / "single" / "swap" / "swap.json").read_text())
    assert sd.keys() == ss.keys()
    for v in sd:
        assert sd[v]["val_after"] == pytest.approx(ss[v]["val_after"], abs=1 / 144)  # at most one digit flips


def test_single_process_is_untouched_by_the_distributed_path(runs):
    """No process group in a plain run: nothing distributed is recorded."""
    m = json.loads((runs / "runs" / "single" / "manifest.json").read_text())
    assert "world_size" not in m["stages"]["train"]["metrics"]
    assert not torch.distributed.is_initialized()
