"""Pooling: AveragePool and ReduceMean/ReduceSum as a `Pool`; MaxPool (and GlobalMaxPool) as each window's max in a
balanced tree of max(a, b) = a + ReLU(b − a) (`max_tree`): exact, and ReLUs, which CROWN relaxes, branch and bound
splits and the MILP encodes."""

from __future__ import annotations

import numpy as np

from ..floats import Float
from ..ops.base import as_tensor, numel
from ..ops.pooling import PairMax, Pool, average_pool
from ..ops.relu import ReLU
from ..ops.shape import Concat, Select
from .constants import axes_of
from .reader import OnnxReader
from .values import Grid, Value


def image(r: OnnxReader, x: Value, what: str) -> tuple[int, int, int]:
    if len(x.shape) != 4 or x.shape[0] != 1:
        raise r.unsupported(f"a 2-d {what} on a tensor of shape {x.shape}", what=f"a {what} on shape {x.shape}")
    return x.shape[1:]


def avgpool(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    in_shape = image(r, x, "pooling")
    if r.node.op_type == "GlobalAveragePool":
        op = average_pool(in_shape, in_shape[1:], (1, 1))
    else:
        pads = list(r.attr("pads", [0, 0, 0, 0]))
        if pads[0] != pads[2] or pads[1] != pads[3] or (any(pads) and not r.attr("count_include_pad", 0)) or r.attr("ceil_mode", 0):
            raise r.unsupported("padding not counted in the average, asymmetric padding or ceil_mode",
                                what="an AveragePool with padding outside the average, asymmetric padding or ceil_mode",
                                fix="use count_include_pad=True and symmetric padding")
        kernel = tuple(r.attr("kernel_shape"))
        op = average_pool(in_shape, kernel, tuple(r.attr("strides", kernel)), (pads[0], pads[1]))
    r.set(r.add(op, [x], (1,) + op.out_shape))


def maxpool(r: OnnxReader) -> None:
    """The max of each window (padded positions, −inf in ONNX, left out) as a tree of ReLUs (`max_tree`)."""
    x = r.var(r.node.input[0])
    c, h, w = image(r, x, "MaxPool")
    if len(r.node.output) > 1 and r.node.output[1]:
        raise r.unsupported("its Indices output is read", what="a MaxPool whose Indices output is used",
                            fix="use the pooled values only (return_indices=False)")
    if r.node.op_type == "GlobalMaxPool":
        kernel, strides, pads, dil = (h, w), (1, 1), (0, 0, 0, 0), (1, 1)
    else:
        kernel = tuple(int(k) for k in r.attr("kernel_shape"))
        strides = tuple(int(v) for v in r.attr("strides", [1, 1]))
        pads = tuple(int(v) for v in r.attr("pads", [0, 0, 0, 0]))
        dil = tuple(int(v) for v in r.attr("dilations", [1, 1]))
        auto_pad = r.attr("auto_pad", b"NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
        if r.attr("ceil_mode", 0) or auto_pad not in ("NOTSET", "VALID"):
            form = "ceil_mode=1" if r.attr("ceil_mode", 0) else f"auto_pad={auto_pad}"
            raise r.unsupported(f"{form}", what=f"a MaxPool with {form}",
                                fix="use explicit pads and ceil_mode=False (nn.MaxPool2d(k, s, padding=p))")
    windows = pool_windows((c, h, w), kernel, strides, pads, dil)
    if windows is None:
        raise r.unsupported(f"a window with no element of the input (kernel {kernel}, pads {pads})",
                            what="a MaxPool window wholly in the padding")
    out_shape = (1, c, *windows.shape[1:3])
    out = max_tree(r, x, windows.reshape(-1, windows.shape[-1]), out_shape)
    if r.int8 and x.fl is not None:
        # float32 max is exact: the window's largest error and the range of its max
        out.fl = Float(*(_window_max(v, windows) for v in (x.fl.err, x.fl.lo, x.fl.hi)))
    grid, flat = r.grids.get(x.node), windows.reshape(-1, windows.shape[-1])
    first = flat.max(1)  # an element of each window
    same = lambda v: bool(np.all((flat < 0) | (v[np.maximum(flat, 0)] == v[first, None])))  # noqa: E731
    if grid is not None and same(grid.scale) and same(grid.zero):
        # maxima of a grid's points are points of it: a requantization on the same grid is exact
        lo, hi = (as_tensor(_window_max(t.numpy(), windows)) for t in (grid.lo, grid.hi))
        r.grids[out.node] = Grid(grid.scale[first], grid.zero[first], grid.qmin, grid.qmax, lo, hi)
    r.set(out)


def pool_windows(in_shape: tuple[int, int, int], kernel: tuple[int, int], stride: tuple[int, int],
                 pads: tuple[int, int, int, int], dilation: tuple[int, int]) -> np.ndarray | None:
    """[C, Ho, Wo, kh·kw] flat input positions of each pooling window (pads: top, left, bottom, right); −1 where the
    window lies in the padding. None when some window lies wholly in it."""
    c, h, w = in_shape
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    ho = (h + pads[0] + pads[2] - dh * (kh - 1) - 1) // sh + 1
    wo = (w + pads[1] + pads[3] - dw * (kw - 1) - 1) // sw + 1
    if ho < 1 or wo < 1:
        return None
    rows = np.arange(ho)[:, None] * sh - pads[0] + np.arange(kh)[None, :] * dh  # [Ho, kh]
    cols = np.arange(wo)[:, None] * sw - pads[1] + np.arange(kw)[None, :] * dw  # [Wo, kw]
    R, C = rows[:, None, :, None], cols[None, :, None, :]  # [Ho, 1, kh, 1], [1, Wo, 1, kw]
    ok = (R >= 0) & (R < h) & (C >= 0) & (C < w)
    pos = np.where(ok, R * w + C, -1).reshape(ho, wo, kh * kw)
    if not np.all((pos >= 0).any(-1)):
        return None
    chan = np.arange(c)[:, None, None, None] * (h * w)
    return np.where(pos[None] >= 0, pos[None] + chan, -1)


def _window_max(v: np.ndarray, windows: np.ndarray) -> np.ndarray:
    """Per window (rows of `windows`, −1 left out), the max of v over it."""
    flat = windows.reshape(-1, windows.shape[-1])
    return np.where(flat >= 0, np.asarray(v)[np.maximum(flat, 0)], -np.inf).max(1)


def max_tree(r: OnnxReader, x: Value, windows: np.ndarray, shape: tuple[int, ...]) -> Value:
    """max over each row of `windows` (flat positions of x; −1: none) as a balanced tree of max(a, b) = a + ReLU(b − a),
    ⌈log2 n⌉ levels for n elements: per level a `Pool` of the pairs' differences b − a, their ReLUs, and a `PairMax`
    a + ReLU(b − a) per pair (an odd element carried). Exact, and made of ReLUs: CROWN relaxes each pairwise max by the
    ReLU's triangle (α-CROWN's lower slope picks any mix of a and b), branch and bound splits them, the MILP encodes
    them exactly; `PairMax` keeps interval arithmetic and the swap gap at the max's own [max l, max u] and max δ."""
    slots = [[int(p) for p in row if p >= 0] for row in windows]  # per output, its elements' positions in `cur`
    cur, n = x, numel(x.shape)
    while any(len(s) > 1 for s in slots):
        first, other, nxt = [], [], []  # per output of the level, in window order: a and b (−1: a carried)
        for s in slots:
            nxt.append(list(range(len(first), len(first) + (len(s) + 1) // 2)))
            first += s[0::2]
            other += s[1::2] + ([-1] if len(s) % 2 else [])
        a, b = np.array(first), np.array(other)
        pa, pb = a[b >= 0], b[b >= 0]
        p = pa.size
        diff = r.add(Pool(np.repeat(np.arange(p), 2), np.tile([1.0, -1.0], p), p, np.stack([pb, pa], 1).reshape(-1), n), [cur], (p,))
        both = r.add(Concat(((n,), (p,)), 0), [cur, r.add(ReLU(p), [diff], (p,))], (n + p,))
        cur = r.add(PairMax.of(a, b, n), [both], (a.size,))
        n, slots = a.size, nxt
    last = np.array([s[0] for s in slots], dtype=np.int64)
    if np.array_equal(last, np.arange(n)):
        return Value(cur.node, tuple(shape), cur.fl)
    return r.add(Select(last, n), [cur], shape)  # a 1×1 window: the elements themselves


def reduce(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    rank = len(x.shape)
    axes = axes_of(r, [None] + [r.consts.get(i) if i else None for i in r.node.input[1:]], rank)
    if axes is None:
        if r.attr("noop_with_empty_axes", 0):
            return r.set(x)
        axes = tuple(range(rank))
    keep = bool(r.attr("keepdims", 1))
    out_full = tuple(1 if a in axes else d for a, d in enumerate(x.shape))
    group = np.broadcast_to(np.arange(numel(out_full)).reshape(out_full), x.shape)
    # each input unit's output: its index with the reduced axes set to 0, in the reduced shape
    idx = np.indices(x.shape)
    for a in axes:
        idx[a] = 0
    group = np.ravel_multi_index(tuple(idx), out_full).reshape(-1)
    count = numel(x.shape) // numel(out_full)
    w = 1.0 / count if r.node.op_type == "ReduceMean" else 1.0
    shape = out_full if keep else tuple(d for a, d in enumerate(x.shape) if a not in axes)
    r.set(r.add(Pool(group, np.full(numel(x.shape), w), numel(out_full)), [x], shape, flops=count))
