"""Language-modelling evaluation with the REPLUG ensemble: bits per byte and token perplexity (Shi et al. 2023,
section 6.1 / Table 1 and Figure 4; docs/paper-map.md §R3).

A text is tokenized with the LM's tokenizer and scored in rolling windows (``windows``): window w predicts the tokens
[a, a + pred_len) given the ``context_len`` tokens before a; the retrieval stride is ``pred_len`` (one retrieval per
window) and the query is the text of that context. Every token of the text is predicted: the first one from the LM's
begin-of-text token (its BOS, else its EOS as a document separator). Each row below is one teacher-forced LM pass
whose per-token log-probabilities of the window's tokens are kept (``target_logprobs``):

* ``none``: [bos] + context + target, the plain LM;
* one set per retriever (``replug``; ``replug_lsr`` with the LSR-trained one), its top ``k_max`` documents:
  [bos] + document + context + target, the document cut to its first ``doc_len`` LM tokens and prepended without
  separator (the authors' code);
* ``random`` (``k_max`` corpus blocks drawn with the seed, none of the retrieved ones): the same with random
  documents, the control of the paper's Figure 4.

Every k <= k_max and every weighting is then arithmetic over the kept rows (``mixture``): REPLUG's
log p(y_t) = logsumexp_d (log p_d(y_t) + log lambda_d) over the top k documents, lambda = softmax(scores / temperature)
(paper: temperature 1; ``weighting="uniform"``: 1/k, the older code); random documents are mixed uniformly. The
first window has no preceding context, hence no query: every system scores it without retrieval (the authors' code,
paper-map §R3). Bits per byte = total negative log-likelihood / ln 2 / the UTF-8 bytes of the texts; token perplexity
= exp(mean negative log-likelihood per LM token).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from npm.baselines.lm import target_logprobs
from npm.baselines.replug import mix_logprobs, mixture_weights
from npm.progress import bar as progress_bar
from npm.settings import ReplugSettings, Settings


def windows(n_tokens: int, context_len: int, pred_len: int) -> list[tuple[int, int, int]]:
    """(context start, start, end) of the rolling windows over ``n_tokens`` tokens: window w predicts
    [start, end) = [w * pred_len, min(n, (w + 1) * pred_len)) given [max(0, start - context_len), start)."""
    if pred_len < 1 or context_len < 0:
        raise ValueError(f"pred_len must be >= 1 and context_len >= 0, got {pred_len} and {context_len}")
    return [(max(0, a - context_len), a, min(n_tokens, a + pred_len)) for a in range(0, n_tokens, pred_len)]


def begin_token(tokenizer) -> int:
    """The id every scored text starts from: the tokenizer's BOS, else its EOS (GPT-2 style document separator)."""
    for tid in (tokenizer.bos_token_id, tokenizer.eos_token_id):
        if tid is not None:
            return int(tid)
    raise ValueError("the LM tokenizer has neither a BOS nor an EOS token to start a text from")


def _check_inputs(texts: Sequence[str], searches: Mapping, n_blocks: int, k_max: int, concat_ks: Sequence[int]) -> None:
    """``score_texts``'s arguments can be scored: k >= 1, every concatenation k <= k_max, a retriever, enough corpus
    blocks for k retrieved and k random documents, and no empty text."""
    if k_max < 1:
        raise ValueError(f"k must be >= 1, got {k_max}")
    if any(not 1 <= k <= k_max for k in concat_ks):
        raise ValueError(f"concatenation k must be in 1..{k_max}, got {list(concat_ks)}")
    if not searches:
        raise ValueError("no retriever given")
    if 2 * k_max > n_blocks:
        raise ValueError(f"k = {k_max} retrieved + {k_max} random documents need {2 * k_max} corpus blocks; the "
                         f"corpus has {n_blocks}: lower k or use a larger corpus")
    if not texts or any(not t or not t.strip() for t in texts):
        raise ValueError("empty evaluation text: every text must hold at least one character to score")


def score_texts(model, tokenizer, texts: Sequence[str],
                searches: Mapping[str, Callable[[str, int], tuple[np.ndarray, np.ndarray]]],
                block_text: Callable[[int], str], n_blocks: int, k_max: int, *, seed: int,
                context_len: int = ReplugSettings.context_len, pred_len: int = ReplugSettings.pred_len,
                doc_len: int = ReplugSettings.doc_len, batch_size: int = Settings.batch_size,
                concat_ks: Sequence[int] = (), progress: bool = True) -> dict:
    """Per-token log-probabilities of every row kind over ``texts`` (see the module docstring).

    ``searches``: system name -> ``search(query, k) -> (block ids, scores)`` best first (``DenseBlockSearcher.search``
    / ``Bm25Searcher.search``; e.g. ``replug`` and ``replug_lsr``); ``block_text(block)`` the text of a corpus block,
    of ``n_blocks``. Returns, over the N scored tokens: ``none`` [N]; ``rows[name]`` [k_max, N] for each search and
    ``random`` (a first window repeats ``none``); ``scores[name]`` [n_windows, k_max] (each window's retrieval
    scores; NaN in first windows); ``window`` [N] (global window index of each token), ``text`` [N] (index into
    ``texts``),
    ``n_bytes`` (UTF-8 bytes of all texts), ``n_windows``, ``doc_ids[name]`` [n_windows, k_max] (-1 in first
    windows). ``concat_ks``: also the authors' ``ensemble = 0`` mode (NPM's retrieve-and-generate baseline), one pass
    over the first retriever's top k documents concatenated, best first, cut to ``doc_len`` tokens in all, for each k
    given: ``concat[k]`` [N]."""
    _check_inputs(texts, searches, n_blocks, k_max, concat_ks)
    bos = begin_token(tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else bos
    rng = np.random.default_rng(seed)
    names = list(searches)
    none, window_of, text_of = [], [], []
    rows: dict[str, list] = {n: [] for n in [*names, "random"]}
    scores: dict[str, list] = {n: [] for n in names}
    doc_ids: dict[str, list] = {n: [] for n in names}
    concat: dict[int, list] = {k: [] for k in concat_ks}
    encoded = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    plan = [(i, w) for i, ids in enumerate(encoded) for w in windows(len(ids), context_len, pred_len)]
    for g, (i, (c, a, e)) in enumerate(progress_bar(plan, desc="REPLUG LM eval", unit="window", show=progress)):
        ids = encoded[i]
        context, target = [bos] + ids[c:a], ids[a:e]
        n = len(target)
        if a == 0:  # no preceding context: no query, no retrieval (the authors' code)
            lp = target_logprobs(model, [context], target, pad, batch_size)
            none.append(lp[0])
            for name in rows:
                rows[name].append(np.repeat(lp, k_max, axis=0))
            for k in concat:
                concat[k].append(lp[0])
            for name in names:
                scores[name].append(np.full(k_max, np.nan))
                doc_ids[name].append(np.full(k_max, -1))
        else:
            query = tokenizer.decode(ids[c:a])
            found = {}
            for name in names:
                blocks, s = searches[name](query, k_max)
                if len(blocks) < k_max:
                    raise ValueError(f"text {i}, window at token {a}: retriever {name} found {len(blocks)} documents, "
                                     f"fewer than k = {k_max}")
                found[name] = np.asarray(blocks[:k_max], np.int64)
                scores[name].append(np.asarray(s[:k_max], np.float64))
                doc_ids[name].append(found[name])
            taken = np.unique(np.concatenate(list(found.values())))
            found["random"] = rng.choice(np.setdiff1d(np.arange(n_blocks), taken), size=k_max, replace=False)
            order = [*names, "random"]
            docs = [tokenizer(block_text(int(b)), add_special_tokens=False)["input_ids"][:doc_len]
                    for name in order for b in found[name]]
            joined = [[t for d in docs[:k] for t in d][:doc_len] for k in concat]  # the first retriever's top k
            lp = target_logprobs(model, [context] + [[bos] + d + ids[c:a] for d in docs + joined], target, pad,
                                 batch_size)
            none.append(lp[0])
            for j, name in enumerate(order):
                rows[name].append(lp[1 + j * k_max:1 + (j + 1) * k_max])
            for j, k in enumerate(concat):
                concat[k].append(lp[1 + len(docs) + j])
        window_of.append(np.full(n, g))
        text_of.append(np.full(n, i))
    return {"none": np.concatenate(none), "rows": {n: np.concatenate(r, axis=1) for n, r in rows.items()},
            "scores": {n: np.stack(s) for n, s in scores.items()}, "window": np.concatenate(window_of),
            "text": np.concatenate(text_of), "n_bytes": sum(len(t.encode("utf-8")) for t in texts),
            "n_windows": len(plan), "doc_ids": {n: np.stack(d) for n, d in doc_ids.items()},
            "concat": {k: np.concatenate(v) for k, v in concat.items()}}


def mixture(scored: dict, kind: str, k: int, weighting: str = ReplugSettings.weighting,
            temperature: float = ReplugSettings.temperature) -> np.ndarray:
    """float64 [N]: per-token log-probabilities of a system over ``score_texts``'s rows.

    ``kind``: ``none`` (the plain LM), a retriever's name (REPLUG over its top k, weights ``mixture_weights`` of the
    window's top-k scores) or ``random`` (k random documents, uniform weights). First windows (no retrieval) keep the
    plain LM's log-probabilities."""
    if kind == "none":
        return scored["none"].copy()
    if kind not in scored["rows"]:
        raise ValueError(f"kind must be none or one of {sorted(scored['rows'])}, not {kind!r}")
    rows = scored["rows"][kind]
    if not 1 <= k <= rows.shape[0]:
        raise ValueError(f"k must be in 1..{rows.shape[0]} (the documents scored per window), got {k}")
    window_scores = next(iter(scored["scores"].values()))
    out = scored["none"].copy()
    for w in np.unique(scored["window"]):
        if np.isnan(window_scores[w]).any():  # a first window: no retrieval
            continue
        at = scored["window"] == w
        if kind == "random":
            weights = mixture_weights(np.zeros(k), weighting="uniform").numpy()
        else:
            weights = mixture_weights(scored["scores"][kind][w, :k], temperature, weighting).numpy()
        out[at] = mix_logprobs(rows[:k, at], weights)
    return out


def bits_per_byte(logprobs: np.ndarray, n_bytes: int) -> float:
    """-sum(log p) / ln 2 / n_bytes: the bits the LM needs per UTF-8 byte of the text (REPLUG Table 1)."""
    if n_bytes < 1:
        raise ValueError("no bytes to score")
    return float(-np.sum(logprobs) / math.log(2) / n_bytes)


def token_perplexity(logprobs: np.ndarray) -> float:
    """exp(mean negative log-likelihood per LM token)."""
    return float(np.exp(-np.mean(logprobs)))


def summarize(scored: dict, texts: Sequence[str], ks: Sequence[int], weighting: str = ReplugSettings.weighting,
              temperature: float = ReplugSettings.temperature, n_resamples: int = 1000, *, seed: int) -> list[dict]:
    """One row per system of REPLUG's Table 1 / Figure 4: the plain LM (k = 0), each retriever's REPLUG and random
    documents at each k of ``ks``: bits per byte, token perplexity, and the bits-per-byte 95 % interval and the
    paired gain over the plain LM from ``n_resamples`` seeded resamples of the texts (bits per byte of a resample =
    its summed negative log-likelihood over its summed bytes)."""
    n_bytes = np.array([len(t.encode("utf-8")) for t in texts], dtype=np.float64)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(texts), (n_resamples, len(texts)))
    text_of = scored["text"]

    def per_text_bits(lp: np.ndarray) -> np.ndarray:
        return -np.bincount(text_of, weights=lp, minlength=len(texts)) / math.log(2)

    base_bits = per_text_bits(scored["none"])
    base = base_bits[picks].sum(axis=1) / n_bytes[picks].sum(axis=1)
    rows = []
    systems = [("none", 0)] + [(kind, k) for kind in scored["rows"] for k in ks]
    systems += [("concat", k) for k in sorted(scored.get("concat", {}))]
    for kind, k in systems:
        if kind == "concat":
            lp = scored["concat"][k]
        else:
            lp = mixture(scored, kind, k, weighting, temperature) if k else scored["none"]
        bits = per_text_bits(lp)
        resampled = bits[picks].sum(axis=1) / n_bytes[picks].sum(axis=1)
        bpb = bits_per_byte(lp, int(n_bytes.sum()))
        rows.append({"system": {"none": "lm", "random": "random_docs", "concat": "concat"}.get(kind, kind), "k": int(k),
                     "bpb": bpb, "bpb_ci95": [float(x) for x in np.percentile(resampled, [2.5, 97.5])],
                     "perplexity": token_perplexity(lp),
                     "gain_pct": 100.0 * (1.0 - bpb / bits_per_byte(scored["none"], int(n_bytes.sum()))),
                     "gain_pct_ci95": [float(x) for x in np.percentile(100.0 * (1.0 - resampled / base), [2.5, 97.5])],
                     "tokens": int(len(lp))})
    return rows
