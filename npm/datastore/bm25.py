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

Contents (config ``datastore.bm25_markers``, ``build-bm25-index --markers/--no-markers``; paper-map §3.8): the
original's ``X.jsonl`` holds each block decoded with its special tokens, so every text unit of a block is indexed as
``<s>...</s>`` (Lucene reads each marker as the term "s": two more terms per unit in a document's length). With
markers (the default, ``DEFAULT_MARKERS``: the paper is silent) the contents are exactly that, with the original's
strings ``<s>`` / ``</s>`` whatever the vocabulary (:func:`marked_texts`); without, the surface text alone, the units
joined by a space. The setting is in the index's record; a reader that passes ``markers`` to :class:`Bm25Searcher`
refuses an index built with the other one.

Java: pyserini 1.6 needs Java 21+ and a JVM started without ``jdk.incubator.vector``; every entry point here calls
:func:`npm.datastore.java.ensure_jvm` first (the indexer subprocess too). One JVM per process, started on the
first ``Bm25Searcher``; see that module.

Identity (issue 12): the index folder holds, besides Lucene's files, the record ``npm-repro-index.json`` (written
before the atomic rename, so every finished index has it): the ``corpus_fingerprint`` of the blocks it indexes
(``npm.fingerprint.CorpusHasher``: token ids, block lengths and token spans, in order; the datastore of the same
blocks has the same one), ``n_blocks``, ``n_tokens``, ``documents``, ``markers`` and the blocks files (``sources``).
A reader that passes ``corpus_fingerprint`` to :class:`Bm25Searcher` (the Predictor, the decoder baselines) gets a
ValueError when the record is missing or differs, before any search. A corrupt Lucene index (truncated or
overwritten segment files) is a ValueError naming the folder and the Java exception's class and gist, not a Java
traceback; a segment file whose bytes changed but which Lucene still reads (zeroed bytes in the term dictionary
answer "no candidate") is caught by the sha256 of every index file, recorded under ``checksums`` in the record and
verified by :class:`Bm25Searcher` (``npm.checksums``; hashed once per file, then cached).
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

import npm.checksums as checksums
from npm.boundaries import SPECIAL
from npm.data.blocks import block_text, load_blocks
from npm.datastore.java import ensure_jvm
from npm.edge_errors import java_gist
from npm.fingerprint import CorpusHasher
from npm.io import atomic_dir, read_json, write_json

DEFAULT_K1 = 0.9  # pyserini's LuceneSearcher defaults, not overridden by the original (paper-map §3.8)
DEFAULT_B = 0.4
DEFAULT_K = 3  # blocks per query (paper-map §3.8)
CLOZE_BLANK = "_____"
COLLECTION = "JsonCollection"
GENERATOR = "DefaultLuceneDocumentGenerator"
_RESULT_MARK = "NPM_BM25_INDEX_STATS "
INDEX_RECORD = "npm-repro-index.json"  # the index's identity, inside the index folder
MARKERS = ("<s>", "</s>")  # the original's unit markers in its X.jsonl contents (RoBERTa's decode; paper-map §3.8)
DEFAULT_MARKERS = True  # the paper is silent: the original's contents
RECORD_FORMAT = "npm-repro BM25 index"


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


def marker_ids(tokenizer) -> tuple[int, int]:
    """(begin id, end id) of the special tokens that wrap every text unit of blocks made with ``tokenizer``
    (``npm.data.blocks``: ``<s>``/``</s>`` = 0/2 for RoBERTa, ``[CLS]``/``[SEP]`` for BERT WordPiece)."""
    begin, end = tokenizer.cls_token_id, tokenizer.sep_token_id
    if begin is None or end is None or begin == end:
        raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no distinct begin/end "
                         f"tokens (cls {begin}, sep {end}), so its blocks' units cannot be marked; build the BM25 "
                         "index with --no-markers")
    return int(begin), int(end)


def unit_markers(blocks: dict[str, np.ndarray]) -> tuple[int, int]:
    """(begin id, end id) of the special tokens that wrap the units of a blocks file, read from the file itself: a
    file starts with its first unit's begin token and ends with its last unit's end token (``npm.data.blocks``;
    other special tokens, such as WordPiece's [UNK], may occur inside units)."""
    ids, flags = blocks["input_ids"], blocks["flags"]
    if len(ids) == 0 or not (flags[0] & SPECIAL and flags[-1] & SPECIAL) or ids[0] == ids[-1]:
        raise ValueError("the blocks do not start and end with a unit's two special tokens: their units cannot be "
                         "marked")
    return int(ids[0]), int(ids[-1])


def block_slice(blocks: dict[str, np.ndarray], b: int) -> dict[str, np.ndarray]:
    """The arrays of block ``b`` of a blocks file's arrays as a blocks file of that one block (token and text
    arrays only), for :func:`marked_texts`."""
    a, e = int(blocks["block_offsets"][b]), int(blocks["block_offsets"][b + 1])
    ta, te = int(blocks["text_offsets"][b]), int(blocks["text_offsets"][b + 1])
    return {"input_ids": blocks["input_ids"][a:e], "flags": blocks["flags"][a:e],
            "token_spans": blocks["token_spans"][a:e], "block_offsets": np.array([0, e - a], np.int64),
            "text": blocks["text"][ta:te], "text_offsets": np.array([0, te - ta], np.int64)}


def marked_texts(blocks: dict[str, np.ndarray], begin_id: int, end_id: int) -> list[str]:
    """Each block's text as the original's ``X.jsonl`` contents (the block's ids decoded with their special tokens,
    paper-map §3.1, §3.8): ``<s>`` where the block holds a unit's begin token (``begin_id``), ``</s>`` where it holds
    its end token (``end_id``), the units' text between them and nothing between ``</s>`` and the next ``<s>``. A
    unit split across blocks is marked only in the block that holds that token. ``blocks``: a blocks file's arrays
    (``load_blocks(path, text=True)``). Edge spaces of a block that starts inside a word-initial token are not
    kept (the blocks' token spans are trimmed), which Lucene's tokenizer ignores anyway."""
    ids, offsets, spans = blocks["input_ids"], blocks["block_offsets"], blocks["token_spans"]
    text, text_offsets = blocks["text"], blocks["text_offsets"]
    special = (blocks["flags"] & SPECIAL) != 0
    marker = np.flatnonzero(special & ((ids == begin_id) | (ids == end_id)))
    block = np.searchsorted(offsets, marker, side="right") - 1
    is_begin = ids[marker] == begin_id
    # A begin marker goes where the next text token of its block starts, an end marker where the previous one ends.
    words = np.flatnonzero(~special)
    nxt = words[np.minimum(np.searchsorted(words, marker), len(words) - 1)] if len(words) else marker
    prv = words[np.maximum(np.searchsorted(words, marker) - 1, 0)] if len(words) else marker
    has_next = (nxt > marker) & (nxt < offsets[block + 1])
    has_prev = (prv < marker) & (prv >= offsets[block])
    length = np.diff(text_offsets)[block]
    pos = np.where(is_begin, np.where(has_next, spans[nxt, 0], length), np.where(has_prev, spans[prv, 1], 0))
    first = np.searchsorted(block, np.arange(len(offsets)))  # markers of block b: first[b]:first[b + 1]
    out = []
    for b in range(len(offsets) - 1):
        raw = text[text_offsets[b]:text_offsets[b + 1]].tobytes()
        parts, at, after_end = [], 0, False
        for m in range(first[b], first[b + 1]):
            piece = raw[at:pos[m]]
            if after_end and is_begin[m]:
                piece = piece.strip()  # the "\n" that joins two units: decode puts nothing between </s> and <s>
            parts += [piece, MARKERS[0 if is_begin[m] else 1].encode()]
            at, after_end = pos[m], not is_begin[m]
        parts.append(raw[at:])
        out.append(b"".join(parts).decode("utf-8", "surrogatepass"))
    return out


class BlockDocuments(Iterator):
    """The iterator :func:`block_documents` returns. Once exhausted, ``corpus`` holds what the documents are made
    from: ``corpus_fingerprint`` (``npm.fingerprint.CorpusHasher`` over the blocks files' token arrays, hashed on
    the same pass that reads their text), ``n_blocks``, ``n_tokens``, ``sources`` (the blocks files) and ``markers``
    (whether the contents carry the units' ``<s>``/``</s>``); :func:`build_bm25_index` writes it into the index's
    record."""

    def __init__(self, blocks_paths: Sequence[str | os.PathLike], skipped: list[int] | None = None,
                 markers: tuple[int, int] | None = None):
        self.sources = [str(p) for p in blocks_paths]
        self.skipped = skipped
        self.markers = markers
        self.corpus: dict | None = None
        self._docs = self._generate()

    def __iter__(self) -> BlockDocuments:
        return self

    def __next__(self) -> tuple[int, str]:
        return next(self._docs)

    def _generate(self) -> Iterator[tuple[int, str]]:
        hasher, first = CorpusHasher(), 0
        for path in self.sources:
            blocks = load_blocks(path, text=True)
            hasher.update(blocks["input_ids"], blocks["block_offsets"], blocks["token_spans"])
            n = len(blocks["block_doc"])
            marked = marked_texts(blocks, *self.markers) if self.markers else None
            for b in range(n):
                text = marked[b] if marked is not None else block_text(blocks, b).replace("\n", " ")
                if text.strip():
                    yield first + b, text
                elif self.skipped is not None:
                    self.skipped.append(first + b)
            first += n
        self.corpus = {"corpus_fingerprint": hasher.hexdigest(), "n_blocks": first, "n_tokens": hasher.n_tokens,
                       "sources": self.sources, "markers": self.markers is not None}


def block_documents(blocks_paths: Sequence[str | os.PathLike], skipped: list[int] | None = None,
                    markers: tuple[int, int] | None = None) -> BlockDocuments:
    """``(global block id, text)`` of every block of the blocks files, in the order given (the datastore's global
    block order). ``markers``: None, the units of a block joined by a space; ``(begin id, end id)`` of the blocks'
    tokenizer (:func:`marker_ids`), the original's contents, each unit wrapped in ``<s>``/``</s>``
    (:func:`marked_texts`). Without markers, a block without text (only the end token of a split unit) cannot be a
    Lucene document: it is left out and its id appended to ``skipped``; with markers it is the document "</s>", as
    in the original. The iterator also fingerprints the blocks (``BlockDocuments.corpus``), so an index built from
    it records what it indexes."""
    return BlockDocuments(blocks_paths, skipped, markers)


def build_bm25_index(docs: Iterable[tuple[int, str]], out_dir: str | os.PathLike, threads: int = 1, *,
                     store_raw: bool = False, store_docvectors: bool = False, optimize: bool = True,
                     corpus: dict | None = None) -> dict:
    """Index ``(global block id, text)`` pairs into a Lucene BM25 index at ``out_dir``, atomically.

    The pairs are written as a pyserini ``JsonCollection`` in a temporary folder beside ``out_dir`` and indexed by
    ``python -m pyserini.index.lucene`` (``DefaultLuceneDocumentGenerator``) in a subprocess that calls
    ``ensure_jvm()`` first. The index is built in a temporary sibling folder and renamed onto ``out_dir`` (an
    existing index there is replaced) only when Lucene indexed every document. ``threads`` > 1 spreads the
    records over that many files (Anserini indexes one file per thread); the original uses 1 thread, which keeps
    Lucene's internal order (the tie-break of equal scores) equal to the input order. ``store_raw`` /
    ``store_docvectors`` add pyserini's ``--storeRaw`` / ``--storeDocvectors`` (not needed for search);
    ``optimize`` (``--optimize``) merges the index into one segment (faster search, exact term statistics).

    ``corpus``: what the documents are made from (``corpus_fingerprint``, ``n_blocks``, ``n_tokens``,
    ``sources``, ``markers``), written into the index's record ``npm-repro-index.json``; default ``docs.corpus`` when
    ``docs`` is :func:`block_documents` (documents from anywhere else get a record without a fingerprint, which a
    checking reader refuses).

    Returns ``{"documents", "unique_terms", "total_terms", "threads", "seconds", "corpus_fingerprint"}``. Raises
    ValueError for no documents, a duplicate or negative id, or an empty text, and RuntimeError when the indexer
    fails.
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
        record = _index_record(docs, corpus, n)
        record["checksums"] = checksums.folder_record(index, "build_bm25_index", _rebuild_command(
            out_dir, record["sources"]), skip=[INDEX_RECORD])
        write_json(index / INDEX_RECORD, record)
    unique_terms = stats.get("unique_terms")  # Lucene reports -1 when the index has several segments
    return {"documents": n, "unique_terms": unique_terms if unique_terms is None or unique_terms >= 0 else None,
            "total_terms": stats.get("total_terms"),
            "threads": threads, "seconds": round(time.perf_counter() - start, 3),
            "corpus_fingerprint": record["corpus_fingerprint"]}


def _index_record(docs, corpus: dict | None, documents: int) -> dict:
    """The index's record: the fingerprint of the blocks the (exhausted) ``docs`` came from, and their count."""
    found = getattr(docs, "corpus", None) if isinstance(docs, BlockDocuments) else None
    if corpus is not None and found is not None and corpus.get("corpus_fingerprint") != found["corpus_fingerprint"]:
        raise ValueError(f"corpus= says fingerprint {str(corpus.get('corpus_fingerprint'))[:12]}, the blocks files "
                         f"the documents were read from have {found['corpus_fingerprint'][:12]}; index left unused")
    info = dict(corpus if corpus is not None else found or {})
    if documents > int(info.get("n_blocks") or documents):
        raise ValueError(f"{documents} documents but corpus= says {info['n_blocks']} blocks; index left unused")
    return {"format": RECORD_FORMAT, "corpus_fingerprint": info.get("corpus_fingerprint"),
            "n_blocks": info.get("n_blocks"), "n_tokens": info.get("n_tokens"), "documents": documents,
            "sources": [str(p) for p in info.get("sources") or []], "markers": info.get("markers"),
            "collection": COLLECTION, "generator": GENERATOR}


def read_index_record(index_dir: str | os.PathLike) -> dict | None:
    """The record ``npm-repro-index.json`` of a BM25 index, or None when it has none (built before indexes carried
    one); a corrupt record is a ValueError."""
    path = Path(index_dir) / INDEX_RECORD
    if not path.exists():
        return None
    record = read_json(path, _rebuild_hint(index_dir, None))
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise ValueError(f"{path} is not the record of an npm-repro BM25 index; {_rebuild_hint(index_dir, None)}")
    return record


def _rebuild_hint(index_dir, blocks: Sequence[str] | None) -> str:
    """How to rebuild the BM25 index at ``index_dir`` over ``blocks`` (the blocks files, in order)."""
    return f"rebuild it with `{_rebuild_command(index_dir, blocks)}` (rule build_bm25_index)"


def _rebuild_command(index_dir, blocks: Sequence[str] | None) -> str:
    """The command that builds the BM25 index at ``index_dir`` over ``blocks`` (the blocks files, in order)."""
    if blocks:
        shown = [str(b) for b in blocks[:3]] + ([f"... ({len(blocks)} files in this order)"] if len(blocks) > 3 else [])
        files = " ".join(shown)
    else:
        files = "<the datastore's blocks files>"
    return f"npm-repro build-bm25-index --blocks {files} --out {index_dir}"


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

    ``corpus_fingerprint``: the fingerprint of the blocks the caller reads the block ids against (a datastore's
    ``corpus_fingerprint``, or ``npm.fingerprint.corpus_fingerprint`` of the blocks files); the index's record must
    hold the same one, else ValueError naming the index, both fingerprints and the command that rebuilds it over
    ``blocks`` (the caller's blocks files, for that message; ``corpus`` names them, e.g. "datastore X"). None (the
    default) skips the check. ``markers``: the contents the caller expects (``block_documents``'s switch, config
    ``datastore.bm25_markers``); an index whose record says otherwise is a ValueError (a record from before the
    switch means no markers); None skips the check. A corrupt Lucene index is a ValueError naming the folder.
    """

    def __init__(self, index_dir: str | os.PathLike, k1: float = DEFAULT_K1, b: float = DEFAULT_B, *,
                 corpus_fingerprint: str | None = None, corpus: str | None = None,
                 blocks: Sequence[str | os.PathLike] | None = None, markers: bool | None = None):
        index_dir = Path(index_dir)
        if not (index_dir.is_dir() and any(index_dir.glob("segments_*"))):
            raise FileNotFoundError(f"{index_dir} is not a Lucene index; build it with build_bm25_index")
        self.index_dir = index_dir
        self.record = read_index_record(index_dir)
        blocks = [str(p) for p in blocks] if blocks else None
        if corpus_fingerprint is not None:
            _check_record(index_dir, self.record, corpus_fingerprint, corpus or "the blocks given", blocks)
        if markers is not None:
            _check_markers(index_dir, self.record, bool(markers), blocks)
        self._blocks_hint = blocks or (self.record or {}).get("sources")
        ensure_jvm()
        from pyserini.search.lucene import LuceneSearcher

        self.k1, self.b = float(k1), float(b)
        with self._lucene():
            self._searcher = LuceneSearcher(str(index_dir))
            self._searcher.set_bm25(self.k1, self.b)
            self.num_docs = int(self._searcher.num_docs)
        checksums.verify(index_dir, (self.record or {}).get("checksums"))  # files Lucene reads without complaint
        self._cache: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}

    @contextlib.contextmanager
    def _lucene(self) -> Iterator[None]:
        """Turn a Java exception from Lucene (a corrupt or unreadable index) into a ValueError naming the index."""
        try:
            yield
        except Exception as e:
            gist = java_gist(e)
            if gist is None:
                raise
            raise ValueError(f"{self.index_dir} is not a readable Lucene index (Java: {gist}); delete it and "
                             f"{_rebuild_hint(self.index_dir, self._blocks_hint)}") from None

    def __len__(self) -> int:
        return self.num_docs

    def search(self, query: str, k: int = DEFAULT_K) -> tuple[np.ndarray, np.ndarray]:
        """The top-``k`` blocks of one query string: (block ids int64, BM25 scores float32), best first."""
        key = (query, _check_k(k))
        hit = self._cache.get(key)
        if hit is None:
            with self._lucene():
                hits = self._searcher.search(query, key[1])
            hit = self._cache[key] = self._to_arrays(query, hits)
        return hit

    def batch_search(self, queries: Sequence[str], k: int = DEFAULT_K,
                     threads: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
        """:meth:`search` for many queries, the uncached ones in one Lucene call on ``threads`` threads (a single
        uncached query through :meth:`search`: pyserini's batch call starts a thread pool, 3-6 ms against 0.5-1 ms for
        one search on the demo's index)."""
        k = _check_k(k)
        todo = list(dict.fromkeys(q for q in queries if (q, k) not in self._cache))
        if len(todo) == 1:
            self.search(todo[0], k)
        elif todo:
            qids = [str(i) for i in range(len(todo))]
            with self._lucene():
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


def _check_record(index_dir: Path, record: dict | None, want: str, corpus: str, blocks: list[str] | None) -> None:
    """The index's record must hold corpus fingerprint ``want`` (that of ``corpus``, the caller's blocks)."""
    hint = _rebuild_hint(index_dir, blocks)
    if record is None:
        raise ValueError(f"BM25 index {index_dir} has no {INDEX_RECORD} (built before indexes recorded the "
                         f"fingerprint of their blocks), so it cannot be checked against {corpus}; {hint}")
    have = record.get("corpus_fingerprint")
    if not have:
        raise ValueError(f"BM25 index {index_dir} records no corpus fingerprint in {INDEX_RECORD} (built from "
                         f"documents, not from blocks files), so it cannot be checked against {corpus}; {hint}")
    if have != want:
        raise ValueError(f"BM25 index {index_dir} was built from other blocks than {corpus}: corpus fingerprint "
                         f"{have[:12]} (its {INDEX_RECORD}, {record.get('n_blocks')} blocks), expected {want[:12]}; "
                         f"pass the BM25 index of those blocks (data/bm25/<corpus> of the same corpus), or "
                         f"{hint.replace(f'--out {index_dir}', '--out <a new folder>')}")


def _check_markers(index_dir: Path, record: dict | None, want: bool, blocks: list[str] | None) -> None:
    """The index's contents must carry the units' ``<s>``/``</s>`` markers iff ``want`` (paper-map §3.8)."""
    hint = _rebuild_hint(index_dir, blocks or (record or {}).get("sources"))
    if record is None:
        raise ValueError(f"BM25 index {index_dir} has no {INDEX_RECORD}, so whether its contents carry the units' "
                         f"<s>/</s> markers cannot be checked; {hint}")
    have = bool(record.get("markers"))  # records from before the switch: built without markers
    if have != want:
        flag = "--markers --tokenizer <the blocks' tokenizer>" if want else "--no-markers"
        raise ValueError(f"BM25 index {index_dir} was built {'with' if have else 'without'} the units' <s>/</s> "
                         f"markers in its contents ({INDEX_RECORD}: markers {have}), but markers {want} is asked "
                         f"(config datastore.bm25_markers); {hint.replace('` (rule', f' {flag}` (rule')}")


def _check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    return int(k)
