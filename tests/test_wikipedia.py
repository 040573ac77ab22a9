"""Wikipedia -> documents (paper-map §2.1, original process_wiki.py), on gensim's real MediaWiki excerpt."""

import bz2
import importlib.util
import json
import logging
from pathlib import Path

import pytest

from npm.data import wikipedia
from npm.data.documents import Stats, extract_documents
from npm.data.wikipedia import iter_pages, page_drop_reason, page_units, read_kilt, read_mediawiki, wikitext_paragraphs
from npm.io import read_jsonl

GENSIM_DUMP = Path(importlib.util.find_spec("gensim").origin).parent.joinpath(
    "test", "test_data", "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")


@pytest.fixture(scope="module")
def gensim_docs(tmp_path_factory):
    """The excerpt extracted once (206 real pages; the wikitext parse takes a few seconds)."""
    out = tmp_path_factory.mktemp("wiki") / "docs.jsonl.gz"
    summary = extract_documents("mediawiki", GENSIM_DUMP, out)
    return summary, {d["title"]: d for d in read_jsonl(out)}


def export_xml(pages, version="0.11"):
    """A small MediaWiki export; ``pages`` = (id, title, ns, wikitext or None)."""
    body = "".join(
        f"<page><title>{title}</title><ns>{ns}</ns><id>{pid}</id><revision><id>{pid}</id>"
        f"<timestamp>2019-08-01T00:00:00Z</timestamp>"
        + (f'<text xml:space="preserve">{text}</text>' if text is not None else "")
        + "</revision></page>\n"
        for pid, title, ns, text in pages)
    xmlns = f"http://www.mediawiki.org/xml/export-{version}/"
    return f'<mediawiki xmlns="{xmlns}" version="{version}">\n{body}</mediawiki>\n'


# ------------------------------------------------------------------------------------- real excerpt


def test_excerpt_counts_redirects_namespaces_and_dropped_pages(gensim_docs):
    summary, docs = gensim_docs
    assert sum(1 for _ in iter_pages(GENSIM_DUMP)) == 206
    assert summary["redirects"] == 99
    assert summary["other_namespaces"] == 1
    assert summary["dropped"] == 10  # 7 disambiguation, 2 "List of", the title "A"
    assert summary["skipped"] == 0
    assert summary["documents"] == len(docs) == 206 - 99 - 1 - 10 == 96
    assert "AccessibleComputing" not in docs  # the first page, a redirect


def test_known_article_units_start_with_title_and_double_space(gensim_docs):
    anarchism = gensim_docs[1]["Anarchism"]
    assert anarchism["id"] == "12" and anarchism["source"] == "wikipedia"
    assert anarchism["date"] == "2016-04-22T10:19:33Z"  # revision timestamp
    assert all(u.startswith("Anarchism. ") for u in anarchism["units"])
    assert anarchism["units"][0].startswith("Anarchism.  Anarchism Anarchism is a political philosophy")


def test_sections_are_units_with_their_headers(gensim_docs):
    units = gensim_docs[1]["Anarchism"]["units"]
    assert units[1].startswith("Anarchism.  Etymology and terminology. The term anarchism is a compound word")
    assert "Anarchism.  History." in units
    assert units[-1] == "Anarchism. "  # the "External links" header opened a unit, then stopped the page


def test_no_wikitext_markup_left(gensim_docs):
    text = "\n".join(u for d in gensim_docs[1].values() for u in d["units"])
    for markup in ("{{", "}}", "[[", "]]", "<ref", "</ref", "<!--", "{|", "|}", "''", "thumb|", "Category:"):
        assert markup not in text, markup


# -------------------------------------------------------------------------------- wikitext conversion


def test_wikitext_to_kilt_paragraphs():
    text = ("{{Infobox person|name=X}}'''Ada''' was a [[mathematician|maths person]]<ref>Cite {{cite web}}</ref> "
            "in [[London]].<!-- hidden --> [[File:Ada.jpg|thumb|A [[portrait]]]]\n\n"
            "== Early life ==\nShe was born.&nbsp;Really.\n* first [[item]]\n** nested\n"
            '{| class="wikitable"\n| cell\n|}\n[[Category:Mathematicians]] [[fr:Ada Lovelace]]')
    assert wikitext_paragraphs("Ada", text) == [
        "Ada", "Ada was a maths person in London.", "Section::::Early life.", "She was born. Really.",
        "BULLET::::- first item", "BULLET::::- nested"]


def test_unbalanced_italics_inside_a_ref_do_not_leak_the_ref():
    text = "Quote.<ref>[[Simon Critchley#Book|Book]]'' by Simon. 2007.</ref>\n\nNext."
    assert wikitext_paragraphs("T", text) == ["T", "Quote.", "Next."]


# ----------------------------------------------------------------------------- the paper-map §2.1 rule


@pytest.mark.parametrize("title, paragraphs, reason", [
    ("Mercury (disambiguation)", ["Mercury (disambiguation)", "Mercury is a planet."], "disambiguation"),
    ("List of rivers", ["List of rivers", "Rivers are listed."], "list"),
    ("Lonely", ["Lonely"], "no text"),
    ("A", ["A", "A is a letter."], "short title"),
    ("Mercury", ["Mercury", "Mercury may refer to:"], "disambiguation"),
    ("Mercury", ["Mercury", "Mercury may also refer to:"], "disambiguation"),
])
def test_drop_rules_on_kilt_records(title, paragraphs, reason):
    assert page_drop_reason(title, paragraphs) == reason
    assert page_units(title, paragraphs) is None


def test_kept_page_is_split_at_sections_and_stops_at_external_links():
    paragraphs = ["Mercury\n", "Mercury is a planet.\n", "It is small.\n", "Section::::Orbit.\n",
                  "BULLET::::- Fast.\n", "\n", "Section::::Moons.\n", "None.\n", "External links\n", "Site.\n"]
    assert page_units("Mercury", paragraphs) == [
        "Mercury.  Mercury Mercury is a planet. It is small.", "Mercury.  Orbit. - Fast.", "Mercury.  Moons. None."]
    assert page_units("Mercury", paragraphs, double_space_quirk=False)[1] == "Mercury. Orbit. - Fast."


def test_kilt_jsonl_goes_through_the_same_rule_and_skips_bad_lines(tmp_path, caplog):
    records = [{"_id": "1", "wikipedia_title": "Mercury", "text": ["Mercury\n", "Mercury is a planet.\n"]},
               {"_id": "2", "wikipedia_title": "List of planets", "text": ["List of planets\n", "Mercury.\n"]},
               {"_id": "3", "wikipedia_title": "Venus"}]
    path = tmp_path / "kilt.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n{not json\n")
    stats = Stats()
    with caplog.at_level(logging.WARNING):
        docs = list(read_kilt(path, stats))
    assert docs == [{"id": "1", "title": "Mercury", "units": ["Mercury.  Mercury Mercury is a planet."],
                     "date": None, "source": "wikipedia"}]
    assert stats.counts["dropped"] == 1 and stats.counts["skipped"] == 2
    assert f"{path}:3" in caplog.text and f"{path}:4" in caplog.text


# -------------------------------------------------------------------------------------- robustness


def test_any_export_version_and_plain_xml(tmp_path):
    path = tmp_path / "dump.xml"
    path.write_text(export_xml([(5, "Mercury", 0, "Mercury is a [[planet]].\n\n== Orbit ==\nFast."),
                                (6, "Talk:Mercury", 1, "Chat."),
                                (7, "Quicksilver", 0, "#redirect [[Mercury]]")], version="0.3"))
    stats = Stats()
    docs = list(read_mediawiki(path, stats))
    assert [(d["id"], d["title"], d["date"]) for d in docs] == [("5", "Mercury", "2019-08-01T00:00:00Z")]
    assert docs[0]["units"] == ["Mercury.  Mercury Mercury is a planet.", "Mercury.  Orbit. Fast."]
    assert stats.counts["redirects"] == 1 and stats.counts["other_namespaces"] == 1


def test_page_the_converter_fails_on_is_skipped_and_counted(tmp_path, monkeypatch, caplog):
    path = tmp_path / "dump.xml.bz2"
    path.write_bytes(bz2.compress(export_xml([(1, "Good", 0, "Good text."), (2, "Bad", 0, "Bad text."),
                                              (3, "No text", 0, None)]).encode()))
    convert = wikipedia.wikitext_paragraphs

    def failing(title, text):
        if title == "Bad":
            raise RecursionError("maximum recursion depth exceeded")
        return convert(title, text)

    monkeypatch.setattr(wikipedia, "wikitext_paragraphs", failing)
    with caplog.at_level(logging.WARNING):
        summary = extract_documents("mediawiki", path, tmp_path / "docs.jsonl.gz")
    assert summary["documents"] == 1
    assert summary["skipped"] == 2 and summary["skipped_ids"] == ["2", "3"]
    assert "page 2 ('Bad')" in caplog.text and "RecursionError" in caplog.text


def test_truncated_bz2_gives_a_clear_error_and_no_output(tmp_path, monkeypatch):
    data = GENSIM_DUMP.read_bytes()
    truncated = tmp_path / "truncated.xml.bz2"
    truncated.write_bytes(data[: len(data) // 2])
    monkeypatch.setattr(wikipedia, "wikitext_paragraphs", lambda title, text: [title, text[:50]])  # I/O only
    out = tmp_path / "docs.jsonl.gz"
    with pytest.raises(ValueError, match=r"truncated\.xml\.bz2: truncated or corrupt .* stopped after \d+ pages"):
        extract_documents("mediawiki", truncated, out)
    assert list(tmp_path.iterdir()) == [truncated]
