"""BM25 over corpus blocks with pyserini's Lucene for NPM's "BM25-restricted" inference (paper 3.3; paper-map §3.8).

Open-set NPM never searches the whole datastore: for each query, Lucene BM25 picks the top-3 corpus blocks and
every stored token of those blocks is a start/end candidate (paper-map §3.7-§3.8; paper 6.4: without it LAMA T-REx
falls from 34.5 to 16.1). As in the original (``npm/searcher.py``):

* the engine is pyserini's ``LuceneSearcher`` (Anserini/Lucene), never a re-implementation, with pyserini's
  default BM25 parameters k1=0.9, b=0.4;
* the index is a ``JsonCollection`` (one ``{"id": "<global block id>", "contents": <block text>}`` record per
  block, paper-map §3.1) indexed with ``DefaultLuceneDocumentGenerator`` on 1 thread, so a Lucene docid *is* the
  global block id;
* k=3 blocks per query; the query string is :func:`bm25_query`; results are cached per query string and the
  returned ids are checked to be unique.

Java: pyserini 1.6 needs Java 21+ and a JVM started without ``jdk.incubator.vector``; every entry point here calls
:func:`npm.datastore.java.ensure_jvm` first (the indexer subprocess too). One JVM per process, started on the
first ``Bm25Searcher``; see that module.
"""

from __future__ import annotations

import array
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from npm.datastore.java import ensure_jvm
from npm.io import atomic_dir

DEFAULT_K1 = 0.9  # pyserini's LuceneSearcher defaults, not overridden by the original (paper-map §3.8)
DEFAULT_B = 0.4
DEFAULT_K = 3  # blocks per query (paper-map §3.8)
CLOZE_BLANK = "_____"
COLLECTION = "JsonCollection"
GENERATOR = "DefaultLuceneDocumentGenerator"
_RESULT_MARK = "NPM_BM25_INDEX_STATS "


def bm25_query(text: str, is_question: bool, mask_token: str = "<mask>") -> str:
    """The BM25 query string of one input (paper-map §3.8).

    Question tasks (KAMEL, NQ, TriviaQA): the input up to and including the first "?" (the whole input when it
    has none). Cloze tasks (LAMA, TempLAMA, entity translation): the input with every mask token replaced by
    "_____".
    """
    if is_question:
        end = text.find("?")
        return text if end < 0 else text[: end + 1]
    return text.replace(mask_token, CLOZE_BLANK)


# ------------------------------------------------------------------------------------------------ indexing


def block_documents(blocks_paths: Sequence[str | os.PathLike], skipped: list[int] | None = None
                    ) -> Iterator[tuple[int, str]]:
    """``(global block id, text)`` of every block of the blocks files, in the order given (the datastore's global
    block order), the units of a block joined by a space. A block without text (only the end token of a split
    unit) cannot be a Lucene document: it is left out and its id appended to ``skipped``."""
    from npm.data.blocks import block_text, load_blocks

    first = 0
    for path in blocks_paths:
        blocks = load_blocks(path, text=True)
        n = len(blocks["block_doc"])
        for b in range(n):
            text = block_text(blocks, b).replace("\n", " ")
            if text.strip():
                yield first + b, text
            elif skipped is not None:
                skipped.append(first + b)
        first += n


def build_bm25_index(docs: Iterable[tuple[int, str]], out_dir: str | os.PathLike, threads: int = 1, *,
                     store_raw: bool = False, store_docvectors: bool = False, optimize: bool = True) -> dict:
    """Index ``(global block id, text)`` pairs into a Lucene BM25 index at ``out_dir``, atomically.

    The pairs are written as a pyserini ``JsonCollection`` in a temporary folder beside ``out_dir`` and indexed by
    ``python -m pyserini.index.lucene`` (``DefaultLuceneDocumentGenerator``) in a subprocess that calls
    ``ensure_jvm()`` first. The index is built in a temporary sibling folder and renamed onto ``out_dir`` (an
    existing index there is replaced) only when Lucene indexed every document. ``threads`` > 1 spreads the
    records over that many files (Anserini indexes one file per thread); the original uses 1 thread, which keeps
    Lucene's internal order (the tie-break of equal scores) equal to the input order. ``store_raw`` /
    ``store_docvectors`` add pyserini's ``--storeRaw`` / ``--storeDocvectors`` (not needed for search);
    ``optimize`` (``--optimize``) merges the index into one segment (faster search, exact term statistics).

    Returns ``{"documents", "unique_terms", "total_terms", "threads", "seconds"}``. Raises ValueError for no
    documents, a duplicate or negative id, or an empty text, and RuntimeError when the indexer fails.
    """
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    start = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out_dir.name}.collection.", dir=out_dir.parent) as work, \
            atomic_dir(out_dir) as index:
        collection = Path(work)
        n = _write_collection(docs, collection, threads)
        flags = ["--storeRaw"] * store_raw + ["--storeDocvectors"] * store_docvectors + ["--optimize"] * optimize
        stats = _run_indexer(collection, index, threads, flags)
        if stats.get("documents") != n:
            raise RuntimeError(f"Lucene indexed {stats.get('documents')} documents out of {n}; index left unused")
    unique_terms = stats.get("unique_terms")  # Lucene reports -1 when the index has several segments
    return {"documents": n, "unique_terms": unique_terms if unique_terms is None or unique_terms >= 0 else None,
            "total_terms": stats.get("total_terms"),
            "threads": threads, "seconds": round(time.perf_counter() - start, 3)}


def _write_collection(docs: Iterable[tuple[int, str]], folder: Path, threads: int) -> int:
    """Write the JsonCollection (``docs{i}.jsonl``, round-robin over ``threads`` files); return the count."""
    ids = array.array("q")
    files = [open(folder / f"docs{i:03d}.jsonl", "w", encoding="utf-8") for i in range(threads)]
    try:
        for n, (block_id, text) in enumerate(docs):
            if isinstance(block_id, bool) or not isinstance(block_id, (int, np.integer)) or block_id < 0:
                raise ValueError(f"document {n}: the id must be a non-negative integer block id, got {block_id!r}")
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"document {n} (block {block_id}): the text must be a non-empty string")
            ids.append(int(block_id))
            record = {"id": str(int(block_id)), "contents": text}
            files[n % threads].write(json.dumps(record, ensure_ascii=True) + "\n")
    finally:
        for f in files:
            f.close()
    if not ids:
        raise ValueError("no documents to index: build_bm25_index needs at least one (block id, text) pair")
    unique, counts = np.unique(np.frombuffer(ids, dtype=np.int64), return_counts=True)
    if len(unique) != len(ids):
        raise ValueError(f"duplicate block ids, e.g. {unique[counts > 1][:5].tolist()}: a Lucene docid must be "
                         "a unique global block id (paper-map §3.1, §3.8)")
    return len(ids)


def _run_indexer(collection: Path, index: Path, threads: int, flags: list[str]) -> dict:
    """Run pyserini's Lucene indexer in a subprocess that starts its JVM through ``ensure_jvm()``."""
    root = str(Path(__file__).resolve().parents[2])  # the folder holding the npm package
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    code = "import sys; from npm.datastore.bm25 import _index_main; sys.exit(_index_main(sys.argv[1:]))"
    cmd = [sys.executable, "-c", code, str(collection), str(index), str(threads), *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_RESULT_MARK)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stdout + proc.stderr)[-4000:]
        raise RuntimeError(f"pyserini's Lucene indexer failed (exit {proc.returncode}):\n{tail}")
    return json.loads(lines[-1][len(_RESULT_MARK):])


def _index_main(argv: Sequence[str]) -> int:
    """Subprocess entry: ``python -m pyserini.index.lucene`` with the JVM fix, then print the index stats."""
    collection, index, threads, *flags = argv
    ensure_jvm()
    import runpy

    sys.argv = ["pyserini.index.lucene", "--collection", COLLECTION, "--generator", GENERATOR,
                "--threads", str(threads), "--input", collection, "--index", index, *flags]
    runpy.run_module("pyserini.index.lucene", run_name="__main__", alter_sys=True)
    from pyserini.index.lucene import LuceneIndexReader

    stats = {str(k): int(v) for k, v in LuceneIndexReader(index).stats().items()}
    print(_RESULT_MARK + json.dumps(stats), flush=True)
    return 0


# ------------------------------------------------------------------------------------------------- search


class Bm25Searcher:
    """Lucene BM25 over a :func:`build_bm25_index` index; docids are global block ids (paper-map §3.8).

    ``search`` / ``batch_search`` return ``(block_ids int64[<=k], scores float32[<=k])``, best first (fewer than
    k when fewer blocks share a term with the query). Results are cached per ``(query, k)``; the cached arrays
    are read-only, so a caller cannot change them. Starts the process's JVM on first use (``ensure_jvm``).
    """

    def __init__(self, index_dir: str | os.PathLike, k1: float = DEFAULT_K1, b: float = DEFAULT_B):
        index_dir = Path(index_dir)
        if not (index_dir.is_dir() and any(index_dir.glob("segments_*"))):
            raise FileNotFoundError(f"{index_dir} is not a Lucene index; build it with build_bm25_index")
        ensure_jvm()
        from pyserini.search.lucene import LuceneSearcher

        self.index_dir = index_dir
        self.k1, self.b = float(k1), float(b)
        self._searcher = LuceneSearcher(str(index_dir))
        self._searcher.set_bm25(self.k1, self.b)
        self.num_docs = int(self._searcher.num_docs)
        self._cache: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}

    def __len__(self) -> int:
        return self.num_docs

    def search(self, query: str, k: int = DEFAULT_K) -> tuple[np.ndarray, np.ndarray]:
        """The top-``k`` blocks of one query string: (block ids int64, BM25 scores float32), best first."""
        key = (query, _check_k(k))
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._to_arrays(query, self._searcher.search(query, key[1]))
        return hit

    def batch_search(self, queries: Sequence[str], k: int = DEFAULT_K,
                     threads: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
        """:meth:`search` for many queries, the uncached ones in one Lucene call on ``threads`` threads."""
        k = _check_k(k)
        todo = list(dict.fromkeys(q for q in queries if (q, k) not in self._cache))
        if todo:
            qids = [str(i) for i in range(len(todo))]
            results = self._searcher.batch_search(todo, qids, k, int(threads))
            for qid, query in zip(qids, todo, strict=True):
                self._cache[(query, k)] = self._to_arrays(query, results.get(qid, []))
        return [self._cache[(q, k)] for q in queries]

    def cache_size(self) -> int:
        return len(self._cache)

    def close(self) -> None:
        self._searcher.close()

    def __enter__(self) -> Bm25Searcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @staticmethod
    def _to_arrays(query: str, hits) -> tuple[np.ndarray, np.ndarray]:
        try:
            ids = np.array([int(h.docid) for h in hits], dtype=np.int64)
        except ValueError as e:
            raise ValueError(f"the index has a non-integer docid ({e}); build it with build_bm25_index") from None
        scores = np.array([h.score for h in hits], dtype=np.float32)
        if len(np.unique(ids)) != len(ids):  # the original asserts this too (paper-map §3.8)
            raise RuntimeError(f"BM25 returned duplicate block ids {ids.tolist()} for query {query!r}")
        ids.flags.writeable = False
        scores.flags.writeable = False
        return ids, scores


def _check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    return int(k)
