"""The rules for torch functions, one family per file (as auto_LiRPA's operators/): `RULES` maps a torch function's
name to the rule that bounds its output box. A function with no rule is a refusal once its input differs between
the networks (`interpreter._Walk.apply`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core import CASTS, _Call
from .affine import _addmm, _conv, _linear
from .arithmetic import _add, _div, _mul
from .attention import _mha, _sdpa
from .compare import COMPARISONS, _compare
from .elementwise import POWERS, ROOTS, _pow, _root
from .embedding import _embedding
from .normalization import _batch_norm, _layer_norm
from .pooling import _avg_pool, _pool_same
from .reduction import REDUCTIONS, _reduce
from .shape import _STRUCTURAL, _pad, _same, _structural, _to
from .stochastic import _dropout

RULES: dict[str, Callable[[_Call], Any]] = {
    **{n: _structural for n in _STRUCTURAL},
    **{n: _same for n in ("neg", "negative", "__neg__", "positive", "__pos__")},
    **{n: _add for n in ("add", "__add__", "__radd__", "sub", "__sub__", "__rsub__", "rsub", "subtract")},
    **{n: _mul for n in ("mul", "__mul__", "__rmul__", "multiply")},
    **{n: _div for n in ("div", "__truediv__", "true_divide", "divide", "__rtruediv__", "__rdiv__")},
    "linear": _linear,
    "addmm": _addmm,
    **{n: _conv for n in ("conv1d", "conv2d", "conv3d")},
    "pad": _pad,
    **{n: _to for n in CASTS},
    **{n: _reduce for n in REDUCTIONS},
    **{n: _pow for n in POWERS},
    **{n: _root for n in ROOTS},
    "batch_norm": _batch_norm,
    "layer_norm": _layer_norm,
    **{n: _dropout for n in ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")},
    **{n: _pool_same for n in ("max_pool1d", "max_pool2d", "max_pool3d", "adaptive_max_pool1d", "adaptive_max_pool2d",
                               "adaptive_max_pool3d")},
    **{n: _avg_pool for n in ("avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
                              "adaptive_avg_pool3d")},
    "embedding": _embedding,
    "scaled_dot_product_attention": _sdpa,
    **{n: _compare for n in COMPARISONS},
}

# Functions read as the ops they run, each through its own rule (the walk calls these with the boxed arguments):
# DECOMPOSED[name](walk, func, args, kwargs, out) -> the output with its boxes
DECOMPOSED: dict[str, Callable[..., Any]] = {"multi_head_attention_forward": _mha}
