"""The VNN-COMP interface: a small generated benchmark folder (plain and gzipped files) through `main`,
results.csv and witnesses round-trip, and the one-line errors (malformed VNN-LIB, an unsupported ONNX op, a
missing file, a missing folder) with a non-zero exit."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import stat

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
from onnx import TensorProto, helper

from analysis.verification.readers import from_onnx
from analysis.verification.vnncomp import FIELDS, format_results, main, read_results, run_benchmark, witness_path
from analysis.verification.vnnlib import (parse_witness, read_vnnlib, write_instances_csv, write_robustness_benchmark)
from quantize.export import export_for_verifiers
from quantize.ort import forward_flat
from _onnx import make_model

TIMEOUT_S = 20


def _model(seed: int) -> nn.Module:
    """A random 16-12-12-3 ReLU MLP whose first layer is centred on the box [0, 1]^16, so that every class wins somewhere."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, 12), nn.ReLU(), nn.Linear(12, 3)).eval()
    with torch.no_grad():
        model[1].weight.mul_(4.0)
        model[1].bias.copy_(-0.5 * model[1].weight.sum(1))
    return model


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Two networks, robustness properties at a small and a large eps (so both answers occur), one gzipped pair."""
    root = tmp_path_factory.mktemp("bench")
    rng = np.random.default_rng(0)
    rows = []
    for seed in (0, 1):
        model = _model(seed)
        path = root / f"net{seed}.onnx"
        export_for_verifiers(model, (1, 4, 4), path, torch.rand(8, 1, 4, 4))
        xs = rng.uniform(0, 1, (3, 16))
        with torch.no_grad():
            labels = [int(v) for v in model(torch.as_tensor(xs, dtype=torch.float32).reshape(3, 1, 4, 4)).argmax(1)]
        for eps in (0.001, 0.5):
            rows += write_robustness_benchmark(root / "tmp", path, xs, labels, eps, 0.0, 1.0, 3, TIMEOUT_S, prefix=f"n{seed}")
    shutil.copytree(root / "tmp" / "vnnlib", root / "vnnlib")
    shutil.copytree(root / "tmp" / "onnx", root / "onnx")
    # gzip the second network and its properties
    for p in list((root / "onnx").glob("net1.onnx")) + list((root / "vnnlib").glob("n1_*.vnnlib")):
        with open(p, "rb") as src, gzip.open(p.with_name(p.name + ".gz"), "wb") as dst:
            dst.write(src.read())
        p.unlink()
    rows = [(o + ".gz" if "net1" in o else o, v + ".gz" if "/n1_" in v else v, t) for o, v, t in rows]
    write_instances_csv(root / "instances.csv", rows)
    return root, rows


def test_benchmark_folder_through_main(folder, tmp_path, capsys):
    root, rows = folder
    out = tmp_path / "results.csv"
    code = main([str(root), "--out", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert f"{len(rows)} instances: {len(rows)} decided" in printed.out
    got = read_results(out)
    assert [(r["onnx"], r["vnnlib"]) for r in got] == [(o, v) for o, v, _ in rows]
    assert {r["category"] for r in got} == {root.name}
    assert {r["result"] for r in got} == {"sat", "unsat"}
    assert all(0 <= r["run_time"] <= TIMEOUT_S + 1 and r["prepare_time"] >= 0 for r in got)
    assert out.stat().st_mode & stat.S_IROTH
    for r in got:
        w = witness_path(out, r["onnx"], r["vnnlib"])
        assert w.is_file() == (r["result"] == "sat")
        if r["result"] == "sat":
            text = w.read_text()
            assert text.startswith("sat\n((X_0 ")
            x, y = parse_witness(text)
            spec = read_vnnlib(root / r["vnnlib"])
            assert spec.in_box(x, 1e-6)
            onnx_path = root / r["onnx"]
            if onnx_path.suffix == ".gz":
                plain = tmp_path / "net.onnx"
                plain.write_bytes(gzip.decompress(onnx_path.read_bytes()))
                onnx_path = plain
            np.testing.assert_allclose(y, forward_flat(onnx_path, x), atol=1e-6)  # Y values are the model's
            assert spec.violation(y) <= 1e-5 * max(1.0, float(np.abs(y).max()))
        if r["vnnlib"].find("0.001") >= 0:
            assert r["result"] == "unsat"


def test_results_round_trip(tmp_path):
    rows = [{"category": "c", "onnx": "a.onnx", "vnnlib": "p.vnnlib", "prepare_time": 0.25, "result": "unsat", "run_time": 1.5},
            {"category": "c", "onnx": "a.onnx", "vnnlib": "q.vnnlib", "prepare_time": 0.0, "result": "timeout", "run_time": 60.0}]
    text = format_results(rows)
    assert text.splitlines()[0] == "c,a.onnx,p.vnnlib,0.250000,unsat,1.500000"
    (tmp_path / "r.csv").write_text(",".join(FIELDS) + "\n" + text)  # a header line is tolerated
    assert read_results(tmp_path / "r.csv") == rows


@pytest.fixture()
def small(tmp_path):
    path = tmp_path / "net.onnx"
    export_for_verifiers(_model(0), (1, 4, 4), path, torch.rand(8, 1, 4, 4))
    write_robustness_benchmark(tmp_path, path, np.full((1, 16), 0.5), [0], 0.01, 0.0, 1.0, 3, 5)
    return tmp_path


def _fails_one_line(root, capsys, match: str) -> None:
    code = main([str(root), "--out", str(root / "out.csv")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and match in err[0], err
    assert read_results(root / "out.csv")[0]["result"] == "error"


def test_malformed_vnnlib_is_one_line(small, capsys):
    (small / "vnnlib" / "prop_0_eps_0.01.vnnlib").write_text("(declare-const X_0 Real)\n(assert (<= X_0 1.0)")
    _fails_one_line(small, capsys, "malformed VNN-LIB: unbalanced '('")


def test_unsupported_onnx_op_is_one_line(small, capsys):
    graph = helper.make_graph([helper.make_node("Flatten", ["x"], ["f"]), helper.make_node("Hardmax", ["f"], ["y"], name="hm1")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])])
    onnx.save(make_model(graph, 17), small / "onnx" / "net.onnx")
    with pytest.raises(NotImplementedError):
        from_onnx(small / "onnx" / "net.onnx")
    _fails_one_line(small, capsys, "unsupported ONNX op Hardmax (node 'hm1'); the verifier reads")


def test_missing_file_is_one_line(small, capsys):
    (small / "onnx" / "net.onnx").unlink()
    _fails_one_line(small, capsys, "net.onnx is missing")


def test_unusable_folder_exits_2(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main([str(tmp_path)]) == 2
    assert "instances.csv is missing" in capsys.readouterr().err
    (tmp_path / "instances.csv").write_text("a.onnx,b.vnnlib,notanumber\n")
    assert main([str(tmp_path)]) == 2
    assert "is not a number" in capsys.readouterr().err
    assert main([str(tmp_path), "--verifier", "nope"]) == 2
    capsys.readouterr()


def test_a_device_that_is_not_there_exits_2_with_the_fix(small, capsys):
    assert main([str(small), "--device", "gpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--device 'gpu' is not a device; use auto, cpu, cuda or cuda:N" in err
    if not torch.cuda.is_available():
        assert main([str(small), "--device", "cuda"]) == 2
        assert "use --device cpu or --device auto" in capsys.readouterr().err
    assert not (small / "results.csv").exists()  # nothing solved, nothing written


def test_threads_set_the_one_process_run_and_a_clash_with_jobs_exits_2(small, capsys):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert main([str(small), "--threads", "1"]) == 0, capsys.readouterr().err
        assert torch.get_num_threads() == 1  # --jobs 1 solved in this process, on one thread
    finally:
        torch.set_num_threads(before)
    capsys.readouterr()
    for bad in (["--threads", "-1"], ["--jobs", "2", "--threads", "3"]):
        assert main([str(small), *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and f"error: --threads {bad[-1]}" in err and "with --jobs" in err


def test_timeout_override_and_rerun(small):
    rows = run_benchmark(small, small / "r.csv", timeout_override=0.0)
    assert rows[0]["result"] == "timeout"
    rows = run_benchmark(small, small / "r.csv", verifier="crown")
    assert rows[0]["result"] in ("unsat", "unknown") and rows[0]["stage"] == "crown"


# ---------------------------------------------------------------------------------------------
# graphs that are not a chain, shards, jobs


class _Residual(nn.Module):
    """Conv with padding and stride, BatchNorm, two residual blocks (one with a 1x1-conv shortcut), Flatten, Gemm."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 4, 3, stride=1, padding=1), nn.BatchNorm2d(4), nn.ReLU())
        self.b1 = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1))
        self.b2 = nn.Sequential(nn.Conv2d(4, 6, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(6, 6, 3, padding=1))
        self.short = nn.Conv2d(4, 6, 1, stride=2)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(6 * 2 * 2, 3))

    def forward(self, x):
        h = self.stem(x)
        h = torch.relu(h + self.b1(h))
        h = torch.relu(self.short(h) + self.b2(h))
        return self.head(h)


def _conv_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(),
                         nn.Flatten(), nn.Linear(4 * 2 * 2, 8), nn.ReLU(), nn.Linear(8, 3))


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """A residual and a conv network, 4 properties each at a small and a large eps."""
    root = tmp_path_factory.mktemp("graphs")
    rng = np.random.default_rng(2)
    rows = []
    for name, make in (("resnet", _Residual), ("cnn", _conv_net)):
        torch.manual_seed(3)
        model = make().eval()
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.running_var.uniform_(0.5, 2.0)
                    m.running_mean.normal_(0, 0.1)
        path = root / f"{name}.onnx"
        export_for_verifiers(model, (1, 4, 4), path, torch.rand(8, 1, 4, 4))
        xs = rng.uniform(0, 1, (2, 16))
        with torch.no_grad():
            labels = [int(v) for v in model(torch.as_tensor(xs, dtype=torch.float32).reshape(2, 1, 4, 4)).argmax(1)]
        for eps in (1e-4, 0.8):
            rows += write_robustness_benchmark(root, path, xs, labels, eps, 0.0, 1.0, 3, TIMEOUT_S, prefix=name)
    write_instances_csv(root / "instances.csv", rows)
    return root, rows


def test_residual_and_conv_onnx_go_through_vnncomp(graphs, tmp_path, capsys):
    root, rows = graphs
    assert any(n.op_type == "Add" and not any(i.startswith("onnx::") for i in n.input)
               for n in onnx.load(root / "onnx" / "resnet.onnx").graph.node)  # a residual Add of two tensors
    out = tmp_path / "results.csv"
    assert main([str(root), "--out", str(out)]) == 0, capsys.readouterr().err
    got = read_results(out)
    assert len(got) == len(rows) and {r["result"] for r in got} <= {"sat", "unsat"}
    rng = np.random.default_rng(0)
    for r in got:
        spec = read_vnnlib(root / r["vnnlib"])
        if "0.0001" in r["vnnlib"]:
            assert r["result"] == "unsat", r
        if r["result"] == "sat":
            x, y = parse_witness(witness_path(out, r["onnx"], r["vnnlib"]).read_text())
            got_y = forward_flat(root / r["onnx"], x)
            assert spec.in_box(x) and np.array_equal(y, got_y) and spec.violation(got_y) < 0
        else:  # no sampled point of the box contradicts the proof
            assert all(spec.violation(forward_flat(root / r["onnx"], x)) > 0 for x in rng.uniform(spec.lb, spec.ub, (300, 16)))
    assert {r["result"] for r in got} == {"sat", "unsat"}


def test_a_shard_pair_covers_the_folder_exactly_once_and_merges_back(graphs, tmp_path, capsys):
    root, rows = graphs
    whole = run_benchmark(root, tmp_path / "all.csv", jobs=1)
    parts = []
    for k in (0, 1):
        assert main([str(root), "--shard", f"{k}/2", "--out", str(tmp_path / f"s{k}.csv")]) == 0
        parts.append(read_results(tmp_path / f"s{k}.csv"))
    keys = [(r["onnx"], r["vnnlib"]) for p in parts for r in p]
    assert sorted(keys) == sorted((o, v) for o, v, _ in rows) and len(set(keys)) == len(keys)
    assert [(r["onnx"], r["vnnlib"]) for r in parts[0]] == [(o, v) for o, v, _ in rows[0::2]]
    assert main([str(root), "--merge", str(tmp_path / "s0.csv"), str(tmp_path / "s1.csv"), "--out", str(tmp_path / "m.csv")]) == 0
    merged = {(r["onnx"], r["vnnlib"]): r["result"] for r in read_results(tmp_path / "m.csv")}
    assert merged == {(r["onnx"], r["vnnlib"]): r["result"] for r in whole}
    for bad in ("2/2", "x", "1/0"):
        assert main([str(root), "--shard", bad]) == 2 and "must look like K/N" in capsys.readouterr().err


def test_pipeline_report_merges_a_folders_shard_results(graphs, tmp_path, capsys):
    import shutil

    from pipeline.cli import main as cli

    root, rows = graphs
    folder = tmp_path / "bench"
    shutil.copytree(root, folder)
    assert main([str(folder), "--shard", "0/2"]) == 0
    assert cli(["report", str(folder)]) == 2  # shard 1/2 missing: one line naming it, nothing merged
    assert "1/2 have no results yet" in capsys.readouterr().err and not (folder / "results.csv").exists()
    assert main([str(folder), "--shard", "1/2"]) == 0
    assert cli(["report", str(folder)]) == 0
    merged = read_results(folder / "results.csv")
    assert sorted((r["onnx"], r["vnnlib"]) for r in merged) == sorted((o, v) for o, v, _ in rows)


def test_jobs_give_the_answers_of_one_process_with_measured_prepare_times(graphs, tmp_path):
    root, rows = graphs
    one = run_benchmark(root, tmp_path / "one.csv", jobs=1)
    two = run_benchmark(root, tmp_path / "two.csv", jobs=2)
    assert [(r["onnx"], r["vnnlib"], r["result"]) for r in two] == [(r["onnx"], r["vnnlib"], r["result"]) for r in one]
    assert all(r["prepare_time"] > 0 for r in two)  # reading the graph and the property, starting onnxruntime


def test_input_count_mismatch_names_the_counts_and_files(small, capsys):
    (small / "vnnlib" / "prop_0_eps_0.01.vnnlib").write_text(
        "\n".join(f"(declare-const X_{i} Real)" for i in range(10)) + "\n(declare-const Y_0 Real)\n(declare-const Y_1 Real)\n"
        "(declare-const Y_2 Real)\n" + "\n".join(f"(assert (>= X_{i} 0.0))\n(assert (<= X_{i} 1.0))" for i in range(10))
        + "\n(assert (<= Y_0 Y_1))\n")
    _fails_one_line(small, capsys, "the network net.onnx takes 16 inputs and gives 3 outputs, but the property "
                                   "prop_0_eps_0.01.vnnlib has 10 inputs (X_i) and 3 outputs (Y_j)")


def test_the_gpu_script_runs_its_path_on_the_cpu(folder, tmp_path, capsys):
    """benchmarks/gpu_verify.py (what benchmarks/gpu_verify.sh runs on a GPU) with device=cpu: the run, the witness
    re-check in onnxruntime at tolerance 0, at most 8 files, the table last; a verdict against the reference is a wrong
    answer and fails the run."""
    from benchmarks import gpu_verify

    root, rows = folder
    out = tmp_path / "out"
    code = gpu_verify.main(["--folder", str(root), "--out", str(out), "--device", "cpu", "--timeout", "5", "--jobs", "1",
                            "--reference", str(tmp_path / "none.csv")])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert printed.rstrip().splitlines()[-1].startswith("| wall time |")
    assert f"| decided | {len(rows)}/{len(rows)}" in printed and "| wrong answers | 0 " in printed
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and {p.name for p in files} >= {"results.csv", "instances.json", "summary.md", "device.txt",
                                                           "witnesses.tar.gz"}
    got = json.loads((out / "instances.json").read_text())["instances"]
    sats = [r for r in got if r["result"] == "sat"]
    assert sats and all(r["witness"]["valid"] and r["witness"]["unsafe_margin"] < 0 for r in sats)
    flipped = {(r["onnx"], r["vnnlib"]): ("unsat" if r["result"] == "sat" else "sat") for r in got[:1]}
    _, summary = gpu_verify.table(got, flipped, 1.0, 5.0, "cpu", 1)
    assert summary["wrong"] == 1 and summary["contradictions"][0][:2] == (got[0]["onnx"], got[0]["vnnlib"])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_benchmark_folder_on_the_gpu_gives_the_cpus_verdicts(folder, tmp_path):
    """Two worker processes sharing the GPU answer every instance as the CPU does; the witnesses are the model's."""
    root, rows = folder
    cpu = run_benchmark(root, tmp_path / "cpu.csv", jobs=1, device="cpu")
    gpu = run_benchmark(root, tmp_path / "gpu.csv", jobs=2, device="cuda")
    assert [r["result"] for r in gpu] == [r["result"] for r in cpu]
    assert all(witness_path(tmp_path / "gpu.csv", r["onnx"], r["vnnlib"]).is_file() == (r["result"] == "sat") for r in gpu)


def test_instances_whose_limit_cannot_cover_one_bound_pass_are_named_with_the_limit_that_would(folder, tmp_path,
                                                                                               monkeypatch):
    """One CROWN pass made to take 0.3 s (looking at its budget as the real one does) under a 0.4 s limit: the note
    names each network and the --timeout that would cover its pass; rows keep VNN-COMP's words and say why in `reason`,
    and no instance runs past its limit by more than a second."""
    import time

    from analysis.verification.bounds import Bounder

    real = Bounder.crown

    def slow(b):
        end = time.perf_counter() + 0.3
        while time.perf_counter() < end:
            if b.expired():
                return
            time.sleep(0.005)
        real(b)

    monkeypatch.setattr(Bounder, "crown", slow)
    root, _ = folder
    notes = []
    rows = run_benchmark(root, tmp_path / "r.csv", timeout_override=0.4, note=notes.append)
    assert len(notes) == 2 and all(n.startswith("--timeout 0.4 cannot cover") for n in notes), notes
    assert all(re.search(r"--timeout 1( or more)? would cover it", n) for n in notes), notes
    assert {"onnx/net0.onnx", "onnx/net1.onnx.gz"} == {re.search(r" s on (\S+) \(", n).group(1) for n in notes}
    assert all(r["result"] in ("sat", "unsat", "timeout") and r["run_time"] <= 0.4 + 1.0 for r in rows)
    assert any(r["reason"] == "budget" for r in rows)
    assert {r["result"] for r in read_results(tmp_path / "r.csv")} <= {"sat", "unsat", "timeout"}
