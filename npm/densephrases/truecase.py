"""Truecasing of lowercased questions (Lee et al. 2021's code, ``--truecase``; docs/paper-map.md §D1.7).

DensePhrases' encoders are cased, and NQ's (and WebQuestions') questions are all lowercase, so its code restores their
case before encoding them: its query loader truecases every question that equals its own lowercase, in training,
query-side fine-tuning and evaluation. The scorer is the ``truecase`` package's (unigram, bigram and trigram casing
statistics, ``TrueCaser.get_true_case_from_tokens``, unknown words in title case); the code's variant around it is
kept here: whitespace tokens, the first word's first letter raised without lowering the rest, and the tokens joined
with a space except before a punctuation mark or a token that begins with an apostrophe. A word's casings are tried
in sorted order (the first wins a tie), where the code's order is that of a Python set of strings, which changes from
run to run with the hash seed.

The statistics are a pickle (``X.dist``): the code's ``english_with_questions.dist`` (in its data release,
``truecase/``), or ``package``, the ``truecase`` package's own ``english.dist``. A pickle is loaded only if it holds
nothing but sets and frequency counts: a downloaded file must not run code.
"""

from __future__ import annotations

import functools
import os
import pickle
import string
from pathlib import Path

PACKAGE = "package"  # the truecase package's english.dist
DISTRIBUTIONS = ("uni_dist", "backward_bi_dist", "forward_bi_dist", "trigram_dist", "word_casing_lookup")
_ALLOWED = {("builtins", "set"), ("builtins", "dict"), ("collections", "Counter"), ("collections", "defaultdict"),
            ("nltk.probability", "FreqDist")}


class _DistUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a truecasing .dist file holds only sets "
                                         "and frequency counts")
        return super().find_class(module, name)


def dist_path(dist: str | os.PathLike) -> Path:
    """The statistics file of config ``densephrases.truecase``: a path, or ``package``."""
    if str(dist) == PACKAGE:
        import truecase

        return Path(truecase.__file__).parent / "data" / "english.dist"
    return Path(dist)


@functools.lru_cache(maxsize=2)
def load_truecaser(dist: str | os.PathLike):
    """The ``truecase`` package's scorer over the statistics of ``dist`` (``dist_path``), with the code's first-word
    rule, loaded once per process (seconds); a file that is missing, not a pickle of the five distributions, or would
    run code is a ValueError naming it."""
    from truecase import TrueCaser

    class CodeTrueCaser(TrueCaser):
        def __init__(self, distributions: dict):  # the package's reads the pickle with pickle.load: not ours
            for key in DISTRIBUTIONS:
                setattr(self, key, distributions[key])
            # each word's casings in sorted order, so that a tie and a sum's rounding never depend on the set order
            # of Python's string hashing (which varies from run to run, in the code too)
            self.word_casing_lookup = {k: sorted(v) for k, v in self.word_casing_lookup.items()}

        def first_token_case(self, raw: str) -> str:  # the code's: "mcDonald" -> "McDonald", not "Mcdonald"
            return raw[:1].upper() + raw[1:]

    path = dist_path(dist)
    try:
        with open(path, "rb") as f:
            distributions = _DistUnpickler(f).load()
        if not isinstance(distributions, dict) or set(DISTRIBUTIONS) - set(distributions):
            raise ValueError(f"it holds no {', '.join(DISTRIBUTIONS)}")
    except (OSError, pickle.UnpicklingError, EOFError, ValueError) as e:
        raise ValueError(f"truecasing statistics {path}: {e} (densephrases.truecase: the code's "
                         f"english_with_questions.dist from its data release, or {PACKAGE!r})") from e
    return CodeTrueCaser(distributions)


def truecase_question(caser, question: str) -> str:
    """``question`` truecased as the code does it when it is all lowercase (``question == question.lower()``), else
    unchanged."""
    if question != question.lower():
        return question
    tokens = caser.get_true_case_from_tokens(question.split(), out_of_vocabulary_token_option="title")
    return "".join(t if t.startswith("'") or t in string.punctuation else " " + t for t in tokens).strip()


def truecase_records(dist: str | os.PathLike | None, records: list[dict]) -> tuple[list[dict], int]:
    """{question, ...} records with their questions truecased (``dist`` None: unchanged) and how many changed."""
    if dist is None or not records:
        return records, 0
    caser = load_truecaser(dist)
    out = [{**r, "question": truecase_question(caser, r["question"])} for r in records]
    return out, sum(a["question"] != b["question"] for a, b in zip(out, records, strict=True))
