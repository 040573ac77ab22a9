"""The contrastive loss of NPM and NPM-single (paper-map §2.4, §9 items 13-17; 18: test_distributed)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from npm.training.collate import collate_phrase
from npm.training.loss import phrase_loss, phrase_positives, single_loss, single_positives

MASK = 99


def brute_force_positives(tokens, lengths, seq, ids, valid):
    """Item 13 by enumeration: (span, row, start) and (span, row, end) sets."""
    starts, ends = set(), set()
    S, Lp = len(ids), len(ids[0])
    for i, (g, n) in enumerate(zip(tokens, lengths, strict=True)):
        g = g[:n]
        for s in range(S):
            if s == seq[i]:
                continue
            for p in range(Lp - n + 1):
                if ids[s][p : p + n] == g and all(valid[s][p : p + n]):
                    starts.add((i, s, p))
                    ends.add((i, s, p + n - 1))
    return starts, ends


def as_set(pos: torch.Tensor, Lp: int) -> set:
    return {(i, c // Lp, c % Lp) for i, c in pos.nonzero().tolist()}


def random_pool(seed: int, S: int = 5, Lp: int = 12, vocab: int = 4):
    """Rows of a tiny vocabulary (many repeated phrases), random valid lengths, padding ids drawn from it too."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 5 + vocab, size=(S, Lp))
    lengths = rng.integers(3, Lp + 1, size=S)
    valid = np.arange(Lp)[None] < lengths[:, None]
    spans, seq = [], []
    for _ in range(12):
        s = int(rng.integers(S))
        n = int(rng.integers(1, 4))
        p = int(rng.integers(0, max(1, lengths[s] - n + 1)))
        n = min(n, lengths[s] - p)
        spans.append(ids[s, p : p + n].tolist() + [-1] * (3 - n))
        seq.append(s)
    span_lengths = [sum(t >= 0 for t in g) for g in spans]
    return ids, valid, spans, span_lengths, seq


def loss_by_formula(q, keys, mask, pos):
    """Per row: log sum_valid exp(q.t/sqrt h) - log sum_pos exp(q.t/sqrt h), in float64 Python."""
    out = []
    h = q.shape[1]
    for i in range(len(q)):
        sims = [float(q[i].double() @ keys[c].double()) / math.sqrt(h) for c in range(len(keys))]
        every = math.log(sum(math.exp(x) for c, x in enumerate(sims) if mask[i, c]))
        positive = math.log(sum(math.exp(x) for c, x in enumerate(sims) if pos[i, c]))
        out.append(every - positive)
    return out


# paper-map §9 item 13 -----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_start_and_end_positives_equal_a_brute_force_enumeration(seed):
    ids, valid, spans, lengths, seq = random_pool(seed)
    start, end = phrase_positives(torch.tensor(spans), torch.tensor(lengths), torch.tensor(seq), torch.tensor(ids),
                                  torch.tensor(valid))
    want_start, want_end = brute_force_positives(spans, lengths, seq, ids.tolist(), valid.tolist())
    assert as_set(start, ids.shape[1]) == want_start
    assert as_set(end, ids.shape[1]) == want_end
    assert any(n > 1 for n in lengths) and len(want_start) > len(spans)  # repeated phrases, multi-token spans


def test_own_sequence_is_excluded_even_if_it_contains_the_span():
    ids = torch.tensor([[1, 7, 8, 7, 8, 2], [1, 7, 8, 9, 2, 0]])
    valid = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]]).bool()
    start, end = phrase_positives(torch.tensor([[7, 8]]), torch.tensor([2]), torch.tensor([0]), ids, valid)
    assert as_set(start, 6) == {(0, 1, 1)} and as_set(end, 6) == {(0, 1, 2)}


def test_a_match_never_runs_past_the_row_end_or_into_padding():
    ids = torch.tensor([[5, 6, 0, 0], [9, 9, 5, 6], [9, 9, 9, 5]])
    valid = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]]).bool()
    start, _ = phrase_positives(torch.tensor([[5, 6]]), torch.tensor([2]), torch.tensor([0]), ids, valid)
    assert as_set(start, 4) == {(0, 1, 2)}
    valid[1, 3] = False  # the same ids, but the last one is padding
    start, _ = phrase_positives(torch.tensor([[5, 6]]), torch.tensor([2]), torch.tensor([0]), ids, valid)
    assert not start.any()


def test_single_token_span_has_equal_start_and_end_positives():
    ids, valid, spans, lengths, seq = random_pool(3)
    start, end = phrase_positives(torch.tensor(spans), torch.tensor(lengths), torch.tensor(seq), torch.tensor(ids),
                                  torch.tensor(valid))
    for i, n in enumerate(lengths):
        assert torch.equal(start[i], end[i]) == (n == 1 or not start[i].any())


# paper-map §9 item 14 -----------------------------------------------------------------------------------


def test_span_masked_in_every_query_row_still_has_a_positive_in_the_unmasked_targets():
    seqs = [np.array([1, 7, 8, 30, 2]), np.array([1, 31, 7, 8, 2])]
    spans = np.array([[0, 1, 2], [1, 2, 2]])  # the phrase's only two occurrences are both masked
    batch = collate_phrase(seqs, spans, MASK)
    assert not any((batch["query_ids"][b, p : p + 2] == torch.tensor([7, 8])).all() for b in range(2) for p in range(5))
    start, end = phrase_positives(batch["span_tokens"], batch["span_lengths"], batch["span_seq"], batch["target_ids"],
                                  batch["target_valid"])
    L = batch["target_ids"].shape[1]
    assert as_set(start, L) == {(0, 1, 2), (1, 0, 1)} and as_set(end, L) == {(0, 1, 3), (1, 0, 2)}
    torch.manual_seed(0)
    targets = torch.randn(2, L, 8)
    loss, stats = phrase_loss(torch.randn(2, 8), torch.randn(2, 8), targets, batch["target_valid"], start, end,
                              batch["span_seq"])
    assert math.isfinite(float(loss)) and stats["positives_per_span"] == 1.0 and stats["queries"] == 2


def test_span_without_positive_is_a_clear_error_naming_the_span():
    seqs = [np.array([1, 7, 8, 30, 2]), np.array([1, 31, 7, 8, 2])]
    batch = collate_phrase(seqs, np.array([[0, 1, 2], [0, 3, 1]]), MASK)  # token 30 occurs only in sequence 0
    start, end = phrase_positives(batch["span_tokens"], batch["span_lengths"], batch["span_seq"], batch["target_ids"],
                                  batch["target_valid"])
    L = batch["target_ids"].shape[1]
    with pytest.raises(ValueError, match=r"1 of 2 masked spans have no positive.*span 1 tokens \[30\]"):
        phrase_loss(torch.randn(2, 8), torch.randn(2, 8), torch.randn(2, L, 8), batch["target_valid"], start, end,
                    batch["span_seq"], span_tokens=batch["span_tokens"])


# paper-map §9 item 15 -----------------------------------------------------------------------------------


def phrase_case(seed: int = 0, h: int = 16):
    ids, valid, spans, lengths, seq = random_pool(seed)
    spans_t, lengths_t, seq_t = torch.tensor(spans), torch.tensor(lengths), torch.tensor(seq)
    start, end = phrase_positives(spans_t, lengths_t, seq_t, torch.tensor(ids), torch.tensor(valid))
    keep = start.any(1) & end.any(1)
    g = torch.Generator().manual_seed(seed)
    n = int(keep.sum())
    targets = torch.randn(*ids.shape, h, generator=g)
    return dict(q_start=torch.randn(n, h, generator=g), q_end=torch.randn(n, h, generator=g), pool_vectors=targets,
                pool_valid=torch.tensor(valid), start_pos=start[keep], end_pos=end[keep], seq=seq_t[keep]), ids


def test_padding_is_never_a_positive_nor_a_negative():
    case, ids = phrase_case(1)
    loss, _ = phrase_loss(**case)
    padding = ~case["pool_valid"]
    assert padding.any()
    huge = case["pool_vectors"].clone()
    huge[padding] = 1e4 * case["q_start"][0]  # would dominate every softmax if it were scored
    loss_huge, _ = phrase_loss(**{**case, "pool_vectors": huge})
    torch.testing.assert_close(loss_huge, loss)
    flat_padding = padding.reshape(-1)
    assert not (case["start_pos"][:, flat_padding].any() or case["end_pos"][:, flat_padding].any())


def test_special_token_targets_are_valid_negatives():
    # pool row 1 = <s> 7 </s>: the span [7]'s only positive, and two special-token targets
    ids = torch.tensor([[0, 7, 9, 2], [0, 7, 2, 1]])
    valid = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]).bool()
    seq = torch.tensor([0])
    start, end = phrase_positives(torch.tensor([[7]]), torch.tensor([1]), seq, ids, valid)
    h = 4
    q = torch.tensor([[2.0, 0.0, 0.0, 0.0]])
    vectors = torch.zeros(2, 4, h)
    vectors[1, 0, 0] = 3.0  # <s> scores 6/2 = 3
    vectors[1, 1, 0] = 1.0  # positive scores 2/2 = 1
    vectors[1, 2, 0] = -1.0  # </s> scores -1
    loss, _ = phrase_loss(q, q, vectors, valid, start, end, seq)
    side = math.log(math.exp(3) + math.exp(1) + math.exp(-1)) - 1
    assert float(loss) == pytest.approx(2 * side, rel=1e-6)


# paper-map §9 item 16 -----------------------------------------------------------------------------------


def test_two_positives_and_one_negative_of_equal_score_give_log3_minus_log2_per_side():
    ids = torch.tensor([[7, 7, 7], [7, 5, 7]])  # own row 0 contains the span too; it is excluded
    valid = torch.ones(2, 3, dtype=torch.bool)
    seq = torch.tensor([0])
    start, end = phrase_positives(torch.tensor([[7]]), torch.tensor([1]), seq, ids, valid)
    h = 8
    q = torch.ones(1, h)
    vectors = torch.ones(2, 3, h) * 0.5
    vectors[0] = 100.0  # the own sequence would dominate if it were scored
    loss, stats = phrase_loss(q, q, vectors, valid, start, end, seq)
    assert stats["loss_start"] == pytest.approx(math.log(3) - math.log(2), rel=1e-6)
    assert stats["loss_end"] == pytest.approx(math.log(3) - math.log(2), rel=1e-6)
    assert float(loss) == pytest.approx(2 * (math.log(3) - math.log(2)), rel=1e-6)
    assert stats["positives_per_span"] == 2 and stats["start_end_same"] == 1.0


@pytest.mark.parametrize("seed", range(3))
def test_loss_equals_the_per_span_formula_on_random_vectors(seed):
    case, _ = phrase_case(seed)
    loss, stats = phrase_loss(**case)
    S, Lp, h = case["pool_vectors"].shape
    keys = case["pool_vectors"].reshape(S * Lp, h)
    mask = case["pool_valid"].reshape(1, -1).repeat(len(case["seq"]), 1)
    for i, s in enumerate(case["seq"].tolist()):
        mask[i, s * Lp : (s + 1) * Lp] = False
    per_start = loss_by_formula(case["q_start"], keys, mask, case["start_pos"])
    per_end = loss_by_formula(case["q_end"], keys, mask, case["end_pos"])
    assert stats["loss_start"] == pytest.approx(np.mean(per_start), rel=1e-5)
    assert stats["loss_end"] == pytest.approx(np.mean(per_end), rel=1e-5)
    assert float(loss) == pytest.approx(np.mean(per_start) + np.mean(per_end), rel=1e-5)
    assert stats["queries"] == len(case["seq"])


def test_similarity_is_the_dot_product_over_sqrt_hidden_size():
    h = 16  # sqrt(h) = 4
    ids = torch.tensor([[3, 3], [5, 6]])
    valid = torch.ones(2, 2, dtype=torch.bool)
    seq = torch.tensor([0])
    start, end = phrase_positives(torch.tensor([[5]]), torch.tensor([1]), seq, ids, valid)
    q = torch.zeros(1, h)
    q[0, 0] = 1.0
    vectors = torch.zeros(2, 2, h)
    vectors[1, 0, 0] = 8.0  # positive: dot 8 -> sim 2; negative: dot 0 -> sim 0
    _, stats = phrase_loss(q, q, vectors, valid, start, end, seq)
    assert stats["loss_start"] == pytest.approx(math.log(1 + math.exp(-2)), rel=1e-6)


def test_loss_is_computed_in_fp32_under_bf16_autocast():
    case, _ = phrase_case(2)
    bf16 = {k: v.bfloat16() if v.is_floating_point() else v for k, v in case.items()}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = phrase_loss(**bf16)
    want, _ = phrase_loss(**{k: v.float() if v.is_floating_point() else v for k, v in bf16.items()})
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, want)


def test_gradient_flows_to_queries_and_targets():
    case, _ = phrase_case(0)
    leaves = {k: case[k].clone().requires_grad_() for k in ("q_start", "q_end", "pool_vectors")}
    loss, _ = phrase_loss(**{**case, **leaves})
    loss.backward()
    for k, v in leaves.items():
        assert torch.isfinite(v.grad).all() and v.grad.abs().sum() > 0, k
    padding = ~case["pool_valid"]
    assert not leaves["pool_vectors"].grad[padding].any()


# paper-map §9 item 17 -----------------------------------------------------------------------------------


def test_single_positives_are_the_same_token_in_other_sequences():
    ids = torch.tensor([[1, 5, 6, 5], [1, 5, 7, 0], [6, 6, 5, 5]])
    valid = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 0]]).bool()
    pos = single_positives(torch.tensor([5, 6, 0]), torch.tensor([0, 0, 1]), ids, valid)
    assert as_set(pos[:1], 4) == {(0, 1, 1), (0, 2, 2)}  # not row 0 (own), not the padding at (2, 3)
    assert as_set(pos[1:2], 4) == {(0, 2, 0), (0, 2, 1)}
    assert not pos[2].any()  # id 0 only occurs as padding


def test_single_tokens_without_a_positive_are_dropped_from_the_mean():
    ids = torch.tensor([[1, 5, 6, 9], [1, 5, 7, 6]])
    valid = torch.ones(2, 4, dtype=torch.bool)
    tokens, seq = torch.tensor([5, 9, 6]), torch.tensor([0, 0, 1])  # 9 has no other occurrence
    pos = single_positives(tokens, seq, ids, valid)
    g = torch.Generator().manual_seed(0)
    q, vectors = torch.randn(3, 8, generator=g), torch.randn(2, 4, 8, generator=g)
    loss, stats = single_loss(q, vectors, valid, pos, seq)
    mask = torch.ones(3, 8, dtype=torch.bool)
    mask[[0, 1], :4] = False
    mask[2, 4:] = False
    per = loss_by_formula(q[[0, 2]], vectors.reshape(8, 8), mask[[0, 2]], pos[[0, 2]])
    assert float(loss) == pytest.approx(np.mean(per), rel=1e-5)
    assert stats["queries"] == 2 and stats["label_ratio"] == pytest.approx(2 / 3)
    assert stats["positives_per_span"] == 1.0


def test_single_without_any_positive_is_an_error():
    ids = torch.tensor([[1, 5], [1, 6]])
    valid = torch.ones(2, 2, dtype=torch.bool)
    pos = single_positives(torch.tensor([5]), torch.tensor([0]), ids, valid)
    with pytest.raises(ValueError, match="none of the 1 masked tokens has a positive"):
        single_loss(torch.randn(1, 4), torch.randn(2, 2, 4), valid, pos, torch.tensor([0]))
