"""Does α,β-CROWN's loader read the verifiers' form of every built-in architecture (`export_for_verifiers`, the files
the verify stage ships in verify/onnx/), and does auto_LiRPA bound what it read? Each architecture's tiny instance
(random weights, `analysis.robustness.coverage.TINY`, made as `readers.tiny_cases` makes it), three loaders, each
checked against onnxruntime on 8 inputs by `read_check.py`:

- α,β-CROWN: its fork of onnx2pytorch at the commit its `load_model.py` pins (`abcrown_loader_setup.sh`), called as
  `load_model_onnx` calls it, then auto_LiRPA's `BoundedModule` and one CROWN pass whose bounds must hold at 512
  points of the ε box: what α,β-CROWN does before its own search;
- auto_LiRPA 0.7.1 behind onnx2pytorch 0.6.0 (PyPI), the same CROWN check;
- onnx2pytorch 0.6.0 alone.

    bash benchmarks/peers/auto_lirpa_setup.sh && bash benchmarks/peers/abcrown_loader_setup.sh
    flock /tmp/heavy.lock .venv/bin/python -m benchmarks.peers.abcrown_loader --out benchmarks/peers/abcrown-loader

Writes `--out`/record.json (every row of read_check.py, the versions, the commit) and `--out`/SUMMARY.md.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from .. import common
from .readers import ROOT, run_loader, tiny_cases, why, write_record

TOOLS = {"abcrown": "α,β-CROWN's loader + auto_LiRPA CROWN", "auto_lirpa": "onnx2pytorch 0.6.0 + auto_LiRPA CROWN",
         "onnx2pytorch": "onnx2pytorch 0.6.0"}


def cell(result: dict) -> str:
    """`readers.why`, and where the loader read the file but auto_LiRPA's pass failed, both facts."""
    if not result["read"] and result.get("stage") == "bound":
        return f"loaded (same function as onnxruntime); CROWN failed: {result['error']}"
    return why(result)


def markdown(record: dict) -> str:
    from pipeline.render import table

    rows = [[c["name"].removesuffix(" (float ReLU)"), c["ops"], *[cell(c["results"][t]) for t in TOOLS]] for c in record["cases"]]
    read = {t: sum(c["results"][t]["read"] for c in record["cases"]) for t in TOOLS}
    return (f"# α,β-CROWN's loader on the verifiers' form of every built-in architecture\n\n"
            f"Made by `benchmarks/peers/abcrown_loader.py` on {record['commit']} ({record['seconds']:.0f} s). Versions: "
            + "; ".join(f"{TOOLS[t]}: {v}" for t, v in record["versions"].items()) + ".\n\n"
            + "Read, of " + f"{len(record['cases'])}: " + ", ".join(f"{TOOLS[t]} {read[t]}" for t in TOOLS) + ".\n\n"
            + table(["architecture (float ReLU file)", "ops", *TOOLS.values()], rows)
            + "\n\nRead: the loader's model computes onnxruntime's outputs on 8 inputs (within 1e-4·(1 + max|y|)); with "
            "auto_LiRPA also one CROWN pass (its time in the cell) whose bounds hold at 512 points of the box.\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "peers" / "abcrown-loader")
    p.add_argument("--venv", type=Path, default=ROOT / ".peers" / "auto_lirpa", help="auto_LiRPA's venv (auto_lirpa_setup.sh)")
    p.add_argument("--loader", type=Path, default=ROOT / ".peers" / "abcrown_loader",
                   help="α,β-CROWN's onnx2pytorch fork (abcrown_loader_setup.sh)")
    args = p.parse_args(argv)
    for need, script in ((args.venv / "bin" / "python", "auto_lirpa_setup.sh"), (args.loader / "onnx2pytorch", "abcrown_loader_setup.sh")):
        if not need.exists():
            p.error(f"{need} is missing: run benchmarks/peers/{script}")
    import onnx

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="abcrown-loader-") as tmp:
        cases = [c for c in tiny_cases(Path(tmp)) if c["kind"] == "float ReLU"]
        versions, results = {}, {}
        for tool in TOOLS:
            versions[tool], results[tool] = run_loader(tool, args.venv, cases, Path(tmp), args.loader if tool == "abcrown" else None)
        ops = {c["name"]: ", ".join(sorted({n.op_type for n in onnx.load(c["onnx"]).graph.node})) for c in cases}
    record = {"commit": common.commit(), "seconds": time.perf_counter() - t0, "versions": versions,
              "cases": [{"name": c["name"], "architecture": c["architecture"], "signature": c["signature"], "ops": ops[c["name"]],
                         "results": {t: {k: v for k, v in results[t][c["name"]].items() if k != "onnx"} for t in TOOLS}}
                        for c in cases]}
    write_record(args.out, record, markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
