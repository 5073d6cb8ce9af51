"""onnxruntime static quantization of an fp32 ONNX file, and its measurements (SQNR per tensor, accuracy, size,
op counts): the library of the int8 stage (`pipeline/stages/int8.py`) and of `analysis.api.quantize`.

Recipe (onnxruntime's, nothing custom in the arithmetic): `quant_pre_process` (shape inference and
basic graph optimization), then `quantize_static` in QDQ format with per-channel int8 weights and
per-tensor activations calibrated on `quantize.calibration_samples` training examples through a
`CalibrationDataReader` (MinMax, Entropy or Percentile; Entropy needs a finer histogram than
quantize_static gives it, see `_entropy_ranges`). With Percentile the clip is chosen per model from
`quantize.clip_search` on held-out inputs (`choose_clip`): finer activation grids leave the int8 verifier less
rounding noise, as far as agreement with fp32 allows. Only the linear layers (Gemm, Conv, MatMul),
ReLU and data movement are quantized: elementwise float ops (λ-GELU's Mul → Gelu → Div, plain Gelu)
stay float between DequantizeLinear and QuantizeLinear, which is what onnxruntime does with them anyway.
Biases stay fp32 in the file (`quantize.quantize_bias=false`): onnxruntime quantizes them to int32
when it fuses QGemm/QLinearConv, so the runtime graph and outputs are those of an int32-bias file,
which would also store a float scale and an int32 zero point per output channel.

Deployment vs verification: by default ReLUs are removed (`QDQKeepRemovableActivations=False`):
the QuantizeLinear after Gemm/Conv clips at its zero point, which is ReLU exactly, and onnxruntime
then runs Q → QGemm/QLinearConv ... → DQ with no float op in between. The verify stage verifies this
file itself (the "-int8" rows): its reader relaxes every Q/DQ pair soundly for onnxruntime's kernels
(`analysis/verification/quantized.py`). Weights are 7-bit by default (`quantize.reduce_range`): on an
x86 CPU without VNNI onnxruntime's u8s8 kernels add products in pairs in int16 with saturation, and
with 8-bit weights the outputs fall outside every bound (the int8 tests show it).

Input normalization: an MLP's `Normalize` (x·scale + shift) can be folded into its first Linear before quantization
(W' = W·diag(scale), b' = b + W·shift; exact algebra, checked in fp32): the int8 MLP then takes natural-unit inputs,
its QuantizeLinear sees them raw and the graph is integer-only. One per-tensor grid over raw features is lossless
where they share a scale (pixels: 1/255 on [0, 1]) and ruinous where they do not (a table: every feature smaller
than the grid's step becomes a constant). So the fold is a candidate, not a rule: `quantize_forms` quantizes the
model both ways and keeps the fold only where its validation agreement with fp32 is as good, and its input grid
loses no more features, as keeping the normalization in float before the first QuantizeLinear (its Mul/Add then stay float, as on a CNN, which cannot
fold: zero padding is not zero after the shift). `input_sqnr_rows` measures what the input grid keeps of each
feature, and `agreement_warning` names the inputs or layers that lose it when agreement falls below
`quantize.agreement_floor`.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import onnx
import torch
from onnxruntime import quantization as q
from onnxruntime.quantization.calibrate import HistogramCollector

from pipeline.config import QuantizeConfig
from pipeline.evaluate import score
from pipeline.atomic_io import atomic_path

from . import ort as ort_util

QUANTIZED_OPS = ["Conv", "Gemm", "MatMul", "Relu", "Flatten", "Reshape", "MaxPool"]
CALIBRATION_BATCH = 128
ENTROPY_BINS = 1024  # histogram bins over [-max|x|, max|x|] for the KL search (onnxruntime's default 128 leaves no choice)
# A tensor below this SQNR has lost much of its signal to rounding: noise above a tenth of its amplitude (an 8-bit
# grid spent evenly on a tensor gives about 40 dB).
LOW_SQNR_DB = 20.0
_WORST_LISTED = 5  # inputs named in a warning


class ArrayReader(q.CalibrationDataReader):
    """Calibration (and SQNR) inputs from an array: {input: batch} dicts, restartable."""

    def __init__(self, x: np.ndarray, batch: int = CALIBRATION_BATCH):
        self.x = ort_util.as_input(x)
        self.batch = batch
        self._it: Iterator[dict[str, np.ndarray]] | None = None
        self.rewind()

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)

    def rewind(self) -> None:
        self._it = iter([{ort_util.INPUT: self.x[i:i + self.batch]} for i in range(0, len(self.x), self.batch)])

    def __len__(self) -> int:
        return math.ceil(len(self.x) / self.batch)


def calibration_samples(qcfg: QuantizeConfig, x: torch.Tensor, seed: int) -> np.ndarray:
    """`quantize.calibration_samples` training examples, drawn without replacement with `seed` (the run's)."""
    if not len(x):
        raise ValueError("no calibration inputs: static quantization needs at least one to calibrate its activation ranges")
    n = min(qcfg.calibration_samples, len(x))
    idx = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))[:n]
    return x[idx].numpy()


# ---------------------------------------------------------------------------------------------
# Quantization and its checks


@dataclass
class Quantized:
    """What `quantize_file` made: the pre-processed fp32 file (the SQNR's reference), the percentile the activation
    ranges were clipped at (None: not percentile calibration), when a clip was chosen every candidate's record
    (`clip_fidelity`, the reference percentile first), and when a search was asked for but not run, why."""

    pre: Path
    percentile: float | None
    search: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""


def quantize_file(src: Path, dst: Path, calib: np.ndarray, qcfg: QuantizeConfig, workdir: Path,
                  check: np.ndarray | None = None, batch_size: int = ort_util.INFER_BATCH) -> Quantized:
    """quant_pre_process + quantize_static (QDQ, per-channel int8 weights), written to `dst`.

    Percentile calibration with `check` inputs and `quantize.clip_search`: one model per candidate clip, all from one
    histogram pass over `calib`, each compared with the fp32 model on `check`, and the one `choose_clip` picks is
    written. Without `check`, with no search, or with too few `check` outputs for `quantize.clip_tolerance_pt` to
    amount to one of them (then a clip's cost cannot be told from noise; `note` says so): the model at
    `quantize.percentile`."""
    pre = workdir / f"{dst.stem}.pre.onnx"
    q.quant_pre_process(str(src), str(pre))
    if qcfg.activation_type == "int16":
        _gemm_weights_transposed(pre)
    # The histogram calibrators print progress to stdout; the stage reports its own.
    with contextlib.redirect_stdout(io.StringIO()):
        if qcfg.calibration_method != "percentile":
            cache = _entropy_ranges(pre, calib, workdir) if qcfg.calibration_method == "entropy" else None
            with atomic_path(dst) as tmp:
                _quantize_static(pre, tmp, qcfg, ArrayReader(calib), cache)
            return Quantized(pre, None)
        clips, note, batch = qcfg.clip_candidates[:1], "", batch_size
        if check is not None and len(check) and len(qcfg.clip_candidates) > 1:
            reference = ort_util.infer(ort_util.session(pre, qcfg.threads), check, batch)
            n = reference.size // reference.shape[-1]  # argmax outputs: one per input, or per token
            if qcfg.clip_tolerance_pt / 100 * n >= 1:
                clips = qcfg.clip_candidates
            else:
                note = (f"{n} validation outputs: {qcfg.clip_tolerance_pt:g} points of agreement is less than one of "
                        f"them, so no clip's cost can be told from noise")
        ranges = _percentile_ranges(pre, calib, workdir, clips)
        if len(clips) == 1:
            with atomic_path(dst) as tmp:
                _quantize_static(pre, tmp, qcfg, None, ranges[clips[0]])
            return Quantized(pre, clips[0], note=note)
        files, rows = {}, []
        for p in clips:
            files[p] = workdir / f"{dst.stem}.p{p:g}.onnx"
            _quantize_static(pre, files[p], qcfg, None, ranges[p])
            rows.append({"percentile": p, **clip_fidelity(reference, ort_util.infer(ort_util.session(files[p], qcfg.threads),
                                                                                    check, batch))})
    chosen = choose_clip(rows, qcfg.clip_tolerance_pt)
    with atomic_path(dst) as tmp:
        shutil.copyfile(files[chosen], tmp)
    return Quantized(pre, chosen, rows)


def quantize_forms(forms: dict[str, Path], dst: Path, calib: np.ndarray, qcfg: QuantizeConfig, workdir: Path,
                   check: np.ndarray | None = None,
                   batch_size: int = ort_util.INFER_BATCH) -> tuple[str, Quantized, list[dict[str, Any]]]:
    """One model given as several fp32 files of the same function (`forms`, in order of preference; the last is the
    reference, e.g. {"folded": input normalization folded into the first Linear, "float": kept in float}), each
    quantized by `quantize_file` and compared with the reference fp32 file on `check` (`clip_fidelity`, and how many
    inputs the input grid keeps under LOW_SQNR_DB of, `input_sqnr_rows` on the first `quantize.sqnr_samples`). `dst`
    gets, among the forms whose argmax disagreements are at most `quantize.clip_tolerance_pt` points of the inputs
    above the fewest, one that loses the fewest inputs, the first in order of preference. Returns the form chosen, its
    `Quantized` and every form's record ([] where one form or no `check` left nothing to compare: the first form is
    written).

    Why a choice: folded, the graph quantizes the raw input on one per-tensor grid, lossless where every feature
    shares one scale (pixels) but not on a table, where features smaller than the grid's step become constants;
    in float, the grid sees standardized features, at the cost of a float Mul/Add before it. The lost inputs decide
    where agreement cannot: a small validation split, or a model that ignores the inputs it would lose."""
    names = list(forms)
    if len(names) == 1 or check is None or not len(check):
        return names[0], quantize_file(forms[names[0]], dst, calib, qcfg, workdir, check, batch_size), []
    threads, batch = qcfg.threads, batch_size
    reference = ort_util.infer(ort_util.session(forms[names[-1]], threads), check, batch)
    made, rows = {}, []
    for name in names:
        sub = workdir / f"form-{name}"
        sub.mkdir(exist_ok=True)
        path = sub / dst.name
        made[name] = quantize_file(forms[name], path, calib, qcfg, sub, check, batch_size)
        inputs = [r["sqnr_db"] for r in input_sqnr_rows(path, check[:qcfg.sqnr_samples], tuple(check.shape[1:]))]
        rows.append({"form": name, **clip_fidelity(reference, ort_util.infer(ort_util.session(path, threads), check, batch)),
                     "inputs_lost": sum(float(v) < LOW_SQNR_DB for v in inputs),
                     "min_input_sqnr_db": min(inputs, key=float) if inputs else None})
    allowed = min(r["disagreements"] for r in rows) + qcfg.clip_tolerance_pt / 100 * rows[0]["inputs"]
    close = [r for r in rows if r["disagreements"] <= allowed]
    chosen = min(close, key=lambda r: r["inputs_lost"])["form"]  # min keeps the first of equals: the preferred form
    with atomic_path(dst) as tmp:
        shutil.copyfile(workdir / f"form-{chosen}" / dst.name, tmp)
    return chosen, made[chosen], rows


def clip_fidelity(reference: np.ndarray, logits: np.ndarray) -> dict[str, Any]:
    """An int8 model's outputs against the fp32 model's on the same inputs: argmax agreement (the share, and the
    inputs where it differs) and the outputs' SQNR in dB."""
    differ = int((reference.argmax(-1) != logits.argmax(-1)).sum())
    n = reference.size // reference.shape[-1]
    ref = reference.astype(np.float64)
    noise = float(np.square(ref - logits).sum())
    return {"agreement": 1 - differ / n, "disagreements": differ, "inputs": n,
            "output_sqnr_db": _db(10 * math.log10(float(np.square(ref).sum()) / noise) if noise > 0 else math.inf)}


def choose_clip(rows: list[dict[str, Any]], tolerance_pt: float) -> float:
    """The most clipping percentile whose argmax agreement is at most `tolerance_pt` points below the reference's
    (`rows[0]`), counted in inputs so that no float rounding decides a tie: finer grids, for the verifier, at an
    agreement the validation set cannot tell from the reference's."""
    ref = rows[0]
    allowed = ref["disagreements"] + tolerance_pt / 100 * ref["inputs"]
    return min((r for r in rows if r["disagreements"] <= allowed), key=lambda r: r["percentile"])["percentile"]


def _quantize_static(pre: Path, dst: Path, qcfg, reader: ArrayReader | None, ranges: Path | None) -> None:
    """onnxruntime's quantize_static with the stage's settings, from `reader`'s inputs or a ranges cache."""
    methods = {"minmax": q.CalibrationMethod.MinMax, "entropy": q.CalibrationMethod.Entropy,
               "percentile": q.CalibrationMethod.Percentile}
    act_type = {"int8": q.QuantType.QInt8, "uint8": q.QuantType.QUInt8, "int16": q.QuantType.QInt16}[qcfg.activation_type]
    with _opset_note_muted():  # a 16-bit grid needs opset 21: onnxruntime raises the file's opset and logs that
        q.quantize_static(str(pre), str(dst), reader, quant_format=q.QuantFormat.QDQ, calibration_cache_path=ranges,
                          op_types_to_quantize=QUANTIZED_OPS, per_channel=qcfg.per_channel, reduce_range=qcfg.reduce_range,
                          weight_type=q.QuantType.QInt8, activation_type=act_type,
                          calibrate_method=methods[qcfg.calibration_method],
                          extra_options={"QDQKeepRemovableActivations": qcfg.keep_activations,
                                         "QuantizeBias": qcfg.quantize_bias, "CalibPercentile": qcfg.percentile})


def _gemm_weights_transposed(path: Path) -> int:
    """Every Gemm with a constant weight and transB=0 (a Linear on tokens, which the exporter writes as MatMul and
    quant_pre_process turns into a Gemm) rewritten with the weight stored transposed and transB=1: the same function.
    For a 16-bit graph: onnxruntime's CPU optimizer rewrites DequantizeLinear → Gemm(transB=0) as MatMulNBits, which
    computes with its input requantized to int8 per block, a rounding the verifier does not bound; it leaves transB=1
    a float32 Gemm (onnxruntime 1.32's behaviour; the reader asks onnxruntime again, `readers.from_onnx`). Returns
    how many were rewritten."""
    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    uses: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    done = 0
    for node in model.graph.node:
        attrs = {a.name: a for a in node.attribute}
        if (node.op_type != "Gemm" or node.input[1] not in inits or uses[node.input[1]] > 1  # a shared weight stays
                or (attrs["transB"].i if "transB" in attrs else 0)):
            continue
        w = onnx.numpy_helper.to_array(inits[node.input[1]])
        inits[node.input[1]].CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(w.T), node.input[1]))
        if "transB" in attrs:
            node.attribute.remove(attrs["transB"])
        node.attribute.append(onnx.helper.make_attribute("transB", 1))
        done += 1
    if done:
        onnx.save(model, str(path))
    return done


@contextlib.contextmanager
def _opset_note_muted():
    """onnxruntime's quantizer logs a warning on the root logger when it raises a model's opset for 16-bit types
    ("Please update the model to opset >= 21"): that is the recipe here, not news, so the stage's log leaves it out."""
    def keep(record: logging.LogRecord) -> bool:
        return "16-bit integer quantization" not in record.getMessage()

    root = logging.getLogger()
    root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)


def _percentile_ranges(model: Path, calib: np.ndarray, workdir: Path, clips: list[float]) -> dict[float, Path]:
    """Percentile calibration's ranges at each of `clips`, saved as calibration caches, from one pass over `calib`.

    The calibrator is the one quantize_static builds for CalibPercentile (`create_calibrator` with only the
    percentile set: onnxruntime's 2048 bins, symmetric ranges); its histograms do not depend on the percentile,
    which only `compute_data` reads, so one collection serves every clip.
    """
    calibrator = _collected(model, calib, workdir, q.CalibrationMethod.Percentile, {"percentile": clips[0]})
    out = {}
    for p in clips:
        calibrator.collector.percentile = p
        out[p] = _save_ranges(calibrator, workdir / f"ranges-p{p:g}.json")
    return out


def _entropy_ranges(model: Path, calib: np.ndarray, workdir: Path) -> Path:
    """Entropy (KL) calibration with a histogram fine enough to choose from, saved as a calibration cache.

    quantize_static builds its entropy calibrator with 128 histogram bins and 128 quantized bins, so
    the KL search has one candidate, the full range, and "entropy" silently equals MinMax. It passes
    no option to change that, hence this calibrator built by hand with ENTROPY_BINS bins.
    """
    calibrator = _collected(model, calib, workdir, q.CalibrationMethod.Entropy,
                            {"num_bins": ENTROPY_BINS, "num_quantized_bins": 128})
    return _save_ranges(calibrator, workdir / "entropy_ranges.json")


class _FlatHistogramCollector(HistogramCollector):
    """onnxruntime's histogram collector, given each tensor's batches joined into one flat array: its own
    `np.asarray` of the list of batches fails when the last batch is smaller than the others ("inhomogeneous
    shape"), and it flattens the values anyway, so the histograms are those of one batch of every input."""

    def collect(self, name_to_arr):
        return super().collect({name: np.concatenate([np.asarray(a).reshape(-1) for a in arrs]) if isinstance(arrs, list)
                                else arrs for name, arrs in name_to_arr.items()})


def _collected(model: Path, calib: np.ndarray, workdir: Path, method, options: dict[str, Any]):
    """onnxruntime's calibrator for `method` with `options`, after one pass over `calib` (the histograms)."""
    from onnxruntime.quantization.calibrate import create_calibrator

    calibrator = create_calibrator(model, QUANTIZED_OPS, augmented_model_path=str(workdir / f"{method.name}_aug.onnx"),
                                   calibrate_method=method, extra_options=options)
    calibrator.collector = _FlatHistogramCollector(
        method=calibrator.method, symmetric=calibrator.symmetric, num_bins=calibrator.num_bins,
        num_quantized_bins=calibrator.num_quantized_bins, percentile=calibrator.percentile, scenario=calibrator.scenario)
    calibrator.collect_data(ArrayReader(calib))
    return calibrator


def _save_ranges(calibrator, path: Path) -> Path:
    """The calibrator's ranges as they stand, as a calibration cache quantize_static reads."""
    from onnxruntime.quantization.calibrate import save_tensors_data

    save_tensors_data(calibrator.compute_data(), path)
    return path


def sqnr_rows(float_path: Path, int8_path: Path, x: np.ndarray, workdir: Path) -> list[dict[str, Any]]:
    """Per-tensor SQNR in dB of the int8 graph against the fp32 graph it was made from, on the same inputs
    (onnxruntime's qdq_loss_debug), in graph order: activations (the float tensor vs the int8 graph's
    dequantized copy, so the error accumulated up to that tensor), then weights (float vs dequantized int8).

    onnxruntime's per-tensor "qdq_err" (the rounding at one tensor alone) is left out on purpose: where a
    ReLU was absorbed into the QuantizeLinear, its "input" is the pre-ReLU Gemm output, so that number
    measures the ReLU, not the quantization.
    """
    from onnxruntime.quantization import qdq_loss_debug as dbg

    aug_f, aug_q = workdir / "aug_fp32.onnx", workdir / "aug_int8.onnx"
    dbg.modify_model_output_intermediate_tensors(str(float_path), str(aug_f))
    dbg.modify_model_output_intermediate_tensors(str(int8_path), str(aug_q))
    acts_f = dbg.collect_activations(str(aug_f), ArrayReader(x))
    acts_q = dbg.collect_activations(str(aug_q), ArrayReader(x))
    graph = onnx.load(str(float_path)).graph
    order = {name: i for i, name in enumerate(o for n in graph.node for o in n.output)}
    worder = {t.name: i for i, t in enumerate(graph.initializer)}
    act_err = dbg.compute_activation_error(dbg.create_activation_matching(acts_q, acts_f))
    w_err = dbg.compute_weight_error(dbg.create_weight_matching(str(float_path), str(int8_path)))
    rows = [{"tensor": n, "kind": "activation", "sqnr_db": _db(act_err[n]["xmodel_err"])}
            for n in sorted(act_err, key=lambda n: order.get(n, len(order)))]
    rows += [{"tensor": n, "kind": "weight", "sqnr_db": _db(w_err[n])} for n in sorted(w_err, key=lambda n: worder.get(n, len(worder)))]
    return rows


def input_sqnr_rows(int8_path: Path, x: np.ndarray, input_shape: tuple[int, ...],
                    names: list[str] | None = None) -> list[dict[str, Any]]:
    """Per input feature, the SQNR in dB of the graph input's own quantization on `x`: the value entering the first
    QuantizeLinear that reads the input (after any float normalization before it) against its DequantizeLinear, as
    onnxruntime computes them, with the feature's variation about its mean as the signal (a feature worth keeping
    varies; its offset says nothing). Rows like `sqnr_rows`' with kind "input", named by `names` (one per feature)
    or by index; [] when no QuantizeLinear reads the input (token ids, a float graph). A feature constant on `x`
    has no variation to lose and gets no row."""
    import onnxruntime as ort

    model = onnx.load(str(int8_path))
    g = model.graph
    found = _input_quantizer(g)
    if found is None:
        return []
    before, after = found
    wanted = [after] if before == g.input[0].name else [before, after]
    del g.output[:]
    g.output.extend(onnx.helper.make_empty_tensor_value_info(t) for t in wanted)
    opts = ort_util.session_options(level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)  # Q and DQ as written
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    x = ort_util.as_input(x)
    vals = [[x[i:i + CALIBRATION_BATCH]] * (len(wanted) == 1) + sess.run(None, {g.input[0].name: x[i:i + CALIBRATION_BATCH]})
            for i in range(0, len(x), CALIBRATION_BATCH)]
    v, vq = (np.concatenate([b[k] for b in vals]).astype(np.float64).reshape(len(x), -1) for k in (0, 1))
    signal = np.square(v - v.mean(0)).mean(0)
    noise = np.square(v - vq).mean(0)
    if names is None or len(names) != v.shape[1]:
        shape = input_shape if math.prod(input_shape) == v.shape[1] else (v.shape[1],)
        names = [f"input[{','.join(map(str, np.unravel_index(j, shape)))}]" for j in range(v.shape[1])]
    return [{"tensor": names[j], "kind": "input",
             "sqnr_db": _db(10 * math.log10(signal[j] / noise[j]) if noise[j] > 0 else math.inf)}
            for j in range(v.shape[1]) if signal[j] > 0]


# Float ops a graph input may pass through before its first QuantizeLinear (a normalization and data movement).
_INPUT_PROLOGUE = frozenset({"Mul", "Add", "Sub", "Div", "Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity"})


def _input_quantizer(graph: onnx.GraphProto) -> tuple[str, str] | None:
    """The tensor entering the first QuantizeLinear fed by the graph input through `_INPUT_PROLOGUE` ops alone, and
    its DequantizeLinear's output; None if there is none."""
    raw = {graph.input[0].name}
    for node in graph.node:  # ONNX graphs are stored in topological order
        if not raw.intersection(node.input):
            continue
        if node.op_type == "QuantizeLinear":
            dq = next((n for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] == node.output[0]), None)
            return (node.input[0], dq.output[0]) if dq is not None else None
        if node.op_type not in _INPUT_PROLOGUE:
            return None
        raw.update(node.output)
    return None


def agreement_warning(model: str, fidelity: dict[str, Any], floor: float, where: str, rows: list[dict[str, Any]],
                      folded: bool) -> str | None:
    """One line when the argmax agreement of `fidelity` (`clip_fidelity`: int8 against fp32 on `where`) is below
    `floor`, else None: the cause read from the SQNR rows (`input_sqnr_rows`, then `sqnr_rows`' activations in graph
    order) and the fix for it. `folded`: the int8 file quantizes the raw input (its normalization folded into the
    first Linear)."""
    if fidelity["agreement"] >= floor:
        return None

    def db(r: dict[str, Any]) -> float:
        return r["sqnr_db"] if isinstance(r["sqnr_db"], float) else float(r["sqnr_db"])

    inputs = sorted((r for r in rows if r["kind"] == "input"), key=db)
    lost = [r for r in inputs if db(r) < LOW_SQNR_DB]
    acts = [r for r in rows if r["kind"] == "activation"]
    first_low = next((r for r in acts if db(r) < LOW_SQNR_DB), None)
    head = (f"{model}: int8 agrees with fp32 on {fidelity['agreement']:.2%} of {where} ({fidelity['disagreements']} of "
            f"{fidelity['inputs']} differ), below quantize.agreement_floor {floor:.2%}")
    if lost:
        worst = ", ".join(f"{r['tensor']} {db(r):.1f} dB" for r in lost[:_WORST_LISTED])
        cause = (f"the input grid keeps under {LOW_SQNR_DB:g} dB SQNR of {len(lost)} of {len(inputs)} inputs' variation "
                 f"({worst}{', ...' if len(lost) > _WORST_LISTED else ''})")
        fix = ("keep the standardization in float before the first QuantizeLinear: quantize.fold_normalization=false"
               if folded else "standardize each input feature inside the model (a first layer x·scale + shift with "
               "one mean and std per feature, as pipeline.models.Normalize), so that one grid fits every input, or "
               "16-bit activation grids: quantize.activation_type=int16")
    elif first_low is not None:
        cause = (f"activations lose it from {first_low['tensor']} on ({db(first_low):.1f} dB SQNR; the lowest "
                 f"{min(db(r) for r in acts):.1f} dB)")
        fix = "16-bit activation grids: quantize.activation_type=int16 (w8a16), or calibrate on more samples"
    else:
        cause = (f"no input or activation is below {LOW_SQNR_DB:g} dB SQNR, so the differing inputs are near-ties of "
                 f"the fp32 logits")
        fix = ("16-bit activation grids narrow them: quantize.activation_type=int16 (w8a16); on a small split judge "
               "the count, not the share")
    return f"{head}; cause: {cause}; fix: {fix}"


def _db(v: float) -> float | str:
    """A finite SQNR as float; a lossless tensor (no noise) as "inf" so the JSON/CSV stays valid."""
    v = float(v)
    return v if math.isfinite(v) else ("inf" if v > 0 else "-inf")


def evaluate_file(path: Path, ds, threads: int = 1,
                  batch_size: int = ort_util.INFER_BATCH) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The data's metric (accuracy, or perplexity for a language model) on the full validation and test
    sets, file size and op counts (raw, and as onnxruntime runs it)."""
    metric = ds.info.metric
    sess = ort_util.session(path, threads)
    logits = {split: ort_util.infer(sess, getattr(ds, split).x.numpy(), batch_size) for split in ("val", "test")}
    facts = {f"{split}_{metric}": score(torch.from_numpy(logits[split]), getattr(ds, split).y, metric)["metric"]
             for split in ("val", "test")}
    facts.update(ort_util.file_facts(path, threads))
    return facts, logits