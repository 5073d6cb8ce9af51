"""A model whose forward returns more than a tensor: a Hugging Face `ModelOutput` (its `logits`), a dict or a tuple.

Every stage function computes on logits. `logits_view(model, example)` runs the model once on `example`, and where the
output is not a tensor gives back a `LogitsView`: the same model with its forward's output reduced to the tensor the
stages use (the `logits` field or key where there is one, else the only tensor, else the first element of a tuple),
and a line saying which it used. The view holds the model's own modules, parameters and buffers under their own
names (the same dicts, not copies), so what a walk over it finds, reports and swaps is the model's, named as the
model names it, and a swap made on the view is made on the model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from .errors import PipelineError


class OutputError(PipelineError):
    """A model output the stages cannot take logits from (one line naming the fix)."""


def pick(out: Any) -> tuple[Any, str] | None:
    """(key, what) of the tensor to use in a forward's output, or None when the output is a tensor itself."""
    if isinstance(out, torch.Tensor):
        return None
    kind = type(out).__name__
    if isinstance(out, Mapping):  # ModelOutput is an OrderedDict of the fields that are set
        if isinstance(out.get("logits"), torch.Tensor):
            return "logits", f"the `logits` of its {kind}"
        tensors = [k for k, v in out.items() if isinstance(v, torch.Tensor)]
        if len(tensors) == 1:
            return tensors[0], f"the `{tensors[0]}` of its {kind}, its only tensor"
        raise OutputError(f"the model returns a {kind} with fields {list(out)} and no `logits`: wrap it in a module whose "
                          "forward returns the logits tensor")
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return 0, f"element 0 of the {kind} it returns ({len(out)} elements)"
    raise OutputError(f"the model returns a {kind}, not a tensor, a dict with `logits` or a tuple starting with one: wrap it "
                      "in a module whose forward returns the logits tensor")


class LogitsView(nn.Module):
    """`model` with its output reduced to `out[key]` (module docstring). Not a copy: the model's own modules."""

    def __init__(self, model: nn.Module, key: Any, what: str):
        super().__init__()
        object.__setattr__(self, "model", model)  # not a submodule: the names stay the model's own
        for d in ("_modules", "_parameters", "_buffers"):
            object.__setattr__(self, d, getattr(model, d))
        self.key, self.what = key, what

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.model(*args, **kwargs)[self.key]

    def train(self, mode: bool = True) -> "LogitsView":
        self.model.train(mode)  # the root's own flag too (HF models read self.training)
        self.training = mode
        return self


def logits_view(model: nn.Module, example: Any) -> tuple[nn.Module, str | None]:
    """(model itself, None) when its forward returns a tensor; else (a `LogitsView` of it, which output it uses).
    One no-grad forward on `example` (a tensor, or a tuple of forward's arguments) in eval mode decides."""
    if isinstance(model, LogitsView):
        return model, model.what
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        with torch.no_grad():
            out = model(*example) if isinstance(example, tuple) else model(example)
    finally:
        for m, training in modes.items():
            m.training = training
    found = pick(out)
    return (model, None) if found is None else (LogitsView(model, *found), found[1])


@contextlib.contextmanager
def traceable(model: nn.Module) -> Iterator[nn.Module]:
    """The model as the TorchScript exporter can trace it. A Hugging Face decoder whose cache is off (the Trainer turns
    it off: `TrainingArguments.use_cache` is False) builds its attention mask through the packed-sequence path
    (`transformers.masking_utils.find_packed_sequence_indices`: torch.diff and a cumsum of booleans, which the exporter
    cannot write); with the cache on, the mask is the plain causal one and the logits are the same. The setting is
    restored afterwards."""
    inner = model.model if isinstance(model, LogitsView) else model
    config = getattr(inner, "config", None)
    off = config is not None and getattr(config, "use_cache", None) is False
    if off:
        config.use_cache = True
    try:
        yield model
    finally:
        if off:
            config.use_cache = False
