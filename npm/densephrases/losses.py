"""DensePhrases' training losses (Lee et al. 2021, sections 4.1-4.3 and appendix E; docs/paper-map.md §D1.3).

A batch of B reading-comprehension examples: the phrase encoder's token vectors ``h`` [B, m, d] of each passage
(the whole last-layer vector is both the start and the end representation: DensePhrases does not split it),
``valid`` [B, m] (the passage tokens a phrase may start or end at), the two query encoders' [CLS] vectors
``q_start``, ``q_end`` [B, d], and the gold answer's token positions ``start``, ``end`` [B].

* :func:`single_passage_loss` (eq. 5-6): z_start = h q_start over the valid tokens, L_start = -log softmax(z)[start],
  the same for the end; (L_start + L_end) / 2, averaged over the batch. Reading comprehension without
  cross-attention.
* :func:`distill_loss` (eq. 7): [KL(P_teacher_start || P_start) + KL(P_teacher_end || P_end)] / 2 with the
  cross-attention teacher's start/end distributions as the target (temperature 1, summed over positions, averaged
  over the batch); zero when the student's logits equal the teacher's.
* :func:`in_batch_loss` (eq. 8, with section 4.3): S_start = Q_start G_start^T, row i's positive is its own gold
  start vector g_i, the other B - 1 gold vectors of the batch and the B x C **pre-batch** vectors of
  :class:`PreBatchQueue` are its negatives; -(log P_start_ii + log P_end_ii) / 2, averaged over the batch.
* :class:`PreBatchQueue` (section 4.3): a FIFO of the gold start/end vectors of the last C batches, detached (no
  gradient, no momentum encoder). As in the original code, a batch whose size differs from the previous one (the
  short last batch of an epoch) is not queued, and the queue is cleared at the start of an epoch.
* :func:`filter_loss` (appendix E, the code's form): binary cross-entropy of the filter head's start and end logits
  [B, m, 2] against the gold positions, ``pos_weight`` = the sequence length, over the valid tokens.
* :func:`total_loss` (eq. 9): lambda_1 L_single + lambda_2 L_distill + lambda_3 L_neg (+ lambda_filter L_filter in the
  code); paper lambda = 1, 2, 4.

Scores are plain inner products (no 1/sqrt(d), unlike NPM), computed in fp32.
"""

from __future__ import annotations

from collections import deque

import torch

PAPER_LAMBDAS = {"single": 1.0, "distill": 2.0, "neg": 4.0, "filter": 0.0}  # eq. 9 (the code adds filter 1.0)


def _masked_log_softmax(logits: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """log softmax over the valid positions of each row (invalid ones get -inf)."""
    return torch.log_softmax(logits.float().masked_fill(~valid.bool(), float("-inf")), dim=-1)


def _gold(logp: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return logp.gather(-1, positions.long()[:, None])[:, 0]


def token_logits(h: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """z [B, m] = h_i . q for every passage token: ``h`` [B, m, d], ``q`` [B, d]; in fp32 under any autocast."""
    with torch.autocast(h.device.type, enabled=False):
        return torch.einsum("bmd,bd->bm", h.float(), q.float())


def single_passage_loss(h, valid, q_start, q_end, start, end) -> torch.Tensor:
    """(L_start + L_end) / 2 of eq. 5-6, averaged over the batch; a gold position must be a valid token."""
    if not valid.bool().gather(1, start.long()[:, None]).all() or not valid.bool().gather(1, end.long()[:, None]).all():
        raise ValueError("a gold start or end position is not a valid passage token")
    log_start = _masked_log_softmax(token_logits(h, q_start), valid)
    log_end = _masked_log_softmax(token_logits(h, q_end), valid)
    return -(_gold(log_start, start) + _gold(log_end, end)).mean() / 2


def distill_loss(student_start, student_end, teacher_start, teacher_end, valid) -> torch.Tensor:
    """[KL(P_t_start || P_s_start) + KL(P_t_end || P_s_end)] / 2 of eq. 7 over the valid positions, summed over
    positions and averaged over the batch; the teacher's logits [B, m] are constants."""
    total = 0.0
    for student, teacher in ((student_start, teacher_start), (student_end, teacher_end)):
        log_s = _masked_log_softmax(student, valid)
        log_t = _masked_log_softmax(teacher.detach(), valid)
        p_t = log_t.exp()
        kl = torch.where(p_t > 0, p_t * (log_t - log_s), torch.zeros_like(p_t)).sum(-1)
        total = total + kl.mean()
    return total / 2


class PreBatchQueue:
    """The gold start/end vectors of the last ``size`` (C) batches, detached, oldest first (section 4.3)."""

    def __init__(self, size: int):
        if size < 0:
            raise ValueError(f"the pre-batch size C must be >= 0, got {size}")
        self.size = size
        self._batches: deque = deque(maxlen=max(size, 1))
        self._last_batch_size: int | None = None

    def __len__(self) -> int:
        """Batches held."""
        return len(self._batches) if self.size else 0

    def push(self, g_start: torch.Tensor, g_end: torch.Tensor) -> bool:
        """Queue one batch's gold vectors [B, d] (detached); False when it is not queued (C = 0, or its size
        differs from the previous batch's, as the original code skips the short last batch)."""
        b = int(g_start.shape[0])
        same = self._last_batch_size is None or b == self._last_batch_size
        self._last_batch_size = b
        if not self.size or not same:
            return False
        self._batches.append((g_start.detach().clone(), g_end.detach().clone()))
        return True

    def clear(self) -> None:
        """Start of an epoch: forget every queued batch."""
        self._batches.clear()
        self._last_batch_size = None

    def negatives(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The queued start and end vectors [C * B, d], or (None, None) when empty."""
        if not len(self):
            return None, None
        return (torch.cat([s for s, _ in self._batches]), torch.cat([e for _, e in self._batches]))


def gold_vectors(h: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """g_start, g_end [B, d]: each example's token vectors at its gold start and end."""
    rows = torch.arange(h.shape[0], device=h.device)
    return h[rows, start.long()], h[rows, end.long()]


def in_batch_loss(q_start, q_end, g_start, g_end, pre_start=None, pre_end=None) -> torch.Tensor:
    """-(log P_start_ii + log P_end_ii) / 2 of eq. 8 averaged over the batch: row i scores its own gold vector
    (the positive) against the other gold vectors of the batch and the pre-batch vectors [C * B, d] if given."""
    losses = []
    for q, g, pre in ((q_start, g_start, pre_start), (q_end, g_end, pre_end)):
        keys = g if pre is None else torch.cat([g, pre.detach().to(g.dtype)])
        with torch.autocast(q.device.type, enabled=False):  # fp32 scores, as token_logits
            scores = q.float() @ keys.float().T
        losses.append(torch.nn.functional.cross_entropy(scores, torch.arange(len(q), device=q.device)))
    return (losses[0] + losses[1]) / 2


def filter_loss(filter_logits, valid, start, end) -> torch.Tensor:
    """Binary cross-entropy of the filter head's [B, m, 2] logits (start, end) against the gold start and end
    positions, over the valid tokens, with ``pos_weight`` = the sequence length m (the original code's weighting);
    the mean of the start and end terms."""
    b, m, _ = filter_logits.shape
    rows = torch.arange(b, device=filter_logits.device)
    keep = valid.bool()
    total = 0.0
    for col, gold in ((0, start), (1, end)):
        target = torch.zeros(b, m, device=filter_logits.device)
        target[rows, gold.long()] = 1.0
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            filter_logits[..., col].float()[keep], target[keep],
            pos_weight=torch.tensor(float(m), device=filter_logits.device))
        total = total + loss
    return total / 2


def total_loss(parts: dict[str, torch.Tensor], lambdas: dict[str, float] | None = None) -> torch.Tensor:
    """Eq. 9: sum of lambda[name] * parts[name] (paper: single 1, distill 2, neg 4); a part with lambda 0 or absent
    from ``parts`` is left out."""
    lambdas = PAPER_LAMBDAS if lambdas is None else lambdas
    unknown = set(parts) - set(lambdas)
    if unknown:
        raise ValueError(f"no lambda for loss part(s) {sorted(unknown)}; known: {sorted(lambdas)}")
    return sum(lambdas[name] * value for name, value in parts.items() if lambdas[name])
