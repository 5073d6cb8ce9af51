"""Record what `benchmarks/gpu.sh` measured on a GPU machine into benchmarks/results.json (its `gpu` section) and
RESULTS.md, with the device named. Run here, on the folder the device tool brought back:

    python -m benchmarks.gpu_record /work/.device/N [--results benchmarks/results.json]

The section keeps `ratio_vs_gelu` per op case and `training_path` (the kernel each case ran: the Triton kernels,
through the launcher `kernels.status()` names) and adds the epochs, the default run's stage times and the tests.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from pipeline.stages import STAGES

from . import report

HERE = Path(__file__).resolve().parent
# The GPU issue's goals (op ÷ nn.GELU, epoch ÷ GELU epoch, the default run's times)
OP_GOAL = {"128x256 fp32": 1.25}
OP_GOAL_DEFAULT = 1.10
EPOCH_GOAL = {"lambda_gelu": 1.05, "lambda_gelu[frozen]": 1.02}
RESNET_GOAL = 1.05
TRAIN_HARDEN_GOAL_S = 15.0
RUN_GOAL_S = 90.0


def _tests(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    text = path.read_text()
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|errors?|skipped)", text)}
    failed = re.findall(r"^FAILED (\S+)", text, re.M)
    # pytest's last line ("N passed ... in 12.3s"): without it the run was cut off (gpu.sh's timeout) and its counts
    # say nothing about the tests it never reached
    finished = re.search(r"^=*\s*\d+ (passed|failed|errors?|skipped|deselected).* in [\d.]+s", text, re.M) is not None
    return {"counts": counts, "failed": failed, "finished": finished}


def section(folder: Path) -> dict[str, Any]:
    gpu = json.loads((folder / "gpu.json").read_text())
    sec: dict[str, Any] = {"device": gpu["device"], "versions": gpu.get("versions"), "written": gpu.get("written")}
    dev_txt = folder / "device.txt"
    if dev_txt.is_file():
        sec["device_info"] = dev_txt.read_text().strip().splitlines()
    op = gpu.get("op", {})
    if "cases" in op:
        launcher = op.get("kernel_status", {}).get("triton", {}).get("launcher")
        sec["copy_GBps"] = op["copy_GBps"]
        sec["op"] = [{**c, "training_path": f"triton ({launcher['kind'] if launcher else 'launcher unknown'})"}
                     for c in op["cases"]]
    elif op:
        sec["op_error"] = op.get("error")
    if "rows" in gpu.get("epochs", {}):
        sec["epochs"] = gpu["epochs"]["rows"]
    if gpu.get("compile"):
        sec["compile"] = gpu["compile"]
    st = folder / "stage-seconds.json"
    if st.is_file():
        sec["default_run"] = json.loads(st.read_text())
    sw = folder / "swap.json"
    if sw.is_file():
        sec["default_run_swap"] = json.loads(sw.read_text())
    sec["tests"] = {name: t for name, t in (("cuda", _tests(folder / "cuda-tests.log")),
                                            ("fast_suite", _tests(folder / "fast-suite.log"))) if t}
    comp = folder / "compile.json"
    if comp.is_file():
        sec["compile"] = json.loads(comp.read_text()).get("compile")
    ver = folder / "verify.tar.gz"
    if ver.is_file():
        import tarfile

        with tarfile.open(ver) as tar:
            member = next((m for m in tar.getmembers() if m.name.endswith("instances.json")), None)
            if member is not None:
                sec["verify"] = json.loads(tar.extractfile(member).read())["summary"]
    return sec


def goals(sec: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    dev = sec["device"]
    for c in sec.get("op", []):
        target = OP_GOAL.get(c["case"], OP_GOAL_DEFAULT)
        for k in ("lambda_gelu", "lambda_gelu[frozen]"):
            r = c["ratio_vs_gelu"][k]
            out.append({"goal": f"{dev}: op {c['case']} {'learned' if k == 'lambda_gelu' else 'frozen'} ÷ nn.GELU",
                        "target": f"≤ {target:.2f}×", "measured": {"median": r, "min": r, "max": r}, "unit": "×",
                        "digits": 3, "met": r <= target,
                        "note": f"host µs over GELU's {c['host_minus_gelu_us'][k]:+.1f}; kernels fwd "
                                f"{c['kernels_ms']['learned' if k == 'lambda_gelu' else 'frozen']['forward_share_of_copy']:.0%}, bwd "
                                f"{c['kernels_ms']['learned' if k == 'lambda_gelu' else 'frozen']['backward_share_of_copy']:.0%} of copy"})
    for row in sec.get("epochs", []):
        if row["path"] != "cuda_graph":
            continue
        resnet = row["setup"].startswith("ResNet")
        for k, target in EPOCH_GOAL.items():
            if resnet and k != "lambda_gelu":
                continue
            r = row["ratio_vs_gelu"][k]
            t = RESNET_GOAL if resnet else target
            out.append({"goal": f"{dev}: epoch {row['setup']} {k} ÷ GELU", "target": f"≤ {t:.2f}×", "measured": r,
                        "unit": "×", "digits": 3, "met": r["median"] <= t, "note": "whole-step CUDA graphs"})
    run = sec.get("default_run")
    if run:
        stages = run["stages"]
        th = sum(stages.get(s, {}).get("seconds") or 0 for s in ("train", "harden"))
        out.append({"goal": f"{dev}: default run, train + harden", "target": f"≤ {TRAIN_HARDEN_GOAL_S:g} s",
                    "measured": {"median": th, "min": th, "max": th}, "unit": " s", "digits": 1,
                    "met": th <= TRAIN_HARDEN_GOAL_S, "note": json.dumps(run.get("training_path", {}).get("train", {}))})
        tot = run["total_s"]
        # every stage must have run and finished: a run that stopped at a failed stage is fast, not met
        unfinished = [f"{s} ({stages[s].get('status')})" if s in stages else f"{s} (not run)"
                      for s in STAGES if stages.get(s, {}).get("status") != "done"]
        out.append({"goal": f"{dev}: default run, every stage", "target": f"≤ {RUN_GOAL_S:g} s, every stage done",
                    "measured": {"median": tot, "min": tot, "max": tot}, "unit": " s", "digits": 1,
                    "met": tot <= RUN_GOAL_S and not unfinished,
                    "note": ", ".join(f"{s} {v['seconds']:.1f}" for s, v in stages.items() if v.get("seconds") is not None)
                    + (f"; not done: {', '.join(unfinished)}" if unfinished else "")})
    swap = sec.get("default_run_swap", {}).get("lambda_gelu")
    if swap:
        lossless = swap["val_after"] == swap["val_before"] and swap["test_after"] == swap["test_before"]
        out.append({"goal": f"{dev}: the default run's λ-GELU swap is lossless", "target": "val and test unchanged",
                    "measured": {"median": swap["test_after"] - swap["test_before"], "min": 0, "max": 0}, "unit": "",
                    "digits": 4, "met": lossless, "note": f"argmax agreement {swap['argmax_agreement']:.4f}"})
    v = sec.get("verify")
    if v:
        out.append({"goal": f"{dev}: mnist_fc stand-in at {v['timeout_s']:g} s, decided", "target": "≥ 80/90",
                    "measured": {"median": v["decided"], "min": v["decided"], "max": v["decided"]}, "unit": f"/{v['instances']}",
                    "digits": 0, "met": v["decided"] >= 80 and v["instances"] == 90,
                    "note": f"{v['jobs']} worker processes sharing the GPU; by depth {v['by_net']}; median decided "
                            f"{v['median_decided_s']} s; CPU reference decided {v.get('reference_decided')}"})
        out.append({"goal": f"{dev}: mnist_fc stand-in, wrong answers", "target": "0",
                    "measured": {"median": v["wrong"], "min": v["wrong"], "max": v["wrong"]}, "unit": "", "digits": 0,
                    "met": v["wrong"] == 0, "note": "witnesses replayed in onnxruntime at tolerance 0; verdicts against the CPU reference"})
    for name, t in sec.get("tests", {}).items():
        bad = t["counts"].get("failed", 0) + t["counts"].get("error", 0) + t["counts"].get("errors", 0)
        done = t.get("finished", True)
        out.append({"goal": f"{dev}: {name} tests", "target": "0 failures, run to the end",
                    "measured": {"median": bad, "min": bad, "max": bad}, "unit": "", "digits": 0, "met": bad == 0 and done,
                    "note": ", ".join(f"{v} {k}" for k, v in t["counts"].items())
                    + (("; failed: " + ", ".join(t["failed"][:8])) if t["failed"] else "")
                    + ("" if done else "; cut off before pytest's summary line (gpu.sh's time limit)")})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_record", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path)
    p.add_argument("--results", type=Path, default=HERE / "results.json")
    args = p.parse_args(argv)
    if not (args.folder / "gpu.json").is_file():
        print(f"gpu_record: {args.folder} has no gpu.json; give the folder benchmarks/gpu.sh wrote", file=sys.stderr)
        return 2
    results = json.loads(args.results.read_text())
    sec = section(args.folder)
    sec["goals"] = goals(sec)
    results["sections"]["gpu"] = sec
    results["goals"] = [g for g in results.get("goals", []) if not g["goal"].startswith(tuple(
        {g2["goal"].split(":")[0] + ":" for g2 in sec["goals"]}))] + sec["goals"]
    args.results.write_text(json.dumps(results, indent=1, ensure_ascii=False, default=str) + "\n")
    md = args.results.with_name("RESULTS.md" if args.results.name == "results.json" else
                                args.results.name.replace("results", "RESULTS").replace(".json", ".md"))
    md.write_text(report.markdown(results))
    for g in sec["goals"]:
        print(f"{'met ' if g['met'] else 'MISS'}  {g['goal']}: {g['measured']['median']:.3f}{g['unit']} ({g['target']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
