"""A transformer's ops as the `nonlinear` ops: a MatMul of two variables as `BatchMatMul`, Softmax as exp and
reciprocal (softmax_i = 1/Σ_j exp(x_j − x_i)), Sqrt/Exp/Reciprocal/Pow as they are."""

from __future__ import annotations

import numpy as np

from ..floats import Float, matmul_float, softmax_float
from ..ops.affine import Scale, TokenLinear
from ..ops.base import numel
from ..ops.curves import Exp, Reciprocal, Rsqrt, Sqrt, Square
from ..ops.products import BatchMatMul, Product
from ..ops.shape import Concat, Permute
from ..ops.softmax import ExpSums, MaskedRows
from .reader import OnnxReader
from .values import Value


def matmul_variables(r: OnnxReader, x: Value, y: Value) -> None:
    """A @ B of two variables (attention's q·kᵀ and p·v): `BatchMatMul` over their broadcast batch axes."""
    if len(x.shape) < 2 or len(y.shape) < 2 or x.shape[-1] != y.shape[-2]:
        raise r.unsupported(f"a product of variables of shapes {x.shape} and {y.shape}",
                            what=f"a MatMul of variables of shapes {x.shape} and {y.shape}")
    try:
        batch = tuple(np.broadcast_shapes(x.shape[:-2], y.shape[:-2]))
    except ValueError:
        raise r.unsupported(f"batch axes {x.shape[:-2]} and {y.shape[:-2]} do not broadcast",
                            what=f"a MatMul of variables of shapes {x.shape} and {y.shape}") from None
    m, k, n = x.shape[-2], x.shape[-1], y.shape[-1]
    xa, yb = r.expand(x, batch + (m, k)), r.expand(y, batch + (k, n))
    nb = numel(batch)
    cat = r.add(Concat(((numel(xa.shape),), (numel(yb.shape),)), 0), [xa, yb], (numel(xa.shape) + numel(yb.shape),))
    out = r.add(BatchMatMul(nb, m, k, n, source=r.node.name), [cat], batch + (m, n))
    if r.int8:
        out.fl = _follow_matmul(r, xa, yb, nb, m, k, n)
    r.set(out)


def _follow_matmul(r: OnnxReader, a: Value, b: Value, nb: int, m: int, k: int, n: int) -> Float | None:
    if a.fl is None or b.fl is None:
        return None
    return matmul_float(a.fl, b.fl, nb, m, k, n)


def curve(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    cls = {"Sqrt": Sqrt, "Reciprocal": Reciprocal, "Exp": Exp}[r.node.op_type]
    out = r.add(cls(numel(x.shape), source=r.node.name), [x], x.shape)
    if r.int8:
        out.fl = None  # exp/sqrt/1/x in float32 before a QuantizeLinear: not followed
    r.set(out)


def power(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    p = np.asarray(r.const(r.node.input[1]), dtype=np.float64)
    if p.size != 1 or float(p) not in (3.0, 2.0, 0.5, -0.5, -1.0, 1.0):
        raise r.unsupported(f"an exponent {p.reshape(-1)[:3].tolist()}; the exponents read are 3, 2, 0.5, -0.5, -1 and 1",
                            what=f"Pow with exponent {p.reshape(-1)[:3].tolist()}")
    p = float(p)
    if p == 1.0:
        return r.set(x)
    if p == 3.0:  # x³ as the product of x and x², which the products' relaxation bounds
        n = numel(x.shape)
        sq = r.add(Square(n, source=r.node.name), [x], x.shape)
        cat = r.add(Concat(((n,), (n,)), 0), [x, sq], (2 * n,))
        return r.set(r.add(Product(n, source=r.node.name), [cat], x.shape))
    cls = {2.0: Square, 0.5: Sqrt, -0.5: Rsqrt, -1.0: Reciprocal}[p]
    out = r.add(cls(numel(x.shape), source=r.node.name), [x], x.shape)
    if r.int8:
        out.fl = None
    r.set(out)


def _softmax_rows(r: OnnxReader, x: Value, rows: int, T: int) -> Value:
    """softmax over the last axis of rows × T values, as 1/Σ_j exp(x_j − x_i) (module docstring), then a Reciprocal.
    The sums: one `ExpSums` op on the logits where the rows·T² differences would be a wide layer, else the differences
    as a layer of their own, an Exp on each and a sum (tighter: `ExpSums.MIN_DIFFS`)."""
    if rows * T * T >= ExpSums.MIN_DIFFS:
        s = r.add(ExpSums(rows, T, source=r.node.name), [x], (rows, T))
    else:
        eye = np.eye(T)
        diff = (eye[None, :, :] - eye[:, None, :]).reshape(T * T, T)  # row (i, j): e_j − e_i (exactly 0 where j = i)
        d = r.add(TokenLinear(diff, np.zeros(T * T), rows), [x], (rows, T * T))
        e = r.add(Exp(rows * T * T, source=r.node.name), [d], (rows, T * T))
        s = r.add(TokenLinear(np.kron(np.eye(T), np.ones((1, T))), np.zeros(T), rows), [e], (rows, T))
    return r.add(Reciprocal(rows * T, source=r.node.name), [s], (rows, T))


def _to_last(r: OnnxReader, x: Value, axis: int) -> tuple[Value, list[int] | None]:
    """x with `axis` moved last (a Permute), and the permutation that undoes it (None: it was last)."""
    rank = len(x.shape)
    if axis == rank - 1:
        return x, None
    perm = [a for a in range(rank) if a != axis] + [axis]
    index = np.transpose(np.arange(numel(x.shape)).reshape(x.shape), perm)
    moved = r.add(Permute(index.reshape(-1)), [x], index.shape)
    return moved, list(np.argsort(perm))


def _permute_back(r: OnnxReader, v: Value, inverse: list[int] | None) -> Value:
    if inverse is None:
        return v
    index = np.transpose(np.arange(numel(v.shape)).reshape(v.shape), inverse)
    return r.add(Permute(index.reshape(-1)), [v], index.shape)


# An added constant at or below this is a mask (-inf, or torch.finfo(float32).min as Hugging Face writes it)
MASKED = -1e30


def _additive_mask(r: OnnxReader, name: str) -> tuple[str, np.ndarray] | None:
    """(the scores' name, the constant) where `name` is Add(scores, constant) and the constant masks some entries."""
    node = next((n for n in r.graph.node if name in n.output), None)
    if node is None or node.op_type != "Add" or len(node.input) != 2:
        return None
    a, b = node.input
    if r.is_const(a) == r.is_const(b):
        return None
    scores, c = (b, a) if r.is_const(a) else (a, b)
    c = np.asarray(r.const(c), dtype=np.float64)
    return (scores, c) if bool((c <= MASKED).any()) else None


def _masked_softmax(r: OnnxReader, scores: Value, mask: np.ndarray, axis: int, shape: tuple[int, ...]) -> Value:
    """softmax(scores + mask) over `axis` where the mask sets entries to -inf or below `MASKED` (a causal mask): those
    entries are 0 after the softmax and out of every other entry's sum, so each row is the softmax of its unmasked
    entries alone, gathered (rows grouped by how many they keep) and put back in place beside constant zeros.
    exp(-inf) is exactly 0; a finite c ≤ -1e30 gives 0 only while the masked score plus c stays far below the row's
    kept ones, which `MaskedRows` checks on every box (a one-line `OutOfDomain` where the box does not show it)."""
    c = np.broadcast_to(mask, shape)
    scores = r.expand(scores, shape)
    moved, inverse = _to_last(r, scores, axis)
    c = np.moveaxis(c, axis, -1)
    T = moved.shape[-1]
    flat_c = c.reshape(-1, T)
    keep = flat_c > MASKED
    if not keep.any(axis=1).all():
        raise r.unsupported("a softmax row whose every entry is masked", what="a Softmax of a fully masked row")
    place = np.arange(flat_c.size).reshape(flat_c.shape)
    parts, order = [], []
    for k in np.unique(keep.sum(axis=1)):
        rows = np.flatnonzero(keep.sum(axis=1) == k)
        idx = place[rows][keep[rows]]  # row by row, each row's kept entries in order
        dropped = ~keep[rows]
        v = r.add(MaskedRows(idx, flat_c.size, flat_c.reshape(-1)[idx], place[rows][dropped], flat_c[rows][dropped],
                             np.nonzero(dropped)[0], len(rows), source=r.node.name), [moved], (len(rows), int(k)))
        v = r.add(Scale(np.ones(idx.size), flat_c.reshape(-1)[idx]), [v], v.shape, flops=1)
        p = _softmax_rows(r, v, len(rows), int(k))
        parts.append(p)
        order.append(idx)
    masked = place[~keep]
    pieces = [(numel(p.shape),) for p in parts] + ([(masked.size,)] if masked.size else [])
    consts = (None,) * len(parts) + ((np.zeros(masked.size),) if masked.size else ())
    cat = r.add(Concat(tuple(pieces), 0, consts), parts, (flat_c.size,))
    back = np.empty(flat_c.size, dtype=np.int64)
    back[np.concatenate([*order, masked])] = np.arange(flat_c.size)
    out = r.add(Permute(back), [cat], moved.shape)
    return _permute_back(r, out, inverse)


def softmax(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    masked = _additive_mask(r, r.node.input[0]) if r.opset >= 13 else None
    if masked is not None:
        out = _masked_softmax(r, r.var(masked[0]), masked[1], r.axis(r.attr("axis", -1), len(x.shape)), x.shape)
        out = Value(out.node, x.shape)
        if r.int8:
            out.fl = None  # the masked softmax in float32 before a QuantizeLinear: not followed
        return r.set(out)
    if r.opset < 13:  # before opset 13 the axes from `axis` (default 1) on are flattened into one
        axis = r.axis(r.attr("axis", 1), len(x.shape))
        T = numel(x.shape[axis:])
        p = _softmax_rows(r, Value(x.node, (numel(x.shape) // T, T), x.fl), numel(x.shape) // T, T)
        out = Value(p.node, x.shape)
        if r.int8:
            out.fl = softmax_float(x.fl, numel(x.shape) // T, T, True)
        return r.set(out)
    axis = r.axis(r.attr("axis", -1), len(x.shape))
    moved, inverse = _to_last(r, x, axis)
    T = moved.shape[-1]
    p = _softmax_rows(r, moved, numel(moved.shape) // T, T)
    out = _permute_back(r, Value(p.node, moved.shape), inverse)
    out = Value(out.node, x.shape)
    if r.int8:
        out.fl = softmax_float(x.fl, numel(x.shape) // T, T, axis == len(x.shape) - 1)
    r.set(out)
