"""`pipeline sweep --shard K/N`: shards are disjoint, cover the grid, are balanced and the same on every
machine; a finished point is skipped; `pipeline report` over the shards' folders equals the report over
one folder holding every run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.cli import main
from pipeline.errors import ConfigError
from pipeline.shards import parse_shard
from pipeline.sweep import Block, Sweep, expand, run_sweep, shard_points

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "configs" / "digits-tiny.toml")


@settings(max_examples=50, deadline=None)
@given(seeds=st.integers(1, 7), lrs=st.integers(1, 4), n=st.integers(1, 9), reverse=st.booleans())
def test_shards_are_disjoint_balanced_and_cover_the_grid(seeds, lrs, n, reverse):
    blocks = [Block({"seed": [str(s) for s in range(seeds)], "train.lr": [str(0.01 * (i + 1)) for i in range(lrs)]},
                    ["variants=lambda_gelu"], "lam"),
              Block({"seed": [str(s) for s in range(seeds)]}, ["variants=gelu"], "base")]
    grid = expand(Sweep(blocks=blocks[::-1] if reverse else blocks))
    shards = [shard_points(grid, (k, n)) for k in range(n)]
    names = [p.name for s in shards for p in s]
    assert sorted(names) == sorted(p.name for p in grid)  # cover, and disjoint (no name twice)
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    # the same assignment however the blocks are listed (another machine, an edited file's block order)
    other = expand(Sweep(blocks=blocks if reverse else blocks[::-1]))
    assert [{p.name for p in shard_points(other, (k, n))} for k in range(n)] == [{p.name for p in s} for s in shards]
    # within a shard, the grid's own order
    order = {p.name: i for i, p in enumerate(grid)}
    assert all([order[p.name] for p in s] == sorted(order[p.name] for p in s) for s in shards)


@pytest.mark.parametrize("bad", ["2", "2/2", "-1/3", "a/b", "1/0", "1/"])
def test_bad_shards_are_refused(bad):
    with pytest.raises(ConfigError, match="K/N"):
        parse_shard(bad)


def test_dry_run_lists_only_the_shard(tmp_path):
    sweep = Sweep(config=TINY, blocks=[Block({"seed": ["0", "1", "2", "3", "4"]}, ["variants=gelu"])])
    plans = [run_sweep(sweep, out_dir=str(tmp_path), dry_run=True, log=lambda m: None, shard=(k, 2)) for k in (0, 1)]
    assert [[p["name"] for p in s["points"]] for s in plans] == [["s0", "s2", "s4"], ["s1", "s3"]]
    assert plans[0]["shard"] == {"k": 0, "n": 2, "grid_points": 5}
    assert main(["sweep", "-c", TINY, "--shard", "0/2", "--report", "--grid", "seed=0,1"]) == 2  # one shard is not the grid


SPEC = """config = "{tiny}"
set = ["train.epochs=2", "threads=1"]
[[grid]]
label = "base"
set = ["variants=gelu,relu"]
seed = [0, 1, 2]
[[grid]]
label = "anneal"
set = ["variants=lambda_gelu", "train.switch_fraction=0.5"]
seed = [0, 1, 2]
"""


@pytest.fixture(scope="module")
def shard_runs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("shards")
    spec = tmp / "grid.toml"
    spec.write_text(SPEC.format(tiny=TINY))
    out = {k: tmp / k for k in ("a", "b")}
    for k, (name, d) in enumerate(out.items()):
        assert main(["sweep", str(spec), "--out", str(d), "--shard", f"{k}/2"]) == 0
    return {"spec": spec, **out, "tmp": tmp}


def test_each_shard_ran_its_own_points(shard_runs):
    runs = {k: sorted(p.parent.name for p in shard_runs[k].glob("*/config.json")) for k in ("a", "b")}
    assert runs == {"a": ["anneal-s0", "anneal-s2", "base-s1"], "b": ["anneal-s1", "base-s0", "base-s2"]}
    index = json.loads((shard_runs["a"] / "sweep-shard-0-of-2.json").read_text())
    assert index["shard"] == {"k": 0, "n": 2, "grid_points": 6} and len(index["points"]) == 3
    assert not (shard_runs["a"] / "sweep.json").exists()


def test_a_finished_point_is_skipped(shard_runs, capsys):
    capsys.readouterr()
    assert main(["sweep", str(shard_runs["spec"]), "--out", str(shard_runs["a"]), "--shard", "0/2"]) == 0
    out = capsys.readouterr().out
    assert out.count("done already, skipped") == 3 and "[train]" not in out


def test_report_over_shard_folders_equals_report_over_one_folder(shard_runs):
    merged = shard_runs["tmp"] / "merged"
    for k in ("a", "b"):
        for run in shard_runs[k].glob("*/config.json"):
            shutil.copytree(run.parent, merged / run.parent.name)
    assert main(["report", str(shard_runs["a"]), str(shard_runs["b"]), "--out", str(shard_runs["tmp"] / "rep-shards")]) == 0
    assert main(["report", str(merged), "--out", str(shard_runs["tmp"] / "rep-one")]) == 0
    numbers = [json.loads((shard_runs["tmp"] / d / "numbers.json").read_text()) for d in ("rep-shards", "rep-one")]
    assert numbers[0] == numbers[1]
    assert {r["mode"] for r in numbers[0]["table2"]} >= {"GELU", "λ-GELU (annealed)"}
    assert all(r["seeds"] == 3 for r in numbers[0]["table2"])  # every shard's seeds in one row
    tables = [(shard_runs["tmp"] / d / "table2.md").read_text() for d in ("rep-shards", "rep-one")]
    assert tables[0] == tables[1]
