"""The DensePhrases Python API (docs/paper-map.md §D1.5): load a model, its phrase dump and index once, answer batches
of questions with phrases and their evidence.

    searcher = PhraseSearcher("results/densephrases/model", "data/densephrases/dump", "data/densephrases/index.faiss")
    searcher.search(["What is the capital of Greece?"])[0][0]   # {"text", "score", "passage", "doc", "context", ...}

A phrase's text is the exact surface string of its tokens in the corpus (the blocks' ``token_spans``), its evidence the
passage (block) text and the document id.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from npm.boundaries import SPACE_BEFORE, SPECIAL
from npm.data.blocks import load_blocks
from npm.datastore.faiss_index import search as faiss_search
from npm.densephrases.dump import PhraseDump, load_index
from npm.densephrases.model import DensePhrases
from npm.densephrases.search import IndexVectors, code_partners, phrase_scores, search
from npm.model import autocast, torch_device
from npm.settings import PHRASE_VECTORS, SEARCH_FORMS, DensePhrasesSettings

MAX_QUESTION_TOKENS = 64


class PhraseSearcher:
    def __init__(self, model_dir: str | os.PathLike, dump_dir: str | os.PathLike, index_path: str | os.PathLike,
                 nprobe: int | None = None, device: str | None = None, precision: str = "fp32",
                 vectors: str = DensePhrasesSettings.vectors, model=None):
        """``device`` (default CUDA when available) and ``precision`` (``npm.model.autocast``) of the query
        encoders; the search itself runs on the CPU over the FAISS index. ``vectors``: what phrases are scored
        from, the dump's fp16 vectors (``dump``) or the index's own codes (``index``: the dump's vectors are never
        read, the index is all that is kept on disk; ``npm.densephrases.search.IndexVectors``). ``model``: the
        ``DensePhrases`` of ``model_dir`` already loaded (None: loaded here)."""
        if vectors not in PHRASE_VECTORS:
            raise ValueError(f"vectors must be one of {PHRASE_VECTORS}, got {vectors!r}")
        self.dump = PhraseDump(dump_dir, vectors=vectors == "dump")
        self.index = load_index(index_path, self.dump, model_dir)
        self.vectors = self.dump.vectors if vectors == "dump" else IndexVectors(self.index)
        if nprobe is not None:
            import faiss

            faiss.ParameterSpace().set_index_parameter(self.index, "nprobe", int(nprobe))
        self.device, self.precision = torch_device(device), precision
        self.model = (DensePhrases.load(model_dir) if model is None else model).eval().to(self.device)
        self._files, firsts_b, firsts_t = [], [0], [0]
        for path in self.dump.meta["blocks"]:
            arrays = load_blocks(path, text=True)
            self._files.append({k: arrays[k] for k in ("text", "text_offsets", "token_spans", "block_doc", "doc_ids",
                                                       "flags", "block_offsets")})
            firsts_b.append(firsts_b[-1] + len(arrays["block_doc"]))
            firsts_t.append(firsts_t[-1] + len(arrays["input_ids"]))
        self._first_block, self._first_token = np.asarray(firsts_b), np.asarray(firsts_t)
        self._word_counts: dict[int, np.ndarray] = {}

    def tokenize(self, questions: list[str]) -> dict:
        """The query encoders' inputs (``input_ids``, ``attention_mask``); an empty question is a ValueError naming
        it."""
        empty = [i for i, q in enumerate(questions) if not str(q).strip()]
        if empty:
            raise ValueError(f"question {empty[0]} has no text: DensePhrases needs a question to encode")
        return self.model.tokenizer(list(questions), padding=True, truncation=True, max_length=MAX_QUESTION_TOKENS,
                                    return_tensors="pt").to(self.device)

    def query_vectors(self, questions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """q_start, q_end [n, d] of the questions on the model's device (with gradient unless called in inference
        mode)."""
        enc = self.tokenize(questions)
        with autocast(self.device, self.precision):
            return self.model.query_vectors(enc["input_ids"], enc["attention_mask"])

    def encode(self, questions: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """q_start, q_end float32 [n, d] of the questions."""
        with torch.inference_mode():
            qs, qe = self.query_vectors(questions)
        return qs.float().cpu().numpy(), qe.float().cpu().numpy()

    def phrase(self, i: int, j: int, score: float, whole_words: bool = False) -> dict:
        """Phrase (dump rows i, j) with its exact surface text, passage, document and passage text. ``whole_words``:
        from the start of the whitespace-delimited word of row i to the end of that of row j, as the original code
        answers (``word2char_start[f2o_start[i]]``, :meth:`word_counts`)."""
        ti, tj = int(self.dump.token[i]), int(self.dump.token[j])
        f = int(np.searchsorted(self._first_token, ti, side="right") - 1)
        arrays = self._files[f]
        if whole_words:
            counts, first = self.word_counts(f), int(self._first_token[f])
            ti = first + int(np.searchsorted(counts, counts[ti - first], side="left"))
            tj = first + int(np.searchsorted(counts, counts[tj - first], side="right")) - 1
        b = int(self.dump.tokens.passage[i]) - int(self._first_block[f])
        base = int(arrays["text_offsets"][b])
        a = base + int(arrays["token_spans"][ti - self._first_token[f], 0])
        e = base + int(arrays["token_spans"][tj - self._first_token[f], 1])
        decode = lambda x, y: arrays["text"][x:y].tobytes().decode("utf-8", "surrogatepass")  # noqa: E731
        return {"text": decode(a, e), "score": float(score), "passage": int(self.dump.tokens.passage[i]),
                "doc": str(arrays["doc_ids"][arrays["block_doc"][b]]), "rows": [int(i), int(j)],
                "context": decode(base, int(arrays["text_offsets"][b + 1]))}

    def word_counts(self, f: int) -> np.ndarray:
        """int32 per token of blocks file ``f``: how many of its tokens up to this one begin a whitespace-delimited
        word (the original's words, SQuAD's ``doc_tokens``: a non-special token after whitespace, after a special
        token or first in its block) or are special, so that a word is a run of equal counts. Made on first use."""
        if f not in self._word_counts:
            arrays = self._files[f]
            flags = np.asarray(arrays["flags"])
            special = (flags & SPECIAL) != 0
            begins = special | ((flags & SPACE_BEFORE) != 0)
            begins[1:] |= special[:-1]
            begins[np.asarray(arrays["block_offsets"][:-1], dtype=np.int64)] = True
            self._word_counts[f] = np.cumsum(begins, dtype=np.int32)
        return self._word_counts[f]

    def word_gap(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """int64, the shape of dump rows ``a`` and ``b`` (``a <= b``, each pair in one segment): the whitespace
        words from row a's word to row b's (0: the same word)."""
        ta, tb = self.dump.token[np.asarray(a)], self.dump.token[np.asarray(b)]
        f = np.searchsorted(self._first_token, tb, side="right") - 1
        out = np.zeros(tb.shape, dtype=np.int64)
        for u in np.unique(f):
            sel, first = f == u, int(self._first_token[u])
            counts = self.word_counts(int(u))
            out[sel] = counts[tb[sel] - first].astype(np.int64) - counts[np.maximum(ta[sel] - first, 0)]
        return out

    def code_candidates(self, q_start: np.ndarray, q_end: np.ndarray, k: int, max_words: int) -> list[np.ndarray]:
        """The original code's phrase candidates (``MIPS.search_phrase``, as its query-side fine-tuning draws them)
        of each question: the dump rows (i, j) int64 [G, 2] of its top-``k`` starts, each with its best end, then of
        its top-``k`` ends, each with its best start (``npm.densephrases.search.code_partners``); G <= 2 k, fewer
        where a retrieved row has no partner. Duplicates are kept, as the code keeps them."""
        qs = np.array(q_start, dtype=np.float32, ndmin=2)
        qe = np.array(q_end, dtype=np.float32, ndmin=2)
        top_starts, _ = faiss_search(self.index, qs, k)
        top_ends, _ = faiss_search(self.index, qe, k)
        out = []
        for n in range(len(qs)):
            ends = code_partners(top_starts[n], self.dump.tokens, self.word_gap, self.vectors, qe[n], max_words, 1)
            starts = code_partners(top_ends[n], self.dump.tokens, self.word_gap, self.vectors, qs[n], max_words, -1)
            pairs = np.stack([np.stack([top_starts[n], ends], 1), np.stack([starts, top_ends[n]], 1)], 1)
            pairs = pairs.reshape(-1, 2)  # the code's order: each rank's start group, then its end group
            out.append(pairs[(pairs >= 0).all(1)].astype(np.int64))
        return out

    def code_ranked(self, q_start: np.ndarray, q_end: np.ndarray, k: int, max_words: int
                    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """The original code's answers (``MIPS.search``): each question's :meth:`code_candidates` groups sorted by
        q_start . h_i + q_end . h_j, best first, the code's order on a tie (a stable sort); (pairs [G, 2], scores
        [G])."""
        out = []
        for qs, qe, pairs in zip(q_start, q_end, self.code_candidates(q_start, q_end, k, max_words), strict=True):
            scores = phrase_scores(self.vectors, qs, qe, pairs) if len(pairs) else np.zeros(0, dtype=np.float32)
            order = np.argsort(-scores, kind="stable")
            out.append((pairs[order], scores[order]))
        return out

    def search(self, questions: list[str], k: int = 10, max_words: int = 20, top_n: int = 10,
               refine_factor: int = DensePhrasesSettings.refine_factor,
               search_form: str = DensePhrasesSettings.search_form) -> list[list[dict]]:
        """The best ``top_n`` phrases of each question, best first, phrases of identical text merged into their
        best occurrence (the original's de-duplication). ``search_form``: ``paper``, eq. 10
        (``npm.densephrases.search.search``, ``refine_factor`` there); ``code``, the original's groups
        (:meth:`code_ranked`), their texts in whole whitespace words."""
        if search_form not in SEARCH_FORMS:
            raise ValueError(f"search_form must be one of {SEARCH_FORMS}, got {search_form!r}")
        if search_form == "code" and refine_factor > 1:
            raise ValueError(f"refine_factor {refine_factor} re-ranks eq. 10's candidates: search_form code has none")
        q_start, q_end = self.encode(questions)
        found = self.code_ranked(q_start, q_end, k, max_words) if search_form == "code" else \
            search(self.index, self.vectors, self.dump.tokens, q_start, q_end, k, max_words,
                   top_n=max(top_n * 4, top_n), refine_factor=refine_factor)
        out = []
        for pairs, scores in found:
            seen, best = set(), []
            for (i, j), s in zip(pairs.tolist(), scores.tolist(), strict=True):
                p = self.phrase(i, j, s, whole_words=search_form == "code")
                if p["text"] not in seen:
                    seen.add(p["text"])
                    best.append(p)
                if len(best) == top_n:
                    break
            out.append(best)
        return out
