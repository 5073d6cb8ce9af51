"""The data types every loader returns and every stage reads (`DataInfo`, `Split`, `Dataset`), the seeded
validation carve and test hold-out, and batching: what a stage needs of a data set once it is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import DataError

SPLIT_SEED = 0  # the validation split is the same for every training seed


@dataclass
class DataInfo:
    name: str
    input_shape: tuple[int, ...]  # per example, e.g. (1, 28, 28) or (108,)
    num_classes: int
    mean: list[float]  # broadcastable to input_shape; used by the model's Normalize layer
    std: list[float]
    input_low: float | list[float]  # valid input range (verification boxes are clipped to it)
    input_high: float | list[float]
    metric: str = "accuracy"  # a key of pipeline.evaluate.METRICS (which says whether higher is better)
    source: str = ""  # where the files were read from
    feature_names: list[str] = field(default_factory=list)


@dataclass
class Split:
    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)


@dataclass
class Dataset:
    info: DataInfo
    train: Split
    val: Split
    test: Split


# ---------------------------------------------------------------------------------------------
# Splits


def split_val(x: torch.Tensor, y: torch.Tensor, frac: float, subset: int) -> tuple[Split, Split]:
    """(train, val): a seeded `frac` of the examples (of the first `subset` of a seeded order, when set) is validation."""
    g = torch.Generator().manual_seed(SPLIT_SEED)
    perm = torch.randperm(len(y), generator=g)
    if subset:
        perm = perm[:subset]
    n_val = max(1, int(round(frac * len(perm))))
    val, train = perm[:n_val], perm[n_val:]
    return Split(x[train], y[train]), Split(x[val], y[val])


def hold_out_test(x: torch.Tensor, y: torch.Tensor) -> tuple[Split, torch.Tensor, torch.Tensor]:
    """A data set without an official test split: a fixed 20% test hold-out (seeded), taken before the validation
    carve; returns (test, the remaining x, the remaining y)."""
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(SPLIT_SEED + 1))
    n_test = len(y) // 5
    return Split(x[perm[:n_test]], y[perm[:n_test]]), x[perm[n_test:]], y[perm[n_test:]]


# ---------------------------------------------------------------------------------------------
# Batches

def on_device(split: Split, device: torch.device) -> Split:
    """The split where training reads it. On a GPU a split that takes at most a quarter of the free memory
    is copied there once (batches are then gathered on the device, in the same seeded order); a larger one
    stays in pinned host memory so that `.to(device, non_blocking=True)` overlaps the copy."""
    if device.type != "cuda" or split.x.device == device:
        return split
    size = split.x.numel() * split.x.element_size() + split.y.numel() * split.y.element_size()
    free, _ = torch.cuda.mem_get_info(device)
    if size <= free // 4:
        return Split(split.x.to(device), split.y.to(device))
    return Split(split.x.pin_memory(), split.y.pin_memory())


def batches(split: Split, batch_size: int, generator: torch.Generator | None = None):
    """Yield (x, y) minibatches; shuffled when a generator is given (deterministic per seed)."""
    n = len(split)
    # The order is drawn on the host (the same for any device) and copied once to where the data lives.
    order = torch.randperm(n, generator=generator).to(split.x.device) if generator is not None else None
    for i in range(0, n, batch_size):
        idx = order[i : i + batch_size] if order is not None else slice(i, i + batch_size)
        yield split.x[idx], split.y[idx]


def augment(x: torch.Tensor, kind: str, generator: torch.Generator) -> torch.Tensor:
    """Training-time augmentation of one batch of [N, C, H, W] images (deterministic per generator).

    flip_crop: zero-pad 4 pixels, take a random crop of the original size, flip half the images
    horizontally (the standard CIFAR recipe).
    """
    if kind == "none":
        return x
    if kind != "flip_crop" or x.dim() != 4:
        raise DataError(f"data.augment={kind} needs image batches [N, C, H, W], got shape {tuple(x.shape)}")
    n, c, h, w = x.shape
    pad = 4
    xp = torch.nn.functional.pad(x, (pad, pad, pad, pad))
    oy = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    ox = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    flip = torch.rand(n, generator=generator) < 0.5
    rows = (oy[:, None] + torch.arange(h))[:, :, None]  # [N, H, 1]
    cols = ox[:, None] + torch.arange(w)  # [N, W]
    cols = torch.where(flip[:, None], cols.flip(1), cols)[:, None, :]  # [N, 1, W]
    out = xp[torch.arange(n)[:, None, None], :, rows, cols]  # [N, H, W, C]
    return out.permute(0, 3, 1, 2).contiguous()


def as_split(data) -> Split:
    """A Split from what a user has: a Split; an (x, y) pair of tensors or arrays; a torch DataLoader, a map-style
    torch Dataset, or any iterable of (x, y) batches (concatenated in memory). y must hold integer class labels
    (or [N, T] token ids); floating x becomes float32. What the library entry points (swap_report, analysis.api)
    take as `data`."""
    from torch.utils.data import DataLoader
    from torch.utils.data import Dataset as TorchDataset

    if isinstance(data, Split):
        return data
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(hasattr(d, "shape") for d in data):
        x, y = (torch.as_tensor(d) for d in data)
    else:
        if isinstance(data, TorchDataset) and hasattr(data, "__len__"):
            data = DataLoader(data, batch_size=1024)
        try:
            pairs = list(data)
        except TypeError:
            raise DataError(f"cannot read data from a {type(data).__name__}: give a Split, (x, y) tensors, a DataLoader "
                            "or an iterable of (x, y) batches") from None
        if not pairs or not all(isinstance(p, (tuple, list)) and len(p) == 2 for p in pairs):
            raise DataError(f"a {type(data).__name__} of {type(pairs[0]).__name__ if pairs else 'nothing'}: expected (x, y) batches")
        x, y = (torch.cat([torch.as_tensor(p[k]) for p in pairs]) for k in (0, 1))
    if len(x) != len(y):
        raise DataError(f"x has {len(x)} examples, y {len(y)}")
    if y.is_floating_point() or y.is_complex():
        raise DataError(f"y must hold integer class labels, got {y.dtype}")
    return Split(x.float() if x.is_floating_point() else x, y.long())  # float32 inputs, as every loader here gives
