"""``Predictor``: NPM / NPM-single predictions over a reference-corpus datastore (paper 3.1, 3.3; reference 3.6-3.8).

* NPM (``kind="npm"``): [MASK][MASK] query vectors; candidate positions from BM25 (``mode="restricted"``: every
  stored vector of the top-3 blocks, reference 3.8) or from FAISS (``mode="faiss"``: the k nearest start and end
  vectors); spans walked over word boundaries (``npm.inference.phrase``); exact scores from the stored vectors.
* NPM-single (``kind="npm_single"``): one query vector; every candidate votes for its own token with
  softmax(s / tau) (reference A.3); tokens are aggregated like one-token spans.

Every answer is the exact surface string of its best occurrence in the corpus text (so characters the tokenizer
maps to an unknown token come out right), with the blocks that support it as evidence.
``label_scores`` gives the closed-set scores of reference 4.1 (kNN token votes summed over verbalizers).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from npm.boundaries import SPECIAL, valid_ends, valid_starts
from npm.datastore.store import STORED
from npm.inference.closed_set import label_scores
from npm.inference.phrase import aggregate_spans, score_spans, walk_spans
from npm.inference.query import encode_queries


class Predictor:
    def __init__(self, model: str, datastore: str, kind: str = "npm", bm25: str | None = None,
                 faiss: str | None = None, tau: float = 1.0, l_max: int = 10, form: str = "paper",
                 exclude_stopwords: bool = True, open_set: bool = True, k: int = 4096, n_blocks: int = 3,
                 device=None):
        from npm.datastore.store import load_datastore
        from npm.model import load_encoder, load_tokenizer

        if kind not in ("npm", "npm_single"):
            raise ValueError(f"kind must be 'npm' or 'npm_single', not {kind!r}")
        self.kind, self.tau, self.l_max, self.form = kind, tau, l_max, form
        self.exclude_stopwords, self.open_set, self.k, self.n_blocks = exclude_stopwords, open_set, k, n_blocks
        self.ds = load_datastore(datastore, expected_model=model)
        self.tokenizer = load_tokenizer(model)
        self.model = load_encoder(model).eval()
        if device is not None:
            self.model.to(device)
        if self.model.config.hidden_size != self.ds.hidden_size:
            raise ValueError(f"model {model} has hidden size {self.model.config.hidden_size}, the datastore "
                             f"{datastore} {self.ds.hidden_size}")
        self._bm25_path, self._faiss_path = bm25, faiss
        self._bm25 = self._faiss = None
        self._texts = [None] * len(self.ds.sources)
        self.scale = 1.0 / math.sqrt(self.ds.hidden_size)

    # -- retrieval back-ends, opened on first use

    def _bm25_searcher(self):
        if self._bm25 is None:
            if self._bm25_path is None:
                raise ValueError("restricted mode needs a BM25 index (bm25=...)")
            from npm.datastore.bm25 import Bm25Searcher

            self._bm25 = Bm25Searcher(self._bm25_path)
            if len(self._bm25) > self.ds.n_blocks:  # blocks without text are not indexed
                raise ValueError(f"BM25 index {self._bm25_path} has {len(self._bm25)} blocks, the datastore "
                                 f"{self.ds.n_blocks}: they were built from different corpora")
        return self._bm25

    def _faiss_index(self):
        if self._faiss is None:
            if self._faiss_path is None:
                raise ValueError("FAISS mode needs a FAISS index (faiss=...)")
            from npm.datastore.faiss_index import load_faiss_index

            self._faiss = load_faiss_index(self._faiss_path)
            if self._faiss.ntotal != self.ds.n_rows:
                raise ValueError(f"FAISS index {self._faiss_path} has {self._faiss.ntotal} vectors, the datastore "
                                 f"{self.ds.n_rows}: rebuild the index")
        return self._faiss

    def encode(self, texts: list[str]) -> np.ndarray:
        """Query vectors float32 [n, 2 or 1, h]."""
        return encode_queries(self.model, self.tokenizer, texts, n_masks=2 if self.kind == "npm" else 1)

    def retrieve_blocks(self, text: str, is_question: bool | None = None) -> np.ndarray:
        """Global block ids of the BM25 top blocks for a query (reference 3.8 query strings)."""
        from npm.datastore.bm25 import bm25_query

        if is_question is None:
            is_question = "?" in text.split("<mask>")[0]
        return self._bm25_searcher().search(bm25_query(text, is_question), k=self.n_blocks)[0]

    # -- the blocks laid end to end

    def _view(self, blocks: np.ndarray) -> dict:
        ds = self.ds
        blocks = np.asarray(blocks, dtype=np.int64)
        starts, ends = ds.block_offsets[blocks], ds.block_offsets[blocks + 1]
        lengths = ends - starts
        local_offsets = np.concatenate([[0], np.cumsum(lengths)])
        glob = np.concatenate([np.arange(a, e) for a, e in zip(starts, ends, strict=True)]) if len(blocks) else \
            np.zeros(0, np.int64)
        flags = ds.flags[glob]
        ids = ds.input_ids[glob].astype(np.int64)
        stop = np.isin(ids, ds.stopword_ids)
        # Open-set mode ignores stop-word vectors: the same candidates as a datastore built without them
        # (reference 3.3), so one datastore per (model, corpus) serves closed- and open-set tasks.
        stored = ((flags & STORED) != 0) & ~(stop if self.open_set else False)
        rows = np.full(len(glob), -1, dtype=np.int64)
        for i, b in enumerate(blocks):
            r, pos = ds.block_rows(int(b))
            rows[local_offsets[i] + pos] = r
        rows[~stored] = -1
        blocked = (flags & SPECIAL) != 0
        if self.exclude_stopwords:
            blocked |= stop
        return {
            "blocks": blocks, "offsets": local_offsets, "ids": ids, "rows": rows,
            "block": np.repeat(np.arange(len(blocks)), lengths),
            "valid_start": valid_starts(flags, local_offsets) & stored,
            "valid_end": valid_ends(flags, local_offsets) & stored,
            "blocked": blocked,
        }

    def _local_positions(self, view: dict, rows: np.ndarray) -> np.ndarray:
        """Local positions in ``view`` of datastore ``rows``; rows the view does not use (stop words in open-set
        mode) are dropped."""
        order = np.argsort(view["rows"])
        sorted_rows = view["rows"][order]
        i = np.minimum(np.searchsorted(sorted_rows, rows), len(order) - 1)
        found = sorted_rows[i] == rows
        return order[i[found]]

    def _sims(self, view: dict, positions: np.ndarray, q: np.ndarray) -> np.ndarray:
        return self.ds.vectors(view["rows"][positions]) @ q * self.scale

    # -- surface strings and evidence

    def _blocks_text(self, src: int) -> dict:
        if self._texts[src] is None:
            from npm.data.blocks import load_blocks

            path = Path(self.ds.sources[src])
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
        (global block id, block text) for up to three supporting blocks."""
        q = self.encode([text])[0]
        if mode == "restricted":
            view = self._view(self.retrieve_blocks(text, is_question))
            start_cand = end_cand = np.flatnonzero(view["rows"] >= 0)
        elif mode == "faiss":
            from npm.datastore.faiss_index import search

            rows, valid = search(self._faiss_index(), q, self.k)
            rows = [r[v] for r, v in zip(rows, valid, strict=True)]
            blocks = np.unique(self.ds.row_to_position(np.concatenate(rows))[0])
            view = self._view(blocks)
            start_cand = self._local_positions(view, rows[0])
            end_cand = self._local_positions(view, rows[-1])
        else:
            raise ValueError(f"mode must be 'restricted' or 'faiss', not {mode!r}")
        if len(start_cand) == 0:
            return []
        if self.kind == "npm_single":
            pos = np.unique(start_cand)
            sims = self._sims(view, pos, q[0]) / self.tau
            weights = np.exp(sims - sims.max())
            weights /= weights.sum()
            span_start = span_end = pos
        else:
            span_start, span_end = walk_spans(start_cand, end_cand, view["block"], view["valid_start"],
                                              view["valid_end"], view["blocked"], self.l_max)
            if len(span_start) == 0:
                return []
            start_pos = np.union1d(start_cand, span_start)
            end_pos = np.union1d(end_cand, span_end)
            weights = score_spans(span_start, span_end, start_pos, self._sims(view, start_pos, q[0]), end_pos,
                                  self._sims(view, end_pos, q[1]), tau=self.tau, form=self.form)
        order, group, scores = aggregate_spans(view["ids"], span_start, span_end, weights)
        out = []
        for g in order[:top]:
            occ = np.flatnonzero(group == g)
            occ = occ[np.argsort(-weights[occ], kind="stable")]
            in_view = view["block"][span_start[occ]]  # view block of each occurrence
            blocks = view["blocks"][in_view]
            best = occ[0]
            base = view["offsets"][in_view[0]]
            out.append({
                "text": self.surface(int(blocks[0]), int(span_start[best] - base), int(span_end[best] - base)).strip(),
                "score": float(scores[g]),
                "occurrences": len(occ),
                "evidence": [(int(x), self.block_text(int(x))) for x in dict.fromkeys(blocks.tolist())][:3],
            })
        return out

    def knn(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """Closed-set neighbours (reference 4.1): token ids and exact scores q . e / sqrt(h) of the k nearest
        stored vectors, of the start and the end query concatenated for NPM."""
        from npm.datastore.faiss_index import exact_scores, search

        q = self.encode([text])[0]
        rows, valid = search(self._faiss_index(), q, self.k)
        sims = exact_scores(q, rows, self.ds.vectors)
        rows, sims = rows[valid], sims[valid]
        return self.ds.row_token_ids(rows), sims

    def label_scores(self, text: str, verbalizers: list[np.ndarray], tau: float = 5.0,
                     tau_twice: bool = False) -> np.ndarray:
        ids, sims = self.knn(text)
        return label_scores(ids, sims, verbalizers, tau=tau, tau_twice=tau_twice and self.kind == "npm")
