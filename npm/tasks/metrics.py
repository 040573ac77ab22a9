"""Open-set metrics and subsampling (paper 4.2, 6.3, Tables 5, 7, 8, 10; paper-map §5.1-§5.2, §6; §9 items 29-30).

* ``normalize_answer``: lowercase, drop every ASCII ``string.punctuation`` character, replace the articles
  ``\\b(a|an|the)\\b`` by a space, collapse whitespace. Non-ASCII punctuation (e.g. "。", "«") is kept.
* ``exact_match``: the normalised prediction equals one normalised gold answer (list membership, never substring).
* ``translation_prediction``: entity translation cuts the prediction at its first punctuation character before
  normalising (paper-map §6, last bullet).
* ``ngram_bucket``: LAMA's answer-length bucket, min(4, min over answers of len(tokens(" " + answer.strip()))).
* ``sample_indices`` / ``sample_by_group``: the seed-0 subsamples (3000 random examples; <=1000 per LAMA bucket or
  per translation language), with numpy's legacy ``RandomState`` so that the draws equal ``np.random.seed(0)``.
* ``aggregate``: macro (mean over groups of the per-group mean; LAMA buckets, translation languages) or micro
  (plain mean; everything else). The paper's text (6.3) says micro for LAMA, its Table 8 caption and the code say
  macro: macro is the default for LAMA and translation.
* ``bootstrap``: the standard error and the 95 % percentile interval of that average over seeded resamples of the
  examples (within each group for a macro average, so every group stays present); the tables print it beside each
  score, and the expected-number bands of the embedded default come from it (docs/paper-map.md §7).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Hashable, Sequence

import numpy as np

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
MAX_BUCKET = 4
N_SAMPLES = 3000
PER_GROUP = 1000  # LAMA: n_samples // 3; entity translation: per language
SAMPLING_SEED = 0  # the evaluation sets' example sampling (the original's np.random.seed(0))


def normalize_answer(s: str) -> str:
    """Paper-map §5.2: lower -> strip ASCII punctuation -> articles to a space -> collapse whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str, answers: Sequence[str] | str) -> bool:
    """True when the normalised prediction equals some normalised gold answer exactly.

    ``answers`` is a list of gold strings; a bare string is one answer (not a list of characters).
    """
    if isinstance(answers, str):
        answers = [answers]
    pred = normalize_answer(prediction)
    return any(pred == normalize_answer(a) for a in answers)


def f1_score(prediction: str, answers: Sequence[str] | str) -> float:
    """SQuAD's token F1 of the normalised prediction against the best gold answer (0 when either is empty)."""
    if isinstance(answers, str):
        answers = [answers]
    pred = normalize_answer(prediction).split()
    best = 0.0
    for a in answers:
        gold = normalize_answer(a).split()
        common = sum((Counter(pred) & Counter(gold)).values())
        if common:
            p, r = common / len(pred), common / len(gold)
            best = max(best, 2 * p * r / (p + r))
    return best


def translation_prediction(text: str) -> str:
    """The prediction up to (excluding) its first ASCII ``string.punctuation`` character, stripped."""
    for i, ch in enumerate(text):
        if ch in _PUNCTUATION:
            return text[:i].strip()
    return text.strip()


def ngram_bucket(answers: Sequence[str], tokenizer) -> int:
    """LAMA bucket (paper-map §5.1): min(4, min over answers of the token count of " " + answer.strip()).

    Tokens are counted without the tokenizer's special tokens. The paper uses RoBERTa's BPE.
    """
    if isinstance(answers, str):
        answers = [answers]
    if not answers:
        raise ValueError("ngram_bucket needs at least one gold answer")
    n = min(len(tokenizer(" " + a.strip(), add_special_tokens=False)["input_ids"]) for a in answers)
    return min(MAX_BUCKET, n)


def sample_indices(n: int, n_samples: int = N_SAMPLES, seed: int = SAMPLING_SEED) -> np.ndarray:
    """The first ``n_samples`` of a seeded permutation of range(n) (int64); smaller sets are kept whole, reordered.

    ``np.random.RandomState(seed).permutation(n)`` draws exactly what ``np.random.seed(seed)`` followed by
    ``np.random.permutation(range(n))`` draws.
    """
    return np.random.RandomState(seed).permutation(n)[:n_samples].astype(np.int64)


def sample_by_group(groups: Sequence[Hashable], per_group: int = PER_GROUP, seed: int = SAMPLING_SEED) -> np.ndarray:
    """Indices of a per-group subsample (LAMA: per n-gram bucket; entity translation: per language).

    Exactly: one ``RandomState(seed)`` stream; the groups are visited in order of first appearance in ``groups``;
    for each, the group's example indices (in data order) are permuted with the stream and the first ``per_group``
    kept; the kept indices of all groups are concatenated in that order and then shuffled once more with the same
    stream (``RandomState.permutation``). Returns int64 indices into ``groups``.
    """
    rng = np.random.RandomState(seed)
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    kept = [np.asarray(idx, dtype=np.int64)[rng.permutation(len(idx))[:per_group]] for idx in members.values()]
    if not kept:
        return np.zeros(0, dtype=np.int64)
    return rng.permutation(np.concatenate(kept)).astype(np.int64)


def micro_average(scores: Sequence[float] | np.ndarray) -> float:
    """Plain mean over examples."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.size == 0:
        raise ValueError("cannot average zero scores")
    return float(scores.mean())


def macro_average(scores: Sequence[float] | np.ndarray, groups: Sequence[Hashable]) -> float:
    """Unweighted mean over the groups present of each group's mean score."""
    scores = np.asarray(scores, dtype=np.float64)
    if len(groups) != scores.size:
        raise ValueError(f"{scores.size} scores but {len(groups)} group labels")
    if scores.size == 0:
        raise ValueError("cannot average zero scores")
    sums: dict[Hashable, list[float]] = {}
    for s, g in zip(scores.tolist(), groups, strict=True):
        sums.setdefault(g, []).append(s)
    return float(np.mean([np.mean(v) for v in sums.values()]))


def aggregate(scores: Sequence[float] | np.ndarray, groups: Sequence[Hashable] | None = None,
              average: str = "macro") -> float:
    """``average="macro"`` (needs ``groups``; LAMA buckets, translation languages) or ``"micro"``."""
    if average == "micro":
        return micro_average(scores)
    if average == "macro":
        if groups is None:
            raise ValueError("macro average needs the group of every score (n-gram bucket or language)")
        return macro_average(scores, groups)
    raise ValueError(f"average must be 'macro' or 'micro', not {average!r}")


BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0


def bootstrap(scores: Sequence[float] | np.ndarray, groups: Sequence[Hashable] | None = None,
              average: str = "micro", n_resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> dict:
    """Uncertainty of ``aggregate(scores, groups, average)`` from ``n_resamples`` seeded resamples of the examples
    with replacement (macro: resampled within each group). Returns ``stderr`` (standard deviation of the resampled
    averages) and ``ci95`` ([2.5, 97.5] percentiles), in the units of ``scores``."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.size == 0:
        raise ValueError("cannot bootstrap zero scores")
    rng = np.random.default_rng(seed)
    if average == "micro":
        stats = scores[rng.integers(0, scores.size, (n_resamples, scores.size))].mean(axis=1)
    elif average == "macro":
        if groups is None or len(groups) != scores.size:
            raise ValueError("macro bootstrap needs the group of every score")
        members: dict[Hashable, list[int]] = {}
        for i, g in enumerate(groups):
            members.setdefault(g, []).append(i)
        per_group = [scores[np.asarray(m)][rng.integers(0, len(m), (n_resamples, len(m)))].mean(axis=1)
                     for m in members.values()]
        stats = np.mean(per_group, axis=0)
    else:
        raise ValueError(f"average must be 'macro' or 'micro', not {average!r}")
    low, high = np.percentile(stats, [2.5, 97.5])
    return {"stderr": float(stats.std(ddof=1)) if n_resamples > 1 else 0.0, "ci95": [float(low), float(high)]}
