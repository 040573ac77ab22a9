"""NPM phrase prediction over the reference corpus (paper 3.1 and 3.3; paper-map §3.7, §9 items 22-23).

Pure functions on flat arrays of the candidate blocks laid end to end (``block`` gives each token's block, so
spans never cross blocks):

1. ``walk_spans``: from every start candidate that is a valid start, walk forward up to ``l_max`` tokens; every
   step that lands on a valid end gives a span. From every end candidate that is a valid end, walk backward the
   same way. A span never contains a blocked token (begin/end tokens, and stop words when they are excluded).
2. ``score_spans``: per occurrence, from exact similarities s = q . e / sqrt(h):
   * ``form="code"`` (the original implementation): P_start + P_end, each a softmax over its candidate set
     divided by tau (``open_set_tau``; a sum of two probabilities);
   * ``form="paper"`` (the paper's 3.1): exp(s_start / tau) + exp(s_end / tau), normalised over all occurrences.
   The candidate set of each side is the union of the retrieved candidates (restricted mode: every stored
   vector of the BM25 blocks; FAISS mode: the k neighbours) and the positions the walk reached.
3. ``aggregate_spans``: scores summed over every occurrence of the same token sequence; the prediction is the
   argmax of sum x length^alpha (alpha = 0 in every reported number).

A batch of queries is one set of arrays: the blocks of every query laid end to end, with ``query`` giving the query
of each position (nondecreasing, the queries' blocks in order). Softmaxes and phrase groups are then per query, and
each query's numbers are computed by exactly the operations that score it alone.
"""

from __future__ import annotations

import numpy as np

from npm.settings import Settings


def walk_spans(start_cand: np.ndarray, end_cand: np.ndarray, block: np.ndarray, valid_start: np.ndarray,
               valid_end: np.ndarray, blocked: np.ndarray, l_max: int = 10,
               walk: str = Settings.span_walk) -> tuple[np.ndarray, np.ndarray]:
    """Unique spans (start, end), inclusive token positions, sorted; paper-map §3.7 step 2 and §9 item 22. ``block``
    (nondecreasing: each block's positions contiguous) names the block of each position. ``walk="code"``: the walk
    back from an end candidate covers one token fewer (at most ``l_max - 1``) and never reaches its block's first
    position, as the original's (its ``_get_token_position``); ``paper``: up to ``l_max``, as the forward walk."""
    n = len(block)
    cum = np.concatenate([[0], np.cumsum(blocked, dtype=np.int64)])
    steps = np.arange(l_max)

    def ok(s, e):
        inside = (s >= 0) & (e < n)
        s, e = np.clip(s, 0, n - 1), np.clip(e, 0, n - 1)
        return inside & (block[s] == block[e]) & (cum[e + 1] - cum[s] == 0) & valid_start[s] & valid_end[e]

    start_cand = np.asarray(start_cand, dtype=np.int64)
    end_cand = np.asarray(end_cand, dtype=np.int64)
    s = start_cand[valid_start[start_cand]][:, None] + 0 * steps
    e_fwd = s + steps
    keep_f = ok(s, e_fwd)
    e = end_cand[valid_end[end_cand]][:, None] + 0 * steps
    s_bwd = e - steps
    keep_b = ok(s_bwd, e)
    if walk == "code":
        first = np.searchsorted(block, block)  # the first position of each position's block
        keep_b &= (steps == 0) | ((steps < l_max - 1) & (s_bwd > first[np.clip(e, 0, n - 1)]))
    elif walk != "paper":
        raise ValueError(f"walk must be paper or code, got {walk!r}")
    starts = np.concatenate([s[keep_f], s_bwd[keep_b]])
    ends = np.concatenate([e_fwd[keep_f], e[keep_b]])
    pairs = np.unique(starts * n + ends)  # one key per span, in (start, end) order: ends are < n
    return pairs // n, pairs % n


def runs(segment: np.ndarray):
    """``(value, start, end)`` of every run of equal values in a nondecreasing array (the queries of a batch)."""
    segment = np.asarray(segment)
    cuts = np.concatenate([[0], np.flatnonzero(np.diff(segment)) + 1, [len(segment)]])
    return [(int(segment[a]), int(a), int(e)) for a, e in zip(cuts[:-1], cuts[1:], strict=True) if e > a]


def softmax(x: np.ndarray, segment: np.ndarray | None = None) -> np.ndarray:
    """Softmax of ``x``, or of each run of equal values of ``segment`` (nondecreasing) on its own; keeps the dtype."""
    if segment is None or len(x) == 0:
        z = np.exp(x - x.max()) if len(x) else x
        return z / z.sum() if len(x) else z
    out = np.empty_like(x)
    for _, a, e in runs(segment):
        out[a:e] = softmax(x[a:e])
    return out


def score_spans(span_start: np.ndarray, span_end: np.ndarray, start_pos: np.ndarray, start_sim: np.ndarray,
                end_pos: np.ndarray, end_sim: np.ndarray, open_set_tau: float, form: str = "paper",
                query: np.ndarray | None = None) -> np.ndarray:
    """Weight of every span occurrence (float64 [n]); see the module docstring for the two forms.

    ``start_pos`` (sorted, unique) with ``start_sim`` are the scored start candidates and must include every
    span start; likewise for ends. ``query`` (per position; None = one query): each softmax runs per query.
    """
    i_s = np.searchsorted(start_pos, span_start)
    i_e = np.searchsorted(end_pos, span_end)
    if len(span_start) and ((i_s >= len(start_pos)).any() or (start_pos[np.minimum(i_s, len(start_pos) - 1)]
                                                                != span_start).any()):
        raise ValueError("a span start has no score: start_pos must include every span start")
    if len(span_end) and ((i_e >= len(end_pos)).any() or (end_pos[np.minimum(i_e, len(end_pos) - 1)]
                                                          != span_end).any()):
        raise ValueError("a span end has no score: end_pos must include every span end")
    start_sim = np.asarray(start_sim, dtype=np.float64) / open_set_tau
    end_sim = np.asarray(end_sim, dtype=np.float64) / open_set_tau
    def of(positions):
        return None if query is None else query[positions]

    if form == "code":
        return softmax(start_sim, of(start_pos))[i_s] + softmax(end_sim, of(end_pos))[i_e]
    if form == "paper":
        return softmax(np.logaddexp(start_sim[i_s], end_sim[i_e]), of(span_start))
    raise ValueError(f"span score form must be 'paper' or 'code', not {form!r}")


def aggregate_spans(ids: np.ndarray, span_start: np.ndarray, span_end: np.ndarray, weights: np.ndarray,
                    alpha: float = 0.0, query: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group occurrences by their token sequence (paper-map §3.7 step 5, §9 item 23).

    Returns ``(order, group, scores)``: ``group`` [n] maps each occurrence to its phrase, ``scores`` [n_phrases]
    is the summed weight x length^alpha, and ``order`` lists the phrases best first (ties: token order).
    ``query`` (per occurrence, nondecreasing; None = one query): phrases are grouped per query, and ``order``
    lists the first query's phrases best first, then the second's, ...
    """
    if len(span_start) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    lengths = span_end - span_start + 1
    width = int(lengths.max())
    cols = span_start[:, None] + np.arange(width)
    tokens = np.where(np.arange(width) < lengths[:, None], ids[np.minimum(cols, len(ids) - 1)], -1)
    if query is not None:
        tokens = np.concatenate([np.asarray(query, np.int64)[:, None], tokens], axis=1)
    _, group = np.unique(tokens, axis=0, return_inverse=True)
    group = group.reshape(-1)
    scores = np.bincount(group, weights=weights)
    length = np.bincount(group, weights=lengths) / np.bincount(group)
    scores = scores * length**alpha
    if query is None:
        return np.argsort(-scores, kind="stable"), group, scores
    group_query = np.zeros(len(scores), np.int64)
    group_query[group] = query
    return np.lexsort((-scores, group_query)), group, scores
