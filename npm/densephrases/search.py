"""DensePhrases' phrase search (Lee et al. 2021, section 5 and eq. 10; docs/paper-map.md §D1.5).

The phrase dump is the token vectors H [N, d] of every passage token laid end to end (the same flat layout as NPM's
datastore). :class:`PhraseTokens` says, per token, which passage it is in, which word of the passage, and whether it
begins or ends its word; special tokens ([CLS], [SEP], <s>, </s>) belong to no word and no phrase. A **phrase** is a
token pair (i, j) of one passage with i <= j, i the first token of a word, j the last token of a word, neither a
punctuation mark (a phrase "," or "Lebanon." is never an answer; the mark still counts as a word), spanning at
most L words (the paper: L = 20; the original code's ``max_answer_length``: 10) and no special token. Its score is
f(i, j) = q_start . h_i + q_end . h_j.

:func:`search` is eq. 10 as DensePhrases runs it: top-k MIPS for q_start and, separately, for q_end (any FAISS index
over H, ``npm.datastore.faiss_index``); every retrieved start i is extended to every end j of its passage within L
words, every retrieved end j to every start i; the candidates' scores are computed exactly from H (FAISS only picks
candidates), identical (i, j) pairs are scored once, and the best ``top_n`` come back. A retrieved start token that
does not begin a word (or a retrieved end that does not end one) yields no phrase.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from npm.boundaries import PUNCT_PIECE, SPECIAL, is_subword
from npm.datastore.faiss_index import search as faiss_search
from npm.settings import DensePhrasesSettings


@dataclass(frozen=True)
class PhraseTokens:
    """Per token of the dump: ``passage`` int64, ``segment`` int64 (a run of non-special tokens of one passage: a
    phrase never leaves its segment), ``word`` int64 (index of its word in the passage; -1 for a special token),
    ``word_start`` / ``word_end`` bool."""

    passage: np.ndarray
    segment: np.ndarray
    word: np.ndarray
    word_start: np.ndarray
    word_end: np.ndarray

    def __len__(self) -> int:
        return len(self.passage)

    def subset(self, rows: np.ndarray) -> PhraseTokens:
        """The table of the tokens ``rows`` (in order): the dump keeps only the tokens its filter lets through."""
        return PhraseTokens(**{name: values[rows] for name, values in self.arrays().items()})

    def arrays(self, prefix: str = "") -> dict[str, np.ndarray]:
        return {prefix + f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_arrays(cls, arrays, prefix: str = "") -> PhraseTokens:
        return cls(**{f.name: np.asarray(arrays[prefix + f.name]) for f in fields(cls)})

    @classmethod
    def from_flags(cls, flags: np.ndarray, passage_offsets: np.ndarray, first_passage: int = 0,
                   first_segment: int = 0) -> PhraseTokens:
        """From the token classes of ``npm.boundaries`` (``flags`` uint8 [N]) and the passages' token offsets
        [n_passages + 1] (a blocks file's ``block_offsets``; passage ids count from ``first_passage``, segment ids
        from ``first_segment``): a word begins at a non-special token that is not a subword piece (or at the first
        non-special token after a special one), and ends where the next token begins a word, is special, or is in
        another passage."""
        flags = np.asarray(flags)
        offsets = np.asarray(passage_offsets, dtype=np.int64)
        n = len(flags)
        if len(offsets) < 2 or offsets[0] != 0 or offsets[-1] != n or np.any(np.diff(offsets) < 0):
            raise ValueError(f"passage offsets must run from 0 to the {n} tokens, non-decreasing")
        local = np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))
        special = (flags & SPECIAL) != 0
        first = np.zeros(n, dtype=bool)
        first[offsets[:-1][offsets[:-1] < n]] = True  # a passage's first token
        after_special = np.zeros(n, dtype=bool)
        after_special[1:] = special[:-1]
        start = ~special & (~is_subword(flags) | first | after_special)
        end = np.zeros(n, dtype=bool)
        end[:-1] = start[1:] | special[1:] | (local[1:] != local[:-1])
        end[-1:] = True
        end &= ~special
        counts = np.cumsum(start)
        base = np.concatenate([[0], counts])[offsets[:-1]]  # words before each passage
        word = np.where(special, -1, counts - 1 - base[local])
        change = first | special | after_special
        segment = np.cumsum(change) - 1 + first_segment
        punct = (flags & PUNCT_PIECE) != 0  # a punctuation mark counts as a word but never begins or ends a phrase
        return cls(local + first_passage, segment.astype(np.int64), word.astype(np.int64), start & ~punct,
                   end & ~punct)


def candidates(starts: np.ndarray, ends: np.ndarray, tokens: PhraseTokens, max_words: int) -> np.ndarray:
    """The phrases (i, j) int64 [P, 2], unique and sorted, that extend the retrieved ``starts`` rightwards and the
    retrieved ``ends`` leftwards within ``max_words`` words of one segment. Only the rows next to each retrieved one
    are read (``tokens`` may be a sharded dump's memmaps: ``npm.densephrases.dump.Concat``)."""
    if max_words < 1:
        raise ValueError(f"max_words (L) must be >= 1, got {max_words}")
    n = len(tokens)
    s = np.asarray(starts, dtype=np.int64).reshape(-1)
    s = s[(s >= 0) & (s < n)]
    s = s[tokens.word_start[s]]
    e = np.asarray(ends, dtype=np.int64).reshape(-1)
    e = e[(e >= 0) & (e < n)]
    e = e[tokens.word_end[e]]
    pairs = [np.stack([i, j], 1) for i, j in (_reach(s, tokens, max_words, 1), _reach(e, tokens, max_words, -1)[::-1])]
    return np.unique(np.concatenate(pairs).astype(np.int64), axis=0)


def _reach(rows: np.ndarray, tokens: PhraseTokens, max_words: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """(retrieved row, other end) of every phrase from each of ``rows`` rightwards (``step`` 1: to the word ends)
    or leftwards (-1: to the word starts) within ``max_words`` words of its segment. The dump is ordered by (segment,
    word), so the rows a phrase may reach are a run next to the retrieved one: read a window of rows, doubled for the
    rows whose window the run fills."""
    n, found, other = len(tokens), [], []
    width = max_words + 1
    while len(rows):
        idx = rows[:, None] + step * np.arange(width)[None, :]
        valid = (idx >= 0) & (idx < n)
        idx = np.clip(idx, 0, n - 1)
        seg, word = tokens.segment[idx], tokens.word[idx]
        gap = (word - word[:, :1]) * step  # words from the retrieved row's word
        inside = valid & (seg == seg[:, :1]) & (gap < max_words)
        done = ~inside[:, -1]
        edge = tokens.word_end[idx] if step == 1 else tokens.word_start[idx]
        r, c = np.nonzero(inside[done] & edge[done])
        found.append(rows[done][r])
        other.append(idx[done][r, c])
        rows, width = rows[~done], width * 2
    if not found:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(found), np.concatenate(other)


def code_partners(rows: np.ndarray, tokens: PhraseTokens, word_gap, h, q: np.ndarray, max_words: int,
                  step: int) -> np.ndarray:
    """The original code's partner of each retrieved dump row (``MIPS.search_phrase``; -1 in ``rows``: none), -1
    where it has none: ``step`` 1, the best end of a retrieved start; -1, the best start of a retrieved end. It
    looks at the ``max_words`` dump rows that begin (end) at the retrieved one, keeps those of its segment that are
    at most ``max_words`` whitespace words away (``word_gap(a, b)``: words from row a's to row b's, a <= b; the
    code's ``f2o_start[end] - f2o_start[start] <= max_answer_length``, so up to L + 1 words), and takes the one with
    the highest q . h_row, the first in row order on a tie (``np.argmax``). Unlike :func:`candidates`, a retrieved
    row inside a word or on a punctuation mark is kept, as the code maps each row to its whole word."""
    rows = np.asarray(rows, dtype=np.int64)
    n, width = len(tokens), int(max_words)
    window = rows[:, None] + np.arange(width)[None, :] - (width - 1 if step == -1 else 0)  # [G, L], ascending
    own = 0 if step == 1 else width - 1  # the retrieved row's column
    ok = (window >= 0) & (window < n) & (rows[:, None] >= 0)
    idx = np.clip(window, 0, max(n - 1, 0))
    segment, word = tokens.segment[idx], tokens.word[idx]
    ok &= (segment == segment[:, own:own + 1]) & (word >= 0) & (word[:, own:own + 1] >= 0)
    a, b = (np.broadcast_to(idx[:, own:own + 1], idx.shape), idx)[::step]
    ok[ok] &= word_gap(a[ok], b[ok]) <= max_words
    scores = np.where(ok, np.asarray(h[idx], dtype=np.float32) @ np.asarray(q, dtype=np.float32), -np.inf)
    best = np.argmax(scores, axis=1)
    return np.where(ok.any(1), idx[np.arange(len(rows)), best], -1)


def phrase_scores(h: np.ndarray, q_start: np.ndarray, q_end: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """f(i, j) = q_start . h_i + q_end . h_j (float32 [P]) from the stored vectors (fp16 upcast)."""
    hi = np.asarray(h[pairs[:, 0]], dtype=np.float32)
    hj = np.asarray(h[pairs[:, 1]], dtype=np.float32)
    return (hi @ np.asarray(q_start, dtype=np.float32) + hj @ np.asarray(q_end, dtype=np.float32)).astype(np.float32)


class IndexVectors:
    """The rows of a FAISS index decoded from its own codes (``h[rows]``: float32 [..., d]), for
    :func:`phrase_scores` when the index is all that is kept on disk (no fp16 dump beside it): a quantised index's
    phrases are then scored, as they are retrieved, from its codes. An IVF index gets its id -> list map in memory."""

    def __init__(self, index):
        import faiss

        ivf = faiss.try_extract_index_ivf(index)
        if ivf is not None:
            ivf.make_direct_map()
        self.index, self.shape = index, (int(index.ntotal), int(index.d))

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        flat = rows.reshape(-1)
        out = self.index.reconstruct_batch(flat) if flat.size else np.zeros((0, self.shape[1]), np.float32)
        return out.reshape(rows.shape + (self.shape[1],))


def refine(rows: np.ndarray, h: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    """Of each question's candidate rows [Q, k'] (-1 = none), the ``k`` with the highest exact q . h_row (``h`` fp16
    upcast), best first, -1 padded: a compressed index's candidates re-ranked by the dump's vectors."""
    out = np.full((len(rows), k), -1, dtype=np.int64)
    for n, r in enumerate(rows):
        r = np.sort(r[r >= 0])  # in row order: sequential reads of the memmap
        if len(r):
            best = np.argsort(-(np.asarray(h[r], dtype=np.float32) @ q[n]), kind="stable")[:k]
            out[n, :len(best)] = r[best]
    return out


def search(index, h: np.ndarray, tokens: PhraseTokens, q_start: np.ndarray, q_end: np.ndarray, k: int,
           max_words: int = 20, top_n: int = 10,
           refine_factor: int = DensePhrasesSettings.refine_factor) -> list[tuple[np.ndarray, np.ndarray]]:
    """Eq. 10 for a batch of questions: per question, (phrases int64 [n, 2], scores float32 [n]) best first, at most
    ``top_n``. ``index`` is a FAISS index over the rows of ``h`` [N, d] (row = token), ``q_start`` / ``q_end``
    [Q, d]; ``k`` starts and ``k`` ends are retrieved per question. ``refine_factor`` r > 1: the index returns r k
    starts and r k ends, and the k of each with the highest exact inner product with the dump's vectors are kept
    (FAISS's IndexRefine idea, with the fp16 dump as the exact store): a compressed index then only has to rank the
    right tokens among its top r k."""
    if len(tokens) != len(h) or index.ntotal != len(h):
        raise ValueError(f"the index holds {index.ntotal} vectors, the dump {len(h)} and the token table "
                         f"{len(tokens)}: they are not one phrase dump")
    if refine_factor < 1:
        raise ValueError(f"refine_factor must be >= 1, got {refine_factor}")
    qs = np.array(q_start, dtype=np.float32, ndmin=2)
    qe = np.array(q_end, dtype=np.float32, ndmin=2)
    top_starts, _ = faiss_search(index, qs, k * refine_factor)
    top_ends, _ = faiss_search(index, qe, k * refine_factor)
    if refine_factor > 1:
        top_starts, top_ends = refine(top_starts, h, qs, k), refine(top_ends, h, qe, k)
    out = []
    for n in range(len(qs)):
        pairs = candidates(top_starts[n], top_ends[n], tokens, max_words)
        scores = phrase_scores(h, qs[n], qe[n], pairs)
        order = np.argsort(-scores, kind="stable")[:top_n]
        out.append((pairs[order], scores[order]))
    return out
