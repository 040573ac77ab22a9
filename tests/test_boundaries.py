"""Word boundaries and token classes (paper-map §2.2 "Token classes", §3.2; §9 items 20-21)."""

import string

import numpy as np
import pytest

from npm.boundaries import (
    PUNCT_END,
    PUNCT_PIECE,
    PUNCT_START,
    PUNCT_TOKEN,
    SPACE_BEFORE,
    SPECIAL,
    encode_units,
    is_subword,
    token_flags,
    valid_ends,
    valid_starts,
)
from npm.masking import span_starts
from tests.conftest import lee_corpus_lines, original_strings

EXAMPLE = " The cat's hat."  # paper-map §9 item 21; Wikipedia units start with a space


def tokens(tok, ids):
    return tok.convert_ids_to_tokens(np.asarray(ids).tolist())


def picked(tok, ids, mask):
    return [t for t, m in zip(tokens(tok, ids), mask, strict=True) if m]


def reference_valid(strings, special):
    """Paper-map §3.2 literally, on each token decoded on its own with its leading space (golden cases).

    One deliberate difference: a token right after a whitespace-only token (byte-level BPE splits " illegal" into
    "Ġ" "il" ... when its vocabulary has no "Ġil") counts as starting with a space, because the word starts there;
    the offsets-based rule of npm.boundaries sees the space before it.
    """
    n = len(strings)
    spaced = [s.startswith(" ") or (i > 0 and strings[i - 1] != "" and strings[i - 1].isspace())
              for i, s in enumerate(strings)]
    starts = [i == 0 or spaced[i] or (strings[i - 1][-1:] in string.punctuation and strings[i - 1] != "")
              for i in range(n)]
    ends = [i == n - 1 or spaced[i + 1] or strings[i + 1][:1] in string.punctuation
            and strings[i + 1] != "" for i in range(n)]
    keep = ~np.asarray(special, dtype=bool)
    return np.array(starts) & keep, np.array(ends) & keep


def test_item21_valid_starts_and_ends_with_byte_level_bpe(bpe_tokenizer):
    ids, flags, _ = encode_units(bpe_tokenizer, [EXAMPLE])
    assert tokens(bpe_tokenizer, ids) == ["<s>", "ĠThe", "Ġcat", "'s", "Ġhat", ".", "</s>"]
    assert picked(bpe_tokenizer, ids, valid_starts(flags)) == ["ĠThe", "Ġcat", "Ġhat"]
    assert picked(bpe_tokenizer, ids, valid_ends(flags)) == ["ĠThe", "Ġcat", "'s", "Ġhat", "."]


def test_item21_rule_on_wordpiece_splits_cats_into_cat_quote_s(wordpiece_tokenizer):
    ids, flags, _ = encode_units(wordpiece_tokenizer, [EXAMPLE])
    assert tokens(wordpiece_tokenizer, ids) == ["[CLS]", "the", "cat", "'", "s", "hat", ".", "[SEP]"]
    # "'" follows "cat" (no space, "cat" ends in a letter): not a start. "s" follows "'", which ends with
    # punctuation: a start. "'" is not an end: the next token "s" neither has a space before it nor starts with
    # punctuation. "cat" is an end because "'" starts with punctuation.
    assert picked(wordpiece_tokenizer, ids, valid_starts(flags)) == ["the", "cat", "s", "hat"]
    assert picked(wordpiece_tokenizer, ids, valid_ends(flags)) == ["the", "cat", "s", "hat", "."]


def test_flags_of_the_example_tokens(bpe_tokenizer, wordpiece_tokenizer):
    _, flags, _ = encode_units(bpe_tokenizer, [EXAMPLE])
    s = SPECIAL | PUNCT_START | PUNCT_END
    dot = PUNCT_START | PUNCT_END | PUNCT_TOKEN | PUNCT_PIECE
    assert flags.tolist() == [s, SPACE_BEFORE, SPACE_BEFORE, PUNCT_START, SPACE_BEFORE, dot, s]
    _, flags, _ = encode_units(wordpiece_tokenizer, [EXAMPLE])
    quote = PUNCT_START | PUNCT_END | PUNCT_PIECE  # a punctuation piece but not paper-map §2.2 "punctuation"
    assert flags.tolist() == [s, SPACE_BEFORE, SPACE_BEFORE, quote, 0, SPACE_BEFORE, dot, s]


def test_reference_rule_golden_cases_on_real_text_bpe(bpe_tokenizer):
    """Against paper-map §3.2 applied to each BPE token decoded on its own, on 300 real news paragraphs."""
    lines = lee_corpus_lines()
    ids, flags, unit_offsets = encode_units(bpe_tokenizer, lines)
    for u in range(len(lines)):
        a, b = unit_offsets[u], unit_offsets[u + 1]
        strings = [bpe_tokenizer.decode([i], clean_up_tokenization_spaces=False) for i in ids[a:b].tolist()]
        want_starts, want_ends = reference_valid(strings, flags[a:b] & SPECIAL)
        assert (valid_starts(flags[a:b]) == want_starts).all(), lines[u]
        assert (valid_ends(flags[a:b]) == want_ends).all(), lines[u]


def test_subwords_match_reference_2_2_on_real_text_bpe(bpe_tokenizer):
    """Paper-map §2.2: not starting with a space and not a substring of string.punctuation; specials count.
    The first token of a unit is word-initial here (the original lets it start a span through its "follows <s>"
    exception instead), and so is a token after a whitespace-only token (see ``reference_valid``)."""
    lines = lee_corpus_lines()
    ids, flags, unit_offsets = encode_units(bpe_tokenizer, lines)
    strings = [bpe_tokenizer.decode([i], clean_up_tokenization_spaces=False) for i in ids.tolist()]
    want = np.array([not s.startswith(" ") and s not in string.punctuation for s in strings])
    after_lone_space = np.flatnonzero([s != "" and s.isspace() for s in strings]) + 1  # see reference_valid
    want[after_lone_space] = False
    first = unit_offsets[:-1] + 1  # after <s>
    want[first] = False
    want[(flags & SPECIAL) != 0] = True
    assert (is_subword(flags) == want).all()


def test_special_tokens_are_subwords_and_never_valid(bpe_tokenizer, wordpiece_tokenizer):
    for tok, text in ((bpe_tokenizer, "a <mask> b"), (wordpiece_tokenizer, "a [MASK] b")):
        ids, flags, _ = encode_units(tok, [text])
        special = np.isin(ids, tok.all_special_ids)
        assert special.sum() == 3  # begin, mask, end: the mask typed in the text is special too
        assert (flags[special] == SPECIAL | PUNCT_START | PUNCT_END).all()
        assert is_subword(flags)[special].all()
        assert not valid_starts(flags)[special].any() and not valid_ends(flags)[special].any()


def test_punctuation_piece_is_a_substring_of_string_punctuation():
    text = "a () -- ... , ;"
    spans = [(0, 1), (2, 4), (5, 7), (8, 11), (12, 13), (14, 15)]
    flags = token_flags(text, spans, np.zeros(6, bool))
    piece = (flags & PUNCT_PIECE) != 0
    assert piece.tolist() == [False, True, False, False, True, True]  # "()" is in string.punctuation, "--" not
    assert ((flags & PUNCT_TOKEN) != 0).tolist() == [False, False, False, False, True, False]
    assert is_subword(flags).tolist() == [False, False, False, False, False, False]  # all word-initial
    glued = token_flags("x--", [(0, 1), (1, 3)], np.zeros(2, bool))
    assert is_subword(glued).tolist() == [False, True]  # paper-map §2.2: multi-char punctuation is a subword


def test_untrimmed_offsets_give_the_same_flags():
    text = "The cat, sat."
    trimmed = [(0, 3), (4, 7), (7, 8), (9, 12), (12, 13)]
    untrimmed = [(0, 3), (3, 7), (7, 8), (8, 12), (12, 13)]  # byte-level spans that keep their leading space
    special = np.zeros(5, bool)
    assert token_flags(text, trimmed, special).tolist() == token_flags(text, untrimmed, special).tolist()


def test_double_space_gives_a_lone_space_token_that_is_word_initial(bpe_tokenizer):
    ids, flags, _ = encode_units(bpe_tokenizer, ["Title.  Section"])  # paper-map §2.1 quirk: "{title}. {unit}"
    toks = tokens(bpe_tokenizer, ids)
    assert "Ġ" in toks
    lone = toks.index("Ġ")
    assert flags[lone] == SPACE_BEFORE and flags[lone + 1] & SPACE_BEFORE
    assert valid_starts(flags)[lone] and valid_ends(flags)[lone - 1]


def test_first_token_of_each_unit_is_word_initial(bpe_tokenizer, wordpiece_tokenizer):
    for tok in (bpe_tokenizer, wordpiece_tokenizer):
        _, flags, unit_offsets = encode_units(tok, ["Hello there", "Another one", "", "x"])
        assert np.diff(unit_offsets)[2] == 2  # an empty unit is just the two special tokens
        for u in (0, 1, 3):
            assert flags[unit_offsets[u] + 1] & SPACE_BEFORE


def test_offsets_are_code_points_outside_the_basic_plane(wordpiece_tokenizer):
    ids, flags, _ = encode_units(wordpiece_tokenizer, ["\U0001d400 rain, snow"])
    toks = tokens(wordpiece_tokenizer, ids)
    assert toks[-3:] == ["rain", ",", "snow"] or toks[-4:-1] == ["rain", ",", "snow"]
    i = toks.index(",")
    assert flags[i] & PUNCT_TOKEN and flags[i - 1] & SPACE_BEFORE and flags[i + 1] & SPACE_BEFORE


@pytest.mark.parametrize("family", ["bpe", "wordpiece"])
def test_flat_version_equals_per_block(family, bpe_tokenizer, wordpiece_tokenizer):
    tok = bpe_tokenizer if family == "bpe" else wordpiece_tokenizer
    _, flags, _ = encode_units(tok, lee_corpus_lines()[:40])
    rng = np.random.default_rng(0)
    cuts = np.sort(rng.choice(np.arange(1, len(flags)), size=60, replace=False))
    block_offsets = np.r_[0, cuts, len(flags)]
    starts, ends = valid_starts(flags, block_offsets), valid_ends(flags, block_offsets)
    for a, b in zip(block_offsets[:-1], block_offsets[1:], strict=True):
        assert (starts[a:b] == valid_starts(flags[a:b])).all()
        assert (ends[a:b] == valid_ends(flags[a:b])).all()
        # a block's edges are valid unless they hold a special token (paper-map §9 item 20: never stored)
        assert starts[a] == (not flags[a] & SPECIAL) and ends[b - 1] == (not flags[b - 1] & SPECIAL)


def test_empty_flags():
    assert valid_starts(np.zeros(0, np.uint8)).shape == (0,)
    assert valid_ends(np.zeros(0, np.uint8), np.array([0])).shape == (0,)


# ---------------------------------------------------------------------- the original code's rule (`code`)

# Real text where reading the source text and decoding each token on its own disagree (paper-map §3.2): a space
# before punctuation (roberta's "Ġ." decodes to "." once transformers 4.21's clean-up has run), non-ASCII spaces,
# characters whose UTF-8 bytes are split across byte-level tokens (each piece decodes to U+FFFD), a double space.
ORIGINAL_CASES = ["The vote was 52 , 48 against .  It passed anyway !", "Prices rose 3.5% (about $2,000) in 2019...",
                  "Café au lait — naïve “quotes” and 東京 in one line.", "서울특별시는 대한민국의 수도이다.",
                  "Москва́ — столица России.", "กรุงเทพมหานคร เป็นเมืองหลวง", "A\u00a0non-breaking\u2009space, here",
                  "He said ' hello ' and left ; it 's late , isn't it ?", " The cat's hat."]


def original_classes(strings, ids, block_offsets):
    """The original's valid starts / ends (``prev_npm.get_candidates``, paper-map §3.2; ids 0 and 2 never listed)
    and the positions where its span masking may start a span (``utils_span``: not 0 or 2, and not a subword
    unless right after ``<s>``; paper-map §2.2), bool [T] each."""
    n_all = len(ids)
    starts, ends, can_start = (np.zeros(n_all, bool) for _ in range(3))
    subwords = {i for i, w in enumerate(strings) if w[0] != " " and w not in string.punctuation}
    for a, b in zip(block_offsets[:-1], block_offsets[1:], strict=True):
        block = ids[a:b].tolist()
        s = [strings[i] for i in block]
        for i in range(len(block)):
            if block[i] in (0, 2):
                continue
            starts[a + i] = i == 0 or s[i].startswith(" ") or any(s[i - 1].endswith(p) for p in string.punctuation)
            ends[a + i] = (i == len(block) - 1 or s[i + 1].startswith(" ")
                           or any(s[i + 1].startswith(p) for p in string.punctuation))
            can_start[a + i] = not ((i == 0 or block[i - 1] != 0) and block[i] in subwords)
    return starts, ends, can_start


def test_code_rule_gives_the_original_s_valid_positions_and_span_starts(roberta_tokenizer):
    """``word_boundaries="code"`` decodes each id on its own as the original did, so on roberta-large's vocabulary its
    valid starts/ends and span starts are the original's exactly, where the text rule differs on these cases."""
    tok = roberta_tokenizer
    texts = ORIGINAL_CASES + lee_corpus_lines()[:40]
    strings = original_strings(tok)
    disagreements = 0
    for rule in ("code", "text"):
        ids, flags, unit_offsets = encode_units(tok, texts, word_boundaries=rule)
        rng = np.random.default_rng(0)  # blocks cut anywhere, some starting mid-unit
        block_offsets = np.unique(np.r_[0, rng.choice(np.arange(1, len(ids)), 80, replace=False), len(ids)])
        want_s, want_e, want_start = original_classes(strings, ids, block_offsets)
        got = (valid_starts(flags, block_offsets), valid_ends(flags, block_offsets),
               span_starts(flags, np.diff(block_offsets)))
        if rule == "code":
            for g, w, what in zip(got, (want_s, want_e, want_start), ("starts", "ends", "span starts"), strict=True):
                bad = np.flatnonzero(g != w)
                assert not len(bad), (what, tokens(tok, ids[bad]))
        else:
            disagreements = sum(int((g != w).sum()) for g, w in zip(got, (want_s, want_e, want_start), strict=True))
    assert disagreements > 0  # the switch matters on these cases


def test_code_rule_flags_of_tokens_the_text_rule_reads_otherwise(roberta_tokenizer):
    ids, code, _ = encode_units(roberta_tokenizer, ["52 , 48 ."], word_boundaries="code")
    _, text, _ = encode_units(roberta_tokenizer, ["52 , 48 ."], word_boundaries="text")
    assert tokens(roberta_tokenizer, ids) == ["<s>", "52", "Ġ,", "Ġ48", "Ġ.", "</s>"]
    comma = PUNCT_START | PUNCT_END | PUNCT_TOKEN | PUNCT_PIECE
    assert code[2] == code[4] == comma  # "Ġ," decodes to "," after the clean-up: not word-initial
    assert text[2] == text[4] == comma | SPACE_BEFORE  # a space precedes it in the text
    assert code[3] == text[3] == SPACE_BEFORE


def test_code_rule_is_refused_for_a_tokenizer_whose_tokens_never_start_with_a_space(wordpiece_tokenizer):
    with pytest.raises(ValueError, match="word_boundaries 'code'.*no token decodes with a leading space"):
        encode_units(wordpiece_tokenizer, [EXAMPLE], word_boundaries="code")


@pytest.mark.parametrize("family", ["bpe", "wordpiece"])
def test_with_the_text_rule_a_span_starts_only_on_a_word_initial_token(family, bpe_tokenizer, wordpiece_tokenizer):
    """The text rule makes a unit's first token word-initial, so the original's "unless right after <s>" exception
    of span masking (``span_starts``) adds no start there: masking is what it was before the code rule existed."""
    tok = bpe_tokenizer if family == "bpe" else wordpiece_tokenizer
    _, flags, unit_offsets = encode_units(tok, lee_corpus_lines()[:80] + ORIGINAL_CASES, word_boundaries="text")
    lengths = np.diff(np.r_[0, np.sort(np.random.default_rng(1).choice(len(flags), 50, replace=False)), len(flags)])
    assert (span_starts(flags, lengths) == (((flags & SPECIAL) == 0) & ~is_subword(flags))).all()


def test_tokenize_blocks_with_the_code_rule_stores_the_decoded_flags_and_records_the_rule(roberta_tokenizer, tmp_path):
    """`npm-repro tokenize-blocks --word-boundaries code`: the blocks' flags are the per-id table's, and the rule is
    in the summary and in the blocks file's checksum record."""
    import gzip
    import json

    from npm.boundaries import decoded_flags
    from npm.cli import main
    from npm.data.blocks import load_blocks

    docs = tmp_path / "docs.jsonl.gz"
    with gzip.open(docs, "wt", encoding="utf-8") as f:
        for k, text in enumerate(ORIGINAL_CASES):
            f.write(json.dumps({"id": str(k), "units": [text]}) + "\n")
    out, summary = tmp_path / "blocks.npz", tmp_path / "summary.json"
    assert main(["tokenize-blocks", "--docs", str(docs), "--tokenizer", roberta_tokenizer.name_or_path,
                 "--word-boundaries", "code", "--out", str(out), "--summary", str(summary)]) == 0
    blocks = load_blocks(out)
    np.testing.assert_array_equal(blocks["flags"], decoded_flags(roberta_tokenizer)[blocks["input_ids"]])
    assert json.loads(summary.read_text())["word_boundaries"] == "code"
    assert "--word-boundaries code" in (tmp_path / "blocks.npz.sha256.json").read_text()
