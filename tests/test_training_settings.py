"""The config's `training` section in one place (npm.settings.TrainingSettings; paper 4.1, docs/paper-map.md §2.5):
the schema documents its keys without defaults (tests/test_settings_schema.py), `npm-repro train` takes options
generated from it, rule pretrain passes the section with to_args, and a run's id (its checkpoint folder) is what it was
before the section moved."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import yaml

from npm.cli import build_parser
from npm.settings import TrainingSettings, check, from_args, options, to_args
from npm.training.loop import TrainConfig, run_record

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ["train", "--model", "npm", "--encoder", "e", "--blocks", "b", "--masked", "m", "--out", "o",
         "--checkpoint-dir", "c"]


def _training(config: str) -> dict:
    return yaml.safe_load((ROOT / "config" / config).read_text())["training"]


@pytest.mark.parametrize("config, run_id", [
    ("config.yaml", "c0470a2fa43efce2c5593ad62dbaddfbdd55ef4442160f30fc563c234658d560"),
    ("paper.yaml", "61175ba25040a506cbb94aed8548100349d83ea0cf66f39cdde29ca06c8cd329"),
])
def test_the_run_id_of_a_config_s_training_settings_is_the_one_before_the_settings_moved(tmp_path, config, run_id):
    """The ids were computed by the code that kept the settings as TrainConfig fields: the same settings, encoder,
    tokenizer and data still name the same run folder, so existing checkpoints resume."""
    encoder = tmp_path / "encoder"
    encoder.mkdir()
    (encoder / "config.json").write_text('{"model_type": "bert"}')
    (encoder / "model.safetensors").write_bytes(b"weights")
    (encoder / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    (tmp_path / "blocks.npz").write_bytes(b"blocks")
    (tmp_path / "masked.npz").write_bytes(b"masked")
    cfg = TrainConfig(model="npm", encoder=str(encoder), shards=[(str(tmp_path / "blocks.npz"),
                                                                       str(tmp_path / "masked.npz"))],
                      out_dir="o", checkpoint_dir="c", training=TrainingSettings.from_mapping(_training(config)))
    assert run_record(cfg, 1, torch.device("cuda"))["run_id"] == run_id  # cuda: the precision as configured


def test_the_pretrain_rule_s_arguments_round_trip_through_train():
    for config in ("config.yaml", "paper.yaml", "released.yaml"):
        settings = TrainingSettings.from_mapping(_training(config))
        args = build_parser().parse_args(TRAIN + to_args(_training(config), TrainingSettings).split())
        # gpus_per_node is the launcher's (torchrun), not an option of train
        assert from_args(args, TrainingSettings) == dataclasses.replace(settings, gpus_per_node=1), config


def test_train_options_are_generated_from_the_settings():
    args = build_parser().parse_args(TRAIN)
    assert from_args(args, TrainingSettings) == TrainingSettings()
    names = {f.name for f in options(TrainingSettings)}
    assert names == {f.name for f in dataclasses.fields(TrainingSettings)} - {"gpus_per_node"}
    given = build_parser().parse_args(TRAIN + ["--pool", "256", "--pad-to", "0", "--schedule-steps", "7", "--compile"])
    assert (given.pool, given.pad_to, given.schedule_steps, given.compile) == (256, None, 7, True)
    assert to_args({"pad_to": None, "pool": "all"}, TrainingSettings).count("--pad-to 0 ") == 1  # null as 0


@pytest.mark.parametrize("flag, value", [("--pool", "quarter"), ("--pool", "0"), ("--lr", "0"), ("--steps", "0"),
                                         ("--precision", "fp8"), ("--pad-to", "-1")])
def test_train_rejects_a_value_outside_the_setting_s_range(capsys, flag, value):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(TRAIN + [flag, value])
    assert info.value.code == 2
    assert f"argument {flag}:" in capsys.readouterr().err


def test_a_bad_training_key_or_value_names_it():
    with pytest.raises(ValueError, match=r"training: unknown key\(s\) \['learning_rate'\]"):
        TrainingSettings.from_mapping({"learning_rate": 1e-4})
    with pytest.raises(ValueError, match="setting pool must be one of"):
        TrainingSettings(pool="quarter")
    with pytest.raises(ValueError, match="setting lines_per_rank must be >= 1"):
        check("lines_per_rank", 0, TrainingSettings)
    assert TrainingSettings(pool=256, pad_to=None).pool == 256
