"""Certified L∞ radius per sample, by bisection over the verifier's answers, and certified accuracy as a curve of ε.

A sample's radius is bracketed ``[proved, open]``: ``proved`` the largest ε answered unsat (sound: a proof at ε holds at
every smaller ε, its box lies inside), ``open`` the smallest ε tried and not proved. ``falsified`` is the smallest ε
answered sat, whose witness (float32, strictly violating on the model itself: `problem.Problem.confirm`) is kept; it is
an upper bound of the true radius, while an ``open`` that is only unknown or timeout bounds what this verifier proves,
not the network. The true radius r* therefore lies in [proved, falsified] and a sound, complete-enough verifier ends
with proved ≤ r* ≤ open. As VERONA's binary search over ε (ada-verona), the answers come from the one property loop
(`analysis.verification.harness`): each round poses one property per sample still open, at the midpoint of its bracket,
all rounds under the same per-property limit.

Certified accuracy at ε (`certified_curve`): the share of samples whose ``proved`` ≥ ε (a misclassified sample has
radius 0 and is never certified), and beside it the share falsified at or below ε.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analysis.verification import harness
from analysis.verification.graph import Graph
from analysis.verification.vnnlib import robustness_spec

TOLERANCE = 1e-3  # default width of the final bracket, relative to eps_max (as ε the input's own units)


@dataclass
class Radius:
    """One sample's bracket; ε = 0 is 'proved' only for a correctly classified sample (`clean`)."""

    sample: int
    label: int
    proved: float = 0.0  # the largest ε answered unsat (0.0: none)
    open: float = math.inf  # the smallest ε tried and not proved (inf: every ε tried was proved)
    falsified: float = math.inf  # the smallest ε answered sat (inf: none)
    witness: np.ndarray | None = None  # the counterexample at `falsified` (flat, float32)
    output: np.ndarray | None = None  # the model's outputs at the witness, as re-checked
    clean: bool = True  # False: the sample itself is misclassified (radius 0, its own witness)
    tries: list[tuple[float, str]] = field(default_factory=list)  # (ε, result) in the order posed
    seconds: float = 0.0  # all the verifier spent on this sample

    @property
    def width(self) -> float:
        return self.open - self.proved


def bisect(net: Graph, recheck: Callable[[np.ndarray], np.ndarray], xs: np.ndarray, labels: Sequence[int], eps_max: float,
           *, low: Any = -math.inf, high: Any = math.inf, tol: float | None = None, verifier: str = "auto",
           timeout_s: float = 5.0, jobs: int = 1, clock: str = "wall", device: str = "cpu",
           network: str = "network") -> list[Radius]:
    """The bracket of every sample `xs[k]` (flat rows, labels `labels[k]`) in [0, `eps_max`], narrowed until
    open − proved ≤ `tol` (default `TOLERANCE` × eps_max) or a sample is falsified at the bracket's top. A misclassified
    sample (by `recheck` on the clean input) is not posed: its radius is 0 and the clean input its witness. Each property
    gets `timeout_s` (`harness.PerTask`). The first round poses `eps_max` itself, so a sample proved there ends with
    proved = eps_max, open = inf (its radius is at least eps_max: censored)."""
    if not eps_max > 0:
        raise ValueError(f"eps_max must be > 0, got {eps_max}")
    tol = TOLERANCE * eps_max if tol is None else float(tol)
    if not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol}")
    xs = np.asarray(xs, dtype=np.float64).reshape(len(labels), -1)
    outs = np.asarray(recheck.many(xs) if hasattr(recheck, "many") else np.stack([recheck(x) for x in xs]))
    radii = []
    for k, y in enumerate(labels):
        r = Radius(sample=k, label=int(y))
        others = np.delete(outs[k], int(y))
        if others.max() >= outs[k][int(y)]:  # the property is violated at ε = 0 already: the clean input is a witness
            r.clean, r.open, r.falsified = False, 0.0, 0.0
            r.witness, r.output = xs[k].astype(np.float32), np.asarray(outs[k], dtype=np.float32)
        radii.append(r)
    todo = {r.sample: eps_max for r in radii if r.clean}
    while todo:
        tasks = [harness.SpecTask(key=(k, eps), verifier=verifier, net=net, recheck=recheck, network=network,
                                  specs=[robustness_spec(xs[k], eps, low, high, radii[k].label, net.num_outputs)])
                 for k, eps in todo.items()]
        todo = {}
        for o in harness.run(tasks, harness.PerTask(timeout_s), jobs=jobs, clock=clock, device=device):
            k, eps = o.key
            r, res = radii[k], o.result
            r.tries.append((eps, res.status))
            r.seconds += res.seconds
            if res.status == "unsat":
                r.proved = max(r.proved, eps)
            else:
                r.open = min(r.open, eps)
                if res.status == "sat" and eps < r.falsified and res.counterexample is not None:
                    r.falsified, r.witness = eps, np.asarray(res.counterexample, dtype=np.float32).reshape(-1)
                    r.output = None if res.output is None else np.asarray(res.output, dtype=np.float32).reshape(-1)
            if math.isfinite(r.open) and r.open - r.proved > tol:
                todo[k] = (r.proved + r.open) / 2
    return radii


def certified_curve(radii: Sequence[Radius], epsilons: Sequence[float]) -> list[dict[str, float]]:
    """Per ε: {"eps", "certified": share with proved ≥ ε (ε > 0) or correctly classified (ε = 0), "falsified": share
    falsified at or below ε, "samples"}."""
    n = max(len(radii), 1)
    return [{"eps": float(e),
             "certified": sum((r.clean and r.proved >= e) if e > 0 else r.clean for r in radii) / n,
             "falsified": sum(r.falsified <= e for r in radii) / n, "samples": len(radii)} for e in epsilons]


def record(r: Radius) -> dict[str, Any]:
    """One sample's bracket as JSON (inf written as None)."""
    fin = lambda v: None if math.isinf(v) else round(float(v), 9)  # noqa: E731
    return {"sample": r.sample, "label": r.label, "clean": r.clean, "proved": fin(r.proved), "open": fin(r.open),
            "falsified": fin(r.falsified), "tries": [[round(e, 9), s] for e, s in r.tries], "seconds": round(r.seconds, 4),
            "witness_output": None if r.output is None else [float(v) for v in r.output]}
