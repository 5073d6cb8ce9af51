"""Data sets: one registry (`DATASETS`: name -> loader), its checks, and the run's data set loaded once per process.

A loader reads the standard files from the user's data directory, downloads them only when `data.download=true`,
and returns tensors in the data's natural units (pixels in [0, 1], raw tabular features): normalization lives
inside the model, so exported graphs are self-contained for users and verifiers. The package: `core` (types,
splits, batches), `files` (finding and fetching files), `builtin` (the built-in sets), `tables` (csv/npz and the
tabular helper), `images` (image_folder and the image helpers).
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict
from typing import Callable

from ..config import Config, DataConfig, check_choice, need
from .builtin import (load_adult, load_breast_cancer, load_cifar10, load_cifar100, load_digits, load_fashion_mnist,
                      load_shakespeare, load_tinyimagenet, load_wikitext2, load_wine, read_idx)
from .core import SPLIT_SEED, DataInfo, Dataset, Split, as_split, augment, batches, on_device
from .images import load_image_folder
from .tables import load_csv, load_npz, tabular_dataset

__all__ = ["DATASETS", "BUILTIN_DATASETS", "FILE_DATASETS", "SPLIT_SEED", "DataInfo", "Dataset", "Split", "as_split",
           "augment", "batches", "on_device", "check_config", "load_dataset", "dataset_for", "tabular_dataset",
           "read_idx", *(f"load_{n}" for n in ("adult", "breast_cancer", "cifar10", "cifar100", "digits", "fashion_mnist",
                                                "shakespeare", "tinyimagenet", "wikitext2", "wine", "csv", "npz", "image_folder"))]

FILE_DATASETS = ("csv", "npz", "image_folder")  # the data sets of the user's own files (data.path, ...)


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
