"""Collate one masked batch line into model tensors (paper 3.2; paper-map §2.3, §9 item 12).

NPM (span masking): every masked span becomes exactly two adjacent mask tokens, [MASK_s][MASK_e]
(the paper needs no distinct ids), so a query row has length L - sum(|span|) + 2 * #spans. The unmasked
target rows keep the original tokens. Rows are padded with id 0 and attention 0 (paper-map §2.1) to the
longest row of the batch, or to a fixed length (the original pads to exactly 256 + 64 = 320); padding
never changes the loss because it is neither a query, a positive nor a negative.

NPM-single (uniform or span masking, one query per masked token): each masked token becomes one mask
token in place, so query and target rows stay aligned and have the original length.

Spans and labels are flattened in (sequence, start) order.

Parametric MLM baseline (``collate_mlm``; the "RoBERTa" row of paper Table 1, paper-map §6, trained
here because the embedded default's encoder has no MLM head): the *unmasked* view of the same batch line, masked on
the fly BERT-style (Devlin et al. 2019): each non-special token is selected with probability 15%; a selected token
becomes the mask token (80%), a uniformly random vocabulary id (10%) or stays (10%); labels are -100 elsewhere. The
draws come from a ``torch.Generator`` the caller seeds (per step), so a resumed run masks exactly the same tokens.
"""

from __future__ import annotations

import numpy as np
import torch

PAD_ID = 0
MLM_RATIO = 0.15  # the MLM baseline: share of non-special tokens selected (BERT's 15%; loop.TrainConfig.mlm_ratio)


def _pad(rows: list[np.ndarray], length: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows) if length is None else length
    if any(len(r) > width for r in rows):
        raise ValueError(f"a row of {max(len(r) for r in rows)} tokens does not fit the padding length {width}")
    ids = np.full((len(rows), width), PAD_ID, dtype=np.int64)
    attention = np.zeros((len(rows), width), dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
        attention[i, : len(r)] = 1
    return torch.from_numpy(ids), torch.from_numpy(attention)


def collate_phrase(
    sequences: list[np.ndarray], spans: np.ndarray, mask_id: int, pad_to: int | None = None
) -> dict[str, torch.Tensor]:
    """Build NPM's two views of a batch.

    sequences: B unpadded token-id arrays; spans: int array [n, 3] of (sequence, start, length) sorted by
    (sequence, start), non-overlapping. Returns query_ids/query_attention [B, Lq], target_ids/target_valid
    [B, Lt], span_seq [n], span_tokens [n, max_len] (padded with -1), span_lengths [n], and q_start_pos /
    q_end_pos [n] (column of each span's [MASK_s] / [MASK_e] in its query row).
    """
    spans = np.asarray(spans, dtype=np.int64).reshape(-1, 3)
    if len(spans) == 0:
        raise ValueError("the batch has no masked span; masked batches without masks cannot train NPM")
    query_rows, q_start = [], np.empty(len(spans), dtype=np.int64)
    bounds = np.searchsorted(spans[:, 0], np.arange(len(sequences) + 1))
    for b, ids in enumerate(sequences):
        own = spans[bounds[b] : bounds[b + 1]]
        pieces, cursor, out_len = [], 0, 0
        for k, (_, start, length) in enumerate(own):
            if start < cursor or start + length > len(ids):
                raise ValueError(f"span (sequence {b}, start {start}, length {length}) overlaps or leaves the row")
            pieces.append(ids[cursor:start])
            out_len += start - cursor
            q_start[bounds[b] + k] = out_len
            pieces.append(np.array([mask_id, mask_id], dtype=ids.dtype))
            out_len += 2
            cursor = start + length
        pieces.append(ids[cursor:])
        query_rows.append(np.concatenate(pieces))
    query_ids, query_attention = _pad(query_rows, pad_to)
    target_ids, target_valid = _pad(list(sequences), pad_to)

    max_len = int(spans[:, 2].max())
    span_tokens = np.full((len(spans), max_len), -1, dtype=np.int64)
    for i, (b, start, length) in enumerate(spans):
        span_tokens[i, :length] = sequences[b][start : start + length]
    return {
        "query_ids": query_ids,
        "query_attention": query_attention,
        "target_ids": target_ids,
        "target_valid": target_valid.bool(),
        "span_seq": torch.from_numpy(spans[:, 0].copy()),
        "span_tokens": torch.from_numpy(span_tokens),
        "span_lengths": torch.from_numpy(spans[:, 2].copy()),
        "q_start_pos": torch.from_numpy(q_start),
        "q_end_pos": torch.from_numpy(q_start + 1),
    }


def collate_single(
    sequences: list[np.ndarray], spans: np.ndarray, mask_id: int, pad_to: int | None = None
) -> dict[str, torch.Tensor]:
    """Build NPM-single's views: every masked token (of any span) becomes one mask token in place.

    Returns query_ids/query_attention and target_ids/target_valid [B, L] (aligned), query_seq [m],
    query_pos [m] (column of each masked token) and query_tokens [m] (its original id).
    """
    spans = np.asarray(spans, dtype=np.int64).reshape(-1, 3)
    if len(spans) == 0:
        raise ValueError("the batch has no masked token; masked batches without masks cannot train NPM-single")
    lengths = spans[:, 2]
    seq = np.repeat(spans[:, 0], lengths)
    within = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    pos = np.repeat(spans[:, 1], lengths) + within
    target_ids, target_valid = _pad(list(sequences), pad_to)
    query_ids = target_ids.clone()
    seq_t, pos_t = torch.from_numpy(seq), torch.from_numpy(pos)
    if (pos_t >= target_valid.sum(1)[seq_t]).any():
        raise ValueError("a masked position lies outside its sequence")
    tokens = target_ids[seq_t, pos_t].clone()
    query_ids[seq_t, pos_t] = mask_id
    return {
        "query_ids": query_ids,
        "query_attention": target_valid.clone(),
        "target_ids": target_ids,
        "target_valid": target_valid.bool(),
        "query_seq": seq_t,
        "query_pos": pos_t,
        "query_tokens": tokens,
    }


IGNORE_INDEX = -100  # cross-entropy label of tokens that are not predicted (transformers' convention)


def collate_mlm(
    sequences: list[np.ndarray], mask_id: int, special_ids, vocab_size: int, generator: torch.Generator,
    ratio: float = MLM_RATIO, pad_to: int | None = None,
) -> dict[str, torch.Tensor]:
    """BERT-style masking of the unmasked rows of one batch line (module docstring; MLM baseline).

    sequences: B unpadded token-id arrays; special_ids: ids never selected (begin/end/pad...); random replacements
    are drawn from ``[0, vocab_size)``. Draw order (fixed, so the result depends only on the generator's seed):
    one uniform per cell for selection, one uniform per cell for the 80/10/10 choice, one random id per cell, and,
    only when nothing was selected, one draw picking a single eligible token (a step always has a target).
    Returns input_ids / attention_mask / labels [B, L] (labels = original id at selected tokens, -100 elsewhere).
    """
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"masking ratio must be in (0, 1], got {ratio}")
    ids, attention = _pad(list(sequences), pad_to)
    special = torch.tensor(sorted({int(i) for i in special_ids if i is not None}), dtype=torch.long)
    eligible = attention.bool() & ~torch.isin(ids, special)
    selected = (torch.rand(ids.shape, generator=generator) < ratio) & eligible
    action = torch.rand(ids.shape, generator=generator)
    random_ids = torch.randint(vocab_size, ids.shape, generator=generator)
    if not selected.any():
        candidates = eligible.flatten().nonzero().flatten()
        if len(candidates) == 0:
            raise ValueError("the batch line has no non-special token to mask for MLM")
        pick = candidates[torch.randint(len(candidates), (1,), generator=generator)]
        selected.view(-1)[pick] = True
    labels = torch.where(selected, ids, torch.full_like(ids, IGNORE_INDEX))
    input_ids = ids.clone()
    to_mask = selected & (action < 0.8)
    to_random = selected & (action >= 0.8) & (action < 0.9)
    input_ids[to_mask] = mask_id
    input_ids[to_random] = random_ids[to_random]
    return {"input_ids": input_ids, "attention_mask": attention, "labels": labels}
