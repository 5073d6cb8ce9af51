"""The benchmark command at its tiny size: it runs every section end to end and writes well-formed results.
No timing is asserted (the machine is shared); only that every number is there and positive, and that a section
that cannot run here says why."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # child processes (the benchmark command)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--quick", "--sizes", "tiny", "--threads", "1", "--out-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "results-tiny.json").read_text()), (out / "RESULTS-tiny.md").read_text()


def _positive(summary):
    return summary["median"] > 0 and 0 < summary["min"] <= summary["median"] <= summary["max"]


def test_results_have_every_section_and_the_setup(tiny):
    res, _ = tiny
    assert res["profile"] == "tiny"
    assert set(res["sections"]) == {"op", "train", "inference", "e2e", "kernel", "gpu"}
    assert not any("error" in s for s in res["sections"].values())
    assert {"cpu", "cores_available", "torch_threads"} <= set(res["machine"])
    assert res["versions"]["torch"]
    assert {g["goal"].split(",")[0] for g in res["goals"]} >= {"memory saved for backward", "training epoch"}


def test_op_section(tiny):
    res, _ = tiny
    op = res["sections"]["op"]["results"][0]
    assert op["training_path"] in op["times_ms"]
    for name in ("gelu", "reference_erf_autograd", "expression_autograd", "lambda_gelu[eager]"):
        assert _positive(op["times_ms"][name]) and _positive(op["ratio_vs_gelu"][name])
    assert op["saved_bytes"]["gelu"] == 64 * 64 * 4
    assert op["extra_saved_bytes_vs_gelu"][op["training_path"]] == 4  # one float32 λ


def test_train_inference_and_e2e_sections(tiny):
    res, _ = tiny
    for t in res["sections"]["train"]["results"]:
        assert {"gelu", "relu", "lambda_gelu"} <= set(t["epoch_s"])
        assert all(_positive(s) for s in t["epoch_s"].values())
        assert all(_positive(s) for s in t["ratio_vs_gelu"].values())
    inf = res["sections"]["inference"]["result"]
    for name in ("swapped_relu", "gelu"):
        for prec in ("fp32", "int8"):
            assert _positive(inf["models"][name][prec]["batch1_ms"]) and _positive(inf["models"][name][prec]["batch256_ms"])
        assert _positive(inf["models"][name]["int8_speedup_batch256"])
    e2e = res["sections"]["e2e"]["result"]
    assert e2e["returncode"] == 0 and e2e["wall_s"] > 0
    assert {"train", "harden", "swap"} <= set(e2e["stages"])
    assert all(s["seconds"] >= 0 and s["status"] == "done" for s in e2e["stages"].values())


def test_gpu_section_skips_with_a_reason_or_has_numbers(tiny):
    res, _ = tiny
    gpu = res["sections"]["gpu"]
    if torch.cuda.is_available():  # the benchmark's child process sees the same devices
        assert "skipped" not in gpu and gpu["device"] and gpu["op"]
        assert all(_positive(t) for r in gpu["op"] for t in r["times_ms"].values())
    else:
        assert set(gpu) - {"meta"} == {"skipped"} and gpu["skipped"].startswith("no CUDA device") and "--only gpu" in gpu["skipped"]


def test_markdown_report(tiny):
    _, md = tiny
    for heading in ("## Goals", "## 1. Activation op", "## 2. Training epoch", "## 3. Inference", "## 4. End to end",
                    "## 5. Fused CPU kernel", "## 6. GPU"):
        assert heading in md


def test_kernel_section_report_states_the_payback():
    # The tiny profile skips the build (a minute); the section's numbers in, its sentence out.
    from benchmarks import report

    run = {"command": "pipeline run", "returncode": 0, "stages": {"train": {"seconds": 20.0, "threads": 2},
                                                                  "harden": {"seconds": 60.0, "threads": 2}},
           "load_before": [1.0], "load_after": [1.0], "wall_s": 90.0}
    sec = {"result": {"build": {"command": "python -m pipeline.kernels.cpu", "returncode": 0, "wall_s": 60.0,
                                "load_before": [1.0], "load_after": [1.0]},
                      "runs": {"cpp, built": [run], "eager": [{**run, "wall_s": 120.0}]},
                      "median_wall_s": {"cpp, built": 90.0, "eager": 120.0},
                      "saved_per_run_s": 30.0, "runs_to_pay_back": 2.0}}
    text = "\n".join(report._kernel(sec))
    assert "saves 30.0 s per run" in text and "costs 60.0 s once, paid back after 2.0 runs" in text
    sec["result"].update(saved_per_run_s=-5.0, runs_to_pay_back=None)
    assert "it never pays back on this job" in "\n".join(report._kernel(sec))
