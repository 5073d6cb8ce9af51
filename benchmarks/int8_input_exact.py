"""Where an int8 run's disagreement with fp32 comes from: each int8 model of a run directory evaluated on the test
split as shipped, and with the input's QuantizeLinear → DequantizeLinear pair removed (the first layer reads the
standardized input exactly), the logits' pair removed, and both; accuracy and argmax agreement with the fp32 file.

    PYTHONPATH=. python -m benchmarks.int8_input_exact runs/adult-mlp-...   # one or more run directories

Used for benchmarks/int8-results/tabular.md (Adult's rare one-hot inputs below 20 dB SQNR: do they cost accuracy?)."""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
from pathlib import Path

import numpy as np
import onnx

from pipeline import config as config_mod
from pipeline.data import dataset_for
from quantize import ort as ort_util


def without_qdq(model: onnx.ModelProto, tensor: str) -> onnx.ModelProto:
    """`model` with the QuantizeLinear → DequantizeLinear pair on `tensor` removed: its consumers read it in float."""
    m = copy.deepcopy(model)
    g = m.graph
    q = next(n for n in g.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor)
    dq = next(n for n in g.node if n.op_type == "DequantizeLinear" and n.input[0] == q.output[0])
    if any(o.name == dq.output[0] for o in g.output):  # the graph's output: the float tensor takes its name
        for n in g.node:
            n.output[:] = [dq.output[0] if name == tensor else name for name in n.output]
    else:
        for n in g.node:
            n.input[:] = [tensor if name == dq.output[0] else name for name in n.input]
    g.node.remove(q)
    g.node.remove(dq)
    return m


def logits(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(model, Path(tmp) / "m.onnx")
        return ort_util.infer(ort_util.session(Path(tmp) / "m.onnx"), x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    for run in ap.parse_args().runs:
        cfg = config_mod.from_dict(json.loads((run / "config.json").read_text()))
        ds = dataset_for(cfg)
        x, y = ds.test.x.numpy(), ds.test.y.numpy()
        q = json.loads((run / "quantize" / "quantize.json").read_text())
        print(f"# {run}")
        for variant, forms in q["models"].items():
            for form, entry in forms.items():
                ref = logits(onnx.load(run / entry["fp32_path"]), x).argmax(-1)
                int8 = onnx.load(run / entry["int8_path"])
                quantized = [n.input[0] for n in int8.graph.node if n.op_type == "QuantizeLinear"]
                first, last = quantized[0], quantized[-1]  # the input's (after a float prologue) and the logits'
                models = {"int8": int8, "input exact": without_qdq(int8, first), "logits exact": without_qdq(int8, last)}
                models["both exact"] = without_qdq(models["input exact"], last)
                parts = []
                for name, m in models.items():
                    pred = logits(m, x).argmax(-1)
                    parts.append(f"{name}: accuracy {float((pred == y).mean()):.4f}, agreement {float((pred == ref).mean()):.4f}")
                print(f"{variant}/{form} (fp32 accuracy {float((ref == y).mean()):.4f}): " + "; ".join(parts), flush=True)


if __name__ == "__main__":
    main()
