"""Issue 12 ("Trustworthy runs"), data faults: each bad input is skipped with a counted warning or is one clear error
naming the file, the line or record, the field and what to do (items 5 and 8 a-d)."""

from __future__ import annotations

import gzip
import json
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from npm.data.batches import build_batches
from npm.data.blocks import block_text, build_blocks, load_blocks
from npm.data.documents import Stats, extract_documents
from npm.data.wikipedia import read_kilt
from npm.io import load_npz, read_jsonl, save_npz, write_jsonl
from npm.masking import mask_shard
from npm.report.tables import load_paper_values
from npm.tasks.registry import read_registry_file
from npm.training.data import BatchLines
from tests.conftest import WORDPIECE, lee_corpus_lines
from tests.workflow_api import ROOT

SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


def news(title, date):
    return {"title": title, "text": "Body.", "language": "en", "date_publish": date, "url": f"https://x/{title}"}


def test_ccnews_impossible_dates_are_skipped_with_file_line_field_and_counted(tmp_path, caplog):
    """Item 5: month 13, day 45 or a file named 20191399 made documents dated so; now they are skipped with a
    warning naming file, line and field, and counted (records_bad_date, files_bad_date) in the summary."""
    src = tmp_path / "raw"
    src.mkdir()
    bad_name = src / "CC-NEWS-20191399000000-00000.json.gz"
    with gzip.open(bad_name, "wt", encoding="utf-8") as f:
        f.write(json.dumps(news("InBadFile", "2019-02-01")) + "\n")
    undated = src / "news.jsonl"
    undated.write_text("".join(json.dumps(news(t, d)) + "\n" for t, d in
                               [("Month13", "2019-13-01 10:00:00"), ("Day45", "2019-02-45"), ("Ok", "2019-02-01")]))
    with caplog.at_level(logging.WARNING):
        summary = extract_documents("cc_news", src, tmp_path / "docs.jsonl")
    docs = list(read_jsonl(tmp_path / "docs.jsonl"))
    assert [(d["id"], d["units"]) for d in docs] == [("20190201", ["Ok. Body."])]
    assert summary["records_bad_date"] == 2 and summary["files_bad_date"] == 1 and summary["skipped"] == 2
    assert f"{undated}:1" in caplog.text and f"{undated}:2" in caplog.text and "date_publish" in caplog.text
    assert "2019-13-01" in caplog.text and "2019-02-45" in caplog.text
    assert str(bad_name) in caplog.text and "20191399" in caplog.text and "file name" in caplog.text


def test_documents_without_tokens_are_skipped_with_a_warning_and_counted(tmp_path, caplog):
    """Item 5: a document with zero tokens (no units, empty units, only mask-token units) became an empty block or
    vanished silently; now it is skipped with a warning naming file and line, and counted as documents_empty."""
    docs = [{"id": "a", "units": ["Hello world."]}, {"id": "b", "units": []}, {"id": "c", "units": ["", "  "]},
            {"id": "d", "units": ["[MASK] only here"]}, {"id": "e", "units": ["Second real one."]}]
    path = tmp_path / "docs.jsonl"
    write_jsonl(path, docs)
    with caplog.at_level(logging.WARNING):
        summary = build_blocks(path, tmp_path / "blocks.npz", WORDPIECE)
    blocks = load_blocks(tmp_path / "blocks.npz", text=True)
    texts = [block_text(blocks, b) for b in range(len(blocks["block_doc"]))]
    assert texts == ["Hello world.", "Second real one."]
    assert blocks["doc_ids"][blocks["block_doc"]].tolist() == ["a", "e"]
    assert summary["documents"] == 5 and summary["documents_empty"] == 3 and summary["blocks"] == 2
    for line, doc_id in ((2, "b"), (3, "c"), (4, "d")):
        assert re.search(rf"{re.escape(str(path))}:{line}: .*document '{doc_id}'.*no token", caplog.text)


BROKEN_YAML = "tasks:\n  cr:\n    family: closed\n    files: [a.txt\n  sst2:\n    family: closed\n"


@pytest.mark.parametrize("loader", [read_registry_file, load_paper_values], ids=["tasks.yaml", "paper_values.yaml"])
def test_yaml_syntax_error_names_file_line_and_column(tmp_path, loader):
    """Item 8a: a YAML syntax error in config/tasks.yaml or paper_values.yaml was a bare yaml ParserError; now it is
    a ValueError "FILE:LINE:COL: not valid YAML (problem); fix ..."."""
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN_YAML, encoding="utf-8")
    pattern = rf"^{re.escape(str(path))}:5:7: not valid YAML \(.+ starts at line 4, column 12\); fix"
    with pytest.raises(ValueError, match=pattern):
        loader(path)


def test_snakemake_names_the_config_file_and_line_of_a_yaml_syntax_error(tmp_path):
    """Item 8a: a YAML syntax error in the workflow config (config/config.yaml) made Snakemake print only "Config file
    is not valid JSON or YAML"; now the dry run fails naming the file, line and column."""
    for name in ("Snakefile", "workflow", "config"):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, tmp_path / name)
    config = tmp_path / "config" / "config.yaml"
    lines = config.read_text(encoding="utf-8").splitlines()
    k = next(i for i, line in enumerate(lines) if line.startswith("  tokenizer:"))
    lines[k] = "  tokenizer: [unclosed"
    config.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = subprocess.run([SNAKEMAKE, "-n", "--cores", "1"], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode != 0
    assert re.search(rf"{re.escape(str(config))}:\d+:\d+: not valid YAML \(.*starts at line {k + 1}, column 14\)",
                     out.stdout + out.stderr), out.stdout + out.stderr


def kilt_line(i):
    return json.dumps({"_id": str(i), "wikipedia_title": f"T{i}", "text": [f"T{i}\n", "Some text.\n"]}) + "\n"


@pytest.mark.parametrize("reader", ["read_jsonl", "read_kilt", "extract_kilt", "extract_cc_news"])
@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_non_utf8_bytes_are_an_error_naming_file_line_and_byte_offset(tmp_path, reader, suffix):
    """Item 8b: non-UTF-8 bytes in a JSONL file (KILT, CC-News, any read_jsonl) were a bare UnicodeDecodeError;
    now they are a ValueError "FILE:LINE: not UTF-8 (byte offset N ...)"."""
    first = kilt_line(1).encode()
    second = kilt_line(2).encode().replace(b"Some", b"S\xe9me")
    path = tmp_path / f"CC-NEWS-20190201000000-00000{suffix}"
    (gzip.open if suffix.endswith(".gz") else open)(path, "wb").write(first + second)
    offset = len(first) + second.index(b"\xe9")
    run = {"read_jsonl": lambda: list(read_jsonl(path)), "read_kilt": lambda: list(read_kilt(path, Stats())),
           "extract_kilt": lambda: extract_documents("kilt", path, tmp_path / "docs.jsonl"),
           "extract_cc_news": lambda: extract_documents("cc_news", path, tmp_path / "docs.jsonl")}[reader]
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:2: not UTF-8 \(byte offset {offset}\b.*\)"):
        run()


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    """A real blocks / batches / span-masked shard laid out as the workflow lays it out (data/{stage}/c/...)."""
    root = tmp_path_factory.mktemp("shard")
    lines = lee_corpus_lines()
    write_jsonl(root / "docs.jsonl", [{"id": str(i), "units": lines[i * 5:(i + 1) * 5]} for i in range(12)])
    paths = {k: root / "data" / k / "c" / "shard0.npz" for k in ("blocks", "batches", "masked")}
    build_blocks(root / "docs.jsonl", paths["blocks"], WORDPIECE, max_seq_length=64)
    build_batches(paths["blocks"], paths["batches"], batch_size=4)
    mask_shard(paths["blocks"], paths["batches"], paths["masked"], mode="span")
    return paths


@pytest.mark.parametrize("stage, rule, read", [
    ("blocks", "tokenize_blocks", lambda p, s: load_blocks(p)),
    ("batches", "batch_blocks", lambda p, s: load_npz(p)),
    ("blocks", "tokenize_blocks", lambda p, s: mask_shard(p, s["batches"], p.parent / "m.npz")),
    ("masked", "mask_batches", lambda p, s: BatchLines([(s["blocks"], p)])),
], ids=["load_blocks", "load_npz", "mask_shard", "BatchLines"])
def test_truncated_npz_names_the_file_and_the_rule_to_rerun(tmp_path, shard, stage, rule, read):
    """Item 8c: an .npz cut to half its bytes was a bare zipfile.BadZipFile in every reader; now it is a ValueError
    "FILE is truncated or not an .npz file (BadZipFile: ...); delete it and re-run the rule that makes it (RULE)"."""
    paths = {k: tmp_path / "data" / k / "c" / "shard0.npz" for k in shard}
    for k, p in shard.items():
        paths[k].parent.mkdir(parents=True)
        shutil.copy(p, paths[k])
    data = paths[stage].read_bytes()
    paths[stage].write_bytes(data[:len(data) // 2])
    with pytest.raises(ValueError, match=rf"^{re.escape(str(paths[stage]))} is truncated or not an \.npz file "
                                         rf"\(BadZipFile: .+\); delete it and re-run the rule that makes it \({rule}"):
        read(paths[stage], paths)


@pytest.mark.parametrize("change, what", [
    (lambda s: s.__setitem__((3, 1), 70), "start 70"),
    (lambda s: s.__setitem__((3, 2), 60), "length 60"),
    (lambda s: s.__setitem__((3, 1), -1), "start -1"),
    (lambda s: s.__setitem__((3, 0), 4), "sequence 4"),
], ids=["start-past-end", "end-past-end", "negative-start", "no-such-sequence"])
def test_spans_outside_their_rows_are_an_error_naming_file_line_and_span(tmp_path, shard, change, what):
    """Item 8d: a masked span outside its sequence was read for training (garbage targets or an IndexError deep in
    collation); now BatchLines rejects it at load time naming the file, the batch line and the span."""
    masked = load_npz(shard["masked"])
    change(masked["spans"])
    line = int(np.searchsorted(masked["span_offsets"], 3, side="right") - 1)
    save_npz(tmp_path / "masked.npz", **masked)
    with pytest.raises(ValueError, match=rf"masked.npz: batch line {line}, span 3 \(.*{what}.*\) lies outside"):
        BatchLines([(shard["blocks"], tmp_path / "masked.npz")])
