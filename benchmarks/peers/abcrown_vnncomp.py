"""α,β-CROWN itself (the whole verifier: attack, α-CROWN, β-CROWN branch and bound; built by abcrown_setup.sh) on a
VNN-COMP folder's instances, one row per instance in `pipeline vnncomp`'s results format, beside ours on the same rows.

    .venv/bin/python -m benchmarks.peers.abcrown_vnncomp FOLDER --instances ROWS.csv --timeout 30 \\
        --out abcrown.csv [--config exp_configs/vnncomp21/eran_sigmoid.yaml] [--rows 0:10] [--set KEY=VALUE ...]

As VNN-COMP runs it (its vnncomp_scripts/run_instance.sh → complete_verifier/vnncomp_main.py): one process per
instance, `abcrown.py --config YAML --precompile_jit --onnx_path --vnnlib_path --results_file --timeout
--save_adv_example`, here with `--device cpu`, one torch / OpenMP / MKL thread, killed `--grace` seconds past the limit,
its address space capped at `--memory-gb` (its allocation error is then its answer: `error`).
Its answer is the first line of its results file (sat / unsat / timeout: α,β-CROWN writes "timeout" for every
undecided end, its own limit or "unknown"), the witness the lines after "sat"; a process that wrote no results file
is `error` (its last line of output in the JSON) or `timeout` when killed. Times as `run_neuralsat.py` takes
neuralsat's: run_time is α,β-CROWN's own clock (its "Time:" line, from before it reads the network and the property
to its answer, as its --timeout counts), prepare_time 0; the process's wall time (with the Python imports and the JIT
precompilation every new process pays) is kept in the JSON. An answer after the limit counts as `timeout`; every sat
witness is re-checked in onnxruntime (`run_neuralsat.check_witness`). Not done here: run_instance.sh's second try with
`--bound_prop_method crown` after a process that exits non-zero without an answer (its way around running out of GPU
memory).

The config, by default, is the one α,β-CROWN's repository gives the benchmark family (`default_config`: vnncomp_main.py's
table, and its 2021 table, kept there as comments, for eran), with its `general.device` set to cpu on the command
line; a family it has no config for runs on α,β-CROWN's built-in defaults (arguments.py: PGD, α-CROWN, then β-CROWN
branch and bound, on ReLUs and, GenBaB, on the other nonlinearities; `abcrown_defaults.yaml`, which only sets the CPU),
which the JSON then says.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from analysis.verification.vnncomp import witness_path
from analysis.verification.vnnlib import read_instances_csv
from pipeline.atomic_io import atomic_write_text

from .run_neuralsat import ROOT, run_process, run_rows, select_rows

DEST = ROOT / ".peers" / "abcrown"
DEFAULTS = ROOT / "benchmarks" / "peers" / "abcrown_defaults.yaml"  # its built-in defaults (it needs a --config file)
# (pattern on "category/onnx path", config under complete_verifier/): the families α,β-CROWN has a VNN-COMP config for.
CONFIGS = [
    (r"^eran.*/.*SIGMOID", "exp_configs/vnncomp21/eran_sigmoid.yaml"),
    (r"^vit", "exp_configs/vnncomp23/vit.yaml"),
    (r"^acasxu", "exp_configs/vnncomp21/acasxu.yaml"),
    (r"^nn4sys", "exp_configs/vnncomp23/nn4sys.yaml"),
    (r"^collins_rul_cnn", "exp_configs/vnncomp23/collins-rul-cnn.yaml"),
    (r"^dist_shift", "exp_configs/vnncomp23/dist-shift.yaml"),
    (r"^metaroom", "exp_configs/vnncomp23/metaroom.yaml"),
    (r"^tllverifybench", "exp_configs/vnncomp23/tllVerifyBench.yaml"),
    (r"^cora", "exp_configs/vnncomp25/cora.yaml"),
]
_TIME = re.compile(r"^Time:\s*([0-9.eE+-]+)\s*$")  # α,β-CROWN's own seconds for the instance


def default_config(category: str, onnx_rel: str) -> str:
    """The config α,β-CROWN's repository runs this family's instances with, else `DEFAULTS` (its built-in defaults)."""
    key = f"{category}/{onnx_rel}"
    return next((cfg for pattern, cfg in CONFIGS if re.search(pattern, key)), str(DEFAULTS))


def parse_output(output: str, results: str | None) -> tuple[str | None, float | None, str | None]:
    """α,β-CROWN's answer (its results file's first line; None when it wrote none), its own seconds (the last "Time:"
    line of its output; None when absent) and, for sat, the witness in VNN-COMP's counterexample form."""
    lines = results.splitlines() if results else []
    answer = lines[0].strip() if lines and lines[0].strip() else None
    seconds = next((float(m.group(1)) for m in (_TIME.match(s.strip()) for s in reversed(output.splitlines())) if m), None)
    witness = "sat\n" + "\n".join(lines[1:]).strip() + "\n" if answer == "sat" and len(lines) > 1 else None
    return answer, seconds, witness


def flags(settings: list[str]) -> list[str]:
    """`--set` values as α,β-CROWN's command line: "key=value" → --key value, "key" → --key."""
    out = []
    for s in settings:
        key, eq, value = s.partition("=")
        out += [f"--{key}", value] if eq else [f"--{key}"]
    return out


def command(python: str, config: str, onnx: Path, vnnlib: Path, results: Path, cex: Path, limit: float,
            settings: list[str]) -> list[str]:
    """vnncomp_main.py's command line for one instance, on the CPU, its counterexample written to `cex`."""
    return [python, "abcrown.py", "--config", config, "--device", "cpu", "--precompile_jit", "--onnx_path", str(onnx),
            "--vnnlib_path", str(vnnlib), "--results_file", str(results), "--timeout", f"{limit:g}", "--save_adv_example",
            "--cex_path", str(cex)] + settings


def run_one(python: str, dest: Path, folder: Path, onnx_rel: str, vnnlib_rel: str, limit: float, grace: float,
            log_dir: Path, config: str, settings: list[str], memory_bytes: int | None = None) -> dict[str, Any]:
    """One α,β-CROWN process on one instance: `run_neuralsat.run_one`'s row (answer, own and wall seconds, witness)."""
    src = dest / "src" / "complete_verifier"
    with tempfile.TemporaryDirectory(prefix="abcrown_") as tmp:
        results = Path(tmp) / "results.txt"
        cmd = command(python, config, (folder / onnx_rel).resolve(), (folder / vnnlib_rel).resolve(), results,
                      Path(tmp) / "cex.txt", limit, settings)
        pythonpath = f"{dest / 'pkgs'}:{ROOT / 'benchmarks' / 'peers' / 'stand_ins'}"
        out, wall, killed, returncode = run_process(cmd, src, {"PYTHONPATH": pythonpath}, limit + grace, memory_bytes)
        stem = witness_path(log_dir / "x.csv", onnx_rel, vnnlib_rel).stem
        atomic_write_text(log_dir / f"{stem}.log", out)
        answer, seconds, witness = parse_output(out, results.read_text() if results.is_file() else None)
    row: dict[str, Any] = {"onnx": onnx_rel, "vnnlib": vnnlib_rel, "limit": limit, "config": config, "wall": wall,
                           "killed": killed, "answer": answer, "self_reported_seconds": seconds, "returncode": returncode}
    if witness is not None:
        row["witness"] = witness
    if answer is None:
        tail = [s for s in out.splitlines() if s.strip()]
        row["message"] = "killed after the grace period" if killed else (tail[-1][:300] if tail else f"exit {returncode}")
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="VNN-COMP benchmark folder (its instances.csv names onnx and vnnlib files)")
    p.add_argument("--out", type=Path, required=True, help="results.csv to write; witnesses go to counterexamples/ beside it")
    p.add_argument("--instances", default="instances.csv", help="the instance list inside the folder")
    p.add_argument("--timeout", type=float, default=None, help="seconds per instance (default: instances.csv's)")
    p.add_argument("--rows", default=None, metavar="START:END", help="only these rows of the list (Python slice)")
    p.add_argument("--config", default=None, help="α,β-CROWN's YAML config (a path under complete_verifier/ or "
                   "absolute; default: default_config's for the family), or 'none' for its built-in defaults")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="FLAG[=VALUE]",
                   help="one more α,β-CROWN command-line flag, e.g. --set complete_verifier=bab (repeatable)")
    p.add_argument("--jobs", type=int, default=1, help="instances run at once (one core each)")
    p.add_argument("--grace", type=float, default=20.0, help="seconds past the limit before a process is killed")
    p.add_argument("--memory-gb", type=float, default=8.0, help="each process's address-space cap (GiB); past it "
                   "α,β-CROWN fails with its allocation error, an `error` row")
    p.add_argument("--category", default=None, help="the category column (default: the folder's name)")
    p.add_argument("--dest", type=Path, default=DEST, help="abcrown_setup.sh's DEST")
    p.add_argument("--python", default=sys.executable, help="the interpreter abcrown_setup.sh checked")
    args = p.parse_args(argv)
    if not (args.dest / "src" / "complete_verifier" / "abcrown.py").is_file():
        print(f"error: {args.dest} holds no α,β-CROWN; run benchmarks/peers/abcrown_setup.sh first", file=sys.stderr)
        return 2
    if not (args.folder / args.instances).is_file():
        print(f"error: {args.folder / args.instances} is missing: a VNN-COMP folder lists its instances there", file=sys.stderr)
        return 2
    category = args.category or args.folder.name
    settings = flags(args.settings)
    rows = select_rows(read_instances_csv(args.folder / args.instances), args.rows)
    configs = {o: str(DEFAULTS) if args.config == "none" else args.config or default_config(category, o)
               for o, _, _ in rows}
    commits = (args.dest / "COMMITS").read_text().split() if (args.dest / "COMMITS").is_file() else []
    run_rows(args.folder, rows, args.out, category, args.jobs, args.timeout,
             lambda o, v, limit, log_dir: run_one(args.python, args.dest, args.folder, o, v, limit, args.grace, log_dir,
                                                  configs[o], settings, int(args.memory_gb * 2**30)),
             {"tool": "α,β-CROWN " + " ".join(commits), "flags": "--device cpu --precompile_jit --save_adv_example "
              + " ".join(settings), "configs": sorted(set(configs.values())),
              "memory_gb": args.memory_gb})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
