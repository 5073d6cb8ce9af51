"""How loose CROWN's intermediate bounds are on the trained MobileNetV2-style ReLU6 net of `mobilenet_verify`, per
ReLU site: on 32 of the units CROWN leaves crossing 0 (seed 0), the mean width of CROWN's interval against the width
reached by projected gradient (30 signed steps of a quarter of the box from 64 random starts, each unit maximized and
minimized on its own: a lower estimate of the true range), and how many of them PGD shows truly crossing 0.

    flock /tmp/heavy.lock python -m benchmarks.mobilenet_bounds [--property 0] [--eps 0.002]

Prints one line per site (the even sites are each ReLU6's first ReLU; the odd ones its second) and the pass's time and
margin bound beside the centre's margin.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.crown_time import margin_rows, timed_pass
from benchmarks.mobilenet_verify import net_and_properties

UNITS = 32
STEPS = 30


def main(argv: list[str] | None = None) -> int:
    from analysis.verification.readers import from_torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--property", type=int, default=0)
    p.add_argument("--eps", type=float, default=0.002)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    model, xs, ys, _ = net_and_properties("trained", a.property + 1)
    net = from_torch(model, (3, 32, 32))
    x0, label = xs[a.property].reshape(-1).double(), int(ys[a.property])
    lb, ub = (x0 - a.eps).clamp(0, 1), (x0 + a.eps).clamp(0, 1)
    C = margin_rows(label)
    seconds, lower, b = timed_pass(net, x0, a.eps, C)
    print(f"CROWN pass {seconds:.2f} s, margin bound {float(lower.min()):.4f}, centre margin "
          f"{float((b.net.forward(x0[None])[0] @ C.T).min()):.4f}, unstable {sum(b.result().unstable())}", flush=True)
    gen = torch.Generator().manual_seed(0)
    for s in range(len(b.sites)):
        l, u = b.pre[s]
        cand = torch.nonzero((l < 0) & (u > 0)).flatten()
        if cand.numel() < UNITS:
            print(f"site {s:2d}: {cand.numel()} units crossing 0", flush=True)
            continue
        units = cand[torch.randperm(cand.numel(), generator=gen)[:UNITS]].repeat(2)
        sign = torch.cat([torch.ones(UNITS), -torch.ones(UNITS)]).double()
        j, rows = b.site_input[s], torch.arange(2 * UNITS)
        x = (lb + (ub - lb) * torch.rand(2 * UNITS, lb.numel(), generator=gen, dtype=torch.float64)).requires_grad_()
        for _ in range(STEPS):
            grad, = torch.autograd.grad((b.net.values(x, upto=j)[j][rows, units] * sign).sum(), x)
            with torch.no_grad():
                x += (ub - lb) * 0.25 * grad.sign()
                x.copy_(torch.maximum(torch.minimum(x, ub), lb))
        with torch.no_grad():
            v = b.net.values(x, upto=j)[j][rows, units]
        hi, lo = v[:UNITS], v[UNITS:]
        crown_w = float((u[units[:UNITS]] - l[units[:UNITS]]).mean())
        pgd_w = float((hi - lo).mean())
        print(f"site {s:2d}: {cand.numel():5d} crossing; CROWN width {crown_w:.4f}, PGD width {pgd_w:.4f} "
              f"(ratio {crown_w / pgd_w:.2f}); truly crossing by PGD {int(((lo < 0) & (hi > 0)).sum())}/{UNITS}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
