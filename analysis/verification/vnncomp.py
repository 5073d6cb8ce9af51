"""Run a VNN-COMP benchmark folder: `instances.csv` (onnx, vnnlib, timeout per row; paths relative to the
folder; .gz allowed for both) → `results.csv` in VNN-COMP's format, one row per instance,

    category,onnx,vnnlib,prepare_time,result,run_time

(no header, as VNN-COMP's scripts write it; result ∈ sat/unsat/timeout/unknown/error; times in seconds of
wall-clock time), and for every sat instance a witness file in VNN-COMP's counterexample form
(``sat`` then ``((X_0 v) … (Y_0 v) …)``) at `witness_path(out_csv, onnx, vnnlib)`. The Y values are the
model's outputs at X as onnxruntime computes them (the re-check every counterexample gets).

prepare_time (measured): reading the ONNX graph into the verifier's graph (once per network file), parsing the
property, starting onnxruntime; run_time: the verifier on the instance, limited to the instance's timeout (or
`timeout_override`) in wall-clock seconds. Instances run through the one property loop (`harness`), `jobs` at a
time; `shard` "K/N" runs the rows whose index is K mod N, and `merge` joins shard results.

It reads what `readers.from_onnx` reads (`readers.supported_ops()`: residual graphs, convolutions, the smooth gates,
transformers, int8 QDQ graphs); anything else makes that instance an error whose message names the op. `main` shows
each answer as it comes (a bar on a terminal, else a line per instance), prints one line per failed instance (missing file, unsupported op, malformed VNN-LIB, input counts
that do not match) and exits 1 when there was one, 2 when the folder itself is unusable or the results cannot be
written where `--out` says (checked before the first instance).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from pipeline.errors import ConfigError, DeviceError, PipelineError
from pipeline.atomic_io import atomic_write_text
from pipeline.cores import choose_threads

from . import harness
from .problem import RESULTS
from .registry import get_verifier
from .vnnlib import format_witness, read_instances_csv

FIELDS = ["category", "onnx", "vnnlib", "prepare_time", "result", "run_time"]


class BenchmarkError(PipelineError):
    """The benchmark folder cannot be run at all (one line)."""


def witness_path(out_csv: Path, onnx: str, vnnlib: str) -> Path:
    """Where the witness of a sat instance goes: counterexamples/<onnx stem>__<vnnlib stem>.counterexample
    beside results.csv (.gz and .onnx/.vnnlib suffixes dropped)."""
    def stem(p: str) -> str:
        name = Path(p).name
        for suffix in (".gz", ".onnx", ".vnnlib"):
            name = name[: -len(suffix)] if name.endswith(suffix) else name
        return name

    return Path(out_csv).parent / "counterexamples" / f"{stem(onnx)}__{stem(vnnlib)}.counterexample"


def results_row(category: str, onnx: str, vnnlib: str, row: Mapping[str, Any], prepare_seconds: float) -> dict[str, Any]:
    """One results.csv row (`FIELDS`) of an instance from its answer, a row with `Outcome.row()`'s fields (the verify
    stage's details.csv rows keep them), and its preparing seconds: the one place an answer becomes VNN-COMP's row."""
    return {"category": category, "onnx": onnx, "vnnlib": vnnlib, "prepare_time": prepare_seconds, "result": row["result"],
            "run_time": row["seconds"]}


def write_witness(out_csv: Path, onnx: str, vnnlib: str, result: Any) -> Path:
    """A sat result's witness, in VNN-COMP's counterexample form, where `witness_path` puts it; returns the path."""
    path = witness_path(out_csv, onnx, vnnlib)
    atomic_write_text(path, format_witness(result.counterexample, result.output))
    return path


def format_results(rows: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for r in rows:
        w.writerow([r["category"], r["onnx"], r["vnnlib"], f"{float(r['prepare_time']):.6f}", r["result"],
                    f"{float(r['run_time']):.6f}"])
    return buf.getvalue()


def write_results(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    atomic_write_text(Path(path), format_results(rows))


def read_results(path: Path) -> list[dict[str, Any]]:
    """Rows of a VNN-COMP results.csv (a header line, if any, is skipped)."""
    out = []
    with open(path, newline="") as f:
        for r in csv.reader(f):
            if not r or r[:len(FIELDS)] == FIELDS:
                continue
            if len(r) < 6 or r[4] not in RESULTS:
                raise ValueError(f"{path}: not a VNN-COMP results row: {','.join(r)!r}")
            out.append({"category": r[0], "onnx": r[1], "vnnlib": r[2], "prepare_time": float(r[3]), "result": r[4],
                        "run_time": float(r[5])})
    return out


def _plain(path: Path, tmp: Path) -> Path:
    """A .gz file decompressed into tmp (Marabou and onnxruntime take plain files); others as they are."""
    if path.suffix != ".gz":
        return path
    out = tmp / f"{len(list(tmp.iterdir()))}_{path.name[:-3]}"
    with gzip.open(path, "rb") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


def _problem_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def check_writable(out_csv: Path) -> None:
    """BenchmarkError (one line) unless `out_csv` and the witnesses beside it can be written: tried by writing a
    temporary file into its folder (made if missing), before any instance is solved. (Every file is replaced by a
    rename, so the folder's permission is what counts.)"""
    out_csv = Path(out_csv)
    if out_csv.is_dir():
        raise BenchmarkError(f"--out {out_csv} is a folder: name the results.csv file to write")
    witnesses = witness_path(out_csv, "x", "x").parent
    for folder in (out_csv.parent, witnesses):
        if folder.exists() and not folder.is_dir():
            raise BenchmarkError(f"cannot write the results to {out_csv}: {folder} is a file, not a folder; "
                                 "give --out a file in a writable folder")
        try:
            if folder == out_csv.parent:
                folder.mkdir(parents=True, exist_ok=True)
            elif not folder.is_dir():
                continue  # made when the first witness is written, inside the folder just checked
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".writable-"):
                pass
        except OSError as e:
            raise BenchmarkError(f"cannot write the results to {out_csv}: {folder} is not writable ({e.strerror or e}); "
                                 "give --out a file in a writable folder") from None


def run_benchmark(folder: str | Path, out_csv: str | Path, timeout_override: float | None = None,
                  verifier: str = "auto", category: str | None = None, clock: str = "wall",
                  instances: str = "instances.csv", log: Callable[[str], None] | None = None, jobs: int = 1,
                  shard: str | None = None, progress: bool = False, device: str = "auto", wall_s: float | None = None,
                  note: Callable[[str], None] | None = None, **options: Any) -> list[dict[str, Any]]:
    """Run the instances of a benchmark folder (those of `shard` "K/N", or all) with `jobs` worker processes;
    writes `out_csv` (rewritten as instances finish, in the folder's order, so a killed run keeps what it
    finished) and the witnesses; returns the rows, each with its `message`. `progress`: show each answer as it
    comes (a bar on a terminal, else a line per instance).

    `verifier`: a registry name or chain ("auto": the staged chain); `options` go to its links; `device`: where they
    compute (auto | cpu | cuda | cuda:N; the jobs share one GPU); `wall_s`: all instances together in at most this many
    wall seconds (an instance not begun by then is a timeout "not run"; None: no such limit). `note(line)`: the property
    loop's budget sentence (`harness.FirstPass`), once per network whose measured CROWN pass (on its first instance) the
    instances' limit cannot cover.

    The instances of one network get their first bound pass together (`harness`: CROWN batched over them, each
    instance's share of it counted in its run_time) before any instance gets its own turn; a returned row also says
    why an open instance is open (`reason`: budget, timeout, unknown, error; results.csv keeps VNN-COMP's words)."""
    folder = Path(folder)
    out_csv = Path(out_csv)
    log = log or (lambda msg: None)
    if not folder.is_dir():
        raise BenchmarkError(f"benchmark folder {folder} does not exist")
    inst_path = folder / instances
    if not inst_path.is_file():
        raise BenchmarkError(f"{inst_path} is missing: a VNN-COMP benchmark folder lists its instances there")
    try:
        rows_in = read_instances_csv(inst_path)
        picked = harness.shard(rows_in, shard)
    except (ValueError, ConfigError) as e:
        raise BenchmarkError(_problem_line(e)) from None
    get_verifier(verifier, **options)  # an unknown name fails here, before any work
    try:
        device = harness.resolve_device(device, setting="--device ")
    except DeviceError as e:
        raise BenchmarkError(str(e)) from None
    check_writable(out_csv)  # so does a results file that could not be written
    category = category or folder.name
    rows: dict[int, dict[str, Any]] = {}

    def write() -> None:
        write_results(out_csv, [rows[i] for i in sorted(rows)])

    with tempfile.TemporaryDirectory(prefix="vnncomp_") as tmpdir:
        tmp = Path(tmpdir)
        plain: dict[Path, Path] = {}
        tasks = []
        for n, i in enumerate(picked):
            onnx_rel, vnnlib_rel, timeout = rows_in[i]
            onnx_src, vnn_src = folder / onnx_rel, folder / vnnlib_rel
            for src in (onnx_src, vnn_src):
                if src.is_file() and src not in plain:
                    plain[src] = _plain(src, tmp)
            tasks.append(harness.FileTask(key=(onnx_rel, vnnlib_rel), verifier=verifier, network=onnx_rel,
                                          timeout=float(timeout_override) if timeout_override is not None else timeout,
                                          onnx=plain.get(onnx_src, onnx_src), vnnlib=plain.get(vnn_src, vnn_src)))

        def done(o: harness.Outcome) -> None:
            onnx_rel, vnnlib_rel = o.key
            res, common = o.result, o.row()
            rows[o.index] = {**results_row(category, onnx_rel, vnnlib_rel, common, o.prepare_seconds), "message": common["message"],
                             "stage": common["stage"], "reason": common["reason"], "info": res.info}
            if res.status == "sat":
                write_witness(out_csv, onnx_rel, vnnlib_rel, res)
            elif res.status == "error":
                log(f"{onnx_rel} {vnnlib_rel}: error: {res.message}")
            write()

        limits = harness.PerTask(timeout_override or 60.0, wall_s)
        for o in harness.run(tasks, limits, jobs=jobs, clock=clock, on_done=done, options=options,
                             progress="vnncomp" if progress else None, label=" ".join, device=device, setting="--timeout ",
                             note=note):
            if o.index not in rows:  # its worker process died before answering: an error row, never a silent gap
                done(o)
    write()
    return [rows[i] for i in sorted(rows)]


def merge(paths: Sequence[str | Path], out_csv: str | Path) -> list[dict[str, Any]]:
    """Shard results.csv files of one benchmark merged into one (instance order kept by first appearance; a row
    that two shards both hold must agree, else ValueError)."""
    merged: dict[tuple[str, str, str], dict[str, Any]] = {}
    for p in paths:
        for r in read_results(Path(p)):
            key = (r["category"], r["onnx"], r["vnnlib"])
            if key in merged and merged[key]["result"] != r["result"]:
                raise ValueError(f"{p}: {key[1]} {key[2]} is {r['result']} here and {merged[key]['result']} in another shard")
            merged.setdefault(key, r)
    rows = list(merged.values())
    write_results(Path(out_csv), rows)
    return rows


def merge_shards(folder: str | Path) -> tuple[Path, list[dict[str, Any]]] | None:
    """A benchmark folder's `results.shard-K-of-N.csv` files (what `--shard` writes) merged into its results.csv
    (`pipeline report FOLDER`); None when the folder holds no shard results. Every shard of N must be there."""
    folder = Path(folder)
    parts = sorted(folder.glob("results.shard-*-of-*.csv"))
    if not parts:
        return None
    counts = {p.name.rsplit("-of-", 1)[1].removesuffix(".csv") for p in parts}
    if len(counts) != 1:
        raise BenchmarkError(f"{folder}: shard results of different N ({', '.join(sorted(counts))}); keep one set")
    n = int(counts.pop())
    missing = [k for k in range(n) if not (folder / f"results.shard-{k}-of-{n}.csv").is_file()]
    if missing:
        raise BenchmarkError(f"{folder}: shard(s) {', '.join(f'{k}/{n}' for k in missing)} have no results yet; "
                             f"run `pipeline vnncomp {folder} --shard K/{n}` for each")
    out = folder / "results.csv"
    return out, merge(parts, out)


def summary(rows: Sequence[dict[str, Any]]) -> str:
    c = Counter(r["result"] for r in rows)
    decided = c["sat"] + c["unsat"]
    return (f"{len(rows)} instances: {decided} decided (sat {c['sat']}, unsat {c['unsat']}), timeout {c['timeout']}, "
            f"unknown {c['unknown']}, error {c['error']}")


def main(argv: Sequence[str] | None = None) -> int:
    """`pipeline vnncomp FOLDER [--out results.csv] [--timeout S] [--verifier auto] [--jobs N] [--threads T]
    [--shard K/N] [--device auto|cpu|cuda]`."""
    p = argparse.ArgumentParser(prog="pipeline vnncomp", description="Run a VNN-COMP benchmark folder (instances.csv).")
    p.add_argument("folder", help="benchmark folder with instances.csv (onnx, vnnlib, timeout per row)")
    p.add_argument("--out", default=None, help="results.csv to write (default: <folder>/results.csv)")
    p.add_argument("--timeout", type=float, default=None, help="per-instance limit in wall seconds (default: instances.csv's)")
    p.add_argument("--verifier", default="auto", help="a verifier or chain a+b (default auto: crown+pgd+alpha-crown+bab)")
    p.add_argument("--category", default=None, help="the category column (default: the folder's name)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="what the timeout counts (default wall, as VNN-COMP)")
    p.add_argument("--instances", default="instances.csv", help="the instance list inside the folder")
    p.add_argument("--jobs", type=int, default=1, help="instances solved at once, one process and one torch thread each")
    p.add_argument("--threads", type=int, default=0, help="torch threads of --jobs 1, which solves in this process (default 0: "
                   "the cores other work leaves free; 1 for a one-core measurement beside a one-thread peer)")
    p.add_argument("--device", default="auto", help="where the bounds and branch and bound compute: auto (a GPU when "
                   "there is one), cpu, cuda or cuda:N; the jobs share one GPU, the MILP stays on the CPU")
    p.add_argument("--shard", metavar="K/N", help="only the instances whose row index is K mod N (K = 0..N-1, e.g. "
                   "$SLURM_ARRAY_TASK_ID/N); `pipeline report` or `--merge` joins the shards' results")
    p.add_argument("--merge", nargs="+", metavar="CSV", help="merge these shard results.csv files into --out, solve nothing")
    args = p.parse_args(argv)
    if args.merge:
        if not args.out:
            print("error: --merge needs --out (the merged results.csv)", file=sys.stderr)
            return 2
        try:
            rows = merge(args.merge, args.out)
        except (OSError, ValueError) as e:
            print(f"error: {_problem_line(e)}", file=sys.stderr)
            return 2
        print(f"{summary(rows)}; merged into {args.out}")
        return 0
    if args.jobs < 1:
        print(f"error: --jobs must be >= 1, got {args.jobs}", file=sys.stderr)
        return 2
    if args.threads < 0 or (args.jobs > 1 and args.threads > 1):
        print(f"error: --threads {args.threads}: give 0 (free cores) or a count for --jobs 1; with --jobs {args.jobs} "
              f"each job runs one thread", file=sys.stderr)
        return 2
    if args.jobs == 1:
        torch.set_num_threads(choose_threads(args.threads))
    name = f"results.shard-{args.shard.replace('/', '-of-')}.csv" if args.shard else "results.csv"
    out = Path(args.out) if args.out else Path(args.folder) / name
    errors: list[str] = []

    def log(msg: str) -> None:
        errors.append(msg)
        print(msg, file=sys.stderr)

    try:
        rows = run_benchmark(args.folder, out, args.timeout, args.verifier, args.category, args.clock, args.instances, log,
                             args.jobs, args.shard, progress=True, device=args.device,
                             note=lambda line: print(f"note: {line}", file=sys.stderr))
    except (BenchmarkError, ValueError) as e:
        print(f"error: {_problem_line(e)}", file=sys.stderr)
        return 2
    print(f"{summary(rows)}; results in {out}")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
