"""Sparsity: APoZ equals a brute-force count, pruning dead units is exact, the stage's artifacts."""

from __future__ import annotations

import copy

import csv
import json

import numpy as np
import pytest
import torch
from torch import nn

from analysis import sparsity as sp
from pipeline.stages import sparsity as sparsity_stage
from pipeline.activations import Gate, Linked
from pipeline.data import Split
from pipeline.config import GateConfig, ModelConfig
from pipeline.models import build_model, make_spec
from quantize import ort as ort_util

from _digits import digits, make_run, trained

PRUNE_ATOL = sp.PRUNE_ATOL  # 1e-6 on logits, float64
STREAM_BATCH = 7  # not a divisor of the split: the last batch is short


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def nets():
    cases = [("relu", "mlp"), ("relu", "cnn"), ("lambda_gelu", "mlp"), ("linked_relu", "mlp")]
    return {case: trained(*case, epochs=3) for case in cases}


def _kill(layer: nn.Module, units: list[int]) -> None:
    """Make units dead on every input: zero weights, negative bias."""
    with torch.no_grad():
        layer.weight[units] = 0.0
        layer.bias[units] = -1.0


def _brute_force(model: nn.Sequential, x: torch.Tensor) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per activation site: (count of exact-zero outputs, count of non-positive inputs) per unit, by explicit loops."""
    out = {}
    with torch.no_grad():
        h = x
        for name, m in model.named_children():
            pre = h
            h = m(h)
            if isinstance(m, Linked):  # CReLU: outputs (relu(z), relu(−z)) on the channel axis
                pre = torch.cat([pre, -pre], dim=1)
            if isinstance(m, (nn.ReLU, Gate, Linked)):
                a, z = h.numpy(), pre.numpy()
                units = a.shape[1]
                zeros, nonpos = np.zeros(units, int), np.zeros(units, int)
                for i in range(a.shape[0]):
                    for u in range(units):
                        zeros[u] += int(np.count_nonzero(a[i, u] == 0))
                        nonpos[u] += int(np.count_nonzero(z[i, u] <= 0))
                out[name] = (zeros, nonpos)
    return out


@pytest.mark.parametrize("case", [("relu", "mlp"), ("relu", "cnn"), ("lambda_gelu", "mlp"), ("linked_relu", "mlp")], ids="-".join)
def test_unit_stats_equal_a_brute_force_count(case, nets):
    model, _ = nets[case]
    split = digits().val
    stats = sp.unit_stats(model, split, STREAM_BATCH)
    brute = _brute_force(model, split.x)
    assert list(stats) == list(brute) == [n for n, _ in sp.activation_sites(model)]
    for name, (zeros, nonpos) in brute.items():
        assert np.array_equal(stats[name]["zero"].numpy(), zeros), name
        assert np.array_equal(stats[name]["nonpos"].numpy(), nonpos), name
        per_unit = stats[name]["positions"]
        assert sp.apoz(stats)[name] == pytest.approx(zeros / per_unit, abs=0)
        assert sp.nonpositive_fraction(stats)[name] == pytest.approx(nonpos / per_unit, abs=0)
        if case[0] != "lambda_gelu":  # a ReLU outputs 0 exactly where its input is <= 0
            assert np.array_equal(zeros, nonpos)
    if case[1] == "cnn":  # a channel counts every position: 8x8 after conv0, 4x4 after the strided conv1
        assert stats["act0"]["positions"] == len(split) * 64 and stats["act1"]["positions"] == len(split) * 16


def test_pruning_an_mlp_is_exact_and_drops_rows_and_columns(nets):
    model = copy.deepcopy(nets[("relu", "mlp")][0])
    _kill(model.fc0, [3, 10, 17])
    _kill(model.fc1, [0, 5])
    a = sp.apoz(sp.unit_stats(model, digits().val, STREAM_BATCH))
    assert all(a["act0"][[3, 10, 17]] == 1.0) and all(a["act1"][[0, 5]] == 1.0)
    dead = {"act0": np.isin(np.arange(64), [3, 10, 17]), "act1": np.isin(np.arange(32), [0, 5])}
    pruned, removed = sp.prune_dead(model, dead)
    assert removed == {"act0": 3, "act1": 2}
    assert pruned.fc0.weight.shape == (61, 64) and pruned.fc0.bias.shape == (61,)
    assert pruned.fc1.weight.shape == (30, 61) and pruned.head.weight.shape == (10, 30)
    keep0 = [u for u in range(64) if u not in (3, 10, 17)]
    assert torch.equal(pruned.fc1.weight[:, :], model.fc1.weight[[u for u in range(32) if u not in (0, 5)]][:, keep0])
    # These units are dead on every input (zero weights, negative bias): equal logits anywhere.
    x = torch.rand(256, 1, 8, 8)
    assert sp.max_logit_diff(model, pruned, Split(x, torch.zeros(256, dtype=torch.long)), 64, torch.float64)[0] <= PRUNE_ATOL


def test_pruning_a_cnn_drops_channels_and_flattened_columns(nets):
    model = copy.deepcopy(nets[("relu", "cnn")][0])
    _kill(model.conv0, [2])
    _kill(model.conv1, [5, 9])  # the last conv: its channels own 4x4 columns each of fc after Flatten
    _kill(model.fc, [4])
    dead = {"act0": np.isin(np.arange(8), [2]), "act1": np.isin(np.arange(16), [5, 9]), "act2": np.isin(np.arange(32), [4])}
    pruned, removed = sp.prune_dead(model, dead)
    assert removed == {"act0": 1, "act1": 2, "act2": 1}
    assert pruned.conv0.weight.shape == (7, 1, 3, 3) and pruned.conv1.weight.shape == (14, 7, 3, 3)
    assert pruned.fc.weight.shape == (31, 14 * 16) and pruned.head.weight.shape == (10, 31)
    x = torch.rand(128, 1, 8, 8)
    split = Split(x, torch.zeros(128, dtype=torch.long))
    assert sp.max_logit_diff(model, pruned, split, 32, torch.float64)[0] <= PRUNE_ATOL
    # The pruned spec rebuilds exactly this model.
    spec = sp.pruned_spec(nets[("relu", "cnn")][1], pruned)
    assert spec["model"]["channels"] == [7, 14] and spec["model"]["cnn_hidden"] == 31
    build_model(spec).load_state_dict(pruned.state_dict())  # strict: every shape matches


def test_a_layer_with_every_unit_dead_keeps_one(nets):
    model = copy.deepcopy(nets[("relu", "mlp")][0])
    _kill(model.fc1, list(range(32)))
    pruned, removed = sp.prune_dead(model, {"act1": np.ones(32, bool)})
    assert removed == {"act1": 31} and pruned.fc1.out_features == 1 and pruned.head.in_features == 1
    x = torch.rand(64, 1, 8, 8)
    assert sp.max_logit_diff(model, pruned, Split(x, torch.zeros(64, dtype=torch.long)), 64, torch.float64)[0] <= PRUNE_ATOL


def test_sparsity_stage(nets, tmp_path, capsys):
    lam, lam_spec = nets[("lambda_gelu", "mlp")]
    lam = copy.deepcopy(lam)
    _kill(lam.fc1, [1, 2])  # dead in the smooth model too, so the swapped model has dead units for sure
    run = make_run(tmp_path, {"lambda_gelu": (lam, lam_spec), "relu": nets[("relu", "cnn")]})
    result = sparsity_stage.run_sparsity(run.cfg, run)
    log = capsys.readouterr().out  # stderr is no terminal here: progress goes to the log as lines
    for v in ("lambda_gelu", "relu"):
        assert f"sparsity {v}: APoZ on" in log and f"sparsity {v}: provably dead" in log and f"sparsity {v}: done" in log
    saved = json.loads(run.file("sparsity", "sparsity.json").read_text())
    assert result == saved and saved["samples"] == len(digits().val)
    with open(run.file("sparsity", "apoz.csv")) as f:
        rows = list(csv.DictReader(f))
    by_variant = {v: [r for r in rows if r["variant"] == v] for v in ("lambda_gelu", "relu")}
    assert len(by_variant["lambda_gelu"]) == 64 + 32 and len(by_variant["relu"]) == 8 + 16 + 32
    assert all(r["nonpos_smooth"] == "" for r in by_variant["relu"])  # a ReLU baseline has no smooth model
    assert all(0 <= float(r["nonpos_smooth"]) <= 1 for r in by_variant["lambda_gelu"])
    for v, entry in saved["variants"].items():
        assert entry["dead"] == sum(r["dead"] == "True" for r in by_variant[v])
        assert entry["always_active"] == sum(r["always_active"] == "True" for r in by_variant[v])
        assert entry["dead"] == sum(lay["dead"] for lay in entry["layers"].values())
        p = entry["pruning"]
        assert p["removed_total"] == entry["dead"] and p["val_max_logit_diff_fp64"] <= PRUNE_ATOL
        assert p["val_argmax_agreement"] == 1.0 and p["onnx_bound_ratio"] <= 1  # onnxruntime vs float64, as a share of the rounding bound
        assert p["params_after"] <= p["params_before"]
        assert run.file("sparsity", v, "apoz_hist.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        # The exported pruned graph runs on natural-unit inputs like every other export.
        sess = ort_util.session(run.file("sparsity", v, "pruned.onnx"))
        assert sess.run(None, {ort_util.INPUT: digits().val.x[:3].numpy()})[0].shape == (3, 10)
    assert saved["variants"]["lambda_gelu"]["layers"]["act1"]["dead"] >= 2


def test_unit_axis_of_token_sequences_is_the_feature_axis():
    from pipeline.gates import channel_axis

    assert channel_axis(torch.zeros(2, 5)) == 1 and channel_axis(torch.zeros(2, 3, 4, 4)) == 1
    assert channel_axis(torch.zeros(2, 7, 16)) == 2  # [N, T, C]


def test_stage_notes_what_it_cannot_measure_or_prune(nets, tmp_path):
    tanh_spec = make_spec(ModelConfig(name="mlp", hidden=[8]), "tanh", GateConfig(), digits().info)
    run = make_run(tmp_path, {"tanh": (build_model(tanh_spec).eval(), tanh_spec), "linked_relu": nets[("linked_relu", "mlp")]})
    saved = sparsity_stage.run_sparsity(run.cfg, run)["variants"]
    assert "no APoZ" in saved["tanh"]["note"] and saved["tanh"]["layers"] == {}  # no exact zeros without a ReLU form
    linked = saved["linked_relu"]
    assert linked["units"] == 2 * (64 + 32) and "not pruned" in linked["pruning"]["note"]
