"""The multi-positive contrastive loss of NPM and NPM-single (paper 3.2-3.3; paper-map §2.4, §9 items 13-17).

Queries are the final-layer vectors at the two mask tokens [MASK_s][MASK_e] of each masked span (NPM) or at
each masked token (NPM-single). Candidates are all valid positions of the unmasked target view of every
sequence in the pool (``npm.training.gather.candidate_pool``) except the query's own sequence.

* Score mask: the target is valid (not padding) AND the target is not in the query's own sequence.
  ``<s>``/``</s>`` (special) targets are valid negatives; padding is neither a positive nor a negative.
* Phrase positives of a span g of length n: start = positions p of another sequence where the target ids
  p..p+n-1 equal g exactly within the row; end = p+n-1 for each start positive.
* sim(q, t) = q.t / sqrt(h), h the hidden size, no other temperature.
* Per query: l = logsumexp(sim over all scored targets) - logsumexp(sim over positives).
  NPM: loss = mean over spans of l_start + mean over spans of l_end. Every span must have a positive.
  NPM-single: mean over masked tokens that have at least one positive; the others are dropped.

Scores are computed in fp32 (autocast is switched off and the inputs upcast) for a stable logsumexp.
Pool positions are flattened row-major: pool row s, column p is column s * Lp + p of the score matrix.
"""

from __future__ import annotations

import math

import torch


def _own_sequence_excluded(pool_valid: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
    """Score mask [n, S*Lp]: valid target positions outside each query's own sequence ``seq`` [n]."""
    n = seq.shape[0]
    S, Lp = pool_valid.shape
    mask = pool_valid.bool().unsqueeze(0).expand(n, S, Lp).clone()
    mask[torch.arange(n, device=mask.device), seq.long()] = False
    return mask.reshape(n, S * Lp)


def phrase_positives(
    span_tokens: torch.Tensor,
    span_lengths: torch.Tensor,
    seq: torch.Tensor,
    pool_ids: torch.Tensor,
    pool_valid: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Start and end positives of every span (paper-map §2.4 "phrase labels", §9 item 13).

    span_tokens [n, m] (padded with -1), span_lengths [n], seq [n] (pool row of each span's own sequence),
    pool_ids / pool_valid [S, Lp]. Returns start_pos, end_pos [n, S*Lp] bool: start positives are the positions
    p of rows s != seq where pool_ids[s, p:p+len] equals the span and all those positions are valid (a match
    never runs past the row); the end positive of each start positive p is p+len-1.
    """
    n, m = span_tokens.shape
    S, Lp = pool_ids.shape
    lengths = span_lengths.long()
    if n and bool(((lengths < 1) | (lengths > m)).any()):  # one wait for the device, not two
        raise ValueError(f"span lengths must lie in [1, {m}] (the width of span_tokens)")
    tokens = span_tokens.long()
    ids, valid = pool_ids.long(), pool_valid.bool()
    start = torch.ones(n, S, Lp, dtype=torch.bool, device=ids.device)
    for k in range(m):
        shifted_ids = torch.zeros_like(ids)
        shifted_valid = torch.zeros_like(valid)
        shifted_ids[:, : Lp - k] = ids[:, k:]
        shifted_valid[:, : Lp - k] = valid[:, k:]
        hit = (shifted_ids.unsqueeze(0) == tokens[:, k].view(n, 1, 1)) & shifted_valid.unsqueeze(0)
        active = (lengths > k).view(n, 1, 1)
        start &= hit | ~active
    start[torch.arange(n, device=start.device), seq.long()] = False
    end = torch.zeros_like(start)  # start p of a span of length k ends at p + k - 1 (inside its row, as matched)
    for k in range(1, min(m, Lp) + 1):  # a span longer than the rows matched nowhere
        end[:, :, k - 1:] |= start[:, :, :Lp - k + 1] & (lengths == k).view(n, 1, 1)
    return start.reshape(n, S * Lp), end.reshape(n, S * Lp)


def single_positives(
    query_tokens: torch.Tensor, seq: torch.Tensor, pool_ids: torch.Tensor, pool_valid: torch.Tensor
) -> torch.Tensor:
    """NPM-single positives [m, S*Lp]: valid positions of other sequences holding the masked token's id (§9 item 17)."""
    m = query_tokens.shape[0]
    S, Lp = pool_ids.shape
    pos = (pool_ids.long().reshape(1, S * Lp) == query_tokens.long().view(m, 1)) & pool_valid.bool().reshape(1, -1)
    pos = pos.reshape(m, S, Lp)
    pos[torch.arange(m, device=pos.device), seq.long()] = False
    return pos.reshape(m, S * Lp)


def _scores(q: torch.Tensor, pool_vectors: torch.Tensor) -> torch.Tensor:
    """sim = q.t / sqrt(h) in fp32, [n, S*Lp]."""
    h = pool_vectors.shape[-1]
    if q.shape[-1] != h:
        raise ValueError(f"query size {q.shape[-1]} != target size {h}")
    with torch.autocast(q.device.type, enabled=False):
        return (q.float() @ pool_vectors.reshape(-1, h).float().T) / math.sqrt(h)


def _info_nce(sim: torch.Tensor, mask: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
    """Per row: logsumexp(sim over mask) - logsumexp(sim over positives & mask)."""
    neg_inf = torch.finfo(sim.dtype).min
    every = torch.logsumexp(sim.masked_fill(~mask, neg_inf), dim=1)
    pos = torch.logsumexp(sim.masked_fill(~(positives & mask), neg_inf), dim=1)
    return every - pos


def _floats(**values) -> dict[str, float]:
    """``values`` as Python floats, in their order: the 0-d tensors among them copied from the device in one transfer
    (one wait for the device, not one per value), numbers as they are."""
    tensors = [v.float() for v in values.values() if isinstance(v, torch.Tensor)]
    copied = iter(torch.stack(tensors).tolist() if tensors else [])
    return {k: next(copied) if isinstance(v, torch.Tensor) else float(v) for k, v in values.items()}


def _describe(rows: torch.Tensor, span_tokens: torch.Tensor | None, limit: int = 10) -> str:
    shown = []
    for i in rows[:limit].tolist():
        if span_tokens is None:
            shown.append(f"span {i}")
        else:
            tokens = [t for t in span_tokens[i].tolist() if t >= 0]
            shown.append(f"span {i} tokens {tokens}")
    more = f" and {len(rows) - limit} more" if len(rows) > limit else ""
    return ", ".join(shown) + more


def phrase_loss(
    q_start: torch.Tensor,
    q_end: torch.Tensor,
    pool_vectors: torch.Tensor,
    pool_valid: torch.Tensor,
    start_pos: torch.Tensor,
    end_pos: torch.Tensor,
    seq: torch.Tensor,
    span_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """NPM's phrase loss (paper 3.2 eq. for L_start + L_end; paper-map §2.4).

    q_start / q_end [n, h] (vectors at [MASK_s] / [MASK_e]), pool_vectors [S, Lp, h], pool_valid [S, Lp],
    start_pos / end_pos [n, S*Lp] from ``phrase_positives``, seq [n] (pool row of each span's own sequence).
    ``span_tokens`` only names the offending spans in the error. Returns the scalar loss (fp32) and stats
    (loss_start, loss_end, positives_per_span, queries, start_end_same, start_end_sim).
    Raises ValueError if a span has no start or no end positive (the original asserts this).
    """
    n = q_start.shape[0]
    if n == 0:
        raise ValueError("no masked span: the phrase loss needs at least one query")
    mask = _own_sequence_excluded(pool_valid, seq)
    start_pos, end_pos = start_pos & mask, end_pos & mask
    missing = torch.nonzero(~(start_pos.any(1) & end_pos.any(1))).flatten()
    if len(missing):
        raise ValueError(
            f"{len(missing)} of {n} masked spans have no positive (no occurrence in another sequence of the "
            f"candidate pool): {_describe(missing, span_tokens)}; span masking must only pick co-occurring spans"
        )
    h = pool_vectors.shape[-1]
    loss_start = _info_nce(_scores(q_start, pool_vectors), mask, start_pos).mean()
    loss_end = _info_nce(_scores(q_end, pool_vectors), mask, end_pos).mean()
    with torch.no_grad():
        stats = _floats(loss_start=loss_start, loss_end=loss_end, positives_per_span=start_pos.sum(1).float().mean(),
                        queries=n, start_end_same=(start_pos == end_pos).all(1).float().mean(),
                        start_end_sim=(q_start.float() * q_end.float()).sum(1).mean() / math.sqrt(h))
    return loss_start + loss_end, stats


def single_loss(
    q: torch.Tensor,
    pool_vectors: torch.Tensor,
    pool_valid: torch.Tensor,
    positives: torch.Tensor,
    seq: torch.Tensor,
) -> tuple[torch.Tensor, dict]:
    """NPM-single's token loss (paper 3.3; paper-map §2.4 "NPM-single").

    q [m, h] (vectors at the masked tokens), positives [m, S*Lp] from ``single_positives``, seq [m]. The mean
    runs over the masked tokens with at least one positive; the others are dropped, as the original.
    Returns the loss and stats (loss, positives_per_span, queries = kept tokens, label_ratio = kept / m).
    Raises ValueError if no masked token has a positive.
    """
    m = q.shape[0]
    mask = _own_sequence_excluded(pool_valid, seq)
    positives = positives & mask
    keep = positives.any(1)
    kept = int(keep.sum())
    if kept == 0:
        raise ValueError(f"none of the {m} masked tokens has a positive (the same id in another sequence of the pool)")
    rows = torch.nonzero(keep).flatten()
    loss = _info_nce(_scores(q[rows], pool_vectors), mask[rows], positives[rows]).mean()
    return loss, _floats(loss=loss.detach(), positives_per_span=positives[rows].sum(1).float().mean(), queries=kept,
                         label_ratio=kept / m)
