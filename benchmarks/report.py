"""benchmarks/RESULTS.md from results.json: machine, versions, goals, then one table per section."""

from __future__ import annotations

from typing import Any


def _r(d: dict[str, float] | None, unit: str = "", digits: int = 2, spread: bool = False) -> str:
    """'median (min–max)' of a summary dict; with spread, also the 10th–90th percentiles."""
    if not d:
        return "–"
    f = f"{{:.{digits}f}}"
    p = f"p10–p90 {f.format(d['p10'])}–{f.format(d['p90'])}; " if spread and "p10" in d else ""
    return f"{f.format(d['median'])}{unit} ({p}{f.format(d['min'])}–{f.format(d['max'])})"


def _mib(b: int | None) -> str:
    return "–" if b is None else f"{b / 2**20:.2f} MiB" if abs(b) >= 2**20 else f"{b} B"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *["| " + " | ".join(r) + " |" for r in rows]]


def _op(sec: dict[str, Any]) -> list[str]:
    lines = []
    for res in sec["results"]:
        shape = "×".join(map(str, res["shape"]))
        lines += ["", f"**{shape} {res['dtype']} on {res['device']}**, {res['reps']} interleaved repetitions"
                  f" of {res['inner']} call(s); training path: `{res['training_path']}`", ""]
        rows = []
        for name, t in res["times_ms"].items():
            rows.append([f"`{name}`", _r(t, " ms", 3 if t["median"] < 1 else 1), _r(res["ratio_vs_gelu"][name], "×"),
                         _mib(res["saved_bytes"][name]), _mib(res["extra_saved_bytes_vs_gelu"][name]),
                         f"{res['first_call_s'][name]:.2f}"])
        lines += _table(["implementation", "fwd+bwd, median (min–max)", "÷ F.gelu, per-repetition ratio",
                         "saved for backward", "saved − GELU's", "first call s"], rows)
    return lines


def _train(sec: dict[str, Any]) -> list[str]:
    lines = []
    for res in sec["results"]:
        key = next(k for k in res if k.startswith("ratio_vs_"))
        arch = f"hidden {res['hidden']}" if res["hidden"] else f"channels {res['channels']}"
        lines += ["", f"**{res['model']} ({arch}) on {res['data']}**, {res['train_examples']} examples, batch "
                  f"{res['batch_size']} ({res['steps_per_epoch']} steps), {res['device']}, {res['reps']} epochs per variant "
                  f"after one warm-up epoch, variants taking turns "
                  + (f"every {res['block_steps']} steps" if res.get("block_steps") else "epoch by epoch"), ""]
        rows = [[f"`{n}`", _r(t, " s"), _r(res["step_ms"][n], " ms"), _r(res[key][n], "×", 3)] for n, t in res["epoch_s"].items()]
        lines += _table(["variant", "epoch, median (min–max)", "per step", key.replace("ratio_vs_", "÷ ")], rows)
    return lines


def _inference(sec: dict[str, Any]) -> list[str]:
    res = sec["result"]
    lines = ["", f"{res['model']} on {res['data']}, onnxruntime CPU, {res['threads']} intra-op thread, opset "
             f"{res['opset']}, weights: {res['weights']}; {res['reps']} interleaved repetitions (×4 at batch 1)", ""]
    rows = []
    for name, m in res["models"].items():
        for prec in ("fp32", "int8"):
            e = m[prec]
            rows.append([f"`{name}`", prec, _r(e.get("batch1_ms"), " ms", 4, True), _r(e.get("batch256_ms"), " ms", 3, True),
                         f"{e.get('batch256_samples_per_s', 0):,.0f}", _mib(e["bytes"]),
                         ", ".join(f"{k}×{v}" for k, v in e["float_ops"].items()) or "none"])
        rows.append([f"`{name}`", "**int8 speed-up**", _r(m.get("int8_speedup_batch1"), "×", 2, True),
                     _r(m.get("int8_speedup_batch256"), "×", 2, True), "", "", ""])
    lines += _table(["model", "precision", "batch 1: median (p10–p90; min–max)", "batch 256", "samples/s at 256",
                     "file", "float ops left"], rows)
    for b in (1, 256):
        for other in ("gelu_fp32", "gelu_int8"):
            k = f"swapped_relu_int8_vs_{other}_batch{b}"
            if k in res:
                lines.append(f"- swapped ReLU int8 vs GELU {other[5:]} at batch {b}: {_r(res[k], '× faster', 2, True)}")
    return lines


def _e2e(sec: dict[str, Any]) -> list[str]:
    res = sec["result"]
    lines = ["", f"`{res['command']}`: exit {res['returncode']}, **{res['wall_s']:.1f} s** wall "
             f"(load {res['load_before']} → {res['load_after']})", ""]
    rows = [[s, f"{v['seconds']:.1f}" if v["seconds"] is not None else "–",
             f"{100 * (v['seconds'] or 0) / res['wall_s']:.0f}%", str(v["status"])] for s, v in res["stages"].items()]
    rows.append(["(start-up, outside stages)", f"{res['outside_stages_s']:.1f}", f"{100 * res['outside_stages_s'] / res['wall_s']:.0f}%", ""])
    lines += _table(["stage", "seconds", "share", "status"], rows)
    if res.get("stderr_tail"):
        lines += ["", "```", *res["stderr_tail"], "```"]
    return lines


def _kernel(sec: dict[str, Any]) -> list[str]:
    if sec.get("skipped"):
        return ["", f"Skipped: {sec['skipped']}"]
    res = sec["result"]
    b = res["build"]
    lines = ["", f"Build alone: `{b['command']}`: exit {b['returncode']}, **{b['wall_s']:.1f} s** (load {b['load_before']} → "
             f"{b['load_after']})", ""]
    rows = []
    for label, runs in res["runs"].items():
        for i, r in enumerate(runs, 1):
            st = r["stages"]
            rows.append([label, str(i), f"`{r['command']}`", str(r["returncode"]), f"{r['wall_s']:.1f}",
                         *(f"{st[s]['seconds']:.1f}" if st.get(s, {}).get("seconds") is not None else "–" for s in ("train", "harden")),
                         str(st.get("train", {}).get("threads", "–")), f"{r['load_before']} → {r['load_after']}"])
    lines += _table(["kernel", "rep", "command", "exit", "wall s", "train s", "harden s", "threads", "load average"], rows)
    saved, n = res["saved_per_run_s"], res["runs_to_pay_back"]
    med = res["median_wall_s"]
    lines += ["", "Medians over repetitions: " + ", ".join(f"{k} {v:.1f} s" for k, v in med.items()) + ". "
              f"The built kernel saves {saved:.1f} s per run against eager; its build costs {b['wall_s']:.1f} s once"
              + (f", paid back after {n:.1f} runs." if n is not None else ": it never pays back on this job.")]
    return lines


def _gpu(sec: dict[str, Any]) -> list[str]:
    """The section `benchmarks/gpu_record.py` writes from a `benchmarks/gpu.sh` run (older runs: the op/train tables)."""
    if sec.get("skipped"):
        return ["", f"Skipped: {sec['skipped']}"]
    lines = ["", f"Device: **{sec['device']}**" + (f" ({'; '.join(sec['device_info'][:2])})" if sec.get("device_info") else "")]
    if sec.get("train") is not None and "epochs" not in sec:  # the layout before gpu_record
        return lines + _op({"results": sec["op"]}) + _train({"results": sec["train"]})
    if sec.get("op"):
        lines += ["", f"Op: the LambdaGELU module's forward+backward ÷ nn.GELU's (CUDA events, 7 interleaved rounds, "
                  f"median); host µs per forward+backward without waiting for the GPU; each kernel's device time as a share "
                  f"of the device-to-device copy ({sec['copy_GBps']:.0f} GB/s, read + write). Path: {sec['op'][0]['training_path']}.", ""]
        rows = []
        for c in sec["op"]:
            r, h, k = c["ratio_vs_gelu"], c["host_us"], c["kernels_ms"]
            rows.append([c["case"], f"{c['ms']['gelu']:.4f}", f"{r['lambda_gelu']:.3f}×", f"{r['lambda_gelu[frozen]']:.3f}×",
                         f"≤ {c['goal']:.2f}×", f"{h['gelu']:.0f} / {h['lambda_gelu']:.0f} / {h['lambda_gelu[frozen]']:.0f}",
                         f"{k['learned']['forward_share_of_copy']:.0%} / {k['learned']['backward_share_of_copy']:.0%}",
                         f"{k['frozen']['forward_share_of_copy']:.0%} / {k['frozen']['backward_share_of_copy']:.0%}"])
        lines += _table(["case", "GELU ms", "λ learned", "λ frozen", "goal", "host µs GELU / learned / frozen",
                         "kernels learned fwd / bwd", "kernels frozen fwd / bwd"], rows)
    if sec.get("epochs"):
        lines += ["", "Epochs: the train loop's own `_train_epoch`, interleaved, median of 3 after one warm-up epoch; "
                  "`cuda_graph` is the default CUDA path (whole-step graphs), `eager` launches every op. ResNet-18 runs on "
                  "CIFAR-shaped synthetic data (random images, 10 classes): no CIFAR files on the machine.", ""]
        rows = [[r["setup"], r["path"], str(r["train_examples"]), f"{r['epoch_s']['gelu']:.3f}",
                 f"{r['ratio_vs_gelu']['lambda_gelu']['median']:.3f}×", f"{r['ratio_vs_gelu']['lambda_gelu[frozen]']['median']:.3f}×"]
                for r in sec["epochs"]]
        lines += _table(["model", "path", "examples", "GELU epoch s", "λ learned ÷ GELU", "λ frozen ÷ GELU"], rows)
    run = sec.get("default_run")
    if run:
        stopped = [s for s, v in run["stages"].items() if v.get("status") != "done"]
        lines += ["", f"The default `pipeline run` on this machine: {run['total_s']:.1f} s of stages"
                  + (f", **stopped at {stopped[0]} ({run['stages'][stopped[0]].get('status')})**." if stopped else "."), ""]
        lines += _table(["stage", "seconds", "status", "device"],
                        [[s, f"{v['seconds']:.1f}" if v["seconds"] is not None else "–", str(v.get("status")),
                          str(v.get("device"))] for s, v in run["stages"].items()])
    v = sec.get("verify")
    if v:
        lines += ["", f"Verifier: the mnist_fc stand-in through `pipeline vnncomp` on the GPU, {v['timeout_s']:g} s per instance, "
                  f"{v['jobs']} worker processes sharing it (`benchmarks/gpu_verify.sh`): {v['decided']}/{v['instances']} decided "
                  f"(by depth {v['by_net']}), median {v['median_decided_s']} s over the decided, {v['wrong']} wrong, "
                  f"{v['wall_s']:.0f} s wall; the CPU reference decided {v.get('reference_decided')}."]
    if sec.get("compile"):
        lines += ["", "torch.compile(mode=\"reduce-overhead\") against the captured steps, default MLP: "
                  + ", ".join(f"{k} {r['epoch_s']:.3f} s/epoch (first {r['first_epoch_s']:.0f} s)" for k, r in sec["compile"].items())]
    for name, t in sec.get("tests", {}).items():
        lines += ["", f"Tests ({name}): " + ", ".join(f"{v} {k}" for k, v in t["counts"].items())
                  + (("; failed: " + ", ".join(t["failed"])) if t["failed"] else "")]
    return lines


SECTIONS = {"op": ("1. Activation op", _op), "train": ("2. Training epoch", _train),
            "inference": ("3. Inference (onnxruntime)", _inference), "e2e": ("4. End to end", _e2e),
            "kernel": ("5. Fused CPU kernel: first build against what it saves", _kernel), "gpu": ("6. GPU", _gpu)}


def markdown(results: dict[str, Any]) -> str:
    m, v = results["machine"], results["versions"]
    lines = [
        "# Benchmarks", "",
        f"Last written by `{results['command']}` (profile `{results['profile']}`); each section names the command and "
        "torch thread count it ran with. Every ratio is taken per repetition "
        "between candidates timed side by side in one process with interleaved repetitions; tables give the median "
        "and the min–max over repetitions. The machine is shared (2 cores): the load average around each section is "
        "recorded in results.json.", "",
        f"- Machine: {m['cpu']}, {m['cores_available']} cores available, torch threads {m['torch_threads']}, "
        f"ATen CPU capability {m['cpu_capability']}, {m['memory_gib']} GiB, {m['platform']}"
        + (f", GPU {m.get('gpu')}" if m.get("cuda") else ", no GPU"),
        "- Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val), "",
        "## Goals", "",
    ]
    rows = []
    for g in results.get("goals", []):
        met = {True: "**met**", False: "**missed**", None: "not measured"}[g["met"]]
        rows.append([g["goal"], g["target"], _r(g.get("measured"), g.get("unit", ""), g.get("digits", 2)), met, g.get("note", "")])
    lines += _table(["goal", "target", "measured: median (min–max)", "", "note"], rows)
    if results.get("notes"):
        lines += ["", "Notes:", "", *[f"- {n}" for n in results["notes"]]]
    for key, (title, fn) in SECTIONS.items():
        sec = results["sections"].get(key)
        if sec is None:
            continue
        lines += ["", f"## {title}"]
        if sec.get("error"):
            lines += ["", f"Failed: `{sec['error']}`"]
            continue
        if sec.get("note"):
            lines += ["", sec["note"]]
        lines += fn(sec)
        if "meta" in sec:
            mt = sec["meta"]
            lines += ["", f"_`{mt.get('command', '')}`: torch threads {mt.get('torch_threads', '?')}, section time "
                      f"{mt['seconds']} s, load average {mt['load_before']} → {mt['load_after']}, {mt['finished']}_"]
    return "\n".join(lines) + "\n"
