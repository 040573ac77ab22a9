"""Evaluation of DensePhrases (Lee et al. 2021, section 7.1 and Table 2; docs/paper-map.md §D1.5).

* :func:`best_spans`: the reading-comprehension answer of a passage from start and end logits: argmax over
  i <= j < i + max_tokens of z_start[i] + z_end[j] over valid tokens (both the query-agnostic model, with
  z = h . q, and the cross-attention teacher read answers this way).
* :func:`rc_scores`: SQuAD exact match and token F1 (``npm.tasks.metrics``) of span predictions, in percent.
"""

from __future__ import annotations

import numpy as np

from npm.tasks.metrics import exact_match, f1_score


def best_spans(start_logits: np.ndarray, end_logits: np.ndarray, valid: np.ndarray,
               max_tokens: int = 30) -> np.ndarray:
    """(i, j) int64 [B, 2]: the best span of each row, i <= j < i + ``max_tokens``, both valid tokens."""
    s = np.where(valid, np.asarray(start_logits, dtype=np.float64), -np.inf)
    e = np.where(valid, np.asarray(end_logits, dtype=np.float64), -np.inf)
    m = s.shape[1]
    i, j = np.triu_indices(m)
    keep = j - i < max_tokens
    i, j = i[keep], j[keep]
    scores = s[:, i] + e[:, j]
    best = scores.argmax(axis=1)
    if not np.isfinite(scores[np.arange(len(s)), best]).all():
        raise ValueError("a passage has no valid token to answer with")
    return np.stack([i[best], j[best]], 1).astype(np.int64)


def span_text(context: str, offsets: np.ndarray, i: int, j: int) -> str:
    """The context characters from token i's start to token j's end (``offsets`` [m, 2] of the passage)."""
    return context[int(offsets[i][0]):int(offsets[j][1])]


def rc_scores(predictions: list[str], answers: list[list[str]]) -> dict:
    """EM and F1 in percent over the examples, with the per-example values."""
    em = [float(exact_match(p, a)) for p, a in zip(predictions, answers, strict=True)]
    f1 = [f1_score(p, a) for p, a in zip(predictions, answers, strict=True)]
    return {"em": 100.0 * float(np.mean(em)), "f1": 100.0 * float(np.mean(f1)), "n": len(em),
            "em_each": em, "f1_each": f1}
