"""Images: uint8 decoding, per-channel statistics, the data set of a folder of images (`image_folder`: root/<class>/
*.png|jpg, or root/train/<class>/ with root/test/<class>/). The built-in image sets (CIFAR, TinyImageNet) use the
same helpers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..config import DataConfig
from ..errors import DataError
from .core import DataInfo, Dataset, Split, hold_out_test, split_val

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
GREY_MODES = ("1", "L", "LA", "I", "I;16", "F")  # Pillow modes without colour


def channel_stats(x: torch.Tensor) -> tuple[list[float], list[float]]:
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


def u8_images(a: np.ndarray) -> torch.Tensor:
    """uint8 [N, C, H, W] -> float32 in [0, 1]."""
    return torch.from_numpy(a).float().div_(255.0)


def image_dataset(name: str, x: torch.Tensor, y: torch.Tensor, test: Split, classes: int, cfg: DataConfig,
                   source: str) -> Dataset:
    train, val = split_val(x, y, cfg.val_fraction, cfg.subset)
    mean, std = channel_stats(train.x)
    info = DataInfo(name, tuple(x.shape[1:]), classes, mean, std, 0.0, 1.0, source=source)
    return Dataset(info, train, val, test)


def read_images(paths: list[Path], mode: str = "RGB") -> np.ndarray:
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
        return u8_images(read_images(paths, mode)), torch.tensor(y, dtype=torch.int64)

    x, y = read(train)
    if test is not None:
        tx, ty = read(test)
        if tx.shape[1:] != x.shape[1:]:
            raise DataError(f"image_folder: test images are {tx.shape[3]}x{tx.shape[2]}, training images {x.shape[3]}x{x.shape[2]}")
        held = Split(tx, ty)
    else:  # no test folder: hold out a fixed 20% before the validation carve (as for digits)
        held, x, y = hold_out_test(x, y)
    return image_dataset(f"image_folder:{root.name}", x, y, held, len(names), cfg, str(root))
