"""REPLUG ensemble decoding (Shi et al. 2023, section 3.2; reference replug.md 2.2).

Each retrieved passage d is prepended *separately* to the input x ("d\\n" + x, the same separator as NPM's
retrieve-and-generate baseline, reference npm.md 6); the unchanged LM runs once per passage and the next-token
distributions are mixed:

    p(y | x, D') = sum_d p(y | d o x) * lambda(d, x),   lambda = softmax(s(d, x) / temperature)

The paper uses the raw retrieval scores (temperature 1); the temperature is a knob here because BM25 scores are
not cosines (a few points of BM25 already make the weights nearly one-hot). ``weighting="uniform"`` gives the
older code's uniform mixture (replug.md 2.5). Decoding is greedy over the mixture, token by token, with one KV
cache per passage; it stops at EOS or the first "\\n" and returns the first line, stripped, like
:func:`npm.baselines.lm.greedy_generate`.

Not implemented here: LSR retriever training, the code's answer voting and concatenation modes, LM evaluation in
bits per byte (replug.md 5.2).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from npm.baselines.lm import MAX_LENGTH, MAX_NEW_TOKENS, encode_prompt, eos_ids, first_line, left_pad, prepend_passages


def mixture_weights(scores, temperature: float = 1.0, weighting: str = "softmax"):
    """lambda(d, x): softmax(scores / temperature) (paper) or uniform 1/k (older code); float64 tensor [k]."""
    import torch

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
    import torch

    logits = torch.as_tensor(logits_per_passage).double()
    w = torch.as_tensor(weights).double()
    if logits.ndim != 2 or w.shape != (logits.shape[0],):
        raise ValueError(f"expected logits [k, V] and weights [k], got {tuple(logits.shape)} and {tuple(w.shape)}")
    log_p = torch.log_softmax(logits, dim=-1) + torch.log(w)[:, None]
    return torch.logsumexp(log_p, dim=0).exp()


def replug_generate(model, tokenizer, prompt: str, passages: Sequence[str], scores, temperature: float = 1.0,
                    max_new_tokens: int = MAX_NEW_TOKENS, max_length: int = MAX_LENGTH,
                    weighting: str = "softmax") -> str:
    """Greedy REPLUG decoding of one prompt over ``passages`` (best first) with retrieval ``scores``.

    Each input is "passage\\n" + prompt (passage "<s>"/"</s>" removed), encoded and cut from the left to
    ``max_length - max_new_tokens`` tokens like :func:`npm.baselines.lm.greedy_generate`; all k inputs run as
    one left-padded batch with a KV cache, and at every step the same mixed-argmax token is appended to all of
    them. With one passage this is plain greedy decoding of "passage\\n" + prompt.
    """
    import torch

    if len(passages) != len(np.atleast_1d(scores)):
        raise ValueError(f"{len(passages)} passages but {len(np.atleast_1d(scores))} scores")
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    weights = mixture_weights(scores, temperature, weighting)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = eos_ids(model, tokenizer)
    seqs = [encode_prompt(tokenizer, prepend_passages(prompt, [p]), max_length - max_new_tokens) for p in passages]
    ids, mask, positions = left_pad(seqs, pad)
    new: list[int] = []
    past = None
    with torch.no_grad():
        for _ in range(max_new_tokens):
            res = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=past,
                        use_cache=True)
            past = res.past_key_values
            token = int(mix_next_token(res.logits[:, -1, :], weights).argmax())
            if token in eos:
                break
            new.append(token)
            if "\n" in tokenizer.decode(new, skip_special_tokens=True):
                break
            ids = torch.full((len(seqs), 1), token, dtype=torch.long)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            positions = positions[:, -1:] + 1
    return first_line(tokenizer.decode(new, skip_special_tokens=True))
