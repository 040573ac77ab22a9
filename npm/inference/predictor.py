"""``Predictor``: NPM / NPM-single predictions over a reference-corpus datastore (paper 3.1, 3.3; paper-map §3.6-§3.8).

* NPM (``model="npm"``): [MASK][MASK] query vectors; candidate positions from BM25 (``mode="restricted"``: every
  stored vector of the top-3 blocks, paper-map §3.8) or from FAISS (``mode="faiss"``: the k nearest start and end
  vectors); spans walked over word boundaries (``npm.inference.phrase``); exact scores from the stored vectors.
* NPM-single (``model="npm_single"``): one query vector; every candidate votes for its own token with
  softmax(s / tau) (paper A.3); tokens are aggregated like one-token spans.

Every answer is the exact surface string of its best occurrence in the corpus text (so characters the tokenizer
maps to an unknown token come out right), with the blocks that support it as evidence.
``label_scores`` gives the closed-set scores of paper-map §4.1 (kNN token votes summed over verbalizers).

Inference defaults (tau, span score, k, restricted blocks, closed-set tau) are those of
``npm.settings.Settings``; ``Predictor.from_config`` opens a model's datastore and indexes where the
workflow builds them, and ``predict_batch`` answers many queries with one encoder pass::

    import npm
    p = npm.Predictor.from_config("npm", "enwiki")   # config/config.yaml, workflow run in "."
    p.predict_batch(["Bratislava is the capital of <mask>.", "Thessaloniki is a city in <mask>."], top=3)
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from npm.boundaries import SPECIAL, valid_ends, valid_starts
from npm.data.blocks import load_blocks
from npm.datastore.bm25 import Bm25Searcher, bm25_query
from npm.datastore.exact_knn import ExactKnn
from npm.datastore.faiss_index import RowFilter, exact_scores, flat_vectors, load_faiss_index, search
from npm.datastore.store import STORED, load_datastore
from npm.inference.closed_set import label_scores
from npm.inference.phrase import aggregate_spans, runs, score_spans, softmax, walk_spans
from npm.inference.query import encode_queries
from npm.io import read_yaml
from npm.model import load_encoder, load_tokenizer, locate_checkpoint
from npm.settings import Settings
from npm.threads import threads

MODELS = ("npm", "npm_single")  # the models with a datastore
BATCH_SIZE = 64  # queries per encoder pass, search and scoring step; any size gives the same answers
# Unrestricted mode views every block that holds one of the 2 x k neighbours of a query (at k = 4096, most of the
# embedded corpus): its spans are scored 8 queries at a time (9 queries/s against 6 for 64 at once, less memory).
UNRESTRICTED_CHUNK = 8


class Predictor:
    """NPM / NPM-single over one datastore: the checkpoint, datastore and indexes are opened once, then ``predict``
    (one query) or ``predict_batch`` (many, one encoder pass) answer cloze queries written with ``<mask>``.

    ``checkpoint``: the encoder (folder or hub id) of model ``model`` (npm or npm_single) that embedded
    ``datastore``. ``settings`` (default ``Settings()``, the paper's setting) gives the phrase temperature, the span
    score, k and the BM25 blocks of restricted mode, and ``label_scores``'s defaults; change one with
    ``dataclasses.replace(settings, open_set_tau=...)``. ``root``: the folder that the relative blocks paths
    recorded in the datastore are relative to (the workflow's working directory; default the current directory).
    ``batch_size``: queries per encoder pass, search and scoring step of ``predict_batch`` (a memory bound only).
    """

    def __init__(self, checkpoint: str, datastore: str, model: str = "npm", settings: Settings | None = None,
                 bm25: str | None = None, faiss: str | None = None, l_max: int = 10, exclude_stopwords: bool = True,
                 device=None, root: str | Path | None = None, batch_size: int = BATCH_SIZE):
        if model not in MODELS:
            raise ValueError(f"model must be one of {list(MODELS)}, not {model!r}")
        self.model, self.settings = model, settings or Settings()
        self.l_max, self.exclude_stopwords = l_max, exclude_stopwords
        self.root = Path(root) if root is not None else None
        self.ds = load_datastore(datastore, expected_model=checkpoint)
        self.tokenizer = load_tokenizer(checkpoint)
        self.encoder = load_encoder(checkpoint).eval()
        if device is not None:
            self.encoder.to(device)
        if self.encoder.config.hidden_size != self.ds.hidden_size:
            raise ValueError(f"checkpoint {checkpoint} has hidden size {self.encoder.config.hidden_size}, the "
                             f"datastore {datastore} {self.ds.hidden_size}")
        # Absolute now: opened on first use, perhaps after a chdir, and the JVM (Lucene) keeps its start-up
        # directory, so a relative BM25 path would be read from wherever Python started.
        self._bm25_path, self._faiss_path = (None if x is None else str(Path(x).absolute()) for x in (bm25, faiss))
        self._bm25 = self._faiss = self._open_filter = None
        self._exact: ExactKnn | bool | None = None  # closed-set exact search; False: the index is not Flat ip
        self.batch_size = batch_size
        self._missing: dict[str, str] = {}  # from_config: index -> the Snakemake target that builds it
        self._texts = [None] * len(self.ds.sources)
        self.scale = 1.0 / math.sqrt(self.ds.hidden_size)

    @classmethod
    def from_config(cls, model: str = "npm", corpus: str = "enwiki", config: str | Path = "config/config.yaml",
                    root: str | Path = ".", **overrides) -> Predictor:
        """The Predictor of ``model`` (npm or npm_single) over reference corpus ``corpus``, where the workflow
        builds them: the checkpoint of config ``models.{model}`` (a hub id, a folder or ``pypi:PACKAGE/SUBDIR``;
        null = ``results/models/{model}``, trained by rule pretrain), the datastore ``data/datastore/{model}/
        {corpus}``, the FAISS index ``data/index/{model}/{corpus}.faiss`` and the BM25 index ``data/bm25/{corpus}``.

        ``root`` is the workflow's working directory: relative paths (``config`` included) are resolved against
        it. The switches come from the config's ``inference`` section (``Settings.from_mapping``); ``overrides``
        are keyword arguments of ``Predictor`` (``l_max``, ``device``, ``settings``, ...) or fields of ``Settings``
        (``open_set_tau``, ``k``, ...), and win over the config. A missing checkpoint or datastore is a
        FileNotFoundError naming the path and the Snakemake target that builds it; a missing FAISS or BM25 index is
        reported so only when a mode needs it.
        """
        root = Path(root).expanduser()
        config_path = Path(config).expanduser()
        if not config_path.is_absolute():
            config_path = root / config_path
        if not config_path.is_file():
            raise FileNotFoundError(f"config file {config_path} does not exist (config= is relative to root={root})")
        cfg = read_yaml(config_path) or {}  # a YAML syntax error names the file, line and column
        try:
            settings = Settings.from_mapping(cfg.get("inference"))
        except ValueError as e:
            raise ValueError(f"{config_path}: {e}") from None
        fields = {name: overrides.pop(name) for name in list(overrides) if name in Settings.__dataclass_fields__}
        settings = dataclasses.replace(overrides.pop("settings", settings), **fields)
        if model not in MODELS:
            raise ValueError(f"model {model!r} has no datastore; use one of {list(MODELS)}")

        def target(rel: str) -> str:
            where = "" if root.resolve() == Path.cwd().resolve() else f"cd {root} && "
            return f"{where}snakemake {rel}"

        def need(rel: str, what: str) -> str:
            path = root / rel
            if not path.exists():
                raise FileNotFoundError(f"{what} {path} does not exist; build it with `{target(rel)}`")
            return str(path)

        released = (cfg.get("models") or {}).get(model)
        if released is None:
            checkpoint = need(f"results/models/{model}", f"model {model!r} (config models.{model}: null) checkpoint")
        else:
            checkpoint = _released_checkpoint(str(released), root, f"{config_path}: models.{model}")
        datastore = str(Path(need(f"data/datastore/{model}/{corpus}/meta.json",
                                  f"datastore of model {model!r} on corpus {corpus!r}:")).parent)
        optional = {"faiss": f"data/index/{model}/{corpus}.faiss", "bm25": f"data/bm25/{corpus}"}
        paths = {name: str(root / rel) if (root / rel).exists() else None for name, rel in optional.items()}
        predictor = cls(checkpoint, datastore, model, settings, **{**paths, "root": root, **overrides})
        predictor._missing = {name: f"{root / rel} does not exist; build it with `{target(rel)}`"
                              for name, rel in optional.items() if name not in overrides and paths[name] is None}
        return predictor

    # -- retrieval back-ends, opened on first use

    def _bm25_searcher(self):
        if self._bm25 is None:
            if self._bm25_path is None:
                raise ValueError("restricted mode needs a BM25 index (bm25=...)"
                                 + (f": {self._missing['bm25']}" if "bm25" in self._missing else ""))

            # The index must be of this datastore's blocks: its block ids are read as the datastore's blocks.
            self._bm25 = Bm25Searcher(self._bm25_path, corpus_fingerprint=self.ds.corpus_fingerprint,
                                      corpus=f"datastore {self.ds.root}", blocks=self.ds.sources)
        return self._bm25

    def _faiss_index(self):
        if self._faiss is None:
            if self._faiss_path is None:
                raise ValueError("FAISS mode needs a FAISS index (faiss=...)"
                                 + (f": {self._missing['faiss']}" if "faiss" in self._missing else ""))

            # Built from this datastore (plan: tokens + model + settings), not only of the same size.
            self._faiss = load_faiss_index(self._faiss_path, datastore=self.ds)
        return self._faiss

    def encode(self, texts: list[str], batch_size: int | None = None) -> np.ndarray:
        """Query vectors float32 [n, 2 or 1, h], in length-sorted encoder passes of ``batch_size`` queries (default
        ``npm.inference.query.pass_size``)."""
        return encode_queries(self.encoder, self.tokenizer, texts, n_masks=2 if self.model == "npm" else 1,
                              batch_size=batch_size)

    def retrieve_blocks(self, text: str, is_question: bool | None = None) -> np.ndarray:
        """Global block ids of the BM25 top blocks for a query (paper-map §3.8 query strings)."""
        return self.retrieve_blocks_batch([text], [is_question])[0]

    def retrieve_blocks_batch(self, texts: Sequence[str], is_question: Sequence[bool | None]) -> list[np.ndarray]:
        """``retrieve_blocks`` for many queries: one Lucene batch search on the thread policy's threads."""
        queries = [bm25_query(t, "?" in t.split("<mask>")[0] if iq is None else iq)
                   for t, iq in zip(texts, is_question, strict=True)]
        hits = self._bm25_searcher().batch_search(queries, k=self.settings.restricted_blocks, threads=threads())
        return [ids for ids, _ in hits]

    # -- the candidate blocks of a batch of queries, laid end to end

    def _view(self, blocks: np.ndarray, query: np.ndarray | None = None) -> dict:
        """The tokens of ``blocks`` laid end to end (a block may come twice, for two queries): per position its
        token id, datastore row (-1: no vector, or a stop word in open-set mode), view block, ``query`` (the query
        index of each block; default 0) and boundary flags. Array operations only, whatever the batch size."""
        ds = self.ds
        blocks = np.asarray(blocks, dtype=np.int64)
        query = np.zeros(len(blocks), np.int64) if query is None else np.asarray(query, dtype=np.int64)
        starts, ends = ds.block_offsets[blocks], ds.block_offsets[blocks + 1]
        lengths = ends - starts
        local_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        block = np.repeat(np.arange(len(blocks)), lengths)
        glob = starts[block] + np.arange(local_offsets[-1]) - local_offsets[:-1][block]
        flags = ds.flags[glob]
        ids = ds.input_ids[glob].astype(np.int64)
        stop = np.isin(ids, ds.stopword_ids)
        has_vector = (flags & STORED) != 0
        # A stored position's row: its block's first row + its rank among the block's stored positions.
        before = np.concatenate([[0], np.cumsum(has_vector)])
        rank = before[1:] - 1 - before[local_offsets[:-1]][block]
        rows = np.where(has_vector, ds.row_offsets[blocks][block] + rank, -1)
        # Open-set mode ignores stop-word vectors: the same candidates as a datastore built without them
        # (paper-map §3.3), so one datastore per (model, corpus) serves closed- and open-set tasks.
        stored = has_vector & ~stop
        rows[~stored] = -1
        blocked = (flags & SPECIAL) != 0
        if self.exclude_stopwords:
            blocked |= stop
        return {
            "blocks": blocks, "offsets": local_offsets, "ids": ids, "rows": rows, "block": block,
            "query": query[block],
            "valid_start": valid_starts(flags, local_offsets) & stored,
            "valid_end": valid_ends(flags, local_offsets) & stored,
            "blocked": blocked,
        }

    def _local_positions(self, view: dict, query: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """View positions of datastore ``rows`` of queries ``query`` (each row looked up among its own query's
        blocks); rows the view does not use (stop words in open-set mode) are dropped."""
        used = view["rows"] >= 0
        key = np.where(used, view["query"] * self.ds.n_rows + view["rows"], -1)
        order = np.argsort(key, kind="stable")
        sorted_key = key[order]
        want = np.asarray(query, np.int64) * self.ds.n_rows + np.asarray(rows, np.int64)
        i = np.minimum(np.searchsorted(sorted_key, want), len(order) - 1)
        found = sorted_key[i] == want if len(order) else np.zeros(len(want), bool)
        return order[i[found]]

    def _sims(self, view: dict, positions: np.ndarray, *qs: np.ndarray) -> list[np.ndarray]:
        """Exact q . e / sqrt(h) (float32) of sorted view ``positions``, each with its own query's vector, for each
        ``q`` [n_queries, h] of ``qs`` (the stored vectors are read once for all of them); one matrix-vector product
        per query, as for a query alone."""
        vecs = self.ds.vectors(view["rows"][positions])
        sims = []
        for q in qs:
            out = np.empty(len(positions), np.float32)
            for i, a, e in runs(view["query"][positions]):
                out[a:e] = vecs[a:e] @ q[i] * self.scale
            sims.append(out)
        return sims

    def _open_rows(self):
        """The FAISS row filter of open-set search: every row but the stop-word vectors (the original's open-set
        datastore holds none, so they never take one of the k places), built on first use."""
        if self._open_filter is None:
            content = ~np.isin(self.ds.row_tokens, self.ds.stopword_ids)  # per row; the filter is per FAISS id
            self._open_filter = RowFilter(content[self.ds.index_rows(np.arange(self.ds.n_rows))])
        return self._open_filter

    # -- surface strings and evidence

    def _blocks_text(self, src: int) -> dict:
        if self._texts[src] is None:
            path = Path(self.ds.sources[src])
            if self.root is not None and not path.is_absolute():
                path = self.root / path
            if not path.exists():
                raise FileNotFoundError(f"{path}: the blocks file this datastore was built from is needed for the "
                                        "surface text; run from the workflow's working directory")
            arrays = load_blocks(path, text=True)
            self._texts[src] = {k: arrays[k] for k in ("block_offsets", "text", "text_offsets", "token_spans")}
        return self._texts[src]

    def block_text(self, block: int) -> str:
        src, local = self.ds.block_source([block])
        t = self._blocks_text(int(src[0]))
        a, e = t["text_offsets"][local[0]], t["text_offsets"][local[0] + 1]
        return t["text"][a:e].tobytes().decode("utf-8", "surrogatepass")

    def surface(self, block: int, start: int, end: int) -> str:
        """Exact corpus text of tokens ``start..end`` (inclusive positions) of global ``block``."""
        src, local = self.ds.block_source([block])
        t = self._blocks_text(int(src[0]))
        base = t["block_offsets"][local[0]]
        a, e = t["text_offsets"][local[0]], t["text_offsets"][local[0] + 1]
        raw = t["text"][a:e].tobytes()
        return raw[t["token_spans"][base + start, 0]:t["token_spans"][base + end, 1]].decode("utf-8", "replace")

    # -- prediction

    def predict(self, text: str, top: int = 5, mode: str = "restricted", is_question: bool | None = None) -> list:
        """Top phrases for one query: dicts with ``text``, ``score``, ``occurrences`` and ``evidence``
        (global block id, block text) for up to three supporting blocks. ``mode``: ``restricted`` (the BM25 top
        blocks) or ``faiss`` (the k nearest vectors); ``is_question`` (BM25 query form) None = "?" before the mask.
        The same as ``predict_batch([text], ...)[0]``."""
        return self.predict_batch([text], top=top, mode=mode, is_question=is_question)[0]

    def predict_batch(self, texts: Sequence[str], top: int = 5, mode: str = "restricted",
                      is_question: bool | None | Sequence[bool | None] = None,
                      batch_size: int | None = None) -> list[list[dict]]:
        """``predict`` for many queries: one list of phrase dicts per query, in order. Batches of ``batch_size``
        queries (default ``self.batch_size``) go through the encoder in one pass, BM25 or FAISS in one search and
        the span scoring in one set of array operations; the answers are those of one query at a time.
        ``is_question``: one value for every query or one per query."""
        if isinstance(texts, str):
            raise TypeError("predict_batch takes a list of queries; use predict for one")
        texts = list(texts)
        _check_mode(mode)
        questions = [is_question] * len(texts) if is_question is None or isinstance(is_question, bool) \
            else list(is_question)
        if len(questions) != len(texts):
            raise ValueError(f"is_question has {len(questions)} values for {len(texts)} queries")
        size = operator.index(batch_size or self.batch_size)
        if size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {size}")
        out: list[list[dict]] = []
        for a in range(0, len(texts), size):
            chunk = texts[a:a + size]
            out += self._predict(chunk, self.encode(chunk), top, mode, questions[a:a + size])
        return out

    def predict_vectors(self, text: str, q: np.ndarray, top: int = 5, mode: str = "restricted",
                        is_question: bool | None = None) -> list:
        """``predict`` from the query's precomputed vectors ``q`` (float32 [2 or 1, h], a row of ``encode``);
        ``text`` gives the BM25 query of restricted mode."""
        _check_mode(mode)
        return self._predict([text], np.asarray(q, np.float32)[None], top, mode, [is_question])[0]

    def _predict(self, texts: list[str], vectors: np.ndarray, top: int, mode: str,
                 questions: list[bool | None]) -> list[list[dict]]:
        """The phrases of a batch of queries with vectors [n, 2 or 1, h]: every query's candidates in one view."""
        n = len(texts)
        if mode == "restricted":
            hits = self.retrieve_blocks_batch(texts, questions)
            view = self._view(np.concatenate(hits), np.repeat(np.arange(n), [len(b) for b in hits]))
            start_cand = end_cand = np.flatnonzero(view["rows"] >= 0)
            return self._score(view, start_cand, end_cand, vectors, top, n)
        found = self._faiss_search(vectors)  # one FAISS search, then the views and spans of a few queries at a time
        out: list[list[dict]] = []
        for a in range(0, n, UNRESTRICTED_CHUNK):
            chunk = vectors[a:a + UNRESTRICTED_CHUNK]
            view, start_cand, end_cand = self._faiss_candidates(chunk, tuple(x[a:a + len(chunk)] for x in found))
            out += self._score(view, start_cand, end_cand, chunk, top, len(chunk))
        return out

    def _score(self, view: dict, start_cand: np.ndarray, end_cand: np.ndarray, vectors: np.ndarray, top: int,
               n: int) -> list[list[dict]]:
        """Spans, their weights and the top phrases of ``n`` queries from their candidates in ``view``."""
        s = self.settings
        if self.model == "npm_single":
            pos = np.unique(start_cand)
            weights = softmax(self._sims(view, pos, vectors[:, 0])[0] / s.open_set_tau, view["query"][pos])
            span_start = span_end = pos
        else:
            span_start, span_end = walk_spans(start_cand, end_cand, view["block"], view["valid_start"],
                                              view["valid_end"], view["blocked"], self.l_max, s.span_walk)
            start_pos = np.union1d(start_cand, span_start)
            end_pos = np.union1d(end_cand, span_end)
            if np.array_equal(start_pos, end_pos):  # restricted mode: every stored vector is both
                start_sim, end_sim = self._sims(view, start_pos, vectors[:, 0], vectors[:, -1])
            else:
                start_sim = self._sims(view, start_pos, vectors[:, 0])[0]
                end_sim = self._sims(view, end_pos, vectors[:, -1])[0]
            weights = score_spans(span_start, span_end, start_pos, start_sim, end_pos, end_sim,
                                  open_set_tau=s.open_set_tau, form=s.span_score, query=view["query"])
        return self._phrases(view, span_start, span_end, weights, top, n)

    def _faiss_search(self, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Unrestricted mode (paper 6.4): the k nearest non-stop-word rows of every query vector, all queries in one
        FAISS search: rows and valid [n, 2 or 1, k]."""
        n, m, h = vectors.shape
        rows, valid = search(self._faiss_index(), vectors.reshape(n * m, h), self.settings.k,
                             rows=self._open_rows())
        rows = self.ds.index_rows(rows)
        return rows.reshape(n, m, -1), valid.reshape(n, m, -1)

    def _faiss_candidates(self, vectors: np.ndarray, found: tuple[np.ndarray, np.ndarray] | None = None
                          ) -> tuple[dict, np.ndarray, np.ndarray]:
        """The view of each query's blocks and the start / end candidate positions of unrestricted mode, from the
        search ``found`` (default: ``_faiss_search(vectors)``). NPM's start candidates are valid word starts and its
        end candidates valid word ends (the walk begins only there, so nothing else enters the span softmax,
        paper-map §3.7)."""
        n, m, _ = vectors.shape
        rows, valid = found if found is not None else self._faiss_search(vectors)
        query = np.broadcast_to(np.arange(n)[:, None, None], rows.shape)[valid]
        side = np.broadcast_to(np.arange(m)[None, :, None], rows.shape)[valid]
        rows = rows[valid]
        blocks = self.ds.row_blocks(rows)
        pairs = np.unique(np.stack([query, blocks], axis=1), axis=0) if len(rows) else np.zeros((0, 2), np.int64)
        view = self._view(pairs[:, 1], pairs[:, 0])
        start_cand = self._local_positions(view, query[side == 0], rows[side == 0])
        end_cand = self._local_positions(view, query[side == m - 1], rows[side == m - 1])
        if self.model == "npm":
            start_cand = start_cand[view["valid_start"][start_cand]]
            end_cand = end_cand[view["valid_end"][end_cand]]
        return view, start_cand, end_cand

    def _phrases(self, view: dict, span_start: np.ndarray, span_end: np.ndarray, weights: np.ndarray, top: int,
                 n: int) -> list[list[dict]]:
        """The ``top`` phrases of each of the ``n`` queries, from the weights of all their span occurrences."""
        query = view["query"][span_start]
        order, group, scores = aggregate_spans(view["ids"], span_start, span_end, weights, query=query)
        group_query = np.zeros(len(scores), np.int64)
        group_query[group] = query
        by_query = np.searchsorted(group_query[order], np.arange(n + 1))
        occurrences = np.lexsort((-weights, group))  # per phrase, best occurrence first (ties: corpus order)
        first = np.concatenate([[0], np.cumsum(np.bincount(group, minlength=len(scores)))])
        out = []
        for i in range(n):
            phrases = []
            for g in order[by_query[i]:by_query[i + 1]][:top]:
                occ = occurrences[first[g]:first[g + 1]]
                in_view = view["block"][span_start[occ]]  # view block of each occurrence
                blocks = view["blocks"][in_view]
                best = occ[0]
                base = view["offsets"][in_view[0]]
                phrases.append({
                    "text": self.surface(int(blocks[0]), int(span_start[best] - base),
                                         int(span_end[best] - base)).strip(),
                    "score": float(scores[g]),
                    "occurrences": len(occ),
                    "evidence": [(int(x), self.block_text(int(x))) for x in dict.fromkeys(blocks.tolist())][:3],
                })
            out.append(phrases)
        return out

    def knn(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """Closed-set neighbours (paper-map §4.1): token ids and exact scores q . e / sqrt(h) of the k nearest
        stored vectors, of the start and the end query concatenated for NPM."""
        return self.knn_vectors(self.encode([text]))[0]

    def knn_vectors(self, vectors: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """``knn`` of a batch of encoded queries (float32 [n, 2 or 1, h], from ``encode``): one search for all
        their vectors (``_knn_search``), one token-id lookup for all neighbours; a (token ids, exact scores) pair
        per query. Each vector's neighbours are listed by exact score, descending, equal ones by row id
        descending (FAISS's order for equal scores), so that the list, and the label scores summed over it, do not
        depend on how the search rounded its own scores (FAISS's one-vector and batched paths, or torch's, can order
        two neighbours a rounding apart either way)."""
        n, m, h = vectors.shape
        flat = np.ascontiguousarray(vectors.reshape(n * m, h), dtype=np.float32)
        rows, valid = self._knn_search(flat)
        rows = self.ds.index_rows(rows)
        sims = exact_scores(flat, rows, self.ds.vectors)
        rows, valid, sims = _by_exact_score(rows, valid, sims)
        rows, valid, sims = rows.reshape(n, -1), valid.reshape(n, -1), sims.reshape(n, -1)
        ids = self.ds.row_token_ids(rows[valid])
        cut = np.cumsum(valid.sum(axis=1))[:-1]
        return list(zip(np.split(ids, cut), np.split(sims[valid], cut), strict=True))

    def _knn_search(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The k nearest FAISS ids of every vector: rows and valid [q, k']. Over a Flat inner-product index (the
        embedded default) an exact search in torch (``npm.datastore.exact_knn``): FAISS Flat's neighbours in its
        order, faster at k = 4096, on the encoder's device (a GPU without faiss-gpu; there the datastore's fp16
        vectors are copied to it once). Any other index (IVF-PQ, HNSW at paper scale) is searched by FAISS."""
        index = self._faiss_index()
        if self._exact is None:
            vectors = flat_vectors(index)
            device = next(self.encoder.parameters()).device
            if vectors is None:
                self._exact = False
            elif device.type == "cpu":  # the index's own fp32 vectors: nothing widened at search time
                self._exact = ExactKnn([(0, vectors)])
            else:  # the same rows (a FAISS id is a stored row), fp16 on the device
                self._exact = ExactKnn(self.ds.iter_vectors(), device)
        if self._exact is False:
            return search(index, flat, self.settings.k)
        rows, _ = self._exact.search(flat, self.settings.k)
        return rows, np.ones(rows.shape, bool)

    def label_scores(self, text: str, verbalizers: list[np.ndarray], tau: float | None = None,
                     tau_twice: bool | None = None) -> np.ndarray:
        """Closed-set label scores; ``tau`` / ``tau_twice`` None = ``settings.closed_set_tau`` / ``tau_twice``."""
        tau = self.settings.closed_set_tau if tau is None else tau
        tau_twice = self.settings.tau_twice if tau_twice is None else tau_twice
        ids, sims = self.knn(text)
        return label_scores(ids, sims, verbalizers, tau=tau, tau_twice=tau_twice and self.model == "npm")


def _by_exact_score(rows: np.ndarray, valid: np.ndarray, sims: np.ndarray) -> tuple[np.ndarray, ...]:
    """``rows``, ``valid`` and ``sims`` [q, k] with each row's neighbours ordered by ``sims`` descending, equal
    ones by row id descending: one stable sort of a list the search has nearly sorted already (3 ms for 256 x 4096),
    and a full two-key sort only for the lists that hold equal scores."""
    order = np.argsort(-sims, axis=1, kind="stable")
    rows, valid, sims = (np.take_along_axis(a, order, axis=1) for a in (rows, valid, sims))
    tied = np.flatnonzero((sims[:, 1:] == sims[:, :-1]).any(axis=1))
    if len(tied):
        order = np.lexsort((-rows[tied], -sims[tied]), axis=1)
        for a in (rows, valid, sims):
            a[tied] = np.take_along_axis(a[tied], order, axis=1)
    return rows, valid, sims


def _check_mode(mode: str) -> None:
    if mode not in ("restricted", "faiss"):
        raise ValueError(f"mode must be 'restricted' or 'faiss', not {mode!r}")


def _released_checkpoint(name: str, root: Path, key: str) -> str:
    """The checkpoint that config ``models`` names, resolved as the workflow does (``npm.model.locate_checkpoint``):
    its local folder, or the hub id itself; anything else is a FileNotFoundError naming ``key``."""
    try:
        return locate_checkpoint(name, root) or name
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{key}: {e}; null uses results/models/ trained by rule pretrain") from None
