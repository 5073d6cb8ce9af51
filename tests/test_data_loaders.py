"""The paper's data sets from their standard files: tiny fakes in the real layouts, written here
(the recipe is the fixture), plus the real Shakespeare text from ../shared/data when present."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.config import DataConfig
from pipeline.data import augment, load_dataset
from pipeline.evaluate import METRICS
from pipeline.errors import DataError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
JPEG_TOL = 3 / 255  # a flat-colour JPEG decodes within a few grey levels


def _cifar_batch(n: int, key: bytes, classes: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {b"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8), key: rng.integers(0, classes, size=n).tolist()}


@pytest.fixture
def cifar_root(tmp_path) -> Path:
    d10 = tmp_path / "cifar-10-batches-py"
    d10.mkdir()
    for i in range(1, 6):
        (d10 / f"data_batch_{i}").write_bytes(pickle.dumps(_cifar_batch(8, b"labels", 10, i)))
    (d10 / "test_batch").write_bytes(pickle.dumps(_cifar_batch(6, b"labels", 10, 9)))
    d100 = tmp_path / "cifar-100-python"
    d100.mkdir()
    (d100 / "train").write_bytes(pickle.dumps({**_cifar_batch(20, b"fine_labels", 100, 1), b"coarse_labels": [0] * 20}))
    (d100 / "test").write_bytes(pickle.dumps({**_cifar_batch(5, b"fine_labels", 100, 2), b"coarse_labels": [0] * 5}))
    return tmp_path


def test_cifar10_reads_the_python_batches_channel_major(cifar_root):
    ds = load_dataset(DataConfig(name="cifar10", root=str(cifar_root), val_fraction=0.25))
    assert ds.info.input_shape == (3, 32, 32) and ds.info.num_classes == 10 and ds.info.metric == "accuracy"
    assert len(ds.train) + len(ds.val) == 40 and len(ds.val) == 10 and len(ds.test) == 6
    raw = _cifar_batch(6, b"labels", 10, 9)
    # CIFAR rows are the R plane, then G, then B, each 32x32 row-major.
    assert ds.test.x[2, 1, 3, 5] == pytest.approx(raw[b"data"][2, 1024 + 3 * 32 + 5] / 255.0)
    assert ds.test.y.tolist() == raw[b"labels"]
    assert 0.0 <= float(ds.train.x.min()) and float(ds.train.x.max()) <= 1.0
    mean = ds.train.x.double().mean(dim=(0, 2, 3))
    assert np.allclose(ds.info.mean, mean.numpy(), atol=1e-6) and len(ds.info.std) == 3


def test_cifar100_uses_the_fine_labels(cifar_root):
    ds = load_dataset(DataConfig(name="cifar100", root=str(cifar_root), val_fraction=0.25))
    assert ds.info.num_classes == 100 and len(ds.test) == 5
    assert ds.test.y.tolist() == _cifar_batch(5, b"fine_labels", 100, 2)[b"fine_labels"]


@pytest.fixture
def tiny_imagenet(tmp_path) -> Path:
    from PIL import Image

    root = tmp_path / "tiny-imagenet-200"
    wnids = ["n02", "n01"]  # unsorted on purpose: class ids follow the sorted wnids
    colours = {"n01": (250, 10, 10), "n02": (10, 10, 250)}
    (root / "val" / "images").mkdir(parents=True)
    (root / "wnids.txt").write_text("\n".join(wnids) + "\n")
    for w in wnids:
        d = root / "train" / w / "images"
        d.mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (8, 8), colours[w]).save(d / f"{w}_{i}.JPEG", quality=95)
    Image.new("L", (8, 8), 128).save(root / "train" / "n01" / "images" / "n01_grey.JPEG", quality=95)
    lines = []
    for i, w in enumerate(["n02", "n01", "n02"]):
        Image.new("RGB", (8, 8), colours[w]).save(root / "val" / "images" / f"val_{i}.JPEG", quality=95)
        lines.append(f"val_{i}.JPEG\t{w}\t0\t0\t8\t8")
    (root / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_tinyimagenet_folder_layout(tiny_imagenet):
    ds = load_dataset(DataConfig(name="tinyimagenet", root=str(tiny_imagenet), val_fraction=0.25))
    assert ds.info.num_classes == 2 and ds.info.input_shape == (3, 8, 8)
    assert len(ds.train) + len(ds.val) == 7
    assert ds.test.y.tolist() == [1, 0, 1]  # n01 -> 0, n02 -> 1
    red = ds.test.x[1].mean(dim=(1, 2))  # val_1 is n01, red
    assert red[0] == pytest.approx(250 / 255, abs=JPEG_TOL) and red[2] == pytest.approx(10 / 255, abs=JPEG_TOL)
    x = torch.cat([ds.train.x, ds.val.x])
    grey = [img for img in x if torch.allclose(img[0], img[1], atol=JPEG_TOL) and torch.allclose(img[1], img[2], atol=JPEG_TOL)]
    assert len(grey) == 1 and float(grey[0].mean()) == pytest.approx(128 / 255, abs=JPEG_TOL)  # greyscale became RGB


def test_tinyimagenet_annotation_naming_an_unknown_class_is_an_error(tiny_imagenet):
    ann = tiny_imagenet / "tiny-imagenet-200" / "val" / "val_annotations.txt"
    ann.write_text(ann.read_text() + "val_0.JPEG\tn99\t0\t0\t8\t8\n")
    with pytest.raises(DataError, match="n99"):
        load_dataset(DataConfig(name="tinyimagenet", root=str(tiny_imagenet)))


def test_wikitext2_bytes_shifted_by_one(tmp_path):
    d = tmp_path / "wikitext-2-raw"
    d.mkdir()
    text = {"train": " = Valkyria = \n" * 40, "valid": "héllo wörld, " * 20, "test": "the end . " * 20}
    for split, t in text.items():
        (d / f"wiki.{split}.raw").write_text(t, encoding="utf-8")
    ds = load_dataset(DataConfig(name="wikitext2", root=str(tmp_path), seq_len=16))
    assert ds.info.metric == "perplexity" and METRICS[ds.info.metric][1] is False  # lower is better
    assert ds.info.num_classes == 256 and ds.info.input_shape == (16,) and ds.info.mean == []
    tokens = list(text["valid"].encode("utf-8"))
    assert ds.val.x[0].tolist() == tokens[:16] and ds.val.y[0].tolist() == tokens[1:17]
    assert len(ds.val) == (len(tokens) - 1) // 16
    assert ds.train.x.dtype == torch.int64 and len(ds.train) == (len(text["train"]) - 1) // 16


@pytest.mark.skipif(not (SHARED / "shakespeare" / "works.txt").is_file(), reason="../shared/data/shakespeare absent")
def test_shakespeare_character_level_contiguous_splits():
    cfg = DataConfig(name="shakespeare", root=str(SHARED), seq_len=32, val_fraction=0.01, subset=500)
    ds = load_dataset(cfg)
    vocab = ds.info.feature_names
    assert ds.info.num_classes == len(vocab) == 84 and vocab == sorted(vocab)  # data/README: 84 distinct characters
    assert len(ds.train) == 500 and ds.info.metric == "perplexity"
    text = (SHARED / "shakespeare" / "works.txt").read_text(encoding="utf-8")
    n_hold = int(len(text) * 0.01)
    decode = lambda ids: "".join(vocab[i] for i in ids)  # noqa: E731
    assert decode(ds.test.x[0].tolist()) == text[len(text) - n_hold:][:32]  # test = the text's tail
    assert decode(ds.val.x[0].tolist()) == text[len(text) - 2 * n_hold:][:32]
    assert torch.equal(ds.train.x[:, 1:], ds.train.y[:, :-1])
    again = load_dataset(cfg)
    assert torch.equal(again.train.x, ds.train.x)  # the subset is seeded


@pytest.mark.parametrize("name,needle", [("cifar10", "cifar-10-batches-py/"), ("cifar100", "cifar-100-python/"),
                                         ("tinyimagenet", "tiny-imagenet-200/"), ("wikitext2", "wikitext-2-raw/"),
                                         ("shakespeare", "works.txt")])
def test_missing_files_are_one_clear_line(tmp_path, name, needle):
    with pytest.raises(DataError) as err:
        load_dataset(DataConfig(name=name, root=str(tmp_path / "nowhere")))
    msg = str(err.value)
    assert msg.startswith(f"{name}: ") and needle in msg and "not found" in msg
    assert "data.download=true" in msg and "\n" not in msg


def test_flip_crop_is_a_shifted_window_of_the_padded_image():
    x = torch.rand(16, 3, 6, 6)
    out = augment(x, "flip_crop", torch.Generator().manual_seed(0))
    again = augment(x, "flip_crop", torch.Generator().manual_seed(0))
    assert out.shape == x.shape and torch.equal(out, again)
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    flipped = 0
    for i in range(16):
        windows = [(padded[i, :, a:a + 6, b:b + 6], False) for a in range(9) for b in range(9)]
        windows += [(w.flip(-1), True) for w, _ in windows]
        match = [f for w, f in windows if torch.equal(w, out[i])]
        assert match, f"image {i} is not a crop of its padded original"
        flipped += match[0]
    assert 0 < flipped < 16
    assert torch.equal(augment(x, "none", torch.Generator()), x)
    with pytest.raises(DataError, match="image batches"):
        augment(torch.zeros(4, 10), "flip_crop", torch.Generator())
