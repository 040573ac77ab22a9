"""Wikipedia pages -> documents whose units are sections (paper section 4.1; paper-map §2.1).

Two inputs, one rule:

* a MediaWiki XML export (``.xml.bz2`` or ``.xml``, any export version), streamed with ``iterparse``;
  wikitext is turned into KILT-style paragraphs by ``wikitext_paragraphs`` (mwparserfromhell): paragraph 0
  is the title, a heading ``== H ==`` becomes ``"Section::::H."``, a list item ``"BULLET::::- text"``;
  templates, refs, tables, comments and file/image/category links are dropped, link text is kept;
* a KILT knowledge-source JSONL (the paper's input): ``{"_id", "wikipedia_title", "text": [paragraphs]}``.

Both go through ``page_units``, the original ``process_wiki.py::shard_wiki`` rule: drop disambiguation,
"List of" and one-paragraph pages; start a unit at each ``Section::::`` paragraph (its header kept); stop at
"External links"; join paragraphs with " ". Each unit becomes ``"{title}. {unit}"``. Kept as in the original:
* the title paragraph (paragraph 0) opens the first unit: ``"Anarchism.  Anarchism Anarchism is ..."``;
* a unit begins with a space, so there are two spaces after "Title." (``double_space_quirk=True``, the
  default, which gives one lone "Ġ" token; ``False`` writes one space);
* an "External links" heading opens a new unit before the stop, so such a page ends with the unit "Title. ".
"""

from __future__ import annotations

import bz2
import json
import logging
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import mwparserfromhell
from mwparserfromhell.nodes import (
    Comment,
    ExternalLink,
    Heading,
    HTMLEntity,
    Tag,
    Text,
    Wikilink,
)

from npm.data.stats import Stats
from npm.io import read_jsonl

logger = logging.getLogger(__name__)

SOURCE = "wikipedia"
# Tags whose content is not running text (refs, tables, galleries, formulas, ...): dropped with their content.
DROP_TAGS = {"ref", "references", "table", "gallery", "imagemap", "timeline", "math", "chem", "ce", "score",
             "graph", "hiero", "templatedata", "syntaxhighlight", "source", "mapframe", "maplink"}
DROP_LINK_NAMESPACES = {"file", "image", "media", "category"}
_INTERLANGUAGE = re.compile(r"[a-z]{2,3}(-[a-z]+)*")
_MAGIC_WORD = re.compile(r"__[A-Z]+__")
_BOLD_ITALIC = re.compile(r"''+")
_EMPTY_PARENS = re.compile(r"\(\s*[,;]?\s*\)")
_SPACE = re.compile(r"\s+")


# ---------------------------------------------------------------------------------------------- the rule


def page_drop_reason(title: str, paragraphs: list[str]) -> str | None:
    """Why the original drops a page (paper-map §2.1), or None to keep it; ``paragraphs[0]`` is the title."""
    if "(disambiguation)" in title:
        return "disambiguation"
    if title.startswith("List of"):
        return "list"
    if len(paragraphs) <= 1:
        return "no text"
    if len(title.strip()) <= 1:
        return "short title"
    first, second = paragraphs[0].strip(), paragraphs[1].strip()
    if second.startswith(first) and (second.endswith("refers to:") or second.endswith("refer to:")):
        return "disambiguation"
    return None


def page_units(title: str, paragraphs: list[str], double_space_quirk: bool = True) -> list[str] | None:
    """The units ``"{title}. {section}"`` of a page (KILT paragraphs), or None if the page is dropped.

    Paper-map §2.1 / original ``shard_wiki`` (``--remove_list`` off): a ``Section::::`` paragraph starts a new
    unit (unless the current one is empty) and keeps its header text; a paragraph starting "External links"
    (header or not) ends the page; ``BULLET::::`` is stripped; paragraphs are joined with " ", so each unit
    begins with a space and the original writes "Title.  text" (``double_space_quirk``).
    """
    if page_drop_reason(title, paragraphs):
        return None
    sections = [""]
    for paragraph in paragraphs:
        if paragraph.startswith("Section::::"):
            paragraph = paragraph.split("::::")[-1]
            if sections[-1]:
                sections.append("")
        if paragraph.startswith("External links"):
            break
        if paragraph.startswith("BULLET::::"):
            paragraph = paragraph.split("::::")[-1]
        paragraph = paragraph.strip()
        if paragraph:
            sections[-1] += " " + paragraph
    return [f"{title}. {s if double_space_quirk else s.lstrip()}" for s in sections]


# ----------------------------------------------------------------------------------- wikitext -> paragraphs


def _plain(code) -> str:
    """Visible text of parsed wikitext, with KILT markers for headings and list items."""
    out = []
    for node in code.nodes:
        if isinstance(node, Text):
            out.append(node.value)
        elif isinstance(node, HTMLEntity):
            out.append(node.normalize())
        elif isinstance(node, Wikilink):
            target = str(node.title).strip()
            namespace, colon, _ = target.partition(":")
            namespace = namespace.strip().lower()
            if colon and (namespace in DROP_LINK_NAMESPACES or (not node.text and _INTERLANGUAGE.fullmatch(namespace))):
                continue
            out.append(_plain(node.text) if node.text else target.lstrip(":"))
        elif isinstance(node, ExternalLink):
            if node.brackets and node.title:
                out.append(_plain(node.title))
        elif isinstance(node, Heading):
            out.append(f"\nSection::::{_SPACE.sub(' ', _plain(node.title)).strip()}.\n")
        elif isinstance(node, Tag):
            tag = str(node.tag).strip().lower()
            if tag == "li":
                out.append("\nBULLET::::- ")
            elif tag == "br":
                out.append(" ")
            elif tag not in DROP_TAGS and node.contents:
                out.append(_plain(node.contents))
        elif isinstance(node, Comment):
            continue
        # Templates, template arguments, parser-function leftovers: dropped.
    return "".join(out)


def wikitext_paragraphs(title: str, wikitext: str) -> list[str]:
    """KILT-style paragraphs of a page: [title, paragraph, "Section::::Heading.", "BULLET::::- item", ...]."""
    # skip_style_tags: an unbalanced '' (common inside refs) makes the parser give up on the enclosing tag and
    # leave it as raw text; parsed without style tags, the '' and ''' marks are plain text, removed here.
    code = mwparserfromhell.parse(wikitext, skip_style_tags=True)
    text = _BOLD_ITALIC.sub("", _MAGIC_WORD.sub("", _plain(code)))
    paragraphs = [title]
    for line in text.split("\n"):
        line = _SPACE.sub(" ", _EMPTY_PARENS.sub("", line)).strip()
        if line and line != "BULLET::::-" and line != "Section::::.":
            paragraphs.append(line)
    return paragraphs


# ------------------------------------------------------------------------------------------- MediaWiki


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _child(elem, name: str):
    for child in elem:
        if _local(child.tag) == name:
            return child
    return None


def iter_pages(path: str | Path) -> Iterator[dict]:
    """Stream the pages of a MediaWiki export: {"id", "title", "ns", "redirect", "timestamp", "text"}.

    Works for any export schema version (the XML namespace is ignored). Fields missing from a page are None;
    with several revisions the last one is used. A truncated or corrupt file raises ValueError naming the
    file, the pages read and the byte offset reached.
    """
    path = Path(path)
    pages, last = 0, None
    with open(path, "rb") as raw:
        stream = bz2.open(raw) if path.suffix == ".bz2" else raw
        try:
            root = None
            for event, elem in ET.iterparse(stream, events=("start", "end")):
                if root is None:
                    root = elem
                if event != "end" or _local(elem.tag) != "page":
                    continue
                revisions = [c for c in elem if _local(c.tag) == "revision"]
                revision = revisions[-1] if revisions else None
                text = _child(revision, "text") if revision is not None else None
                stamp = _child(revision, "timestamp") if revision is not None else None
                page = {
                    "id": getattr(_child(elem, "id"), "text", None),
                    "title": getattr(_child(elem, "title"), "text", None),
                    "ns": getattr(_child(elem, "ns"), "text", None) or "0",
                    "redirect": _child(elem, "redirect") is not None,
                    "timestamp": getattr(stamp, "text", None),
                    "text": None if text is None else (text.text or ""),
                }
                root.clear()  # drop the finished page (and everything before it) from memory
                pages, last = pages + 1, page["title"]
                yield page
        except (EOFError, OSError, ET.ParseError) as e:
            raise ValueError(
                f"{path}: truncated or corrupt MediaWiki dump: stopped after {pages} pages (last {last!r}) "
                f"at byte {raw.tell():,} of {path.stat().st_size:,} ({type(e).__name__}: {e}); "
                "download the file again") from e


def read_mediawiki(path: str | Path, stats: Stats | None = None, double_space_quirk: bool = True) -> Iterator[dict]:
    """Documents of the article pages (namespace 0, not redirects) of a MediaWiki export.

    Counts "redirects", "other_namespaces", "dropped" (paper-map §2.1 rules) in ``stats``; a page without
    title or text, or whose wikitext cannot be converted, is logged and counted as "skipped".
    """
    stats = stats if stats is not None else Stats()
    for page in iter_pages(path):
        where = f"{path}: page {page['id']} ({page['title']!r})"
        if page["ns"] != "0":
            stats.counts["other_namespaces"] += 1
            continue
        if page["id"] is None or page["title"] is None or page["text"] is None:
            stats.skip(page["id"], where, "no <id>, no <title> or no revision <text>")
            continue
        if page["redirect"] or page["text"].lstrip().upper().startswith("#REDIRECT"):
            stats.counts["redirects"] += 1
            continue
        try:
            paragraphs = wikitext_paragraphs(page["title"], page["text"])
        except Exception as e:  # one bad page must not stop a 6M-page run
            stats.skip(page["id"], where, f"wikitext could not be converted ({type(e).__name__}: {e})")
            continue
        units = page_units(page["title"], paragraphs, double_space_quirk)
        if units is None:
            stats.counts["dropped"] += 1
            continue
        yield {"id": str(page["id"]), "title": page["title"], "units": units, "date": page["timestamp"],
               "source": SOURCE}


# ------------------------------------------------------------------------------------------------ KILT


def read_kilt(path: str | Path, stats: Stats | None = None, double_space_quirk: bool = True) -> Iterator[dict]:
    """Documents of a KILT knowledge-source JSONL (.gz or not; the original's input), through ``page_units``.

    A line that is not JSON or lacks a string ``wikipedia_title`` / a ``text`` list is logged and skipped.
    """
    stats = stats if stats is not None else Stats()
    for lineno, line in read_jsonl(path, parse=False):  # bytes that are not UTF-8: a ValueError naming the line
        where = f"{path}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            stats.skip(f"line {lineno}", where, f"not JSON ({e.msg})")
            continue
        rec_id = record.get("_id", f"line {lineno}") if isinstance(record, dict) else f"line {lineno}"
        if not isinstance(record, dict) or not isinstance(record.get("wikipedia_title"), str) \
                or not isinstance(record.get("text"), list) \
                or not all(isinstance(p, str) for p in record["text"]):
            stats.skip(rec_id, where, "needs a string 'wikipedia_title' and a 'text' list of strings")
            continue
        title = record["wikipedia_title"]
        units = page_units(title, record["text"], double_space_quirk)
        if units is None:
            stats.counts["dropped"] += 1
            continue
        yield {"id": str(rec_id), "title": title, "units": units, "date": None, "source": SOURCE}
