"""Collate (paper-map §2.3, §9 item 12)."""

import numpy as np
import pytest

from npm.training.collate import collate_phrase, collate_single

MASK = 99


def test_each_span_becomes_two_mask_tokens_and_labels_are_in_sequence_start_order():
    seqs = [np.array([1, 10, 11, 12, 13, 2]), np.array([1, 20, 21, 22, 2])]
    spans = np.array([[0, 1, 2], [0, 4, 1], [1, 2, 2]])
    batch = collate_phrase(seqs, spans, MASK)
    q = batch["query_ids"]
    # paper-map §9 item 12: masked length = L - sum|span| + 2 * #spans
    assert batch["query_attention"][0].sum() == 6 - 3 + 4
    assert batch["query_attention"][1].sum() == 5 - 2 + 2
    assert q[0, :7].tolist() == [1, MASK, MASK, 12, MASK, MASK, 2]
    assert q[1, :5].tolist() == [1, 20, MASK, MASK, 2]
    assert batch["span_tokens"].tolist() == [[10, 11], [13, -1], [21, 22]]
    assert batch["q_start_pos"].tolist() == [1, 4, 2]
    assert batch["q_end_pos"].tolist() == [2, 5, 3]
    assert (q[batch["span_seq"], batch["q_start_pos"]] == MASK).all()
    assert (q[batch["span_seq"], batch["q_end_pos"]] == MASK).all()
    assert int((q == MASK).sum()) == 2 * len(spans)


def test_rows_are_padded_with_id_zero_and_attention_zero():
    seqs = [np.array([1, 5, 6, 2]), np.array([1, 7, 2])]
    batch = collate_phrase(seqs, np.array([[0, 1, 1]]), MASK, pad_to=8)
    assert batch["target_ids"].shape == (2, 8)
    assert batch["target_ids"][1, 3:].tolist() == [0] * 5
    assert not batch["target_valid"][1, 3:].any()
    assert batch["query_ids"].shape == (2, 8)


def test_row_longer_than_fixed_padding_is_an_error():
    with pytest.raises(ValueError, match="does not fit"):
        collate_phrase([np.arange(1, 10)], np.array([[0, 1, 1]]), MASK, pad_to=5)


def test_batch_without_masks_is_an_error():
    with pytest.raises(ValueError, match="no masked span"):
        collate_phrase([np.arange(1, 10)], np.zeros((0, 3), dtype=int), MASK)


def test_single_masks_every_token_of_a_span_in_place():
    seqs = [np.array([1, 10, 11, 12, 2]), np.array([1, 20, 2])]
    batch = collate_single(seqs, np.array([[0, 1, 2], [1, 1, 1]]), MASK)
    assert batch["query_ids"][0, :5].tolist() == [1, MASK, MASK, 12, 2]
    assert batch["query_ids"][1, :3].tolist() == [1, MASK, 2]
    assert batch["query_seq"].tolist() == [0, 0, 1]
    assert batch["query_pos"].tolist() == [1, 2, 1]
    assert batch["query_tokens"].tolist() == [10, 11, 20]
    assert batch["target_ids"][0, 1] == 10  # the target view is unmasked
