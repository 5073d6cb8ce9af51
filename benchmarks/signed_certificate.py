"""The per-sample swap bound before and after the change is carried with its signs (`certificate/signed.py`), side by
side in one process: benchmarks.zoo's hardened MobileNetV3 (timm mobilenetv3_small_050, 64 test inputs) and a
6-block conv net with BatchNorm, residual adds and squeeze-excite (random weights, λ 20, 64 inputs). Per net: the
bound's max and median, its ratio to the change measured in float64, the share of samples whose top-1 it keeps, and
the walk's time each way.

    flock /tmp/heavy.lock python -m benchmarks.signed_certificate    # writes zoo-results/signed-certificate.json
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import torch
from torch import nn

from analysis.theory.certificate import Certifier, certified_fraction, relu_swapped


def conv_net(blocks: int = 6, lam: float = 20.0, seed: int = 0) -> nn.Module:
    """Conv → BN → GELU, then residual blocks (conv, BN, GELU, squeeze-excite with a Hardsigmoid gate), pooled to a
    Linear head, with BatchNorm statistics as a trained net has them; converted by `to_gates` (λ-GELU gates at λ)."""
    from pipeline import to_gates

    torch.manual_seed(seed)

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv, self.bn, self.act = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.GELU()
            self.se, self.gate = nn.Conv2d(c, c, 1), nn.Hardsigmoid()

        def forward(self, x):
            h = self.act(self.bn(self.conv(x)))
            return x + h * self.gate(self.se(h.mean((2, 3), keepdim=True)))

    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.GELU(), *[Block(8) for _ in range(blocks)],
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_var.uniform_(0.2, 2.0)
            m.running_mean.uniform_(-0.5, 0.5)
    model, _ = to_gates(net)
    for m in model.modules():
        if hasattr(m, "lam"):
            with torch.no_grad():
                m.lam.fill_(lam)
    return model.eval()


def measure(name: str, model: nn.Module, x: torch.Tensor) -> dict:
    cert = Certifier(model)
    cert.per_sample(x[:1])  # the first walk derives the gates' constants (sympy, cached): not the walk's cost
    t = time.perf_counter()
    box = cert.per_sample(x, signed=False).per_logit
    t_box = time.perf_counter() - t
    t = time.perf_counter()
    signed = cert.per_sample(x).per_logit
    t_signed = time.perf_counter() - t
    with torch.no_grad():
        s, r = model.double()(x.double()), relu_swapped(model).double()(x.double())
    change = (r - s).abs()
    row = {"net": name, "samples": len(x), "measured_max": float(change.max())}
    for key, b in (("box", box), ("signed", signed)):
        row[key] = {"max": float(b.max()), "median": float(b.median()),
                    "to_change_median": float((b / change.clamp_min(1e-300)).median()),
                    "holds": bool((b >= change).all()), "certified_fraction": certified_fraction(s, b)}
    row.update(walk_s_box=t_box, walk_s_signed=t_signed, signed_not_looser=bool((signed <= box).all()))
    return row


def main() -> None:
    from benchmarks.zoo import harden

    rows = []
    x = torch.randn(64, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    rows.append(measure("conv6 (random, λ 20, 8×8)", conv_net(), x))
    model, _, _, (_, _, xt, _) = harden("mobilenetv3")
    rows.append(measure("mobilenetv3_small_050 (benchmarks.zoo, hardened)", model, xt[:64]))
    for r in rows:
        print(f"{r['net']}: box max {r['box']['max']:.3g} (kept {r['box']['certified_fraction']:.3f}), signed max "
              f"{r['signed']['max']:.3g} (kept {r['signed']['certified_fraction']:.3f}), measured max {r['measured_max']:.3g}; "
              f"walk {r['walk_s_box']:.1f} s / {r['walk_s_signed']:.1f} s", flush=True)
    out = Path(__file__).resolve().parent / "zoo-results" / "signed-certificate.json"
    out.write_text(json.dumps({"cpu": platform.processor(), "threads": torch.get_num_threads(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
