"""Span masking (NPM) and uniform masking (NPM-single) (paper-map §2.2, §2.3; §9 items 5-11, 17)."""

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npm.boundaries import (
    PUNCT_END,
    PUNCT_PIECE,
    PUNCT_START,
    PUNCT_TOKEN,
    SPACE_BEFORE,
    SPECIAL,
    encode_units,
    is_subword,
)
from npm.data.batches import make_batches
from npm.data.blocks import tokenize_documents
from npm.io import load_npz, save_npz
from npm.masking import mask_line, mask_shard, sample_spans, span_candidates, take_spans, uniform_mask_line
from npm.settings import MaskingSettings
from tests.conftest import lee_corpus_lines

S = SPECIAL | PUNCT_START | PUNCT_END  # flags of <s>, </s>, [CLS], [SEP]
W = SPACE_BEFORE  # a word-initial token
SUB = 0  # a continuation piece
DOT = PUNCT_START | PUNCT_END | PUNCT_TOKEN | PUNCT_PIECE  # "."
BOS, EOS, DOT_ID = 0, 2, 4
SPLIT_WORDS = ["photosynthesis", "kilimanjaro", "xylophonist", "neuroscientists", "unbelievably"]


def rng(seed=0):
    return np.random.default_rng(seed)


def words_line(*rows):
    """Hand-made sequences <s> w w ... </s> of word-initial tokens, with their flags."""
    seqs = [np.array([BOS, *r, EOS]) for r in rows]
    flags = [np.array([S] + [W] * len(r) + [S], dtype=np.uint8) for r in rows]
    return seqs, flags


def encode_line(tok, texts):
    """One sequence per text, each encoded as one unit with the tokenizer's own special tokens."""
    seqs, flags = [], []
    for text in texts:
        ids, f, _ = encode_units(tok, [text])
        seqs.append(ids.astype(np.int64))
        flags.append(f)
    return seqs, flags


def piece_ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def find(seq, pattern):
    """Start positions of ``pattern`` in ``seq``."""
    n = len(pattern)
    return [j for j in range(len(seq) - n + 1) if list(seq[j:j + n]) == list(pattern)]


def occurs_elsewhere(seqs, flags, b, window):
    return any(find(s, window) and any(not (f[j:j + len(window)] & SPECIAL).any() for j in find(s, window))
               for c, (s, f) in enumerate(zip(seqs, flags, strict=True)) if c != b)


@pytest.fixture(params=["bpe_tokenizer", "wordpiece_tokenizer"])
def tok(request):
    return request.getfixturevalue(request.param)


# ------------------------------------------------------------------------------------------------------------------
# A literal, loop-per-token transcription of paper-map §2.2, with the same random draws as the vectorised code.


def reference_candidates(seqs, flags, gen, max_span_length=10, punct_keep_prob=0.1):
    out = []
    for b, (ids, f) in enumerate(zip(seqs, flags, strict=True)):
        special, sub, punct = (f & SPECIAL) != 0, is_subword(f), (f & PUNCT_TOKEN) != 0
        for j in range(len(ids)):
            if special[j] or (sub[j] and (j == 0 or not special[j - 1])):  # "unless it directly follows <s>"
                continue
            if punct[j] and gen.random() >= punct_keep_prob:
                continue
            for length in range(1, max_span_length + 1):
                if j + length > len(ids) or special[j:j + length].any():
                    break
                if length >= 2 and punct[j]:
                    break
                if j + length < len(ids) and sub[j + length]:
                    continue
                if not occurs_elsewhere(seqs, flags, b, list(ids[j:j + length])):
                    break
                out.append((b, j, length))
    return out


def reference_mask_line(seqs, flags, gen, ratio=0.15, p=0.5, max_span_length=10, max_spans_per_sequence=128,
                        max_ngram_repeats=10, min_masked_ratio=0.05, punct_keep_prob=0.1):
    cands = reference_candidates(seqs, flags, gen, max_span_length, punct_keep_prob)
    groups = {}
    for n in range(1, max_span_length + 1):
        group = [c for c in cands if c[2] == n]
        groups[n] = [group[k] for k in gen.permutation(len(group))]
    n_tokens = sum(len(s) for s in seqs)
    budget = int(ratio * n_tokens)
    draws = gen.geometric(p, size=budget) if budget > 0 else []
    masked = [np.zeros(len(s), dtype=bool) for s in seqs]
    per_seq, per_ngram, spans, total = Counter(), Counter(), [], 0
    for n in draws:
        if n > max_span_length:
            continue
        done = False
        while True:
            while n > 0 and not groups[n]:
                n -= 1
            if n == 0:
                done = True
                break
            b, j, length = groups[n].pop()
            gram = tuple(seqs[b][j:j + length])
            if per_seq[b] >= max_spans_per_sequence or masked[b][j:j + length].any() or \
                    per_ngram[gram] >= max_ngram_repeats:
                continue
            masked[b][j:j + length] = True
            per_seq[b] += 1
            per_ngram[gram] += 1
            spans.append((b, j, length))
            total += length
            break
        if done or total >= budget:
            break
    if total == 0 or total < min_masked_ratio * n_tokens:
        return None
    return sorted(spans)


# ------------------------------------------------------------------------------------------------------------------
# Item 5: co-occurrence in a different sequence of the line.


def test_item5_phrase_repeated_only_within_one_sequence_is_never_a_candidate(tok):
    texts = [" the government minister spoke and the government minister left", " cricket fans cheered loudly"]
    seqs, flags = encode_line(tok, texts)
    phrase = piece_ids(tok, " government minister")
    hits = find(seqs[0], phrase)
    assert len(hits) == 2
    covered = {j + k for j in hits for k in range(len(phrase))}
    for b, j, length in span_candidates(seqs, flags, rng(), punct_keep_prob=1.0).tolist():
        assert b != 0 or not covered & set(range(j, j + length))
    for seed in range(5):
        spans = mask_line(seqs, flags, rng(seed), ratio=0.5, min_masked_ratio=0.0)
        for b, j, length in (spans if spans is not None else np.zeros((0, 3), int)).tolist():
            assert b != 0 or not covered & set(range(j, j + length))


def test_item5_same_phrase_in_two_sequences_is_a_candidate_in_both(tok):
    texts = [" the government minister spoke and the government minister left", " cricket fans met the government "
             "minister today"]
    seqs, flags = encode_line(tok, texts)
    phrase = piece_ids(tok, " government minister")
    cands = {tuple(c) for c in span_candidates(seqs, flags, rng(), punct_keep_prob=1.0).tolist()}
    for b in (0, 1):
        for j in find(seqs[b], phrase):
            assert (b, j, len(phrase)) in cands


# ------------------------------------------------------------------------------------------------------------------
# Item 6: no special token, no start on a continuation piece, no end before a continuation piece or </s>.


def split_word(tok):
    for word in SPLIT_WORDS:
        if len(piece_ids(tok, " " + word)) >= 2:
            return word
    pytest.fail("no test word splits into pieces")


def test_item6_first_piece_alone_is_not_a_candidate_but_the_whole_word_is(tok):
    word = split_word(tok)
    pieces = piece_ids(tok, " " + word)
    seqs, flags = encode_line(tok, [f" we saw {word} today", f" they love {word} too"])
    cands = {tuple(c) for c in span_candidates(seqs, flags, rng()).tolist()}
    for b in (0, 1):
        (j,) = find(seqs[b], pieces)
        assert (b, j, len(pieces)) in cands  # the whole word co-occurs and ends before a word-initial token
        for length in range(1, len(pieces)):
            assert (b, j, length) not in cands  # would end mid-word
        assert not any(c[0] == b and j < c[1] < j + len(pieces) for c in cands)  # never starts on a piece


def test_item6_no_candidate_contains_a_special_token_or_ends_before_the_end_token(tok):
    word = split_word(tok)
    seqs, flags = encode_line(tok, [f" they saw {word}", f" we saw {word}", f" we saw {word}"])
    cands = span_candidates(seqs, flags, rng())
    assert len(cands)
    for b, j, length in cands.tolist():
        assert not (flags[b][j:j + length] & SPECIAL).any()
        assert j + length < len(seqs[b]) and not is_subword(flags[b][j + length:j + length + 1])[0]
    # the last word co-occurs but is followed by </s> ([SEP]): never a candidate, alone or as part of a phrase
    assert not any(j + length == len(seqs[b]) - 1 for b, j, length in cands.tolist())
    saw = piece_ids(tok, " saw")
    assert {(b, find(seqs[b], saw)[0], len(saw)) for b in range(3)} <= {tuple(c) for c in cands.tolist()}


def test_item6_first_token_of_a_unit_may_start_a_span(tok):
    seqs, flags = encode_line(tok, ["Government officials met", "Government officials left"])
    starts = {(b, j) for b, j, _ in span_candidates(seqs, flags, rng()).tolist()}
    assert {(0, 1), (1, 1)} <= starts  # position 1 directly follows <s> / [CLS]


def test_item6_special_token_flags_never_start_or_join_a_span():
    seqs = [np.array([BOS, 5, EOS, BOS, 6, EOS]), np.array([BOS, 5, EOS, BOS, 6, EOS])]
    flags = [np.array([S, W, S, S, W, S], dtype=np.uint8)] * 2
    cands = span_candidates(seqs, flags, rng())
    # "5" and "6" are followed by </s> (a subword by the original's definition); nothing else may start
    assert cands.tolist() == []


# ------------------------------------------------------------------------------------------------------------------
# Item 7: punctuation starts unigrams only, kept with probability 0.1.


def test_item7_about_ten_percent_of_dots_are_candidates_and_never_start_longer_spans():
    row = [v for k in range(20) for v in (10 + k, DOT_ID)]
    seqs = [np.array([BOS, *row, EOS])] * 2
    f = np.array([S] + [W, DOT] * 20 + [S], dtype=np.uint8)
    flags = [f, f]
    dots = [(b, j) for b in range(2) for j in range(len(seqs[b])) if seqs[b][j] == DOT_ID]
    kept, trials = 0, 0
    for seed in range(60):
        cands = span_candidates(seqs, flags, rng(seed), punct_keep_prob=0.1)
        dot_cands = [(b, j, n) for b, j, n in cands.tolist() if seqs[b][j] == DOT_ID]
        assert all(n == 1 for _, _, n in dot_cands)
        kept += len(dot_cands)
        trials += len(dots)
    assert trials >= 2000
    assert 0.07 < kept / trials < 0.13


def test_item7_punctuation_is_a_unigram_candidate_only_with_real_tokens(tok):
    seqs, flags = encode_line(tok, [" yes. no. yes. no. maybe", " yes. no. yes. no. maybe"])
    dot = piece_ids(tok, ".")[-1]
    cands = span_candidates(seqs, flags, rng(), punct_keep_prob=1.0).tolist()
    dot_cands = [(b, j, n) for b, j, n in cands if seqs[b][j] == dot]
    assert len(dot_cands) == sum(int((s == dot).sum()) for s in seqs)  # all kept with probability 1
    assert all(n == 1 for _, _, n in dot_cands)
    assert not [c for c in span_candidates(seqs, flags, rng(), punct_keep_prob=0.0).tolist() if seqs[c[0]][c[1]] == dot]


# ------------------------------------------------------------------------------------------------------------------
# Item 8: span length <= max; longer draws skipped; exhausted lengths fall back; stop when length 1 runs out.


def test_item8_candidates_are_at_most_max_span_length():
    seqs, flags = words_line(range(10, 50), range(10, 50))
    assert span_candidates(seqs, flags, rng())[:, 2].max() == 10
    assert span_candidates(seqs, flags, rng(), max_span_length=3)[:, 2].max() == 3
    spans = mask_line(seqs, flags, rng(), ratio=0.5, p=0.1, max_span_length=3)
    assert spans[:, 2].max() <= 3


def test_item8_draws_longer_than_the_maximum_are_skipped_not_clipped():
    groups = {n: [(100 * n, 0, n)] for n in range(1, 11)}
    accepted = take_spans(groups, [11, 12, 1], budget=50, n_tokens=2000)
    assert accepted == [(100, 0, 1)]
    assert groups[10] == [(1000, 0, 10)]


def test_item8_exhausted_length_falls_back_to_a_shorter_one():
    groups = {3: [], 2: [(5, 0, 7)], 1: [(0, 0, 8)]}
    assert take_spans(groups, [3], budget=50, n_tokens=20, max_span_length=3) == [(5, 0, 2)]


def test_item8_masking_stops_when_length_one_runs_out_even_if_longer_groups_remain():
    groups = {1: [(0, 0, 0)], 5: [(10, 1, 1)]}
    accepted = take_spans(groups, [1, 1, 5], budget=50, n_tokens=20, max_span_length=5)
    assert accepted == [(0, 0, 1)]
    assert groups[5] == [(10, 1, 1)]


# ------------------------------------------------------------------------------------------------------------------
# Item 9: budget = floor(ratio * tokens); stop right after reaching it.


def test_item9_budget_is_the_floor_of_ratio_times_tokens():
    cands = np.array([[k, 0, 1] for k in range(100)])
    accepted = sample_spans(cands, n_tokens=70, rng=rng(), ratio=0.15, p=1.0)  # p=1: every draw is 1
    assert len(accepted) == 10  # int(10.5)


def test_item9_overshoot_is_at_most_the_last_span_minus_one():
    seqs, flags = words_line(*[range(10, 60)] * 4)
    n_tokens = sum(len(s) for s in seqs)
    budget = int(0.15 * n_tokens)
    full = span_candidates(seqs, flags, rng(), punct_keep_prob=1.0)
    starts = np.concatenate([[0], np.cumsum([len(s) for s in seqs])[:-1]])
    flat = np.stack([starts[full[:, 0]] + full[:, 1], full[:, 0], full[:, 2]], axis=1)
    for seed in range(20):
        accepted = sample_spans(flat, n_tokens, rng(seed))
        total = int(accepted[:, 2].sum())
        assert budget <= total <= budget + accepted[-1, 2] - 1
        spans = mask_line(seqs, flags, rng(seed))
        assert budget <= spans[:, 2].sum() < budget + 10


# ------------------------------------------------------------------------------------------------------------------
# Item 10: spans per sequence capped; no overlaps; the same n-gram masked at most max_ngram_repeats times.


def test_item10_spans_per_sequence_are_capped():
    seqs, flags = words_line(*[range(10, 60)] * 4)
    for seed in range(5):
        spans = mask_line(seqs, flags, rng(seed), ratio=0.5, max_spans_per_sequence=2, min_masked_ratio=0.0)
        assert Counter(spans[:, 0].tolist()).most_common(1)[0][1] <= 2


def test_item10_spans_never_overlap():
    seqs, flags = words_line(*[range(10, 60)] * 4)
    for seed in range(10):
        spans = mask_line(seqs, flags, rng(seed), ratio=0.9)
        for b in range(4):
            mine = spans[spans[:, 0] == b]
            assert (mine[1:, 1] >= mine[:-1, 1] + mine[:-1, 2]).all()


def test_item10_the_same_ngram_is_masked_at_most_max_ngram_repeats_times():
    seqs, flags = words_line(*[[7] * 30] * 8)  # every n-gram of a length is the same
    for seed in range(5):
        spans = mask_line(seqs, flags, rng(seed), ratio=0.5, max_ngram_repeats=3, min_masked_ratio=0.0)
        grams = Counter(tuple(seqs[b][j:j + n]) for b, j, n in spans.tolist())
        assert max(grams.values()) <= 3
        assert len(grams) >= 2


# ------------------------------------------------------------------------------------------------------------------
# Item 11: a line with less than 5% of its tokens masked is dropped.


def test_item11_line_with_under_five_percent_masked_is_dropped():
    seqs, flags = words_line([5, *range(10, 60)], [5, *range(100, 150)])  # only "5" co-occurs: 2 of 104 tokens
    assert mask_line(seqs, flags, rng()) is None
    spans = mask_line(seqs, flags, rng(), min_masked_ratio=0.0)
    assert spans.tolist() == [[0, 1, 1], [1, 1, 1]]


def test_item11_line_without_candidates_is_dropped_even_with_no_minimum():
    seqs, flags = words_line(range(10, 20), range(20, 30))
    assert mask_line(seqs, flags, rng(), min_masked_ratio=0.0) is None


# ------------------------------------------------------------------------------------------------------------------
# Item 17: NPM-single uniform masking.


def test_item17_uniform_masks_only_non_special_tokens_that_cooccur():
    seqs, flags = words_line([5, 6, *range(10, 30)], [5, 6, *range(40, 60)])
    for seed in range(20):
        spans = uniform_mask_line(seqs, flags, rng(seed))
        assert (spans[:, 2] == 1).all()
        assert {tuple(s) for s in spans[:, :2].tolist()} <= {(0, 1), (0, 2), (1, 1), (1, 2)}
    # 4 eligible of 48 tokens: the probability 0.15 * 48 / 4 is capped at 1, so all four are masked
    assert uniform_mask_line(seqs, flags, rng()).tolist() == [[0, 1, 1], [0, 2, 1], [1, 1, 1], [1, 2, 1]]


def test_item17_uniform_masks_fifteen_percent_of_all_tokens_in_expectation():
    seqs, flags = words_line(range(10, 110), range(10, 110), range(200, 300))
    n_tokens = sum(len(s) for s in seqs)  # 306 tokens, 200 eligible: each masked with probability 0.2295
    counts = [len(uniform_mask_line(seqs, flags, rng(seed))) for seed in range(300)]
    assert abs(np.mean(counts) - 0.15 * n_tokens) < 1.5


def test_item17_uniform_line_without_eligible_tokens_is_dropped():
    seqs, flags = words_line(range(10, 20), range(20, 30))
    assert uniform_mask_line(seqs, flags, rng()) is None


# ------------------------------------------------------------------------------------------------------------------
# Property tests on random small lines, against the literal transcription of paper-map §2.2.

TOKEN = st.sampled_from([(0, S), (2, S), (3, W), (4, DOT), (5, W), (5, SUB), (6, W), (6, SUB), (7, W), (8, SUB)])


@st.composite
def lines(draw):
    n_seq = draw(st.integers(2, 4))
    seqs, flags = [], []
    for _ in range(n_seq):
        body = draw(st.lists(TOKEN, min_size=0, max_size=14))
        toks = [(0, S), *body, (2, S)]
        seqs.append(np.array([t for t, _ in toks], dtype=np.int64))
        flags.append(np.array([f for _, f in toks], dtype=np.uint8))
    return seqs, flags


PARAMS = st.fixed_dictionaries({
    "ratio": st.sampled_from([0.15, 0.5, 0.9]),
    "p": st.sampled_from([0.2, 0.5, 0.9]),
    "max_span_length": st.integers(1, 5),
    "max_spans_per_sequence": st.integers(1, 4),
    "max_ngram_repeats": st.integers(1, 3),
    "min_masked_ratio": st.sampled_from([0.0, 0.05]),
    "punct_keep_prob": st.sampled_from([0.0, 0.5, 1.0]),
})


@settings(max_examples=60, deadline=None)
@given(lines(), st.integers(0, 2**32 - 1), st.integers(1, 6), st.sampled_from([0.0, 0.3, 1.0]))
def test_property_candidates_match_the_literal_reference(line, seed, max_len, keep):
    seqs, flags = line
    got = span_candidates(seqs, flags, rng(seed), max_span_length=max_len, punct_keep_prob=keep)
    want = sorted(reference_candidates(seqs, flags, rng(seed), max_len, keep))
    assert got.tolist() == [list(c) for c in want]


@settings(max_examples=60, deadline=None)
@given(lines(), st.integers(0, 2**32 - 1), PARAMS)
def test_property_mask_line_matches_the_literal_reference(line, seed, params):
    seqs, flags = line
    got = mask_line(seqs, flags, rng(seed), **params)
    want = reference_mask_line(seqs, flags, rng(seed), **params)
    assert (got is None) == (want is None)
    if got is not None:
        assert got.tolist() == [list(s) for s in want]


@settings(max_examples=60, deadline=None)
@given(lines(), st.integers(0, 2**32 - 1), PARAMS)
def test_property_masked_spans_are_valid(line, seed, params):
    seqs, flags = line
    spans = mask_line(seqs, flags, rng(seed), **params)
    if spans is None:
        return
    assert spans.dtype == np.int64 and spans.shape[1] == 3 and len(spans)
    assert [tuple(s) for s in spans.tolist()] == sorted(tuple(s) for s in spans.tolist())
    assert (spans[:, 2] >= 1).all() and (spans[:, 2] <= params["max_span_length"]).all()
    assert max(Counter(spans[:, 0].tolist()).values()) <= params["max_spans_per_sequence"]
    grams = Counter()
    masked = [np.zeros(len(s), dtype=bool) for s in seqs]
    for b, j, n in spans.tolist():
        assert j + n <= len(seqs[b])
        assert not masked[b][j:j + n].any()
        masked[b][j:j + n] = True
        assert not (flags[b][j:j + n] & SPECIAL).any()
        assert not is_subword(flags[b][j:j + 1])[0] or (j > 0 and flags[b][j - 1] & SPECIAL)
        assert j + n == len(seqs[b]) or not is_subword(flags[b][j + n:j + n + 1])[0]
        window = list(seqs[b][j:j + n])
        assert occurs_elsewhere(seqs, flags, b, window)
        grams[tuple(window)] += 1
    assert max(grams.values()) <= params["max_ngram_repeats"]
    n_tokens = sum(len(s) for s in seqs)
    assert sum(spans[:, 2]) >= params["min_masked_ratio"] * n_tokens


@settings(max_examples=60, deadline=None)
@given(lines(), st.integers(0, 2**32 - 1), st.sampled_from([0.15, 0.5]))
def test_property_uniform_masks_cooccurring_non_special_tokens_only(line, seed, ratio):
    seqs, flags = line
    spans = uniform_mask_line(seqs, flags, rng(seed), ratio=ratio)
    if spans is None:
        return
    assert (spans[:, 2] == 1).all()
    assert [tuple(s) for s in spans.tolist()] == sorted({tuple(s) for s in spans.tolist()})
    for b, j, _ in spans.tolist():
        assert not flags[b][j] & SPECIAL
        assert occurs_elsewhere(seqs, flags, b, [seqs[b][j]])


# ------------------------------------------------------------------------------------------------------------------
# mask_shard: files in, masked batches file out (docs/data-contracts.md).


@pytest.fixture(scope="module")
def shard(tmp_path_factory, request):
    bpe = request.getfixturevalue("bpe_tokenizer")
    lines_ = lee_corpus_lines()
    docs = [{"id": f"doc{k}", "units": [" " + u for u in lines_[k:k + 10]]} for k in range(0, len(lines_), 10)]
    blocks = tokenize_documents(docs, bpe)
    tmp = tmp_path_factory.mktemp("shard")
    save_npz(tmp / "blocks.npz", **blocks)
    save_npz(tmp / "batches.npz", batches=make_batches(blocks["block_doc"], batch_size=8))
    return tmp, blocks


def ngram_sequences(seqs, flags, max_n):
    """Token n-gram (n <= max_n, no special token) -> the set of sequences of the line that contain it."""
    where = {}
    for b, (ids, f) in enumerate(zip(seqs, flags, strict=True)):
        ids, special = ids.tolist(), ((f & SPECIAL) != 0).tolist()
        for j in range(len(ids)):
            for n in range(1, max_n + 1):
                if j + n > len(ids) or special[j + n - 1]:
                    break
                where.setdefault(tuple(ids[j:j + n]), set()).add(b)
    return where


def check_masked_file(path, blocks, batches_in, mode):
    out = load_npz(path)
    assert set(out) == {"batches", "span_offsets", "spans"}
    batches, offsets, spans = out["batches"], out["span_offsets"], out["spans"]
    assert batches.dtype == np.int64 and offsets.dtype == np.int64 and spans.dtype == np.int32
    assert batches.ndim == 2 and batches.shape[1] == batches_in.shape[1]
    assert spans.ndim == 2 and spans.shape[1] == 3
    assert len(offsets) == len(batches) + 1 and offsets[0] == 0 and offsets[-1] == len(spans)
    assert (np.diff(offsets) > 0).all()
    rows = [tuple(r) for r in batches_in.tolist()]
    kept = [rows.index(tuple(r)) for r in batches.tolist()]
    assert kept == sorted(kept)  # kept lines, in input order
    ids, bo = blocks["input_ids"], blocks["block_offsets"]
    masked = tokens = 0
    for k, line in enumerate(batches):
        seqs = [ids[bo[b]:bo[b + 1]] for b in line]
        mine = spans[offsets[k]:offsets[k + 1]]
        assert [tuple(s) for s in mine.tolist()] == sorted(tuple(s) for s in mine.tolist())
        flags = [blocks["flags"][bo[b]:bo[b + 1]] for b in line]
        where = ngram_sequences(seqs, flags, int(mine[:, 2].max()))
        for b, j, n in mine.tolist():
            assert mode == "span" or n == 1
            assert where[tuple(seqs[b][j:j + n].tolist())] - {b}  # occurs in another sequence of the line
        masked += int(mine[:, 2].sum())
        tokens += sum(len(s) for s in seqs)
    return out, masked, tokens


@pytest.mark.parametrize("mode", ["span", "uniform"])
def test_mask_shard_writes_the_contract_and_a_summary(shard, mode):
    tmp, blocks = shard
    batches_in = load_npz(tmp / "batches.npz")["batches"]
    summary = mask_shard(tmp / "blocks.npz", tmp / "batches.npz", tmp / f"out.{mode}.npz", mode=mode)
    out, masked, tokens = check_masked_file(tmp / f"out.{mode}.npz", blocks, batches_in, mode)
    assert summary["batches_in"] == len(batches_in)
    assert summary["batches_kept"] == len(out["batches"]) > 0
    assert summary["batches_dropped_low_mask"] == len(batches_in) - len(out["batches"])
    assert summary["spans"] == len(out["spans"])
    assert summary["masked_tokens"] == masked and summary["tokens"] == tokens
    assert summary["masked_ratio"] == pytest.approx(masked / tokens)
    assert 0.05 <= summary["masked_ratio"] < 0.3
    assert sum(summary["span_length_histogram"].values()) == len(out["spans"])
    assert summary["mode"] == mode and summary["seed"] == 2022


def test_mask_shard_is_deterministic_under_the_seed(shard):
    tmp, _ = shard
    args = (tmp / "blocks.npz", tmp / "batches.npz")
    mask_shard(*args, tmp / "a.npz", masking=MaskingSettings(seed=7))
    mask_shard(*args, tmp / "b.npz", masking=MaskingSettings(seed=7))
    mask_shard(*args, tmp / "c.npz", masking=MaskingSettings(seed=8))
    a, b, c = load_npz(tmp / "a.npz"), load_npz(tmp / "b.npz"), load_npz(tmp / "c.npz")
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["spans"], c["spans"])


def test_mask_shard_rejects_batches_that_refer_to_missing_blocks(shard, tmp_path):
    tmp, blocks = shard
    n_blocks = len(blocks["block_offsets"]) - 1
    save_npz(tmp_path / "bad.npz", batches=np.array([[0, n_blocks]], dtype=np.int64))
    with pytest.raises(ValueError, match=r"bad\.npz.*block"):
        mask_shard(tmp / "blocks.npz", tmp_path / "bad.npz", tmp_path / "out.npz")
    assert not (tmp_path / "out.npz").exists()


def test_mask_shard_rejects_an_empty_batches_file(shard, tmp_path):
    tmp, _ = shard
    save_npz(tmp_path / "empty.npz", batches=np.zeros((0, 8), dtype=np.int64))
    with pytest.raises(ValueError, match=r"empty\.npz.*no batch line"):
        mask_shard(tmp / "blocks.npz", tmp_path / "empty.npz", tmp_path / "out.npz")


def test_mask_shard_rejects_an_unknown_mode(shard, tmp_path):
    tmp, _ = shard
    with pytest.raises(ValueError, match=r"mode.*'bogus'.*batches\.npz"):
        mask_shard(tmp / "blocks.npz", tmp / "batches.npz", tmp_path / "out.npz", mode="bogus")


def test_mask_shard_rejects_a_file_that_is_not_a_blocks_file(shard, tmp_path):
    tmp, _ = shard
    save_npz(tmp_path / "noflags.npz", input_ids=np.zeros(3, np.int32), block_offsets=np.array([0, 3]))
    with pytest.raises(ValueError, match=r"noflags\.npz.*flags"):
        mask_shard(tmp_path / "noflags.npz", tmp / "batches.npz", tmp_path / "out.npz")
