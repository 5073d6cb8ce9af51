"""The swap stage: every gate of the selected checkpoint becomes ReLU, with no weight update (the library swap is
`pipeline/relu_swap.py`); its run, its report section.

Reads: `train/<variant>/best.pt`, each variant's record. Writes: `swap/<variant>/relu.pt`, `swap/swap.json`.
"""

from __future__ import annotations

from typing import Any

from pipeline import checkpoint
from pipeline.atomic_io import atomic_write_json
from pipeline.config import Config
from pipeline.data import dataset_for
from pipeline.errors import TrainingError
from pipeline.relu_swap import relu_spec, swap_report, to_relu
from pipeline.render import table
from pipeline.rundir import Output, RunDir
from pipeline.train_loop import diverged

OUTPUTS = (Output("swap/swap.json"), Output("swap/<variant>/relu.pt"))  # every variant: a ReLU baseline's is its own model


def _refuse_diverged(payload: dict[str, Any], cfg: Config, variant: str, source) -> None:
    """The train stage's divergence rule (`pipeline.train_loop.diverged`), applied again to the checkpoint that would
    ship: a model whose training loss ran away (however it got selected) is not swapped, exported or verified."""
    loss, init = payload.get("train_loss"), payload.get("initial_loss")
    if loss is None:
        return  # a checkpoint saved outside the train stage (the API's) carries no training losses
    if diverged(loss, init, cfg.train.divergence_factor):
        untrained = f"{init:.4g}" if init else "not recorded"
        raise TrainingError(f"{variant}: {source} comes from a diverged training (mean loss {loss:.4g}, untrained "
                            f"{untrained}); lower train.lr and rerun training (`--redo train`) before swapping it")


def run_swap(cfg: Config, run: RunDir) -> dict[str, Any]:
    """swap.json: per variant the metric before and after the swap on val and test, the argmax agreement and
    largest |Δlogit| on val (the split the checkpoint was chosen on), the test loss before and after, how many gates
    became ReLU (`swapped`) and what was kept as it is, with the reason (`kept`). A
    variant with nothing to swap (a ReLU baseline, a non-gate like Tanh) is recorded too, before = after: its
    numbers are what the swapped networks are compared with."""
    device = run.compute_device()
    ds = dataset_for(cfg)
    bs = cfg.data.eval_batch_size
    m = ds.info.metric  # accuracy, or perplexity for language models
    result: dict[str, dict[str, float]] = {}
    swapped_to: dict[str, str] = {}  # what each variant's gates became
    for variant in cfg.variants:
        record = run.variant(variant)
        source = run.file("train", variant, "best.pt")
        model, payload = checkpoint.load_model(source, device)
        _refuse_diverged(payload, cfg, variant, source)
        val, test = (swap_report(model, getattr(ds, s), bs, device, m) for s in ("val", "test"))
        result[variant] = {"val_before": val["before"], "val_after": val["after"], "test_before": test["before"],
                           "test_after": test["after"], "argmax_agreement": val["argmax_agreement"],
                           "max_logit_change": val["max_logit_change"], "test_loss_before": test["loss_before"],
                           "test_loss_after": test["loss_after"], "swapped": val["swapped"], "kept": val["kept"]}
        if record.swap_changes:
            swapped, spec = to_relu(model), relu_spec(payload["spec"], record.swapped_to)  # the loaded copy is ours to change
            swapped_to[variant] = record.swapped_to
        else:
            # Nothing to swap: a ReLU baseline's checkpoint already is its ReLU model; a non-gate stays as it is.
            swapped, spec = model, payload["spec"]
            swapped_to[variant] = "already ReLU" if record.is_relu else "no swap"
        checkpoint.save(run.file("swap", variant, "relu.pt"), swapped, spec, source_epoch=payload.get("epoch"),
                        source=str(source.relative_to(run.path)))
    atomic_write_json(run.file("swap", "swap.json"), result)
    return {**result, "swapped_to": swapped_to}


def report_section(cfg: Config, run: RunDir) -> str | None:
    """The swap stage's section of report.md (None when it has not run)."""
    swap = run.read_json("swap", "swap.json")
    if swap is None:
        return None
    swapped_to = {v: run.variant(v).swapped_to for v in swap}
    # a run directory written before swap.json counted its gates has no "swapped": shown as unknown, not as 0
    rows = [[v, swapped_to[v] or "no swap (not a gate)", r.get("swapped", "—"), r["val_before"], r["val_after"],
             r["val_after"] - r["val_before"], r["test_before"], r["test_after"], r["argmax_agreement"],
             r["max_logit_change"]] for v, r in swap.items()]
    kept = [f"- {v}: {line}" for v, r in swap.items() for line in r.get("kept") or []]
    return "\n\n".join(["## Swap to ReLU (best checkpoint, no weight update)",
                        table(["variant", "swap to", "gates swapped", "val before", "val after", "Δ val", "test before",
                               "test after", "argmax agreement (val)", "max |Δ logit| (val)"], rows),
                        *(["Activations the swap keeps as they are (not gates):\n\n" + "\n".join(kept)] if kept else [])])
