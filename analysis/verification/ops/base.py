"""What every op of a verification graph is: `Op` (tensors on one device, casts), `Affine` (a linear map plus a constant)
and `Activation` (one input; its interval, its CROWN lines, its α and how branch and bound treats it), and the
exceptions an op raises when a model or a box is beyond it.

Every tensor is the C-order flattening of one example's tensor (batch axis dropped), which is also how VNN-LIB numbers
the inputs X_i; a value is [B, size]. Everything is float64: a graph read from a float32 model computes with its float32
weights exactly (each converts to float64 without rounding).

Devices: an op's tensors live on one device (`Op.to`; readers build on the CPU, `graph.Graph.to` moves a whole graph),
and every op computes on the device of its tensors. What an op makes itself (`back`'s constant term, masks) is made
with `new_zeros`/`*_like` or `device=` from its inputs, never on a default device; only `sparse` (the MILP's
matrices) reads values on the host, from a graph the MILP has moved to the CPU (`milp.on_cpu`).

The bound engine (`bounds.Bounder`) asks an op only through the attributes and methods below, never by its type.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import numpy as np
import torch

DTYPE = torch.float64


class UnsupportedModel(NotImplementedError):
    """The model holds something no tool here reads; the message is one line that names it and where it is.

    Structured for callers that report it (the verify stage's `not_verified`): `node` (the ONNX node's name, or a module
    path), `op` (its op type), `what` (the form met, in the node's own terms) and `fix` (what would make it readable,
    or None); each may be None where the message is about the model as a whole."""

    def __init__(self, message: str = "", *, node: str | None = None, op: str | None = None, what: str | None = None,
                 fix: str | None = None):
        super().__init__(message)
        self.node, self.op, self.what, self.fix = node, op, what, fix


class OutOfDomain(UnsupportedModel):
    """A nonlinear op's input interval leaves the op's domain on this box: no finite sound relaxation."""


def as_tensor(a: Any, device: torch.device | str | None = None) -> torch.Tensor:
    """A float64 tensor on `device`; None: a tensor's own device, the CPU for anything else (a numpy array is copied:
    broadcast views are read-only)."""
    if isinstance(a, torch.Tensor):
        return a.detach().to(a.device if device is None else device, DTYPE)
    t = torch.from_numpy(np.array(a, dtype=np.float64))
    return t if device is None else t.to(device)


def numel(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64))


class Op:
    arity: ClassVar[int] = 1
    affine: ClassVar[bool] = False  # an `Affine` map: back-substituted by `back`, no relaxation
    # every output unit is a copy of one input unit or an affine function of one (Concat, Select, Scale): CROWN bounds
    # of such a unit are its source's, mapped (`bounds.Bounder._crown_plan`)
    copies: ClassVar[bool] = False
    # attention's ops (a product of two variables, a softmax's sums): the engine bounds copies through their sources
    # and, on a wide graph, stops CROWN's intermediate queries at a cut
    attention: ClassVar[bool] = False

    def cast(self, dtype: torch.dtype) -> "Op":
        """A shallow copy whose floating-point tensors are in `dtype` (branch and bound searches in float32)."""
        return self._mapped(lambda t: t.to(dtype) if t.is_floating_point() else t)

    def to(self, device: torch.device | str) -> "Op":
        """A shallow copy whose tensors live on `device` (itself when they already do)."""
        device = torch.device(device)
        if all(t.device == device for t in self.tensors()):
            return self
        return self._mapped(lambda t: t.to(device))

    def tensors(self) -> list[torch.Tensor]:
        return [v for v in vars(self).values() if isinstance(v, torch.Tensor)]

    def _mapped(self, fn) -> "Op":
        new = copy.copy(self)
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor):
                setattr(new, name, fn(value))
        return new

    def in_sizes(self) -> tuple[int, ...]:
        raise NotImplementedError

    @property
    def out_size(self) -> int:
        raise NotImplementedError


class Affine(Op):
    """y = Σ_i M_i x_i + c."""

    affine: ClassVar[bool] = True
    # products each coefficient of `back` sums at most; a Conv's decides whether its back-substitution runs in float32
    # (`float32.Float32Back`), 0 elsewhere (float64 always)
    back_terms: ClassVar[int] = 0
    grouped: ClassVar[bool] = False  # a Conv of several groups: float32 whatever its terms (`float32.FLOAT32_MIN_TERMS`)
    has_back_units: ClassVar[bool] = False  # `back_units` answers (a Scale): CROWN's query rows cross it on their units

    def forward(self, *h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def back(self, A: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        raise NotImplementedError

    def ibp(self, *bounds: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def unit_sources(self) -> torch.Tensor | None:
        """For a one-input op whose every output unit is an affine function of one input unit (`copies`): that input
        unit per output unit; None otherwise."""
        return None

    def unit_rows(self, units: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the rows of a one-input op as a matrix for its output units `units`, their constants): `back` of those
        units' one-hot rows (`crown.CrownPass._local_back`: CROWN's query rows)."""
        E = torch.zeros(units.numel(), self.out_size, dtype=DTYPE, device=units.device)
        E[torch.arange(units.numel(), device=units.device), units] = 1.0
        (rows,), c = self.back(E)
        return rows, c

    def back_units(self, A: torch.Tensor, units: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`back` of a one-input op whose output unit i is an affine function of input unit i, for rows A given on the
        units `units` alone (the rest 0): (the rows on the same input units, their constant), where `has_back_units`
        (`crown.CrownPass._local_back`)."""
        raise NotImplementedError

    def abs_forward(self, *d: torch.Tensor) -> torch.Tensor:
        """Σ_i |M_i| d_i: how far the output can move when each input moves by at most d_i (elementwise)."""
        raise NotImplementedError

    def sparse(self) -> tuple[list[Any], np.ndarray]:
        """([scipy CSR M_i per input], c): the same map as matrices, for the MILP."""
        raise NotImplementedError


class Activation(Op):
    """One input. Elementwise ones give a sound relaxation on an input interval [l, u]: `interval` (its range) and
    `lines` (al·x + bl ≤ op(x) ≤ au·x + bu); ops that are not elementwise (`elementwise = False`: a product of two
    variables, a LayerNorm's variance) give `relax(l, u)` and back-substitute themselves, `back(A, relax, unknown)`.

    What the engine asks of every activation site (each has a default here):
    - `crown_lines(l, u, slopes, exact)`: the relaxation CROWN and α-CROWN use, with α-CROWN's slopes when given;
    - `optimizable()`, `initial_slopes(lines, rows)`, `project(slopes, l, u)`, `alpha_lr`: the α it optimizes, if any,
      and its learning rate's factor;
    - `query(l, u)`: the units whose interval is worth tightening by CROWN; `unstable(l, u)`: the units a split would
      help (counted in reports); `constant(l, u)`: the units whose lines are 0 there (no query reads through them);
    - `branchable`: branch and bound splits its units at 0 with ReLU's rules (`relu.ReluLines`);
    - `alpha_bounds`: α-CROWN optimizes its input's interval too (`alpha.AlphaCrown.alpha_intermediate`);
    - `float32_rows`: how CROWN's queries of its input may use float32 convolutions (`bounds.Bounder._crown`);
    - `refine_rows`, `unbounded_note`: a site's own last word on its CROWN rows and on why a bound is missing;
    - `gap(l, u, d)`: the swap gap's rule (how far its output moves when its input moves by d)."""

    size: int
    # False: `lines` does not depend on the input interval, so tightening it by CROWN buys nothing (`Rounding` off a grid)
    needs_bounds: ClassVar[bool] = True
    # False: not elementwise (a product of two variables): `relax(l, u)` and `back(A, relax)` instead of lines
    elementwise: ClassVar[bool] = True
    branchable: ClassVar[bool] = False
    # True: the interval of its `query` units is worth α-CROWN's optimization before a search (its lines tighten with
    # it, and a search splits it); its units are done once none is `unstable`
    alpha_bounds: ClassVar[bool] = False
    # α-CROWN's learning rate for its slopes, as a factor of the one asked for (set for slopes in [0, 1], ReLU's range)
    alpha_lr: ClassVar[float] = 1.0
    # True: `interval(l, u)` is the op's exact range over [l, u], so a per-unit copy of a unit whose interval CROWN
    # bounded needs no CROWN query of its own (`crown.CrownPass._copied`)
    exact_interval: ClassVar[bool] = False
    # True: its lines have slope 0 on every interval (the graph input's first quantization, `QuantizedInput`), so CROWN's
    # bound of one affine map of its output is interval arithmetic's (`crown.CrownPass._exact_by_ibp`)
    flat_lines: ClassVar[bool] = False
    # "sign": CROWN screens the site's input with float32 convolutions and redoes in float64 the units still crossing 0
    # (a ReLU's relaxation of a stable unit is exact whatever its interval); "gate": float32 throughout when
    # `float32.FLOAT32_GATES`; None: float64 (the relaxation depends on every unit's interval)
    float32_rows: ClassVar[str | None] = None
    # True: CROWN may leave a unit unqueried when its lines on its interval arithmetic interval are already nearly
    # exact (`line_gap` a small part of how far the unit moves: `crown.CrownPass._near_exact`); a smooth curve's
    # relaxation gap shrinks with its interval's square, a ReLU's kink does not
    skip_near_exact: ClassVar[bool] = False

    def in_sizes(self) -> tuple[int, ...]:
        return (self.size,)

    @property
    def out_size(self) -> int:
        return self.size

    def interval(self, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError(f"{type(self).__name__} has no interval relaxation")

    def lines(self, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        raise NotImplementedError(f"{type(self).__name__} has no linear relaxation")

    def check_bounded(self) -> None:
        """Raise `UnsupportedModel` if the bound engine has no relaxation for this op as configured."""

    def crown_lines(self, l: torch.Tensor, u: torch.Tensor, slopes: Any = None, exact: bool = True):
        """(al, bl, au, bu) with al·x + bl ≤ op(x) ≤ au·x + bu on [l, u] (bl None: 0), shapes [n] or [rows, n] when
        `slopes` is per row; a non-elementwise op's `relax` tuple. `exact` False: a cheaper, still sound, evaluation
        during α's gradient steps."""
        return self.lines(l, u) if self.elementwise else self.relax(l, u)

    def optimizable(self) -> bool:
        return False

    def line_gap(self, l: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """The largest distance between the upper and the lower line of `crown_lines` on [l, u], per unit (at an end:
        both are lines)."""
        al, bl, au, bu = self.crown_lines(l, u)
        d, b = au - al, bu - (0 if bl is None else bl)
        return torch.maximum(d * l, d * u) + b

    def initial_slopes(self, lines: tuple, rows: int):
        """α-CROWN's start for `rows` query rows: CROWN's own lines' slopes (lower, upper), one copy per row."""
        al, _, au, _ = lines
        return al.expand(rows, -1).clone(), au.expand(rows, -1).clone()

    def project(self, slopes, l: torch.Tensor, u: torch.Tensor) -> None:
        """Move α-CROWN's slopes (in place) back into the range where the lines stay sound on [l, u]."""

    def query(self, l: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """The units whose bounds CROWN should tighten (every unit, none where the lines ignore the interval)."""
        return torch.arange(l.numel() if self.needs_bounds else 0, device=l.device)

    def constant(self, l: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Mask of the units whose lines on [l, u] and on every interval inside it are 0·x + 0 (a dead ReLU): a unit
        read only by such units gets coefficient 0 in every back-substitution (`crown.CrownPass._not_worth_querying`)."""
        return torch.zeros_like(l, dtype=torch.bool)

    def fixed(self, l: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Mask of the units whose lines are the same on every interval inside [l, u] (a stable ReLU's: x or 0), so a
        tighter interval of them changes nothing of this site's relaxation (`crown.CrownPass._not_worth_querying`)."""
        return self.constant(l, u)

    def loose(self, l: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Mask of the units whose lines CROWN's tighter interval would almost surely leave as they are (a grid rounding
        over many steps: x ± E on any interval wider than two steps); none by default."""
        return torch.zeros_like(l, dtype=torch.bool)

    def unstable(self, l: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Mask of the units whose interval holds a kink a split would remove (none for ops that are not split)."""
        return torch.zeros_like(l, dtype=torch.bool)

    def refine_rows(self, bounder: Any, s: int, idx: torch.Tensor, n: int, lo: torch.Tensor, up: torch.Tensor,
                    float32: bool, cuts: dict | None) -> torch.Tensor:
        """CROWN's lower bounds `lo` of this site's input units `idx`, raised where the op knows better ones."""
        return lo

    def unbounded_note(self, l: torch.Tensor, u: torch.Tensor, needed: torch.Tensor) -> str:
        """Why this site leaves a bound infinite on this interval, as one clause ("" if it does not)."""
        return ""

    def gap(self, l: torch.Tensor, u: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """The swap gap's rule: a bound on |op(z') − op(z)| for z in [l, u] and |z' − z| ≤ d."""
        raise UnsupportedModel(f"the swap gap has no rule for {type(self).__name__}")
