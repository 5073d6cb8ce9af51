"""Typed run configuration: dataclass defaults, a TOML/YAML file, then `key.sub=value` overrides.

Every section owns its defaults. Unknown keys and wrong types are errors that list the valid
choices (nanoGPT's configurator guard). A file's values keep their own types and must match the
declared ones (an int may stand for a float; `epochs = "5"` is refused); command-line values are
text and are parsed (booleans accept true/false/1/0/yes/no).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from .errors import ConfigError
from .opset import OPSET


@dataclass
class DataConfig:
    name: str = "fashion_mnist"  # a key of pipeline.data.DATASETS
    root: str = "data"  # directory holding the standard files (also searched: system dirs)
    download: bool = False  # fetch missing files from the official mirrors (needs network)
    val_fraction: float = 0.1  # carved from the training set, seeded; selects checkpoints
    subset: int = 0  # keep only this many training examples (0 = all); for smoke runs
    batch_size: int = 128
    eval_batch_size: int = 2048
    seq_len: int = 128  # text data sets: tokens per training sequence (the model's context length)
    augment: Literal["none", "flip_crop"] = "none"  # images: random 4-pixel-padded crop + horizontal flip (CIFAR recipe)
    # Files of your own (name = csv | npz | image_folder); the other data sets take none of these.
    path: str = ""  # the csv/npz file, or the image_folder root (root/<class>/*.png|jpg, or root/{train,test}/<class>/)
    test_path: str = ""  # csv/npz: a test file with the same columns ("" = a fixed 20% hold-out of `path`)
    label: str = ""  # csv: the label column; npz: the label array (classes = its sorted distinct values)
    features: list[str] = field(default_factory=list)  # feature columns/arrays, in this order ([] = all but the label)
    categorical: list[str] = field(default_factory=list)  # feature columns one-hot encoded (vocabulary from `path`)


@dataclass
class ModelConfig:
    name: str = "mlp"  # a key of pipeline.models.MODELS
    hidden: list[int] = field(default_factory=lambda: [256, 256, 256, 256])  # MLP widths
    channels: list[int] = field(default_factory=lambda: [16, 32, 32])  # CNN conv widths
    cnn_hidden: int = 128  # CNN fully connected width
    # Linked activations double a layer's outputs. none: widths as given; sqrt2 / inv_sqrt2: every hidden
    # width times √2 / 1/√2; params: widths scaled so the parameter count equals the single/linked counterpart's
    width_match: Literal["none", "sqrt2", "inv_sqrt2", "params"] = "none"
    resnet_width: int = 64  # resnet18_cifar: channels of the first stage (64, 128, 256, 512 in the paper's model)
    # Transformers (deit_tiny, gpt): DeiT-Tiny is 192 wide, 12 deep, 3 heads; GPT-2 small 768/12/12
    dim: int = 192
    depth: int = 12
    heads: int = 3
    mlp_ratio: float = 4.0  # FFN width = mlp_ratio * dim; the FFN holds the block's one activation
    patch_size: int = 8  # deit_tiny: square patches (64x64 TinyImageNet / 8 = 8x8 = 64 tokens)
    dropout: float = 0.0


@dataclass
class GateConfig:
    """Hardness parametrisation of the λ-gates: λ = 1 + softplus(s / t)."""

    temperature: float = 0.1  # t
    lr_mult: float = 9.0  # c: s is trained with lr = c * lr_w and no weight decay
    granularity: Literal["layer", "channel", "global"] = "layer"
    init: Literal["uniform", "increasing", "decreasing"] = "uniform"
    init_lambda: float = 1.05  # uniform λ(0); start of the increasing/decreasing ramp
    init_lambda_max: float = 2.0  # end of the increasing/decreasing ramp


@dataclass
class TrainConfig:
    epochs: int = 20  # T
    optimizer: Literal["sgd", "adamw"] = "sgd"
    lr: float = 5e-2
    weight_decay: float = 1e-4
    momentum: float = 0.9  # SGD only
    schedule: Literal["constant", "cosine"] = "cosine"  # per-epoch lr schedule for weights and s
    switch_fraction: float = 0.25  # e_s = floor(switch_fraction * T): λ learned up to e_s, then annealed
    grad_clip: float = 0.0  # max global grad norm (0 = off)
    # Divergence: an epoch whose mean training loss exceeds this factor times the untrained model's loss
    # (its first batch, before any update) stops the run with the epoch named (0 = off). Non-finite loss always does.
    divergence_factor: float = 10.0
    # bf16: autocast for forward/backward (weights and optimizer stay fp32); fp64: everything in float64 (CPU
    # reference runs: two runs that differ only in summation order then agree to ~1e-12, not to float32 noise)
    precision: Literal["fp32", "bf16", "fp64"] = "fp32"
    compile: bool = False  # torch.compile the model (inductor; falls back with a warning where it cannot)
    # torch.compile's mode: reduce-overhead captures the compiled forward and backward as CUDA graphs
    compile_mode: Literal["default", "reduce-overhead", "max-autotune"] = "default"
    # Whole training steps as CUDA graphs (pipeline/step_graph.py): auto = on CUDA whenever the step allows it
    # (one process, the split on the GPU, no augmentation, no torch.compile), off = eager launches
    cuda_graph: Literal["auto", "off"] = "auto"


@dataclass
class HardenConfig:
    epsilon: float = 5e-3  # tolerance on the bound named by `criterion`
    lambda_target: float = 0.0  # > 0 overrides the value derived from epsilon
    # gate_l1: E∞(λ) = ∫|H(x) − Φ(λx)|dx = 2/(λ√(2π)) (the paper); act_l1: ∫|ReLU − f_λ| = 1/(2λ²);
    # sup: max|ReLU − f_λ| = c/λ, c ≈ 0.169971 (what a swap changes per unit)
    criterion: Literal["gate_l1", "act_l1", "sup"] = "gate_l1"
    # Which epoch's weights become best.pt (what later stages swap, export and verify):
    # best_val: best validation metric of the smooth model (the paper); best_hardened: best among epochs whose
    # λ reached λ_target (needs hold > 0 to be a choice); last: the final epoch; best_swapped: best validation
    # metric of the model with every gate swapped to ReLU (the network that ships). Ties go to the later, more
    # hardened epoch. A selected checkpoint not hardened to its target is warned about and reported. Default
    # best_hardened: the same shipped accuracy as the other rules, and never a checkpoint below λ_target
    # (docs/EXPERIMENTS.md, "Checkpoint selection"); with hold = 0 it is the last epoch for a λ-gate and best_val for
    # a baseline.
    select: Literal["best_val", "best_hardened", "last", "best_swapped"] = "best_hardened"
    hold: int = 0  # epochs at λ_target after the anneal (λ reaches it at epoch T − hold)
    # anneal: Algorithm 1. swap: at epoch e_s + 1 every gate becomes ReLU and training continues (fine-tunes the
    # swapped network; the ablation "swap, then fine-tune as long as λ-GELU anneals").
    method: Literal["anneal", "swap"] = "anneal"
    schedule: Literal["epoch", "step"] = "epoch"  # λ moves once per epoch (the paper) or after every step


@dataclass
class CheckConfig:
    """Per-layer empirical check of the bounds on the real validation pre-activations (pipeline/stages/check.py;
    analysis/bounds_check.py)."""

    soft_delta: float = 1e-3  # "soft" band: pre-activations with g(λx) in (δ, 1 − δ)
    band: float = 3.0  # |λx| < band estimates the pre-activation density at 0 (for the closed-form comparison)
    sup_rtol: float = 1e-9  # float64 slack on max|ReLU − f_λ| ≤ c/λ
    # the first N validation samples also get the float32 statement whose rounding goes through each network's Jacobian
    # (analysis/theory/certificate/chain32.py: tight, but about 10 ms per sample for the default MLP); 0 = off
    float32_jacobian_samples: int = 1000


@dataclass
class ExportConfig:
    """fp32 ONNX export (the stage: pipeline/stages/export.py; the library: quantize/export.py)."""

    opset: int = OPSET
    # onnxruntime and PyTorch are each checked against float64 with the bound float32 rounding can account for in
    # the network (quantize/rounding.py); atol + rtol·max|logit| is slack on top, for ops that bound has no rule for
    atol: float = 0.0
    rtol: float = 0.0
    check_samples: int = 1024  # validation inputs in the check batch
    simplify: bool = True  # run onnxsim


@dataclass
class QuantizeConfig:
    """onnxruntime static int8 quantization and its measurements (pipeline/stages/int8.py; quantize/int8.py)."""

    calibration_samples: int = 1024  # training examples fed through the CalibrationDataReader
    # percentile (onnxruntime's, 99.999%): its finer activation grids leave the int8 verifier less rounding noise than
    # minmax at the same int8-vs-fp32 agreement (docs/EXPERIMENTS.md, "Calibration")
    calibration_method: Literal["minmax", "entropy", "percentile"] = "percentile"
    # percentile's range: the |activation| below which this share of the calibration values lies (onnxruntime's
    # default 99.999). A lower one clips more and gives finer grids, so less rounding noise for the verifier, but can
    # cost a conv net agreement (docs/EXPERIMENTS.md, "Calibration"). The reference clip of `clip_search`
    percentile: float = 99.999
    # more clipping percentiles also tried, per model (one histogram pass for all): the int8 stage keeps the most
    # clipping one whose validation argmax agreement with fp32 is at most `clip_tolerance_pt` points below
    # `percentile`'s (quantize/int8.py, `choose_clip`), at the cost of one pass over the validation split per
    # candidate; [] quantizes at `percentile` alone
    clip_search: list[float] = field(default_factory=lambda: [99.99, 99.9, 99.5])
    # about 1.3 standard errors of an agreement difference on 6000 validation inputs at 99.4% agreement: a smaller
    # loss is not told apart from noise there. A validation split where it is less than one input (under 500) keeps
    # `percentile`, and so does 0
    clip_tolerance_pt: float = 0.2
    per_channel: bool = True  # int8 weights per output channel (activations are per tensor)
    # "int16": 16-bit activation grids (w8a16, opset 21): 257 times finer than int8's, so the verifier's rounding
    # bound is too; onnxruntime's CPU runs such a graph unfused, in float32, so it buys size, not speed
    # (docs/verification.md, "Sixteen-bit activations")
    activation_type: Literal["int8", "uint8", "int16"] = "int8"
    # 7-bit weights: on x86 CPUs without VNNI, onnxruntime's int8 kernels add products in pairs in int16 with
    # saturation, and only 7-bit weights keep those pairs in range; on 8-bit activation grids the verifier reads no
    # other model (analysis/verification/quantized.py)
    reduce_range: bool = True
    keep_activations: bool = False  # QDQKeepRemovableActivations: keep ReLU nodes (slower; for graph readers)
    quantize_bias: bool = False  # False: biases stay fp32 in the file, onnxruntime makes them int32 when it fuses (same outputs, smaller file)
    # an MLP's input Normalize folded into its first Linear (one integer-only graph quantizing the raw input) is a
    # candidate beside keeping it in float before the first QuantizeLinear; each model keeps the fold only where its
    # validation agreement with fp32 is within clip_tolerance_pt of the float form's and its input grid loses no more
    # features (one grid over raw features of different scales turns the small ones into constants:
    # quantize/int8.py, `quantize_forms`); false: never fold
    fold_normalization: bool = True
    # int8's validation argmax agreement with fp32 below this: the run warns in its closing lines and the report, with
    # the inputs and layers that lose the signal (per-input and per-tensor SQNR) and the fix
    agreement_floor: float = 0.98
    threads: int = 1  # onnxruntime intra-op threads for evaluation and timing
    repeats: int = 200  # timed runs at the throughput batch (batch 1 uses 4x as many)
    timing_blocks: int = 10  # the runs are cut into this many blocks; the smallest block median is reported
    throughput_batch: int = 256
    sqnr_samples: int = 256  # validation inputs for the per-tensor SQNR

    @property
    def clip_percentile(self) -> float | None:
        """The reference percentile the activation ranges are clipped at (None: not percentile calibration), as
        recorded; the clip each model got is its own record's (`quantize.int8.Quantized.percentile`)."""
        return self.percentile if self.calibration_method == "percentile" else None

    @property
    def clip_candidates(self) -> list[float]:
        """The percentiles a model may be quantized at, the reference first (none: not percentile calibration)."""
        if self.calibration_method != "percentile":
            return []
        return [self.percentile, *(p for p in dict.fromkeys(self.clip_search) if p != self.percentile)]


@dataclass
class SparsityConfig:
    """APoZ and dead-unit pruning (pipeline/stages/sparsity.py; analysis/sparsity.py)."""

    split: Literal["val", "test"] = "val"  # where APoZ and dead units are counted (the linked-neurons study uses test)
    prune: bool = True  # remove dead units, check and export the pruned model
    atol: float = 1e-6  # pruned vs original logits on the validation set (float64)
    bins: int = 20  # histogram bins over 0..100%


@dataclass
class VerifyConfig:
    """L∞ robustness of every variant (pipeline/stages/verify.py): the swapped float ReLU model decided by a staged
    verifier (CROWN, the attack as a probe, α-CROWN, branch and bound), the smooth model certified through its gates
    and via the swap."""

    samples: int = 5  # the first N validation examples, the same for every variant
    # L∞ radii, data units; boxes clipped to its range: the largest the default run's ReLU properties are all decided
    # at within the budget (docs/EXPERIMENTS.md, "Default radii and budgets")
    epsilons: list[float] = field(default_factory=lambda: [0.002, 0.005, 0.008])
    # seconds for the whole stage (on the clock verify.cpu_time chooses), shared by every property (ReLU and smooth):
    # first one bound pass for every property (a network's properties batched; when this cannot cover it, the stage
    # says so with the budget that would), then rounds for what is open: easy ones are decided first and the time they
    # leave goes to the hard ones (analysis.verification.harness.StageBudget)
    budget_s: float = 60.0
    # a cap on any one property's whole time (its share of the first pass and its turns; and smooth certificate);
    # 0 = none, the budget decides
    timeout_s: float = 0.0
    jobs: int = 0  # worker processes solving properties side by side; 0 = the run's thread count
    # names in analysis.verification.registry.VERIFIERS (pgd, ibp, crown, alpha-crown, bab, milp, marabou) or chains
    # "a+b" (in order until one answers sat/unsat, one timeout for the chain); "auto" = crown+pgd+alpha-crown+bab.
    # The first writes results.csv; each further one is run beside it for comparison (results.<name>.csv).
    verifiers: list[str] = field(default_factory=lambda: ["auto"])
    # false: limits count wall-clock seconds (VNN-COMP's rule); true: every limit, the stage budgets included, counts
    # CPU seconds of the process doing the work and its children (each worker its own; HiGHS, which takes a wall limit
    # only, then gets the CPU seconds left as wall seconds), so a loaded machine gives the same answers, more slowly.
    # The downstream stage's bisections use the same clock
    cpu_time: bool = False
    smooth: bool = True  # certify the smooth models too: through their gates, and via the swapped ReLU network
    # verify the int8 model of each variant's ReLU form too (the int8 stage's file, as onnxruntime's kernels run it)
    int8: bool = True
    # seconds for the int8 models' properties (the clock of cpu_time), after the float ones and apart from budget_s:
    # the open ones are bound by the rounding, not the time, so more decides little, and 20 keeps the stage within
    # 60 s on 2 cores (docs/EXPERIMENTS.md, "Default radii and budgets")
    int8_budget_s: float = 20.0
    # where the verifiers compute: auto (a GPU when there is one, else the CPU) | cpu | cuda | cuda:N. On a GPU the
    # worker processes share it for their bound passes and searches; the MILP and the re-checks stay on the CPU
    device: str = "auto"


@dataclass
class DownstreamConfig:
    """The downstream record of every shipped network (pipeline/stages/downstream.py): certified radius per sample by
    bisection, unstable ReLUs after one CROWN pass at each verify.epsilons, the pruned model's latency beside the
    unpruned one; with the int8, sparsity and verify stages' own numbers, read from their files."""

    samples: int = 0  # the first N validation examples (those the verify stage poses first); 0 = verify.samples
    eps_max: float = 0.1  # the bisection's upper end, data units; a radius beyond it is reported as ≥ eps_max
    tol: float = 0.0  # the final bracket's width; 0 = eps_max / 64 (7 rounds)
    timeout_s: float = 1.0  # per bisection property (its bound pass, attack and branch and bound)
    int8: bool = True  # bisect the int8 model too (the verify stage's int8 graph)
    curve_points: int = 21  # certified accuracy on this many ε, 0..eps_max


@dataclass
class Config:
    name: str = ""  # run directory name under out_dir ("" = derived from data/model/time)
    out_dir: str = "runs"
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # torch intra-op CPU threads. 0 = auto: the cores not already busy when the run starts (cores minus the busy
    # share of /proc/stat over half a second, at least 1), so a shared machine is not oversubscribed; the count
    # used is in the manifest. Float sums can depend on it: set it for bit-identical reruns across machines and loads.
    threads: int = 0
    # Models trained side by side: the hardened λ-gate model and the baselines it is compared to
    # (GELU swapped directly; ReLU trained from the start, which the verify stage compares against).
    variants: list[str] = field(default_factory=lambda: ["lambda_gelu", "gelu", "relu"])
    stages: list[str] = field(default_factory=list)  # run only these (default: all registered)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    harden: HardenConfig = field(default_factory=HardenConfig)
    check: CheckConfig = field(default_factory=CheckConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    quantize: QuantizeConfig = field(default_factory=QuantizeConfig)
    sparsity: SparsityConfig = field(default_factory=SparsityConfig)
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    downstream: DownstreamConfig = field(default_factory=DownstreamConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------
# Parsing

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str, text: bool = True) -> Any:
    """Convert `value` to the field type `tp`, or raise ConfigError.

    text=True: a command-line value, where everything is a string ("5", "true", "32,32") and is parsed.
    text=False: a value from a TOML/YAML/JSON file, which carries its own type: it must already have the
    declared one (an int may stand for a float), so `epochs = "5"` is refused, not parsed.
    """
    origin = get_origin(tp)
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices:
            raise ConfigError(f"{key}={value!r} is not valid; choose one of {', '.join(map(str, choices))}")
        return value
    if origin in (list, typing.List):
        (inner,) = get_args(tp)
        if isinstance(value, str) and text:
            body = value.strip()
            if body.startswith("["):
                try:
                    value = json.loads(body)
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{key}: cannot parse list {value!r} ({exc.msg})") from None
            else:
                value = [v.strip() for v in body.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} expects a list of {_type_name(inner)}, got {_shown(value)}; write a list: [...]")
        return [_coerce(v, inner, f"{key}[{i}]", text) for i, v in enumerate(value)]
    if origin in (typing.Union, types.UnionType):
        return _coerce(value, next(a for a in get_args(tp) if a is not type(None)), key, text)
    if not text:
        return _native(value, tp, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise ConfigError(f"{key} expects a boolean (true/false/1/0), got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key} expects an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        try:
            return int(str(value).strip())
        except ValueError:
            raise ConfigError(f"{key} expects an integer, got {value!r}") from None
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key} expects a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key} expects a number, got {value!r}") from None
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{key} expects a string, got {value!r}")
        return str(value)
    raise ConfigError(f"{key}: unsupported field type {tp!r}")  # programming error, kept loud


def _shown(value: Any) -> str:
    return f"the string {value!r}" if isinstance(value, str) else repr(value)


def _native(value: Any, tp: Any, key: str) -> Any:
    """A file's scalar, which must have the field's type already (bool is no int and no float here, an int
    is a float); the error says what to write instead."""
    unquote = "; write it unquoted" if isinstance(value, str) else ""
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key} expects true or false, got {_shown(value)}{unquote}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        fix = f"; write {int(value)}" if isinstance(value, float) and value.is_integer() else unquote
        raise ConfigError(f"{key} expects an integer, got {_shown(value)}{fix}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{key} expects a number, got {_shown(value)}{unquote}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key} expects a string, got {value!r}; quote it: \"{value}\"")
    raise ConfigError(f"{key}: unsupported field type {tp!r}")  # programming error, kept loud


def _fields(obj: Any) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(obj)}


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


# Keys an earlier version had, which a run directory's config.json may still hold: read from a file with the value it
# had by default, one is dropped; set to anything else (or as an override), it is refused with why it went.
RETIRED = {"verify.probe_smooth": (False, "the verify stage's Marabou probe of the smooth ONNX files was removed; the "
                                          "marabou verifier reads ONNX files (verify.verifiers=auto,marabou)")}


def _set(obj: Any, dotted: str, value: Any, prefix: str = "", text: bool = True) -> None:
    head, _, rest = dotted.partition(".")
    fields = _fields(obj)
    full = f"{prefix}{head}"
    if f"{prefix}{dotted}" in RETIRED:
        default, why = RETIRED[f"{prefix}{dotted}"]
        if not text and value == default:
            return
        raise ConfigError(f"{prefix}{dotted} is no longer a setting: {why}")
    if head not in fields:
        raise ConfigError(
            f"unknown config key {full!r}; valid keys here: {', '.join(sorted(fields))}"
        )
    current = getattr(obj, head)
    if dataclasses.is_dataclass(current):
        if not rest:
            if not isinstance(value, dict):
                raise ConfigError(f"{full} is a section; set one of its keys, e.g. {full}.{next(iter(_fields(current)))}=...")
            for k, v in value.items():
                _set(current, k, v, prefix=f"{full}.", text=text)
            return
        _set(current, rest, value, prefix=f"{full}.", text=text)
        return
    if rest:
        raise ConfigError(f"{full} is not a section, so {full}.{rest} does not exist")
    setattr(obj, head, _coerce(value, _hints(type(obj))[head], full, text))


def apply(cfg: Config, values: dict[str, Any]) -> Config:
    """Merge a nested dict (from a file or config.json) into cfg, strictly: every value must have its field's type."""
    for k, v in values.items():
        _set(cfg, k, v, text=False)
    return cfg


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} must look like key.sub=value (e.g. train.epochs=5)")
        _set(cfg, key.strip(), value)
    return cfg


def read_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; see configs/ for ready ones")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            import tomllib

            return tomllib.loads(text)
        if path.suffix in (".yaml", ".yml"):
            return _yaml_load(text)
        if path.suffix == ".json":
            return json.loads(text)
    except Exception as exc:  # each parser has its own error type; the message and its position are what matter
        mark = getattr(exc, "problem_mark", None)  # YAML: where the parser stopped
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"cannot parse {path}{where}: {what}") from None
    raise ConfigError(f"config file {path} must end in .toml, .yaml, .yml or .json")


def _yaml_load(text: str) -> dict[str, Any]:
    """PyYAML with YAML 1.2's float syntax: YAML 1.1 (PyYAML's default) needs a dot in a float, so `lr: 1e-3`
    would load as the string '1e-3', which a typed config refuses."""
    import re

    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                                 re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))
    return yaml.load(text, Loader=Loader) or {}


def need(cond: bool, msg: str) -> None:
    """Raise ConfigError(msg) unless cond: the one-line form of every config check."""
    if not cond:
        raise ConfigError(msg)


def check_choice(key: str, value: str, choices: Any) -> None:
    """`value` must be a key of the registry `choices` (the registries call this beside their dicts)."""
    need(value in choices, f"{key}={value!r} is unknown; choose one of {', '.join(choices)}")


def validate(cfg: Config) -> Config:
    """Field and cross-field checks. Names in the registries are checked beside them, and a stage with its own
    validation hook (verify: `pipeline.stages.verify.validate_config`) checks its section there
    (`pipeline.runner.validate` runs them all; this module imports nothing else from the project)."""
    need(len(cfg.variants) > 0, "variants must name at least one activation, e.g. variants=lambda_gelu,gelu")
    need(len(set(cfg.variants)) == len(cfg.variants), f"variants has duplicates: {cfg.variants}")
    need(0 < cfg.data.val_fraction < 1, f"data.val_fraction must be in (0, 1), got {cfg.data.val_fraction}")
    need(cfg.data.batch_size > 0 and cfg.data.eval_batch_size > 0, "data.batch_size and data.eval_batch_size must be > 0")
    need(cfg.threads >= 0, "threads must be >= 0 (0 = auto)")
    need(cfg.data.subset >= 0, "data.subset must be >= 0 (0 = all)")
    need(cfg.train.epochs >= 1, f"train.epochs must be >= 1, got {cfg.train.epochs}")
    need(0 <= cfg.train.switch_fraction <= 1, "train.switch_fraction must be in [0, 1]")
    need(cfg.train.lr > 0, "train.lr must be > 0")
    need(cfg.train.divergence_factor == 0 or cfg.train.divergence_factor > 1,
         f"train.divergence_factor must be > 1 (or 0 = off), got {cfg.train.divergence_factor}")
    need(cfg.harden.hold >= 0, f"harden.hold must be >= 0, got {cfg.harden.hold}")
    need(cfg.gate.temperature > 0, f"gate.temperature must be > 0, got {cfg.gate.temperature}")
    need(cfg.gate.lr_mult >= 0, "gate.lr_mult must be >= 0")
    need(cfg.gate.init_lambda > 1 and cfg.gate.init_lambda_max > 1,
         "gate.init_lambda and gate.init_lambda_max must be > 1 (λ = 1 + softplus(s/t) is never 1 exactly)")
    need(cfg.harden.epsilon > 0 or cfg.harden.lambda_target > 0,
         "set harden.epsilon > 0 or harden.lambda_target > 0")
    need(cfg.harden.lambda_target == 0 or cfg.harden.lambda_target >= 1, "harden.lambda_target must be >= 1 (or 0 to derive it)")
    need(all(h > 0 for h in cfg.model.hidden) and cfg.model.hidden, "model.hidden must be a non-empty list of positive widths")
    need(cfg.data.seq_len >= 1, f"data.seq_len must be >= 1, got {cfg.data.seq_len}")
    need(min(cfg.model.resnet_width, cfg.model.dim, cfg.model.depth, cfg.model.heads, cfg.model.patch_size) >= 1
         and cfg.model.mlp_ratio > 0, "model.resnet_width, dim, depth, heads, patch_size and mlp_ratio must be positive")
    need(cfg.model.dim % cfg.model.heads == 0, f"model.dim={cfg.model.dim} must be divisible by model.heads={cfg.model.heads}")
    need(0 <= cfg.model.dropout < 1, f"model.dropout must be in [0, 1), got {cfg.model.dropout}")
    need(13 <= cfg.export.opset <= OPSET, f"export.opset must be in 13..{OPSET} (the TorchScript exporter's range), got {cfg.export.opset}")
    need(cfg.export.atol >= 0 and cfg.export.rtol >= 0 and cfg.export.check_samples > 0,
         "export.check_samples must be > 0, export.atol and export.rtol >= 0")
    validate_quantize(cfg.quantize)
    need(cfg.sparsity.atol > 0 and cfg.sparsity.bins > 0, "sparsity.atol and sparsity.bins must be > 0")
    return cfg


def validate_quantize(q: QuantizeConfig) -> QuantizeConfig:
    """The quantize section's checks (`validate` runs them; `analysis.api.quantize` runs them on its own section)."""
    need(q.calibration_samples > 0, "quantize.calibration_samples must be > 0")
    need(q.threads > 0 and q.repeats > 0 and q.throughput_batch > 0,
         "quantize.threads, quantize.repeats and quantize.throughput_batch must be > 0")
    need(q.sqnr_samples > 0, "quantize.sqnr_samples must be > 0")
    need(50 < q.percentile <= 100, "quantize.percentile must be in (50, 100], e.g. 99.999")
    need(all(50 < p <= 100 for p in q.clip_search),
         f"quantize.clip_search must list percentiles in (50, 100], e.g. [99.99, 99.9, 99.5]; got {q.clip_search}")
    need(q.clip_tolerance_pt >= 0, f"quantize.clip_tolerance_pt must be >= 0 (points of agreement), got "
         f"{q.clip_tolerance_pt}")
    need(0 <= q.agreement_floor <= 1, f"quantize.agreement_floor must be in [0, 1] (a share of the validation "
         f"inputs), got {q.agreement_floor}")
    need(1 <= q.timing_blocks <= q.repeats, "quantize.timing_blocks must be in 1..quantize.repeats")
    return q


def load(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    cfg = Config()
    if path is not None:
        apply(cfg, read_file(path))
    apply_overrides(cfg, overrides or [])
    return validate(cfg)


def from_dict(values: dict[str, Any]) -> Config:
    return apply(Config(), values)
