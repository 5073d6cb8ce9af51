"""`pipeline` command line: parses arguments and calls library functions, nothing else. With the runner and the stages
(`pipeline/stages/`) it is the top layer: each command imports what it calls (`analysis`, `quantize`) when it runs, so
`pipeline --help` stays fast."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Iterator

from . import config as config_mod
from .errors import PipelineError

EPILOG = """examples:
  pipeline run                                   # default: Fashion-MNIST, MLP 4x256, λ-GELU + GELU baseline
  pipeline run -c configs/digits-tiny.toml       # a ready config
  pipeline run train.epochs=5 data.name=adult    # key.sub=value overrides
  pipeline run --resume runs/<name>              # continue a killed run where it stopped
  pipeline stages                                # list the stages in run order, with the files each writes
  pipeline analyze --run runs/<name>             # activation properties + the papers' claims table
  pipeline sweep configs/sweeps/zoo-fmnist.toml --report   # the GELU analysis paper's activation zoo (Table 1)
  torchrun --nproc_per_node=4 -m pipeline.cli run -c configs/cifar10-resnet18.toml   # DDP, one GPU per process
  pipeline sweep configs/sweeps/tc-grid-fmnist.toml  # a grid of runs, finished points skipped
  pipeline report runs-paper/tc-grid-fmnist        # Table I/II, Figures 1-3 (Markdown + PNG)
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pipeline", description="λ-GELU: train, harden, swap to ReLU, deploy.",
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    p.add_argument("--debug", action="store_true", help="show the full traceback of an error instead of one line")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run (or resume) the staged pipeline", formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=EPILOG)
    r.add_argument("-c", "--config", help="TOML/YAML/JSON config file (defaults: the built-in Fashion-MNIST run)")
    r.add_argument("--resume", metavar="RUN_DIR", help="resume this run directory with its own config.json")
    r.add_argument("--redo", action="append", default=[], metavar="STAGE", help="rerun STAGE and every later stage")
    r.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides, e.g. train.epochs=5")
    sub.add_parser("stages", help="list the stages in run order, with the files each writes")
    vc = sub.add_parser("vnncomp", help="verify a VNN-COMP benchmark folder (instances.csv, ONNX, VNN-LIB) and write results.csv",
                        add_help=False)
    vc.add_argument("args", nargs="*", help="arguments of the VNN-COMP runner (`pipeline vnncomp --help`)")
    sub.add_parser("plugins", help="list the data sets, models and activations other installed packages register (entry points)")
    sw = sub.add_parser("sweep", help="run a grid of runs, one run directory per point; finished points are skipped")
    sw.add_argument("spec", nargs="?", help="sweep file (TOML/YAML/JSON: config, out_dir, set, [[grid]] blocks); see configs/sweeps/")
    sw.add_argument("-c", "--config", help="base config file (replaces the sweep file's `config`)")
    sw.add_argument("--grid", action="append", default=[], metavar="key=v1,v2",
                    help="an axis crossed into every block, e.g. --grid seed=0,1,2 (JSON list for choices with commas)")
    sw.add_argument("--out", metavar="DIR", help="where the run directories go (default: the sweep file's out_dir)")
    sw.add_argument("--label", help="prefix for the run names of every block (sweeps sharing --out need different labels)")
    sw.add_argument("--dry-run", action="store_true", help="list the points and their overrides, run nothing")
    sw.add_argument("--report", action="store_true", help="then write the paper tables and figures (as `pipeline report`)")
    sw.add_argument("--shard", metavar="K/N", help="run only shard K of N (K = 0..N-1, e.g. $SLURM_ARRAY_TASK_ID/N): "
                    "points assigned by their index in the name-sorted grid mod N; `pipeline report` merges the shards")
    sw.add_argument("overrides", nargs="*", metavar="key.sub=value", help="overrides for every point, e.g. train.epochs=5")
    rp = sub.add_parser("report", help="the paper's Table I/II and Figures 1-3 (Markdown + PNG) from finished runs; "
                        "a VNN-COMP benchmark folder gets its shards' results merged into its results.csv")
    rp.add_argument("paths", nargs="+", metavar="DIR", help="run directories, or folders holding them (searched recursively), "
                    "or benchmark folders run with `pipeline vnncomp --shard K/N`")
    rp.add_argument("--out", metavar="DIR", help="output folder (default: <first DIR>/paper-report)")
    rp.add_argument("--title", default="λ-GELU: the paper's tables on these runs")
    an = sub.add_parser("analyze", help="activation properties and the seed papers' claims (derived, with verdicts)")
    an.add_argument("--run", metavar="RUN_DIR", help="write analysis/analysis.{md,json} into this run directory")
    an.add_argument("--out", metavar="DIR", help="or into this directory (default: print only)")
    c = sub.add_parser("config", help="print the resolved config as JSON")
    c.add_argument("-c", "--config")
    c.add_argument("overrides", nargs="*")
    return p


def cmd_run(args: argparse.Namespace) -> int:
    from . import distributed, runner

    world = distributed.init_from_env()  # torchrun: join the process group; otherwise one process
    try:
        if args.resume:
            if args.config:
                raise PipelineError("--resume uses the run's own config.json; drop -c/--config (overrides are allowed)")
            args.interrupted_hint = _resume_hint(args.resume)
            run = runner.resume(args.resume, args.overrides, args.redo)
        else:
            args.interrupted_hint = "stopped before the run directory was made; nothing to resume"
            run = runner.create(config_mod.load(args.config, args.overrides), argv=sys.argv)
            args.interrupted_hint = _resume_hint(run.path)
        if world.main:
            print(f"run directory: {run.path}" + (f" ({world.size} processes)" if world.distributed else ""))
        runner.run_pipeline(run.cfg, run, redo=args.redo)
        if world.main:
            for line in runner.closing_lines(run):  # the run's closing summary repeats what must not pass unseen
                print(line)
            print(f"finished: {run.path}")
    finally:
        distributed.shutdown()
    return 0


def _resume_hint(path) -> str:
    return f"resume with `pipeline run --resume {path}` (finished epochs and stages are kept)"


def cmd_stages(args: argparse.Namespace) -> int:
    from .stages import STAGES

    width = max(map(len, STAGES))
    for name, st in STAGES.items():
        print(f"{name:<{width}}  {st.directory + '/':<12} {st.describe()}")
        for o in st.outputs:  # what the stage declares it writes, as the runner checks it
            cond = "; ".join(c for c in (o.when, f"{o.only} form only" if o.only else "") if c)
            print(f"{'':<{width}}    {o.path}" + (f"  ({cond})" if cond else ""))
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    from . import plugins

    found = plugins.load(strict=False)
    print(plugins.table(found) if found else f"no plug-ins installed (entry point groups: {', '.join(plugins.GROUPS.values())})")
    return 1 if any(p.error for p in found) else 0


def cmd_vnncomp(args: argparse.Namespace) -> int:
    from analysis.verification import vnncomp

    return vnncomp.main(args.args)


def cmd_config(args: argparse.Namespace) -> int:
    from .runner import validate

    print(json.dumps(validate(config_mod.load(args.config, args.overrides)).to_dict(), indent=2))
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from pathlib import Path

    from . import distributed
    from .shards import parse_shard
    from .sweep import Sweep, parse_axis, read_sweep, run_sweep

    if args.spec and "=" in args.spec and not Path(args.spec).exists():  # `pipeline sweep key=value ...` without a file
        args.overrides.insert(0, args.spec)
        args.spec = None
    sweep = read_sweep(args.spec) if args.spec else Sweep()
    if args.config:
        sweep.config = args.config
    for block in sweep.blocks if args.label else []:
        block.label = "-".join(x for x in (args.label, block.label) if x)
    sweep.set = [*sweep.set, *args.overrides]
    axes = dict(parse_axis(a) for a in args.grid)
    shard = parse_shard(args.shard) if args.shard else None
    if shard and args.report:
        raise PipelineError("--report with --shard would tabulate one shard: run `pipeline report <out_dir>` once every shard is done")
    world = distributed.init_from_env()
    args.interrupted_hint = "run the same `pipeline sweep` command again to go on (finished points are skipped)"
    try:
        summary = run_sweep(sweep, axes, out_dir=args.out, dry_run=args.dry_run, shard=shard)
        if args.report and not args.dry_run and world.main:
            from analysis.paper import write_report

            print(f"report: {write_report([summary['out_dir']])}")
    finally:
        distributed.shutdown()
    return 1 if any(p["status"] == "failed" for p in summary["points"]) else 0


def cmd_report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from analysis.paper import write_report
    from analysis.verification import vnncomp

    # a VNN-COMP benchmark folder (instances.csv) gets its shards' results merged; run directories get the report
    bench = [p for p in args.paths if Path(p, "instances.csv").is_file()]
    for folder in bench:
        merged = vnncomp.merge_shards(folder)
        if merged is None:
            raise PipelineError(f"{folder} holds no results.shard-K-of-N.csv: run `pipeline vnncomp {folder} --shard K/N` first")
        out, rows = merged
        print(f"{vnncomp.summary(rows)}; merged into {out}")
    runs = [p for p in args.paths if p not in bench]
    if runs or not bench:
        print(f"report: {write_report(runs, out=args.out, title=args.title)}")
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    from pathlib import Path

    from analysis import analyze

    if args.run and not Path(args.run, "config.json").is_file():
        raise PipelineError(f"{args.run} is not a run directory (no config.json); use --out DIR for a plain folder")
    out = Path(args.run, "analysis") if args.run else (Path(args.out) if args.out else None)
    res = analyze.write(out) if out else analyze.analyze()
    print(res["markdown"])
    if out:
        print(f"written: {out / 'analysis.md'}, {out / 'analysis.json'}")
    return 0


class Terminated(KeyboardInterrupt):
    """SIGTERM (what Slurm, Kubernetes and `kill` send) raised where the program is, so that it unwinds like
    Ctrl-C: the stage under way is marked interrupted, and the run resumes from its last checkpoint."""


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises `Terminated` for the duration (once: a second SIGTERM gets the previous handler, so a
    clean-up that hangs can still be stopped); the previous handler is restored afterwards."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, previous)
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# OS errors that are the user's to fix (permissions, a read-only or full disk): exit 2 with the fix, like PipelineError
FIXABLE_OS_ERRORS = {errno.EACCES: "fix its permissions, or use another folder", errno.EPERM: "fix its permissions, or use another folder",
                     errno.EROFS: "use a writable folder", errno.ENOSPC: "free some space", errno.EDQUOT: "free some space"}


COMMANDS = {"run": cmd_run, "stages": cmd_stages, "config": cmd_config, "analyze": cmd_analyze, "sweep": cmd_sweep, "report": cmd_report,
            "plugins": cmd_plugins, "vnncomp": cmd_vnncomp}


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "vnncomp":  # its own options (and --help) belong to the runner
        args.args = [*args.args, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        with sigterm_interrupts():
            return COMMANDS[args.command](args)
    except PipelineError as exc:  # the user's to fix: one line that names the fix
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        hint = getattr(args, "interrupted_hint", None)
        what = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
        print(f"{what}; {hint}" if hint else what, file=sys.stderr)
        return 128 + signal.SIGTERM if isinstance(exc, Terminated) else 128 + signal.SIGINT
    except Exception as exc:  # anything else is a bug or the environment: still one line, the traceback on request
        if args.debug:
            raise
        if isinstance(exc, OSError) and exc.errno in FIXABLE_OS_ERRORS:
            print(f"error: {exc.filename or 'a file'}: {exc.strerror}; {FIXABLE_OS_ERRORS[exc.errno]}", file=sys.stderr)
            return 2
        where = traceback.extract_tb(exc.__traceback__)[-1]
        print(f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
              f"(at {Path(where.filename).name}:{where.lineno}; rerun with --debug for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
