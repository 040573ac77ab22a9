"""Inference on hand-checkable inputs (paper-map §3.6-§3.7, §4.1; §9 items 19, 22-23, 25-27)."""

import itertools
import math

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertModel

from npm.inference.closed_set import label_scores
from npm.inference.phrase import aggregate_spans, score_spans, walk_spans
from npm.inference.query import encode_queries, query_ids
from npm.model import encode
from npm.tasks.templates import closed_set_input


def test_item19_one_mask_becomes_two_adjacent_masks(wordpiece_tokenizer, bpe_tokenizer):
    for tok in (wordpiece_tokenizer, bpe_tokenizer):
        ids, pos = query_ids(tok, "Thessaloniki is the second largest city in <mask>.")
        assert ids[pos] == ids[pos + 1] == tok.mask_token_id
        assert (ids == tok.mask_token_id).sum() == 2
        assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
        single, pos1 = query_ids(tok, "Thessaloniki is the second largest city in <mask>.", n_masks=1)
        assert (single == tok.mask_token_id).sum() == 1 and pos1 == pos
    ids, pos = query_ids(wordpiece_tokenizer, "Written with the tokenizer's own [MASK] token.")
    assert ids[pos] == ids[pos + 1] == wordpiece_tokenizer.mask_token_id


def test_item19_q_start_and_q_end_are_the_final_layer_at_the_two_masks(wordpiece_tokenizer):
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=wordpiece_tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=64), add_pooling_layer=False).eval()
    texts = ["Paris is the capital of <mask>.", "A much longer query about <mask> and other things here."]
    q = encode_queries(model, wordpiece_tokenizer, texts, n_masks=2, batch_size=2)
    assert q.shape == (2, 2, 32)
    for i, text in enumerate(texts):
        ids, pos = query_ids(wordpiece_tokenizer, text)
        with torch.no_grad():
            hidden = encode(model, torch.from_numpy(ids)[None], torch.ones(1, len(ids), dtype=torch.long))[0]
        np.testing.assert_allclose(q[i, 0], hidden[pos].numpy(), atol=1e-5)
        np.testing.assert_allclose(q[i, 1], hidden[pos + 1].numpy(), atol=1e-5)


@pytest.mark.parametrize("text, message", [("", "empty query"), ("   ", "empty query"),
                                           ("No mask here.", "no mask"), ("<mask> and <mask>.", "2 masks")])
def test_bad_queries_are_clear_errors(wordpiece_tokenizer, text, message):
    with pytest.raises(ValueError, match=message):
        query_ids(wordpiece_tokenizer, text)


def test_item27_template_without_mask_gets_mask_dot_appended_with_no_space():
    assert closed_set_input("The movie was great. It was") == "The movie was great. It was<mask>."
    assert closed_set_input("A <mask> here.") == "A <mask> here."


def test_item27_long_inputs_keep_their_last_tokens_and_the_mask(wordpiece_tokenizer):
    """As the original: the input is cut to its last 256 tokens, then NPM's second mask goes in (257 tokens). Before:
    the mask went in first, so NPM's query lost one more leading token than NPM-single's."""
    text = "word " * 400 + "the end is <mask>."
    single, pos1 = query_ids(wordpiece_tokenizer, text, n_masks=1, max_length=256)
    ids, pos = query_ids(wordpiece_tokenizer, text, max_length=256)
    assert len(single) == 256 and len(ids) == 257 and pos == pos1
    assert ids[pos] == ids[pos + 1] == wordpiece_tokenizer.mask_token_id
    np.testing.assert_array_equal(np.delete(ids, pos + 1), single)
    full = wordpiece_tokenizer(text.replace("<mask>", wordpiece_tokenizer.mask_token))["input_ids"]
    np.testing.assert_array_equal(single, full[-256:])
    assert ids[-1] == wordpiece_tokenizer.sep_token_id and ids[0] != wordpiece_tokenizer.cls_token_id
    with pytest.raises(ValueError, match="would drop the mask"):
        query_ids(wordpiece_tokenizer, "<mask> " + "word " * 400, max_length=256)


def brute_force_spans(start_cand, end_cand, block, vs, ve, blocked, l_max, walk="paper"):
    """Every span a walk forward from a start candidate or back from an end candidate reaches; ``walk="code"``: the
    original's _get_token_position, whose walk back covers range(e - 1, max(first, e - l_max + 1), -1)."""
    out = set()
    for s, e in itertools.product(range(len(block)), repeat=2):
        if not (0 <= e - s < l_max) or block[s] != block[e] or blocked[s:e + 1].any() or not vs[s] or not ve[e]:
            continue
        first = int(np.flatnonzero(block == block[e])[0])
        back = s == e or (s > max(first, e - l_max + 1)) if walk == "code" else True
        if s in start_cand or (e in end_cand and back):
            out.add((s, e))
    return sorted(out)


@pytest.mark.parametrize("seed", range(5))
def test_item22_span_candidates_match_a_brute_force_walk(seed):
    rng = np.random.default_rng(seed)
    n = 80
    block = np.repeat(np.arange(4), 20)
    vs, ve = rng.random(n) < 0.6, rng.random(n) < 0.6
    blocked = rng.random(n) < 0.1
    blocked[::20] = True  # each block begins with its begin token
    start_cand = rng.choice(n, 15, replace=False)
    end_cand = rng.choice(n, 15, replace=False)
    blocked[20] = False  # a block whose first position is a token (a unit cut mid-way)
    for l_max, walk in itertools.product((1, 2, 3, 10), ("paper", "code")):
        s, e = walk_spans(start_cand, end_cand, block, vs, ve, blocked, l_max, walk)
        assert list(zip(s.tolist(), e.tolist(), strict=True)) == brute_force_spans(
            set(start_cand.tolist()), set(end_cand.tolist()), block, vs, ve, blocked, l_max, walk), (l_max, walk)


def test_item22_the_code_s_walk_back_is_one_token_shorter_and_stops_before_the_block_s_first_position():
    block = np.zeros(6, int)
    valid = np.ones(6, bool)
    none = np.zeros(6, bool)
    def spans(walk, l_max):
        s, e = walk_spans(np.array([], int), np.array([5]), block, valid, valid, none, l_max, walk)
        return set(zip(s.tolist(), e.tolist(), strict=True))

    assert spans("paper", 3) == {(3, 5), (4, 5), (5, 5)}
    assert spans("code", 3) == {(4, 5), (5, 5)}  # range(4, max(0, 3), -1): position 4 only
    assert spans("paper", 10) == {(s, 5) for s in range(6)}
    assert spans("code", 10) == {(s, 5) for s in range(1, 6)}  # range(4, max(0, -4), -1) stops at 1


def test_item22_a_stop_word_inside_blocks_the_span():
    # "United States of America": " of" is a stop word, so only spans without it survive
    block = np.zeros(6, int)
    special = np.array([1, 0, 0, 0, 0, 1], bool)  # <s> United States of America </s>
    stop = np.array([0, 0, 0, 1, 0, 0], bool)
    valid = ~special
    s, e = walk_spans(np.arange(6), np.arange(6), block, valid, valid, special | stop, 10)
    spans = set(zip(s.tolist(), e.tolist(), strict=True))
    assert (1, 4) not in spans and (1, 2) in spans and (4, 4) in spans and (3, 3) not in spans
    s, e = walk_spans(np.arange(6), np.arange(6), block, valid, valid, special, 10)
    assert (1, 4) in set(zip(s.tolist(), e.tolist(), strict=True))  # without the exclusion it is a candidate


def test_item23_code_form_is_p_start_plus_p_end():
    start_pos, start_sim = np.array([1, 4, 7]), np.array([2.0, 1.0, 0.0])
    end_pos, end_sim = np.array([2, 5, 8]), np.array([0.5, 1.5, 0.0])
    w = score_spans(np.array([1, 4]), np.array([2, 5]), start_pos, start_sim, end_pos, end_sim, open_set_tau=1.0,
                    form="code")
    ps = np.exp(start_sim) / np.exp(start_sim).sum()
    pe = np.exp(end_sim) / np.exp(end_sim).sum()
    np.testing.assert_allclose(w, [ps[0] + pe[0], ps[1] + pe[1]])
    paper = score_spans(np.array([1, 4]), np.array([2, 5]), start_pos, start_sim, end_pos, end_sim, open_set_tau=1.0,
                        form="paper")
    raw = np.array([math.exp(2.0) + math.exp(0.5), math.exp(1.0) + math.exp(1.5)])
    np.testing.assert_allclose(paper, raw / raw.sum())
    with pytest.raises(ValueError, match="span start has no score"):
        score_spans(np.array([3]), np.array([2]), start_pos, start_sim, end_pos, end_sim, open_set_tau=1.0)


@pytest.mark.parametrize("form", ["code", "paper"])
def test_item23_two_occurrences_beat_one_slightly_better_occurrence(form):
    # tokens: [a b] at 0-1, [c d] at 2-3, [a b] at 4-5
    ids = np.array([10, 11, 20, 21, 10, 11])
    starts, ends = np.array([0, 2, 4]), np.array([1, 3, 5])
    sims = np.array([1.0, 1.2, 1.0])  # "c d" alone scores a little higher than each "a b"
    w = score_spans(starts, ends, starts, sims, ends, sims, open_set_tau=1.0, form=form)
    assert w[1] > w[0]
    order, group, scores = aggregate_spans(ids, starts, ends, w)
    best = order[0]
    assert group[0] == group[2] == best and math.isclose(scores[best], w[0] + w[2])


def test_alpha_rewards_longer_phrases():
    ids = np.array([1, 2, 3])
    w = np.array([0.5, 0.4])
    order, _, _ = aggregate_spans(ids, np.array([0, 0]), np.array([0, 2]), w, alpha=0.0)
    assert order[0] == 0
    order, group, scores = aggregate_spans(ids, np.array([0, 0]), np.array([0, 2]), w, alpha=1.0)
    assert group[order[0]] == group[1] and math.isclose(scores.max(), 0.4 * 3)


def test_item25_single_softmax_over_neighbours_votes_for_their_tokens():
    neighbour_ids = np.array([7, 8, 7, 9])
    sims = np.array([10.0, 5.0, 5.0, 0.0])  # already q.e / sqrt(h)
    scores = label_scores(neighbour_ids, sims, [np.array([7]), np.array([8, 9])], tau=5.0)
    p = np.exp(sims / 5.0) / np.exp(sims / 5.0).sum()
    np.testing.assert_allclose(scores, [p[0] + p[2], p[1] + p[3]])
    assert math.isclose(scores.sum(), 1.0)


def test_item25_a_word_listed_twice_in_a_verbalizer_counts_twice_as_the_original():
    """The original scores a label as prob[ids].sum() over its verbalizer's token ids (npm_single.py), so an id
    listed twice counts twice; before, a membership test counted it once."""
    neighbour_ids = np.array([7, 8, 7, 9])
    sims = np.array([10.0, 5.0, 5.0, 0.0])
    p = np.exp(sims / 5.0) / np.exp(sims / 5.0).sum()
    scores = label_scores(neighbour_ids, sims, [np.array([7, 7]), np.array([8, 9, 3])], tau=5.0)
    np.testing.assert_allclose(scores, [2 * (p[0] + p[2]), p[1] + p[3]])


def test_item26_npm_divides_by_tau_once_by_default_and_twice_as_the_original():
    ids = np.array([7, 8, 7, 8])  # start neighbours then end neighbours
    sims = np.array([20.0, 10.0, 15.0, 12.0])
    once = label_scores(ids, sims, [np.array([7]), np.array([8])], tau=5.0)
    twice = label_scores(ids, sims, [np.array([7]), np.array([8])], tau=5.0, tau_twice=True)
    p1 = np.exp(sims / 5) / np.exp(sims / 5).sum()
    p2 = np.exp(sims / 25) / np.exp(sims / 25).sum()
    np.testing.assert_allclose(once, [p1[[0, 2]].sum(), p1[[1, 3]].sum()])
    np.testing.assert_allclose(twice, [p2[[0, 2]].sum(), p2[[1, 3]].sum()])
    assert twice[0] < once[0]  # a flatter distribution
