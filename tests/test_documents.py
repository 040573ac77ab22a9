"""extract_documents / shard_documents: formats, package paths, seeded buffer shuffle and contiguous shards (2.1)."""

import json
from collections import Counter
from pathlib import Path

import pytest

from npm.data.documents import extract_documents, shard_documents
from npm.io import read_jsonl, resolve_package_path, write_jsonl


def kilt_file(path, titles):
    path.write_text("".join(json.dumps({"_id": str(i), "wikipedia_title": t, "text": [t, f"{t} is a thing."]}) + "\n"
                            for i, t in enumerate(titles)))
    return path


def docs_file(path, n):
    write_jsonl(path, ({"id": str(i), "title": f"T{i}", "units": [f"T{i}. text"], "date": None, "source": "wikipedia"}
                       for i in range(n)))
    return path


# ------------------------------------------------------------------------------------------ sources


def test_pypi_path_resolves_inside_the_installed_package():
    path = Path(resolve_package_path("pypi:gensim/test/test_data/lee_background.cor"))
    assert path.is_file() and path.parts[-4:] == ("gensim", "test", "test_data", "lee_background.cor")
    assert str(resolve_package_path("data/raw/x.xml.bz2")) == "data/raw/x.xml.bz2"


def test_pypi_path_errors_name_the_package_or_the_file():
    with pytest.raises(FileNotFoundError, match="'no_such_package_xyz' is not installed"):
        resolve_package_path("pypi:no_such_package_xyz/data.json")
    with pytest.raises(FileNotFoundError, match="does not exist inside the installed package 'gensim'"):
        resolve_package_path("pypi:gensim/test/test_data/missing.bz2")


def test_unknown_format_lists_the_allowed_ones(tmp_path):
    with pytest.raises(ValueError, match="unknown document format 'wiki'; allowed: mediawiki, kilt, cc_news"):
        extract_documents("wiki", tmp_path, tmp_path / "out.jsonl.gz")


def test_summary_and_limit(tmp_path):
    src = kilt_file(tmp_path / "kilt.jsonl", ["Alpha", "Beta", "List of things", "Gamma"])
    summary = extract_documents("kilt", src, tmp_path / "docs.jsonl.gz", limit=2)
    assert summary["documents"] == 2 and summary["units"] == 2
    assert summary["characters"] == len("Alpha.  Alpha Alpha is a thing.") + len("Beta.  Beta Beta is a thing.")
    assert summary["skipped"] == 0 and summary["skipped_ids"] == []
    assert [d["title"] for d in read_jsonl(tmp_path / "docs.jsonl.gz")] == ["Alpha", "Beta"]


def test_no_documents_is_an_error_naming_the_source_and_writes_nothing(tmp_path):
    src = kilt_file(tmp_path / "kilt.jsonl", ["List of things", "X"])
    out = tmp_path / "docs.jsonl.gz"
    with pytest.raises(ValueError, match=r"kilt source .*kilt\.jsonl gave no documents"):
        extract_documents("kilt", src, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kilt.jsonl"]


# ------------------------------------------------------------------------------------------- shards


def read_ids(paths):
    return [[d["id"] for d in read_jsonl(p)] for p in paths]


def test_shards_are_deterministic_for_a_seed(tmp_path):
    src = docs_file(tmp_path / "docs.jsonl.gz", 50)
    a = [tmp_path / "a" / f"shard{i}.jsonl.gz" for i in range(3)]
    b = [tmp_path / "b" / f"shard{i}.jsonl.gz" for i in range(3)]
    c = [tmp_path / "c" / f"shard{i}.jsonl.gz" for i in range(3)]
    shard_documents(src, a, seed=2022, shuffle_buffer=20)
    shard_documents(src, b, seed=2022, shuffle_buffer=20)
    shard_documents(src, c, seed=7, shuffle_buffer=20)
    assert read_ids(a) == read_ids(b) != read_ids(c)


def test_shards_hold_every_document_once_in_contiguous_parts_per_buffer(tmp_path):
    src = docs_file(tmp_path / "docs.jsonl.gz", 23)
    outs = [tmp_path / f"shard{i}.jsonl.gz" for i in range(4)]
    summary = shard_documents(src, outs, seed=2022, shuffle_buffer=10)
    # buffers of 10, 10, 3 -> parts of ceil(10/4)=3: 3,3,3,1 | 3,3,3,1 | ceil(3/4)=1: 1,1,1,0 (original save_lines)
    assert summary["documents"] == 23 and summary["per_shard"] == [7, 7, 7, 2]
    ids = read_ids(outs)
    assert Counter(i for shard in ids for i in shard) == Counter(str(i) for i in range(23))
    first_buffer = {str(i) for i in range(10)}
    assert all(set(shard[:3 if k < 3 else 1]) <= first_buffer for k, shard in enumerate(ids))
    assert [d for shard in ids for d in shard] != [str(i) for i in range(23)]  # shuffled


def test_no_shuffle_keeps_the_date_order_split_contiguously(tmp_path):
    src = docs_file(tmp_path / "docs.jsonl", 10)
    outs = [tmp_path / f"shard{i}.jsonl" for i in range(3)]
    summary = shard_documents(src, outs, seed=2022, shuffle=False)
    assert summary["per_shard"] == [4, 4, 2]
    assert read_ids(outs) == [["0", "1", "2", "3"], ["4", "5", "6", "7"], ["8", "9"]]


def test_failed_sharding_leaves_no_shard_files(tmp_path):
    src = tmp_path / "empty.jsonl.gz"
    write_jsonl(src, [])
    outs = [tmp_path / "shards" / f"shard{i}.jsonl.gz" for i in range(2)]
    with pytest.raises(ValueError, match="empty.jsonl.gz holds no documents"):
        shard_documents(src, outs, seed=2022)
    assert list((tmp_path / "shards").iterdir()) == []
