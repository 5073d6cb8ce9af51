"""Tables: feature vectors in their raw units (`tabular_dataset`, shared with the built-in Adult, breast_cancer and
wine), and the user's own files: csv and npz (categoricals one-hot over the training file's values,
standardization inside the model). Paths are taken as given (relative to the working directory).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..config import DataConfig
from ..errors import DataError
from .core import DataInfo, Dataset, Split, hold_out_test, split_val


def tabular_dataset(name: str, x: torch.Tensor, y: torch.Tensor, test: Split | None, classes: int, cfg: DataConfig,
                    source: str, feature_names: list[str]) -> Dataset:
    """Feature vectors in their raw units: the validation carve (and, without an official test split, a
    fixed 20% test hold-out first), per-feature mean/std for the model's Normalize from the training part,
    and each feature's range over the training pool as the valid input box."""
    if test is None:
        test, x, y = hold_out_test(x, y)
    train, val = split_val(x, y, cfg.val_fraction, cfg.subset)
    mean = train.x.mean(0)
    std = train.x.std(0).clamp_min(1e-6)  # a constant column stays finite
    lo, hi = x.min(0).values, x.max(0).values
    info = DataInfo(name, (x.shape[1],), classes, mean.tolist(), std.tolist(), lo.tolist(), hi.tolist(),
                    source=source, feature_names=feature_names)
    return Dataset(info, train, val, test)


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
