"""Typed config: files, overrides, and one-line errors that name the valid choices."""

import pytest

from pipeline import config
from pipeline.errors import ConfigError
from pipeline.runner import validate


def test_defaults_are_the_paper_fashion_mnist_setup():
    cfg = config.load()
    assert (cfg.data.name, cfg.model.name, cfg.model.hidden) == ("fashion_mnist", "mlp", [256] * 4)
    assert (cfg.train.optimizer, cfg.train.lr, cfg.train.weight_decay) == ("sgd", 5e-2, 1e-4)
    assert (cfg.gate.temperature, cfg.gate.lr_mult, cfg.harden.epsilon) == (0.1, 9.0, 5e-3)
    assert cfg.variants == ["lambda_gelu", "gelu", "relu"]


def test_overrides_parse_types():
    cfg = config.load(overrides=["train.epochs=7", "train.lr=1e-3", "data.download=1", "model.hidden=32,16",
                                 "variants=[\"gelu\"]", "gate.granularity=channel"])
    assert cfg.train.epochs == 7 and cfg.train.lr == 1e-3 and cfg.data.download is True
    assert cfg.model.hidden == [32, 16] and cfg.variants == ["gelu"] and cfg.gate.granularity == "channel"


@pytest.mark.parametrize("text,value", [("true", True), ("false", False), ("1", True), ("0", False), ("no", False), ("YES", True)])
def test_booleans(text, value):
    assert config.load(overrides=[f"data.download={text}"]).data.download is value


@pytest.mark.parametrize("override,needle", [
    ("train.epoch=3", "unknown config key 'train.epoch'; valid keys here: "),
    ("trian.epochs=3", "unknown config key 'trian'; valid keys here: "),
    ("train.epochs=three", "train.epochs expects an integer"),
    ("train.optimizer=adam", "choose one of sgd, adamw"),
    ("data.download=maybe", "expects a boolean (true/false/1/0)"),
    ("data.name=mnist", "choose one of fashion_mnist, adult, digits"),
    ("variants=lambda_gelu,swish", "choose one of relu, gelu, lambda_gelu"),
    ("train.epochs", "must look like key.sub=value"),
    ("train=3", "train is a section"),
    ("gate.temperature=0", "gate.temperature must be > 0"),
])
def test_errors_are_one_line_and_name_the_fix(override, needle):
    with pytest.raises(ConfigError) as e:
        validate(config.load(overrides=[override]))  # fields, then registry names, as every entry point does
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_retired_key_in_an_old_config_json_is_dropped_and_refused_when_set():
    """verify.probe_smooth (the verify stage's Marabou probe, removed): a run directory's config.json from before holds
    its default, and still opens; set to anything, as a file value or an override, it is one line saying why it went."""
    from pipeline.config import from_dict

    old = config.Config().to_dict()
    old["verify"]["probe_smooth"] = False
    assert from_dict(old).to_dict() == config.Config().to_dict()
    old["verify"]["probe_smooth"] = True
    for make in (lambda: from_dict(old), lambda: config.apply_overrides(config.Config(), ["verify.probe_smooth=false"])):
        with pytest.raises(ConfigError, match="verify.probe_smooth is no longer a setting.*marabou verifier") as e:
            make()
        assert "\n" not in str(e.value)


def test_toml_and_yaml_files(tmp_path):
    (tmp_path / "a.toml").write_text('seed = 3\n[train]\nepochs = 4\n[data]\nname = "digits"\n')
    (tmp_path / "b.yaml").write_text("seed: 3\ntrain:\n  epochs: 4\ndata:\n  name: digits\n")
    a, b = config.load(tmp_path / "a.toml"), config.load(tmp_path / "b.yaml")
    assert a.to_dict() == b.to_dict() and a.train.epochs == 4 and a.seed == 3
    assert config.load(tmp_path / "a.toml", ["train.epochs=9"]).train.epochs == 9  # CLI wins over file
    (tmp_path / "bad.toml").write_text("[train]\nepochs = 'x'\n")
    with pytest.raises(ConfigError, match="train.epochs expects an integer"):
        config.load(tmp_path / "bad.toml")
    with pytest.raises(ConfigError, match="does not exist"):
        config.load(tmp_path / "missing.toml")


def test_round_trip_through_dict():
    cfg = config.load(overrides=["train.epochs=3", "gate.init=decreasing"])
    assert config.from_dict(cfg.to_dict()).to_dict() == cfg.to_dict()


def test_shipped_configs_load():
    from pathlib import Path

    files = sorted(Path(__file__).parent.parent.joinpath("configs").glob("*.toml"))
    assert files, "configs/ should ship ready configs"
    for f in files:
        config.load(f)


# A file's values are typed: each must already have the declared type (a string is not parsed as a number
# there, as it is on the command line, where every value is text). An int may stand for a float.
@pytest.mark.parametrize("suffix,text,needle", [
    (".toml", '[train]\nepochs = "5"\n', "train.epochs expects an integer, got the string '5'; write it unquoted"),
    (".yaml", 'train:\n  epochs: "5"\n', "train.epochs expects an integer, got the string '5'; write it unquoted"),
    (".json", '{"train": {"epochs": "5"}}', "train.epochs expects an integer, got the string '5'; write it unquoted"),
    (".toml", "[train]\nepochs = 5.0\n", "train.epochs expects an integer, got 5.0"),
    (".toml", "[train]\nepochs = true\n", "train.epochs expects an integer, got True"),
    (".toml", '[train]\nlr = "0.1"\n', "train.lr expects a number, got the string '0.1'; write it unquoted"),
    (".toml", "[train]\nlr = false\n", "train.lr expects a number, got False"),
    (".toml", '[data]\ndownload = "true"\n', "data.download expects true or false, got the string 'true'; write it unquoted"),
    (".json", '{"data": {"download": 1}}', "data.download expects true or false, got 1"),
    (".toml", "name = 2024\n", "name expects a string, got 2024; quote it"),
    (".toml", '[model]\nhidden = "32,32"\n', "model.hidden expects a list of int, got the string '32,32'; write a list"),
    (".toml", '[model]\nhidden = [32, "32"]\n', "model.hidden[1] expects an integer, got the string '32'"),
    (".toml", '[verify]\nepsilons = [0.01, "0.02"]\n', "verify.epsilons[1] expects a number, got the string '0.02'"),
])
def test_a_file_value_of_the_wrong_type_is_refused_with_one_line(tmp_path, suffix, text, needle):
    path = tmp_path / f"c{suffix}"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        config.load(path)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_file_may_give_an_int_where_a_float_is_declared(tmp_path):
    (tmp_path / "c.toml").write_text("[train]\nlr = 1\n[verify]\nepsilons = [1, 0.5]\n")
    cfg = config.load(tmp_path / "c.toml")
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)
    assert cfg.verify.epsilons == [1.0, 0.5] and all(isinstance(e, float) for e in cfg.verify.epsilons)


def test_yaml_exponent_floats_are_numbers(tmp_path):
    # YAML 1.1 (PyYAML's default) reads `1e-3` as a string; YAML 1.2 and every user read it as a number
    (tmp_path / "c.yaml").write_text("train:\n  lr: 1e-3\n  weight_decay: 5E-4\n")
    cfg = config.load(tmp_path / "c.yaml")
    assert (cfg.train.lr, cfg.train.weight_decay) == (1e-3, 5e-4)
