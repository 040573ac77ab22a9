"""Truecasing of lowercased questions (npm.densephrases.truecase; docs/paper-map.md §D1.7): the code's --truecase
against an independent transcription of its ``TrueCaser.get_true_case`` (densephrases/utils/squad_utils.py at
9583883) over the truecase package's real statistics (its english.dist), and a statistics file that would run code
refused."""

from __future__ import annotations

import os
import pickle
import string

import pytest

from npm.densephrases.truecase import load_truecaser, truecase_question, truecase_records

QUESTIONS = ["who was the first president of the united states", "who plays in the new york yankees",
             "who sings don't stop believing ?", "mid-june is when the county grand jury said it met",
             "what is the capital of greece", "when was the eiffel tower built in paris , france",
             "how many members does the u.s. senate have", "where did the 1984 olympic games take place"]


def _original(caser, sentence):
    """The code's ``get_true_case``: whitespace tokens; a punctuation mark or a number kept; a known word's only
    casing, or the casing with the highest ``get_score(previous truecased token, casing, next raw token)``, the
    first word's first letter raised; an unknown word in title case; joined with spaces except before a
    punctuation mark or a token that starts with an apostrophe."""
    tokens, out = sentence.strip().split(), []
    for n, token in enumerate(tokens):
        if token in string.punctuation or token.isdigit():
            out.append(token)
            continue
        casings = caser.word_casing_lookup.get(token.lower())
        if casings is None:
            out.append(token.lower().title())
            continue
        if len(casings) == 1:
            out.append(list(casings)[0])
        else:
            prev, nxt = (out[n - 1] if n else None), (tokens[n + 1] if n < len(tokens) - 1 else None)
            scores = [caser.get_score(prev, c, nxt) for c in casings]
            out.append(list(casings)[scores.index(max(scores))])
        if n == 0:
            out[0] = f"{out[0][0].upper()}{out[0][1:]}"
    return "".join(" " + t if not t.startswith("'") and t not in string.punctuation else t for t in out).strip()


def test_lowercased_questions_are_truecased_as_the_code_does():
    caser = load_truecaser("package")
    got = [truecase_question(caser, q) for q in QUESTIONS]
    assert got == [_original(caser, q) for q in QUESTIONS]
    assert got[0] == "Who was the first president of the United States"
    assert got[1] == "Who plays in the New York Yankees"
    assert got[2] == "Who sings don't stop believing?"  # the code's join: no space before "?"
    assert got[3].startswith("Mid-June ")  # the code's first word: "mid-June" raised, not "Mid-june"
    cased = "Who wrote the Iliad?"
    assert truecase_question(caser, cased) == cased  # only an all-lowercase question is truecased
    records, changed = truecase_records("package", [{"question": q, "id": i} for i, q in enumerate(QUESTIONS[:2])]
                                        + [{"question": cased, "id": 9}])
    assert changed == 2 and [r["question"] for r in records] == got[:2] + [cased] and records[2]["id"] == 9
    assert truecase_records(None, [{"question": QUESTIONS[0]}]) == ([{"question": QUESTIONS[0]}], 0)


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("true",))


def test_a_statistics_file_that_would_run_code_or_is_not_one_is_refused(tmp_path):
    evil = tmp_path / "evil.dist"
    evil.write_bytes(pickle.dumps({"uni_dist": _RunsCode()}))
    with pytest.raises(ValueError, match="refusing to load posix.system|refusing to load os.system"):
        load_truecaser(str(evil))
    partial = tmp_path / "partial.dist"
    partial.write_bytes(pickle.dumps({"uni_dist": {}}))
    with pytest.raises(ValueError, match="holds no uni_dist"):
        load_truecaser(str(partial))
    with pytest.raises(ValueError, match="missing.dist.*english_with_questions.dist"):
        load_truecaser(str(tmp_path / "missing.dist"))
