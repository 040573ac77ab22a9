"""The parametric masked-LM baseline of paper Table 1 (the "RoBERTa" row; paper-map §4.1 step 7, §6).

The original scores it without a corpus: the same closed-set templates as NPM ("<mask>." appended when the template
has none), a softmax over the **whole vocabulary** at the single mask position, label score = the probability of the
label's single token (leading space; never the fuzzy verbalizer), prediction = argmax. Paper: RoBERTa-large 72.1.

* ``mlm_label_scores``: the label probabilities [n, n_labels] of a batch of texts.
* ``MlmScorer``: system ``mlm`` of ``npm.evaluation.systems`` (the model comes from ``npm.model.load_masked_lm``;
  ``npm.training.loop`` trains it with ``model="mlm"`` on NPM's batch lines, steps and optimiser).

Inputs longer than the model's limit, or than ``inference.mlm_max_length`` (the original code: 256, as for every
closed-set model), keep their **last** tokens (``npm.inference.query.query_ids``, as for NPM), so the mask survives; a
text with no mask or with two masks is an error naming the example.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from npm.inference.query import query_ids
from npm.model import load_masked_lm, load_tokenizer, max_input_length, torch_device
from npm.tasks.registry import label_verbalizers

BATCH_SIZE = 32  # texts per forward pass


# ------------------------------------------------------------------------------------------------ scoring

def _head_module(model):
    """The single output-head child (``cls`` for BERT, ``lm_head`` for RoBERTa) or None when the architecture
    splits its head over several children (then the full forward is used)."""
    heads = [m for n, m in model.named_children() if n != model.base_model_prefix and any(True for _ in m.parameters())]
    return heads[0] if len(heads) == 1 else None


def _label_id_lists(label_ids) -> list[list[int]]:
    out = []
    for label, ids in enumerate(label_ids):
        ids = [int(ids)] if np.ndim(ids) == 0 else [int(i) for i in np.asarray(ids).reshape(-1)]
        if not ids:
            raise ValueError(f"label {label} has no token id")
        out.append(ids)
    if not out:
        raise ValueError("no labels to score")
    return out


def mlm_label_scores(model, tokenizer, texts: Sequence[str], label_ids, batch_size: int = 32, device=None,
                     example_ids: Sequence | None = None, max_length: int | None = None) -> np.ndarray:
    """Label probabilities float64 [n, n_labels] (paper-map §4.1 step 7).

    Each text holds exactly one ``<mask>`` (or the tokenizer's own mask token); p = softmax over the whole
    vocabulary of the MLM logits at that position; a label's score is p of its token (``label_ids[j]`` an int, or
    an array of ids whose probabilities are summed; the baseline passes one id per label). Texts longer than
    ``max_length`` (default and at most: the model's limit) keep their last tokens. ``example_ids`` name the
    examples in errors (default: their index).
    """
    labels = _label_id_lists(label_ids)
    vocab = model.get_output_embeddings().weight.shape[0] if model.get_output_embeddings() is not None else None
    if vocab is not None and max(max(ids) for ids in labels) >= vocab:
        raise ValueError(f"label token ids {labels} exceed the model's vocabulary of {vocab}")
    names = list(example_ids) if example_ids is not None else list(range(len(texts)))
    if len(names) != len(texts):
        raise ValueError(f"{len(names)} example ids for {len(texts)} texts")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    limit = min(max_length or np.inf, max_input_length(model, tokenizer))
    prepared = []
    for name, text in zip(names, texts, strict=True):
        try:
            prepared.append(query_ids(tokenizer, text, n_masks=1, max_length=limit))
        except ValueError as e:
            raise ValueError(f"example {name}: {e}") from None
    if device is not None:
        model.to(device)
    device = next(model.parameters()).device
    model.eval()
    with torch.inference_mode():
        return _score_batches(model, tokenizer, prepared, labels, batch_size, device)


def _score_batches(model, tokenizer, prepared: list, labels: list[list[int]], batch_size: int, device) -> np.ndarray:
    """Forward passes over length-sorted batches of prepared (ids, mask position) pairs; see ``mlm_label_scores``."""
    head = _head_module(model)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    flat = torch.tensor([i for ids in labels for i in ids], device=device)
    owner = torch.tensor([j for j, ids in enumerate(labels) for _ in ids], device=device)
    order = np.argsort([len(ids) for ids, _ in prepared], kind="stable")  # similar lengths share a batch
    out = np.zeros((len(prepared), len(labels)), dtype=np.float64)
    for a in range(0, len(order), batch_size):
        rows = order[a:a + batch_size]
        width = max(len(prepared[r][0]) for r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attention = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            row = torch.from_numpy(prepared[r][0])
            ids[i, :len(row)], attention[i, :len(row)] = row, 1
        pos = torch.tensor([prepared[r][1] for r in rows], device=device)
        ids, attention = ids.to(device), attention.to(device)
        at = torch.arange(len(rows), device=device)
        if head is not None:  # the head on the mask positions only (a full [B, L, V] logit tensor is large)
            hidden = model.base_model(input_ids=ids, attention_mask=attention).last_hidden_state
            logits = head(hidden[at, pos])
        else:
            logits = model(input_ids=ids, attention_mask=attention).logits[at, pos]
        probs = torch.softmax(logits.float(), dim=-1)[:, flat]
        scores = torch.zeros((len(rows), len(labels)), device=device).index_add_(1, owner, probs)
        out[rows] = scores.double().cpu().numpy()
    return out


# ------------------------------------------------------------------------------------------------ system

class MlmScorer:
    """System ``mlm``: closed-set label scores of a masked LM, no corpus (``npm.evaluation.systems``)."""

    def __init__(self, system, inputs, settings):
        self.device = torch_device(inputs.device)
        self.tokenizer = load_tokenizer(inputs.checkpoint)
        self.model = load_masked_lm(inputs.checkpoint).to(self.device)
        # inference.mlm_max_length: the original keeps the last 256 tokens of every closed-set input
        self.max_length = int(min(settings.mlm_max_length or np.inf, max_input_length(self.model, self.tokenizer)))
        self.info = {"model": str(inputs.checkpoint), "corpus": None, "corpus_tokens": None, "retrieval": None,
                     "parameters": int(sum(p.numel() for p in self.model.parameters())), "device": str(self.device),
                     "max_length": self.max_length}

    def closed_set(self, task, examples, progress=None):
        verbalizers = label_verbalizers(task, self.tokenizer, fuzzy=False)
        scores = mlm_label_scores(self.model, self.tokenizer, [ex["input"] for ex in examples], verbalizers,
                                  batch_size=BATCH_SIZE, example_ids=[ex["id"] for ex in examples],
                                  max_length=self.max_length)
        if progress:
            progress(len(examples))
        return dict(scores=scores, metrics={"label_ids": [v.tolist() for v in verbalizers]})


__all__ = ["MlmScorer", "mlm_label_scores"]
