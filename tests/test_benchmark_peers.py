"""The side-by-side's own checks: a peer's witness re-checked in onnxruntime, how a peer's answer is scored
against the limit, and the residual stand-in's graph (what the verification reader must learn to read)."""

import json

import numpy as np
import pytest
import torch
from torch import nn

from analysis.verification.problem import BOX_TOL
from analysis.verification.vnnlib import format_witness, robustness_spec, write_vnnlib
from benchmarks.peers.run_neuralsat import check_witness, scored
from benchmarks.standins import OPSET, ResNet2b
from quantize.export import save, to_onnx

pytestmark = pytest.mark.usefixtures("one_thread")

# float32 inference of a 2x2 layer against the float64 closed form
MARGIN_TOL = 1e-6


@pytest.fixture(scope="module")
def linear(tmp_path_factory):
    """y = W x + b with W = [[1, 0], [0, 2]], b = [0, -0.5]: class 0 is safe at x = (1, 0.2) within eps 0.1,
    and x = (0.5, 0.5) has y = (0.5, 0.5), class 1 tied with class 0 (unsafe: Y_1 >= Y_0)."""
    d = tmp_path_factory.mktemp("peer")
    model = nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
        model.bias.copy_(torch.tensor([0.0, -0.5]))
    proto, _ = to_onnx(model, torch.zeros(1, 2), OPSET, simplify=False, dynamic_batch=False)
    save(proto, d / "lin.onnx")
    return d, model


def _witness(d, x, y):
    path = d / "w.counterexample"
    path.write_text(format_witness(np.asarray(x), np.asarray(y)))
    return path


def test_a_point_in_the_unsafe_set_is_a_valid_witness(linear):
    d, _ = linear
    spec = robustness_spec(np.array([0.5, 0.5]), 0.25, 0.0, 1.0, 0, 2)
    write_vnnlib(d / "p.vnnlib", spec)
    x = np.array([0.5, 0.5])  # y = (0.5, 0.5): Y_1 >= Y_0 holds with equality, margin 0
    res = check_witness(d / "lin.onnx", d / "p.vnnlib", _witness(d, x, [0.5, 0.5]))
    assert res["valid"]
    assert res["unsafe_margin"] == pytest.approx(0.0, abs=MARGIN_TOL)
    assert res["box_excess"] == 0.0
    assert res["y_diff"] == pytest.approx(0.0, abs=MARGIN_TOL)


def test_a_safe_point_or_one_outside_the_box_is_not(linear):
    d, _ = linear
    spec = robustness_spec(np.array([1.0, 0.2]), 0.1, 0.0, 1.0, 0, 2)
    write_vnnlib(d / "q.vnnlib", spec)
    safe = np.array([1.0, 0.2])  # y = (1, -0.1): margin y0 - y1 = 1.1 > 0
    res = check_witness(d / "lin.onnx", d / "q.vnnlib", _witness(d, safe, [1.0, -0.1]))
    assert not res["valid"]
    assert res["unsafe_margin"] == pytest.approx(1.1, abs=MARGIN_TOL)
    outside = np.array([1.0, 0.2 + 0.1 + 100 * BOX_TOL])
    res = check_witness(d / "lin.onnx", d / "q.vnnlib", _witness(d, outside, [1.0, 0.1]))
    assert not res["valid"]
    assert res["box_excess"] == pytest.approx(100 * BOX_TOL, rel=1e-3)


def _row(answer, own, wall, limit=30.0, killed=False):
    return {"answer": answer, "self_reported_seconds": own, "wall": wall, "limit": limit, "killed": killed}


def test_scoring_counts_an_answer_only_within_the_limit():
    assert scored(_row("unsat", 12.0, 16.0)) == "unsat"  # start-up (wall - own) is not counted
    assert scored(_row("sat", 30.5, 35.0)) == "timeout"
    assert scored(_row("timeout", 30.1, 34.0)) == "timeout"
    assert scored(_row(None, None, 60.0, killed=True)) == "timeout"
    assert scored(_row(None, None, 3.0)) == "error"
    assert scored(_row("invalid_counterexample", 2.0, 6.0)) == "error"


def test_the_residual_standin_exports_residual_adds_and_strided_padded_convs(tmp_path):
    model = ResNet2b().eval()
    proto, _ = to_onnx(model, torch.zeros(1, 1, 28, 28), OPSET, simplify=True, dynamic_batch=False)
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("Add") == 2 and "BatchNormalization" not in ops  # BatchNorm folded into the convs
    convs = [n for n in proto.graph.node if n.op_type == "Conv"]
    attrs = [{a.name: list(a.ints) for a in n.attribute} for n in convs]
    assert any(a.get("strides") == [2, 2] and a.get("pads") == [1, 1, 1, 1] for a in attrs)
    assert {"Flatten", "Gemm", "Relu"} <= set(ops)


def test_the_conv_folder_gathers_only_the_float_relu_instances_of_each_run(tmp_path):
    # two runs' verify/ folders, each with a float ReLU and an int8 network: only the float ones are gathered, each
    # file named after its run, and instances.csv lists them with the limit given
    from analysis.verification.vnnlib import read_instances_csv, write_instances_csv
    from benchmarks.peers.side_by_side import gather

    runs = {}
    for name in ("a", "b"):
        verify = tmp_path / name / "verify"
        for rel in ("onnx/v.onnx", "onnx/v-int8.onnx", "vnnlib/v_0.vnnlib", "vnnlib/v-int8_0.vnnlib"):
            (verify / rel).parent.mkdir(parents=True, exist_ok=True)
            (verify / rel).write_text(f"{name}:{rel}")
        write_instances_csv(verify / "instances.csv", [("onnx/v.onnx", "vnnlib/v_0.vnnlib", 1.0),
                                                       ("onnx/v-int8.onnx", "vnnlib/v-int8_0.vnnlib", 1.0)])
        (verify / "summary.json").write_text(json.dumps({"models": {
            "v": {"onnx": "onnx/v.onnx", "network": "relu"}, "v-int8": {"onnx": "onnx/v-int8.onnx", "network": "int8"},
            "w": {"onnx": None, "note": "not verified"}}}))
        runs[name] = tmp_path / name
    out = tmp_path / "folder"
    gather(runs, out, 30.0)
    assert read_instances_csv(out / "instances.csv") == [("onnx/a-v.onnx", "vnnlib/a-v_0.vnnlib", 30.0),
                                                         ("onnx/b-v.onnx", "vnnlib/b-v_0.vnnlib", 30.0)]
    assert (out / "onnx" / "b-v.onnx").read_text() == "b:onnx/v.onnx"
    assert sorted(p.name for p in (out / "onnx").iterdir()) == ["a-v.onnx", "b-v.onnx"]


# timm's forward (float32) against the plain copy's, same weights: a few float32 ulps of the logits
PLAIN_VIT_TOL = 1e-5


@pytest.mark.parametrize("heads, img", [(2, 16), (4, 8)])
def test_the_plain_vit_is_timms_vit_with_its_weights(heads, img):
    """What `crown_vit.py` compares rests on this: the peer bounds `PlainViT` loaded with the timm model's state_dict
    (strict), and it computes timm's function (unfused attention, class token, final norm, head)."""
    from benchmarks.peers.plain_vit import PlainViT
    from benchmarks.vit64 import timm_vit

    from pipeline.extras import import_timm

    try:
        import_timm()  # with its torchvision repair, where the CUDA torchvision meets the CPU torch
    except ImportError as exc:  # the models extra is not installed
        pytest.skip(str(exc))
    arch = dict(img=img, patch=4, chans=3, dim=16, depth=2, heads=heads, classes=10)
    model = timm_vit(**arch)
    with torch.no_grad():  # trained-sized positions and class token, not the init's zeros
        model.pos_embed.normal_(0, 0.5)
        model.cls_token.normal_(0, 0.5)
    plain = PlainViT(**arch).eval()
    plain.load_state_dict(model.state_dict())
    x = torch.rand(4, 3, img, img, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(plain(x), model(x), atol=PLAIN_VIT_TOL, rtol=0)


def test_a_pass_past_its_limit_is_killed_and_said(tmp_path):
    import sys

    from benchmarks.peers.crown_vit import run_limited

    out = run_limited([sys.executable, "-c", "import time; time.sleep(30)"], {}, 0.5, tmp_path / "log.txt")
    assert out["ended"].startswith("killed at the"), out
    assert out["wall_s"] < 10
    done = run_limited([sys.executable, "-c", "print('x')"], {}, 30, tmp_path / "log2.txt")
    assert done["ended"] == "ok" and done["peak_rss_mib"] > 0
    failed = run_limited([sys.executable, "-c", "raise SystemExit('error: no model')"], {}, 30, tmp_path / "log3.txt")
    assert failed["ended"] == "exit 1: error: no model"


def test_lirpa_downstream_runs_alpha_crown_only_where_crown_left_a_correctly_classified_sample(monkeypatch):
    """The auto_LiRPA peer's α-CROWN step, with auto_LiRPA's bounds replaced by the closed form of a linear network
    (exact lower margins; "CROWN" looser by LOOSE): CROWN-certified samples count for α-CROWN, a sample misclassified
    at its box's centre is never sent, each other sample is sent alone, and the driver's record turns the flags into
    fractions."""
    from benchmarks.peers import lirpa_downstream_peer as peer
    from benchmarks.peers.lirpa_downstream import record

    loose = 0.3
    net = nn.Linear(2, 3)  # y = (x0, x1, 0.5): class 0's margins are x0 - x1 and x0 - 0.5
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]))
        net.bias.copy_(torch.tensor([0.0, 0.0, 0.5]))
    # exact lower margins at radius 0.1: A 0.4 (CROWN 0.1), B 0.15 (CROWN -0.15), C -0.3 (centre margin -0.2),
    # D -0.05 (centre margins 0.55, 0.05)
    centres = torch.tensor([[1.0, 0.0], [0.75, 0.3], [0.3, 0.0], [0.55, 0.0]])
    lo, hi = centres - 0.1, centres + 0.1
    C = torch.tensor([[[1.0, -1.0, 0.0], [1.0, 0.0, -1.0]]]).repeat(4, 1, 1)
    calls = []

    def closed_form(net_, lo_, hi_, C_, method):
        A = C_.double() @ net_.weight.double()  # samples × margins × inputs
        mid, rad = ((lo_ + hi_) / 2).double(), ((hi_ - lo_) / 2).double()
        exact = (torch.einsum("sji,si->sj", A, mid) - torch.einsum("sji,si->sj", A.abs(), rad)
                 + C_.double() @ net_.bias.double())
        calls.append((method, [round(v, 6) for v in mid[:, 0].tolist()]))
        return exact - (loose if method == "CROWN" else 0.0), 0.0, None

    monkeypatch.setattr(peer, "bounds", closed_form)
    monkeypatch.setattr(peer, "unstable", lambda bounded, n: [3] * n)
    res = peer.one_eps(net, lo, hi, C, 0.1)
    assert res["crown_certified"] == [1, 0, 0, 0]
    assert res["alpha_crown_certified"] == [1, 1, 0, 0]
    assert calls == [("CROWN", [1.0, 0.75, 0.3, 0.55]), ("alpha-CROWN", [0.75]), ("alpha-CROWN", [0.55])]
    out = record({"version": "v", "rows": [{"name": "relu", "eps": [res]}]}, {"samples": 4})
    row = out["variants"]["relu"][0]
    assert (row["crown_certified"], row["alpha_crown_certified"], row["alpha_crown_samples"]) == (0.25, 0.5, 2)
    assert row["crown_unstable_mean"] == 3.0


def test_the_downstream_check_finds_a_linear_networks_least_margin_at_a_sampled_vertex(linear):
    # the soundness check behind lirpa_downstream_check.py: onnxruntime on the batch-1 file made batch-free, at
    # sampled vertices of the box; y0 - y1 = x0 - 2 x1 + 0.5 is least at the vertex x = (0.2, 0.1), where it is 0.5
    import onnxruntime as ort

    from benchmarks.peers.lirpa_downstream_check import batch_free, sampled_margins

    d, _ = linear
    session = ort.InferenceSession(batch_free(str(d / "lin.onnx")), providers=["CPUExecutionProvider"])
    least = sampled_margins(session, np.array([0.2, -0.3]), np.array([0.6, 0.1]), np.array([[1.0, -1.0]]), (2,), 200,
                            np.random.default_rng(0))
    assert least == pytest.approx([0.5], abs=MARGIN_TOL)


# What α,β-CROWN prints around its answer in single-instance mode (utils.Logger.summarize_results), abridged.
ABCROWN_TAIL = """Attack finished in 1.1519 seconds.
initial CROWN bounds (first 10 items): [10.158, 5.4005]
Verified with initial CROWN!
Result: {answer}
Time: {seconds}
"""
# A stand-in for α,β-CROWN's abcrown.py: prints that tail and writes its results file as α,β-CROWN does (a witness
# after "sat"), its answer, own seconds, witness and a sleep before all that read from the environment;
# ABCROWN_FAKE_ANSWER=none writes no results file.
FAKE_ABCROWN = '''import os, sys, time
args = sys.argv[1:]
time.sleep(float(os.environ["ABCROWN_FAKE_SLEEP"]))
answer, seconds = os.environ["ABCROWN_FAKE_ANSWER"], os.environ["ABCROWN_FAKE_SECONDS"]
assert args[args.index("--device") + 1] == "cpu" and os.environ["OMP_NUM_THREADS"] == "1"
print(open(os.environ["ABCROWN_FAKE_TAIL"]).read().format(answer=answer, seconds=seconds))
if answer != "none":
    with open(args[args.index("--results_file") + 1], "w") as f:
        f.write(answer + ("\\n" + os.environ["ABCROWN_FAKE_CEX"] if answer == "sat" else ""))
'''


def test_abcrowns_output_becomes_the_row_it_means():
    from benchmarks.peers.abcrown_vnncomp import parse_output

    out = ABCROWN_TAIL.format(answer="unsat", seconds="1.5590438842773438")
    assert parse_output(out, "unsat") == ("unsat", 1.5590438842773438, None)
    cex = "((X_0 0.5)\n (X_1 0.5)\n (Y_0 0.5)\n (Y_1 0.5))"
    answer, seconds, witness = parse_output(ABCROWN_TAIL.format(answer="sat", seconds="2.25"), "sat\n" + cex)
    assert (answer, seconds) == ("sat", 2.25)
    assert witness == "sat\n" + cex + "\n"
    # killed before its answer: no results file and no Time line
    assert parse_output("Attack finished in 1.1519 seconds.\n", None) == (None, None, None)


@pytest.mark.parametrize("answer, seconds, sleep, expect", [
    ("sat", "2.25", 0, "sat"), ("unsat", "31.0", 0, "timeout"), ("timeout", "30.4", 0, "timeout"),
    ("none", "1.0", 0, "error"), ("unsat", "1.0", 5, "timeout")])
def test_a_fake_abcrown_run_becomes_a_vnncomp_results_row(linear, tmp_path, monkeypatch, answer, seconds, sleep, expect):
    from analysis.verification.vnncomp import read_results
    from benchmarks.peers import abcrown_vnncomp

    d, _ = linear
    (d / "instances.csv").write_text("lin.onnx,p.vnnlib,30\n")
    write_vnnlib(d / "p.vnnlib", robustness_spec(np.array([0.5, 0.5]), 0.25, 0.0, 1.0, 0, 2))
    src = tmp_path / "abcrown" / "src" / "complete_verifier"
    src.mkdir(parents=True)
    (src / "abcrown.py").write_text(FAKE_ABCROWN)
    (tmp_path / "tail.txt").write_text(ABCROWN_TAIL)
    cex = format_witness(np.array([0.5, 0.5]), np.array([0.5, 0.5])).removeprefix("sat\n")
    fake = {"ANSWER": answer, "SECONDS": seconds, "TAIL": str(tmp_path / "tail.txt"), "CEX": cex, "SLEEP": str(sleep)}
    for k, v in fake.items():
        monkeypatch.setenv(f"ABCROWN_FAKE_{k}", v)
    out = tmp_path / "res" / "abcrown.csv"
    limit = ["--timeout", "0.5", "--grace", "0.5"] if sleep else []  # the process is killed 1 s in, mid-sleep
    assert abcrown_vnncomp.main([str(d), "--out", str(out), "--dest", str(tmp_path / "abcrown"), "--config", "none",
                                 *limit]) == 0
    (row,) = read_results(out)
    assert (row["category"], row["onnx"], row["vnnlib"], row["result"]) == (d.name, "lin.onnx", "p.vnnlib", expect)
    assert row["prepare_time"] == 0.0
    record = json.loads(out.with_suffix(".json").read_text())["rows"][0]
    if sleep:
        assert record["killed"] and record["message"] == "killed after the grace period"
        assert row["run_time"] == pytest.approx(record["wall"], abs=1e-6)  # no clock of its own: the process's
    else:
        assert row["run_time"] == pytest.approx(float(seconds), abs=1e-6)  # its own clock, not the process's
    if answer == "none" and not sleep:
        assert record["message"] == "Time: 1.0"  # its last line of output
    if expect == "sat":
        assert record["witness_check"]["valid"]
        assert record["witness_check"]["unsafe_margin"] == pytest.approx(0.0, abs=MARGIN_TOL)


def test_published_answers_take_the_trusted_tools_and_refuse_a_contradiction(tmp_path):
    from benchmarks.peers.abcrown_compare import published_answers

    path = tmp_path / "published.csv"
    path.write_text("row,vnnlib,a-b-CROWN,ERAN,Debona\n0,a.vnnlib,UNSAT,timeout,violated\n1,b.vnnlib,timeout,violated,holds\n"
                    "2,c.vnnlib,timeout,unknown,holds\n")
    # Debona is not trusted: its 'violated' on a and 'holds' on c are not answers here
    assert published_answers(path, ["a-b-CROWN", "ERAN"]) == {"a.vnnlib": "unsat", "b.vnnlib": "sat"}
    with pytest.raises(ValueError, match="a.vnnlib"):
        published_answers(path, ["a-b-CROWN", "Debona"])


def test_each_family_gets_the_config_abcrowns_repository_gives_it():
    from benchmarks.peers.abcrown_vnncomp import DEFAULTS, default_config

    assert default_config("eran_sig", "nets/ffnnSIGMOID__Point_6x200.onnx") == "exp_configs/vnncomp21/eran_sigmoid.yaml"
    assert default_config("vit23", "onnx/ibp_3_3_8.onnx") == "exp_configs/vnncomp23/vit.yaml"
    assert default_config("metaroom", "onnx/4cnn_ry_117_19_no_custom_OP.onnx") == "exp_configs/vnncomp23/metaroom.yaml"
    assert default_config("dist_shift", "onnx/mnist_concat.onnx") == "exp_configs/vnncomp23/dist-shift.yaml"
    # a ReLU eran net and a family it has no config for run on its built-in defaults
    assert default_config("eran", "nets/ffnnRELU__Point_6x100.onnx") == str(DEFAULTS)
    assert default_config("mobilenet-relu6", "onnx/mobilenet_relu6_trained.onnx") == str(DEFAULTS)
