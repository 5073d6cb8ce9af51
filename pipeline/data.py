"""Dataset registry. Each loader reads the standard files from the user's data directory,
downloads them only when `data.download=true`, and returns tensors in the data's natural units
(pixels in [0, 1], raw tabular features): normalization lives inside the model, so exported
graphs are self-contained for users and verifiers.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import struct
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .config import Config, DataConfig, check_choice, need
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
    return tabular_dataset("adult", x, y, Split(encode(test_rows), torch.tensor(test_y)), 2, cfg, str(d), names)


def tabular_dataset(name: str, x: torch.Tensor, y: torch.Tensor, test: Split | None, classes: int, cfg: DataConfig,
                    source: str, feature_names: list[str]) -> Dataset:
    """Feature vectors in their raw units: the validation carve (and, without an official test split, a
    fixed 20% test hold-out first), per-feature mean/std for the model's Normalize from the training part,
    and each feature's range over the training pool as the valid input box."""
    if test is None:
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(SPLIT_SEED + 1))
        n_test = len(y) // 5
        test, x, y = Split(x[perm[:n_test]], y[perm[:n_test]]), x[perm[n_test:]], y[perm[n_test:]]
    train, val = _split_val(x, y, cfg.val_fraction, cfg.subset)
    mean = train.x.mean(0)
    std = train.x.std(0).clamp_min(1e-6)  # a constant column stays finite
    lo, hi = x.min(0).values, x.max(0).values
    info = DataInfo(name, (x.shape[1],), classes, mean.tolist(), std.tolist(), lo.tolist(), hi.tolist(),
                    source=source, feature_names=feature_names)
    return Dataset(info, train, val, test)


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
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(SPLIT_SEED + 1))
    n_test = len(y) // 5
    test = Split(x[perm[:n_test]], y[perm[:n_test]])
    train, val = _split_val(x[perm[n_test:]], y[perm[n_test:]], cfg.val_fraction, cfg.subset)
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


def _fetch_archive(url: str, dest: Path) -> None:
    """Download a .tar.gz or .zip into dest and unpack it there (data.download=true only)."""
    import tarfile
    import zipfile

    dest.mkdir(parents=True, exist_ok=True)
    fname = url.rsplit("/", 1)[-1]
    _download({fname: url}, dest)
    archive = dest / fname
    try:
        if fname.endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                z.extractall(dest)
        else:
            with tarfile.open(archive) as t:
                t.extractall(dest, filter="data")
    except (OSError, tarfile.TarError, zipfile.BadZipFile) as exc:
        raise DataError(f"cannot unpack {archive} ({exc}); delete it and retry, or unpack it by hand into {dest}") from None


def _locate_folder(cfg: DataConfig, name: str, files: list[str], url: str, hint: str) -> Path:
    """Like `_locate`, for data sets shipped as one archive holding a folder of files."""
    dirs = list(dict.fromkeys(_search_dirs(cfg.root, name)))
    found = _find(files, dirs)
    if found is None and cfg.download:
        dest = Path(cfg.root).expanduser()
        _fetch_archive(url, dest)
        found = _find(files, dirs)
    if found is None:
        looked = ", ".join(str(d) for d in dirs)
        raise DataError(f"{name}: {files[0].split('/')[0]}/ with {', '.join(f.split('/')[-1] for f in files)} not found "
                        f"(looked in {looked}); {hint}, or rerun with data.download=true")
    return found


def _channel_stats(x: torch.Tensor) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of [N, C, H, W] images, in chunks (no float64 copy of the set)."""
    n, c = x.shape[0], x.shape[1]
    s = torch.zeros(c, dtype=torch.float64)
    s2 = torch.zeros(c, dtype=torch.float64)
    for i in range(0, n, 4096):
        chunk = x[i : i + 4096].double()
        s += chunk.sum(dim=(0, 2, 3))
        s2 += (chunk * chunk).sum(dim=(0, 2, 3))
    count = n * x.shape[2] * x.shape[3]
    mean = s / count
    std = (s2 / count - mean * mean).clamp_min(1e-12).sqrt()
    return mean.tolist(), std.tolist()


def _u8_images(a: np.ndarray) -> torch.Tensor:
    """uint8 [N, C, H, W] -> float32 in [0, 1]."""
    return torch.from_numpy(a).float().div_(255.0)


def _image_dataset(name: str, x: torch.Tensor, y: torch.Tensor, test: Split, classes: int, cfg: DataConfig,
                   source: str) -> Dataset:
    train, val = _split_val(x, y, cfg.val_fraction, cfg.subset)
    mean, std = _channel_stats(train.x)
    info = DataInfo(name, tuple(x.shape[1:]), classes, mean, std, 0.0, 1.0, source=source)
    return Dataset(info, train, val, test)


def _load_cifar(cfg: DataConfig, name: str) -> Dataset:
    import pickle

    folder, train_files, test_files, key, classes, url = CIFAR[name]
    files = [f"{folder}/{f}" for f in train_files + test_files]
    d = _locate_folder(cfg, name, files, url,
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
        return _u8_images(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))

    x, y = read(train_files)
    tx, ty = read(test_files)
    return _image_dataset(name, x, y, Split(tx, ty), classes, cfg, str(d))


def load_cifar10(cfg: DataConfig) -> Dataset:
    return _load_cifar(cfg, "cifar10")


def load_cifar100(cfg: DataConfig) -> Dataset:
    return _load_cifar(cfg, "cifar100")


# ---------------------------------------------------------------------------------------------
# TinyImageNet (the Stanford CS231n folder layout); the official val split is our test split

TINYIMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"


def _read_jpegs(paths: list[Path], mode: str = "RGB") -> np.ndarray:
    """uint8 [N, C, H, W] of image files of one size; mode "RGB" (C = 3) or "L" (greyscale, C = 1)."""
    try:
        from PIL import Image
    except ImportError:
        raise DataError("decoding image files needs Pillow: pip install pillow") from None
    out = None
    for i, p in enumerate(paths):
        try:
            with Image.open(p) as im:
                a = np.asarray(im.convert(mode), dtype=np.uint8)  # a few of TinyImageNet's images are greyscale
        except OSError as exc:
            raise DataError(f"{p} is not a readable image ({exc}); fetch the data set again") from None
        a = a.reshape(*a.shape[:2], -1)  # [H, W, C]
        if out is None:
            out = np.empty((len(paths), a.shape[2], *a.shape[:2]), dtype=np.uint8)
        if a.shape[:2] != out.shape[2:]:
            raise DataError(f"{p} is {a.shape[1]}x{a.shape[0]}, the other images are {out.shape[3]}x{out.shape[2]}")
        out[i] = a.transpose(2, 0, 1)
    if out is None:
        raise DataError("tinyimagenet: no images found under train/<wnid>/images/")
    return out


def load_tinyimagenet(cfg: DataConfig) -> Dataset:
    folder = "tiny-imagenet-200"
    d = _locate_folder(cfg, "tinyimagenet", [f"{folder}/wnids.txt", f"{folder}/val/val_annotations.txt"],
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
    x = _u8_images(_read_jpegs(train_paths))
    test = Split(_u8_images(_read_jpegs(val_paths)), torch.tensor(val_y, dtype=torch.int64))
    return _image_dataset("tinyimagenet", x, torch.tensor(train_y, dtype=torch.int64), test, len(wnids), cfg, str(d))


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
    return DataInfo(name, (cfg.seq_len,), vocab, [], [], 0, vocab - 1, metric="perplexity",
                    higher_is_better=False, source=source, feature_names=symbols)


def load_shakespeare(cfg: DataConfig) -> Dataset:
    """Character level; the text's own sorted characters are the vocabulary. Contiguous splits:
    test = the last `val_fraction` of the text, val = the `val_fraction` before it, train = the rest."""
    d = _locate(cfg, "shakespeare", ["works.txt"], {}, hint="put the plain-text works.txt there")
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
    d = _locate_folder(cfg, "wikitext2", WIKITEXT2_FILES, WIKITEXT2_URL, hint="unzip wikitext-2-raw-v1.zip there")

    def tokens(rel: str) -> torch.Tensor:
        return torch.from_numpy(np.frombuffer((d / rel).read_bytes(), dtype=np.uint8).astype(np.int64))

    train, val, test = (_sequences(tokens(f), cfg.seq_len) for f in WIKITEXT2_FILES)
    return Dataset(_lm_info("wikitext2", cfg, 256, str(d / "wikitext-2-raw"), []), _keep(train, cfg.subset), val, test)


# ---------------------------------------------------------------------------------------------
# Files of your own: csv and npz (tabular, as Adult: categoricals one-hot, standardization inside the model)
# and image_folder (root/<class>/*.png|jpg). Paths are taken as given (relative to the working directory).

FILE_DATASETS = ("csv", "npz", "image_folder")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
GREY_MODES = ("1", "L", "LA", "I", "I;16", "F")  # Pillow modes without colour


@dataclass
class _Table:
    """Columns of one file: name -> [N] values (str for csv) or [N, k] numbers (npz), and where row i is."""

    source: Path
    columns: dict[str, np.ndarray]
    where: Callable[[int], str]


def _file(path: str, key: str, name: str) -> Path:
    p = Path(path).expanduser()
    if not p.is_file():
        raise DataError(f"{name}: {key}={path} is not a file" + ("" if p.exists() else " (it does not exist)"))
    return p


def _read_csv(path: Path) -> _Table:
    import csv

    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            lines = [(i, row) for i, row in enumerate(csv.reader(f), start=1) if any(c.strip() for c in row)]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{path} is not a readable UTF-8 CSV file ({exc})") from None
    if len(lines) < 2:
        raise DataError(f"{path} needs a header line and at least one row")
    header = [h.strip() for h in lines[0][1]]
    if len(set(header)) != len(header):
        raise DataError(f"{path}: the header names a column twice: {', '.join(sorted({h for h in header if header.count(h) > 1}))}")
    for n, row in lines[1:]:
        if len(row) != len(header):
            raise DataError(f"{path}, line {n}: {len(row)} fields, the header has {len(header)}")
    cells = np.array([[c.strip() for c in row] for _, row in lines[1:]], dtype=object)
    numbers = [n for n, _ in lines[1:]]
    return _Table(path, {h: cells[:, j] for j, h in enumerate(header)}, lambda i: f"line {numbers[i]}")


def _read_npz(path: Path) -> _Table:
    try:
        with np.load(path, allow_pickle=False) as z:
            columns = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError) as exc:
        raise DataError(f"{path} is not a readable .npz file of plain arrays ({exc})") from None
    sizes = {k: len(a) if a.ndim else None for k, a in columns.items()}
    bad = [k for k, a in columns.items() if a.ndim not in (1, 2)]
    if bad:
        raise DataError(f"{path}: array {bad[0]!r} has shape {columns[bad[0]].shape}; every array must be [N] or [N, k] "
                        "(images: use data.name=image_folder)")
    if len(set(sizes.values())) > 1:
        raise DataError(f"{path}: the arrays have different lengths: " + ", ".join(f"{k} {n}" for k, n in sizes.items()))
    return _Table(path, columns, lambda i: f"row {i}")


def _columns(t: _Table, cfg: DataConfig) -> list[str]:
    """The feature columns (config order, or every column but the label), each checked to exist."""
    missing = [c for c in [cfg.label, *cfg.features] if c not in t.columns]
    if missing:
        raise DataError(f"{t.source}: no column {missing[0]!r} (data.{'label' if missing[0] == cfg.label else 'features'}); "
                        f"it has {', '.join(t.columns)}")
    features = list(cfg.features) or [c for c in t.columns if c != cfg.label]
    if cfg.label in cfg.features:
        raise DataError(f"data.features lists the label column {cfg.label!r}")
    if not features:
        raise DataError(f"{t.source}: no feature columns beside the label {cfg.label!r}")
    return features


def _numbers(t: _Table, col: str) -> np.ndarray:
    """A numeric column as float64 [N, k]; a non-number, an empty cell, NaN or ±inf is an error naming the row."""
    a = t.columns[col]
    try:
        x = np.asarray(a, dtype=np.float64)
    except ValueError:
        x = None
        for i, v in enumerate(a.reshape(len(a), -1)[:, 0] if a.ndim > 1 else a):
            try:
                float(v)
            except ValueError:
                what = ("is empty; fill it in or drop the row" if str(v) == "" else
                        f"{str(v)!r} is not a number; fix it, or list the column in data.categorical to one-hot it")
                raise DataError(f"{t.source}, {t.where(i)}, column {col!r}: {what}") from None
        raise DataError(f"{t.source}: column {col!r} is not numeric; list it in data.categorical to one-hot it")
    x = x.reshape(len(x), -1)
    bad = np.argwhere(~np.isfinite(x))
    if len(bad):
        i, j = bad[0]
        name = col if x.shape[1] == 1 else f"{col}[{j}]"
        raise DataError(f"{t.source}, {t.where(int(i))}, column {name!r}: {x[i, j]} (missing or not finite); "
                        "fill it in or drop the row")
    return x


def _strings(t: _Table, col: str) -> list[str]:
    a = t.columns[col]
    if a.ndim != 1:
        raise DataError(f"{t.source}: {col!r} has shape {a.shape}; a label or categorical array must be [N]")
    if a.dtype.kind == "f":  # npz labels stored as floats: 1.0 is class "1"
        _numbers(t, col)  # NaN / inf are errors here too
        if np.all(a == np.round(a)):
            a = a.astype(np.int64)
    out = [str(v) for v in a.tolist()]
    for i, v in enumerate(out):
        if v in ("", "nan", "NaN"):
            raise DataError(f"{t.source}, {t.where(i)}, column {col!r}: {'is empty' if v == '' else 'NaN'}; "
                            "fill it in or drop the row")
    return out


def _sort_key(v: str) -> tuple:
    try:
        return (0, float(v), v)  # numbers in numeric order (2 before 10)
    except ValueError:
        return (1, 0.0, v)


def _encode(t: _Table, features: list[str], categorical: list[str], vocab: dict[str, list[str]] | None
            ) -> tuple[torch.Tensor, list[str], dict[str, list[str]]]:
    """Feature matrix [N, D] float32: numeric columns as they are, categorical ones one-hot over `vocab` (the
    training file's sorted values, built here when None; an unseen value is all zeros, as for Adult)."""
    vocab = {} if vocab is None else vocab
    blocks, names = [], []
    for col in features:
        if col in categorical:
            values = _strings(t, col)
            cats = vocab.setdefault(col, sorted(set(values), key=_sort_key))
            index = {v: i for i, v in enumerate(cats)}
            onehot = np.zeros((len(values), len(cats)))
            rows = [(r, index[v]) for r, v in enumerate(values) if v in index]
            if rows:
                onehot[tuple(np.array(rows).T)] = 1.0
            blocks.append(onehot)
            names += [f"{col}={v}" for v in cats]
        else:
            x = _numbers(t, col)
            blocks.append(x)
            names += [col] if x.shape[1] == 1 else [f"{col}[{j}]" for j in range(x.shape[1])]
    return torch.tensor(np.concatenate(blocks, axis=1), dtype=torch.float32), names, vocab


def _labels(t: _Table, col: str, classes: list[str] | None) -> tuple[torch.Tensor, list[str]]:
    values = _strings(t, col)
    classes = classes or sorted(set(values), key=_sort_key)
    index = {v: i for i, v in enumerate(classes)}
    unknown = next((i for i, v in enumerate(values) if v not in index), None)
    if unknown is not None:
        raise DataError(f"{t.source}, {t.where(unknown)}, column {col!r}: label {values[unknown]!r} is not among the "
                        f"training file's classes {', '.join(classes)}")
    return torch.tensor([index[v] for v in values], dtype=torch.int64), classes


def _load_table(cfg: DataConfig, read: Callable[[Path], _Table]) -> Dataset:
    t = read(_file(cfg.path, "data.path", cfg.name))
    features = _columns(t, cfg)
    x, names, vocab = _encode(t, features, cfg.categorical, None)
    y, classes = _labels(t, cfg.label, None)
    if len(classes) < 2:
        raise DataError(f"{t.source}: column {cfg.label!r} holds one class ({classes[0]}); classification needs two or more")
    test = None
    if cfg.test_path:
        tt = read(_file(cfg.test_path, "data.test_path", cfg.name))
        _columns(tt, cfg)
        missing = [c for c in features if c not in tt.columns]
        if missing:
            raise DataError(f"{tt.source}: no column {missing[0]!r} (the training file {t.source} has it)")
        test = Split(_encode(tt, features, cfg.categorical, vocab)[0], _labels(tt, cfg.label, classes)[0])
    return tabular_dataset(f"{cfg.name}:{t.source.name}", x, y, test, len(classes), cfg, str(t.source), names)


def load_csv(cfg: DataConfig) -> Dataset:
    """A CSV file with a header line: `data.label` the class column, `data.features` (default: all others),
    `data.categorical` one-hot; an optional `data.test_path`, else a fixed 20% test hold-out."""
    return _load_table(cfg, _read_csv)


def load_npz(cfg: DataConfig) -> Dataset:
    """A NumPy .npz of [N] / [N, k] arrays, each array a column (or k columns), as for `load_csv`."""
    return _load_table(cfg, _read_npz)


def _image_classes(root: Path) -> dict[str, list[Path]]:
    dirs = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not dirs:
        raise DataError(f"image_folder: {root} holds no class folders; expected {root}/<class>/*.png|jpg")
    out = {}
    for d in dirs:
        files = sorted(p for p in d.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        if not files:
            raise DataError(f"image_folder: {d} holds no .png/.jpg files")
        out[d.name] = files
    return out


def _image_mode(path: Path) -> str:
    """Pillow's mode of an image file, read from its header."""
    try:
        from PIL import Image

        with Image.open(path) as im:
            return im.mode
    except ImportError:
        raise DataError("decoding image files needs Pillow: pip install pillow") from None
    except OSError as exc:
        raise DataError(f"{path} is not a readable image ({exc})") from None


def load_image_folder(cfg: DataConfig) -> Dataset:
    """root/<class>/*.png|jpg (a fixed 20% test hold-out), or root/train/<class>/ with root/test/<class>/.
    Classes are the folder names in sorted order; every image must have the same size (none is resized);
    greyscale when every image is, RGB otherwise; pixels in [0, 1], per-channel normalization in the model."""
    root = Path(cfg.path).expanduser()
    if not root.is_dir():
        raise DataError(f"image_folder: data.path={cfg.path} is not a folder" + ("" if root.exists() else " (it does not exist)"))
    split_dirs = (root / "train").is_dir()
    train = _image_classes(root / "train" if split_dirs else root)
    test = _image_classes(root / "test") if split_dirs and (root / "test").is_dir() else None
    names = sorted(train)
    extra = sorted(set(test or {}) - set(names))
    if extra:
        raise DataError(f"image_folder: {root / 'test'} has class folders that train/ lacks: {', '.join(extra)}")
    every = [p for files in [*train.values(), *(test or {}).values()] for p in files]
    mode = "L" if all(_image_mode(p) in GREY_MODES for p in every) else "RGB"

    def read(classes: dict[str, list[Path]]) -> tuple[torch.Tensor, torch.Tensor]:
        paths = [p for c in names for p in classes.get(c, [])]
        y = [i for i, c in enumerate(names) for _ in classes.get(c, [])]
        return _u8_images(_read_jpegs(paths, mode)), torch.tensor(y, dtype=torch.int64)

    x, y = read(train)
    if test is not None:
        tx, ty = read(test)
        if tx.shape[1:] != x.shape[1:]:
            raise DataError(f"image_folder: test images are {tx.shape[3]}x{tx.shape[2]}, training images {x.shape[3]}x{x.shape[2]}")
        held = Split(tx, ty)
    else:  # no test folder: hold out a fixed 20% before the validation carve (as for digits)
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(SPLIT_SEED + 1))
        n_test = len(y) // 5
        held, x, y = Split(x[perm[:n_test]], y[perm[:n_test]]), x[perm[n_test:]], y[perm[n_test:]]
    return _image_dataset(f"image_folder:{root.name}", x, y, held, len(names), cfg, str(root))


def _check_files(cfg: DataConfig) -> None:
    """The file keys belong to the file data sets, and each of those has what it needs."""
    given = [k for k in ("path", "test_path", "label", "features", "categorical") if getattr(cfg, k)]
    if cfg.name not in BUILTIN_DATASETS:  # a plug-in's loader reads what it wants of them
        return
    if cfg.name not in FILE_DATASETS:
        need(not given, f"data.{given[0] if given else ''} is for data.name={'/'.join(FILE_DATASETS)}; "
                        f"data.name={cfg.name} reads its own files")
        return
    need(bool(cfg.path), f"data.name={cfg.name} needs data.path=<{'folder' if cfg.name == 'image_folder' else 'file'}>")
    if cfg.name == "image_folder":
        extra = [k for k in given if k != "path"]
        need(not extra, f"data.{extra[0] if extra else ''} is for csv/npz; image_folder takes data.path only "
                        "(classes are the folder names, a test/ folder is the test split)")
        return
    need(bool(cfg.label), f"data.name={cfg.name} needs data.label=<the class column>")
    stray = [c for c in cfg.categorical if cfg.features and c not in cfg.features]
    need(not stray, f"data.categorical names {stray[0] if stray else ''!r}, which data.features does not list")
    need(cfg.label not in cfg.categorical, f"data.categorical lists the label column {cfg.label!r} (labels are classes already)")
    need(len(set(cfg.features)) == len(cfg.features), f"data.features lists a column twice: {cfg.features}")


DATASETS: dict[str, Callable[[DataConfig], Dataset]] = {
    "fashion_mnist": load_fashion_mnist,
    "adult": load_adult,
    "digits": load_digits,
    "breast_cancer": load_breast_cancer,
    "wine": load_wine,
    "cifar10": load_cifar10,
    "cifar100": load_cifar100,
    "tinyimagenet": load_tinyimagenet,
    "shakespeare": load_shakespeare,
    "wikitext2": load_wikitext2,
    "csv": load_csv,
    "npz": load_npz,
    "image_folder": load_image_folder,
}
BUILTIN_DATASETS = frozenset(DATASETS)  # the rest come from plug-ins (pipeline.plugins)


def check_config(cfg: DataConfig) -> None:
    check_choice("data.name", cfg.name, DATASETS)
    _check_files(cfg)


def load_dataset(cfg: DataConfig) -> Dataset:
    return DATASETS[cfg.name](cfg)


@functools.lru_cache(maxsize=2)
def _cached_dataset(key: str) -> Dataset:
    return load_dataset(DataConfig(**json.loads(key)))


def dataset_for(cfg: Config) -> Dataset:
    """The run's data set, loaded once per process (every stage of a run asks for it)."""
    return _cached_dataset(json.dumps(asdict(cfg.data), sort_keys=True))  # a hashable key (the config has lists)


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
