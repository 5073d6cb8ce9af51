"""Dataset registry. Each loader reads the standard files from the user's data directory,
downloads them only when `data.download=true`, and returns tensors in the data's natural units
(pixels in [0, 1], raw tabular features): normalization lives inside the model, so exported
graphs are self-contained for users and verifiers.
"""

from __future__ import annotations

import gzip
import os
import struct
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .config import DataConfig
from .errors import DataError

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
    metric: str = "accuracy"
    higher_is_better: bool = True
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
# Helpers


def _search_dirs(root: str, name: str, extra: tuple[str, ...] = ()) -> list[Path]:
    base = Path(root).expanduser()
    dirs = [base, base / name, base / name.replace("_", "-")]
    return dirs + [Path(e) for e in extra]


def _find(files: list[str], dirs: list[Path]) -> Path | None:
    for d in dirs:
        if all((d / f).is_file() for f in files):
            return d
    return None


def _download(urls: dict[str, str], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for fname, url in urls.items():
        target = dest / fname
        if target.is_file():
            continue
        tmp = target.with_suffix(target.suffix + ".part")
        try:
            with urllib.request.urlopen(url, timeout=60) as r, open(tmp, "wb") as f:
                f.write(r.read())
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise DataError(f"download of {url} failed ({exc}); copy {fname} into {dest} by hand") from None
        os.replace(tmp, target)


def _locate(cfg: DataConfig, name: str, files: list[str], urls: dict[str, str], hint: str,
            extra_dirs: tuple[str, ...] = ()) -> Path:
    dirs = _search_dirs(cfg.root, name, extra_dirs)
    found = _find(files, dirs)
    if found is not None:
        return found
    if cfg.download:
        dest = Path(cfg.root).expanduser() / name
        _download(urls, dest)
        return dest
    looked = ", ".join(str(d) for d in dirs)
    raise DataError(f"{name}: {', '.join(files)} not found (looked in {looked}); {hint}, or rerun with data.download=true")


def _split_val(x: torch.Tensor, y: torch.Tensor, frac: float, subset: int) -> tuple[Split, Split]:
    g = torch.Generator().manual_seed(SPLIT_SEED)
    perm = torch.randperm(len(y), generator=g)
    if subset:
        perm = perm[:subset]
    n_val = max(1, int(round(frac * len(perm))))
    val, train = perm[:n_val], perm[n_val:]
    return Split(x[train], y[train]), Split(x[val], y[val])


# ---------------------------------------------------------------------------------------------
# Fashion-MNIST (IDX files)

FMNIST_FILES = {
    "train_x": "train-images-idx3-ubyte.gz",
    "train_y": "train-labels-idx1-ubyte.gz",
    "test_x": "t10k-images-idx3-ubyte.gz",
    "test_y": "t10k-labels-idx1-ubyte.gz",
}
FMNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"


def read_idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
        zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
        if zero != 0 or dtype_code != 0x08:
            raise ValueError("not an unsigned-byte IDX file")
        shape = struct.unpack(">" + "I" * ndim, data[4 : 4 + 4 * ndim])
        arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
        return arr.reshape(shape)
    except (OSError, ValueError, EOFError, struct.error) as exc:
        raise DataError(f"{path} is not a readable IDX file ({exc}); delete it and fetch it again") from None


def load_fashion_mnist(cfg: DataConfig) -> Dataset:
    d = _locate(
        cfg, "fashion_mnist", list(FMNIST_FILES.values()),
        {f: FMNIST_URL + f for f in FMNIST_FILES.values()},
        hint="install them with `apt-get install -y dataset-fashion-mnist` (Debian)",
        extra_dirs=("/usr/share/datasets/fashion-mnist",),
    )
    arr = {k: read_idx(d / f) for k, f in FMNIST_FILES.items()}

    def images(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a.astype(np.float32) / 255.0).unsqueeze(1)  # [N, 1, 28, 28] in [0, 1]

    x, y = images(arr["train_x"]), torch.from_numpy(arr["train_y"].astype(np.int64))
    train, val = _split_val(x, y, cfg.val_fraction, cfg.subset)
    test = Split(images(arr["test_x"]), torch.from_numpy(arr["test_y"].astype(np.int64)))
    mean, std = float(train.x.mean()), float(train.x.std())
    info = DataInfo("fashion_mnist", (1, 28, 28), 10, [mean], [std], 0.0, 1.0, source=str(d))
    return Dataset(info, train, val, test)


# ---------------------------------------------------------------------------------------------
# UCI Adult (adult.data / adult.test): one-hot categoricals, raw continuous features

ADULT_COLUMNS = [
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
    "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country",
]
ADULT_CONTINUOUS = {"age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"}
ADULT_URL = "https://archive.ics.uci.edu/ml/machine-learning-databases/adult/"


def _read_adult(path: Path) -> tuple[list[list[str]], list[int]]:
    rows, labels = [], []
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 15:  # blank lines and adult.test's "|1x3 Cross validator" header
            continue
        rows.append(parts[:14])
        labels.append(1 if parts[14].rstrip(".") == ">50K" else 0)
    if not rows:
        raise DataError(f"{path} holds no Adult records; replace it with the UCI original")
    return rows, labels


def load_adult(cfg: DataConfig) -> Dataset:
    d = _locate(cfg, "adult", ["adult.data", "adult.test"],
                {f: ADULT_URL + f for f in ("adult.data", "adult.test")},
                hint="copy the UCI files adult.data and adult.test there")
    train_rows, train_y = _read_adult(d / "adult.data")
    test_rows, test_y = _read_adult(d / "adult.test")
    # Category vocabularies from the training file; "?" (missing) is a category of its own.
    names: list[str] = []
    encoders: list[Callable[[list[str]], list[float]]] = []
    for j, col in enumerate(ADULT_COLUMNS):
        if col in ADULT_CONTINUOUS:
            names.append(col)
            encoders.append(lambda r, j=j: [float(r[j])])
        else:
            vocab = sorted({r[j] for r in train_rows})
            names += [f"{col}={v}" for v in vocab]
            index = {v: i for i, v in enumerate(vocab)}
            encoders.append(lambda r, j=j, index=index, n=len(vocab): [1.0 if index.get(r[j]) == i else 0.0 for i in range(n)])

    def encode(rows: list[list[str]]) -> torch.Tensor:
        return torch.tensor([[v for enc in encoders for v in enc(r)] for r in rows], dtype=torch.float32)

    x, y = encode(train_rows), torch.tensor(train_y)
    train, val = _split_val(x, y, cfg.val_fraction, cfg.subset)
    test = Split(encode(test_rows), torch.tensor(test_y))
    mean = train.x.mean(0)
    std = train.x.std(0).clamp_min(1e-6)  # a constant column stays finite
    lo, hi = x.min(0).values, x.max(0).values
    info = DataInfo("adult", (x.shape[1],), 2, mean.tolist(), std.tolist(), lo.tolist(), hi.tolist(),
                    source=str(d), feature_names=names)
    return Dataset(info, train, val, test)


# ---------------------------------------------------------------------------------------------
# sklearn digits (bundled with scikit-learn; 8x8 images, fast tests)


def load_digits(cfg: DataConfig) -> Dataset:
    from sklearn.datasets import load_digits as sk_digits

    bunch = sk_digits()
    x = torch.tensor(bunch.images / 16.0, dtype=torch.float32).unsqueeze(1)  # [N, 1, 8, 8] in [0, 1]
    y = torch.tensor(bunch.target, dtype=torch.int64)
    # No official test split: hold out a fixed 20% before the validation carve.
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(SPLIT_SEED + 1))
    n_test = len(y) // 5
    test = Split(x[perm[:n_test]], y[perm[:n_test]])
    train, val = _split_val(x[perm[n_test:]], y[perm[n_test:]], cfg.val_fraction, cfg.subset)
    info = DataInfo("digits", (1, 8, 8), 10, [float(train.x.mean())], [float(train.x.std())], 0.0, 1.0,
                    source="sklearn.datasets.load_digits")
    return Dataset(info, train, val, test)


DATASETS: dict[str, Callable[[DataConfig], Dataset]] = {
    "fashion_mnist": load_fashion_mnist,
    "adult": load_adult,
    "digits": load_digits,
}


def load_dataset(cfg: DataConfig) -> Dataset:
    return DATASETS[cfg.name](cfg)


def batches(split: Split, batch_size: int, generator: torch.Generator | None = None):
    """Yield (x, y) minibatches; shuffled when a generator is given (deterministic per seed)."""
    n = len(split)
    order = torch.randperm(n, generator=generator) if generator is not None else None
    for i in range(0, n, batch_size):
        idx = order[i : i + batch_size] if order is not None else slice(i, i + batch_size)
        yield split.x[idx], split.y[idx]
