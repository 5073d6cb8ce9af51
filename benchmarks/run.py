"""Run every benchmark and write results.json and RESULTS.md.

    python -m benchmarks.run                    # full profile (~15 min on 2 cores): benchmarks/results.json, RESULTS.md
    python -m benchmarks.run --quick            # minutes: smaller tensors and data, digits end to end (results-quick.*)
    python -m benchmarks.run --sizes tiny       # seconds: the test suite's smoke run
    python -m benchmarks.run --only op,train    # some sections; merged into the existing results file

Sections: op (λ-GELU vs F.gelu forward+backward, bytes saved for backward), train (epoch time), inference
(onnxruntime fp32 vs int8), e2e (`pipeline run` wall time per stage), kernel (the fused CPU kernel's
one-time build against what it saves per run), gpu (op and train on CUDA, or the reason they were skipped).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

from pipeline import kernels
from pipeline.config import Config
from pipeline.kernels import inductor

from . import common, report

SECTION_NAMES = ("op", "train", "inference", "e2e", "kernel", "gpu")
HERE = Path(__file__).resolve().parent


def _cfg(**over: Any) -> Config:
    cfg = Config()
    for dotted, value in over.items():
        obj = cfg
        *path, last = dotted.split("__")
        for p in path:
            obj = getattr(obj, p)
        setattr(obj, last, value)
    return cfg


# profile -> settings. The full profile is the issue's: 4096×4096 op, default MLP and the CNN, default `pipeline run`.
PROFILES: dict[str, dict[str, Any]] = {
    "full": {
        "op": [((4096, 4096), 15, 1), ((128, 256), 15, 100)],  # (shape, reps, calls per rep)
        "train": [(lambda: _cfg(), 7, None),
                  (lambda: _cfg(model__name="cnn", data__subset=10000, train__grad_clip=1.0), 3, ["gelu", "relu", "lambda_gelu", "lambda_gelu[frozen]"])],
        "inference": (lambda: _cfg(), 200),
        "e2e": [],
        "kernel": ["stages=train,harden"],  # the default job's stages the kernel changes, default threads (auto)
        "gpu": {"op": [((4096, 4096), 20, 1)], "train": [(lambda: _cfg(device="cuda"), 3, None)]},
        "compile": True,
    },
    "quick": {
        "op": [((1024, 1024), 7, 2), ((128, 256), 7, 30)],
        "train": [(lambda: _cfg(data__subset=10000), 2, None),
                  (lambda: _cfg(model__name="cnn", data__subset=3000, train__grad_clip=1.0), 2, ["gelu", "relu", "lambda_gelu"])],
        "inference": (lambda: _cfg(), 50),
        "e2e": ["data.name=digits", "train.epochs=2"],
        "kernel": ["data.name=digits", "train.epochs=2", "stages=train,harden"],
        "gpu": {"op": [((2048, 2048), 10, 1)], "train": [(lambda: _cfg(device="cuda", data__subset=10000), 2, None)]},
        "compile": True,
    },
    "tiny": {
        "op": [((64, 64), 3, 2)],
        "train": [(lambda: _cfg(data__name="digits", data__subset=300, model__hidden=[32, 32]), 1, None),
                  (lambda: _cfg(data__name="digits", data__subset=200, model__name="cnn", model__channels=[4, 8],
                                model__cnn_hidden=16), 1, ["gelu", "relu", "lambda_gelu"])],
        "inference": (lambda: _cfg(data__name="digits", model__hidden=[32, 32], quantize__calibration_samples=64), 3),
        "e2e": ["data.name=digits", "train.epochs=2", "data.subset=300", "model.hidden=[32,32]",
                "stages=train,harden,swap", "variants=lambda_gelu,gelu", "threads=1"],
        "kernel": None,  # a build takes a minute: not for a smoke run
        "gpu": {"op": [((64, 64), 3, 1)], "train": []},
        "compile": False,  # torch.compile takes 10–30 s per graph: not for a smoke run
    },
}


def _op_section(prof: dict[str, Any], device: str, compile_ok: bool | None) -> dict[str, Any]:
    from .op import bench_op

    return {"results": [bench_op(shape, reps, device, inner, compile_ok=compile_ok) for shape, reps, inner in prof]}


def _train_section(prof: list, device: str | None = None) -> dict[str, Any]:
    from .training import bench_epochs

    results = []
    for make, reps, variants in prof:
        cfg = make()
        dev = device or cfg.device
        results.append(bench_epochs(cfg, reps, "cpu" if dev == "auto" else dev, variants))
    return {"results": results}


def _inference_section(prof) -> dict[str, Any]:
    from .inference import bench_inference

    make, reps = prof
    return {"result": bench_inference(make(), reps)}


def _e2e_section(overrides: list[str], profile: str) -> dict[str, Any]:
    from pipeline.stages import STAGES

    from .end_to_end import bench_pipeline

    missing = [s for s in ("export", "int8") if s not in STAGES]
    note = ("default config, all stages, every default variant" if profile == "full"
            else "digits, 2 epochs (--quick)" if profile == "quick" else "tiny smoke run")
    if missing:
        note += f"; stages {', '.join(missing)} do not exist yet, so this is not the full pipeline"
    return {"note": note, "result": bench_pipeline(overrides)}


def _kernel_section(overrides: list[str] | None) -> dict[str, Any]:
    if overrides is None:
        return {"skipped": "the tiny profile does not build the kernel (about a minute); use --quick or the full profile"}
    from pipeline.kernels import cpu

    from .first_build import bench_first_build

    if not cpu.build():
        return {"skipped": f"no fused CPU kernel on this machine: {cpu.status.error}"}
    return {"result": bench_first_build(overrides)}


def _gpu_section(prof: dict[str, Any]) -> dict[str, Any]:
    if not torch.cuda.is_available():
        why = "no CUDA device" + ("" if torch.version.cuda else f" (torch {torch.__version__} is a CPU-only build)")
        return {"skipped": f"{why}; run `python -m benchmarks.run --only gpu` on a machine with a GPU"}
    compile_ok = inductor.unavailable("cuda") is None
    return {"device": torch.cuda.get_device_name(0), "compile_ok": compile_ok,
            "op": _op_section(prof["op"], "cuda", compile_ok)["results"],
            "train": _train_section(prof["train"], "cuda")["results"] if prof["train"] else []}


def goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's goals, evaluated on the largest op shape, the default MLP, and the default run."""
    out = []
    sec = results["sections"]
    op = sec.get("op", {}).get("results")
    if op:
        big = max(op, key=lambda r: torch.Size(r["shape"]).numel())
        shape = "×".join(map(str, big["shape"]))
        path = big["training_path"]
        r = big["ratio_vs_gelu"][path]
        others = [f"`{k}` {v['median']:.2f}× ({v['min']:.2f}–{v['max']:.2f})" for k, v in big["ratio_vs_gelu"].items()
                  if k in ("lambda_gelu[inductor]", "compiled_expression")]
        out.append({"goal": f"λ-GELU fwd+bwd (x and λ grads) on the training path `{path}`, {shape}",
                    "target": "≤ 1.10× F.gelu", "measured": r, "unit": "×", "met": r["median"] <= 1.10,
                    "note": "torch.compile: " + ", ".join(others) if others else ""})
        e = big["ratio_vs_gelu"].get("lambda_gelu[eager]")
        if e:
            out.append({"goal": f"λ-GELU fwd+bwd, plain eager (`lambda_gelu[eager]`, native ops only), {shape}",
                        "target": "≤ 3× F.gelu", "measured": e, "unit": "×", "met": e["median"] <= 3.0})
        extra = big["extra_saved_bytes_vs_gelu"][path]
        out.append({"goal": "memory saved for backward, training path", "target": "≤ GELU's + one λ (4 bytes) per layer",
                    "measured": {"median": extra, "min": extra, "max": extra}, "unit": " B", "digits": 0,
                    "met": extra <= 4, "note": f"GELU saves {big['saved_bytes']['gelu']} B; λ-GELU {big['saved_bytes'][path]} B"})
    tr = sec.get("train", {}).get("results")
    if tr:
        mlp = tr[0]
        r = mlp["ratio_vs_gelu"]["lambda_gelu"]
        default = mlp["data"] == "fashion_mnist" and mlp["train_examples"] >= 50000
        note = "" if default else f"not the default size ({mlp['data']}, {mlp['train_examples']} examples)"
        for key, label in (("lambda_gelu[frozen]", "frozen λ (harden stage)"),
                           ("lambda_gelu[λ_nodes]", "λ(s) by autograd nodes outside the op (before the change)")):
            if key in mlp["ratio_vs_gelu"]:
                fr = mlp["ratio_vs_gelu"][key]
                note = (note + "; " if note else "") + f"{label}: {fr['median']:.3f}× ({fr['min']:.3f}–{fr['max']:.3f})"
        out.append({"goal": "training epoch, default MLP, λ learned", "target": "≤ 1.05× the GELU epoch",
                    "measured": r, "unit": "×", "digits": 3, "met": r["median"] <= 1.05 if default else None, "note": note})
    e2e = sec.get("e2e", {}).get("result")
    if e2e:
        default = results["profile"] == "full"
        w = e2e["wall_s"]
        top = sorted(((v["seconds"] or 0, k) for k, v in e2e["stages"].items()), reverse=True)[:3]
        out.append({"goal": "default `pipeline run`, all stages, all default variants", "target": "≤ 300 s on 2 cores",
                    "measured": {"median": w, "min": w, "max": w}, "unit": " s", "digits": 1,
                    "met": (w <= 300 and e2e["returncode"] == 0) if default else None,
                    "note": ("" if default else "not the default config; ") + "largest stages: "
                    + ", ".join(f"{k} {s:.0f} s" for s, k in top)})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the quick profile (minutes)")
    p.add_argument("--sizes", choices=list(PROFILES), help="profile: full (default), quick, tiny")
    p.add_argument("--only", default=",".join(SECTION_NAMES), help=f"comma-separated sections of {', '.join(SECTION_NAMES)}")
    p.add_argument("--out-dir", type=Path, help="where results*.json and RESULTS*.md go (default: benchmarks/)")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    p.add_argument("--no-merge", action="store_true", help="do not keep sections of an existing results file")
    p.add_argument("--e2e-override", action="append", default=[], metavar="KEY=VALUE",
                   help="extra `pipeline run` override for the e2e section (e.g. threads=1); repeatable")
    args = p.parse_args(argv)
    profile = args.sizes or ("quick" if args.quick else "full")
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in only if s not in SECTION_NAMES]
    if bad:
        p.error(f"--only: unknown section(s) {', '.join(bad)}; choose from {', '.join(SECTION_NAMES)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    prof = PROFILES[profile]
    out_dir = args.out_dir or HERE
    suffix = "" if profile == "full" else f"-{profile}"
    json_path, md_path = out_dir / f"results{suffix}.json", out_dir / f"RESULTS{suffix}.md"

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    results: dict[str, Any] = {"sections": {}}
    if json_path.is_file() and not args.no_merge:
        old = json.loads(json_path.read_text())
        if old.get("profile") == profile:
            results["sections"] = {k: v for k, v in old.get("sections", {}).items() if k not in only}
            results["notes"] = old.get("notes", [])  # hand-written remarks about earlier sections
    results.update({"profile": profile, "command": "python -m benchmarks.run " + " ".join(argv if argv is not None else sys.argv[1:]),
                    "machine": common.machine(), "versions": common.versions(), "written": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    compile_ok = None if prof["compile"] else False
    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "op": lambda: _op_section(prof["op"], "cpu", compile_ok),
        "train": lambda: _train_section(prof["train"], "cpu"),
        "inference": lambda: _inference_section(prof["inference"]),
        "e2e": lambda: _e2e_section(prof["e2e"] + args.e2e_override, profile),
        "kernel": lambda: _kernel_section(prof["kernel"]),
        "gpu": lambda: _gpu_section(prof["gpu"]),
    }
    failed = False
    for name in SECTION_NAMES:
        if name not in only:
            continue
        with common.Section(name, log) as s:
            try:
                sec = runners[name]()
            except Exception as exc:  # one failing section must not lose the others' numbers
                failed = True
                sec = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc().splitlines()[-12:]}
                log(f"[{name}] failed: {sec['error']}")
            sec["meta"] = s.meta()
        results["sections"][name] = sec
    results["fastgate"] = kernels.status()
    results["goals"] = goals(results)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=1, ensure_ascii=False, default=str) + "\n")
    md_path.write_text(report.markdown(results))
    log(f"wrote {json_path} and {md_path}")
    for g in results["goals"]:
        m = g["measured"]
        log(f"  {g['goal']}: {m['median']:.3f} ({m['min']:.3f}–{m['max']:.3f}) target {g['target']} -> {g['met']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
