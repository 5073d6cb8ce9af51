"""Ours (`pipeline vnncomp`) beside α,β-CROWN (`abcrown_vnncomp.py`) on the same rows of a VNN-COMP folder, row by row,
optionally checked against published answers: `SUMMARY.md` (the counts table, the rows one tool alone decides, every
sat witness's onnxruntime re-check) and `side_by_side.csv` under --out.

    .venv/bin/python -m benchmarks.peers.abcrown_compare FOLDER --ours ours-*.csv --abcrown abcrown-*.csv \\
        --out benchmarks/peers/NAME [--published published-2021.csv --trusted a-b-CROWN ERAN VeriNet] [--title ...]

Several CSVs per tool are chunks of one run (each chunk one locked job with both tools). A published answer counts
where one of the `--trusted` columns decided the row (they are checked not to contradict each other); a tool's answer
is wrong where it is the other one. Times: each tool's run_time column (ours: verification, reading the network is
its prepare_time; α,β-CROWN: its own clock, with reading the network; its whole process, start-up included, is
`abcrown_process_s`, from the JSON beside its CSV).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

from analysis.verification.vnncomp import read_results, witness_path
from analysis.verification.vnnlib import read_instances_csv
from pipeline.atomic_io import atomic_write_text

from .run_neuralsat import check_witness
from .side_by_side import DECIDED, _key, tool_summary

# How VNN-COMP result files and tools spelled the two answers.
PUBLISHED = {"unsat": "unsat", "holds": "unsat", "sat": "sat", "violated": "sat"}


def published_answers(path: Path, trusted: list[str]) -> dict[str, str]:
    """vnnlib file name → the answer the `trusted` columns published (rows where none decided are left out); a row
    where they contradict each other raises ValueError naming it."""
    out = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            said = {PUBLISHED[r[t].strip().lower()] for t in trusted if r.get(t, "").strip().lower() in PUBLISHED}
            if len(said) > 1:
                raise ValueError(f"{path}: {r['vnnlib']}: the trusted tools contradict each other ({sorted(said)})")
            if said:
                out[Path(r["vnnlib"]).name] = said.pop()
    return out


def _rows(paths: list[Path]) -> tuple[dict[tuple[str, str], dict[str, Any]], dict[tuple[str, str], Path]]:
    rows, where = {}, {}
    for path in paths:
        for r in read_results(path):
            rows[_key(r["onnx"], r["vnnlib"])] = r
            where[_key(r["onnx"], r["vnnlib"])] = path
    return rows, where


def compare(folder: Path, ours: list[Path], abcrown: list[Path], published: dict[str, str]) -> list[dict[str, Any]]:
    """One row per instance both tools ran, in instances.csv's order."""
    mine, mine_at = _rows(ours)
    theirs, theirs_at = _rows(abcrown)
    extra = {_key(r["onnx"], r["vnnlib"]): r for p in abcrown if p.with_suffix(".json").is_file()
             for r in json.loads(p.with_suffix(".json").read_text())["rows"]}
    out = []
    for onnx, vnnlib, _ in read_instances_csv(folder / "instances.csv"):
        k = _key(onnx, vnnlib)
        if k not in mine or k not in theirs:
            continue
        truth = published.get(Path(vnnlib).name)
        row: dict[str, Any] = {"vnnlib": Path(vnnlib).stem, "ours": mine[k]["result"], "ours_s": round(mine[k]["run_time"], 3),
                               "abcrown": theirs[k]["result"], "abcrown_s": round(theirs[k]["run_time"], 3),
                               "abcrown_process_s": round(extra[k]["wall"], 3) if k in extra else None, "published": truth}
        for tool, at in (("ours", mine_at[k]), ("abcrown", theirs_at[k])):
            row[f"{tool}_wrong"] = truth is not None and row[tool] in DECIDED and row[tool] != truth
            if row[tool] == "sat":
                wit = witness_path(at, onnx, vnnlib)
                chk = check_witness(folder / onnx, folder / vnnlib, wit) if wit.is_file() else {"valid": False}
                row[f"{tool}_witness_valid"] = chk["valid"]
        out.append(row)
    return out


def markdown(rows: list[dict[str, Any]], title: str, names: dict[str, str]) -> str:
    from pipeline.render import table

    def line(tool: str) -> list[Any]:
        s = tool_summary(rows, tool, f"{tool}_s")
        wrong = sum(r[f"{tool}_wrong"] for r in rows)
        bad = sum(r.get(f"{tool}_witness_valid") is False for r in rows)
        return [names[tool], s["unsat"], s["sat"], s["timeout"] + s["unknown"], s["error"], wrong, bad,
                "—" if s["median_s_solved"] is None else f"{s['median_s_solved']:.2f}",
                f"{sum(r[f'{tool}_s'] for r in rows):.0f}"]

    one = [[r["vnnlib"], f"{r['ours']} ({r['ours_s']:.1f} s)", f"{r['abcrown']} ({r['abcrown_s']:.1f} s)",
            r["published"] or "—"] for r in rows if (r["ours"] in DECIDED) != (r["abcrown"] in DECIDED)]
    return (f"# {title}\n\n{len(rows)} instances.\n\n"
            + table(["tool", "unsat", "sat", "open", "error", "wrong", "invalid witness", "median s (decided)",
                     "sum of run_time s"], [line("ours"), line("abcrown")])
            + "\n\nOpen: timeout or unknown. Wrong: against the published answer. Invalid witness: a sat whose witness "
              "fails the onnxruntime re-check (`run_neuralsat.check_witness`).\n\n"
            + ("Decided by one tool only:\n\n" + table(["instance", "ours", "α,β-CROWN", "published"], one) + "\n"
               if one else "No instance is decided by one tool only.\n"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="the VNN-COMP folder both ran (its instances.csv gives the order)")
    p.add_argument("--ours", type=Path, nargs="+", required=True, help="pipeline vnncomp's results.csv (chunks)")
    p.add_argument("--abcrown", type=Path, nargs="+", required=True, help="abcrown_vnncomp.py's results.csv (chunks)")
    p.add_argument("--published", type=Path, help="a CSV of published answers: a vnnlib column and one per tool")
    p.add_argument("--trusted", nargs="+", default=[], help="the published columns to check against")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--title", default="Ours beside α,β-CROWN")
    p.add_argument("--abcrown-name", default="α,β-CROWN")
    args = p.parse_args(argv)
    if args.published and not args.trusted:
        print("error: --published needs --trusted (which of its columns to check against)", file=sys.stderr)
        return 2
    published = published_answers(args.published, args.trusted) if args.published else {}
    rows = compare(args.folder, args.ours, args.abcrown, published)
    args.out.mkdir(parents=True, exist_ok=True)
    cols = list(dict.fromkeys(k for r in rows for k in r))
    lines = [",".join(cols)] + [",".join("" if r.get(k) is None else str(r.get(k)) for k in cols) for r in rows]
    atomic_write_text(args.out / "side_by_side.csv", "\n".join(lines) + "\n")
    text = markdown(rows, args.title, {"ours": "ours (`pipeline vnncomp`)", "abcrown": args.abcrown_name})
    atomic_write_text(args.out / "SUMMARY.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
