"""`pipeline sweep`: a grid of ordinary runs, one run directory per point; finished points are skipped.

A sweep is a union of *blocks*. A block is the cartesian product of its axes (config key → list of
values), plus fixed overrides (`set`) and a `label` that prefixes its run names. A sweep file
(TOML, YAML or JSON) holds:

    config = "../fmnist-mlp.toml"          # base config, relative to the sweep file
    out_dir = "runs-paper/tc-grid-fmnist"  # one run directory per point in here
    set = ["train.switch_fraction=1"]      # overrides for every point
    [[grid]]
    label = "lam"
    set = ["variants=lambda_gelu"]
    "gate.temperature" = [0.1, 0.3, 0.6, 0.9]
    "gate.lr_mult" = [1, 3, 6, 9]
    "gate.init" = ["uniform", "increasing", "decreasing"]
    seed = [0, 1, 2]

Axes given on the command line (`--grid seed=0,1,2`) are crossed into every block, replacing a
block's own axis of the same key. Each point is `pipeline run` with its overrides and
`name=<label>-<axis values>`, so a killed sweep restarts where it stopped: a point whose selected
stages are all done is skipped, a partial one resumes at its first unfinished stage. Points run
only `train, harden, swap` unless `stages` is set (those are all the paper tables need).

A grid that outgrows one machine runs in shards: `--shard K/N` (K = 0..N−1) runs the points whose index
in the name-sorted grid is K mod N, so a Slurm job array (`K = $SLURM_ARRAY_TASK_ID`) or a Kubernetes
indexed job (`K = $JOB_COMPLETION_INDEX`) covers the grid with disjoint shards, each skipping what is
finished. Shards may share `out_dir` (each writes its own index, `sweep-shard-K-of-N.json`) or not:
`pipeline report DIR...` reads the run directories under every folder it is given.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import config as config_mod
from . import distributed, runner
from .atomic_io import atomic_write_json
from .errors import ConfigError, PipelineError
from .rundir import RunDir
from .runner import validate
from .shards import in_shard
from .stages import selected

DEFAULT_STAGES = ["train", "harden", "swap"]
RESERVED = {"label", "set"}  # block keys that are not axes
# Short names for run directory names; other keys use their last dotted part.
SHORT = {"gate.temperature": "t", "gate.lr_mult": "c", "gate.init": "", "seed": "s", "variants": "",
         "train.epochs": "T", "train.switch_fraction": "sw", "gate.granularity": ""}


@dataclass
class Block:
    axes: dict[str, list[str]]
    set: list[str] = field(default_factory=list)
    label: str = ""


@dataclass
class Sweep:
    config: str | None = None  # base config file
    out_dir: str = "runs/sweep"
    set: list[str] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=lambda: [Block({})])


@dataclass
class Point:
    name: str
    overrides: list[str]  # base `set`, block `set`, then the axis values (later wins)


def _value(v: Any, key: str) -> str:
    """One axis value as an override string (a list value is one choice: variants=[gelu, relu])."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float, str)):
        return str(v)
    if isinstance(v, (list, tuple)) and all(isinstance(x, (int, float, str)) for x in v):
        return ",".join(map(str, v))
    raise ConfigError(f"sweep axis {key}: value {v!r} must be a number, a string or a list of them")


def _overrides(v: Any, key: str) -> list[str]:
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return list(v)
    raise ConfigError(f"sweep {key} must be a list of key.sub=value strings, got {v!r}")


def parse_axis(text: str) -> tuple[str, list[str]]:
    """`key=v1,v2,v3`, or `key=[...]` (JSON) when a choice itself holds commas."""
    key, sep, values = text.partition("=")
    if not sep or not key.strip() or not values.strip():
        raise ConfigError(f"--grid {text!r} must look like key.sub=v1,v2 (e.g. seed=0,1,2)")
    values = values.strip()
    if values.startswith("["):
        try:
            choices = json.loads(values)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--grid {text!r}: cannot parse the JSON list ({exc.msg})") from None
        if not isinstance(choices, list):
            raise ConfigError(f"--grid {text!r}: the JSON value must be a list of choices")
    else:
        choices = [c.strip() for c in values.split(",") if c.strip()]
    return key.strip(), [_value(c, key) for c in choices]


def read_sweep(path: str | Path) -> Sweep:
    """Parse a sweep file; `config` is resolved relative to the file."""
    path = Path(path)
    raw = config_mod.read_file(path)
    known = {"config", "out_dir", "set", "grid"}
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(f"{path}: unknown sweep keys {sorted(unknown)}; valid: {sorted(known)} (axes go in [[grid]] blocks)")
    sweep = Sweep(out_dir=str(raw.get("out_dir", Sweep.out_dir)), set=_overrides(raw.get("set", []), "set"), blocks=[])
    if "config" in raw:
        sweep.config = str((path.parent / str(raw["config"])).resolve())
    grids = raw.get("grid", [{}])
    if isinstance(grids, dict):
        grids = [grids]
    for i, g in enumerate(grids):
        if not isinstance(g, dict):
            raise ConfigError(f"{path}: grid[{i}] must be a table of axes")
        axes = {}
        for k, v in g.items():
            if k in RESERVED:
                continue
            choices = v if isinstance(v, list) else [v]
            if not choices:
                raise ConfigError(f"{path}: grid[{i}].{k} has no values")
            axes[k] = [_value(c, k) for c in choices]
        sweep.blocks.append(Block(axes, _overrides(g.get("set", []), f"grid[{i}].set"), str(g.get("label", ""))))
    return sweep


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]", "_", text.replace(",", "+"))


def point_name(label: str, assignment: dict[str, str]) -> str:
    parts = [label] if label else []
    for k, v in assignment.items():
        parts.append(SHORT.get(k, k.rsplit(".", 1)[-1]) + _slug(v))
    return "-".join(p for p in parts if p) or "base"


def expand(sweep: Sweep, extra_axes: dict[str, list[str]] | None = None) -> list[Point]:
    points: list[Point] = []
    for block in sweep.blocks:
        axes = {**block.axes, **(extra_axes or {})}
        keys = list(axes)
        for combo in itertools.product(*(axes[k] for k in keys)):
            assignment = dict(zip(keys, combo))
            overrides = [*sweep.set, *block.set, *(f"{k}={v}" for k, v in assignment.items())]
            points.append(Point(point_name(block.label, assignment), overrides))
    seen: dict[str, Point] = {}
    for p in points:
        if p.name in seen and seen[p.name].overrides != p.overrides:
            raise ConfigError(f"two sweep points are both named {p.name!r}; give their blocks different labels")
        seen.setdefault(p.name, p)
    return list(seen.values())  # identical points (same name, same overrides) run once


def shard_points(points: list[Point], shard: tuple[int, int] | None) -> list[Point]:
    """The points of shard (K, N): index in the name-sorted grid ≡ K (mod N), in the grid's own order.
    Disjoint for K = 0..N−1 and covering the grid; balanced to within one point; the same on every machine
    (names are unique in a grid, so the order does not depend on how blocks are listed)."""
    if shard is None:
        return points
    mine = {p.name for i, p in enumerate(sorted(points, key=lambda p: p.name)) if in_shard(i, shard)}
    return [p for p in points if p.name in mine]


def point_config(sweep: Sweep, point: Point, out_dir: str) -> config_mod.Config:
    cfg = config_mod.load(sweep.config, [*point.overrides, f"out_dir={out_dir}", f"name={point.name}"])
    if not cfg.stages:  # a point needs only what the paper tables read, unless the user asks for more
        cfg.stages = list(DEFAULT_STAGES)
    return validate(cfg)


def _finished(path: Path, cfg: config_mod.Config) -> bool:
    if not (path / "manifest.json").is_file():
        return False
    run = RunDir.open(path)
    if run.cfg.to_dict() != cfg.to_dict():
        return False  # RunDir.create below explains the mismatch
    stages = run.manifest().get("stages", {})
    return all(stages.get(s, {}).get("status") == "done" for s in selected(cfg))


def _record(path: Path, summary: dict[str, Any]) -> None:
    """sweep.json indexes every point ever run into this folder (several sweeps may share one)."""
    old = json.loads(path.read_text()) if path.is_file() else {"points": []}
    points = {p["name"]: p for p in old.get("points", [])}
    points.update({p["name"]: p for p in summary["points"]})
    atomic_write_json(path, {**summary, "points": list(points.values())})


def run_sweep(sweep: Sweep, extra_axes: dict[str, list[str]] | None = None, out_dir: str | None = None,
              dry_run: bool = False, log: Callable[[str], None] = print,
              shard: tuple[int, int] | None = None) -> dict[str, Any]:
    """Run every point (of `shard`, when given) in order; returns {"out_dir", "points": [{name, status,
    seconds, error}]}.

    A point that fails (e.g. a diverging (t, c) cell) is recorded and the sweep goes on; the
    caller decides what a failure means. Under torchrun every rank runs every point together.
    """
    out = out_dir or sweep.out_dir
    grid = expand(sweep, extra_axes)
    configs = {p.name: point_config(sweep, p, out) for p in grid}  # every point validated before any trains
    points = shard_points(grid, shard)
    world = distributed.world()
    log = log if world.main else (lambda msg: None)
    summary: dict[str, Any] = {"out_dir": out, "base_config": sweep.config, "points": []}
    index = "sweep.json"
    if shard is not None:
        summary["shard"] = {"k": shard[0], "n": shard[1], "grid_points": len(grid)}
        index = f"sweep-shard-{shard[0]}-of-{shard[1]}.json"  # shards sharing out_dir never write one file together
        log(f"sweep: shard {shard[0]}/{shard[1]}, {len(points)} of {len(grid)} points in {out}")
    else:
        log(f"sweep: {len(points)} points in {out}")
    if dry_run:
        for p in points:
            log(f"  {p.name}: {' '.join(p.overrides)}")
        summary["points"] = [{**asdict(p), "status": "planned"} for p in points]
        return summary
    for i, p in enumerate(points, 1):
        cfg = configs[p.name]
        entry = {**asdict(p), "status": "done", "seconds": 0.0, "error": None}
        started = time.time()
        if distributed.broadcast(_finished(Path(out) / p.name, cfg) if world.main else None):
            entry["status"] = "skipped"
            log(f"[{i}/{len(points)}] {p.name}: done already, skipped")
        else:
            log(f"[{i}/{len(points)}] {p.name}")
            try:
                run = runner.create(cfg, argv=["sweep", *p.overrides])
                runner.run_pipeline(run.cfg, run, log=lambda msg: log(f"    {msg}"))
            except PipelineError as exc:
                entry.update(status="failed", error=str(exc))
                log(f"    failed: {exc}")
        entry["seconds"] = round(time.time() - started, 3)
        summary["points"].append(entry)
        if world.main:
            _record(Path(out) / index, summary)
    failed = [e["name"] for e in summary["points"] if e["status"] == "failed"]
    log(f"sweep: {len(points) - len(failed)} of {len(points)} points finished" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return summary
