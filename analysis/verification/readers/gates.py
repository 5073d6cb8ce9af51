"""The smooth gates, read from the ops their module exports to (`pipeline.gates.GateFamily.onnx`): λ-GELU =
GELU(λx)/λ is Mul → Gelu → Div (folded back into one Gate with its λ; Gelu's tanh approximation is read as its
formula, `smooth.tanh_gelu`), x·σ(λx) is Mul → Sigmoid → Mul, SERF's x·erf(softplus(λx)) is Mul → Softplus → Erf →
Mul, Mish Softplus → Tanh → Mul. An op of a chain that no gate takes is the activation it is (`smooth`)."""

from __future__ import annotations

import numpy as np
import torch

from ..ops.affine import Scale
from ..ops.base import as_tensor, numel
from ..ops.gates import Gate
from .reader import OnnxReader, gate_patterns
from .smooth import STANDALONE, tanh_gelu
from .values import Pending, Value


def gate_op(r: OnnxReader) -> None:
    """One op of a gate's chain: a whole chain of a `whole` pattern (Gelu) is the gate at λ = 1, which `fold_gate`
    turns into x·g(λx) when it sits between Mul(λ) and Div(λ); any other part is Pending until its Mul by x."""
    op, src = r.node.op_type, r.vals.get(r.node.input[0])
    ops, arg = ((*src.ops, op), src.arg) if isinstance(src, Pending) else ((op,), r.var(r.node.input[0]))
    patterns = gate_patterns()
    if not any(p[:len(ops)] == ops for p in patterns) and op in STANDALONE:
        return r.set(STANDALONE[op](r, r.var(r.node.input[0]), r.node))
    if not any(p[:len(ops)] == ops for p in patterns):
        known = "; ".join(" → ".join(p) for p in patterns)
        raise r.unsupported(f"{op} is read only as a part of a gate x·g(λx) ({known})",
                            what=f"a {op} outside a gate x·g(λx)")
    fam = patterns.get(ops)
    if fam is not None and fam.onnx.whole:
        approximate = r.attr("approximate", "none")
        form = approximate.decode() if isinstance(approximate, bytes) else approximate
        if form == "tanh" and op == "Gelu":
            return r.set(tanh_gelu(r, arg))
        if form != "none":
            raise r.unsupported(f"the {form} approximation of {op.upper()}", what=f"{op} with approximate='{form}'",
                                fix="use the exact form (approximate='none') or 'tanh'")
        return r.set(r.add(Gate(fam.name, np.ones(numel(arg.shape)), source=r.node.name), [arg], arg.shape))
    r.set(Pending(ops, arg, r.node))


def lambda_of(r: OnnxReader, arg: Value, x: Value) -> np.ndarray | None:
    """λ (per unit) when `arg` is λ·x: x itself (λ = 1), or a Scale node with no shift and λ > 0 on x."""
    if arg.node == x.node and numel(arg.shape) == numel(x.shape):
        return np.ones(numel(x.shape))
    node = r.nodes[arg.node]
    if (isinstance(node.op, Scale) and node.inputs == (x.node,) and bool(torch.all(node.op.shift == 0))
            and bool(torch.all(node.op.scale > 0))):
        return node.op.scale.numpy()
    return None


def fold_gate(r: OnnxReader, x: Value, scale: np.ndarray) -> Value | None:
    """GELU(λx)·(1/λ) (Mul → Gelu → Div as λ-GELU exports) read back as one Gate x·Φ(λx) with its λ."""
    node = r.nodes[x.node]
    if not (isinstance(node.op, Gate) and bool(torch.all(node.op.lam == 1))):
        return None
    inner = r.nodes[node.inputs[0]]
    if not (isinstance(inner.op, Scale) and bool(torch.all(inner.op.shift == 0)) and bool(torch.all(inner.op.scale > 0))):
        return None
    lam = inner.op.scale
    if not bool(torch.all((as_tensor(scale) * lam - 1).abs() <= 1e-12)):
        return None
    src = Value(inner.inputs[0], x.shape)
    return r.add(Gate(node.op.kind, lam, source=r.node.name), [src], x.shape)
