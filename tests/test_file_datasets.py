"""Data sets of your own from files: csv and npz (tabular, as Adult) and image_folder. Every file is written by
the test itself (the recipe is the fixture); a CSV data set runs through `pipeline run`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline import checkpoint
from pipeline.cli import main
from pipeline.config import DataConfig
from pipeline.data import as_split, load_dataset
from pipeline.errors import DataError

N_ROWS = 240
COLORS = ["red", "green", "blue"]


def _rows(n: int, seed: int) -> list[dict]:
    """Two numeric features on very different scales, one categorical; the class follows a rule on them."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        a, b, color = rng.normal(), rng.normal(1000, 300), COLORS[rng.integers(3)]
        rows.append({"a": f"{a:.4f}", "b": f"{b:.1f}", "color": color,
                     "species": "setosa" if a + (b - 1000) / 300 > 0 or color == "red" else "virginica"})
    return rows


def _write_csv(path: Path, rows: list[dict], columns=("a", "b", "color", "species")) -> Path:
    path.write_text(",".join(columns) + "\n" + "".join(",".join(r[c] for c in columns) + "\n" for r in rows))
    return path


def _csv(path: Path, **kw) -> DataConfig:
    return DataConfig(name="csv", path=str(path), label="species", **kw)


def test_csv_columns_one_hot_and_standardization_inside_the_model(tmp_path):
    train = _write_csv(tmp_path / "train.csv", _rows(N_ROWS, 0))
    test_rows = _rows(20, 1)
    test_rows[0]["color"] = "purple"  # a category the training file lacks: all zeros
    test = _write_csv(tmp_path / "test.csv", test_rows)
    ds = load_dataset(_csv(train, categorical=["color"], test_path=str(test)))
    assert ds.info.feature_names == ["a", "b", "color=blue", "color=green", "color=red"]
    assert ds.info.num_classes == 2 and len(ds.test) == 20 and len(ds.train) + len(ds.val) == N_ROWS
    assert ds.test.x[0, 2:].tolist() == [0.0, 0.0, 0.0]
    assert ds.test.x[1, 2:].sum() == 1.0 and float(ds.test.x[1, 0]) == pytest.approx(float(test_rows[1]["a"]))
    assert ds.info.std[1] > 100 and ds.info.std[0] < 2  # raw units in, mean/std for the model's Normalize
    assert ds.test.y.tolist() == [0 if r["species"] == "setosa" else 1 for r in test_rows]  # classes sorted by name
    only = load_dataset(_csv(train, features=["b", "a"]))  # chosen columns, in the config's order; 20% held out
    assert only.info.feature_names == ["b", "a"] and len(only.test) == N_ROWS // 5


@pytest.mark.parametrize("edit,cfg,needle", [
    (None, {"label": "kind"}, "train.csv: no column 'kind' (data.label); it has a, b, color, species"),
    (None, {"features": ["a", "size"]}, "no column 'size' (data.features)"),
    ((3, "b", "12x"), {}, "train.csv, line 5, column 'b': '12x' is not a number"),
    ((7, "a", "NaN"), {}, "train.csv, line 9, column 'a': nan (missing or not finite)"),
    ((2, "a", ""), {}, "train.csv, line 4, column 'a': is empty"),
    ((4, "species", ""), {}, "train.csv, line 6, column 'species': is empty"),
    (None, {"path": "nowhere.csv"}, "csv: data.path=nowhere.csv is not a file (it does not exist)"),
])
def test_csv_errors_are_one_line_naming_row_and_column(tmp_path, edit, cfg, needle):
    rows = _rows(30, 0)
    if edit:
        i, col, value = edit
        rows[i][col] = value
    path = _write_csv(tmp_path / "train.csv", rows)
    with pytest.raises(DataError) as e:
        load_dataset(DataConfig(**{"name": "csv", "path": str(path), "label": "species", "categorical": ["color"], **cfg}))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_csv_data_set_runs_through_pipeline_run(tmp_path, capsys):
    path = _write_csv(tmp_path / "flowers.csv", _rows(N_ROWS, 0))
    args = ["run", f"out_dir={tmp_path}", "name=csv", "threads=1", "data.name=csv", f"data.path={path}",
            "data.label=species", "data.categorical=color", "data.batch_size=32", "variants=lambda_gelu,gelu",
            "model.hidden=[16]", "train.epochs=4", "train.lr=0.1", "stages=train,harden,swap"]
    assert main(args) == 0
    run = tmp_path / "csv"
    swap = json.loads((run / "swap" / "swap.json").read_text())
    assert set(swap) == {"lambda_gelu", "gelu"} and swap["lambda_gelu"]["val_before"] > 0.6, swap
    model, payload = checkpoint.load_model(run / "train" / "lambda_gelu" / "best.pt")
    assert payload["spec"]["input_shape"] == [5] and len(payload["spec"]["mean"]) == 5  # standardized inside the model
    assert json.loads((run / "config.json").read_text())["data"]["categorical"] == ["color"]
    # the same mistakes through the CLI: one line, exit 2, and no run folder for a config that cannot run
    bad = [a if not a.startswith("data.label=") else "data.label=kind" for a in args]
    assert main([*bad[:2], "name=bad", *bad[3:]]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "no column 'kind'" in err and "\n" not in err and not (tmp_path / "bad").exists()
    assert main(["run", f"out_dir={tmp_path}", "data.name=digits", "data.path=x.csv"]) == 2
    assert "data.path is for data.name=csv/npz/image_folder" in capsys.readouterr().err
    assert main(["run", f"out_dir={tmp_path}", "data.name=csv", f"data.path={path}"]) == 2
    assert "data.name=csv needs data.label=<the class column>" in capsys.readouterr().err


def test_npz_arrays_are_columns(tmp_path):
    rng = np.random.default_rng(0)
    x, kind = rng.normal(size=(100, 3)), np.array(["u", "v"] * 50)
    y = (x[:, 0] > 0).astype(np.float64)  # labels saved as floats: 1.0 is class "1"
    np.savez(tmp_path / "d.npz", x=x, kind=kind, y=y)
    ds = load_dataset(DataConfig(name="npz", path=str(tmp_path / "d.npz"), label="y", categorical=["kind"]))
    assert ds.info.feature_names == ["x[0]", "x[1]", "x[2]", "kind=u", "kind=v"] and ds.info.num_classes == 2
    assert len(ds.test) == 20 and ds.train.x.dtype == torch.float32
    x[5, 1] = np.inf
    np.savez(tmp_path / "bad.npz", x=x, y=y)
    with pytest.raises(DataError, match=r"bad.npz, row 5, column 'x\[1\]': inf"):
        load_dataset(DataConfig(name="npz", path=str(tmp_path / "bad.npz"), label="y"))
    np.savez(tmp_path / "img.npz", x=np.zeros((4, 2, 2, 2)), y=np.arange(4))
    with pytest.raises(DataError, match="every array must be"):
        load_dataset(DataConfig(name="npz", path=str(tmp_path / "img.npz"), label="y"))


def _png(path: Path, value: int, size=(6, 5), mode="L") -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, value if mode == "L" else (value, 0, 255 - value)).save(path)


def test_image_folder_with_and_without_train_test(tmp_path):
    for c, v in (("cat", 10), ("dog", 200)):
        for i in range(10):
            _png(tmp_path / "flat" / c / f"{i}.png", v + i)
    ds = load_dataset(DataConfig(name="image_folder", path=str(tmp_path / "flat")))
    assert ds.info.input_shape == (1, 5, 6) and ds.info.num_classes == 2 and len(ds.test) == 4
    x = torch.cat([ds.train.x, ds.val.x, ds.test.x])
    y = torch.cat([ds.train.y, ds.val.y, ds.test.y])
    assert torch.equal(x.amax(dim=(1, 2, 3)) < 100 / 255, y == 0)  # folder "cat" (dark) is class 0
    for split, n in (("train", 6), ("test", 2)):
        for c, v in (("a", 0), ("b", 255)):
            for i in range(n):
                _png(tmp_path / "tt" / split / c / f"{i}.jpg", v, mode="RGB")
    ds = load_dataset(DataConfig(name="image_folder", path=str(tmp_path / "tt")))
    assert ds.info.input_shape == (3, 5, 6) and len(ds.test) == 4 and len(ds.train) + len(ds.val) == 12
    _png(tmp_path / "flat" / "dog" / "big.png", 3, size=(7, 5))
    with pytest.raises(DataError, match=r"big.png is 7x5, the other images are 6x5"):
        load_dataset(DataConfig(name="image_folder", path=str(tmp_path / "flat")))
    (tmp_path / "flat" / "empty").mkdir()
    with pytest.raises(DataError, match="empty holds no .png/.jpg files"):
        load_dataset(DataConfig(name="image_folder", path=str(tmp_path / "flat")))


def test_as_split_takes_tensors_arrays_loaders_and_says_what_it_cannot():
    from torch.utils.data import DataLoader, TensorDataset

    x, y = np.random.default_rng(0).random((10, 3)), np.arange(10) % 3
    ref = as_split((x, y))
    assert ref.x.dtype == torch.float32 and ref.y.dtype == torch.int64 and len(ref) == 10
    loaded = as_split(DataLoader(TensorDataset(torch.tensor(x), torch.tensor(y)), batch_size=4))
    assert torch.equal(loaded.x, ref.x) and torch.equal(loaded.y, ref.y)
    assert as_split(ref) is ref and len(as_split(TensorDataset(ref.x, ref.y))) == 10
    with pytest.raises(DataError, match="integer class labels"):
        as_split((x, y.astype(float)))
    with pytest.raises(DataError, match="cannot read data from a int"):
        as_split(3)
