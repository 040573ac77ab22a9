"""The config's `data`, `masking` and `datastore` sections in one place (npm.settings.DataSettings, MaskingSettings,
DatastoreSettings; paper 3.2.1, 4.1, 5.3, A.2; docs/paper-map.md §2.1-§2.3, §3.1-§3.5): the schema documents their
keys without defaults (tests/test_settings_schema.py), the options of `shard-documents`, `tokenize-blocks`,
`batch-blocks`, `mask-batches`, `embed` and `build-faiss-index` are generated from them, and the rules pass each
section with to_args."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from npm.cli import build_parser, main
from npm.data.batches import make_batches
from npm.data.blocks import tokenize_documents
from npm.datastore.bm25 import DEFAULT_MARKERS
from npm.datastore.store import STOPWORD_LISTS, STOPWORDS_DEFAULT
from npm.io import load_npz, save_npz
from npm.masking import mask_shard
from npm.settings import DataSettings, DatastoreSettings, MaskingSettings, check, from_args, options, to_args
from tests.conftest import lee_corpus_lines

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = (DataSettings, MaskingSettings, DatastoreSettings)
# each command that takes options of a section, with the other arguments it needs (parsing only)
COMMANDS = {
    "shard-documents": (DataSettings, ["shard-documents", "--docs", "d", "--out-dir", "o", "--shards", "1"]),
    "tokenize-blocks": (DataSettings, ["tokenize-blocks", "--docs", "d", "--tokenizer", "t", "--out", "o"]),
    "batch-blocks": (DataSettings, ["batch-blocks", "--blocks", "b", "--out", "o"]),
    "import-corpus": (DataSettings, ["import-corpus", "--folder", "f", "--stem", "s", "--tokenizer", "t",
                                     "--out", "o"]),
    "mask-batches": (MaskingSettings, ["mask-batches", "--blocks", "b", "--batches", "c", "--out", "o"]),
    "embed": (DatastoreSettings, ["embed", "--out", "o"]),
    "embed --step plan": (DatastoreSettings, ["embed", "--step", "plan", "--out", "o"]),  # rule plan_datastore
    "embed --step shard": (DatastoreSettings, ["embed", "--step", "shard", "--shard", "0", "--out", "o"]),
    "build-faiss-index": (DatastoreSettings, ["build-faiss-index", "--datastore", "d", "--out", "o"]),
}


def _config(name: str) -> dict:
    return yaml.safe_load((ROOT / "config" / name).read_text())


@pytest.mark.parametrize("config", ["config.yaml", "paper.yaml", "released.yaml"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_the_rules_arguments_round_trip_through_the_command(config, command):
    """What a rule passes (to_args of the config's section for its command) parses back to the config's values of
    exactly the keys that command takes; the others keep their defaults."""
    section, base = COMMANDS[command]
    values = _config(config).get(section.SECTION)
    args = build_parser().parse_args(base + to_args(values, section, command).split())
    taken = {f.name for f in options(section, command)}
    expected = dataclasses.replace(section(), **{k: v for k, v in (values or {}).items() if k in taken})
    assert from_args(args, section, command) == expected


def test_each_option_belongs_to_a_command_and_parses_to_its_default():
    for command, (section, base) in COMMANDS.items():
        assert from_args(build_parser().parse_args(base), section, command) == section(), command
    for section in SECTIONS:
        taken = {f.name for command, (s, _) in COMMANDS.items() if s is section for f in options(s, command)}
        read_by_workflow = {f.name for f in dataclasses.fields(section) if f.metadata["option"] is False}
        assert taken | read_by_workflow == {f.name for f in dataclasses.fields(section)}, section.SECTION
    assert {f.name for f in options(DataSettings, "tokenize-blocks")} == {"max_seq_length", "word_boundaries"}
    assert {f.name for f in options(DataSettings, "import-corpus")} == {"word_boundaries"}
    assert {f.name for f in options(DatastoreSettings, "embed --step shard")} == {"batch_blocks"}
    assert {f.name for f in options(DatastoreSettings, "build-faiss-index")} == {
        "faiss_factory", "faiss_metric", "faiss_train_sample", "faiss_train_draw", "nprobe", "ef_search"}
    assert {f.name for f in options(DatastoreSettings, "embed --step plan")} == {
        "shards", "drop_stopwords", "stopwords", "precision"}


def test_the_defaults_of_the_datastore_modules_are_the_settings():
    f = {f.name: f for f in dataclasses.fields(DatastoreSettings)}
    assert f["stopwords"].default == STOPWORDS_DEFAULT
    assert set(f["stopwords"].metadata["choices"]) == set(STOPWORD_LISTS)
    assert f["bm25_markers"].default == DEFAULT_MARKERS


def test_no_rule_of_these_sections_substitutes_single_keys():
    """Each rule passes its section whole with to_args (`{params.settings}`), never `{params.m[ratio]}` per key."""
    for name in ("data.smk", "corpus.smk", "index.smk"):
        text = (ROOT / "workflow" / "rules" / name).read_text()
        assert not re.search(r"\{params\.\w+\[\w+\]", text), name
        assert not re.search(r'config\["(data|masking)"\]\["', text), name
    assert "to_args(config[\"masking\"], MaskingSettings)" in (ROOT / "workflow" / "rules" / "data.smk").read_text()


@pytest.mark.parametrize("command, flag, value", [
    ("mask-batches", "--max-spans-per-sequence", "100"),  # the schema's enum [64, 128]; the CLI took any number
    ("mask-batches", "--ratio", "1.5"),
    ("mask-batches", "--p", "0"),
    ("tokenize-blocks", "--max-seq-length", "5000"),
    ("batch-blocks", "--batch-size", "1"),
    ("shard-documents", "--shuffle-buffer", "0"),
    ("embed", "--stopwords", "nltk"),
    ("build-faiss-index", "--nprobe", "0"),
])
def test_a_command_rejects_a_value_outside_the_setting_s_range(capsys, command, flag, value):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(COMMANDS[command][1] + [flag, value])
    assert info.value.code == 2
    assert f"argument {flag}:" in capsys.readouterr().err


def test_a_bad_key_or_value_names_it():
    with pytest.raises(ValueError, match=r"masking: unknown key\(s\) \['span_ratio'\]"):
        MaskingSettings.from_mapping({"span_ratio": 0.2})
    with pytest.raises(ValueError, match=r"setting max_spans_per_sequence must be one of \[64, 128\], got 100"):
        MaskingSettings(max_spans_per_sequence=100)
    with pytest.raises(ValueError, match="setting max_seq_length must be <= 4096"):
        check("max_seq_length", 8192, DataSettings)
    with pytest.raises(ValueError, match="setting stopwords must be one of"):
        DatastoreSettings(stopwords="nltk")
    assert MaskingSettings(max_spans_per_sequence=64).max_spans_per_sequence == 64


def test_mask_batches_masks_with_the_settings_it_is_given(tmp_path, bpe_tokenizer):
    """`npm-repro mask-batches` with the rule's options writes what mask_shard writes with the same MaskingSettings
    (the code receives the section, not renamed keywords); another seed gives other spans."""
    lines = lee_corpus_lines()
    docs = [{"id": f"doc{k}", "units": [" " + u for u in lines[k:k + 10]]} for k in range(0, 80, 10)]
    blocks = tokenize_documents(docs, bpe_tokenizer)
    save_npz(tmp_path / "blocks.npz", **blocks)
    save_npz(tmp_path / "batches.npz", batches=make_batches(blocks["block_doc"], batch_size=4))
    masking = MaskingSettings(seed=7, ratio=0.3, max_spans_per_sequence=64)
    inputs = ["--blocks", str(tmp_path / "blocks.npz"), "--batches", str(tmp_path / "batches.npz")]
    assert main(["mask-batches", *inputs, *to_args(masking.as_dict(), MaskingSettings).split(),
                 "--out", str(tmp_path / "cli.npz")]) in (0, None)
    summary = mask_shard(tmp_path / "blocks.npz", tmp_path / "batches.npz", tmp_path / "api.npz", masking=masking)
    assert summary["seed"] == 7 and summary["params"]["ratio"] == 0.3
    cli, api = load_npz(tmp_path / "cli.npz"), load_npz(tmp_path / "api.npz")
    assert len(api["spans"]) > 0
    for key in ("batches", "span_offsets", "spans"):
        assert np.array_equal(cli[key], api[key]), key
    mask_shard(tmp_path / "blocks.npz", tmp_path / "batches.npz", tmp_path / "other.npz",
               masking=dataclasses.replace(masking, seed=8))
    assert not np.array_equal(load_npz(tmp_path / "other.npz")["spans"], api["spans"])
