"""Query encoding (paper 3.1 and 3.3; paper-map §3.6, §4.1; §9 items 19 and 27).

NPM: the query is tokenized with the tokenizer's begin/end tokens, a second mask token is inserted right after
the (single) mask, and one encoder pass gives ``q_start`` (final hidden layer at the first mask) and ``q_end``
(at the second). NPM-single keeps one mask and gives one vector. Inputs longer than the model's limit keep their
**last** ``max_length`` tokens, as the original (the leading begin token is lost; the mask must survive); NPM's
second mask goes in after that cut, as the original's, so its query may hold ``max_length + 1`` tokens.

Queries are written with ``<mask>`` (the paper's and the datasets' templates) or the tokenizer's own mask
token (``[MASK]`` for BERT); both are accepted. A query with no mask, with two masks or with no text is an
error, never a silent guess.
"""

from __future__ import annotations

import numpy as np
import torch

from npm.model import encode
from npm.tasks.templates import MASK_PLACEHOLDER


def query_ids(tokenizer, text: str, n_masks: int = 2, max_length: int = 256) -> tuple[np.ndarray, int]:
    """Token ids int64 [L] of one query and the position of its first mask.

    ``n_masks`` = 2 for NPM ([MASK_s][MASK_e]), 1 for NPM-single and the MLM baseline.
    """
    if not text or not text.strip():
        raise ValueError("empty query: write a sentence with one <mask>, e.g. 'Paris is the capital of <mask>.'")
    mask = tokenizer.mask_token
    if mask != MASK_PLACEHOLDER:
        text = text.replace(MASK_PLACEHOLDER, mask)
    ids = np.asarray(tokenizer(text, add_special_tokens=True, verbose=False)["input_ids"], dtype=np.int64)
    where = np.flatnonzero(ids == tokenizer.mask_token_id)
    if len(where) == 0:
        raise ValueError(f"query has no mask ({MASK_PLACEHOLDER} or {mask}): {text!r}")
    if len(where) > 1:
        raise ValueError(f"query has {len(where)} masks; NPM predicts exactly one span per query: {text!r}")
    pos = int(where[0])
    if len(ids) > max_length:
        cut = len(ids) - max_length
        if pos < cut:
            raise ValueError(f"query of {len(ids)} tokens: keeping its last {max_length} tokens (as the original) "
                             f"would drop the mask at token {pos}; shorten the text before the mask")
        ids, pos = ids[cut:], pos - cut
    if n_masks == 2:  # after the cut, as the original: NPM's query may hold max_length + 1 tokens
        ids = np.insert(ids, pos + 1, tokenizer.mask_token_id)
    return ids, pos


def pass_size(device) -> int:
    """Queries per encoder pass: 16 on CPU (with length-sorted passes, 93 queries/s against 35 for one pass of 64
    mixed-length queries on one thread, benchmarks/predict.py), 128 on a GPU."""
    return 128 if torch.device(device).type == "cuda" else 16


@torch.inference_mode()
def encode_queries(model, tokenizer, texts: list[str], n_masks: int = 2, max_length: int = 256,
                   batch_size: int | None = None, device=None) -> np.ndarray:
    """Final-layer vectors at the mask(s): float32 [n, n_masks, h] (paper-map §3.6: not the LM head).

    The queries go through the encoder in passes of ``batch_size`` (default ``pass_size``) queries of similar
    length (sorted by length, so that little of a pass is padding); the rows come back in the order of ``texts``.
    """
    device = device or next(model.parameters()).device
    if model.training:  # eval() walks every submodule: 2 ms a call, a tenth of a one-query prediction on CPU
        model.eval()
    prepared = [query_ids(tokenizer, t, n_masks, max_length) for t in texts]
    size = batch_size or pass_size(device)
    order = np.argsort([len(ids) for ids, _ in prepared], kind="stable")
    out = np.zeros((len(texts), n_masks, model.config.hidden_size), np.float32)
    for a in range(0, len(order), size):
        take = order[a:a + size]
        chunk = [prepared[i] for i in take]
        width = max(len(ids) for ids, _ in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        attention = torch.zeros_like(ids)
        for i, (row, _) in enumerate(chunk):
            ids[i, :len(row)] = torch.from_numpy(row)
            attention[i, :len(row)] = 1
        hidden = encode(model, ids.to(device), attention.to(device)).float()
        pos = torch.tensor([p for _, p in chunk], device=hidden.device)
        cols = pos[:, None] + torch.arange(n_masks, device=hidden.device)
        out[take] = hidden[torch.arange(len(chunk), device=hidden.device)[:, None], cols].cpu().numpy()
    return out
