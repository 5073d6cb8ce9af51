"""Dataset registry. Each loader reads the standard files from the user's data directory,
downloads them only when `data.download=true`, and returns tensors in the data's natural units
(pixels in [0, 1], raw tabular features): normalization lives inside the model, so exported
graphs are self-contained for users and verifiers.
"""

from __future__ import annotations

import functools
import gzip
import os
import struct
import urllib.request
from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .config import Config, DataConfig, check_choice
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


def _read_jpegs(paths: list[Path]) -> np.ndarray:
    try:
        from PIL import Image
    except ImportError:
        raise DataError("tinyimagenet needs Pillow to decode its JPEG files: pip install pillow") from None
    out = None
    for i, p in enumerate(paths):
        try:
            with Image.open(p) as im:
                a = np.asarray(im.convert("RGB"), dtype=np.uint8)  # a few images are greyscale
        except OSError as exc:
            raise DataError(f"{p} is not a readable image ({exc}); fetch the data set again") from None
        if out is None:
            out = np.empty((len(paths), 3, *a.shape[:2]), dtype=np.uint8)
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
}


def check_config(cfg: DataConfig) -> None:
    check_choice("data.name", cfg.name, DATASETS)


def load_dataset(cfg: DataConfig) -> Dataset:
    return DATASETS[cfg.name](cfg)


@functools.lru_cache(maxsize=2)
def _cached_dataset(key: tuple) -> Dataset:
    return load_dataset(DataConfig(*key))


def dataset_for(cfg: Config) -> Dataset:
    """The run's data set, loaded once per process (every stage of a run asks for it)."""
    return _cached_dataset(astuple(cfg.data))


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
    order = torch.randperm(n, generator=generator) if generator is not None else None
    for i in range(0, n, batch_size):
        idx = order[i : i + batch_size].to(split.x.device) if order is not None else slice(i, i + batch_size)
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
