"""Evaluation texts of REPLUG's language-modelling evaluation in the embedded world (docs/paper-map.md §R3).

REPLUG's Table 1 scores Pile text against a retrieval corpus drawn from the same distribution. The embedded default
scores **body sections** (text after the lead) of the real Wikipedia articles in gensim's MediaWiki dump excerpt,
against a retrieval corpus of Wikipedia **leads**: the same entities, different text, so retrieval can help without
handing back the scored text. Only articles whose lead is in the retrieval corpus are eligible (the lead of
"Albedo" is what a query about albedo should find). Nothing here is generated: each text is a real section, cut to
``max_chars`` at the last sentence end before it.
"""

from __future__ import annotations

import os

import numpy as np

from npm.io import read_jsonl
from npm.settings import LsrSettings, ReplugSettings


def _cut(text: str, max_chars: int) -> str:
    """``text`` up to ``max_chars`` characters, ending at the last ". " inside them (else at a space)."""
    if len(text) <= max_chars:
        return text
    head = text[:max_chars]
    end = head.rfind(". ")
    end = end + 1 if end > max_chars // 2 else head.rfind(" ")
    return head[:end if end > 0 else max_chars].rstrip()


def lm_eval_texts(articles: str | os.PathLike, corpus: str | os.PathLike, n_texts: int,
                  max_chars: int = ReplugSettings.max_chars, min_chars: int = 500, *, seed: int) -> list[dict]:
    """``n_texts`` records {id, title, text, source} from the documents JSONL ``articles`` (units: lead, then body
    sections), one per article whose title has a document in ``corpus``: its first body section of at least
    ``min_chars`` characters, cut to ``max_chars``; articles chosen with ``seed``, listed by title."""
    if n_texts < 1:
        raise ValueError(f"n_texts must be >= 1, got {n_texts}")
    titles = {doc["title"] for doc in read_jsonl(corpus)}
    eligible = []
    for doc in read_jsonl(articles):
        if doc["title"] not in titles:
            continue
        body = next((u for u in doc["units"][1:] if len(u) >= min_chars), None)
        if body is not None:
            eligible.append({"id": str(doc["id"]), "title": doc["title"], "text": _cut(body, max_chars),
                             "source": f"{os.path.basename(str(articles))}: a body section (not the lead)"})
    if len(eligible) < n_texts:
        raise ValueError(f"{articles}: only {len(eligible)} articles have their lead in {corpus} and a body section "
                         f"of >= {min_chars} characters; {n_texts} texts were asked for")
    picked = np.random.default_rng(seed).choice(len(eligible), size=n_texts, replace=False)
    return sorted((eligible[i] for i in picked), key=lambda r: r["title"])


def lsr_queries(articles: str | os.PathLike, corpus: str | os.PathLike, exclude: str | os.PathLike, n_queries: int,
                chars: int = LsrSettings.chars, *, seed: int) -> list[dict]:
    """LSR training queries (REPLUG 4: training text disjoint from the evaluation text): ``n_queries`` records
    {id, title, text, source_doc} of ``chars`` characters each (ending at a space), cut from the body sections of
    the articles of ``articles`` that are not among the evaluation texts ``exclude`` (JSONL with ``title``).
    ``source_doc`` is the id of the corpus document of the same article (its lead), or null: LSR never retrieves a
    query's own document (REPLUG keeps training queries and corpus documents disjoint)."""
    if n_queries < 1 or chars < 50:
        raise ValueError(f"n_queries must be >= 1 and chars >= 50, got {n_queries} and {chars}")
    ids = {doc["title"]: str(doc["id"]) for doc in read_jsonl(corpus)}
    skip = {r["title"] for r in read_jsonl(exclude)}
    pool = []
    for doc in read_jsonl(articles):
        if doc["title"] in skip:
            continue
        for u, unit in enumerate(doc["units"][1:], 1):
            for p, a in enumerate(range(0, len(unit) - chars + 1, chars)):
                text = unit[a:a + chars]
                if a and " " in text:  # start and end at word boundaries
                    text = text[text.find(" ") + 1:]
                text = text[:text.rfind(" ")] if " " in text else text
                pool.append({"id": f"{doc['id']}-{u}-{p}", "title": doc["title"], "text": text,
                             "source_doc": ids.get(doc["title"])})
    if len(pool) < n_queries:
        raise ValueError(f"{articles}: only {len(pool)} passages of {chars} characters outside the evaluation texts; "
                         f"{n_queries} queries were asked for")
    picked = np.sort(np.random.default_rng(seed).choice(len(pool), size=n_queries, replace=False))
    return [pool[i] for i in picked]
