"""The built-in data sets, each read from its standard files (found by `files.locate`, downloaded only when
`data.download=true`): Fashion-MNIST (IDX), UCI Adult, scikit-learn's bundled digits, breast_cancer and wine,
CIFAR-10/100 (torchvision's python pickles), TinyImageNet (the CS231n folder layout), and character/byte level text
(Shakespeare, WikiText-2). Tensors come in the data's natural units (pixels in [0, 1], raw tabular features).
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..config import DataConfig
from ..errors import DataError
from .core import SPLIT_SEED, DataInfo, Dataset, Split, hold_out_test, split_val
from .files import locate, locate_folder
from .images import image_dataset, read_images, u8_images
from .tables import tabular_dataset

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
    d = locate(
        cfg, "fashion_mnist", list(FMNIST_FILES.values()),
        {f: FMNIST_URL + f for f in FMNIST_FILES.values()},
        hint="install them with `apt-get install -y dataset-fashion-mnist` (Debian)",
        extra_dirs=("/usr/share/datasets/fashion-mnist",),
    )
    arr = {k: read_idx(d / f) for k, f in FMNIST_FILES.items()}

    def images(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a.astype(np.float32) / 255.0).unsqueeze(1)  # [N, 1, 28, 28] in [0, 1]

    x, y = images(arr["train_x"]), torch.from_numpy(arr["train_y"].astype(np.int64))
    train, val = split_val(x, y, cfg.val_fraction, cfg.subset)
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
    d = locate(cfg, "adult", ["adult.data", "adult.test"],
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
    return tabular_dataset("adult", x, y, Split(encode(test_rows), torch.tensor(test_y)), 2, cfg, str(d), names)


def _sklearn_tabular(name: str, loader: str, cfg: DataConfig) -> Dataset:
    import sklearn.datasets

    bunch = getattr(sklearn.datasets, loader)()
    x = torch.tensor(bunch.data, dtype=torch.float32)
    y = torch.tensor(bunch.target, dtype=torch.int64)
    return tabular_dataset(name, x, y, None, int(y.max()) + 1, cfg, f"sklearn.datasets.{loader}", list(bunch.feature_names))


def load_breast_cancer(cfg: DataConfig) -> Dataset:
    """Wisconsin breast cancer (569 × 30, 2 classes), bundled with scikit-learn: a small validation split."""
    return _sklearn_tabular("breast_cancer", "load_breast_cancer", cfg)


def load_wine(cfg: DataConfig) -> Dataset:
    """Wine (178 × 13, 3 classes), bundled with scikit-learn."""
    return _sklearn_tabular("wine", "load_wine", cfg)


# ---------------------------------------------------------------------------------------------
# sklearn digits (bundled with scikit-learn; 8x8 images, fast tests)


def load_digits(cfg: DataConfig) -> Dataset:
    from sklearn.datasets import load_digits as sk_digits

    bunch = sk_digits()
    x = torch.tensor(bunch.images / 16.0, dtype=torch.float32).unsqueeze(1)  # [N, 1, 8, 8] in [0, 1]
    y = torch.tensor(bunch.target, dtype=torch.int64)
    # No official test split: hold out a fixed 20% before the validation carve.
    test, x, y = hold_out_test(x, y)
    train, val = split_val(x, y, cfg.val_fraction, cfg.subset)
    info = DataInfo("digits", (1, 8, 8), 10, [float(train.x.mean())], [float(train.x.std())], 0.0, 1.0,
                    source="sklearn.datasets.load_digits")
    return Dataset(info, train, val, test)


# ---------------------------------------------------------------------------------------------
# CIFAR-10 / CIFAR-100 (torchvision's python-pickle folders)

# name -> (folder, training files, test files, label key, classes, archive URL)
CIFAR = {
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], b"labels", 10,
                "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"),
    "cifar100": ("cifar-100-python", ["train"], ["test"], b"fine_labels", 100,
                 "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"),
}


def _load_cifar(cfg: DataConfig, name: str) -> Dataset:
    import pickle

    folder, train_files, test_files, key, classes, url = CIFAR[name]
    files = [f"{folder}/{f}" for f in train_files + test_files]
    d = locate_folder(cfg, name, files, url,
                       hint=f"unpack {url.rsplit('/', 1)[-1]} there (torchvision's CIFAR layout)") / folder

    def read(fnames: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ys = [], []
        for f in fnames:
            try:
                with open(d / f, "rb") as fh:
                    batch = pickle.load(fh, encoding="bytes")
                xs.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
                ys.append(np.asarray(batch[key], dtype=np.int64))
            except (OSError, pickle.UnpicklingError, EOFError, KeyError, ValueError) as exc:
                raise DataError(f"{d / f} is not a CIFAR python batch ({type(exc).__name__}: {exc}); fetch it again") from None
        return u8_images(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))

    x, y = read(train_files)
    tx, ty = read(test_files)
    return image_dataset(name, x, y, Split(tx, ty), classes, cfg, str(d))


def load_cifar10(cfg: DataConfig) -> Dataset:
    return _load_cifar(cfg, "cifar10")


def load_cifar100(cfg: DataConfig) -> Dataset:
    return _load_cifar(cfg, "cifar100")


# ---------------------------------------------------------------------------------------------
# TinyImageNet (the Stanford CS231n folder layout); the official val split is our test split

TINYIMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"


def load_tinyimagenet(cfg: DataConfig) -> Dataset:
    folder = "tiny-imagenet-200"
    d = locate_folder(cfg, "tinyimagenet", [f"{folder}/wnids.txt", f"{folder}/val/val_annotations.txt"],
                       TINYIMAGENET_URL, hint="unzip tiny-imagenet-200.zip there") / folder
    wnids = sorted(w.strip() for w in (d / "wnids.txt").read_text().split() if w.strip())
    index = {w: i for i, w in enumerate(wnids)}
    train_paths, train_y = [], []
    for w in wnids:
        imgs = sorted((d / "train" / w / "images").glob("*.JPEG"))
        if not imgs:
            raise DataError(f"tinyimagenet: {d / 'train' / w / 'images'} holds no .JPEG files")
        train_paths += imgs
        train_y += [index[w]] * len(imgs)
    val_paths, val_y = [], []
    for line in (d / "val" / "val_annotations.txt").read_text().splitlines():
        parts = line.split("\t")
        if len(parts) < 2:
            continue
        if parts[1] not in index:
            raise DataError(f"tinyimagenet: val_annotations.txt names class {parts[1]!r}, which wnids.txt lacks")
        val_paths.append(d / "val" / "images" / parts[0])
        val_y.append(index[parts[1]])
    x = u8_images(read_images(train_paths))
    test = Split(u8_images(read_images(val_paths)), torch.tensor(val_y, dtype=torch.int64))
    return image_dataset("tinyimagenet", x, torch.tensor(train_y, dtype=torch.int64), test, len(wnids), cfg, str(d))


# ---------------------------------------------------------------------------------------------
# Language modelling: x is [N, T] token ids, y the same sequences shifted by one ([N, T]).
# No input normalization (the spec's mean/std are empty, so the model has no Normalize layer).


def _sequences(tokens: torch.Tensor, seq_len: int) -> Split:
    """Non-overlapping windows: x = tokens[i:i+T], y = tokens[i+1:i+T+1]."""
    n = (len(tokens) - 1) // seq_len
    if n < 1:
        raise DataError(f"text of {len(tokens)} tokens is too short for data.seq_len={seq_len}")
    return Split(tokens[: n * seq_len].view(n, seq_len), tokens[1 : n * seq_len + 1].view(n, seq_len))


def _keep(split: Split, subset: int) -> Split:
    if not subset or subset >= len(split):
        return split
    perm = torch.randperm(len(split), generator=torch.Generator().manual_seed(SPLIT_SEED))[:subset]
    return Split(split.x[perm], split.y[perm])


def _lm_info(name: str, cfg: DataConfig, vocab: int, source: str, symbols: list[str]) -> DataInfo:
    return DataInfo(name, (cfg.seq_len,), vocab, [], [], 0, vocab - 1, metric="perplexity", source=source,
                    feature_names=symbols)


def load_shakespeare(cfg: DataConfig) -> Dataset:
    """Character level; the text's own sorted characters are the vocabulary. Contiguous splits:
    test = the last `val_fraction` of the text, val = the `val_fraction` before it, train = the rest."""
    d = locate(cfg, "shakespeare", ["works.txt"], {}, hint="put the plain-text works.txt there")
    try:
        text = (d / "works.txt").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{d / 'works.txt'} is not readable UTF-8 text ({exc})") from None
    vocab = sorted(set(text))
    lut = {ch: i for i, ch in enumerate(vocab)}
    tokens = torch.tensor([lut[ch] for ch in text], dtype=torch.int64)
    n_hold = max(cfg.seq_len + 1, int(len(tokens) * cfg.val_fraction))
    a, b = len(tokens) - 2 * n_hold, len(tokens) - n_hold
    train = _keep(_sequences(tokens[:a], cfg.seq_len), cfg.subset)
    val, test = _sequences(tokens[a:b], cfg.seq_len), _sequences(tokens[b:], cfg.seq_len)
    return Dataset(_lm_info("shakespeare", cfg, len(vocab), str(d), vocab), train, val, test)


WIKITEXT2_FILES = ["wikitext-2-raw/wiki.train.raw", "wikitext-2-raw/wiki.valid.raw", "wikitext-2-raw/wiki.test.raw"]
WIKITEXT2_URL = "https://wikitext.smerity.com/wikitext-2-raw-v1.zip"


def load_wikitext2(cfg: DataConfig) -> Dataset:
    """WikiText-2 raw, byte level (vocabulary = the 256 byte values; no hub tokenizer).
    The official valid/test files are our val/test splits."""
    d = locate_folder(cfg, "wikitext2", WIKITEXT2_FILES, WIKITEXT2_URL, hint="unzip wikitext-2-raw-v1.zip there")

    def tokens(rel: str) -> torch.Tensor:
        return torch.from_numpy(np.frombuffer((d / rel).read_bytes(), dtype=np.uint8).astype(np.int64))

    train, val, test = (_sequences(tokens(f), cfg.seq_len) for f in WIKITEXT2_FILES)
    return Dataset(_lm_info("wikitext2", cfg, 256, str(d / "wikitext-2-raw"), []), _keep(train, cfg.subset), val, test)
