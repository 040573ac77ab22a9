"""Raw dumps -> documents, documents -> document shards (paper section 4.1; paper-map §2.1).

* ``extract_documents(fmt, source, out)`` reads a MediaWiki XML export or a KILT knowledge-source JSONL
  (``npm.data.wikipedia``: units are sections, ``"{title}. {section}"``) or a folder of CC-News records
  (``npm.data.ccnews``: one document per date, units ``"{title}. {text}"``) and writes one document per line
  (docs/data-contracts.md): ``{"id", "title", "units", "date", "source"}``.
* ``shard_documents(src, outs)`` is the original ``shard_wiki``/``save_lines``: documents are read in buffers
  of ``shuffle_buffer`` (1M), each buffer is shuffled with one seeded generator and cut into ``len(outs)``
  contiguous parts of ``ceil(len(buffer) / len(outs))`` documents appended to the shards.
  ``shuffle=False`` (CC-News) keeps the input (date) order.

Every output is written atomically (``npm.io``); a malformed record is logged with where it is and skipped
(``npm.data.stats.Stats``, what the readers left out).
"""

from __future__ import annotations

import contextlib
import gzip
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path

import numpy as np
from tqdm import tqdm

from npm.data import ccnews, wikipedia
from npm.data.stats import Stats
from npm.io import atomic_path, read_jsonl, resolve_package_path, write_jsonl
from npm.settings import DataSettings

FORMATS = ("mediawiki", "kilt", "cc_news")


def _reader(fmt: str):
    return {"mediawiki": wikipedia.read_mediawiki, "kilt": wikipedia.read_kilt, "cc_news": ccnews.read_ccnews}[fmt]


def extract_documents(fmt: str, source: str | Path, out: str | Path, limit: int | None = None) -> dict:
    """Read ``source`` in format ``fmt`` and write its documents to ``out`` (JSONL, gzip if .gz), atomically.

    Returns {"documents", "units", "characters", "skipped", "skipped_ids" (first 50), "format", "source"}
    plus the reader's other counts (e.g. "redirects", "other_namespaces", "dropped", "non_english").
    No document at all is an error (and no file is written).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown document format {fmt!r}; allowed: {', '.join(FORMATS)}")
    path = Path(resolve_package_path(source))
    if not path.exists():
        raise FileNotFoundError(f"{fmt} source {path} does not exist")
    stats = Stats()
    totals = Counter()

    def counted(docs: Iterable[dict]) -> Iterator[dict]:
        for doc in tqdm(docs, desc=f"extract {path.name}", unit="doc", disable=None):
            totals["documents"] += 1
            totals["units"] += len(doc["units"])
            totals["characters"] += sum(len(u) for u in doc["units"])
            yield doc
        if not totals["documents"]:  # raised inside the write: the temporary file is removed
            raise ValueError(f"{fmt} source {path} gave no documents ({dict(stats.counts) or 'nothing read'}); "
                             "check the format and the file")

    docs = _reader(fmt)(path, stats)
    write_jsonl(out, counted(islice(docs, limit) if limit else docs))
    summary = {k: totals[k] for k in ("documents", "units", "characters")}
    summary.update(skipped=stats.counts["skipped"], skipped_ids=stats.skipped_ids, format=fmt, source=str(source))
    summary.update({k: v for k, v in stats.counts.items() if k != "skipped"})
    return summary


def _text_lines(path: Path) -> Iterator[str]:
    for _, line in read_jsonl(path, parse=False):  # bytes that are not UTF-8: a ValueError naming the line
        yield line if line.endswith("\n") else line + "\n"


def shard_documents(src: str | Path, outs: list[Path], seed: int,
                    shuffle_buffer: int = DataSettings.shuffle_buffer, shuffle: bool = True) -> dict:
    """Split the documents of ``src`` into the shard files ``outs`` (paper-map §2.1, original ``shard_wiki``).

    Buffers of ``shuffle_buffer`` documents are shuffled with ``np.random.default_rng(seed)`` (one generator for
    the whole run, so the result depends only on ``seed``), and each buffer is cut into ``len(outs)``
    contiguous parts of ``ceil(len / len(outs))`` documents, part i appended to ``outs[i]``, as the original
    ``save_lines`` does. (The original shuffles with the legacy ``np.random.seed(2022)`` + ``np.random.shuffle``,
    so the permutation itself differs.) Records are copied line for line. All shards are written to
    temporaries and renamed together at the end. Returns {"documents", "per_shard", "seed", "shuffle"}.
    """
    src, outs = Path(src), [Path(o) for o in outs]
    if not outs:
        raise ValueError("shard_documents needs at least one output shard")
    if shuffle_buffer < 1:
        raise ValueError(f"shuffle_buffer must be >= 1, got {shuffle_buffer}")
    rng = np.random.default_rng(seed)
    per_shard = [0] * len(outs)

    with contextlib.ExitStack() as stack:
        tmps = [stack.enter_context(atomic_path(out)) for out in outs]
        files = [stack.enter_context(gzip.open(t, "wt", encoding="utf-8") if o.suffix == ".gz"
                                     else open(t, "w", encoding="utf-8")) for t, o in zip(tmps, outs, strict=True)]

        def flush(buffer: list[str]) -> None:
            if shuffle:
                rng.shuffle(buffer)
            n = math.ceil(len(buffer) / len(outs))
            for i, f in enumerate(files):
                part = buffer[i * n:(i + 1) * n]
                f.writelines(part)
                per_shard[i] += len(part)

        buffer: list[str] = []
        for line in tqdm(_text_lines(src), desc=f"shard {src.name}", unit="doc", disable=None):
            buffer.append(line)
            if len(buffer) == shuffle_buffer:
                flush(buffer)
                buffer = []
        if buffer:
            flush(buffer)
        if not sum(per_shard):
            raise ValueError(f"{src} holds no documents; run extract-documents on a non-empty source first")
    return {"documents": sum(per_shard), "per_shard": per_shard, "seed": seed, "shuffle": shuffle}
