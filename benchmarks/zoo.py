"""The models people already have, tiny, through every stage: timm's ConvNeXt, ViT, ResNet (SiLU) and MobileNetV3
(HardSwish), Hugging Face's BERT and GPT-2 (its default `gelu_new`), built from configs with random weights (no hub), converted with
no declaration, hardened in a plain loop, swapped, exported and quantized; tests/test_zoo.py asserts on the same runs.

    flock /tmp/heavy.lock python -m benchmarks.zoo        # writes benchmarks/zoo-results/zoo.json; ZOO.md quotes it
    flock /tmp/heavy.lock python -m benchmarks.zoo mobilenetv3     # one family: zoo-results/zoo-mobilenetv3.json
"""

from __future__ import annotations

import copy
import json
import platform
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.overrides import TorchFunctionMode

from pipeline.extras import import_timm, import_transformers

VOCAB, TOKENS, CLASSES = 32, 8, 3
FAMILIES = ("convnext", "vit", "resnet_silu", "bert", "gpt2")
# Families measured by `main` but too slow for the fast suite's fixtures (tests/test_zoo.py runs them as slow tests)
SLOW_FAMILIES = ("mobilenetv3",)


def build(name: str) -> torch.nn.Module:
    """The family's model as its library builds it (its own activation classes), tiny."""
    timm, transformers = import_timm(), import_transformers()
    torch.manual_seed(0)
    if name == "convnext":  # timm's GELU module (act_layer='gelu'), in-place adds none, LayerNorm2d
        return timm.create_model("convnext_atto", pretrained=False, num_classes=10, depths=(1, 1, 1, 1), dims=(8, 16, 24, 32))
    if name == "vit":  # nn.GELU, attention, a class token
        return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, img_size=32, patch_size=8,
                                 embed_dim=32, depth=2, num_heads=2)
    if name == "resnet_silu":  # nn.SiLU(inplace=True), `x += shortcut`, BatchNorm
        return timm.create_model("resnet18", pretrained=False, num_classes=10, act_layer="silu", layers=(1, 1, 1, 1),
                                 channels=(8, 16, 32, 64))
    if name == "bert":  # GELUActivation holding F.gelu, a Tanh pooler
        cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                                      vocab_size=VOCAB, max_position_embeddings=TOKENS, num_labels=CLASSES)
        return transformers.BertForSequenceClassification(cfg)
    if name == "gpt2":  # NewGELUActivation (the tanh formula), Conv1D (addmm)
        cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=TOKENS,
                                      num_labels=CLASSES, pad_token_id=0, bos_token_id=1, eos_token_id=1)
        return transformers.GPT2ForSequenceClassification(cfg)
    if name == "mobilenetv3":  # nn.Hardswish activations, squeeze-excite nn.Hardsigmoid gates, ReLU stem blocks
        return timm.create_model("mobilenetv3_small_050", pretrained=False, num_classes=10)
    raise ValueError(name)


def data(name: str, n: int = 768) -> tuple[torch.Tensor, torch.Tensor]:
    """Digits as 3×32×32 images for the vision models; token sequences whose class is the first token mod 3 (repeated
    last, where GPT-2 reads it; never the pad id 0) for the text models."""
    g = torch.Generator().manual_seed(0)
    if name in ("bert", "gpt2"):
        x = torch.randint(1, VOCAB, (n, TOKENS), generator=g)
        x[:, -1] = x[:, 0]
        return x, x[:, 0] % CLASSES
    xs, ys = load_digits(return_X_y=True)
    img = torch.tensor(xs[:n] / 16, dtype=torch.float32).reshape(-1, 1, 8, 8)
    img = torch.nn.functional.interpolate(img, size=32, mode="nearest").expand(-1, 3, -1, -1).contiguous()
    return img, torch.tensor(ys[:n])


def logits(out):
    return out.logits if hasattr(out, "logits") else out


def harden(name: str, epochs: int = 4, train: int = 512):
    """(the model converted with no declaration and hardened in a plain loop, the conversion report, the hardener,
    (x_train, y_train, x_test, y_test))."""
    from pipeline import Hardener, to_gates

    x, y = data(name)
    model, report = to_gates(build(name))
    hardener = Hardener(model, epochs=epochs)
    opt = torch.optim.Adam(hardener.param_groups(lr=3e-3, weight_decay=0.0), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for epoch in range(1, epochs + 1):
        hardener.start_epoch(epoch)
        model.train()
        for i in torch.randperm(train, generator=g).split(64):
            opt.zero_grad()
            F.cross_entropy(logits(model(x[i])), y[i]).backward()
            opt.step()
    return model.eval(), report, hardener, (x[:train], y[:train], x[train:], y[train:])


class SmoothOps(TorchFunctionMode):
    """Counts the smooth elementwise functions a forward calls, by the class of the module that called them: the
    reference for "no smooth op is left in the swapped forward"."""

    NAMES = {"gelu", "silu", "mish", "erf", "erfc", "tanh", "sigmoid", "softplus", "exp", "hardswish", "hardsigmoid"}

    def __init__(self, model: nn.Module):
        super().__init__()
        self.stack, self.counts, self.handles = [], {}, []
        for m in model.modules():
            self.handles += [m.register_forward_pre_hook(lambda mod, a: self.stack.append(type(mod).__name__)),
                             m.register_forward_hook(self._leave)]

    def _leave(self, module, args, output) -> None:  # None: the output stays
        self.stack.pop()

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "").strip("_")
        if name in self.NAMES:
            key = f"{self.stack[-1] if self.stack else '(root)'}.{name}"
            self.counts[key] = self.counts.get(key, 0) + 1
        return func(*args, **(kwargs or {}))


def stages(name: str, folder: Path) -> dict:
    """One family through every stage, timed; the numbers the issue's goals name."""
    from analysis import api
    from pipeline import to_relu

    t = time.perf_counter()
    model, report, hardener, (x_train, _, x, y) = harden(name)
    trained = time.perf_counter() - t
    swap = api.swap(model, (x, y))
    relu = to_relu(copy.deepcopy(model), x[:2])
    counter = SmoothOps(relu)
    with torch.no_grad(), counter:
        relu(x[:4])
    t = time.perf_counter()
    exported = api.export_onnx(relu, x[:2], folder / f"{name}.onnx", check_inputs=x)
    export_s = time.perf_counter() - t
    int8 = api.quantize(relu, x_train, folder / f"{name}.int8.onnx", data=(x, y))
    return {"family": name, "params": sum(p.numel() for p in model.parameters()),
            "converted": [f"{s.fqn}: {s.source} -> {s.target}" for s in report.converted],
            "left": [s.fqn for s in report.left], "not_gates": [f"{s.fqn}: {s.source}" for s in report.not_gates],
            "hardened": hardener.hardened(), "train_s": trained, "swap": swap,
            "smooth_ops_left": counter.counts, "export_s": export_s, "ort_bound_ratio": exported["ort_bound_ratio"],
            "fp32_accuracy": int8["fp32"]["accuracy"], "int8_accuracy": int8["int8"]["accuracy"]}


def main(names: list[str] | None = None) -> None:
    """Every family (zoo-results/zoo.json), or those named (zoo-results/zoo-<names>.json)."""
    names = names or list(FAMILIES + SLOW_FAMILIES)
    unknown = sorted(set(names) - set(FAMILIES + SLOW_FAMILIES))
    if unknown:
        raise SystemExit(f"error: unknown families {unknown}; choose from {', '.join(FAMILIES + SLOW_FAMILIES)}")
    every = set(names) == set(FAMILIES + SLOW_FAMILIES)
    out = Path(__file__).resolve().parent / "zoo-results" / ("zoo.json" if every else f"zoo-{'-'.join(names)}.json")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            rows.append(stages(name, Path(tmp)))
            r = rows[-1]
            print(f"{name}: swap max|Δlogit| {r['swap']['max_logit_change']:.2e}, int8 {r['int8_accuracy']:.4f} vs fp32 "
                  f"{r['fp32_accuracy']:.4f}, smooth ops left {r['smooth_ops_left']}, export {r['export_s']:.2f} s", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cpu": platform.processor(), "threads": torch.get_num_threads(), "rows": rows}, indent=1,
                              default=str) + "\n")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
