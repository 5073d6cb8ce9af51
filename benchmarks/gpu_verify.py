"""The mnist_fc stand-in through `pipeline vnncomp` on a GPU, every sat witness re-checked, one summary table.

    python -m benchmarks.gpu_verify --out $OUT                      # on the GPU machine (benchmarks/gpu_verify.sh)
    python -m benchmarks.gpu_verify --device cpu --timeout 2 --jobs 2 --limit 6 --out /tmp/gv   # the same path on a CPU

Runs `analysis.verification.vnncomp.run_benchmark` on the folder (default runs/standins/mnist_fc, written by
`python -m benchmarks.standins`; carried to the GPU machine, so its nets are the ones the CPU results were measured on)
at `--timeout` seconds per instance with `--jobs` worker processes sharing the device. Then every sat witness is read
back and run through onnxruntime on its float32 X: it counts only if X lies in the box and the output violates the
property strictly (tolerance 0). A wrong answer is a witness that fails that, or a verdict that contradicts the
reference results (`--reference`, a CPU run's results.csv on the same nets: sat against unsat). Writes into --out (at most
8 files): results.csv (VNN-COMP's rows), instances.json (per instance: verdict, times, message, witness check),
witnesses.tar.gz, summary.md (the table), device.txt; the table is printed last.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import statistics
import sys
import tarfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REFERENCE = HERE / "standin-results" / "mnist_fc-30s.csv"
NETS_SHA = HERE / "standin-results" / "mnist_fc-nets.sha256"  # the nets REFERENCE was measured on


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def net_of(onnx_rel: str) -> str:
    """'onnx/mnist-net_256x4.onnx' -> '256x4' (the depth column)."""
    return Path(onnx_rel).name.split("_")[-1].removesuffix(".gz").removesuffix(".onnx")


def device_report(device: str) -> str:
    import torch

    lines = [f"python {platform.python_version()}, torch {torch.__version__}, device {device}"]
    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(torch.device(device))
        free, total = torch.cuda.mem_get_info(torch.device(device))
        lines.append(f"{p.name}, {p.multi_processor_count} SMs, {total / 2**30:.1f} GiB ({free / 2**30:.1f} free)")
    try:
        import os

        lines.append(f"{os.cpu_count()} CPU cores")
    except Exception:  # pragma: no cover
        pass
    return "\n".join(lines)


def reference_verdicts(reference: Path, folder: Path) -> tuple[dict[tuple[str, str], str], str]:
    """The reference run's verdicts when it was measured on these nets (their sha256 in NETS_SHA), else none and why."""
    from analysis.verification.vnncomp import read_results

    if not reference.is_file():
        return {}, f"no reference file {reference}"
    if reference.resolve() == REFERENCE.resolve() and NETS_SHA.is_file():
        want = dict(line.split()[::-1] for line in NETS_SHA.read_text().splitlines() if line.strip())
        for name, digest in want.items():
            p = folder / "onnx" / name
            if not p.is_file() or sha256(p) != digest:
                return {}, f"{p} is not the net the reference was measured on (sha256 differs): no comparison"
    return {(r["onnx"], r["vnnlib"]): r["result"] for r in read_results(reference)}, f"reference {reference}"


def check_witnesses(folder: Path, out_csv: Path, rows: list[dict[str, Any]]) -> None:
    """Each sat row gets `witness`: the onnxruntime re-check of its witness file (valid only when strictly unsafe)."""
    import tempfile

    from analysis.verification.vnncomp import _plain, witness_path
    from benchmarks.peers.run_neuralsat import check_witness

    with tempfile.TemporaryDirectory(prefix="gpu_verify_") as tmp:
        for r in rows:
            if r["result"] != "sat":
                continue
            w = witness_path(out_csv, r["onnx"], r["vnnlib"])
            if not w.is_file():
                r["witness"] = {"valid": False, "why": f"no witness file {w.name}"}
                continue
            c = check_witness(_plain(folder / r["onnx"], Path(tmp)), _plain(folder / r["vnnlib"], Path(tmp)), w)
            c["valid"] = bool(c["box_excess"] == 0 and c["unsafe_margin"] < 0)  # inside the box, strictly unsafe
            r["witness"] = c


def table(rows: list[dict[str, Any]], ref: dict[tuple[str, str], str], wall_s: float, timeout: float, device: str,
          jobs: int) -> tuple[str, dict[str, Any]]:
    decided = [r for r in rows if r["result"] in ("sat", "unsat")]
    bad_witness = [r for r in rows if r["result"] == "sat" and not r.get("witness", {}).get("valid")]
    contradict = [r for r in decided if ref.get((r["onnx"], r["vnnlib"])) in ("sat", "unsat")
                  and ref[(r["onnx"], r["vnnlib"])] != r["result"]]
    nets = sorted({net_of(r["onnx"]) for r in rows}, key=lambda n: (len(n), n))
    per = {n: (sum(net_of(r["onnx"]) == n for r in decided), sum(net_of(r["onnx"]) == n for r in rows)) for n in nets}
    secs = [float(r["run_time"]) for r in decided]
    c = Counter(r["result"] for r in rows)
    ref_decided = sum(v in ("sat", "unsat") for v in ref.values()) if ref else None
    lines = [f"| mnist_fc stand-in, {timeout:g} s per instance, {device}, {jobs} jobs | value |", "|---|---|",
             f"| decided | {len(decided)}/{len(rows)} (sat {c['sat']}, unsat {c['unsat']}) |"]
    lines += [f"| {n} | {d}/{t} |" for n, (d, t) in per.items()]
    not_run = sum("not run" in (r.get("message") or "") for r in rows)
    lines += [f"| timeout / unknown / error | {c['timeout']} / {c['unknown']} / {c['error']} "
              f"({not_run} of the timeouts not run: the wall budget) |",
              f"| median s over decided | {statistics.median(secs):.3f} |" if secs else "| median s over decided | - |",
              f"| wrong answers | {len(bad_witness) + len(contradict)} (witnesses failing onnxruntime: {len(bad_witness)}, "
              f"verdicts against the reference: {len(contradict)}) |",
              f"| witnesses checked (strictly unsafe in onnxruntime) | {c['sat'] - len(bad_witness)}/{c['sat']} |",
              f"| reference (CPU) decided | {ref_decided if ref_decided is not None else '-'} |",
              f"| wall time | {wall_s:.0f} s |"]
    summary = {"decided": len(decided), "instances": len(rows), "by_net": per, "counts": dict(c),
               "median_decided_s": statistics.median(secs) if secs else None, "wrong": len(bad_witness) + len(contradict),
               "bad_witnesses": [(r["onnx"], r["vnnlib"]) for r in bad_witness],
               "contradictions": [(r["onnx"], r["vnnlib"], r["result"], ref[(r["onnx"], r["vnnlib"])]) for r in contradict],
               "not_run": not_run, "wall_s": wall_s, "timeout_s": timeout, "device": device, "jobs": jobs, "reference_decided": ref_decided}
    return "\n".join(lines), summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--folder", default="runs/standins/mnist_fc", help="the stand-in folder (instances.csv, onnx/, vnnlib/)")
    p.add_argument("--out", default="gpu-verify-out", help="where the (at most 8) result files go")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per instance (wall)")
    p.add_argument("--jobs", type=int, default=12, help="worker processes (they share the device)")
    p.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu | auto")
    p.add_argument("--limit", type=int, default=0, help="only the first N instances (0: all), for a quick check")
    p.add_argument("--reference", default=str(REFERENCE), help="a results.csv to compare verdicts with (same nets)")
    p.add_argument("--options", default="", help="verifier options K=V,... (integers), e.g. rebound=1,refine=0")
    p.add_argument("--budget", type=float, default=0.0, help="wall seconds for the whole run (0: none): no instance "
                   "runs past it and one not begun by then counts as a timeout 'not run', so the table comes out inside "
                   "an outer limit")
    args = p.parse_args(argv)

    from analysis.verification.harness import resolve_device
    from analysis.verification.vnncomp import BenchmarkError, run_benchmark
    from analysis.verification.vnnlib import read_instances_csv, write_instances_csv
    from pipeline.errors import DeviceError

    folder, out = Path(args.folder), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not (folder / "instances.csv").is_file():
        print(f"error: {folder}/instances.csv is missing; build the stand-in with `python -m benchmarks.standins --out "
              f"runs/standins --only mnist_fc` (or carry runs/standins/mnist_fc)", file=sys.stderr)
        return 2
    try:
        device = resolve_device(args.device, setting="--device ")
    except DeviceError as e:  # one line, in the words of this script's flag
        print(f"error: {e}", file=sys.stderr)
        return 2
    options = {k: int(v) for k, v in (kv.split("=") for kv in args.options.split(",") if kv)}
    info = device_report(device)
    nets = {p.name: sha256(p)[:16] for p in sorted((folder / "onnx").glob("*.onnx"))}
    (out / "device.txt").write_text(info + "\n" + "\n".join(f"{k} sha256 {v}…" for k, v in nets.items()) + "\n")
    print(info, flush=True)
    instances = "instances.csv"
    if args.limit:
        rows_in = read_instances_csv(folder / "instances.csv")[: args.limit]
        instances = f"instances-first-{args.limit}.csv"
        write_instances_csv(folder / instances, rows_in)
    out_csv = out / "results.csv"
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    try:
        rows = run_benchmark(folder, out_csv, args.timeout, "auto", "mnist_fc", "wall", instances, log, args.jobs,
                             None, device=device, wall_s=args.budget or None, **options)
    except (BenchmarkError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    wall = time.perf_counter() - t0
    check_witnesses(folder, out_csv, rows)
    ref, why = reference_verdicts(Path(args.reference), folder)
    text, summary = table(rows, ref, wall, args.timeout, device, args.jobs)
    summary["reference"] = why
    summary["options"] = options
    with tarfile.open(out / "witnesses.tar.gz", "w:gz") as tar:
        for w in sorted((out / "counterexamples").glob("*.counterexample")):
            tar.add(w, arcname=w.name)
    for w in (out / "counterexamples").glob("*.counterexample"):
        w.unlink()
    if (out / "counterexamples").is_dir():
        (out / "counterexamples").rmdir()
    per_instance = [{k: v for k, v in r.items() if k != "info"} | {"info": {k: v for k, v in r.get("info", {}).items()
                                                                          if isinstance(v, (int, float, str, dict))}}
                    for r in rows]
    (out / "instances.json").write_text(json.dumps({"summary": summary, "instances": per_instance}, indent=1, default=str))
    (out / "summary.md").write_text(f"{why}\n\n{text}\n")
    print(f"\n{why}\n{text}", flush=True)
    return 1 if summary["wrong"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
