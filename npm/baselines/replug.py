"""REPLUG ensemble decoding (Shi et al. 2023, section 3.2; paper-map §R2.2).

Each retrieved passage d is prepended *separately* to the input x ("d\\n" + x, the same separator as NPM's
retrieve-and-generate baseline, paper-map §6); the unchanged LM runs once per passage and the next-token
distributions are mixed:

    p(y | x, D') = sum_d p(y | d o x) * lambda(d, x),   lambda = softmax(s(d, x) / temperature)

The paper uses the raw retrieval scores (temperature 1); the temperature is a knob here because BM25 scores are
not cosines (a few points of BM25 already make the weights nearly one-hot). ``weighting="uniform"`` gives the
older code's uniform mixture (paper-map §R2.5). Decoding is greedy over the mixture, token by token, with a KV
cache per (example, passage) row, in the decoder baselines' own loop (:func:`npm.baselines.lm.decode_greedy`); it
stops at EOS or the first "\\n" and returns the first line, stripped, like :func:`npm.baselines.lm.greedy_generate`.
:func:`replug_continuations` decodes several examples at once: their k passages each are rows of one left-padded
batch (cost: k LM rows per example and step, paper-map §R2.2).

:func:`mix_logprobs` mixes teacher-forced token log-probabilities the same way (the language-modelling evaluation,
``npm.replug.lm_eval``).

:func:`replug_vote` is the authors' QA code instead of the paper's token-level mixture (paper-map §R2.5): every
passage decodes its own greedy answer from "passage\n" + prompt, and an answer's weight is the sum, over the passages
that gave it, of lambda(d, x) x exp(mean log-probability of the answer's tokens); the heaviest answer wins
(:func:`vote`). The answer's tokens are the generated text up to the end of its answer line, re-encoded and scored
teacher-forced after the row's prompt (the OpenAI API returned the generated tokens' log-probabilities; re-encoding a
greedy continuation gives the same tokens except where the tokenizer would split the text differently).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from npm.baselines.lm import (
    MAX_LENGTH,
    MAX_NEW_TOKENS,
    decode_greedy,
    decoding_setup,
    encode_prompt,
    first_line,
    greedy_continuations,
    model_device,
    prepend_passages,
    target_logprobs,
)
from npm.settings import ReplugSettings, Settings


def mixture_weights(scores, temperature: float = ReplugSettings.temperature,
                    weighting: str = ReplugSettings.weighting):
    """lambda(d, x): softmax(scores / temperature) (paper) or uniform 1/k (older code); float64 tensor [k]."""
    s = torch.as_tensor(np.asarray(scores, dtype=np.float64))
    if s.ndim != 1 or len(s) == 0:
        raise ValueError(f"scores must be a non-empty 1-D array, got shape {tuple(s.shape)}")
    if weighting == "uniform":
        return torch.full_like(s, 1.0 / len(s))
    if weighting != "softmax":
        raise ValueError(f"weighting must be 'softmax' or 'uniform', got {weighting!r}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return torch.softmax(s / temperature, dim=0)


def mix_next_token(logits_per_passage, weights):
    """The REPLUG mixture sum_d w_d softmax(logits_d): probabilities [V] from logits [k, V] and weights [k].

    Computed in log space (logsumexp of log-softmax + log w) for stability; ``weights`` must sum to 1.
    """
    logits = torch.as_tensor(logits_per_passage).double()
    w = torch.as_tensor(weights).double()
    if logits.ndim != 2 or w.shape != (logits.shape[0],):
        raise ValueError(f"expected logits [k, V] and weights [k], got {tuple(logits.shape)} and {tuple(w.shape)}")
    log_p = torch.log_softmax(logits, dim=-1) + torch.log(w)[:, None]
    return torch.logsumexp(log_p, dim=0).exp()


def mix_logprobs(logprobs, weights) -> np.ndarray:
    """The REPLUG mixture of teacher-forced scores: log sum_d w_d p_d(y_t), float64 [T] from per-document token
    log-probabilities [k, T] and weights [k] (summing to 1), in log space (logsumexp of log p + log w), so that very
    negative log-probabilities stay finite."""
    lp = np.asarray(logprobs, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if lp.ndim != 2 or w.shape != (lp.shape[0],):
        raise ValueError(f"expected log-probabilities [k, T] and weights [k], got {lp.shape} and {w.shape}")
    with np.errstate(divide="ignore"):
        x = lp + np.log(w)[:, None]
    top = x.max(axis=0)
    return top + np.log(np.exp(x - top).sum(axis=0))


def replug_generate(model, tokenizer, prompt: str, passages: Sequence[str], scores,
                    temperature: float = Settings.replug_temperature, max_new_tokens: int = MAX_NEW_TOKENS,
                    max_length: int = MAX_LENGTH, weighting: str = ReplugSettings.weighting) -> str:
    """Greedy REPLUG decoding of one prompt over ``passages`` (best first) with retrieval ``scores``.

    Each input is "passage\\n" + prompt (passage "<s>"/"</s>" removed), encoded and cut from the left to
    ``max_length - max_new_tokens`` tokens like :func:`npm.baselines.lm.greedy_generate`; all k inputs run as
    one left-padded batch with a KV cache, and at every step the same mixed-argmax token is appended to all of
    them. With one passage this is plain greedy decoding of "passage\\n" + prompt.
    """
    if len(passages) != len(np.atleast_1d(scores)):
        raise ValueError(f"{len(passages)} passages but {len(np.atleast_1d(scores))} scores")
    if not len(passages):
        raise ValueError("REPLUG needs at least one passage (replug_continuations decodes the bare prompt instead)")
    raw = replug_continuations(model, tokenizer, [prompt], [passages], [scores], temperature=temperature,
                               max_new_tokens=max_new_tokens, max_length=max_length, weighting=weighting)
    return first_line(raw[0])


def replug_continuations(model, tokenizer, prompts: Sequence[str], passages: Sequence[Sequence[str]], scores,
                         temperature: float = Settings.replug_temperature, max_new_tokens: int = MAX_NEW_TOKENS,
                         max_length: int = MAX_LENGTH, weighting: str = ReplugSettings.weighting,
                         batch_size: int = Settings.batch_size,
                         skip_blank_lines: bool = Settings.skip_blank_lines) -> list[str]:
    """Raw greedy REPLUG continuations (decoded, not cut or stripped) of several prompts, ``batch_size`` at a time.

    ``passages[i]`` / ``scores[i]`` are prompt i's retrieved texts (best first) and retrieval scores. Every
    (prompt, passage) pair is one row "passage\\n" + prompt; prompt i's rows are one group of
    :func:`npm.baselines.lm.decode_greedy` (the decoder baselines' loop): at each step they are mixed with
    lambda = :func:`mixture_weights` (float64, log space) and the argmax of the mixture is appended to all of them.
    A prompt with no passage (BM25 found no block sharing a term with the query) is decoded alone with weight 1,
    i.e. plain greedy decoding of the bare prompt. A prompt stops at EOS, once its continuation contains "\\n", or
    after ``max_new_tokens`` tokens.
    """
    if not (len(prompts) == len(passages) == len(scores)):
        raise ValueError(f"{len(prompts)} prompts, {len(passages)} passage lists and {len(scores)} score lists")
    budget, device = max_length - max_new_tokens, model_device(model)
    encoded, weights = [], []  # per prompt: its rows' ids and their mixture weights
    for i, prompt in enumerate(prompts):
        texts, s = list(passages[i]), np.atleast_1d(np.asarray(scores[i], dtype=np.float64))
        if len(texts) != len(s):
            raise ValueError(f"prompt {i}: {len(texts)} passages but {len(s)} scores")
        if texts:
            encoded.append([encode_prompt(tokenizer, prepend_passages(prompt, [t]), budget) for t in texts])
            weights.append(mixture_weights(s, temperature, weighting).to(device))
        else:
            encoded.append([encode_prompt(tokenizer, prompt, budget)])
            weights.append(torch.ones(1, dtype=torch.float64, device=device))

    def choose(i: int, logits) -> int:
        return int(mix_next_token(logits, weights[i]).argmax())

    return decode_greedy(model, tokenizer, encoded, choose, max_new_tokens=max_new_tokens, batch_size=batch_size,
                         skip_blank_lines=skip_blank_lines)


def vote(answers: Sequence[str], weights, mean_logprobs) -> tuple[int, dict[str, float]]:
    """The authors' answer vote: weight(a) = sum over the rows i with answers[i] == a of weights[i] *
    exp(mean_logprobs[i]). Returns (the first row giving the heaviest answer, {answer: weight}); equal weights go to
    the answer met first (passage order). An empty answer gets no weight unless every answer is empty."""
    w = np.asarray(weights, dtype=np.float64)
    lp = np.asarray(mean_logprobs, dtype=np.float64)
    if not len(answers) or w.shape != (len(answers),) or lp.shape != (len(answers),):
        raise ValueError(f"{len(answers)} answers, {w.shape} weights and {lp.shape} log-probabilities")
    totals: dict[str, float] = {}
    for a, wi, li in zip(answers, w, lp, strict=True):
        totals[a] = totals.get(a, 0.0) + (float(wi * np.exp(li)) if a else 0.0)
    best = max(totals, key=lambda a: (totals[a], a != ""))  # dict order: the first answer wins a tie
    return list(answers).index(best), totals


def _answer_prefix(raw: str, skip_blank_lines: bool) -> str:
    """The generated text up to the end of its answer line (:func:`npm.baselines.lm.first_line`), trailing blanks
    dropped: what produced the answer."""
    lead = len(raw) - len(raw.lstrip()) if skip_blank_lines else 0
    end = raw.find("\n", lead)
    return raw[:end if end >= 0 else len(raw)].rstrip()


def replug_vote(model, tokenizer, prompts: Sequence[str], passages: Sequence[Sequence[str]], scores,
                temperature: float = Settings.replug_temperature, max_new_tokens: int = MAX_NEW_TOKENS,
                max_length: int = MAX_LENGTH, weighting: str = ReplugSettings.weighting,
                batch_size: int = Settings.batch_size,
                skip_blank_lines: bool = Settings.skip_blank_lines) -> tuple[list[str], list[dict]]:
    """REPLUG with the answer vote of the authors' QA code: per prompt, the raw greedy continuation of the passage
    whose answer won (:func:`vote`), and a record {answers, weights, mean_logprobs, votes}. Each (prompt, passage)
    row is "passage\n" + prompt, decoded like :func:`npm.baselines.lm.greedy_continuations`; a prompt without
    passages is decoded alone."""
    if not (len(prompts) == len(passages) == len(scores)):
        raise ValueError(f"{len(prompts)} prompts, {len(passages)} passage lists and {len(scores)} score lists")
    pad, _, _ = decoding_setup(model, tokenizer, max_new_tokens, batch_size)
    rows, spans, weights = [], [], []
    for i, prompt in enumerate(prompts):
        texts, s = list(passages[i]), np.atleast_1d(np.asarray(scores[i], dtype=np.float64))
        if len(texts) != len(s):
            raise ValueError(f"prompt {i}: {len(texts)} passages but {len(s)} scores")
        spans.append((len(rows), len(rows) + max(1, len(texts))))
        rows.extend([prepend_passages(prompt, [t]) for t in texts] or [prompt])
        weights.append(mixture_weights(s, temperature, weighting).numpy() if texts else np.ones(1))
    raws = greedy_continuations(model, tokenizer, rows, max_new_tokens=max_new_tokens, max_length=max_length,
                                batch_size=batch_size, skip_blank_lines=skip_blank_lines)
    mean_lp = np.full(len(rows), -np.inf)
    for r, (row, raw) in enumerate(zip(rows, raws, strict=True)):
        answer_ids = tokenizer(_answer_prefix(raw, skip_blank_lines), add_special_tokens=False)["input_ids"]
        if answer_ids:
            prompt_ids = encode_prompt(tokenizer, row, max_length - max_new_tokens)
            mean_lp[r] = float(target_logprobs(model, [prompt_ids], answer_ids, pad)[0].mean())
    out, records = [], []
    for (a, e), w in zip(spans, weights, strict=True):
        answers = [first_line(raw, skip_blank_lines) for raw in raws[a:e]]
        best, totals = vote(answers, w, mean_lp[a:e])
        out.append(raws[a + best])
        records.append({"answers": answers, "weights": [float(x) for x in w],
                        "mean_logprobs": [float(x) if np.isfinite(x) else None for x in mean_lp[a:e]],
                        "votes": totals})
    return out, records
