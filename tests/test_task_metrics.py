"""Task metrics, sampling and templates (paper-map §4.1-§4.2, §5.1-§5.2, §6; §9 items 27-30)."""

import json

import numpy as np
import pytest

from npm.tasks.metrics import (
    aggregate,
    bootstrap,
    exact_match,
    macro_average,
    micro_average,
    ngram_bucket,
    normalize_answer,
    sample_by_group,
    sample_indices,
    translation_prediction,
)
from npm.tasks.registry import load_registry
from npm.tasks.templates import (
    CLOSED_SET_TEMPLATES,
    YAHOO_TOPICS,
    closed_set_input,
    closed_set_text,
    detokenize,
    kamel_input,
    lama_input,
    qa_input,
    read_fuzzy_verbalizer_json,
    read_fuzzy_verbalizer_txt,
    translation_input,
)

# ----------------------------------------------------------------------------------- paper-map §9 item 29


def test_item29_the_beatles_bang_normalises_to_beatles():
    assert normalize_answer("The Beatles!") == "beatles"
    assert exact_match("The Beatles!", ["beatles"])


def test_item29_normalisation_order_lower_punctuation_articles_whitespace():
    assert normalize_answer("  A  Tale of\tTwo   Cities. ") == "tale of two cities"
    assert normalize_answer("The-Who") == "thewho"  # punctuation is removed, not replaced by a space
    assert normalize_answer("Anthem") == "anthem"  # articles only as whole words
    assert normalize_answer("AN apple, THE pear") == "apple pear"


def test_item29_non_ascii_punctuation_is_kept():
    assert normalize_answer("«Paris»。") == "«paris»。"
    assert normalize_answer("東京、日本") == "東京、日本"
    assert not exact_match("«Paris»", ["Paris"])


def test_item29_exact_match_is_list_membership_not_substring():
    assert not exact_match("Paris", ["Paris, France"])
    assert not exact_match("Paris France", ["Paris"])
    assert exact_match("paris", ["London", "PARIS."])
    assert not exact_match("Par", "Paris")  # a bare string is one answer, not a list of characters
    assert exact_match("Paris", "paris")


def test_translation_prediction_is_cut_at_the_first_punctuation_before_normalising():
    assert translation_prediction("반포대교 (Banpo Bridge), Seoul") == "반포대교"
    assert translation_prediction("Мост Банпо") == "Мост Банпо"
    assert exact_match(translation_prediction("반포대교. and more"), ["반포대교"])


# ----------------------------------------------------------------------------------- paper-map §9 item 30


def test_item30_ngram_bucket_is_the_shortest_answer_capped_at_four(wordpiece_tokenizer):
    tok = wordpiece_tokenizer
    assert ngram_bucket(["Paris"], tok) == 1
    assert ngram_bucket(["New York City", " New York "], tok) == 2
    assert ngram_bucket(["Los Angeles County Fire Department"], tok) == 4
    assert ngram_bucket(["rebooted"], tok) == 3  # subword pieces count, special tokens do not
    with pytest.raises(ValueError, match="at least one"):
        ngram_bucket([], tok)


def test_item30_sampling_with_seed_0_is_the_legacy_permutation_prefix():
    idx = sample_indices(10_000, n_samples=3000, seed=0)
    np.testing.assert_array_equal(idx, np.random.RandomState(0).permutation(10_000)[:3000])
    np.random.seed(0)
    np.testing.assert_array_equal(idx, np.random.permutation(range(10_000))[:3000])
    np.testing.assert_array_equal(idx, sample_indices(10_000))
    assert len(set(idx.tolist())) == 3000


def test_item30_small_sets_are_kept_whole_but_reordered():
    idx = sample_indices(50, n_samples=3000)
    assert sorted(idx.tolist()) == list(range(50)) and idx.tolist() != list(range(50))


def test_item30_group_sampling_caps_each_group_and_is_reproducible():
    groups = [1] * 1500 + [2] * 300 + [3] * 1200 + [4] * 10
    idx = sample_by_group(groups, per_group=1000, seed=0)
    counts = np.bincount(np.asarray(groups)[idx])
    assert counts.tolist() == [0, 1000, 300, 1000, 10]
    assert len(set(idx.tolist())) == len(idx) == 2310
    np.testing.assert_array_equal(idx, sample_by_group(groups, per_group=1000, seed=0))
    assert not np.array_equal(idx, sample_by_group(groups, per_group=1000, seed=1))


def test_item30_group_sampling_draws_one_legacy_stream_then_shuffles_all():
    groups = ["ko", "zh", "ko", "zh", "zh", "ko", "zh"]
    rng = np.random.RandomState(0)
    ko, zh = np.array([0, 2, 5]), np.array([1, 3, 4, 6])
    kept = np.concatenate([ko[rng.permutation(3)[:2]], zh[rng.permutation(4)[:2]]])
    np.testing.assert_array_equal(sample_by_group(groups, per_group=2, seed=0), rng.permutation(kept))


def test_item30_macro_and_micro_differ_on_unbalanced_groups():
    scores = [1, 1, 1, 0]
    groups = [1, 1, 1, 4]
    assert micro_average(scores) == pytest.approx(0.75)
    assert macro_average(scores, groups) == pytest.approx(0.5)
    assert aggregate(scores, groups) == pytest.approx(0.5)  # macro is the default
    assert aggregate(scores, groups, average="micro") == pytest.approx(0.75)
    with pytest.raises(ValueError, match="needs the group"):
        aggregate(scores, None, average="macro")
    with pytest.raises(ValueError, match="macro' or 'micro"):
        aggregate(scores, groups, average="weighted")


# ---------------------------------------------------------------------------------- paper-map §9 item 27, §4.2


def test_item27_closed_set_templates_reuse_closed_set_input():
    record = {"text": "a fine film ."}
    assert closed_set_text("sst2", record) == closed_set_input(CLOSED_SET_TEMPLATES["sst2"](record))
    assert closed_set_text("sst2", record) == "a fine film. It was<mask>."
    with pytest.raises(ValueError, match="unknown closed-set task"):
        closed_set_text("imdb", record)


@pytest.mark.parametrize("raw, expected", [
    ("it 's a film that does n't work .", "it's a film that doesn't work."),
    ("i don 't know !", "i don't know!"),
    ("what a mess ? !", "what a mess?!"),
    ("wow ! .", "wow!"),
    ("really ? .", "really?"),
    ("x ( a film ) , [ b ] ; c : d", "x (a film), [b]; c: d"),
    # as the original, only a "(" or "[" that itself got a space glues the next token: not a first one, not one
    # glued to the one before
    ("( a film ) is great .", "( a film) is great."),
    ("a ( ( b ) )", "a (( b))"),
    ("the ' quotes ' and the 90 's", "the' quotes' and the 90's"),
    ("see www. imdb. com for more", "see www.imdb.com for more"),
    ("it 's com but not com .", "it's com but not com."),
    ("  spaced   out  ", "spaced out"),
])
def test_detokenize_rules(raw, expected):
    assert detokenize(raw) == expected


RECORDS = {
    "agn": ({"title": "Stocks rally", "description": "Markets rose on Monday."},
            "Stocks rally \n Markets rose on Monday. The text topic is about<mask>."),
    "yahoo": ({"question_title": "Why?", "question_content": "Just why.", "best_answer": "Because."},
              "title: Why? content: Just why. answer: Because. The text topic is about<mask>."),
    "rte": ({"sentence1": "The cat sat on the mat.", "sentence2": "A cat is sitting!"},
            "The cat sat on the mat, right?<mask>, a cat is sitting."),
    "subj": ({"text": "the film is n't a comedy ."}, "the film isn't a comedy. This is a<mask>."),
    "sst2": ({"text": "it 's great !"}, "it's great! It was<mask>."),
    "mr": ({"text": "dull ( really ) ."}, "dull (really). It was<mask>."),
    "rt": ({"text": "a triumph ."}, "a triumph. It was<mask>."),
    "cr": ({"text": "the battery , sadly , died ."}, "the battery, sadly, died. It was<mask>."),
    "amazon": ({"title": "Great product", "content": "Works as described."},
               "Great product. Works as described. It was<mask>."),
}


@pytest.mark.parametrize("task", sorted(RECORDS))
def test_every_closed_set_template_on_a_sample_record(task):
    record, expected = RECORDS[task]
    assert closed_set_text(task, record) == expected


def test_amazon_title_ending_in_punctuation_gets_no_extra_dot():
    assert closed_set_text("amazon", {"title": "Wow!", "content": "Nice."}) == "Wow! Nice. It was<mask>."


def test_amazon_input_is_the_original_s_title_dot_content_stripped_as_a_whole():
    """As the original's load_amazon: "." follows any title not ending in punctuation (an empty one, or one ending in
    a space, too), then one space and the content, and the whole input is stripped. Before: the title and the
    content were stripped apart and an empty title got no dot."""
    assert closed_set_text("amazon", {"title": "", "content": "Broke."}) == ". Broke. It was<mask>."
    assert closed_set_text("amazon", {"title": "Great ", "content": " Works"}) == "Great .  Works It was<mask>."
    assert closed_set_text("amazon", {"title": " Fine", "content": "Ok. "}) == "Fine. Ok. It was<mask>."


def test_label_words_have_a_leading_space_in_label_id_order():
    reg = load_registry()
    LABEL_WORDS = {n: t.label_words for n, t in reg.items() if t.closed}  # config/tasks.yaml verbalizer.words
    assert {t.template for t in reg.values() if t.closed} == set(CLOSED_SET_TEMPLATES)
    assert LABEL_WORDS["agn"] == (" politics", " sports", " business", " technology")
    assert LABEL_WORDS["rte"] == (" Yes", " No")
    assert LABEL_WORDS["subj"] == (" review", " summary")
    assert LABEL_WORDS["sst2"] == LABEL_WORDS["amazon"] == (" terrible", " great")
    assert len(LABEL_WORDS["yahoo"]) == len(YAHOO_TOPICS) == 10 and LABEL_WORDS["yahoo"][-1] == " politics"
    assert all(w.startswith(" ") and not w.startswith("  ") for ws in LABEL_WORDS.values() for w in ws)


# ------------------------------------------------------------------------------------------------ 5.1


def test_lama_template_fills_subject_and_mask_and_glues_the_final_dot():
    assert lama_input("[X] is owned by [Y] .", "AVCDH") == "AVCDH is owned by <mask>."


def test_lama_template_glues_the_dot_before_the_subject_goes_in_as_the_original():
    # the original replaces [Y] and " ." first, then [X]: a " ." inside a subject stays as the data has it
    assert lama_input("[X] was born in [Y] .", "John Smith Jr .") == "John Smith Jr . was born in <mask>."
    assert lama_input("[X] is located in [Y] .", "St . Louis") == "St . Louis is located in <mask>."


def test_kamel_final_dot_is_dropped_when_a_gold_ends_in_dot_plus_or_bang():
    q = "What programming language is [S] written in?"
    assert kamel_input(q, "Linux", ["C"]) == "What programming language is Linux written in? Answer: <mask>."
    for gold in ("C++", "Inc.", "Yahoo!"):
        assert kamel_input(q, "Linux", ["C", gold]) == "What programming language is Linux written in? Answer: <mask>"


def test_nq_question_is_stripped_unquoted_and_gets_a_question_mark():
    assert qa_input('  "who wrote hamlet"  ') == "who wrote hamlet? The answer is: <mask>."
    assert qa_input("who wrote hamlet?") == "who wrote hamlet? The answer is: <mask>."
    assert qa_input('the "best" band') == 'the "best" band? The answer is: <mask>.'


def test_translation_template():
    assert translation_input("Korean", "Banpo Bridge") == "The Korean translation of Banpo Bridge is: <mask>."
    assert translation_input("ko", "Banpo Bridge") == "The Korean translation of Banpo Bridge is: <mask>."


def test_is_question_only_for_kamel_nq_triviaqa():
    assert {n for n, t in load_registry().items() if t.is_question} == {"kamel", "nq", "triviaqa"}


# ----------------------------------------------------------------------------------- paper-map §9 item 28


def ids_of(tok, word):
    return tok(" " + word, add_special_tokens=False)["input_ids"][0]


def test_item28_txt_verbalizer_lists_are_truncated_to_the_shortest(wordpiece_tokenizer, tmp_path):
    tok = wordpiece_tokenizer
    path = tmp_path / "sst2.txt"
    path.write_text("terrible, awful, horrible, bad\ngreat, awesome\n\n", encoding="utf-8")
    verb = read_fuzzy_verbalizer_txt(path, tok)
    assert [v.tolist() for v in verb] == [[ids_of(tok, "terrible"), ids_of(tok, "awful")],
                                          [ids_of(tok, "great"), ids_of(tok, "awesome")]]
    assert all(v.dtype == np.int64 for v in verb)
    assert [v.tolist() for v in read_fuzzy_verbalizer_txt(path.read_text().splitlines(), tok)] == \
        [v.tolist() for v in verb]


def test_item28_a_word_of_two_tokens_is_an_error_naming_word_and_label(wordpiece_tokenizer):
    with pytest.raises(ValueError, match=r"'gloomy' of label 1 encodes to 2 tokens"):
        read_fuzzy_verbalizer_txt(["terrible, awful", "great, gloomy"], wordpiece_tokenizer)


def test_item28_yahoo_json_verbalizer_is_not_truncated(wordpiece_tokenizer, tmp_path):
    tok = wordpiece_tokenizer
    path = tmp_path / "yahoo.json"
    path.write_text(json.dumps({"Health": ["health", "doctor", "medicine"], "Sports": ["sports"]}), encoding="utf-8")
    verb = read_fuzzy_verbalizer_json(path, tok)
    assert [len(v) for v in verb] == [3, 1] and verb[1].tolist() == [ids_of(tok, "sports")]
    flipped = read_fuzzy_verbalizer_json(path, tok, topics=["Sports", "Health"])
    assert [len(v) for v in flipped] == [1, 3]
    with pytest.raises(ValueError, match="no words for"):
        read_fuzzy_verbalizer_json(path, tok, topics=YAHOO_TOPICS)


def test_bootstrap_interval_brackets_the_score_and_shrinks_with_n():
    """The interval printed beside each table cell: seeded (same numbers twice), around the average, standard error
    close to the binomial one sqrt(p(1-p)/n), and narrower for more examples."""
    small = np.array([1.0] * 12 + [0.0] * 28)
    big = np.tile(small, 10)
    a, b = bootstrap(small), bootstrap(small)
    assert a == b
    assert a["ci95"][0] < small.mean() < a["ci95"][1]
    assert a["stderr"] == pytest.approx(np.sqrt(0.3 * 0.7 / 40), rel=0.15)
    assert bootstrap(big)["stderr"] < a["stderr"] / 2
    assert bootstrap(np.ones(5)) == {"stderr": 0.0, "ci95": [1.0, 1.0]}


def test_bootstrap_of_a_macro_average_resamples_within_groups():
    """Macro averages (LAMA buckets) keep every group in every resample: a group of one example adds no noise."""
    scores = np.array([1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    groups = [1, 1, 1, 1, 1, 1, 2]
    out = bootstrap(scores, groups, "macro")
    assert out["ci95"][0] <= aggregate(scores, groups, "macro") <= out["ci95"][1]
    assert out["ci95"][0] >= 0.5  # group 2 is always 1.0, so the macro mean never drops below half
    with pytest.raises(ValueError, match="group of every score"):
        bootstrap(scores, None, "macro")
