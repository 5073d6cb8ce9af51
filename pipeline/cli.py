"""`pipeline` command line: parses arguments and calls library functions, nothing else."""

from __future__ import annotations

import argparse
import json
import sys

from . import config as config_mod
from .errors import PipelineError

EPILOG = """examples:
  pipeline run                                   # default: Fashion-MNIST, MLP 4x256, λ-GELU + GELU baseline
  pipeline run -c configs/digits-tiny.toml       # a ready config
  pipeline run train.epochs=5 data.name=adult    # key.sub=value overrides
  pipeline run --resume runs/<name>              # continue a killed run where it stopped
  pipeline stages                                # list the stages in run order
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pipeline", description="λ-GELU: train, harden, swap to ReLU, deploy.",
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run (or resume) the staged pipeline", formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=EPILOG)
    r.add_argument("-c", "--config", help="TOML/YAML/JSON config file (defaults: the built-in Fashion-MNIST run)")
    r.add_argument("--resume", metavar="RUN_DIR", help="resume this run directory with its own config.json")
    r.add_argument("--redo", action="append", default=[], metavar="STAGE", help="rerun STAGE and every later stage")
    r.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides, e.g. train.epochs=5")
    sub.add_parser("stages", help="list the stages in run order")
    c = sub.add_parser("config", help="print the resolved config as JSON")
    c.add_argument("-c", "--config")
    c.add_argument("overrides", nargs="*")
    return p


def cmd_run(args: argparse.Namespace) -> int:
    from .rundir import RunDir, atomic_write_json
    from .stages import run_pipeline

    if args.resume:
        if args.config:
            raise PipelineError("--resume uses the run's own config.json; drop -c/--config (overrides are allowed)")
        run = RunDir.open(args.resume)
        if args.overrides:  # e.g. a lower lr after a NaN: recorded in config.json and the manifest
            config_mod.validate(config_mod.apply_overrides(run.cfg, args.overrides))
            atomic_write_json(run.file("config.json"), run.cfg.to_dict())
            m = run.manifest()
            m.setdefault("resumed_with", []).append(args.overrides)
            run._write_manifest(m)
    else:
        cfg = config_mod.load(args.config, args.overrides)
        run = RunDir.create(cfg, argv=sys.argv)
    print(f"run directory: {run.path}")
    run_pipeline(run.cfg, run, redo=args.redo)
    print(f"finished: {run.path}")
    return 0


def cmd_stages(args: argparse.Namespace) -> int:
    from .stages import STAGES

    width = max(map(len, STAGES))
    for name, st in STAGES.items():
        print(f"{name:<{width}}  {st.directory + '/':<12} {st.help}")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    print(json.dumps(config_mod.load(args.config, args.overrides).to_dict(), indent=2))
    return 0


COMMANDS = {"run": cmd_run, "stages": cmd_stages, "config": cmd_config}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; resume with `pipeline run --resume <run dir>`", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
