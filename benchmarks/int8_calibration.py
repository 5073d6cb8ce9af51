"""What an int8 calibration choice costs the model and buys the verifier (`quantize.percentile`): per run directory,
the int8 models' fidelity to fp32 (test argmax agreement, accuracy change, output SQNR, largest logit change; the int8
stage's `quantize.json`) beside what the verify stage decided on them (`verify/details.csv`) and their margin bounds.

Each run is a copy of one trained run with the int8 stage (and every stage after it) redone at one setting:

    cp -r runs/default /tmp/p99.5
    pipeline run --resume /tmp/p99.5 --redo int8 quantize.percentile=99.5
    python -m benchmarks.int8_calibration /tmp/p99.999 /tmp/p99.5 ... --out benchmarks/int8-results/calibration/calibration.json

With `quantize.clip_search` (the default) each model's clip is chosen by the int8 stage; a run at one setting alone
takes `quantize.clip_search=[]`.

Fidelity is the swapped ReLU form's (the file the verify stage's int8 rows are about).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path


def summarize(run: Path) -> dict:
    from analysis.robustness.properties import is_int8

    q = json.loads((run / "quantize" / "quantize.json").read_text())
    rows = [r for r in csv.DictReader(open(run / "verify" / "details.csv")) if r["stage"] != "clean"]
    summary = json.loads((run / "verify" / "summary.json").read_text())
    out = {"run": run.name, "calibration_method": q["settings"]["calibration_method"],
           # the run's config says it where the int8 stage that made the files did not record it yet
           "percentile": q["settings"].get("percentile",
                                           json.loads((run / "config.json").read_text())["quantize"].get("percentile")),
           "variants": {},
           "int8_solve_seconds": summary.get("int8_solve_seconds"), "solve_seconds": summary.get("solve_seconds")}
    for v, forms in q["models"].items():
        r = forms["relu"]
        mine = [x for x in rows if x["variant"] == f"{v}-int8" or (x["variant"] == v and not is_int8(x["variant"]))]
        i8 = [x for x in mine if is_int8(x["variant"])]
        fl = [x for x in mine if not is_int8(x["variant"])]
        margins = [float(x["margin_lb"]) for x in i8 if x["margin_lb"]]
        out["variants"][v] = {
            # the clip the int8 stage chose for this model (`quantize.clip_search`), where it recorded one
            **({"percentile": r["percentile"]} if "percentile" in r else {}),
            "test_argmax_agreement": r["test_argmax_agreement"], "test_drop_pt": round(r["test_drop_pt"], 3),
            "output_sqnr_db": round(r["output_sqnr_db"], 2), "test_max_logit_change": round(r["test_max_logit_change"], 2),
            "int8_decided": sum(x["result"] in ("sat", "unsat") for x in i8), "int8_properties": len(i8),
            "int8_unsat": sum(x["result"] == "unsat" for x in i8), "int8_sat": sum(x["result"] == "sat" for x in i8),
            "int8_open": {f"{x['sample']}@{x['eps']}": {"reason": x["reason"], "margin_lb": x["margin_lb"]}
                          for x in i8 if x["result"] not in ("sat", "unsat")},
            "int8_median_margin_lb": statistics.median(margins) if margins else None,
            "float_decided": sum(x["result"] in ("sat", "unsat") for x in fl), "float_properties": len(fl)}
    out["int8_decided"] = sum(v["int8_decided"] for v in out["variants"].values())
    out["int8_properties"] = sum(v["int8_properties"] for v in out["variants"].values())
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, help="write the summaries here as JSON (e.g. "
                    "benchmarks/int8-results/calibration/calibration.json); default: print only")
    args = ap.parse_args(argv)
    res = [summarize(r) for r in args.runs]
    for r in res:
        agree = " ".join(f"{v}:{e['test_argmax_agreement']:.4f}" for v, e in r["variants"].items())
        chosen = " ".join(f"{v}:{e['percentile']:g}" for v, e in r["variants"].items() if "percentile" in e)
        print(f"{r['run']}: percentile {r['percentile']}" + (f" (chosen {chosen})" if chosen else "")
              + f": int8 {r['int8_decided']}/{r['int8_properties']} decided; agreement {agree}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
