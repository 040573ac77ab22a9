"""Closed-set scoring with a decoder LM: plain and domain-conditional PMI (Holtzman et al. 2021; NPM Table 1).

NPM's Table 1 compares with "GPT-2" and "GPT-2 + PMI" (numbers copied from Shi et al. 2022 / Holtzman et al. 2021;
the original NPM repo ships no PMI code, paper-map §6). Re-implemented from the definition:

* plain score of label y for input x: log P(y | x) = the sum of the log-probabilities of the label word's tokens
  (label words carry their leading space, config/tasks.yaml verbalizer.words) right after the prompt;
* domain-conditional PMI: log P(y | x) - log P(y | x_domain), where the domain premise x_domain is the
  task-specific template text without the example (e.g. "It was" for sentiment, "The text topic is about" for
  topic classification; config/tasks.yaml verbalizer.premise), which divides out each label's prior surface-form
  probability.

The prompt for a causal LM is the NPM closed-set template's text before the mask (:func:`causal_prompt`).
Templates with text after the mask (RTE: "{premise}, right?<mask>, {hypothesis}.") are not meaningful under this
left-to-right scoring and are rejected by :func:`causal_prompt`; RTE has its own causal form with the label word
last instead (``npm.tasks.templates.CAUSAL_TEMPLATES``, Shi et al. 2022), whose domain premise is RTE's
``verbalizer.premise``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from npm.baselines.lm import MAX_LENGTH, encode_prompt, model_device
from npm.tasks.templates import MASK_PLACEHOLDER as MASK


def causal_prompt(text: str) -> str:
    """The causal-LM prompt of an NPM closed-set input: the text before its "<mask>" with trailing spaces removed
    (label words bring their own leading space). Raises ValueError when text follows the mask (other than ".")."""
    before, sep, after = text.partition(MASK)
    if sep and after.strip() not in ("", "."):
        raise ValueError(f"the mask is not at the end of {text!r}: left-to-right label scoring would ignore "
                         f"{after!r}")
    return before.rstrip()


def label_logprobs(model, tokenizer, prompts: Sequence[str], label_words: Sequence[str], batch_rows: int = 16,
                   max_length: int = MAX_LENGTH) -> np.ndarray:
    """log P(label word | prompt) for every prompt and label: float64 [n_prompts, n_labels].

    The prompt is encoded like :func:`npm.baselines.lm.encode_prompt` (tokenizer's special prefix, cut from the
    left so that prompt + label fit in ``max_length``); the label word is encoded on its own without special
    tokens and appended; its score is the sum over its tokens of log softmax(logits at the previous position).
    When every label word is one token (the usual case: " great", " sports"), one forward pass per prompt scores
    all labels at once from the prompt's last position: the same numbers with n_labels times fewer passes.
    ``batch_rows``: rows per forward pass (prompts, or (prompt, label) pairs when a label word has several tokens).
    """
    labels = [tokenizer(w, add_special_tokens=False)["input_ids"] for w in label_words]
    if not labels or any(len(ids) == 0 for ids in labels):
        raise ValueError(f"every label word must encode to at least one token: {list(label_words)}")
    longest = max(len(ids) for ids in labels)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = model_device(model)
    encoded = []
    for prompt in prompts:
        ids = encode_prompt(tokenizer, prompt, max_length - longest)
        if not ids:
            raise ValueError(f"prompt {prompt!r} encodes to no tokens and the tokenizer adds no BOS to condition on")
        encoded.append(ids)
    if longest == 1:
        return _single_token_logprobs(model, encoded, [lab[0] for lab in labels], int(pad), batch_rows, device)
    pairs = [(ids, lab) for ids in encoded for lab in labels]  # (prompt ids, label ids)
    out = np.empty(len(pairs), dtype=np.float64)
    with torch.no_grad():
        for start in range(0, len(pairs), batch_rows):
            chunk = pairs[start:start + batch_rows]
            width = max(len(p) + len(lab) for p, lab in chunk)
            ids = torch.full((len(chunk), width), int(pad), dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, (p, lab) in enumerate(chunk):  # right padding: positions start at 0 for every row
                seq = p + lab
                ids[i, :len(seq)] = torch.as_tensor(seq)
                mask[i, :len(seq)] = 1
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
            for i, (p, lab) in enumerate(chunk):  # log-softmax (float64) of the label positions only
                rows = torch.arange(len(p) - 1, len(p) + len(lab) - 1, device=logits.device)
                log_p = torch.log_softmax(logits[i, rows].double(), dim=-1)
                picked = log_p[torch.arange(len(lab), device=logits.device), torch.as_tensor(lab, device=logits.device)]
                out[start + i] = float(picked.sum())
    return out.reshape(len(prompts), len(labels))


def _single_token_logprobs(model, encoded: list[list[int]], label_ids: list[int], pad: int, batch_size: int,
                           device) -> np.ndarray:
    """log P(label token | prompt) [n_prompts, n_labels] from one right-padded forward pass per prompt."""
    out = np.empty((len(encoded), len(label_ids)), dtype=np.float64)
    wanted = torch.as_tensor(label_ids, device=device)
    with torch.no_grad():
        for start in range(0, len(encoded), batch_size):
            chunk = encoded[start:start + batch_size]
            width = max(len(p) for p in chunk)
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, p in enumerate(chunk):
                ids[i, :len(p)] = torch.as_tensor(p)
                mask[i, :len(p)] = 1
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
            last = torch.as_tensor([len(p) - 1 for p in chunk], device=logits.device)
            log_p = torch.log_softmax(logits[torch.arange(len(chunk), device=logits.device), last].double(), dim=-1)
            out[start:start + len(chunk)] = log_p[:, wanted].cpu().numpy()
    return out


def plain_scores(model, tokenizer, prompts: Sequence[str], label_words: Sequence[str], **kwargs) -> np.ndarray:
    """Uncalibrated scores log P(y | x) [n_prompts, n_labels] (the "GPT-2" rows of NPM Table 1)."""
    return label_logprobs(model, tokenizer, prompts, label_words, **kwargs)


def pmi_scores(model, tokenizer, prompts: Sequence[str], label_words: Sequence[str], domain_premise: str,
               **kwargs) -> np.ndarray:
    """Domain-conditional PMI log P(y | x) - log P(y | domain_premise) [n_prompts, n_labels] (Holtzman et al.
    2021, "+ PMI" rows of NPM Table 1); ``domain_premise`` a task's ``pmi_premise`` (config/tasks.yaml)."""
    conditional = label_logprobs(model, tokenizer, prompts, label_words, **kwargs)
    domain = label_logprobs(model, tokenizer, [domain_premise], label_words, **kwargs)
    return conditional - domain


def predict(scores: np.ndarray) -> np.ndarray:
    """Predicted label ids: argmax over labels (first label on ties)."""
    return np.asarray(scores).argmax(axis=-1)
