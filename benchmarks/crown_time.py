"""One CROWN pass of ours, timed, for comparing two trees of the engine side by side (run one after the other, each
with its own PYTHONPATH, in one hold of the shared lock):

    python -m benchmarks.crown_time preact RUN TAG      # our side of peers/crown_side_by_side on RUN's first 3
                                                        # properties of verify/onnx/lambda_gelu.onnx, 5 passes each
    python -m benchmarks.crown_time mobilenet TAG [EPS] [N]   # a MobileNetV2-style ReLU6 net, N properties at EPS
    python -m benchmarks.crown_time grouped [EPS] [N] [ROUNDS] [WIDTH]   # that net with depthwise convs (WIDTH 1) or
                                                        # grouped ones of WIDTH channels a group against the same net
                                                        # with each written as a plain conv, passes interleaved

Each prints `RESULT TAG ...` lines: seconds (min and median for `preact`), the spec rows' bounds, unstable ReLUs.
The MobileNetV2-style net (random weights, seed 0; inverted residuals with depthwise 3×3 convolutions, BatchNorm,
ReLU6, 9,994 parameters, 3×32×32 input, 10 classes) is what depthwise convolutions' back-substitution is timed on; its
properties are robustness of the predicted class at uniform random inputs in [0, 1] (seed 1), decided when CROWN's
margin bounds are all > 0.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn


def preact(run: Path, tag: str) -> None:
    from benchmarks.peers import crown_side_by_side as c

    for r in c.ours(c.properties(run, "lambda_gelu.onnx", 3), 5):
        print(f"RESULT {tag} {r['name']} min {min(r['seconds']):.4f} median {statistics.median(r['seconds']):.4f} "
              f"spec_lower_mean {sum(r['spec_lower']) / len(r['spec_lower']):.10f} unstable {r['unstable']}")


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, expand: int, stride: int, width: int = 1):
        super().__init__()
        hid = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [nn.Conv2d(cin, hid, 1, bias=False), nn.BatchNorm2d(hid), nn.ReLU6()]
        # depthwise (width 1) or grouped 3×3 of `width` channels a group (RegNetX's group width)
        layers += [nn.Conv2d(hid, hid, 3, stride, 1, groups=hid // width, bias=False), nn.BatchNorm2d(hid), nn.ReLU6(),
                   nn.Conv2d(hid, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


# the inverted residual blocks after the stem, (out channels, expansion, stride) each
BLOCKS_10K = ((8, 1, 1), (12, 4, 2), (12, 4, 1), (16, 4, 2), (16, 4, 1))  # 9,994 parameters
BLOCKS_13K = BLOCKS_10K + ((16, 4, 1),)  # 12,906 parameters


def mobilenet(blocks: tuple[tuple[int, int, int], ...] = BLOCKS_10K, width: int = 1) -> nn.Module:
    """The MobileNetV2-style net; `width` > 1: its 3×3 convolutions grouped with `width` channels a group."""
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU6()]
    cin = 8
    for cout, expand, stride in blocks:
        layers.append(InvertedResidual(cin, cout, expand, stride, width))
        cin = cout
    m = nn.Sequential(*layers, nn.Conv2d(cin, 64, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU6(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    for mod in m.modules():  # BatchNorm statistics as a trained net's, not the identity
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.1, 0.1)
            mod.running_var.uniform_(0.5, 1.5)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.1, 0.3)
    return m.eval()


def margin_rows(label: int, classes: int = 10) -> torch.Tensor:
    """The robustness property's rows: y_label − y_j for every other class j (all > 0: the label is kept)."""
    C = -torch.eye(classes, dtype=torch.float64)
    C[:, label] += 1
    return torch.cat([C[:label], C[label + 1:]])


def timed_pass(net, x0: torch.Tensor, eps: float, C: torch.Tensor):
    """One CROWN pass over the box x0 ± eps clipped to [0, 1], timed: (seconds, the rows' lower bounds, the Bounder)."""
    from analysis.verification.bounds import Bounder, Spec

    t0 = time.perf_counter()
    b = Bounder(net, (x0 - eps).clamp(0, 1), (x0 + eps).clamp(0, 1))
    b.crown()
    lower = b.spec_bounds(Spec(C, torch.zeros(len(C))))
    return time.perf_counter() - t0, lower, b


def mobilenet_pass(tag: str, eps: float, n: int) -> None:
    from analysis.verification.readers import from_torch

    net = from_torch(mobilenet(), (3, 32, 32))
    gen = torch.Generator().manual_seed(1)
    times, decided = [], 0
    for k in range(n):
        x0 = torch.rand(3 * 32 * 32, generator=gen, dtype=torch.float64)
        seconds, lower, b = timed_pass(net, x0, eps, margin_rows(int(net.forward(x0[None])[0].argmax())))
        times.append(seconds)
        decided += bool((lower > 0).all())
        print(f"RESULT {tag} mobilenet_{k}_{eps} seconds {times[-1]:.3f} margin_lower {float(lower.min()):.10f} "
              f"unstable {sum(b.result().unstable())}", flush=True)
    print(f"RESULT {tag} mobilenet median {statistics.median(times):.3f} s, decided by CROWN {decided}/{n}")


def as_plain(model: nn.Module) -> nn.Module:
    """A copy of `model` with every grouped convolution written as a plain one computing the same function: its weight
    block-diagonal over the groups, zero elsewhere (what a depthwise conv costs written without `groups`)."""
    import copy

    plain = copy.deepcopy(model)
    for name, mod in list(plain.named_modules()):
        for child_name, child in list(mod.named_children()):
            if isinstance(child, nn.Conv2d) and child.groups > 1:
                g, co, cig = child.groups, child.out_channels, child.in_channels // child.groups
                dense = nn.Conv2d(child.in_channels, co, child.kernel_size, child.stride, child.padding,
                                  child.dilation, 1, child.bias is not None)
                w = torch.zeros_like(dense.weight)
                for k in range(g):
                    rows = slice(k * co // g, (k + 1) * co // g)
                    w[rows, k * cig:(k + 1) * cig] = child.weight.data[rows]
                dense.weight.data = w
                if child.bias is not None:
                    dense.bias.data = child.bias.data.clone()
                setattr(mod, child_name, dense)
    return plain.eval()


def grouped_vs_plain(eps: float, n: int, rounds: int, width: int = 1) -> None:
    """CROWN passes on the MobileNetV2-style net (depthwise 3×3 convs, or grouped ones of `width` channels a group)
    and on `as_plain` of it, interleaved per property and round; prints each pass's seconds, the largest difference
    between the two nets' margin bounds, and the median ratio grouped / plain."""
    from analysis.verification.readers import from_torch

    model = mobilenet(BLOCKS_13K, width)
    nets = {"grouped": from_torch(model, (3, 32, 32)), "plain": from_torch(as_plain(model), (3, 32, 32))}
    gen = torch.Generator().manual_seed(1)
    ratios = []
    for k in range(n):
        x0 = torch.rand(3 * 32 * 32, generator=gen, dtype=torch.float64)
        C = margin_rows(int(nets["grouped"].forward(x0[None])[0].argmax()))
        secs: dict[str, list[float]] = {"grouped": [], "plain": []}
        lower: dict[str, torch.Tensor] = {}
        for _ in range(rounds):
            for name, net in nets.items():
                seconds, lower[name], _ = timed_pass(net, x0, eps, C)
                secs[name].append(seconds)
        ratio = statistics.median(secs["grouped"]) / statistics.median(secs["plain"])
        ratios.append(ratio)
        print(f"RESULT grouped_{k}_{eps} grouped {statistics.median(secs['grouped']):.3f} s plain "
              f"{statistics.median(secs['plain']):.3f} s ratio {ratio:.3f} max_bound_diff "
              f"{float((lower['grouped'] - lower['plain']).abs().max()):.3e}", flush=True)
    print(f"RESULT grouped median ratio grouped/plain {statistics.median(ratios):.3f} over {n} properties "
          f"(group width {width})")


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    if argv[0] == "preact":
        preact(Path(argv[1]), argv[2])
    elif argv[0] == "mobilenet":
        mobilenet_pass(argv[1], float(argv[2]) if len(argv) > 2 else 0.002, int(argv[3]) if len(argv) > 3 else 10)
    elif argv[0] == "grouped":
        grouped_vs_plain(float(argv[1]) if len(argv) > 1 else 0.002, int(argv[2]) if len(argv) > 2 else 5,
                         int(argv[3]) if len(argv) > 3 else 3, int(argv[4]) if len(argv) > 4 else 1)
    else:
        raise SystemExit(f"error: unknown mode {argv[0]!r}; use preact RUN TAG, mobilenet TAG [EPS] [N] or grouped [EPS] [N] [ROUNDS] [WIDTH]")


if __name__ == "__main__":
    main(sys.argv[1:])
