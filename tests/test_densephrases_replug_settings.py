"""The config's `densephrases` and `replug` sections in one place (npm.settings.DensePhrasesSettings, ReplugSettings and
their subsections; docs/paper-map.md §D, §R3): the schema documents their keys without defaults
(tests/test_settings_schema.py), the steps of `npm-repro densephrases` / `npm-repro replug` take options generated from
them, and the rules pass them with to_args."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from npm.cli import build_parser
from npm.settings import (
    DensePhrasesQueryFt,
    DensePhrasesSettings,
    DensePhrasesTeacher,
    DensePhrasesTrain,
    LsrSettings,
    ReplugSettings,
    from_args,
    to_args,
)

ROOT = Path(__file__).resolve().parents[1]

# Each step with its required arguments, and the sections (with the step's subset) the rule passes to it.
DP_STEPS = {
    "train-teacher": (["--encoder", "e", "--train", "t", "--out", "o", "--checkpoint-dir", "c"],
                      [(DensePhrasesTeacher, "teacher", None)]),
    "filter": (["--teacher", "t", "--train", "t", "--out", "o"], []),
    "train": (["--encoder", "e", "--train", "t", "--out", "o", "--checkpoint-dir", "c"],
              [(DensePhrasesTrain, "train", None)]),
    "dump": (["--checkpoint", "m", "--blocks", "b", "--out", "o"], []),
    "index": (["--dump", "d", "--out", "o"], []),
    "query-ft": (["--checkpoint", "m", "--dump", "d", "--index", "i", "--train", "t", "--out", "o"],
                 [(DensePhrasesQueryFt, "query_ft", None)]),
    "evaluate": (["--checkpoint", "m", "--out", "o"], []),
    "search": (["--checkpoint", "m", "--dump", "d", "--index", "i", "q"], []),
}
REPLUG_STEPS = {
    "texts": ["--articles", "a", "--corpus", "c", "--out", "o"],
    "queries": ["--articles", "a", "--corpus", "c", "--exclude", "e", "--out", "o"],
    "train-lsr": ["--encoder", "e", "--lm", "l", "--blocks", "b", "--queries", "q", "--out", "o",
                  "--checkpoint-dir", "c"],
    "eval-lm": ["--lm", "l", "--texts", "t", "--blocks", "b", "--out", "o"],
}


def _section(config: str, name: str) -> dict:
    return yaml.safe_load((ROOT / "config" / config).read_text())[name]


@pytest.mark.parametrize("config", ["config.yaml", "paper.yaml"])
@pytest.mark.parametrize("step", list(DP_STEPS))
def test_the_densephrases_rules_arguments_round_trip_through_each_step(config, step):
    """What rule densephrases_* passes (to_args of the section and of the step's subsection) parses back into the
    config's settings: each key the step takes reaches it with the config's value."""
    values = DensePhrasesSettings.from_mapping(_section(config, "densephrases")).as_dict()
    required, subsections = DP_STEPS[step]
    line = to_args(values, DensePhrasesSettings, step)
    for section, key, _ in subsections:
        line += " " + to_args(values[key], section)
    args = build_parser().parse_args(["densephrases", step, *required, *line.split()])
    expected = DensePhrasesSettings.from_mapping(values)
    got = from_args(args, DensePhrasesSettings, step)
    for f in dataclasses.fields(DensePhrasesSettings):
        if f.metadata["option"] is not False and step in f.metadata["option"]:
            assert getattr(got, f.name) == getattr(expected, f.name), f.name
    for section, key, _ in subsections:
        assert from_args(args, section).as_dict() == {**section.from_mapping(values[key]).as_dict(),
                                                      **{f.name: None for f in dataclasses.fields(section)
                                                         if f.metadata["option"] is False}}


@pytest.mark.parametrize("step", list(REPLUG_STEPS))
def test_the_replug_rules_arguments_round_trip_through_each_step(step):
    values = ReplugSettings.from_mapping(_section("config.yaml", "replug")).as_dict()
    line = to_args(values, ReplugSettings, step) + " " + to_args(values["lsr"], LsrSettings, step)
    args = build_parser().parse_args(["replug", step, *REPLUG_STEPS[step], *line.split()])
    expected = ReplugSettings.from_mapping(values)
    for section, settings in ((ReplugSettings, expected), (LsrSettings, expected.lsr)):
        got = from_args(args, section, step)
        for f in dataclasses.fields(section):
            if f.metadata["option"] is not False and step in f.metadata["option"]:
                assert getattr(got, f.name) == getattr(settings, f.name), (section.SECTION, f.name)


def test_the_sections_fill_their_subsections_with_the_defaults():
    dp = DensePhrasesSettings.from_mapping({"corpus": "enwiki", "train": {"epochs": 2}})
    assert dp.train == DensePhrasesTrain(epochs=2) and dp.teacher == DensePhrasesTeacher() and dp.query_ft is None
    assert DensePhrasesSettings.from_mapping({"query_ft": {}}).query_ft == DensePhrasesQueryFt()
    assert ReplugSettings.from_mapping({"lsr": {"k": 4}}).as_dict()["lsr"] == {**LsrSettings().as_dict(), "k": 4}


@pytest.mark.parametrize("section, values, message", [
    (DensePhrasesSettings, {"train": {"epoch": 2}}, r"densephrases\.train: unknown key\(s\) \['epoch'\]"),
    (DensePhrasesSettings, {"train": {"negatives": "hard"}}, "setting negatives must be one of"),
    (DensePhrasesSettings, {"precision": "fp16"}, "setting precision must be one of"),
    (DensePhrasesSettings, {"rc": "squad"}, "setting rc must be one of"),
    (DensePhrasesSettings, {"query_ft": {"k": 0}}, "setting k must be >= 1"),
    (DensePhrasesSettings, {"filter_threshold": 1.0}, r"filter_threshold 1\.0 .*train\.lambda_filter is 0"),
    (DensePhrasesSettings, {"rc_filter_threshold": -2.0}, r"rc_filter_threshold -2\.0 .*train\.lambda_filter is 0"),
    (DensePhrasesSettings, {"vectors": "index", "refine_factor": 10}, "refine_factor 10 re-ranks by the fp16 dump"),
    (DensePhrasesSettings, {"dump_passages": "paragraphs"}, "setting dump_passages must be one of"),
    (DensePhrasesSettings, {"dump_max_tokens": 64, "dump_stride": 63}, r"dump_stride 63 would skip .* at most 62"),
    (DensePhrasesSettings, {"max_passage_tokens": 64, "doc_stride": 63}, r"doc_stride 63 would skip .* at most 62"),
    (DensePhrasesSettings, {"train": {"pre_batch": 0}}, r"train\.pre_batch 0 .* in-batch negatives alone"),
    (DensePhrasesSettings, {"train": {"negatives": "none", "pre_batch_epochs": 0}, "negatives_ablation": ["pre_batch"]},
     r"train\.pre_batch_epochs 0 train with in-batch negatives alone"),
    (ReplugSettings, {"lsr": {"warmup_ratio": 1.5}}, "setting warmup_ratio must be <= 1"),
    (ReplugSettings, {"temperature": 0}, "setting temperature must be > 0"),
])
def test_bad_values_are_rejected_naming_the_setting(section, values, message):
    with pytest.raises(ValueError, match=message):
        section.from_mapping(values)


@pytest.mark.parametrize("argv", [
    ["densephrases", "index", "--dump", "d", "--out", "o", "--nprobe", "0"],
    ["densephrases", "train", "--encoder", "e", "--train", "t", "--out", "o", "--checkpoint-dir", "c",
     "--lambda-neg", "-1"],
    ["replug", "train-lsr", "--encoder", "e", "--lm", "l", "--blocks", "b", "--queries", "q", "--out", "o",
     "--checkpoint-dir", "c", "--warmup-ratio", "2"],
])
def test_a_bad_option_is_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2 and "must be" in capsys.readouterr().err


@pytest.mark.parametrize("value", [0.0, None, -2.0])
def test_a_zero_filter_threshold_is_a_threshold_and_null_is_no_filter(value):
    """A filter threshold may be any logit, 0 too: the options the workflow passes must not read 0 as null (the
    nullable counts do: their 0 is no valid value)."""
    values = {"filter_threshold": value, "compressed_filter_threshold": value, "rc_filter_threshold": value,
              "train": {"lambda_filter": 1.0}}
    for step, required, name in (("dump", ["--blocks", "b"], "filter_threshold"),
                                 ("trim", ["--dump", "d"], "compressed_filter_threshold"),
                                 ("evaluate", [], "rc_filter_threshold")):
        line = to_args(values, DensePhrasesSettings, step)
        args = build_parser().parse_args(["densephrases", step, *required, "--out", "o", "--checkpoint", "c",
                                          *line.split()])
        got = from_args(args, DensePhrasesSettings, step)
        assert getattr(got, name) == value
