"""DensePhrases' losses (npm.densephrases.losses; paper-map §D1.3) against hand computations: the single-passage
loss, distillation (zero at teacher = student), in-batch negatives, the pre-batch FIFO (size, order, detach, the
skipped short batch, the epoch reset), the filter BCE and eq. 9's weighted sum."""

from __future__ import annotations

import math

import pytest
import torch

from npm.densephrases.losses import (
    PAPER_LAMBDAS,
    PreBatchQueue,
    distill_loss,
    filter_loss,
    gold_vectors,
    in_batch_loss,
    single_passage_loss,
    token_logits,
    total_loss,
)


def _lse(xs):
    top = max(xs)
    return top + math.log(sum(math.exp(x - top) for x in xs))


def test_single_passage_loss_is_the_mean_of_start_and_end_cross_entropies_over_valid_tokens():
    h = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [5.0, 5.0]]])  # token 3 is padding
    valid = torch.tensor([[True, True, True, False]])
    q_start, q_end = torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    z_start, z_end = [2.0, 0.0, 2.0], [0.0, 1.0, 1.0]  # h . q over the three valid tokens
    want = ((_lse(z_start) - z_start[0]) + (_lse(z_end) - z_end[2])) / 2
    got = single_passage_loss(h, valid, q_start, q_end, torch.tensor([0]), torch.tensor([2]))
    assert float(got) == pytest.approx(want)
    with pytest.raises(ValueError, match="not a valid passage token"):
        single_passage_loss(h, valid, q_start, q_end, torch.tensor([3]), torch.tensor([2]))


def test_distillation_is_zero_when_the_student_is_the_teacher_and_the_kl_otherwise():
    valid = torch.tensor([[True, True, True, False]])
    teacher_s, teacher_e = torch.tensor([[1.0, 2.0, 0.5, 9.0]]), torch.tensor([[0.0, -1.0, 3.0, 9.0]])
    assert float(distill_loss(teacher_s.clone(), teacher_e.clone(), teacher_s, teacher_e, valid)) == pytest.approx(0.0)
    student_s = torch.tensor([[0.0, 0.0, 0.0, -9.0]], requires_grad=True)
    student_e = teacher_e.clone()
    p_t = torch.softmax(teacher_s[0, :3], 0)
    want = float((p_t * (p_t.log() - math.log(1 / 3))).sum()) / 2  # the end term is 0
    got = distill_loss(student_s, student_e, teacher_s, teacher_e, valid)
    assert float(got) == pytest.approx(want) and float(got) > 0
    got.backward()
    assert student_s.grad[0, 3] == 0  # padding takes no part


def test_in_batch_negatives_are_the_other_gold_vectors_of_the_batch():
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    g = torch.tensor([[2.0, 0.0], [0.0, 3.0], [1.0, -1.0]])
    scores = (q @ g.T).tolist()
    want_start = sum(_lse(row) - row[i] for i, row in enumerate(scores)) / 3
    got = in_batch_loss(q, q, g, g)
    assert float(got) == pytest.approx(want_start)  # start and end identical here: their mean is one of them
    # pre-batch vectors are extra columns of every row
    pre = torch.tensor([[0.0, 5.0]])
    with_pre = (torch.cat([q @ g.T, q @ pre.T], 1)).tolist()
    want = sum(_lse(row) - row[i] for i, row in enumerate(with_pre)) / 3
    assert float(in_batch_loss(q, q, g, g, pre, pre)) == pytest.approx(want)


def test_pre_batch_queue_keeps_the_last_c_batches_detached_and_skips_a_short_batch():
    queue = PreBatchQueue(2)
    assert queue.negatives() == (None, None)
    batches = [torch.full((3, 2), float(i), requires_grad=True) for i in range(4)]
    for b in batches[:3]:
        assert queue.push(b * 1.0, b * -1.0)
    start, end = queue.negatives()
    assert len(queue) == 2 and start.shape == (6, 2)
    assert start[:, 0].tolist() == [1.0] * 3 + [2.0] * 3 and end[0, 0] == -1.0  # oldest first, batch 0 gone
    assert not start.requires_grad and not end.requires_grad  # detached: no gradient reaches a queued batch
    assert not queue.push(torch.zeros(2, 2), torch.zeros(2, 2))  # the short last batch of an epoch: not queued
    assert len(queue) == 2
    # a loss with the queue: gradient flows into the current batch only
    q = torch.ones(3, 2, requires_grad=True)
    g = batches[3] * 1.0
    in_batch_loss(q, q, g, g, *queue.negatives()).backward()
    assert batches[3].grad is not None and all(b.grad is None for b in batches[:3])
    queue.clear()
    assert len(queue) == 0 and queue.negatives() == (None, None)
    off = PreBatchQueue(0)
    assert not off.push(torch.zeros(3, 2), torch.zeros(3, 2)) and off.negatives() == (None, None)


def test_gold_vectors_and_token_logits():
    h = torch.arange(24.0).view(2, 3, 4)
    g_s, g_e = gold_vectors(h, torch.tensor([1, 0]), torch.tensor([2, 2]))
    assert g_s.tolist() == [h[0, 1].tolist(), h[1, 0].tolist()] and g_e.tolist() == [h[0, 2].tolist(), h[1, 2].tolist()]
    q = torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 1.0]])
    assert token_logits(h, q).tolist() == [[0.0, 4.0, 8.0], [15.0, 19.0, 23.0]]


def test_filter_loss_is_weighted_binary_cross_entropy_on_gold_positions():
    logits = torch.tensor([[[0.0, 1.0], [2.0, -1.0], [0.5, 0.5]]])
    valid = torch.tensor([[True, True, False]])
    got = filter_loss(logits, valid, torch.tensor([1]), torch.tensor([0]))
    m = 3

    def bce(x, y):
        return -(m * y * math.log(1 / (1 + math.exp(-x))) + (1 - y) * math.log(1 - 1 / (1 + math.exp(-x))))

    start = (bce(0.0, 0) + bce(2.0, 1)) / 2
    end = (bce(1.0, 1) + bce(-1.0, 0)) / 2
    assert float(got) == pytest.approx((start + end) / 2)


def test_total_loss_weighs_the_parts_as_eq_9():
    parts = {"single": torch.tensor(1.0), "distill": torch.tensor(0.5), "neg": torch.tensor(0.25)}
    assert float(total_loss(parts)) == pytest.approx(1 * 1.0 + 2 * 0.5 + 4 * 0.25)
    assert PAPER_LAMBDAS["filter"] == 0.0
    assert float(total_loss({**parts, "filter": torch.tensor(3.0)}, {**PAPER_LAMBDAS, "filter": 1.0})) == 6.0
    with pytest.raises(ValueError, match="no lambda"):
        total_loss({"other": torch.tensor(1.0)})


def test_scores_stay_fp32_under_a_bf16_autocast():
    """Mixed precision encodes in bf16 but scores in fp32: in bf16 a phrase score of ~50 is rounded to steps of 0.25,
    enough to reorder the in-batch and passage softmaxes (eq. 5-8) and wreck open-domain retrieval."""
    g = torch.Generator().manual_seed(0)
    h, q = torch.randn(2, 7, 64, generator=g) * 3, torch.randn(2, 64, generator=g) * 3
    gs, ge = torch.randn(2, 64, generator=g) * 3, torch.randn(2, 64, generator=g) * 3
    want_z, want_l = token_logits(h, q), in_batch_loss(q, q, gs, ge)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z, loss = token_logits(h, q), in_batch_loss(q, q, gs, ge)
    assert z.dtype == torch.float32
    torch.testing.assert_close(z, want_z)
    torch.testing.assert_close(loss, want_l)
