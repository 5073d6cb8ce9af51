"""The properties the verify stage decides (the stage: `pipeline/stages/verify.py`): L∞ local robustness of every
variant of a run, for three networks, each a task of the one property loop (`analysis.verification.harness`).

Which network a certificate is about:
- **swapped ReLU** (`relu_properties`): ``verify/onnx/<variant>.onnx``, a copy of the export stage's
  ``export/<variant>/relu/model.verifiers.onnx``: the float32 ReLU network of ``swap/<variant>/relu.pt`` (λ-GELU or
  GELU after the swap, or the ReLU baseline itself) in the verifiers' form
  (`quantize.export.export_for_verifiers`: input normalization folded into its first Gemm or unpadded Conv, else a
  1×1 Conv), evaluated in float64 with its float32 weights. Decided by the staged verifier (`verify.verifiers`,
  default "auto": CROWN → PGD attack (a probe) → α-CROWN → branch and bound on the unstable ReLUs those bounds
  leave); every counterexample is re-checked in onnxruntime on the float32 point its witness states
  (`analysis.verification.problem`).
- **int8** (the same function; its rows and files named `int8_name(variant)`, ``<variant>-int8``, their own category in
  ``results.csv``): the int8 QDQ model of the variant's ReLU form that the int8 stage wrote, as onnxruntime's CPU
  kernels run it. The reader (`analysis.verification.readers`) turns each QuantizeLinear/DequantizeLinear pair into a
  sound relaxation of the runtime's rounding (`analysis.verification.quantized`: the first one exact on its grid, the
  others a rounding to the grid within x ± E, then the clamp to the grid's range as two ReLUs); the same staged
  verifier decides it, and a counterexample counts only when the int8 model itself misclassifies it in onnxruntime.
  Whether a row is an int8 model's is decided here, once (`is_int8`).
- **smooth** (`smooth_properties`): the model of ``train/<variant>/best.pt`` with its λ-GELU/GELU gates, read through
  its ONNX export, in float64. Two routes, each recorded on its own: ``direct`` (bounds through the gates' linear
  relaxations, then the attack; a counterexample is re-checked on the torch model in float32) and ``via-relu`` (the
  same weights with ReLU: its margin lower bound minus a sound bound on |smooth − ReLU| over the box;
  `analysis.verification.gap.swap_gap`).

Properties: for each of the first ``verify.samples`` validation examples ``x0`` (the same for every variant) and each
``eps`` in ``verify.epsilons``, the box ``[max(x0 − eps, lo), min(x0 + eps, hi)]`` (``lo``/``hi``: the data's valid
range; ε is in the data's own input units) must keep the true class's logit above every other. A sample the network
already gets wrong is ``sat`` with ``x0`` itself as the witness (stage "clean"; no verifier runs).

The builders write every ONNX and VNN-LIB file first (the benchmark exists before any solving) and keep the rows a
previous run marked final, so the stage resumes per property. What the three networks' answers say together is
`analysis/robustness/chain.py`.
"""

from __future__ import annotations

import csv
import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from analysis.verification import harness
from analysis.verification.ops.base import UnsupportedModel
from analysis.verification.problem import Result
from analysis.verification.readers import from_onnx, from_torch
from analysis.verification.vnnlib import format_real, robustness_spec, write_vnnlib
from pipeline import checkpoint
from pipeline.activations import gate_of, gate_sites
from pipeline.atomic_io import atomic_write_bytes
from quantize import ort as ort_util

# direct: the bounds before the attack, unlike the ReLU chain: through the gates CROWN costs less than the attack on the
# smooth network, and most properties are certified
ROUTES = {"direct": "crown+pgd+alpha-crown", "via-relu": "via-relu"}
# Which network each kind of certificate is about, in the summary's and the report's words.
RELU_NETWORK = ("the float32 ReLU ONNX in verify/onnx/ (the swapped model in the verifiers' form: normalization folded into "
                "the first Gemm or unpadded Conv, else a 1×1 Conv), "
                "evaluated in float64; not the int8 model")
SMOOTH_NETWORK = "the smooth model of train/<variant>/best.pt (its λ-GELU/GELU gates), evaluated in float64; not the int8 model"
INT8_NETWORK = ("the int8 QDQ ONNX of the int8 stage (quantize/<variant>/relu/model.int8.onnx, copied to verify/onnx/"
                "<variant>-int8.onnx) as onnxruntime's CPU kernels run it: integer sums, the requantization's float32 "
                "multiply and rounding bounded per unit (analysis/verification/quantized.py); a counterexample counts "
                "only when that model itself, in onnxruntime, misclassifies it")

INT8 = "-int8"  # the rows, files and results.csv category of a variant's int8 model carry its name with this suffix


def int8_name(variant: str) -> str:
    """The name an int8 model's rows, files and results.csv category carry."""
    return variant + INT8


def is_int8(name: str) -> bool:
    """Is this row (file, category, model entry) an int8 model's? The one place it is decided; a variant whose own name
    ends so is refused by the stage's config check (`pipeline.stages.verify.validate_config`)."""
    return name.endswith(INT8)


def property_name(variant: str, sample: int, eps: float) -> str:
    """The name of one property's VNN-LIB file (and of the property in the report's lists)."""
    return f"{variant}_{sample}_{format_real(eps)}"


def read_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV the stage wrote (details.csv, smooth.csv), [] when it has not."""
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _final(row: dict[str, Any]) -> bool:
    return str(row.get("final", "1")) in ("1", "True", "true", "")  # rows of an older stage version carry no flag


class Kind:
    """One family of properties of the stage (the swapped ReLU networks; the smooth ones): its models, tasks and
    rows, the CSV it is written to."""

    def __init__(self, name: str, models: dict[str, Any], tasks: list[harness.Task], rows: dict[Any, dict[str, Any]],
                 instances: list[tuple[str, str, bool]] | None = None, int8: frozenset = frozenset()):
        self.name, self.models, self.tasks, self.rows = name, models, tasks, rows
        self.instances = instances or []  # (onnx, vnnlib, is it an int8 model's) per instances.csv row
        self.int8 = int8  # the keys of the tasks about an int8 model, decided where they are made
        self.order = {t.key: i for i, t in enumerate(tasks)}
        for k in rows:
            self.order.setdefault(k, len(self.order))

    def open(self, int8: bool | None = None) -> int:
        """How many of its tasks have no known answer: to be solved (`int8`: only the int8 models' or only the others')."""
        return sum(1 for t in self.tasks if t.known is None and (int8 is None or (t.key in self.int8) == int8))


@dataclass(frozen=True)
class Samples:
    """What every property of the stage is built from: the first `n` validation examples (flat, float64) and their
    labels, and the data's valid input range and facts (`info`)."""

    info: Any
    xs: np.ndarray
    labels: list[int]
    lo: np.ndarray
    hi: np.ndarray

    @property
    def n(self) -> int:
        return len(self.labels)

    @classmethod
    def of(cls, ds, samples: int) -> Samples:
        """The first `samples` validation examples of `ds` (the same for every variant)."""
        n = min(samples, len(ds.val.y))
        return cls(ds.info, ds.val.x[:n].double().numpy().reshape(n, -1), [int(c) for c in ds.val.y[:n]],
                   np.asarray(ds.info.input_low, dtype=np.float64), np.asarray(ds.info.input_high, dtype=np.float64))


def eps_units(info) -> str:
    """What ε is measured in, for data of these facts (`DataInfo`), in the summary's words."""
    if getattr(info, "feature_names", None):
        return "raw feature units of each input column (the model standardizes inside)"
    return f"the input's own units (valid range {info.input_low} to {info.input_high})"


@dataclass(frozen=True)
class Network:
    """One variant's networks as the run holds them (paths relative to `RunFacts.root`)."""

    variant: str
    activation: str
    relu: dict[str, Any] | None  # the export stage's verifiers' form of its ReLU model ({"path", "error"}); None: no gate
    int8: str | None  # the int8 stage's model of its ReLU form; None: none written
    smooth: str | None  # its smooth checkpoint; None: it has no smooth form


@dataclass(frozen=True)
class RunFacts:
    """What the builders read of a run, handed over by the stage that reads the run directory and its config: the
    engine reads neither."""

    root: Path  # the run directory
    networks: tuple[Network, ...]  # in the run's variant order
    epsilons: tuple[float, ...]
    timeout_s: float | None  # a cap per property; None: none
    int8: bool  # the int8 models are verified too
    reduce_range: bool  # the int8 stage's setting, recorded beside each int8 model


def relu_properties(facts: RunFacts, out: Path, s: Samples, names: list[str]) -> Kind:
    """The swapped ReLU networks and their int8 models: every ONNX, property file and instances row first (the
    benchmark exists before any solving), and a task per property and verifier; the rows a previous run finished are
    kept."""
    info = s.info
    xs, labels, lo, hi, n = s.xs, s.labels, s.lo, s.hi, s.n
    done = {(r["variant"], int(r["sample"]), format_real(float(r["eps"])), r["verifier"]): r
            for r in read_rows(out / "details.csv") if _final(r)}
    models: dict[str, Any] = {}
    tasks: list[harness.Task] = []
    rows: dict[Any, dict[str, Any]] = {}
    instances: list[tuple[str, str, bool]] = []
    int8: set[Any] = set()
    # (the name its rows and files carry, the variant, "relu" | "int8", its network's file relative to the run: the
    # export stage's verifiers' form of the ReLU model, the int8 stage's model)
    entries: list[tuple[str, str, str, str | None]] = []
    for given in facts.networks:
        variant, form = given.variant, given.relu
        if form is None:
            models[variant] = {"onnx": None, "note": "not verified: its activation is no gate, so the swap left it smooth"}
            continue
        if form["path"] is None:
            models[variant] = {"onnx": None, "variant": variant, "network": "relu",
                               "note": f"not verified: the export stage could not write its verifiers' form: {form['error']}"}
            continue
        entries.append((variant, variant, "relu", form["path"]))
    if facts.int8:
        for given in facts.networks:
            if given.int8 is None:
                models[int8_name(given.variant)] = {"onnx": None, "variant": given.variant, "network": "int8",
                                              "note": "not verified: the int8 stage wrote no int8 model of its ReLU form"}
                continue
            entries.append((int8_name(given.variant), given.variant, "int8", given.int8))
    activation = {given.variant: given.activation for given in facts.networks}
    for name, variant, network, source in entries:
        onnx_rel = Path("onnx") / f"{name}.onnx"
        onnx_path = out / onnx_rel
        if not onnx_path.is_file():  # the export or int8 stage's file itself, so that the benchmark folder stands alone
            atomic_write_bytes(onnx_path, (facts.root / source).read_bytes())
        t0 = time.perf_counter()
        try:
            net = from_onnx(onnx_path)
        except UnsupportedModel as e:
            models[name] = {"onnx": None, "variant": variant, "network": network, "note": f"not verified: {e}"}
            continue
        read_s = time.perf_counter() - t0
        sess = ort_util.session(onnx_path)
        predicted = [int(np.argmax(ort_util.forward_flat(sess, x))) for x in xs]
        models[name] = {"onnx": onnx_rel.as_posix(), "variant": variant, "network": network, "activation": activation[variant],
                        "relus": net.num_relus, "read_seconds": round(read_s, 4),
                        "clean_correct": int(sum(p == c for p, c in zip(predicted, labels))), "samples": n}
        if network == "int8":
            models[name].update(source=source, reduce_range=facts.reduce_range)
        for eps in facts.epsilons:
            for k in range(n):
                spec = robustness_spec(xs[k], eps, lo, hi, labels[k], info.num_classes)
                rel = Path("vnnlib") / f"{property_name(variant, k, eps)}.vnnlib"
                if not (out / rel).is_file():
                    write_vnnlib(out / rel, spec, comment=f"L-inf robustness of validation sample {k}: eps={format_real(eps)}, "
                                                          f"true class {labels[k]} of {info.num_classes}; model {onnx_rel.as_posix()}")
                instances.append((onnx_rel.as_posix(), rel.as_posix(), network == "int8"))
                for verifier in names:
                    key = (name, k, format_real(eps), verifier)
                    base = {"variant": name, "sample": k, "eps": format_real(eps), "verifier": verifier, "label": labels[k],
                            "predicted": predicted[k], "relus": net.num_relus, "vnnlib": rel.as_posix()}
                    if key in done:
                        rows[key] = done[key]
                        continue
                    known = None
                    if predicted[k] != labels[k]:  # the sample itself is the counterexample
                        x32 = xs[k].astype(np.float32).astype(np.float64)
                        known = Result("sat", 0.0, x32, ort_util.forward_flat(sess, x32),
                                       f"the network predicts {predicted[k]} at the sample itself (true class {labels[k]}); "
                                       "no verifier ran", "clean")
                    tasks.append(harness.FileTask(key=key, verifier=verifier, timeout=facts.timeout_s, known=known,
                                                  onnx=onnx_path, vnnlib=out / rel))
                    if network == "int8":
                        int8.add(key)
                    rows[key] = {**base, "result": "", "final": 0}
    return Kind("relu", models, tasks, rows, instances, frozenset(int8))


def smooth_properties(facts: RunFacts, out: Path, s: Samples) -> Kind:
    """A task per property and route for every variant with a smooth model; rows a previous run finished are kept."""
    info = s.info
    xs, labels, lo, hi, n = s.xs, s.labels, s.lo, s.hi, s.n
    done = {(r["variant"], int(r["sample"]), format_real(float(r["eps"])), r["route"]): r
            for r in read_rows(out / "smooth.csv") if _final(r)}
    models: dict[str, Any] = {}
    tasks: list[harness.Task] = []
    rows: dict[Any, dict[str, Any]] = {}
    for given in facts.networks:
        variant = given.variant
        if given.smooth is None:
            continue
        src = facts.root / given.smooth
        model, _ = checkpoint.load_model(src)
        try:
            net = from_torch(model, info.input_shape)
        except UnsupportedModel as e:
            models[variant] = {"network": None, "note": f"not certified: {e}"}
            continue
        # from the model's gates: a gate the reader takes as its own op (λ-HardSwish: Mul → HardSwish → Div) keeps its λ
        lam = [float(gate_of(m)[1].mean()) for _, m in gate_sites(model)]
        models[variant] = {"network": given.smooth, "activation": given.activation,
                           "mean_lambda_per_layer": [round(v, 4) for v in lam]}
        recheck = harness.ModuleRecheck(model, info.input_shape, load=functools.partial(checkpoint.load_module, src))
        with torch.no_grad():
            predicted = [int(v) for v in model(torch.as_tensor(xs, dtype=torch.float32).reshape(n, *info.input_shape)).argmax(1)]
        models[variant]["clean_correct"] = int(sum(p == c for p, c in zip(predicted, labels)))
        for eps in facts.epsilons:
            for k in range(n):
                spec = robustness_spec(xs[k], eps, lo, hi, labels[k], info.num_classes)
                for route, chain in ROUTES.items():
                    key = (variant, k, format_real(eps), route)
                    if key in done:
                        rows[key] = done[key]
                        continue
                    known = None
                    if predicted[k] != labels[k]:
                        known = Result("sat", 0.0, message=f"the smooth network predicts {predicted[k]} at the sample itself",
                                       stage="clean")
                    tasks.append(harness.SpecTask(key=key, verifier=chain, timeout=facts.timeout_s, known=known,
                                                  net=net, specs=[spec], recheck=recheck, network=f"{variant} (smooth)"))
                    rows[key] = {"variant": variant, "sample": k, "eps": format_real(eps), "route": route,
                                 "network": f"smooth {given.activation} ({given.smooth})",
                                 "label": labels[k], "predicted": predicted[k], "result": "", "final": 0}
    return Kind("smooth", models, tasks, rows)
